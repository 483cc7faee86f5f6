//! How much host memory this process may still take: the kernel's `MemAvailable`, bounded by
//! the memory limit of the process's own cgroup (v1 or v2).
//!
//! A container or a systemd unit with a memory limit sees the whole machine in
//! `/proc/meminfo`; past its cgroup's limit the kernel's OOM killer ends it, whatever
//! `MemAvailable` says. So the room is
//!
//! ```text
//! min(MemAvailable, min over the cgroup and its ancestors of (limit − usage))
//! ```
//!
//! where the cgroup is read from `/proc/self/cgroup`:
//!
//! - **v2** (the `0::<path>` line): `memory.max` and `memory.current` under
//!   `/sys/fs/cgroup/<path>` and each directory above it up to `/sys/fs/cgroup`;
//! - **v1** (the line whose controllers include `memory`): `memory.limit_in_bytes` and
//!   `memory.usage_in_bytes` under `/sys/fs/cgroup/memory/<path>` and above.
//!
//! `max` (v2) and v1's "no limit" figure (`PAGE_COUNTER_MAX` pages, about 2^63) mean no limit.
//! A cgroup path not found under the mount (a container that sees its host's path but has its
//! own cgroup mounted) is read at the mount itself. Missing or unreadable files bound nothing:
//! with no cgroup limit found the room is `MemAvailable` alone.
//!
//! Every path is read under a root ([`HostMemory::at`]; `/` in production), so that tests
//! point it at a fake `proc/meminfo` and cgroup tree.

use std::path::{Path, PathBuf};

/// v1 limits at or above this are its "no limit" sentinel (`PAGE_COUNTER_MAX` pages: about
/// 2^63 bytes, rounded down to a page).
const V1_UNLIMITED: u64 = 1 << 62;

/// The host's memory figures, read under a root directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostMemory {
    root: PathBuf,
}

impl Default for HostMemory {
    fn default() -> Self {
        Self::at("/")
    }
}

/// The tightest cgroup memory limit over this process's cgroup and its ancestors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CgroupMemory {
    /// The limit, in bytes.
    pub limit: u64,
    /// Bytes the cgroup with that limit is charged for now.
    pub usage: u64,
}

impl CgroupMemory {
    /// Bytes the cgroup may still take.
    pub fn room(&self) -> u64 {
        self.limit.saturating_sub(self.usage)
    }
}

impl HostMemory {
    /// Figures read under `root` (`/proc/meminfo` is `<root>/proc/meminfo`, and so on).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The root everything is read under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Memory a new arena could take now: `MemAvailable`, bounded by the cgroup's room.
    /// `None` when neither is known.
    pub fn available(&self) -> Option<u64> {
        let meminfo = self.meminfo("MemAvailable:");
        let cgroup = self.cgroup().map(|c| c.room());
        min_known(meminfo, cgroup)
    }

    /// The memory this process could ever have: `MemTotal`, bounded by the cgroup's limit.
    pub fn total(&self) -> Option<u64> {
        let meminfo = self.meminfo("MemTotal:");
        let cgroup = self.cgroup().map(|c| c.limit);
        min_known(meminfo, cgroup)
    }

    /// A `/proc/meminfo` field (`key` with its colon), in bytes.
    pub fn meminfo(&self, key: &str) -> Option<u64> {
        let text = std::fs::read_to_string(self.root.join("proc/meminfo")).ok()?;
        parse_meminfo(&text, key)
    }

    /// The tightest memory limit of this process's cgroups (v2 and v1 both, where both are
    /// mounted), with its usage; `None` when no limit is set or none could be read.
    pub fn cgroup(&self) -> Option<CgroupMemory> {
        let text = std::fs::read_to_string(self.root.join("proc/self/cgroup")).ok()?;
        let paths = parse_proc_cgroup(&text);
        let fs = self.root.join("sys/fs/cgroup");
        let v2 = paths
            .v2
            .and_then(|p| tightest(&fs, &p, "memory.max", "memory.current"));
        let v1 = paths.v1_memory.and_then(|p| {
            tightest(
                &fs.join("memory"),
                &p,
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        });
        match (v2, v1) {
            (Some(a), Some(b)) => Some(if a.room() <= b.room() { a } else { b }),
            (a, b) => a.or(b),
        }
    }
}

fn min_known(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The cgroup paths `/proc/self/cgroup` names.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct CgroupPaths {
    /// The v2 (unified) cgroup: the `0::<path>` line.
    pub v2: Option<String>,
    /// The v1 cgroup of the `memory` controller.
    pub v1_memory: Option<String>,
}

/// Reads `/proc/self/cgroup`: lines `<id>:<controllers>:<path>`.
pub fn parse_proc_cgroup(text: &str) -> CgroupPaths {
    let mut paths = CgroupPaths::default();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            paths.v2 = Some(path.to_owned());
        } else if controllers.split(',').any(|c| c == "memory") {
            paths.v1_memory = Some(path.to_owned());
        }
    }
    paths
}

