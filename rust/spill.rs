//! Spill files: the complete byte stream of an output that outgrew its in-memory tail.
//!
//! One private directory per service (mode 0700, unpredictable name) holds files that are
//! each 0600 with a random name. The directory is opened once and every file is created
//! relative to that held fd (`openat` with `O_EXCL | O_NOFOLLOW`), so renaming or replacing
//! the directory's path never redirects a spill file. All spill files of a service share
//! one byte budget (`max_spill_total_bytes`): once it is spent, further spill writes stop
//! and the streams report `spill_truncated`.
//!
//! A large spill stays out of the page cache past its first `DIRECT_FROM` bytes. A spill
//! file is written once and rarely read again, mostly in part. Plainly buffered, every byte
//! of it stays a page-cache page, evicting pages the machine was using; on this project's VM
//! 64 MiB took 17 ms that way at first, then ~100 ms a file once the host's reclaim set in
//! (150-220 ms under load). Two ways out, in order:
//! - **Drop-behind** (`pwritev2(RWF_DONTCACHE)`, Linux 6.14, where the file system takes
//!   it): buffered writes whose pages leave the cache once written back. 64 MiB cost the
//!   writer ~25 ms of CPU here, steadily, and nothing waits for the device.
//! - **Uncached** (`O_DIRECT`), where drop-behind is refused: the writer waits for the
//!   device (64 MiB: 110-130 ms here, 7 ms of CPU). Writes go out in aligned 1 MiB batches
//!   from one buffer per file; the last partial block is written padded and the file cut
//!   back to its length. A file system without `O_DIRECT`, a rejected write, or a device
//!   slower than `SLOW_DEVICE_NS_PER_MIB` batch after batch turns the service's files
//!   buffered from then on (on a slow disk the page cache absorbs a burst the device could
//!   not).
//!
//! The supervisor thread, which drains every call, is the writer: a drain that waits for a
//! device stalls its producer, which is why drop-behind comes first.

use std::ffi::CString;
use std::fs::{self, DirBuilder, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, FileExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use nix::fcntl::{fcntl, FcntlArg, OFlag};

use crate::sys;

/// Spill bytes are gathered into batches before one file write: this size while buffered
/// (what a slowly spilling stream holds in memory), the larger one once uncached (fewer,
/// larger device writes: 1 MiB measured fastest here).
const BUFFERED_BATCH_BYTES: usize = 256 << 10;
pub const DIRECT_BATCH_BYTES: usize = 1 << 20;
/// Offsets, lengths and the buffer's address of uncached writes are multiples of this (the
/// largest logical block size of common devices; 512-byte devices take it too).
const DIRECT_ALIGN: usize = 4096;
/// Uncached batch writes slower than this per MiB (below 256 MiB/s), `SLOW_BATCHES` in a row,
/// mean the device does not keep up: buffered writes from then on. (In a row: one slow write
/// on a busy host says little.)
const SLOW_DEVICE_NS_PER_MIB: u128 = 4_000_000;
const SLOW_BATCHES: u32 = 4;
/// A file's first bytes are written buffered: a small spill costs a page-cache copy, where
/// an uncached write would keep the supervisor waiting for the device (and a padded block
/// and a truncation per file). Past this, a stream is a bulk dump read rarely and in part.
const DIRECT_FROM: u64 = 4 << 20;

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

/// Whether a service's large spill files may keep out of the page cache, and how (shared
/// by its files: once a file finds drop-behind refused, or `O_DIRECT` unsupported or the
/// device slow, later files do not try it again).
#[derive(Debug)]
pub struct DirectWrites {
    allowed: AtomicBool,
    drop_behind: AtomicBool,
}

impl DirectWrites {
    pub fn new(allowed: bool) -> Self {
        Self {
            allowed: AtomicBool::new(allowed),
            drop_behind: AtomicBool::new(allowed),
        }
    }

    /// `O_DIRECT` may still be tried.
    pub fn allowed(&self) -> bool {
        self.allowed.load(Ordering::Relaxed)
    }

    fn give_up(&self) {
        self.allowed.store(false, Ordering::Relaxed);
    }

    fn drop_behind(&self) -> bool {
        self.drop_behind.load(Ordering::Relaxed)
    }

    fn give_up_drop_behind(&self) {
        self.drop_behind.store(false, Ordering::Relaxed);
    }
}

/// How a spill file's batches are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cache {
    /// Into the page cache, where they stay.
    Kept,
    /// Into the page cache, dropped once written back (`RWF_DONTCACHE`).
    DropBehind,
    /// Straight to the device (`O_DIRECT` is set on the file).
    Direct,
}

