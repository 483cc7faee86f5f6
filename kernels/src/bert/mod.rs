//! A BERT encoder's forward pass on the GPU, as one safe type: [`CudaBert`] reads the weights
//! in place inside an imported arena (a [`Mapping`] it keeps alive), owns its activation
//! buffers (allocated once, sized from its [`Limits`]), and turns token sequences into
//! pooled sentence vectors. Every pointer it hands the launchers is one of its own buffers,
//! or a tensor range checked against the arena's size when it was made, so nothing a caller
//! passes can make it read or write out of bounds: this is the safe layer over the `unsafe`
//! launchers of [`crate::encoder`] and [`crate::blas`].
//!
//! Per group of `B` sequences padded to their longest `S` (`T = B·S` tokens): the ids go up,
//! then per layer three projections, the heads split with their biases (q scaled by 1/√d),
//! the scores as one strided-batched product over `B·heads`, a masked softmax, the context as
//! a second batched product, the heads merged, the output projection, then bias, residual and
//! LayerNorm fused; the feed-forward (bias and exact GELU fused) and a second fused
//! bias-residual-LayerNorm; then pooling (and normalizing) into f32 and one copy down.
//! Activations are in the weights' dtype with f32 accumulation everywhere.

mod weights;

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use modelshare_device::Mapping;

pub use weights::{Embeddings, EncoderWeights, Layer, Linear, Norm};

use crate::blas::{BatchedMatmul, Blas};
use crate::encoder::{self, EmbedArgs, HeadsArgs, Pooling, ResidualNormArgs};
use crate::error::KernelError;
use crate::{KernelCache, WeightDtype, sys};

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
    /// Most tokens (sequences × their padded length) in one call.
    pub max_tokens: usize,
    /// Most sequences in one call.
    pub max_sequences: usize,
    /// Longest sequence.
    pub max_seq_len: usize,
}

/// Where a tensor lies in the arena, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placed {
    /// Offset from the arena's start.
    pub offset: u64,
    /// Length.
    pub bytes: u64,
}

/// One sequence to encode: token ids and token types, of equal length.
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    /// Token ids, each below the vocabulary size.
    pub ids: &'a [u32],
    /// Token types, each below the token-type vocabulary (or 0).
    pub type_ids: &'a [u32],
}

/// One device buffer and its address.
#[derive(Debug)]
struct Buffer<T> {
    slice: CudaSlice<T>,
    ptr: u64,
}

impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> Buffer<T> {
    fn new(stream: &Arc<CudaStream>, len: usize) -> Result<Self, KernelError> {
        let slice = stream.alloc_zeros::<T>(len.max(16))?;
        let (ptr, sync) = slice.device_ptr(stream);
        drop(sync);
        Ok(Self { slice, ptr })
    }
}

/// The activations of one call, in the weights' dtype unless said otherwise.
#[derive(Debug)]
struct Buffers {
    ids: Buffer<i32>,
    type_ids: Buffer<i32>,
    lengths: Buffer<i32>,
    x: Buffer<u8>,
    q: Buffer<u8>,
    k: Buffer<u8>,
    v: Buffer<u8>,
    qh: Buffer<u8>,
    kh: Buffer<u8>,
    vh: Buffer<u8>,
    up: Buffer<u8>,
    scores: Buffer<u8>,
    pooled: Buffer<f32>,
}

/// One call's group as launched: `b` sequences padded to `s` tokens, `t = b·s` in all.
///
/// Made only by [`CudaBert::pack`], which checks it against the limits, and the safety of
/// every launch of a pass rests on that: the pointers are the encoder's own buffers, sized
/// in [`CudaBert::new`] for its limits (`b ≤ max_sequences`, `s ≤ max_seq_len` padded, and
/// `t` within the `max_tokens + 8·max_sequences` tokens the buffers hold), or weights whose
/// ranges `new` checked inside the arena that `_arena` keeps alive; all work is on the
/// encoder's stream, in order, and nothing else touches the buffers; the arena's weights
/// are only read.
#[derive(Clone, Copy, Debug)]
struct Group {
    /// Sequences.
    b: usize,
    /// The padded length of each.
    s: usize,
    /// Tokens, `b·s`.
    t: usize,
}

