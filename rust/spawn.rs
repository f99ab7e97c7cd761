//! Spawning a child with vfork semantics: `clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD)`.
//!
//! Agent harnesses hold GiBs of memory, so the harness is never forked: the child borrows
//! the parent's address space until it calls `execve`. Everything the child needs — argv,
//! envp, the working directory, the stdio fds, the Landlock ruleset fd — is prepared in the
//! parent as C data; the child runs only raw, async-signal-safe syscalls on that memory and
//! reports a failure before exec (stage + errno) through a close-on-exec pipe, so spawn
//! errors are exact and a refused sandbox is told apart from the command's own failure.

use std::ffi::{c_void, CString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::confine::{CapData, CapHeader, Confinement, LOCKED_SECUREBITS};
use crate::errors::{SpawnError, SpawnStage};
use crate::pipes::{above_stdio, cloexec_pipe, set_nonblocking};

/// Size of the child's stack while it runs between clone and exec (a guard page below it).
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// The fd a long command's script is read from (`bash /dev/fd/3`, see `SpawnPlan::script`).
pub const SCRIPT_FD: RawFd = 3;

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
}

/// The parent's ends of the child's stdio pipes.
pub struct ParentPipes {
    pub stdin: OwnedFd,
    pub stdout: OwnedFd,
    pub stderr: OwnedFd,
}

/// A freshly spawned process-group leader.
pub struct Spawned {
    pub pid: libc::pid_t,
    pub pidfd: OwnedFd,
    pub pipes: ParentPipes,
}

/// Raw data the child reads. Built in the parent; every pointer stays valid until clone
/// returns, which under CLONE_VFORK is after the child has exec'd or exited.
#[repr(C)]
struct ChildArgs {
    program: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    cwd: *const libc::c_char,
    stdio: [RawFd; 3],
    report_fd: RawFd,
    /// Highest fd to mark close-on-exec when `close_range` is unavailable.
    max_fd: RawFd,
    script_fd: RawFd,
    confine: ChildConfinement,
}

/// The confinement steps of the child, as raw data (`active == false`: unconfined).
#[repr(C)]
struct ChildConfinement {
    active: bool,
    /// Clear the bounding set and lock securebits (the harness holds CAP_SETPCAP).
    privileged: bool,
    last_cap: libc::c_int,
    cap_header: CapHeader,
    cap_data: [CapData; 2],
    landlock_fd: RawFd,
    filter: libc::sock_fprog,
}

impl ChildConfinement {
    fn from_plan(confinement: Option<&Confinement>) -> Self {
        let mut c = Self {
            active: false,
            privileged: false,
            last_cap: 0,
            cap_header: CapHeader {
                version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
                pid: 0,
            },
            cap_data: [CapData::default(); 2],
            landlock_fd: -1,
            filter: libc::sock_fprog {
                len: 0,
                filter: std::ptr::null_mut(),
            },
        };
        if let Some(conf) = confinement {
            c.active = true;
            c.privileged = conf.caps.can_setpcap;
            c.last_cap = conf.caps.last_cap;
            c.landlock_fd = conf.landlock_fd();
            c.filter = conf.filter_prog();
        }
        c
    }
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

/// Spawns `plan` as the leader of a new process group with piped stdio.
pub fn spawn(plan: &SpawnPlan) -> Result<Spawned, SpawnError> {
    let pipe_err = |e: io::Error| SpawnError::from_io(SpawnStage::Pipes, &e);
    let (stdin_r, stdin_w) = cloexec_pipe().map_err(pipe_err)?;
    let (stdout_r, stdout_w) = cloexec_pipe().map_err(pipe_err)?;
    let (stderr_r, stderr_w) = cloexec_pipe().map_err(pipe_err)?;
    let (report_r, report_w) = cloexec_pipe().map_err(pipe_err)?;
    let stdin_r = above_stdio(stdin_r).map_err(pipe_err)?;
    let stdout_w = above_stdio(stdout_w).map_err(pipe_err)?;
    let stderr_w = above_stdio(stderr_w).map_err(pipe_err)?;
    let report_w = above_stdio(report_w).map_err(pipe_err)?;
    for fd in [&stdin_w, &stdout_r, &stderr_r] {
        set_nonblocking(fd).map_err(pipe_err)?;
    }

    let argv = null_terminated(&plan.argv);
    let envp = null_terminated(&plan.envp);
    // SAFETY: sysconf has no memory-safety preconditions.
    let open_max = unsafe { libc::sysconf(libc::_SC_OPEN_MAX) };
    let mut args = ChildArgs {
        program: plan.program.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        cwd: plan.cwd.as_ptr(),
        stdio: [
            stdin_r.as_raw_fd(),
            stdout_w.as_raw_fd(),
            stderr_w.as_raw_fd(),
        ],
        report_fd: report_w.as_raw_fd(),
        max_fd: open_max.clamp(1024, 1 << 20) as RawFd,
        script_fd: plan.script.unwrap_or(-1),
        confine: ChildConfinement::from_plan(plan.confinement.as_deref()),
    };
    // The header is read by the child through a pointer into `args`.
    args.confine.cap_header.pid = 0;

    CHILD_STACK
        .with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.is_none() {
                *slot = Some(
                    ChildStack::new().map_err(|e| SpawnError::from_io(SpawnStage::Clone, &e))?,
                );
            }
            match slot.as_ref() {
                Some(stack) => clone_child(&args, stack.top()),
                None => Err(SpawnError::new(SpawnStage::Clone, libc::ENOMEM)),
            }
        })
        .and_then(|(pid, pidfd)| {
            finish_spawn(
                pid,
                pidfd,
                report_r,
                report_w,
                (stdin_r, stdout_w, stderr_w),
                (stdin_w, stdout_r, stderr_r),
            )
        })
}

