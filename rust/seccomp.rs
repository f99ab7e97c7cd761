//! The seccomp filter of a confined command, built in the parent as classic BPF and installed
//! by the vfork child (after `no_new_privs`, right before `execve`) with one raw syscall.
//!
//! Landlock has no right for `chmod`/`chown`/`utime`/xattr writes, none for creating a socket
//! of a non-TCP family, and does not see keyrings or terminal ioctls; this filter refuses
//! those with `EPERM`. It is a handful of instructions written by hand (no crate: nothing to
//! gain for a filter this small, and nothing of it runs in the child but `seccomp(2)`):
//! - every confined mode: keyrings (`keyctl`, `add_key`, `request_key`: the harness's session
//!   keyring is shared with its children), `io_uring` (its operations bypass seccomp: sockets,
//!   xattrs), `bpf` and `userfaultfd` (kernel attack surface no command needs), new
//!   namespaces (`unshare`, `setns`, `clone` with a namespace flag), `clone` with
//!   `CLONE_PARENT` (its child would be the harness's, a zombie nobody reaps: `clone3`
//!   answers `ENOSYS` so libc falls back to `clone`, whose flags the filter reads), and the
//!   terminal ioctls `TIOCSTI` and `TIOCLINUX` (keystroke injection), and file leases
//!   (`fcntl(F_SETLEASE)`, and `F_SETDELEG`: a uid-0 command owns root's files, and its
//!   lease on one holds every open of that file for writing, the harness's own included,
//!   for 45 s);
//! - `read-only`: every metadata write (`chmod`/`chown`/`utime` families, xattr writes,
//!   `file_setattr`, and the ioctls that set inode flags, extended attributes or the inode
//!   generation);
//! - every confined mode: `prlimit64` on another process (Landlock has no hook for it: a
//!   command could lower the harness's, the keeper's or a sibling call's limits, e.g.
//!   `RLIMIT_CPU` to kill the harness); `setrlimit`/`getrlimit` pass pid 0 and still work;
//! - every confined mode: the scheduling calls on another process (`setpriority`,
//!   `ioprio_set`, `sched_setscheduler`, `sched_setparam`, `sched_setattr`,
//!   `sched_setaffinity` with a pid other than 0, and `PRIO_USER`/`IOPRIO_WHO_USER`): no
//!   Landlock hook either, and a command reniced, SCHED_IDLE'd and pinned an unprivileged
//!   harness and every sibling call for good; `nice`, `ionice`, `chrt` and `taskset` on a
//!   command they start (pid 0) still work;
//! - every confined mode: `perf_event_open` for every process on a CPU (pid -1) or for a
//!   cgroup: its samples carry other processes' registers and user stacks, the harness's
//!   included, with no ptrace check for Landlock to refuse (where `perf_event_paranoid`
//!   allows such events at all); a command's own processes can still be measured;
//! - every confined mode: System V IPC and POSIX message queues. The IPC namespace is the
//!   host's: a command read, wrote and removed the harness's shared memory, semaphores and
//!   queues, and segments it left outlived its call and its memory limit;
//! - `network=False`: `socket()` for every family, and `socketpair` of any type but
//!   `SOCK_STREAM` (a pair of datagram sockets is unconnected: `sendto` with a path, or
//!   `connect`, reaches any pathname unix socket it can see, `/dev/log` included; a connected
//!   stream socket refuses both with `EISCONN`).
//!
//! A confined spawner thread (see `spawner.rs`) installs the filter on itself once, so that
//! its children inherit it instead of installing their own: the kernel copies, checks and
//! JIT-compiles a filter at every install (~125 us for the whole filter here), and frees its
//! image on a kworker when the last process holding it exits. The thread needs `clone3`
//! itself, to clone each child straight into its call's cgroup, so its filter
//! (`build_keyed`) allows `clone3` only when the four argument registers `clone3` ignores
//! carry a 256-bit key drawn for that thread (`Clone3Key`), which the thread passes and
//! nothing else knows:
//! - the key lives in the harness's memory and in the filter, which a process can read only
//!   with `CAP_SYS_ADMIN` (`PTRACE_SECCOMP_GET_FILTER`); every confined command has dropped
//!   every capability;
//! - a confined command has a Landlock domain the harness lacks, so Landlock refuses it any
//!   ptrace access to the harness (`/proc/<harness>/mem`, `.../syscall`, where the registers
//!   of a spawn under way show), whatever the harness's dumpability; a protected harness is
//!   not dumpable either;
//! - the child starts with the parent's registers: it clears the four before it runs
//!   anything, and `execve` clears every register again.
//!
//! A guess is right once in 2^256. Without a key (no `getrandom`), the thread carries the
//! base (`build_base`: `clone3` left out) and each child stacks the four-instruction
//! `clone3` layer on it (~35 us per spawn here, with the kworker's share at its exit).
//!
//! A syscall made through another architecture's ABI (x32, or i386 `int 0x80` on x86_64)
//! would be numbered differently: the filter kills such a process instead of guessing. A
//! syscall newer than this filter (numbered from `FIRST_UNKNOWN_SYSCALL` on) answers `ENOSYS`
//! in every confined mode, so that a future kernel's call cannot do what the filter refuses
//! through an older one; libc falls back on `ENOSYS` to the call it replaces.

/// What the filter refuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FilterPolicy {
    pub read_only: bool,
    pub deny_sockets: bool,
}

