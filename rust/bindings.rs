//! The Python face of the core (`shellseam._core`): small, frozen classes that return
//! primitives. Python adds the dataclasses, defaults and asyncio; every blocking call here
//! releases the GIL, and long waits check for Python signals between short slices.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::collector::{Collected, Collector as CoreCollector, Delta};
use crate::env::{EnvPair, EnvPolicy};
use crate::errors::CoreError;
use crate::landlock;
use crate::spawn::SpawnPlan;
use crate::spill::SpillDir;
use crate::supervisor::{Notifier as CoreNotifier, Proc as CoreProc, ProcConfig, Service};

create_exception!(
    _core,
    SpawnError,
    PyException,
    "A spawn failed: args are (stage, errno, message)."
);
create_exception!(
    _core,
    DisposedError,
    PyException,
    "The service has been disposed."
);
create_exception!(
    _core,
    SandboxError,
    PyException,
    "A Landlock ruleset could not be built."
);

/// Slice length of GIL-released waits between checks for Python signals (Ctrl-C).
const WAIT_SLICE: Duration = Duration::from_millis(50);

fn to_py_err(err: CoreError) -> PyErr {
    let text = err.to_string();
    match err {
        CoreError::Disposed => DisposedError::new_err(text),
        CoreError::Invalid(msg) => PyValueError::new_err(msg),
        CoreError::ForkedChild => SpawnError::new_err(("forked-child", 0, text)),
        CoreError::Spawn(e) => SpawnError::new_err((e.stage.name(), e.errno, e.strerror())),
        CoreError::Io(e) => PyOSError::new_err(e.to_string()),
    }
}

fn cstring(bytes: Vec<u8>, what: &str) -> PyResult<CString> {
    CString::new(bytes).map_err(|_| PyValueError::new_err(format!("{what} contains a NUL byte")))
}

fn path_str(p: &Option<PathBuf>) -> Option<String> {
    p.as_ref().map(|p| p.to_string_lossy().into_owned())
}

type CollectedTuple = (String, bool, Option<String>, u64, bool);

fn collected_tuple(c: Collected) -> CollectedTuple {
    let spill = path_str(&c.spill_path);
    (c.text, c.truncated, spill, c.total_bytes, c.spill_truncated)
}

type DeltaTuple = (String, bool, Option<String>);

fn delta_tuple(d: Delta) -> DeltaTuple {
    let spill = path_str(&d.spill_path);
    (d.text, d.lossy, spill)
}

/// Waits in GIL-released slices so that Ctrl-C reaches Python while a command runs.
fn wait_with_signals(
    py: Python<'_>,
    timeout: Option<f64>,
    mut wait: impl FnMut(Duration) -> bool + Send,
) -> PyResult<bool> {
    let deadline = timeout.map(|t| std::time::Instant::now() + Duration::from_secs_f64(t.max(0.0)));
    loop {
        let slice = match deadline {
            Some(d) => {
                let left = d.saturating_duration_since(std::time::Instant::now());
                left.min(WAIT_SLICE)
            }
            None => WAIT_SLICE,
        };
        if py.detach(|| wait(slice)) {
            return Ok(true);
        }
        if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
            return Ok(false);
        }
        py.check_signals()?;
    }
}

/// Wakes an asyncio loop (it watches `fd`) when subscribed processes finish.
#[pyclass(frozen, module = "shellseam._core")]
pub struct Notifier {
    inner: Arc<CoreNotifier>,
}

#[pymethods]
impl Notifier {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(CoreNotifier::new().map_err(|e| PyOSError::new_err(e.to_string()))?),
        })
    }

    /// The eventfd to watch for readability.
    #[getter]
    fn fd(&self) -> i32 {
        self.inner.fd()
    }

    /// Wakes a blocked `wait` (it then returns an empty list).
    fn wake(&self) {
        self.inner.wake();
    }

    /// Tokens of processes finished since the last call; never blocks.
    fn take(&self) -> Vec<u64> {
        self.inner.take()
    }

    /// Blocks (GIL released) until a token is queued or `timeout` seconds pass.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> Vec<u64> {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.wait(timeout.map(|t| Duration::from_secs_f64(t.max(0.0)))))
    }
}

/// One managed process group.
#[pyclass(frozen, module = "shellseam._core")]
pub struct Proc {
    inner: Arc<CoreProc>,
}

#[pymethods]
impl Proc {
    #[getter]
    fn pid(&self) -> i32 {
        self.inner.pid
    }

