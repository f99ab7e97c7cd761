//! Spawns for event loops, off the loop thread and without the GIL.
//!
//! Under vfork semantics the spawning thread sleeps until its child has exec'd; with many
//! commands in flight the child first waits for a CPU, and a loop thread spawning itself
//! would stall every other run with it. An asyncio `run` therefore prepares its spawn on the
//! loop thread and queues it here: one of two native spawner threads spawns it and pushes
//! the caller's token to the loop's notifier (the eventfd the loop already watches for
//! exits). Nothing of Python runs on these threads: no GIL to win back, no futures to chain,
//! no self-pipe write per spawn (a Python thread pool cost ~120 us of CPU per spawn here).

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;

use crate::errors::CoreError;
use crate::notifier::Notifier;
use crate::process::{Proc, ProcConfig};
use crate::spawn::SpawnPlan;
use crate::supervisor::Service;
use crate::sys::lock;

/// Spawner threads per service (one more measured +3 % in flight, as a Python pool).
pub const SPAWNERS: usize = 2;

/// One queued spawn.
pub struct SpawnJob {
    pub plan: SpawnPlan,
    pub cfg: ProcConfig,
    /// Kept open until the spawn is done (the plan's script fd is this one).
    pub script: Option<OwnedFd>,
    pub pending: Arc<PendingSpawn>,
    pub notifier: Arc<Notifier>,
    pub token: u64,
}

#[derive(Default)]
enum State {
    #[default]
    Waiting,
    /// The caller gave up while the spawn was queued or under way: what lands is killed.
    Abandoned,
    Ready(Result<Arc<Proc>, CoreError>),
    Taken,
}

/// The outcome of a queued spawn, once its token has been pushed.
#[derive(Default)]
pub struct PendingSpawn {
    state: Mutex<State>,
    /// More notifiers to tell when the spawn is over (an abandoning caller's dispatcher).
    also: Mutex<Vec<(Arc<Notifier>, u64)>>,
}

impl PendingSpawn {
    /// Whether the spawn is over (its result may be taken, or was).
    pub fn is_done(&self) -> bool {
        matches!(*lock(&self.state), State::Ready(_) | State::Taken)
    }

    /// The spawned process or the spawn's error, once; None before it is done or after.
    pub fn take(&self) -> Option<Result<Arc<Proc>, CoreError>> {
        let mut state = lock(&self.state);
        match std::mem::take(&mut *state) {
            State::Ready(result) => {
                *state = State::Taken;
                Some(result)
            }
            other => {
                *state = other;
                None
            }
        }
    }

    /// The caller gives up: true while the spawn is still to land (it is then killed as it
    /// lands, and its result can still be taken); false when it is over already.
    pub fn abandon(&self) -> bool {
        let mut state = lock(&self.state);
        match *state {
            State::Waiting | State::Abandoned => {
                *state = State::Abandoned;
                true
            }
            _ => false,
        }
    }

    /// Also pushes `token` to `notifier` when the spawn is over (at once if it is).
    pub fn subscribe(&self, notifier: Arc<Notifier>, token: u64) {
        let state = lock(&self.state);
        if matches!(*state, State::Ready(_) | State::Taken) {
            drop(state);
            notifier.push(token);
            return;
        }
        lock(&self.also).push((notifier, token));
    }

    fn complete(&self, result: Result<Arc<Proc>, CoreError>) {
        let mut state = lock(&self.state);
        if let (State::Abandoned, Ok(proc)) = (&*state, &result) {
            proc.kill();
        }
        *state = State::Ready(result);
        let also = std::mem::take(&mut *lock(&self.also));
        drop(state);
        for (notifier, token) in also {
            notifier.push(token);
        }
    }
}

struct Threads {
    tx: Sender<SpawnJob>,
    handles: Vec<JoinHandle<()>>,
    owner: u32,
}

#[derive(Default)]
enum Slot {
    #[default]
    Idle,
    Running(Threads),
    Stopped,
}

