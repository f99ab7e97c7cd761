//! The confined spawners: one thread per service and seccomp policy that spawns the
//! confined children, carrying on itself what those children would otherwise set up one by
//! one and inherit from it instead.
//!
//! - The seccomp filter (see `seccomp.rs`): the kernel copies, checks and JIT-compiles a
//!   filter at every install, ~125 us for the whole filter here. The thread installs the
//!   whole filter with `clone3` allowed only under a key drawn for it, which it passes to
//!   its own `clone3` calls; its children inherit that filter and install none. (Without a
//!   key, the thread carries the base layer and each child adds the four-instruction
//!   `clone3` layer, ~35 us.) The thread sets `no_new_privs` first (filters need it, or
//!   CAP_SYS_ADMIN); it never execs, so nothing else changes for it.
//! - For a harness holding `CAP_SETPCAP`: an empty bounding set and locked securebits,
//!   per-thread credentials a child inherits, where a child clearing its bounding set makes
//!   41 `PR_CAPBSET_DROP` calls (~70 us of credential commits).
//!
//! The child still empties its effective, permitted, inheritable and ambient sets and
//! enforces Landlock itself. The thread never runs Python and never
//! execs: only its children see its credentials and filter, and every syscall it makes
//! (pipes, fcntl, mmap, clone3, futex) is one the base layer allows. Handing a spawn to it
//! and back costs two thread wake-ups, a fraction of what it saves.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags};

use crate::confine::LOCKED_SECUREBITS;
use crate::errors::{SpawnError, SpawnStage};
use crate::seccomp::{self, Clone3Key, FilterPolicy};
use crate::spawn::{
    make_pipes, spawn_with, ChildEnds, InheritedFilter, ParentPipes, SpawnPlan, Spawned,
};
use crate::sys::lock;
use crate::sys::poll_timeout;

/// What the thread answers: the child's pid and pidfd.
type Answer = Result<(libc::pid_t, OwnedFd), SpawnError>;

/// How long a confined foreground spawn waits on its pipes before it takes the thread's
/// answer (see `ConfinedSpawner::spawn`): longer than a short command lives, short enough
/// that a silent command whose leader exits while a background child holds the pipes is
/// seen to have exited without noticeable delay.
const FOREGROUND_SETTLE: Duration = Duration::from_millis(5);

/// Sleeps until the child's stdout or stderr is readable or hung up, or `at_most` passed.
fn wait_for_output(pipes: &ParentPipes, at_most: Duration) {
    let interest = PollFlags::POLLIN;
    let mut fds = [
        PollFd::new(pipes.stdout.as_fd(), interest),
        PollFd::new(pipes.stderr.as_fd(), interest),
    ];
    // EINTR or an error: the caller goes on to the answer, which is all that is lost.
    let _ = nix::poll::poll(&mut fds, poll_timeout(Some(at_most)));
}

/// One caller's answer: filled by the thread, waited for by the caller.
#[derive(Default)]
struct Reply {
    result: Mutex<Option<Answer>>,
    filled: Condvar,
}

/// A spawn handed to the thread; `wait` for its answer.
struct Pending {
    reply: Arc<Reply>,
}

