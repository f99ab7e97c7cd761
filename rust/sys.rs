//! Thin, checked wrappers over the parent-side syscalls of the supervisor: epoll, eventfd,
//! signal masks. (The code between clone and exec lives in `spawn.rs` and stays raw.)

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

/// Locks `m`; a panic while holding a lock must not wedge every later caller.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

pub(crate) fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(crate) fn eventfd_write(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd.as_raw_fd(), &one as *const u64 as *const libc::c_void, 8) };
}

pub(crate) fn eventfd_read(fd: &OwnedFd) {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    unsafe {
        libc::read(
            fd.as_raw_fd(),
            &mut value as *mut u64 as *mut libc::c_void,
            8,
        )
    };
}

/// Waits up to `timeout` (None: forever) for `fd` to become readable.
pub(crate) fn poll_readable(fd: &OwnedFd, timeout: Option<std::time::Duration>) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
    // SAFETY: polls one valid pollfd owned by this frame.
    unsafe { libc::poll(&mut pfd, 1, ms) };
}

pub(crate) fn epoll_create() -> io::Result<OwnedFd> {
    // SAFETY: epoll_create1 returns a new fd or -1.
    let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if epfd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `epfd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(epfd) })
}

pub(crate) fn epoll_add(epfd: &OwnedFd, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: registers a valid fd with a valid epoll instance; `ev` is copied by the kernel.
    if unsafe { libc::epoll_ctl(epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

pub(crate) fn epoll_del(epfd: &OwnedFd, fd: RawFd) {
    // SAFETY: removing a registered fd; a stale registration is harmless (ENOENT).
    unsafe {
        libc::epoll_ctl(
            epfd.as_raw_fd(),
            libc::EPOLL_CTL_DEL,
            fd,
            std::ptr::null_mut(),
        )
    };
}

pub(crate) type EpollEvent = libc::epoll_event;

pub(crate) fn epoll_event_buffer(len: usize) -> Vec<EpollEvent> {
    vec![libc::epoll_event { events: 0, u64: 0 }; len]
}

/// The user data of an event (the registration key).
pub(crate) fn epoll_event_key(ev: &EpollEvent) -> u64 {
    ev.u64
}

/// Waits for events; an error (EINTR) counts as none.
pub(crate) fn epoll_wait(epfd: &OwnedFd, events: &mut [EpollEvent], timeout_ms: i32) -> usize {
    // SAFETY: `events` is a valid buffer of `events.len()` epoll_event entries.
    let n = unsafe {
        libc::epoll_wait(
            epfd.as_raw_fd(),
            events.as_mut_ptr(),
            events.len().min(i32::MAX as usize) as libc::c_int,
            timeout_ms,
        )
    };
    if n < 0 {
        0
    } else {
        n as usize
    }
}

/// Blocks every signal in the calling thread: signals belong to the harness's threads; a
/// SIGPIPE from a stdin write stays pending here instead of killing anything.
pub(crate) fn block_signals_in_this_thread() {
    // SAFETY: sigset_t is plain data, filled by sigfillset and read by pthread_sigmask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// Reaps our own child, blocking (used when a spawn is abandoned).
pub(crate) fn reap_blocking(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: reaps our own child; `status` is a valid out-pointer.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

/// What `wait4(pid, WNOHANG)` found.
pub(crate) enum Reaped {
    Exited(libc::c_int, libc::rusage),
    Running,
    /// ECHILD and other errors: somebody else reaped it.
    Lost,
}

pub(crate) fn reap_nonblocking(pid: libc::pid_t) -> Reaped {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data filled by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaps our own child without blocking; out-pointers are valid.
    let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
    if r == pid {
        Reaped::Exited(status, usage)
    } else if r < 0 {
        Reaped::Lost
    } else {
        Reaped::Running
    }
}
