//! Zombies of a call whose parent is the harness, which nobody else will reap.
//!
//! Two ways make them. A command's `clone(CLONE_PARENT)` children are siblings of its leader:
//! children of the thread that spawned the call, in any harness. And a harness that made
//! itself a child subreaper (`PR_SET_CHILD_SUBREAPER`) becomes the parent of every orphan
//! its calls leave (`sleep 100 &` once bash exits, a `setsid` escapee). The harness's own
//! children (e.g. its `subprocess.Popen` ones) must keep their exit status for their owner,
//! so only zombies that are provably the call's are reaped:
//! - as the call settles, those in its session or cgroup, while its unreaped leader keeps the
//!   session's number from being reused (`reap_strays`);
//! - for a moment after, those in the cgroup of a call that was not pooled, when some of its
//!   children were still exiting as it settled (a killed process leaves its cgroup slightly
//!   before it becomes a zombie), and for a subreaper harness after every such call and in
//!   the process group of each session-contained call (`Adopted`).

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::unistd::{getsid, Pid};

use crate::kill::{
    all_children, read_proc, signal_group_of, stat_of, task_children, zombie_children,
};

/// How long after a call settles its late zombies are looked for.
const LINGER: Duration = Duration::from_millis(500);
/// How long at most for a session-contained call's, while its process group still has
/// members: under load a killed orphan can take longer than `LINGER` to become a zombie.
const LINGER_GROUP: Duration = Duration::from_secs(5);
/// How often, meanwhile.
const RESCAN: Duration = Duration::from_millis(20);
/// How often a leader a tracer still holds is tried (for as long as the tracer holds it).
const LEADER_RESCAN: Duration = Duration::from_millis(250);

/// Whose zombies to reap.
#[derive(Debug)]
pub(crate) enum Owner {
    /// Tail of the call cgroup's path (`/<service parent>/<call>`), as `/proc/<pid>/cgroup`
    /// shows it.
    Cgroup(String),
    /// The call's process group (session containment): its number, and its (reaped)
    /// leader's pidfd, through which the group itself is asked whether it has members. While
    /// it has, no other group can have its number; once it has none, its number may be
    /// anybody's (the harness's next `Popen(start_new_session=True)`'s) and nothing of it is
    /// left to reap.
    Group(libc::pid_t, OwnedFd),
}

fn is_subreaper() -> bool {
    let mut flag: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER stores an int through a valid pointer.
    unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int) };
    flag != 0
}

/// Whether `pid` is (or, a zombie, was) in the cgroup whose path ends with `tail`, or below
/// it. A zombie still shows its cgroup, with " (deleted)" once the cgroup was removed.
pub(crate) fn in_cgroup(pid: libc::pid_t, tail: &str) -> bool {
    read_proc(&format!("/proc/{pid}/cgroup")).is_some_and(|text| lists_cgroup(&text, tail))
}

/// Whether a `/proc/<pid>/cgroup` text puts the process in the v2 cgroup `tail`, or below.
fn lists_cgroup(text: &str, tail: &str) -> bool {
    let below = format!("{tail}/");
    text.lines()
        .filter_map(|l| l.strip_prefix("0::"))
        .map(|path| path.strip_suffix(" (deleted)").unwrap_or(path))
        .any(|path| path.ends_with(tail) || path.contains(&below))
}

fn belongs(pid: libc::pid_t, owner: &Owner) -> bool {
    match owner {
        Owner::Cgroup(tail) => in_cgroup(pid, tail),
        // A zombie keeps its group until reaped, so the group it shows and ours, if ours
        // still has members, both hold the number now: they are one.
        Owner::Group(pgid, _) => {
            crate::kill::pgrp_of(pid) == Some(*pgid) && group_has_members(owner)
        }
    }
}

fn reap(pid: libc::pid_t) -> bool {
    let mut status = 0;
    // SAFETY: reaps a zombie child of ours without blocking.
    unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) == pid }
}

/// What the sweep of a settling call found among the harness's children.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Strays {
    /// Zombies of the call, reaped.
    pub reaped: usize,
    /// Children of the call not yet zombies: on their way out (a killed process leaves its
    /// cgroup slightly before it becomes a zombie), so their zombies are still to come.
    pub coming: usize,
}

