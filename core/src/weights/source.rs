//! Resolving a requested model path under the model root, and validating every file
//! of the model it names.
//!
//! A request names a path relative to the root. It may be a `.safetensors` file, or a
//! directory holding `model.safetensors.index.json` (sharded) or `model.safetensors`.
//! Every path is canonicalized and must stay under the canonical root, so symlinks may
//! point anywhere inside the root but nowhere outside it. Each weight file is opened
//! once and its handle kept, so the loader reads the very file that was validated.
//!
//! The check-then-open is not atomic against someone who can rewrite the model root
//! while a load runs; the root is the operator's, so that is out of scope.

use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File};
use std::io::{ErrorKind, Read};
use std::path::{Path, PathBuf};

use super::WeightLimits;
use super::error::{WeightsError, quoted};
use super::header::{Header, LENGTH_PREFIX_BYTES, parse_header};
use super::index::{INDEX_FILE, Index, parse_index};

// Moved to `super::path`; re-exported for callers of the old path.
pub(crate) use super::path::normalize_relative;

/// The weight file of a single-file model directory.
pub const SINGLE_FILE: &str = "model.safetensors";

/// Extensions of the small files passed through as the model's metadata.
const METADATA_EXTENSIONS: [&str; 4] = [".json", ".txt", ".model", ".jinja"];

/// One validated weight file, kept open.
#[derive(Debug)]
pub struct Shard {
    /// Opened once and kept open: the loader reads from this handle (no re-open race).
    pub file: File,
    /// Path relative to the model root, for messages.
    pub display: String,
    /// Length of the file when it was validated (from `fstat` on `file`).
    pub file_len: u64,
    pub header: Header,
}

/// A resolved and fully validated model.
#[derive(Debug)]
pub struct ModelSource {
    /// The requested path, normalized (`./a//b/` becomes `a/b`).
    pub source: String,
    /// One shard for a single-file model; the index's shards in first-seen order otherwise.
    pub shards: Vec<Shard>,
    /// The `__metadata__` of all shards merged; where shards disagree on a key, the
    /// first shard's value wins.
    pub header_metadata: BTreeMap<String, String>,
    /// (file name, contents) of the metadata files beside a directory model, sorted by name.
    pub metadata_files: Vec<(String, Vec<u8>)>,
}

/// The model root, and the directories under it that this load may not read (other tenants'
/// model directories): a path that resolves into one is treated as missing, before anything
/// of it is opened or parsed, so the answer is the same as for a path that does not exist.
struct Root {
    path: PathBuf,
    deny: Vec<PathBuf>,
}

