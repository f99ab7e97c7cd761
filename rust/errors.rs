//! Errors of the process core, kept as Rust enums until the binding boundary converts them
//! (once) into Python exceptions.

use std::fmt;
use std::io;

/// Where a spawn failed. The numeric codes cross the child's report pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum SpawnStage {
    Pipes = 1,
    Clone = 2,
    Signals = 3,
    ProcessGroup = 4,
    Stdio = 5,
    Chdir = 6,
    Sandbox = 7,
    Exec = 8,
    /// The process ran but could not be put under the supervisor (epoll, thread).
    Supervise = 9,
    /// The child could not join its cgroups or set its rlimits.
    Contain = 10,
    Unknown = 99,
}

impl SpawnStage {
    pub fn from_code(code: u32) -> Self {
        match code {
            1 => Self::Pipes,
            2 => Self::Clone,
            3 => Self::Signals,
            4 => Self::ProcessGroup,
            5 => Self::Stdio,
            6 => Self::Chdir,
            7 => Self::Sandbox,
            8 => Self::Exec,
            9 => Self::Supervise,
            10 => Self::Contain,
            _ => Self::Unknown,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Pipes => "pipes",
            Self::Clone => "clone",
            Self::Signals => "signals",
            Self::ProcessGroup => "process-group",
            Self::Stdio => "stdio",
            Self::Chdir => "chdir",
            Self::Sandbox => "sandbox",
            Self::Exec => "exec",
            Self::Supervise => "supervise",
            Self::Contain => "contain",
            Self::Unknown => "unknown",
        }
    }
}

/// A spawn that did not produce a running command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnError {
    pub stage: SpawnStage,
    pub errno: i32,
}

impl SpawnError {
    pub fn new(stage: SpawnStage, errno: i32) -> Self {
        Self { stage, errno }
    }

    pub fn from_io(stage: SpawnStage, err: &io::Error) -> Self {
        Self::new(stage, err.raw_os_error().unwrap_or(libc::EIO))
    }

    /// The C library's message for this errno.
    pub fn strerror(&self) -> String {
        Self::strerror_of(self.errno)
    }

    /// The C library's message for `errno`, without Rust's " (os error N)" suffix.
    pub fn strerror_of(errno: i32) -> String {
        let text = io::Error::from_raw_os_error(errno).to_string();
        match text.rfind(" (os error ") {
            Some(cut) => text[..cut].to_string(),
            None => text,
        }
    }
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.stage.name(), self.strerror())
    }
}

impl std::error::Error for SpawnError {}

/// Failures of the service itself (not of one spawn).
#[derive(Debug)]
pub enum CoreError {
    Disposed,
    /// The service was created by another process (this one is a forked child).
    ForkedChild,
    Invalid(String),
    Spawn(SpawnError),
    Io(io::Error),
}

impl fmt::Display for CoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disposed => write!(f, "the subprocess service has been disposed"),
            Self::ForkedChild => write!(
                f,
                "this subprocess service belongs to the parent process; create one after fork"
            ),
            Self::Invalid(msg) => write!(f, "{msg}"),
            Self::Spawn(err) => write!(f, "{err}"),
            Self::Io(err) => write!(f, "{err}"),
        }
    }
}

impl std::error::Error for CoreError {}

impl From<SpawnError> for CoreError {
    fn from(err: SpawnError) -> Self {
        Self::Spawn(err)
    }
}

impl From<io::Error> for CoreError {
    fn from(err: io::Error) -> Self {
        Self::Io(err)
    }
}
