//! Benchmark floors: the least native code can do for what shellseam does, timed.
//!
//! Diagnostics, not part of the product.
//! - `minimal_reader`, the drain floor: spawns `argv` with stdout on a non-blocking pipe,
//!   waits in epoll, reads into one buffer and copies the last `tail` bytes into a ring,
//!   then reaps the child. No process group, no supervisor thread: whatever shellseam's
//!   drain costs beyond this is shellseam's own. Given a spill file, it also writes the
//!   stream's first `spill_cap` bytes there through the spill files' own writer (uncached
//!   where possible, `spill::SpillWriter`): the floor of the drain SPEC asks for (the
//!   complete head of the stream kept on disk).
//! - `session_spawn`, the spawn floor with shellseam's contract: glibc `posix_spawn`
//!   (vfork) of a session leader with stdin, stdout and stderr on pipes, stdout and stderr
//!   drained with `poll` until EOF, then `waitpid`. The pipes and the session are what
//!   SPEC asks of every call, so this is the floor of `run_sync` itself.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout};

use crate::pipes::{cloexec_pipe, set_nonblocking};
use crate::spill::SpillWriter;
use crate::sys::{epoll_add, epoll_create, epoll_event_buffer, epoll_wait, readable};

/// What one floor run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorRun {
    pub elapsed: Duration,
    pub total_bytes: u64,
}

/// Where the minimal reader writes the head of the stream, and how much of it.
pub struct FloorSpill {
    pub writer: SpillWriter,
    pub cap: u64,
}

/// Runs `argv` (`argv[0]` looked up in PATH) with stdout drained through `buf_bytes` reads
/// into a `tail` byte ring, and the first `spill.cap` bytes written to `spill.file`; stdin
/// and stderr are /dev/null.
pub fn minimal_reader(
    argv: &[String],
    buf_bytes: usize,
    tail: usize,
    mut spill: Option<FloorSpill>,
) -> io::Result<FloorRun> {
    let Some((program, args)) = argv.split_first() else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty argv"));
    };
    let started = Instant::now();
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout: OwnedFd = match child.stdout.take() {
        Some(out) => out.into(),
        None => return Err(io::Error::other("no stdout pipe")),
    };
    set_nonblocking(&stdout)?;
    let epoll = epoll_create()?;
    epoll_add(&epoll, &stdout, readable(), 0)?;
    let mut events = epoll_event_buffer(4);
    let mut buf = vec![0u8; buf_bytes.max(1)];
    let tail = tail.max(1);
    let mut ring = vec![0u8; tail];
    let mut total: u64 = 0;
    'drain: loop {
        if epoll_wait(&epoll, &mut events, None) == 0 {
            continue;
        }
        loop {
            match nix::unistd::read(&stdout, &mut buf) {
                Ok(0) => break 'drain,
                Ok(n) => {
                    if let Some(file) = spill.as_mut() {
                        let room = file.cap.saturating_sub(total).min(n as u64) as usize;
                        if file.writer.append(&buf[..room]).is_err() {
                            spill = None; // a full disk: the file keeps what it got
                        }
                    }
                    ring_push(&mut ring, total, &buf[..n]);
                    total += n as u64;
                }
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => break,
                Err(err) => return Err(err.into()),
            }
        }
    }
    drop(stdout);
    if let Some(file) = spill.as_mut() {
        let _ = file.writer.complete();
    }
    child.wait()?;
    Ok(FloorRun {
        elapsed: started.elapsed(),
        total_bytes: total,
    })
}

