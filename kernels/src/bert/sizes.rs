//! The encoder's sizes and what one call may hold ([`Dims`], [`Limits`]), the checks that
//! they fit together and in memory, and the sizes derived from them: a group's padded length
//! and the activation and scores buffers.

use crate::encoder::{self, Pooling};
use crate::error::KernelError;

/// The sizes of an encoder (from its `config.json`) and what to do after the last layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dims {
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads (dividing `hidden`).
    pub heads: usize,
    /// Feed-forward size.
    pub intermediate: usize,
    /// Rows of the position table.
    pub max_positions: usize,
    /// Rows of the token-type table (0: none).
    pub type_vocab: usize,
    /// The position of a sequence's first token in the position table.
    pub position_offset: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
    /// Pooling of the last layer's token vectors.
    pub pooling: Pooling,
    /// L2-normalize the pooled vectors.
    pub normalize: bool,
}

/// What one call may hold, sizing the activation buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most tokens in one call: its sequences × their padded length, or, with the fused
    /// attention, the sum of their lengths (see [`CudaBert::pads`](super::CudaBert::pads)).
    pub max_tokens: usize,
    /// Most sequences in one call.
    pub max_sequences: usize,
    /// Longest sequence.
    pub max_seq_len: usize,
}

/// Sequences are padded to a multiple of this many tokens.
const PAD_TO: usize = 8;
/// The attention scores of a sub-batch take at most this many bytes (or one sequence's).
const SCORES_BYTES: usize = 64 << 20;

/// `len` rounded up to a multiple of [`PAD_TO`], but not past `table` (the positions).
pub(super) fn padded_len(len: usize, table: usize) -> usize {
    len.next_multiple_of(PAD_TO).min(table).max(len)
}

/// Elements of the scores buffer: [`SCORES_BYTES`] worth, and at least one sequence of the
/// longest padded length.
pub(super) fn scores_elems(d: &Dims, l: &Limits, es: usize) -> usize {
    // check_dims bounds s by MAX_ROW_LEN and heads by hidden ≤ MAX_ROW_LEN: no overflow.
    let s = padded_len(l.max_seq_len, d.max_positions - d.position_offset);
    (SCORES_BYTES / es.max(1)).max(d.heads * s * s)
}

/// Tokens the activation buffers hold (`max_tokens` plus room to pad every sequence to a
/// multiple of [`PAD_TO`]), with every buffer size checked to fit: a wrapped product would
/// allocate less than the kernels use.
pub(super) fn buffer_tokens(d: &Dims, l: &Limits, es: usize) -> Result<usize, KernelError> {
    let too_big = || {
        KernelError::bad(format!(
            "buffers for the limits {l:?} do not fit in memory sizes"
        ))
    };
    let t = PAD_TO
        .checked_mul(l.max_sequences)
        .and_then(|p| p.checked_add(l.max_tokens))
        .ok_or_else(too_big)?;
    t.checked_mul(d.hidden.max(d.intermediate))
        .and_then(|n| n.checked_mul(es))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(too_big)?;
    l.max_sequences
        .checked_mul(d.hidden)
        .and_then(|n| n.checked_mul(4))
        .filter(|&n| n <= isize::MAX as usize)
        .ok_or_else(too_big)?;
    Ok(t)
}

/// Sizes that could not work: nothing is allocated for them.
pub(super) fn check_dims(d: &Dims, l: &Limits) -> Result<(), KernelError> {
    let padded = padded_len(
        l.max_seq_len,
        d.max_positions.saturating_sub(d.position_offset),
    );
    let ok = d.hidden > 0
        && d.hidden <= encoder::MAX_ROW_LEN
        && padded <= encoder::MAX_ROW_LEN
        && d.heads > 0
        && d.hidden.is_multiple_of(d.heads)
        && d.vocab > 0
        && d.intermediate > 0
        && l.max_seq_len > 0
        && l.max_seq_len + d.position_offset <= d.max_positions
        && l.max_tokens >= l.max_seq_len
        && l.max_sequences > 0;
    if ok {
        Ok(())
    } else {
        Err(KernelError::bad(format!(
            "encoder sizes {d:?} with limits {l:?} do not fit together"
        )))
    }
}
