//! Landlock rulesets, built in the parent with the `landlock` crate and enforced by the
//! child between clone and exec.
//!
//! The harness is never restricted: this module creates a ruleset, fills it with rules and
//! gives up its fd (`Option<OwnedFd>::from(RulesetCreated)`); `spawn.rs` hands the fd to the
//! vfork child, which calls `landlock_restrict_self` right before `execve`. What a confined
//! mode asks for is fixed (every filesystem right up to ABI 5, TCP bind/connect when the
//! network is denied, signal and abstract-unix-socket scoping from ABI 6); what the running
//! kernel cannot enforce is dropped best-effort by the crate and reported, never silently
//! (`Enforcement::Partial` + `missing`).
//!
//! Rules are built from directory fds the caller pinned, never from paths that may have
//! been swapped since (a workspace renamed and replaced by a symlink to `/` keeps its grant
//! on the original directory, wherever it now is). Device nodes can never be created
//! (`make_char`/`make_block` are never granted) and no terminal device is writable or
//! accepts an ioctl.
//!
//! Reading is granted everywhere but in `/dev`: a terminal's keystrokes, the consoles' text
//! (`/dev/vcs*`), input events and raw disks are readable by their owner without any
//! capability, so a confined command reads only the bit buckets, the random sources and
//! `/dev/shm` there (and lists `/dev`). Landlock rules grant, never subtract: the read rules
//! are built from the children of `/` as they are when the ruleset is built, one rule each,
//! `/dev` left out.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::{open, OFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreated, RulesetCreatedAttr, Scope, ABI,
};

/// The highest ABI whose features a confined mode asks for (scoping).
pub const FULL_ENFORCEMENT_ABI: i32 = 6;

/// Filesystem rights are asked for up to this ABI (`ioctl_dev` is ABI 5).
const FS_ABI: ABI = ABI::V5;

/// The Landlock ABI of the running kernel (0: none). One syscall; the crate keeps its own
/// probe private, and `shellseam doctor` needs the number.
pub fn abi() -> i32 {
    // SAFETY: the version query passes no attribute memory (NULL, size 0).
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32, // LANDLOCK_CREATE_RULESET_VERSION
        )
    };
    if v < 0 {
        0
    } else {
        v as i32
    }
}

/// How completely a mode is enforced on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enforcement {
    Full,
    Partial,
}

impl Enforcement {
    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Partial => "partial",
        }
    }
}

/// What one confined call may do. Roots are directories the caller opened and pinned.
#[derive(Debug)]
pub struct Policy<'a> {
    /// Directories (and their subtrees) with every right but device creation; empty for
    /// read-only.
    pub writable_roots: Vec<BorrowedFd<'a>>,
    /// False: deny TCP bind/connect (ABI 4+; the seccomp filter denies every socket).
    pub network: bool,
}

/// A ruleset ready to be enforced by a child.
#[derive(Debug)]
pub struct LandlockRuleset {
    pub fd: OwnedFd,
    pub enforcement: Enforcement,
    /// Human descriptions of requested features this kernel cannot enforce.
    pub missing: Vec<String>,
}

/// Why a ruleset could not be built.
#[derive(Debug)]
pub enum BuildError {
    Unsupported,
    Ruleset(landlock::RulesetError),
    Io(io::Error),
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unsupported => f.write_str("the kernel does not support Landlock"),
            Self::Ruleset(e) => write!(f, "cannot build the Landlock ruleset: {e}"),
            Self::Io(e) => write!(f, "cannot build the Landlock ruleset: {e}"),
        }
    }
}

impl std::error::Error for BuildError {}

impl BuildError {
    /// The errno behind the failure, when a syscall gave one.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            Self::Unsupported => Some(libc::EOPNOTSUPP),
            Self::Io(e) => e.raw_os_error(),
            Self::Ruleset(_) => None,
        }
    }
}

impl From<landlock::RulesetError> for BuildError {
    fn from(e: landlock::RulesetError) -> Self {
        Self::Ruleset(e)
    }
}

