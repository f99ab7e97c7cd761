//! Foreground runs for event loops: spawned off the loop thread and without the GIL, then
//! waited for by the supervisor.
//!
//! Under vfork semantics the spawning thread sleeps until its child has exec'd; with many
//! commands in flight the child first waits for a CPU, and a loop thread spawning itself
//! would stall every other run with it. An asyncio `run` therefore prepares its call on the
//! loop thread and queues it here: one of three native spawner threads spawns it, the
//! supervisor drives it (and kills it when the caller's timeout passes), and the caller's
//! token reaches the loop's notifier (the eventfd the loop watches) once, when the run is
//! over: its process done, or its spawn failed. Nothing of Python runs on these threads: no
//! GIL to win back, no futures to chain, no self-pipe write per spawn (a Python thread pool
//! cost ~120 us of CPU per spawn here), and the loop is woken once per run.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::errors::CoreError;
use crate::notifier::Notifier;
use crate::process::{Cause, Proc, ProcConfig};
use crate::spawn::SpawnPlan;
use crate::supervisor::Service;
use crate::sys::lock;

/// Spawner threads per service. A spawner spends most of its time in the vfork wait (87 %
/// of it with 64 in flight, 2 threads): its child waits ~1.7 ms for a CPU before it execs.
/// So their number sets how far spawning runs ahead of the commands, and with two, a CPU
/// sat idle 3.2 % of the time while a child queued on the other; three cut that to 2.4 %
/// (+1.4 % throughput side by side). Four would make five threads with the supervisor,
/// over SPEC's four extra threads.
pub const SPAWNERS: usize = 3;

/// One queued run.
pub struct SpawnJob {
    pub plan: SpawnPlan,
    pub cfg: ProcConfig,
    /// Kept open until the spawn is done (the plan's script fd is this one).
    pub script: Option<OwnedFd>,
    pub pending: Arc<PendingRun>,
    pub notifier: Arc<Notifier>,
    pub token: u64,
    /// The caller's timeout, kept by the supervisor from the spawn on.
    pub timeout: Option<Duration>,
    /// Its number among queued spawns (set by `submit`, see `ignored_signals_for`).
    pub seq: u64,
}

#[derive(Default)]
enum State {
    #[default]
    Waiting,
    /// The caller had the run killed (for a cause, or cancelled: None) while its spawn was
    /// queued or under way: what lands is killed.
    Killed(Option<Cause>),
    Landed(Arc<Proc>),
    /// The spawn failed; its error is handed out once.
    Failed(Option<CoreError>),
}

#[derive(Default)]
struct Inner {
    state: State,
    /// More notifiers to tell when the run is over (an abandoning caller's dispatcher).
    also: Vec<(Arc<Notifier>, u64)>,
}

/// A queued run: its process once it landed, or its spawn's error.
#[derive(Default)]
pub struct PendingRun {
    inner: Mutex<Inner>,
}

impl PendingRun {
    /// Whether the run is over: its process done, or its spawn failed.
    pub fn is_done(&self) -> bool {
        match &lock(&self.inner).state {
            State::Landed(proc) => proc.is_done(),
            State::Failed(_) => true,
            State::Waiting | State::Killed(_) => false,
        }
    }

    /// The process, once it landed.
    pub fn landed(&self) -> Option<Arc<Proc>> {
        match &lock(&self.inner).state {
            State::Landed(proc) => Some(Arc::clone(proc)),
            _ => None,
        }
    }

    /// The spawn's error, once; None while it is under way, when it landed, or after.
    pub fn take_error(&self) -> Option<CoreError> {
        match &mut lock(&self.inner).state {
            State::Failed(err) => err.take(),
            _ => None,
        }
    }

    /// Kills the run (`cause`: what its result says, first cause winning): now if it
    /// landed, else as it lands. False when it is over, or a kill was already requested.
    pub fn kill(&self, cause: Option<Cause>) -> bool {
        let proc = {
            let mut inner = lock(&self.inner);
            match &inner.state {
                State::Landed(proc) => Arc::clone(proc),
                State::Waiting => {
                    inner.state = State::Killed(cause);
                    return true;
                }
                State::Killed(_) | State::Failed(_) => return false,
            }
        };
        proc.kill_for(cause)
    }

    /// Also pushes `token` to `notifier` when the run is over (at once if it is).
    pub fn subscribe(&self, notifier: Arc<Notifier>, token: u64) {
        let mut inner = lock(&self.inner);
        match &inner.state {
            State::Landed(proc) => {
                let proc = Arc::clone(proc);
                drop(inner);
                proc.subscribe_as(notifier, token);
            }
            State::Failed(_) => {
                drop(inner);
                notifier.push(token);
            }
            State::Waiting | State::Killed(_) => inner.also.push((notifier, token)),
        }
    }

