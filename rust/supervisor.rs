//! The supervisor: one thread per service that drains every child's pipes and reaps exits.
//!
//! epoll watches each child's stdout/stderr (read), stdin (write, when bytes remain) and
//! pidfd (exit), plus an eventfd that wakes the loop for new timers and shutdown. Each
//! registration has its own key, routed to a typed `Source`. Deadlines (drain grace, kill
//! escalation, leftover reaping) live in a min-heap (`lifecycle::Timers`). No thread per
//! process, no Python per chunk: callers block on a per-process condvar or subscribe a
//! `Notifier` whose eventfd an asyncio loop can watch.

use std::collections::HashMap;
use std::ffi::CString;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::adopted::Adopted;
use crate::cgroup::{CallCgroup, ServiceCgroups};
use crate::contain::CallContainment;
use crate::errors::{CoreError, SpawnError, SpawnStage};
use crate::forksafe::ForkClosed;
use crate::keeper::Keeper;
use crate::lifecycle::{self, Timers};
use crate::pipes::{Drain, READ_CHUNK};
use crate::process::{Proc, ProcConfig};
use crate::seccomp::FilterPolicy;
use crate::spawn::{spawn, SpawnPlan, Spawned};
use crate::spawner::ConfinedSpawner;
use crate::spill::SpillDir;
use crate::sys::{
    block_signals_in_this_thread, epoll_add, epoll_create, epoll_del, epoll_event_buffer,
    epoll_wait, eventfd, eventfd_clear, eventfd_raise, getpid, lock, readable, writable,
};
use nix::sys::epoll::{Epoll, EpollFlags};
use nix::sys::eventfd::EventFd;

mod containment;
mod handover;
mod source;
#[cfg(test)]
mod tests;

pub(crate) use handover::{drive_until_exit, ensure_watched};

use containment::KeeperSlot;
pub(crate) use source::Source;

/// The registration key of the wake eventfd; process registrations count up from 1.
const WAKE_KEY: u64 = 0;
const EVENT_BATCH: usize = 256;

/// Timers for the supervisor thread, and the end of its current sleep.
#[derive(Default)]
struct TimersIn {
    new: Vec<(Instant, u64)>,
    /// The earliest of the supervisor's timers when it last took the new ones (None: it
    /// had none, and sleeps until an event). Set under the same lock as `new` is drained,
    /// so that a timer added later is either taken before that sleep or compared with it.
    sleeps_until: Option<Instant>,
}

/// State shared by the supervisor thread, the service and every process.
pub(crate) struct Shared {
    epoll: Epoll,
    wake: EventFd,
    /// epoll registration key -> what it watches. A key is never reused, so an event
    /// left over from a closed registration routes nowhere.
    routes: Mutex<HashMap<u64, Source>>,
    next_key: AtomicU64,
    pub live: Mutex<HashMap<u64, Arc<Proc>>>,
    timers_in: Mutex<TimersIn>,
    pub spill: Mutex<SpillDir>,
    disposed: AtomicBool,
    stop: AtomicBool,
    next_token: AtomicU64,
    /// The process that created the service. A forked child inherits this memory but not
    /// the supervisor thread, and its "processes" are its parent's: it must not touch them.
    owner_pid: libc::pid_t,
    /// The service's cgroups, created on the first contained call (None: unavailable).
    cgroups: OnceLock<Option<ServiceCgroups>>,
    /// Emptied call cgroups waiting to go back to the pool (off the caller's path).
    releases: Mutex<Vec<CallCgroup>>,
    keeper: Mutex<KeeperSlot>,
    /// Settled calls whose orphans a subreaper harness may still have to reap.
    adopted: Mutex<Adopted>,
    /// The threads that spawn confined children, one per filter policy (see `spawner.rs`),
    /// each started on the first spawn of its policy; None: it could not be started.
    confined_spawners: Mutex<HashMap<FilterPolicy, Option<Arc<ConfinedSpawner>>>>,
}

/// A subprocess service: the supervisor thread plus every process it owns.
pub struct Service {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Shared {
    /// False in a forked child of the process that created the service.
    pub fn in_owner(&self) -> bool {
        getpid() == self.owner_pid
    }

    /// Hands the supervisor a timer; `wake`: from another thread, which wakes the
    /// supervisor only when the timer is due before the end of its current sleep (a run's
    /// two-minute timeout usually is not: the supervisor takes it when it next wakes).
    pub fn add_timer(&self, at: Instant, token: u64, wake: bool) {
        let mut timers = lock(&self.timers_in);
        timers.new.push((at, token));
        let sooner = timers.sleeps_until.is_none_or(|until| at < until);
        drop(timers);
        if wake && sooner {
            self.wake_supervisor();
        }
    }

