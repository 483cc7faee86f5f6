//! A call's sequences checked against the limits and the vocabularies, and laid out as the
//! kernels read them: a [`Group`] of sequences padded to their longest.

use super::sizes::{Dims, Limits, padded_len};
use crate::error::KernelError;

/// One sequence to encode: token ids and token types, of equal length.
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    /// Token ids, each below the vocabulary size.
    pub ids: &'a [u32],
    /// Token types, each below the token-type vocabulary (or 0).
    pub type_ids: &'a [u32],
}

/// One call's group as launched: `b` sequences padded to `s` tokens, `t = b·s` in all.
///
/// Made only by [`pack`], which checks it against the limits, and the safety of every launch
/// of a pass rests on that: the pointers are the encoder's own buffers, sized in
/// [`CudaBert::new`](super::CudaBert::new) for its limits (`b ≤ max_sequences`,
/// `s ≤ max_seq_len` padded, and `t` within the `max_tokens + 8·max_sequences` tokens the
/// buffers hold), or weights whose ranges `new` checked inside the arena that `_arena` keeps
/// alive; all work is on the encoder's stream, in order, and nothing else touches the
/// buffers; the arena's weights are only read.
#[derive(Clone, Copy, Debug)]
pub(super) struct Group {
    /// Sequences.
    pub(super) b: usize,
    /// The padded length of each.
    pub(super) s: usize,
    /// Tokens, `b·s`.
    pub(super) t: usize,
}

/// A group's inputs laid out as the kernels read them.
#[derive(Debug)]
pub(super) struct Packed {
    pub(super) group: Group,
    /// `[b, s]` token ids, 0 past each sequence's end.
    pub(super) ids: Vec<i32>,
    /// `[b, s]` token types, likewise.
    pub(super) types: Vec<i32>,
    /// Each sequence's length.
    pub(super) lengths: Vec<i32>,
}

/// Checks `seqs` against the limits `l` and the vocabularies of `d`, and lays out their ids,
/// types and lengths as the kernels read them (`None` for no sequences).
pub(super) fn pack(d: Dims, l: Limits, seqs: &[Tokens<'_>]) -> Result<Option<Packed>, KernelError> {
    let b = seqs.len();
    let longest = seqs.iter().map(|q| q.ids.len()).max().unwrap_or(0);
    if b == 0 {
        return Ok(None);
    }
    if b > l.max_sequences
        || b * longest > l.max_tokens
        || longest > l.max_seq_len
        || seqs.iter().any(|q| q.ids.is_empty())
    {
        return Err(KernelError::bad(format!(
            "a group of {b} sequences of up to {longest} tokens is outside the limits {l:?} (or holds an empty one)"
        )));
    }
    // Padded to a multiple of 8 (tensor-core friendly strides), within the position table;
    // the buffers hold max_tokens + 8·max_sequences tokens for it.
    let s = padded_len(longest, d.max_positions - d.position_offset);
    let t = b * s;
    let mut ids = vec![0i32; t];
    let mut types = vec![0i32; t];
    let mut lengths = Vec::with_capacity(b);
    for (i, q) in seqs.iter().enumerate() {
        if q.type_ids.len() != q.ids.len() {
            return Err(KernelError::bad(
                "a sequence's token types and ids differ in length",
            ));
        }
        for (j, (&id, &ty)) in q.ids.iter().zip(q.type_ids).enumerate() {
            if id as usize >= d.vocab || (ty != 0 && ty as usize >= d.type_vocab) {
                return Err(KernelError::bad(format!(
                    "token id {id} (type {ty}) is outside the vocabulary"
                )));
            }
            ids[i * s + j] = id as i32;
            types[i * s + j] = ty as i32;
        }
        lengths.push(q.ids.len() as i32);
    }
    Ok(Some(Packed {
        group: Group { b, s, t },
        ids,
        types,
        lengths,
    }))
}
