//! The cgroups of one service: the parents it owns (a v2 parent, and v1 `memory`/`pids`
//! parents where the v2 controllers are unavailable), the pool of idle call cgroups that
//! keeps `mkdir`/`rmdir` off the hot path, and removal: of a call's cgroups, of the whole
//! tree at dispose, and of stale parents left by harnesses that died without cleaning up.

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::call::{Dir, Peak};
use super::{lock, open_dir, remove_tree, CallCgroup, Hierarchy, TreeLimits};

/// Idle cgroups kept per service for reuse; more are removed when they come back.
const POOL_MAX: usize = 64;

/// The memory charge an emptied cgroup may keep and still be pooled. The kernel caches
/// charges per CPU (up to `MEMCG_CHARGE_BATCH`, 64 pages, per CPU and cgroup), so a cgroup
/// whose processes are gone still shows a few hundred KiB, plus some kernel memory; 100-550
/// KiB after `true`, `ls` or `python -c pass` on a 2-CPU host. What a call leaves beyond
/// that (tmpfs pages, page cache) would count against the next call's limit and peak.
fn idle_charge_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (cpus, page) = unsafe {
        (
            libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let per_cpu = 64 * u64::try_from(page).unwrap_or(4096);
    per_cpu * u64::try_from(cpus).unwrap_or(1).max(1) + (512 << 10)
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

/// The service's parents, open.
#[derive(Clone)]
struct ParentFds {
    v2: Arc<OwnedFd>,
    memory: Option<Arc<OwnedFd>>,
    pids: Option<Arc<OwnedFd>>,
}

/// The cgroups of one service: parents it owns and a pool of idle call cgroups.
pub struct ServiceCgroups {
    parent: PathBuf,
    memory_parent: Option<PathBuf>,
    pids_parent: Option<PathBuf>,
    /// The parents, held open (`O_PATH`) until `remove_all`: a call's directories and files
    /// are opened relative to them.
    parent_fds: Mutex<Option<ParentFds>>,
    v2_memory: bool,
    v2_pids: bool,
    idle_charge: u64,
    pool: Mutex<Vec<CallCgroup>>,
    home: Mutex<Home>,
    next: AtomicU64,
}

/// The service's warm cgroup: the one a call gets whenever no other call holds it (every
/// call, when they come one at a time), with its files held open between calls (see
/// `Dir`). There is exactly one while the service has cgroups, so the harness holds the
/// same descriptors after any call: when a call leaves it unusable, `lost` puts another in
/// its place before that call completes.
enum Home {
    /// Not made yet.
    None,
    Idle(Box<CallCgroup>),
    InUse,
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
        let parent_fd = match open_dir(&parent) {
            Ok(fd) => Arc::new(fd),
            Err(e) => {
                let _ = fs::remove_dir(&parent);
                return Err(e);
            }
        };
        let v1 = |dir: &Option<PathBuf>, enabled: bool| {
            if enabled {
                return None;
            }
            let p = dir.as_ref()?.join(&name);
            fs::create_dir(&p).ok()?;
            match open_dir(&p) {
                Ok(fd) => Some((p, Arc::new(fd))),
                Err(_) => {
                    let _ = fs::remove_dir(&p);
                    None
                }
            }
        };
        let (memory_parent, memory_parent_fd) = v1(&h.memory_v1, v2_memory).unzip();
        let (pids_parent, pids_parent_fd) = v1(&h.pids_v1, v2_pids).unzip();
        Ok(Self {
            parent,
            memory_parent,
            pids_parent,
            parent_fds: Mutex::new(Some(ParentFds {
                v2: parent_fd,
                memory: memory_parent_fd,
                pids: pids_parent_fd,
            })),
            v2_memory,
            v2_pids,
            idle_charge: idle_charge_bytes(),
            pool: Mutex::new(Vec::new()),
            home: Mutex::new(Home::None),
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
        let fds = lock(&self.parent_fds)
            .clone()
            .ok_or_else(|| io::Error::from_raw_os_error(libc::EBADF))?;
        let dir = Dir::create(&fds.v2, &self.parent, name.clone())?;
        let v1 = |parent: &Option<PathBuf>, fd: &Option<Arc<OwnedFd>>| match (parent, fd) {
            (Some(p), Some(fd)) => Dir::create(fd, p, name.clone()).map(Some),
            _ => Ok(None),
        };
        // A v1 directory that cannot be made takes back what was made before it.
        let undo = |made: &[Option<&Dir>]| {
            for d in made.iter().flatten() {
                let _ = fs::remove_dir(&d.path);
            }
        };
        let memory = v1(&self.memory_parent, &fds.memory).inspect_err(|_| undo(&[Some(&dir)]))?;
        let pids = v1(&self.pids_parent, &fds.pids)
            .inspect_err(|_| undo(&[Some(&dir), memory.as_ref()]))?;
        if let Some(m) = &memory {
            // OOM inside the call kills a member instead of pausing the call.
            let _ = m.write("memory.oom_control", "0");
        }
        if self.v2_memory {
            // v2: an OOM kill takes the whole call, not one arbitrary member.
            let _ = dir.write("memory.oom.group", "1");
        }
        let mut cg = CallCgroup {
            dir,
            memory,
            pids,
            v2_memory: self.v2_memory,
            v2_pids: self.v2_pids,
            applied: TreeLimits::default(),
            killed: false,
            home: false,
            use_memory: false,
            use_pids: false,
            peak: Peak::Unknown,
            fresh: true,
            nested: std::cell::Cell::new(false),
            cpu_base: 0,
            pids_max_base: 0,
            oom_base: 0,
        };
        cg.rebase();
        Ok(cg)
    }

    /// A cgroup for a new call with `limits` applied: the warm one when it is free.
    pub fn acquire(&self, limits: TreeLimits) -> io::Result<CallCgroup> {
        let cg = {
            let mut home = lock(&self.home);
            match std::mem::replace(&mut *home, Home::InUse) {
                Home::Idle(cg) => *cg,
                Home::None => {
                    drop(home);
                    match self.new_home() {
                        Ok(cg) => cg,
                        Err(e) => {
                            *lock(&self.home) = Home::None;
                            return Err(e);
                        }
                    }
                }
                Home::InUse => {
                    drop(home);
                    let pooled = lock(&self.pool).pop();
                    match pooled {
                        Some(cg) => cg,
                        None => self.create()?,
                    }
                }
            }
        };
        let reused = !cg.fresh;
        // Opens the v1 `tasks` files the child joins through now (held for the spawn), so
        // that a cgroup whose files cannot be opened is replaced here.
        let ready = |mut cg: CallCgroup| match cg
            .open()
            .and_then(|()| cg.apply(limits))
            .and_then(|()| cg.join_fds().map(drop))
        {
            Ok(()) => Ok(cg),
            Err(e) => {
                self.release(cg);
                Err(e)
            }
        };
        match ready(cg) {
            // A cgroup an earlier call ran in may have a file another process holds a lease
            // on (an unconfined root command can take one; the open then fails at once
            // rather than wait, see `open_at`): a new cgroup has none.
            Err(_) if reused => ready(self.create()?),
            done => done,
        }
    }

    /// A cgroup from the pool (or a new one) made warm; a pooled one that cannot be (see
    /// `acquire`) is removed and a new one made.
    fn new_home(&self) -> io::Result<CallCgroup> {
        let pooled = lock(&self.pool).pop();
        let mut cg = match pooled {
            Some(mut cg) => match cg.warm() {
                Ok(()) => cg,
                Err(_) => {
                    remove(cg);
                    self.warm_new()?
                }
            },
            None => self.warm_new()?,
        };
        cg.trim(); // what `create` read for its baselines
        cg.home = true;
        Ok(cg)
    }

    fn warm_new(&self) -> io::Result<CallCgroup> {
        let mut cg = self.create()?;
        if let Err(e) = cg.warm() {
            remove(cg);
            return Err(e);
        }
        Ok(cg)
    }

    /// Whether `cg` can go straight back to the pool: its call emptied it, it was never
    /// `cgroup.kill`ed, and the memory charged to it (when the call used the controller) is
    /// no more than an idle cgroup shows: nothing of a call may weigh on the next one. The
    /// caller checks the pids charge. `pool` then takes it without a syscall.
    pub fn reusable(&self, cg: &CallCgroup, emptied: bool) -> bool {
        emptied
            && !cg.killed
            && !cg.nested()
            && !cg.has_children()
            && cg
                .memory_charged()
                .is_none_or(|bytes| bytes <= self.idle_charge)
    }

    /// Returns an emptied, reusable cgroup to the pool (see `reusable`), or to the home
    /// slot with its files held (the warm one).
    pub fn pool(&self, mut cg: CallCgroup) {
        if cg.home {
            cg.trim();
            *lock(&self.home) = Home::Idle(Box::new(cg));
            return;
        }
        cg.close();
        let mut pool = lock(&self.pool);
        if pool.len() < POOL_MAX {
            pool.push(cg);
        } else {
            drop(pool);
            remove(cg);
        }
    }

    /// The warm cgroup `cg` cannot be reused: closes its fds and puts another cgroup in its
    /// place (so the descriptors held do not change). Its removal is the caller's.
    pub fn lost(&self, cg: &mut CallCgroup) {
        cg.close();
        if !std::mem::take(&mut cg.home) {
            return;
        }
        *lock(&self.home) = match self.new_home() {
            Ok(next) => Home::Idle(Box::new(next)),
            Err(_) => Home::None,
        };
    }

    /// Disposes of a cgroup that is not plainly reusable: removes it, unless it is still
    /// populated (members that would not die), which rmdir refuses; `remove_all` then takes
    /// it when the service goes away. By path only: it holds no fd once its call completed.
    pub fn release(&self, mut cg: CallCgroup) {
        if cg.home {
            cg.home = false;
            *lock(&self.home) = Home::None;
        }
        remove(cg);
    }

    /// Removes every idle cgroup and the parents (call after every call has settled). A
    /// call can settle with a member still exiting (a large address space takes seconds to
    /// free on a loaded machine), whose cgroup rmdir refuses until it is gone: waited for up
    /// to `EXIT_WAIT`, else the directories stay (an empty one is swept by the next service
    /// started on the machine once this harness is gone).
    pub fn remove_all(&self) {
        const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
        let mut idle: Vec<CallCgroup> = std::mem::take(&mut *lock(&self.pool));
        if let Home::Idle(cg) = std::mem::replace(&mut *lock(&self.home), Home::None) {
            idle.push(*cg);
        }
        for cg in idle {
            remove(cg);
        }
        // Calls still settling keep theirs until they are dropped.
        lock(&self.parent_fds).take();
        let deadline = std::time::Instant::now() + EXIT_WAIT;
        loop {
            let parents = self.parents();
            for parent in &parents {
                remove_tree(parent);
            }
            if parents.iter().all(|p| !p.exists()) || std::time::Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
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
        // A command may have made cgroups below its call's: only then is the tree walked
        // (a walk holds a directory fd for a moment; a plain rmdir holds none).
        if fs::remove_dir(&p).is_err() {
            remove_tree(&p);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::hierarchy;

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
    fn a_v1_cgroup_that_cannot_be_made_leaves_no_directory_behind() {
        let h = hierarchy();
        if h.v2.is_none() {
            return;
        }
        let svc = ServiceCgroups::new(h).expect("service cgroups");
        let Some(pids) = svc.pids_parent.clone() else {
            svc.remove_all();
            return; // no v1 pids cgroup on this host
        };
        // The v1 parent goes (its fd stays held): making a call's cgroup there fails after
        // its v2 (and v1 memory) directories were made.
        fs::remove_dir(&pids).unwrap();
        let made = svc.acquire(TreeLimits::default());
        let calls = |dir: &Path| {
            fs::read_dir(dir)
                .map(|d| d.flatten().filter(|e| e.path().is_dir()).count())
                .unwrap_or(0)
        };
        let (v2_left, memory_left) = (
            calls(svc.parent()),
            svc.memory_parent.as_deref().map_or(0, calls),
        );
        svc.remove_all();
        assert!(made.is_err());
        assert_eq!((v2_left, memory_left), (0, 0));
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
        assert!(svc.reusable(&cg, true));
        svc.pool(cg);
        let again = svc.acquire(TreeLimits::default()).expect("reuse");
        assert_eq!(again.path(), path);
        svc.release(again); // not plainly reusable: removed at once
        assert!(!path.exists());
        svc.remove_all();
        assert!(!path.exists());
        assert!(!svc.parent().exists());
    }

    #[test]
    fn charges_a_call_leaves_keep_its_cgroup_out_of_the_pool() {
        use crate::spawn::{spawn, SpawnPlan};
        use std::ffi::CString;
        let h = hierarchy();
        if h.v2.is_none() {
            return;
        }
        /// Removes the tmpfs file and the cgroups, also when an assertion fails.
        struct Cleanup(ServiceCgroups, String);
        impl Drop for Cleanup {
            fn drop(&mut self) {
                let _ = fs::remove_file(&self.1);
                self.0.remove_all();
            }
        }
        let shm = format!("/dev/shm/shellseam-cargo-{}", std::process::id());
        let guard = Cleanup(
            ServiceCgroups::new(h).expect("service cgroups"),
            shm.clone(),
        );
        let svc = &guard.0;
        let cg = svc
            .acquire(TreeLimits {
                memory_bytes: Some(256 << 20),
                max_processes: Some(8),
            })
            .expect("acquire");
        let c = |s: &str| CString::new(s).unwrap();
        let plan = SpawnPlan {
            cgroup: Some(cg.dir_fd()),
            join_cgroups: cg.join_fds().expect("tasks files"),
            ..SpawnPlan::new(
                c("/bin/sh"),
                vec![
                    c("sh"),
                    c("-c"),
                    c(&format!("head -c 8388608 /dev/zero > {shm}")),
                ],
                std::sync::Arc::new(vec![c("PATH=/usr/bin:/bin")]),
                c("/"),
            )
        };
        let child = spawn(&plan).expect("spawn");
        while crate::kill::not_dead(child.pid) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(cg.pids_charged(), Some(1), "a zombie stays charged");
        crate::sys::reap_blocking(child.pid);
        assert_eq!(cg.pids_charged(), Some(0));
        let planted = cg.memory_charged().unwrap();
        let reusable = svc.reusable(&cg, true);
        let _ = fs::remove_file(&shm);
        assert!(planted >= 8 << 20, "{planted}");
        assert!(!reusable, "tmpfs pages outlive the call");
        assert!(svc.reusable(&cg, true), "{:?}", cg.memory_charged());
        svc.release(cg);
        let parent = svc.parent().to_path_buf();
        drop(guard);
        assert!(!parent.exists());
    }
}