/// A group's inputs laid out as the kernels read them.
#[derive(Debug)]
struct Packed {
    group: Group,
    /// `[b, s]` token ids, 0 past each sequence's end.
    ids: Vec<i32>,
    /// `[b, s]` token types, likewise.
    types: Vec<i32>,
    /// Each sequence's length.
    lengths: Vec<i32>,
}

/// A BERT encoder on the GPU holding an arena.
#[derive(Debug)]
pub struct CudaBert {
    dims: Dims,
    limits: Limits,
    dtype: WeightDtype,
    /// Absolute device addresses of the weights (checked inside `_arena`).
    weights: EncoderWeights<u64>,
    /// Keeps the arena (and so every address in `weights`) alive.
    _arena: Mapping,
    stream: Arc<CudaStream>,
    blas: Blas,
    cache: KernelCache,
    buffers: Buffers,
    /// Elements of the scores buffer.
    scores_elems: usize,
}

impl CudaBert {
    /// An encoder over `weights` (placed in `arena`, of `dtype`), on the arena's device and
    /// context, which is bound to the calling thread. Checks every tensor's size against
    /// `dims` and its range against the arena, makes a stream that waits for the arena's
    /// load, and allocates the buffers.
    pub fn new(
        arena: &Mapping,
        weights: &EncoderWeights<Placed>,
        dtype: WeightDtype,
        dims: Dims,
        limits: Limits,
    ) -> Result<Self, KernelError> {
        sys::driver_available()?;
        let (Some(base), Some(ctx)) = (arena.device_ptr(), arena.context()) else {
            return Err(KernelError::bad("the arena is not in device memory"));
        };
        check_dims(&dims, &limits)?;
        let es = dtype.size_bytes() as u64;
        let mut sizes = expected_sizes(
            &dims,
            weights.layers.len(),
            weights.embeddings.token_type.is_some(),
        );
        let weights = weights.try_map(|p| {
            let want = sizes.next().unwrap_or(0) * es;
            let end = p.offset.checked_add(p.bytes);
            if p.bytes != want || end.is_none_or(|e| e > arena.len()) || !p.offset.is_multiple_of(es) {
                return Err(KernelError::bad(format!(
                    "a weight at offset {} of {} bytes is not the {want} bytes its shape needs inside the {}-byte arena",
                    p.offset, p.bytes, arena.len()
                )));
            }
            Ok(base + p.offset)
        })?;
        ctx.bind_to_thread()?;
        let stream = ctx.new_stream()?;
        arena
            .wait_ready(&stream)
            .map_err(|e| KernelError::bad(format!("cannot wait for the arena's load: {e}")))?;
        let blas = Blas::new(stream.clone())?;
        let (h, es) = (dims.hidden, es as usize);
        let t = buffer_tokens(&dims, &limits, es)?;
        let act = |n: usize| Buffer::<u8>::new(&stream, n * es);
        let buffers = Buffers {
            ids: Buffer::new(&stream, t)?,
            type_ids: Buffer::new(&stream, t)?,
            lengths: Buffer::new(&stream, limits.max_sequences)?,
            x: act(t * h)?,
            q: act(t * h)?,
            k: act(t * h)?,
            v: act(t * h)?,
            qh: act(t * h)?,
            kh: act(t * h)?,
            vh: act(t * h)?,
            up: act(t * dims.intermediate)?,
            // The attention runs in sub-batches whose scores fit this (at least one sequence).
            scores: act(scores_elems(&dims, &limits, es))?,
            pooled: Buffer::new(&stream, limits.max_sequences * h)?,
        };
        Ok(Self {
            dims,
            limits,
            dtype,
            weights,
            _arena: arena.clone(),
            stream,
            blas,
            cache: KernelCache::new(),
            buffers,
            scores_elems: scores_elems(&dims, &limits, es),
        })
    }

