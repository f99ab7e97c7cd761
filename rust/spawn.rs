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

use crate::clone::{clone3_into, ChildContain};
use crate::errors::{SpawnError, SpawnStage};
use crate::pipes::{above_stdio, cloexec_pipe, set_nonblocking};

/// Size of the child's stack while it runs between clone and exec.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// Everything one spawn needs, owned by the parent for the duration of the call.
pub struct SpawnPlan {
    pub program: CString,
    pub argv: Vec<CString>,
    /// `NAME=value` entries, shared so that a cached environment is not copied per spawn.
    pub envp: std::sync::Arc<Vec<CString>>,
    pub cwd: CString,
    /// Landlock ruleset fd to enforce in the child before exec (see `landlock.rs`); the
    /// caller keeps it open for the duration of the call.
    pub landlock_ruleset: Option<RawFd>,
    /// Containment (see `clone.rs`): the cgroup v2 directory the child is cloned into,
    /// the v1 cgroup directories it joins before exec, and the rlimits it sets.
    pub cgroup: Option<RawFd>,
    pub join_cgroups: Vec<RawFd>,
    /// `(resource, soft, hard)`.
    pub rlimits: Vec<(u32, u64, u64)>,
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
    landlock_fd: RawFd,
    /// Highest fd to mark close-on-exec when `close_range` is unavailable.
    max_fd: RawFd,
    contain: ChildContain,
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
        report_fd: report_w.as_raw_fd(),
        landlock_fd: plan.landlock_ruleset.unwrap_or(-1),
        max_fd: open_max.clamp(1024, 1 << 20) as RawFd,
        contain: ChildContain::new(&plan.join_cgroups, &plan.rlimits),
    };

    let mut stack = vec![0u8; CHILD_STACK_BYTES];
    // Stacks grow down on every architecture we build for; align the top to 16 bytes.
    let top = (stack.as_mut_ptr() as usize + CHILD_STACK_BYTES) & !0xf;
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
    let mut args = args;
    let (pid, clone_error) = clone_child(plan.cgroup, &mut args, top as *mut c_void, &mut pidfd);
    // SAFETY: restores the mask saved above on this thread.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &saved, std::ptr::null_mut());
    }
    drop(stack);
    if pid < 0 {
        return Err(SpawnError::from_io(SpawnStage::Clone, &clone_error));
    }
    // SAFETY: clone succeeded with CLONE_PIDFD, so `pidfd` is a fresh fd we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };

    // The child has exec'd (its copy of the report pipe closed on exec) or exited; drop our
    // write end and read whatever it reported.
    drop(report_w);
    drop((stdin_r, stdout_w, stderr_w));
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

/// Clones the child with vfork semantics: into `cgroup` with clone3 where the kernel has
/// it, else with clone (the child then joins the cgroup itself before anything else).
fn clone_child(
    cgroup: Option<RawFd>,
    args: &mut ChildArgs,
    top: *mut c_void,
    pidfd: &mut libc::c_int,
) -> (libc::pid_t, io::Error) {
    let arg = args as *mut ChildArgs as *mut c_void;
    if let Some(fd) = cgroup {
        // SAFETY: as for clone below; `args` and the stack outlive the child's exec.
        let ret = unsafe { clone3_into(fd, top, child_main, arg, pidfd) };
        if ret >= 0 {
            return (ret as libc::pid_t, io::Error::from_raw_os_error(0));
        }
        let errno = (-ret) as i32;
        if errno != libc::ENOSYS && errno != libc::E2BIG {
            return (-1, io::Error::from_raw_os_error(errno));
        }
        args.contain = args.contain.with_join_v2(fd);
    }
    let flags = libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD;
    // SAFETY: `child_main` only performs raw syscalls on `args`, which (with argv/envp/plan
    // and `stack`) outlives the call: CLONE_VFORK suspends us until the child has exec'd or
    // exited. CLONE_PIDFD stores the pidfd through the parent-tid pointer.
    let pid = unsafe { libc::clone(child_main, top, flags, arg, pidfd as *mut libc::c_int) };
    (pid, io::Error::last_os_error())
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
    // SAFETY: `arg` points at the parent's ChildArgs, alive until we exec or exit.
    let args = unsafe { &*(arg as *const ChildArgs) };
    let stage = match child_setup(args) {
        Ok(()) => SpawnStage::Exec,
        Err(stage) => stage,
    };
    // Only reached on failure: execve does not return on success.
    // SAFETY: errno slot of this thread, see `sys`.
    let errno = unsafe { *libc::__errno_location() };
    let mut report = [0u8; 8];
    report[..4].copy_from_slice(&(stage as u32).to_ne_bytes());
    report[4..].copy_from_slice(&errno.to_ne_bytes());
    // SAFETY: raw write of a stack buffer, then exit_group; no Rust runtime involved.
    unsafe {
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

fn child_setup(args: &ChildArgs) -> Result<(), SpawnStage> {
    // SAFETY (whole function): raw syscalls on memory prepared by the parent; each failure
    // leaves errno set for `child_main` to report.
    // SAFETY: raw syscalls on the parent's data, before anything else can fork.
    if !unsafe { crate::clone::child_join_cgroups(&args.contain) } {
        return Err(SpawnStage::Contain);
    }
    unsafe {
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
        sys(libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const libc::c_ulong,
            std::ptr::null::<c_void>(),
            8usize,
        ))
        .map_err(|_| SpawnStage::Signals)?;

        sys(libc::syscall(libc::SYS_setpgid, 0, 0)).map_err(|_| SpawnStage::ProcessGroup)?;
        for (target, &fd) in args.stdio.iter().enumerate() {
            sys(libc::syscall(libc::SYS_dup2, fd, target)).map_err(|_| SpawnStage::Stdio)?;
        }
        sys(libc::syscall(libc::SYS_chdir, args.cwd)).map_err(|_| SpawnStage::Chdir)?;

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

        if !crate::clone::child_set_rlimits(&args.contain) {
            return Err(SpawnStage::Contain);
        }

        if args.landlock_fd >= 0 {
            sys(libc::syscall(
                libc::SYS_prctl,
                libc::PR_SET_NO_NEW_PRIVS,
                1,
                0,
                0,
                0,
            ))
            .map_err(|_| SpawnStage::Sandbox)?;
            sys(libc::syscall(
                libc::SYS_landlock_restrict_self,
                args.landlock_fd,
                0u32,
            ))
            .map_err(|_| SpawnStage::Sandbox)?;
        }

        libc::syscall(libc::SYS_execve, args.program, args.argv, args.envp);
    }
    Err(SpawnStage::Exec)
}
