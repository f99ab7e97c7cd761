//! `_core` containment: per-call limits and resources, the host's facts, and the keeper's
//! entry point.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyString;

use crate::cgroup::{hierarchy, ServiceCgroups};
pub use crate::contain::CallLimits;
use crate::contain::Resources as CoreResources;

#[pymethods]
impl CallLimits {
    #[new]
    #[pyo3(signature = (*, memory_bytes=None, max_processes=None, cpu_ms=None, file_size_bytes=None, open_files=None))]
    fn new(
        memory_bytes: Option<u64>,
        max_processes: Option<u64>,
        cpu_ms: Option<u64>,
        file_size_bytes: Option<u64>,
        open_files: Option<u64>,
    ) -> Self {
        Self {
            memory_bytes,
            max_processes,
            cpu_ms,
            file_size_bytes,
            open_files,
        }
    }

    /// The record of `limits`, a `ResourceLimits` (None: no limits), read off its fields.
    #[staticmethod]
    pub(crate) fn of(limits: &Bound<'_, PyAny>) -> PyResult<Option<Self>> {
        if limits.is_none() {
            return Ok(None);
        }
        let py = limits.py();
        let get = |name: &Bound<'_, PyString>| -> PyResult<Option<u64>> {
            limits.getattr(name)?.extract()
        };
        Ok(Some(Self {
            memory_bytes: get(intern!(py, "memory_bytes"))?,
            max_processes: get(intern!(py, "max_processes"))?,
            cpu_ms: get(intern!(py, "cpu_ms"))?,
            file_size_bytes: get(intern!(py, "file_size_bytes"))?,
            open_files: get(intern!(py, "open_files"))?,
        }))
    }

    fn __repr__(&self) -> String {
        format!("{self:?}")
    }
}

/// Containment facts of one finished call.
#[pyclass(frozen, get_all, module = "shellseam._core")]
pub struct Resources {
    /// True when the call ran in its own cgroup.
    pub cgroup: bool,
    /// Whether memory / processes / CPU limits applied to the whole tree.
    pub tree_memory: bool,
    pub tree_processes: bool,
    pub tree_cpu: bool,
    /// "memory", "processes", "cpu" or None.
    pub limit_exceeded: Option<&'static str>,
    pub peak_memory_bytes: Option<u64>,
    /// CPU time of every process of the call (cgroup), None under session containment.
    pub cpu_ms: Option<f64>,
}

impl From<CoreResources> for Resources {
    fn from(r: CoreResources) -> Self {
        Self {
            cgroup: r.cgroup,
            tree_memory: r.tree_memory,
            tree_processes: r.tree_processes,
            tree_cpu: r.tree_cpu,
            limit_exceeded: r.limit_hit.map(|h| h.name()),
            peak_memory_bytes: r.peak_memory_bytes,
            cpu_ms: r.cpu_usec.map(|u| u as f64 / 1000.0),
        }
    }
}

/// What this host offers for containment.
#[pyclass(frozen, get_all, module = "shellseam._core")]
pub struct ContainmentFacts {
    pub cgroup: bool,
    pub memory: bool,
    pub pids: bool,
    pub cgroup_root: Option<String>,
    /// "cgroup v2", "cgroup v1" or None, per controller.
    pub memory_controller: Option<&'static str>,
    pub pids_controller: Option<&'static str>,
    /// Why there is no cgroup containment, when there is none.
    pub reason: Option<String>,
}

/// Probes the host by creating (and removing) a service cgroup parent.
#[pyfunction]
pub fn containment_facts(py: Python<'_>) -> ContainmentFacts {
    py.detach(|| {
        let h = hierarchy();
        let root = h.v2.as_ref().map(|p| p.to_string_lossy().into_owned());
        match ServiceCgroups::new(h) {
            Ok(set) => {
                let facts = ContainmentFacts {
                    cgroup: true,
                    memory: set.has_memory(),
                    pids: set.has_pids(),
                    cgroup_root: root,
                    memory_controller: set.memory_controller(),
                    pids_controller: set.pids_controller(),
                    reason: None,
                };
                set.remove_all();
                facts
            }
            Err(err) => ContainmentFacts {
                cgroup: false,
                memory: false,
                pids: false,
                cgroup_root: root,
                memory_controller: None,
                pids_controller: None,
                reason: Some(err.to_string()),
            },
        }
    })
}

/// The keeper process's body (see `keeper.rs`); never called in a harness.
#[pyfunction]
pub fn _keeper_main(py: Python<'_>, fd: i32) -> i32 {
    py.detach(|| crate::keeper::keeper_main(fd))
}
