//! The result records of SPEC §2 built natively: `CollectedOutput`, `ShellResources` and
//! `ShellRunResult` instances straight from a settled process, in the native call that
//! waited for it.
//!
//! Python registers the classes once (`register_result_types`). An instance is made the way
//! `copy` and `pickle` make one: `object.__new__(cls)`, then its fields set in order as
//! `object.__setattr__` sets them. The frozen dataclass `__init__` (a Python call per
//! field, run cold right after a child process ran) is skipped; the instances are the same
//! in every way that can be observed (fields, order, equality, hash, repr, pickling).

use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyString, PyType};
use pyo3::{ffi, IntoPyObjectExt};

use crate::collector::Collected;
use crate::process::{Outcome, Proc};

struct Types {
    collected: Py<PyType>,
    resources: Py<PyType>,
    run_result: Py<PyType>,
    new: Py<PyAny>,
    /// Signal number -> name, as Python's `signal.Signals` names them.
    signal_names: Py<PyDict>,
}

static TYPES: PyOnceLock<Types> = PyOnceLock::new();

/// Registers the record classes the core builds results of (the first registration wins).
#[pyfunction]
pub fn register_result_types(
    py: Python<'_>,
    collected: Bound<'_, PyType>,
    resources: Bound<'_, PyType>,
    run_result: Bound<'_, PyType>,
    signal_names: Bound<'_, PyDict>,
) -> PyResult<()> {
    let new = py
        .import("builtins")?
        .getattr("object")?
        .getattr("__new__")?;
    let _ = TYPES.set(
        py,
        Types {
            collected: collected.unbind(),
            resources: resources.unbind(),
            run_result: run_result.unbind(),
            new: new.unbind(),
            signal_names: signal_names.unbind(),
        },
    );
    Ok(())
}

fn types(py: Python<'_>) -> PyResult<&Types> {
    TYPES
        .get(py)
        .ok_or_else(|| PyRuntimeError::new_err("shellseam result types are not registered"))
}

/// A new, empty instance of `cls`, and the setter of its fields.
fn blank<'py>(
    py: Python<'py>,
    t: &Types,
    cls: &Py<PyType>,
) -> PyResult<(Bound<'py, PyAny>, Fields<'py>)> {
    let obj = t.new.bind(py).call1((cls.bind(py),))?;
    Ok((obj.clone(), Fields(obj)))
}

/// Sets the fields of a new record as `object.__setattr__` does (the frozen dataclass's
/// `__init__` does the same): straight into the instance's attribute storage, which
/// asking for its `__dict__` first would turn into a dict of its own.
struct Fields<'py>(Bound<'py, PyAny>);

impl<'py> Fields<'py> {
    fn set_item<V: IntoPyObject<'py>>(
        &self,
        name: &Bound<'py, PyString>,
        value: V,
    ) -> PyResult<()> {
        let py = self.0.py();
        let value = value.into_bound_py_any(py)?;
        // SAFETY: the GIL is held (the objects are bound to it); `self.0` is an instance of a
        // plain Python class (its type's `tp_dictoffset` is set: dataclasses without
        // slots), `name` a str and `value` a live object, each borrowed for the call.
        let done =
            unsafe { ffi::PyObject_GenericSetAttr(self.0.as_ptr(), name.as_ptr(), value.as_ptr()) };
        if done == 0 {
            Ok(())
        } else {
            Err(PyErr::fetch(py))
        }
    }
}

fn collected_output<'py>(py: Python<'py>, t: &Types, c: Collected) -> PyResult<Bound<'py, PyAny>> {
    let (obj, d) = blank(py, t, &t.collected)?;
    d.set_item(intern!(py, "text"), c.text)?;
    d.set_item(intern!(py, "truncated"), c.truncated)?;
    let spill = c.spill_path.map(|p| p.to_string_lossy().into_owned());
    d.set_item(intern!(py, "spill_path"), spill)?;
    d.set_item(intern!(py, "total_bytes"), c.total_bytes)?;
    d.set_item(intern!(py, "spill_truncated"), c.spill_truncated)?;
    Ok(obj)
}

/// The `ShellResources` of a settled process (None while it runs), with `limits` (the
/// call's `ResourceLimits`) as its `limits` field.
pub(crate) fn shell_resources<'py>(
    py: Python<'py>,
    proc: &Proc,
    limits: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let t = types(py)?;
    match proc.outcome() {
        Some(outcome) => resources_record(py, t, proc, &outcome, limits).map(Some),
        None => Ok(None),
    }
}

fn resources_record<'py>(
    py: Python<'py>,
    t: &Types,
    proc: &Proc,
    outcome: &Outcome,
    limits: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyAny>> {
    let (raw, verdict) = proc.verdict(outcome);
    let (obj, d) = blank(py, t, &t.resources)?;
    let containment = if raw.cgroup { "cgroup" } else { "session" };
    d.set_item(intern!(py, "containment"), containment)?;
    d.set_item(intern!(py, "enforcement"), verdict.enforcement)?;
    d.set_item(intern!(py, "limits"), limits)?;
    d.set_item(intern!(py, "limit_exceeded"), verdict.limit_exceeded)?;
    d.set_item(intern!(py, "peak_memory_bytes"), raw.peak_memory_bytes)?;
    d.set_item(intern!(py, "cpu_ms"), verdict.cpu_ms)?;
    Ok(obj)
}

/// How the run was ended by its caller.
pub(crate) struct Ending {
    pub timed_out: bool,
    pub aborted: bool,
    pub timeout_ms: u64,
}

/// The `ShellRunResult` of a settled process (`sandbox` None: a sandboxing executor sets
/// it), or None while it runs.
pub(crate) fn shell_result<'py>(
    py: Python<'py>,
    proc: &Proc,
    ending: Ending,
    limits: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let t = types(py)?;
    let Some(outcome) = proc.outcome() else {
        return Ok(None);
    };
    let resources = resources_record(py, t, proc, &outcome, limits)?;
    let (out, err) = proc.collected();
    let signal = match outcome.signal {
        None => None,
        Some(n) => match t.signal_names.bind(py).get_item(n)? {
            Some(name) => Some(name),
            None => Some(format!("SIG{n}").into_pyobject(py)?.into_any()),
        },
    };
    let (obj, d) = blank(py, t, &t.run_result)?;
    d.set_item(intern!(py, "exit_code"), outcome.exit_code)?;
    d.set_item(intern!(py, "signal"), signal)?;
    d.set_item(intern!(py, "timed_out"), ending.timed_out)?;
    d.set_item(intern!(py, "aborted"), ending.aborted)?;
    d.set_item(intern!(py, "timeout_ms"), ending.timeout_ms)?;
    d.set_item(intern!(py, "stdout"), collected_output(py, t, out)?)?;
    d.set_item(intern!(py, "stderr"), collected_output(py, t, err)?)?;
    let duration_ms = outcome.duration.as_secs_f64() * 1000.0;
    d.set_item(intern!(py, "duration_ms"), duration_ms)?;
    d.set_item(intern!(py, "leftover_killed"), outcome.leftover_killed)?;
    d.set_item(intern!(py, "sandbox"), py.None())?;
    d.set_item(intern!(py, "resources"), resources)?;
    d.set_item(
        intern!(py, "exit_status_unknown"),
        outcome.exit_status_unknown,
    )?;
    Ok(Some(obj))
}