/// The spawner threads of one service, started on the first queued spawn.
#[derive(Default)]
pub struct SpawnQueue {
    /// `Idle` before the first queued spawn; `Stopped` once `stop` ran (later spawns run on
    /// the caller's thread, where a disposed service refuses them).
    threads: Mutex<Slot>,
    /// Spawns queued or under way (not yet a process the service counts, nor failed).
    queued: Arc<AtomicUsize>,
}

impl SpawnQueue {
    /// Spawns submitted and not yet over.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Queues `job` for `service`'s spawner threads (started now if need be). A job no
    /// thread can take (none could start, or the queue was stopped) is run here, and its
    /// token pushed before this returns.
    pub fn submit(&self, service: &Arc<Service>, job: SpawnJob) {
        self.queued.fetch_add(1, Ordering::SeqCst);
        let mut slot = lock(&self.threads);
        if matches!(&*slot, Slot::Running(t) if t.owner != std::process::id()) {
            // A forked copy: the threads were the parent's (the service refuses to spawn
            // here anyway, and says so through the job).
            *slot = Slot::Idle;
        }
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
        run(Some(Arc::clone(service)), job);
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }

    /// Ends the spawner threads once the queued spawns are done (never from one of them);
    /// spawns submitted later run on their caller's thread.
    pub fn stop(&self) {
        let Slot::Running(threads) = std::mem::replace(&mut *lock(&self.threads), Slot::Stopped)
        else {
            return;
        };
        drop(threads.tx);
        if threads.owner != std::process::id() {
            return;
        }
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
    Ok(Threads {
        tx,
        handles,
        owner: std::process::id(),
    })
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
        run(service.upgrade(), job);
        queued.fetch_sub(1, Ordering::SeqCst);
    }
}

fn run(service: Option<Arc<Service>>, mut job: SpawnJob) {
    let result = match &service {
        // A panic must not leave the caller waiting for a token that never comes.
        Some(service) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            service.spawn(&mut job.plan, job.cfg)
        }))
        .unwrap_or_else(|_| Err(CoreError::Io(std::io::Error::other("the spawn panicked")))),
        None => Err(CoreError::Disposed),
    };
    drop(job.script);
    job.pending.complete(result);
    job.notifier.push(job.token);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::time::Duration;

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
            pending: Arc::new(PendingSpawn::default()),
            notifier: Arc::clone(notifier),
            token,
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
    fn queued_spawns_land_and_push_their_tokens() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let jobs: Vec<_> = (0..6)
            .map(|i| {
                let j = job("echo hi", &notifier, 1000 + i);
                let pending = Arc::clone(&j.pending);
                queue.submit(&service, j);
                pending
            })
            .collect();
        for (i, pending) in jobs.iter().enumerate() {
            while !pending.is_done() {
                wait_token(&notifier, 1000 + i as u64);
            }
            let proc = pending.take().expect("done").expect("spawned");
            assert!(pending.take().is_none(), "taken once");
            proc.wait(Some(Duration::from_secs(10)));
            assert_eq!(proc.collected().0.text, "hi\n");
        }
        queue.stop();
        service.dispose(false);
    }

    #[test]
    fn an_abandoned_spawn_is_killed_as_it_lands() {
        let service = service();
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let j = job("sleep 30", &notifier, 7);
        let pending = Arc::clone(&j.pending);
        assert!(pending.abandon(), "nothing landed yet");
        queue.submit(&service, j);
        wait_token(&notifier, 7);
        assert!(!pending.abandon(), "over");
        let proc = pending.take().expect("done").expect("spawned");
        assert!(
            proc.wait(Some(Duration::from_secs(10))),
            "killed, not left for 30 s"
        );
        queue.stop();
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
        assert!(matches!(pending.take(), Some(Err(CoreError::Disposed))));
    }

    #[test]
    fn a_disposed_service_fails_queued_spawns() {
        let service = service();
        service.dispose(false);
        let queue = SpawnQueue::default();
        let notifier = notifier();
        let j = job("true", &notifier, 9);
        let pending = Arc::clone(&j.pending);
        queue.submit(&service, j);
        wait_token(&notifier, 9);
        assert!(matches!(pending.take(), Some(Err(CoreError::Disposed))));
        queue.stop();
    }
}