/// Reaps the zombie children of the harness that are the settling call's, other than its
/// `leader`: those in its session, while `held` (the leader is an unreaped zombie, so no
/// other session can have its number: asked again before each such reap, as a stray
/// `waitpid(-1)` of the harness may take the leader at any time), and those in its cgroup
/// (`tail`, not pooled yet).
/// Reads the children of one thread when it can: the one the leader is a child of, as are
/// the command's CLONE_PARENT children (the spawning thread's, unless that thread exited and
/// handed its children on).
pub(crate) fn reap_strays(
    leader: libc::pid_t,
    spawner: libc::pid_t,
    held: &dyn Fn() -> bool,
    tail: Option<&str>,
) -> Strays {
    let leader_held = held();
    let children = match task_children(spawner) {
        Some(list) if leader_held && list.contains(&leader) => list,
        _ => all_children(),
    };
    let mut found = Strays::default();
    if !leader_held && tail.is_none() {
        return found; // nothing to tell a child of the call by
    }
    for pid in children.into_iter().filter(|&p| p != leader) {
        // A session's member, by one cheap syscall before its stat file: with many calls in
        // flight the spawner's children are every call's leaders.
        let in_session =
            leader_held && getsid(Some(Pid::from_raw(pid))) == Ok(Pid::from_raw(leader));
        if tail.is_none() && !in_session {
            continue;
        }
        let Some(stat) = stat_of(pid) else {
            continue;
        };
        let ours = tail.is_some_and(|t| in_cgroup(pid, t))
            || (leader_held && stat.session == leader && held());
        if !ours {
            continue;
        }
        if !stat.dead() {
            found.coming += 1;
        } else if reap(pid) {
            found.reaped += 1;
        }
    }
    found
}

/// Settled calls whose late zombies are still being looked for.
#[derive(Default)]
pub(crate) struct Adopted {
    /// Whose zombies, until when, and until when at most while the owner has members.
    pending: Vec<(Owner, Instant, Instant)>,
    /// Leaders of settled calls that a tracer outside the call still holds (pidfd, pid):
    /// reaped by pidfd, so never another's child, once the tracer lets go or dies.
    leaders: Vec<(OwnedFd, libc::pid_t)>,
    /// When the rescan timer already armed fires (one chain of timers, never one per wake).
    armed: Option<Instant>,
}

/// Whether a call's process group still has members (zombies included).
fn group_has_members(owner: &Owner) -> bool {
    match owner {
        Owner::Group(_, leader) => signal_group_of(leader.as_fd(), 0).unwrap_or(false),
        Owner::Cgroup(_) => false,
    }
}

impl Adopted {
    /// A call settled: reap its late zombies now and for a moment. Only for an `owner` whose
    /// zombies may still come, or any owner of a subreaper harness. Returns when to arm the
    /// rescan timer (see `reap`).
    pub fn settled(&mut self, owner: Owner, may_come: bool, now: Instant) -> Option<Instant> {
        if !may_come && !is_subreaper() {
            return None;
        }
        self.pending.push((owner, now + LINGER, now + LINGER_GROUP));
        self.reap(now)
    }

    /// A settled call's leader that a tracer still holds: reaped as soon as it can be.
    /// Returns when to arm the rescan timer (see `reap`).
    pub fn hold_leader(
        &mut self,
        leader: OwnedFd,
        pid: libc::pid_t,
        now: Instant,
    ) -> Option<Instant> {
        self.leaders.push((leader, pid));
        self.armed = None; // scan now
        self.reap(now)
    }

    /// One scan, unless only held leaders are left and their scan is not due. Returns when
    /// to arm the rescan timer: None while nothing is pending or the armed one comes soon
    /// enough.
    pub fn reap(&mut self, now: Instant) -> Option<Instant> {
        if self.pending.is_empty() && self.armed.is_some_and(|at| now < at) {
            return None;
        }
        self.leaders.retain(|(fd, pid)| {
            matches!(
                crate::sys::reap_leader(fd.as_fd(), *pid, false),
                crate::sys::Reaped::Running
            )
        });
        if !self.pending.is_empty() {
            self.reap_pending(now);
        }
        let next = if !self.pending.is_empty() {
            now + RESCAN
        } else if !self.leaders.is_empty() {
            now + LEADER_RESCAN
        } else {
            self.armed = None;
            return None;
        };
        match self.armed {
            Some(at) if now < at && at <= next => None,
            _ => {
                self.armed = Some(next);
                Some(next)
            }
        }
    }

    /// Whether anything is still looked after.
    #[cfg(test)]
    fn pending(&self) -> bool {
        !self.pending.is_empty() || !self.leaders.is_empty()
    }

