//! Spawning a child with vfork semantics: `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)`.
//!
//! Agent harnesses hold GiBs of memory, so the harness is never forked: the child borrows
//! the parent's address space until it calls `execve`. Everything the child needs — argv,
//! envp, the working directory, the stdio fds, the Landlock ruleset fd — is prepared in the
//! parent as C data; the child runs only raw, async-signal-safe syscalls on that memory and
//! reports a failure before exec (stage + errno) in that memory, so spawn errors are exact
//! and a refused sandbox is told apart from the command's own failure.

use std::ffi::{c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::child::{child_main, ChildArgs, ChildConfinement};
use crate::clone::{clone3_into, ChildContain};
use crate::confine::Confinement;
use crate::errors::{SpawnError, SpawnStage};
use crate::pipes::{above_stdio, cloexec_pipe, set_nonblocking};
use crate::seccomp::Clone3Key;

/// Size of the child's stack while it runs between clone and exec (a guard page below it).
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// The fd a long command's script is read from (`bash /dev/fd/3`, see `SpawnPlan::script`).
pub const SCRIPT_FD: RawFd = 3;

/// What the spawning thread carries of a confined child's seccomp filter (see `spawner.rs`
/// and `seccomp.rs`), which the child inherits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InheritedFilter {
    /// Nothing: the child installs the whole filter.
    None,
    /// The base layer: the child stacks the `clone3` layer on it.
    Base,
    /// The whole filter with `clone3` keyed: the child installs nothing, and the spawn
    /// passes the key to `clone3`.
    Keyed(Clone3Key),
}

impl InheritedFilter {
    fn clone3_key(self) -> Option<Clone3Key> {
        match self {
            Self::Keyed(key) => Some(key),
            Self::None | Self::Base => None,
        }
    }
}

/// Everything one spawn needs, owned by the parent for the duration of the call.
pub struct SpawnPlan {
    pub program: CString,
    pub argv: Vec<CString>,
    /// `NAME=value` entries, shared so that a cached environment is not copied per spawn.
    pub envp: std::sync::Arc<Vec<CString>>,
    pub cwd: CString,
    /// What a confined child applies before exec (see `confine.rs`); None: unconfined.
    pub confinement: Option<std::sync::Arc<Confinement>>,
    /// A sealed memfd holding a command too long for one argument; the child gets it as
    /// fd `SCRIPT_FD` (not close-on-exec) and argv names `/dev/fd/3`.
    pub script: Option<RawFd>,
    /// Containment (see `clone.rs`): the cgroup v2 directory the child is cloned into,
    /// the v1 cgroup directories it joins before exec, and the rlimits it sets.
    pub cgroup: Option<RawFd>,
    pub join_cgroups: Vec<RawFd>,
    /// `(resource, soft, hard)`.
    pub rlimits: Vec<(u32, u64, u64)>,
    /// The spawning thread's bounding set is already empty and its securebits locked (the
    /// confined spawner, see `spawner.rs`): the child inherits both instead of dropping.
    pub bounding_set_cleared: bool,
    /// What the spawning thread carries of the confinement's seccomp filter (the confined
    /// spawner), for the child to inherit.
    pub inherited_filter: InheritedFilter,
    /// The signals the harness ignores (see `ignored_signals`), read by the requesting
    /// thread before it handed the spawn to a confined spawner, whose every syscall runs
    /// through its filter; None: read by the spawning thread when it needs them.
    pub ignored_signals: Option<u64>,
}

impl SpawnPlan {
    /// A plan to run `program` unconfined and uncontained (set the other fields to add).
    pub fn new(
        program: CString,
        argv: Vec<CString>,
        envp: std::sync::Arc<Vec<CString>>,
        cwd: CString,
    ) -> Self {
        Self {
            program,
            argv,
            envp,
            cwd,
            confinement: None,
            script: None,
            cgroup: None,
            join_cgroups: Vec::new(),
            rlimits: Vec::new(),
            bounding_set_cleared: false,
            inherited_filter: InheritedFilter::None,
            ignored_signals: None,
        }
    }

