//! A call's sequences checked against the limits and the vocabularies, and laid out as the
//! kernels read them: a [`Group`] of sequences packed one after the other (padded to their
//! longest only inside attention).

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

/// One call's group as launched: `b` sequences of `t` tokens in all, packed one after the
/// other in the token rows (the position-wise steps compute no padding); attention pads
/// each to `s` (the longest, rounded up), `b·s` rows per head.
///
/// Made only by [`pack`], which checks it against the limits, and the safety of every launch
/// of a pass rests on that: the pointers are the encoder's own buffers, sized in
/// [`CudaBert::new`](super::CudaBert::new) for its limits (`b ≤ max_sequences`,
/// `s ≤ max_seq_len` padded, and `t` within the `max_tokens + 8·max_sequences` tokens the
/// buffers hold; `t ≤ b·s`; with the split heads, whose buffers hold `b·s` rows, `b·s`
/// within them too: [`Padding`]), or weights whose ranges `new` checked inside the arena that `_arena` keeps
/// alive; all work is on the encoder's stream, in order, and nothing else touches the
/// buffers; the arena's weights are only read.
#[derive(Clone, Copy, Debug)]
pub(super) struct Group {
    /// Sequences.
    pub(super) b: usize,
    /// The padded length of each inside attention.
    pub(super) s: usize,
    /// Tokens, the sum of the sequences' lengths.
    pub(super) t: usize,
}

/// A group's inputs laid out as the kernels read them.
#[derive(Debug)]
pub(super) struct Packed {
    pub(super) group: Group,
    /// `[t]` token ids, the sequences one after the other.
    pub(super) ids: Vec<i32>,
    /// `[t]` token types, likewise.
    pub(super) types: Vec<i32>,
    /// `[t]` each token's position in its sequence.
    pub(super) positions: Vec<i32>,
    /// `[b]` each sequence's length.
    pub(super) lengths: Vec<i32>,
    /// `[b + 1]` where each sequence starts in the token rows, from 0 (the last: `t`).
    pub(super) offsets: Vec<i32>,
}

/// What [`Limits::max_tokens`] bounds in a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Padding {
    /// Its sequences padded to the longest (`b·longest`): the split heads and the scores
    /// hold every sequence at the padded length.
    Padded,
    /// Its real tokens (`t`): every buffer is per token (the fused attention over the
    /// packed projections), so lengths may differ as they will.
    Packed,
}

/// Checks `seqs` against the limits `l` (tokens counted as `padding` says) and the
/// vocabularies of `d`, and lays out their ids, types and lengths as the kernels read them
/// (`None` for no sequences).
pub(super) fn pack(
    d: Dims,
    l: Limits,
    padding: Padding,
    seqs: &[Tokens<'_>],
) -> Result<Option<Packed>, KernelError> {
    let b = seqs.len();
    let longest = seqs.iter().map(|q| q.ids.len()).max().unwrap_or(0);
    if b == 0 {
        return Ok(None);
    }
    let tokens = match padding {
        Padding::Padded => b * longest,
        Padding::Packed => seqs.iter().map(|q| q.ids.len()).sum(),
    };
    if b > l.max_sequences
        || tokens > l.max_tokens
        || longest > l.max_seq_len
        || seqs.iter().any(|q| q.ids.is_empty())
    {
        return Err(KernelError::bad(format!(
            "a group of {b} sequences of up to {longest} tokens is outside the limits {l:?} (or holds an empty one)"
        )));
    }
    // Attention pads to a multiple of 8 (tensor-core friendly strides), within the position
    // table; the buffers hold max_tokens + 8·max_sequences tokens for it.
    let s = padded_len(longest, d.max_positions - d.position_offset);
    let t: usize = seqs.iter().map(|q| q.ids.len()).sum();
    let mut ids = Vec::with_capacity(t);
    let mut types = Vec::with_capacity(t);
    let mut positions = Vec::with_capacity(t);
    let mut lengths = Vec::with_capacity(b);
    let mut offsets = Vec::with_capacity(b + 1);
    offsets.push(0);
    for q in seqs {
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
            ids.push(id as i32);
            types.push(ty as i32);
            positions.push(j as i32);
        }
        lengths.push(q.ids.len() as i32);
        offsets
            .push(i32::try_from(ids.len()).map_err(|_| {
                KernelError::bad(format!("{t} tokens do not fit the kernels' i32"))
            })?);
    }
    Ok(Some(Packed {
        group: Group { b, s, t },
        ids,
        types,
        positions,
        lengths,
        offsets,
    }))
}

/// The integer inputs of a group of `b` sequences and `t` tokens: ids, types and positions
/// (`t` each), lengths (`b`) and the sequences' starts (`b + 1`).
pub(super) const fn input_ints(t: usize, b: usize) -> usize {
    3 * t + 2 * b + 1
}

impl Packed {
    /// Lays out ids, types, positions, lengths and offsets one after the other in `dst` (at
    /// least `input_ints(at.t, at.b)` long), as
    /// [`Buffers::inputs_of`](super::buffers::Buffers::inputs_of) finds them on the device
    /// for the launch shape `at` (at least the group's): rows past the group's tokens hold
    /// token 0, type 0, position 0; sequences past its own have length 0 and start at its
    /// end, so that they hold no row.
    pub(super) fn write_ints(&self, dst: &mut [i32], at: Group) {
        let end = *self.offsets.last().unwrap_or(&0);
        let mut from = 0;
        for (part, len, fill) in [
            (&self.ids, at.t, 0),
            (&self.types, at.t, 0),
            (&self.positions, at.t, 0),
            (&self.lengths, at.b, 0),
            (&self.offsets, at.b + 1, end),
        ] {
            let (head, tail) = dst[from..from + len].split_at_mut(part.len());
            head.copy_from_slice(part);
            tail.fill(fill);
            from += len;
        }
    }
}
