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
//! not die (uninterruptible sleep) is never reused.

use std::ffi::CString;
use std::fs;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Idle cgroups kept per service for reuse; more are removed when they come back.
const POOL_MAX: usize = 64;

/// What the host offers, discovered once per process.
#[derive(Debug, Clone, Default)]
pub struct Hierarchy {
    /// This process's own cgroup v2 directory, when a cgroup2 hierarchy is mounted.
    pub v2: Option<PathBuf>,
    /// Own v1 `memory` / `pids` cgroup directories (hybrid or legacy hosts).
    pub memory_v1: Option<PathBuf>,
    pub pids_v1: Option<PathBuf>,
    /// Controllers enabled for v2 children of our cgroup (unified-only hosts).
    pub v2_memory: bool,
    pub v2_pids: bool,
}

/// One line of `/proc/self/mountinfo` that is a cgroup mount.
#[derive(Debug, PartialEq)]
struct CgroupMount {
    root: String,
    mount_point: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

/// Octal escapes (`\040` for a space) used by mountinfo for odd characters in paths.
fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.len() < 3 {
            continue;
        }
        let fstype = right[0];
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let controllers = if fstype == "cgroup" {
            right[2].split(',').map(str::to_string).collect()
        } else {
            Vec::new()
        };
        mounts.push(CgroupMount {
            root: unescape_mount_path(left[3]),
            mount_point: PathBuf::from(unescape_mount_path(left[4])),
            v2: fstype == "cgroup2",
            controllers,
        });
    }
    mounts
}

/// `(hierarchy id, controllers, path)` lines of `/proc/self/cgroup`.
fn parse_proc_cgroup(text: &str) -> Vec<(String, Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.to_string();
            let ctrls = parts.next()?;
            let path = parts.next()?.to_string();
            let ctrls = ctrls
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Some((id, ctrls, path))
        })
        .collect()
}

/// The directory of our cgroup `path` inside a mount whose root is `root`.
fn own_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str())?
    };
    let rel = rel.trim_start_matches('/');
    let dir = if rel.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(rel)
    };
    dir.is_dir().then_some(dir)
}

fn discover_from(mountinfo: &str, proc_cgroup: &str) -> Hierarchy {
    let mounts = parse_mountinfo(mountinfo);
    let own = parse_proc_cgroup(proc_cgroup);
    let mut h = Hierarchy::default();
    for (id, ctrls, path) in &own {
        if id == "0" && ctrls.is_empty() {
            if let Some(m) = mounts.iter().find(|m| m.v2) {
                h.v2 = own_dir(m, path);
            }
            continue;
        }
        for wanted in ["memory", "pids"] {
            if !ctrls.iter().any(|c| c == wanted) {
                continue;
            }
            let Some(m) = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == wanted))
            else {
                continue;
            };
            let dir = own_dir(m, path);
            if wanted == "memory" {
                h.memory_v1 = dir;
            } else {
                h.pids_v1 = dir;
            }
        }
    }
    if let Some(v2) = &h.v2 {
        // `cgroup.kill` (5.14) is what empties a call; without it, no cgroup containment.
        if !v2.join("cgroup.kill").exists() && !has_kill_in_children(v2) {
            h.v2 = None;
        }
    }
    if let Some(v2) = &h.v2 {
        let ctrls = fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
        h.v2_memory = ctrls.split_whitespace().any(|c| c == "memory");
        h.v2_pids = ctrls.split_whitespace().any(|c| c == "pids");
    }
    h
}

/// The root cgroup has no `cgroup.kill`; its children do when the kernel supports it.
fn has_kill_in_children(dir: &Path) -> bool {
    let probe = dir.join(format!("shellseam-probe-{}", std::process::id()));
    if fs::create_dir(&probe).is_err() {
        return false;
    }
    let ok = probe.join("cgroup.kill").exists();
    let _ = fs::remove_dir(&probe);
    ok
}