    /// What is left of a plan handed to another thread (nothing: it is not used again).
    pub(crate) fn handed_over() -> Self {
        Self::new(
            CString::default(),
            Vec::new(),
            std::sync::Arc::default(),
            CString::default(),
        )
    }
}

/// The parent's ends of the child's stdio pipes.
pub struct ParentPipes {
    /// None once closed early: a foreground spawn with nothing to write (see
    /// `Service::spawn_child`).
    pub stdin: Option<OwnedFd>,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// A freshly spawned process-group leader.
pub struct Spawned {
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
    pub pipes: ParentPipes,
}

/// The child's stack: an anonymous mapping with a PROT_NONE guard page below it, kept per
/// thread (spawns on one thread are sequential: CLONE_VFORK suspends it until exec).
struct ChildStack {
    base: *mut c_void,
    len: usize,
    guard: usize,
}

impl ChildStack {
    fn new() -> io::Result<Self> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = CHILD_STACK_BYTES + page;
        // SAFETY: a fresh private anonymous mapping; checked for MAP_FAILED below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Self {
            base,
            len,
            guard: page,
        };
        // SAFETY: the lowest page of our own mapping becomes inaccessible: an overflow of
        // the child's stack faults instead of writing into the harness's memory.
        if unsafe { libc::mprotect(base, page, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The 16-byte aligned top (stacks grow down on every architecture we build for).
    fn top(&self) -> *mut c_void {
        ((self.base as usize + self.len) & !0xf) as *mut c_void
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `new`, no longer used by any child.
        unsafe {
            libc::munmap(self.base, self.len);
        }
        let _ = self.guard;
    }
}

thread_local! {
    static CHILD_STACK: std::cell::RefCell<Option<ChildStack>> =
        const { std::cell::RefCell::new(None) };
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    let mut ptrs: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    ptrs
}

/// The child's ends of its stdio pipes (stdin's read end, stdout's and stderr's write ends),
/// above the stdio range; closed once the child has them.
pub struct ChildEnds(OwnedFd, OwnedFd, OwnedFd);

/// A child's stdio pipes: its ends, and ours (non-blocking).
pub fn make_pipes() -> Result<(ChildEnds, ParentPipes), SpawnError> {
    let pipe_err = |e: io::Error| SpawnError::from_io(SpawnStage::Pipes, &e);
    let (stdin_r, stdin_w) = cloexec_pipe().map_err(pipe_err)?;
    let (stdout_r, stdout_w) = cloexec_pipe().map_err(pipe_err)?;
    let (stderr_r, stderr_w) = cloexec_pipe().map_err(pipe_err)?;
    let stdin_r = above_stdio(stdin_r).map_err(pipe_err)?;
    let stdout_w = above_stdio(stdout_w).map_err(pipe_err)?;
    let stderr_w = above_stdio(stderr_w).map_err(pipe_err)?;
    for fd in [&stdin_w, &stdout_r, &stderr_r] {
        set_nonblocking(fd).map_err(pipe_err)?;
    }
    let ours = ParentPipes {
        stdin: Some(stdin_w),
        stdout: stdout_r,
        stderr: stderr_r,
    };
    Ok((ChildEnds(stdin_r, stdout_w, stderr_w), ours))
}

/// Spawns `plan` as the leader of a new process group with piped stdio.
pub fn spawn(plan: &SpawnPlan) -> Result<Spawned, SpawnError> {
    let (child_ends, pipes) = make_pipes()?;
    let (pid, pidfd) = spawn_with(plan, child_ends)?;
    Ok(Spawned { pid, pidfd, pipes })
}

/// Spawns `plan` on stdio pipes made beforehand (`make_pipes`): the pid and pidfd. The
/// child's ends are closed here, whatever happens.
pub fn spawn_with(
    plan: &SpawnPlan,
    child_ends: ChildEnds,
) -> Result<(libc::pid_t, OwnedFd), SpawnError> {
    let ChildEnds(stdin_r, stdout_w, stderr_w) = child_ends;
    let argv = null_terminated(&plan.argv);
    let envp = null_terminated(&plan.envp);
    let args = ChildArgs {
        program: plan.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: plan.cwd.as_ptr(),
        stdio: [
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ],
        report: AtomicU64::new(0),
        script_fd: plan.script.unwrap_or(-1),
        handlers_cleared: false,
        ignored: 0,
        confine: ChildConfinement::from_plan(
            plan.confinement.as_deref(),
            plan.bounding_set_cleared,
            plan.inherited_filter,
        ),
        contain: ChildContain::new(&plan.join_cgroups, &plan.rlimits),
    };
    let mut args = args;

    CHILD_STACK
        .with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(
                    ChildStack::new().map_err(|e| SpawnError::from_io(SpawnStage::Clone, &e))?,
                );
            }
            match slot.as_ref() {
                Some(stack) => {
                    let key = plan.inherited_filter.clone3_key();
                    clone_child(
                        plan.cgroup,
                        plan.ignored_signals,
                        key,
                        &mut args,
                        stack.top(),
                    )
                }
                None => Err(SpawnError::new(SpawnStage::Clone, libc::ENOMEM)),
            }
        })
        .and_then(|(pid, pidfd)| {
            drop((stdin_r, stdout_w, stderr_w));
            finish_spawn(pid, pidfd, args.report.load(Ordering::Acquire))
        })
}

