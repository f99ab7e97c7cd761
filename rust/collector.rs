//! Per-stream bounded collector: an in-memory tail plus a spill file with the full stream.
//!
//! The collector keeps the stream's head in memory until it outgrows `cap`; at that moment
//! it opens a spill file, writes everything so far (byte 0 onwards) and from then on streams
//! every chunk to the file, up to `spill_cap`. Memory holds only the last `cap` bytes, in a
//! ring of exactly `cap` bytes once full: each byte is copied into it at most once (a 1 GiB
//! stream is 1 GiB of copying, not 2 with a trimmed buffer). A consuming cursor serves
//! background reads: unread bytes older than the tail are dropped and flagged.

use std::borrow::Cow;
use std::io;
use std::path::PathBuf;

use crate::spill::SpillFile;
use crate::utf8;

/// Opens a fresh spill file on demand.
pub type SpillOpener<'a> = &'a mut dyn FnMut() -> io::Result<(SpillFile, PathBuf)>;

#[derive(Debug)]
pub struct Collector {
    cap: usize,
    spill_cap: u64,
    /// The last `min(total, cap)` bytes; once it holds `cap` bytes it is a ring whose
    /// oldest byte sits at `ring_start`.
    ring: Vec<u8>,
    ring_start: usize,
    total: u64,
    spill_file: Option<SpillFile>,
    spill_path: Option<PathBuf>,
    spill_written: u64,
    spill_truncated: bool,
    spill_failed: bool,
    read_pos: u64,
}

/// A snapshot of a finished (or running) stream, as the foreground result needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collected {
    pub text: String,
    pub truncated: bool,
    pub spill_path: Option<PathBuf>,
    pub total_bytes: u64,
    pub spill_truncated: bool,
}

/// One consuming read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delta {
    pub text: String,
    pub lossy: bool,
    pub spill_path: Option<PathBuf>,
    /// The spill file stopped short of the stream (its cap, or the service's total): it
    /// holds only the stream's head.
    pub spill_truncated: bool,
}

impl Collector {
    pub fn new(cap: usize, spill_cap: u64) -> Self {
        Self {
            cap: cap.max(1),
            spill_cap,
            ring: Vec::new(),
            ring_start: 0,
            total: 0,
            spill_file: None,
            spill_path: None,
            spill_written: 0,
            spill_truncated: false,
            spill_failed: false,
            read_pos: 0,
        }
    }

    pub fn total(&self) -> u64 {
        self.total
    }

    pub fn truncated(&self) -> bool {
        self.total > self.cap as u64
    }

    /// Offset of the first byte of the tail (the last `cap` bytes).
    fn window_start(&self) -> u64 {
        self.total - self.ring.len() as u64
    }

    /// Keeps the last `cap` bytes of the stream, `chunk` being its newest bytes.
    fn push_tail(&mut self, chunk: &[u8]) {
        let cap = self.cap;
        let mut chunk = &chunk[chunk.len().saturating_sub(cap)..];
        if self.ring.len() < cap {
            let take = (cap - self.ring.len()).min(chunk.len());
            self.ring.extend_from_slice(&chunk[..take]);
            chunk = &chunk[take..];
        }
        if chunk.is_empty() {
            return;
        }
        // Full: the newest bytes overwrite the oldest, from `ring_start` round the end.
        let first = chunk.len().min(cap - self.ring_start);
        self.ring[self.ring_start..self.ring_start + first].copy_from_slice(&chunk[..first]);
        self.ring[..chunk.len() - first].copy_from_slice(&chunk[first..]);
        self.ring_start = (self.ring_start + chunk.len()) % cap;
    }

    pub fn push(&mut self, chunk: &[u8], open_spill: SpillOpener<'_>) {
        if chunk.is_empty() {
            return;
        }
        let before = self.total;
        self.total += chunk.len() as u64;
        if self.spill_path.is_some() {
            // Already spilling (or the capped/failed file is closed: write_spill no-ops).
            self.write_spill(chunk);
        } else if self.total > self.cap as u64 && !self.spill_failed {
            // Nothing was dropped yet (before <= cap): the ring holds the complete head, in
            // order (it has not wrapped).
            debug_assert_eq!(before, self.ring.len() as u64);
            debug_assert_eq!(self.ring_start, 0);
            match open_spill() {
                Ok((file, path)) => {
                    self.spill_file = Some(file);
                    self.spill_path = Some(path);
                    let head = std::mem::take(&mut self.ring);
                    self.write_spill(&head);
                    self.ring = head;
                    self.write_spill(chunk);
                }
                Err(_) => self.spill_failed = true,
            }
        }
        self.push_tail(chunk);
    }

    fn write_spill(&mut self, bytes: &[u8]) {
        let Some(file) = self.spill_file.as_mut() else {
            return;
        };
        let room = self.spill_cap.saturating_sub(self.spill_written);
        let want = (bytes.len() as u64).min(room);
        // The service's spill files share one total budget (max_spill_total_bytes).
        let take = file.grant(want) as usize;
        if take < bytes.len() {
            self.spill_truncated = true;
        }
        // The file gathers small pipe reads into large writes: fewer syscalls on the
        // supervisor thread while a producer streams at full speed.
        let mut wrote = file.append(&bytes[..take]);
        self.spill_written += take as u64;
        if self.spill_truncated {
            wrote = wrote.and_then(|()| file.complete());
            self.spill_file = None;
        }
        if wrote.is_err() {
            // A full disk: the file keeps the head it got; say so instead of lying.
            self.spill_truncated = true;
            self.spill_file = None;
        }
    }

