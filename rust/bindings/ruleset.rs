//! `_core.Ruleset` and the Landlock probes.

use std::os::fd::OwnedFd;

use pyo3::prelude::*;

use super::SandboxError;
use crate::landlock;

/// A prepared Landlock ruleset (an fd the child enforces before exec).
#[pyclass(frozen, module = "shellseam._core")]
pub struct Ruleset {
    pub(crate) fd: OwnedFd,
    #[pyo3(get)]
    enforcement: &'static str,
    #[pyo3(get)]
    missing: Vec<String>,
}

/// Builds the ruleset of a confined mode: read+execute everywhere, full access under
/// `writable_roots`, TCP denied when `network` is False (where the kernel can).
#[pyfunction]
#[pyo3(signature = (writable_roots, network))]
pub(crate) fn build_ruleset(writable_roots: Vec<String>, network: bool) -> PyResult<Ruleset> {
    let rs = landlock::build(&landlock::Policy {
        writable_roots,
        network,
    })
    .map_err(|e| {
        let errno = e.raw_os_error().unwrap_or(0);
        SandboxError::new_err(("SANDBOX_UNAVAILABLE", e.to_string(), errno, Some("sandbox")))
    })?;
    Ok(Ruleset {
        fd: rs.fd,
        enforcement: rs.enforcement.name(),
        missing: rs.missing,
    })
}

#[pyfunction]
pub(crate) fn landlock_abi() -> i32 {
    landlock::abi()
}

/// Requested features this kernel lacks for a confined mode (empty: full enforcement).
#[pyfunction]
pub(crate) fn landlock_missing(network: bool) -> Vec<String> {
    landlock::missing_features(landlock::abi(), network)
}

/// Names of the filesystem rights the running kernel can handle.
#[pyfunction]
pub(crate) fn landlock_fs_rights() -> Vec<&'static str> {
    landlock::describe_fs_rights(landlock::kernel_fs_rights())
}