/// Clones the child on `top` and returns (pid, pidfd); the parent resumes after exec/exit.
/// With a cgroup, the child is cloned straight into it (`clone3(CLONE_INTO_CGROUP)`); a
/// kernel without clone3 gets a plain clone and the child joins the cgroup itself first.
fn clone_child(
    cgroup: Option<RawFd>,
    known_ignored: Option<u64>,
    key: Option<Clone3Key>,
    args: &mut ChildArgs,
    top: *mut c_void,
) -> Result<(libc::pid_t, OwnedFd), SpawnError> {
    let mut pidfd: libc::c_int = -1;

    // Block every signal while the child shares our memory: a handler of the harness must
    // never run on the child's stack. The child resets dispositions before unblocking.
    // SAFETY: sigset_t values are plain data initialised by sigfillset/pthread_sigmask.
    let mut all: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut saved: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to sigset_t values owned by this frame.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut saved);
    }
    let (pid, clone_error) = clone_raw(cgroup, known_ignored, key, args, top, &mut pidfd);
    // SAFETY: restores the mask saved above on this thread.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
    }
    if pid < 0 {
        return Err(SpawnError::from_io(SpawnStage::Clone, &clone_error));
    }
    // SAFETY: clone succeeded with CLONE_PIDFD, so `pidfd` is a fresh fd we own.
    Ok((pid, unsafe { OwnedFd::from_raw_fd(pidfd) }))
}

/// Whether clone3 takes CLONE_CLEAR_SIGHAND here (until it refused once).
static CLEAR_SIGHAND: AtomicBool = AtomicBool::new(true);

/// The signals this process ignores now, bit `n - 1` for signal `n`: what a child cloned
/// with CLONE_CLEAR_SIGHAND still has to reset (the kernel resets the handled ones). A
/// disposition another thread changes while a spawn is under way is a race of that thread
/// with the spawn, as with fork: a handler is never inherited (the kernel clears it at the
/// clone), an ignored signal set in that instant may be.
///
/// Read fresh at every spawn (a disposition changed since the last one must not be missed)
/// from the `SigIgn` line of this process's status file, one `pread` on a held fd: ~8 us
/// here, where asking the kernel signal by signal takes 62 `rt_sigaction` calls, ~17 us.
/// The loop remains for a process without a readable `/proc`.
pub(crate) fn ignored_signals() -> u64 {
    ignored_from_status().unwrap_or_else(ignored_by_sigaction)
}

/// Spawns queued to spawner threads, numbered as they are queued (see `ignored_signals_for`).
static QUEUED_SPAWNS: AtomicU64 = AtomicU64::new(0);
/// The latest read of the ignored signals: `(n, mask)`, good for every queued spawn
/// numbered below `n`.
static IGNORED_READ: Mutex<Option<(u64, u64)>> = Mutex::new(None);