    #[getter]
    fn token(&self) -> u64 {
        self.inner.token
    }

    #[getter]
    fn done(&self) -> bool {
        self.inner.is_done()
    }

    /// SIGTERM to the group now, SIGKILL after the grace period; False when already
    /// finished or a kill is already under way.
    fn kill(&self, py: Python<'_>) -> bool {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.kill())
    }

    /// Waits until done (GIL released); False when `timeout` seconds passed first.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let inner = Arc::clone(&self.inner);
        wait_with_signals(py, timeout, move |slice| inner.wait(Some(slice)))
    }

    fn subscribe(&self, notifier: &Notifier) {
        self.inner.subscribe(Arc::clone(&notifier.inner));
    }

    /// (exit_code, signal_number, duration_ms, leftover_killed, kill_requested,
    ///  user_cpu_ms, system_cpu_ms, max_rss_kib), or None while running.
    #[allow(clippy::type_complexity)]
    fn outcome(&self) -> Option<(Option<i32>, Option<i32>, f64, u32, bool, f64, f64, i64)> {
        self.inner.outcome().map(|o| {
            (
                o.exit_code,
                o.signal,
                o.duration.as_secs_f64() * 1000.0,
                o.leftover_killed,
                o.kill_requested,
                o.user_cpu.as_secs_f64() * 1000.0,
                o.system_cpu.as_secs_f64() * 1000.0,
                o.max_rss_kib,
            )
        })
    }

    /// (outcome, stdout collected, stderr collected) in one call, or None while running.
    #[allow(clippy::type_complexity)]
    fn result(
        &self,
    ) -> Option<(
        (Option<i32>, Option<i32>, f64, u32, bool, f64, f64, i64),
        CollectedTuple,
        CollectedTuple,
    )> {
        let outcome = self.outcome()?;
        let (out, err) = self.collected();
        Some((outcome, out, err))
    }

    /// ((text, truncated, spill_path, total_bytes, spill_truncated) for stdout, then stderr).
    fn collected(&self) -> (CollectedTuple, CollectedTuple) {
        let (out, err) = self.inner.collected();
        (collected_tuple(out), collected_tuple(err))
    }

    /// Consuming read: ((text, lossy, spill_path) for stdout, then stderr).
    fn read(&self) -> (DeltaTuple, DeltaTuple) {
        let (out, err) = self.inner.read();
        (delta_tuple(out), delta_tuple(err))
    }
}

/// A standalone bounded collector (the one each stream uses), for property tests and
/// for embedding callers that feed bytes themselves.
#[pyclass(module = "shellseam._core")]
pub struct Collector {
    inner: std::sync::Mutex<(CoreCollector, SpillDir)>,
}

#[pymethods]
impl Collector {
    #[new]
    fn new(cap: usize, spill_cap: u64, spill_parent: PathBuf) -> Self {
        Self {
            inner: std::sync::Mutex::new((
                CoreCollector::new(cap, spill_cap),
                SpillDir::new(spill_parent),
            )),
        }
    }

    fn push(&self, chunk: &[u8]) {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (collector, dir) = &mut *guard;
        let mut open = || dir.create_file("stream");
        collector.push(chunk, &mut open);
    }

    /// The stream so far (buffered spill bytes are written out first).
    fn collected(&self) -> CollectedTuple {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.flush();
        collected_tuple(guard.0.collected())
    }

    #[pyo3(signature = (final_read=false))]
    fn read(&self, final_read: bool) -> DeltaTuple {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        delta_tuple(guard.0.read(final_read))
    }

    fn tail_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        PyBytes::new(py, guard.0.tail_bytes())
    }
}

/// A prepared Landlock ruleset (an fd the child enforces before exec).
#[pyclass(frozen, module = "shellseam._core")]
pub struct Ruleset {
    fd: OwnedFd,
    #[pyo3(get)]
    enforcement: &'static str,
    #[pyo3(get)]
    missing: Vec<String>,
}

/// Builds the ruleset of a confined mode: read+execute everywhere, full access under
/// `writable_roots`, TCP denied when `network` is False (where the kernel can).
#[pyfunction]
#[pyo3(signature = (writable_roots, network))]
fn build_ruleset(writable_roots: Vec<String>, network: bool) -> PyResult<Ruleset> {
    let rs = landlock::build(&landlock::Policy {
        writable_roots,
        network,
    })
    .map_err(|e| SandboxError::new_err(e.to_string()))?;
    Ok(Ruleset {
        fd: rs.fd,
        enforcement: rs.enforcement.name(),
        missing: rs.missing,
    })
}

