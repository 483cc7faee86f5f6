//! The host backend: the encoder's forward pass on the CPU, on the weights in the shared
//! host arena (f32 tensors are read in place; f16 and bf16 ones are widened to f32 once,
//! when the version is attached).
//!
//! Sequences are not padded: the position-wise parts (projections, feed-forward, norms) run
//! on all tokens of the group packed together, as `host_gemm` products over the rayon pool;
//! attention runs per sequence, in parallel, over each sequence's own tokens. The element-wise
//! parts are the kernels' own CPU references (`modelshare_kernels::reference::encoder`), run
//! on chunks of rows in parallel.

use std::sync::Arc;

use half::{bf16, f16};
use modelshare_kernels::WeightDtype;
use modelshare_kernels::host_gemm::{self, MatMut, MatRef, Threads};
use modelshare_kernels::reference::encoder as ops;
use modelshare_worker::Tensor;
use rayon::prelude::*;

use crate::encoder::{EncodeError, Encoder};
use crate::spec::ModelSpec;
use crate::tokenize::Sequence;
use crate::weights::{EncoderWeights, Linear, Norm};

/// A weight as the host backend reads it.
#[derive(Debug)]
pub enum HostWeight {
    /// An f32 tensor of the shared arena, read in place.
    Shared(Tensor),
    /// A widened copy of an f16 or bf16 tensor.
    Widened(Vec<f32>),
}

impl HostWeight {
    /// Reads `tensor` as f32: in place, or widened.
    pub fn new(tensor: &Tensor, dtype: WeightDtype) -> Result<Self, EncodeError> {
        let bad = |e: modelshare_worker::WorkerError| EncodeError::Weights(e.to_string());
        Ok(match dtype {
            WeightDtype::F32 => {
                tensor.as_slice::<f32>().map_err(bad)?;
                HostWeight::Shared(tensor.clone())
            }
            WeightDtype::F16 => HostWeight::Widened(
                tensor
                    .as_slice::<f16>()
                    .map_err(bad)?
                    .iter()
                    .map(|v| v.to_f32())
                    .collect(),
            ),
            WeightDtype::BF16 => HostWeight::Widened(
                tensor
                    .as_slice::<bf16>()
                    .map_err(bad)?
                    .iter()
                    .map(|v| v.to_f32())
                    .collect(),
            ),
        })
    }

    fn f32(&self) -> &[f32] {
        match self {
            // Checked to be an f32 tensor of the host arena when made.
            HostWeight::Shared(t) => t.as_slice::<f32>().unwrap_or(&[]),
            HostWeight::Widened(v) => v,
        }
    }
}

/// The encoder on the CPU.
#[derive(Debug)]
pub struct CpuEncoder {
    spec: Arc<ModelSpec>,
    weights: EncoderWeights<HostWeight>,
    max_tokens: usize,
    max_sequences: usize,
}

impl CpuEncoder {
    /// An encoder over `weights` (the SDK's tensors of a host arena).
    pub fn new(
        spec: Arc<ModelSpec>,
        weights: &EncoderWeights<Tensor>,
        max_tokens: usize,
        max_sequences: usize,
    ) -> Result<Self, EncodeError> {
        let dtype = weights.dtype;
        let weights = weights.try_map(|t| HostWeight::new(t, dtype))?;
        Ok(Self {
            spec,
            weights,
            max_tokens,
            max_sequences,
        })
    }
}

impl Encoder for CpuEncoder {
    fn hidden(&self) -> usize {
        self.spec.encoder.hidden
    }

    fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    fn pads(&self) -> bool {
        false
    }

    fn max_sequences(&self) -> usize {
        self.max_sequences
    }

    /// A panic leaves nothing behind: every buffer of a call is its own (allocated in
    /// `encode`, dropped with the unwinding), the weights are only read, and rayon passes a
    /// worker's panic to the caller with its pool intact. The next call starts afresh.
    fn survives_panic(&self) -> bool {
        true
    }

    fn encode(&mut self, seqs: &[&Sequence]) -> Result<Vec<f32>, EncodeError> {
        let c = &self.spec.encoder;
        let (h, inter) = (c.hidden, c.intermediate);
        let starts: Vec<usize> = seqs
            .iter()
            .scan(0, |at, s| {
                let start = *at;
                *at += s.len();
                Some(start)
            })
            .collect();
        let tokens: usize = seqs.iter().map(|s| s.len()).sum();
        let mut x = vec![0.0f32; tokens * h];
        self.embed(seqs, &mut x);

        let mut q = vec![0.0f32; tokens * h];
        let mut k = vec![0.0f32; tokens * h];
        let mut v = vec![0.0f32; tokens * h];
        let mut ctx = vec![0.0f32; tokens * h];
        let mut proj = vec![0.0f32; tokens * h];
        let mut up = vec![0.0f32; tokens * inter];
        for layer in &self.weights.layers {
            linear(&x, &layer.query, &mut q, tokens)?;
            linear(&x, &layer.key, &mut k, tokens)?;
            linear(&x, &layer.value, &mut v, tokens)?;
            for (y, l) in [
                (&mut q, &layer.query),
                (&mut k, &layer.key),
                (&mut v, &layer.value),
            ] {
                let bias = l.bias.f32();
                y.par_chunks_mut(h)
                    .for_each(|row| row.iter_mut().zip(bias).for_each(|(v, b)| *v += b));
            }
            self.attention(seqs, &starts, &q, &k, &v, &mut ctx)?;
            linear(&ctx, &layer.attn_out, &mut proj, tokens)?;
            add_norm(
                &mut x,
                &proj,
                layer.attn_out.bias.f32(),
                &layer.attn_norm,
                h,
                c.eps,
            );
            linear(&x, &layer.up, &mut up, tokens)?;
            let bias = layer.up.bias.f32();
            up.par_chunks_mut(inter * ROWS)
                .for_each(|rows| ops::bias_gelu(rows, bias));
            linear(&up, &layer.down, &mut proj, tokens)?;
            add_norm(
                &mut x,
                &proj,
                layer.down.bias.f32(),
                &layer.out_norm,
                h,
                c.eps,
            );
        }
        let pooled: Vec<Vec<f32>> = seqs
            .par_iter()
            .zip(&starts)
            .map(|(s, &start)| {
                let mut out = vec![0.0f32; h];
                let len = s.len();
                let tokens = &x[start * h..(start + len) * h];
                let (mode, normalize) = (self.spec.pooling, self.spec.normalize);
                ops::pool(tokens, &[len as i32], &mut out, 1, len, h, mode, normalize);
                out
            })
            .collect();
        Ok(pooled.concat())
    }
}

