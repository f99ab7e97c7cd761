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
//! controller cgroups by writing "0" to their `cgroup.procs`, then lower rlimits.

use std::ffi::c_void;
use std::os::fd::RawFd;

/// Most rlimits one spawn sets (`RLIMIT_AS`, `RLIMIT_CPU`, `RLIMIT_FSIZE`, `RLIMIT_NOFILE`).
pub const MAX_RLIMITS: usize = 4;
/// Most cgroup directories a child joins itself (v2 fallback + v1 memory + v1 pids).
pub const MAX_JOINS: usize = 3;

/// What the child does to contain itself, prepared in the parent.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ChildContain {
    /// Cgroup directory fds to join; -1 marks an unused slot.
    pub join: [RawFd; MAX_JOINS],
    /// `(resource, soft, hard)`.
    pub rlimits: [(u32, u64, u64); MAX_RLIMITS],
    pub rlimit_count: usize,
}

impl ChildContain {
    pub fn new(join: &[RawFd], rlimits: &[(u32, u64, u64)]) -> Self {
        let mut out = Self {
            join: [-1; MAX_JOINS],
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

    pub fn with_join(mut self, fd: RawFd) -> Self {
        if let Some(slot) = self.join.iter_mut().find(|s| **s < 0) {
            *slot = fd;
        }
        self
    }
}

const CGROUP_PROCS: &[u8] = b"cgroup.procs\0";

/// In the child, first of all (before anything could fork): join every cgroup. Raw
/// syscalls only; false on failure with errno set.
///
/// # Safety
/// Called between clone and exec in a child sharing the parent's memory; `c` is the
/// parent's data, alive until the child execs.
pub unsafe fn child_join_cgroups(c: &ChildContain) -> bool {
    for &dir in &c.join {
        if dir < 0 {
            continue;
        }
        // SAFETY: raw openat/write/close on a NUL-terminated static name.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat,
                dir,
                CGROUP_PROCS.as_ptr(),
                libc::O_WRONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return false;
        }
        // SAFETY: as above; "0" moves the writing process.
        let n = unsafe { libc::syscall(libc::SYS_write, fd, b"0".as_ptr(), 1usize) };
        // SAFETY: closes the fd opened above.
        unsafe { libc::syscall(libc::SYS_close, fd) };
        if n < 0 {
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

/// `clone3` into `cgroup_fd` with vfork semantics; the child runs `entry(arg)` on the stack
/// whose (16-byte aligned) top is `top`, exactly as with `libc::clone`. Returns the pid
/// (storing the pidfd) or `-errno`.
///
/// # Safety
/// As `libc::clone` with `CLONE_VM | CLONE_VFORK`: `entry` must only make raw syscalls
/// and `arg` and the stack below `top` must outlive the child's exec.
#[cfg(target_arch = "x86_64")]
pub unsafe fn clone3_into(
    cgroup_fd: RawFd,
    top: *mut c_void,
    entry: extern "C" fn(*mut c_void) -> libc::c_int,
    arg: *mut c_void,
    pidfd: &mut libc::c_int,
) -> libc::c_long {
    // The kernel starts the child at `stack + stack_size`; only that sum matters.
    const SPAN: u64 = 16;
    let mut args = CloneArgs {
        flags: (libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD) as u64 | CLONE_INTO_CGROUP,
        pidfd: pidfd as *mut libc::c_int as u64,
        exit_signal: libc::SIGCHLD as u64,
        stack: (top as u64).saturating_sub(SPAN),
        stack_size: SPAN,
        cgroup: cgroup_fd as u64,
        ..CloneArgs::default()
    };
    let ret: libc::c_long;
    // SAFETY: the parent returns from `syscall` normally. The child starts on the new,
    // aligned stack with a copy of our registers: it calls `entry(arg)` (kept in the
    // callee-saved r12/r13, which the kernel preserves) and exits with its return value;
    // it never returns into this frame.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "mov rdi, rax",
            "mov eax, 231",
            "syscall",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 => ret,
            in("rdi") &mut args as *mut CloneArgs,
            in("rsi") std::mem::size_of::<CloneArgs>(),
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
    _cgroup_fd: RawFd,
    _top: *mut c_void,
    _entry: extern "C" fn(*mut c_void) -> libc::c_int,
    _arg: *mut c_void,
    _pidfd: &mut libc::c_int,
) -> libc::c_long {
    -(libc::ENOSYS as libc::c_long)
}
