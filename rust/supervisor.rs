//! The supervisor: one thread per service that drains every child's pipes and reaps exits.
//!
//! epoll watches each child's stdout/stderr (read), stdin (write, when bytes remain) and
//! pidfd (exit), plus an eventfd that wakes the loop for new timers and shutdown. Deadlines
//! (drain grace, kill escalation, leftover reaping) live in a min-heap. No thread per
//! process, no Python per chunk: callers block on a per-process condvar or subscribe a
//! `Notifier` whose eventfd an asyncio loop can watch.
//!
//! Lifecycle of a process: Running → (leader exits) Draining until both pipes reach EOF or
//! `grace` passes → Reaping: any process left in the group is counted, sent SIGTERM and,
//! after `grace`, SIGKILL → Done. A kill request sends SIGTERM to the group at once and
//! SIGKILL after `grace` if the group is still there.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::collector::{Collected, Collector, Delta};
use crate::errors::CoreError;
use crate::kill::{count_group, group_alive, signal_group};
use crate::spawn::{spawn, SpawnPlan};
use crate::spill::SpillDir;

const WAKE_TOKEN: u64 = u64::MAX;
const KIND_STDOUT: u64 = 0;
const KIND_STDERR: u64 = 1;
const KIND_STDIN: u64 = 2;
const KIND_EXIT: u64 = 3;
const READ_CHUNK: usize = 1 << 20;
const DEFAULT_PIPE_BYTES: usize = 1 << 16;
/// Pipe size for a stream that filled the default one. Larger pipes measured slower here:
/// the producer's writes touch more cache for no fewer wake-ups.
const LARGE_PIPE_BYTES: libc::c_int = 256 * 1024;
/// How often the group of a process in its Reaping phase is polled (no event exists for
/// the exit of a process that is not our child).
const REAP_POLL: Duration = Duration::from_millis(5);
/// How long SIGKILLed leftovers may take to vanish before the call completes regardless.
const SIGKILL_SETTLE: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a lock must not wedge every later caller.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Per-process limits and input.
pub struct ProcConfig {
    pub stdout_cap: usize,
    pub stderr_cap: usize,
    pub spill_cap: u64,
    pub grace: Duration,
    pub stdin: Vec<u8>,
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
}

/// Wakes a waiter (e.g. an asyncio loop reading `fd()`) when subscribed processes finish.
pub struct Notifier {
    efd: OwnedFd,
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

    fn push(&self, token: u64) {
        lock(&self.queue).push(token);
        eventfd_write(self.efd.as_raw_fd());
    }

    /// Wakes a blocked `wait` without queueing a token.
    pub fn wake(&self) {
        eventfd_write(self.efd.as_raw_fd());
    }

    /// Tokens of the processes that finished since the last call (never blocks).
    pub fn take(&self) -> Vec<u64> {
        eventfd_read(self.efd.as_raw_fd());
        std::mem::take(&mut *lock(&self.queue))
    }