    /// Makes the supervisor loop run once more (it picks up new timers then).
    pub fn wake_supervisor(&self) {
        eventfd_raise(&self.wake);
    }

    fn get(&self, token: u64) -> Option<Arc<Proc>> {
        lock(&self.live).get(&token).cloned()
    }

    /// Registers `fd` for `events`; returns the key its events will carry.
    fn watch(&self, fd: &OwnedFd, events: EpollFlags, source: Source) -> io::Result<u64> {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        lock(&self.routes).insert(key, source);
        if let Err(err) = epoll_add(&self.epoll, fd, events, key) {
            lock(&self.routes).remove(&key);
            return Err(err);
        }
        Ok(key)
    }

    /// A route for `source` whose fd is not (yet) in the epoll set (see `ProcState::in_epoll`).
    fn route_only(&self, source: Source) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        lock(&self.routes).insert(key, source);
        key
    }

    /// Deregisters `fd` (a no-op when it never was: `key` is None).
    pub fn unwatch(&self, fd: &OwnedFd, key: Option<u64>) {
        self.unwatch_from(fd, key, true);
    }

    /// `unwatch` for an fd that may be out of the epoll set (`in_epoll` false): its route
    /// goes, without an `EPOLL_CTL_DEL` that could only fail.
    pub fn unwatch_from(&self, fd: &OwnedFd, key: Option<u64>, in_epoll: bool) {
        if let Some(key) = key {
            if in_epoll {
                epoll_del(&self.epoll, fd);
            }
            lock(&self.routes).remove(&key);
        }
    }

    fn route(&self, key: u64) -> Option<Source> {
        lock(&self.routes).get(&key).copied()
    }
}

impl Service {
    /// A service whose spill files (under `spill_parent`) may hold `spill_total` bytes.
    pub fn new(spill_parent: PathBuf, spill_total: u64) -> io::Result<Self> {
        let epoll = epoll_create()?;
        let wake = eventfd()?;
        epoll_add(&epoll, &wake, readable(), WAKE_KEY)?;
        Ok(Self {
            shared: Arc::new(Shared {
                epoll,
                wake,
                routes: Mutex::new(HashMap::from([(WAKE_KEY, Source::Wake)])),
                next_key: AtomicU64::new(WAKE_KEY + 1),
                live: Mutex::new(HashMap::new()),
                timers_in: Mutex::new(TimersIn::default()),
                spill: Mutex::new(SpillDir::with_total(spill_parent, spill_total)),
                disposed: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                next_token: AtomicU64::new(1),
                owner_pid: getpid(),
                cgroups: OnceLock::new(),
                releases: Mutex::new(Vec::new()),
                keeper: Mutex::new(KeeperSlot::default()),
                adopted: Mutex::new(Adopted::default()),
                confined_spawners: Mutex::new(HashMap::new()),
            }),
            thread: Mutex::new(None),
        })
    }

    pub fn is_disposed(&self) -> bool {
        self.shared.disposed.load(Ordering::SeqCst)
    }

    pub fn spill_dir(&self) -> Option<PathBuf> {
        if !self.in_owner() {
            return None; // a forked copy: see `usable`
        }
        lock(&self.shared.spill).path().map(|p| p.to_path_buf())
    }

    /// Whether the service may act: not disposed, and not a forked copy of the harness (its
    /// spill directory, keeper and locks are the parent's; a lock a thread of the parent held
    /// at the fork is never released in the copy, so a copy takes none).
    fn usable(&self) -> bool {
        self.in_owner() && !self.is_disposed()
    }

    /// The spill directory, created now if nothing spilled yet (None once disposed, or in a
    /// forked copy). The keeper is told at once: a harness killed before anything spilled
    /// must not leave it.
    pub fn ensure_spill_dir(&self) -> Option<PathBuf> {
        if !self.usable() {
            return None;
        }
        let dir = lock(&self.shared.spill).ensure_dir().ok()?;
        self.shared.note_spill_dir();
        Some(dir)
    }

    /// Tells the keeper to remove `dir` (a tree the harness made for its commands: a
    /// read-only call's `$TMPDIR`, the sandbox cache) if the harness dies before it does.
    pub fn note_scratch_dir(&self, dir: &Path) {
        if !self.usable() {
            return; // a keeper started now would outlive the service
        }
        self.shared
            .tell_keeper(|k| k.send(&format!("scratch {}", dir.display())));
    }

