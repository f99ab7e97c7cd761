//! Everything a confined child applies between clone and exec, prepared in the parent:
//! the Landlock ruleset fd, the seccomp filter, and the plan for dropping privileges.
//!
//! The child only makes raw syscalls on this data (see `spawn.rs`), in this order: drop the
//! capability bounding set and lock the securebits (both need `CAP_SETPCAP`, so they come
//! first), clear effective/permitted/inheritable with `capset` (which clears the ambient
//! set with them), set `no_new_privs`, enforce the Landlock ruleset, install the seccomp
//! filter (last, so that none of the setup syscalls is filtered), then `execve`. A child of
//! a confined spawner thread (`spawner.rs`) inherits the thread's empty bounding set,
//! locked securebits and filter (the whole filter with `clone3` keyed, see `seccomp.rs`),
//! and installs none of its own (only the `clone3` layer, where the thread has no key).

use std::os::fd::{AsRawFd, BorrowedFd, RawFd};

use crate::landlock::{self, BuildError, Enforcement, LandlockRuleset};
use crate::seccomp::{self, FilterPolicy};
use crate::spawn::InheritedFilter;

/// Securebits a confined child locks: root gains nothing from exec (`NOROOT`), uid changes
/// never touch capabilities, ambient capabilities cannot be raised, keep-caps stays off.
pub const LOCKED_SECUREBITS: libc::c_ulong = (libc::SECBIT_NOROOT
    | libc::SECBIT_NOROOT_LOCKED
    | libc::SECBIT_NO_SETUID_FIXUP
    | libc::SECBIT_NO_SETUID_FIXUP_LOCKED
    | libc::SECBIT_KEEP_CAPS_LOCKED
    | libc::SECBIT_NO_CAP_AMBIENT_RAISE
    | libc::SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED)
    as libc::c_ulong;

/// What this process may do about its children's capabilities (read once).
#[derive(Debug, Clone, Copy)]
pub struct CapabilityFacts {
    /// The highest capability number the kernel knows.
    pub last_cap: i32,
    /// The harness holds `CAP_SETPCAP`: it can clear the bounding set and lock securebits.
    pub can_setpcap: bool,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CapHeader {
    pub version: u32,
    pub pid: i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct CapData {
    pub effective: u32,
    pub permitted: u32,
    pub inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
const CAP_SETPCAP: u32 = 8;

fn read_facts() -> CapabilityFacts {
    let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(63)
        .clamp(0, 63);
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills two CapData records for a version-3 header, both owned here.
    let r = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    let can_setpcap = r == 0 && data[0].effective & (1 << CAP_SETPCAP) != 0;
    CapabilityFacts {
        last_cap,
        can_setpcap,
    }
}

/// The capability facts of this process, now.
pub fn capability_facts() -> CapabilityFacts {
    read_facts()
}

/// A confined mode's child-side plan, built once per policy and shared by every spawn.
#[derive(Debug)]
pub struct Confinement {
    pub landlock: LandlockRuleset,
    /// What the filter refuses: confined spawner threads are per policy (`spawner.rs`).
    pub filter_policy: FilterPolicy,
    /// The whole filter, for a child that inherits none.
    filter: Vec<libc::sock_filter>,
    /// The `clone3` layer, for a child that inherits the base layer from its spawner.
    clone3_layer: Vec<libc::sock_filter>,
    pub caps: CapabilityFacts,
}

// SAFETY: `sock_filter` is plain data; the filter is only read after construction.
unsafe impl Send for Confinement {}
// SAFETY: as above, shared read-only.
unsafe impl Sync for Confinement {}

impl Confinement {
    /// Builds the confinement of one policy. `writable_roots` are pinned directory fds
    /// (empty for read-only).
    pub fn build(
        writable_roots: &[BorrowedFd<'_>],
        network: bool,
        read_only: bool,
    ) -> Result<Self, BuildError> {
        let mut landlock = landlock::build(&landlock::Policy {
            writable_roots: writable_roots.to_vec(),
            network,
        })?;
        // The child overwrites fd 3 with a long command's script before it enforces the
        // ruleset: keep the ruleset fd above it.
        landlock.fd = crate::pipes::above_stdio(landlock.fd).map_err(BuildError::Io)?;
        let filter_policy = FilterPolicy {
            read_only,
            deny_sockets: !network,
        };
        Ok(Self {
            landlock,
            filter_policy,
            filter: seccomp::build(filter_policy),
            clone3_layer: seccomp::clone3_layer(),
            // Read at each build (not once per process): a harness that dropped privileges
            // since gets a plan that no longer needs them.
            caps: read_facts(),
        })
    }

    pub fn enforcement(&self) -> Enforcement {
        self.landlock.enforcement
    }

    pub fn missing(&self) -> &[String] {
        &self.landlock.missing
    }

    pub fn landlock_fd(&self) -> RawFd {
        self.landlock.fd.as_raw_fd()
    }

    /// The filter the child installs as the `sock_fprog` seccomp(2) takes, valid while
    /// `self` lives: the whole filter, only the `clone3` layer when the spawning thread
    /// carries the base layer, nothing (an empty program) when it carries the keyed filter,
    /// which is the whole filter for every process but the key's holder.
    pub fn filter_prog(&self, inherited: InheritedFilter) -> libc::sock_fprog {
        seccomp::prog(match inherited {
            InheritedFilter::None => &self.filter,
            InheritedFilter::Base => &self.clone3_layer,
            InheritedFilter::Keyed(_) => &[],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_are_read_and_stable() {
        let a = capability_facts();
        let b = capability_facts();
        assert!(
            a.last_cap >= 37,
            "every supported kernel knows CAP_AUDIT_READ"
        );
        assert_eq!(a.can_setpcap, b.can_setpcap);
    }
}