/// Features a policy asks for that a kernel with `abi` lacks.
pub fn missing_features(abi: i32, network: bool) -> Vec<String> {
    let mut missing = Vec::new();
    if abi < 1 {
        missing.push("landlock (kernel has no Landlock support)".to_string());
        return missing;
    }
    if abi < 2 {
        missing.push("fs refer (ABI 2): cross-directory rename/link control".to_string());
    }
    if abi < 3 {
        missing.push("fs truncate (ABI 3)".to_string());
    }
    if abi < 4 && !network {
        missing.push("net tcp bind/connect (ABI 4): TCP is denied by seccomp only".to_string());
    }
    if abi < 5 {
        missing.push("fs ioctl_dev (ABI 5)".to_string());
    }
    if abi < 6 {
        missing.push("scope signal + abstract unix socket (ABI 6)".to_string());
    }
    missing
}

/// Every filesystem right a confined mode handles.
fn handled_fs() -> BitFlags<AccessFs> {
    AccessFs::from_all(FS_ABI)
}

/// What a writable root grants: everything handled except creating device nodes.
pub fn writable_rights() -> BitFlags<AccessFs> {
    handled_fs() & !(AccessFs::MakeChar | AccessFs::MakeBlock)
}

/// What the filesystem outside `/dev` grants: read and execute; no ioctl on any device.
fn readable_rights() -> BitFlags<AccessFs> {
    AccessFs::ReadFile | AccessFs::ReadDir | AccessFs::Execute
}

/// What may be opened in `/dev`: the bit buckets read and write, the random sources and
/// `/dev/shm` read; never a terminal, console, input device or disk. (`/dev/std*` and
/// `/proc/self/fd/*` reach the command's own pipes, which Landlock does not mediate.)
fn device_rules() -> [(&'static str, BitFlags<AccessFs>); 6] {
    let bucket = AccessFs::ReadFile | AccessFs::WriteFile | AccessFs::Truncate;
    let source = BitFlags::from(AccessFs::ReadFile);
    [
        ("/dev/null", bucket),
        ("/dev/zero", bucket),
        ("/dev/full", bucket),
        ("/dev/random", source),
        ("/dev/urandom", source),
        ("/dev/shm", readable_rights()),
    ]
}

/// Where nothing may be read but what `READABLE_WITHIN` grants back: `/dev` (its few
/// devices come from `device_rules`), `/sys/kernel`, and the kernel's tracing and
/// debugging file systems wherever else they are mounted. `/sys/kernel` holds them
/// (`tracing`, `debug`: a trace buffer records every process's syscalls with their
/// arguments, the harness's included, once anybody enables an event) and root-only files
/// (`vmcoreinfo`: the kernel's address layout; `boot_params`), all open to a root-uid
/// command through their owner-only modes. Each unreadable path costs a rule per sibling
/// on its way down, and every rule is copied into each confined child's domain (~0.7 us
/// per rule here): `/sys/kernel` whole rather than two of its 26 entries.
const UNREADABLE: [&str; 2] = ["/dev", "/sys/kernel"];

/// What is read beneath an unreadable path: `/sys/kernel/mm` (transparent huge page
/// settings, which the JVM, Go's runtime and allocators read).
const READABLE_WITHIN: [&str; 1] = ["/sys/kernel/mm"];

/// `UNREADABLE`, and every tracefs or debugfs mount point elsewhere.
fn unreadable() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = UNREADABLE.iter().map(PathBuf::from).collect();
    if let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") {
        for line in mounts.lines() {
            let mut fields = line.split(' ');
            let (Some(_), Some(at), Some(kind)) = (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if kind == "tracefs" || kind == "debugfs" {
                // Spaces and the like are octal escapes (`\040`) in this file.
                let at = at
                    .replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\134", "\\");
                if !paths.iter().any(|p| p.as_os_str() == at.as_str()) {
                    paths.push(PathBuf::from(at));
                }
            }
        }
    }
    paths
}

