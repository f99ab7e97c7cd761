//! The keeper: no command outlives its harness.
//!
//! A small process per service holds the read end of a pipe whose only write end is the
//! service's (close-on-exec, so no command inherits it). The service tells it, one line at
//! a time, what to clean up: its cgroup parents, the process groups of session-contained
//! calls, and a spill directory that is not kept. The process groups, one per call, go
//! into a table the two share instead (a memfd, the keeper's fd 3), each with its leader's
//! pidfs inode number: one `pwrite` when a call starts and one when it settles, without waking the keeper (a line on the pipe
//! costs a wake-up of another process, ~20 us a call here); calls beyond the table's slots
//! are told by line. When the harness dies — any signal,
//! `SIGKILL` and `os._exit` included — the kernel closes the write end; the keeper reads
//! EOF, kills every call cgroup (`cgroup.kill` on the service's parent covers every call
//! and every descendant) and every live session group, removes the cgroups and the spill
//! directory, and exits. `dispose()` sends `exit` after cleaning up itself.
//!
//! The keeper is `python -I -S` running a three-line bootstrap that loads this extension
//! module from its file (no package import, no site) and calls `keeper_main(0)`: a maturin
//! wheel ships one native library, and this reuses it instead of a second binary.

use std::collections::{BTreeMap, HashMap};
use std::ffi::CString;
use std::fs;
use std::io::{self, BufRead, BufReader};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::memfd::{memfd_create, MFdFlags};

use crate::cgroup::remove_tree;
use crate::spawn::{spawn, SpawnPlan, SCRIPT_FD};

/// Slots of the shared group table: that many session-contained calls at once are told
/// without a line (256 KiB of memfd).
const GROUP_SLOTS: usize = 16384;
/// One slot: the pgid (i32), four bytes of padding, the leader's pidfs inode (u64).
const SLOT: usize = 16;
/// The most slots a keeper reads (a bound on what a line can make it allocate).
const MAX_GROUP_SLOTS: usize = 1 << 20;

/// How long the keeper waits for killed cgroups to empty before removing them.
const EMPTY_WAIT: Duration = Duration::from_secs(2);

/// What the keeper has been told to clean up.
#[derive(Debug, Default, PartialEq)]
pub struct Duties {
    pub cgroups: Vec<PathBuf>,
    pub dirs: Vec<PathBuf>,
    pub spills: Vec<PathBuf>,
    /// Trees the harness made for its commands and removes when their call settles.
    pub scratch: Vec<PathBuf>,
    /// Session groups told by line: pgid → the leader's pidfs inode (0: unknown).
    pub groups: BTreeMap<libc::pid_t, u64>,
    /// The shared group table: its fd and slot count (`groups <fd> <slots>`).
    pub table: Option<(RawFd, usize)>,
    pub exit: bool,
}

impl Duties {
    /// Applies one protocol line; unknown lines are ignored.
    pub fn apply(&mut self, line: &str) {
        let (verb, arg) = line.split_once(' ').unwrap_or((line, ""));
        match verb {
            "cgroup" => self.cgroups.push(PathBuf::from(arg)),
            "dir" => self.dirs.push(PathBuf::from(arg)),
            "spill" => self.spills.push(PathBuf::from(arg)),
            "keep-spill" => self.spills.retain(|p| p != Path::new(arg)),
            "scratch" => self.scratch.push(PathBuf::from(arg)),
            "unscratch" => self.scratch.retain(|p| p != Path::new(arg)),
            "group" => {
                let (pgid, ino) = arg.split_once(' ').unwrap_or((arg, "0"));
                if let (Ok(pgid), Ok(ino)) = (pgid.parse(), ino.parse()) {
                    self.groups.insert(pgid, ino);
                }
            }
            "ungroup" => {
                if let Ok(pgid) = arg.parse::<libc::pid_t>() {
                    self.groups.remove(&pgid);
                }
            }
            "groups" => {
                let mut words = arg.split(' ').map(str::parse::<usize>);
                if let (Some(Ok(fd)), Some(Ok(slots)), None) =
                    (words.next(), words.next(), words.next())
                {
                    if let Ok(fd) = RawFd::try_from(fd) {
                        self.table = Some((fd, slots.min(MAX_GROUP_SLOTS)));
                    }
                }
            }
            "exit" => self.exit = true,
            _ => {}
        }
    }