/// Appends bytes to a new file in batches; past `DIRECT_FROM` bytes, out of the page cache
/// where possible (see the module's doc). The file holds every appended byte once
/// `complete` returned Ok.
#[derive(Debug)]
pub struct SpillWriter {
    file: File,
    cache: Cache,
    /// Drop-behind may be tried before `O_DIRECT` (tests of the `O_DIRECT` path clear it).
    try_drop_behind: bool,
    device: Arc<DirectWrites>,
    /// `buf[start..]` is the batch: bytes from file offset `base` on. Allocated with room
    /// for `start` (the distance to an aligned address) plus one batch, and never grown, so
    /// the batch's address stays aligned.
    buf: Vec<u8>,
    start: usize,
    /// The batch's size (the buffer holds no more).
    batch: usize,
    base: u64,
    /// Uncached batch writes in a row that were slower than `slow_ns_per_mib`.
    slow: u32,
    slow_ns_per_mib: u128,
    direct_from: u64,
}

impl SpillWriter {
    /// A writer for `file` (opened for writing, empty, without `O_APPEND`); past
    /// `DIRECT_FROM` bytes it drops its pages behind it, or else goes uncached, as `device`
    /// allows and the kernel and file system take it.
    pub fn new(file: File, device: Arc<DirectWrites>) -> Self {
        Self {
            file,
            cache: Cache::Kept,
            try_drop_behind: true,
            device,
            buf: Vec::new(),
            start: 0,
            batch: BUFFERED_BATCH_BYTES,
            base: 0,
            slow: 0,
            slow_ns_per_mib: SLOW_DEVICE_NS_PER_MIB,
            direct_from: DIRECT_FROM,
        }
    }

    /// True while writes bypass the page cache (`O_DIRECT`).
    pub fn is_direct(&self) -> bool {
        self.cache == Cache::Direct
    }

    /// True while the file's pages do not stay in the page cache (drop-behind or direct).
    pub fn is_uncached(&self) -> bool {
        self.cache != Cache::Kept
    }

    fn pending(&self) -> usize {
        self.buf.len() - self.start
    }

    /// Adds `bytes` to the file, writing each batch as it fills.
    pub fn append(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        if self.buf.capacity() == 0 && !bytes.is_empty() {
            self.new_batch(BUFFERED_BATCH_BYTES);
        }
        while !bytes.is_empty() {
            let take = bytes.len().min(self.batch - self.pending());
            self.buf.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending() == self.batch {
                self.write_out(false)?;
            }
        }
        Ok(())
    }

    /// A batch buffer of `batch` bytes at an aligned address, holding what was pending.
    fn new_batch(&mut self, batch: usize) {
        let mut buf = Vec::with_capacity(batch + DIRECT_ALIGN);
        let start = (DIRECT_ALIGN - buf.as_ptr() as usize % DIRECT_ALIGN) % DIRECT_ALIGN;
        buf.resize(start, 0);
        if self.buf.len() > self.start {
            buf.extend_from_slice(&self.buf[self.start..]);
        }
        self.buf = buf;
        self.start = start;
        self.batch = batch;
    }

    /// Writes every pending byte: the file is complete up to here.
    pub fn complete(&mut self) -> io::Result<()> {
        if self.pending() > 0 {
            self.write_out(true)?;
        }
        Ok(())
    }

