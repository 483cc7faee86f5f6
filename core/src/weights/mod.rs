//! Reading and validating safetensors weights before anything is allocated for them.
//!
//! # Layout
//!
//! - [`source`]: resolves a path requested relative to the model root (never leaving
//!   it), opens every weight file once and validates the whole model: a single
//!   `.safetensors` file, or a directory with `model.safetensors` or a sharded
//!   `model.safetensors.index.json`, plus the small metadata files beside it.
//! - [`path`]: checks and normalizes a requested relative path (no root, no `..`).
//! - [`header`]: parses and checks one file's header (length, JSON, ranges, overlaps,
//!   duplicates); [`tensor`] checks each tensor's entry (dtype, shape, offsets); `json` holds
//!   what their serde visitors share with the index's.
//! - [`index`]: parses the index of a sharded model.
//! - [`layout`]: plans each tensor's aligned offset in the model's arena.
//! - [`dtype`]: the element types and their sizes.
//! - [`error`]: [`WeightsError`], one variant per kind of failure.
//!
//! # Data flow
//!
//! ```text
//! resolve(root, rel) ──► parse_index ──► parse_header (each shard) ──► ModelSource
//!                                                                          │
//!                                                 Layout ◄── plan ◄────────┘
//! ```
//!
//! All of it is blocking I/O: run it on a blocking thread.

pub mod dtype;
pub mod error;
pub mod header;
pub mod index;
mod json;
pub mod layout;
pub mod path;
pub mod source;
pub mod tensor;

#[cfg(test)]
mod tests;

pub use dtype::DType;
pub use error::WeightsError;
pub use header::{Header, parse_header};
pub use index::{Index, parse_index};
pub use layout::{ALIGNMENT, Layout, PlannedTensor, plan};
pub use source::{ModelSource, Shard, resolve};
pub use tensor::TensorEntry;

/// Bounds on what a model may declare, so that a hostile file cannot make the server
/// allocate or read without limit.
#[derive(Debug, Clone)]
pub struct WeightLimits {
    /// Largest header (and index file) accepted, in bytes.
    pub max_header_bytes: u64,
    /// Most tensors in a model.
    pub max_tensors: usize,
    /// Most shards in a sharded model.
    pub max_shards: usize,
    /// Longest tensor name, in bytes.
    pub max_name_bytes: usize,
    /// Most dimensions of a tensor.
    pub max_rank: usize,
    /// Largest single metadata file (config.json...), in bytes.
    pub max_metadata_file_bytes: u64,
    /// Largest total of a model's metadata files, in bytes.
    pub max_metadata_total_bytes: u64,
    /// Largest `__metadata__` of a model (keys and values of all its shards, merged), in
    /// bytes: it travels in every attach reply and describe.
    pub max_header_metadata_bytes: u64,
}

impl Default for WeightLimits {
    fn default() -> Self {
        WeightLimits {
            max_header_bytes: 100_000_000,
            max_tensors: 1_000_000,
            max_shards: 4096,
            max_name_bytes: 1024,
            max_rank: 16,
            max_metadata_file_bytes: 32 << 20,
            max_metadata_total_bytes: 64 << 20,
            max_header_metadata_bytes: 1 << 20,
        }
    }
}
