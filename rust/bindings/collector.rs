//! `_core.Collector`: the bounded collector of one stream, standalone.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::records::{Collected, ReadDelta};
use crate::collector::Collector as CoreCollector;
use crate::spill::SpillDir;

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
    fn collected(&self) -> Collected {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.flush();
        guard.0.collected().into()
    }

    #[pyo3(signature = (final_read=false))]
    fn read(&self, final_read: bool) -> ReadDelta {
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        guard.0.read(final_read).into()
    }

    fn tail_bytes<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        PyBytes::new(py, &guard.0.tail_bytes())
    }
}
