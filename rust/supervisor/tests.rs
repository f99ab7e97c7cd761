//! The supervisor's own tests: a real child per test, its output, stdin, exit and kill.

use super::*;
use crate::kill::session_members;
use std::ffi::CString;
use std::time::Duration;

fn plan(cmd: &str) -> SpawnPlan {
    let c = |s: &str| CString::new(s).unwrap();
    SpawnPlan::new(
        c("/bin/bash"),
        vec![c("bash"), c("-c"), c(cmd)],
        std::sync::Arc::new(vec![c("PATH=/usr/bin:/bin")]),
        c("/"),
    )
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
        defer_watch: false,
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
fn caller_and_supervisor_settle_each_run_exactly_once() {
    // The waiting caller and the supervisor race to settle every exit: each run must
    // keep its exact status and every byte, whoever wins.
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    for i in 0..200 {
        let cmd = format!("head -c {} /dev/zero; exit {}", 1000 * i, i % 7);
        let p = svc.spawn(&mut plan(&cmd), cfg(1 << 20)).unwrap();
        assert!(p.wait(Some(Duration::from_secs(10))));
        let o = p.outcome().unwrap();
        assert_eq!(o.exit_code, Some(i % 7));
        assert!(!o.exit_status_unknown);
        assert_eq!(p.collected().0.total_bytes, 1000 * i as u64);
    }
    assert_eq!(svc.running(), 0);
    svc.dispose(false);
}

#[test]
fn ring_tail_is_the_streams_end_and_the_spill_its_head() {
    // Far past the spill cap and round the tail ring many times: the tail must be
    // exactly the stream's last bytes, and the spill file its exact head.
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    let mut c = cfg(1000);
    c.spill_cap = 10_000;
    let p = svc.spawn(&mut plan("seq 1 300000"), c).unwrap();
    assert!(p.wait(Some(Duration::from_secs(20))));
    let out = p.collected().0;
    let stream: String = (1..=300000).map(|i| format!("{i}\n")).collect();
    assert_eq!(out.total_bytes, stream.len() as u64);
    assert_eq!(out.text, stream[stream.len() - 1000..]);
    let spilled = std::fs::read(out.spill_path.unwrap()).unwrap();
    assert_eq!(spilled, stream.as_bytes()[..10_000]);
    svc.dispose(false);
}

#[test]
fn a_timed_out_wait_leaves_the_run_to_the_supervisor() {
    let svc = Service::new(std::env::temp_dir(), u64::MAX).unwrap();
    let p = svc
        .spawn(&mut plan("sleep 0.3; echo late"), cfg(1000))
        .unwrap();
    assert!(!p.wait(Some(Duration::from_millis(10))));
    // Nobody waits in `wait` now: the supervisor alone must settle it.
    let notifier = Arc::new(crate::notifier::Notifier::new().unwrap());
    p.subscribe(Arc::clone(&notifier));
    assert_eq!(notifier.wait(Some(Duration::from_secs(10))), vec![p.token]);
    assert!(p.is_done());
    assert_eq!(p.collected().0.text, "late\n");
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
    assert!(session_members(p.pgid()).0.gone());
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

#[test]
fn a_forked_copy_takes_no_lock_of_the_parents_service() {
    let service = Service::new(std::env::temp_dir(), u64::MAX).expect("service");
    // Threads of the harness hold the service's locks when it forks (the supervisor its
    // live table and spill state as a call completes, a spawn the keeper's).
    let held = (
        lock(&service.shared.keeper),
        lock(&service.shared.spill),
        lock(&service.shared.live),
    );
    let scratch = std::path::Path::new("/nonexistent/shellseam-scratch");
    let refused = crate::sys::passes_in_a_fork(Duration::from_secs(10), || {
        service.note_scratch_dir(scratch);
        service.forget_scratch_dir(scratch);
        let quiet = service.ensure_spill_dir().is_none()
            && service.spill_dir().is_none()
            && service.running() == 0
            && service.keeper_pid().is_none()
            && !service.has_cgroups();
        service.dispose(false);
        quiet && service.is_disposed()
    });
    drop(held);
    service.dispose(false);
    assert!(
        refused,
        "the forked copy waited for a lock held at the fork"
    );
}
