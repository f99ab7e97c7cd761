//! Spill files: the complete byte stream of an output that outgrew its in-memory tail.
//!
//! One private directory per service (mode 0700, unpredictable name) holds files that are
//! each 0600 with a random name. The directory is opened once and every file is created
//! relative to that held fd (`openat` with `O_EXCL | O_NOFOLLOW`), so renaming or replacing
//! the directory's path never redirects a spill file. All spill files of a service share
//! one byte budget (`max_spill_total_bytes`): once it is spent, further spill writes stop
//! and the streams report `spill_truncated`.

use std::ffi::CString;
use std::fs::{self, DirBuilder, File};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Random lowercase hex from the kernel's CSPRNG.
pub fn random_hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    crate::sys::fill_random(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The bytes every spill file of one service may still take together.
#[derive(Debug)]
pub struct SpillBudget {
    left: AtomicU64,
}

impl SpillBudget {
    pub fn new(total: u64) -> Self {
        Self {
            left: AtomicU64::new(total),
        }
    }

    /// Takes up to `want` bytes; returns how many were granted.
    pub fn take(&self, want: u64) -> u64 {
        let mut granted = 0;
        let _ = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                granted = left.min(want);
                Some(left - granted)
            });
        granted
    }

    pub fn left(&self) -> u64 {
        self.left.load(Ordering::Acquire)
    }
}

/// One open spill file and the service budget its writes draw on.
#[derive(Debug)]
pub struct SpillFile {
    file: File,
    budget: Arc<SpillBudget>,
}

impl SpillFile {
    /// Bytes of the next `want` this file may still write (the shared budget allowing).
    pub fn grant(&self, want: u64) -> u64 {
        self.budget.take(want)
    }

    pub fn write_all(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.file.write_all(bytes)
    }
}

/// The service's spill directory, created on first use.
pub struct SpillDir {
    parent: PathBuf,
    path: Option<PathBuf>,
    fd: Option<OwnedFd>,
    budget: Arc<SpillBudget>,
}

fn cpath(path: &Path) -> io::Result<CString> {
    use std::os::unix::ffi::OsStrExt;
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))
}

fn open_dir_nofollow(path: &Path) -> io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: opens a NUL-terminated path; returns a fresh fd or -1.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is fresh and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl SpillDir {
    pub fn new(parent: PathBuf) -> Self {
        Self::with_total(parent, u64::MAX)
    }

    /// A spill directory whose files may hold `total` bytes together.
    pub fn with_total(parent: PathBuf, total: u64) -> Self {
        Self {
            parent,
            path: None,
            fd: None,
            budget: Arc::new(SpillBudget::new(total)),
        }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    pub fn budget_left(&self) -> u64 {
        self.budget.left()
    }

    /// Creates the directory now (if not yet) and returns its path.
    pub fn ensure_dir(&mut self) -> io::Result<PathBuf> {
        self.ensure().map(|(path, _)| path)
    }

    fn ensure(&mut self) -> io::Result<(PathBuf, i32)> {
        if let (Some(path), Some(fd)) = (&self.path, &self.fd) {
            return Ok((path.clone(), fd.as_raw_fd()));
        }
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.parent)?;
        for _ in 0..16 {
            let candidate = self.parent.join(format!("shellseam-{}", random_hex(12)?));
            match DirBuilder::new().mode(0o700).create(&candidate) {
                Ok(()) => {
                    let fd = open_dir_nofollow(&candidate)?;
                    let raw = fd.as_raw_fd();
                    self.path = Some(candidate.clone());
                    self.fd = Some(fd);
                    return Ok((candidate, raw));
                }
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(err),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "could not create a unique spill directory",
        ))
    }

    /// Puts the directory's mode back to 0700 if a command changed it. Landlock has no right
    /// for `chmod`, so a workspace-write command running as the harness's uid can open the
    /// directory to other users (who could then replace what the model reads); while it is
    /// 0700 again the files' own modes do not matter. Called as each call finishes.
    pub fn keep_private(&self) {
        let Some(fd) = &self.fd else { return };
        if let Ok(st) = nix::sys::stat::fstat(fd) {
            if st.st_mode & 0o7777 != 0o700 {
                let _ = nix::sys::stat::fchmod(fd, nix::sys::stat::Mode::from_bits_truncate(0o700));
            }
        }
    }

    /// Creates a new private spill file; `label` only helps a human reading the directory.
    pub fn create_file(&mut self, label: &str) -> io::Result<(SpillFile, PathBuf)> {
        let (dir, dirfd) = self.ensure()?;
        for _ in 0..16 {
            let name = format!("{label}-{}.log", random_hex(12)?);
            let cname = cpath(Path::new(&name))?;
            // SAFETY: openat on the held directory fd with a NUL-terminated single-component
            // name; returns a fresh fd or -1.
            let fd = unsafe {
                libc::openat(
                    dirfd,
                    cname.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC,
                    0o600 as libc::c_uint,
                )
            };
            if fd < 0 {
                let err = io::Error::last_os_error();
                if err.kind() == io::ErrorKind::AlreadyExists {
                    continue;
                }
                return Err(err);
            }
            // SAFETY: `fd` was just returned by openat and is owned by nobody else.
            let file = unsafe { File::from_raw_fd(fd) };
            let spill = SpillFile {
                file,
                budget: Arc::clone(&self.budget),
            };
            return Ok((spill, dir.join(name)));
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "could not create a unique spill file",
        ))
    }

    /// Removes the directory and everything in it (a symlink put in its place is removed,
    /// never followed).
    pub fn remove(&mut self) -> io::Result<()> {
        self.fd = None;
        match self.path.take() {
            Some(path) => match fs::remove_dir_all(&path) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
                _ => Ok(()),
            },
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn directory_and_files_are_private_and_unique() {
        let base = std::env::temp_dir();
        let mut dir = SpillDir::new(base);
        let (_f1, p1) = dir.create_file("stdout").unwrap();
        let (_f2, p2) = dir.create_file("stdout").unwrap();
        assert_ne!(p1, p2);
        let dir_path = dir.path().unwrap().to_path_buf();
        let mode = fs::metadata(&dir_path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let mode = fs::metadata(&p1).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        dir.remove().unwrap();
        assert!(!dir_path.exists());
    }

    #[test]
    fn a_swapped_directory_path_never_redirects_a_file() {
        let base = std::env::temp_dir().join(format!("spill-swap-{}", random_hex(6).unwrap()));
        let target = base.join("target");
        fs::create_dir_all(&target).unwrap();
        let mut dir = SpillDir::new(base.join("parent"));
        let (_f, first) = dir.create_file("stdout").unwrap();
        let spill = dir.path().unwrap().to_path_buf();
        let moved = base.join("moved");
        fs::rename(&spill, &moved).unwrap();
        std::os::unix::fs::symlink(&target, &spill).unwrap();
        let (_g, second) = dir.create_file("stdout").unwrap();
        assert_eq!(fs::read_dir(&target).unwrap().count(), 0);
        let name = second.file_name().unwrap();
        assert!(moved.join(name).exists());
        assert!(moved.join(first.file_name().unwrap()).exists());
        dir.remove().unwrap();
        assert!(target.exists(), "removal never follows the planted symlink");
        fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_budget_is_shared_and_never_overspent() {
        let budget = SpillBudget::new(10);
        assert_eq!(budget.take(4), 4);
        assert_eq!(budget.take(10), 6);
        assert_eq!(budget.take(1), 0);
        assert_eq!(budget.left(), 0);
    }
}
