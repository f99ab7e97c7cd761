//! Containment of one call, as the lifecycle sees it: who "the call's processes" are, how
//! they are signalled and counted, what limits apply and which one was hit.
//!
//! Under cgroup containment the call's processes are every member of its cgroup (even ones
//! that left the session); otherwise its process group. Whole-call limits go to cgroup
//! controllers where the service has them (`tree`), else to per-process rlimits
//! (`process`); file size and open files are always rlimits.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::resource::{getrlimit, Resource};

use crate::adopted::{reap_strays, Strays};
use crate::cgroup::{CallCgroup, ServiceCgroups, TreeLimits, Usage};
use crate::kill::{
    liveness, only_a_dead_leader, session_members, signal_group, signal_group_of,
    signal_outside_group,
};
use crate::sys::{reap_leader, unreaped, Reaped};

/// `(resource, soft, hard)` for `prlimit64` in the child.
pub type Rlimit = (u32, u64, u64);

/// `(resource, soft, hard)` for a limit of the call, never above the harness's own hard
/// limit: raising that needs `CAP_SYS_RESOURCE` (every spawn would fail without it, and
/// `RLIMIT_NOFILE` can never pass `fs.nr_open`), and a limit is a ceiling: what the harness
/// itself may not exceed, its commands may not either.
fn ceiling(resource: Resource, soft: u64, hard: u64) -> Rlimit {
    let cap = getrlimit(resource).map_or(u64::MAX, |(_, hard)| hard);
    (resource as u32, soft.min(cap), hard.min(cap))
}

/// The limits of one call, as validated by the Python layer (`None`: no limit). Python
/// builds it as the frozen record `_core.CallLimits` (constructor in bindings/contain.rs);
/// a negative value or a non-int is refused there by the conversion to u64.
#[cfg_attr(
    feature = "python",
    pyo3::pyclass(frozen, get_all, module = "shellseam._core")
)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallLimits {
    pub memory_bytes: Option<u64>,
    pub max_processes: Option<u64>,
    pub cpu_ms: Option<u64>,
    pub file_size_bytes: Option<u64>,
    pub open_files: Option<u64>,
}

/// Which limit a call hit (as far as the core can tell; a file-size hit is read from the
/// command's status by the Python layer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitHit {
    Memory,
    Processes,
    Cpu,
}

impl LimitHit {
    pub fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Processes => "processes",
            Self::Cpu => "cpu",
        }
    }
}

/// Containment facts of a finished call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Resources {
    pub cgroup: bool,
    /// Whether each whole-call limit is enforced for the whole tree.
    pub tree_memory: bool,
    pub tree_processes: bool,
    pub tree_cpu: bool,
    pub limit_hit: Option<LimitHit>,
    pub peak_memory_bytes: Option<u64>,
    /// From the cgroup; None under session containment (the caller uses rusage).
    pub cpu_usec: Option<u64>,
}

/// The outcome of a CPU-limit check.
pub(crate) enum CpuCheck {
    NotDue,
    /// Under the limit: check again at this time.
    Again(Instant),
    /// Over the limit: kill the call.
    Exceeded,
}

/// How often a call with a CPU limit has its CPU time checked.
fn cpu_check_interval(cpu_ms: u64) -> Duration {
    Duration::from_millis((cpu_ms / 4).clamp(10, 250))
}

/// Whether a live member of session `sid` used more than `limit_usec` of CPU itself.
fn session_member_over(sid: libc::pid_t, limit_usec: u64) -> bool {
    // SAFETY: sysconf with a constant name has no preconditions.
    let ticks_per_sec = match unsafe { libc::sysconf(libc::_SC_CLK_TCK) } {
        t if t > 0 => t as u64,
        _ => 100,
    };
    session_members(sid)
        .1
        .iter()
        .any(|m| m.cpu_ticks.saturating_mul(1_000_000) / ticks_per_sec > limit_usec)
}