impl std::ops::Deref for Root {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

/// Resolves `rel` under `root` and validates everything. Blocking I/O.
pub fn resolve(root: &Path, rel: &str, limits: &WeightLimits) -> Result<ModelSource, WeightsError> {
    resolve_denying(root, rel, limits, &[])
}

/// [`resolve`], with every file it reads (the requested path, the index, the shards, the
/// metadata files and the links among them) outside the directories in `deny`: one that
/// resolves into them counts as missing (a metadata file is then skipped).
pub fn resolve_denying(
    root: &Path,
    rel: &str,
    limits: &WeightLimits,
    deny: &[PathBuf],
) -> Result<ModelSource, WeightsError> {
    let source = normalize_relative(rel).map_err(|reason| WeightsError::bad_path(rel, reason))?;
    let root = Root {
        path: root
            .canonicalize()
            .map_err(|e| WeightsError::io(&format!("model root {}", root.display()), e))?,
        deny: deny.iter().filter_map(|d| d.canonicalize().ok()).collect(),
    };
    let path = canonicalize_under(&root, &root.join(&source), &source)?.ok_or_else(|| {
        WeightsError::NotFound {
            path: source.clone(),
        }
    })?;
    let meta = fs::metadata(&path).map_err(|e| WeightsError::io(&source, e))?;

    if meta.is_file() {
        if !source.ends_with(".safetensors") {
            return Err(WeightsError::bad_path(
                &source,
                "names a file that does not end in .safetensors",
            ));
        }
        let shard = open_shard(&path, source.clone(), limits)?;
        check_header_metadata(&shard.header.metadata, &source, limits)?;
        return Ok(ModelSource {
            source,
            header_metadata: shard.header.metadata.clone(),
            shards: vec![shard],
            metadata_files: Vec::new(),
        });
    }
    if !meta.is_dir() {
        return Err(WeightsError::bad_path(
            &source,
            "is neither a regular file nor a directory",
        ));
    }

    let shards = if exists(&path.join(INDEX_FILE), &source)? {
        sharded(&root, &path, &source, limits)?
    } else if exists(&path.join(SINGLE_FILE), &source)? {
        let display = format!("{source}/{SINGLE_FILE}");
        let file =
            canonicalize_under(&root, &path.join(SINGLE_FILE), &display)?.ok_or_else(|| {
                WeightsError::NotFound {
                    path: display.clone(),
                }
            })?;
        vec![open_shard(&file, display, limits)?]
    } else {
        return Err(WeightsError::bad_path(
            &source,
            format!("directory holds neither {SINGLE_FILE} nor {INDEX_FILE}"),
        ));
    };

    let mut header_metadata = BTreeMap::new();
    for shard in &shards {
        for (k, v) in &shard.header.metadata {
            header_metadata
                .entry(k.clone())
                .or_insert_with(|| v.clone());
        }
    }
    check_header_metadata(&header_metadata, &source, limits)?;
    let metadata_files = metadata_files(&root, &path, &source, limits)?;
    Ok(ModelSource {
        source,
        shards,
        header_metadata,
        metadata_files,
    })
}

/// Refuses a `__metadata__` (merged over the shards) larger than the limit: it is sent with
/// every attach reply, so a large one would make each attach carry it.
fn check_header_metadata(
    metadata: &BTreeMap<String, String>,
    source: &str,
    limits: &WeightLimits,
) -> Result<(), WeightsError> {
    let bytes: u64 = metadata
        .iter()
        .map(|(k, v)| (k.len() + v.len()) as u64)
        .sum();
    if bytes > limits.max_header_metadata_bytes {
        return Err(WeightsError::Limit {
            file: source.to_owned(),
            what: "the size of __metadata__ (keys and values, in bytes)".into(),
            limit: limits.max_header_metadata_bytes,
            actual: bytes,
        });
    }
    Ok(())
}

/// Canonicalizes `path`, which must stay under the canonical `root`; `None` if it does
/// not exist (or a component of it is not a directory).
fn canonicalize_under(
    root: &Root,
    path: &Path,
    display: &str,
) -> Result<Option<PathBuf>, WeightsError> {
    match path.canonicalize() {
        Ok(p) if root.deny.iter().any(|d| p.starts_with(d)) => Ok(None),
        Ok(p) if p.starts_with(&root.path) => Ok(Some(p)),
        Ok(_) => Err(WeightsError::bad_path(
            display,
            "leaves the model root (through a symlink)",
        )),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(None),
        Err(e) => Err(WeightsError::io(display, e)),
    }
}

/// Whether anything (even a dangling symlink) is at `path`.
fn exists(path: &Path, display: &str) -> Result<bool, WeightsError> {
    match fs::symlink_metadata(path) {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(false),
        Err(e) => Err(WeightsError::io(display, e)),
    }
}

/// Opens a regular file and returns it with its length from `fstat`. The type is
/// checked before opening too, so that a FIFO cannot block the open.
fn open_regular(path: &Path, display: &str) -> Result<(File, u64), WeightsError> {
    let not_regular = || WeightsError::bad_path(display, "is not a regular file");
    let meta = fs::metadata(path).map_err(|e| WeightsError::io(display, e))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    let file = File::open(path).map_err(|e| WeightsError::io(display, e))?;
    let meta = file.metadata().map_err(|e| WeightsError::io(display, e))?;
    if !meta.is_file() {
        return Err(not_regular());
    }
    Ok((file, meta.len()))
}

/// Opens a weight file and validates its header.
fn open_shard(path: &Path, display: String, limits: &WeightLimits) -> Result<Shard, WeightsError> {
    let (mut file, file_len) = open_regular(path, &display)?;
    let header = parse_header(&display, &mut file, file_len, limits)?;
    Ok(Shard {
        file,
        display,
        file_len,
        header,
    })
}

/// Reads a whole small file, at most `limit` bytes (else [`WeightsError::Limit`]).
fn read_bounded(
    path: &Path,
    display: &str,
    limit: u64,
    what: &str,
) -> Result<Vec<u8>, WeightsError> {
    let (file, len) = open_regular(path, display)?;
    if len > limit {
        return Err(WeightsError::limit(display, what, limit, len));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
    // One byte more than the limit, to notice a file that grew since the fstat.
    file.take(limit.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(|e| WeightsError::io(display, e))?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > limit {
        return Err(WeightsError::limit(display, what, limit, read));
    }
    Ok(bytes)
}

/// Resolves, opens and cross-checks the shards of an index in directory `dir`.
fn sharded(
    root: &Root,
    dir: &Path,
    source: &str,
    limits: &WeightLimits,
) -> Result<Vec<Shard>, WeightsError> {
    let index_display = format!("{source}/{INDEX_FILE}");
    let index = read_index(root, dir, &index_display, limits)?;
    let shards = open_index_shards(root, dir, source, &index, &index_display, limits)?;
    let holder = tensor_holders(&index, &shards, &index_display, limits)?;
    check_index_agrees(&index, &shards, &holder, &index_display)?;
    Ok(shards)
}

/// Reads and parses the index file of directory `dir` (shown as `index_display`).
fn read_index(
    root: &Root,
    dir: &Path,
    index_display: &str,
    limits: &WeightLimits,
) -> Result<Index, WeightsError> {
    let index_path =
        canonicalize_under(root, &dir.join(INDEX_FILE), index_display)?.ok_or_else(|| {
            WeightsError::NotFound {
                path: index_display.to_owned(),
            }
        })?;
    let bytes = read_bounded(
        &index_path,
        index_display,
        limits.max_header_bytes,
        "index file size",
    )?;
    parse_index(index_display, &bytes, limits)
}

/// Opens and validates each shard the index names, in its order; a shard that does not exist
/// is the index's error.
fn open_index_shards(
    root: &Root,
    dir: &Path,
    source: &str,
    index: &Index,
    index_display: &str,
    limits: &WeightLimits,
) -> Result<Vec<Shard>, WeightsError> {
    let mut shards = Vec::with_capacity(index.shards.len());
    for name in &index.shards {
        let display = format!("{source}/{name}");
        let path = canonicalize_under(root, &dir.join(name), &display)?.ok_or_else(|| {
            WeightsError::malformed(
                index_display,
                0,
                format!(
                    "the index names shard {}, which does not exist",
                    quoted(name)
                ),
            )
        })?;
        shards.push(open_shard(&path, display, limits)?);
    }
    Ok(shards)
}

/// Which shard holds each tensor, by name: no tensor may be in two, and all of them together
/// stay within the tensor count limit.
fn tensor_holders<'a>(
    index: &'a Index,
    shards: &'a [Shard],
    index_display: &str,
    limits: &WeightLimits,
) -> Result<HashMap<&'a str, &'a str>, WeightsError> {
    let mut holder: HashMap<&str, &str> = HashMap::new();
    let mut total: usize = 0;
    for (name, shard) in index.shards.iter().zip(shards) {
        for t in &shard.header.tensors {
            total = total.saturating_add(1);
            if let Some(other) = holder.insert(&t.name, name) {
                return Err(WeightsError::malformed(
                    &shard.display,
                    LENGTH_PREFIX_BYTES,
                    format!(
                        "tensor {} is also in shard {}",
                        quoted(&t.name),
                        quoted(other)
                    ),
                ));
            }
        }
    }
    if total > limits.max_tensors {
        return Err(WeightsError::limit(
            index_display,
            "tensor count",
            u64::try_from(limits.max_tensors).unwrap_or(u64::MAX),
            u64::try_from(total).unwrap_or(u64::MAX),
        ));
    }
    Ok(holder)
}

/// The index and the shards must agree exactly: every tensor the index lists is in the shard
/// it names (`holder` says where each is), and every tensor of a shard is listed.
fn check_index_agrees(
    index: &Index,
    shards: &[Shard],
    holder: &HashMap<&str, &str>,
    index_display: &str,
) -> Result<(), WeightsError> {
    let mut listed: HashMap<&str, &str> = HashMap::with_capacity(index.weight_map.len());
    for (tensor, shard) in &index.weight_map {
        listed.insert(tensor, shard);
        match holder.get(tensor.as_str()) {
            Some(held_by) if held_by == shard => {}
            found => {
                let elsewhere = found
                    .map(|s| format!(" (it is in shard {})", quoted(s)))
                    .unwrap_or_default();
                return Err(WeightsError::malformed(
                    index_display,
                    0,
                    format!(
                        "index names tensor {} in shard {}, which does not contain it{elsewhere}",
                        quoted(tensor),
                        quoted(shard)
                    ),
                ));
            }
        }
    }
    for (name, shard) in index.shards.iter().zip(shards) {
        for t in &shard.header.tensors {
            if !listed.contains_key(t.name.as_str()) {
                return Err(WeightsError::malformed(
                    index_display,
                    0,
                    format!(
                        "shard {} holds tensor {}, which the index does not list",
                        quoted(name),
                        quoted(&t.name)
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The sentence-transformers file naming the module directories of a model.
const MODULES_FILE: &str = "modules.json";

/// Reads the metadata files directly in directory `dir`: regular files (or symlinks to
/// regular files under the root) named `*.json`, `*.txt`, `*.model` or `*.jinja`, except
/// the index; and the same files one level down in the module directories that a
/// sentence-transformers `modules.json` names (`1_Pooling/config.json`, ...), named with
/// their directory. Sizes are checked against the limits before anything is read.
fn metadata_files(
    root: &Root,
    dir: &Path,
    source: &str,
    limits: &WeightLimits,
) -> Result<Vec<(String, Vec<u8>)>, WeightsError> {
    let mut found = Vec::new();
    let mut total: u64 = 0;
    list_metadata_files(root, dir, "", source, limits, &mut found, &mut total)?;
    let modules = found
        .iter()
        .find(|(name, _, _)| name == MODULES_FILE)
        .map(|(_, _, path)| path.clone());
    if let Some(modules) = modules {
        for sub in module_dirs(&modules, &format!("{source}/{MODULES_FILE}"), limits)? {
            let Some(path) = canonicalize_under(root, &dir.join(&sub), &format!("{source}/{sub}"))?
            else {
                continue; // a module without files of its own (Normalize)
            };
            if path.is_dir() {
                let prefix = format!("{sub}/");
                list_metadata_files(root, &path, &prefix, source, limits, &mut found, &mut total)?;
            }
        }
    }
    if total > limits.max_metadata_total_bytes {
        return Err(WeightsError::limit(
            source,
            "total size of metadata files",
            limits.max_metadata_total_bytes,
            total,
        ));
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));

    let mut out = Vec::with_capacity(found.len());
    let mut remaining = limits.max_metadata_total_bytes;
    for (name, display, path) in found {
        let limit = limits.max_metadata_file_bytes.min(remaining);
        let bytes = read_bounded(&path, &display, limit, "metadata file size")?;
        remaining = remaining.saturating_sub(u64::try_from(bytes.len()).unwrap_or(u64::MAX));
        out.push((name, bytes));
    }
    Ok(out)
}

/// Adds to `found` (name, display, path) of each metadata file directly in `dir`, named
/// `prefix` + file name, and their sizes to `total`.
fn list_metadata_files(
    root: &Root,
    dir: &Path,
    prefix: &str,
    source: &str,
    limits: &WeightLimits,
    found: &mut Vec<(String, String, PathBuf)>,
    total: &mut u64,
) -> Result<(), WeightsError> {
    for entry in fs::read_dir(dir).map_err(|e| WeightsError::io(source, e))? {
        let entry = entry.map_err(|e| WeightsError::io(source, e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue; // not UTF-8: cannot be named in a manifest
        };
        if name == INDEX_FILE || !METADATA_EXTENSIONS.iter().any(|ext| name.ends_with(ext)) {
            continue;
        }
        let name = format!("{prefix}{name}");
        let display = format!("{source}/{name}");
        let file_type = entry
            .file_type()
            .map_err(|e| WeightsError::io(&display, e))?;
        let path = if file_type.is_symlink() {
            match canonicalize_under(root, &entry.path(), &display)? {
                Some(p) => p,
                None => continue, // dangling
            }
        } else if file_type.is_file() {
            entry.path()
        } else {
            continue;
        };
        let meta = fs::metadata(&path).map_err(|e| WeightsError::io(&display, e))?;
        if !meta.is_file() {
            continue;
        }
        if meta.len() > limits.max_metadata_file_bytes {
            return Err(WeightsError::limit(
                &display,
                "metadata file size",
                limits.max_metadata_file_bytes,
                meta.len(),
            ));
        }
        *total = total.saturating_add(meta.len());
        found.push((name, display, path));
    }
    Ok(())
}

/// The module directories a sentence-transformers `modules.json` names: each entry's
/// `path`, when it is one plain directory name (`1_Pooling`); the empty path (the
/// transformer itself, at the top) and anything else are skipped. A file that is not
/// such a list is the model's business, not the loader's: it yields no directories.
fn module_dirs(
    path: &Path,
    display: &str,
    limits: &WeightLimits,
) -> Result<Vec<String>, WeightsError> {
    let bytes = read_bounded(
        path,
        display,
        limits.max_metadata_file_bytes,
        "metadata file size",
    )?;
    let Ok(serde_json::Value::Array(modules)) = serde_json::from_slice::<serde_json::Value>(&bytes)
    else {
        return Ok(Vec::new());
    };
    let mut dirs: Vec<String> = modules
        .iter()
        .filter_map(|m| m.get("path")?.as_str())
        .filter(|p| {
            !p.is_empty()
                && !p.starts_with('.')
                && p.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
        })
        .map(str::to_owned)
        .collect();
    dirs.sort();
    dirs.dedup();
    Ok(dirs)
}