const BPF_LD_W_ABS: u16 = 0x20; // BPF_LD | BPF_W | BPF_ABS
const BPF_JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const BPF_JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const BPF_JSET_K: u16 = 0x45; // BPF_JMP | BPF_JSET | BPF_K
const BPF_AND_K: u16 = 0x54; // BPF_ALU | BPF_AND | BPF_K
const BPF_XOR_K: u16 = 0xa4; // BPF_ALU | BPF_XOR | BPF_K
const BPF_OR_X: u16 = 0x4c; // BPF_ALU | BPF_OR | BPF_X
const BPF_TAX: u16 = 0x07; // BPF_MISC | BPF_TAX
const BPF_LDX_IMM: u16 = 0x01; // BPF_LDX | BPF_W | BPF_IMM
const BPF_RET_K: u16 = 0x06; // BPF_RET | BPF_K

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_ERRNO: u32 = 0x0005_0000;

// Offsets into `struct seccomp_data`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// Low 32 bits of argument `i` (little-endian layout).
const fn off_arg_low(i: u32) -> u32 {
    16 + 8 * i
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
#[cfg(target_arch = "riscv64")]
const AUDIT_ARCH: u32 = 0xC000_00F3;

// Syscalls newer than some libc releases (numbered the same on every architecture).
const SYS_FCHMODAT2: i64 = 452;
const SYS_SETXATTRAT: i64 = 463;
const SYS_REMOVEXATTRAT: i64 = 466;
const SYS_FILE_SETATTR: i64 = 469;
/// One past the newest syscall this filter was written for (`file_setattr`, Linux 6.17).
/// Raise it only after judging every syscall below the new value.
const FIRST_UNKNOWN_SYSCALL: u32 = 470;

/// `clone` flags a confined command may not use: new namespaces, and `CLONE_PARENT` (the
/// child would belong to the command's parent, the harness, which never waits for it).
const REFUSED_CLONE_FLAGS: u32 = (libc::CLONE_PARENT
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u32;

/// `fcntl`'s command that takes a file lease (`F_SETLEASE`, the same on every architecture).
const F_SETLEASE: u32 = libc::F_SETLEASE as u32;
/// `fcntl`'s command that takes a file delegation (`F_LINUX_SPECIFIC_BASE + 16`, Linux 6.19).
const F_SETDELEG: u32 = 1024 + 16;

/// The socket type in `socket`/`socketpair`'s type argument (the rest are `SOCK_NONBLOCK`
/// and `SOCK_CLOEXEC`).
const SOCK_TYPE_MASK: u32 = 0xf;

/// Metadata writes through ioctl, read-only refuses them: inode flags (chattr), extended
/// file attributes, and the inode generation (ext4's and the generic request, each also in
/// its 32-bit encoding, which a driver may accept from a 64-bit caller too).
const METADATA_IOCTLS: [u32; 7] = [
    0x4008_6602, // FS_IOC_SETFLAGS
    0x4004_6602, // FS_IOC32_SETFLAGS
    0x401c_5820, // FS_IOC_FSSETXATTR
    0x4008_7602, // FS_IOC_SETVERSION
    0x4004_7602, // FS_IOC32_SETVERSION
    0x4008_6604, // EXT4_IOC_SETVERSION
    0x4004_6604, // EXT4_IOC32_SETVERSION
];

fn stmt(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

fn errno(e: i32) -> u32 {
    RET_ERRNO | (e as u32 & 0xffff)
}

/// Syscalls every confined mode refuses with EPERM.
fn always_denied() -> Vec<i64> {
    vec![
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_bpf,
        libc::SYS_userfaultfd,
    ]
}

/// System V IPC and POSIX message queues, which every confined mode refuses.
fn ipc() -> Vec<i64> {
    vec![
        libc::SYS_shmget,
        libc::SYS_shmat,
        libc::SYS_shmctl,
        libc::SYS_semget,
        libc::SYS_semop,
        libc::SYS_semtimedop,
        libc::SYS_semctl,
        libc::SYS_msgget,
        libc::SYS_msgsnd,
        libc::SYS_msgrcv,
        libc::SYS_msgctl,
        libc::SYS_mq_open,
        libc::SYS_mq_unlink,
        libc::SYS_mq_timedsend,
        libc::SYS_mq_timedreceive,
        libc::SYS_mq_notify,
        libc::SYS_mq_getsetattr,
    ]
}

/// `perf_event_open`'s flag naming a cgroup (by fd, in `pid`) instead of a process.
const PERF_FLAG_PID_CGROUP: u32 = 1 << 2;

/// `PRIO_USER` (setpriority) and `IOPRIO_WHO_USER` (ioprio_set): every process of a uid.
const PRIO_USER: u32 = 2;
const IOPRIO_WHO_USER: u32 = 3;

/// Calls taking a pid as their first argument that may act on the caller only (pid 0):
/// limits and scheduling of another process have no Landlock hook.
const OWN_PROCESS_ONLY: [i64; 5] = [
    libc::SYS_prlimit64,
    libc::SYS_sched_setscheduler,
    libc::SYS_sched_setparam,
    libc::SYS_sched_setattr,
    libc::SYS_sched_setaffinity,
];

/// An action allowing the call only when argument `pid_arg` is 0 (the caller itself).
fn only_self(pid_arg: u32) -> Vec<libc::sock_filter> {
    vec![
        stmt(BPF_LD_W_ABS, off_arg_low(pid_arg)),
        jump(BPF_JEQ_K, 0, 0, 1),
        stmt(BPF_RET_K, RET_ALLOW),
        stmt(BPF_RET_K, errno(libc::EPERM)),
    ]
}

/// `(which, who, ...)` calls: allowed for who 0 (the caller, its group) unless `which`
/// names every process of a user.
fn only_self_not_user(user: u32) -> Vec<libc::sock_filter> {
    vec![
        stmt(BPF_LD_W_ABS, off_arg_low(1)),
        jump(BPF_JEQ_K, 0, 0, 3),
        stmt(BPF_LD_W_ABS, off_arg_low(0)),
        jump(BPF_JEQ_K, user, 1, 0),
        stmt(BPF_RET_K, RET_ALLOW),
        stmt(BPF_RET_K, errno(libc::EPERM)),
    ]
}

/// Metadata-writing syscalls read-only mode refuses.
fn metadata_writes() -> Vec<i64> {
    let mut nrs = vec![
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        SYS_FCHMODAT2,
        libc::SYS_fchown,
        libc::SYS_fchownat,
        libc::SYS_utimensat,
        libc::SYS_setxattr,
        libc::SYS_lsetxattr,
        libc::SYS_fsetxattr,
        SYS_SETXATTRAT,
        libc::SYS_removexattr,
        libc::SYS_lremovexattr,
        libc::SYS_fremovexattr,
        SYS_REMOVEXATTRAT,
        SYS_FILE_SETATTR,
    ];
    #[cfg(target_arch = "x86_64")]
    nrs.extend([
        libc::SYS_chmod,
        libc::SYS_chown,
        libc::SYS_lchown,
        libc::SYS_utime,
        libc::SYS_utimes,
        libc::SYS_futimesat,
    ]);
    nrs
}

/// The secret a confined spawner thread passes to `clone3` in the argument registers the
/// syscall ignores (`rdx`, `r10`, `r8`, `r9` on x86_64), which its filter demands (see the
/// module documentation). Never printed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Clone3Key(pub [u64; 4]);

impl std::fmt::Debug for Clone3Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clone3Key(..)")
    }
}

impl Clone3Key {
    /// 256 random bits from the kernel; None if it gives none.
    pub fn generate() -> Option<Self> {
        let mut bytes = [0u8; 32];
        crate::sys::fill_random(&mut bytes).ok()?;
        let mut words = [0u64; 4];
        for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
            *word = u64::from_ne_bytes(chunk.try_into().ok()?);
        }
        Some(Self(words))
    }
}