/// The containment state of one call, owned by its `ProcState`.
pub(crate) struct CallContainment {
    /// The call's leader (its pidfd, from the clone until the call is done): its group is
    /// signalled through it, and it tells whether the leader still holds its number.
    pub leader: Option<OwnedFd>,
    /// The leader's pid (for a kernel without `waitid(P_PIDFD)`).
    pub leader_pid: libc::pid_t,
    pub cgroup: Option<CallCgroup>,
    contained: bool,
    tree_memory: bool,
    tree_processes: bool,
    cpu_limit_usec: Option<u64>,
    pub next_cpu_check: Option<Instant>,
    cpu_exceeded: bool,
    usage: Option<Usage>,
    /// `cgroup.events`, watched for EPOLLPRI while leftovers are being reaped.
    pub events: Option<(OwnedFd, Option<u64>)>,
    /// The v1 memory controller's OOM eventfd (see `CallCgroup::oom_events`), watched while
    /// the call runs: an OOM kills the whole call.
    pub oom: Option<(OwnedFd, Option<u64>)>,
    /// The call ran out of memory (its OOM event fired; the kill that followed may have
    /// come before the kernel's own, so its `oom_kill` counter need not show it).
    pub oom_seen: bool,
    /// Members already counted in `leftover_killed`.
    counted: HashSet<libc::pid_t>,
    /// The cgroup was last seen empty (the call's processes are all gone).
    pub emptied: bool,
    /// The thread that spawned the call: its leader, and the command's CLONE_PARENT
    /// children, are that thread's children.
    spawner: libc::pid_t,
    /// As the call settled, its cgroup held tasks besides the leader (pids counted) or a
    /// process was created after the leader (not counted): stray zombies were looked for.
    strays_looked_for: bool,
    /// What that found.
    strays: Strays,
}

impl CallContainment {
    /// Prepares a call: takes a cgroup from `cgroups` (when containing) with the tree
    /// limits applied, and returns the rlimits the child must set.
    ///
    /// A cgroup that cannot be had (e.g. `cgroup.max.descendants` reached) does not fail
    /// the call: it runs with session containment and rlimits, and its facts say so.
    pub fn prepare(cgroups: Option<&ServiceCgroups>, limits: &CallLimits) -> (Self, Vec<Rlimit>) {
        let cgroup = cgroups.and_then(|set| {
            set.acquire(TreeLimits {
                memory_bytes: limits.memory_bytes.filter(|_| set.has_memory()),
                max_processes: limits.max_processes.filter(|_| set.has_pids()),
            })
            .ok()
        });
        let contained = cgroup.is_some();
        let tree_memory = contained && cgroups.is_some_and(ServiceCgroups::has_memory);
        let tree_processes = contained && cgroups.is_some_and(ServiceCgroups::has_pids);
        let mut rlimits = Vec::new();
        if let Some(v) = limits.file_size_bytes {
            rlimits.push(ceiling(Resource::RLIMIT_FSIZE, v, v));
        }
        if let Some(v) = limits.open_files {
            rlimits.push(ceiling(Resource::RLIMIT_NOFILE, v, v));
        }
        if let (Some(v), false) = (limits.memory_bytes, tree_memory) {
            rlimits.push(ceiling(Resource::RLIMIT_AS, v, v));
        }
        if let (Some(ms), false) = (limits.cpu_ms, cgroup.is_some()) {
            // Per process: SIGXCPU at the soft limit (the status names it), SIGKILL a second
            // later for a command that ignores it. The rlimit counts whole seconds; the
            // checks below (each member's own CPU time) keep a limit in milliseconds.
            let secs = ms.div_ceil(1000).max(1);
            rlimits.push(ceiling(Resource::RLIMIT_CPU, secs, secs + 1));
        }
        let cpu_limit_usec = limits.cpu_ms.map(|ms| ms.saturating_mul(1000));
        let next_cpu_check = limits
            .cpu_ms
            .map(|ms| Instant::now() + cpu_check_interval(ms));
        (
            Self {
                leader: None,
                leader_pid: 0,
                contained: cgroup.is_some(),
                cgroup,
                tree_memory,
                tree_processes,
                cpu_limit_usec,
                next_cpu_check,
                cpu_exceeded: false,
                usage: None,
                events: None,
                oom: None,
                oom_seen: false,
                counted: HashSet::new(),
                emptied: false,
                // SAFETY: gettid has no preconditions (the libc wrapper needs glibc 2.30).
                spawner: unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t,
                strays_looked_for: false,
                strays: Strays::default(),
            },
            rlimits,
        )
    }