    /// Every session group to kill, with its leader's pidfs inode: those told by line and
    /// those in the shared table.
    pub fn all_groups(&self) -> BTreeMap<libc::pid_t, u64> {
        let mut all = self.groups.clone();
        if let Some((fd, slots)) = self.table {
            all.extend(read_table(fd, slots));
        }
        all
    }

    /// The harness is gone: kill, wait briefly, remove.
    pub fn clean_up(&self) {
        // SAFETY: getpgrp has no preconditions.
        let own = unsafe { libc::getpgrp() };
        let groups = self.all_groups();
        let deadline = Instant::now() + EMPTY_WAIT;
        // Again while a pass left anybody running: a process not killed yet (one that
        // `cgroup.kill` misses, a session member outside the group) may have forked after
        // the pass listed it.
        loop {
            let mut reached = false;
            for cg in &self.cgroups {
                reached |= kill_cgroup(cg);
            }
            for (&pgid, &ino) in &groups {
                if pgid > 1 && pgid != own {
                    reached |= kill_session(pgid, ino);
                }
            }
            if !reached || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        while self.cgroups.iter().any(|cg| populated(cg)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        for dir in self.cgroups.iter().chain(&self.dirs) {
            remove_tree(dir);
        }
        // std's remove_dir_all opens every level without following symlinks and never
        // climbs back up by "..": nothing a (now dead) command left can redirect it.
        for tree in self.spills.iter().chain(&self.scratch) {
            let _ = fs::remove_dir_all(tree);
        }
    }
}

/// Kills every process of call cgroup `cg` (and below): `cgroup.kill`, then by pid what it
/// misses (a process whose main thread exited). Whether a process still runs afterwards.
fn kill_cgroup(cg: &Path) -> bool {
    let _ = fs::write(cg.join("cgroup.kill"), "1");
    let Some(name) = cg.file_name() else {
        return false;
    };
    let tail = format!("/{}", name.to_string_lossy());
    crate::contain::kill_members_by_pid(&procs_below(cg), &tail);
    procs_below(cg)
        .into_iter()
        .any(|pid| crate::kill::liveness(pid) == Some(true))
}

/// Kills what is left of a session-contained call whose leader had pidfs inode `ino`.
///
/// While its pid names the leader still (the inode says so), the group is killed through the
/// leader's pidfd: the group itself. When the pid names another process, the number was free
/// (nothing of the call held it any more) and went to a stranger, not ours to kill. When no
/// process has it (the leader was reaped since the harness died) or the inode is unknown, the
/// group and session are found by their number, as members still hold it. Whether it
/// reached a live member outside the group.
fn kill_session(pgid: libc::pid_t, ino: u64) -> bool {
    let leader = crate::kill::pidfd_open(pgid).filter(|_| ino != 0);
    let by_pidfd = match &leader {
        Some(fd) if crate::kill::pidfs_ino(fd.as_fd()) != ino => return false,
        Some(fd) => crate::kill::signal_group_of(fd.as_fd(), libc::SIGKILL).is_ok(),
        None => false,
    };
    if !by_pidfd {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
    }
    // The session's members that left the group (`set -m`, `setpgid`).
    !crate::kill::signal_outside_group(pgid, libc::SIGKILL, || true).is_empty()
}

/// The live groups in a group table (pgid 0: a free slot), with their leaders' inodes.
fn read_table(fd: RawFd, slots: usize) -> Vec<(libc::pid_t, u64)> {
    let mut buf = vec![0u8; slots * SLOT];
    let mut off = 0;
    while off < buf.len() {
        // SAFETY: reads into the unfilled part of a live buffer of that length; `fd` is only
        // read (a wrong fd yields an error or bytes, never memory unsafety).
        let n = unsafe {
            libc::pread(
                fd,
                buf[off..].as_mut_ptr() as *mut libc::c_void,
                buf.len() - off,
                off as libc::off_t,
            )
        };
        if n > 0 {
            off += n as usize;
        } else if n == 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            break;
        }
    }
    buf[..off - off % SLOT]
        .chunks_exact(SLOT)
        .filter_map(|c| {
            let pgid = libc::pid_t::from_ne_bytes(c[..4].try_into().ok()?);
            let ino = u64::from_ne_bytes(c[8..].try_into().ok()?);
            (pgid != 0).then_some((pgid, ino))
        })
        .collect()
}

/// The harness's side of the group table.
struct GroupTable {
    /// The process that made it: a forked copy of the harness shares the memfd and must
    /// never write the parent's slots.
    owner: u32,
    file: fs::File,
    slots: HashMap<libc::pid_t, u64>,
    free: Vec<u64>,
}

impl GroupTable {
    fn new(slots: usize) -> io::Result<Self> {
        let fd = memfd_create(c"shellseam-keeper-groups", MFdFlags::MFD_CLOEXEC)?;
        let file = fs::File::from(fd);
        file.set_len((slots * SLOT) as u64)?;
        Ok(Self {
            owner: std::process::id(),
            file,
            slots: HashMap::new(),
            free: (0..slots as u64).rev().collect(),
        })
    }