/// What the filter does with `clone3`.
#[derive(Clone, Copy)]
enum Clone3Rule {
    /// `ENOSYS`: libc falls back to `clone`, whose flags the filter reads.
    Refused,
    /// Not singled out (the base layer: the `clone3` layer decides).
    Left,
    /// Allowed only with the key in its four unused argument registers, else `ENOSYS`.
    Keyed(Clone3Key),
}

/// `clone3` allowed only when arguments 2 to 5 hold `key`, else `ENOSYS`. Every half-word
/// is read and compared (XOR with the key's, OR-ed into X) before the one test, so that
/// the time taken does not tell how much of a guess was right.
fn keyed_clone3(key: Clone3Key) -> Vec<libc::sock_filter> {
    let mut block = vec![stmt(BPF_LDX_IMM, 0)];
    for (i, word) in key.0.iter().enumerate() {
        for (half, value) in [(0, *word as u32), (4, (*word >> 32) as u32)] {
            block.push(stmt(BPF_LD_W_ABS, off_arg_low(2 + i as u32) + half));
            block.push(stmt(BPF_XOR_K, value));
            block.push(stmt(BPF_OR_X, 0));
            block.push(stmt(BPF_TAX, 0));
        }
    }
    block.push(jump(BPF_JEQ_K, 0, 0, 1));
    block.push(stmt(BPF_RET_K, RET_ALLOW));
    block.push(stmt(BPF_RET_K, errno(libc::ENOSYS)));
    block
}

