//! The clone call and the child's containment steps.
//!
//! `clone3(CLONE_INTO_CGROUP)` starts the child inside its call's cgroup, so there is no
//! instant in which it (or anything it forks) is outside. clone3 with `CLONE_VM` needs a
//! stack of its own, and the child returns from the syscall on that empty stack, so the
//! call is a few instructions of inline assembly that jump straight to the child's entry
//! point (as glibc's `clone3.S` does). Elsewhere (no clone3, another architecture) the plain
//! `clone` is used and the child joins the cgroup itself before anything else.
//!
//! The child's own steps are raw syscalls on memory prepared by the parent: join v1
//! controller cgroups by writing "0" to their `tasks` files (fds the parent holds), then
//! lower rlimits.

use std::ffi::c_void;
use std::os::fd::RawFd;

use crate::seccomp::Clone3Key;

/// Most rlimits one spawn sets (`RLIMIT_AS`, `RLIMIT_CPU`, `RLIMIT_FSIZE`, `RLIMIT_NOFILE`).
pub const MAX_RLIMITS: usize = 4;
/// Most cgroup directories a child joins itself (v2 fallback + v1 memory + v1 pids).
pub const MAX_JOINS: usize = 3;

/// What the child does to contain itself, prepared in the parent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ChildContain {
    /// Held fds on the v1 `tasks` files to join (see `TASKS`); -1 marks an unused slot.
    pub join: [RawFd; MAX_JOINS],
    /// A v2 cgroup directory to join when clone3 could not clone into it; -1: none.
    pub join_v2: RawFd,
    /// `(resource, soft, hard)`.
    pub rlimits: [(u32, u64, u64); MAX_RLIMITS],
    pub rlimit_count: usize,
}

impl ChildContain {
    pub fn new(join: &[RawFd], rlimits: &[(u32, u64, u64)]) -> Self {
        let mut out = Self {
            join: [-1; MAX_JOINS],
            join_v2: -1,
            rlimits: [(0, 0, 0); MAX_RLIMITS],
            rlimit_count: 0,
        };
        for (slot, fd) in out.join.iter_mut().zip(join) {
            *slot = *fd;
        }
        for (slot, lim) in out.rlimits.iter_mut().zip(rlimits) {
            *slot = *lim;
            out.rlimit_count += 1;
        }
        out
    }

    /// The child joins the v2 cgroup `fd` itself (no clone3 on this kernel or architecture).
    pub fn with_join_v2(mut self, fd: RawFd) -> Self {
        self.join_v2 = fd;
        self
    }
}

const CGROUP_PROCS: &[u8] = b"cgroup.procs\0";
// v1 joins write the `tasks` file: moving only the calling thread (pid 0) skips the global
// threadgroup lock that a `cgroup.procs` write takes, and with it an RCU grace period that
// could cost milliseconds; the child is single-threaded, so the thread is the process.

/// Writes "0" (this task) to the held cgroup file `fd`.
///
/// # Safety
/// Raw syscalls only; callable between clone and exec.
unsafe fn join_fd(fd: RawFd) -> bool {
    // SAFETY: a raw write of a static byte; "0" moves the writing task.
    unsafe { libc::syscall(libc::SYS_write, fd, b"0".as_ptr(), 1usize) >= 0 }
}

/// Writes "0" (this task) into `name` under the cgroup directory `dir`.
///
/// # Safety
/// Raw syscalls only; callable between clone and exec.
unsafe fn join(dir: RawFd, name: &[u8]) -> bool {
    // SAFETY: raw openat/write/close on a NUL-terminated static name.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat,
            dir,
            name.as_ptr(),
            // Never waiting on a file lease (see `cgroup::open_at`).
            libc::O_WRONLY | libc::O_CLOEXEC | libc::O_NONBLOCK,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: as above; "0" moves the writing task.
    let n = unsafe { libc::syscall(libc::SYS_write, fd, b"0".as_ptr(), 1usize) };
    // SAFETY: closes the fd opened above.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    n >= 0
}

/// In the child, first of all (before anything could fork): join every cgroup. Raw
/// syscalls only; false on failure with errno set.
///
/// # Safety
/// Called between clone and exec in a child sharing the parent's memory; `c` is the
/// parent's data, alive until the child execs.
pub unsafe fn child_join_cgroups(c: &ChildContain) -> bool {
    // SAFETY: raw syscalls on the parent's data (see `join`).
    if c.join_v2 >= 0 && !unsafe { join(c.join_v2, CGROUP_PROCS) } {
        return false;
    }
    for &fd in &c.join {
        // SAFETY: as above.
        if fd >= 0 && !unsafe { join_fd(fd) } {
            return false;
        }
    }
    true
}

/// In the child, once its stdio is in place (a tiny `RLIMIT_NOFILE` must not refuse the
/// `dup2` onto 0..2) and before the sandbox: set the rlimits. Raw syscalls only; false on
/// failure with errno set.
///
/// # Safety
/// As `child_join_cgroups`.
pub unsafe fn child_set_rlimits(c: &ChildContain) -> bool {
    for &(resource, soft, hard) in &c.rlimits[..c.rlimit_count.min(MAX_RLIMITS)] {
        let lim = [soft, hard];
        // SAFETY: prlimit64 on ourselves with a valid two-u64 struct.
        let r = unsafe {
            libc::syscall(
                libc::SYS_prlimit64,
                0,
                resource,
                lim.as_ptr(),
                std::ptr::null_mut::<c_void>(),
            )
        };
        if r < 0 {
            return false;
        }
    }
    true
}