    /// Puts `pgid` (its leader's pidfs inode `ino`) in a free slot; false when none is left
    /// (or the write failed).
    fn insert(&mut self, pgid: libc::pid_t, ino: u64) -> bool {
        if std::process::id() != self.owner {
            return false;
        }
        if self.slots.contains_key(&pgid) {
            return true;
        }
        let Some(slot) = self.free.pop() else {
            return false;
        };
        if self
            .file
            .write_all_at(&slot_bytes(pgid, ino), slot * SLOT as u64)
            .is_err()
        {
            self.free.push(slot);
            return false;
        }
        self.slots.insert(pgid, slot);
        true
    }

    /// Frees `pgid`'s slot; false when it has none (it was told by line).
    fn remove(&mut self, pgid: libc::pid_t) -> bool {
        if std::process::id() != self.owner {
            return false; // the parent's slot: not ours to clear (as `insert` refuses)
        }
        let Some(slot) = self.slots.remove(&pgid) else {
            return false;
        };
        // The slot's page was written when the pgid went in, so clearing it allocates
        // nothing; should it fail all the same, the slot is never reused.
        if self
            .file
            .write_all_at(&slot_bytes(0, 0), slot * SLOT as u64)
            .is_ok()
        {
            self.free.push(slot);
        }
        true
    }
}

fn slot_bytes(pgid: libc::pid_t, ino: u64) -> [u8; SLOT] {
    let mut bytes = [0u8; SLOT];
    bytes[..4].copy_from_slice(&pgid.to_ne_bytes());
    bytes[8..].copy_from_slice(&ino.to_ne_bytes());
    bytes
}

/// The processes of cgroup `dir` and of every cgroup below it.
fn procs_below(dir: &Path) -> Vec<libc::pid_t> {
    let mut pids = fs::read_to_string(dir.join("cgroup.procs"))
        .map(|t| crate::cgroup::procs(&t))
        .unwrap_or_default();
    pids.extend(crate::cgroup::procs_below(dir));
    pids
}

fn populated(cg: &Path) -> bool {
    fs::read_to_string(cg.join("cgroup.events"))
        .map(|t| t.lines().any(|l| l == "populated 1"))
        .unwrap_or(false)
}

/// The keeper process's body: reads duties from `fd` until `exit` or EOF.
pub fn keeper_main(fd: i32) -> i32 {
    // Only the harness's death (or `exit`) ends the keeper: a Ctrl-C or a SIGTERM sent to
    // the harness's process group must not take the safety net down first.
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE] {
        // SAFETY: installs the ignore disposition; no handler code is involved.
        unsafe { libc::signal(sig, libc::SIG_IGN) };
    }
    // Not dumpable: a command of the harness's user cannot open the keeper's duty pipe
    // through /proc/<keeper>/fd (to hold it open past the harness's death, or to write it
    // duties), read its memory or ptrace it. (Root with CAP_SYS_PTRACE still can: an
    // unconfined root command is outside every boundary.)
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    // SAFETY: the keeper owns fd `fd` (its stdin); nothing else uses it.
    let input = unsafe { fs::File::from_raw_fd(fd) };
    let mut duties = Duties::default();
    for line in BufReader::new(input).lines() {
        let Ok(line) = line else { break };
        duties.apply(&line);
        if duties.exit {
            return 0;
        }
    }
    duties.clean_up();
    0
}

