//! The supervisor's own tests: a real child per test, its output, stdin, exit and kill.

use super::*;
use crate::kill::group_members;
use std::ffi::CString;
use std::time::Duration;

fn plan(cmd: &str) -> SpawnPlan {
    let c = |s: &str| CString::new(s).unwrap();
    SpawnPlan {
        program: c("/bin/bash"),
        argv: vec![c("bash"), c("-c"), c(cmd)],
        envp: std::sync::Arc::new(vec![c("PATH=/usr/bin:/bin")]),
        cwd: c("/"),
        confinement: None,
        script: None,
        cgroup: None,
        join_cgroups: Vec::new(),
        rlimits: Vec::new(),
    }
}

fn cfg(cap: usize) -> ProcConfig {
    ProcConfig {
        stdout_cap: cap,
        stderr_cap: cap,
        spill_cap: 1 << 20,
        grace: Duration::from_millis(300),
        stdin: Vec::new(),
        limits: crate::contain::CallLimits::default(),
        cgroup: true,
    }
}

#[test]
fn runs_and_collects() {
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    let p = svc
        .spawn(&mut plan("echo out; echo err >&2; exit 3"), cfg(1000))
        .unwrap();
    assert!(p.wait(Some(Duration::from_secs(10))));
    let o = p.outcome().unwrap();
    assert_eq!(o.exit_code, Some(3));
    let (out, err) = p.collected();
    assert_eq!(out.text, "out\n");
    assert_eq!(err.text, "err\n");
    svc.dispose(false);
}

#[test]
fn stdin_is_written_then_closed() {
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    let mut c = cfg(1000);
    c.stdin = b"hello".to_vec();
    let p = svc.spawn(&mut plan("cat"), c).unwrap();
    assert!(p.wait(Some(Duration::from_secs(10))));
    assert_eq!(p.collected().0.text, "hello");
    svc.dispose(false);
}

#[test]
fn leftover_holding_pipes_is_killed_after_grace() {
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    let p = svc
        .spawn(&mut plan("sleep 100 & echo hi"), cfg(1000))
        .unwrap();
    assert!(p.wait(Some(Duration::from_secs(10))));
    let o = p.outcome().unwrap();
    assert_eq!(o.exit_code, Some(0));
    assert_eq!(o.leftover_killed, 1);
    assert!(group_members(p.pgid()).gone());
    svc.dispose(false);
}

#[test]
fn kill_escalates_to_sigkill() {
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    let p = svc
        .spawn(&mut plan("trap '' TERM; sleep 100"), cfg(1000))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(p.kill());
    assert!(!p.kill());
    assert!(p.wait(Some(Duration::from_secs(10))));
    assert_eq!(p.outcome().unwrap().signal, Some(libc::SIGKILL));
    svc.dispose(false);
}

#[test]
fn missing_workdir_is_a_chdir_error() {
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    let mut p = plan("true");
    p.cwd = CString::new("/nonexistent/dir").unwrap();
    match svc.spawn(&mut p, cfg(10)) {
        Err(CoreError::Spawn(e)) => {
            assert_eq!(e.stage, crate::errors::SpawnStage::Chdir);
            assert_eq!(e.errno, libc::ENOENT);
        }
        _ => panic!("expected a chdir spawn error"),
    }
    svc.dispose(false);
}