    /// The harness removed `dir` itself: the keeper forgets it.
    pub fn forget_scratch_dir(&self, dir: &Path) {
        if !self.in_owner() {
            return;
        }
        if let Some(k) = &lock(&self.shared.keeper).running {
            k.send(&format!("unscratch {}", dir.display()));
        }
    }

    /// Processes not yet settled (none of a forked copy's own: see `usable`).
    pub fn running(&self) -> usize {
        if !self.in_owner() {
            return 0;
        }
        lock(&self.shared.live).len()
    }

    /// Whether this process made the service (not a forked copy of the harness), answered
    /// without a lock: one the fork caught held by another thread is never released here.
    pub fn in_owner(&self) -> bool {
        self.shared.in_owner()
    }

    pub fn has_supervisor_thread(&self) -> bool {
        lock(&self.thread).is_some()
    }

    fn ensure_thread(&self) -> io::Result<()> {
        let mut thread = lock(&self.thread);
        if thread.is_none() {
            let shared = Arc::clone(&self.shared);
            let handle = std::thread::Builder::new()
                .name("shellseam-supervisor".into())
                .spawn(move || supervise(&shared))?;
            *thread = Some(handle);
        }
        Ok(())
    }

    /// Configures the keeper (started on the first call) and whether the spill directory
    /// is kept when the harness dies.
    pub fn set_keeper(&self, program: CString, argv: Vec<CString>, keep_spill: bool) {
        let mut slot = lock(&self.shared.keeper);
        slot.command = Some((program, argv));
        slot.keep_spill = keep_spill;
    }

    /// The keeper's pid, once started.
    pub fn keeper_pid(&self) -> Option<libc::pid_t> {
        if !self.in_owner() {
            return None; // the parent's keeper, if any
        }
        lock(&self.shared.keeper).running.as_ref().map(Keeper::pid)
    }

    /// Whether this service contains calls in cgroups (creating its cgroups if needed).
    pub fn has_cgroups(&self) -> bool {
        self.in_owner() && self.shared.cgroups().is_some()
    }

    pub fn spawn(&self, plan: &mut SpawnPlan, cfg: ProcConfig) -> Result<Arc<Proc>, CoreError> {
        if !self.shared.in_owner() {
            return Err(CoreError::ForkedChild);
        }
        if self.is_disposed() {
            return Err(CoreError::Disposed);
        }
        self.ensure_thread()
            .map_err(|e| SpawnError::from_io(SpawnStage::Supervise, &e))?;
        let started = Instant::now();
        let cgroups = if cfg.cgroup {
            self.shared.cgroups()
        } else {
            None
        };
        if cgroups.is_none() {
            self.shared.tell_keeper(|_| {}); // started before the call, so it can be told
        }
        let (mut contain, rlimits) = CallContainment::prepare(cgroups, &cfg.limits);
        plan.cgroup = contain.cgroup.as_ref().map(CallCgroup::dir_fd);
        let joins = contain
            .cgroup
            .as_ref()
            .map(CallCgroup::join_fds)
            .transpose()
            .map_err(|e| SpawnError::from_io(SpawnStage::Contain, &e));
        plan.rlimits = rlimits;
        let child = match joins.and_then(|joins| {
            plan.join_cgroups = joins.unwrap_or_default();
            self.spawn_child(plan, cfg.defer_watch && cfg.stdin.is_empty())
        }) {
            Ok(child) => child,
            Err(err) => {
                self.shared.end_containment(0, &mut contain, |_| false);
                return Err(err.into());
            }
        };
        if let Some(cg) = contain.cgroup.as_mut() {
            // The plan's fds were the cgroup's: they close here.
            plan.cgroup = None;
            plan.join_cgroups.clear();
            cg.shed();
        }
        if contain.cgroup.is_none() {
            let (pgid, ino) = (
                child.pid,
                crate::kill::pidfs_ino(std::os::fd::AsFd::as_fd(&child.pidfd)),
            );
            self.shared.tell_keeper(|k| k.group(pgid, ino));
        }
        let token = self.shared.next_token.fetch_add(1, Ordering::Relaxed);
        let first_cpu_check = contain.next_cpu_check;
        let proc_has_memory_limit = contain.cgroup.is_some() && cfg.limits.memory_bytes.is_some();
        let cfg_defer_watch = cfg.defer_watch;
        let proc = Arc::new(Proc::new(
            token,
            Arc::clone(&self.shared),
            child,
            cfg,
            contain,
            started,
        ));
        if let Some(at) = first_cpu_check {
            self.shared.add_timer(at, token, true);
        }
        if proc_has_memory_limit {
            self.shared.watch_oom(token, &mut lock(&proc.state).contain);
        }
        {
            let mut live = lock(&self.shared.live);
            if self.is_disposed() {
                drop(live);
                // Lost a race with dispose: the caller gets DISPOSED and nothing survives.
                self.abandon(&proc);
                return Err(CoreError::Disposed);
            }
            live.insert(token, Arc::clone(&proc));
        }
        let registered = self.watch_all(&proc, cfg_defer_watch);
        if let Err(err) = registered {
            // Unsupervised, the process could never settle: take it down now, reap it here.
            lock(&self.shared.live).remove(&token);
            self.abandon(&proc);
            let mut st = lock(&proc.state);
            let st = &mut *st;
            let pipe = |fd: Option<ForkClosed>| fd.map(ForkClosed::into_inner);
            let owned = [
                (pipe(st.stdout.fd.take()), st.stdout.key.take()),
                (pipe(st.stderr.fd.take()), st.stderr.key.take()),
                (st.stdin.close(), st.stdin.key.take()),
                (st.contain.leader.take(), st.pidfd_key.take()),
            ];
            for (fd, key) in owned {
                if let Some(fd) = fd {
                    self.shared.unwatch(&fd, key);
                }
            }
            return Err(SpawnError::from_io(SpawnStage::Supervise, &err).into());
        }
        Ok(proc)
    }