/// The harness's side: the pipe to a running keeper, and the group table it shares.
pub struct Keeper {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    pipe: OwnedFd,
    table: Option<GroupTable>,
}

impl Keeper {
    /// Starts `argv` (the bootstrap) as the keeper, its stdin the duty pipe.
    pub fn start(program: &CString, argv: Vec<CString>) -> io::Result<Self> {
        // No table (no memfd here): every group goes by line.
        let table = GroupTable::new(GROUP_SLOTS).ok();
        let plan = SpawnPlan {
            script: table.as_ref().map(|t| t.file.as_raw_fd()),
            ..SpawnPlan::new(
                program.clone(),
                argv,
                std::sync::Arc::new(Vec::new()),
                CString::new("/").unwrap_or_default(),
            )
        };
        let child = spawn(&plan).map_err(|e| io::Error::from_raw_os_error(e.errno))?;
        // Its stdout and stderr are not read: writes there fail with EPIPE (ignored).
        drop((child.pipes.stdout, child.pipes.stderr));
        let Some(pipe) = child.pipes.stdin else {
            // Not reached (spawn always makes it): no keeper without its pipe.
            // SAFETY: kills our own child, then reaps it.
            unsafe {
                libc::kill(child.pid, libc::SIGKILL);
            }
            crate::sys::reap_blocking(child.pid);
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
        let keeper = Self {
            pid: child.pid,
            pidfd: child.pidfd,
            pipe,
            table,
        };
        if keeper.table.is_some() {
            keeper.send(&format!("groups {SCRIPT_FD} {GROUP_SLOTS}"));
        }
        Ok(keeper)
    }

    /// The keeper kills process group `pgid` (a session-contained call whose leader has
    /// pidfs inode `ino`, 0 if unknown) if the harness dies.
    pub fn group(&mut self, pgid: libc::pid_t, ino: u64) {
        if !self.table.as_mut().is_some_and(|t| t.insert(pgid, ino)) {
            self.send(&format!("group {pgid} {ino}"));
        }
    }

    /// The call of `pgid` settled: the keeper forgets the group.
    pub fn ungroup(&mut self, pgid: libc::pid_t) {
        if !self.table.as_mut().is_some_and(|t| t.remove(pgid)) {
            self.send(&format!("ungroup {pgid}"));
        }
    }

    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// Sends one duty line. A full pipe (the keeper stopped) drops the line rather than
    /// blocking the harness.
    pub fn send(&self, line: &str) {
        if line.contains('\n') {
            return; // a path with a newline cannot be told; never split it into two duties
        }
        let mut buf = Vec::with_capacity(line.len() + 1);
        buf.extend_from_slice(line.as_bytes());
        buf.push(b'\n');
        let mut off = 0;
        while off < buf.len() {
            // SAFETY: writes from a live buffer to our pipe fd.
            let n = unsafe {
                libc::write(
                    self.pipe.as_raw_fd(),
                    buf[off..].as_ptr() as *const libc::c_void,
                    buf.len() - off,
                )
            };
            if n > 0 {
                off += n as usize;
            } else if io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                return;
            }
        }
    }