/// Clones the child on `top` and returns (pid, pidfd); the parent resumes after exec/exit.
fn clone_child(args: &ChildArgs, top: *mut c_void) -> Result<(libc::pid_t, OwnedFd), SpawnError> {
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
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: `child_main` only performs raw syscalls on `args`, which (with argv/envp/plan
    // and `stack`) outlives the call: CLONE_VFORK suspends us until the child has exec'd or
    // exited. CLONE_PIDFD stores the pidfd through the parent-tid pointer.
    let pid = unsafe {
        libc::clone(
            child_main,
            top,
            flags,
            args as *const ChildArgs as *mut c_void,
            &mut pidfd as *mut libc::c_int,
        )
    };
    let clone_error = io::Error::last_os_error();
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

/// After the child exec'd or failed: closes the child's ends and reads its report.
fn finish_spawn(
    pid: libc::pid_t,
    pidfd: OwnedFd,
    report_r: OwnedFd,
    report_w: OwnedFd,
    child_ends: (OwnedFd, OwnedFd, OwnedFd),
    parent_ends: (OwnedFd, OwnedFd, OwnedFd),
) -> Result<Spawned, SpawnError> {
    let (stdin_w, stdout_r, stderr_r) = parent_ends;
    // The child has exec'd (its copy of the report pipe closed on exec) or exited; drop our
    // write end and read whatever it reported.
    drop(report_w);
    drop(child_ends);
    if let Some(err) = read_report(&report_r) {
        reap_failed_child(pid);
        return Err(err);
    }
    Ok(Spawned {
        pid,
        pidfd,
        pipes: ParentPipes {
            stdin: stdin_w,
            stdout: stdout_r,
            stderr: stderr_r,
        },
    })
}

/// Reads the child's 8-byte failure report, if it sent one.
fn read_report(fd: &OwnedFd) -> Option<SpawnError> {
    let mut buf = [0u8; 8];
    let mut got = 0usize;
    while got < buf.len() {
        // SAFETY: reads into the unfilled tail of `buf`, within bounds.
        let n = unsafe {
            libc::read(
                fd.as_raw_fd(),
                buf[got..].as_mut_ptr() as *mut c_void,
                buf.len() - got,
            )
        };
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if n == 0 {
            break;
        }
        got += n as usize;
    }
    if got < buf.len() {
        return None;
    }
    let stage = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let errno = i32::from_ne_bytes([buf[4], buf[5], buf[6], buf[7]]);
    Some(SpawnError::new(SpawnStage::from_code(stage), errno))
}

fn reap_failed_child(pid: libc::pid_t) {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child; `status` is a valid out-pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
}

/// Raw syscall returning the kernel's `-errno` convention as `Err(errno)`.
///
/// `libc::syscall` stores errno in the calling thread's TLS, which the child shares with the
/// suspended parent thread; reading it right away is async-signal-safe.
#[inline(always)]
fn sys(ret: libc::c_long) -> Result<libc::c_long, i32> {
    if ret < 0 {
        // SAFETY: __errno_location always returns this thread's errno slot.
        Err(unsafe { *libc::__errno_location() })
    } else {
        Ok(ret)
    }
}

/// The child between clone and exec: raw syscalls only, no allocation, no locks.
extern "C" fn child_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` points at the parent's ChildArgs, alive until we exec or exit; the
    // parent is suspended (CLONE_VFORK) and every pointer in it was prepared for us.
    let (stage, errno) = unsafe { child_setup(&*(arg as *const ChildArgs)) };
    // Only reached on failure: execve does not return on success.
    let mut report = [0u8; 8];
    report[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    report[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: raw write of a stack buffer, then exit_group; no Rust runtime involved.
    unsafe {
        let args = &*(arg as *const ChildArgs);
        libc::syscall(
            libc::SYS_write,
            args.report_fd,
            report.as_ptr(),
            report.len(),
        );
        libc::syscall(libc::SYS_exit_group, 127);
    }
    127
}

/// Fails the setup at `stage` with the errno of the syscall that just failed.
macro_rules! check {
    ($ret:expr, $stage:expr) => {
        if let Err(errno) = sys($ret) {
            return ($stage, errno);
        }
    };
}

/// Every step between clone and exec; returns the failed stage and its errno (read once,
/// right after the failing syscall). Does not return when `execve` succeeds.
///
/// # Safety
/// Must run only in a child created by `clone(CLONE_VM | CLONE_VFORK)` from `spawn`, on the
/// guarded child stack, with `args` (and everything it points to: argv, envp, the cwd, the
/// seccomp filter) alive and unchanged until the child execs or exits, which CLONE_VFORK
/// guarantees by suspending the parent. Only raw, async-signal-safe syscalls are made: no
/// allocation, no locks, no Rust runtime.
unsafe fn child_setup(args: &ChildArgs) -> (SpawnStage, i32) {
    // Reset every disposition: the harness may ignore SIGPIPE (CPython does) or handle
    // signals; an ignored disposition would survive exec. Signals stay blocked meanwhile.
    let dfl: [libc::c_ulong; 4] = [libc::SIG_DFL as libc::c_ulong, 0, 0, 0];
    for sig in 1..65 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        libc::syscall(
            libc::SYS_rt_sigaction,
            sig,
            dfl.as_ptr(),
            std::ptr::null::<c_void>(),
            8usize,
        );
    }
    let empty: libc::c_ulong = 0;
    check!(
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const libc::c_ulong,
            std::ptr::null::<c_void>(),
            8usize,
        ),
        SpawnStage::Signals
    );

    // A new session: its own process group and no controlling terminal, so nothing the
    // command runs can read, inject into or take over the harness's terminal.
    check!(libc::syscall(libc::SYS_setsid), SpawnStage::ProcessGroup);
    for (target, &fd) in args.stdio.iter().enumerate() {
        // dup3 (aarch64 has no dup2); the sources are above stdio, so never equal.
        check!(
            libc::syscall(libc::SYS_dup3, fd, target as libc::c_int, 0),
            SpawnStage::Stdio
        );
    }
    check!(libc::syscall(libc::SYS_chdir, args.cwd), SpawnStage::Chdir);

    // Nothing of the harness leaks: every fd above stdio closes on exec.
    let marked = sys(libc::syscall(
        libc::SYS_close_range,
        3u32,
        u32::MAX,
        libc::CLOSE_RANGE_CLOEXEC,
    ));
    if marked.is_err() {
        for fd in 3..=args.max_fd {
            libc::syscall(libc::SYS_fcntl, fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
    }
    if args.script_fd >= 0 {
        let ret = if args.script_fd == SCRIPT_FD {
            libc::syscall(libc::SYS_fcntl, SCRIPT_FD, libc::F_SETFD, 0)
        } else {
            libc::syscall(libc::SYS_dup3, args.script_fd, SCRIPT_FD, 0)
        };
        check!(ret, SpawnStage::Stdio);
    }

    if args.confine.active {
        if let Some(failed) = confine_child(&args.confine) {
            return failed;
        }
    }

    libc::syscall(libc::SYS_execve, args.program, args.argv, args.envp);
    (SpawnStage::Exec, *libc::__errno_location())
}

/// Drops every privilege, then enforces Landlock and seccomp (see `confine.rs` for why in
/// this order). Returns the failure, if any.
///
/// # Safety
/// As `child_setup`: only in the vfork child, with `c` (and its filter) alive.
unsafe fn confine_child(c: &ChildConfinement) -> Option<(SpawnStage, i32)> {
    macro_rules! step {
        ($ret:expr) => {
            if let Err(errno) = sys($ret) {
                return Some((SpawnStage::Sandbox, errno));
            }
        };
    }
    if c.privileged {
        // Both need CAP_SETPCAP, which the capset below takes away.
        for cap in 0..=c.last_cap {
            step!(libc::syscall(
                libc::SYS_prctl,
                libc::PR_CAPBSET_DROP,
                cap as libc::c_ulong,
                0,
                0,
                0
            ));
        }
        step!(libc::syscall(
            libc::SYS_prctl,
            libc::PR_SET_SECUREBITS,
            LOCKED_SECUREBITS,
            0,
            0,
            0
        ));
    }
    step!(libc::syscall(
        libc::SYS_prctl,
        libc::PR_CAP_AMBIENT,
        libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
        0,
        0,
        0
    ));
    step!(libc::syscall(
        libc::SYS_capset,
        &c.cap_header as *const CapHeader,
        c.cap_data.as_ptr()
    ));
    step!(libc::syscall(
        libc::SYS_prctl,
        libc::PR_SET_NO_NEW_PRIVS,
        1,
        0,
        0,
        0
    ));
    step!(libc::syscall(
        libc::SYS_landlock_restrict_self,
        c.landlock_fd,
        0u32
    ));
    // Last: every setup syscall above runs unfiltered.
    step!(libc::syscall(
        libc::SYS_seccomp,
        1u32, // SECCOMP_SET_MODE_FILTER
        0u32,
        &c.filter as *const libc::sock_fprog
    ));
    None
}