/// Every directory and regular file under `/` that may be read, with what reading it
/// grants: the entries of `/`, but where an `unreadable` path lies beneath an entry, that
/// entry's own entries instead (recursively), the unreadable one left out. An entry that
/// cannot be opened, a symlink (its target is reached where it lies) or a device node
/// grants nothing: skipping only narrows access.
fn top_level_rules() -> io::Result<Vec<(OwnedFd, BitFlags<AccessFs>)>> {
    let hidden = unreadable();
    let mut rules = Vec::new();
    grant_beneath(Path::new("/"), &hidden, &mut rules)?;
    for path in READABLE_WITHIN {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        if let Ok(fd) = open(path, flags, Mode::empty()) {
            rules.push((fd, readable_rights()));
        }
    }
    Ok(rules)
}

fn grant_beneath(
    dir: &Path,
    hidden: &[PathBuf],
    rules: &mut Vec<(OwnedFd, BitFlags<AccessFs>)>,
) -> io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if hidden.contains(&path) {
            continue;
        }
        let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let Ok(fd) = open(&path, flags, Mode::empty()) else {
            continue;
        };
        // The type of what was opened, not of what the name held when listed.
        let Ok(st) = fstat(&fd) else {
            continue;
        };
        let rights = match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFDIR if hidden.iter().any(|h| h.starts_with(&path)) => {
                // Something beneath is unreadable: its siblings one by one. A directory
                // that cannot be listed grants nothing.
                let _ = grant_beneath(&path, hidden, rules);
                continue;
            }
            SFlag::S_IFDIR => readable_rights(),
            SFlag::S_IFREG => AccessFs::ReadFile | AccessFs::Execute,
            _ => continue,
        };
        rules.push((fd, rights));
    }
    Ok(())
}

/// Adds the read rules: listing `/` (and, beneath it, any directory), the entries of
/// `top_level_rules`, and the devices of `device_rules`.
fn allow_reading(created: RulesetCreated) -> Result<RulesetCreated, BuildError> {
    let root = PathFd::new("/").map_err(|e| BuildError::Io(io::Error::other(e.to_string())))?;
    let mut created = created.add_rule(PathBeneath::new(root, AccessFs::ReadDir))?;
    for (fd, rights) in top_level_rules().map_err(BuildError::Io)? {
        created = created.add_rule(PathBeneath::new(fd, rights))?;
    }
    for (dev, rights) in device_rules() {
        if let Ok(fd) = PathFd::new(dev) {
            created = created.add_rule(PathBeneath::new(fd, rights))?;
        }
    }
    Ok(created)
}

/// Builds the ruleset of a confined mode for the running kernel.
pub fn build(policy: &Policy<'_>) -> Result<LandlockRuleset, BuildError> {
    let abi = abi();
    if abi < 1 {
        return Err(BuildError::Unsupported);
    }
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(handled_fs())?
        .scope(Scope::AbstractUnixSocket | Scope::Signal)?;
    if !policy.network {
        ruleset = ruleset.handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)?;
    }
    let mut created = allow_reading(ruleset.create()?)?;
    for root in &policy.writable_roots {
        created = created.add_rule(PathBeneath::new(root.as_fd(), writable_rights()))?;
    }
    let fd: Option<OwnedFd> = created.into();
    let fd = fd.ok_or(BuildError::Unsupported)?;
    let enforcement = if abi >= FULL_ENFORCEMENT_ABI {
        Enforcement::Full
    } else {
        Enforcement::Partial
    };
    Ok(LandlockRuleset {
        fd,
        enforcement,
        missing: missing_features(abi, policy.network),
    })
}