#[pyfunction]
fn landlock_abi() -> i32 {
    landlock::abi()
}

/// Requested features this kernel lacks for a confined mode (empty: full enforcement).
#[pyfunction]
fn landlock_missing(network: bool) -> Vec<String> {
    landlock::missing_features(landlock::abi(), network)
}

/// Names of the filesystem rights the running kernel can handle.
#[pyfunction]
fn landlock_fs_rights() -> Vec<&'static str> {
    landlock::describe_fs_rights(landlock::kernel_fs_rights())
}

/// The supervisor of one subprocess service.
#[pyclass(frozen, module = "shellseam._core")]
pub struct Supervisor {
    inner: Arc<Service>,
}

#[pymethods]
impl Supervisor {
    #[new]
    fn new(spill_parent: PathBuf) -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(
                Service::new(spill_parent).map_err(|e| PyOSError::new_err(e.to_string()))?,
            ),
        })
    }

    #[getter]
    fn spill_dir(&self) -> Option<String> {
        self.inner
            .spill_dir()
            .map(|p| p.to_string_lossy().into_owned())
    }

    #[getter]
    fn running(&self) -> usize {
        self.inner.running()
    }

    #[getter]
    fn disposed(&self) -> bool {
        self.inner.is_disposed()
    }

    #[getter]
    fn has_thread(&self) -> bool {
        self.inner.has_supervisor_thread()
    }

    /// Spawns `argv` (program path `program`) in a new process group.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (*, program, argv, cwd, env, stdin, stdout_cap, stderr_cap, spill_cap, grace_ms, ruleset=None))]
    fn spawn(
        &self,
        py: Python<'_>,
        program: Vec<u8>,
        argv: Vec<Vec<u8>>,
        cwd: Vec<u8>,
        env: &Env,
        stdin: Vec<u8>,
        stdout_cap: usize,
        stderr_cap: usize,
        spill_cap: u64,
        grace_ms: u64,
        ruleset: Option<&Ruleset>,
    ) -> PyResult<Proc> {
        let argv = argv
            .into_iter()
            .map(|a| cstring(a, "an argument"))
            .collect::<PyResult<Vec<_>>>()?;
        let plan = SpawnPlan {
            program: cstring(program, "the program path")?,
            argv,
            envp: Arc::clone(&env.envp),
            cwd: cstring(cwd, "the working directory")?,
            landlock_ruleset: ruleset.map(|r| r.fd.as_raw_fd()),
            cgroup: None,
            join_cgroups: Vec::new(),
            rlimits: Vec::new(),
        };
        let cfg = ProcConfig {
            stdout_cap,
            stderr_cap,
            spill_cap,
            grace: Duration::from_millis(grace_ms),
            stdin,
        };
        let inner = Arc::clone(&self.inner);
        let proc = py
            .detach(move || inner.spawn(&plan, cfg))
            .map_err(to_py_err)?;
        Ok(Proc { inner: proc })
    }

    /// Refuses new spawns and requests the kill of every live process (no waiting).
    fn begin_dispose(&self, py: Python<'_>) -> Vec<Proc> {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.begin_dispose())
            .into_iter()
            .map(|inner| Proc { inner })
            .collect()
    }

    /// Kills (with escalation) and reaps every process, stops the supervisor thread and
    /// removes the spill directory unless `keep_spill`.
    #[pyo3(signature = (keep_spill=false))]
    fn dispose(&self, py: Python<'_>, keep_spill: bool) {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.dispose(keep_spill));
    }
}

fn envp_from_pairs(pairs: Vec<EnvPair>) -> PyResult<Vec<CString>> {
    pairs
        .into_iter()
        .map(|(mut k, v)| {
            if k.is_empty() || k.contains(&b'=') {
                return Err(PyValueError::new_err("invalid environment variable name"));
            }
            k.push(b'=');
            k.extend_from_slice(&v);
            cstring(k, "the environment")
        })
        .collect()
}

/// A prepared child environment (C strings ready for execve).
#[pyclass(frozen, module = "shellseam._core")]
pub struct Env {
    envp: Arc<Vec<CString>>,
}

