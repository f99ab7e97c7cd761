//! `_core.Proc`: one managed process group.

use std::sync::Arc;

use pyo3::prelude::*;

use pyo3::exceptions::PyRuntimeError;

use super::contain::Resources;
use super::notifier::Notifier;
use super::records::{Collected, Finished, Outcome, ReadDelta};
use super::results;
use super::wait_with_signals;
use crate::process::Proc as CoreProc;

/// One managed process group.
#[pyclass(frozen, module = "shellseam._core")]
pub struct Proc {
    pub(crate) inner: Arc<CoreProc>,
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

    /// Waits until done, then hands back the result in the same call (one crossing per
    /// foreground run); None when `timeout` seconds passed first.
    #[pyo3(signature = (timeout=None))]
    fn wait_result(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<Finished>> {
        if !self.wait(py, timeout)? {
            return Ok(None);
        }
        Ok(self.result())
    }

    fn subscribe(&self, notifier: &Notifier) {
        self.inner.subscribe(Arc::clone(&notifier.inner));
    }

    /// How it ended, or None while running.
    fn outcome(&self) -> Option<Outcome> {
        self.inner.outcome().map(Outcome::from)
    }

    /// The outcome and both collected streams in one call, or None while running.
    fn result(&self) -> Option<Finished> {
        let outcome = self.outcome()?;
        let (stdout, stderr) = self.collected();
        Some(Finished {
            outcome,
            stdout,
            stderr,
        })
    }

    /// Containment facts, or None while running.
    fn resources(&self) -> Option<Resources> {
        self.inner.resources().map(Resources::from)
    }

    /// The call's `ShellResources` (`limits`: its `ResourceLimits`), or None while running.
    fn shell_resources<'py>(
        &self,
        py: Python<'py>,
        limits: Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        results::shell_resources(py, &self.inner, &limits)
    }

    /// The `ShellRunResult` of the settled process, or None while running.
    #[pyo3(signature = (*, timed_out, aborted, timeout_ms, limits))]
    fn shell_result<'py>(
        &self,
        py: Python<'py>,
        timed_out: bool,
        aborted: bool,
        timeout_ms: u64,
        limits: Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyAny>>> {
        let ending = results::Ending {
            timed_out,
            aborted,
            timeout_ms,
        };
        results::shell_result(py, &self.inner, ending, &limits)
    }

    /// Both streams as collected so far: (stdout, stderr).
    fn collected(&self) -> (Collected, Collected) {
        let (out, err) = self.inner.collected();
        (out.into(), err.into())
    }

    /// Consuming read of both streams: (stdout, stderr).
    fn read(&self) -> (ReadDelta, ReadDelta) {
        let (out, err) = self.inner.read();
        (out.into(), err.into())
    }
}

/// A foreground run's wait: up to `timeout` seconds, then the kill and the wait for the end;
/// the `ShellRunResult`, `timed_out` when the timeout fired. Interrupted by a signal handler
/// that raises (KeyboardInterrupt), it kills the group and waits for it before raising, as
/// `run_sync` always did: nothing of a foreground run outlives it. A second interrupt ends
/// that wait too (the kill's escalation goes on in the supervisor, which has the process).
pub(crate) fn run_to_end<'py>(
    py: Python<'py>,
    proc: &Arc<CoreProc>,
    timeout: Option<f64>,
    timeout_ms: u64,
    limits: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let waited = {
        let inner = Arc::clone(proc);
        wait_with_signals(py, timeout, move |slice| inner.wait(Some(slice)))
    };
    let timed_out = match waited {
        Ok(done) => !done,
        Err(err) => return Err(kill_and_wait(py, proc).err().unwrap_or(err)),
    };
    if timed_out {
        if let Err(err) = kill_and_wait(py, proc) {
            // Interrupted while the timeout's kill runs its grace: wait on, as above.
            return Err(kill_and_wait(py, proc).err().unwrap_or(err));
        }
    }
    let ending = results::Ending {
        timed_out,
        aborted: false,
        timeout_ms,
    };
    results::shell_result(py, proc, ending, limits)?
        .ok_or_else(|| PyRuntimeError::new_err("an unbounded wait returns settled"))
}

/// Kills the group and waits for the end (a raising signal handler ends the wait: its error).
fn kill_and_wait(py: Python<'_>, proc: &Arc<CoreProc>) -> PyResult<()> {
    let inner = Arc::clone(proc);
    py.detach(move || {
        inner.kill();
    });
    let inner = Arc::clone(proc);
    wait_with_signals(py, None, move |slice| inner.wait(Some(slice))).map(|_| ())
}
