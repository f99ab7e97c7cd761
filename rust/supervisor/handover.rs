//! A caller blocked in `wait` drives its own process until the leader exits.
//!
//! While a thread sits in `wait`, the supervisor would otherwise be woken for every event
//! of that process (output, pipe hang-up, exit) and the caller woken after it: two
//! wake-ups and a hand-off over the process lock per event, where a caller running
//! `waitpid` needs one. So the waiting caller takes the process's pipes and pidfd out of the
//! supervisor's epoll set, polls them itself, drains output with the same code the
//! supervisor runs, and gives whatever is still open back when the leader exits or its
//! timeout passes. Timers (kill escalation, CPU checks, the drain grace) stay with the
//! supervisor, which needs no fd for them.
//!
//! Only a process that is plainly running qualifies: its stdin fully written (feeding it
//! needs EPOLLOUT in the supervisor) and no other caller driving it. A bulk producer goes
//! back to the supervisor for good: its epoll loop drains a stream faster than a `poll`
//! per wake-up does.

use std::cell::RefCell;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags};

use super::Shared;
use crate::lifecycle::{self, Phase};
use crate::pipes::{Drain, READ_CHUNK};
use crate::process::{Proc, ProcState};
use crate::sys::{epoll_add, epoll_del, lock, poll_timeout, readable};

thread_local! {
    /// One read buffer per waiting thread, kept between calls (a fresh 1 MiB buffer per
    /// wait would cost an mmap and its page faults every call).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Shared {
    /// Stops epoll events for `fd`; its key keeps routing to it for `resume_watch`.
    fn pause_watch(&self, fd: &OwnedFd) {
        epoll_del(&self.epoll, fd);
    }

    /// Registers `fd` again under its old `key`. A failure (no memory for the epoll
    /// item) leaves the fd unwatched: the supervisor's timers still settle the process.
    fn resume_watch(&self, fd: &OwnedFd, key: u64) {
        let _ = epoll_add(&self.epoll, fd, readable(), key);
    }
}

/// What the caller polls: its own duplicates, so that the supervisor may close the
/// originals (under the process lock) without our poll ever watching a reused number.
struct Taken {
    pidfd: OwnedFd,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
}

/// Takes the process over for the calling thread; None when it cannot (then a process
/// whose registration was deferred joins the epoll set now: nobody else would watch it).
fn take(proc: &Proc, st: &mut ProcState) -> Option<Taken> {
    let taken = try_take(proc, st);
    if taken.is_none() && needs_watching(st) {
        give_back(proc, st);
    }
    taken
}

fn try_take(proc: &Proc, st: &mut ProcState) -> Option<Taken> {
    if st.phase != Phase::Running
        || st.leader.is_some()
        || st.caller_driven
        || st.bulk_output
        || st.stdin.fd.is_some()
        || st.pidfd_key.is_none()
    {
        return None;
    }
    let dup = |fd: Option<&OwnedFd>| fd.and_then(|fd| fd.try_clone().ok());
    let pidfd = dup(st.contain.leader.as_ref())?;
    let (stdout, stderr) = (dup(st.stdout.fd.as_deref()), dup(st.stderr.fd.as_deref()));
    if stdout.is_none() != st.stdout.fd.is_none() || stderr.is_none() != st.stderr.fd.is_none() {
        return None; // out of fds: leave it all to the supervisor
    }
    let shared = &proc.shared;
    if st.in_epoll {
        for fd in [
            st.stdout.fd.as_deref(),
            st.stderr.fd.as_deref(),
            st.contain.leader.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            shared.pause_watch(fd);
        }
        st.in_epoll = false;
    }
    st.caller_driven = true;
    Some(Taken {
        pidfd,
        stdout,
        stderr,
    })
}

/// Puts a process whose registration was deferred into the epoll set, unless a caller
/// drives it (a waiter that does not drive must not be left with nobody watching).
pub(crate) fn ensure_watched(proc: &Proc) {
    let mut st = lock(&proc.state);
    if needs_watching(&st) {
        give_back(proc, &mut st);
    }
}

/// Out of the epoll set with nobody driving it, and registered already (a waiter racing the
/// spawn, `dispose` for one, may come before `watch_all` gave it its routes: registering is
/// then still `watch_all`'s).
fn needs_watching(st: &ProcState) -> bool {
    !st.in_epoll && !st.caller_driven && st.pidfd_key.is_some()
}

