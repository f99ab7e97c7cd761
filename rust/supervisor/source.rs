//! The typed source of an epoll event: each registration's key routes to one of these, so
//! events are never told apart by bit-packing.

/// What an epoll registration watches; the u64 is the process token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The service's eventfd: new timers or shutdown.
    Wake,
    Stdout(u64),
    Stderr(u64),
    Stdin(u64),
    /// The leader's pidfd: it exited.
    Exit(u64),
    /// The call's `cgroup.events` changed (EPOLLPRI): it may have emptied.
    Cgroup(u64),
    /// The call's v1 memory cgroup ran out of memory.
    Oom(u64),
}