impl Pending {
    /// The child's pid and pidfd, once the thread has them (the child exec'd or failed).
    fn wait(self) -> Answer {
        let mut result = lock(&self.reply.result);
        loop {
            if let Some(done) = result.take() {
                return done;
            }
            result = self
                .reply
                .filled
                .wait(result)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }
}

/// The job queue; `open == false` once the spawner is stopped.
struct Queue {
    jobs: VecDeque<(SpawnPlan, ChildEnds, Arc<Reply>)>,
    open: bool,
}

/// The queue and the condition its thread sleeps on; both sides sleep on a futex at once
/// (a channel that spins before parking burns CPU the child itself needs).
struct Shared {
    queue: Mutex<Queue>,
    queued: Condvar,
}

/// The thread and its job queue.
pub struct ConfinedSpawner {
    shared: Arc<Shared>,
    /// The thread cleared its bounding set (the harness holds `CAP_SETPCAP`).
    bounding_set_cleared: bool,
    /// The filter the thread carries, which its children inherit.
    inherited: InheritedFilter,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Clears the calling thread's bounding set (capabilities `0..=last_cap`) and locks its
/// securebits; false if the kernel refused any step.
fn drop_for_children(last_cap: i32) -> bool {
    for cap in 0..=last_cap {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return false;
        }
    }
    // SAFETY: as above.
    unsafe { libc::prctl(libc::PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0) == 0 }
}

/// Sets `no_new_privs` on the calling thread and installs `policy`'s filter on it, keyed
/// when a key could be drawn, else its base layer; what the thread's children inherit, or
/// None if the kernel refused a step.
fn carry_filter(policy: FilterPolicy) -> Option<InheritedFilter> {
    let (filter, inherited) = match Clone3Key::generate() {
        Some(key) => (
            seccomp::build_keyed(policy, key),
            InheritedFilter::Keyed(key),
        ),
        None => (seccomp::build_base(policy), InheritedFilter::Base),
    };
    let prog = seccomp::prog(&filter);
    // SAFETY: prctl with integer arguments; seccomp(SECCOMP_SET_MODE_FILTER, 0, prog) reads
    // the program, which `filter` keeps alive for the call (the kernel copies it).
    let installed = unsafe {
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
            && libc::syscall(
                libc::SYS_seccomp,
                1u32,
                0u32,
                &prog as *const libc::sock_fprog,
            ) == 0
    };
    installed.then_some(inherited)
}

/// The thread's loop: one spawn at a time until the queue is closed and empty.
fn serve(shared: &Shared) {
    loop {
        let (plan, child_ends, reply) = {
            let mut queue = lock(&shared.queue);
            loop {
                if let Some(job) = queue.jobs.pop_front() {
                    break job;
                }
                if !queue.open {
                    return;
                }
                queue = shared
                    .queued
                    .wait(queue)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        // A panic must not leave the caller waiting for an answer that never comes.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            spawn_with(&plan, child_ends)
        }))
        .unwrap_or_else(|_| Err(SpawnError::new(SpawnStage::Clone, libc::EIO)));
        *lock(&reply.result) = Some(result);
        reply.filled.notify_one();
    }
}