/// Spawns `program` with `argv` and `envp` as a session leader with piped stdio, drains
/// stdout and stderr with `poll` until both close, reaps it and returns the wall time.
pub fn session_spawn(
    program: &CString,
    argv: &[CString],
    envp: &[CString],
) -> io::Result<Duration> {
    let ptrs = |v: &[CString]| {
        let mut p: Vec<*mut libc::c_char> = v.iter().map(|s| s.as_ptr() as *mut _).collect();
        p.push(std::ptr::null_mut());
        p
    };
    let (argv, envp) = (ptrs(argv), ptrs(envp));
    let started = Instant::now();
    let (stdin_r, stdin_w) = cloexec_pipe()?;
    let (stdout_r, stdout_w) = cloexec_pipe()?;
    let (stderr_r, stderr_w) = cloexec_pipe()?;
    let mut pid: libc::pid_t = 0;
    // SAFETY: the attribute and file-action objects are initialised before use and
    // destroyed after; every pointer handed to posix_spawn (program, NUL-terminated argv and
    // envp arrays, fds) stays valid for the call.
    let ret = unsafe {
        let mut actions: libc::posix_spawn_file_actions_t = std::mem::zeroed();
        let mut attr: libc::posix_spawnattr_t = std::mem::zeroed();
        libc::posix_spawn_file_actions_init(&mut actions);
        libc::posix_spawnattr_init(&mut attr);
        libc::posix_spawnattr_setflags(&mut attr, libc::POSIX_SPAWN_SETSID as libc::c_short);
        for (fd, target) in [(&stdin_r, 0), (&stdout_w, 1), (&stderr_w, 2)] {
            libc::posix_spawn_file_actions_adddup2(&mut actions, fd.as_raw_fd(), target);
        }
        let ret = libc::posix_spawn(
            &mut pid,
            program.as_ptr(),
            &actions,
            &attr,
            argv.as_ptr(),
            envp.as_ptr(),
        );
        libc::posix_spawn_file_actions_destroy(&mut actions);
        libc::posix_spawnattr_destroy(&mut attr);
        ret
    };
    drop((stdin_r, stdin_w, stdout_w, stderr_w));
    if ret != 0 {
        return Err(io::Error::from_raw_os_error(ret));
    }
    let mut open = [Some(stdout_r), Some(stderr_r)];
    let mut buf = vec![0u8; 64 * 1024];
    while open.iter().any(Option::is_some) {
        let mut fds: Vec<PollFd<'_>> = open
            .iter()
            .flatten()
            .map(|fd| PollFd::new(fd.as_fd(), PollFlags::POLLIN))
            .collect();
        if nix::poll::poll(&mut fds, PollTimeout::NONE).is_err() {
            continue;
        }
        let ready: Vec<bool> = fds
            .iter()
            .map(|f| f.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let mut ready = ready.into_iter();
        for slot in open.iter_mut() {
            let Some(fd) = slot.as_ref() else { continue };
            if ready.next() == Some(true) && matches!(nix::unistd::read(fd, &mut buf), Ok(0)) {
                *slot = None;
            }
        }
    }
    let mut status = 0;
    // SAFETY: reaps the child spawned above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    Ok(started.elapsed())
}

/// Copies `bytes` (stream offset `at`) into the ring, keeping its last `ring.len()` bytes.
fn ring_push(ring: &mut [u8], at: u64, bytes: &[u8]) {
    let len = ring.len();
    let (bytes, at) = if bytes.len() > len {
        let skip = bytes.len() - len;
        (&bytes[skip..], at + skip as u64)
    } else {
        (bytes, at)
    };
    let start = (at % len as u64) as usize;
    let first = bytes.len().min(len - start);
    ring[start..start + first].copy_from_slice(&bytes[..first]);
    ring[..bytes.len() - first].copy_from_slice(&bytes[first..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_everything_the_child_writes() {
        let argv = ["head", "-c", "3000000", "/dev/zero"].map(String::from);
        let run = minimal_reader(&argv, 1 << 16, 64 * 1024, None).unwrap();
        assert_eq!(run.total_bytes, 3_000_000);
    }

    #[test]
    fn writes_the_head_of_the_stream_to_the_spill_file() {
        let path =
            std::env::temp_dir().join(format!("shellseam-floor-spill-{}", std::process::id()));
        let file = std::fs::File::create(&path).unwrap();
        let argv = ["seq", "1", "100000"].map(String::from);
        let device = std::sync::Arc::new(crate::spill::DirectWrites::new(true));
        let spill = FloorSpill {
            writer: SpillWriter::new(file, device),
            cap: 1000,
        };
        let run = minimal_reader(&argv, 4096, 64, Some(spill)).unwrap();
        let head = std::fs::read(&path).unwrap_or_default();
        let _ = std::fs::remove_file(&path);
        let whole: String = (1..=100_000).map(|i| format!("{i}\n")).collect();
        assert_eq!(run.total_bytes, whole.len() as u64);
        assert_eq!(head, whole.as_bytes()[..1000]);
    }

    #[test]
    fn session_spawn_runs_a_session_leader_to_the_end() {
        let c = |s: &str| CString::new(s).unwrap();
        let marker = std::env::temp_dir().join(format!("shellseam-floor-{}", std::process::id()));
        let script = format!(
            "[ \"$(ps -o sid= -p $$)\" -eq $$ ] && echo ok > {}",
            marker.display()
        );
        let took = session_spawn(
            &c("/bin/sh"),
            &[c("sh"), c("-c"), c(&script)],
            &[c("PATH=/usr/bin:/bin")],
        )
        .unwrap();
        let got = std::fs::read_to_string(&marker).unwrap_or_default();
        let _ = std::fs::remove_file(&marker);
        assert_eq!(got, "ok\n", "ran as the leader of its own session");
        assert!(took > Duration::ZERO);
    }

    #[test]
    fn ring_keeps_the_last_bytes() {
        let mut ring = vec![0u8; 4];
        ring_push(&mut ring, 0, b"abc");
        ring_push(&mut ring, 3, b"def");
        // Offsets 2..6 = "cdef" live at ring positions 2,3,0,1.
        assert_eq!(&ring, b"efcd");
        ring_push(&mut ring, 6, b"0123456");
        // Last four: "3456" at offsets 9..13 -> positions 1,2,3,0.
        assert_eq!(&ring, b"6345");
    }
}