    /// Blocks until at least one token is queued or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> Vec<u64> {
        let ready = {
            let queue = lock(&self.queue);
            !queue.is_empty()
        };
        if !ready {
            let mut pfd = libc::pollfd {
                fd: self.efd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
            // SAFETY: polls one valid pollfd owned by this frame.
            unsafe { libc::poll(&mut pfd, 1, ms) };
        }
        self.take()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Draining,
    Reaping { sigkill_sent: bool },
    Done,
}

struct Stream {
    fd: Option<OwnedFd>,
    collector: Collector,
    grown: bool,
}

struct ProcState {
    phase: Phase,
    stdout: Stream,
    stderr: Stream,
    stdin_fd: Option<OwnedFd>,
    stdin_data: Vec<u8>,
    stdin_off: usize,
    pidfd: Option<OwnedFd>,
    wait_status: Option<libc::c_int>,
    rusage: Option<libc::rusage>,
    kill_requested: bool,
    kill_at: Option<Instant>,
    deadline: Option<Instant>,
    leftover_killed: u32,
    started: Instant,
    finished: Option<Instant>,
    subscribers: Vec<Arc<Notifier>>,
    grace: Duration,
}

/// One managed process group, shared by the supervisor and its callers.
pub struct Proc {
    pub token: u64,
    pub pid: libc::pid_t,
    shared: Arc<Shared>,
    state: Mutex<ProcState>,
    done: Condvar,
}

struct Shared {
    epfd: OwnedFd,
    wake: OwnedFd,
    live: Mutex<HashMap<u64, Arc<Proc>>>,
    timers_in: Mutex<Vec<(Instant, u64)>>,
    spill: Mutex<SpillDir>,
    disposed: AtomicBool,
    stop: AtomicBool,
    next_token: AtomicU64,
    /// The process that created the service. A forked child inherits this memory but not
    /// the supervisor thread, and its "processes" are its parent's: it must not touch them.
    owner_pid: libc::pid_t,
}

/// A subprocess service: the supervisor thread plus every process it owns.
pub struct Service {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: eventfd returns a new fd or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn eventfd_write(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
}

fn eventfd_read(fd: RawFd) {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from a non-blocking eventfd.
    unsafe { libc::read(fd, &mut value as *mut u64 as *mut libc::c_void, 8) };
}

fn epoll_add(epfd: RawFd, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
    let mut ev = libc::epoll_event { events, u64: data };
    // SAFETY: registers a valid fd with a valid epoll instance; `ev` is copied by the kernel.
    if unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, fd, &mut ev) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn epoll_del(epfd: RawFd, fd: RawFd) {
    // SAFETY: removing a registered fd; a stale registration is harmless (ENOENT).
    unsafe { libc::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
}

impl Shared {
    /// False in a forked child of the process that created the service.
    fn in_owner(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() == self.owner_pid }
    }

    fn add_timer(&self, at: Instant, token: u64, wake: bool) {
        lock(&self.timers_in).push((at, token));
        if wake {
            eventfd_write(self.wake.as_raw_fd());
        }
    }

    fn get(&self, token: u64) -> Option<Arc<Proc>> {
        lock(&self.live).get(&token).cloned()
    }
}

impl Service {
    pub fn new(spill_parent: PathBuf) -> io::Result<Self> {
        // SAFETY: epoll_create1 returns a new fd or -1.
        let epfd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if epfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `epfd` is fresh and owned by nobody else.
        let epfd = unsafe { OwnedFd::from_raw_fd(epfd) };
        let wake = eventfd()?;
        epoll_add(
            epfd.as_raw_fd(),
            wake.as_raw_fd(),
            libc::EPOLLIN as u32,
            WAKE_TOKEN,
        )?;
        Ok(Self {
            shared: Arc::new(Shared {
                epfd,
                wake,
                live: Mutex::new(HashMap::new()),
                timers_in: Mutex::new(Vec::new()),
                spill: Mutex::new(SpillDir::new(spill_parent)),
                disposed: AtomicBool::new(false),
                stop: AtomicBool::new(false),
                next_token: AtomicU64::new(1),
                // SAFETY: getpid has no preconditions.
                owner_pid: unsafe { libc::getpid() },
            }),
            thread: Mutex::new(None),
        })
    }

    pub fn is_disposed(&self) -> bool {
        self.shared.disposed.load(Ordering::SeqCst)
    }

    pub fn spill_dir(&self) -> Option<PathBuf> {
        lock(&self.shared.spill).path().map(|p| p.to_path_buf())
    }

    pub fn running(&self) -> usize {
        lock(&self.shared.live).len()
    }

    pub fn has_supervisor_thread(&self) -> bool {
        lock(&self.thread).is_some()
    }

