//! The service's pipe ends never stay open in a forked copy of the harness.
//!
//! A harness that forks (multiprocessing, a pre-fork server) copies every fd, including the
//! write end of a command's stdin: after the service closes its own end, the command still
//! waits for EOF until the forked child exits. Every parent-side pipe end is registered here
//! for as long as it is open; Python's `os.register_at_fork` hooks call `prepare` (lock the
//! registry so the child's copy is consistent), then `child` (point every registered fd at
//! /dev/null, so the pipes are closed in the child while the fd numbers stay valid for the
//! child's copies of our structures to close later) or `parent` (unlock).

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ops::Deref;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::{Mutex, MutexGuard};

use crate::sys::lock;

static OPEN_PIPE_ENDS: Mutex<BTreeSet<RawFd>> = Mutex::new(BTreeSet::new());

thread_local! {
    static HELD: RefCell<Option<MutexGuard<'static, BTreeSet<RawFd>>>> =
        const { RefCell::new(None) };
}

/// A parent-side pipe end, closed in any forked copy of the harness.
#[derive(Debug)]
pub struct ForkClosed(Option<OwnedFd>);

impl ForkClosed {
    pub fn new(fd: OwnedFd) -> Self {
        lock(&OPEN_PIPE_ENDS).insert(fd.as_raw_fd());
        Self(Some(fd))
    }

    /// Stops tracking (before the caller closes it: a fork in between never aims at a
    /// reused number).
    pub fn into_inner(mut self) -> OwnedFd {
        let fd = self.0.take();
        match fd {
            Some(fd) => {
                lock(&OPEN_PIPE_ENDS).remove(&fd.as_raw_fd());
                fd
            }
            // `new` always stores an fd and only into_inner/drop take it.
            None => unreachable!("ForkClosed without an fd"),
        }
    }
}

impl Drop for ForkClosed {
    fn drop(&mut self) {
        if let Some(fd) = self.0.take() {
            lock(&OPEN_PIPE_ENDS).remove(&fd.as_raw_fd());
            drop(fd);
        }
    }
}

impl Deref for ForkClosed {
    type Target = OwnedFd;
    fn deref(&self) -> &OwnedFd {
        match &self.0 {
            Some(fd) => fd,
            None => unreachable!("ForkClosed without an fd"),
        }
    }
}

impl AsFd for ForkClosed {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.deref().as_fd()
    }
}

/// Before fork: hold the registry so that the child's copy is not mid-update.
pub fn prepare() {
    let guard = lock(&OPEN_PIPE_ENDS);
    HELD.with(|held| *held.borrow_mut() = Some(guard));
}

/// After fork, in the parent: let go.
pub fn parent() {
    HELD.with(|held| drop(held.borrow_mut().take()));
}

/// After fork, in the child: every registered pipe end now names /dev/null.
pub fn child() {
    HELD.with(|held| {
        let Some(guard) = held.borrow_mut().take() else {
            return;
        };
        // SAFETY: opening /dev/null has no memory-safety preconditions.
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
        for &fd in guard.iter() {
            if null >= 0 {
                // SAFETY: dup3 onto an fd number this process holds open (registered
                // while open); it atomically closes the pipe end and keeps the number.
                unsafe { libc::dup3(null, fd, libc::O_CLOEXEC) };
            }
        }
        if null >= 0 {
            // SAFETY: closes the fd opened above.
            unsafe { libc::close(null) };
        }
        drop(guard);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_ends_are_redirected_in_a_fork_and_kept_in_the_parent() {
        let (r, w) = nix::unistd::pipe().expect("pipe");
        let tracked = ForkClosed::new(w);
        prepare();
        let redirected = crate::sys::passes_in_a_fork(std::time::Duration::from_secs(10), || {
            child();
            // SAFETY: stat is plain old data; all-zero is valid and fstat overwrites it.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: fstat into a local.
            let ok = unsafe { libc::fstat(tracked.as_raw_fd(), &mut st) } == 0;
            ok && st.st_mode & libc::S_IFMT == libc::S_IFCHR
        });
        parent();
        assert!(redirected);
        drop(tracked);
        // The only write end is closed now: the read end sees EOF.
        let mut buf = [0u8; 1];
        assert_eq!(nix::unistd::read(&r, &mut buf).expect("read"), 0);
        assert!(!lock(&OPEN_PIPE_ENDS).contains(&r.as_raw_fd()));
    }
}
