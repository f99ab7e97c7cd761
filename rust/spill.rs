//! Spill files: the complete byte stream of an output that outgrew its in-memory tail.
//!
//! One private directory per service (mode 0700, unpredictable name) holds files that are
//! each 0600 with a random name, created with O_EXCL | O_NOFOLLOW so that nothing planted
//! in a shared temp directory can redirect a command's output.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Random lowercase hex from the kernel's CSPRNG.
pub fn random_hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    let mut filled = 0;
    while filled < buf.len() {
        // The raw syscall, not glibc's getrandom() wrapper (GLIBC_2.25): the wheel's
        // symbol versions then name only what the manylinux tag promises, whatever glibc
        // or linker (zig stubs leave an unknown symbol unversioned) built it.
        // SAFETY: getrandom writes at most `len - filled` bytes into the unfilled tail.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getrandom,
                buf[filled..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - filled,
                0 as libc::c_uint,
            )
        };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        filled += n as usize;
    }
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// The service's spill directory, created on first use.
pub struct SpillDir {
    parent: PathBuf,
    path: Option<PathBuf>,
}

impl SpillDir {
    pub fn new(parent: PathBuf) -> Self {
        Self { parent, path: None }
    }

    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    fn ensure(&mut self) -> io::Result<PathBuf> {
        if let Some(path) = &self.path {
            return Ok(path.clone());
        }
        for _ in 0..16 {
            let candidate = self.parent.join(format!("shellseam-{}", random_hex(12)?));
            match DirBuilder::new().mode(0o700).create(&candidate) {
                Ok(()) => {
                    self.path = Some(candidate.clone());
                    return Ok(candidate);
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

    /// Creates a new private spill file; `label` only helps a human reading the directory.
    pub fn create_file(&mut self, label: &str) -> io::Result<(File, PathBuf)> {
        let dir = self.ensure()?;
        for _ in 0..16 {
            let path = dir.join(format!("{label}-{}.log", random_hex(12)?));
            let opened = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path);
            match opened {
                Ok(file) => return Ok((file, path)),
                Err(err) if err.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(err) => return Err(err),
            }
        }
        Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "could not create a unique spill file",
        ))
    }

    /// Removes the directory and everything in it.
    pub fn remove(&mut self) -> io::Result<()> {
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
}
