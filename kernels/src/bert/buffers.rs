//! The encoder's device buffers: its inputs and activations, allocated once for its limits.
//!
//! The activations that are never live at the same time share memory: one `work` region
//! holds the q, k and v projections and the split heads during attention, the scores in the
//! projections' place once the heads are split, and the feed-forward's wide activation in
//! all of their place (see [`Buffers::new`]). A BERT-large's activations for 32,768 tokens
//! take 560 MiB in f16 instead of 944, and 480 MiB with the fused attention, which needs no
//! heads or scores.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};

use super::pack::{Group, input_ints};
use super::sizes::{Dims, Limits, buffer_tokens, scores_elems};
use crate::error::KernelError;

/// One device buffer and its address.
#[derive(Debug)]
pub(super) struct Buffer<T> {
    pub(super) slice: CudaSlice<T>,
    pub(super) ptr: u64,
}

impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> Buffer<T> {
    /// `len` zeroed elements (at least 16) on `stream`.
    fn new(stream: &Arc<CudaStream>, len: usize) -> Result<Self, KernelError> {
        let slice = stream.alloc_zeros::<T>(len.max(16))?;
        let (ptr, sync) = slice.device_ptr(stream);
        drop(sync);
        Ok(Self { slice, ptr })
    }
}

/// The activations of one call, in the weights' dtype unless said otherwise. Every address
/// below `work` lies inside it; which of them may overlap is said on each.
#[derive(Debug)]
pub(super) struct Buffers {
    /// A group's integer inputs, one after the other as one copy up brings them
    /// ([`Buffers::inputs_of`]): at most [`input_ints`] of them.
    pub(super) inputs: Buffer<i32>,
    /// The hidden states, `[tokens, hidden]`, live across the whole call.
    pub(super) x: Buffer<u8>,
    /// The other activations (kept alive here; the addresses below point into it).
    pub(super) _work: Buffer<u8>,
    /// The query, key and value projections, one after the other, [`Buffers::slot`] elements
    /// apart (so that the three can be one strided-batched product); `k` also takes the
    /// attention's output projection. Disjoint from the heads.
    pub(super) q: u64,
    pub(super) k: u64,
    pub(super) v: u64,
    /// Elements from one projection's slot to the next.
    pub(super) slot: usize,
    /// The split heads, `[batch·heads, seq, head_dim]` each, after the three projections.
    pub(super) qh: u64,
    pub(super) kh: u64,
    pub(super) vh: u64,
    /// The attention scores: over the projections (dead once the heads are split) when they
    /// fit there, else after the heads. Disjoint from the heads.
    pub(super) scores: u64,
    /// Elements `scores` holds: at least one sequence's of the longest padded length (0 with
    /// the fused attention, which needs none).
    pub(super) scores_elems: usize,
    /// The feed-forward's wide activation `[tokens, intermediate]`, over everything above
    /// (all dead by then).
    pub(super) up: u64,
    /// The feed-forward's down product `[tokens, hidden]`, right after `up`.
    pub(super) down: u64,
    pub(super) pooled: Buffer<f32>,
}

impl Buffers {
    /// The buffers for `limits` of an encoder of `dims` with elements of `es` bytes, zeroed,
    /// on `stream`.
    ///
    /// `work` holds, in elements (`t` tokens, `h` hidden): q, k, v at 0, t·h, 2·t·h; the
    /// heads at 3·t·h, 4·t·h, 5·t·h; the scores at 0 if they fit in 3·t·h, else at 6·t·h;
    /// `up` at 0 and `down` at t·intermediate. A pass uses them in that order on one stream:
    /// the projections, the split (projections → heads), the scores and context (heads →
    /// scores → qh), the merge (qh → q), the output projection (q → k) into `x`, then the
    /// feed-forward (x → up → down) into `x`; each step reads only what is still live.
    ///
    /// With `fused` attention (over the projections themselves: their slots take the
    /// context, the output projection goes into another), the heads and the scores are never
    /// used and not allocated: `work` holds the projections and the feed-forward only, and
    /// `qh`, `kh`, `vh` and `scores` must not be touched.
    pub(super) fn new(
        stream: &Arc<CudaStream>,
        dims: &Dims,
        limits: &Limits,
        es: usize,
        fused: bool,
    ) -> Result<Self, KernelError> {
        let h = dims.hidden;
        let t = buffer_tokens(dims, limits, es)?;
        let act = |n: usize| Buffer::<u8>::new(stream, n * es);
        let th = t * h;
        let (heads_len, scores_len) = if fused {
            (0, 0)
        } else {
            (3 * th, scores_elems(dims, limits, es))
        };
        let scores_at = if scores_len <= 3 * th { 0 } else { 6 * th };
        let up_len = t * dims.intermediate;
        // buffer_tokens checked t·max(h, intermediate)·es; these few multiples of it stay
        // far from usize::MAX on a 64-bit host.
        let work_len = (3 * th + heads_len)
            .max(up_len + th)
            .max(scores_at + scores_len);
        let work = act(work_len)?;
        let at = |elems: usize| work.ptr + (elems * es) as u64;
        Ok(Self {
            inputs: Buffer::new(stream, input_ints(t, limits.max_sequences))?,
            x: act(th)?,
            q: at(0),
            k: at(th),
            v: at(2 * th),
            slot: th,
            qh: at(3 * th),
            kh: at(4 * th),
            vh: at(5 * th),
            scores: at(scores_at),
            scores_elems: scores_len,
            up: at(0),
            down: at(up_len),
            _work: work,
            pooled: Buffer::new(stream, limits.max_sequences * h)?,
        })
    }
}

/// Device addresses of a group's integer inputs (i32 arrays) inside [`Buffers::inputs`].
#[derive(Clone, Copy, Debug)]
pub(super) struct Inputs {
    pub(super) ids: u64,
    pub(super) types: u64,
    pub(super) positions: u64,
    pub(super) lengths: u64,
    pub(super) offsets: u64,
}

impl Buffers {
    /// Where `g`'s inputs lie in `inputs`, in the order [`Packed::write_ints`]
    /// (super::pack::Packed::write_ints) lays them out.
    pub(super) fn inputs_of(&self, g: Group) -> Inputs {
        let at = |ints: usize| self.inputs.ptr + (ints * 4) as u64;
        Inputs {
            ids: at(0),
            types: at(g.t),
            positions: at(2 * g.t),
            lengths: at(3 * g.t),
            offsets: at(3 * g.t + g.b),
        }
    }
}
