//! The service's containment glue on `Shared`: its cgroups (created on the first contained
//! call and announced to the keeper), the keeper itself, and what happens when a call
//! settles: its stray zombies are reaped, its cgroup goes back to the pool or is queued for
//! removal off the caller's path, and late zombies are looked for on a rescan timer.

use std::ffi::CString;
use std::time::Instant;

use super::{Shared, Source};
use crate::adopted::Owner;
use crate::cgroup::{hierarchy, CallCgroup, ServiceCgroups};
use crate::contain::{cgroup_tail, CallContainment};
use crate::keeper::Keeper;
use crate::sys::{eventfd_raise, lock};
use nix::sys::epoll::EpollFlags;
/// The keeper's command line and, once started, the keeper (see `keeper.rs`).
#[derive(Default)]
pub(super) struct KeeperSlot {
    pub(super) command: Option<(CString, Vec<CString>)>,
    pub(super) keep_spill: bool,
    pub(super) running: Option<Keeper>,
    pub(super) spill_told: bool,
}

impl Shared {
    /// The service's cgroups, created on first use; None where the host has none.
    pub(super) fn cgroups(&self) -> Option<&ServiceCgroups> {
        self.cgroups
            .get_or_init(|| {
                let set = ServiceCgroups::new(hierarchy()).ok()?;
                self.tell_keeper(|k| {
                    k.send(&format!("cgroup {}", set.parent().display()));
                    for dir in set.parents().iter().skip(1) {
                        k.send(&format!("dir {}", dir.display()));
                    }
                });
                Some(set)
            })
            .as_ref()
    }

    /// Runs `f` with the keeper, starting it on first use (no keeper configured: no-op).
    pub(super) fn tell_keeper(&self, f: impl FnOnce(&mut Keeper)) {
        let mut slot = lock(&self.keeper);
        if slot.running.is_none() {
            let Some((program, argv)) = slot.command.clone() else {
                return;
            };
            match Keeper::start(&program, argv) {
                Ok(k) => slot.running = Some(k),
                Err(_) => {
                    slot.command = None; // no keeper on this host; do not retry per call
                    return;
                }
            }
        }
        if let Some(k) = &mut slot.running {
            f(k);
        }
    }

    /// Tells the keeper about the spill directory once it exists (unless it is kept).
    pub fn note_spill_dir(&self) {
        let told = {
            let slot = lock(&self.keeper);
            slot.spill_told || slot.keep_spill
        };
        if told {
            return;
        }
        let Some(dir) = lock(&self.spill).path().map(|p| p.to_path_buf()) else {
            return;
        };
        self.tell_keeper(|k| k.send(&format!("spill {}", dir.display())));
        lock(&self.keeper).spill_told = true;
    }

    /// Watches the call's v1 OOM events (when it has a memory limit there), so that an OOM
    /// kill inside the call ends all of it, as the SPEC's "the call is killed" says.
    pub fn watch_oom(&self, token: u64, contain: &mut CallContainment) {
        let Some(cg) = &contain.cgroup else { return };
        if contain.oom.is_some() {
            return;
        }
        if let Ok(Some(fd)) = cg.oom_events() {
            let key = self
                .watch(&fd, EpollFlags::EPOLLIN, Source::Oom(token))
                .ok();
            contain.oom = Some((fd, key));
        }
    }

    /// Stops watching the call's OOM events (the eventfd's close ends the registration).
    pub fn unwatch_oom(&self, contain: &mut CallContainment) {
        if let Some((fd, key)) = contain.oom.take() {
            self.unwatch(&fd, key);
        }
    }

    /// Watches the call's `cgroup.events` so that its emptying wakes the loop.
    pub fn watch_cgroup_events(&self, token: u64, contain: &mut CallContainment) {
        let Some(cg) = &contain.cgroup else { return };
        if contain.events.is_some() {
            return;
        }
        if let Ok(fd) = cg.events_fd() {
            crate::cgroup::rearm_events(&fd);
            let key = self
                .watch(&fd, EpollFlags::EPOLLPRI, Source::Cgroup(token))
                .ok();
            contain.events = Some((fd, key));
        }
    }

    /// The call settled. While its leader is still an unreaped zombie: stop watching it,
    /// kill what is left of a session-contained call's group, reap its stray zombies, let
    /// the keeper forget a session group. Then `release_leader`, and only after that does its cgroup go back to the pool: when
    /// nothing is left charged to it (see `ServiceCgroups::reusable`) and no zombie of the
    /// call can still turn up. Otherwise it is queued for removal off the caller's path.
    /// Zombies of the call still to come are looked for a moment (for a subreaper harness,
    /// those of every call not pooled).
    pub fn end_containment(
        &self,
        pgid: libc::pid_t,
        contain: &mut CallContainment,
        release_leader: impl FnOnce(&CallContainment) -> bool,
    ) {
        if let Some((fd, key)) = contain.events.take() {
            self.unwatch(&fd, key);
        }
        self.unwatch_oom(contain);
        contain.end_group(pgid);
        contain.reap_strays(pgid);
        if contain.cgroup.is_none() {
            self.tell_keeper(|k| k.ungroup(pgid));
        }
        let traced = release_leader(contain);
        let leader = contain.leader.take();
        if let (true, Some(fd)) = (traced, &leader) {
            // A tracer outside the call holds the zombie leader: reaped once it lets go,
            // so that no zombie of the call stays with the harness.
            if let Ok(fd) = fd.try_clone() {
                let now = Instant::now();
                if let Some(at) = lock(&self.adopted).hold_leader(fd, contain.leader_pid, now) {
                    self.add_timer(at, 0, true);
                }
            }
        }
        let (held, coming) = contain.left_behind();
        let owner = match contain.cgroup.take() {
            Some(mut cg) => {
                if let Some(set) = self.cgroups.get().and_then(Option::as_ref) {
                    if !held && set.reusable(&cg, contain.emptied) {
                        // The common case, at once: no fd of the call outlives its completion.
                        set.pool(cg);
                        return;
                    }
                }
                let tail = cgroup_tail(cg.path());
                // rmdir or a populated check: off the caller's path. No fd of the call
                // outlives its completion meanwhile (a warm cgroup is replaced at once).
                match self.cgroups.get().and_then(Option::as_ref) {
                    Some(set) => set.lost(&mut cg),
                    None => cg.close(),
                }
                lock(&self.releases).push(cg);
                eventfd_raise(&self.wake);
                Owner::Cgroup(tail)
            }
            None => match leader {
                Some(leader) => Owner::Group(pgid, leader),
                None => return,
            },
        };
        let now = Instant::now();
        if let Some(at) = lock(&self.adopted).settled(owner, coming, now) {
            self.add_timer(at, 0, true);
        }
    }

    /// Looks again for adopted zombies of settled calls (subreaper harnesses only).
    pub(super) fn reap_adopted(&self) {
        let now = Instant::now();
        if let Some(at) = lock(&self.adopted).reap(now) {
            self.add_timer(at, 0, false);
        }
    }

    /// Removes cgroups that cannot be reused (supervisor thread, no process lock held).
    pub(super) fn recycle(&self) {
        let done: Vec<CallCgroup> = std::mem::take(&mut *lock(&self.releases));
        if let Some(set) = self.cgroups.get().and_then(Option::as_ref) {
            for cg in done {
                set.release(cg);
            }
        }
    }
}
