//! The confined spawner: one thread per service that spawns the confined children of a
//! privileged harness, its own capability bounding set already empty and its securebits
//! already locked.
//!
//! A confined child of a harness holding `CAP_SETPCAP` must clear its bounding set, one
//! `PR_CAPBSET_DROP` per capability: 41 credential commits, ~70 us measured here per spawn,
//! more than anything else the sandbox adds. Both the bounding set and the securebits are
//! per-thread credentials that a child inherits, so this thread drops and locks them once,
//! when it starts, and every child it clones starts with them; the child still empties its
//! effective, permitted, inheritable and ambient sets itself (one `capset`, one `prctl`).
//! The thread never runs Python and never execs: only its children see these credentials.
//! Handing a spawn to it and back costs two thread wake-ups, a fraction of the drops saved.

use std::sync::mpsc;
use std::sync::Mutex;
use std::thread::JoinHandle;

use crate::confine::LOCKED_SECUREBITS;
use crate::errors::{SpawnError, SpawnStage};
use crate::spawn::{spawn, SpawnPlan, Spawned};
use crate::sys::lock;

type Reply = mpsc::SyncSender<Result<Spawned, SpawnError>>;

/// The thread and its job queue.
pub struct ConfinedSpawner {
    jobs: Mutex<Option<mpsc::Sender<(SpawnPlan, Reply)>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// Clears the calling thread's bounding set (capabilities `0..=last_cap`) and locks its
/// securebits; false if the kernel refused any step (the thread is then of no use).
fn drop_for_children(last_cap: i32) -> bool {
    for cap in 0..=last_cap {
        // SAFETY: prctl with integer arguments only.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return false;
        }
    }
    // SAFETY: as above.
    unsafe { libc::prctl(libc::PR_SET_SECUREBITS, LOCKED_SECUREBITS, 0, 0, 0) == 0 }
}

impl ConfinedSpawner {
    /// Starts the thread; None when it could not be started or could not drop the
    /// privileges (the caller's children then drop them themselves).
    pub fn start(last_cap: i32) -> Option<Self> {
        let (jobs, queue) = mpsc::channel::<(SpawnPlan, Reply)>();
        let (ready_tx, ready) = mpsc::sync_channel(1);
        let thread = std::thread::Builder::new()
            .name("shellseam-spawn".into())
            .spawn(move || {
                let ok = drop_for_children(last_cap);
                let _ = ready_tx.send(ok);
                if !ok {
                    return;
                }
                for (plan, reply) in queue {
                    let _ = reply.send(spawn(&plan));
                }
            })
            .ok()?;
        if ready.recv() != Ok(true) {
            let _ = thread.join();
            return None;
        }
        Some(Self {
            jobs: Mutex::new(Some(jobs)),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Spawns `plan` on the thread (its children inherit the dropped bounding set and the
    /// locked securebits: `plan.bounding_set_cleared` is set) and waits for the result.
    pub fn spawn(&self, mut plan: SpawnPlan) -> Result<Spawned, SpawnError> {
        plan.bounding_set_cleared = true;
        let (reply, answer) = mpsc::sync_channel(1);
        let sent = match lock(&self.jobs).as_ref() {
            Some(jobs) => jobs.send((plan, reply)).is_ok(),
            None => false,
        };
        if !sent {
            return Err(SpawnError::new(SpawnStage::Clone, libc::ESRCH));
        }
        answer
            .recv()
            .unwrap_or_else(|_| Err(SpawnError::new(SpawnStage::Clone, libc::ESRCH)))
    }

    /// Ends the thread (after the spawns already queued).
    pub fn stop(&self) {
        drop(lock(&self.jobs).take());
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    /// The bounding set line of /proc/<pid>/status.
    fn cap_bnd(pid: i32) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("CapBnd:"))
            .unwrap_or_default()
            .to_string()
    }

    #[test]
    fn children_of_the_spawner_start_without_a_bounding_set() {
        let facts = crate::confine::capability_facts();
        if !facts.can_setpcap {
            return; // an unprivileged harness has nothing to drop
        }
        let Some(spawner) = ConfinedSpawner::start(facts.last_cap) else {
            panic!("a harness with CAP_SETPCAP starts the spawner");
        };
        let c = |s: &str| CString::new(s).unwrap();
        let plan = SpawnPlan::new(
            c("/bin/sleep"),
            vec![c("sleep"), c("5")],
            std::sync::Arc::new(vec![]),
            c("/"),
        );
        let child = spawner.spawn(plan).expect("spawn");
        let bnd = cap_bnd(child.pid);
        // SAFETY: kills and reaps our own child.
        unsafe {
            libc::kill(child.pid, libc::SIGKILL);
        }
        crate::sys::reap_blocking(child.pid);
        spawner.stop();
        assert_eq!(bnd, "CapBnd:\t0000000000000000");
        // This thread (the caller's) keeps its own.
        assert_ne!(
            cap_bnd(std::process::id() as i32),
            "CapBnd:\t0000000000000000"
        );
    }
}