/// What the filter does with one syscall number it singles out (every other number under
/// `FIRST_UNKNOWN_SYSCALL` is allowed). Each action is a block of instructions that ends in
/// a return; register A holds the syscall number when it starts.
fn action(nr: i64, policy: FilterPolicy, clone3: Clone3Rule) -> Vec<libc::sock_filter> {
    if nr == libc::SYS_clone3 {
        return match clone3 {
            Clone3Rule::Keyed(key) => keyed_clone3(key),
            // clone3 passes its flags in memory a filter cannot read: make libc fall back
            // to clone, whose flags are an argument.
            Clone3Rule::Refused | Clone3Rule::Left => vec![stmt(BPF_RET_K, errno(libc::ENOSYS))],
        };
    }
    if nr == libc::SYS_clone {
        // clone(flags, ...): refuse the flags above.
        return vec![
            stmt(BPF_LD_W_ABS, off_arg_low(0)),
            jump(BPF_JSET_K, REFUSED_CLONE_FLAGS, 1, 0),
            stmt(BPF_RET_K, RET_ALLOW),
            stmt(BPF_RET_K, errno(libc::EPERM)),
        ];
    }
    if OWN_PROCESS_ONLY.contains(&nr) {
        return only_self(0);
    }
    if nr == libc::SYS_perf_event_open {
        // perf_event_open(attr, pid, cpu, group_fd, flags): a process (pid >= 0, which
        // the kernel checks like ptrace, and Landlock with it) but never every process on a
        // CPU (pid -1) or a cgroup's (PERF_FLAG_PID_CGROUP): those samples carry other
        // processes' registers and stacks, the harness's included, and no ptrace check.
        return vec![
            stmt(BPF_LD_W_ABS, off_arg_low(1)),
            jump(BPF_JEQ_K, u32::MAX, 3, 0),
            stmt(BPF_LD_W_ABS, off_arg_low(4)),
            jump(BPF_JSET_K, PERF_FLAG_PID_CGROUP, 1, 0),
            stmt(BPF_RET_K, RET_ALLOW),
            stmt(BPF_RET_K, errno(libc::EPERM)),
        ];
    }
    if nr == libc::SYS_setpriority {
        return only_self_not_user(PRIO_USER);
    }
    if nr == libc::SYS_ioprio_set {
        return only_self_not_user(IOPRIO_WHO_USER);
    }
    if nr == libc::SYS_socketpair && policy.deny_sockets {
        // socketpair(domain, type, ...): a stream pair only.
        return vec![
            stmt(BPF_LD_W_ABS, off_arg_low(1)),
            stmt(BPF_AND_K, SOCK_TYPE_MASK),
            jump(BPF_JEQ_K, libc::SOCK_STREAM as u32, 0, 1),
            stmt(BPF_RET_K, RET_ALLOW),
            stmt(BPF_RET_K, errno(libc::EPERM)),
        ];
    }
    if nr == libc::SYS_fcntl {
        // fcntl(fd, cmd, ...): no lease. A uid-0 command owns root's files, capabilities
        // or not, and a read lease on one makes every open of it for writing wait out
        // `fs.lease-break-time` (45 s): a command stalled the harness's setup of later calls
        // on its pooled cgroups' files, and could stall any other process opening a file it
        // can read (found by attacking; Landlock has no hook for leases).
        // `F_SETDELEG` (Linux 6.19+) takes the same kind of hold through a delegation.
        return vec![
            stmt(BPF_LD_W_ABS, off_arg_low(1)),
            jump(BPF_JEQ_K, F_SETLEASE, 2, 0),
            jump(BPF_JEQ_K, F_SETDELEG, 1, 0),
            stmt(BPF_RET_K, RET_ALLOW),
            stmt(BPF_RET_K, errno(libc::EPERM)),
        ];
    }
    if nr == libc::SYS_ioctl {
        // ioctl(fd, cmd, ...): the kernel truncates cmd to 32 bits, so comparing the low
        // word is exact.
        let mut cmds = vec![libc::TIOCSTI as u32, libc::TIOCLINUX as u32];
        if policy.read_only {
            cmds.extend(METADATA_IOCTLS);
        }
        let n = cmds.len() as u8;
        let mut block = vec![stmt(BPF_LD_W_ABS, off_arg_low(1))];
        for (i, cmd) in cmds.iter().enumerate() {
            // Jump to the EPERM return, which follows the ALLOW after the last comparison.
            block.push(jump(BPF_JEQ_K, *cmd, n - i as u8, 0));
        }
        block.push(stmt(BPF_RET_K, RET_ALLOW));
        block.push(stmt(BPF_RET_K, errno(libc::EPERM)));
        return block;
    }
    vec![stmt(BPF_RET_K, errno(libc::EPERM))]
}

/// The syscall numbers `policy` singles out, sorted, each with its action (`clone3` unless
/// `Clone3Rule::Left`: the base layer leaves it to the `clone3` layer).
fn singled_out(policy: FilterPolicy, clone3: Clone3Rule) -> Vec<(u32, Vec<libc::sock_filter>)> {
    let mut nrs = always_denied();
    if policy.read_only {
        nrs.extend(metadata_writes());
    }
    if policy.deny_sockets {
        nrs.extend([libc::SYS_socket, libc::SYS_socketpair]);
    }
    nrs.extend(ipc());
    if !matches!(clone3, Clone3Rule::Left) {
        nrs.push(libc::SYS_clone3);
    }
    nrs.extend(OWN_PROCESS_ONLY);
    nrs.extend([
        libc::SYS_clone,
        libc::SYS_fcntl,
        libc::SYS_ioctl,
        libc::SYS_setpriority,
        libc::SYS_ioprio_set,
        libc::SYS_perf_event_open,
    ]);
    nrs.sort_unstable();
    nrs.dedup();
    nrs.into_iter()
        .map(|nr| (nr as u32, action(nr, policy, clone3)))
        .collect()
}

/// A balanced decision tree over `cases` (sorted by number), register A holding the
/// syscall number: `JGE` comparisons down to one case, then its `JEQ` and action, else
/// ALLOW. The kernel emulates a new filter for every syscall number to find those it always
/// allows (`seccomp_cache_prepare`), so the install costs the summed path lengths: a tree
/// takes ~7 steps per number where a linear list of comparisons took ~40 (~100 us per
/// spawn measured here, against ~30 us).
fn tree(cases: &[(u32, Vec<libc::sock_filter>)]) -> Vec<libc::sock_filter> {
    match cases {
        [] => vec![stmt(BPF_RET_K, RET_ALLOW)],
        [(nr, block)] => {
            let mut out = vec![jump(BPF_JEQ_K, *nr, 0, block.len() as u8)];
            out.extend_from_slice(block);
            out.push(stmt(BPF_RET_K, RET_ALLOW));
            out
        }
        _ => {
            let (low, high) = cases.split_at(cases.len() / 2);
            let left = tree(low);
            // Jumps are relative and forward, at most 255 instructions: the left subtree of
            // a filter this size is far shorter (checked by the tests).
            let mut out = vec![jump(BPF_JGE_K, high[0].0, left.len() as u8, 0)];
            out.extend(left);
            out.extend(tree(high));
            out
        }
    }
}

