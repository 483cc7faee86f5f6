//! Planning where each tensor of a validated model goes in its arena.
//!
//! Tensors are placed in shard order, then file order (by offset), each at the next
//! multiple of [`ALIGNMENT`], so the loader can stream every shard front to back.

use super::dtype::DType;
use super::error::WeightsError;
use super::source::ModelSource;

/// Alignment of every tensor in the arena, in bytes.
pub const ALIGNMENT: u64 = 256;

/// One tensor: where its bytes are in its shard and where they go in the arena.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Index into [`ModelSource::shards`].
    pub shard: usize,
    /// Absolute offset of the tensor's bytes in the shard file.
    pub file_offset: u64,
    pub byte_length: u64,
    /// Offset in the arena; a multiple of [`ALIGNMENT`].
    pub arena_offset: u64,
}

/// The arena layout of a whole model.
#[derive(Debug, Clone, PartialEq)]
pub struct Layout {
    /// Shard order, then file order.
    pub tensors: Vec<PlannedTensor>,
    /// End of the last tensor rounded up to [`ALIGNMENT`]; 0 for no tensors.
    pub arena_bytes: u64,
    /// Sum of the tensors' `byte_length`.
    pub payload_bytes: u64,
}

/// Plans the arena layout of a validated model.
pub fn plan(source: &ModelSource) -> Result<Layout, WeightsError> {
    let overflow = |file: &str, what: &str| {
        WeightsError::malformed(file, 0, format!("{what} overflows 64 bits"))
    };
    let count = source.shards.iter().map(|s| s.header.tensors.len()).sum();
    let mut tensors = Vec::with_capacity(count);
    let mut end: u64 = 0;
    let mut payload_bytes: u64 = 0;
    for (shard_index, shard) in source.shards.iter().enumerate() {
        let file = shard.display.as_str();
        for t in &shard.header.tensors {
            let byte_length = t
                .end
                .checked_sub(t.begin)
                .ok_or_else(|| overflow(file, "a tensor's byte length"))?;
            let file_offset = shard
                .header
                .data_start
                .checked_add(t.begin)
                .ok_or_else(|| overflow(file, "a tensor's file offset"))?;
            let arena_offset = align_up(end).ok_or_else(|| overflow(file, "the arena size"))?;
            end = arena_offset
                .checked_add(byte_length)
                .ok_or_else(|| overflow(file, "the arena size"))?;
            payload_bytes = payload_bytes
                .checked_add(byte_length)
                .ok_or_else(|| overflow(file, "the payload size"))?;
            tensors.push(PlannedTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                shard: shard_index,
                file_offset,
                byte_length,
                arena_offset,
            });
        }
    }
    let arena_bytes = align_up(end).ok_or_else(|| overflow(&source.source, "the arena size"))?;
    Ok(Layout {
        tensors,
        arena_bytes,
        payload_bytes,
    })
}

/// Rounds `n` up to a multiple of [`ALIGNMENT`]; `None` on overflow.
fn align_up(n: u64) -> Option<u64> {
    n.checked_add(ALIGNMENT - 1)
        .map(|m| m / ALIGNMENT * ALIGNMENT)
}
