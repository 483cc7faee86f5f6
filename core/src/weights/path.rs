//! Requested paths: [`normalize_relative`] checks that a path stays under the directory it is
//! relative to, before anything touches the file system. A leaf, used by [`super::source`]
//! and [`super::index`] for model and shard paths and by the tenants file for model
//! directories.

use std::path::{Component, Path};

/// Checks that `s` is a plain relative path (no root, no `..`, no NUL) and returns it
/// normalized: `.` components and repeated or trailing slashes dropped, `/`-separated.
pub fn normalize_relative(s: &str) -> Result<String, &'static str> {
    if s.is_empty() {
        return Err("path is empty");
    }
    if s.contains('\0') {
        return Err("path contains a NUL byte");
    }
    let mut parts = Vec::new();
    for c in Path::new(s).components() {
        match c {
            Component::Normal(part) => parts.push(part.to_str().ok_or("path is not UTF-8")?),
            Component::CurDir => {}
            Component::ParentDir => return Err("path has a '..' component"),
            Component::RootDir | Component::Prefix(_) => {
                return Err("path is absolute; it must be relative to the model root");
            }
        }
    }
    if parts.is_empty() {
        return Err("path names the model root itself");
    }
    Ok(parts.join("/"))
}
