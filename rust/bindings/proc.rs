//! `_core.Proc`: one managed process group.

use std::sync::Arc;

use pyo3::prelude::*;

use super::contain::Resources;
use super::notifier::Notifier;
use super::{collected_tuple, delta_tuple, wait_with_signals, CollectedTuple, DeltaTuple};
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

    /// Containment facts, or None while running.
    fn resources(&self) -> Option<Resources> {
        self.inner.resources().map(Resources::from)
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
