//! The drain floor: the least a userspace reader can do with a child's stdout, timed.
//!
//! A benchmark diagnostic, not part of the product. It spawns `argv` with stdout on a
//! non-blocking pipe, waits in epoll, reads into one buffer and copies the last `tail`
//! bytes into a ring, then reaps the child. No spill file, no process group, no supervisor
//! thread: whatever shellseam's drain costs beyond this is shellseam's own.

use std::io;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;

use crate::pipes::set_nonblocking;
use crate::sys::{epoll_add, epoll_create, epoll_event_buffer, epoll_wait, readable};

/// What one floor run measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FloorRun {
    pub elapsed: Duration,
    pub total_bytes: u64,
}

/// Runs `argv` (`argv[0]` looked up in PATH) with stdout drained through `buf_bytes` reads
/// into a `tail` byte ring; stdin and stderr are /dev/null.
pub fn minimal_reader(argv: &[String], buf_bytes: usize, tail: usize) -> io::Result<FloorRun> {
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
    child.wait()?;
    Ok(FloorRun {
        elapsed: started.elapsed(),
        total_bytes: total,
    })
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
        let run = minimal_reader(&argv, 1 << 16, 64 * 1024).unwrap();
        assert_eq!(run.total_bytes, 3_000_000);
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