/// Numbers a spawn as it is queued, on the requesting thread.
pub(crate) fn number_queued_spawn() -> u64 {
    QUEUED_SPAWNS.fetch_add(1, Ordering::SeqCst)
}

/// The ignored signals for the queued spawn numbered `seq`. A read that begins after a
/// spawn was queued sees every disposition its caller set before queueing it, which is all
/// that reading fresh at every spawn promises (a change made while the spawn waits races
/// with it either way): one read serves every spawn queued before it began, so a burst of
/// 64 runs reads the status file a few times instead of 64 (~14 us each under that load).
/// The cache is only ever `try_lock`ed: a forked copy of the harness, where the lock may
/// have been held by a thread that is gone, reads fresh instead of waiting.
pub(crate) fn ignored_signals_for(seq: u64) -> u64 {
    if let Ok(last) = IGNORED_READ.try_lock() {
        if let Some((covers, mask)) = *last {
            if seq < covers {
                return mask;
            }
        }
    }
    let covers = QUEUED_SPAWNS.load(Ordering::SeqCst);
    let mask = ignored_signals();
    if let Ok(mut last) = IGNORED_READ.try_lock() {
        if last.is_none_or(|(newest, _)| covers > newest) {
            *last = Some((covers, mask));
        }
    }
    mask
}

/// The process's held `/proc/self/status`: `(pid << 32) | fd`, 0 while none. One fd for the
/// whole process (every thread `pread`s it at offset 0); a forked copy of the harness, with
/// another pid, opens its own.
static STATUS_FD: AtomicU64 = AtomicU64::new(0);
/// The status file did not describe this process even when just opened (a `/proc` of
/// another pid namespace): the kernel is asked signal by signal from then on.
static STATUS_UNUSABLE: AtomicBool = AtomicBool::new(false);

/// `SigIgn` from this process's status file; None when it cannot be read, parsed, or is
/// not this process's.
fn ignored_from_status() -> Option<u64> {
    if STATUS_UNUSABLE.load(Ordering::Relaxed) {
        return None;
    }
    let pid = crate::sys::getpid();
    let held = STATUS_FD.load(Ordering::Acquire);
    if held != 0 && (held >> 32) as u32 == pid as u32 {
        if let Some(ignored) = read_sigign(held as u32 as RawFd, pid) {
            return Some(ignored);
        }
        // The fd no longer shows our status (closed behind our back, its number reused):
        // not ours to close.
        return reopen_status(pid, held, false);
    }
    // None yet, or inherited from the process we were forked from: ours to close.
    reopen_status(pid, held, held != 0)
}

/// Opens `/proc/self/status` in place of `held` and reads it; a status that is not this
/// process's even now marks the file unusable.
fn reopen_status(pid: libc::pid_t, held: u64, close_held: bool) -> Option<u64> {
    // `self`, not the number: a `/proc` of another pid namespace may give our number to
    // another process, but never resolves `self` to one.
    let file = std::fs::File::open("/proc/self/status").ok()?;
    let fd = std::os::fd::IntoRawFd::into_raw_fd(file);
    let packed = (u64::from(pid as u32) << 32) | u64::from(fd as u32);
    match STATUS_FD.compare_exchange(held, packed, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            if close_held {
                // SAFETY: the fd inherited from our parent process's entry, ours to close;
                // no other thread of this process reads it (its pid is not ours).
                unsafe { libc::close(held as u32 as RawFd) };
            }
        }
        Err(_) => {
            // Another thread opened one first: read ours once, then let it go.
            let ignored = read_sigign(fd, pid);
            // SAFETY: `fd` was opened above and never published.
            unsafe { libc::close(fd) };
            return ignored;
        }
    }
    let ignored = read_sigign(fd, pid);
    if ignored.is_none() {
        STATUS_UNUSABLE.store(true, Ordering::Relaxed);
    }
    ignored
}

