//! Zombies a subreaper harness adopts from its calls.
//!
//! A harness that made itself a child subreaper (`PR_SET_CHILD_SUBREAPER`) becomes the
//! parent of every orphan its calls leave: `sleep 100 &` once bash exits, a `setsid`
//! escapee. When the call's leftovers are killed they turn into the harness's zombies,
//! which nobody else will reap. The supervisor reaps the zombie children that belonged to a
//! settled call — by its cgroup, or by its process group under session containment — and
//! looks again for a moment, since a killed process leaves its cgroup slightly before it
//! becomes a zombie.

use std::fs;
use std::time::{Duration, Instant};

/// How long after a call settles its adopted zombies are looked for.
const LINGER: Duration = Duration::from_millis(500);
/// How often, meanwhile.
pub(crate) const RESCAN: Duration = Duration::from_millis(20);

/// Whose zombies to reap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Tail of the call cgroup's path (`/<service parent>/<call>`), as `/proc/<pid>/cgroup`
    /// shows it.
    Cgroup(String),
    /// The call's process group (session containment).
    Group(libc::pid_t),
}

fn is_subreaper() -> bool {
    let mut flag: libc::c_int = 0;
    // SAFETY: PR_GET_CHILD_SUBREAPER stores an int through a valid pointer.
    unsafe { libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut flag as *mut libc::c_int) };
    flag != 0
}

fn belongs(pid: libc::pid_t, owner: &Owner) -> bool {
    match owner {
        Owner::Cgroup(tail) => fs::read_to_string(format!("/proc/{pid}/cgroup"))
            .map(|t| {
                t.lines()
                    .any(|l| l.starts_with("0::") && l.ends_with(tail.as_str()))
            })
            .unwrap_or(false),
        Owner::Group(pgid) => crate::kill::pgrp_of(pid) == Some(*pgid),
    }
}

/// Settled calls whose adopted zombies are still being looked for.
#[derive(Default)]
pub(crate) struct Adopted {
    pending: Vec<(Owner, Instant)>,
}

impl Adopted {
    /// A call settled: reap its adopted zombies now and for a moment. False when the harness
    /// is no subreaper (nothing to do, nothing pending).
    pub fn settled(&mut self, owner: Owner, now: Instant) -> bool {
        if !is_subreaper() {
            return false;
        }
        self.pending.push((owner, now + LINGER));
        self.reap(now)
    }

    /// One scan; true while something is still pending.
    pub fn reap(&mut self, now: Instant) -> bool {
        if self.pending.is_empty() {
            return false;
        }
        for pid in crate::kill::zombie_children() {
            if self.pending.iter().any(|(owner, _)| belongs(pid, owner)) {
                let mut status = 0;
                // SAFETY: reaps a zombie child of ours without blocking.
                unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            }
        }
        self.pending.retain(|(_, until)| *until > now);
        !self.pending.is_empty()
    }
}