    /// Writes the batch (`all`: every byte of it, else a full batch).
    ///
    /// Through the page cache, a full batch is written up to an aligned file offset, so
    /// that uncached writes can take over from there (once the file is `direct_from` long).
    /// Uncached, only whole blocks are written unless `all`: then the last partial block
    /// goes out padded with zeros, the file is cut back to its length, and the partial block
    /// stays in the batch (the next write rewrites it, longer). What is not written moves to
    /// the front.
    fn write_out(&mut self, all: bool) -> io::Result<()> {
        let len = self.pending();
        if self.cache != Cache::Direct {
            let end = self.base + len as u64;
            let keep = if all {
                0
            } else {
                (end % DIRECT_ALIGN as u64) as usize
            };
            let (from, to) = (self.start, self.start + len - keep);
            if self.cache == Cache::DropBehind {
                let wrote = sys::write_all_dropbehind(&self.file, &self.buf[from..to], self.base);
                if let Err(err) = wrote {
                    if !matches!(err.raw_os_error(), Some(libc::EOPNOTSUPP | libc::EINVAL)) {
                        return Err(err);
                    }
                    // Refused (before any byte, or after some: rewriting them at the same
                    // offsets is harmless): kept in the cache for this batch, and the file
                    // tries `O_DIRECT` at the next.
                    self.device.give_up_drop_behind();
                    self.cache = Cache::Kept;
                    return self.write_out(all);
                }
            } else {
                self.file.write_all_at(&self.buf[from..to], self.base)?;
            }
            self.base += (len - keep) as u64;
            self.buf.copy_within(to.., from);
            self.buf.truncate(from + keep);
            if !all && self.cache == Cache::Kept && self.base >= self.direct_from {
                self.go_uncached();
            }
            return Ok(());
        }
        let whole = len / DIRECT_ALIGN * DIRECT_ALIGN;
        let padded = if all {
            len.div_ceil(DIRECT_ALIGN) * DIRECT_ALIGN
        } else {
            whole
        };
        if padded == 0 {
            return Ok(());
        }
        self.buf.resize(self.start + padded, 0);
        let began = Instant::now();
        let wrote = self.file.write_all_at(&self.buf[self.start..], self.base);
        self.buf.truncate(self.start + len);
        if padded > len {
            // The padding is not the stream's: cut it off whatever the write did (a write
            // cut short by a file size limit may have written part of it).
            self.cut_back(self.base + len as u64)?;
        }
        if let Err(err) = wrote {
            if !matches!(err.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) {
                return Err(err);
            }
            // The file system refused an uncached write after accepting the flag.
            self.go_buffered()?;
            return self.write_out(all);
        }
        let per_mib = began.elapsed().as_nanos() * (1 << 20) / padded as u128;
        self.base += whole as u64;
        self.buf.copy_within(self.start + whole.., self.start);
        self.buf.truncate(self.start + (len - whole));
        if padded == DIRECT_BATCH_BYTES {
            self.slow = if per_mib > self.slow_ns_per_mib {
                self.slow + 1
            } else {
                0
            };
            if self.slow == SLOW_BATCHES {
                self.go_buffered()?;
            }
        }
        Ok(())
    }

    /// Cuts the file to `len` if it is longer.
    fn cut_back(&self, len: u64) -> io::Result<()> {
        if self.file.metadata()?.len() > len {
            self.file.set_len(len)?;
        }
        Ok(())
    }

    /// Drops the file's pages behind it from now on if the service still may; else sets
    /// `O_DIRECT` if the service still allows it and the batch starts on a block (a file
    /// system that refuses it makes the service's files buffered from then on).
    fn go_uncached(&mut self) {
        if self.try_drop_behind && self.device.drop_behind() {
            self.cache = Cache::DropBehind;
        } else if !self.device.allowed() || self.base % DIRECT_ALIGN as u64 != 0 {
            return;
        } else {
            match set_direct(&self.file, true) {
                Ok(()) => self.cache = Cache::Direct,
                Err(_) => {
                    self.device.give_up();
                    return;
                }
            }
        }
        if self.batch != DIRECT_BATCH_BYTES {
            self.new_batch(DIRECT_BATCH_BYTES);
        }
    }

