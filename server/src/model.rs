//! Domain types: model names, version states and manifests.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::ServerError;
use crate::weights::dtype::DType;

/// Longest model name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Checks a model name against `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn validate_name(name: &str) -> Result<(), ServerError> {
    let invalid = |reason: &str| ServerError::InvalidArgument {
        field: "name".into(),
        reason: format!("model name '{}' {reason}", name.escape_debug()),
    };
    let mut chars = name.chars();
    match chars.next() {
        None => return Err(invalid("is empty")),
        Some(c) if !(c.is_ascii_lowercase() || c.is_ascii_digit()) => {
            return Err(invalid("must start with a-z or 0-9"));
        }
        Some(_) => {}
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(&format!("is longer than {MAX_NAME_LEN} bytes")));
    }
    if let Some(c) =
        chars.find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(*c)))
    {
        return Err(invalid(&format!(
            "contains '{}': only a-z, 0-9, '.', '_' and '-' are allowed",
            c.escape_debug()
        )));
    }
    Ok(())
}

/// Life cycle of a version: `Loading → Ready → Draining → Freed`, or `Loading → Failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VersionState {
    /// Bytes are being copied into the arena.
    Loading,
    /// Loaded and immutable.
    Ready,
    /// Unloaded, waiting for its last lease.
    Draining,
    /// Memory released.
    Freed,
    /// The load failed; its arena was released.
    Failed,
}

impl VersionState {
    /// Every state, in life-cycle order.
    pub const ALL: [VersionState; 5] = [
        VersionState::Loading,
        VersionState::Ready,
        VersionState::Draining,
        VersionState::Freed,
        VersionState::Failed,
    ];

    /// Lowercase name, as shown by the CLI and used as a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            VersionState::Loading => "loading",
            VersionState::Ready => "ready",
            VersionState::Draining => "draining",
            VersionState::Freed => "freed",
            VersionState::Failed => "failed",
        }
    }

    /// Whether the version still holds an arena.
    pub fn holds_arena(self) -> bool {
        matches!(
            self,
            VersionState::Loading | VersionState::Ready | VersionState::Draining
        )
    }
}

impl fmt::Display for VersionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tensor inside an arena.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorMeta {
    /// Name as in the weight file.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
    /// Offset from the start of the arena.
    pub offset: u64,
    /// Length in bytes.
    pub byte_length: u64,
    /// XXH3-64 of the bytes (filled in by the loader).
    pub xxh3: u64,
    /// ms64 computed on the device after a CUDA load (0 otherwise).
    pub ms64: u64,
}

/// What a worker needs to interpret an arena.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: u32,
    /// Arena size.
    pub arena_bytes: u64,
    /// Alignment of every tensor offset.
    pub alignment: u64,
    /// Tensors in arena order.
    pub tensors: Vec<TensorMeta>,
    /// Merged `__metadata__` of the safetensors headers.
    pub header_metadata: BTreeMap<String, String>,
    /// Small files kept beside the weights.
    pub files: Vec<(String, Vec<u8>)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A regression here lets malformed names (path-like, upper case, too long) into the registry.
    #[test]
    fn names_follow_the_documented_pattern() {
        for ok in ["a", "llama-7b", "m.v2_final", "0abc", &"x".repeat(64)] {
            assert!(validate_name(ok).is_ok(), "{ok} should be accepted");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "A",
            "a/b",
            "a b",
            "../x",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
