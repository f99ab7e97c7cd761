//! One managed process group as its callers see it: kill, wait, subscribe, and what it
//! produced. The supervisor thread drives its state (see `lifecycle.rs`).

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::collector::{Collected, Collector, Delta};
use crate::contain::{CallContainment, CallLimits, Resources};
use crate::lifecycle::{self, after, Phase};
use crate::notifier::Notifier;
use crate::pipes::{OutStream, StdinFeed};
use crate::spawn::Spawned;
use crate::supervisor::Shared;
use crate::sys::{lock, poll_readable};
use crate::verdict::Verdict;

/// Per-process limits and input.
pub struct ProcConfig {
    pub stdout_cap: usize,
    pub stderr_cap: usize,
    pub spill_cap: u64,
    pub grace: Duration,
    pub stdin: Vec<u8>,
    /// The call's limits, and whether it gets a cgroup (where the host has them).
    pub limits: CallLimits,
    pub cgroup: bool,
    /// The caller drives the process from its spawn on (a foreground run waiting in the
    /// same native call): its pipes and pidfd get their routes but join the supervisor's
    /// epoll set only if it hands them over (see `supervisor/handover.rs`).
    pub defer_watch: bool,
}

/// How a process ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub duration: Duration,
    pub leftover_killed: u32,
    pub kill_requested: bool,
    pub user_cpu: Duration,
    pub system_cpu: Duration,
    pub max_rss_kib: i64,
    /// Somebody else reaped the leader (a stray `waitpid(-1)`): its status is lost, and
    /// `exit_code`/`signal` are None rather than a made-up 0.
    pub exit_status_unknown: bool,
}

/// Why a caller had the call killed (the result says `timed_out` or `aborted`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Timeout,
    Abort,
}

/// What became of the group leader.
#[derive(Debug, Clone, Copy)]
pub(crate) enum LeaderExit {
    /// Exited, status read with WNOWAIT: still an unreaped zombie holding its pgid.
    Zombie(libc::c_int),
    Status(libc::c_int, libc::rusage),
    /// Exited (its pidfd says so), but a tracer holds its zombie: only the tracer can wait
    /// for it until it lets go. The status is read at the reap, if it can be by then.
    Traced,
    /// ECHILD: reaped by someone else.
    Unknown,
}

/// Everything the supervisor and the callers share about one process, under its lock.
pub(crate) struct ProcState {
    pub phase: Phase,
    pub stdout: OutStream,
    pub stderr: OutStream,
    pub stdin: StdinFeed,
    /// The route of the leader's pidfd (`contain.leader`) while its exit is watched.
    pub pidfd_key: Option<u64>,
    pub leader: Option<LeaderExit>,
    pub kill_requested: bool,
    pub kill_at: Option<Instant>,
    pub deadline: Option<Instant>,
    pub leftover_killed: u32,
    pub started: Instant,
    pub finished: Option<Instant>,
    /// Told when the process is done: each notifier gets its token.
    pub subscribers: Vec<(Arc<Notifier>, u64)>,
    /// The caller's timeout, when the supervisor keeps it (`arm_timeout`).
    pub timeout_at: Option<Instant>,
    /// Why the call was killed, when its caller's timeout or abort did it: the first wins.
    pub cause: Option<Cause>,
    pub grace: Duration,
    pub contain: CallContainment,
    /// The call's limits, for its verdict (see `verdict.rs`).
    pub limits: CallLimits,
    /// A caller blocked in `wait` polls the pipes and pidfd itself (supervisor/handover.rs).
    pub caller_driven: bool,
    /// The output pipes and the pidfd are in the supervisor's epoll set. False before a
    /// deferred registration and while a caller drives them: closing one then needs no
    /// `EPOLL_CTL_DEL` (it would only fail with ENOENT).
    pub in_epoll: bool,
    /// A bulk producer: waiting callers leave the draining to the supervisor.
    pub bulk_output: bool,
}

/// One managed process group, shared by the supervisor and its callers.
pub struct Proc {
    pub token: u64,
    pub pid: libc::pid_t,
    pub(crate) shared: Arc<Shared>,
    pub(crate) state: Mutex<ProcState>,
    pub(crate) done: Condvar,
}

