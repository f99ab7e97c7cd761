//! Signalling and inspecting a process group.
//!
//! A group outlives its reaped leader while any member is alive, and the kernel keeps the
//! pgid reserved for as long, so signalling `-pgid` after the leader's exit reaches exactly
//! the leftovers.

use std::fs;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

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

/// The members of a session that are not yet zombies, by scanning /proc: how many, and the
/// pids of the live ones outside the leader's group (`set -m` jobs, `setpgid(0, 0)`), which
/// a signal to the group misses. Zombies are not counted: they are already dead and only
/// wait for their parent. A session keeps its id while its leader is unreaped, so `sid`
/// names the call's session as long as the caller holds the leader.
///
/// Session-mode calls pay this at every exit (their leader is kept unreaped, so `kill(-pgid,
/// 0)` cannot tell), hence the filter: one `getsid(2)` per process, a cheap syscall, and the
/// /proc stat text (state and flags) only for the session's own members. Reading every stat
/// file instead cost ~1.5 ms per call on a quiet machine with ~150 processes. The processes
/// looked at are those created since the leader when that is provably all of them and they
/// are fewer than /proc's (see `pids_since`; `tasks_at_start`: the machine's tasks as the
/// leader started, None: always list /proc): 1,024 session-mode calls in flight took 4.4 s
/// of harness CPU listing /proc.
pub fn session_members(
    sid: libc::pid_t,
    tasks_at_start: Option<usize>,
) -> (Members, Vec<libc::pid_t>) {
    let mut members = Members::default();
    let mut outside = Vec::new();
    if sid <= 1 || only_a_dead_leader(sid) {
        return (members, outside);
    }
    let mut count = |pid: libc::pid_t| {
        if getsid(Some(Pid::from_raw(pid))).map(Pid::as_raw) != Ok(sid) || !is_process(pid) {
            return; // another session's, gone since it was listed, or a member's thread
        }
        match stat_of(pid) {
            Some(s) if s.session != sid || s.dead() => {}
            Some(s) if !s.live(pid) => members.exiting += 1,
            Some(s) => {
                members.live += 1;
                if s.pgrp != sid {
                    outside.push(pid);
                }
            }
            None => {}
        }
    };
    match tasks_at_start.and_then(|tasks| pids_since(sid, tasks)) {
        // Every member was created after the leader: its pid was handed out since.
        Some(candidates) => candidates.for_each(&mut count),
        None => {
            let Ok(entries) = fs::read_dir("/proc") else {
                return (members, outside);
            };
            entries
                .flatten()
                .filter_map(|entry| entry.file_name().to_str()?.parse::<libc::pid_t>().ok())
                .for_each(&mut count);
        }
    }
    (members, outside)
}

/// Pids below this are not handed out again once the allocator wrapped (kernel/pid.c).
const RESERVED_PIDS: u64 = 300;

/// The pids handed out after `first` (a live or unreaped leader), oldest first: the cyclic
/// interval `(first, last]` of the pid namespace's allocator, when they are fewer than the
/// machine's threads (looking at each is then cheaper than listing /proc, whose entries each
/// cost a dentry: with a thousand calls in flight, every call's exit listed every other
/// call's process) and the allocator provably did not lap since `first`.
///
/// A lap would leave members outside the interval: a command can make one without any
/// privilege (a loop of short-lived threads) and stop it just past its leader. The proof
/// counts the pids allocated since `first`: pidfs (Linux 6.9) numbers every pid's inode from
/// one counter, so `ino(last) - ino(first)` is at least that count (pids of other
/// namespaces only add to it). A lap passes every number of the ring (`RESERVED_PIDS` to
/// `pid_max`) and skips only those in use, which were handed out before `first`: at most
/// three per task that existed then (its pid, group and session numbers), and no more than
/// `tasks_at_start`'s. So fewer allocations than the ring minus those cannot have lapped.
/// None when any of it cannot be read: no pidfs, a `last` pid already gone.
///
/// A process can take an older number only with privileges (`clone3`'s `set_tid`, writing
/// `ns_last_pid`, both CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE), and any process can leave
/// its session with `setsid`, which session containment does not follow either.
fn pids_since(
    first: libc::pid_t,
    tasks_at_start: usize,
) -> Option<impl Iterator<Item = libc::pid_t>> {
    let loadavg = read_proc("/proc/loadavg")?;
    let (threads, last) = parse_loadavg(&loadavg)?;
    let max: libc::pid_t = read_proc("/proc/sys/kernel/pid_max")?.trim().parse().ok()?;
    let (after, wrapped) = if last >= first {
        (first + 1..=last, None)
    } else {
        // Wrapped: up to pid_max (exclusive), then from the bottom again.
        (first + 1..=max - 1, Some(1..=last))
    };
    let span = after.clone().count() + wrapped.clone().map_or(0, |r| r.count());
    if span > threads {
        return None;
    }
    let handed_out = pidfs_ino(last)?.checked_sub(pidfs_ino(first)?)?;
    cannot_have_lapped(handed_out, tasks_at_start, max)
        .then(|| after.chain(wrapped.into_iter().flatten()))
}