#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;
/// Every handled signal starts at SIG_DFL in the child (Linux 5.5); ignored ones stay so.
const CLONE_CLEAR_SIGHAND: u64 = 0x1_0000_0000;

/// `clone3` with vfork semantics, into `cgroup_fd` when one is given; the child runs
/// `entry(arg)` on the stack
/// whose (16-byte aligned) top is `top`, exactly as with `libc::clone`; `clear_sighand`: the
/// kernel resets the child's handled signals to SIG_DFL (`CLONE_CLEAR_SIGHAND`); `key`: the
/// spawning thread's filter allows `clone3` only with it (see `seccomp.rs`). Returns the
/// pid (storing the pidfd) or `-errno`.
///
/// # Safety
/// As `libc::clone` with `CLONE_VM | CLONE_VFORK`: `entry` must only make raw syscalls
/// and `arg` and the stack below `top` must outlive the child's exec.
#[cfg(target_arch = "x86_64")]
pub unsafe fn clone3_into(
    cgroup_fd: Option<RawFd>,
    top: *mut c_void,
    entry: extern "C" fn(*mut c_void) -> libc::c_int,
    arg: *mut c_void,
    pidfd: &mut libc::c_int,
    clear_sighand: bool,
    key: Option<Clone3Key>,
) -> libc::c_long {
    // The kernel starts the child at `stack + stack_size`; only that sum matters.
    const SPAN: u64 = 16;
    let clear = if clear_sighand {
        CLONE_CLEAR_SIGHAND
    } else {
        0
    };
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64
            | cgroup_fd.map_or(0, |_| CLONE_INTO_CGROUP)
            | clear,
        pidfd: pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: (top as u64).saturating_sub(SPAN),
        stack_size: SPAN,
        cgroup: cgroup_fd.map_or(0, |fd| fd as u64),
        ..CloneArgs::default()
    };
    // The key of a confined spawner's filter (see `seccomp.rs`) rides in the argument
    // registers clone3 ignores; zeros elsewhere.
    let [k0, k1, k2, k3] = key.map_or([0; 4], |k| k.0);
    let ret: libc::c_long;
    // SAFETY: the parent returns from `syscall` normally and clears the four registers that
    // held the key (declared clobbered), so that its next syscalls do not carry it into a
    // trace. The child starts on the new, aligned stack with a copy of our registers: it
    // clears the same four, calls `entry(arg)` (kept in the callee-saved r12/r13, which the kernel preserves) and
    // exits with its return value; it never returns into this frame.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor edx, edx",
            "xor r10d, r10d",
            "xor r8d, r8d",
            "xor r9d, r9d",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "mov rdi, rax",
            "mov eax, 231",
            "syscall",
            "ud2",
            "2:",
            "xor edx, edx",
            "xor r10d, r10d",
            "xor r8d, r8d",
            "xor r9d, r9d",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &mut args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
            inout("rdx") k0 => _,
            inout("r10") k1 => _,
            inout("r8") k2 => _,
            inout("r9") k3 => _,
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

#[cfg(not(target_arch = "x86_64"))]
pub unsafe fn clone3_into(
    _cgroup_fd: Option<RawFd>,
    _top: *mut c_void,
    _entry: extern "C" fn(*mut c_void) -> libc::c_int,
    _arg: *mut c_void,
    _pidfd: &mut libc::c_int,
    _clear_sighand: bool,
    _key: Option<Clone3Key>,
) -> libc::c_long {
    -(libc::ENOSYS as libc::c_long)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{hierarchy, ServiceCgroups, TreeLimits};

    /// The path without clone3: a child joins its v2 cgroup (`cgroup.procs`) and its v1
    /// controllers (`tasks`) itself.
    #[test]
    fn a_child_joins_v2_and_v1_cgroups_itself() {
        let h = hierarchy();
        if h.v2.is_none() {
            return;
        }
        let set = ServiceCgroups::new(h).expect("service cgroups");
        let cg = set
            .acquire(TreeLimits {
                memory_bytes: Some(1 << 30),
                max_processes: Some(16),
            })
            .expect("acquire");
        let contain =
            ChildContain::new(&cg.join_fds().expect("tasks files"), &[]).with_join_v2(cg.dir_fd());
        // SAFETY: the child only makes raw syscalls, then pauses until killed.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: raw syscalls in the forked child.
            unsafe {
                if !child_join_cgroups(&contain) {
                    libc::syscall(libc::SYS_exit_group, 1);
                }
                loop {
                    libc::syscall(libc::SYS_pause);
                }
            }
        }
        let name = set
            .parent()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut joined = 0;
        for _ in 0..200 {
            let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
            joined = own.lines().filter(|l| l.contains(&name)).count();
            if joined >= 3 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // SAFETY: signals and reaps our own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert_eq!(joined, 3, "v2 + memory + pids");
        set.release(cg);
        set.remove_all();
        assert!(set.parents().iter().all(|p| !p.exists()));
    }
}
