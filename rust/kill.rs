//! Signalling and inspecting a process group.
//!
//! A group outlives its reaped leader while any member is alive, and the kernel keeps the
//! pgid reserved for as long, so signalling `-pgid` after the leader's exit reaches exactly
//! the leftovers.

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::{getsid, Pid};

/// Sends `sig` (0: only check) to every process of the group; a vanished group is not an
/// error (Ok(false)).
pub fn signal_group(pgid: libc::pid_t, sig: libc::c_int) -> io::Result<bool> {
    if pgid <= 1 {
        // killpg(0) is the caller's own group and 1 is init's: never a command's.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let signal = match sig {
        0 => None,
        n => Some(Signal::try_from(n)?),
    };
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Sends `sig` (0: only check) to the process group whose leader `leader` names (a pidfd):
/// the group itself, not its number, whatever became of the leader. Ok(false) when the group
/// has no member left; an error where the kernel cannot (`PIDFD_SIGNAL_PROCESS_GROUP` came
/// with Linux 6.9).
pub fn signal_group_of(leader: BorrowedFd<'_>, sig: libc::c_int) -> io::Result<bool> {
    // SAFETY: pidfd_send_signal on a pidfd the caller holds, no siginfo.
    let r = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            leader.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            PIDFD_SIGNAL_PROCESS_GROUP,
        )
    };
    if r == 0 {
        return Ok(true);
    }
    match Errno::last() {
        Errno::ESRCH => Ok(false),
        err => Err(err.into()),
    }
}

/// include/uapi/linux/pidfd.h.
const PIDFD_SIGNAL_PROCESS_GROUP: libc::c_uint = 1 << 2;

/// `PF_EXITING` in the flags field of /proc/<pid>/stat (include/linux/sched.h).
const PF_EXITING: u64 = 0x4;

/// The members of a group that are not yet zombies, from a scan of /proc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Members {
    /// Running, sleeping or stopped: what a kill still has to stop.
    pub live: usize,
    /// Already in exit(2) (`PF_EXITING`), not yet zombies. A process closes its pipes (our
    /// EOF) before it turns into a zombie, so a background job that printed its last line
    /// and exited can be caught in between: it is going away on its own, not a leftover.
    pub exiting: usize,
}

impl Members {
    /// Nothing of the group is left but zombies waiting for their reaper.
    pub fn gone(self) -> bool {
        self.live == 0 && self.exiting == 0
    }
}

/// One member of a session, from `session_members`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub pid: libc::pid_t,
    /// Not exiting (see `Stat::live`).
    pub live: bool,
    /// Outside the leader's group (`set -m` jobs, `setpgid(0, 0)`): a group signal misses it.
    pub outside: bool,
    /// Its own CPU time when scanned (see `Stat::cpu_ticks`).
    pub cpu_ticks: u64,
}

/// The members of a session that are not yet zombies, by scanning /proc: how many, and each
/// of them (a caller counting leftovers counts a pid once, whichever group it is in when
/// seen: a job can move into the leader's group). Zombies are not counted:
/// they are already dead and only wait for their parent. A session keeps its id while its
/// leader is unreaped, so `sid` names the call's session as long as the caller holds the
/// leader.
///
/// Session-mode calls pay this at every exit (their leader is kept unreaped, so `kill(-pgid,
/// 0)` cannot tell), hence the filter: one `getsid(2)` per process, a cheap syscall, and the
/// /proc stat text (state and flags) only for the session's own members. Reading every stat
/// file instead cost ~1.5 ms per call on a quiet machine with ~150 processes.
///
/// Every process of /proc is looked at. Looking only at the pids handed out since the leader
/// is not sound: a command can make the allocator come round (a loop of short-lived threads;
/// or, leaving no trace in any counter, forks that fail in a pid namespace whose init died,
/// which take a number and give it back) and stop it just past its leader.
pub fn session_members(sid: libc::pid_t) -> (Members, Vec<Member>) {
    let mut members = Members::default();
    let mut list = Vec::new();
    if sid <= 1 || only_a_dead_leader(sid) {
        return (members, list);
    }
    let Ok(entries) = fs::read_dir("/proc") else {
        return (members, list);
    };
    for pid in entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
    {
        if getsid(Some(Pid::from_raw(pid))).map(Pid::as_raw) != Ok(sid) {
            continue; // another session's, or gone since it was listed
        }
        let Some(s) = stat_of(pid) else { continue };
        if s.session != sid || s.dead() {
            continue;
        }
        let live = s.live(pid);
        if live {
            members.live += 1;
        } else {
            members.exiting += 1;
        }
        list.push(Member {
            pid,
            live,
            outside: s.pgrp != sid,
            cpu_ticks: s.cpu_ticks,
        });
    }
    (members, list)
}

