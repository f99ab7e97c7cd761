//! The child between clone and exec: raw, async-signal-safe syscalls on data the parent
//! prepared (`ChildArgs`), no allocation, no locks, no Rust runtime. In order: reset signal
//! dispositions, `setsid`, stdio with `dup3`, `chdir`, close-on-exec for every other fd, a
//! long command's script on fd 3, then for a confined call the privilege drop, Landlock and
//! seccomp (see `confine.rs`), then `execve`. A failure is reported as (stage, errno) in
//! `ChildArgs::report`, memory the suspended parent reads once clone returns.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clone::{child_join_cgroups, child_set_rlimits, ChildContain};
use crate::confine::{CapData, CapHeader, Confinement, LOCKED_SECUREBITS};
use crate::errors::SpawnStage;
use crate::spawn::{InheritedFilter, SCRIPT_FD};

/// Raw data the child reads. Built in the parent; every pointer stays valid until clone
/// returns, which under CLONE_VFORK is after the child has exec'd or exited.
#[repr(C)]
pub(crate) struct ChildArgs {
    pub(crate) program: *const libc::c_char,
    pub(crate) argv: *const *const libc::c_char,
    pub(crate) envp: *const *const libc::c_char,
    pub(crate) cwd: *const libc::c_char,
    pub(crate) stdio: [RawFd; 3],
    /// The failure report: `stage << 32 | errno`, 0 while none. The child shares our memory
    /// (CLONE_VM) and the parent reads it after clone returns, i.e. after the child exec'd
    /// (no report) or exited: a store and a load, where a report pipe cost a `pipe2`, two
    /// closes and a read per spawn.
    pub(crate) report: AtomicU64,
    pub(crate) script_fd: RawFd,
    /// The kernel already reset the handled signals (`CLONE_CLEAR_SIGHAND`): only those in
    /// `ignored` (bit `n - 1` for signal `n`) need resetting. Set before each clone attempt.
    pub(crate) handlers_cleared: bool,
    pub(crate) ignored: u64,
    pub(crate) confine: ChildConfinement,
    /// The call's cgroups to join (when not cloned into one) and its rlimits.
    pub(crate) contain: ChildContain,
}

/// The confinement steps of the child, as raw data (`active == false`: unconfined).
#[repr(C)]
pub(crate) struct ChildConfinement {
    active: bool,
    /// Clear the bounding set and lock securebits (the harness holds CAP_SETPCAP).
    privileged: bool,
    /// `no_new_privs` is already set: the spawning thread set it (it carries a filter).
    no_new_privs_inherited: bool,
    last_cap: libc::c_int,
    cap_header: CapHeader,
    cap_data: [CapData; 2],
    landlock_fd: RawFd,
    filter: libc::sock_fprog,
}

impl ChildConfinement {
    /// `bounding_set_cleared`: the spawning thread already dropped the bounding set and
    /// locked the securebits (see `spawner.rs`), so the child inherits them; `inherited`:
    /// what it carries of the filter, which decides what the child installs (the whole
    /// filter, the `clone3` layer, or nothing).
    pub(crate) fn from_plan(
        confinement: Option<&Confinement>,
        bounding_set_cleared: bool,
        inherited: InheritedFilter,
    ) -> Self {
        let mut c = Self {
            active: false,
            privileged: false,
            no_new_privs_inherited: false,
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
            c.privileged = conf.caps.can_setpcap && !bounding_set_cleared;
            c.last_cap = conf.caps.last_cap;
            c.landlock_fd = conf.landlock_fd();
            c.filter = conf.filter_prog(inherited);
            c.no_new_privs_inherited = inherited != InheritedFilter::None;
        }
        c
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
pub(crate) extern "C" fn child_main(arg: *mut c_void) -> libc::c_int {
    // SAFETY: `arg` points at the parent's ChildArgs, alive until we exec or exit; the
    // parent is suspended (CLONE_VFORK) and every pointer in it was prepared for us.
    let (stage, errno) = unsafe { child_setup(&*(arg as *const ChildArgs)) };
    // Only reached on failure: execve does not return on success.
    let packed = (u64::from(stage as u32) << 32) | u64::from(errno as u32);
    // SAFETY: as above; a plain store into the parent's memory, then exit_group with no
    // Rust runtime involved.
    unsafe {
        let args = &*(arg as *const ChildArgs);
        args.report.store(packed, Ordering::Release);
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
    // First, before anything can fork: the call's cgroups (v1 controllers, and v2 when
    // clone3 could not place us there).
    if !child_join_cgroups(&args.contain) {
        return (SpawnStage::Contain, *libc::__errno_location());
    }
    // Reset every disposition: the harness may ignore SIGPIPE (CPython does) or handle
    // signals; an ignored disposition would survive exec. Signals stay blocked meanwhile.
    // Cloned with CLONE_CLEAR_SIGHAND, the handlers are already gone and only the signals
    // the harness ignored are left (62 calls measured 20-30 us here, most of them no-ops).
    let dfl: [libc::c_ulong; 4] = [libc::SIG_DFL as libc::c_ulong, 0, 0, 0];
    for sig in 1..65 {
        if sig == libc::SIGKILL
            || sig == libc::SIGSTOP
            || (args.handlers_cleared && args.ignored & (1u64 << (sig - 1)) == 0)
        {
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
        // A kernel without close_range (before 5.11): every fd up to the open-files limit,
        // read here rather than by the parent on every spawn.
        let mut limit = [0u64; 2];
        let got = libc::syscall(
            libc::SYS_prlimit64,
            0,
            libc::RLIMIT_NOFILE,
            std::ptr::null::<c_void>(),
            limit.as_mut_ptr(),
        );
        let max_fd = if got == 0 {
            limit[0].clamp(1024, 1 << 20) as RawFd
        } else {
            1024
        };
        for fd in 3..max_fd {
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

    // After stdio (a tiny RLIMIT_NOFILE must not refuse the dup3 onto 0..2), before the
    // privilege drop (raising a hard limit needs capabilities).
    if !child_set_rlimits(&args.contain) {
        return (SpawnStage::Contain, *libc::__errno_location());
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
    // Emptying the permitted and inheritable sets clears the ambient set too (the kernel
    // keeps only ambient bits both permitted and inheritable): no PR_CAP_AMBIENT call.
    step!(libc::syscall(
        libc::SYS_capset,
        &c.cap_header as *const CapHeader,
        c.cap_data.as_ptr()
    ));
    // A thread carrying a seccomp filter has `no_new_privs` (the filter needed it), and a
    // child inherits it; it cannot be unset.
    if !c.no_new_privs_inherited {
        step!(libc::syscall(
            libc::SYS_prctl,
            libc::PR_SET_NO_NEW_PRIVS,
            1,
            0,
            0,
            0
        ));
    }
    step!(libc::syscall(
        libc::SYS_landlock_restrict_self,
        c.landlock_fd,
        0u32
    ));
    // Last: every setup syscall above runs unfiltered, or under the filter inherited from
    // a confined spawner thread, which allows each of them (capset, prctl,
    // landlock_restrict_self, seccomp, prlimit64 on pid 0, the cgroup writes, dup3, chdir,
    // close_range, rt_sigaction: none is singled out there). An empty program: the
    // inherited filter is already the whole one.
    if c.filter.len > 0 {
        step!(libc::syscall(
            libc::SYS_seccomp,
            1u32, // SECCOMP_SET_MODE_FILTER
            0u32,
            &c.filter as *const libc::sock_fprog
        ));
    }
    None
}
