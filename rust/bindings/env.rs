//! `_core.Env` and `_core.EnvBuilder`: prepared child environments.

use std::ffi::CString;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::env::{envp_from_pairs, EnvBuilder as CoreEnvBuilder, EnvPair, EnvPolicy, EnvSource};

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
}

/// A Python mapping of bytes (e.g. `posix.environ`) seen as an environment source.
struct PyEnviron<'a, 'py>(&'a Bound<'py, PyDict>);

impl EnvSource for PyEnviron<'_, '_> {
    type Error = PyErr;

    fn entry_count(&self) -> usize {
        self.0.len()
    }

    fn equals(&self, snapshot: &[EnvPair]) -> PyResult<bool> {
        for ((k, v), (sk, sv)) in self.0.iter().zip(snapshot.iter()) {
            if k.extract::<&[u8]>()? != sk.as_slice() || v.extract::<&[u8]>()? != sv.as_slice() {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn pairs(&self) -> PyResult<Vec<EnvPair>> {
        self.0
            .iter()
            .map(|(k, v)| Ok((k.extract::<Vec<u8>>()?, v.extract::<Vec<u8>>()?)))
            .collect()
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
        let envp = self.inner.build(
            &PyEnviron(base),
            &extra.unwrap_or_default(),
            &managed.unwrap_or_default(),
        )?;
        Ok(Env { envp })
    }
}