    /// The limits the buffers were sized for.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The pooled vectors of `seqs`, row-major `[seqs.len(), hidden]` f32. The group must fit
    /// the limits (sequences of 1 to `max_seq_len` tokens; their count times the longest at
    /// most `max_tokens`), ids inside the vocabularies. Blocks until the result is on the host.
    pub fn encode(&mut self, seqs: &[Tokens<'_>]) -> Result<Vec<f32>, KernelError> {
        let Some(packed) = self.pack(seqs)? else {
            return Ok(Vec::new());
        };
        let g = packed.group;
        self.upload(&packed)?;
        self.embed(g)?;
        for layer in &self.weights.layers {
            self.project_heads(layer, g)?;
            self.attend(g)?;
            self.attention_output(layer, g)?;
            self.feed_forward(layer, g)?;
        }
        self.pool(g)
    }

    /// Checks `seqs` against the limits and the vocabularies, and lays out their ids, types
    /// and lengths as the kernels read them (`None` for no sequences).
    fn pack(&self, seqs: &[Tokens<'_>]) -> Result<Option<Packed>, KernelError> {
        let d = self.dims;
        let b = seqs.len();
        let longest = seqs.iter().map(|q| q.ids.len()).max().unwrap_or(0);
        if b == 0 {
            return Ok(None);
        }
        let l = self.limits;
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

    /// Copies a group's ids, types and lengths into their device buffers.
    fn upload(&mut self, p: &Packed) -> Result<(), KernelError> {
        let Group { b, t, .. } = p.group;
        let st = self.stream.clone();
        let bu = &mut self.buffers;
        st.memcpy_htod(&p.ids, &mut bu.ids.slice.slice_mut(..t))?;
        st.memcpy_htod(&p.types, &mut bu.type_ids.slice.slice_mut(..t))?;
        st.memcpy_htod(&p.lengths, &mut bu.lengths.slice.slice_mut(..b))?;
        Ok(())
    }

    /// The embedding layer: `x = LayerNorm(word[id] + position + token_type[type])`.
    fn embed(&self, g: Group) -> Result<(), KernelError> {
        let (d, bu, e) = (self.dims, &self.buffers, &self.weights.embeddings);
        // SAFETY: as said on `Group`.
        unsafe {
            encoder::embed_layer_norm(
                &self.cache,
                &self.stream,
                self.dtype,
                &EmbedArgs {
                    out: bu.x.ptr,
                    ids: bu.ids.ptr,
                    type_ids: if e.token_type.is_some() {
                        bu.type_ids.ptr
                    } else {
                        0
                    },
                    word: e.word,
                    position: e.position,
                    // No table: any valid pointer (type_vocab 0 makes every type a zero row).
                    token_type: e.token_type.unwrap_or(e.word),
                    gamma: e.norm.gamma,
                    beta: e.norm.beta,
                    tokens: g.t,
                    seq_len: g.s,
                    hidden: d.hidden,
                    vocab: d.vocab,
                    positions: d.max_positions,
                    type_vocab: d.type_vocab,
                    position_offset: d.position_offset,
                    eps: d.eps,
                },
            )
        }
    }

    /// A layer's query, key and value projections of `x` (into q, k, v), then the heads
    /// split apart with their biases, q scaled by 1/√d (into qh, kh, vh).
    fn project_heads(&self, layer: &Layer<u64>, g: Group) -> Result<(), KernelError> {
        let (h, heads) = (self.dims.hidden, self.dims.heads);
        let head_dim = h / heads;
        let bu = &self.buffers;
        self.linear(bu.x.ptr, &layer.query, bu.q.ptr, g, h, h)?;
        self.linear(bu.x.ptr, &layer.key, bu.k.ptr, g, h, h)?;
        self.linear(bu.x.ptr, &layer.value, bu.v.ptr, g, h, h)?;
        let heads_args = HeadsArgs {
            q: bu.q.ptr,
            k: bu.k.ptr,
            v: bu.v.ptr,
            q_bias: layer.query.bias,
            k_bias: layer.key.bias,
            v_bias: layer.value.bias,
            q_out: bu.qh.ptr,
            k_out: bu.kh.ptr,
            v_out: bu.vh.ptr,
            batch: g.b,
            seq: g.s,
            heads,
            head_dim,
            q_scale: 1.0 / (head_dim as f32).sqrt(),
        };
        // SAFETY: as said on `Group`.
        unsafe { encoder::split_heads(&self.cache, &self.stream, self.dtype, &heads_args) }
    }

    /// Attention over the split heads: the scores `qh·khᵀ` as one strided-batched product, a
    /// masked softmax, and the context `scores·vh`, in sub-batches of sequences whose scores
    /// fit the scores buffer. The context goes into qh (free once the scores are made).
    fn attend(&self, g: Group) -> Result<(), KernelError> {
        let Group { b, s, .. } = g;
        let (bu, blas, dtype) = (&self.buffers, &self.blas, self.dtype);
        let heads = self.dims.heads;
        let head_dim = self.dims.hidden / heads;
        let per_seq = heads * s * s;
        let chunk = (self.scores_elems / per_seq).clamp(1, b);
        let es = dtype.size_bytes() as u64;
        for b0 in (0..b).step_by(chunk) {
            let nb = chunk.min(b - b0);
            let at = |base: u64, per: usize| base + (b0 * per) as u64 * es;
            let scores = BatchedMatmul {
                a: at(bu.qh.ptr, heads * s * head_dim),
                b: at(bu.kh.ptr, heads * s * head_dim),
                c: bu.scores.ptr,
                m: s,
                n: s,
                k: head_dim,
                batch: nb * heads,
                stride_a: s * head_dim,
                stride_b: s * head_dim,
                stride_c: s * s,
                b_transposed: true,
                alpha: 1.0,
            };
            let context = BatchedMatmul {
                a: bu.scores.ptr,
                b: at(bu.vh.ptr, heads * s * head_dim),
                c: at(bu.qh.ptr, heads * s * head_dim),
                m: s,
                n: head_dim,
                k: s,
                batch: nb * heads,
                stride_a: s * s,
                stride_b: s * head_dim,
                stride_c: s * head_dim,
                b_transposed: false,
                alpha: 1.0,
            };
            let lengths = bu.lengths.ptr + (b0 * 4) as u64;
            // SAFETY: as said on `Group`; the sub-batch [b0, b0 + nb) lies inside the
            // group's heads, and its scores (nb·heads·s² ≤ scores_elems) inside `scores`.
            unsafe {
                blas.batched_matmul(dtype, &scores)?;
                encoder::masked_softmax(
                    &self.cache,
                    &self.stream,
                    dtype,
                    bu.scores.ptr,
                    lengths,
                    nb,
                    heads,
                    s,
                )?;
                blas.batched_matmul(dtype, &context)?;
            }
        }
        Ok(())
    }

    /// The heads' context merged back (qh into q), the output projection (into k), then
    /// bias, residual and LayerNorm fused into `x`.
    fn attention_output(&self, layer: &Layer<u64>, g: Group) -> Result<(), KernelError> {
        let (h, heads) = (self.dims.hidden, self.dims.heads);
        let bu = &self.buffers;
        // SAFETY: as said on `Group`.
        unsafe {
            encoder::merge_heads(
                &self.cache,
                &self.stream,
                self.dtype,
                bu.qh.ptr,
                bu.q.ptr,
                g.b,
                heads,
                g.s,
                h / heads,
            )?
        };
        self.linear(bu.q.ptr, &layer.attn_out, bu.k.ptr, g, h, h)?;
        self.add_norm(bu.k.ptr, layer.attn_out.bias, &layer.attn_norm, g.t)
    }

    /// The feed-forward: up (into `up`), bias and exact GELU fused, down (into k), then bias,
    /// residual and LayerNorm fused into `x`.
    fn feed_forward(&self, layer: &Layer<u64>, g: Group) -> Result<(), KernelError> {
        let (h, inter) = (self.dims.hidden, self.dims.intermediate);
        let bu = &self.buffers;
        self.linear(bu.x.ptr, &layer.up, bu.up.ptr, g, h, inter)?;
        // SAFETY: as said on `Group`.
        unsafe {
            encoder::bias_gelu(
                &self.cache,
                &self.stream,
                self.dtype,
                bu.up.ptr,
                layer.up.bias,
                g.t,
                inter,
            )?
        };
        self.linear(bu.up.ptr, &layer.down, bu.k.ptr, g, inter, h)?;
        self.add_norm(bu.k.ptr, layer.down.bias, &layer.out_norm, g.t)
    }

    /// Pooling (and normalizing) the last hidden states into f32 `pooled`, then one copy down;
    /// waits for it.
    fn pool(&self, g: Group) -> Result<Vec<f32>, KernelError> {
        let (d, bu) = (self.dims, &self.buffers);
        let h = d.hidden;
        // SAFETY: as said on `Group`; `pooled` holds max_sequences·hidden f32.
        unsafe {
            encoder::pool(
                &self.cache,
                &self.stream,
                self.dtype,
                bu.x.ptr,
                bu.lengths.ptr,
                bu.pooled.ptr,
                g.b,
                g.s,
                h,
                d.pooling,
                d.normalize,
            )?;
        }
        let mut out = vec![0.0f32; g.b * h];
        self.stream
            .memcpy_dtoh(&bu.pooled.slice.slice(..g.b * h), &mut out)?;
        self.stream.synchronize()?;
        Ok(out)
    }

    /// `y = x·Wᵀ` over the group's tokens (the bias is fused into what follows).
    fn linear(
        &self,
        x: u64,
        lin: &Linear<u64>,
        y: u64,
        g: Group,
        inp: usize,
        out: usize,
    ) -> Result<(), KernelError> {
        // SAFETY: as said on `Group`.
        unsafe {
            self.blas
                .linear(self.dtype, x, lin.weight, y, g.t, inp, out)
        }
    }

    /// `x = LayerNorm(y + bias + x)` over `rows` tokens, in place on the hidden states.
    fn add_norm(
        &self,
        y: u64,
        bias: u64,
        norm: &Norm<u64>,
        rows: usize,
    ) -> Result<(), KernelError> {
        let x = self.buffers.x.ptr;
        let args = ResidualNormArgs {
            out: x,
            x: y,
            bias,
            residual: x,
            gamma: norm.gamma,
            beta: norm.beta,
            rows,
            cols: self.dims.hidden,
            eps: self.dims.eps,
        };
        // SAFETY: as said on `Group` (`rows` is a group's `t`).
        unsafe { encoder::bias_residual_layer_norm(&self.cache, &self.stream, self.dtype, &args) }
    }
}

/// Sequences are padded to a multiple of this many tokens.
const PAD_TO: usize = 8;
/// The attention scores of a sub-batch take at most this many bytes (or one sequence's).
const SCORES_BYTES: usize = 64 << 20;

/// `len` rounded up to a multiple of [`PAD_TO`], but not past `table` (the positions).
fn padded_len(len: usize, table: usize) -> usize {
    len.next_multiple_of(PAD_TO).min(table).max(len)
}

/// Elements of the scores buffer: [`SCORES_BYTES`] worth, and at least one sequence of the
/// longest padded length.
fn scores_elems(d: &Dims, l: &Limits, es: usize) -> usize {
    // check_dims bounds s by MAX_ROW_LEN and heads by hidden ≤ MAX_ROW_LEN: no overflow.
    let s = padded_len(l.max_seq_len, d.max_positions - d.position_offset);
    (SCORES_BYTES / es.max(1)).max(d.heads * s * s)
}

/// Tokens the activation buffers hold (`max_tokens` plus room to pad every sequence to a
/// multiple of [`PAD_TO`]), with every buffer size checked to fit: a wrapped product would
/// allocate less than the kernels use.
fn buffer_tokens(d: &Dims, l: &Limits, es: usize) -> Result<usize, KernelError> {
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
fn check_dims(d: &Dims, l: &Limits) -> Result<(), KernelError> {
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

/// The element counts of every weight, in `try_map`'s order (embeddings, then each layer).
fn expected_sizes(d: &Dims, layers: usize, token_types: bool) -> impl Iterator<Item = u64> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(type_vocab: usize) -> Dims {
        Dims {
            vocab: 50,
            hidden: 8,
            heads: 2,
            intermediate: 16,
            max_positions: 64,
            type_vocab,
            position_offset: 0,
            eps: 1e-12,
            pooling: Pooling::Mean,
            normalize: true,
        }
    }

    fn limits() -> Limits {
        Limits {
            max_tokens: 256,
            max_sequences: 8,
            max_seq_len: 30,
        }
    }

    fn weights(layers: usize, token_types: bool) -> EncoderWeights<u32> {
        let lin = || Linear { weight: 0, bias: 0 };
        let norm = || Norm { gamma: 0, beta: 0 };
        EncoderWeights {
            dtype: WeightDtype::F16,
            embeddings: Embeddings {
                word: 0,
                position: 0,
                token_type: token_types.then_some(0),
                norm: norm(),
            },
            layers: (0..layers)
                .map(|_| Layer {
                    query: lin(),
                    key: lin(),
                    value: lin(),
                    attn_out: lin(),
                    attn_norm: norm(),
                    up: lin(),
                    down: lin(),
                    out_norm: norm(),
                })
                .collect(),
        }
    }

    /// The expected sizes would drift from try_map's order, checking each weight against
    /// another's size.
    #[test]
    fn expected_sizes_follow_try_maps_order() {
        for token_types in [true, false] {
            let d = dims(if token_types { 2 } else { 0 });
            let w = weights(3, token_types);
            let mut visited = 0;
            w.try_map(|_| -> Result<(), ()> {
                visited += 1;
                Ok(())
            })
            .expect("maps");
            let sizes: Vec<u64> = expected_sizes(&d, 3, token_types).collect();
            assert_eq!(sizes.len(), visited);
            let mut want = vec![50 * 8, 64 * 8];
            if token_types {
                want.push(2 * 8);
            }
            want.extend([8, 8, 8 * 8, 8]);
            assert_eq!(&sizes[..want.len()], &want[..]);
            // The last layer ends with up (16x8, 16), down (8x16, 8), out_norm (8, 8).
            assert_eq!(&sizes[sizes.len() - 6..], &[16 * 8, 16, 8 * 16, 8, 8, 8]);
        }
    }

    /// Padding would pass the position table or shrink a length; limits past the kernels' or
    /// memory sizes would be accepted.
    #[test]
    fn padding_and_limits_are_checked() {
        assert_eq!(padded_len(1, 512), 8);
        assert_eq!(padded_len(8, 512), 8);
        assert_eq!(padded_len(250, 252), 252);
        assert_eq!(padded_len(252, 252), 252);
        assert!(check_dims(&dims(2), &limits()).is_ok());
        let l = Limits {
            max_seq_len: 65,
            ..limits()
        };
        assert!(check_dims(&dims(2), &l).is_err(), "past the position table");
        let wide = Dims {
            hidden: 8194,
            heads: 2,
            ..dims(2)
        };
        assert!(check_dims(&wide, &limits()).is_err(), "past MAX_ROW_LEN");
        assert_eq!(
            buffer_tokens(&dims(2), &limits(), 2).expect("fits"),
            256 + 8 * 8
        );
        for l in [
            Limits {
                max_sequences: 1 << 62,
                ..limits()
            },
            Limits {
                max_tokens: usize::MAX - 10,
                ..limits()
            },
            Limits {
                max_tokens: 1 << 60,
                ..limits()
            },
        ] {
            assert!(buffer_tokens(&dims(2), &l, 2).is_err(), "{l:?}");
        }
        assert!(scores_elems(&dims(2), &limits(), 2) >= 2 * 32 * 32);
    }
}