    fn ensure_thread(&self) -> Result<(), CoreError> {
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

    pub fn spawn(&self, plan: &SpawnPlan, cfg: ProcConfig) -> Result<Arc<Proc>, CoreError> {
        if !self.shared.in_owner() {
            return Err(CoreError::ForkedChild);
        }
        if self.is_disposed() {
            return Err(CoreError::Disposed);
        }
        self.ensure_thread()?;
        let started = Instant::now();
        let child = spawn(plan)?;
        let token = self.shared.next_token.fetch_add(1, Ordering::Relaxed);
        let proc = Arc::new(Proc {
            token,
            pid: child.pid,
            shared: Arc::clone(&self.shared),
            state: Mutex::new(ProcState {
                phase: Phase::Running,
                stdout: Stream {
                    fd: Some(child.pipes.stdout),
                    collector: Collector::new(cfg.stdout_cap, cfg.spill_cap),
                    grown: false,
                },
                stderr: Stream {
                    fd: Some(child.pipes.stderr),
                    collector: Collector::new(cfg.stderr_cap, cfg.spill_cap),
                    grown: false,
                },
                stdin_fd: Some(child.pipes.stdin),
                stdin_data: cfg.stdin,
                stdin_off: 0,
                pidfd: Some(child.pidfd),
                wait_status: None,
                rusage: None,
                kill_requested: false,
                kill_at: None,
                deadline: None,
                leftover_killed: 0,
                started,
                finished: None,
                subscribers: Vec::new(),
                grace: cfg.grace,
            }),
            done: Condvar::new(),
        });
        {
            let mut live = lock(&self.shared.live);
            if self.is_disposed() {
                drop(live);
                // Lost a race with dispose: the caller gets DISPOSED and nothing survives.
                let _ = signal_group(child.pid, libc::SIGKILL);
                let mut status = 0;
                // SAFETY: reaps our own child; `status` is a valid out-pointer.
                unsafe { libc::waitpid(child.pid, &mut status, 0) };
                return Err(CoreError::Disposed);
            }
            live.insert(token, Arc::clone(&proc));
        }
        let mut st = lock(&proc.state);
        // Write what fits right away; only a command that does not read yet needs EPOLLOUT.
        write_stdin(&mut st, None);
        let epfd = self.shared.epfd.as_raw_fd();
        let registrations = [
            (st.stdout.fd.as_ref(), libc::EPOLLIN as u32, KIND_STDOUT),
            (st.stderr.fd.as_ref(), libc::EPOLLIN as u32, KIND_STDERR),
            (st.stdin_fd.as_ref(), libc::EPOLLOUT as u32, KIND_STDIN),
            (st.pidfd.as_ref(), libc::EPOLLIN as u32, KIND_EXIT),
        ];
        let mut registered = Ok(());
        for (fd, events, kind) in registrations {
            if let Some(fd) = fd {
                registered = epoll_add(epfd, fd.as_raw_fd(), events, (token << 2) | kind);
                if registered.is_err() {
                    break;
                }
            }
        }
        drop(st);
        if let Err(err) = registered {
            // Unsupervised, the process could never settle: take it down now, reap it here.
            lock(&self.shared.live).remove(&token);
            let _ = signal_group(child.pid, libc::SIGKILL);
            let mut status = 0;
            // SAFETY: reaps our own child; `status` is a valid out-pointer.
            unsafe { libc::waitpid(child.pid, &mut status, 0) };
            let mut st = lock(&proc.state);
            for fd in [
                st.stdout.fd.take(),
                st.stderr.fd.take(),
                st.stdin_fd.take(),
                st.pidfd.take(),
            ]
            .into_iter()
            .flatten()
            {
                epoll_del(epfd, fd.as_raw_fd());
            }
            return Err(CoreError::Io(err));
        }
        Ok(proc)
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
        self.shared.stop.store(true, Ordering::SeqCst);
        eventfd_write(self.shared.wake.as_raw_fd());
        if let Some(handle) = lock(&self.thread).take() {
            let _ = handle.join();
        }
        if !keep_spill {
            let _ = lock(&self.shared.spill).remove();
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

impl Proc {
    pub fn pgid(&self) -> libc::pid_t {
        self.pid
    }

    pub fn is_done(&self) -> bool {
        lock(&self.state).phase == Phase::Done
    }

    /// Requests termination: SIGTERM to the group now, SIGKILL after the grace period.
    /// False when the process already finished or a kill is already under way.
    pub fn kill(&self) -> bool {
        if !self.shared.in_owner() {
            return false;
        }
        let mut st = lock(&self.state);
        if st.phase == Phase::Done || st.kill_requested {
            return false;
        }
        st.kill_requested = true;
        let _ = signal_group(self.pid, libc::SIGTERM);
        let at = Instant::now() + st.grace;
        st.kill_at = Some(at);
        drop(st);
        self.shared.add_timer(at, self.token, true);
        true
    }

    /// Waits until the process is done; false when `timeout` passed first.
    pub fn wait(&self, timeout: Option<Duration>) -> bool {
        if !self.shared.in_owner() {
            return false; // nobody in this process will ever settle it
        }
        let mut st = lock(&self.state);
        let deadline = timeout.map(|t| Instant::now() + t);
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

    /// Queues this process's token on `notifier` when it finishes (at once if it has).
    pub fn subscribe(&self, notifier: Arc<Notifier>) {
        let mut st = lock(&self.state);
        if st.phase == Phase::Done {
            drop(st);
            notifier.push(self.token);
        } else {
            st.subscribers.push(notifier);
        }
    }

    pub fn outcome(&self) -> Option<Outcome> {
        let st = lock(&self.state);
        if st.phase != Phase::Done {
            return None;
        }
        let status = st.wait_status.unwrap_or(0);
        let (exit_code, signal) = if libc::WIFSIGNALED(status) {
            (None, Some(libc::WTERMSIG(status)))
        } else {
            (Some(libc::WEXITSTATUS(status)), None)
        };
        let tv = |t: libc::timeval| {
            Duration::from_secs(t.tv_sec.max(0) as u64)
                + Duration::from_micros(t.tv_usec.max(0) as u64)
        };
        let (user_cpu, system_cpu, max_rss_kib) =
            st.rusage.map_or((Duration::ZERO, Duration::ZERO, 0), |r| {
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
        })
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

fn supervise(shared: &Arc<Shared>) {
    block_signals_in_this_thread();
    let epfd = shared.epfd.as_raw_fd();
    let mut heap: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut scratch = vec![0u8; READ_CHUNK];
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        heap.extend(lock(&shared.timers_in).drain(..).map(Reverse));
        if shared.stop.load(Ordering::SeqCst) && lock(&shared.live).is_empty() {
            break;
        }
        let timeout_ms = heap.peek().map_or(-1, |Reverse((at, _))| {
            let wait = at.saturating_duration_since(Instant::now());
            // Round up so that we never wake just before a deadline and spin.
            (wait.as_micros().div_ceil(1000)).min(i32::MAX as u128) as libc::c_int
        });
        // SAFETY: `events` is a valid buffer of `events.len()` epoll_event entries.
        let n = unsafe {
            libc::epoll_wait(
                epfd,
                events.as_mut_ptr(),
                events.len() as libc::c_int,
                timeout_ms,
            )
        };
        let n = if n < 0 { 0 } else { n as usize };
        for ev in &events[..n] {
            let data = ev.u64;
            if data == WAKE_TOKEN {
                eventfd_read(shared.wake.as_raw_fd());
                continue;
            }
            let Some(proc) = shared.get(data >> 2) else {
                continue;
            };
            let mut st = lock(&proc.state);
            match data & 3 {
                KIND_STDOUT | KIND_STDERR => {
                    let is_out = data & 3 == KIND_STDOUT;
                    drain_stream(shared, &mut st, is_out, &mut scratch, false);
                }
                KIND_STDIN => write_stdin(&mut st, Some(epfd)),
                _ => reap_leader(&proc, &mut st, epfd),
            }
            advance(&proc, &mut st, Instant::now());
        }
        let now = Instant::now();
        while let Some(Reverse((at, token))) = heap.peek().copied() {
            if at > now {
                break;
            }
            heap.pop();
            if let Some(proc) = shared.get(token) {
                let mut st = lock(&proc.state);
                on_timer(&proc, &mut st, now);
            }
        }
    }
}

fn block_signals_in_this_thread() {
    // Signals belong to the harness's threads; a SIGPIPE from a stdin write stays pending
    // here instead of killing anything.
    // SAFETY: sigset_t is plain data, filled by sigfillset and read by pthread_sigmask.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// Reads what the pipe holds (bounded per call for fairness); closes it on EOF or error.
fn drain_stream(
    shared: &Shared,
    st: &mut ProcState,
    is_out: bool,
    scratch: &mut [u8],
    final_pass: bool,
) {
    let label = if is_out { "stdout" } else { "stderr" };
    let stream = if is_out {
        &mut st.stdout
    } else {
        &mut st.stderr
    };
    let Some(fd) = stream.fd.as_ref().map(|fd| fd.as_raw_fd()) else {
        return;
    };
    let mut open_spill = || lock(&shared.spill).create_file(label);
    let mut close = false;
    for _ in 0..64 {
        // SAFETY: reads into `scratch`, which is valid for `scratch.len()` bytes.
        let n = unsafe { libc::read(fd, scratch.as_mut_ptr() as *mut libc::c_void, scratch.len()) };
        if n > 0 {
            let n = n as usize;
            stream.collector.push(&scratch[..n], &mut open_spill);
            if !stream.grown && n >= DEFAULT_PIPE_BYTES {
                // A producer that fills the default pipe gets a larger one: fewer wakeups.
                // SAFETY: F_SETPIPE_SZ on a valid pipe fd; failure (limits) is harmless.
                unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, LARGE_PIPE_BYTES) };
                stream.grown = true;
            }
            if n < scratch.len() && !final_pass {
                break;
            }
            continue;
        }
        if n == 0 {
            close = true;
            break;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => break,
            _ => {
                close = true;
                break;
            }
        }
    }
    if close || final_pass {
        epoll_del(shared.epfd.as_raw_fd(), fd);
        stream.fd = None;
    }
}

/// Writes pending stdin; closes it when done. `epfd` is None before the fd is registered.
fn write_stdin(st: &mut ProcState, epfd: Option<RawFd>) {
    let Some(fd) = st.stdin_fd.as_ref().map(|fd| fd.as_raw_fd()) else {
        return;
    };
    let mut finished = false;
    while st.stdin_off < st.stdin_data.len() {
        let rest = &st.stdin_data[st.stdin_off..];
        // SAFETY: writes from a live slice to a non-blocking pipe.
        let n = unsafe { libc::write(fd, rest.as_ptr() as *const libc::c_void, rest.len()) };
        if n >= 0 {
            st.stdin_off += n as usize;
            continue;
        }
        match io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EAGAIN) => return,
            // EPIPE: the command exited or closed stdin without reading; not an error.
            _ => {
                finished = true;
                break;
            }
        }
    }
    if finished || st.stdin_off >= st.stdin_data.len() {
        if let Some(epfd) = epfd {
            epoll_del(epfd, fd);
        }
        st.stdin_fd = None;
        st.stdin_data = Vec::new();
    }
}

fn reap_leader(proc: &Proc, st: &mut ProcState, epfd: RawFd) {
    let mut status: libc::c_int = 0;
    // SAFETY: rusage is plain data filled by wait4.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: reaps our own child without blocking; out-pointers are valid.
    let r = unsafe { libc::wait4(proc.pid, &mut status, libc::WNOHANG, &mut usage) };
    if r == proc.pid {
        st.wait_status = Some(status);
        st.rusage = Some(usage);
    } else if r < 0 {
        // ECHILD: somebody else reaped it (a stray waitpid(-1) in the harness). Report
        // what we can instead of waiting forever.
        st.wait_status = Some(0);
    } else {
        return;
    }
    if let Some(fd) = st.pidfd.take() {
        epoll_del(epfd, fd.as_raw_fd());
    }
}

fn pipes_closed(st: &ProcState) -> bool {
    st.stdout.fd.is_none() && st.stderr.fd.is_none()
}

fn advance(proc: &Proc, st: &mut ProcState, now: Instant) {
    match st.phase {
        Phase::Running if st.wait_status.is_some() => {
            if pipes_closed(st) {
                begin_reap(proc, st, now);
            } else {
                st.phase = Phase::Draining;
                let at = now + st.grace;
                st.deadline = Some(at);
                proc.shared.add_timer(at, proc.token, false);
            }
        }
        Phase::Draining if pipes_closed(st) => begin_reap(proc, st, now),
        _ => {}
    }
}

/// The leader is gone and the drain ended: terminate whatever is left of the group.
fn begin_reap(proc: &Proc, st: &mut ProcState, now: Instant) {
    if let Some(fd) = st.stdin_fd.take() {
        epoll_del(proc.shared.epfd.as_raw_fd(), fd.as_raw_fd());
    }
    if group_alive(proc.pid) {
        let left = count_group(proc.pid);
        if left > 0 {
            st.leftover_killed += left as u32;
            let _ = signal_group(proc.pid, libc::SIGTERM);
            st.phase = Phase::Reaping {
                sigkill_sent: false,
            };
            st.deadline = Some(now + st.grace);
            proc.shared.add_timer(now + REAP_POLL, proc.token, false);
            return;
        }
    }
    finish(proc, st, now);
}

fn on_timer(proc: &Proc, st: &mut ProcState, now: Instant) {
    if st.phase == Phase::Done {
        return;
    }
    if st.kill_at.is_some_and(|at| at <= now) {
        st.kill_at = None;
        let _ = signal_group(proc.pid, libc::SIGKILL);
    }
    let due = st.deadline.is_some_and(|at| at <= now);
    match st.phase {
        Phase::Draining if due => begin_reap(proc, st, now),
        Phase::Reaping { sigkill_sent } => {
            // Count live members, not the group's existence: a killed orphan stays a
            // zombie until init reaps it, and some inits (containers) take their time.
            if !group_alive(proc.pid) || count_group(proc.pid) == 0 {
                finish(proc, st, now);
            } else if due && !sigkill_sent {
                let _ = signal_group(proc.pid, libc::SIGKILL);
                st.phase = Phase::Reaping { sigkill_sent: true };
                st.deadline = Some(now + SIGKILL_SETTLE);
                proc.shared.add_timer(now + REAP_POLL, proc.token, false);
            } else if due {
                // Unkillable (uninterruptible sleep): complete with what we have.
                finish(proc, st, now);
            } else {
                proc.shared.add_timer(now + REAP_POLL, proc.token, false);
            }
        }
        _ => {}
    }
}

fn finish(proc: &Proc, st: &mut ProcState, now: Instant) {
    // Whatever already sits in the pipes was produced: keep it, then let go of the pipes.
    let mut scratch = vec![0u8; 64 * 1024];
    drain_stream(&proc.shared, st, true, &mut scratch, true);
    drain_stream(&proc.shared, st, false, &mut scratch, true);
    st.stdout.collector.flush();
    st.stderr.collector.flush();
    if let Some(fd) = st.pidfd.take() {
        epoll_del(proc.shared.epfd.as_raw_fd(), fd.as_raw_fd());
    }
    st.phase = Phase::Done;
    st.finished = Some(now);
    st.deadline = None;
    st.kill_at = None;
    for notifier in st.subscribers.drain(..) {
        notifier.push(proc.token);
    }
    lock(&proc.shared.live).remove(&proc.token);
    proc.done.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn plan(cmd: &str) -> SpawnPlan {
        let c = |s: &str| CString::new(s).unwrap();
        SpawnPlan {
            program: c("/bin/bash"),
            argv: vec![c("bash"), c("-c"), c(cmd)],
            envp: std::sync::Arc::new(vec![c("PATH=/usr/bin:/bin")]),
            cwd: c("/"),
            landlock_ruleset: None,
            cgroup: None,
            join_cgroups: Vec::new(),
            rlimits: Vec::new(),
        }
    }

    fn cfg(cap: usize) -> ProcConfig {
        ProcConfig {
            stdout_cap: cap,
            stderr_cap: cap,
            spill_cap: 1 << 20,
            grace: Duration::from_millis(300),
            stdin: Vec::new(),
        }
    }

    #[test]
    fn runs_and_collects() {
        let svc = Service::new(std::env::temp_dir()).unwrap();
        let p = svc
            .spawn(&plan("echo out; echo err >&2; exit 3"), cfg(1000))
            .unwrap();
        assert!(p.wait(Some(Duration::from_secs(10))));
        let o = p.outcome().unwrap();
        assert_eq!(o.exit_code, Some(3));
        let (out, err) = p.collected();
        assert_eq!(out.text, "out\n");
        assert_eq!(err.text, "err\n");
        svc.dispose(false);
    }

    #[test]
    fn stdin_is_written_then_closed() {
        let svc = Service::new(std::env::temp_dir()).unwrap();
        let mut c = cfg(1000);
        c.stdin = b"hello".to_vec();
        let p = svc.spawn(&plan("cat"), c).unwrap();
        assert!(p.wait(Some(Duration::from_secs(10))));
        assert_eq!(p.collected().0.text, "hello");
        svc.dispose(false);
    }

    #[test]
    fn leftover_holding_pipes_is_killed_after_grace() {
        let svc = Service::new(std::env::temp_dir()).unwrap();
        let p = svc.spawn(&plan("sleep 100 & echo hi"), cfg(1000)).unwrap();
        assert!(p.wait(Some(Duration::from_secs(10))));
        let o = p.outcome().unwrap();
        assert_eq!(o.exit_code, Some(0));
        assert_eq!(o.leftover_killed, 1);
        assert_eq!(count_group(p.pgid()), 0);
        svc.dispose(false);
    }

    #[test]
    fn kill_escalates_to_sigkill() {
        let svc = Service::new(std::env::temp_dir()).unwrap();
        let p = svc
            .spawn(&plan("trap '' TERM; sleep 100"), cfg(1000))
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
        assert!(p.kill());
        assert!(!p.kill());
        assert!(p.wait(Some(Duration::from_secs(10))));
        assert_eq!(p.outcome().unwrap().signal, Some(libc::SIGKILL));
        svc.dispose(false);
    }

    #[test]
    fn missing_workdir_is_a_chdir_error() {
        let svc = Service::new(std::env::temp_dir()).unwrap();
        let mut p = plan("true");
        p.cwd = CString::new("/nonexistent/dir").unwrap();
        match svc.spawn(&p, cfg(10)) {
            Err(CoreError::Spawn(e)) => {
                assert_eq!(e.stage, crate::errors::SpawnStage::Chdir);
                assert_eq!(e.errno, libc::ENOENT);
            }
            _ => panic!("expected a chdir spawn error"),
        }
        svc.dispose(false);
    }
}