/// A memory limit file's figure: `Some(bytes)`, or `None` for no limit (`max`, v1's
/// sentinel) and for text that is not a number.
pub fn parse_limit(text: &str) -> Option<u64> {
    let text = text.trim();
    if text == "max" {
        return None;
    }
    let n: u64 = text.parse().ok()?;
    (n < V1_UNLIMITED).then_some(n)
}

/// A `/proc/meminfo` field (`key` with its colon) in bytes.
pub fn parse_meminfo(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let mut words = line[key.len()..].split_whitespace();
    let n: u64 = words.next()?.parse().ok()?;
    let scale = match words.next() {
        Some("kB") => 1024,
        None => 1,
        Some(_) => return None,
    };
    n.checked_mul(scale)
}

/// The least room over the cgroup `path` under the mount `mount` and its ancestors up to the
/// mount, reading `limit_file` and `usage_file` in each; the mount itself when `path` is not
/// found under it.
fn tightest(mount: &Path, path: &str, limit_file: &str, usage_file: &str) -> Option<CgroupMemory> {
    let relative = Path::new(path.trim_start_matches('/'));
    // A path with `..` in it is not one the kernel writes: read the mount alone.
    let safe = relative
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    let mut dir = if safe && mount.join(relative).is_dir() {
        mount.join(relative)
    } else {
        mount.to_owned()
    };
    let mut best: Option<CgroupMemory> = None;
    loop {
        let limit = std::fs::read_to_string(dir.join(limit_file))
            .ok()
            .and_then(|t| parse_limit(&t));
        if let Some(limit) = limit {
            let usage = std::fs::read_to_string(dir.join(usage_file))
                .ok()
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0);
            let here = CgroupMemory { limit, usage };
            if best.is_none_or(|b| here.room() < b.room()) {
                best = Some(here);
            }
        }
        if dir == mount {
            return best;
        }
        match dir.parent() {
            Some(up) if up.starts_with(mount) => dir = up.to_owned(),
            _ => return best,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A fake root: `proc/meminfo` with `available` MiB available, and `proc/self/cgroup`.
    fn root_with(available_mib: u64, proc_cgroup: &str) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("proc/self")).unwrap();
        std::fs::write(
            dir.path().join("proc/meminfo"),
            format!(
                "MemTotal:       {} kB\nMemFree:          1000 kB\nMemAvailable:   {} kB\n",
                available_mib * 2 * 1024,
                available_mib * 1024
            ),
        )
        .unwrap();
        std::fs::write(dir.path().join("proc/self/cgroup"), proc_cgroup).unwrap();
        dir
    }

    fn write(root: &Path, path: &str, text: &str) {
        let path = root.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn proc_cgroup_lines_name_the_v2_and_v1_memory_paths() {
        assert_eq!(
            parse_proc_cgroup("0::/user.slice/app.scope\n"),
            CgroupPaths {
                v2: Some("/user.slice/app.scope".into()),
                v1_memory: None
            }
        );
        let v1 = "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/x\n";
        assert_eq!(
            parse_proc_cgroup(v1),
            CgroupPaths {
                v2: None,
                v1_memory: Some("/docker/abc".into())
            }
        );
        assert_eq!(parse_proc_cgroup("garbage\n\n"), CgroupPaths::default());
    }

    #[test]
    fn limits_read_max_and_the_v1_sentinel_as_no_limit() {
        assert_eq!(parse_limit("3221225472\n"), Some(3 << 30));
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("junk"), None);
        assert_eq!(
            parse_meminfo("MemAvailable:   2048 kB\n", "MemAvailable:"),
            Some(2 << 20)
        );
        assert_eq!(
            parse_meminfo("MemAvailable:   2048 MB\n", "MemAvailable:"),
            None
        );
    }

    /// A v2 `memory.max` below `MemAvailable` bounds the room (limit less usage); an
    /// ancestor's tighter limit wins over the leaf's.
    #[test]
    fn a_v2_limit_below_mem_available_is_honoured() {
        let root = root_with(1000, "0::/svc/app\n");
        write(
            root.path(),
            "sys/fs/cgroup/svc/app/memory.max",
            "104857600\n",
        );
        write(
            root.path(),
            "sys/fs/cgroup/svc/app/memory.current",
            "10485760\n",
        );
        let mem = HostMemory::at(root.path());
        assert_eq!(mem.available(), Some(90 * MIB));
        assert_eq!(mem.total(), Some(100 * MIB));
        write(root.path(), "sys/fs/cgroup/svc/memory.max", "62914560\n");
        write(
            root.path(),
            "sys/fs/cgroup/svc/memory.current",
            "20971520\n",
        );
        assert_eq!(mem.available(), Some(40 * MIB));
    }

    /// A v1 `memory.limit_in_bytes` below `MemAvailable` bounds the room; the v1 sentinel
    /// does not.
    #[test]
    fn a_v1_limit_below_mem_available_is_honoured() {
        let root = root_with(1000, "5:memory:/docker/abc\n3:cpu:/docker/abc\n");
        let cg = "sys/fs/cgroup/memory/docker/abc";
        write(
            root.path(),
            &format!("{cg}/memory.limit_in_bytes"),
            "104857600\n",
        );
        write(
            root.path(),
            &format!("{cg}/memory.usage_in_bytes"),
            "4194304\n",
        );
        let mem = HostMemory::at(root.path());
        assert_eq!(mem.available(), Some(96 * MIB));
        write(
            root.path(),
            &format!("{cg}/memory.limit_in_bytes"),
            "9223372036854771712\n",
        );
        assert_eq!(mem.available(), Some(1000 * MIB));
    }

    /// A container that sees its host's cgroup path but has its own cgroup mounted: the
    /// limit is read at the mount.
    #[test]
    fn a_path_missing_under_the_mount_is_read_at_the_mount() {
        let root = root_with(1000, "0::/kubepods/pod1/c1\n");
        write(root.path(), "sys/fs/cgroup/memory.max", "52428800\n");
        write(root.path(), "sys/fs/cgroup/memory.current", "0\n");
        assert_eq!(HostMemory::at(root.path()).available(), Some(50 * MIB));
    }

    /// `max`, missing limit files and a missing `/proc/self/cgroup` leave `MemAvailable`.
    #[test]
    fn no_limit_or_missing_files_fall_back_to_mem_available() {
        let root = root_with(1000, "0::/svc\n");
        write(root.path(), "sys/fs/cgroup/svc/memory.max", "max\n");
        write(root.path(), "sys/fs/cgroup/svc/memory.current", "1\n");
        let mem = HostMemory::at(root.path());
        assert_eq!(mem.cgroup(), None);
        assert_eq!(mem.available(), Some(1000 * MIB));
        std::fs::remove_dir_all(root.path().join("sys")).unwrap();
        assert_eq!(mem.available(), Some(1000 * MIB));
        std::fs::remove_file(root.path().join("proc/self/cgroup")).unwrap();
        assert_eq!(mem.available(), Some(1000 * MIB));
        assert_eq!(mem.total(), Some(2000 * MIB));
        // No meminfo either: unknown, but a cgroup limit alone still answers.
        let bare = tempfile::tempdir().unwrap();
        assert_eq!(HostMemory::at(bare.path()).available(), None);
        write(bare.path(), "proc/self/cgroup", "0::/\n");
        write(bare.path(), "sys/fs/cgroup/memory.max", "1048576\n");
        assert_eq!(HostMemory::at(bare.path()).available(), Some(MIB));
    }

    /// The real machine answers something (`MemAvailable` at least).
    #[test]
    fn the_real_root_reads() {
        assert!(HostMemory::default().available().is_some());
    }
}
