//! The life of a process, driven by the supervisor thread.
//!
//! Running → (leader exits) Draining until both pipes reach EOF or `grace` passes →
//! Reaping: any process left in the group is counted, sent SIGTERM and, after `grace`,
//! SIGKILL → Done. A kill request sends SIGTERM to the group at once and SIGKILL after
//! `grace` if the group is still there. Deadlines live in a min-heap of timers.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use crate::contain::CallContainment;
use crate::contain::CpuCheck;
use crate::forksafe::ForkClosed;
use crate::pipes::{Drain, OutStream};
use crate::process::{Cause, LeaderExit, Proc, ProcState};
use crate::sys::{lock, peek_exit, Peeked, Reaped};

/// How often the group of a process in its Reaping phase is polled (no event exists for
/// the exit of a process that is not our child).
const REAP_POLL: Duration = Duration::from_millis(5);
/// The same, as a safety net, when the cgroup's `populated` event wakes us anyway.
const REAP_POLL_EVENTS: Duration = Duration::from_millis(100);

fn reap_poll(st: &ProcState) -> Duration {
    if st.contain.events.is_some() {
        REAP_POLL_EVENTS
    } else {
        REAP_POLL
    }
}
/// How long SIGKILLed leftovers may take to vanish before the call completes regardless.
const SIGKILL_SETTLE: Duration = Duration::from_secs(2);

/// `now + wait`, saturating a century ahead instead of panicking on overflow (a grace of
/// 2^64 ms crosses the boundary as a valid u64).
pub(crate) fn after(now: Instant, wait: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(wait.min(CENTURY)).unwrap_or(now)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Running,
    Draining,
    Reaping { sigkill_sent: bool },
    Done,
}

/// Pending deadlines: (when, process token), earliest first.
#[derive(Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, u64)>>,
}

impl Timers {
    pub fn extend(&mut self, timers: impl IntoIterator<Item = (Instant, u64)>) {
        self.heap.extend(timers.into_iter().map(Reverse));
    }

    /// The earliest deadline, None when there is none.
    pub fn next_at(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// Time until the earliest deadline, None when there is none.
    pub fn timeout(&self, now: Instant) -> Option<Duration> {
        self.heap
            .peek()
            .map(|Reverse((at, _))| at.saturating_duration_since(now))
    }

    /// Removes and returns the token of a timer due at `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<u64> {
        match self.heap.peek() {
            Some(Reverse((at, _))) if *at <= now => self.heap.pop().map(|Reverse((_, t))| t),
            _ => None,
        }
    }

    /// Whether the heap holds enough timers for `compact` to look at them: a caller's
    /// timeout stays in the heap after its process ended (removing it then would cost a
    /// search per call), and an event loop running thousands of calls a minute with the
    /// default two-minute timeout would otherwise keep them all.
    pub fn crowded(&self) -> bool {
        self.heap.len() > COMPACT_ABOVE
    }

    /// Drops the timers of processes that are gone once they outnumber the `live` ones
    /// several times over.
    pub fn compact(&mut self, live: usize, is_live: impl Fn(u64) -> bool) {
        if self.heap.len() > COMPACT_ABOVE.max(live.saturating_mul(4)) {
            self.heap.retain(|Reverse((_, token))| is_live(*token));
        }
    }
}

/// Timers below which `Timers::compact` never bothers.
const COMPACT_ABOVE: usize = 1024;

fn stream(st: &mut ProcState, is_out: bool) -> &mut OutStream {
    if is_out {
        &mut st.stdout
    } else {
        &mut st.stderr
    }
}

/// Drains one output pipe; closes it on EOF or error, or after a final pass.
pub(crate) fn drain_stream(
    proc: &Proc,
    st: &mut ProcState,
    is_out: bool,
    scratch: &mut [u8],
    mode: Drain,
) {
    let label = if is_out { "stdout" } else { "stderr" };
    let shared = &proc.shared;
    let mut open_spill = || {
        let file = lock(&shared.spill).create_file(label);
        shared.note_spill_dir();
        file
    };
    let in_epoll = st.in_epoll;
    let s = stream(st, is_out);
    let close = s.drain(scratch, mode, &mut open_spill);
    if close || mode == Drain::Final {
        if let Some(fd) = s.fd.take().map(ForkClosed::into_inner) {
            shared.unwatch_from(&fd, s.key.take(), in_epoll);
        }
    }
}