impl ConfinedSpawner {
    /// Starts the thread for `policy` (`last_cap`: the harness holds `CAP_SETPCAP`, so the
    /// thread clears its bounding set too); None when it could not be started or the kernel
    /// refused a step (the caller's children then do everything themselves).
    pub fn start(policy: FilterPolicy, last_cap: Option<i32>) -> Option<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                jobs: VecDeque::new(),
                open: true,
            }),
            queued: Condvar::new(),
        });
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let theirs = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("shellseam-spawn".into())
            .spawn(move || {
                // Every signal blocked, as on the supervisor thread: no handler of the
                // harness may run under this thread's filter and credentials.
                // SAFETY: sigset_t is plain data set up by sigfillset; the mask is ours.
                unsafe {
                    let mut all: libc::sigset_t = std::mem::zeroed();
                    libc::sigfillset(&mut all);
                    libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
                }
                // Capabilities first: the filter's no_new_privs does not stop the drops,
                // but nothing after the filter should depend on what it allows.
                let carried = if last_cap.is_none_or(drop_for_children) {
                    carry_filter(policy)
                } else {
                    None
                };
                let _ = ready_tx.send(carried);
                if carried.is_some() {
                    serve(&theirs);
                }
            })
            .ok()?;
        let Ok(Some(inherited)) = ready.recv() else {
            let _ = thread.join();
            return None;
        };
        Some(Self {
            shared,
            bounding_set_cleared: last_cap.is_some(),
            inherited,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Spawns `plan` on the thread (its children inherit its filter and, for a privileged
    /// harness, the dropped bounding set and locked securebits) and waits.
    ///
    /// The signals the harness ignores (`SpawnPlan::ignored_signals`) are read here, on the
    /// requesting thread: on the spawner each of those ~64 syscalls would run through its
    /// filter.
    ///
    /// `foreground`: the caller drives the process once spawned and has nothing to write to
    /// its stdin. Stdin is then closed at once (the command reads EOF, as it would once an
    /// empty feed was done), and the caller waits on its own ends of the pipes first, up to
    /// `FOREGROUND_SETTLE`, taking the answer only then: a short command has exited by that
    /// time, so the thread's wake-up for its answer (a futex wake of a thread whose CPU the
    /// new child now occupies: ~70 us median here) is not on the path; the hang-up of the
    /// pipes wakes the caller once, as the exit of a local command does. Output wakes it at
    /// once, and so does a failed spawn (the thread closes the child's ends).
    pub fn spawn(&self, mut plan: SpawnPlan, foreground: bool) -> Result<Spawned, SpawnError> {
        plan.ignored_signals = plan.cgroup.is_some().then(crate::spawn::ignored_signals);
        let (child_ends, mut pipes) = make_pipes()?;
        if foreground {
            pipes.stdin = None;
        }
        let pending = self.submit(plan, child_ends)?;
        if foreground {
            wait_for_output(&pipes, FOREGROUND_SETTLE);
        }
        let (pid, pidfd) = pending.wait()?;
        Ok(Spawned { pid, pidfd, pipes })
    }

    /// Hands `plan`, with the child's ends of its pipes, to the thread without waiting.
    fn submit(&self, mut plan: SpawnPlan, child_ends: ChildEnds) -> Result<Pending, SpawnError> {
        plan.inherited_filter = self.inherited;
        plan.bounding_set_cleared = self.bounding_set_cleared;
        let reply = Arc::new(Reply::default());
        {
            let mut queue = lock(&self.shared.queue);
            if !queue.open {
                return Err(SpawnError::new(SpawnStage::Clone, libc::ESRCH));
            }
            queue.jobs.push_back((plan, child_ends, Arc::clone(&reply)));
        }
        self.shared.queued.notify_one();
        Ok(Pending { reply })
    }

    /// Ends the thread (after the spawns already queued).
    pub fn stop(&self) {
        self.close();
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }

    fn close(&self) {
        lock(&self.shared.queue).open = false;
        self.shared.queued.notify_one();
    }
}

impl Drop for ConfinedSpawner {
    /// A spawner nobody stopped (one started as its service was being disposed) still ends
    /// its thread: the thread leaves once the queue is closed and empty.
    fn drop(&mut self) {
        self.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    /// One line of a status file (`/proc/<pid>/status`), by its key.
    fn status_line(path: &str, key: &str) -> String {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn children_of_the_spawner_inherit_its_filter_and_bounding_set() {
        let facts = crate::confine::capability_facts();
        let last_cap = facts.can_setpcap.then_some(facts.last_cap);
        let policy = FilterPolicy {
            read_only: true,
            deny_sockets: true,
        };
        let Some(spawner) = ConfinedSpawner::start(policy, last_cap) else {
            panic!("the spawner starts (no_new_privs and a filter need no privilege)");
        };
        let c = |s: &str| CString::new(s).unwrap();
        let plan = SpawnPlan::new(
            c("/bin/sleep"),
            vec![c("sleep"), c("5")],
            std::sync::Arc::new(vec![]),
            c("/"),
        );
        let mine = "/proc/thread-self/status";
        let (my_filters, my_nnp, my_bnd) = (
            status_line(mine, "Seccomp_filters:"),
            status_line(mine, "NoNewPrivs:"),
            status_line(mine, "CapBnd:"),
        );
        let child = spawner.spawn(plan, false).expect("spawn");
        let status = format!("/proc/{}/status", child.pid);
        let (bnd, filters, nnp) = (
            status_line(&status, "CapBnd:"),
            status_line(&status, "Seccomp_filters:"),
            status_line(&status, "NoNewPrivs:"),
        );
        // SAFETY: kills and reaps our own child.
        unsafe {
            libc::kill(child.pid, libc::SIGKILL);
        }
        crate::sys::reap_blocking(child.pid);
        spawner.stop();
        // The base layer, inherited: one filter more than this thread (a host may have
        // its own, e.g. a container runtime's).
        let count = |line: &str| {
            line.rsplit('\t')
                .next()
                .and_then(|n| n.trim().parse::<u32>().ok())
                .unwrap_or(0)
        };
        assert_eq!(count(&filters), count(&my_filters) + 1, "{filters}");
        assert_eq!(nnp, "NoNewPrivs:\t1");
        if last_cap.is_some() {
            assert_eq!(bnd, "CapBnd:\t0000000000000000");
        }
        // This thread (the caller's) keeps its own.
        assert_eq!(status_line(mine, "Seccomp_filters:"), my_filters);
        assert_eq!(status_line(mine, "NoNewPrivs:"), my_nnp);
        assert_eq!(status_line(mine, "CapBnd:"), my_bnd);
    }
}
