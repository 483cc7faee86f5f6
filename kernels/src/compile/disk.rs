//! The disk cache: where it lives, the names of its files, and the files themselves (the PTX
//! under a first line carrying its ms64 and length, written atomically).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::reference::ms64;

/// The environment variable naming the on-disk cache directory (empty: no disk cache).
pub const CACHE_DIR_ENV: &str = "MODELSHARE_KERNEL_CACHE";

/// The first bytes of a cache file, before its checksum and length.
const FILE_MAGIC: &str = "// modelshare-kernels ptx v1";

/// `<hash>-sm<major><minor>.ptx`, the hash as 16 hex digits.
pub fn cache_file_name(hash: u64, major: i32, minor: i32) -> String {
    format!("{hash:016x}-sm{major}{minor}.ptx")
}

/// The disk cache directory: `$MODELSHARE_KERNEL_CACHE` (empty: none), else
/// `$XDG_CACHE_HOME/modelshare/kernels`, else `$HOME/.cache/modelshare/kernels`, else none.
pub fn default_disk_dir() -> Option<PathBuf> {
    disk_dir_from(|name| std::env::var_os(name))
}

/// [`default_disk_dir`] with the environment read through `var`.
pub(super) fn disk_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if let Some(dir) = var(CACHE_DIR_ENV) {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    // The XDG spec says a relative XDG_CACHE_HOME is invalid and to be ignored.
    if let Some(xdg) = var("XDG_CACHE_HOME").map(PathBuf::from)
        && xdg.is_absolute()
    {
        return Some(xdg.join("modelshare").join("kernels"));
    }
    var("HOME").filter(|home| !home.is_empty()).map(|home| {
        PathBuf::from(home)
            .join(".cache")
            .join("modelshare")
            .join("kernels")
    })
}

/// A cache file: the magic, the ms64 and length of the PTX on the first line, then the PTX.
pub(super) fn encode_cache_file(ptx: &str) -> Vec<u8> {
    let header = format!(
        "{FILE_MAGIC} ms64={:016x} bytes={}\n",
        ms64(ptx.as_bytes()),
        ptx.len()
    );
    let mut out = Vec::with_capacity(header.len() + ptx.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(ptx.as_bytes());
    out
}

/// The PTX of a cache file, or `None` if the file is not one this crate wrote intact.
pub(super) fn decode_cache_file(bytes: &[u8]) -> Option<String> {
    let newline = bytes.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..newline]).ok()?;
    let body = &bytes[newline + 1..];
    let mut fields = header.strip_prefix(FILE_MAGIC)?.split_whitespace();
    let sum = u64::from_str_radix(fields.next()?.strip_prefix("ms64=")?, 16).ok()?;
    let len: usize = fields.next()?.strip_prefix("bytes=")?.parse().ok()?;
    if fields.next().is_some() || body.len() != len || ms64(body) != sum || body.contains(&0) {
        return None;
    }
    String::from_utf8(body.to_vec()).ok()
}

/// Writes a cache file atomically: a temporary file in the same directory, then a rename.
pub(super) fn write_cache_file(path: &Path, ptx: &str) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = PathBuf::from(tmp);
    let result =
        std::fs::write(&tmp, encode_cache_file(ptx)).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