/// Sends `sig` to the members of session `sid` outside its leader's group, live or already
/// exiting (the group itself takes `signal_group`); the live ones it reached. `held` tells
/// whether the session's leader still holds its number: checked after each member is pinned
/// by a pidfd, so that a member of another session that got the number meanwhile is never
/// signalled.
pub fn signal_outside_group(
    sid: libc::pid_t,
    sig: libc::c_int,
    held: impl Fn() -> bool,
) -> Vec<libc::pid_t> {
    let mut reached = Vec::new();
    for m in session_members(sid).1.into_iter().filter(|m| m.outside) {
        let pid = m.pid;
        let member = || stat_of(pid).is_some_and(|s| s.session == sid && !s.dead()) && held();
        if signal_if(pid, sig, member) && m.live {
            reached.push(pid);
        }
    }
    reached
}

/// Sends `sig` to process `pid` (the whole process, whichever of its threads runs) only if
/// `belongs` holds of it: through a pidfd taken before the check, so a pid that was freed
/// and handed to another process in the meantime is never signalled. False when it was not
/// signalled.
pub fn signal_if(pid: libc::pid_t, sig: libc::c_int, belongs: impl FnOnce() -> bool) -> bool {
    let Some(fd) = pidfd_open(pid) else {
        return false;
    };
    // The pidfd names one process; /proc/<pid> read while that process still runs is its.
    let member = belongs();
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd owned by this frame, no timeout.
    let exited = unsafe { libc::poll(&mut pfd, 1, 0) } != 0;
    member
        && !exited
        // SAFETY: pidfd_send_signal on the pidfd opened above, no siginfo.
        && unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd.as_raw_fd(),
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        } == 0
}

/// A pidfd of process `pid`; None when there is no such process (or no fd to be had).
pub fn pidfd_open(pid: libc::pid_t) -> Option<OwnedFd> {
    // SAFETY: pidfd_open with integer arguments; the fd is owned right below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    let fd = libc::c_int::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The pidfs inode number of the process `pidfd` names: never given to another process while
/// the machine runs (pidfs, Linux 6.9), so it tells whether a pid still names that process.
/// 0 where pidfds are anonymous inodes, all alike.
pub fn pidfs_ino(pidfd: BorrowedFd<'_>) -> u64 {
    /// include/uapi/linux/magic.h.
    const PIDFS_MAGIC: i64 = 0x5049_4446;
    static ON_PIDFS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let on_pidfs = *ON_PIDFS.get_or_init(|| {
        nix::sys::statfs::fstatfs(pidfd).is_ok_and(|s| s.filesystem_type().0 == PIDFS_MAGIC)
    });
    if !on_pidfs {
        return 0;
    }
    nix::sys::stat::fstat(pidfd).map_or(0, |st| st.st_ino)
}

/// The fast path of `session_members`, two small reads: the group's leader is a zombie and no
/// process (nor thread) was created in this pid namespace after it, so the group holds
/// nothing else. Sound because the kernel cannot hand the leader's pid out again while the
/// zombie holds it, so the last allocated pid equals it only when nothing came after; and
/// every other member of the group would be a descendant created after the leader (it
/// started the session, and only the session's processes can join its groups).
pub fn only_a_dead_leader(pgid: libc::pid_t) -> bool {
    let last = read_proc("/proc/sys/kernel/ns_last_pid")
        .and_then(|t| t.trim().parse::<libc::pid_t>().ok());
    if last != Some(pgid) {
        return false;
    }
    stat_of(pgid).is_some_and(|s| s.dead() && s.pgrp == pgid)
}

/// What a process is to a kill, from its /proc stat: `None` when it is gone or a zombie
/// (already dead, waiting for its parent), `Some(true)` when live (in any thread, see
/// `Stat::live`), `Some(false)` when already in exit(2) (`PF_EXITING`: going away on its own,
/// but not yet out of its cgroup).
pub fn liveness(pid: libc::pid_t) -> Option<bool> {
    let stat = stat_of(pid)?;
    (!stat.dead()).then(|| stat.live(pid))
}

/// Whether process `pid` is there and not dead (live or exiting): `liveness(pid).is_some()`
/// without reading what `Stat::live` reads.
pub fn not_dead(pid: libc::pid_t) -> bool {
    stat_of(pid).is_some_and(|s| !s.dead())
}

/// The children of one thread of this process, from `/proc/self/task/<tid>/children`
/// (None: no such thread).
pub fn task_children(tid: libc::pid_t) -> Option<Vec<libc::pid_t>> {
    let text = fs::read_to_string(format!("/proc/self/task/{tid}/children")).ok()?;
    Some(
        text.split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect(),
    )
}

/// The children of every thread of this process.
pub fn all_children() -> Vec<libc::pid_t> {
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse().ok())
        .filter_map(task_children)
        .flatten()
        .collect()
}

