//! A cgroup per call: containment of every descendant, whole-call limits and accounting.
//!
//! The call's processes live in a cgroup v2 directory under a parent the service owns, so a
//! process that leaves the command's session (`setsid`, a double-forking daemon) is still
//! found, signalled and counted, and `cgroup.kill` empties the call at the end. Limits use
//! the controllers the host offers: v2 `memory`/`pids` where enabled, else (legacy/hybrid
//! hosts) per-call v1 `memory` and `pids` cgroups that the child joins before exec. CPU time
//! comes from the v2 `cpu.stat`, which exists without any controller.
//!
//! `mkdir`/`rmdir` stay off the hot path: a call takes a cgroup from the service's pool and
//! gives it back once empty; counters that cannot be reset (CPU, `pids.events`, OOM kills)
//! are read as a baseline when the cgroup returns to the pool. A cgroup whose members would
//! not die (uninterruptible sleep) is never reused, nor one still charged with something of
//! its call (zombies, tmpfs pages): it would weigh on the next call.

mod call;
mod hierarchy;
mod service;

pub use call::{rearm_events, CallCgroup};
pub use hierarchy::{hierarchy, Hierarchy};
pub use service::ServiceCgroups;

use std::ffi::CString;
use std::fs;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Limits of one call that the cgroup enforces (the rest are rlimits, see `spawn.rs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeLimits {
    pub memory_bytes: Option<u64>,
    pub max_processes: Option<u64>,
}

/// Accounting of one finished call.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu_usec: u64,
    pub peak_memory_bytes: Option<u64>,
    pub oom_killed: bool,
    pub forks_refused: bool,
}

/// A directory held as a base for `openat` (and for `clone3(CLONE_INTO_CGROUP)`, which
/// takes an `O_PATH` fd): no read or write of the directory itself goes through it.
pub(super) fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: opens a NUL-terminated path; the returned fd is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the directory `name` in the directory open as `dir`; one that exists is taken.
pub(super) fn mkdir_at(dir: RawFd, name: &str) -> io::Result<()> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: mkdirat relative to a directory fd we hold, with a NUL-terminated name.
    if unsafe { libc::mkdirat(dir, c.as_ptr(), 0o755) } == 0 {
        return Ok(());
    }
    match io::Error::last_os_error() {
        e if e.raw_os_error() == Some(libc::EEXIST) => Ok(()),
        e => Err(e),
    }
}

/// Opens `name` under `dir`, never waiting: with `O_NONBLOCK` a file lease that conflicts
/// fails the open with `EWOULDBLOCK` at once. Without it, a lease a root command took on
/// a pooled cgroup's file held the setup of a later call (a spawner thread, a caller) for
/// `fs.lease-break-time`, 45 s, far past its timeout (found by attacking).
pub(super) fn open_at(dir: RawFd, name: &str, flags: libc::c_int) -> io::Result<fs::File> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: openat relative to a directory fd we hold, with a NUL-terminated name.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC | libc::O_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { fs::File::from_raw_fd(fd) })
}

/// Reads a cgroup file, or a /proc file (`stat`, `cgroup`; `dir` AT_FDCWD): one `read` per
/// small file instead of `read_to_string`'s probes and `statx` (see `read_whole`).
pub(crate) fn read_at(dir: RawFd, name: &str) -> io::Result<String> {
    read_whole(&open_at(dir, name, libc::O_RDONLY)?)
}

/// Reads a kernfs or procfs file from offset 0 with `pread`, so that a held fd can be read
/// again (kernfs regenerates the file for each read at offset 0).
///
/// Both hand out at most a page of whole records per read, so a read of a long list
/// (`cgroup.procs` with a thousand pids) comes back short long before the end: only a read
/// shorter than half a page, which no record of these files comes near, or an empty one, is
/// the end. (Taking any short read for the end cut `cgroup.procs` at ~680 pids: the rest
/// went uncounted, and a process `cgroup.kill` misses was never killed by pid.)
pub(super) fn read_whole(file: &fs::File) -> io::Result<String> {
    const PAGE: usize = 4096;
    let mut buf = vec![0u8; PAGE];
    let mut len = 0;
    loop {
        if buf.len() - len < PAGE {
            buf.resize(buf.len() * 2, 0);
        }
        let n = file.read_at(&mut buf[len..], len as u64)?;
        len += n;
        if n < PAGE / 2 {
            break;
        }
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|_| io::Error::from_raw_os_error(libc::EILSEQ))
}

/// The value of `key` in a flat-keyed file (`cpu.stat`, `cgroup.events`, `pids.events`).
pub(super) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The pids a `cgroup.procs` text lists.
pub(crate) fn procs(text: &str) -> Vec<libc::pid_t> {
    text.lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// At most this many cgroups below a call's are looked into (a command may make a deep or
/// wide tree of them; the walk is iterative and bounded, never recursive).
const SUBTREE_MAX: usize = 4096;

/// The cgroups below `dir` (not `dir` itself), parents before children, at most
/// `SUBTREE_MAX`.
pub(crate) fn cgroups_below(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut next = 0;
    let mut from = dir.to_path_buf();
    loop {
        if let Ok(entries) = fs::read_dir(&from) {
            for entry in entries.flatten() {
                if found.len() >= SUBTREE_MAX {
                    return found;
                }
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    found.push(entry.path());
                }
            }
        }
        let Some(path) = found.get(next) else {
            return found;
        };
        from = path.clone();
        next += 1;
    }
}

/// The processes of every cgroup below `dir` (see `cgroups_below`). Never waits on a lease
/// (see `open_at`: a command owns the files of a cgroup it made).
pub(crate) fn procs_below(dir: &Path) -> Vec<libc::pid_t> {
    cgroups_below(dir)
        .iter()
        .filter_map(|d| read_at(libc::AT_FDCWD, &d.join("cgroup.procs").to_string_lossy()).ok())
        .flat_map(|t| procs(&t))
        .collect()
}

/// Removes `dir` and every cgroup below it, children first (rmdir refuses a cgroup that has
/// children or processes: those stay). Pass after pass while one removes something, for a
/// tree larger than one walk takes.
pub fn remove_tree(dir: &Path) {
    loop {
        let below = cgroups_below(dir);
        let removed = below
            .iter()
            .rev()
            .filter(|d| fs::remove_dir(d).is_ok())
            .count();
        if below.is_empty() || removed == 0 {
            break;
        }
    }
    let _ = fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_keyed_values() {
        let t = "usage_usec 42\nuser_usec 40\n";
        assert_eq!(keyed(t, "usage_usec"), Some(42));
        assert_eq!(keyed(t, "nope"), None);
        assert_eq!(keyed("populated 0\nfrozen 0\n", "populated"), Some(0));
    }
}