    /// Tells the keeper to exit without cleaning up, and reaps it.
    pub fn stop(self) {
        self.send("exit");
        let mut pfd = libc::pollfd {
            fd: self.pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: polls one valid pollfd owned by this frame.
        if unsafe { libc::poll(&mut pfd, 1, 2000) } <= 0 {
            // SAFETY: signals our own unreaped child (its pid cannot have been reused).
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
        let mut status = 0;
        // SAFETY: reaps our own child; `status` is a valid out-pointer.
        unsafe { libc::waitpid(self.pid, &mut status, 0) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn duty_lines_accumulate() {
        let mut d = Duties::default();
        for line in [
            "cgroup /sys/fs/cgroup/x",
            "spill /tmp/a b",
            "group 42",
            "group 43 7",
            "group x 7",
            "group 44 y",
            "ungroup 42",
            "bogus",
            "keep-spill /tmp/zz",
            "scratch /tmp/s1",
            "scratch /tmp/s2",
            "unscratch /tmp/s1",
        ] {
            d.apply(line);
        }
        assert_eq!(d.cgroups, vec![PathBuf::from("/sys/fs/cgroup/x")]);
        assert_eq!(d.spills, vec![PathBuf::from("/tmp/a b")]);
        assert_eq!(d.groups.clone().into_iter().collect::<Vec<_>>(), [(43, 7)]);
        assert_eq!(d.scratch, vec![PathBuf::from("/tmp/s2")]);
        assert!(!d.exit);
        d.apply("exit");
        assert!(d.exit);
    }

    #[test]
    fn the_group_table_line_is_checked() {
        let mut d = Duties::default();
        for bad in [
            "groups",
            "groups 3",
            "groups x 4",
            "groups 3 4 5",
            "groups -1 4",
        ] {
            d.apply(bad);
            assert_eq!(d.table, None, "{bad}");
        }
        d.apply("groups 3 16384");
        assert_eq!(d.table, Some((3, 16384)));
        d.apply("groups 3 99999999999");
        assert_eq!(d.table, Some((3, MAX_GROUP_SLOTS)));
    }

    #[test]
    fn the_group_table_holds_live_groups_and_reuses_freed_slots() {
        let mut t = GroupTable::new(3).expect("memfd");
        let fd = t.file.as_raw_fd();
        assert!(t.insert(101, 1) && t.insert(102, 2) && t.insert(103, u64::MAX));
        assert!(!t.insert(104, 4), "full: the caller tells this one by line");
        let mut d = Duties::default();
        d.apply(&format!("groups {fd} 3"));
        d.apply("group 104 4");
        let groups = |d: &Duties| d.all_groups().into_iter().collect::<Vec<_>>();
        assert_eq!(groups(&d), [(101, 1), (102, 2), (103, u64::MAX), (104, 4)]);
        assert!(t.remove(102));
        assert!(!t.remove(104), "told by line: untold by line");
        d.apply("ungroup 104");
        assert_eq!(groups(&d), [(101, 1), (103, u64::MAX)]);
        assert!(t.insert(105, 5), "the freed slot is used again");
        assert_eq!(groups(&d), [(101, 1), (103, u64::MAX), (105, 5)]);
        // A keeper told more slots than the table has reads what is there.
        d.apply(&format!("groups {fd} 100"));
        assert_eq!(groups(&d), [(101, 1), (103, u64::MAX), (105, 5)]);
    }

    #[test]
    fn a_forked_copy_never_writes_the_parents_table() {
        let mut t = GroupTable::new(4).expect("memfd");
        assert!(t.insert(201, 9));
        let fd = t.file.as_raw_fd();
        let untouched = crate::sys::passes_in_a_fork(Duration::from_secs(10), || {
            !t.insert(202, 9) && !t.remove(201)
        });
        assert!(untouched);
        assert_eq!(read_table(fd, 4), [(201, 9)]);
    }

    /// A child of ours that leads a group of its own with one more member; (leader, member).
    fn group_of_two() -> (libc::pid_t, libc::pid_t) {
        let mut ends = [0; 2];
        // SAFETY: pipe into a live array of two ints.
        assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
        // SAFETY: the child makes only async-signal-safe calls (setpgid, fork, write, pause).
        let leader = unsafe { libc::fork() };
        if leader == 0 {
            // SAFETY: as above.
            unsafe {
                libc::setpgid(0, 0);
                let member = libc::fork();
                if member == 0 {
                    loop {
                        libc::pause();
                    }
                }
                libc::write(ends[1], (&member as *const libc::pid_t).cast(), 4);
                loop {
                    libc::pause();
                }
            }
        }
        let mut member: libc::pid_t = 0;
        // SAFETY: reads 4 bytes into a pid_t; then closes both ends of our pipe.
        unsafe {
            libc::read(ends[0], (&mut member as *mut libc::pid_t).cast(), 4);
            libc::close(ends[0]);
            libc::close(ends[1]);
        }
        (leader, member)
    }

    fn alive(pid: libc::pid_t) -> bool {
        crate::kill::not_dead(pid)
    }

    #[test]
    fn a_group_is_killed_only_while_its_number_names_the_calls_leader() {
        let (leader, member) = group_of_two();
        let fd = crate::kill::pidfd_open(leader).expect("pidfd");
        let ino = crate::kill::pidfs_ino(fd.as_fd());
        if ino == 0 {
            // SAFETY: kills our own child's group.
            unsafe { libc::kill(-leader, libc::SIGKILL) };
            return; // no pidfs on this kernel: groups are killed by number
        }
        // The number now names another process (another inode): a stranger, left alone.
        kill_session(leader, ino + 1);
        assert!(alive(leader) && alive(member), "a stranger was killed");
        kill_session(leader, ino);
        let deadline = Instant::now() + Duration::from_secs(5);
        while (alive(member) || alive(leader)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(
            !alive(member) && !alive(leader),
            "the call's group was killed"
        );
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(leader, std::ptr::null_mut(), 0) };
    }

    #[test]
    fn clean_up_kills_every_call_cgroup_and_removes_them() {
        use crate::cgroup::{hierarchy, ServiceCgroups, TreeLimits};
        let h = hierarchy();
        if h.v2.is_none() {
            return;
        }
        let set = ServiceCgroups::new(h).expect("service cgroups");
        let cg = set.acquire(TreeLimits::default()).expect("acquire");
        let c = |s: &str| CString::new(s).unwrap();
        let plan = SpawnPlan {
            cgroup: Some(cg.dir_fd()),
            join_cgroups: cg.join_fds().expect("tasks files"),
            ..SpawnPlan::new(
                c("/bin/sleep"),
                vec![c("sleep"), c("300")],
                std::sync::Arc::new(vec![]),
                c("/"),
            )
        };
        let child = spawn(&plan).expect("spawn");
        let mut d = Duties::default();
        d.apply(&format!("cgroup {}", set.parent().display()));
        for dir in set.parents().iter().skip(1) {
            d.apply(&format!("dir {}", dir.display()));
        }
        d.clean_up();
        let mut status = 0;
        // SAFETY: reaps our own child.
        unsafe { libc::waitpid(child.pid, &mut status, 0) };
        assert!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL);
        for dir in set.parents() {
            assert!(!dir.exists(), "{}", dir.display());
        }
        drop(cg);
    }

    #[test]
    fn clean_up_removes_spill_dirs() {
        let dir = std::env::temp_dir().join(format!("keeper-test-{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).unwrap();
        fs::write(dir.join("sub/f"), "x").unwrap();
        let mut d = Duties::default();
        d.apply(&format!("spill {}", dir.display()));
        let scratch = dir.with_extension("scratch");
        let sentinel = dir.with_extension("sentinel");
        fs::create_dir_all(scratch.join("deep")).unwrap();
        fs::create_dir_all(&sentinel).unwrap();
        fs::write(sentinel.join("keep"), "x").unwrap();
        std::os::unix::fs::symlink(&sentinel, scratch.join("deep/link")).unwrap();
        d.apply(&format!("scratch {}", scratch.display()));
        d.clean_up();
        assert!(!dir.exists());
        assert!(!scratch.exists());
        // The symlink went, never what it names.
        assert!(sentinel.join("keep").exists());
        fs::remove_dir_all(&sentinel).unwrap();
    }
}
