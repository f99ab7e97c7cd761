//! The parent-side syscalls of the supervisor, on `nix`: epoll, eventfd, poll, signal
//! masks, waitpid. Only `waitid(P_PIDFD)` stays raw here: nix has no call that returns the
//! rusage of one reaped child; `getrandom`, whose glibc wrapper the wheel must not import;
//! and `pwritev2`, which nix lacks. (The code between clone and exec lives in `spawn.rs` and
//! stays raw.)

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signal::SigSet;
use nix::sys::wait::waitpid;
use nix::unistd::Pid;

pub(crate) use nix::sys::epoll::EpollEvent as Event;

/// Fills `buf` from the kernel's CSPRNG (spill names, the confined spawner's `clone3` key).
///
/// The raw syscall, not glibc's getrandom() wrapper (GLIBC_2.25): the wheel's symbol
/// versions then name only what the manylinux tag promises, whatever glibc or linker (zig
/// stubs leave an unknown symbol unversioned) built it.
pub(crate) fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut filled = 0;
    while filled < buf.len() {
        // SAFETY: getrandom writes at most `len - filled` bytes into the unfilled tail.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getrandom,
                buf[filled..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - filled,
                0 as libc::c_uint,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        filled += n as usize;
    }
    Ok(())
}

/// Writes all of `buf` at `offset` of `file` with `RWF_DONTCACHE` (Linux 6.14): buffered,
/// but each page leaves the page cache once written back. nix has no `pwritev2`. Fails
/// with `EOPNOTSUPP` before writing anything where the kernel or the file system does not
/// take the flag.
pub(crate) fn write_all_dropbehind(
    file: &impl AsFd,
    mut buf: &[u8],
    mut offset: u64,
) -> std::io::Result<()> {
    let fd = file.as_fd().as_raw_fd();
    while !buf.is_empty() {
        let iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let Ok(at) = libc::off_t::try_from(offset) else {
            return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
        };
        // SAFETY: one iovec naming `buf`, which outlives the call; the kernel only reads it.
        let n = unsafe { libc::pwritev2(fd, &iov, 1, at, libc::RWF_DONTCACHE) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        buf = &buf[n as usize..];
        offset += n as u64;
    }
    Ok(())
}

/// Locks `m`; a panic while holding a lock must not wedge every later caller.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn getpid() -> libc::pid_t {
    nix::unistd::getpid().as_raw()
}

/// A non-blocking, close-on-exec eventfd used as a wake-up flag.
pub(crate) fn eventfd() -> std::io::Result<EventFd> {
    Ok(EventFd::from_value_and_flags(
        0,
        EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK,
    )?)
}

/// Raises the flag. It cannot fail short of the counter overflowing (2^64 - 2 raises
/// without a read), where the flag is raised already.
pub(crate) fn eventfd_raise(efd: &EventFd) {
    let _ = efd.write(1);
}

/// Lowers the flag; EAGAIN (it was not raised) is not an error.
pub(crate) fn eventfd_clear(efd: &EventFd) {
    let _ = efd.read();
}

