//! One call's cgroup: the v2 directory the child is cloned into plus the v1 `memory`/`pids`
//! cgroups it joins on hybrid hosts. It applies the call's tree limits, lists and signals
//! the members, kills them all (`cgroup.kill`), watches `cgroup.events` for emptying and
//! reads the call's usage against baselines taken when the cgroup last went to the pool.

use std::fs;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The most pids a 64-bit kernel can hand out (`PID_MAX_LIMIT`, 4 Mi).
const PID_MAX_LIMIT: u64 = 4 * 1024 * 1024;

use super::{keyed, lock, mkdir_at, open_at, read_whole, TreeLimits, Usage};

/// One cgroup directory of a call (v2 or one v1 controller), reached from its parent's fd
/// (which the service holds): a file is opened as `c<n>/<file>` relative to the parent, one
/// short lookup, and the directory itself is opened (`O_PATH`) only for what needs its fd,
/// `clone3(CLONE_INTO_CGROUP)`. The files a call reads or the child writes (`cpu.stat`,
/// `pids.current`, v1 `tasks`, ...) are opened on first use and kept while the cgroup is in
/// use or warm in the pool: a `pread` on a held kernfs file costs ~1.5 us where
/// open/read/close costs ~8 us. A call's cgroup other than the warm one lets go of its
/// descriptors once its child is spawned (`CallCgroup::shed`): every descriptor the harness
/// holds is copied into each child it spawns and closed again at exec (~70 ns each), and
/// one call in flight holds three (two pipes and the pidfd) instead of six; four where
/// the kernel resets `memory.peak` per open file (see `Peak`). Cold pooled
/// cgroups hold none (see `ServiceCgroups::pool`). Reopening by name trusts the name: an
/// unconfined command of a root harness could rename its cgroup, as it can leave it (the
/// README's open holes); a confined one cannot write the cgroup tree.
pub(super) struct Dir {
    pub(super) path: PathBuf,
    parent: Arc<OwnedFd>,
    leaf: String,
    fd: OnceLock<OwnedFd>,
    files: Mutex<Vec<(&'static str, fs::File)>>,
}

impl Dir {
    /// Makes (or takes, when it exists) the directory `leaf` of the parent open as `parent`,
    /// whose path is `parent_path`.
    pub(super) fn create(
        parent: &Arc<OwnedFd>,
        parent_path: &Path,
        leaf: String,
    ) -> io::Result<Self> {
        mkdir_at(parent.as_raw_fd(), &leaf)?;
        Ok(Self {
            path: parent_path.join(&leaf),
            parent: Arc::clone(parent),
            leaf,
            fd: OnceLock::new(),
            files: Mutex::new(Vec::new()),
        })
    }

    /// The directory's own fd (`O_PATH`), opened on first use.
    fn fd(&self) -> io::Result<RawFd> {
        if let Some(fd) = self.fd.get() {
            return Ok(fd.as_raw_fd());
        }
        let fd: OwnedFd = open_at(
            self.parent.as_raw_fd(),
            &self.leaf,
            libc::O_PATH | libc::O_DIRECTORY,
        )?
        .into();
        // Another thread may have set one meanwhile: then ours is closed, theirs used.
        let _ = self.fd.set(fd);
        self.fd
            .get()
            .map(AsRawFd::as_raw_fd)
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
    }

    /// The directory's fd, or -1 when it cannot be opened (every use then fails cleanly
    /// with EBADF).
    pub(super) fn raw(&self) -> RawFd {
        self.fd().unwrap_or(-1)
    }

    /// Opens the directory's file `name` (not held).
    pub(super) fn open_file(&self, name: &str, flags: libc::c_int) -> io::Result<fs::File> {
        open_at(
            self.parent.as_raw_fd(),
            &format!("{}/{name}", self.leaf),
            flags,
        )
    }

    /// Writes `value` to the directory's file `name`.
    pub(super) fn write(&self, name: &str, value: &str) -> io::Result<()> {
        self.open_file(name, libc::O_WRONLY)?
            .write_all(value.as_bytes())
    }