    /// The spawn is over: arms the timeout, kills what a caller gave up meanwhile and hands
    /// the subscribers over to the process; the process, when it landed.
    fn complete(
        &self,
        result: Result<Arc<Proc>, CoreError>,
        timeout: Option<Duration>,
    ) -> Option<Arc<Proc>> {
        let mut inner = lock(&self.inner);
        let killed = match inner.state {
            State::Killed(cause) => Some(cause),
            _ => None,
        };
        let also = std::mem::take(&mut inner.also);
        let landed = match result {
            Ok(proc) => {
                if let Some(timeout) = timeout {
                    proc.arm_timeout(timeout);
                }
                inner.state = State::Landed(Arc::clone(&proc));
                Some(proc)
            }
            Err(err) => {
                inner.state = State::Failed(Some(err));
                None
            }
        };
        drop(inner);
        match &landed {
            Some(proc) => {
                if let Some(cause) = killed {
                    proc.kill_for(cause);
                }
                for (notifier, token) in also {
                    proc.subscribe_as(notifier, token);
                }
            }
            None => {
                for (notifier, token) in also {
                    notifier.push(token);
                }
            }
        }
        landed
    }
}

struct Threads {
    tx: Sender<SpawnJob>,
    handles: Vec<JoinHandle<()>>,
}

#[derive(Default)]
enum Slot {
    #[default]
    Idle,
    Running(Threads),
    Stopped,
}

/// The spawner threads of one service, started on the first queued spawn.
pub struct SpawnQueue {
    /// `Idle` before the first queued spawn; `Stopped` once `stop` ran (later spawns run on
    /// the caller's thread, where a disposed service refuses them).
    threads: Mutex<Slot>,
    /// Spawns queued or under way (not yet a process the service counts, nor failed).
    queued: Arc<AtomicUsize>,
    /// The process that made the queue: a forked copy of the harness has none of its
    /// threads and takes none of its locks (one of them may have been held at the fork).
    owner: u32,
}

impl Default for SpawnQueue {
    fn default() -> Self {
        Self {
            threads: Mutex::default(),
            queued: Arc::default(),
            owner: std::process::id(),
        }
    }
}

impl SpawnQueue {
    /// Spawns submitted and not yet over.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Queues `job` for `service`'s spawner threads (started now if need be). With nothing
    /// of the service running or queued, it spawns here instead: there is nothing to stall,
    /// and the two thread hand-offs would cost a lone run about as much as its spawn. A job
    /// no thread can take (none could start, or the queue was stopped) also spawns here.
    pub fn submit(&self, service: &Arc<Service>, mut job: SpawnJob) {
        job.seq = crate::spawn::number_queued_spawn();
        let first = self.queued.fetch_add(1, Ordering::SeqCst) == 0;
        // A forked copy of the harness: the service refuses it, and says so through the
        // job, before any lock is taken (a thread of the parent may have held one).
        if !service.in_owner() || (first && service.running() == 0) {
            run(Some(Arc::clone(service)), job, &self.queued);
            return;
        }
        let mut slot = lock(&self.threads);
        if matches!(*slot, Slot::Idle) {
            if let Ok(threads) = start(Arc::downgrade(service), Arc::clone(&self.queued)) {
                *slot = Slot::Running(threads);
            }
        }
        let job = match &*slot {
            Slot::Running(threads) => match threads.tx.send(job) {
                Ok(()) => return,
                Err(failed) => failed.0,
            },
            Slot::Idle | Slot::Stopped => job,
        };
        drop(slot);
        // No spawner thread (none could start, or the queue was stopped): the spawn runs
        // here.
        run(Some(Arc::clone(service)), job, &self.queued);
    }

    /// Ends the spawner threads once the queued spawns are done (never from one of them);
    /// spawns submitted later run on their caller's thread.
    pub fn stop(&self) {
        if self.owner != std::process::id() {
            return;
        }
        let Slot::Running(threads) = std::mem::replace(&mut *lock(&self.threads), Slot::Stopped)
        else {
            return;
        };
        drop(threads.tx);
        for handle in threads.handles {
            let _ = handle.join();
        }
    }
}

fn start(service: Weak<Service>, queued: Arc<AtomicUsize>) -> std::io::Result<Threads> {
    let (tx, rx) = channel::<SpawnJob>();
    let rx = Arc::new(Mutex::new(rx));
    let mut handles = Vec::with_capacity(SPAWNERS);
    for _ in 0..SPAWNERS {
        let (rx, service, queued) = (Arc::clone(&rx), service.clone(), Arc::clone(&queued));
        let spawned = std::thread::Builder::new()
            .name("shellseam-spawn".into())
            .spawn(move || serve(&rx, &service, &queued));
        match spawned {
            Ok(handle) => handles.push(handle),
            Err(err) if handles.is_empty() => return Err(err),
            Err(_) => break,
        }
    }
    Ok(Threads { tx, handles })
}