/// Writes pending stdin; closes the pipe when done.
pub(crate) fn feed_stdin(proc: &Proc, st: &mut ProcState) {
    if st.stdin.write() {
        close_stdin(proc, st);
    }
}

fn close_stdin(proc: &Proc, st: &mut ProcState) {
    let key = st.stdin.key.take();
    if let Some(fd) = st.stdin.close() {
        proc.shared.unwatch(&fd, key);
    }
}

/// Stops watching the leader's pidfd; the pidfd itself stays open until the call is done
/// (see `CallContainment::leader`).
fn unwatch_exit(proc: &Proc, st: &mut ProcState) {
    let key = st.pidfd_key.take();
    if let Some(fd) = &st.contain.leader {
        proc.shared.unwatch_from(fd, key, st.in_epoll);
    }
}

/// The pidfd became readable: read the leader's status, leaving it a zombie. An unreaped
/// leader keeps its pid, and so the group's number, from being reused: the drain and the
/// leftover kill can never signal a group that is no longer the call's. `finish` reaps it.
/// Once: a waiting caller and the supervisor may both have seen the exit. Called only when
/// the pidfd is readable, i.e. the leader exited.
pub(crate) fn reap_leader(proc: &Proc, st: &mut ProcState) {
    let Some(fd) = &st.contain.leader else { return };
    if st.leader.is_some() {
        return;
    }
    match peek_exit(std::os::fd::AsFd::as_fd(fd), proc.pid) {
        Peeked::Exited(status) => st.leader = Some(LeaderExit::Zombie(status)),
        // ECHILD: somebody else reaped it (a stray waitpid(-1) in the harness). Report
        // that the status is unknown instead of waiting forever or making one up.
        Peeked::Lost => st.leader = Some(LeaderExit::Unknown),
        // Exited, yet not waitable: a process of the call traces it (`PTRACE_SEIZE` of the
        // shell) and holds its zombie. The call goes on as after any exit (its leftovers,
        // the tracer among them, are killed, which hands the zombie back); waiting for a
        // status that may never come spun the supervisor on the readable pidfd and held the
        // call past its timeout (found by attacking).
        Peeked::Running => st.leader = Some(LeaderExit::Traced),
    }
    unwatch_exit(proc, st);
}

/// Reaps the zombie leader once its group has been dealt with (rusage comes with it).
/// True when it could not be: a tracer that outlives the call (one that left a
/// session-contained call's session) still holds it, and the service reaps it later.
fn release_leader(contain: &CallContainment, leader: &mut Option<LeaderExit>) -> bool {
    // What the exit is if the reap gets no status.
    let unreaped = match *leader {
        // Reaped by someone else meanwhile: the status was already read.
        // SAFETY: rusage is plain old data; all-zero is a valid (empty) value.
        Some(LeaderExit::Zombie(status)) => {
            LeaderExit::Status(status, unsafe { std::mem::zeroed() })
        }
        // A tracer still holds the zombie, or reaped it when it let go.
        Some(LeaderExit::Traced) => LeaderExit::Unknown,
        _ => return false,
    };
    let reaped = contain.reap_leader();
    let held = matches!(reaped, Reaped::Running);
    *leader = Some(match reaped {
        // For a traced leader: the tracer let go (it was killed with the call).
        Reaped::Exited(status, usage) => LeaderExit::Status(status, usage),
        _ => unreaped,
    });
    held
}

fn pipes_closed(st: &ProcState) -> bool {
    st.stdout.fd.is_none() && st.stderr.fd.is_none()
}

/// Moves a process on after an event of its own.
pub(crate) fn advance(proc: &Proc, st: &mut ProcState, now: Instant) {
    match st.phase {
        Phase::Running if st.leader.is_some() => {
            if pipes_closed(st) {
                begin_reap(proc, st, now);
            } else {
                st.phase = Phase::Draining;
                let at = after(now, st.grace);
                st.deadline = Some(at);
                proc.shared.add_timer(at, proc.token, false);
            }
        }
        Phase::Draining if pipes_closed(st) => begin_reap(proc, st, now),
        _ => {}
    }
}

