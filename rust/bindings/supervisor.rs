//! `_core.Supervisor`: one subprocess service.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::contain::CallLimits;
use super::cstring;
use super::env::{Env, EnvBuilder};
use super::notifier::Notifier;
use super::proc::Proc;
use super::results;
use super::ruleset::Ruleset;
use super::spec::{self, ConfinedCall};
use crate::env::EnvPair;
use crate::errors::CoreError;
use crate::process::{Cause, Proc as CoreProc, ProcConfig};
use crate::spawn::SpawnPlan;
use crate::spawn_queue::{PendingRun as CorePending, SpawnJob, SpawnQueue};
use crate::supervisor::Service;
use crate::sys::lock;

/// The supervisor of one subprocess service.
#[pyclass(frozen, module = "shellseam._core")]
pub struct Supervisor {
    inner: Arc<Service>,
    /// Spawner threads for `run_queued`, started on its first queued run.
    queue: SpawnQueue,
}

/// A foreground run queued by `Supervisor.run_queued`: over once its token reached the
/// notifier.
#[pyclass(frozen, module = "shellseam._core")]
pub struct PendingRun {
    inner: Arc<CorePending>,
    timeout_ms: u64,
}

#[pymethods]
impl PendingRun {
    /// Whether the run is over: its process done, or its spawn failed.
    #[getter]
    fn done(&self) -> bool {
        self.inner.is_done()
    }

    /// Kills the run now, or as it lands (SIGTERM to its group, SIGKILL after the grace);
    /// `abort`: its result says `aborted` (unless its timeout fired first). False when it
    /// is over or a kill was already requested.
    #[pyo3(signature = (abort=false))]
    fn kill(&self, py: Python<'_>, abort: bool) -> bool {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.kill(abort.then_some(Cause::Abort)))
    }

    /// The `ShellRunResult` of the run that is over (`limits_record`: the call's
    /// `ResourceLimits`; `sandbox` None); raises the spawn's error when it failed, and
    /// returns None while the run is not over.
    fn result<'py>(
        &self,
        py: Python<'py>,
        limits_record: Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        if let Some(err) = self.inner.take_error() {
            return Err(err.into());
        }
        let Some(proc) = self.inner.landed() else {
            return Ok(None);
        };
        let cause = proc.cause();
        let ending = results::Ending {
            timed_out: cause == Some(Cause::Timeout),
            aborted: cause == Some(Cause::Abort),
            timeout_ms: self.timeout_ms,
        };
        results::shell_result(py, &proc, ending, &limits_record)
    }

    /// Also pushes `token` to `notifier` when the run is over (at once if it is).
    fn subscribe(&self, notifier: &Notifier, token: u64) {
        self.inner.subscribe(Arc::clone(&notifier.inner), token);
    }
}

/// A shell executor's spawn settings that do not change from call to call, prepared once
/// for `Supervisor.run_shell` (its Python caller then passes only what each call brings).
#[pyclass(frozen, module = "shellseam._core")]
pub struct ShellTemplate {
    program: Vec<u8>,
    argv0: Vec<u8>,
    stderr_cap: usize,
    spill_cap: u64,
    grace_ms: u64,
    cgroup: bool,
    /// The `ResourceLimits` object `run_spec` last converted, and what it made of it (a
    /// `ResourceLimits` is frozen: the same object gives the same record).
    last_limits: Mutex<Option<(Py<PyAny>, Option<CallLimits>)>>,
}

#[pymethods]
impl ShellTemplate {
    #[new]
    fn new(
        program: Vec<u8>,
        argv0: Vec<u8>,
        stderr_cap: usize,
        spill_cap: u64,
        grace_ms: u64,
        cgroup: bool,
    ) -> Self {
        Self {
            program,
            argv0,
            stderr_cap,
            spill_cap,
            grace_ms,
            cgroup,
            last_limits: Mutex::new(None),
        }
    }
}

