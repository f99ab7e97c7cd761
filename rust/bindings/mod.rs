//! The Python face of the core (`shellseam._core`), one file per class: small, frozen
//! classes and frozen records (`records.rs`). Python adds the dataclasses, defaults and asyncio; every blocking call here
//! releases the GIL, and long waits check for Python signals between short slices.

mod collector;
mod contain;
mod env;
mod floor;
mod notifier;
mod proc;
mod records;
mod results;
mod ruleset;
mod spec;
mod supervisor;

use std::ffi::CString;
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::errors::{CoreError, SpawnError as CoreSpawnError, SpawnStage};

create_exception!(
    _core,
    NativeError,
    PyException,
    "A failure of the native core: args are (code, message, errno, stage), where code is the\n\
     ShellError code, errno the OS error number (0 when none) and stage where a spawn failed."
);
create_exception!(
    _core,
    SpawnError,
    NativeError,
    "A spawn failed (code SPAWN_FAILED, or SANDBOX_UNAVAILABLE at stage \"sandbox\")."
);
create_exception!(
    _core,
    DisposedError,
    NativeError,
    "The service has been disposed (code DISPOSED)."
);
create_exception!(
    _core,
    SandboxError,
    NativeError,
    "A Landlock ruleset could not be built (code SANDBOX_UNAVAILABLE)."
);

/// Slice length of GIL-released waits between checks for Python signals (Ctrl-C).
const WAIT_SLICE: Duration = Duration::from_millis(50);

/// The one conversion of native errors: the ShellError code, errno and spawn stage survive
/// as fields instead of being flattened into a message.
impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> Self {
        let text = err.to_string();
        match err {
            CoreError::Disposed => DisposedError::new_err(("DISPOSED", text, 0, None::<&str>)),
            CoreError::Invalid(msg) => PyValueError::new_err(msg),
            CoreError::ForkedChild => {
                SpawnError::new_err(("SPAWN_FAILED", text, 0, Some("forked-child")))
            }
            CoreError::Spawn(e) => {
                let code = if e.stage == SpawnStage::Sandbox {
                    "SANDBOX_UNAVAILABLE"
                } else {
                    "SPAWN_FAILED"
                };
                SpawnError::new_err((code, e.strerror(), e.errno, Some(e.stage.name())))
            }
            CoreError::Io(e) => match e.raw_os_error() {
                Some(errno) => PyOSError::new_err((errno, CoreSpawnError::strerror_of(errno))),
                None => PyOSError::new_err(e.to_string()),
            },
        }
    }
}

/// Before `os.fork()`: holds the registry of the services' pipe ends.
#[pyfunction]
fn fork_prepare(py: Python<'_>) {
    py.detach(crate::forksafe::prepare);
}

/// After `os.fork()` in the parent.
#[pyfunction]
fn fork_parent() {
    crate::forksafe::parent();
}

/// After `os.fork()` in the child: the services' pipe ends are closed (they name
/// /dev/null), so no command waits on a copy of its stdin held by the child.
#[pyfunction]
fn fork_child() {
    crate::forksafe::child();
}

pub(crate) fn cstring(bytes: Vec<u8>, what: &str) -> PyResult<CString> {
    CString::new(bytes).map_err(|_| PyValueError::new_err(format!("{what} contains a NUL byte")))
}

/// A wait timeout in seconds as a Duration: negative or NaN is zero; infinite, or too
/// large to represent, is None (no timeout).
pub(crate) fn duration_from_secs(secs: f64) -> Option<Duration> {
    if secs.is_nan() || secs <= 0.0 {
        return Some(Duration::ZERO);
    }
    Duration::try_from_secs_f64(secs).ok()
}

/// Waits in GIL-released slices so that Ctrl-C reaches Python while a command runs.
pub(crate) fn wait_with_signals(
    py: Python<'_>,
    timeout: Option<f64>,
    mut wait: impl FnMut(Duration) -> bool + Send,
) -> PyResult<bool> {
    let deadline =
        timeout.and_then(|t| std::time::Instant::now().checked_add(duration_from_secs(t)?));
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

#[pymodule]
#[pyo3(name = "_core")]
pub fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<supervisor::Supervisor>()?;
    m.add_class::<proc::Proc>()?;
    m.add_class::<supervisor::ShellTemplate>()?;
    m.add_class::<supervisor::PendingRun>()?;
    m.add("SPAWNER_THREADS", crate::spawn_queue::SPAWNERS)?;
    m.add_class::<notifier::Notifier>()?;
    m.add_class::<ruleset::Ruleset>()?;
    m.add_class::<ruleset::RootCheck>()?;
    m.add_class::<collector::Collector>()?;
    m.add_class::<env::Env>()?;
    m.add_class::<env::EnvBuilder>()?;
    m.add_class::<contain::CallLimits>()?;
    m.add_class::<contain::Resources>()?;
    m.add_class::<contain::ContainmentFacts>()?;
    m.add_function(wrap_pyfunction!(contain::containment_facts, m)?)?;
    m.add_function(wrap_pyfunction!(contain::_keeper_main, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::build_ruleset, m)?)?;
    m.add_function(wrap_pyfunction!(fork_prepare, m)?)?;
    m.add_function(wrap_pyfunction!(fork_parent, m)?)?;
    m.add_function(wrap_pyfunction!(fork_child, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::landlock_abi, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::landlock_missing, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::landlock_fs_rights, m)?)?;
    m.add_function(wrap_pyfunction!(floor::bench_minimal_reader, m)?)?;
    m.add_function(wrap_pyfunction!(floor::bench_session_spawn, m)?)?;
    m.add_function(wrap_pyfunction!(results::register_result_types, m)?)?;
    m.add_function(wrap_pyfunction!(spec::register_spec_type, m)?)?;
    m.add_class::<spec::ConfinedCall>()?;
    m.add_class::<records::Rusage>()?;
    m.add_class::<records::Outcome>()?;
    m.add_class::<records::Collected>()?;
    m.add_class::<records::ReadDelta>()?;
    m.add_class::<records::Finished>()?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add_function(wrap_pyfunction!(ruleset::capability_facts, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::protect_harness, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::harness_dumpable, m)?)?;
    m.add("SpawnError", m.py().get_type::<SpawnError>())?;
    m.add("DisposedError", m.py().get_type::<DisposedError>())?;
    m.add("SandboxError", m.py().get_type::<SandboxError>())?;
    Ok(())
}
