//! What the server remembers of a version whose memory can outlive it: a small JSON file per
//! version (`<model>@<version>.json`) in the records directory beside the handle socket,
//! written when the version is ready and removed when its memory is freed.
//!
//! After a restart the records say which memory workers may still hold, how to check it
//! (each tensor's place and checksums), and how to bring the version back (its source, file
//! identities, owner and access).

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::Manifest;
use crate::tenants::policy::Access;
use crate::weights::source::ModelSource;

/// The format written; records of another format are ignored (and removed).
pub const FORMAT: u32 = 1;

/// The longest record read back, in bytes (a manifest of 100,000 tensors fits).
pub const MAX_RECORD_BYTES: u64 = 64 << 20;

/// One weight file as it was when the version was loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    /// Path relative to the model root.
    pub path: String,
    /// Length in bytes.
    pub len: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Inode number.
    pub ino: u64,
}

/// A worker process that held a lease on the version, as the server last saw: its pid and
/// its start time (clock ticks after boot, `/proc/<pid>/stat`), so that a reused pid is not
/// taken for it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Holder {
    /// Process id, in the server's pid namespace.
    pub pid: u32,
    /// Start time of the process.
    pub start: u64,
}

impl Holder {
    /// The process `pid`, if it is alive.
    pub fn of(pid: u32) -> Option<Holder> {
        Some(Holder {
            pid,
            start: start_time(pid)?,
        })
    }

    /// Whether this very process is still alive.
    pub fn alive(&self) -> bool {
        start_time(self.pid) == Some(self.start)
    }
}

/// Field 22 of `/proc/<pid>/stat` (after the parenthesised command, which may hold spaces).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// One tensor's place in the arena and its checksums.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldTensor {
    /// Name as in the weight file.
    pub name: String,
    /// Offset in the arena.
    pub offset: u64,
    /// Length in bytes.
    pub byte_length: u64,
    /// XXH3-64 of the bytes, from the load.
    pub xxh3: u64,
    /// ms64 computed on the device after the load (0 on the host backend).
    pub ms64: u64,
}

/// A version whose memory may outlive the server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldRecord {
    /// [`FORMAT`].
    pub format: u32,
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: u32,
    /// The owning tenant (none: the admin).
    pub owner: Option<String>,
    /// Tenants it is shared with.
    pub shared_with: BTreeSet<String>,
    /// Visible to every tenant.
    pub public: bool,
    /// The load's path under the model root.
    pub source: String,
    /// The weight files it was loaded from.
    pub files: Vec<FileId>,
    /// The backend kind's wire name ("host", "cuda-vmm").
    pub backend: String,
    /// The device the arena is on.
    pub device_uuid: String,
    /// The arena's length.
    pub arena_bytes: u64,
    /// Every tensor, in arena order.
    pub tensors: Vec<HeldTensor>,
    /// The worker processes that held leases on it when the record was last written (kept
    /// current within seconds): after a restart, memory none of them lives to hold is not
    /// waited for.
    #[serde(default)]
    pub holders: Vec<Holder>,
}

impl HeldRecord {
    /// The record of a loaded version.
    pub fn new(
        manifest: &Manifest,
        owner: Option<String>,
        access: &Access,
        source: &str,
        files: Vec<FileId>,
        backend: &str,
        device_uuid: &str,
    ) -> Self {
        HeldRecord {
            format: FORMAT,
            model: manifest.model.clone(),
            version: manifest.version,
            owner,
            shared_with: access.shared_with.clone(),
            public: access.public,
            source: source.to_owned(),
            files,
            backend: backend.to_owned(),
            device_uuid: device_uuid.to_owned(),
            arena_bytes: manifest.arena_bytes,
            tensors: manifest
                .tensors
                .iter()
                .map(|t| HeldTensor {
                    name: t.name.clone(),
                    offset: t.offset,
                    byte_length: t.byte_length,
                    xxh3: t.xxh3,
                    ms64: t.ms64,
                })
                .collect(),
            holders: Vec::new(),
        }
    }

    /// Whether a process that held it is still alive (so may still map its memory).
    pub fn held_by_a_live_process(&self) -> bool {
        self.holders.iter().any(Holder::alive)
    }

    /// The access it had.
    pub fn access(&self) -> Access {
        Access {
            shared_with: self.shared_with.clone(),
            public: self.public,
        }
    }

    /// Whether a load of `manifest` from files `files` is the same version's bytes: the same
    /// files, unchanged, and the same layout.
    pub fn matches(&self, manifest: &Manifest, files: &[FileId]) -> bool {
        self.files == files
            && self.arena_bytes == manifest.arena_bytes
            && self.tensors.len() == manifest.tensors.len()
            && self.tensors.iter().zip(&manifest.tensors).all(|(h, t)| {
                h.name == t.name && h.offset == t.offset && h.byte_length == t.byte_length
            })
    }

    /// `manifest` (of the same layout, see [`HeldRecord::matches`]) with this record's
    /// checksums.
    pub fn fill_checksums(&self, manifest: &mut Manifest) {
        for (t, h) in manifest.tensors.iter_mut().zip(&self.tensors) {
            t.xxh3 = h.xxh3;
            t.ms64 = h.ms64;
        }
    }

    /// The file name of the record of `model`@`version`.
    pub fn file_name(model: &str, version: u32) -> String {
        // An owner/name model's '/' as "%2F": one file in the folder, and no name has a '%'.
        let model = model.replace('/', "%2F");
        format!("{model}@{version}.json")
    }
}

/// The identities of a source's weight files (the handles it keeps open: no re-open race).
pub fn file_ids(src: &ModelSource) -> Vec<FileId> {
    src.shards
        .iter()
        .map(|s| {
            let meta = s.file.metadata().ok();
            FileId {
                path: s.display.clone(),
                len: s.file_len,
                mtime_ns: meta.as_ref().map_or(0, |m| {
                    i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec())
                }),
                ino: meta.as_ref().map_or(0, MetadataExt::ino),
            }
        })
        .collect()
}

/// Writes `record` into `dir` atomically (a temporary file renamed over), mode 0600.
pub fn write(dir: &Path, record: &HeldRecord) -> std::io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(HeldRecord::file_name(&record.model, record.version));
    let tmp = dir.join(format!(
        ".{}.tmp",
        HeldRecord::file_name(&record.model, record.version)
    ));
    let bytes = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(&bytes)?;
    f.sync_data()?;
    std::fs::rename(&tmp, &path)?;
    Ok(path)
}

/// Reads every record in `dir`; files that are not records of [`FORMAT`] are removed with a
/// warning (a record the server cannot use only delays nothing and misleads the accounting).
pub fn read_all(dir: &Path) -> Vec<HeldRecord> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !name.ends_with(".json") {
            continue;
        }
        match read_one(&path) {
            Ok(r) if HeldRecord::file_name(&r.model, r.version) == name => out.push(r),
            Ok(_) => {
                tracing::warn!(path = %path.display(), "a held-memory record under another name; removed");
                let _ = std::fs::remove_file(&path);
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "unreadable held-memory record; removed");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    out.sort_by(|a, b| (&a.model, a.version).cmp(&(&b.model, b.version)));
    out
}

fn read_one(path: &Path) -> Result<HeldRecord, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    f.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_RECORD_BYTES {
        return Err(format!("longer than {MAX_RECORD_BYTES} bytes"));
    }
    let r: HeldRecord = serde_json::from_slice(&bytes).map_err(|e| e.to_string())?;
    if r.format != FORMAT {
        return Err(format!("format {} (this server writes {FORMAT})", r.format));
    }
    Ok(r)
}