fn serve(rx: &Mutex<Receiver<SpawnJob>>, service: &Weak<Service>, queued: &AtomicUsize) {
    // Signals belong to the harness's own threads (a spawn blocks them all anyway while
    // its child shares our memory, and the child clears its mask before exec).
    crate::sys::block_signals_in_this_thread();
    loop {
        let job = lock(rx).recv();
        let Ok(job) = job else {
            return; // the queue was stopped or dropped
        };
        run(service.upgrade(), job, queued);
    }
}

/// Spawns `job`, counts it out of `queued` (its process is the service's from here on, in
/// `running`), then settles its pending run: out of the count before anyone can hear the
/// run is over, so a caller woken by its token never sees it still queued.
fn run(service: Option<Arc<Service>>, mut job: SpawnJob, queued: &AtomicUsize) {
    let result = match &service {
        // A panic must not leave the caller waiting for a token that never comes.
        Some(service) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if job.plan.ignored_signals.is_none() {
                job.plan.ignored_signals = Some(crate::spawn::ignored_signals_for(job.seq));
            }
            service.spawn(&mut job.plan, job.cfg)
        }))
        .unwrap_or_else(|_| Err(CoreError::Io(std::io::Error::other("the spawn panicked")))),
        None => Err(CoreError::Disposed),
    };
    drop(job.script);
    queued.fetch_sub(1, Ordering::SeqCst);
    match job.pending.complete(result, job.timeout) {
        // The token comes when the process is done (at once if it is already).
        Some(proc) => proc.subscribe_as(job.notifier, job.token),
        None => job.notifier.push(job.token),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::time::Instant;

    fn job(command: &str, notifier: &Arc<Notifier>, token: u64) -> SpawnJob {
        let c = |s: &str| CString::new(s).unwrap();
        SpawnJob {
            plan: SpawnPlan::new(
                c("/bin/sh"),
                vec![c("sh"), c("-c"), c(command)],
                Arc::new(vec![c("PATH=/usr/bin:/bin")]),
                c("/"),
            ),
            cfg: ProcConfig {
                stdout_cap: 1 << 16,
                stderr_cap: 1 << 16,
                spill_cap: 1 << 20,
                grace: Duration::from_millis(200),
                stdin: Vec::new(),
                limits: Default::default(),
                cgroup: false,
                defer_watch: false,
            },
            script: None,
            pending: Arc::new(PendingRun::default()),
            notifier: Arc::clone(notifier),
            token,
            timeout: None,
            seq: 0,
        }
    }

    fn service() -> Arc<Service> {
        Arc::new(Service::new(std::env::temp_dir(), u64::MAX).expect("service"))
    }

    fn notifier() -> Arc<Notifier> {
        Arc::new(Notifier::new().expect("notifier"))
    }

    fn wait_token(notifier: &Notifier, token: u64) {
        for _ in 0..100 {
            if notifier
                .wait(Some(Duration::from_millis(100)))
                .contains(&token)
            {
                return;
            }
        }
        panic!("token {token} never came");
    }

    #[test]
    fn queued_runs_push_their_tokens_once_done() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let jobs: Vec<_> = (0..6)
            .map(|i| {
                let j = job("sleep 0.1; echo hi", &notifier, 1000 + i);
                let pending = Arc::clone(&j.pending);
                queue.submit(&service, j);
                pending
            })
            .collect();
        assert!(
            matches!(*lock(&queue.threads), Slot::Running(_)),
            "all but the first were queued"
        );
        let mut seen = std::collections::HashSet::new();
        let started = Instant::now();
        while seen.len() < jobs.len() && started.elapsed() < Duration::from_secs(10) {
            seen.extend(notifier.wait(Some(Duration::from_millis(100))));
        }
        assert_eq!(
            seen,
            (1000..1006).collect(),
            "each token, once its run is over"
        );
        for pending in &jobs {
            assert!(pending.is_done());
            let proc = pending.landed().expect("landed");
            assert_eq!(proc.collected().0.text, "hi\n");
            assert_eq!(proc.cause(), None);
        }
        assert_eq!(queue.queued(), 0);
        queue.stop();
        service.dispose(false);
    }

    #[test]
    fn a_forked_copy_refuses_a_queued_run_without_taking_a_lock() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        // Something is queued, so a run would go to the spawner threads; and a thread of
        // the harness holds the queue's lock when it forks.
        queue.queued.fetch_add(1, Ordering::SeqCst);
        let held = lock(&queue.threads);
        let refused = crate::sys::passes_in_a_fork(Duration::from_secs(10), || {
            let j = job("true", &notifier, 9);
            let pending = Arc::clone(&j.pending);
            queue.submit(&service, j);
            // Disposing of the copy's service stops the queue: no lock either.
            queue.stop();
            matches!(pending.take_error(), Some(CoreError::ForkedChild))
        });
        drop(held);
        queue.queued.fetch_sub(1, Ordering::SeqCst);
        queue.stop();
        service.dispose(false);
        assert!(
            refused,
            "the forked copy waited for a lock held at the fork"
        );
    }

    #[test]
    fn a_lone_run_spawns_on_the_callers_thread() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let j = job("echo lone", &notifier, 3);
        let pending = Arc::clone(&j.pending);
        queue.submit(&service, j);
        assert!(pending.landed().is_some(), "spawned before submit returned");
        assert!(
            matches!(*lock(&queue.threads), Slot::Idle),
            "no thread started"
        );
        wait_token(&notifier, 3);
        service.dispose(false);
    }

    #[test]
    fn a_run_killed_before_it_lands_is_killed_as_it_lands_and_keeps_the_cause() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let j = job("sleep 30", &notifier, 7);
        let pending = Arc::clone(&j.pending);
        assert!(pending.kill(Some(Cause::Abort)), "nothing landed yet");
        assert!(!pending.kill(None), "once");
        let started = Instant::now();
        queue.submit(&service, j);
        wait_token(&notifier, 7);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "killed, not left for 30 s"
        );
        let proc = pending.landed().expect("landed");
        assert!(proc.is_done());
        assert_eq!(proc.cause(), Some(Cause::Abort));
        assert!(!pending.kill(Some(Cause::Timeout)), "over");
        assert_eq!(proc.cause(), Some(Cause::Abort), "the first cause stays");
        queue.stop();
        service.dispose(false);
    }

    #[test]
    fn the_supervisor_kills_a_run_whose_timeout_passed() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let mut j = job("sleep 30", &notifier, 8);
        j.timeout = Some(Duration::from_millis(150));
        let pending = Arc::clone(&j.pending);
        let started = Instant::now();
        queue.submit(&service, j);
        wait_token(&notifier, 8);
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(150),
            "not before the timeout: {took:?}"
        );
        assert!(
            took < Duration::from_secs(10),
            "killed, not left for 30 s: {took:?}"
        );
        let proc = pending.landed().expect("landed");
        assert_eq!(proc.cause(), Some(Cause::Timeout));
        let outcome = proc.outcome().expect("done");
        assert_eq!(outcome.signal, Some(libc::SIGTERM));
        assert!(outcome.kill_requested);
        queue.stop();
        service.dispose(false);
    }

    #[test]
    fn a_run_that_ends_first_keeps_no_cause() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let mut j = job("true", &notifier, 9);
        j.timeout = Some(Duration::from_millis(50));
        let pending = Arc::clone(&j.pending);
        queue.submit(&service, j);
        wait_token(&notifier, 9);
        std::thread::sleep(Duration::from_millis(100)); // the timer fires on a done process
        let proc = pending.landed().expect("landed");
        assert_eq!(proc.cause(), None);
        assert_eq!(proc.outcome().expect("done").exit_code, Some(0));
        service.dispose(false);
    }

    #[test]
    fn a_stopped_queue_starts_no_threads_and_subscribers_hear_the_end() {
        let service = service();
        let queue = SpawnQueue::default();
        queue.stop();
        service.dispose(false);
        let (notifier, other) = (notifier(), notifier());
        let j = job("true", &notifier, 11);
        let pending = Arc::clone(&j.pending);
        pending.subscribe(Arc::clone(&other), 12);
        queue.submit(&service, j); // runs here: no thread
        assert!(matches!(*lock(&queue.threads), Slot::Stopped));
        assert_eq!(queue.queued(), 0);
        wait_token(&notifier, 11);
        wait_token(&other, 12);
        pending.subscribe(Arc::clone(&other), 13); // over: told at once
        wait_token(&other, 13);
        assert!(pending.is_done());
        assert!(matches!(pending.take_error(), Some(CoreError::Disposed)));
        assert!(pending.take_error().is_none(), "handed out once");
    }

    #[test]
    fn a_disposed_service_fails_queued_runs() {
        let service = service();
        let busy = job("sleep 30", &notifier(), 1);
        let busy_pending = Arc::clone(&busy.pending);
        let queue = SpawnQueue::default();
        queue.submit(&service, busy); // inline: nothing ran yet
        service.dispose(false);
        assert!(busy_pending.is_done(), "dispose killed and reaped it");
        let notifier = notifier();
        let j = job("true", &notifier, 9);
        let pending = Arc::clone(&j.pending);
        queue.submit(&service, j);
        wait_token(&notifier, 9);
        assert!(matches!(pending.take_error(), Some(CoreError::Disposed)));
        queue.stop();
    }
}