/// The host's hierarchy, discovered on first use.
pub fn hierarchy() -> &'static Hierarchy {
    static H: OnceLock<Hierarchy> = OnceLock::new();
    H.get_or_init(|| {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        discover_from(&mountinfo, &own)
    })
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

fn open_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: opens a NUL-terminated path; the returned fd is owned below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn open_at(dir: RawFd, name: &str, flags: libc::c_int) -> io::Result<fs::File> {
    let c = CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: openat relative to a directory fd we hold, with a NUL-terminated name.
    let fd = unsafe { libc::openat(dir, c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { fs::File::from_raw_fd(fd) })
}

/// Reads a cgroup file. kernfs hands over everything that fits in one read, so a short
/// read is the end: one `read` per small file instead of two.
fn read_at(dir: RawFd, name: &str) -> io::Result<String> {
    let mut file = open_at(dir, name, libc::O_RDONLY)?;
    let mut buf = vec![0u8; 4096];
    let mut len = 0;
    loop {
        let n = file.read(&mut buf[len..])?;
        len += n;
        if n == 0 || len < buf.len() {
            break;
        }
        buf.resize(buf.len() * 2, 0);
    }
    buf.truncate(len);
    String::from_utf8(buf).map_err(|_| io::Error::from_raw_os_error(libc::EILSEQ))
}

fn write_at(dir: RawFd, name: &str, value: &str) -> io::Result<()> {
    open_at(dir, name, libc::O_WRONLY)?.write_all(value.as_bytes())
}

/// The value of `key` in a flat-keyed file (`cpu.stat`, `cgroup.events`, `pids.events`).
fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// One cgroup directory of a call (v2 or one v1 controller). Its fd is open only while a
/// call uses it: idle pooled cgroups hold no descriptors.
struct Dir {
    path: PathBuf,
    fd: Option<OwnedFd>,
}

impl Dir {
    fn create(path: PathBuf) -> io::Result<Self> {
        match fs::create_dir(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let fd = Some(open_dir(&path)?);
        Ok(Self { path, fd })
    }

    fn open(&mut self) -> io::Result<()> {
        if self.fd.is_none() {
            self.fd = Some(open_dir(&self.path)?);
        }
        Ok(())
    }

    /// The open fd (-1 when closed: every use then fails cleanly with EBADF).
    fn raw(&self) -> RawFd {
        self.fd.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }
}

/// One call's cgroups. `dir` is what the child is cloned into; `memory`/`pids` are v1
/// cgroups the child joins before exec (hybrid hosts).
pub struct CallCgroup {
    dir: Dir,
    memory: Option<Dir>,
    pids: Option<Dir>,
    v2_memory: bool,
    v2_pids: bool,
    applied: TreeLimits,
    /// `cgroup.kill` was written: on this kernel generation a later
    /// `clone3(CLONE_INTO_CGROUP)` into it compares kill sequence numbers of two different
    /// cgroups and SIGKILLs the new child, so a killed cgroup is never reused.
    killed: bool,
    /// Whether this call uses the memory / pids controller (joined on v1, always on v2).
    use_memory: bool,
    use_pids: bool,
    /// v2 `memory.peak`, reset through this fd for each call (the reset is per open file).
    peak: Option<fs::File>,
    cpu_base: u64,
    pids_max_base: u64,
    oom_base: u64,
}

impl CallCgroup {
    /// The v2 directory fd for `clone3(CLONE_INTO_CGROUP)`.
    pub fn dir_fd(&self) -> RawFd {
        self.dir.raw()
    }

    /// v1 directories the child joins (by writing "0" to their `cgroup.procs`): only the
    /// controllers this call needs, since each join is a cgroup migration.
    pub fn join_fds(&self) -> Vec<RawFd> {
        let memory = self.memory.as_ref().filter(|_| self.use_memory);
        let pids = self.pids.as_ref().filter(|_| self.use_pids);
        [memory, pids].into_iter().flatten().map(Dir::raw).collect()
    }

    pub fn path(&self) -> &Path {
        &self.dir.path
    }

    fn memory_file(&self) -> (&str, &str, Option<RawFd>) {
        if self.v2_memory {
            ("memory.max", "memory.swap.max", Some(self.dir.raw()))
        } else {
            (
                "memory.limit_in_bytes",
                "memory.memsw.limit_in_bytes",
                self.memory.as_ref().map(Dir::raw),
            )
        }
    }

    /// Sets the call's whole-tree limits, writing only what changed since the last use.
    pub fn apply(&mut self, limits: TreeLimits) -> io::Result<()> {
        // On v1 a controller costs a migration per call: only a call with that limit pays.
        self.use_memory = self.v2_memory || limits.memory_bytes.is_some();
        self.use_pids = self.v2_pids || limits.max_processes.is_some();
        if self.v2_memory {
            let mut peak = open_at(self.dir.raw(), "memory.peak", libc::O_RDWR)?;
            let _ = peak.write_all(b"reset");
            self.peak = Some(peak);
        } else if self.use_memory {
            if let Some(mem) = &self.memory {
                // The peak of this call only: reset to the current usage.
                let _ = write_at(mem.raw(), "memory.max_usage_in_bytes", "0");
            }
        }
        if limits.memory_bytes != self.applied.memory_bytes {
            let (limit, swap, fd) = self.memory_file();
            if let Some(fd) = fd {
                let unlimited = if self.v2_memory { "max" } else { "-1" };
                let value = limits
                    .memory_bytes
                    .map_or(unlimited.to_string(), |v| v.to_string());
                if self.v2_memory {
                    write_at(fd, limit, &value)?;
                    let _ = write_at(
                        fd,
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
                        write_at(fd, limit, &value)?;
                        let _ = write_at(fd, swap, &value);
                    } else {
                        let _ = write_at(fd, swap, &value);
                        write_at(fd, limit, &value)?;
                    }
                }
            }
            self.applied.memory_bytes = limits.memory_bytes;
        }
        if limits.max_processes != self.applied.max_processes {
            let fd = if self.v2_pids {
                Some(self.dir.raw())
            } else {
                self.pids.as_ref().map(Dir::raw)
            };
            if let Some(fd) = fd {
                let value = limits
                    .max_processes
                    .map_or("max".to_string(), |v| v.to_string());
                write_at(fd, "pids.max", &value)?;
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

    /// Opens the directories a call with `limits` needs (each open is a syscall per call).
    fn open(&mut self, limits: TreeLimits) -> io::Result<()> {
        self.dir.open()?;
        let applied = self.applied;
        if let Some(m) = &mut self.memory {
            if limits.memory_bytes.is_some() || applied.memory_bytes != limits.memory_bytes {
                m.open()?;
            }
        }
        if let Some(p) = &mut self.pids {
            if limits.max_processes.is_some() || applied.max_processes != limits.max_processes {
                p.open()?;
            }
        }
        Ok(())
    }

    fn close(&mut self) {
        self.dirs().for_each(|d| d.fd = None);
    }

    /// Reads the baselines of counters that cannot be reset (a new cgroup).
    fn rebase(&mut self) {
        self.cpu_base = self.cpu_usec_total();
        self.pids_max_base = self.pids_max_events();
        self.oom_base = self.oom_kills();
    }

    fn cpu_usec_total(&self) -> u64 {
        read_at(self.dir.raw(), "cpu.stat")
            .ok()
            .and_then(|t| keyed(&t, "usage_usec"))
            .unwrap_or(0)
    }

    fn pids_max_events(&self) -> u64 {
        let fd = if self.v2_pids {
            Some(self.dir.raw())
        } else {
            self.pids.as_ref().map(Dir::raw)
        };
        fd.and_then(|fd| read_at(fd, "pids.events").ok())
            .and_then(|t| keyed(&t, "max"))
            .unwrap_or(0)
    }

    fn oom_kills(&self) -> u64 {
        if self.v2_memory {
            return read_at(self.dir.raw(), "memory.events")
                .ok()
                .and_then(|t| keyed(&t, "oom_kill"))
                .unwrap_or(0);
        }
        self.memory
            .as_ref()
            .and_then(|m| read_at(m.raw(), "memory.oom_control").ok())
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
        let peak = if let Some(mut file) = self.peak.take() {
            let mut text = String::new();
            file.read_to_string(&mut text).ok().map(|_| text)
        } else if self.use_memory {
            self.memory
                .as_ref()
                .and_then(|m| read_at(m.raw(), "memory.max_usage_in_bytes").ok())
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

    /// Live members (zombies are not listed by cgroup v2).
    pub fn members(&self) -> Vec<libc::pid_t> {
        read_at(self.dir.raw(), "cgroup.procs")
            .map(|t| t.lines().filter_map(|l| l.trim().parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Whether any process is still in the cgroup.
    pub fn populated(&self) -> bool {
        read_at(self.dir.raw(), "cgroup.events")
            .ok()
            .and_then(|t| keyed(&t, "populated"))
            != Some(0)
    }

    /// An fd on `cgroup.events` that raises EPOLLPRI when `populated` changes.
    pub fn events_fd(&self) -> io::Result<OwnedFd> {
        Ok(open_at(self.dir.raw(), "cgroup.events", libc::O_RDONLY)?.into())
    }

    /// Sends `sig` to every member; returns how many were signalled.
    pub fn signal_all(&self, sig: libc::c_int) -> usize {
        let mut n = 0;
        for pid in self.members() {
            // SAFETY: kill(2) has no memory-safety preconditions.
            if unsafe { libc::kill(pid, sig) } == 0 {
                n += 1;
            }
        }
        n
    }

    /// SIGKILLs every member at once, including ones forked while we look.
    pub fn kill_all(&mut self) -> io::Result<()> {
        self.killed = true;
        write_at(self.dir.raw(), "cgroup.kill", "1")
    }
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

/// Parent name unique to this process and service.
fn parent_name() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    format!(
        "shellseam-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// The cgroups of one service: parents it owns and a pool of idle call cgroups.
pub struct ServiceCgroups {
    parent: PathBuf,
    memory_parent: Option<PathBuf>,
    pids_parent: Option<PathBuf>,
    v2_memory: bool,
    v2_pids: bool,
    pool: Mutex<Vec<CallCgroup>>,
    next: AtomicU64,
}

impl ServiceCgroups {
    /// Creates the service's parents; `Err` means no cgroup containment on this host.
    pub fn new(h: &Hierarchy) -> io::Result<Self> {
        let v2 = h
            .v2
            .as_ref()
            .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "no cgroup v2 hierarchy"))?;
        let name = parent_name();
        let parent = v2.join(&name);
        fs::create_dir(&parent)?;
        for dir in [Some(v2), h.memory_v1.as_ref(), h.pids_v1.as_ref()]
            .into_iter()
            .flatten()
        {
            sweep_stale(dir);
        }
        let (mut v2_memory, mut v2_pids) = (h.v2_memory, h.v2_pids);
        if v2_memory || v2_pids {
            let mut want = String::new();
            if v2_memory {
                want.push_str("+memory ");
            }
            if v2_pids {
                want.push_str("+pids");
            }
            if fs::write(parent.join("cgroup.subtree_control"), want.trim()).is_err() {
                (v2_memory, v2_pids) = (false, false);
            }
        }
        let v1 = |dir: &Option<PathBuf>, enabled: bool| {
            if enabled {
                return None;
            }
            let p = dir.as_ref()?.join(&name);
            fs::create_dir(&p).ok().map(|()| p)
        };
        let memory_parent = v1(&h.memory_v1, v2_memory);
        let pids_parent = v1(&h.pids_v1, v2_pids);
        Ok(Self {
            parent,
            memory_parent,
            pids_parent,
            v2_memory,
            v2_pids,
            pool: Mutex::new(Vec::new()),
            next: AtomicU64::new(0),
        })
    }

    pub fn parent(&self) -> &Path {
        &self.parent
    }

    /// Every directory this service owns, parents last (what the keeper removes).
    pub fn parents(&self) -> Vec<PathBuf> {
        [
            Some(self.parent.clone()),
            self.memory_parent.clone(),
            self.pids_parent.clone(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    pub fn has_memory(&self) -> bool {
        self.v2_memory || self.memory_parent.is_some()
    }

    pub fn has_pids(&self) -> bool {
        self.v2_pids || self.pids_parent.is_some()
    }

    pub fn memory_controller(&self) -> Option<&'static str> {
        if self.v2_memory {
            Some("cgroup v2")
        } else {
            self.memory_parent.as_ref().map(|_| "cgroup v1")
        }
    }

    pub fn pids_controller(&self) -> Option<&'static str> {
        if self.v2_pids {
            Some("cgroup v2")
        } else {
            self.pids_parent.as_ref().map(|_| "cgroup v1")
        }
    }

    fn create(&self) -> io::Result<CallCgroup> {
        let name = format!("c{}", self.next.fetch_add(1, Ordering::Relaxed));
        let dir = Dir::create(self.parent.join(&name))?;
        let memory = match &self.memory_parent {
            Some(p) => Some(Dir::create(p.join(&name))?),
            None => None,
        };
        let pids = match &self.pids_parent {
            Some(p) => Some(Dir::create(p.join(&name))?),
            None => None,
        };
        if let Some(m) = &memory {
            // OOM inside the call kills a member instead of pausing the call.
            let _ = write_at(m.raw(), "memory.oom_control", "0");
        }
        if self.v2_memory {
            // v2: an OOM kill takes the whole call, not one arbitrary member.
            let _ = write_at(dir.raw(), "memory.oom.group", "1");
        }
        let mut cg = CallCgroup {
            dir,
            memory,
            pids,
            v2_memory: self.v2_memory,
            v2_pids: self.v2_pids,
            applied: TreeLimits::default(),
            killed: false,
            use_memory: false,
            use_pids: false,
            peak: None,
            cpu_base: 0,
            pids_max_base: 0,
            oom_base: 0,
        };
        cg.rebase();
        Ok(cg)
    }

    /// A cgroup for a new call with `limits` applied.
    pub fn acquire(&self, limits: TreeLimits) -> io::Result<CallCgroup> {
        let pooled = lock(&self.pool).pop();
        let mut cg = match pooled {
            Some(cg) => cg,
            None => self.create()?,
        };
        if let Err(e) = cg.open(limits).and_then(|()| cg.apply(limits)) {
            remove(cg);
            return Err(e);
        }
        Ok(cg)
    }

    /// Whether `cg` can go straight back to the pool: its call emptied it and it was never
    /// `cgroup.kill`ed. `pool` then takes it without a syscall beyond closing its fds.
    pub fn reusable(cg: &CallCgroup, emptied: bool) -> bool {
        emptied && !cg.killed
    }

    /// Returns an emptied, reusable cgroup to the pool (see `reusable`).
    pub fn pool(&self, mut cg: CallCgroup) {
        cg.close();
        let mut pool = lock(&self.pool);
        if pool.len() < POOL_MAX {
            pool.push(cg);
        } else {
            drop(pool);
            remove(cg);
        }
    }

    /// Disposes of a cgroup that is not plainly reusable: removes a killed one, leaves one
    /// that is still populated (members that would not die) until the service goes away.
    pub fn release(&self, cg: CallCgroup) {
        if cg.killed || !cg.populated() {
            remove(cg);
        }
    }

    /// Removes every idle cgroup and the parents (call after every call has settled).
    pub fn remove_all(&self) {
        let idle: Vec<CallCgroup> = std::mem::take(&mut *lock(&self.pool));
        for cg in idle {
            remove(cg);
        }
        for parent in self.parents() {
            remove_tree(&parent);
        }
    }
}

fn remove(cg: CallCgroup) {
    let paths: Vec<PathBuf> = [Some(&cg.dir), cg.memory.as_ref(), cg.pids.as_ref()]
        .into_iter()
        .flatten()
        .map(|d| d.path.clone())
        .collect();
    drop(cg);
    for p in paths {
        let _ = fs::remove_dir(p);
    }
}

/// Removes the empty cgroup parents of services whose harness is gone (its keeper could
/// not clean up, e.g. it was SIGKILLed too). Only `shellseam-<pid>-<n>` directories of
/// dead pids, and only empty ones: rmdir refuses a populated cgroup.
fn sweep_stale(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix("shellseam-")) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            remove_tree(&entry.path());
        }
    }
}

/// rmdir of a cgroup subtree, children first (cgroup dirs hold only virtual files).
pub fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = fs::remove_dir(dir);
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_cgroup_mounts() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].controllers, vec!["rw", "memory"]);
        assert!(m[2].v2);
        assert_eq!(m[2].mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn parses_proc_cgroup_lines() {
        let own = parse_proc_cgroup("4:memory:/a/b\n0::/\n2:cpu,cpuacct:/\n");
        assert_eq!(own[0], ("4".into(), vec!["memory".into()], "/a/b".into()));
        assert_eq!(own[1], ("0".into(), vec![], "/".into()));
        assert_eq!(own[2].1, vec!["cpu".to_string(), "cpuacct".to_string()]);
    }

    #[test]
    fn own_dir_strips_the_mount_root() {
        let m = CgroupMount {
            root: "/outer".into(),
            mount_point: PathBuf::from("/"),
            v2: true,
            controllers: vec![],
        };
        assert_eq!(own_dir(&m, "/outer"), Some(PathBuf::from("/")));
        assert_eq!(own_dir(&m, "/elsewhere"), None);
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape_mount_path("/a\\040b"), "/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
    }

    #[test]
    fn reads_keyed_values() {
        let t = "usage_usec 42\nuser_usec 40\n";
        assert_eq!(keyed(t, "usage_usec"), Some(42));
        assert_eq!(keyed(t, "nope"), None);
        assert_eq!(keyed("populated 0\nfrozen 0\n", "populated"), Some(0));
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
            program: c("/bin/sleep"),
            argv: vec![c("sleep"), c("5")],
            envp: std::sync::Arc::new(vec![]),
            cwd: c("/"),
            confinement: None,
            script: None,
            cgroup: Some(cg.dir_fd()),
            join_cgroups: cg.join_fds(),
            rlimits: vec![(libc::RLIMIT_NOFILE, 77, 77)],
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

    #[test]
    fn a_new_service_sweeps_empty_parents_of_dead_harnesses() {
        let h = hierarchy();
        let Some(root) = h.v2.as_ref() else { return };
        // A pid that is surely dead: a reaped child of ours.
        let child = std::process::Command::new("/bin/true").spawn().unwrap();
        let dead = child.id();
        let mut child = child;
        child.wait().unwrap();
        let stale = root.join(format!("shellseam-{dead}-7"));
        fs::create_dir_all(stale.join("c0")).unwrap();
        let svc = ServiceCgroups::new(h).expect("service cgroups");
        assert!(!stale.exists());
        svc.remove_all();
    }

    #[test]
    fn pool_round_trip_on_this_host() {
        let h = hierarchy();
        if h.v2.is_none() {
            return; // no writable cgroup2 here
        }
        let svc = ServiceCgroups::new(h).expect("service cgroups");
        assert!(svc.has_pids() && svc.has_memory(), "{h:?}");
        let cg = svc
            .acquire(TreeLimits {
                memory_bytes: Some(1 << 30),
                max_processes: Some(64),
            })
            .expect("acquire");
        assert!(!cg.populated());
        assert!(cg.members().is_empty());
        let path = cg.path().to_path_buf();
        assert!(ServiceCgroups::reusable(&cg, true));
        svc.pool(cg);
        let again = svc.acquire(TreeLimits::default()).expect("reuse");
        assert_eq!(again.path(), path);
        svc.release(again); // not plainly reusable: removed at once
        assert!(!path.exists());
        svc.remove_all();
        assert!(!path.exists());
        assert!(!svc.parent().exists());
    }
}
