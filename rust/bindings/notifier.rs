//! `_core.Notifier`: wakes an asyncio loop when subscribed processes finish.

use std::sync::Arc;

use pyo3::prelude::*;

use super::duration_from_secs;
use crate::errors::CoreError;
use crate::notifier::Notifier as CoreNotifier;

/// Wakes an asyncio loop (it watches `fd`) when subscribed processes finish.
#[pyclass(frozen, module = "shellseam._core")]
pub struct Notifier {
    pub(crate) inner: Arc<CoreNotifier>,
}

#[pymethods]
impl Notifier {
    #[new]
    fn new() -> PyResult<Self> {
        Ok(Self {
            inner: Arc::new(CoreNotifier::new().map_err(CoreError::Io)?),
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
        let timeout = timeout.and_then(duration_from_secs);
        py.detach(move || inner.wait(timeout))
    }
}
