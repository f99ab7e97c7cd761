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

use super::env::EnvBuilder;
use super::ruleset::{RootCheck, Ruleset};
use crate::env::EnvPair;

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
    /// Its `SandboxPolicy` (None for an unconfined executor's spec).
    pub policy: Bound<'py, PyAny>,
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
        policy: field(intern!(py, "sandbox_policy"))?,
    }))
}

/// The values of a `SandboxPolicy` a prepared confinement depends on, as their text and
/// truth (read as the core reads a str: its characters, whatever a subclass's `__eq__`
/// would say).
#[derive(PartialEq, Eq)]
struct PolicyValues {
    mode: String,
    workspace_root: String,
    writable_roots: Vec<String>,
    network: bool,
}

impl PolicyValues {
    fn of(policy: &Bound<'_, PyAny>) -> PyResult<Self> {
        let py = policy.py();
        Ok(Self {
            mode: policy.getattr(intern!(py, "mode"))?.extract()?,
            workspace_root: policy.getattr(intern!(py, "workspace_root"))?.extract()?,
            writable_roots: policy.getattr(intern!(py, "writable_roots"))?.extract()?,
            network: policy.getattr(intern!(py, "network"))?.extract()?,
        })
    }
}

/// A sandboxing executor's prepared call of one policy (`Supervisor.run_confined`): the
/// policy's values, the roots checked again at every call, the ruleset, the environment
/// builder and layer, and the sandbox record of a result that is no denial.
#[pyclass(frozen, module = "shellseam._core")]
pub struct ConfinedCall {
    /// The values of the policy it was prepared for.
    policy: PolicyValues,
    roots: Py<RootCheck>,
    pub(crate) ruleset: Py<Ruleset>,
    pub(crate) builder: Py<EnvBuilder>,
    pub(crate) env: Vec<EnvPair>,
    info: Py<PyAny>,
}

#[pymethods]
impl ConfinedCall {
    #[new]
    fn new(
        policy: &Bound<'_, PyAny>,
        roots: Py<RootCheck>,
        ruleset: Py<Ruleset>,
        builder: Py<EnvBuilder>,
        env: Vec<EnvPair>,
        info: Py<PyAny>,
    ) -> PyResult<Self> {
        Ok(Self {
            policy: PolicyValues::of(policy)?,
            roots,
            ruleset,
            builder,
            env,
            info,
        })
    }
}

impl ConfinedCall {
    /// Whether `policy` has the values this call was prepared for, and every root still
    /// names the directory it was pinned to.
    pub(crate) fn matches(&self, policy: &Bound<'_, PyAny>) -> bool {
        !policy.is_none()
            && PolicyValues::of(policy).is_ok_and(|values| values == self.policy)
            && self.roots.get().still_same()
    }

    /// Sets the sandbox record of `result` when it cannot read as a denial: its command
    /// exited 0 or has no exit code (killed by a signal).
    pub(crate) fn stamp(&self, result: &Bound<'_, PyAny>) -> PyResult<()> {
        let py = result.py();
        let code = result.getattr(intern!(py, "exit_code"))?;
        if !code.is_none() && code.extract::<i64>().map_or(true, |c| c != 0) {
            return Ok(());
        }
        result
            .getattr(intern!(py, "__dict__"))?
            .set_item(intern!(py, "sandbox"), self.info.bind(py))
    }
}