    fn go_buffered(&mut self) -> io::Result<()> {
        self.device.give_up();
        set_direct(&self.file, false)?;
        self.cache = Cache::Kept;
        Ok(())
    }
}

/// Sets or clears `O_DIRECT` (the file's only status flag that may be set: spill files are
/// opened write-only, without `O_APPEND`).
fn set_direct(file: &File, on: bool) -> nix::Result<()> {
    let flags = if on { OFlag::O_DIRECT } else { OFlag::empty() };
    fcntl(file, FcntlArg::F_SETFL(flags)).map(drop)
}

/// One open spill file and the service budget its writes draw on.
#[derive(Debug)]
pub struct SpillFile {
    writer: SpillWriter,
    budget: Arc<SpillBudget>,
}

impl SpillFile {
    /// Bytes of the next `want` this file may still write (the shared budget allowing).
    pub fn grant(&self, want: u64) -> u64 {
        self.budget.take(want)
    }

    /// Adds bytes (written as batches fill).
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.writer.append(bytes)
    }

    /// Writes what is pending: the file holds every byte appended.
    pub fn complete(&mut self) -> io::Result<()> {
        self.writer.complete()
    }
}

/// The service's spill directory, created on first use.
pub struct SpillDir {
    parent: PathBuf,
    path: Option<PathBuf>,
    fd: Option<OwnedFd>,
    budget: Arc<SpillBudget>,
    device: Arc<DirectWrites>,
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
            device: Arc::new(DirectWrites::new(true)),
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
                writer: SpillWriter::new(file, Arc::clone(&self.device)),
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

    fn scratch_file(tag: &str) -> (PathBuf, File) {
        let path = std::env::temp_dir().join(format!(
            "shellseam-writer-{tag}-{}-{}",
            std::process::id(),
            random_hex(4).unwrap()
        ));
        let file = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        (path, file)
    }

    fn o_direct_set(writer: &SpillWriter) -> bool {
        let flags = fcntl(&writer.file, FcntlArg::F_GETFL).unwrap();
        OFlag::from_bits_truncate(flags).contains(OFlag::O_DIRECT)
    }

