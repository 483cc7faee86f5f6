//! Domain types: version states and manifests; model names live in [`crate::names`] and are
//! re-exported here.

use std::collections::BTreeMap;
use std::fmt;

use crate::weights::dtype::DType;

pub use crate::names::{MAX_NAME_LEN, validate_name};

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
    /// XXH3-64 of the bytes, hashed on the CPU by the loader where the device does not checksum
    /// (host memory) or `load_cpu_hash` asks for it; 0 when not computed.
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