impl ShellTemplate {
    /// The spawn of `<shell> -c <command>` with these settings.
    #[allow(clippy::too_many_arguments)]
    fn call<'a>(
        &self,
        command: Vec<u8>,
        cwd: Vec<u8>,
        env: &'a Env,
        stdin: Vec<u8>,
        stdout_cap: usize,
        ruleset: Option<&'a Ruleset>,
        limits: Option<&'a CallLimits>,
        script_fd: Option<i32>,
    ) -> Call<'a> {
        Call {
            program: self.program.clone(),
            argv: vec![self.argv0.clone(), b"-c".to_vec(), command],
            cwd,
            env,
            stdin,
            caps: (stdout_cap, self.stderr_cap, self.spill_cap),
            grace_ms: self.grace_ms,
            ruleset,
            script_fd,
            limits,
            cgroup: self.cgroup,
        }
    }

    /// The core's record of `limits` (a `ResourceLimits`), converted once per object.
    ///
    /// The lock is never held while Python code may run: reading the attributes of a
    /// subclass, or dropping the object cached before, may run Python code that lets
    /// another thread in, and that thread would wait here for the lock while holding the
    /// GIL the first one needs.
    fn call_limits(&self, limits: &Bound<'_, PyAny>) -> PyResult<Option<CallLimits>> {
        if let Some((seen, record)) = lock(&self.last_limits).as_ref() {
            if seen.is(limits) {
                return Ok(*record);
            }
        }
        let record = CallLimits::of(limits)?;
        let replaced = lock(&self.last_limits).replace((limits.clone().unbind(), record));
        drop(replaced);
        Ok(record)
    }
}

/// One spawn's arguments as Python passed them.
struct Call<'a> {
    program: Vec<u8>,
    argv: Vec<Vec<u8>>,
    cwd: Vec<u8>,
    env: &'a Env,
    stdin: Vec<u8>,
    /// stdout, stderr and spill caps.
    caps: (usize, usize, u64),
    grace_ms: u64,
    ruleset: Option<&'a Ruleset>,
    script_fd: Option<i32>,
    limits: Option<&'a CallLimits>,
    cgroup: bool,
}

impl Supervisor {
    /// `run_shell` of a spec read natively, in the child environment `envp`.
    fn run_plain<'py>(
        &self,
        py: Python<'py>,
        template: &ShellTemplate,
        spec: spec::PlainSpec<'py>,
        envp: Arc<Vec<CString>>,
        ruleset: Option<&Ruleset>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let limits = template.call_limits(&spec.limits)?;
        let env = Env { envp };
        let call = template.call(
            spec.command,
            spec.workdir,
            &env,
            spec.stdin,
            spec.stdout_cap,
            ruleset,
            limits.as_ref(),
            None,
        );
        self.run_to_end(py, call, spec.timeout_ms, &spec.limits)
    }

    /// Spawns `call` driven by the calling thread, waits up to `timeout_ms` (then kills and
    /// waits for the end) and builds its `ShellRunResult`.
    fn run_to_end<'py>(
        &self,
        py: Python<'py>,
        call: Call<'_>,
        timeout_ms: u64,
        limits_record: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let timeout = Duration::from_millis(timeout_ms).as_secs_f64();
        let proc = self.start(py, call, timeout_ms > 0)?;
        super::proc::run_to_end(py, &proc, Some(timeout), timeout_ms, limits_record)
    }

    /// Spawns `call` (GIL released); `defer_watch`: the caller drives it from the start.
    fn start(&self, py: Python<'_>, call: Call<'_>, defer_watch: bool) -> PyResult<Arc<CoreProc>> {
        let (mut plan, cfg) = plan_of(call, defer_watch)?;
        let inner = Arc::clone(&self.inner);
        Ok(py.detach(move || inner.spawn(&mut plan, cfg))?)
    }
}

/// The native plan and settings of `call`.
fn plan_of(call: Call<'_>, defer_watch: bool) -> PyResult<(SpawnPlan, ProcConfig)> {
    {
        let argv = call
            .argv
            .into_iter()
            .map(|a| cstring(a, "an argument"))
            .collect::<PyResult<Vec<_>>>()?;
        let plan = SpawnPlan {
            confinement: call.ruleset.map(|r| Arc::clone(&r.inner)),
            script: call.script_fd,
            ..SpawnPlan::new(
                cstring(call.program, "the program path")?,
                argv,
                Arc::clone(&call.env.envp),
                cstring(call.cwd, "the working directory")?,
            )
        };
        let (stdout_cap, stderr_cap, spill_cap) = call.caps;
        let cfg = ProcConfig {
            stdout_cap,
            stderr_cap,
            spill_cap,
            grace: Duration::from_millis(call.grace_ms),
            stdin: call.stdin,
            limits: call.limits.copied().unwrap_or_default(),
            cgroup: call.cgroup,
            defer_watch,
        };
        Ok((plan, cfg))
    }
}