/// Zombie children of this process (of any of its threads).
pub fn zombie_children() -> Vec<libc::pid_t> {
    let zombie = |pid: &libc::pid_t| stat_of(*pid).is_some_and(|s| s.dead());
    all_children().into_iter().filter(zombie).collect()
}

/// The process group of `pid` (zombies included), from /proc.
pub fn pgrp_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    stat_of(pid).map(|s| s.pgrp)
}

/// What /proc/<pid>/stat says of a process (zombies included); None once it is gone.
pub fn stat_of(pid: libc::pid_t) -> Option<Stat> {
    parse_stat(&read_proc(&format!("/proc/{pid}/stat"))?)
}

/// A small /proc file that holds one record, in one `read` (see `cgroup::read_at`).
pub fn read_proc(path: &str) -> Option<String> {
    crate::cgroup::read_at(libc::AT_FDCWD, path).ok()
}

/// The fields of /proc/<pid>/stat that containment reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub state: char,
    pub pgrp: libc::pid_t,
    pub session: libc::pid_t,
    pub flags: u64,
    /// The process's threads; a zombie's main thread counts until the process is reaped.
    pub threads: u64,
    /// Its own CPU time (user + system) in clock ticks, its children's not included.
    pub cpu_ticks: u64,
}

impl Stat {
    /// A zombie or a process being released: already dead, waiting for (or past) its reaper.
    /// Not a process whose main thread exited while others run on: /proc shows the main
    /// thread's state (`Z`), but the process lives (`Zl` in ps) and takes signals.
    pub fn dead(&self) -> bool {
        (self.state == 'Z' && self.threads <= 1) || self.state == 'X'
    }

    /// For process `pid` that is not `dead`: whether it runs on, rather than going away on
    /// its own (in exit(2), `PF_EXITING`, or with a SIGKILL pending, which `exit_group` and
    /// a fatal signal queue on every thread: a thread busy in the kernel, a long `munmap`,
    /// shows neither state nor flag until it returns). The flags are the main thread's: when
    /// it is exiting or exited (a zombie with other threads), the process lives on in any
    /// other thread that is not exiting too (see `another_thread_runs`).
    ///
    /// A SIGKILL pending on the main thread alone does not settle it: `execve` in another
    /// thread queues one on every thread but itself, and the process runs on as the new
    /// program (found by attacking: such a job went uncounted).
    pub fn live(&self, pid: libc::pid_t) -> bool {
        let status = || read_proc(&format!("/proc/{pid}/status")).unwrap_or_default();
        let main_runs = self.flags & PF_EXITING == 0 && !sigkill_pending(&status());
        main_runs || (self.threads > 1 && another_thread_runs(pid))
    }
}