/// `SigIgn` of the status file open as `fd`, if it describes process `pid`.
fn read_sigign(fd: RawFd, pid: libc::pid_t) -> Option<u64> {
    let mut buf = [0u8; 4096];
    // SAFETY: pread into a buffer of the given length; an fd that is not (or no longer) a
    // status file fails or reads something `status_field` or the Tgid check refuses.
    let n = unsafe { libc::pread(fd, buf.as_mut_ptr() as *mut c_void, buf.len(), 0) };
    let status = buf.get(..usize::try_from(n).ok()?)?;
    if status_field(status, b"Tgid")?.parse::<libc::pid_t>().ok()? != pid {
        return None;
    }
    u64::from_str_radix(status_field(status, b"SigIgn")?, 16).ok()
}

/// The value of the status file line `<key>:\t<value>` (the first line is `Name:`, so a
/// key is always preceded by a newline).
fn status_field<'a>(status: &'a [u8], key: &[u8]) -> Option<&'a str> {
    let at = status
        .windows(key.len() + 3)
        .position(|w| w[0] == b'\n' && &w[1..=key.len()] == key && &w[key.len() + 1..] == b":\t")?
        + key.len()
        + 3;
    let rest = status.get(at..)?;
    std::str::from_utf8(&rest[..rest.iter().position(|&b| b == b'\n')?]).ok()
}

/// The ignored signals, asked of the kernel one by one.
fn ignored_by_sigaction() -> u64 {
    let mut ignored = 0u64;
    for sig in 1..65 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // The kernel's struct sigaction starts with the handler; the rest is not read.
        let mut old = [0 as libc::c_ulong; 4];
        // SAFETY: a query (no new action) into memory of the kernel's struct size for
        // x86_64/aarch64/riscv64 (handler, flags, restorer, mask: four words). The raw call
        // because glibc's sigaction refuses its two internal signals.
        let got = unsafe {
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                std::ptr::null::<c_void>(),
                old.as_mut_ptr(),
                8usize,
            )
        };
        if got == 0 && old[0] == libc::SIG_IGN as libc::c_ulong {
            ignored |= 1u64 << (sig - 1);
        }
    }
    ignored
}

/// Whether clone3 exists here for a child outside any cgroup (until it said ENOSYS once:
/// an old kernel, or a container runtime's filter).
static CLONE3: AtomicBool = AtomicBool::new(true);