impl CpuEncoder {
    /// `x[t] = LayerNorm(word[id] + position[p + offset] + token_type[type])` for every token,
    /// sequence by sequence in parallel.
    fn embed(&self, seqs: &[&Sequence], x: &mut [f32]) {
        let c = &self.spec.encoder;
        let e = &self.weights.embeddings;
        let mut rows: Vec<&mut [f32]> = Vec::with_capacity(seqs.len());
        let mut rest = x;
        for s in seqs {
            let (mine, tail) = rest.split_at_mut(s.len() * c.hidden);
            rows.push(mine);
            rest = tail;
        }
        rows.into_par_iter().zip(seqs).for_each(|(out, s)| {
            let ids: Vec<i32> = s.ids.iter().map(|&i| i as i32).collect();
            let types: Vec<i32> = s.type_ids.iter().map(|&i| i as i32).collect();
            ops::embed_layer_norm(
                out,
                &ids,
                Some(&types),
                e.word.f32(),
                e.position.f32(),
                e.token_type.as_ref().map_or(&[], HostWeight::f32),
                e.norm.gamma.f32(),
                e.norm.beta.f32(),
                s.len(),
                c.position_offset,
                c.eps,
            );
        });
    }

    /// Self-attention of every sequence over its own tokens: `ctx = softmax(q·kᵀ/√d)·v` per
    /// head (q, k and v with their biases).
    fn attention(
        &self,
        seqs: &[&Sequence],
        starts: &[usize],
        q: &[f32],
        k: &[f32],
        v: &[f32],
        ctx: &mut [f32],
    ) -> Result<(), EncodeError> {
        let c = &self.spec.encoder;
        let (h, heads, d) = (c.hidden, c.heads, c.head_dim());
        let scale = 1.0 / (d as f32).sqrt();
        // Each sequence's rows of ctx are its own: sequences run in parallel, and within one
        // the heads one after the other (each head writes its own columns).
        let mut rows: Vec<&mut [f32]> = Vec::with_capacity(seqs.len());
        let mut rest = ctx;
        for s in seqs {
            let (mine, tail) = rest.split_at_mut(s.len() * h);
            rows.push(mine);
            rest = tail;
        }
        rows.into_par_iter()
            .zip(seqs.par_iter().zip(starts))
            .try_for_each(|(out, (s, &start))| {
                let len = s.len();
                let mut scores = vec![0.0f32; len * len];
                for head in 0..heads {
                    let view = |data| head_view(data, start * h + head * d, len, d, h);
                    host_gemm::matmul(
                        MatMut::row_major(&mut scores, len, len),
                        view(q),
                        view(k).t(),
                        scale,
                        Threads::One,
                    )?;
                    ops::masked_softmax(&mut scores, &[len as i32], 1, 1, len);
                    let dst = MatMut {
                        data: &mut *out,
                        offset: head * d,
                        rows: len,
                        cols: d,
                        row_stride: h,
                        col_stride: 1,
                    };
                    host_gemm::matmul(
                        dst,
                        MatRef::row_major(&scores, len, len),
                        view(v),
                        1.0,
                        Threads::One,
                    )?;
                }
                Ok::<(), EncodeError>(())
            })
    }
}

/// Rows `[len, d]` of one head: columns `offset..offset + d` of rows `h` wide.
fn head_view(data: &[f32], offset: usize, len: usize, d: usize, h: usize) -> MatRef<'_> {
    MatRef {
        data,
        offset,
        rows: len,
        cols: d,
        row_stride: h,
        col_stride: 1,
    }
}

/// `y = x·Wᵀ` over packed rows (the bias is the caller's, fused into what follows).
fn linear(
    x: &[f32],
    l: &Linear<HostWeight>,
    y: &mut [f32],
    rows: usize,
) -> Result<(), EncodeError> {
    let (w, out) = (l.weight.f32(), l.bias.f32().len());
    host_gemm::linear(x, w, y, rows, w.len() / out.max(1), out)?;
    Ok(())
}

/// Rows per parallel chunk of the element-wise parts.
const ROWS: usize = 16;

/// `x = LayerNorm(y + bias + x)`, in chunks of rows.
fn add_norm(x: &mut [f32], y: &[f32], bias: &[f32], norm: &Norm<HostWeight>, h: usize, eps: f32) {
    let (g, b) = (norm.gamma.f32(), norm.beta.f32());
    x.par_chunks_mut(h * ROWS)
        .zip(y.par_chunks(h * ROWS))
        .for_each(|(x, y)| ops::bias_residual_layer_norm_in_place(x, y, bias, g, b, eps));
}