    /// Spawns `plan` here, or a confined child on the confined spawner of its filter policy
    /// (which carries the filter's base layer and, for a privileged harness, an empty
    /// bounding set, for the child to inherit). A spawner that cannot be had: here.
    /// `foreground`: the caller drives the process once spawned (see `ProcConfig`) and has
    /// nothing to write to its stdin (see `ConfinedSpawner::spawn`).
    fn spawn_child(&self, plan: &mut SpawnPlan, foreground: bool) -> Result<Spawned, SpawnError> {
        let Some(conf) = &plan.confinement else {
            return spawn(plan);
        };
        let (policy, caps) = (conf.filter_policy, conf.caps);
        let mut spawners = lock(&self.shared.confined_spawners);
        if self.is_disposed() {
            // dispose has stopped (or is stopping) every spawner: start none it would miss.
            drop(spawners);
            return spawn(plan);
        }
        let spawner = spawners
            .entry(policy)
            .or_insert_with(|| {
                let last_cap = caps.can_setpcap.then_some(caps.last_cap);
                ConfinedSpawner::start(policy, last_cap).map(Arc::new)
            })
            .clone();
        drop(spawners);
        match spawner {
            Some(spawner) => spawner.spawn(
                std::mem::replace(plan, SpawnPlan::handed_over()),
                foreground,
            ),
            None => spawn(plan),
        }
    }

    /// Kills and reaps a process that will never be supervised, with everything in its
    /// cgroup, and lets go of its containment.
    fn abandon(&self, proc: &Proc) {
        let mut st = lock(&proc.state);
        st.contain.signal(proc.pid, libc::SIGKILL);
        st.contain.reap_leader_blocking();
        let start = Instant::now();
        while st.contain.any_alive(proc.pid) && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.shared
            .end_containment(proc.pid, &mut st.contain, |_| false);
    }

    /// Registers a new process's pipes and pidfd with epoll; `defer`: only their routes,
    /// for a caller that drives the process from the start (when its stdin is written at
    /// once: feeding the rest needs the supervisor's EPOLLOUT).
    fn watch_all(&self, proc: &Proc, defer: bool) -> io::Result<()> {
        let shared = &self.shared;
        let token = proc.token;
        let mut st = lock(&proc.state);
        // Write what fits right away; only a command that does not read yet needs EPOLLOUT.
        lifecycle::feed_stdin(proc, &mut st);
        let st = &mut *st;
        if defer && st.stdin.fd.is_none() {
            if st.stdout.fd.is_some() {
                st.stdout.key = Some(shared.route_only(Source::Stdout(token)));
            }
            if st.stderr.fd.is_some() {
                st.stderr.key = Some(shared.route_only(Source::Stderr(token)));
            }
            if st.contain.leader.is_some() && st.leader.is_none() {
                st.pidfd_key = Some(shared.route_only(Source::Exit(token)));
            }
            return Ok(());
        }
        st.in_epoll = true;
        let input = readable();
        if let Some(fd) = &st.stdout.fd {
            st.stdout.key = Some(shared.watch(fd, input, Source::Stdout(token))?);
        }
        if let Some(fd) = &st.stderr.fd {
            st.stderr.key = Some(shared.watch(fd, input, Source::Stderr(token))?);
        }
        if let Some(fd) = &st.stdin.fd {
            let output = writable();
            st.stdin.key = Some(shared.watch(fd, output, Source::Stdin(token))?);
        }
        // The pidfd stays open after the leader's exit is seen (see `CallContainment::leader`),
        // readable for good: watched only until then.
        if let (Some(fd), None) = (&st.contain.leader, &st.leader) {
            st.pidfd_key = Some(shared.watch(fd, input, Source::Exit(token))?);
        }
        Ok(())
    }