/// The clone itself, with every signal blocked by the caller. clone3 whenever the kernel
/// has it, with or without a cgroup: `CLONE_CLEAR_SIGHAND` spares the child resetting every
/// handled signal (62 `rt_sigaction` calls, 20-30 us here).
fn clone_raw(
    cgroup: Option<RawFd>,
    known_ignored: Option<u64>,
    key: Option<Clone3Key>,
    args: &mut ChildArgs,
    top: *mut c_void,
    pidfd: &mut libc::c_int,
) -> (libc::pid_t, io::Error) {
    if cgroup.is_some() || CLONE3.load(Ordering::Relaxed) {
        let mut ret = -(libc::EINVAL as libc::c_long);
        if CLEAR_SIGHAND.load(Ordering::Relaxed) {
            args.handlers_cleared = true;
            args.ignored = known_ignored.unwrap_or_else(ignored_signals);
            let arg = args as *mut ChildArgs as *mut c_void;
            // SAFETY: as for clone below; `args` and the stack outlive the child's exec.
            ret = unsafe { clone3_into(cgroup, top, child_main, arg, pidfd, true, key) };
            if ret == -(libc::EINVAL as libc::c_long) {
                // A kernel before 5.5 knows no CLONE_CLEAR_SIGHAND: the child resets all.
                CLEAR_SIGHAND.store(false, Ordering::Relaxed);
            }
        }
        if ret == -(libc::EINVAL as libc::c_long) {
            args.handlers_cleared = false;
            let arg = args as *mut ChildArgs as *mut c_void;
            // SAFETY: as above.
            ret = unsafe { clone3_into(cgroup, top, child_main, arg, pidfd, false, key) };
        }
        if ret >= 0 {
            return (ret as libc::pid_t, io::Error::from_raw_os_error(0));
        }
        let errno = (-ret) as i32;
        // ENOSYS: no clone3 here (an old kernel, or a container runtime's filter; glibc's
        // own threads need such a filter to answer ENOSYS too, not EPERM).
        if errno != libc::ENOSYS && errno != libc::E2BIG {
            return (-1, io::Error::from_raw_os_error(errno));
        }
        args.handlers_cleared = false;
        match cgroup {
            Some(fd) => args.contain = args.contain.with_join_v2(fd),
            None => CLONE3.store(false, Ordering::Relaxed),
        }
    }
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: `child_main` only performs raw syscalls on `args`, which (with argv/envp/plan
    // and the stack) outlives the call: CLONE_VFORK suspends us until the child has exec'd
    // or exited. CLONE_PIDFD stores the pidfd through the parent-tid pointer.
    let pid = unsafe {
        libc::clone(
            child_main,
            top,
            flags,
            args as *mut ChildArgs as *mut c_void,
            pidfd as *mut libc::c_int,
        )
    };
    (pid, io::Error::last_os_error())
}

/// After the child exec'd or failed: reads its report.
fn finish_spawn(
    pid: libc::pid_t,
    pidfd: OwnedFd,
    report: u64,
) -> Result<(libc::pid_t, OwnedFd), SpawnError> {
    if report != 0 {
        crate::sys::reap_blocking(pid);
        let (stage, errno) = ((report >> 32) as u32, report as u32 as i32);
        return Err(SpawnError::new(SpawnStage::from_code(stage), errno));
    }
    Ok((pid, pidfd))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_file_and_the_kernel_agree_on_ignored_signals() {
        let rt = libc::SIGRTMIN() + 5;
        let set = |sig: libc::c_int, handler: libc::sighandler_t| {
            // SAFETY: installs SIG_IGN or SIG_DFL, no handler code.
            unsafe { libc::signal(sig, handler) }
        };
        let before = (set(libc::SIGUSR1, libc::SIG_IGN), set(rt, libc::SIG_IGN));
        let from_status = ignored_from_status();
        let asked = ignored_by_sigaction();
        set(libc::SIGUSR1, before.0);
        set(rt, before.1);
        assert_eq!(from_status, Some(asked));
        assert_ne!(asked & (1 << (libc::SIGUSR1 - 1)), 0);
        assert_ne!(asked & (1 << (rt - 1)), 0);
        // And again, now that both are back: the held fd answers for now, not for then.
        assert_eq!(ignored_from_status(), Some(ignored_by_sigaction()));
    }

    #[test]
    fn status_fields_are_parsed_or_refused() {
        let status = b"Name:\tx\nTgid:\t42\nSigPnd:\t0\nSigIgn:\t0000000000001000\nSigCgt:\t1\n";
        assert_eq!(status_field(status, b"SigIgn"), Some("0000000000001000"));
        assert_eq!(status_field(status, b"Tgid"), Some("42"));
        assert_eq!(
            status_field(b"Name:\tx\nSigIgn:\t00000000000010", b"SigIgn"),
            None
        );
        assert_eq!(
            status_field(b"SigIgn:\t1\n", b"SigIgn"),
            None,
            "mid-line is not a line"
        );
        assert_eq!(status_field(b"Name:\tx\nXSigIgn:\t1\n", b"SigIgn"), None);
        assert_eq!(status_field(b"", b"SigIgn"), None);
    }

    #[test]
    fn a_status_fd_that_is_not_ours_is_never_believed() {
        let file = std::fs::File::open("/proc/self/status").expect("status");
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let pid = crate::sys::getpid();
        assert!(read_sigign(fd, pid).is_some());
        assert_eq!(read_sigign(fd, pid + 1), None, "another Tgid");
        let (r, _w) = nix::unistd::pipe().expect("pipe");
        assert_eq!(read_sigign(std::os::fd::AsRawFd::as_raw_fd(&r), pid), None);
        assert_eq!(read_sigign(-1, pid), None);
    }
}
