//! A resolved `ShellExecSpec` read natively, for `Supervisor.run_spec`: a plain executor's
//! `run_sync` then crosses into Rust once, with the spec itself, instead of running its
//! checks, encodings and argument conversions as Python calls (each of them runs cold right
//! after a child process ran: ~30-50 us in all where the same code takes ~3 us warm).
//!
//! Only a spec `resolve` marked checked (`shellseam.checks.mark_checked`) whose checked
//! values are still the very objects it checked is read here, and only when nothing of it
//! needs the Python path (an abort signal, a command beyond one argument's limit, text
//! that is not plain UTF-8): `plain_spec` returns None for anything else, and the caller
//! runs the spec the usual way.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyString, PyTuple, PyType};

use super::contain::CallLimits;

/// What Python registered of the spec class (`register_spec_type`).
struct SpecType {
    cls: Py<PyType>,
    /// The `__dict__` key of the mark `mark_checked` sets.
    mark: Py<PyString>,
    /// The fields the mark holds the checked values of, in its order.
    fields: Vec<Py<PyString>>,
    /// The longest command passed as the shell's `-c` argument (longer ones go through a
    /// script memfd, made by the Python path).
    max_arg_bytes: usize,
    /// `sys.getfilesystemencoding()` is UTF-8: `os.fsencode` of a str without surrogates
    /// is then its UTF-8 bytes.
    fs_utf8: bool,
}

static SPEC: PyOnceLock<SpecType> = PyOnceLock::new();

/// Registers the spec class `run_spec` reads (the first registration wins).
#[pyfunction]
pub fn register_spec_type(
    py: Python<'_>,
    cls: Bound<'_, PyType>,
    mark: Bound<'_, PyString>,
    fields: Vec<Bound<'_, PyString>>,
    max_arg_bytes: usize,
    fs_utf8: bool,
) {
    let _ = SPEC.set(
        py,
        SpecType {
            cls: cls.unbind(),
            mark: mark.unbind(),
            fields: fields.into_iter().map(Bound::unbind).collect(),
            max_arg_bytes,
            fs_utf8,
        },
    );
}

/// The values of a plain spec, as the core takes them.
pub(crate) struct PlainSpec<'py> {
    pub command: Vec<u8>,
    pub workdir: Vec<u8>,
    pub stdin: Vec<u8>,
    pub timeout_ms: u64,
    pub stdout_cap: usize,
    /// The spec's `ResourceLimits` (stamped on the result).
    pub limits: Bound<'py, PyAny>,
}

/// The UTF-8 bytes of `value` when it is a str without surrogates.
fn utf8(value: &Bound<'_, PyAny>) -> Option<Vec<u8>> {
    let s = value.cast::<PyString>().ok()?;
    s.to_str().ok().map(|s| s.as_bytes().to_vec())
}

/// `spec` read as a plain run, or None when it needs the Python path (see the module).
pub(crate) fn plain_spec<'py>(spec: &Bound<'py, PyAny>) -> PyResult<Option<PlainSpec<'py>>> {
    let py = spec.py();
    let Some(t) = SPEC.get(py) else {
        return Ok(None);
    };
    if !spec.get_type().is(t.cls.bind(py)) {
        return Ok(None);
    }
    let values = spec
        .getattr(intern!(py, "__dict__"))?
        .cast_into::<PyDict>()?;
    let get = |name: &Bound<'py, PyString>| values.get_item(name);
    let Some(mark) = get(t.mark.bind(py))? else {
        return Ok(None);
    };
    let Ok(mark) = mark.cast_into::<PyTuple>() else {
        return Ok(None);
    };
    if mark.len() != t.fields.len() {
        return Ok(None);
    }
    for (i, field) in t.fields.iter().enumerate() {
        match get(field.bind(py))? {
            Some(value) if value.is(&mark.get_item(i)?) => {}
            _ => return Ok(None),
        }
    }
    let field = |name: &Bound<'py, PyString>| -> PyResult<Bound<'py, PyAny>> {
        Ok(get(name)?.unwrap_or_else(|| py.None().into_bound(py)))
    };
    for unset in [
        intern!(py, "env"),
        intern!(py, "managed_env"),
        intern!(py, "signal"),
    ] {
        if !field(unset)?.is_none() {
            return Ok(None);
        }
    }
    let Some(command) = utf8(&field(intern!(py, "command"))?) else {
        return Ok(None);
    };
    if command.len() > t.max_arg_bytes {
        return Ok(None);
    }
    let workdir = match utf8(&field(intern!(py, "workdir"))?) {
        Some(w) if t.fs_utf8 => w,
        _ => return Ok(None),
    };
    let stdin = field(intern!(py, "stdin"))?;
    let stdin = if stdin.is_none() {
        Vec::new()
    } else if let Ok(b) = stdin.cast::<PyBytes>() {
        b.as_bytes().to_vec()
    } else {
        match utf8(&stdin) {
            Some(s) => s,
            None => return Ok(None),
        }
    };
    Ok(Some(PlainSpec {
        command,
        workdir,
        stdin,
        timeout_ms: field(intern!(py, "timeout_ms"))?.extract()?,
        stdout_cap: field(intern!(py, "stdout_max_bytes"))?.extract()?,
        limits: field(intern!(py, "limits"))?,
    }))
}

/// The core's record of a `ResourceLimits` (None: no limits), read off its attributes.
pub(crate) fn call_limits(limits: &Bound<'_, PyAny>) -> PyResult<Option<CallLimits>> {
    if limits.is_none() {
        return Ok(None);
    }
    let py = limits.py();
    let get =
        |name: &Bound<'_, PyString>| -> PyResult<Option<u64>> { limits.getattr(name)?.extract() };
    Ok(Some(CallLimits {
        memory_bytes: get(intern!(py, "memory_bytes"))?,
        max_processes: get(intern!(py, "max_processes"))?,
        cpu_ms: get(intern!(py, "cpu_ms"))?,
        file_size_bytes: get(intern!(py, "file_size_bytes"))?,
        open_files: get(intern!(py, "open_files"))?,
    }))
}
