//! `_core.bench_minimal_reader`: the drain floor the benchmark shows beside shellseam.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::CoreError;
use crate::floor::minimal_reader;

/// Runs `argv` with its stdout drained by the least a userspace reader can do (epoll,
/// non-blocking reads of `buf_bytes`, the last `tail_bytes` kept in a ring) and returns
/// the wall time in seconds, spawn to reap. A benchmark diagnostic (GIL released).
#[pyfunction]
#[pyo3(signature = (argv, buf_bytes = 1048576, tail_bytes = 65536))]
pub fn bench_minimal_reader(
    py: Python<'_>,
    argv: Vec<String>,
    buf_bytes: usize,
    tail_bytes: usize,
) -> PyResult<f64> {
    if argv.is_empty() {
        return Err(PyValueError::new_err("argv must not be empty"));
    }
    let run = py
        .detach(move || minimal_reader(&argv, buf_bytes, tail_bytes))
        .map_err(CoreError::Io)?;
    Ok(run.elapsed.as_secs_f64())
}