#[pymethods]
impl Env {
    /// An environment of exactly these entries.
    #[staticmethod]
    fn from_pairs(pairs: Vec<EnvPair>) -> PyResult<Self> {
        Ok(Self {
            envp: Arc::new(envp_from_pairs(pairs)?),
        })
    }

    /// The entries as (name, value) pairs, in order.
    fn pairs<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        self.envp
            .iter()
            .map(|entry| {
                let bytes = entry.as_bytes();
                let eq = bytes.iter().position(|&b| b == b'=').unwrap_or(bytes.len());
                let value = bytes.get(eq + 1..).unwrap_or(&[]);
                (PyBytes::new(py, &bytes[..eq]), PyBytes::new(py, value))
            })
            .collect()
    }
}

/// An executor's environment rules (see `env.rs`), with the filtered inherited layer
/// cached until the harness's environment changes.
#[pyclass(frozen, module = "shellseam._core")]
pub struct EnvBuilder {
    policy: EnvPolicy,
    cache: std::sync::Mutex<EnvCache>,
}

/// The last inherited environment seen, its filtered layer, and the complete environment
/// of a call without caller layers (the common case), all valid while `snapshot` is.
#[derive(Default)]
struct EnvCache {
    snapshot: Vec<EnvPair>,
    kept: Vec<EnvPair>,
    plain: Option<Arc<Vec<CString>>>,
}

#[pymethods]
impl EnvBuilder {
    #[new]
    fn new(
        scrub_patterns: Vec<String>,
        managed_prefix: String,
        drop_names: Vec<Vec<u8>>,
        terminal: Vec<EnvPair>,
    ) -> Self {
        Self {
            policy: EnvPolicy::new(&scrub_patterns, &managed_prefix, drop_names, terminal),
            cache: std::sync::Mutex::new(EnvCache::default()),
        }
    }

    /// The child environment for one call: `base` (the harness's bytes environment, e.g.
    /// `posix.environ`) filtered by the rules, then terminal, `extra` and `managed`.
    #[pyo3(signature = (base, extra=None, managed=None))]
    fn build(
        &self,
        base: &Bound<'_, PyDict>,
        extra: Option<Vec<EnvPair>>,
        managed: Option<Vec<EnvPair>>,
    ) -> PyResult<Env> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut same = cache.snapshot.len() == base.len();
        if same {
            for ((k, v), (sk, sv)) in base.iter().zip(cache.snapshot.iter()) {
                if k.extract::<&[u8]>()? != sk.as_slice() || v.extract::<&[u8]>()? != sv.as_slice()
                {
                    same = false;
                    break;
                }
            }
        }
        if !same {
            let snapshot = base
                .iter()
                .map(|(k, v)| Ok((k.extract::<Vec<u8>>()?, v.extract::<Vec<u8>>()?)))
                .collect::<PyResult<Vec<EnvPair>>>()?;
            let kept = self.policy.kept_base(&snapshot);
            *cache = EnvCache {
                snapshot,
                kept,
                plain: None,
            };
        }
        let extra = extra.unwrap_or_default();
        let managed = managed.unwrap_or_default();
        let plain = extra.is_empty() && managed.is_empty();
        if plain {
            if let Some(envp) = &cache.plain {
                return Ok(Env {
                    envp: Arc::clone(envp),
                });
            }
        }
        let envp = Arc::new(envp_from_pairs(self.policy.merge(
            &cache.kept,
            &extra,
            &managed,
        ))?);
        if plain {
            cache.plain = Some(Arc::clone(&envp));
        }
        Ok(Env { envp })
    }
}

#[pymodule]
#[pyo3(name = "_core")]
pub fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Supervisor>()?;
    m.add_class::<Proc>()?;
    m.add_class::<Notifier>()?;
    m.add_class::<Ruleset>()?;
    m.add_class::<Collector>()?;
    m.add_class::<Env>()?;
    m.add_class::<EnvBuilder>()?;
    m.add_function(wrap_pyfunction!(build_ruleset, m)?)?;
    m.add_function(wrap_pyfunction!(landlock_abi, m)?)?;
    m.add_function(wrap_pyfunction!(landlock_missing, m)?)?;
    m.add_function(wrap_pyfunction!(landlock_fs_rights, m)?)?;
    m.add("SpawnError", m.py().get_type::<SpawnError>())?;
    m.add("DisposedError", m.py().get_type::<DisposedError>())?;
    m.add("SandboxError", m.py().get_type::<SandboxError>())?;
    Ok(())
}