    /// Whether the number of the call's group and session is provably still the call's:
    /// while the leader is ours to reap (running, or a zombie nobody reaped), or while its
    /// group (asked through the pidfd) has members, either of which keeps the number from
    /// being handed out. False once somebody else reaped the leader (a stray `waitpid(-1)`
    /// in the harness, `SIGCHLD` ignored) and the group emptied: the number may then be
    /// anybody's, and nothing is done by number any more.
    pub fn held(&self) -> bool {
        self.leader_unreaped()
            || self
                .leader_fd()
                .is_some_and(|fd| signal_group_of(fd, 0).unwrap_or(false))
    }

    /// The leader is ours to reap: running, or a zombie nobody reaped (still charged).
    fn leader_unreaped(&self) -> bool {
        self.leader_fd()
            .is_some_and(|fd| unreaped(fd, self.leader_pid))
    }

    fn leader_fd(&self) -> Option<BorrowedFd<'_>> {
        self.leader.as_ref().map(AsFd::as_fd)
    }

    /// Sends `sig` (0: only check) to the call's process group: through the leader's pidfd,
    /// the group itself whatever became of its number; by number only on a kernel without
    /// that (before 6.9), and only while the leader holds the number. Whether it reached any.
    fn signal_group(&self, pgid: libc::pid_t, sig: libc::c_int) -> bool {
        let Some(fd) = self.leader_fd() else {
            return false;
        };
        match signal_group_of(fd, sig) {
            Ok(reached) => reached,
            Err(_) => self.held() && signal_group(pgid, sig).unwrap_or(false),
        }
    }

    /// The session's members outside the group, signalled while the leader holds the
    /// session's number (see `kill::signal_outside_group`); the live ones it reached.
    fn signal_session(&self, sid: libc::pid_t, sig: libc::c_int) -> Vec<libc::pid_t> {
        if !self.held() {
            return Vec::new();
        }
        signal_outside_group(sid, sig, || self.held())
    }

    /// The call settled. Under session containment: SIGKILL to the group, whatever the scans
    /// saw. A scan is a snapshot, and a chain of processes that each fork the next and exit
    /// is never all in one; a group signal reaches every member, a fork under way included.
    pub fn end_group(&self, pgid: libc::pid_t) {
        if self.cgroup.is_none() && pgid > 1 {
            self.signal_group(pgid, libc::SIGKILL);
        }
    }

    /// Reaps the leader (the call is done with its number) with its rusage.
    pub fn reap_leader(&self) -> Reaped {
        self.leader_fd()
            .map_or(Reaped::Lost, |fd| reap_leader(fd, self.leader_pid, false))
    }

    /// Waits for the leader to exit and reaps it (a call that is being abandoned).
    pub fn reap_leader_blocking(&self) {
        if let Some(fd) = self.leader_fd() {
            reap_leader(fd, self.leader_pid, true);
        }
    }

    /// Signals every process of the call: the group, and the cgroup's members outside it
    /// (once each: a trap in the shell must see one SIGTERM, not two).
    pub fn signal(&mut self, pgid: libc::pid_t, sig: libc::c_int) {
        self.signal_group(pgid, sig);
        let Some(cg) = &mut self.cgroup else {
            // Session containment: the session's members outside the group too.
            self.signal_session(pgid, sig);
            return;
        };
        let tail = cgroup_tail(cg.path());
        if sig == libc::SIGKILL {
            let _ = cg.kill_all();
            kill_members_by_pid(&cg.members(), &tail);
        } else {
            for pid in cg.members() {
                if crate::kill::pgrp_of(pid) != Some(pgid) {
                    signal_member(pid, sig, &tail);
                }
            }
        }
    }

    /// A kill request: SIGTERM to the session's group and to every other member of the
    /// call's cgroup at once. Members outside the group left the command's session: the
    /// executor terminates them as leftovers, so they are counted (once). Returns how many.
    pub fn terminate(&mut self, pgid: libc::pid_t) -> usize {
        self.signal_group(pgid, libc::SIGTERM);
        let Some(cg) = &self.cgroup else {
            // Session containment: members that left the group (`set -m`, `setpgid`) are
            // leftovers too, terminated and counted once.
            let reached = self.signal_session(pgid, libc::SIGTERM);
            return reached
                .into_iter()
                .filter(|&pid| self.counted.insert(pid))
                .count();
        };
        let mut escaped = 0;
        let tail = cgroup_tail(cg.path());
        for pid in cg.members() {
            // The group got its SIGTERM above; a second one would run a shell's trap twice.
            if crate::kill::pgrp_of(pid) == Some(pgid) {
                continue;
            }
            if self.counted.insert(pid) {
                escaped += 1;
            }
            signal_member(pid, libc::SIGTERM, &tail);
        }
        escaped
    }

    /// After the shell exited and the drain ended: `(leftovers not counted yet, whether
    /// anything is alive)`; the new leftovers are counted now. One read of `cgroup.procs`.
    pub fn count_leftovers(&mut self, pgid: libc::pid_t) -> (usize, bool) {
        match &self.cgroup {
            Some(cg) => {
                // Zombies (the shell's among them, kept unreaped until the call is dealt
                // with) are dead; members already in exit(2) are waited for, not counted.
                let mut alive = false;
                let mut new = 0;
                for pid in cg.members() {
                    match liveness(pid) {
                        Some(true) => {
                            alive = true;
                            if self.counted.insert(pid) {
                                new += 1;
                            }
                        }
                        Some(false) => alive = true,
                        None => {}
                    }
                }
                // Past the walk's bound, a process in a cgroup far below is in no list:
                // the kernel's `populated` counts the whole subtree (and `cgroup.kill`
                // takes it).
                if !alive && cg.nested() && cg.populated() {
                    alive = true;
                }
                self.emptied = !alive;
                (new, alive)
            }
            None => {
                // The whole session: its group, and members that left the group.
                let Some((members, list)) = self.scan_session(pgid) else {
                    // Its number may be anybody's: the group alone, through the pidfd.
                    return (0, self.signal_group(pgid, 0));
                };
                let new = list
                    .into_iter()
                    .filter(|m| m.live && self.counted.insert(m.pid))
                    .count();
                (new, !members.gone())
            }
        }
    }

    /// Whether anything of the call is still running.
    pub fn any_alive(&mut self, pgid: libc::pid_t) -> bool {
        match &self.cgroup {
            Some(cg) => {
                // A populated subtree may hold members the bounded walk did not list.
                let alive = cg.populated()
                    && (cg.members().into_iter().any(crate::kill::not_dead) || cg.nested());
                self.emptied = !alive;
                alive
            }
            None => match self.scan_session(pgid) {
                Some((members, _)) => !members.gone(),
                None => self.signal_group(pgid, 0),
            },
        }
    }

    /// `kill::session_members` of the call's session, None unless the leader held the
    /// session's number throughout the scan (checked after it: reaping is for good).
    fn scan_session(
        &self,
        sid: libc::pid_t,
    ) -> Option<(crate::kill::Members, Vec<crate::kill::Member>)> {
        if !self.held() {
            return None;
        }
        let scan = session_members(sid);
        self.held().then_some(scan)
    }

    /// The call settled; its leader is still an unreaped zombie when `held`, which keeps the
    /// call's session number from being reused. Reaps the call's zombies whose parent is the
    /// harness (`adopted::reap_strays`). Cheap when there are none: one read of
    /// `pids.current` (only the leader is charged), or without a pids count the last-pid
    /// check (no process was created after the leader).
    pub fn reap_strays(&mut self, pgid: libc::pid_t) {
        if pgid <= 0 {
            return;
        }
        // The leader is charged while it is an unreaped zombie. `held` is also true when a
        // stray `waitpid(-1)` reaped it while a member of its group lives on, and that member
        // alone must not pass for the leader.
        let leader_charged = self.leader_unreaped();
        self.strays_looked_for = match self.cgroup.as_ref().and_then(CallCgroup::pids_charged) {
            Some(tasks) => tasks > u64::from(leader_charged),
            None => !self.held() || !only_a_dead_leader(pgid),
        };
        if self.strays_looked_for {
            let tail = self.cgroup.as_ref().map(|cg| cgroup_tail(cg.path()));
            let strays = reap_strays(pgid, self.spawner, &|| self.held(), tail.as_deref());
            self.strays = strays;
        }
    }

    /// Once the leader is reaped: `(held, coming)`. `held`: the call's cgroup must not be
    /// pooled, as tasks of the call are still charged to it (exact with a pids count: a
    /// zombie counts until reaped; without one, a call that had strays or leftovers is
    /// suspect). `coming`: the harness will be the parent of zombies of the call that were
    /// still exiting as it settled, to be looked for a moment.
    pub fn left_behind(&self) -> (bool, bool) {
        let Some(cg) = &self.cgroup else {
            return (false, false); // session members outside the group are out of reach
        };
        let coming = self.strays.coming > 0;
        let held = if cg.counts_pids() {
            // Read again only when `reap_strays` found more than the held leader charged
            // (the leader is reaped now).
            self.strays_looked_for && cg.pids_charged().is_some_and(|tasks| tasks > 0)
        } else {
            self.strays != Strays::default() || !self.counted.is_empty()
        };
        (held || coming, coming)
    }

    /// Checks the CPU limit when a check is due.
    pub fn check_cpu(&mut self, now: Instant) -> CpuCheck {
        let (Some(limit), Some(at)) = (self.cpu_limit_usec, self.next_cpu_check) else {
            return CpuCheck::NotDue;
        };
        if now < at {
            return CpuCheck::NotDue;
        }
        let over = match &self.cgroup {
            Some(cg) => cg.cpu_usec() > limit,
            // Without a cgroup the limit is per process (`enforcement="process"`): any
            // member of the call's session past it.
            None => self.leader_pid > 0 && session_member_over(self.leader_pid, limit),
        };
        if over {
            self.cpu_exceeded = true;
            self.next_cpu_check = None;
            return CpuCheck::Exceeded;
        }
        let next = now + cpu_check_interval(limit / 1000);
        self.next_cpu_check = Some(next);
        CpuCheck::Again(next)
    }

    /// Reads the call's accounting; done once, before completion is signalled.
    pub fn stamp(&mut self) {
        if let Some(cg) = &mut self.cgroup {
            self.usage = Some(cg.usage());
        }
        self.next_cpu_check = None;
    }

    pub fn resources(&self) -> Resources {
        let usage = self.usage.unwrap_or_default();
        let limit_hit = if self.cpu_exceeded {
            Some(LimitHit::Cpu)
        } else if usage.oom_killed || self.oom_seen {
            Some(LimitHit::Memory)
        } else if usage.forks_refused {
            Some(LimitHit::Processes)
        } else {
            None
        };
        Resources {
            cgroup: self.contained,
            tree_memory: self.tree_memory,
            tree_processes: self.tree_processes,
            tree_cpu: self.contained,
            limit_hit,
            peak_memory_bytes: self.usage.and_then(|u| u.peak_memory_bytes),
            cpu_usec: self.usage.map(|u| u.cpu_usec),
        }
    }
}

