//! `_core.Env` and `_core.EnvBuilder`: prepared child environments.

use std::cell::RefCell;
use std::ffi::CString;
use std::sync::{Arc, Mutex};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::env::{envp_from_pairs, EnvBuilder as CoreEnvBuilder, EnvPair, EnvPolicy, EnvSource};
use crate::sys::lock;

/// A prepared child environment (C strings ready for execve).
#[pyclass(frozen, module = "shellseam._core")]
pub struct Env {
    pub(crate) envp: Arc<Vec<CString>>,
}

#[pymethods]
impl Env {
    /// An environment of exactly these entries.
    #[staticmethod]
    fn from_pairs(pairs: Vec<EnvPair>) -> PyResult<Self> {
        Ok(Self {
            envp: Arc::new(envp_from_pairs(pairs)?),
        })
    }
    /// The entries as (name, value) pairs, in order.
    fn pairs<'py>(&self, py: Python<'py>) -> Vec<(Bound<'py, PyBytes>, Bound<'py, PyBytes>)> {
        self.envp
            .iter()
            .map(|entry| {
                let bytes = entry.as_bytes();
                let eq = bytes.iter().position(|&b| b == b'=').unwrap_or(bytes.len());
                let value = bytes.get(eq + 1..).unwrap_or(&[]);
                (PyBytes::new(py, &bytes[..eq]), PyBytes::new(py, value))
            })
            .collect()
    }
}

/// An executor's environment rules (see `env.rs`), with the filtered inherited layer
/// cached until the harness's environment changes.
#[pyclass(frozen, module = "shellseam._core")]
pub struct EnvBuilder {
    inner: CoreEnvBuilder,
    /// The key and value objects (alternating) of the mapping last seen to equal the cache's
    /// snapshot, held so that none of them can be freed and its address reused: a mapping
    /// holding these very objects, in this order, holds the same bytes (bytes are
    /// immutable), which is told by comparing addresses alone. Comparing the bytes
    /// themselves touched every entry's data on every call, cold after each child (~8 us).
    seen: Mutex<Vec<Py<PyAny>>>,
}

/// A Python mapping of bytes (e.g. `posix.environ`) seen as an environment source.
struct PyEnviron<'a, 'py> {
    dict: &'a Bound<'py, PyDict>,
    seen: &'a Mutex<Vec<Py<PyAny>>>,
    /// The objects `remember` replaced, dropped with the source (see there).
    retired: RefCell<Vec<Py<PyAny>>>,
}

impl PyEnviron<'_, '_> {
    /// Whether the mapping holds exactly the objects of `seen`, in order. The dict's own
    /// entry table is walked with `PyDict_Next` and borrowed references:
    /// taking a reference to every key and value (as iterating bound items does) writes to
    /// each object's header, and that is a cache miss per object when the call runs cold.
    fn holds_seen(&self, seen: &[Py<PyAny>]) -> bool {
        if seen.len() != 2 * self.dict.len() {
            return false;
        }
        let dict = self.dict.as_ptr();
        let mut pos: ffi::Py_ssize_t = 0;
        let mut key: *mut ffi::PyObject = std::ptr::null_mut();
        let mut value: *mut ffi::PyObject = std::ptr::null_mut();
        seen.chunks_exact(2).all(|kv| {
            // SAFETY: the GIL is held (`self.dict` is bound to it) and `dict` is a dict;
            // `PyDict_Next` writes borrowed pointers into `key` and `value`, which are only
            // compared here, and nothing in this loop runs Python code or changes the dict.
            let more = unsafe { ffi::PyDict_Next(dict, &mut pos, &mut key, &mut value) } != 0;
            more && key == kv[0].as_ptr() && value == kv[1].as_ptr()
        })
    }

    /// Makes the mapping's objects the ones seen. Those seen before are dropped with this
    /// source, after the builder let go of its locks: dropping the last reference to an
    /// object may run Python code, which may let another thread in to wait for a lock
    /// while it holds the GIL.
    fn remember(&self, seen: &mut Vec<Py<PyAny>>) {
        let objects = self
            .dict
            .iter()
            .flat_map(|(k, v)| [k.unbind(), v.unbind()])
            .collect();
        let before = std::mem::replace(seen, objects);
        self.retired.borrow_mut().extend(before);
    }
}

impl EnvSource for PyEnviron<'_, '_> {
    type Error = PyErr;

    fn entry_count(&self) -> usize {
        self.dict.len()
    }

    fn equals(&self, snapshot: &[EnvPair]) -> PyResult<bool> {
        let mut seen = lock(self.seen);
        if self.holds_seen(&seen) {
            return Ok(true);
        }
        for ((k, v), (sk, sv)) in self.dict.iter().zip(snapshot.iter()) {
            if k.extract::<&[u8]>()? != sk.as_slice() || v.extract::<&[u8]>()? != sv.as_slice() {
                return Ok(false);
            }
        }
        self.remember(&mut seen);
        Ok(true)
    }

    fn pairs(&self) -> PyResult<Vec<EnvPair>> {
        // Bytes only, as `equals` reads them: a mutable entry (a bytearray) could change
        // under the same object and the identity check would not see it.
        let pairs = self
            .dict
            .iter()
            .map(|(k, v)| {
                Ok((
                    k.extract::<&[u8]>()?.to_vec(),
                    v.extract::<&[u8]>()?.to_vec(),
                ))
            })
            .collect::<PyResult<Vec<_>>>()?;
        // The new snapshot is made of these objects' bytes.
        self.remember(&mut lock(self.seen));
        Ok(pairs)
    }
}

#[pymethods]
impl EnvBuilder {
    #[new]
    fn new(
        scrub_patterns: Vec<String>,
        managed_prefix: String,
        drop_names: Vec<Vec<u8>>,
        terminal: Vec<EnvPair>,
        allowed_names: Vec<Vec<u8>>,
    ) -> Self {
        let policy = EnvPolicy::new(&scrub_patterns, &managed_prefix, drop_names, terminal)
            .with_allowed(allowed_names);
        Self {
            inner: CoreEnvBuilder::new(policy),
            seen: Mutex::new(Vec::new()),
        }
    }

    /// The child environment for one call: `base` (the harness's bytes environment, e.g.
    /// `posix.environ`) filtered by the rules, then terminal, `extra` and `managed`.
    #[pyo3(signature = (base, extra=None, managed=None))]
    fn build(
        &self,
        base: &Bound<'_, PyDict>,
        extra: Option<Vec<EnvPair>>,
        managed: Option<Vec<EnvPair>>,
    ) -> PyResult<Env> {
        let envp = self.envp(
            base,
            &extra.unwrap_or_default(),
            &managed.unwrap_or_default(),
        )?;
        Ok(Env { envp })
    }
}

impl EnvBuilder {
    /// The child environment of a call with the `extra` and `managed` layers (`build`).
    pub(crate) fn envp(
        &self,
        base: &Bound<'_, PyDict>,
        extra: &[EnvPair],
        managed: &[EnvPair],
    ) -> PyResult<Arc<Vec<CString>>> {
        let source = PyEnviron {
            dict: base,
            seen: &self.seen,
            retired: RefCell::new(Vec::new()),
        };
        self.inner.build(&source, extra, managed)
    }
}