    /// Runs `f` on the held file `name` (opened with `flags` on first use).
    fn with_file<T>(
        &self,
        name: &'static str,
        flags: libc::c_int,
        f: impl FnOnce(&fs::File) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut files = lock(&self.files);
        if let Some((_, file)) = files.iter().find(|(n, _)| *n == name) {
            return f(file);
        }
        let file = self.open_file(name, flags)?;
        let out = f(&file);
        files.push((name, file));
        out
    }

    /// Whether cgroups were made below this one (see `CallCgroup::members`); a directory
    /// that cannot be looked at counts as having some.
    fn has_children(&self) -> bool {
        nix::sys::stat::fstatat(
            &*self.parent,
            self.leaf.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_or(true, |st| st.st_nlink > 2)
    }

    /// The whole of a small cgroup file, read from offset 0 of its held fd.
    pub(super) fn read(&self, name: &'static str) -> io::Result<String> {
        self.with_file(name, libc::O_RDONLY, read_whole)
    }

    /// A held write-only fd on `name` (the v1 `tasks` file the child writes "0" to).
    fn write_fd(&self, name: &'static str) -> io::Result<RawFd> {
        self.with_file(name, libc::O_WRONLY, |f| Ok(f.as_raw_fd()))
    }

    /// Opens `names` for reading now (see `CallCgroup::warm`).
    fn preopen(&self, names: &[&'static str]) -> io::Result<()> {
        for name in names {
            self.with_file(name, libc::O_RDONLY, |_| Ok(()))?;
        }
        Ok(())
    }

    /// Closes every held file but `keep`.
    fn retain(&self, keep: &[&'static str]) {
        lock(&self.files).retain(|(name, _)| keep.contains(name));
    }

    /// Closes the directory and every held file (a later use opens what it needs again).
    pub(super) fn close(&mut self) {
        self.fd.take();
        lock(&self.files).clear();
    }
}

/// Files of the v2 directory every call reads.
const V2_WARM: &[&str] = &["cgroup.procs", "cpu.stat"];
/// Files of the pids controller's directory every call with a process limit reads.
const PIDS_WARM: &[&str] = &["pids.current", "pids.events"];
/// What a warm cgroup keeps open: the v2 directory's files (with the pids files when the
/// controller is enabled there), the v1 pids cgroup's files and the `tasks` file its
/// child writes.
const V2_PIDS_WARM: &[&str] = &["cgroup.procs", "cpu.stat", "pids.current", "pids.events"];
const PIDS_V1_KEEP: &[&str] = &["pids.current", "pids.events", "tasks"];

/// Where a call's v2 memory peak comes from.
pub(super) enum Peak {
    /// An fd on `memory.peak` that "reset" was written to when the call began: it reads
    /// the peak since then (kernel 6.12+; the reset is per open file, so the fd is held for
    /// the call: four descriptors per call in flight on such hosts, not three).
    Since(fs::File),
    /// The kernel cannot reset the peak (5.19 to 6.11, where `memory.peak` is read-only):
    /// the cgroup's lifetime peak, which is the call's own in a cgroup made for it.
    Lifetime,
    /// Not known: no `memory.peak` (before 5.19), or a reused cgroup that cannot reset it
    /// (an earlier call's peak must not be reported as this one's).
    Unknown,
}

impl Peak {
    /// Starts watching the peak of a call in `dir` (`fresh`: no call ran there before).
    /// Never fails: a peak that cannot be reset costs the report, not the call's cgroup.
    pub(super) fn watch(dir: &Dir, fresh: bool) -> Self {
        let reset = dir
            .open_file("memory.peak", libc::O_RDWR)
            .and_then(|mut f| f.write_all(b"reset").map(|()| f));
        match reset {
            Ok(file) => Self::Since(file),
            Err(_) if fresh => Self::Lifetime,
            Err(_) => Self::Unknown,
        }
    }

    /// The peak in bytes as the kernel wrote it (None: not known).
    pub(super) fn read(self, dir: &Dir) -> Option<String> {
        match self {
            // From offset 0: the reset moved the file position.
            Self::Since(file) => super::read_whole(&file).ok(),
            Self::Lifetime => dir
                .open_file("memory.peak", libc::O_RDONLY)
                .and_then(|f| super::read_whole(&f))
                .ok(),
            Self::Unknown => None,
        }
    }
}

/// One call's cgroups. `dir` is what the child is cloned into; `memory`/`pids` are v1
/// cgroups the child joins before exec (hybrid hosts).
pub struct CallCgroup {
    pub(super) dir: Dir,
    pub(super) memory: Option<Dir>,
    pub(super) pids: Option<Dir>,
    pub(super) v2_memory: bool,
    pub(super) v2_pids: bool,
    pub(super) applied: TreeLimits,
    /// `cgroup.kill` was written: on this kernel generation a later
    /// `clone3(CLONE_INTO_CGROUP)` into it compares kill sequence numbers of two different
    /// cgroups and SIGKILLs the new child, so a killed cgroup is never reused.
    pub(super) killed: bool,
    /// Whether this call uses the memory / pids controller (joined on v1, always on v2).
    pub(super) use_memory: bool,
    pub(super) use_pids: bool,
    /// The service's warm cgroup (see `ServiceCgroups::acquire`).
    pub(super) home: bool,
    /// How the call's v2 `memory.peak` is read (see `Peak`).
    pub(super) peak: Peak,
    /// No call ran in the cgroup yet (made for this one).
    pub(super) fresh: bool,
    /// A command made cgroups below this one (seen by `members`): never reused.
    pub(super) nested: std::cell::Cell<bool>,
    pub(super) cpu_base: u64,
    pub(super) pids_max_base: u64,
    pub(super) oom_base: u64,
}

impl CallCgroup {
    /// The v2 directory fd for `clone3(CLONE_INTO_CGROUP)`.
    pub fn dir_fd(&self) -> RawFd {
        self.dir.raw()
    }

    /// The v1 `tasks` files the child joins by writing "0" to them (held fds, so the child
    /// makes one syscall per join): only the controllers this call needs, since each join
    /// is a cgroup migration. Err: a file could not be opened (the spawn fails with it).
    pub fn join_fds(&self) -> io::Result<Vec<RawFd>> {
        let memory = self.memory.as_ref().filter(|_| self.use_memory);
        let pids = self.pids.as_ref().filter(|_| self.use_pids);
        [memory, pids]
            .into_iter()
            .flatten()
            .map(|d| d.write_fd("tasks"))
            .collect()
    }

    pub fn path(&self) -> &Path {
        &self.dir.path
    }

    fn memory_file(&self) -> (&str, &str, Option<&Dir>) {
        if self.v2_memory {
            ("memory.max", "memory.swap.max", Some(&self.dir))
        } else {
            (
                "memory.limit_in_bytes",
                "memory.memsw.limit_in_bytes",
                self.memory.as_ref(),
            )
        }
    }

    /// Where the call's pids controller lives (v2 directory or v1 `pids` cgroup).
    fn pids_dir(&self) -> Option<&Dir> {
        if self.v2_pids {
            Some(&self.dir)
        } else {
            self.pids.as_ref()
        }
    }

    /// Sets the call's whole-tree limits, writing only what changed since the last use.
    pub fn apply(&mut self, limits: TreeLimits) -> io::Result<()> {
        // On v1 a controller costs a migration per call: only a call with that limit pays.
        self.use_memory = self.v2_memory || limits.memory_bytes.is_some();
        self.use_pids = self.v2_pids || limits.max_processes.is_some();
        if self.v2_memory {
            self.peak = Peak::watch(&self.dir, self.fresh);
        } else if self.use_memory {
            if let Some(mem) = &self.memory {
                // The peak of this call only: reset to the current usage.
                let _ = mem.write("memory.max_usage_in_bytes", "0");
            }
        }
        self.fresh = false;
        if limits.memory_bytes != self.applied.memory_bytes {
            let (limit, swap, dir) = self.memory_file();
            if let Some(dir) = dir {
                let unlimited = if self.v2_memory { "max" } else { "-1" };
                let value = limits
                    .memory_bytes
                    .map_or(unlimited.to_string(), |v| v.to_string());
                if self.v2_memory {
                    dir.write(limit, &value)?;
                    let _ = dir.write(
                        swap,
                        if limits.memory_bytes.is_some() {
                            "0"
                        } else {
                            "max"
                        },
                    );
                } else {
                    // v1 requires memsw >= memory at every step: order the two writes.
                    let lowering = match (limits.memory_bytes, self.applied.memory_bytes) {
                        (Some(new), Some(old)) => new < old,
                        (Some(_), None) => true,
                        (None, _) => false,
                    };
                    if lowering {
                        dir.write(limit, &value)?;
                        let _ = dir.write(swap, &value);
                    } else {
                        let _ = dir.write(swap, &value);
                        dir.write(limit, &value)?;
                    }
                }
            }
            if self.v2_memory {
                // The kernel's OOM kill takes the whole call, not one process of it.
                let group = if limits.memory_bytes.is_some() {
                    "1"
                } else {
                    "0"
                };
                let _ = self.dir.write("memory.oom.group", group);
            }
            self.applied.memory_bytes = limits.memory_bytes;
        }
        if limits.max_processes != self.applied.max_processes {
            if let Some(dir) = self.pids_dir() {
                // The kernel refuses a pids.max above PID_MAX_LIMIT; no more processes than
                // that can exist, so a larger limit is no limit.
                let value = limits
                    .max_processes
                    .filter(|&v| v <= PID_MAX_LIMIT)
                    .map_or("max".to_string(), |v| v.to_string());
                dir.write("pids.max", &value)?;
            }
            self.applied.max_processes = limits.max_processes;
        }
        Ok(())
    }

    fn dirs(&mut self) -> impl Iterator<Item = &mut Dir> {
        [
            Some(&mut self.dir),
            self.memory.as_mut(),
            self.pids.as_mut(),
        ]
        .into_iter()
        .flatten()
    }

    /// Opens the v2 directory the child is cloned into: a cgroup gone from under us fails
    /// here, before the spawn, and the call goes without (see `CallContainment::prepare`).
    pub(super) fn open(&mut self) -> io::Result<()> {
        self.dir.fd().map(|_| ())
    }

    /// Opens what every call reads or its child writes, so that the warm cgroup holds the
    /// same descriptors whatever its last call read: `trim` closes the rest.
    pub(super) fn warm(&mut self) -> io::Result<()> {
        self.open()?;
        self.dir.preopen(V2_WARM)?;
        if let Some(p) = self.pids_dir() {
            p.preopen(PIDS_WARM)?;
        }
        if let (false, Some(p)) = (self.v2_pids, &self.pids) {
            p.write_fd("tasks")?;
        }
        Ok(())
    }

    /// Back to what `warm` opened.
    pub(super) fn trim(&mut self) {
        self.dir
            .retain(if self.v2_pids { V2_PIDS_WARM } else { V2_WARM });
        if let Some(p) = &self.pids {
            p.retain(PIDS_V1_KEEP);
        }
        if let Some(m) = &self.memory {
            m.retain(&[]);
        }
    }

    /// Closes the call's directory and file fds, its peak's too (a cold cgroup holds none).
    pub fn close(&mut self) {
        self.dirs().for_each(Dir::close);
        self.peak = Peak::Unknown;
    }

    /// The child is spawned: clone3 put it in the v2 directory and it joined the v1
    /// cgroups before exec. A cgroup other than the warm one closes its descriptors now
    /// (see `Dir`); what the call reads later opens its files again.
    pub fn shed(&mut self) {
        if !self.home {
            // The peak's fd stays: its reset holds for that open file only.
            self.dirs().for_each(Dir::close);
        }
    }

    /// Reads the baselines of counters that cannot be reset (a new cgroup).
    pub(super) fn rebase(&mut self) {
        self.cpu_base = self.cpu_usec_total();
        self.pids_max_base = self.pids_max_events();
        self.oom_base = self.oom_kills();
    }

    fn cpu_usec_total(&self) -> u64 {
        self.dir
            .read("cpu.stat")
            .ok()
            .and_then(|t| keyed(&t, "usage_usec"))
            .unwrap_or(0)
    }

    fn pids_max_events(&self) -> u64 {
        self.pids_dir()
            .and_then(|d| d.read("pids.events").ok())
            .and_then(|t| keyed(&t, "max"))
            .unwrap_or(0)
    }

    fn oom_kills(&self) -> u64 {
        if self.v2_memory {
            return self
                .dir
                .read("memory.events")
                .ok()
                .and_then(|t| keyed(&t, "oom_kill"))
                .unwrap_or(0);
        }
        self.memory
            .as_ref()
            .and_then(|m| m.read("memory.oom_control").ok())
            .and_then(|t| keyed(&t, "oom_kill"))
            .unwrap_or(0)
    }

    /// CPU time of the call so far (user + system of every member, living or gone).
    pub fn cpu_usec(&self) -> u64 {
        self.cpu_usec_total().saturating_sub(self.cpu_base)
    }

    /// Accounting of the call; read once, before its completion is signalled, when its
    /// processes are gone. The totals read become the next call's baselines.
    pub fn usage(&mut self) -> Usage {
        let peak = if self.v2_memory {
            std::mem::replace(&mut self.peak, Peak::Unknown).read(&self.dir)
        } else if self.use_memory {
            self.memory
                .as_ref()
                .and_then(|m| m.read("memory.max_usage_in_bytes").ok())
        } else {
            None
        };
        let cpu_total = self.cpu_usec_total();
        let mut usage = Usage {
            cpu_usec: cpu_total.saturating_sub(self.cpu_base),
            peak_memory_bytes: peak.and_then(|t| t.trim().parse().ok()),
            oom_killed: false,
            forks_refused: false,
        };
        self.cpu_base = cpu_total;
        if self.use_memory {
            let ooms = self.oom_kills();
            usage.oom_killed = ooms > self.oom_base;
            self.oom_base = ooms;
        }
        if self.use_pids {
            let refused = self.pids_max_events();
            usage.forks_refused = refused > self.pids_max_base;
            self.pids_max_base = refused;
        }
        usage
    }

    /// Whether the call uses a pids controller (see `pids_charged`).
    pub fn counts_pids(&self) -> bool {
        self.use_pids
    }

    /// Tasks charged to the call's pids controller, zombies included until reaped (None:
    /// the call uses none; an unreadable count is taken as charged).
    pub fn pids_charged(&self) -> Option<u64> {
        if !self.use_pids {
            return None;
        }
        Some(charge(self.pids_dir(), "pids.current"))
    }

    /// Bytes charged to the call's memory controller: what its processes still hold, and
    /// what outlives them (tmpfs pages, page cache, kernel objects). None: the call uses none.
    pub fn memory_charged(&self) -> Option<u64> {
        if !self.use_memory {
            return None;
        }
        Some(if self.v2_memory {
            charge(Some(&self.dir), "memory.current")
        } else {
            charge(self.memory.as_ref(), "memory.usage_in_bytes")
        })
    }

    /// Live members (zombies are not listed by cgroup v2), in the cgroup and in any a
    /// command made below it (any process may make one in a cgroup its user owns, as a
    /// nested container runtime does; found by attacking: a process moved there was never
    /// counted nor killed). Those are looked for only when the directory's link count,
    /// 2 plus its subdirectories on kernfs, says there are some: one `fstatat`.
    pub fn members(&self) -> Vec<libc::pid_t> {
        let mut pids = self
            .dir
            .read("cgroup.procs")
            .map(|t| super::procs(&t))
            .unwrap_or_default();
        if self.nested.get() || self.dir.has_children() {
            self.nested.set(true);
            pids.extend(super::procs_below(&self.dir.path));
        }
        pids
    }

    /// Whether `members` found cgroups below this one.
    pub fn nested(&self) -> bool {
        self.nested.get()
    }

    /// Whether cgroups are below this one now (a process that made one may have exited
    /// since `members` looked): one `fstatat`.
    pub fn has_children(&self) -> bool {
        self.dir.has_children()
    }

    /// Whether any process is still in the cgroup.
    pub fn populated(&self) -> bool {
        self.dir
            .read("cgroup.events")
            .ok()
            .and_then(|t| keyed(&t, "populated"))
            != Some(0)
    }

    /// An fd on `cgroup.events` that raises EPOLLPRI when `populated` changes.
    pub fn events_fd(&self) -> io::Result<OwnedFd> {
        Ok(self.dir.open_file("cgroup.events", libc::O_RDONLY)?.into())
    }

    /// On a v1 memory controller with a limit: an eventfd the kernel signals when the call's
    /// cgroup runs out of memory (`cgroup.event_control` on `memory.oom_control`), so that
    /// the whole call can be killed, as v2's `memory.oom.group` does by itself. None when
    /// there is no such controller or limit; the registration ends when the fd is closed.
    pub fn oom_events(&self) -> io::Result<Option<OwnedFd>> {
        if self.v2_memory || !self.use_memory || self.applied.memory_bytes.is_none() {
            return Ok(None);
        }
        let Some(mem) = &self.memory else {
            return Ok(None);
        };
        // SAFETY: eventfd with integer flags; the fd is owned right away.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd returned by eventfd above, owned only here.
        let efd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(efd) };
        let control = mem.open_file("memory.oom_control", libc::O_RDONLY)?;
        let line = format!("{} {}", efd.as_raw_fd(), control.as_raw_fd());
        mem.write("cgroup.event_control", &line)?;
        Ok(Some(efd))
    }

    /// SIGKILLs every member at once, including ones forked while we look.
    pub fn kill_all(&mut self) -> io::Result<()> {
        self.killed = true;
        self.dir.write("cgroup.kill", "1")
    }
}

/// A counter file's value; u64::MAX when it cannot be read (never mistaken for empty).
fn charge(dir: Option<&Dir>, name: &'static str) -> u64 {
    dir.ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))
        .and_then(|d| d.read(name))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

/// Re-arms an EPOLLPRI watch on `cgroup.events`: kernfs reports a change until the file
/// is read again.
pub fn rearm_events(fd: &OwnedFd) {
    let mut buf = [0u8; 128];
    // SAFETY: pread into a stack buffer from an fd we own.
    unsafe {
        libc::pread(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            0,
        )
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{hierarchy, ServiceCgroups};
    use std::ffi::CString;

    /// Removes a test's directory tree, also when an assertion fails.
    struct TempTree(std::path::PathBuf);
    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    /// A call's cgroup on a v2 memory controller in `dir` (a plain directory in tests).
    fn v2_memory_call(dir: Dir, fresh: bool) -> CallCgroup {
        CallCgroup {
            dir,
            memory: None,
            pids: None,
            v2_memory: true,
            v2_pids: false,
            applied: TreeLimits::default(),
            killed: false,
            use_memory: false,
            use_pids: false,
            home: false,
            peak: Peak::Unknown,
            fresh,
            nested: std::cell::Cell::new(false),
            cpu_base: 0,
            pids_max_base: 0,
            oom_base: 0,
        }
    }

    #[test]
    fn a_peak_that_cannot_be_reset_costs_the_report_not_the_cgroup() {
        use std::os::unix::fs::PermissionsExt;
        // Kernels 5.19 to 6.11 have a read-only `memory.peak`, older ones none: opening it
        // for the reset failed, and with it every call's cgroup (the call ran uncontained).
        // A plain directory stands in for the cgroup.
        let root = TempTree(std::env::temp_dir().join(format!("peak-{}", std::process::id())));
        fs::create_dir(&root.0).unwrap();
        fs::set_permissions(&root.0, fs::Permissions::from_mode(0o755)).unwrap();
        let parent = Arc::new(super::super::open_dir(&root.0).unwrap());
        let dir = Dir::create(&parent, &root.0, "c0".into()).unwrap();
        // Whatever the umask made of it: the test's thread must enter it.
        fs::set_permissions(root.0.join("c0"), fs::Permissions::from_mode(0o755)).unwrap();
        let mut cg = v2_memory_call(dir, true);
        cg.apply(TreeLimits::default())
            .expect("no memory.peak at all");
        assert_eq!(cg.usage().peak_memory_bytes, None);
        let file = root.0.join("c0/memory.peak");
        fs::write(&file, "1234\n").unwrap();
        fs::set_permissions(&file, fs::Permissions::from_mode(0o444)).unwrap();
        cg.fresh = true;
        // The kernel refuses to open a read-only kernfs file for writing even to root; a
        // thread whose fsuid is not 0 loses CAP_DAC_OVERRIDE and is refused the same way.
        let (fresh, reused) = std::thread::spawn(move || {
            // SAFETY: setfsuid changes only this thread's filesystem uid.
            unsafe { libc::setfsuid(65534) };
            let fresh = cg.apply(TreeLimits::default()).map(|()| cg.usage());
            let reused = cg.apply(TreeLimits::default()).map(|()| cg.usage());
            // SAFETY: as above, back to root for this thread.
            unsafe { libc::setfsuid(0) };
            (fresh, reused)
        })
        .join()
        .unwrap();
        let peak = |u: io::Result<Usage>| u.expect("the cgroup is kept").peak_memory_bytes;
        assert_eq!(peak(fresh), Some(1234), "a cgroup made for the call");
        assert_eq!(
            peak(reused),
            None,
            "an earlier call's peak is not this one's"
        );
    }

    #[test]
    fn a_peak_fd_is_kept_through_the_call_and_closed_with_its_cgroup() {
        // The reset holds for the open file that wrote it: shedding the cgroup's descriptors
        // after the spawn keeps it, closing the cgroup (a spawn failure, a cgroup lost) does
        // not leave it open until the cgroup is removed.
        let root = TempTree(std::env::temp_dir().join(format!("peak-fd-{}", std::process::id())));
        fs::create_dir(&root.0).unwrap();
        let parent = Arc::new(super::super::open_dir(&root.0).unwrap());
        let dir = Dir::create(&parent, &root.0, "c0".into()).unwrap();
        fs::write(root.0.join("c0/memory.peak"), "0\n").unwrap();
        let mut cg = v2_memory_call(dir, false);
        cg.apply(TreeLimits::default()).unwrap();
        assert!(matches!(cg.peak, Peak::Since(_)));
        cg.shed();
        assert!(matches!(cg.peak, Peak::Since(_)), "shed after the spawn");
        cg.close();
        assert!(matches!(cg.peak, Peak::Unknown));
    }

    #[test]
    fn child_is_cloned_into_its_cgroup_with_rlimits() {
        use crate::spawn::{spawn, SpawnPlan};
        let h = hierarchy();
        if h.v2.is_none() {
            return;
        }
        let svc = ServiceCgroups::new(h).expect("service cgroups");
        let mut cg = svc
            .acquire(TreeLimits {
                memory_bytes: None,
                max_processes: Some(8),
            })
            .expect("acquire");
        let c = |s: &str| CString::new(s).unwrap();
        let plan = SpawnPlan {
            cgroup: Some(cg.dir_fd()),
            join_cgroups: cg.join_fds().expect("tasks files"),
            rlimits: vec![(libc::RLIMIT_NOFILE, 77, 77)],
            ..SpawnPlan::new(
                c("/bin/sleep"),
                vec![c("sleep"), c("5")],
                std::sync::Arc::new(vec![]),
                c("/"),
            )
        };
        let child = spawn(&plan).expect("spawn");
        assert_eq!(cg.members(), vec![child.pid]);
        assert!(cg.populated());
        let own = fs::read_to_string(format!("/proc/{}/cgroup", child.pid)).unwrap();
        let name = svc
            .parent()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            own.lines().filter(|l| l.contains(&name)).count() >= 2,
            "{own}"
        );
        let limits = fs::read_to_string(format!("/proc/{}/limits", child.pid)).unwrap();
        assert!(
            limits
                .lines()
                .any(|l| l.starts_with("Max open files") && l.contains(" 77 ")),
            "{limits}"
        );
        cg.kill_all().expect("cgroup.kill");
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(child.pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status));
        assert!(!cg.populated());
        let killed = cg.path().to_path_buf();
        svc.release(cg);
        assert!(!killed.exists(), "a killed cgroup is removed, never pooled");
        svc.remove_all();
        assert!(!svc.parent().exists());
    }
}