    fn reap_pending(&mut self, now: Instant) {
        for pid in zombie_children() {
            if self.pending.iter().any(|(owner, _, _)| belongs(pid, owner)) {
                reap(pid);
            }
        }
        self.pending.retain(|(owner, until, at_most)| {
            *until > now || (*at_most > now && group_has_members(owner))
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kill::stat_of;

    #[test]
    fn a_zombie_shows_its_removed_cgroup() {
        let tail = "/shellseam-1-0/c1";
        assert!(lists_cgroup("4:memory:/\n0::/a/shellseam-1-0/c1\n", tail));
        assert!(lists_cgroup("0::/shellseam-1-0/c1 (deleted)\n", tail));
        assert!(lists_cgroup("0::/shellseam-1-0/c1/inner\n", tail));
        assert!(!lists_cgroup("0::/shellseam-1-0/c11\n", tail));
        assert!(!lists_cgroup("4:memory:/shellseam-1-0/c1\n0::/\n", tail));
    }

    fn fork(child: impl FnOnce() -> libc::c_int) -> libc::pid_t {
        // SAFETY: the child makes only async-signal-safe calls (setsid, clone, write, _exit).
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            let code = child();
            // SAFETY: as above.
            unsafe { libc::_exit(code) };
        }
        pid
    }

    fn until_zombie(pid: libc::pid_t) {
        while stat_of(pid).is_some_and(|s| s.state != 'Z') {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn exit_code(pid: libc::pid_t) -> libc::c_int {
        let mut status = 0;
        // SAFETY: reaps our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        libc::WEXITSTATUS(status)
    }

    #[test]
    fn a_group_whose_member_dies_late_is_still_looked_after() {
        // A session call's killed orphan that becomes a zombie only after `LINGER` (an exit
        // slowed by load): its group still has the member, so its zombie is still reaped.
        let member = fork(|| {
            // SAFETY: as in `fork`; then waits to be killed.
            unsafe {
                libc::setpgid(0, 0);
                loop {
                    libc::pause();
                }
            }
        });
        while crate::kill::pgrp_of(member) != Some(member) {
            std::thread::sleep(Duration::from_millis(1));
        }
        let start = Instant::now();
        let mut adopted = Adopted::default();
        // SAFETY: pidfd_open of our own child, owned right below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, member, 0) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as libc::c_int) };
        assert!(adopted
            .settled(Owner::Group(member, fd), true, start)
            .is_some());
        let late = start + LINGER + Duration::from_millis(100);
        adopted.reap(late);
        assert!(
            adopted.pending(),
            "a live member keeps the group looked after"
        );
        // SAFETY: kills our own child.
        unsafe { libc::kill(member, libc::SIGKILL) };
        until_zombie(member);
        assert!(adopted.reap(late).is_none());
        assert!(!adopted.pending(), "its zombie reaped, the group is done");
        assert!(stat_of(member).is_none(), "reaped");
        adopted.reap(start + LINGER_GROUP);
        assert!(!adopted.pending(), "never past LINGER_GROUP");
    }

    #[test]
    fn reaps_the_clone_parent_children_of_a_settled_call_only() {
        let unrelated = fork(|| 5);
        let mut ends = [0; 2];
        // SAFETY: pipe(2) fills two fds.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // The call's leader: a session of its own, and a sibling made with CLONE_PARENT.
        let leader = fork(|| {
            // SAFETY: as in `fork`; the clone child runs on a copy of the stack, as after fork.
            unsafe {
                libc::setsid();
                let flags = libc::CLONE_PARENT | libc::SIGCHLD;
                let stray = libc::syscall(libc::SYS_clone, flags, 0, 0, 0, 0) as libc::pid_t;
                if stray == 0 {
                    libc::_exit(7);
                }
                libc::write(ends[1], (&stray as *const libc::pid_t).cast(), 4);
            }
            0
        });
        let mut stray: libc::pid_t = 0;
        // SAFETY: reads 4 bytes into a pid_t; then closes both ends of our pipe.
        unsafe {
            libc::read(ends[0], (&mut stray as *mut libc::pid_t).cast(), 4);
            libc::close(ends[0]);
            libc::close(ends[1]);
        }
        assert!(stray > 0);
        for pid in [unrelated, leader, stray] {
            until_zombie(pid);
        }
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
        let found = reap_strays(leader, tid, &|| true, None);
        assert_eq!((found.reaped, found.coming), (1, 0));
        assert!(stat_of(stray).is_none(), "the stray was reaped");
        assert_eq!(exit_code(leader), 0, "the leader is left to its call");
        assert_eq!(exit_code(unrelated), 5, "another child keeps its status");
    }
}
