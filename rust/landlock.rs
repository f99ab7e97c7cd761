//! Landlock rulesets, built in the parent and enforced by the child between clone and exec.
//!
//! The harness is never restricted: this module only creates a ruleset fd and fills it with
//! rules; `spawn.rs` hands the fd to the child, which calls `prctl(PR_SET_NO_NEW_PRIVS)` and
//! `landlock_restrict_self` right before `execve`. What a confined mode asks for is fixed
//! (every filesystem right up to ABI 5, TCP bind/connect when the network is denied, signal
//! and abstract-unix-socket scoping from ABI 6); what the running kernel cannot enforce is
//! dropped best-effort and reported, never silently (`Enforcement::Partial` + `missing`).

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

// Filesystem access rights, by the ABI that introduced them.
const FS_EXECUTE: u64 = 1 << 0;
const FS_WRITE_FILE: u64 = 1 << 1;
const FS_READ_FILE: u64 = 1 << 2;
const FS_READ_DIR: u64 = 1 << 3;
const FS_REMOVE_DIR: u64 = 1 << 4;
const FS_REMOVE_FILE: u64 = 1 << 5;
const FS_MAKE_CHAR: u64 = 1 << 6;
const FS_MAKE_DIR: u64 = 1 << 7;
const FS_MAKE_REG: u64 = 1 << 8;
const FS_MAKE_SOCK: u64 = 1 << 9;
const FS_MAKE_FIFO: u64 = 1 << 10;
const FS_MAKE_BLOCK: u64 = 1 << 11;
const FS_MAKE_SYM: u64 = 1 << 12;
const FS_REFER: u64 = 1 << 13; // ABI 2
const FS_TRUNCATE: u64 = 1 << 14; // ABI 3
const FS_IOCTL_DEV: u64 = 1 << 15; // ABI 5

const FS_ABI1: u64 = (1 << 13) - 1;
const NET_BIND_TCP: u64 = 1 << 0; // ABI 4
const NET_CONNECT_TCP: u64 = 1 << 1; // ABI 4
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0; // ABI 6
const SCOPE_SIGNAL: u64 = 1 << 1; // ABI 6

const CREATE_RULESET_VERSION: u32 = 1 << 0;
const RULE_PATH_BENEATH: libc::c_int = 1;

/// Rights that make sense on a non-directory (Landlock rejects directory rights there).
const FILE_RIGHTS: u64 = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV;

/// The highest ABI whose features a confined mode asks for (scoping).
pub const FULL_ENFORCEMENT_ABI: i32 = 6;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// The Landlock ABI of the running kernel (0: none).
pub fn abi() -> i32 {
    // SAFETY: the version query passes no attribute memory.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    if v < 0 {
        0
    } else {
        v as i32
    }
}

/// Filesystem rights the kernel of `abi` knows.
fn fs_rights_for(abi: i32) -> u64 {
    let mut rights = FS_ABI1;
    if abi >= 2 {
        rights |= FS_REFER;
    }
    if abi >= 3 {
        rights |= FS_TRUNCATE;
    }
    if abi >= 5 {
        rights |= FS_IOCTL_DEV;
    }
    rights
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

/// What one confined call may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Directories (and their subtrees) with full access; empty for read-only.
    pub writable_roots: Vec<String>,
    /// False: deny TCP bind/connect (ABI 4+).
    pub network: bool,
}

/// A ruleset ready to be enforced by a child.
#[derive(Debug)]
pub struct Ruleset {
    pub fd: OwnedFd,
    pub enforcement: Enforcement,
    /// Human descriptions of requested features this kernel cannot enforce.
    pub missing: Vec<String>,
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
        missing.push("net tcp bind/connect (ABI 4): network=False not enforced".to_string());
    }
    if abi < 5 {
        missing.push("fs ioctl_dev (ABI 5)".to_string());
    }
    if abi < 6 {
        missing.push("scope signal + abstract unix socket (ABI 6)".to_string());
    }
    missing
}

fn open_path(path: &str) -> Option<(OwnedFd, bool)> {
    let c = CString::new(path).ok()?;
    // SAFETY: opens a NUL-terminated path with O_PATH; returns a new fd or -1.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    if fd < 0 {
        return None;
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let is_dir = Path::new(path).is_dir();
    Some((fd, is_dir))
}

