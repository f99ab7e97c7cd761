//! `_core.bench_minimal_reader` and `_core.bench_session_spawn`: the floors the benchmark
//! shows beside shellseam.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::cstring;
use super::env::Env;
use crate::errors::CoreError;
use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use crate::floor::{minimal_reader, session_spawn, FloorSpill};
use crate::spill::{DirectWrites, SpillWriter};

/// Runs `argv` with its stdout drained by the least a userspace reader can do (epoll,
/// non-blocking reads of `buf_bytes`, the last `tail_bytes` kept in a ring; with
/// `spill_path`, the first `spill_bytes` also written to that new file) and returns the
/// wall time in seconds, spawn to reap. A benchmark diagnostic (GIL released).
#[pyfunction]
#[pyo3(signature = (argv, buf_bytes = 131072, tail_bytes = 65536, spill_path = None, spill_bytes = 67108864))]
pub fn bench_minimal_reader(
    py: Python<'_>,
    argv: Vec<String>,
    buf_bytes: usize,
    tail_bytes: usize,
    spill_path: Option<PathBuf>,
    spill_bytes: u64,
) -> PyResult<f64> {
    if argv.is_empty() {
        return Err(PyValueError::new_err("argv must not be empty"));
    }
    let spill = match &spill_path {
        Some(path) => Some(FloorSpill {
            writer: SpillWriter::new(
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(CoreError::Io)?,
                Arc::new(DirectWrites::new(true)),
            ),
            cap: spill_bytes,
        }),
        None => None,
    };
    let run = py.detach(move || minimal_reader(&argv, buf_bytes, tail_bytes, spill));
    let run = run.map_err(|err| {
        if let Some(path) = &spill_path {
            let _ = std::fs::remove_file(path); // made for this run, which did not happen
        }
        CoreError::Io(err)
    })?;
    Ok(run.elapsed.as_secs_f64())
}

/// Spawns `program` as a session leader with stdin, stdout and stderr on pipes (glibc
/// `posix_spawn`), drains stdout and stderr with `poll` to EOF, reaps it and returns the
/// wall time in seconds: the floor of a call with shellseam's contract, minus shellseam
/// (no cgroup, no supervisor, no Python). A benchmark diagnostic (GIL released).
#[pyfunction]
pub fn bench_session_spawn(
    py: Python<'_>,
    program: Vec<u8>,
    argv: Vec<Vec<u8>>,
    env: &Env,
) -> PyResult<f64> {
    let program = cstring(program, "program")?;
    let argv = argv
        .into_iter()
        .map(|a| cstring(a, "argv"))
        .collect::<PyResult<Vec<_>>>()?;
    let envp = env.envp.clone();
    let took = py
        .detach(move || session_spawn(&program, &argv, &envp))
        .map_err(CoreError::Io)?;
    Ok(took.as_secs_f64())
}