/// Names of the filesystem rights this kernel can enforce, for `shellseam doctor`.
pub fn kernel_fs_rights() -> Vec<String> {
    const NAMES: &[(AccessFs, &str)] = &[
        (AccessFs::Execute, "execute"),
        (AccessFs::WriteFile, "write_file"),
        (AccessFs::ReadFile, "read_file"),
        (AccessFs::ReadDir, "read_dir"),
        (AccessFs::RemoveDir, "remove_dir"),
        (AccessFs::RemoveFile, "remove_file"),
        (AccessFs::MakeChar, "make_char"),
        (AccessFs::MakeDir, "make_dir"),
        (AccessFs::MakeReg, "make_reg"),
        (AccessFs::MakeSock, "make_sock"),
        (AccessFs::MakeFifo, "make_fifo"),
        (AccessFs::MakeBlock, "make_block"),
        (AccessFs::MakeSym, "make_sym"),
        (AccessFs::Refer, "refer"),
        (AccessFs::Truncate, "truncate"),
        (AccessFs::IoctlDev, "ioctl_dev"),
    ];
    let abi = abi();
    if abi < 1 {
        return Vec::new();
    }
    let kernel = AccessFs::from_all(ABI::from(abi.min(FS_ABI as i32)));
    NAMES
        .iter()
        .filter(|(right, _)| kernel.contains(*right))
        .map(|(_, name)| (*name).to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn writable_roots_never_grant_device_creation() {
        let rights = writable_rights();
        assert!(!rights.contains(AccessFs::MakeChar));
        assert!(!rights.contains(AccessFs::MakeBlock));
        assert!(rights.contains(AccessFs::WriteFile | AccessFs::Refer | AccessFs::Truncate));
        assert!(!readable_rights().contains(AccessFs::IoctlDev));
        for (dev, rights) in device_rules() {
            assert!(!rights.contains(AccessFs::IoctlDev), "{dev}");
        }
    }

    #[test]
    fn reading_covers_every_top_level_directory_but_dev() {
        let identity = |st: nix::sys::stat::FileStat| (st.st_dev, st.st_ino);
        let granted: Vec<_> = top_level_rules()
            .expect("list /")
            .into_iter()
            .map(|(fd, rights)| (identity(fstat(&fd).expect("fstat")), rights))
            .collect();
        let id_of = |p: &str| nix::sys::stat::stat(p).ok().map(identity);
        let has = |p: &str| id_of(p).is_some_and(|id| granted.iter().any(|(g, _)| *g == id));
        let usr = id_of("/usr").expect("stat /usr");
        assert!(granted.contains(&(usr, readable_rights())));
        // Nothing for /dev, nor for /sys/kernel and what it holds but mm; /sys entry by
        // entry instead of whole.
        let unreadable = ["/dev", "/sys", "/sys/kernel", "/sys/kernel/tracing"];
        for path in unreadable.into_iter().chain(["/sys/kernel/debug"]) {
            assert!(!has(path), "{path}");
        }
        for readable in ["/etc", "/sys/fs", "/sys/kernel/mm"] {
            assert!(has(readable) || id_of(readable).is_none(), "{readable}");
        }
        // One rule per directory and regular file of `/` but /dev and /sys, then of /sys
        // but /sys/kernel, then /sys/kernel/mm; none for a symlink (`/bin -> usr/bin` on
        // merged-usr systems) or a device node.
        let plain = |dir: &str, but: &[&str]| {
            std::fs::read_dir(dir)
                .map(|entries| {
                    entries
                        .filter_map(|e| e.ok())
                        .filter(|e| !but.contains(&e.path().to_string_lossy().as_ref()))
                        .filter_map(|e| e.path().symlink_metadata().ok())
                        .filter(|m| m.is_dir() || m.is_file())
                        .count()
                })
                .unwrap_or(0)
        };
        let expected = plain("/", &["/dev", "/sys"])
            + plain("/sys", &["/sys/kernel"])
            + usize::from(id_of("/sys/kernel/mm").is_some());
        assert_eq!(granted.len(), expected);
    }

    #[test]
    fn missing_features_name_what_old_kernels_lack() {
        assert!(missing_features(7, false).is_empty());
        assert!(missing_features(6, true).is_empty());
        let m = missing_features(3, false);
        assert!(m.iter().any(|s| s.contains("ABI 4")));
        assert!(m.iter().any(|s| s.contains("ABI 6")));
        assert!(missing_features(0, true)[0].contains("no Landlock"));
    }

    #[test]
    fn builds_a_ruleset_on_this_kernel() {
        if abi() < 1 {
            return;
        }
        let tmp = PathFd::new("/tmp").expect("open /tmp");
        let rs = build(&Policy {
            writable_roots: vec![tmp.as_fd()],
            network: false,
        })
        .expect("ruleset");
        assert!(rs.fd.as_raw_fd() >= 0);
        assert!(!kernel_fs_rights().is_empty());
    }
}