#[pymethods]
impl Supervisor {
    /// `keeper`: (program, argv) of the keeper process, started on the first call; it
    /// removes the spill directory when the harness dies unless `keep_spill`.
    #[new]
    #[pyo3(signature = (spill_parent, spill_total=u64::MAX, keeper=None, keep_spill=false))]
    fn new(
        spill_parent: PathBuf,
        spill_total: u64,
        keeper: Option<(Vec<u8>, Vec<Vec<u8>>)>,
        keep_spill: bool,
    ) -> PyResult<Self> {
        let service = Service::new(spill_parent, spill_total).map_err(CoreError::Io)?;
        if let Some((program, argv)) = keeper {
            let argv = argv
                .into_iter()
                .map(|a| cstring(a, "a keeper argument"))
                .collect::<PyResult<Vec<_>>>()?;
            service.set_keeper(cstring(program, "the keeper program")?, argv, keep_spill);
        }
        Ok(Self {
            inner: Arc::new(service),
            queue: SpawnQueue::default(),
        })
    }

    /// The keeper's pid once started (None before the first call or without a keeper).
    #[getter]
    fn keeper_pid(&self) -> Option<i32> {
        self.inner.keeper_pid()
    }

    /// Whether calls get cgroups (creates the service's cgroup parent on first use).
    fn has_cgroups(&self, py: Python<'_>) -> bool {
        let inner = Arc::clone(&self.inner);
        py.detach(move || inner.has_cgroups())
    }

    /// The spill directory, created now if nothing spilled yet; None when it cannot be
    /// (disposed, or the parent is not writable).
    fn ensure_spill_dir(&self) -> Option<String> {
        self.inner
            .ensure_spill_dir()
            .map(|p| p.to_string_lossy().into_owned())
    }

    /// Tells the keeper to remove `dir` if the harness dies before it does.
    fn note_scratch_dir(&self, dir: std::path::PathBuf) {
        self.inner.note_scratch_dir(&dir);
    }

    /// The harness removed `dir` itself: the keeper forgets it.
    fn forget_scratch_dir(&self, dir: std::path::PathBuf) {
        self.inner.forget_scratch_dir(&dir);
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

    /// Runs `run_queued` took whose spawn is not over yet.
    #[getter]
    fn queued(&self) -> usize {
        self.queue.queued()
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
    #[pyo3(signature = (*, program, argv, cwd, env, stdin, stdout_cap, stderr_cap, spill_cap, grace_ms, ruleset=None, script_fd=None, limits=None, cgroup=true))]
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
        script_fd: Option<i32>,
        limits: Option<&CallLimits>,
        cgroup: bool,
    ) -> PyResult<Proc> {
        let call = Call {
            program,
            argv,
            cwd,
            env,
            stdin,
            caps: (stdout_cap, stderr_cap, spill_cap),
            grace_ms,
            ruleset,
            script_fd,
            limits,
            cgroup,
        };
        let proc = self.start(py, call, false)?;
        Ok(Proc { inner: proc })
    }

    /// A foreground run for an event loop, in one call: queues the spawn `run_shell` would
    /// make for one of the service's spawner threads (or spawns here when nothing of the
    /// service runs) and returns at once. The supervisor kills the run when `timeout_ms`
    /// passes (0: no timeout), and `token` is pushed to `notifier` once, when the run is
    /// over: its process done, or its spawn failed (`PendingRun.result` then has the
    /// result or raises). `script_fd` is duplicated: the caller may close its own at once.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (notifier, token, template, command, cwd, env, stdin, stdout_cap, ruleset, limits, timeout_ms, script_fd=None))]
    fn run_queued(
        &self,
        py: Python<'_>,
        notifier: &Notifier,
        token: u64,
        template: &ShellTemplate,
        command: Vec<u8>,
        cwd: Vec<u8>,
        env: &Env,
        stdin: Vec<u8>,
        stdout_cap: usize,
        ruleset: Option<&Ruleset>,
        limits: Option<&CallLimits>,
        timeout_ms: u64,
        script_fd: Option<i32>,
    ) -> PyResult<PendingRun> {
        let script = match script_fd {
            None => None,
            Some(fd) if fd < 0 => {
                return Err(PyValueError::new_err(format!(
                    "script_fd must be an open fd, got {fd}"
                )));
            }
            Some(fd) => {
                // SAFETY: fcntl(F_DUPFD_CLOEXEC) on any int is memory-safe; a closed or
                // foreign fd fails (EBADF) or is duplicated, never freed.
                let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
                if dup < 0 {
                    return Err(CoreError::Io(std::io::Error::last_os_error()).into());
                }
                // SAFETY: `dup` is a fresh fd that nothing else owns.
                Some(unsafe { OwnedFd::from_raw_fd(dup) })
            }
        };
        let call = template.call(
            command,
            cwd,
            env,
            stdin,
            stdout_cap,
            ruleset,
            limits,
            script.as_ref().map(|fd| fd.as_raw_fd()),
        );
        let (plan, cfg) = plan_of(call, false)?;
        let pending = Arc::new(CorePending::default());
        let job = SpawnJob {
            plan,
            cfg,
            script,
            pending: Arc::clone(&pending),
            notifier: Arc::clone(&notifier.inner),
            token,
            timeout: (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms)),
            seq: 0,
        };
        py.detach(|| self.queue.submit(&self.inner, job));
        Ok(PendingRun {
            inner: pending,
            timeout_ms,
        })
    }