/// The filter program for `policy`, ready for `seccomp(SECCOMP_SET_MODE_FILTER)`.
pub fn build(policy: FilterPolicy) -> Vec<libc::sock_filter> {
    build_with(policy, Clone3Rule::Refused)
}

/// `build(policy)`, except that `clone3` with `key` in its unused argument registers is
/// allowed: the filter of a confined spawner thread, which its children inherit as theirs.
pub fn build_keyed(policy: FilterPolicy, key: Clone3Key) -> Vec<libc::sock_filter> {
    build_with(policy, Clone3Rule::Keyed(key))
}

/// The base layer: `build(policy)` except that `clone3` is allowed. Only ever installed
/// with `clone3_layer()` stacked on it before the command runs.
pub fn build_base(policy: FilterPolicy) -> Vec<libc::sock_filter> {
    build_with(policy, Clone3Rule::Left)
}

/// The `clone3` layer: `clone3` answers `ENOSYS` (see `action`), everything else is left to
/// the filters below it.
pub fn clone3_layer() -> Vec<libc::sock_filter> {
    vec![
        stmt(BPF_LD_W_ABS, OFF_NR),
        jump(BPF_JEQ_K, libc::SYS_clone3 as u32, 0, 1),
        stmt(BPF_RET_K, errno(libc::ENOSYS)),
        stmt(BPF_RET_K, RET_ALLOW),
    ]
}

/// `filter` as the `sock_fprog` seccomp(2) takes; valid while `filter` lives.
pub fn prog(filter: &[libc::sock_filter]) -> libc::sock_fprog {
    libc::sock_fprog {
        len: filter.len() as libc::c_ushort,
        filter: filter.as_ptr() as *mut libc::sock_filter,
    }
}