fn add_path_rule(ruleset: &OwnedFd, path: &str, access: u64) -> io::Result<()> {
    // A root that does not exist grants nothing: skipping it only narrows access.
    let Some((fd, is_dir)) = open_path(path) else {
        return Ok(());
    };
    let allowed = if is_dir { access } else { access & FILE_RIGHTS };
    let attr = PathBeneathAttr {
        allowed_access: allowed,
        parent_fd: fd.as_raw_fd(),
    };
    // SAFETY: `attr` is a valid packed path-beneath attribute that outlives the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            ruleset.as_raw_fd(),
            RULE_PATH_BENEATH,
            &attr as *const PathBeneathAttr,
            0u32,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Device files a read-only command may still write (and what `/dev/std*` needs).
const WRITABLE_DEVICES: &[&str] = &[
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/tty",
    "/dev/pts",
];

/// Builds the ruleset of a confined mode for the running kernel.
pub fn build(policy: &Policy) -> io::Result<Ruleset> {
    let abi = abi();
    if abi < 1 {
        return Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel does not support Landlock",
        ));
    }
    let handled_fs = fs_rights_for(abi);
    let attr = RulesetAttr {
        handled_access_fs: handled_fs,
        handled_access_net: if abi >= 4 && !policy.network {
            NET_BIND_TCP | NET_CONNECT_TCP
        } else {
            0
        },
        scoped: if abi >= 6 {
            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        } else {
            0
        },
    };
    // Older kernels know a shorter attribute; pass only what they understand.
    let size = if abi >= 6 {
        24usize
    } else if abi >= 4 {
        16
    } else {
        8
    };
    // SAFETY: `attr` is a valid ruleset attribute of at least `size` bytes.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            size,
            0u32,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh ruleset fd (close-on-exec by the kernel) owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };

    add_path_rule(&fd, "/", FS_READ_FILE | FS_READ_DIR | FS_EXECUTE)?;
    let device_rights = FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV;
    for dev in WRITABLE_DEVICES {
        add_path_rule(&fd, dev, device_rights & handled_fs)?;
    }
    for root in &policy.writable_roots {
        add_path_rule(&fd, root, handled_fs)?;
    }
    let missing = missing_features(abi, policy.network);
    let enforcement = if abi >= FULL_ENFORCEMENT_ABI {
        Enforcement::Full
    } else {
        Enforcement::Partial
    };
    Ok(Ruleset {
        fd,
        enforcement,
        missing,
    })
}

/// Every filesystem right of the highest ABI this module knows (for tests and doctor).
pub fn all_fs_rights() -> u64 {
    FS_ABI1 | FS_REFER | FS_TRUNCATE | FS_IOCTL_DEV
}

/// Lists the named rights in `mask` (for `shellseam doctor`).
pub fn describe_fs_rights(mask: u64) -> Vec<&'static str> {
    const NAMES: &[(u64, &str)] = &[
        (FS_EXECUTE, "execute"),
        (FS_WRITE_FILE, "write_file"),
        (FS_READ_FILE, "read_file"),
        (FS_READ_DIR, "read_dir"),
        (FS_REMOVE_DIR, "remove_dir"),
        (FS_REMOVE_FILE, "remove_file"),
        (FS_MAKE_CHAR, "make_char"),
        (FS_MAKE_DIR, "make_dir"),
        (FS_MAKE_REG, "make_reg"),
        (FS_MAKE_SOCK, "make_sock"),
        (FS_MAKE_FIFO, "make_fifo"),
        (FS_MAKE_BLOCK, "make_block"),
        (FS_MAKE_SYM, "make_sym"),
        (FS_REFER, "refer"),
        (FS_TRUNCATE, "truncate"),
        (FS_IOCTL_DEV, "ioctl_dev"),
    ];
    NAMES
        .iter()
        .filter(|(bit, _)| mask & bit != 0)
        .map(|(_, name)| *name)
        .collect()
}

/// Filesystem rights of the running kernel, for reporting.
pub fn kernel_fs_rights() -> u64 {
    let abi = abi();
    if abi < 1 {
        0
    } else {
        fs_rights_for(abi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn abi_rights_grow_monotonically() {
        assert!(fs_rights_for(1) < fs_rights_for(2));
        assert!(fs_rights_for(3) < fs_rights_for(5));
        assert_eq!(fs_rights_for(7), all_fs_rights());
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
        let rs = build(&Policy {
            writable_roots: vec!["/tmp".into()],
            network: false,
        })
        .unwrap();
        assert!(rs.fd.as_raw_fd() >= 0);
    }
}
