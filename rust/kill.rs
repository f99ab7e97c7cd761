//! Signalling and inspecting a process group.
//!
//! A group outlives its reaped leader while any member is alive, and the kernel keeps the
//! pgid reserved for as long, so signalling `-pgid` after the leader's exit reaches exactly
//! the leftovers.

use std::fs;
use std::io;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// Sends `sig` (0: only check) to every process of the group; a vanished group is not an
/// error (Ok(false)).
pub fn signal_group(pgid: libc::pid_t, sig: libc::c_int) -> io::Result<bool> {
    if pgid <= 1 {
        // killpg(0) is the caller's own group and 1 is init's: never a command's.
        return Err(io::Error::from(io::ErrorKind::InvalidInput));
    }
    let signal = match sig {
        0 => None,
        n => Some(Signal::try_from(n)?),
    };
    match killpg(Pid::from_raw(pgid), signal) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(err) => Err(err.into()),
    }
}

/// Whether any process is still in the group (zombies awaiting their reaper count too).
pub fn group_alive(pgid: libc::pid_t) -> bool {
    matches!(signal_group(pgid, 0), Ok(true))
}

/// Counts the live members of a group by scanning /proc; zombies are not counted, they
/// are already dead and only wait for their parent.
pub fn count_group(pgid: libc::pid_t) -> usize {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    let mut count = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = fs::read_to_string(format!("/proc/{name}/stat")) else {
            continue;
        };
        if let Some((state, pgrp)) = parse_stat(&stat) {
            if pgrp == pgid && state != 'Z' && state != 'X' {
                count += 1;
            }
        }
    }
    count
}

/// Zombie children of this process (of any of its threads), from
/// `/proc/self/task/*/children`.
pub fn zombie_children() -> Vec<libc::pid_t> {
    let Ok(tasks) = fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        let Ok(children) = fs::read_to_string(task.path().join("children")) else {
            continue;
        };
        for pid in children.split_whitespace().filter_map(|p| p.parse().ok()) {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if parse_stat(&stat).is_some_and(|(state, _)| state == 'Z') {
                out.push(pid);
            }
        }
    }
    out
}

/// The process group of `pid` (zombies included), from /proc.
pub fn pgrp_of(pid: libc::pid_t) -> Option<libc::pid_t> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat).map(|(_, pgrp)| pgrp)
}

/// (state, pgrp) from a /proc/<pid>/stat line; the comm field may hold spaces and ')'.
fn parse_stat(stat: &str) -> Option<(char, libc::pid_t)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_odd_comm() {
        let line = "123 (a) b (c)) S 1 456 456 0 -1";
        assert_eq!(parse_stat(line), Some(('S', 456)));
    }

    #[test]
    fn never_signals_the_callers_group_or_init() {
        for pgid in [0, 1, -5] {
            assert!(signal_group(pgid, libc::SIGKILL).is_err());
        }
        assert!(!group_alive(0));
    }

    #[test]
    fn own_group_is_alive_and_counted() {
        let pgid = nix::unistd::getpgrp().as_raw();
        assert!(group_alive(pgid));
        assert!(count_group(pgid) >= 1);
    }
}