/// Whether a thread of process `pid` other than its main thread runs and is not exiting.
///
/// A process in `exit_group` has every thread exiting for as long as its address space takes
/// to tear down (half a second for 4 GiB), and is going away on its own. Judged by its
/// threads' state alone, a process whose threads keep starting the next and exiting could be
/// caught between them; but such a chain creates threads, and a process in `exit_group`
/// cannot: so when no listed thread runs, the threads are listed again, and a thread that was
/// not there before means the process runs on.
fn another_thread_runs(pid: libc::pid_t) -> bool {
    let first = other_threads(pid);
    let runs = |&tid: &libc::pid_t| {
        let task = format!("/proc/{pid}/task/{tid}");
        parse_stat(&read_proc(&format!("{task}/stat")).unwrap_or_default())
            .is_some_and(|t| t.state != 'Z' && t.state != 'X' && t.flags & PF_EXITING == 0)
            && !sigkill_pending(&read_proc(&format!("{task}/status")).unwrap_or_default())
    };
    first.iter().any(runs) || other_threads(pid).iter().any(|tid| !first.contains(tid))
}

/// Whether a /proc status text shows a SIGKILL pending (`SigPnd`, or `ShdPnd` for the whole
/// process): `exit_group` and a fatal signal queue one on every other thread, which is on its
/// way out but not yet `PF_EXITING` until it is next scheduled.
fn sigkill_pending(status: &str) -> bool {
    const SIGKILL_BIT: u64 = 1 << (libc::SIGKILL - 1);
    status
        .lines()
        .filter_map(|l| {
            l.strip_prefix("SigPnd:")
                .or_else(|| l.strip_prefix("ShdPnd:"))
        })
        .filter_map(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .any(|mask| mask & SIGKILL_BIT != 0)
}

/// The threads of process `pid` but its main thread.
fn other_threads(pid: libc::pid_t) -> Vec<libc::pid_t> {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&tid| tid != pid)
        .collect()
}

