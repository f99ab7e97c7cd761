//! The parent's side of the child's stdio pipes: creating them (close-on-exec, above the
//! stdio range, non-blocking), draining output into a collector and feeding stdin.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::collector::{Collector, SpillOpener};
use crate::forksafe::ForkClosed;

/// Bytes read per `read` call while draining. Reads of 1 MiB measured 1.7-2.1x the wall of
/// `head | cat` on 1 GiB against 1.4-1.5x for 16-128 KiB (issue 13): with a buffer that
/// large the reader kept pace with `head`'s 4 KiB writes, one read per write, both sides
/// spinning on the pipe's mutex (`mutex_spin_on_owner` was a fifth of `head`'s samples).
pub(crate) const READ_CHUNK: usize = 128 << 10;
const DEFAULT_PIPE_BYTES: usize = 1 << 16;
/// Pipe size for a stream that filled the default one. Larger pipes measured slower here:
/// the producer's writes touch more cache for no fewer wake-ups.
const LARGE_PIPE_BYTES: libc::c_int = 256 * 1024;
/// Reads per drain before yielding to other processes (fairness).
const READS_PER_DRAIN: usize = 64;

/// How far one drain of a pipe goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Drain {
    /// After an epoll event: a short read means the pipe is empty for now (saves a read),
    /// unless the stream once filled a pipe: a bulk producer refills it at once, and going
    /// back to `epoll_wait` after each short read cost an epoll round trip per few KiB
    /// (1 GiB: 1.43x -> 1.11x of `head | cat` reading on to `EAGAIN`, issue 13).
    Streaming,
    /// Until the pipe is empty or at EOF: a waiting caller settling a process it saw exit.
    UntilEmpty,
    /// The last pass: everything the pipe holds, then it is closed regardless.
    Final,
}

/// A pipe whose both ends are close-on-exec.
pub fn cloexec_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(OFlag::O_CLOEXEC)?)
}

/// Moves `fd` above the stdio range so that the child's dup onto 0..2 never aliases it
/// (a harness that closed its own stdin would otherwise get pipe fds 0..2 back).
pub fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    use std::os::fd::{AsRawFd, FromRawFd};
    // Fd 3 is taken too: the child puts a long command's script there (spawn::SCRIPT_FD).
    if fd.as_raw_fd() > 3 {
        return Ok(fd);
    }
    let new = fcntl(&fd, FcntlArg::F_DUPFD_CLOEXEC(4))?;
    // SAFETY: F_DUPFD_CLOEXEC succeeded, so `new` is a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// Makes one end of a pipe from `cloexec_pipe` non-blocking. Its status flags are known
/// (none: the access mode, which `F_SETFL` ignores, and close-on-exec, a descriptor flag),
/// so one `F_SETFL` does it without reading them first.
pub fn set_nonblocking(fd: impl AsFd) -> io::Result<()> {
    fcntl(&fd, FcntlArg::F_SETFL(OFlag::O_NONBLOCK))?;
    Ok(())
}

/// One output stream of a process: its pipe (None once closed), its epoll registration
/// key and its collector.
pub(crate) struct OutStream {
    pub fd: Option<ForkClosed>,
    pub key: Option<u64>,
    pub collector: Collector,
    grown: bool,
}

impl OutStream {
    pub fn new(fd: OwnedFd, collector: Collector) -> Self {
        Self {
            fd: Some(ForkClosed::new(fd)),
            key: None,
            collector,
            grown: false,
        }
    }

    /// Reads what the pipe holds (bounded per call for fairness unless `Final`). True
    /// when the pipe reached EOF or failed and must be closed.
    pub fn drain(&mut self, scratch: &mut [u8], mode: Drain, open_spill: SpillOpener<'_>) -> bool {
        let Some(fd) = self.fd.as_ref() else {
            return false;
        };
        for _ in 0..READS_PER_DRAIN {
            match nix::unistd::read(fd, scratch) {
                Ok(0) => return true,
                Ok(n) => {
                    self.collector.push(&scratch[..n], open_spill);
                    if !self.grown && n >= DEFAULT_PIPE_BYTES {
                        // A producer that fills the default pipe gets a larger one: fewer
                        // wake-ups. Failure (the per-user pipe limit) is harmless.
                        let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(LARGE_PIPE_BYTES));
                        self.grown = true;
                    }
                    if n < scratch.len() && mode == Drain::Streaming && !self.grown {
                        // A short read of a stream that never filled its pipe: empty now.
                        return false;
                    }
                }
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return false,
                Err(_) => return true,
            }
        }
        false
    }
}

/// The bytes still to be written to a process's stdin, and its pipe.
pub(crate) struct StdinFeed {
    pub fd: Option<ForkClosed>,
    pub key: Option<u64>,
    data: Vec<u8>,
    off: usize,
}

impl StdinFeed {
    /// `fd`: None when the pipe was closed already (nothing to write).
    pub fn new(fd: Option<OwnedFd>, data: Vec<u8>) -> Self {
        Self {
            fd: fd.map(ForkClosed::new),
            key: None,
            data,
            off: 0,
        }
    }

    /// Writes what the pipe takes. True when everything is written (or the reader went
    /// away) and the pipe must be closed.
    pub fn write(&mut self) -> bool {
        let Some(fd) = self.fd.as_ref() else {
            return false;
        };
        while self.off < self.data.len() {
            match nix::unistd::write(fd, &self.data[self.off..]) {
                Ok(n) => self.off += n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return false,
                // EPIPE: the command exited or closed stdin without reading; not an error.
                Err(_) => return true,
            }
        }
        true
    }

    /// Drops the pipe and the unwritten bytes.
    pub fn close(&mut self) -> Option<OwnedFd> {
        self.data = Vec::new();
        self.fd.take().map(ForkClosed::into_inner)
    }
}