fn build_with(policy: FilterPolicy, clone3: Clone3Rule) -> Vec<libc::sock_filter> {
    let mut p = vec![
        stmt(BPF_LD_W_ABS, OFF_ARCH),
        jump(BPF_JEQ_K, AUDIT_ARCH, 1, 0),
        stmt(BPF_RET_K, RET_KILL_PROCESS),
        stmt(BPF_LD_W_ABS, OFF_NR),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        // x32 syscalls share the arch value and set bit 30 of the number.
        p.push(jump(BPF_JGE_K, 0x4000_0000, 0, 1));
        p.push(stmt(BPF_RET_K, RET_KILL_PROCESS));
    }
    p.push(jump(BPF_JGE_K, FIRST_UNKNOWN_SYSCALL, 0, 1));
    p.push(stmt(BPF_RET_K, errno(libc::ENOSYS)));
    p.extend(tree(&singled_out(policy, clone3)));
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny interpreter for the subset of classic BPF the filter uses.
    fn run(prog: &[libc::sock_filter], arch: u32, nr: u32, args: [u32; 2]) -> u32 {
        run_counted(prog, arch, nr, args).0
    }

    /// `run`, and the number of instructions it took.
    fn run_counted(prog: &[libc::sock_filter], arch: u32, nr: u32, args: [u32; 2]) -> (u32, usize) {
        let all = [u64::from(args[0]), u64::from(args[1]), 0, 0, 0, 0];
        run_all(prog, arch, nr, all)
    }

    /// `run_counted` with all six arguments, 64 bits each.
    fn run_all(prog: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> (u32, usize) {
        let word = |k: u32| -> Option<u32> {
            let i = usize::try_from(k.checked_sub(off_arg_low(0))? / 8).ok()?;
            let arg = *args.get(i)?;
            Some(if k % 8 == 0 {
                arg as u32
            } else {
                (arg >> 32) as u32
            })
        };
        let mut acc = 0u32;
        let mut x = 0u32;
        let mut pc = 0usize;
        let mut steps = 0usize;
        loop {
            steps += 1;
            let ins = prog[pc];
            match ins.code {
                BPF_LD_W_ABS => {
                    acc = match ins.k {
                        OFF_NR => nr,
                        OFF_ARCH => arch,
                        k => word(k).unwrap_or_else(|| panic!("unexpected load {k}")),
                    };
                    pc += 1;
                }
                BPF_RET_K => return (ins.k, steps),
                BPF_AND_K => {
                    acc &= ins.k;
                    pc += 1;
                }
                BPF_XOR_K => {
                    acc ^= ins.k;
                    pc += 1;
                }
                BPF_OR_X => {
                    acc |= x;
                    pc += 1;
                }
                BPF_TAX => {
                    x = acc;
                    pc += 1;
                }
                BPF_LDX_IMM => {
                    x = ins.k;
                    pc += 1;
                }
                code => {
                    let taken = match code {
                        BPF_JEQ_K => acc == ins.k,
                        BPF_JGE_K => acc >= ins.k,
                        BPF_JSET_K => acc & ins.k != 0,
                        other => panic!("unexpected op {other:#x}"),
                    };
                    pc += 1 + if taken { ins.jt } else { ins.jf } as usize;
                }
            }
        }
    }

    const EPERM: u32 = RET_ERRNO | libc::EPERM as u32;

    #[test]
    fn every_known_number_is_decided_as_listed_in_a_few_steps() {
        for (read_only, deny_sockets) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let policy = FilterPolicy {
                read_only,
                deny_sockets,
            };
            let prog = build(policy);
            let mut denied = always_denied();
            denied.extend(ipc());
            if read_only {
                denied.extend(metadata_writes());
            }
            if deny_sockets {
                denied.extend([libc::SYS_socket, libc::SYS_socketpair]); // type 0: not a stream
            }
            let mut longest = 0;
            for nr in 0..FIRST_UNKNOWN_SYSCALL {
                let expected = if denied.contains(&(nr as i64)) {
                    EPERM
                } else if nr as i64 == libc::SYS_clone3 {
                    RET_ERRNO | libc::ENOSYS as u32
                } else {
                    RET_ALLOW
                };
                let (got, steps) = run_counted(&prog, AUDIT_ARCH, nr, [0, 0]);
                assert_eq!(got, expected, "nr {nr} under {policy:?}");
                let ordinary = !singled_out(policy, Clone3Rule::Refused)
                    .iter()
                    .any(|(n, _)| *n == nr);
                if ordinary {
                    longest = longest.max(steps);
                }
            }
            // The kernel emulates the filter for every number at install: keep paths short
            // (header, ~log2 of the singled-out numbers, a comparison, the return).
            assert!(longest <= 14, "{longest} steps under {policy:?}");
        }
    }

    /// The decision of a stack of filters: the most restrictive return (for the values the
    /// filter uses: KILL_PROCESS, then ERRNO, then ALLOW).
    fn run_stack(progs: &[&[libc::sock_filter]], arch: u32, nr: u32, args: [u32; 2]) -> u32 {
        let rank = |r: u32| match r {
            RET_KILL_PROCESS => 0,
            RET_ALLOW => 2,
            _ => 1,
        };
        progs
            .iter()
            .map(|p| run(p, arch, nr, args))
            .min_by_key(|&r| rank(r))
            .unwrap_or(RET_ALLOW)
    }

    #[test]
    fn the_two_layers_decide_as_the_whole_filter() {
        let layer = clone3_layer();
        for (read_only, deny_sockets) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let policy = FilterPolicy {
                read_only,
                deny_sockets,
            };
            let (whole, base) = (build(policy), build_base(policy));
            let stack: [&[libc::sock_filter]; 2] = [&base, &layer];
            let clone3 = libc::SYS_clone3 as u32;
            assert_eq!(run(&base, AUDIT_ARCH, clone3, [0, 0]), RET_ALLOW);
            for nr in (0..FIRST_UNKNOWN_SYSCALL).chain([FIRST_UNKNOWN_SYSCALL, 0x4000_0001]) {
                for args in [[0, 0], [1, 1], [u32::MAX, u32::MAX], [0x2_0000, 5]] {
                    for arch in [AUDIT_ARCH, 0x4000_0003] {
                        assert_eq!(
                            run_stack(&stack, arch, nr, args),
                            run(&whole, arch, nr, args),
                            "nr {nr} args {args:?} arch {arch:#x} under {policy:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_keyed_filter_decides_as_the_whole_filter_but_for_clone3_with_the_key() {
        let key = Clone3Key::generate().expect("getrandom");
        assert_ne!(
            key,
            Clone3Key::generate().expect("getrandom"),
            "drawn afresh"
        );
        assert_eq!(format!("{key:?}"), "Clone3Key(..)", "never printed");
        let clone3 = libc::SYS_clone3 as u32;
        let enosys = RET_ERRNO | libc::ENOSYS as u32;
        let [a, b, c, d] = key.0;
        for (read_only, deny_sockets) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let policy = FilterPolicy {
                read_only,
                deny_sockets,
            };
            let (whole, keyed) = (build(policy), build_keyed(policy, key));
            for nr in (0..FIRST_UNKNOWN_SYSCALL).chain([FIRST_UNKNOWN_SYSCALL, 0x4000_0001]) {
                for arch in [AUDIT_ARCH, 0x4000_0003] {
                    for args in [[0, 0, 0, 0, 0, 0], [1, 88, a, b, c, d]] {
                        let expected = if nr == clone3 && arch == AUDIT_ARCH && args[2] == a {
                            RET_ALLOW
                        } else {
                            run_all(&whole, arch, nr, args).0
                        };
                        assert_eq!(run_all(&keyed, arch, nr, args).0, expected, "nr {nr}");
                    }
                }
            }
            // Every word of the key counts, each half of it too.
            assert_eq!(
                run_all(&keyed, AUDIT_ARCH, clone3, [0, 0, a, b, c, d]).0,
                RET_ALLOW
            );
            for word in 2..6 {
                for flip in [1u64, 1 << 32, 1 << 63] {
                    let mut args = [0, 0, a, b, c, d];
                    args[word] ^= flip;
                    let (got, _) = run_all(&keyed, AUDIT_ARCH, clone3, args);
                    assert_eq!(got, enosys, "word {word} flipped by {flip:#x}");
                }
            }
            // Nor is the key anywhere else: arguments 0 and 1 are the command's own.
            let shifted = [a, b, c, d, 0, 0];
            assert_eq!(run_all(&keyed, AUDIT_ARCH, clone3, shifted).0, enosys);
        }
    }

    #[test]
    fn a_real_keyed_filter_lets_only_the_key_holder_clone3() {
        // In a forked child: the filter is installed for good.
        let key = Clone3Key::generate().expect("getrandom");
        let prog_vec = build_keyed(
            FilterPolicy {
                read_only: false,
                deny_sockets: false,
            },
            key,
        );
        let fprog = prog(&prog_vec);
        // SAFETY: the child makes raw syscalls only and exits with a code the parent reads.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: raw syscalls in the forked child; clone3 with a zeroed, 64-byte
            // `clone_args` (exit signal 0) whose children exit at once.
            unsafe {
                let installed = libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
                    && libc::syscall(libc::SYS_seccomp, 1u32, 0u32, &fprog) == 0;
                if !installed {
                    libc::_exit(10);
                }
                let args = [0u64; 8];
                let guess = libc::syscall(
                    libc::SYS_clone3,
                    args.as_ptr(),
                    64usize,
                    1u64,
                    2u64,
                    3u64,
                    4u64,
                );
                if guess == 0 {
                    libc::_exit(0);
                }
                let refused = guess < 0 && *libc::__errno_location() == libc::ENOSYS;
                let [a, b, c, d] = key.0;
                let keyed = libc::syscall(libc::SYS_clone3, args.as_ptr(), 64usize, a, b, c, d);
                if keyed == 0 {
                    libc::_exit(0);
                }
                libc::_exit(match (refused, keyed > 0) {
                    (true, true) => 0,
                    (false, _) => 11,
                    (true, false) => 12,
                });
            }
        }
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(libc::WIFEXITED(status), "{status:#x}");
        assert_eq!(
            libc::WEXITSTATUS(status),
            0,
            "10: no filter, 11: a guess passed, 12: the key failed"
        );
    }

    #[test]
    fn every_mode_refuses_a_file_lease_and_no_other_fcntl() {
        for read_only in [false, true] {
            let prog = build(FilterPolicy {
                read_only,
                deny_sockets: false,
            });
            let fcntl = libc::SYS_fcntl as u32;
            assert_eq!(run(&prog, AUDIT_ARCH, fcntl, [3, F_SETLEASE]), EPERM);
            assert_eq!(run(&prog, AUDIT_ARCH, fcntl, [3, F_SETDELEG]), EPERM);
            for cmd in [
                libc::F_GETLEASE,
                libc::F_SETFL,
                libc::F_SETFD,
                libc::F_DUPFD_CLOEXEC,
                libc::F_SETLK,
                libc::F_SETPIPE_SZ,
            ] {
                assert_eq!(run(&prog, AUDIT_ARCH, fcntl, [3, cmd as u32]), RET_ALLOW);
            }
        }
    }

    #[test]
    fn read_only_refuses_metadata_writes_and_nothing_ordinary() {
        let prog = build(FilterPolicy {
            read_only: true,
            deny_sockets: false,
        });
        for nr in metadata_writes() {
            assert_eq!(run(&prog, AUDIT_ARCH, nr as u32, [0, 0]), EPERM, "nr {nr}");
        }
        for nr in [libc::SYS_read, libc::SYS_openat, libc::SYS_socket] {
            assert_eq!(run(&prog, AUDIT_ARCH, nr as u32, [0, 0]), RET_ALLOW);
        }
        let dgram = libc::SOCK_DGRAM as u32;
        let pair = libc::SYS_socketpair as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, pair, [1, dgram]), RET_ALLOW);
        let ioctl = libc::SYS_ioctl as u32;
        for cmd in METADATA_IOCTLS {
            assert_eq!(run(&prog, AUDIT_ARCH, ioctl, [1, cmd]), EPERM, "{cmd:#x}");
        }
        assert_eq!(
            run(&prog, AUDIT_ARCH, ioctl, [1, libc::TIOCSTI as u32]),
            EPERM
        );
        assert_eq!(
            run(&prog, AUDIT_ARCH, ioctl, [1, libc::TCGETS as u32]),
            RET_ALLOW
        );
    }

    #[test]
    fn syscalls_newer_than_the_filter_answer_enosys_in_every_mode() {
        let enosys = RET_ERRNO | libc::ENOSYS as u32;
        for (read_only, deny_sockets) in [(true, true), (false, false)] {
            let prog = build(FilterPolicy {
                read_only,
                deny_sockets,
            });
            for nr in [FIRST_UNKNOWN_SYSCALL, 511, 0x3fff_ffff] {
                assert_eq!(run(&prog, AUDIT_ARCH, nr, [0, 0]), enosys, "nr {nr}");
            }
            let newest = SYS_FILE_SETATTR as u32;
            let expected = if read_only { EPERM } else { RET_ALLOW };
            assert_eq!(run(&prog, AUDIT_ARCH, newest, [0, 0]), expected);
        }
    }

    #[test]
    fn sockets_namespaces_and_foreign_abis() {
        let prog = build(FilterPolicy {
            read_only: false,
            deny_sockets: true,
        });
        let sock = libc::SYS_socket as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, sock, [0, 0]), EPERM);
        let pair = libc::SYS_socketpair as u32;
        let stream = (libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK) as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, pair, [1, stream]), RET_ALLOW);
        for kind in [libc::SOCK_DGRAM, libc::SOCK_SEQPACKET, libc::SOCK_RAW] {
            let kind = (kind | libc::SOCK_CLOEXEC) as u32;
            assert_eq!(run(&prog, AUDIT_ARCH, pair, [1, kind]), EPERM, "{kind}");
        }
        let chmod = libc::SYS_fchmodat as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, chmod, [0, 0]), RET_ALLOW);
        assert_eq!(run(&prog, 0x4000_0003, sock, [0, 0]), RET_KILL_PROCESS);
        let clone = libc::SYS_clone as u32;
        let plain = (libc::CLONE_VM | libc::SIGCHLD) as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, clone, [plain, 0]), RET_ALLOW);
        let userns = plain | libc::CLONE_NEWUSER as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, clone, [userns, 0]), EPERM);
        let sibling = (libc::CLONE_PARENT | libc::SIGCHLD) as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, clone, [sibling, 0]), EPERM);
        let vfork = (libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD) as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, clone, [vfork, 0]), RET_ALLOW);
        let thread = (libc::CLONE_VM
            | libc::CLONE_FS
            | libc::CLONE_FILES
            | libc::CLONE_SIGHAND
            | libc::CLONE_THREAD
            | libc::CLONE_SYSVSEM
            | libc::CLONE_SETTLS
            | libc::CLONE_PARENT_SETTID
            | libc::CLONE_CHILD_CLEARTID) as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, clone, [thread, 0]), RET_ALLOW);
        let clone3 = libc::SYS_clone3 as u32;
        let enosys = RET_ERRNO | libc::ENOSYS as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, clone3, [0, 0]), enosys);
        // perf_event_open(attr, pid, cpu, group_fd, flags): own processes only.
        let perf = libc::SYS_perf_event_open as u32;
        let perf_args = |pid: i32, flags: u64| [1, pid as u32 as u64, 0, u64::MAX, flags, 0];
        assert_eq!(
            run_all(&prog, AUDIT_ARCH, perf, perf_args(0, 0)).0,
            RET_ALLOW
        );
        assert_eq!(
            run_all(&prog, AUDIT_ARCH, perf, perf_args(4242, 8)).0,
            RET_ALLOW
        );
        assert_eq!(run_all(&prog, AUDIT_ARCH, perf, perf_args(-1, 0)).0, EPERM);
        assert_eq!(run_all(&prog, AUDIT_ARCH, perf, perf_args(3, 4)).0, EPERM);
        assert_eq!(run_all(&prog, AUDIT_ARCH, perf, perf_args(3, 0xc)).0, EPERM);
        let ioctl = libc::SYS_ioctl as u32;
        for cmd in METADATA_IOCTLS {
            assert_eq!(
                run(&prog, AUDIT_ARCH, ioctl, [1, cmd]),
                RET_ALLOW,
                "{cmd:#x}"
            );
        }
        assert_eq!(
            run(&prog, AUDIT_ARCH, ioctl, [1, libc::TIOCLINUX as u32]),
            EPERM
        );
        let keyctl = libc::SYS_keyctl as u32;
        assert_eq!(run(&prog, AUDIT_ARCH, keyctl, [0, 0]), EPERM);
    }

    #[test]
    fn limits_and_scheduling_reach_only_the_caller_and_ipc_is_refused() {
        let prlimit = libc::SYS_prlimit64 as u32;
        for (read_only, deny_sockets) in
            [(false, false), (true, false), (false, true), (true, true)]
        {
            let prog = build(FilterPolicy {
                read_only,
                deny_sockets,
            });
            assert_eq!(run(&prog, AUDIT_ARCH, prlimit, [0, 0]), RET_ALLOW);
            for pid in [1, 4242, u32::MAX] {
                assert_eq!(run(&prog, AUDIT_ARCH, prlimit, [pid, 0]), EPERM, "{pid}");
            }
            let getrlimit = libc::SYS_getrlimit as u32;
            assert_eq!(run(&prog, AUDIT_ARCH, getrlimit, [1, 0]), RET_ALLOW);
            for nr in OWN_PROCESS_ONLY {
                assert_eq!(run(&prog, AUDIT_ARCH, nr as u32, [0, 0]), RET_ALLOW);
                assert_eq!(run(&prog, AUDIT_ARCH, nr as u32, [77, 0]), EPERM, "{nr}");
            }
            for (nr, user) in [
                (libc::SYS_setpriority, PRIO_USER),
                (libc::SYS_ioprio_set, IOPRIO_WHO_USER),
            ] {
                let nr = nr as u32;
                assert_eq!(run(&prog, AUDIT_ARCH, nr, [0, 0]), RET_ALLOW); // itself
                assert_eq!(run(&prog, AUDIT_ARCH, nr, [1, 0]), RET_ALLOW); // its group
                assert_eq!(run(&prog, AUDIT_ARCH, nr, [0, 77]), EPERM);
                assert_eq!(run(&prog, AUDIT_ARCH, nr, [user, 0]), EPERM);
            }
            for nr in ipc() {
                assert_eq!(run(&prog, AUDIT_ARCH, nr as u32, [0, 0]), EPERM, "{nr}");
            }
        }
    }
}