/// Parses a /proc/<pid>/stat line; the comm field may hold spaces and ')'.
fn parse_stat(stat: &str) -> Option<Stat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    // tty_nr, tpgid, then flags.
    let flags = fields.nth(2)?.parse().ok()?;
    // Four fault counters, then utime and stime.
    let utime: u64 = fields.nth(4)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // cutime, cstime, priority, nice, then num_threads.
    let threads = fields.nth(4)?.parse().ok()?;
    Some(Stat {
        state,
        pgrp,
        session,
        flags,
        threads,
        cpu_ticks: utime.saturating_add(stime),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn parses_stat_with_odd_comm() {
        let line = "123 (a) b (c)) S 1 456 457 0 -1 4194560 0 0 0 0 5 6 0 0 20 0 3 0";
        let stat = Stat {
            state: 'S',
            pgrp: 456,
            session: 457,
            flags: 4194560,
            threads: 3,
            cpu_ticks: 11,
        };
        assert_eq!(parse_stat(line), Some(stat));
        assert!(!stat.dead());
        let orphaned_threads = Stat { state: 'Z', ..stat };
        assert!(!orphaned_threads.dead(), "its other threads run on");
        assert!(Stat {
            threads: 1,
            ..orphaned_threads
        }
        .dead());
        assert!(Stat { state: 'X', ..stat }.dead());
        assert_eq!(parse_stat("123 (a) S 1 456 457 0 -1 4194560 0"), None);
        let exiting = "9 (sh) R 1 456 456 0 -1 4194564 0 0 0 0 0 0 0 0 20 0 1 0";
        assert_eq!(
            parse_stat(exiting).map(|s| s.flags & PF_EXITING),
            Some(PF_EXITING)
        );
    }

    #[test]
    fn a_pending_sigkill_is_read_from_status() {
        let status = |pnd: &str, shd: &str| format!("Name:\tx\nSigPnd:\t{pnd}\nShdPnd:\t{shd}\n");
        assert!(!sigkill_pending(&status(
            "0000000000000000",
            "0000000000000000"
        )));
        assert!(sigkill_pending(&status(
            "0000000000000100",
            "0000000000000000"
        )));
        assert!(sigkill_pending(&status(
            "0000000000000000",
            "0000000000004100"
        )));
        assert!(!sigkill_pending(&status(
            "0000000000004000",
            "0000000000000080"
        )));
        assert!(!sigkill_pending(""));
    }

    #[test]
    fn a_process_whose_main_thread_exited_is_live() {
        let script = "import ctypes, threading, time\n\
                      threading.Thread(target=time.sleep, args=(30,)).start()\n\
                      ctypes.CDLL(None).pthread_exit(None)";
        let Ok(mut child) = std::process::Command::new("python3")
            .args(["-c", script])
            .spawn()
        else {
            return; // no python3 here
        };
        let pid = child.id() as libc::pid_t;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while stat_of(pid).is_some_and(|s| s.state != 'Z') && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let stat = stat_of(pid).unwrap();
        assert_eq!((stat.state, stat.threads), ('Z', 2));
        assert!(!stat.dead());
        assert_eq!(liveness(pid), Some(true));
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn never_signals_the_callers_group_or_init() {
        for pgid in [0, 1, -5] {
            assert!(signal_group(pgid, libc::SIGKILL).is_err());
            assert!(signal_group(pgid, 0).is_err());
        }
    }

    /// Forks a session leader that runs `body` and exits; returns once it is a zombie.
    fn dead_leader(body: fn()) -> libc::pid_t {
        // SAFETY: the child calls only async-signal-safe functions (setsid, fork, pause,
        // _exit) before it exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: as above.
            unsafe { libc::setsid() };
            body();
            // SAFETY: as above.
            unsafe { libc::_exit(0) };
        }
        while not_dead(pid) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        pid
    }

    fn reap(pid: libc::pid_t) {
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }

    #[test]
    fn a_group_left_with_its_dead_leader_only_is_gone() {
        // The fast path holds only while nothing else on the machine creates a process:
        // retry until one attempt runs undisturbed.
        let mut fast = false;
        for _ in 0..50 {
            let pid = dead_leader(|| {});
            fast = only_a_dead_leader(pid);
            assert!(session_members(pid).0.gone());
            reap(pid);
            if fast {
                break;
            }
        }
        assert!(fast, "the last-pid fast path never applied");
    }

    #[test]
    fn a_member_left_behind_by_a_dead_leader_is_counted() {
        let pid = dead_leader(|| {
            // SAFETY: see dead_leader.
            if unsafe { libc::fork() } == 0 {
                // SAFETY: see dead_leader.
                unsafe { libc::pause() };
            }
        });
        assert!(
            !only_a_dead_leader(pid),
            "a process was created after the leader"
        );
        assert_eq!(session_members(pid).0.live, 1);
        assert!(signal_group(pid, libc::SIGKILL).is_ok());
        reap(pid);
    }

    #[test]
    fn a_group_is_signalled_through_its_leaders_pidfd_after_the_leader_was_reaped() {
        let pid = dead_leader(|| {
            // SAFETY: see dead_leader.
            if unsafe { libc::fork() } == 0 {
                // SAFETY: see dead_leader.
                unsafe { libc::pause() };
            }
        });
        // SAFETY: pidfd_open of our own (zombie) child, owned right below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0);
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        reap(pid);
        let member = || {
            let found = fs::read_dir("/proc")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<libc::pid_t>().ok())
                .find(|&p| stat_of(p).is_some_and(|s| s.pgrp == pid && !s.dead()));
            found
        };
        assert!(member().is_some(), "the group outlives its reaped leader");
        assert_eq!(signal_group_of(fd.as_fd(), 0).ok(), Some(true));
        assert_eq!(signal_group_of(fd.as_fd(), libc::SIGKILL).ok(), Some(true));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while member().is_some() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert!(
            member().is_none(),
            "the member was killed through the pidfd"
        );
    }

    #[test]
    fn own_session_is_counted() {
        assert_eq!(
            signal_group(nix::unistd::getpgrp().as_raw(), 0).ok(),
            Some(true)
        );
        let sid = getsid(None).map_or(0, Pid::as_raw);
        if sid > 1 {
            assert!(session_members(sid).0.live >= 1);
        }
    }
}