impl Proc {
    pub(crate) fn new(
        token: u64,
        shared: Arc<Shared>,
        child: Spawned,
        cfg: ProcConfig,
        mut contain: CallContainment,
        started: Instant,
    ) -> Self {
        contain.leader = Some(child.pidfd);
        contain.leader_pid = child.pid;
        Self {
            token,
            pid: child.pid,
            shared,
            state: Mutex::new(ProcState {
                phase: Phase::Running,
                stdout: OutStream::new(
                    child.pipes.stdout,
                    Collector::new(cfg.stdout_cap, cfg.spill_cap),
                ),
                stderr: OutStream::new(
                    child.pipes.stderr,
                    Collector::new(cfg.stderr_cap, cfg.spill_cap),
                ),
                stdin: StdinFeed::new(child.pipes.stdin, cfg.stdin),
                pidfd_key: None,
                leader: None,
                kill_requested: false,
                kill_at: None,
                deadline: None,
                leftover_killed: 0,
                started,
                finished: None,
                subscribers: Vec::new(),
                timeout_at: None,
                cause: None,
                grace: cfg.grace,
                contain,
                limits: cfg.limits,
                caller_driven: false,
                in_epoll: false,
                bulk_output: false,
            }),
            done: Condvar::new(),
        }
    }

    pub fn pgid(&self) -> libc::pid_t {
        self.pid
    }

    pub fn is_done(&self) -> bool {
        lock(&self.state).phase == Phase::Done
    }

    /// Requests termination: SIGTERM to every process of the call now, SIGKILL to all of
    /// them after the grace period.
    /// False when the process already finished or a kill is already under way.
    pub fn kill(&self) -> bool {
        self.kill_for(None)
    }

    /// `kill` for `cause` (None: none), which the call keeps unless another came first or it
    /// is done.
    pub fn kill_for(&self, cause: Option<Cause>) -> bool {
        if !self.shared.in_owner() {
            return false;
        }
        let mut st = lock(&self.state);
        let Some(at) = self.request_kill(&mut st, cause) else {
            return false;
        };
        drop(st);
        self.shared.add_timer(at, self.token, true);
        true
    }

    /// Why the call was killed by its caller's timeout or abort, if it was.
    pub fn cause(&self) -> Option<Cause> {
        lock(&self.state).cause
    }

    /// The kill under the process lock: keeps `cause` unless another came first, signals
    /// the call and returns when its SIGKILL is due (a timer the caller adds); None when done
    /// already (no cause kept then) or a kill is under way.
    pub(crate) fn request_kill(&self, st: &mut ProcState, cause: Option<Cause>) -> Option<Instant> {
        if st.phase == Phase::Done {
            return None;
        }
        if st.cause.is_none() {
            st.cause = cause;
        }
        if st.kill_requested {
            return None;
        }
        st.kill_requested = true;
        let escaped = st.contain.terminate(self.pid);
        st.leftover_killed = st
            .leftover_killed
            .saturating_add(u32::try_from(escaped).unwrap_or(u32::MAX));
        let at = after(Instant::now(), st.grace);
        st.kill_at = Some(at);
        Some(at)
    }

    /// Has the supervisor kill the call for `Cause::Timeout` once `timeout` has passed
    /// (a caller that does not wait in a thread of its own: an event loop).
    pub fn arm_timeout(&self, timeout: Duration) {
        let at = after(Instant::now(), timeout);
        {
            let mut st = lock(&self.state);
            if st.phase == Phase::Done {
                return;
            }
            st.timeout_at = Some(at);
        }
        self.shared.add_timer(at, self.token, true);
    }

