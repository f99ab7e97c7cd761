//! `_core.Ruleset` (a confined mode's child-side plan) and the Landlock probes.

use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::SandboxError;
use crate::confine::{self, Confinement};
use crate::landlock;

/// A prepared confinement: the Landlock ruleset fd, the seccomp filter and the privilege
/// drop, applied by the child before exec. One is shared by every call of a policy.
#[pyclass(frozen, module = "shellseam._core")]
pub struct Ruleset {
    pub(crate) inner: Arc<Confinement>,
    #[pyo3(get)]
    enforcement: &'static str,
    #[pyo3(get)]
    missing: Vec<String>,
}

/// Takes a reference of our own to a caller's fd (EBADF for a closed one, never UB).
fn dup_fd(fd: i32) -> PyResult<OwnedFd> {
    // SAFETY: F_DUPFD_CLOEXEC accepts any integer and returns a fresh fd or -1.
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(PyValueError::new_err(format!(
            "writable_root_fds: {fd} is not an open fd: {}",
            std::io::Error::last_os_error()
        )));
    }
    // SAFETY: `new` was just returned by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Builds the confinement of a mode: read+execute everywhere, everything but device creation
/// under the directories `writable_root_fds` (pinned O_PATH fds), sockets denied when
/// `network` is False, metadata writes denied when `read_only`.
#[pyfunction]
#[pyo3(signature = (writable_root_fds, network, read_only))]
pub(crate) fn build_ruleset(
    py: Python<'_>,
    writable_root_fds: Vec<i32>,
    network: bool,
    read_only: bool,
) -> PyResult<Ruleset> {
    let owned = writable_root_fds
        .into_iter()
        .map(dup_fd)
        .collect::<PyResult<Vec<_>>>()?;
    let conf = py
        .detach(move || {
            let roots: Vec<BorrowedFd<'_>> = owned.iter().map(|f| f.as_fd()).collect();
            Confinement::build(&roots, network, read_only)
        })
        .map_err(|e| {
            let errno = e.raw_os_error().unwrap_or(0);
            SandboxError::new_err(("SANDBOX_UNAVAILABLE", e.to_string(), errno, Some("sandbox")))
        })?;
    Ok(Ruleset {
        enforcement: conf.enforcement().name(),
        missing: conf.missing().to_vec(),
        inner: Arc::new(conf),
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
pub(crate) fn landlock_fs_rights() -> Vec<String> {
    landlock::kernel_fs_rights()
}

/// Whether confined children can also clear the bounding set and lock securebits (the
/// harness holds CAP_SETPCAP), and the highest capability number.
#[pyfunction]
pub(crate) fn capability_facts() -> (bool, i32) {
    let f = confine::capability_facts();
    (f.can_setpcap, f.last_cap)
}

/// Makes the harness non-dumpable: its /proc/<pid>/environ, mem and maps become readable
/// only with CAP_SYS_PTRACE, which no confined command has.
#[pyfunction]
pub(crate) fn protect_harness() -> PyResult<()> {
    // SAFETY: PR_SET_DUMPABLE with a plain integer argument changes only this process's flag.
    let r = unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if r != 0 {
        return Err(pyo3::exceptions::PyOSError::new_err(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    Ok(())
}

/// Whether the harness is dumpable (`PR_GET_DUMPABLE`).
#[pyfunction]
pub(crate) fn harness_dumpable() -> bool {
    // SAFETY: PR_GET_DUMPABLE reads a flag of this process.
    unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) == 1 }
}

/// The roots of a cached confinement, checked again at every call of it: each path with
/// the directory it was pinned to (device, inode; None: the path named nothing then). One
/// `stat` per path, no Python object per check.
#[pyclass(frozen, module = "shellseam._core")]
pub struct RootCheck {
    entries: Vec<(std::ffi::CString, Option<Identity>)>,
}

/// A directory's (device, inode).
type Identity = (u64, u64);

#[pymethods]
impl RootCheck {
    #[new]
    fn new(entries: Vec<(Vec<u8>, Option<Identity>)>) -> PyResult<Self> {
        let entries = entries
            .into_iter()
            .map(|(path, ident)| {
                std::ffi::CString::new(path)
                    .map(|path| (path, ident))
                    .map_err(|_| PyValueError::new_err("a root path contains a NUL byte"))
            })
            .collect::<PyResult<_>>()?;
        Ok(Self { entries })
    }

    /// Whether every path still names the directory it was pinned to, or still names
    /// nothing.
    pub(crate) fn still_same(&self) -> bool {
        self.entries.iter().all(
            |(path, ident)| match nix::sys::stat::stat(path.as_c_str()) {
                Ok(st) => Some((st.st_dev, st.st_ino)) == *ident,
                Err(_) => ident.is_none(),
            },
        )
    }
}
