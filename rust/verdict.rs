//! The resource verdict of a settled call: which limit it exceeded, how its limits were
//! enforced, and its CPU time (`ShellResources` in SPEC §2).
//!
//! The cgroup knows its own verdicts (OOM kill, refused forks, the CPU kill). A file-size
//! hit, and a CPU hit under a per-process rlimit, are read from how the command ended: the
//! signal, bash's `128+n` status, or bash's message about a job it saw killed.

use crate::contain::{CallLimits, Resources};
use crate::process::Outcome;

/// How bash reports a job killed by SIGXFSZ / SIGXCPU.
const XFSZ_TEXT: &str = "File size limit exceeded";
const XCPU_TEXT: &str = "CPU time limit exceeded";

/// What `ShellResources` says of a call beyond the core's raw facts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// `"memory"`, `"processes"`, `"cpu"`, `"file_size"` or None.
    pub limit_exceeded: Option<&'static str>,
    /// `"tree"`, `"process"` or None (no limit asked).
    pub enforcement: Option<&'static str>,
    /// The whole call's CPU time (cgroup), else the leader's (rusage).
    pub cpu_ms: f64,
}

fn killed_by(outcome: &Outcome, stderr_tail: &str, sig: i32, text: &str) -> bool {
    outcome.signal == Some(sig)
        || outcome.exit_code == Some(128 + sig)
        || stderr_tail.contains(text)
}

/// `tree` when every whole-call limit asked for is a cgroup controller, `process` when
/// one fell back to an rlimit or only per-process limits were asked, None when none was.
fn enforcement(limits: &CallLimits, r: &Resources) -> Option<&'static str> {
    let whole_call = [
        (limits.memory_bytes, r.tree_memory),
        (limits.max_processes, r.tree_processes),
        (limits.cpu_ms, r.tree_cpu),
    ];
    let per_process = [limits.file_size_bytes, limits.open_files];
    if whole_call.iter().all(|(l, _)| l.is_none()) {
        return per_process.iter().any(Option::is_some).then_some("process");
    }
    if whole_call.iter().any(|(l, tree)| l.is_some() && !tree) {
        return Some("process");
    }
    Some("tree")
}

/// The verdict of a settled call from its limits, the core's facts and how it ended.
pub fn verdict(
    limits: &CallLimits,
    r: &Resources,
    outcome: &Outcome,
    stderr_tail: &str,
) -> Verdict {
    let leader_cpu_ms = (outcome.user_cpu + outcome.system_cpu).as_secs_f64() * 1000.0;
    let mut exceeded = r.limit_hit.map(|h| h.name());
    if exceeded.is_none() {
        if let (Some(cpu_ms), false) = (limits.cpu_ms, r.tree_cpu) {
            // RLIMIT_CPU: SIGXCPU at the soft limit, SIGKILL at the hard one (a second on).
            let killed_over =
                outcome.signal == Some(libc::SIGKILL) && leader_cpu_ms >= cpu_ms as f64;
            if killed_over || killed_by(outcome, stderr_tail, libc::SIGXCPU, XCPU_TEXT) {
                exceeded = Some("cpu");
            }
        }
    }
    if exceeded.is_none()
        && limits.file_size_bytes.is_some()
        && killed_by(outcome, stderr_tail, libc::SIGXFSZ, XFSZ_TEXT)
    {
        exceeded = Some("file_size");
    }
    Verdict {
        limit_exceeded: exceeded,
        enforcement: enforcement(limits, r),
        cpu_ms: r
            .cpu_usec
            .map_or(leader_cpu_ms, |usec| usec as f64 / 1000.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contain::LimitHit;
    use std::time::Duration;

    fn ended(exit_code: Option<i32>, signal: Option<i32>, cpu_ms: u64) -> Outcome {
        Outcome {
            exit_code,
            signal,
            duration: Duration::ZERO,
            leftover_killed: 0,
            kill_requested: false,
            user_cpu: Duration::from_millis(cpu_ms),
            system_cpu: Duration::ZERO,
            max_rss_kib: 0,
            exit_status_unknown: false,
        }
    }

    fn facts(tree: bool, hit: Option<LimitHit>, cpu_usec: Option<u64>) -> Resources {
        Resources {
            cgroup: tree,
            tree_memory: tree,
            tree_processes: tree,
            tree_cpu: tree,
            limit_hit: hit,
            peak_memory_bytes: None,
            cpu_usec,
        }
    }

    #[test]
    fn enforcement_follows_the_limits_asked_and_where_they_went() {
        let none = CallLimits::default();
        let procs = CallLimits {
            max_processes: Some(64),
            ..CallLimits::default()
        };
        let fsize = CallLimits {
            file_size_bytes: Some(1),
            ..CallLimits::default()
        };
        let both = CallLimits {
            max_processes: Some(64),
            open_files: Some(64),
            ..CallLimits::default()
        };
        let ok = ended(Some(0), None, 0);
        let tree = facts(true, None, Some(2500));
        let session = facts(false, None, None);
        assert_eq!(verdict(&none, &tree, &ok, "").enforcement, None);
        assert_eq!(verdict(&procs, &tree, &ok, "").enforcement, Some("tree"));
        assert_eq!(verdict(&both, &tree, &ok, "").enforcement, Some("tree"));
        assert_eq!(
            verdict(&procs, &session, &ok, "").enforcement,
            Some("process")
        );
        assert_eq!(verdict(&fsize, &tree, &ok, "").enforcement, Some("process"));
        assert_eq!(verdict(&none, &tree, &ok, "").cpu_ms, 2.5);
        assert_eq!(
            verdict(&none, &session, &ended(Some(0), None, 7), "").cpu_ms,
            7.0
        );
    }

    #[test]
    fn limits_hit_are_read_from_the_core_then_from_how_the_command_ended() {
        let cpu = CallLimits {
            cpu_ms: Some(100),
            file_size_bytes: Some(10),
            ..CallLimits::default()
        };
        let session = facts(false, None, None);
        let tree_oom = facts(true, Some(LimitHit::Memory), Some(1));
        let exceeded =
            |r: &Resources, o: &Outcome, tail: &str| verdict(&cpu, r, o, tail).limit_exceeded;
        assert_eq!(
            exceeded(&tree_oom, &ended(None, Some(9), 0), ""),
            Some("memory")
        );
        assert_eq!(
            exceeded(&session, &ended(None, Some(libc::SIGXCPU), 0), ""),
            Some("cpu")
        );
        assert_eq!(
            exceeded(&session, &ended(None, Some(9), 150), ""),
            Some("cpu")
        );
        assert_eq!(exceeded(&session, &ended(None, Some(9), 50), ""), None);
        assert_eq!(
            exceeded(&session, &ended(Some(152), None, 0), ""),
            Some("cpu")
        );
        assert_eq!(
            exceeded(&session, &ended(Some(153), None, 0), ""),
            Some("file_size")
        );
        let tail = "bash: line 1: 7 File size limit exceeded (core dumped) dd";
        assert_eq!(
            exceeded(&session, &ended(Some(0), None, 0), tail),
            Some("file_size")
        );
        assert_eq!(exceeded(&session, &ended(Some(1), None, 0), "fine"), None);
        // Under a cgroup CPU limit the core's own verdict is the only one.
        let tree = facts(true, None, Some(1));
        assert_eq!(
            exceeded(&tree, &ended(None, Some(libc::SIGXCPU), 0), ""),
            None
        );
    }
}
