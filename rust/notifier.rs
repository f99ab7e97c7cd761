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

    /// Queues `token` and wakes the waiter. Only the first token of a batch writes the
    /// eventfd: `take` clears it before taking the queue, so a queue that holds tokens
    /// always has its eventfd raised (many completions, one wake-up and one write).
    pub(crate) fn push(&self, token: u64) {
        let first = {
            let mut queue = lock(&self.queue);
            queue.push(token);
            queue.len() == 1
        };
        if first {
            eventfd_raise(&self.efd);
        }
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

    #[test]
    fn a_batch_of_tokens_raises_the_eventfd_once_and_is_taken_whole() {
        let n = Notifier::new().unwrap();
        for token in 1..=5 {
            n.push(token);
        }
        assert_eq!(n.efd.read().unwrap(), 1, "one write for the batch");
        assert_eq!(n.take(), vec![1, 2, 3, 4, 5]);
        n.push(6); // the queue was emptied: the next token raises it again
        assert_eq!(n.wait(Some(Duration::from_secs(5))), vec![6]);
    }
}