/// A poll/epoll timeout: None waits forever; durations round up to whole milliseconds so
/// that a waiter never wakes just before its deadline and spins, and saturate at i32::MAX.
pub(crate) fn poll_timeout(timeout: Option<Duration>) -> PollTimeout {
    match timeout {
        None => PollTimeout::NONE,
        Some(t) => {
            let ms = t.as_micros().div_ceil(1000);
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
    }
}

/// Waits up to `timeout` (None: forever) for `fd` to become readable; true when it is.
pub(crate) fn poll_readable(fd: impl AsFd, timeout: Option<Duration>) -> bool {
    let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
    // EINTR and friends count as "not yet": the caller looks at its state again either way.
    matches!(nix::poll::poll(&mut fds, poll_timeout(timeout)), Ok(n) if n > 0)
}

pub(crate) fn epoll_create() -> std::io::Result<Epoll> {
    Ok(Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?)
}

pub(crate) fn readable() -> EpollFlags {
    EpollFlags::EPOLLIN
}

pub(crate) fn writable() -> EpollFlags {
    EpollFlags::EPOLLOUT
}

pub(crate) fn epoll_add(
    epoll: &Epoll,
    fd: impl AsFd,
    events: EpollFlags,
    key: u64,
) -> std::io::Result<()> {
    Ok(epoll.add(fd, EpollEvent::new(events, key))?)
}

/// Removes a registration; a stale one (ENOENT) is harmless.
pub(crate) fn epoll_del(epoll: &Epoll, fd: &OwnedFd) {
    let _ = epoll.delete(fd);
}

pub(crate) fn epoll_event_buffer(len: usize) -> Vec<Event> {
    vec![EpollEvent::empty(); len]
}

/// Waits for events; an error (EINTR) counts as none.
pub(crate) fn epoll_wait(epoll: &Epoll, events: &mut [Event], timeout: Option<Duration>) -> usize {
    epoll.wait(events, poll_timeout(timeout)).unwrap_or(0)
}

/// Blocks every signal in the calling thread: signals belong to the harness's threads; a
/// SIGPIPE from a stdin write stays pending here instead of killing anything.
pub(crate) fn block_signals_in_this_thread() {
    // Cannot fail with a valid set and how.
    let _ = SigSet::all().thread_block();
}

/// Reaps our own child, blocking (used when a spawn is abandoned).
pub(crate) fn reap_blocking(pid: libc::pid_t) {
    while waitpid(Pid::from_raw(pid), None) == Err(Errno::EINTR) {}
}

/// What a non-blocking reap of the leader found.
pub(crate) enum Reaped {
    Exited(libc::c_int, libc::rusage),
    Running,
    /// ECHILD and other errors: somebody else reaped it.
    Lost,
}

/// Reaps the child `leader` names (its pidfd; `pid` its number), with its rusage; without
/// blocking unless `block`. By pidfd, not by number: once somebody else reaped the child,
/// its number may already be another child's (by number only before Linux 5.4).
pub(crate) fn reap_leader(leader: BorrowedFd<'_>, pid: libc::pid_t, block: bool) -> Reaped {
    // SAFETY: rusage is plain old data; all-zero is a valid value that waitid overwrites.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let options = libc::WEXITED | if block { 0 } else { libc::WNOHANG };
    match waitid_leader(leader, pid, options, Some(&mut usage)) {
        Ok(Some(status)) => Reaped::Exited(status, usage),
        Ok(None) => Reaped::Running,
        Err(_) => Reaped::Lost,
    }
}

/// Whether the leader exited, read with `WNOWAIT`: the zombie stays unreaped, so its pid —
/// and with it the number of its process group and session — cannot be reused until we
/// reap it after the group has been dealt with.
pub(crate) enum Peeked {
    /// A raw wait status (as `wait4` would give it).
    Exited(libc::c_int),
    Running,
    /// ECHILD and other errors: somebody else reaped it.
    Lost,
}

pub(crate) fn peek_exit(leader: BorrowedFd<'_>, pid: libc::pid_t) -> Peeked {
    match waitid_leader(
        leader,
        pid,
        libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        None,
    ) {
        Ok(Some(status)) => Peeked::Exited(status),
        Ok(None) => Peeked::Running,
        Err(_) => Peeked::Lost,
    }
}

/// Whether the child `leader` names is still ours to reap (running, or a zombie nobody
/// reaped): while it is, its pid, and so the number of a group or session it leads, cannot
/// have gone to another process.
pub(crate) fn unreaped(leader: BorrowedFd<'_>, pid: libc::pid_t) -> bool {
    !matches!(peek_exit(leader, pid), Peeked::Lost)
}

/// `waitid(P_PIDFD)` on `leader`, or `waitid(P_PID)` on `pid` where the kernel has no
/// `P_PIDFD` (before 5.4: EINVAL). The raw syscall (glibc's wrapper has no rusage, nix's no
/// raw status): Ok(Some(raw wait status)) once exited, Ok(None) while running (WNOHANG).
fn waitid_leader(
    leader: BorrowedFd<'_>,
    pid: libc::pid_t,
    options: libc::c_int,
    usage: Option<&mut libc::rusage>,
) -> Result<Option<libc::c_int>, Errno> {
    let usage = usage.map_or(std::ptr::null_mut(), |u| u as *mut libc::rusage);
    let mut target = (libc::P_PIDFD, leader.as_raw_fd() as libc::id_t);
    loop {
        // SAFETY: siginfo_t is plain old data; all-zero is valid and waitid overwrites it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waits on the child the pidfd names; `info` is a live local and `usage`
        // null or a live rusage of the caller's.
        let r = unsafe {
            libc::syscall(
                libc::SYS_waitid,
                target.0,
                target.1,
                &mut info as *mut libc::siginfo_t,
                options,
                usage,
            )
        };
        if r < 0 {
            match Errno::last() {
                Errno::EINTR => continue,
                Errno::EINVAL if target.0 == libc::P_PIDFD => {
                    target = (libc::P_PID, pid as libc::id_t);
                    continue;
                }
                err => return Err(err),
            }
        }
        // SAFETY: waitid filled `info` for a child-state change (or left si_pid 0).
        let (child, status) = unsafe { (info.si_pid(), info.si_status()) };
        if child == 0 {
            return Ok(None);
        }
        return Ok(Some(match info.si_code {
            libc::CLD_EXITED => (status & 0xff) << 8,
            libc::CLD_DUMPED => (status & 0x7f) | 0x80,
            _ => status & 0x7f,
        }));
    }
}

/// Runs `child` in a forked copy of this process and tells whether it returned true and
/// the copy exited within `within` (a copy still running then, hung on a lock held at the
/// fork, is killed and reaped).
#[cfg(test)]
pub(crate) fn passes_in_a_fork(within: Duration, child: impl FnOnce() -> bool) -> bool {
    // SAFETY: the copy runs `child` and leaves with _exit, never returning into the test.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let code = i32::from(!child());
        // SAFETY: leaves the forked copy without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let deadline = std::time::Instant::now() + within;
    let mut status = 0;
    loop {
        // SAFETY: polls the child forked above.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if std::time::Instant::now() > deadline {
            // SAFETY: kills and reaps our own hung child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_timeouts_round_up_and_saturate() {
        assert_eq!(poll_timeout(None), PollTimeout::NONE);
        assert_eq!(poll_timeout(Some(Duration::ZERO)), PollTimeout::ZERO);
        assert_eq!(
            poll_timeout(Some(Duration::from_micros(1))),
            PollTimeout::from(1u8)
        );
        assert_eq!(
            poll_timeout(Some(Duration::from_secs(u64::MAX))),
            PollTimeout::MAX
        );
    }

    #[test]
    fn eventfd_flag_raises_and_clears() {
        let efd = eventfd().unwrap();
        eventfd_clear(&efd); // not raised: EAGAIN, ignored
        eventfd_raise(&efd);
        eventfd_raise(&efd);
        assert_eq!(efd.read(), Ok(2));
        assert_eq!(efd.read(), Err(Errno::EAGAIN));
    }

    #[test]
    fn peeking_leaves_the_zombie_for_the_reaper() {
        use std::os::fd::FromRawFd;
        use std::process::Command;
        let mut child = Command::new("sh")
            .args(["-c", "exit 7"])
            .spawn()
            .expect("spawn");
        let pid = child.id() as libc::pid_t;
        // SAFETY: pidfd_open of our own child, owned right below.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        assert!(fd >= 0, "pidfd_open");
        // SAFETY: a new descriptor nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        assert!(unreaped(fd.as_fd(), pid));
        let status = loop {
            match peek_exit(fd.as_fd(), pid) {
                Peeked::Exited(status) => break status,
                Peeked::Running => std::thread::sleep(Duration::from_millis(2)),
                Peeked::Lost => panic!("lost our own child"),
            }
        };
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 7);
        // Still a zombie of ours: the peek did not reap it.
        assert!(unreaped(fd.as_fd(), pid));
        match reap_leader(fd.as_fd(), pid, false) {
            Reaped::Exited(again, usage) => {
                assert_eq!(again, status);
                assert!(usage.ru_maxrss > 0, "rusage comes with the reap");
            }
            _ => panic!("the peek reaped the child"),
        }
        assert!(!unreaped(fd.as_fd(), pid));
        assert!(matches!(peek_exit(fd.as_fd(), pid), Peeked::Lost));
        assert!(child.wait().is_err(), "already reaped above");
    }
}