/// A waiting caller saw the leader's pidfd fire: settle the process in the caller's thread
/// exactly as the supervisor would (reap, take what the pipes hold, move on), saving the
/// hand-off of supervisor wake-up then caller wake-up. Whatever is left to wait for (a
/// drain grace, leftovers) goes back to the supervisor, woken to pick up its timers.
pub(crate) fn settle_exited(proc: &Proc, st: &mut ProcState) {
    if st.phase != Phase::Running {
        return;
    }
    reap_leader(proc, st);
    if st.leader.is_none() {
        return;
    }
    let mut scratch = [0u8; 16 * 1024];
    drain_stream(proc, st, true, &mut scratch, Drain::UntilEmpty);
    drain_stream(proc, st, false, &mut scratch, Drain::UntilEmpty);
    let now = Instant::now();
    advance(proc, st, now);
    if st.phase != Phase::Done {
        proc.shared.wake_supervisor();
    }
}

/// The leader is gone and the drain ended: terminate whatever is left of the call.
fn begin_reap(proc: &Proc, st: &mut ProcState, now: Instant) {
    close_stdin(proc, st);
    if count_and_signal(proc, st, libc::SIGTERM) {
        st.phase = Phase::Reaping {
            sigkill_sent: false,
        };
        st.deadline = Some(after(now, st.grace));
        proc.shared.watch_cgroup_events(proc.token, &mut st.contain);
        proc.shared
            .add_timer(now + reap_poll(st), proc.token, false);
        return;
    }
    finish(proc, st, now);
}

/// Counts the call's leftovers not counted yet and, if anything of it is alive, sends it
/// `sig`; whether anything was.
fn count_and_signal(proc: &Proc, st: &mut ProcState, sig: libc::c_int) -> bool {
    let (left, alive) = st.contain.count_leftovers(proc.pid);
    st.leftover_killed = st
        .leftover_killed
        .saturating_add(u32::try_from(left).unwrap_or(u32::MAX));
    if alive {
        st.contain.signal(proc.pid, sig);
    }
    alive
}

/// The call's cgroup changed (`populated`): finish a reaping call that emptied.
pub(crate) fn on_cgroup_event(proc: &Proc, st: &mut ProcState, now: Instant) {
    if let Some((fd, _)) = &st.contain.events {
        crate::cgroup::rearm_events(fd);
    }
    if matches!(st.phase, Phase::Reaping { .. }) && !st.contain.any_alive(proc.pid) {
        finish(proc, st, now);
    }
}

/// The call's memory cgroup ran out of memory: the kernel killed one of its processes;
/// SPEC's "memory over the limit → the call is killed" takes the rest along.
pub(crate) fn on_oom(proc: &Proc, st: &mut ProcState) {
    proc.shared.unwatch_oom(&mut st.contain); // once is enough
    if st.phase != Phase::Done {
        st.contain.oom_seen = true;
        st.contain.signal(proc.pid, libc::SIGKILL);
    }
}