    /// Appends chunks of the given sizes (completing the file after those marked), and
    /// checks after each completion that the file holds exactly the bytes appended so far.
    /// `direct`: the service allows leaving the page cache (drop-behind first if
    /// `drop_behind`, else `O_DIRECT`).
    fn write_and_check(direct: bool, drop_behind: bool, direct_from: u64, plan: &[(usize, bool)]) {
        let (path, file) = scratch_file("plan");
        let mut writer = SpillWriter::new(file, Arc::new(DirectWrites::new(direct)));
        writer.try_drop_behind = drop_behind;
        writer.direct_from = direct_from;
        writer.slow_ns_per_mib = u128::MAX; // a busy test machine must not turn it buffered
        let mut stream = Vec::new();
        let mut seed = 7u32;
        for &(len, complete) in plan {
            let chunk: Vec<u8> = (0..len)
                .map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                    (seed >> 16) as u8
                })
                .collect();
            writer.append(&chunk).unwrap();
            stream.extend_from_slice(&chunk);
            if complete {
                writer.complete().unwrap();
                assert_eq!(o_direct_set(&writer), writer.is_direct());
                let got = fs::read(&path).unwrap();
                assert_eq!(got.len(), stream.len());
                assert!(got == stream, "the file holds the bytes appended, in order");
            }
        }
        // Full batches were written past `direct_from`: uncached from there on (drop-behind
        // where this kernel and file system take it, else `O_DIRECT`).
        if direct_from < DIRECT_FROM {
            assert_eq!(writer.is_uncached(), direct);
            if !drop_behind {
                assert_eq!(writer.is_direct(), direct);
            }
        }
        if !direct {
            assert!(!writer.is_uncached());
        }
        drop(writer);
        fs::remove_file(&path).unwrap();
    }

    #[test]
    fn every_byte_reaches_the_file_uncached_or_buffered() {
        const MIB: usize = DIRECT_BATCH_BYTES;
        let plan = [
            (1, true),
            (4095, true),
            (1, true),
            (5000, false),
            (MIB - 3, false),
            (10, true),
            (3 * MIB + 123, true),
            (0, true),
            (4096, true),
            (MIB, true),
            (77, false),
        ];
        for drop_behind in [false, true] {
            for direct_from in [0, 4096 * 3, DIRECT_FROM] {
                write_and_check(true, drop_behind, direct_from, &plan);
            }
        }
        write_and_check(false, true, 0, &plan);
    }

    #[test]
    fn the_file_goes_buffered_mid_stream_without_losing_a_byte() {
        let (path, file) = scratch_file("switch");
        let device = Arc::new(DirectWrites::new(true));
        let mut writer = SpillWriter::new(file, Arc::clone(&device));
        writer.try_drop_behind = false;
        writer.direct_from = 0;
        writer.slow_ns_per_mib = u128::MAX;
        let mut want = vec![b'a'; DIRECT_BATCH_BYTES + 5000];
        writer.append(&want).unwrap();
        assert!(writer.is_direct() && o_direct_set(&writer));
        writer.complete().unwrap(); // one padded block, cut back
        assert_eq!(fs::metadata(&path).unwrap().len(), want.len() as u64);
        writer.go_buffered().unwrap();
        assert!(!o_direct_set(&writer));
        assert!(!device.allowed(), "the service's later files stay buffered");
        writer.append(&[b'b'; 3000]).unwrap();
        writer.complete().unwrap();
        want.extend_from_slice(&[b'b'; 3000]);
        assert!(fs::read(&path).unwrap() == want);
        let (path2, file2) = scratch_file("after");
        let mut later = SpillWriter::new(file2, device);
        later.direct_from = 0;
        later.append(&[b'c'; 2 * DIRECT_BATCH_BYTES]).unwrap();
        assert!(!later.is_direct() && !o_direct_set(&later));
        fs::remove_file(&path).unwrap();
        fs::remove_file(&path2).unwrap();
    }

    #[test]
    fn a_device_slow_batch_after_batch_gets_buffered_writes() {
        let (path, file) = scratch_file("slow");
        let device = Arc::new(DirectWrites::new(true));
        let mut writer = SpillWriter::new(file, Arc::clone(&device));
        writer.try_drop_behind = false;
        writer.direct_from = 0;
        writer.slow_ns_per_mib = 0; // every write counts as slow
                                    // The first buffered batch, then SLOW_BATCHES - 1 uncached ones: still uncached.
        writer.append(&[b'x'; BUFFERED_BATCH_BYTES]).unwrap();
        let batch = vec![b'x'; DIRECT_BATCH_BYTES];
        for _ in 1..SLOW_BATCHES {
            writer.append(&batch).unwrap();
        }
        assert!(
            writer.is_direct(),
            "fewer slow batches than SLOW_BATCHES in a row"
        );
        writer.append(&batch).unwrap();
        assert!(!writer.is_direct() && !o_direct_set(&writer) && !device.allowed());
        writer.append(b"tail").unwrap();
        writer.complete().unwrap();
        let got = fs::read(&path).unwrap();
        let want = BUFFERED_BATCH_BYTES + SLOW_BATCHES as usize * DIRECT_BATCH_BYTES + 4;
        assert_eq!(got.len(), want);
        assert!(got.ends_with(b"xtail"));
        fs::remove_file(&path).unwrap();
    }

    /// Appends `DIRECT_FROM` and two more MiB of batches to a new spill file under
    /// `parent`, then `end\n`: the writer keeps the first bytes cached and goes uncached
    /// right past them, and the file holds every byte. Returns whether it went `O_DIRECT`.
    fn spill_a_large_file(parent: &Path, try_drop_behind: bool) -> bool {
        let mut dir = SpillDir::new(parent.to_path_buf());
        let (mut spill, path) = dir.create_file("stdout").unwrap();
        spill.writer.slow_ns_per_mib = u128::MAX;
        spill.writer.try_drop_behind = try_drop_behind;
        let mut want = Vec::new();
        for i in 0..(DIRECT_FROM as usize / DIRECT_BATCH_BYTES + 2) {
            assert_eq!(
                spill.writer.is_uncached(),
                i >= DIRECT_FROM as usize / DIRECT_BATCH_BYTES
            );
            let batch = vec![b'0' + i as u8; DIRECT_BATCH_BYTES];
            spill.append(&batch).unwrap();
            want.extend_from_slice(&batch);
        }
        assert!(spill.writer.is_uncached());
        assert_eq!(o_direct_set(&spill.writer), spill.writer.is_direct());
        spill.append(b"end\n").unwrap();
        spill.complete().unwrap();
        want.extend_from_slice(b"end\n");
        assert!(fs::read(&path).unwrap() == want);
        let direct = spill.writer.is_direct();
        drop(spill);
        dir.remove().unwrap();
        direct
    }

    /// Pages of `path` in the page cache (`mincore` over a mapping of it).
    fn cached_pages(path: &Path) -> usize {
        use std::os::fd::AsRawFd;
        let file = File::open(path).unwrap();
        let len = file.metadata().unwrap().len() as usize;
        let page = 4096;
        let mut resident = vec![0u8; len.div_ceil(page)];
        // SAFETY: a fresh read-only shared mapping of `len` bytes of an open file, queried
        // with a vector of one byte per page and unmapped before returning.
        unsafe {
            let addr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            );
            assert_ne!(addr, libc::MAP_FAILED);
            assert_eq!(libc::mincore(addr, len, resident.as_mut_ptr()), 0);
            libc::munmap(addr, len);
        }
        resident.iter().filter(|&&b| b & 1 == 1).count()
    }

    #[test]
    fn a_large_spill_file_goes_uncached_past_its_first_mebibytes() {
        // Drop-behind where the kernel and file system take it (else `O_DIRECT`)...
        spill_a_large_file(&std::env::temp_dir(), true);
        // ... and `O_DIRECT` where drop-behind is not tried.
        assert!(spill_a_large_file(&std::env::temp_dir(), false));
    }

    #[test]
    fn a_file_system_refusing_drop_behind_gets_direct_writes() {
        // tmpfs takes `O_DIRECT` but not `RWF_DONTCACHE`.
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return;
        }
        assert!(
            spill_a_large_file(shm, true),
            "refused drop-behind falls back to O_DIRECT"
        );
    }

    #[test]
    fn dropped_behind_pages_leave_the_page_cache() {
        let (path, file) = scratch_file("dropbehind");
        let device = Arc::new(DirectWrites::new(true));
        let mut writer = SpillWriter::new(file, Arc::clone(&device));
        writer.direct_from = 0;
        let batch = vec![b'd'; DIRECT_BATCH_BYTES];
        for _ in 0..9 {
            writer.append(&batch).unwrap();
        }
        writer.complete().unwrap();
        if writer.cache != Cache::DropBehind {
            // A kernel before 6.14 or a file system without it: O_DIRECT took over.
            assert!(writer.is_direct() && !device.drop_behind());
            fs::remove_file(&path).unwrap();
            return;
        }
        writer.file.sync_all().unwrap();
        // Written back, the file's pages leave the cache (the first, plainly buffered
        // batch of `BUFFERED_BATCH_BYTES` may stay).
        let deadline = Instant::now() + std::time::Duration::from_secs(5);
        let mut cached = cached_pages(&path);
        while cached > BUFFERED_BATCH_BYTES / 4096 && Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(20));
            cached = cached_pages(&path);
        }
        assert!(
            cached <= BUFFERED_BATCH_BYTES / 4096,
            "{cached} pages still cached"
        );
        assert_eq!(fs::read(&path).unwrap().len(), 9 * DIRECT_BATCH_BYTES);
        fs::remove_file(&path).unwrap();
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