    /// Waits until the process is done; false when `timeout` passed first.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        if !self.shared.in_owner() {
            return false; // nobody in this process will ever settle it
        }
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        self.settle_on_exit(timeout);
        let mut st = lock(&self.state);
        while st.phase != Phase::Done {
            match deadline {
                None => {
                    st = self
                        .done
                        .wait(st)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                }
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return false;
                    }
                    st = self
                        .done
                        .wait_timeout(st, deadline - now)
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                        .0;
                }
            }
        }
        true
    }

    /// While the leader runs, the caller drives the process itself (supervisor/handover.rs)
    /// and settles it here when it exits (see `lifecycle::settle_exited`). Where it cannot
    /// take the process over (stdin still being fed, another caller driving it), it waits
    /// on the leader's pidfd alone: one wake-up instead of the supervisor's then ours. The
    /// pidfd is duplicated so that the supervisor may close its own at any time without
    /// our poll ever watching a reused fd number.
    fn settle_on_exit(&self, timeout: Option<Duration>) {
        if timeout != Some(Duration::ZERO) && crate::supervisor::drive_until_exit(self, timeout) {
            return;
        }
        crate::supervisor::ensure_watched(self);
        let pidfd = {
            let st = lock(&self.state);
            if st.phase != Phase::Running || st.leader.is_some() {
                return;
            }
            match st.contain.leader.as_ref().map(|fd| fd.try_clone()) {
                Some(Ok(fd)) => fd,
                _ => return,
            }
        };
        if poll_readable(&pidfd, timeout) {
            lifecycle::settle_exited(self, &mut lock(&self.state));
        }
    }

    /// Queues this process's token on `notifier` when it finishes (at once if it has).
    pub fn subscribe(&self, notifier: Arc<Notifier>) {
        self.subscribe_as(notifier, self.token);
    }

    /// Queues `token` on `notifier` when this process finishes (at once if it has).
    pub fn subscribe_as(&self, notifier: Arc<Notifier>, token: u64) {
        let mut st = lock(&self.state);
        if st.phase == Phase::Done {
            drop(st);
            notifier.push(token);
        } else {
            st.subscribers.push((notifier, token));
        }
    }

    pub fn outcome(&self) -> Option<Outcome> {
        let st = lock(&self.state);
        if st.phase != Phase::Done {
            return None;
        }
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.max(0) as u64)
        };
        let (exit_code, signal, usage) = match st.leader {
            Some(LeaderExit::Status(status, usage)) if libc::WIFSIGNALED(status) => {
                (None, Some(libc::WTERMSIG(status)), Some(usage))
            }
            Some(LeaderExit::Status(status, usage)) => {
                (Some(libc::WEXITSTATUS(status)), None, Some(usage))
            }
            // Not reached once Done (finish reaps the zombie); its status is still exact.
            Some(LeaderExit::Zombie(status)) if libc::WIFSIGNALED(status) => {
                (None, Some(libc::WTERMSIG(status)), None)
            }
            Some(LeaderExit::Zombie(status)) => (Some(libc::WEXITSTATUS(status)), None, None),
            Some(LeaderExit::Traced | LeaderExit::Unknown) | None => (None, None, None),
        };
        let (user_cpu, system_cpu, max_rss_kib) = usage
            .map_or((Duration::ZERO, Duration::ZERO, 0), |r| {
                (tv(r.ru_utime), tv(r.ru_stime), r.ru_maxrss)
            });
        Some(Outcome {
            exit_code,
            signal,
            duration: st.finished.unwrap_or(st.started) - st.started,
            leftover_killed: st.leftover_killed,
            kill_requested: st.kill_requested,
            user_cpu,
            system_cpu,
            max_rss_kib,
            exit_status_unknown: !matches!(
                st.leader,
                Some(LeaderExit::Status(..) | LeaderExit::Zombie(_))
            ),
        })
    }

    /// Containment facts, once done.
    pub fn resources(&self) -> Option<Resources> {
        let st = lock(&self.state);
        (st.phase == Phase::Done).then(|| st.contain.resources())
    }

    /// The resource verdict of the settled call that ended with `outcome`.
    pub fn verdict(&self, outcome: &Outcome) -> (Resources, Verdict) {
        let st = lock(&self.state);
        let resources = st.contain.resources();
        // Only a CPU or file-size limit reads the stderr tail (bash's message about a job).
        let tail = if st.limits.cpu_ms.is_some() || st.limits.file_size_bytes.is_some() {
            String::from_utf8_lossy(&st.stderr.collector.tail_bytes()).into_owned()
        } else {
            String::new()
        };
        let verdict = crate::verdict::verdict(&st.limits, &resources, outcome, &tail);
        (resources, verdict)
    }

    pub fn collected(&self) -> (Collected, Collected) {
        let st = lock(&self.state);
        (
            st.stdout.collector.collected(),
            st.stderr.collector.collected(),
        )
    }

    /// Consumes unread output of both streams.
    pub fn read(&self) -> (Delta, Delta) {
        let mut st = lock(&self.state);
        let final_read = st.phase == Phase::Done;
        let out = st.stdout.collector.read(final_read);
        let err = st.stderr.collector.read(final_read);
        (out, err)
    }
}