    /// A foreground run in one call: spawns `<shell> -c <command>` with `template`'s
    /// settings (`script_fd`: a long command's sealed script, `command` then the stub that
    /// reads it), waits up to `timeout_ms` (then kills the group and waits for the end) and
    /// returns the `ShellRunResult` (`limits_record`: the call's `ResourceLimits`). The
    /// calling thread drives the process from its spawn on, so its pipes and pidfd join the
    /// supervisor's epoll set only if it hands them over (a bulk producer, the timeout). The
    /// arguments are positional: keywords cost Python a dict per call level.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (template, command, cwd, env, stdin, stdout_cap, ruleset, limits, timeout_ms, limits_record, script_fd=None))]
    fn run_shell<'py>(
        &self,
        py: Python<'py>,
        template: &ShellTemplate,
        command: Vec<u8>,
        cwd: Vec<u8>,
        env: &Env,
        stdin: Vec<u8>,
        stdout_cap: usize,
        ruleset: Option<&Ruleset>,
        limits: Option<&CallLimits>,
        timeout_ms: u64,
        limits_record: Bound<'py, PyAny>,
        script_fd: Option<i32>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let call = template.call(
            command, cwd, env, stdin, stdout_cap, ruleset, limits, script_fd,
        );
        self.run_to_end(py, call, timeout_ms, &limits_record)
    }

    /// `run_shell` of a resolved `spec` (a `ShellExecSpec` as `resolve` made and marked
    /// it), read natively, with the child environment `builder` makes of `environ`
    /// (`posix.environ`) and the confinement's `env` layer, and its `ruleset`; None, with
    /// nothing run, when the spec needs the Python path (`spec.rs`: an abort signal, env
    /// layers, a long command, text that is not plain UTF-8, a spec changed or built by
    /// hand).
    #[pyo3(signature = (template, builder, environ, spec, ruleset=None, env=None))]
    #[allow(clippy::too_many_arguments)]
    fn run_spec<'py>(
        &self,
        py: Python<'py>,
        template: &ShellTemplate,
        builder: &EnvBuilder,
        environ: Bound<'py, PyDict>,
        spec: Bound<'py, PyAny>,
        ruleset: Option<&Ruleset>,
        env: Option<Vec<EnvPair>>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(spec) = spec::plain_spec(&spec)? else {
            return Ok(None);
        };
        let env = builder.envp(&environ, &env.unwrap_or_default(), &[])?;
        self.run_plain(py, template, spec, env, ruleset).map(Some)
    }

    /// `run_spec` of a spec whose sandbox policy is the one `confined` was prepared for,
    /// with its ruleset and environment, after its roots were found to be the same
    /// directories still; the result carries `confined`'s sandbox record when the command
    /// exited 0 or was killed by a signal (no denial to look for: the caller completes any
    /// other). None, with
    /// nothing run, when the spec needs the Python path (`run_spec`), has another policy,
    /// or a root changed (the caller prepares the policy again).
    fn run_confined<'py>(
        &self,
        py: Python<'py>,
        template: &ShellTemplate,
        confined: &ConfinedCall,
        environ: Bound<'py, PyDict>,
        spec: Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let Some(spec) = spec::plain_spec(&spec)? else {
            return Ok(None);
        };
        if !confined.matches(&spec.policy) {
            return Ok(None);
        }
        let env = confined.builder.get().envp(&environ, &confined.env, &[])?;
        let result = self.run_plain(py, template, spec, env, Some(confined.ruleset.get()))?;
        confined.stamp(&result)?;
        Ok(Some(result))
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
        // Queued spawns land (or fail as disposed) and their threads end first.
        py.detach(|| self.queue.stop());
        py.detach(move || inner.dispose(keep_spill));
    }
}