/// Whether `handed_out` allocations since a pid (pidfs inode numbers apart) are too few for
/// the allocator to have come round to it again, with `tasks_at_start` tasks holding numbers
/// when it was handed out and `pid_max`'s ring (see `pids_since`).
fn cannot_have_lapped(handed_out: u64, tasks_at_start: usize, pid_max: libc::pid_t) -> bool {
    let in_use_before = (tasks_at_start as u64).saturating_mul(3).saturating_add(1); // and itself
    let ring = u64::try_from(pid_max).map_or(0, |max| max.saturating_sub(RESERVED_PIDS));
    // Distinct pids have distinct pidfs inodes; equal ones are a shared anonymous inode.
    handed_out > 0 && handed_out.saturating_add(in_use_before) < ring
}

/// `PIDFD_THREAD` (Linux 6.9, with pidfs): a pidfd of any thread, not only of a process.
const PIDFD_THREAD: libc::c_uint = libc::O_EXCL as libc::c_uint;

/// The pidfs inode number of the task `pid` names (a process or a thread, live or an
/// unreaped zombie): unique since boot, handed out in the order pids are allocated.
fn pidfs_ino(pid: libc::pid_t) -> Option<u64> {
    // SAFETY: pidfd_open with integer arguments; the fd is owned right below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, PIDFD_THREAD) };
    let fd = libc::c_int::try_from(fd).ok().filter(|&fd| fd >= 0)?;
    // SAFETY: the syscall returned a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    nix::sys::stat::fstat(&fd).ok().map(|st| st.st_ino)
}

/// The machine's tasks (threads) now, from /proc/loadavg.
pub fn tasks() -> Option<usize> {
    parse_loadavg(&read_proc("/proc/loadavg")?).map(|(threads, _)| threads)
}

/// `(threads, last pid)` from /proc/loadavg (`0.10 0.20 0.30 1/345 6789`).
fn parse_loadavg(text: &str) -> Option<(usize, libc::pid_t)> {
    let mut fields = text.split_whitespace().skip(3);
    let threads = fields.next()?.split_once('/')?.1.parse().ok()?;
    let last = fields.next()?.parse().ok()?;
    Some((threads, last))
}

/// Whether `pid` names a process (a thread group's leader) rather than another thread:
/// `tgkill(pid, pid, 0)` finds the task only if it leads its group (EPERM: found, but not
/// ours to signal).
fn is_process(pid: libc::pid_t) -> bool {
    // SAFETY: tgkill with signal 0 only checks; it has no memory-safety preconditions.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, pid, pid, 0) };
    r == 0 || Errno::last() == Errno::EPERM
}

/// Sends `sig` to the live members of session `sid` outside its leader's group (the group
/// itself takes `signal_group`); the pids it reached. `tasks_at_start`: as for
/// `session_members`.
pub fn signal_outside_group(
    sid: libc::pid_t,
    sig: libc::c_int,
    tasks_at_start: Option<usize>,
) -> Vec<libc::pid_t> {
    let mut reached = session_members(sid, tasks_at_start).1;
    reached.retain(|&pid| signal_session_member(pid, sid, sig));
    reached
}

/// Sends `sig` to `pid` only if it is still a live member of session `sid`: through a pidfd
/// taken before the check, so a pid that was freed and handed to another process in the
/// meantime is never signalled. False when it was not signalled.
fn signal_session_member(pid: libc::pid_t, sid: libc::pid_t, sig: libc::c_int) -> bool {
    // SAFETY: pidfd_open with integer arguments; the fd is closed below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return false;
    }
    let fd = fd as libc::c_int;
    // The pidfd names one process; /proc/<pid> read while that process still runs is its.
    let member = stat_of(pid).is_some_and(|s| s.session == sid && !s.dead());
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: poll on one pollfd owned by this frame, no timeout.
    let exited = unsafe { libc::poll(&mut pfd, 1, 0) } != 0;
    let sent = member
        && !exited
        // SAFETY: pidfd_send_signal on the pidfd opened above, no siginfo.
        && unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                fd,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        } == 0;
    // SAFETY: closes the pidfd opened above.
    unsafe { libc::close(fd) };
    sent
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
}

impl Stat {
    /// A zombie or a process being released: already dead, waiting for (or past) its reaper.
    /// Not a process whose main thread exited while others run on: /proc shows the main
    /// thread's state (`Z`), but the process lives (`Zl` in ps) and takes signals.
    pub fn dead(&self) -> bool {
        (self.state == 'Z' && self.threads <= 1) || self.state == 'X'
    }

    /// For process `pid` that is not `dead`: whether it runs on, rather than being in exit(2)
    /// (`PF_EXITING`: going away on its own). The flags are the main thread's: when it exited
    /// or is exiting, the process lives on in any other thread that is not exiting too.
    pub fn live(&self, pid: libc::pid_t) -> bool {
        self.flags & PF_EXITING == 0 || (self.threads > 1 && another_thread_runs(pid))
    }
}