/// SIGKILL to each of `pids` that is in the cgroup `tail` names (or below it), the whole
/// process through a pidfd. `cgroup.kill` signals each process through one thread, which
/// misses a process whose main thread exited while another runs on: the kill waits on the
/// dead thread and no other is woken (and later kills skip the process as already dying).
pub(crate) fn kill_members_by_pid(pids: &[libc::pid_t], tail: &str) {
    for &pid in pids {
        signal_member(pid, libc::SIGKILL, tail);
    }
}

/// Sends `sig` to `pid`, listed in `cgroup.procs` of the cgroup `tail` names, if it is still
/// in that cgroup (or below) once pinned by a pidfd: a member that exited since the list was
/// read may have left its pid to a process outside the call.
fn signal_member(pid: libc::pid_t, sig: libc::c_int, tail: &str) {
    crate::kill::signal_if(pid, sig, || crate::adopted::in_cgroup(pid, tail));
}

/// `/<service parent>/<call>`: how the call's cgroup ends in `/proc/<pid>/cgroup`.
pub(crate) fn cgroup_tail(path: &std::path::Path) -> String {
    let mut parts = path.iter().rev().take(2).collect::<Vec<_>>();
    parts.reverse();
    let mut tail = String::new();
    for part in parts {
        tail.push('/');
        tail.push_str(&part.to_string_lossy());
    }
    tail
}
