//! The steps of a [`CudaBert`] call, all enqueued on its stream: the inputs up, the
//! embeddings, each layer's attention and feed-forward, then pooling and the copy down.

use super::model::CudaBert;
use super::pack::{Group, Packed, input_ints};
use super::stages::Stage;
use super::weights::{Layer, Linear, Norm};
use crate::blas::BatchedMatmul;
use crate::encoder::{self, EmbedArgs, HeadsArgs, Layout, PackedAttentionArgs, ResidualNormArgs};
use crate::error::KernelError;

impl CudaBert {
    /// Copies a group's integer inputs up in one copy, laid out for its launch shape `at`
    /// (see [`Packed::write_ints`]), from the page-locked staging at `staged` (ints), which
    /// [`CudaBert::encode_groups`] hands out so that no queued copy reads it until the stream
    /// has been waited for.
    pub(super) fn upload(
        &mut self,
        p: &Packed,
        at: Group,
        staged: usize,
    ) -> Result<(), KernelError> {
        let n = input_ints(at.t, at.b);
        if at.t < p.group.t
            || at.b < p.group.b
            || staged + n > self.staging.len()
            || n > self.buffers.inputs.slice.len()
        {
            return Err(KernelError::bad(format!(
                "{n} input ints at {staged} do not fit the staging ({}) or the device buffer",
                self.staging.len()
            )));
        }
        // The staging's own event is never recorded (only raw copies use it): no wait here.
        let base = self.staging.as_mut_ptr()?;
        // SAFETY: `staging` is a live page-locked allocation of `len` i32, and
        // [staged, staged + n) lies inside it (checked above); encode_groups gives each
        // queued group its own range until it waits for the stream, and waits for it before
        // returning, on success or error, so no queued copy reads it now.
        let src = unsafe { std::slice::from_raw_parts_mut(base.add(staged), n) };
        p.write_ints(src, at);
        // SAFETY: `inputs` holds at least n i32 (checked above); `src` is page-locked and
        // untouched until the stream is waited for; the copy is ordered on the stream after
        // the previous group's kernels that read `inputs`.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                self.buffers.inputs.ptr,
                src,
                self.stream.cu_stream(),
            )?
        };
        Ok(())
    }

    /// Enqueues a group's kernels at its launch shape `g` (its inputs already up): the
    /// embeddings, each layer, the pooling into `pooled`; `mark` is called after each stage.
    /// The same launches whether run or captured into a graph.
    pub(super) fn forward(
        &self,
        g: Group,
        mark: &mut dyn FnMut(Stage) -> Result<(), KernelError>,
    ) -> Result<(), KernelError> {
        self.embed(g)?;
        mark(Stage::Embed)?;
        for layer in &self.weights.layers {
            let qkv = self.project(layer, g)?;
            let ctx = if self.fused_attention {
                mark(Stage::Projections)?;
                let ctx = self.attend_packed(layer, qkv, g)?;
                mark(Stage::Attention)?;
                Some(ctx)
            } else {
                self.split(layer, qkv, g)?;
                mark(Stage::Projections)?;
                self.attend(g)?;
                mark(Stage::Attention)?;
                None
            };
            self.attention_output(layer, ctx, g)?;
            mark(Stage::AttentionOutput)?;
            self.feed_forward(layer, g)?;
            mark(Stage::FeedForward)?;
        }
        self.pool(g)
    }

    /// Where the group's sequences lie in the token rows: packed, `t` rows.
    fn layout(&self, g: Group) -> Layout {
        Layout::Packed {
            offsets: self.buffers.inputs_of(g).offsets,
            rows: g.t,
        }
    }

    /// The embedding layer: `x = LayerNorm(word[id] + position + token_type[type])`.
    pub(super) fn embed(&self, g: Group) -> Result<(), KernelError> {
        let (d, e) = (self.dims, &self.weights.embeddings);
        let inp = self.buffers.inputs_of(g);
        // SAFETY: as said on `Group`.
        unsafe {
            encoder::embed_layer_norm(
                &self.cache,
                &self.stream,
                self.dtype,
                &EmbedArgs {
                    out: self.buffers.x.ptr,
                    ids: inp.ids,
                    type_ids: if e.token_type.is_some() { inp.types } else { 0 },
                    position_ids: inp.positions,
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

    /// A layer's query, key and value projections of `x`, without their biases; gives back
    /// where each landed (q, k, v). They are one strided-batched product when their weights
    /// lie evenly spaced in the arena (a safetensors file sorts a layer's key, query and value
    /// together), into the three slots in the order of their weights' addresses; else three,
    /// into q, k, v.
    pub(super) fn project(&self, layer: &Layer<u64>, g: Group) -> Result<[u64; 3], KernelError> {
        let h = self.dims.hidden;
        let bu = &self.buffers;
        let weights = [layer.query.weight, layer.key.weight, layer.value.weight];
        let es = self.dtype.size_bytes() as u64;
        // Where each of q, k, v lands: the slots in the order of their weights' addresses.
        let [q, k, v] = match evenly_spaced(weights, es) {
            Some((order, spacing)) => {
                let product = BatchedMatmul {
                    a: bu.x.ptr,
                    b: weights[order[0]],
                    c: bu.q,
                    m: g.t,
                    n: h,
                    k: h,
                    batch: 3,
                    stride_a: 0,
                    stride_b: spacing,
                    stride_c: bu.slot,
                    b_transposed: true,
                    alpha: 1.0,
                };
                // SAFETY: as said on `Group`; the three weights are `spacing` elements apart
                // (each h·h, checked by `place`), the three slots `slot` ≥ t·h apart in `work`.
                unsafe { self.blas.batched_matmul(self.dtype, &product)? };
                let mut at = [0; 3];
                for (slot, &which) in order.iter().enumerate() {
                    at[which] = bu.q + (slot * bu.slot) as u64 * es;
                }
                at
            }
            None => {
                self.linear(bu.x.ptr, &layer.query, bu.q, g, h, h)?;
                self.linear(bu.x.ptr, &layer.key, bu.k, g, h, h)?;
                self.linear(bu.x.ptr, &layer.value, bu.v, g, h, h)?;
                [bu.q, bu.k, bu.v]
            }
        };
        Ok([q, k, v])
    }

    /// The heads split apart from the projections at `[q, k, v]` with their biases, q scaled
    /// by 1/√d (into qh, kh, vh, padded to `s`).
    pub(super) fn split(
        &self,
        layer: &Layer<u64>,
        [q, k, v]: [u64; 3],
        g: Group,
    ) -> Result<(), KernelError> {
        let bu = &self.buffers;
        let heads = self.dims.heads;
        let head_dim = self.dims.hidden / heads;
        let heads_args = HeadsArgs {
            q,
            k,
            v,
            layout: self.layout(g),
            q_bias: layer.query.bias,
            k_bias: layer.key.bias,
            v_bias: layer.value.bias,
            q_out: bu.qh,
            k_out: bu.kh,
            v_out: bu.vh,
            batch: g.b,
            seq: g.s,
            heads,
            head_dim,
            q_scale: 1.0 / (head_dim as f32).sqrt(),
        };
        // SAFETY: as said on `Group`.
        unsafe { encoder::split_heads(&self.cache, &self.stream, self.dtype, &heads_args) }
    }

    /// Attention over the split heads, its context into qh: the scores `qh·khᵀ` as one
    /// strided-batched product, a masked softmax, and the context `scores·vh`, in sub-batches
    /// of sequences whose scores fit the scores buffer (qh free once the scores are made).
    /// Where the fused kernel runs, [`CudaBert::attend_packed`] does all of it instead.
    pub(super) fn attend(&self, g: Group) -> Result<(), KernelError> {
        let Group { b, s, .. } = g;
        let (bu, blas, dtype) = (&self.buffers, &self.blas, self.dtype);
        let heads = self.dims.heads;
        let head_dim = self.dims.hidden / heads;
        let per_seq = heads * s * s;
        let chunk = (bu.scores_elems / per_seq).clamp(1, b);
        let es = dtype.size_bytes() as u64;
        for b0 in (0..b).step_by(chunk) {
            let nb = chunk.min(b - b0);
            let at = |base: u64, per: usize| base + (b0 * per) as u64 * es;
            let scores = BatchedMatmul {
                a: at(bu.qh, heads * s * head_dim),
                b: at(bu.kh, heads * s * head_dim),
                c: bu.scores,
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
                a: bu.scores,
                b: at(bu.vh, heads * s * head_dim),
                c: at(bu.qh, heads * s * head_dim),
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
            let lengths = bu.inputs_of(g).lengths + (b0 * 4) as u64;
            // SAFETY: as said on `Group`; the sub-batch [b0, b0 + nb) lies inside the
            // group's heads, and its scores (nb·heads·s² ≤ scores_elems) inside `scores`.
            unsafe {
                blas.batched_matmul(dtype, &scores)?;
                encoder::masked_softmax(
                    &self.cache,
                    &self.stream,
                    dtype,
                    bu.scores,
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

    /// Attention in one kernel straight over the projections at `[q, k, v]`
    /// ([`encoder::attention_packed`]: biases, q's scale, split, attention and merge): the
    /// context lands over q's rows, whose address it gives back.
    pub(super) fn attend_packed(
        &self,
        layer: &Layer<u64>,
        [q, k, v]: [u64; 3],
        g: Group,
    ) -> Result<u64, KernelError> {
        let heads = self.dims.heads;
        let head_dim = self.dims.hidden / heads;
        let args = PackedAttentionArgs {
            q,
            k,
            v,
            q_bias: layer.query.bias,
            k_bias: layer.key.bias,
            v_bias: layer.value.bias,
            layout: self.layout(g),
            batch: g.b,
            heads,
            seq: g.s,
            head_dim,
            q_scale: 1.0 / (head_dim as f32).sqrt(),
        };
        // SAFETY: as said on `Group`; q, k, v are three disjoint slots of `t·hidden` (or
        // more) elements in the work region; `fused_attention` was set for this device's
        // capability, dtype and head size.
        unsafe { encoder::attention_packed(&self.cache, &self.stream, self.dtype, &args)? };
        Ok(q)
    }

    /// The output projection of the context at `ctx` (q, or, from the fused kernel, where q
    /// landed) into another projection slot, then bias, residual and LayerNorm fused into
    /// `x`; after a three-step attention, the heads' context is first merged back (qh into q).
    pub(super) fn attention_output(
        &self,
        layer: &Layer<u64>,
        ctx: Option<u64>,
        g: Group,
    ) -> Result<(), KernelError> {
        let h = self.dims.hidden;
        let bu = &self.buffers;
        if let Some(ctx) = ctx {
            // Any projection slot but the context's is dead by now.
            let out = if ctx == bu.q { bu.k } else { bu.q };
            self.linear(ctx, &layer.attn_out, out, g, h, h)?;
            return self.add_norm(out, layer.attn_out.bias, &layer.attn_norm, g.t);
        }
        let heads = self.dims.heads;
        // SAFETY: as said on `Group`.
        unsafe {
            encoder::merge_heads(
                &self.cache,
                &self.stream,
                self.dtype,
                bu.qh,
                bu.q,
                self.layout(g),
                g.b,
                heads,
                g.s,
                h / heads,
            )?
        };
        self.linear(bu.q, &layer.attn_out, bu.k, g, h, h)?;
        self.add_norm(bu.k, layer.attn_out.bias, &layer.attn_norm, g.t)
    }

    /// The feed-forward: up (into `up`), bias and exact GELU fused, down (into `down`), then bias,
    /// residual and LayerNorm fused into `x`.
    pub(super) fn feed_forward(&self, layer: &Layer<u64>, g: Group) -> Result<(), KernelError> {
        let (h, inter) = (self.dims.hidden, self.dims.intermediate);
        let bu = &self.buffers;
        self.linear(bu.x.ptr, &layer.up, bu.up, g, h, inter)?;
        // SAFETY: as said on `Group`.
        unsafe {
            encoder::bias_gelu(
                &self.cache,
                &self.stream,
                self.dtype,
                bu.up,
                layer.up.bias,
                g.t,
                inter,
            )?
        };
        self.linear(bu.up, &layer.down, bu.down, g, inter, h)?;
        self.add_norm(bu.down, layer.down.bias, &layer.out_norm, g.t)
    }

    /// Pooling (and normalizing) the last hidden states into f32 `pooled` (a sequence of
    /// length 0 gives zeros).
    fn pool(&self, g: Group) -> Result<(), KernelError> {
        let (d, bu) = (self.dims, &self.buffers);
        // SAFETY: as said on `Group`; `pooled` holds max_sequences·hidden f32.
        unsafe {
            encoder::pool(
                &self.cache,
                &self.stream,
                self.dtype,
                bu.x.ptr,
                self.layout(g),
                bu.inputs_of(g).lengths,
                bu.pooled.ptr,
                g.b,
                g.s,
                d.hidden,
                d.pooling,
                d.normalize,
            )
        }
    }

    /// Queues the copy of the first `sequences` pooled vectors down into the pinned rows
    /// `(pointer, length in f32)` from element `at` (the caller waits for the stream before
    /// it reads them).
    pub(super) fn copy_down(
        &self,
        sequences: usize,
        (rows, len): (*mut f32, usize),
        at: usize,
    ) -> Result<(), KernelError> {
        let n = sequences * self.dims.hidden;
        if at + n > len || n > self.buffers.pooled.slice.len() {
            return Err(KernelError::bad(format!(
                "{n} pooled values at {at} do not fit the {len} pinned ones"
            )));
        }
        // SAFETY: `rows` is the pinned allocation of `len` f32 (the caller's), and `at + n` fits it;
        // the copy reads `n` f32 of `pooled` (checked above), queued on the stream behind the
        // pool kernel; `encode_groups` reads these rows only after waiting for the stream, and
        // queues no other write to them before.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(rows.add(at), n);
            cudarc::driver::result::memcpy_dtoh_async(
                dst,
                self.buffers.pooled.ptr,
                self.stream.cu_stream(),
            )?;
        }
        Ok(())
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

/// The order of `weights` by address, and the elements from one to the next, when the three
/// lie equally spaced (in any order) a whole number of elements apart.
fn evenly_spaced(weights: [u64; 3], es: u64) -> Option<([usize; 3], usize)> {
    let mut order = [0, 1, 2];
    order.sort_by_key(|&i| weights[i]);
    let [a, b, c] = order.map(|i| weights[i]);
    let gap = b - a;
    (gap > 0 && c - b == gap && gap.is_multiple_of(es))
        .then(|| usize::try_from(gap / es).ok())
        .flatten()
        .map(|spacing| (order, spacing))
}

#[cfg(test)]
mod tests {
    use super::evenly_spaced;

    /// The projections would be one product over weights that are not evenly spaced, or in
    /// the wrong slots when the arena orders them key, query, value.
    #[test]
    fn evenly_spaced_weights_and_their_order() {
        // A safetensors layer: key, query, value, each a 2048-byte bias then the weight.
        let (k, q, v) = (1000, 1000 + 4096, 1000 + 8192);
        assert_eq!(evenly_spaced([q, k, v], 2), Some(([1, 0, 2], 2048)));
        assert_eq!(evenly_spaced([k, q, v], 2), Some(([0, 1, 2], 2048)));
        assert_eq!(evenly_spaced([v, q, k], 4), Some(([2, 1, 0], 1024)));
        assert_eq!(evenly_spaced([q, k, v + 256], 2), None, "uneven");
        assert_eq!(evenly_spaced([q, q, q], 2), None, "one weight thrice");
        assert_eq!(evenly_spaced([1, 4, 7], 2), None, "not whole elements");
    }
}