/// Whether a thread of process `pid` other than its main thread runs and is not exiting.
fn another_thread_runs(pid: libc::pid_t) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks
        .flatten()
        .filter_map(|task| task.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|&tid| tid != pid)
        .filter_map(|tid| parse_stat(&read_proc(&format!("/proc/{pid}/task/{tid}/stat"))?))
        .any(|t| t.state != 'Z' && t.state != 'X' && t.flags & PF_EXITING == 0)
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
    // Ten fields (minflt to nice), then num_threads.
    let threads = fields.nth(10)?.parse().ok()?;
    Some(Stat {
        state,
        pgrp,
        session,
        flags,
        threads,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loadavg_gives_the_thread_count_and_the_last_pid() {
        assert_eq!(
            parse_loadavg("0.73 0.21 0.19 1/345 12345\n"),
            Some((345, 12345))
        );
        assert_eq!(parse_loadavg("0.73 0.21 0.19 1/345"), None);
        assert_eq!(parse_loadavg(""), None);
        let (threads, last) = parse_loadavg(&read_proc("/proc/loadavg").unwrap()).unwrap();
        assert!(threads > 0 && last > 0);
    }

    #[test]
    fn no_thread_is_a_process_and_pidfs_numbers_follow_allocation() {
        let me = std::process::id() as libc::pid_t;
        assert!(is_process(me));
        let thread = std::thread::spawn(|| {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::pid_t;
            (is_process(tid), tid, pidfs_ino(tid))
        });
        let (thread_is_process, tid, thread_ino) = thread.join().unwrap();
        assert!(!thread_is_process && tid != me);
        let (Some(mine), Some(thread_ino)) = (pidfs_ino(me), thread_ino) else {
            return; // no pidfs (Linux < 6.9): the shortcut is never taken
        };
        assert!(thread_ino > mine, "a later task has a greater pidfs number");
        assert_eq!(pidfs_ino(tid), None, "the thread is gone");
    }

    #[test]
    fn the_pids_since_a_process_include_every_later_child() {
        let spawn = || {
            std::process::Command::new("sleep")
                .arg("5")
                .spawn()
                .unwrap()
        };
        let mut children = vec![];
        let mut found = None;
        // The shortcut needs the last pid handed out to be alive: retry until nothing else
        // on the machine took (and let go of) a pid in between.
        for _ in 0..50 {
            let (first, second) = (spawn(), spawn());
            let since = pids_since(first.id() as libc::pid_t, tasks().unwrap());
            found = since.map(|pids| pids.collect::<Vec<_>>());
            let wanted = second.id() as libc::pid_t;
            children.extend([first, second]);
            if found.as_ref().is_some_and(|pids| pids.contains(&wanted)) {
                break;
            }
        }
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        if pidfs_ino(std::process::id() as libc::pid_t).is_some() {
            assert!(found.is_some(), "the shortcut never applied");
        }
    }

    #[test]
    fn a_lap_is_ruled_out_only_by_too_few_allocations() {
        // 32768 - 300 numbers in the ring; 100 tasks hold at most 300 of them.
        assert!(cannot_have_lapped(1, 100, 32768));
        assert!(cannot_have_lapped(32_000 - 300, 100, 32768));
        assert!(!cannot_have_lapped(32_468 - 301, 100, 32768));
        assert!(!cannot_have_lapped(40_000, 100, 32768));
        // Many tasks holding numbers make a lap cheap.
        assert!(!cannot_have_lapped(10, 11_000, 32768));
        // A shared anonymous inode (no pidfs) proves nothing; nor does a ring below 300.
        assert!(!cannot_have_lapped(0, 1, 32768));
        assert!(!cannot_have_lapped(1, 0, 301));
        assert!(!cannot_have_lapped(u64::MAX, usize::MAX, libc::pid_t::MAX));
    }

    #[test]
    fn parses_stat_with_odd_comm() {
        let line = "123 (a) b (c)) S 1 456 457 0 -1 4194560 0 0 0 0 5 6 0 0 20 0 3 0";
        let stat = Stat {
            state: 'S',
            pgrp: 456,
            session: 457,
            flags: 4194560,
            threads: 3,
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
        while liveness(pid).is_some() {
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
            assert!(session_members(pid, tasks()).0.gone());
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
        assert_eq!(session_members(pid, tasks()).0.live, 1);
        assert_eq!(session_members(pid, None).0.live, 1);
        assert!(signal_group(pid, libc::SIGKILL).is_ok());
        reap(pid);
    }

    #[test]
    fn own_session_is_counted() {
        assert_eq!(
            signal_group(nix::unistd::getpgrp().as_raw(), 0).ok(),
            Some(true)
        );
        let sid = getsid(None).map_or(0, Pid::as_raw);
        if sid > 1 {
            assert!(session_members(sid, None).0.live >= 1);
        }
    }
}