    /// Refuses new spawns and requests the kill of every live process; returns them so
    /// that an async caller can await their settlement before `dispose`.
    pub fn begin_dispose(&self) -> Vec<Arc<Proc>> {
        self.shared.disposed.store(true, Ordering::SeqCst);
        if !self.shared.in_owner() {
            return Vec::new();
        }
        let procs: Vec<Arc<Proc>> = lock(&self.shared.live).values().cloned().collect();
        for proc in &procs {
            proc.kill();
        }
        procs
    }

    /// Kills (with escalation) and reaps every process, then stops the supervisor thread.
    pub fn dispose(&self, keep_spill: bool) {
        if !self.shared.in_owner() {
            // A forked child: the processes, thread and spill files are the parent's.
            self.shared.disposed.store(true, Ordering::SeqCst);
            return;
        }
        let procs = self.begin_dispose();
        for proc in &procs {
            proc.wait(None);
        }
        let spawners: Vec<_> = lock(&self.shared.confined_spawners)
            .drain()
            .filter_map(|(_, spawner)| spawner)
            .collect();
        for spawner in spawners {
            spawner.stop();
        }
        self.shared.stop.store(true, Ordering::SeqCst);
        eventfd_raise(&self.shared.wake);
        if let Some(handle) = lock(&self.thread).take() {
            let _ = handle.join();
        }
        self.shared.recycle();
        if let Some(set) = self.shared.cgroups.get().and_then(Option::as_ref) {
            set.remove_all();
        }
        if !keep_spill {
            let _ = lock(&self.shared.spill).remove();
        }
        if let Some(keeper) = lock(&self.shared.keeper).running.take() {
            keeper.stop();
        }
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if !self.shared.in_owner() {
            return;
        }
        if !self.is_disposed() || lock(&self.thread).is_some() {
            self.dispose(false);
        }
    }
}

fn supervise(shared: &Arc<Shared>) {
    block_signals_in_this_thread();
    let mut timers = Timers::default();
    let mut scratch = vec![0u8; READ_CHUNK];
    let mut events = epoll_event_buffer(EVENT_BATCH);
    loop {
        {
            let mut new = lock(&shared.timers_in);
            timers.extend(new.new.drain(..));
            new.sleeps_until = timers.next_at();
        }
        if shared.stop.load(Ordering::SeqCst) && lock(&shared.live).is_empty() {
            break;
        }
        let n = epoll_wait(&shared.epoll, &mut events, timers.timeout(Instant::now()));
        for ev in &events[..n] {
            let Some(source) = shared.route(ev.data()) else {
                continue;
            };
            let token = match source {
                Source::Wake => {
                    eventfd_clear(&shared.wake);
                    continue;
                }
                Source::Stdout(t)
                | Source::Stderr(t)
                | Source::Stdin(t)
                | Source::Exit(t)
                | Source::Cgroup(t)
                | Source::Oom(t) => t,
            };
            let Some(proc) = shared.get(token) else {
                continue;
            };
            let mut st = lock(&proc.state);
            match source {
                Source::Stdout(_) => {
                    lifecycle::drain_stream(&proc, &mut st, true, &mut scratch, Drain::Streaming)
                }
                Source::Stderr(_) => {
                    lifecycle::drain_stream(&proc, &mut st, false, &mut scratch, Drain::Streaming)
                }
                Source::Stdin(_) => lifecycle::feed_stdin(&proc, &mut st),
                Source::Exit(_) => lifecycle::reap_leader(&proc, &mut st),
                Source::Cgroup(_) => lifecycle::on_cgroup_event(&proc, &mut st, Instant::now()),
                Source::Oom(_) => lifecycle::on_oom(&proc, &mut st),
                Source::Wake => {}
            }
            lifecycle::advance(&proc, &mut st, Instant::now());
        }
        let now = Instant::now();
        while let Some(token) = timers.pop_due(now) {
            if let Some(proc) = shared.get(token) {
                let mut st = lock(&proc.state);
                lifecycle::on_timer(&proc, &mut st, now);
            }
        }
        if timers.crowded() {
            let live = lock(&shared.live);
            // Token 0 is no process's: the rescan for adopted zombies (`reap_adopted`).
            timers.compact(live.len(), |token| token == 0 || live.contains_key(&token));
        }
        shared.recycle();
        shared.reap_adopted();
    }
}
