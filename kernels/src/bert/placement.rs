//! Where the weights lie: each tensor's range in the arena ([`Placed`]), checked against the
//! size its shape needs and the arena's length, and turned into a device address.

use modelshare_device::Mapping;

use super::sizes::Dims;
use super::weights::EncoderWeights;
use crate::WeightDtype;
use crate::error::KernelError;

/// Where a tensor lies in the arena, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Offset from the arena's start.
    pub offset: u64,
    /// Length.
    pub bytes: u64,
}

/// The absolute device addresses of `weights` in `arena` (which starts at device address
/// `base`), each tensor checked to be exactly the bytes its shape in `dims` needs, aligned to
/// its elements and inside the arena.
pub(super) fn place(
    arena: &Mapping,
    base: u64,
    weights: &EncoderWeights<Placed>,
    dtype: WeightDtype,
    dims: &Dims,
) -> Result<EncoderWeights<u64>, KernelError> {
    let es = dtype.size_bytes() as u64;
    let mut sizes = expected_sizes(
        dims,
        weights.layers.len(),
        weights.embeddings.token_type.is_some(),
    );
    weights.try_map(|p| {
        let want = sizes.next().unwrap_or(0) * es;
        let end = p.offset.checked_add(p.bytes);
        if p.bytes != want || end.is_none_or(|e| e > arena.len()) || !p.offset.is_multiple_of(es) {
            return Err(KernelError::bad(format!(
                "a weight at offset {} of {} bytes is not the {want} bytes its shape needs inside the {}-byte arena",
                p.offset, p.bytes, arena.len()
            )));
        }
        Ok(base + p.offset)
    })
}

/// The element counts of every weight, in `try_map`'s order (embeddings, then each layer).
pub(super) fn expected_sizes(
    d: &Dims,
    layers: usize,
    token_types: bool,
) -> impl Iterator<Item = u64> {
    let (v, h, i, p, ty) = (
        d.vocab as u64,
        d.hidden as u64,
        d.intermediate as u64,
        d.max_positions as u64,
        d.type_vocab as u64,
    );
    let mut sizes = vec![v * h, p * h];
    if token_types {
        sizes.push(ty * h);
    }
    sizes.extend([h, h]);
    for _ in 0..layers {
        // query, key, value, attn_out (weight, bias), attn_norm, up, down, out_norm.
        sizes.extend([
            h * h,
            h,
            h * h,
            h,
            h * h,
            h,
            h * h,
            h,
            h,
            h,
            i * h,
            i,
            h * i,
            h,
            h,
            h,
        ]);
    }
    sizes.into_iter()
}