/// Gives what is still open back to the supervisor.
fn give_back(proc: &Proc, st: &mut ProcState) {
    st.caller_driven = false;
    st.in_epoll = true;
    let shared = &proc.shared;
    if let (Some(fd), Some(key)) = (st.stdout.fd.as_deref(), st.stdout.key) {
        shared.resume_watch(fd, key);
    }
    if let (Some(fd), Some(key)) = (st.stderr.fd.as_deref(), st.stderr.key) {
        shared.resume_watch(fd, key);
    }
    if let (Some(fd), Some(key)) = (st.contain.leader.as_ref(), st.pidfd_key) {
        shared.resume_watch(fd, key);
    }
}

/// Output in one drain past which the caller hands the process back: a bulk producer is
/// drained best by the supervisor's epoll loop (a `poll` per wake-up re-arms three wait
/// queues each time: 1 GiB measured ~15 % slower drained by the caller).
const BULK: u64 = 256 * 1024;

/// Drains one stream for the caller; drops its duplicate once the stream is closed. True
/// when the drain was bulk (see `BULK`).
fn drain(proc: &Proc, st: &mut ProcState, is_out: bool, taken: &mut Taken) -> bool {
    let total = |st: &ProcState| {
        if is_out {
            st.stdout.collector.total()
        } else {
            st.stderr.collector.total()
        }
    };
    let before = total(st);
    SCRATCH.with_borrow_mut(|scratch| {
        if scratch.len() < READ_CHUNK {
            scratch.resize(READ_CHUNK, 0);
        }
        lifecycle::drain_stream(proc, st, is_out, scratch, Drain::Streaming);
    });
    let (open, dup) = if is_out {
        (st.stdout.fd.is_some(), &mut taken.stdout)
    } else {
        (st.stderr.fd.is_some(), &mut taken.stderr)
    };
    if !open {
        *dup = None;
    }
    total(st).saturating_sub(before) >= BULK
}

/// Drives `proc` from the calling thread until its leader exits (then settles it as
/// `lifecycle::settle_exited` does) or `timeout` passes. False when it could not take the
/// process over (the caller then just waits for the supervisor).
pub(crate) fn drive_until_exit(proc: &Proc, timeout: Option<Duration>) -> bool {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let Some(mut taken) = take(proc, &mut lock(&proc.state)) else {
        return false;
    };
    let exited = loop {
        let wait = match deadline {
            None => None,
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(left) if !left.is_zero() => Some(left),
                _ => break false,
            },
        };
        let (out_ready, err_ready, exit_ready) = {
            let interest = PollFlags::POLLIN;
            let mut fds = vec![PollFd::new(taken.pidfd.as_fd(), interest)];
            let out_at = taken.stdout.as_ref().map(|fd| {
                fds.push(PollFd::new(fd.as_fd(), interest));
                fds.len() - 1
            });
            let err_at = taken.stderr.as_ref().map(|fd| {
                fds.push(PollFd::new(fd.as_fd(), interest));
                fds.len() - 1
            });
            // EINTR counts as "nothing yet": the loop looks again.
            let _ = nix::poll::poll(&mut fds, poll_timeout(wait));
            let ready = |at: Option<usize>| {
                at.and_then(|i| fds[i].revents())
                    .is_some_and(|r| !r.is_empty())
            };
            (ready(out_at), ready(err_at), ready(Some(0)))
        };
        if exit_ready {
            break true;
        }
        if out_ready || err_ready {
            let mut st = lock(&proc.state);
            let bulk = (out_ready && drain(proc, &mut st, true, &mut taken))
                | (err_ready && drain(proc, &mut st, false, &mut taken));
            if st.phase != Phase::Running || st.leader.is_some() {
                break true; // the supervisor saw the exit first (an event it already had)
            }
            if bulk {
                st.bulk_output = true;
                break false; // a bulk producer: the supervisor drains it from here on
            }
        }
    };
    let mut st = lock(&proc.state);
    if exited {
        lifecycle::settle_exited(proc, &mut st);
    }
    give_back(proc, &mut st);
    true
}
