//! The frozen records the core hands Python: named fields, no positional tuples.

use std::path::PathBuf;

use pyo3::prelude::*;

use crate::collector::{Collected as CoreCollected, Delta};
use crate::process::Outcome as CoreOutcome;

fn path_str(p: Option<PathBuf>) -> Option<String> {
    p.map(|p| p.to_string_lossy().into_owned())
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Resource usage of a process's leader as `wait4` reported it (zeros when unknown).
#[pyclass(frozen, get_all, module = "shellseam._core")]
#[derive(Clone, Debug, PartialEq)]
pub struct Rusage {
    pub user_cpu_ms: f64,
    pub system_cpu_ms: f64,
    pub max_rss_kib: i64,
}

/// How a process ended.
#[pyclass(frozen, get_all, module = "shellseam._core")]
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub exit_status_unknown: bool,
    pub duration_ms: f64,
    pub leftover_killed: u32,
    pub kill_requested: bool,
    pub rusage: Rusage,
}

impl From<CoreOutcome> for Outcome {
    fn from(o: CoreOutcome) -> Self {
        Self {
            exit_code: o.exit_code,
            signal: o.signal,
            exit_status_unknown: o.exit_status_unknown,
            duration_ms: ms(o.duration),
            leftover_killed: o.leftover_killed,
            kill_requested: o.kill_requested,
            rusage: Rusage {
                user_cpu_ms: ms(o.user_cpu),
                system_cpu_ms: ms(o.system_cpu),
                max_rss_kib: o.max_rss_kib,
            },
        }
    }
}

/// One stream as collected so far: its (tail) text and how to recover the rest.
#[pyclass(frozen, get_all, module = "shellseam._core")]
#[derive(Clone, Debug, PartialEq)]
pub struct Collected {
    pub text: String,
    pub truncated: bool,
    pub spill_path: Option<String>,
    pub total_bytes: u64,
    pub spill_truncated: bool,
}

impl From<CoreCollected> for Collected {
    fn from(c: CoreCollected) -> Self {
        Self {
            text: c.text,
            truncated: c.truncated,
            spill_path: path_str(c.spill_path),
            total_bytes: c.total_bytes,
            spill_truncated: c.spill_truncated,
        }
    }
}

/// One consuming read of a stream.
#[pyclass(frozen, get_all, module = "shellseam._core")]
#[derive(Clone, Debug, PartialEq)]
pub struct ReadDelta {
    pub text: String,
    pub lossy: bool,
    pub spill_path: Option<String>,
    pub spill_truncated: bool,
}

impl From<Delta> for ReadDelta {
    fn from(d: Delta) -> Self {
        Self {
            text: d.text,
            lossy: d.lossy,
            spill_path: path_str(d.spill_path),
            spill_truncated: d.spill_truncated,
        }
    }
}

/// A finished process: its outcome and both collected streams, taken together.
#[pyclass(frozen, get_all, module = "shellseam._core")]
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub outcome: Outcome,
    pub stdout: Collected,
    pub stderr: Collected,
}

#[pymethods]
impl Rusage {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

#[pymethods]
impl Outcome {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

#[pymethods]
impl Collected {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

#[pymethods]
impl ReadDelta {
    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}