/// A timer of this process fired.
pub(crate) fn on_timer(proc: &Proc, st: &mut ProcState, now: Instant) {
    if st.phase == Phase::Done {
        return;
    }
    if st.timeout_at.is_some_and(|at| at <= now) {
        // The caller's timeout (`Proc::arm_timeout`): killed as the caller would.
        st.timeout_at = None;
        if let Some(at) = proc.request_kill(st, Some(Cause::Timeout)) {
            proc.shared.add_timer(at, proc.token, false);
        }
    }
    if st.kill_at.is_some_and(|at| at <= now) {
        st.kill_at = None;
        st.contain.signal(proc.pid, libc::SIGKILL);
    }
    match st.contain.check_cpu(now) {
        CpuCheck::Exceeded => {
            // Over its CPU limit: the whole call dies at once (a grace would only burn more).
            st.contain.signal(proc.pid, libc::SIGKILL);
        }
        CpuCheck::Again(at) => proc.shared.add_timer(at, proc.token, false),
        CpuCheck::NotDue => {}
    }
    let due = st.deadline.is_some_and(|at| at <= now);
    match st.phase {
        Phase::Draining if due => begin_reap(proc, st, now),
        Phase::Reaping { sigkill_sent } => {
            // Count live members, not the group's existence: a killed orphan stays a
            // zombie until init reaps it, and some inits (containers) take their time.
            if !st.contain.any_alive(proc.pid) {
                finish(proc, st, now);
            } else if due && !sigkill_sent {
                st.contain.signal(proc.pid, libc::SIGKILL);
                st.phase = Phase::Reaping { sigkill_sent: true };
                st.deadline = Some(now + SIGKILL_SETTLE);
                proc.shared
                    .add_timer(now + reap_poll(st), proc.token, false);
            } else if due {
                // Unkillable (uninterruptible sleep): complete with what we have.
                finish(proc, st, now);
            } else {
                if sigkill_sent {
                    // What the SIGKILL missed: processes that members not killed yet forked
                    // after the pass listed them (outside the group, where no group signal
                    // reaches; or a process `cgroup.kill` missed). Counted and killed too.
                    count_and_signal(proc, st, libc::SIGKILL);
                }
                proc.shared
                    .add_timer(now + reap_poll(st), proc.token, false);
            }
        }
        _ => {}
    }
}

fn finish(proc: &Proc, st: &mut ProcState, now: Instant) {
    // Whatever already sits in the pipes was produced: keep it, then let go of the pipes.
    // (Usually both hung up and are closed by now: no buffer then, where a zeroed 64 KiB
    // one cost every call a calloc and a memset.)
    if st.stdout.fd.is_some() || st.stderr.fd.is_some() {
        let mut scratch = vec![0u8; 64 * 1024];
        drain_stream(proc, st, true, &mut scratch, Drain::Final);
        drain_stream(proc, st, false, &mut scratch, Drain::Final);
    }
    st.stdout.collector.finish();
    st.stderr.collector.finish();
    lock(&proc.shared.spill).keep_private();
    unwatch_exit(proc, st);
    st.contain.stamp();
    let leader = &mut st.leader;
    proc.shared
        .end_containment(proc.pid, &mut st.contain, |c| release_leader(c, leader));
    st.phase = Phase::Done;
    st.finished = Some(now);
    st.deadline = None;
    st.kill_at = None;
    // Out of the live set before anyone is woken: a woken waiter sees `running` without it.
    lock(&proc.shared.live).remove(&proc.token);
    st.timeout_at = None;
    for (notifier, token) in st.subscribers.drain(..) {
        notifier.push(token);
    }
    proc.done.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_saturate_instead_of_overflowing() {
        let now = Instant::now();
        assert!(after(now, Duration::MAX) > now + Duration::from_secs(3600 * 24 * 365));
        assert_eq!(
            after(now, Duration::from_millis(5)),
            now + Duration::from_millis(5)
        );
    }

    #[test]
    fn compaction_keeps_the_timers_of_live_processes() {
        let now = Instant::now();
        let mut t = Timers::default();
        t.extend((0..2000u64).map(|i| (now + Duration::from_secs(i), i)));
        assert!(t.crowded());
        t.compact(10, |token| token % 2 == 0);
        assert_eq!(t.heap.len(), 1000, "dead ones dropped once they are many");
        assert!(!t.crowded());
        t.compact(10, |_| false);
        assert_eq!(t.heap.len(), 1000, "few timers: left alone");
        t.extend((0..1000u64).map(|i| (now, i)));
        t.compact(600, |_| false);
        assert_eq!(
            t.heap.len(),
            2000,
            "not many more than live processes: left alone"
        );
    }

    #[test]
    fn timers_pop_in_deadline_order() {
        let now = Instant::now();
        let mut t = Timers::default();
        assert_eq!(t.timeout(now), None);
        t.extend([(now + Duration::from_millis(20), 2), (now, 1)]);
        assert_eq!(t.timeout(now), Some(Duration::ZERO));
        assert_eq!(t.pop_due(now), Some(1));
        assert_eq!(t.pop_due(now), None);
        assert_eq!(t.timeout(now), Some(Duration::from_millis(20)));
        assert_eq!(t.pop_due(now + Duration::from_millis(20)), Some(2));
    }
}
