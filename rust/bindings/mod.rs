//! The Python face of the core (`shellseam._core`), one file per class: small, frozen
//! classes that return primitives. Python adds the dataclasses, defaults and asyncio; every blocking call here
//! releases the GIL, and long waits check for Python signals between short slices.

mod collector;
mod contain;
mod env;
mod notifier;
mod proc;
mod ruleset;
mod supervisor;

use std::ffi::CString;
use std::path::PathBuf;
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;

use crate::collector::{Collected, Delta};
use crate::errors::CoreError;

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

impl From<CoreError> for PyErr {
    fn from(err: CoreError) -> Self {
        let text = err.to_string();
        match err {
            CoreError::Disposed => DisposedError::new_err(text),
            CoreError::Invalid(msg) => PyValueError::new_err(msg),
            CoreError::ForkedChild => SpawnError::new_err(("forked-child", 0, text)),
            CoreError::Spawn(e) => SpawnError::new_err((e.stage.name(), e.errno, e.strerror())),
            CoreError::Io(e) => PyOSError::new_err(e.to_string()),
        }
    }
}

pub(crate) fn cstring(bytes: Vec<u8>, what: &str) -> PyResult<CString> {
    CString::new(bytes).map_err(|_| PyValueError::new_err(format!("{what} contains a NUL byte")))
}

fn path_str(p: &Option<PathBuf>) -> Option<String> {
    p.as_ref().map(|p| p.to_string_lossy().into_owned())
}

pub(crate) type CollectedTuple = (String, bool, Option<String>, u64, bool);

pub(crate) fn collected_tuple(c: Collected) -> CollectedTuple {
    let spill = path_str(&c.spill_path);
    (c.text, c.truncated, spill, c.total_bytes, c.spill_truncated)
}

pub(crate) type DeltaTuple = (String, bool, Option<String>);

pub(crate) fn delta_tuple(d: Delta) -> DeltaTuple {
    let spill = path_str(&d.spill_path);
    (d.text, d.lossy, spill)
}

/// Waits in GIL-released slices so that Ctrl-C reaches Python while a command runs.
pub(crate) fn wait_with_signals(
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

#[pymodule]
#[pyo3(name = "_core")]
pub fn core_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<supervisor::Supervisor>()?;
    m.add_class::<proc::Proc>()?;
    m.add_class::<notifier::Notifier>()?;
    m.add_class::<ruleset::Ruleset>()?;
    m.add_class::<collector::Collector>()?;
    m.add_class::<env::Env>()?;
    m.add_class::<env::EnvBuilder>()?;
    m.add_class::<contain::Resources>()?;
    m.add_class::<contain::ContainmentFacts>()?;
    m.add_function(wrap_pyfunction!(contain::containment_facts, m)?)?;
    m.add_function(wrap_pyfunction!(contain::_keeper_main, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::build_ruleset, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::landlock_abi, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::landlock_missing, m)?)?;
    m.add_function(wrap_pyfunction!(ruleset::landlock_fs_rights, m)?)?;
    m.add("SpawnError", m.py().get_type::<SpawnError>())?;
    m.add("DisposedError", m.py().get_type::<DisposedError>())?;
    m.add("SandboxError", m.py().get_type::<SandboxError>())?;
    Ok(())
}
