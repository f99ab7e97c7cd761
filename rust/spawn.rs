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

thread_local! {
    /// This thread's held `/proc/self/status`, with the pid it was opened for: a forked
    /// copy of the harness (another pid) opens its own. Per thread, so that concurrent
    /// spawns never wait on each other for it.
    static STATUS: std::cell::RefCell<Option<(libc::pid_t, std::fs::File)>> =
        const { std::cell::RefCell::new(None) };
}

/// `SigIgn` from this process's status file; None when it cannot be read or parsed.
fn ignored_from_status() -> Option<u64> {
    use std::os::unix::fs::FileExt;
    let pid = crate::sys::getpid();
    STATUS
        .try_with(|cell| {
            let mut held = cell.try_borrow_mut().ok()?;
            if held.as_ref().map(|(opened_for, _)| *opened_for) != Some(pid) {
                // `self`, not the number: a `/proc` of another pid namespace may give our
                // number to another process, but never resolves `self` to one.
                let file = std::fs::File::open("/proc/self/status").ok()?;
                *held = Some((pid, file));
            }
            let (_, file) = held.as_ref()?;
            let mut buf = [0u8; 4096];
            let n = file.read_at(&mut buf, 0).ok()?;
            parse_sigign(buf.get(..n)?)
        })
        .ok()
        .flatten()
}

/// The `SigIgn:` mask of a status file's text (hex, bit `n - 1` for signal `n`).
fn parse_sigign(status: &[u8]) -> Option<u64> {
    const KEY: &[u8] = b"\nSigIgn:\t";
    let at = status.windows(KEY.len()).position(|w| w == KEY)? + KEY.len();
    let rest = status.get(at..)?;
    let hex = &rest[..rest.iter().position(|&b| b == b'\n')?];
    u64::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()
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

/// The clone itself, with every signal blocked by the caller.
fn clone_raw(
    cgroup: Option<RawFd>,
    known_ignored: Option<u64>,
    key: Option<Clone3Key>,
    args: &mut ChildArgs,
    top: *mut c_void,
    pidfd: &mut libc::c_int,
) -> (libc::pid_t, io::Error) {
    if let Some(fd) = cgroup {
        let mut ret = -(libc::EINVAL as libc::c_long);
        if CLEAR_SIGHAND.load(Ordering::Relaxed) {
            args.handlers_cleared = true;
            args.ignored = known_ignored.unwrap_or_else(ignored_signals);
            let arg = args as *mut ChildArgs as *mut c_void;
            // SAFETY: as for clone below; `args` and the stack outlive the child's exec.
            ret = unsafe { clone3_into(fd, top, child_main, arg, pidfd, true, key) };
            if ret == -(libc::EINVAL as libc::c_long) {
                // A kernel before 5.5 knows no CLONE_CLEAR_SIGHAND: the child resets all.
                CLEAR_SIGHAND.store(false, Ordering::Relaxed);
            }
        }
        if ret == -(libc::EINVAL as libc::c_long) {
            args.handlers_cleared = false;
            let arg = args as *mut ChildArgs as *mut c_void;
            // SAFETY: as above.
            ret = unsafe { clone3_into(fd, top, child_main, arg, pidfd, false, key) };
        }
        if ret >= 0 {
            return (ret as libc::pid_t, io::Error::from_raw_os_error(0));
        }
        let errno = (-ret) as i32;
        if errno != libc::ENOSYS && errno != libc::E2BIG {
            return (-1, io::Error::from_raw_os_error(errno));
        }
        args.handlers_cleared = false;
        args.contain = args.contain.with_join_v2(fd);
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
    fn sigign_is_parsed_or_refused() {
        let status =
            b"Name:\tx\nSigPnd:\t0000000000000000\nSigIgn:\t0000000000001000\nSigCgt:\t1\n";
        assert_eq!(parse_sigign(status), Some(0x1000));
        assert_eq!(parse_sigign(b"Name:\tx\nSigIgn:\t00000000000010"), None);
        assert_eq!(parse_sigign(b"Name:\tx\nSigIgn:\tzz\n"), None);
        assert_eq!(
            parse_sigign(b"SigIgn:\t1\n"),
            None,
            "a key mid-line is not the line"
        );
        assert_eq!(parse_sigign(b""), None);
    }
}
