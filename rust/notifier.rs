//! A notifier wakes a waiter (an asyncio loop watching its eventfd, or a thread blocked in
//! `wait`) when subscribed processes finish, and hands over their tokens.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::eventfd::EventFd;

use crate::sys::{eventfd, eventfd_clear, eventfd_raise, lock, poll_readable};

/// Wakes a waiter (e.g. an asyncio loop reading `fd()`) when subscribed processes finish.
pub struct Notifier {
    efd: EventFd,
    queue: Mutex<Vec<u64>>,
}

impl Notifier {
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            efd: eventfd()?,
            queue: Mutex::new(Vec::new()),
        })
    }

    pub fn fd(&self) -> RawFd {
        self.efd.as_raw_fd()
    }

    pub(crate) fn push(&self, token: u64) {
        lock(&self.queue).push(token);
        eventfd_raise(&self.efd);
    }

    /// Wakes a blocked `wait` without queueing a token.
    pub fn wake(&self) {
        eventfd_raise(&self.efd);
    }

    /// Tokens of the processes that finished since the last call (never blocks).
    pub fn take(&self) -> Vec<u64> {
        eventfd_clear(&self.efd);
        std::mem::take(&mut *lock(&self.queue))
    }

    /// Blocks until at least one token is queued or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> Vec<u64> {
        let ready = !lock(&self.queue).is_empty();
        if !ready {
            let _ = poll_readable(&self.efd, timeout);
        }
        self.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushed_tokens_are_taken_once() {
        let n = Notifier::new().unwrap();
        assert!(n.take().is_empty());
        n.push(7);
        n.push(9);
        assert_eq!(n.wait(Some(Duration::from_secs(5))), vec![7, 9]);
        assert!(n.wait(Some(Duration::from_millis(1))).is_empty());
    }
}
