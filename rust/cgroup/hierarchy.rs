//! Discovery of the host's cgroup hierarchy, once per process: which cgroup2 and v1
//! (`memory`, `pids`) mounts exist (`/proc/self/mountinfo`), where this process sits in each
//! (`/proc/self/cgroup`), and which v2 controllers its children may use. The parsers are
//! pure functions of the two files' text, so they are tested on fixed samples.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// What the host offers, discovered once per process.
#[derive(Debug, Clone, Default)]
pub struct Hierarchy {
    /// This process's own cgroup v2 directory, when a cgroup2 hierarchy is mounted.
    pub v2: Option<PathBuf>,
    /// Own v1 `memory` / `pids` cgroup directories (hybrid or legacy hosts).
    pub memory_v1: Option<PathBuf>,
    pub pids_v1: Option<PathBuf>,
    /// Controllers enabled for v2 children of our cgroup (unified-only hosts).
    pub v2_memory: bool,
    pub v2_pids: bool,
}

/// One line of `/proc/self/mountinfo` that is a cgroup mount.
#[derive(Debug, PartialEq)]
struct CgroupMount {
    root: String,
    mount_point: PathBuf,
    v2: bool,
    controllers: Vec<String>,
}

/// Octal escapes (`\040` for a space) used by mountinfo for odd characters in paths.
fn unescape_mount_path(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = std::str::from_utf8(&bytes[i + 1..i + 4]).unwrap_or("");
            if let Ok(v) = u8::from_str_radix(oct, 8) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.len() < 3 {
            continue;
        }
        let fstype = right[0];
        if fstype != "cgroup" && fstype != "cgroup2" {
            continue;
        }
        let controllers = if fstype == "cgroup" {
            right[2].split(',').map(str::to_string).collect()
        } else {
            Vec::new()
        };
        mounts.push(CgroupMount {
            root: unescape_mount_path(left[3]),
            mount_point: PathBuf::from(unescape_mount_path(left[4])),
            v2: fstype == "cgroup2",
            controllers,
        });
    }
    mounts
}

/// `(hierarchy id, controllers, path)` lines of `/proc/self/cgroup`.
fn parse_proc_cgroup(text: &str) -> Vec<(String, Vec<String>, String)> {
    text.lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let id = parts.next()?.to_string();
            let ctrls = parts.next()?;
            let path = parts.next()?.to_string();
            let ctrls = ctrls
                .split(',')
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect();
            Some((id, ctrls, path))
        })
        .collect()
}

/// The directory of our cgroup `path` inside a mount whose root is `root`.
fn own_dir(mount: &CgroupMount, path: &str) -> Option<PathBuf> {
    let rel = if mount.root == "/" {
        path
    } else {
        path.strip_prefix(mount.root.as_str())?
    };
    let rel = rel.trim_start_matches('/');
    let dir = if rel.is_empty() {
        mount.mount_point.clone()
    } else {
        mount.mount_point.join(rel)
    };
    dir.is_dir().then_some(dir)
}

fn discover_from(mountinfo: &str, proc_cgroup: &str) -> Hierarchy {
    let mounts = parse_mountinfo(mountinfo);
    let own = parse_proc_cgroup(proc_cgroup);
    let mut h = Hierarchy::default();
    for (id, ctrls, path) in &own {
        if id == "0" && ctrls.is_empty() {
            if let Some(m) = mounts.iter().find(|m| m.v2) {
                h.v2 = own_dir(m, path);
            }
            continue;
        }
        for wanted in ["memory", "pids"] {
            if !ctrls.iter().any(|c| c == wanted) {
                continue;
            }
            let Some(m) = mounts
                .iter()
                .find(|m| !m.v2 && m.controllers.iter().any(|c| c == wanted))
            else {
                continue;
            };
            let dir = own_dir(m, path);
            if wanted == "memory" {
                h.memory_v1 = dir;
            } else {
                h.pids_v1 = dir;
            }
        }
    }
    if let Some(v2) = &h.v2 {
        // `cgroup.kill` (5.14) is what empties a call; without it, no cgroup containment.
        if !v2.join("cgroup.kill").exists() && !has_kill_in_children(v2) {
            h.v2 = None;
        }
    }
    if let Some(v2) = &h.v2 {
        let ctrls = fs::read_to_string(v2.join("cgroup.subtree_control")).unwrap_or_default();
        h.v2_memory = ctrls.split_whitespace().any(|c| c == "memory");
        h.v2_pids = ctrls.split_whitespace().any(|c| c == "pids");
    }
    h
}

/// The root cgroup has no `cgroup.kill`; its children do when the kernel supports it.
fn has_kill_in_children(dir: &Path) -> bool {
    let probe = dir.join(format!("shellseam-probe-{}", std::process::id()));
    if fs::create_dir(&probe).is_err() {
        return false;
    }
    let ok = probe.join("cgroup.kill").exists();
    let _ = fs::remove_dir(&probe);
    ok
}

/// The host's hierarchy, discovered on first use.
pub fn hierarchy() -> &'static Hierarchy {
    static H: OnceLock<Hierarchy> = OnceLock::new();
    H.get_or_init(|| {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        discover_from(&mountinfo, &own)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_cgroup_mounts() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].controllers, vec!["rw", "memory"]);
        assert!(m[2].v2);
        assert_eq!(m[2].mount_point, PathBuf::from("/sys/fs/cgroup/unified"));
    }

    #[test]
    fn parses_proc_cgroup_lines() {
        let own = parse_proc_cgroup("4:memory:/a/b\n0::/\n2:cpu,cpuacct:/\n");
        assert_eq!(own[0], ("4".into(), vec!["memory".into()], "/a/b".into()));
        assert_eq!(own[1], ("0".into(), vec![], "/".into()));
        assert_eq!(own[2].1, vec!["cpu".to_string(), "cpuacct".to_string()]);
    }

    #[test]
    fn own_dir_strips_the_mount_root() {
        let m = CgroupMount {
            root: "/outer".into(),
            mount_point: PathBuf::from("/"),
            v2: true,
            controllers: vec![],
        };
        assert_eq!(own_dir(&m, "/outer"), Some(PathBuf::from("/")));
        assert_eq!(own_dir(&m, "/elsewhere"), None);
    }

    #[test]
    fn unescapes_octal() {
        assert_eq!(unescape_mount_path("/a\\040b"), "/a b");
        assert_eq!(unescape_mount_path("/plain"), "/plain");
    }
}