    /// Writes buffered spill bytes to the file (the file is complete after this).
    pub fn flush(&mut self) {
        if let Some(file) = self.spill_file.as_mut() {
            if file.complete().is_err() {
                self.spill_truncated = true;
                self.spill_file = None;
            }
        }
    }

    /// The stream ended: writes what is pending and closes the spill file (its batch
    /// buffer and descriptor are not kept for as long as the collector is).
    pub fn finish(&mut self) {
        self.flush();
        self.spill_file = None;
    }

    /// The tail as raw bytes, oldest first (a copy only when the ring has wrapped).
    pub fn tail_bytes(&self) -> Cow<'_, [u8]> {
        if self.ring_start == 0 {
            return Cow::Borrowed(&self.ring);
        }
        let mut tail = Vec::with_capacity(self.ring.len());
        tail.extend_from_slice(&self.ring[self.ring_start..]);
        tail.extend_from_slice(&self.ring[..self.ring_start]);
        Cow::Owned(tail)
    }

    pub fn collected(&self) -> Collected {
        let truncated = self.truncated();
        let whole = self.tail_bytes();
        let tail = if truncated {
            utf8::skip_partial_start(&whole)
        } else {
            &whole
        };
        Collected {
            text: String::from_utf8_lossy(tail).into_owned(),
            truncated,
            spill_path: self.spill_path.clone(),
            total_bytes: self.total,
            spill_truncated: self.spill_truncated,
        }
    }

    /// Consumes the unread bytes. While the stream may still grow (`final_read` false), an
    /// incomplete UTF-8 sequence at the end is left unread for the next call. The spill
    /// file the delta names is written out first: it holds the stream up to this read.
    pub fn read(&mut self, final_read: bool) -> Delta {
        self.flush();
        let window = self.window_start();
        let lossy = self.read_pos < window;
        let start = self.read_pos.max(window);
        let from = (start - window) as usize;
        let tail = self.tail_bytes();
        let mut bytes = &tail[from..];
        if lossy {
            bytes = utf8::skip_partial_start(bytes);
        }
        let skipped = (tail.len() - from - bytes.len()) as u64;
        if !final_read {
            bytes = utf8::trim_partial_end(bytes);
        }
        let read_pos = start + skipped + bytes.len() as u64;
        let text = String::from_utf8_lossy(bytes).into_owned();
        self.read_pos = read_pos;
        Delta {
            text,
            lossy,
            spill_path: self.spill_path.clone(),
            spill_truncated: self.spill_truncated,
        }
    }

    pub fn spill_path(&self) -> Option<&PathBuf> {
        self.spill_path.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_spill() -> impl FnMut() -> io::Result<(SpillFile, PathBuf)> {
        || Err(io::Error::other("no spill in this test"))
    }

    #[test]
    fn small_stream_is_kept_whole() {
        let mut c = Collector::new(10, 100);
        let mut open = no_spill();
        c.push(b"hello", &mut open);
        let got = c.collected();
        assert_eq!(got.text, "hello");
        assert!(!got.truncated);
        assert_eq!(got.total_bytes, 5);
    }

    #[test]
    fn tail_never_starts_inside_a_code_point() {
        let mut c = Collector::new(4, 100);
        let mut open = no_spill();
        c.push("aé€".as_bytes(), &mut open); // 1 + 2 + 3 bytes
        let got = c.collected();
        assert!(got.truncated);
        assert_eq!(got.text, "€");
    }

    #[test]
    fn consuming_reads_flag_dropped_bytes() {
        let mut c = Collector::new(4, 100);
        let mut open = no_spill();
        c.push(b"ab", &mut open);
        assert_eq!(c.read(false).text, "ab");
        c.push(b"cdefgh", &mut open);
        let d = c.read(false);
        assert_eq!(d.text, "efgh");
        assert!(d.lossy);
        let d = c.read(false);
        assert_eq!(d.text, "");
        assert!(!d.lossy);
    }

    #[test]
    fn capped_spill_is_not_reopened_by_later_chunks() {
        let dir = std::env::temp_dir();
        let mut spill = crate::spill::SpillDir::new(dir);
        let mut c = Collector::new(10, 25);
        {
            let mut open = || spill.create_file("t");
            for _ in 0..5 {
                c.push(b"0123456789", &mut open);
            }
        }
        c.flush();
        let got = c.collected();
        assert!(got.spill_truncated);
        let path = got.spill_path.unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"0123456789012345678901234");
        spill.remove().unwrap();
    }

    #[test]
    fn ring_holds_the_last_cap_bytes_across_wraps() {
        // Chunk sizes around and across the cap: the tail is always the stream's last bytes.
        let mut c = Collector::new(7, 0);
        let mut open = no_spill();
        let mut stream = Vec::new();
        for (i, len) in [1, 6, 7, 3, 8, 15, 2, 7, 1, 1, 13].iter().enumerate() {
            let chunk: Vec<u8> = (0..*len).map(|k| b'a' + ((i * 5 + k) % 26) as u8).collect();
            c.push(&chunk, &mut open);
            stream.extend_from_slice(&chunk);
            let keep = stream.len().min(7);
            assert_eq!(&*c.tail_bytes(), &stream[stream.len() - keep..]);
        }
    }

    #[test]
    fn partial_code_point_waits_for_the_rest() {
        let mut c = Collector::new(64, 100);
        let mut open = no_spill();
        let euro = "€".as_bytes();
        c.push(&euro[..2], &mut open);
        assert_eq!(c.read(false).text, "");
        c.push(&euro[2..], &mut open);
        assert_eq!(c.read(false).text, "€");
    }
}
