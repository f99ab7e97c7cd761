//! The parent's side of the child's stdio pipes: creating them (close-on-exec, above the
//! stdio range, non-blocking), draining output into a collector and feeding stdin.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::collector::{Collector, SpillOpener};

/// Bytes read per `read` call while draining.
pub(crate) const READ_CHUNK: usize = 1 << 20;
const DEFAULT_PIPE_BYTES: usize = 1 << 16;
/// Pipe size for a stream that filled the default one. Larger pipes measured slower here:
/// the producer's writes touch more cache for no fewer wake-ups.
const LARGE_PIPE_BYTES: libc::c_int = 256 * 1024;
/// Reads per drain before yielding to other processes (fairness).
const READS_PER_DRAIN: usize = 64;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A pipe whose both ends are close-on-exec.
pub fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [-1 as RawFd; 2];
    // SAFETY: `fds` is a valid two-element array for pipe2 to fill.
    cvt(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) })?;
    // SAFETY: pipe2 succeeded, so both fds are fresh and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Moves `fd` above the stdio range so that the child's dup onto 0..2 never aliases it
/// (a harness that closed its own stdin would otherwise get pipe fds 0..2 back).
pub fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC on a valid fd returns a new fd that we then own.
    let new = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) })?;
    // SAFETY: `new` was just returned by fcntl and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

pub fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFL/F_SETFL on a valid fd only change its status flags.
    unsafe {
        let flags = cvt(libc::fcntl(fd, libc::F_GETFL))?;
        cvt(libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK))?;
    }
    Ok(())
}

/// One output stream of a process: its pipe (None once closed), its epoll registration
/// key and its collector.
pub(crate) struct OutStream {
    pub fd: Option<OwnedFd>,
    pub key: Option<u64>,
    pub collector: Collector,
    grown: bool,
}

impl OutStream {
    pub fn new(fd: OwnedFd, collector: Collector) -> Self {
        Self {
            fd: Some(fd),
            key: None,
            collector,
            grown: false,
        }
    }

    /// Reads what the pipe holds (bounded per call for fairness, everything when
    /// `final_pass`). True when the pipe reached EOF or failed and must be closed.
    pub fn drain(
        &mut self,
        scratch: &mut [u8],
        final_pass: bool,
        open_spill: SpillOpener<'_>,
    ) -> bool {
        let Some(fd) = self.fd.as_ref().map(|fd| fd.as_raw_fd()) else {
            return false;
        };
        for _ in 0..READS_PER_DRAIN {
            // SAFETY: reads into `scratch`, which is valid for `scratch.len()` bytes.
            let n =
                unsafe { libc::read(fd, scratch.as_mut_ptr() as *mut libc::c_void, scratch.len()) };
            if n > 0 {
                let n = n as usize;
                self.collector.push(&scratch[..n], open_spill);
                if !self.grown && n >= DEFAULT_PIPE_BYTES {
                    // A producer that fills the default pipe gets a larger one: fewer wakeups.
                    // SAFETY: F_SETPIPE_SZ on a valid pipe fd; failure (limits) is harmless.
                    unsafe { libc::fcntl(fd, libc::F_SETPIPE_SZ, LARGE_PIPE_BYTES) };
                    self.grown = true;
                }
                if n < scratch.len() && !final_pass {
                    return false;
                }
                continue;
            }
            if n == 0 {
                return true;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return false,
                _ => return true,
            }
        }
        false
    }
}

/// The bytes still to be written to a process's stdin, and its pipe.
pub(crate) struct StdinFeed {
    pub fd: Option<OwnedFd>,
    pub key: Option<u64>,
    data: Vec<u8>,
    off: usize,
}

impl StdinFeed {
    pub fn new(fd: OwnedFd, data: Vec<u8>) -> Self {
        Self {
            fd: Some(fd),
            key: None,
            data,
            off: 0,
        }
    }

    /// Writes what the pipe takes. True when everything is written (or the reader went
    /// away) and the pipe must be closed.
    pub fn write(&mut self) -> bool {
        let Some(fd) = self.fd.as_ref().map(|fd| fd.as_raw_fd()) else {
            return false;
        };
        while self.off < self.data.len() {
            let rest = &self.data[self.off..];
            // SAFETY: writes from a live slice to a non-blocking pipe.
            let n = unsafe { libc::write(fd, rest.as_ptr() as *const libc::c_void, rest.len()) };
            if n >= 0 {
                self.off += n as usize;
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) => return false,
                // EPIPE: the command exited or closed stdin without reading; not an error.
                _ => return true,
            }
        }
        true
    }

    /// Drops the pipe and the unwritten bytes.
    pub fn close(&mut self) -> Option<OwnedFd> {
        self.data = Vec::new();
        self.fd.take()
    }
}
