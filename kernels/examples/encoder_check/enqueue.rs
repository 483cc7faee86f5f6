//! One encoder layer enqueued on the device, step by step, each step between two events when
//! it is timed.

use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream};
use modelshare_kernels::encoder::{self, HeadsArgs, Layout, ResidualNormArgs};
use modelshare_kernels::{BatchedMatmul, Pooling, WeightDtype};

use crate::buf::Buf;
use crate::env::{EPS, Env, Res};
use crate::layer::LayerBufs;
use crate::shape::Shape;

/// Timing marks: (step, start, end) per enqueued step.
pub type Marks = Vec<(&'static str, CudaEvent, CudaEvent)>;

/// Enqueues one encoder layer on `b` (h1 written over `b.x`), marking each step when
/// `marks` is given.
pub fn enqueue_layer(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    mut marks: Option<&mut Marks>,
) -> Res<()> {
    enqueue_attention_scores(env, dtype, s, b, &mut marks)?;
    enqueue_attention_output(env, dtype, s, b, &mut marks)?;
    enqueue_feed_forward(env, dtype, s, b, &mut marks)?;
    Ok(())
}

/// Runs `f` (one step of a layer, named `name`), between two events recorded on `st` when
/// `marks` is given.
pub fn marked_step(
    st: &Arc<CudaStream>,
    marks: &mut Option<&mut Marks>,
    name: &'static str,
    f: &mut dyn FnMut() -> Res<()>,
) -> Res<()> {
    match marks.as_deref_mut() {
        Some(m) => {
            let start = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            f()?;
            let end = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            m.push((name, start, end));
            Ok(())
        }
        None => f(),
    }
}

/// Enqueues the attention scores of the layer: the Q, K and V projections, the heads, Q·Kᵀ
/// and the masked softmax.
pub fn enqueue_attention_scores(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    marks: &mut Option<&mut Marks>,
) -> Res<()> {
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let nh = s.heads;
    let hd = s.head_dim();
    let bh = s.batch * nh;
    let p = |buf: &Buf| buf.ptr(st);
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Res<()>| -> Res<()> {
        marked_step(st, marks, name, f)
    };
    // SAFETY (every unsafe block below): LayerBufs allocated each buffer with the
    // elements this layer reads or writes, on this stream; nothing else runs on them.
    step("linear qkv (3x)", &mut || {
        for i in 0..3 {
            // SAFETY: see above.
            unsafe {
                env.blas
                    .linear(dtype, p(&b.x), p(&b.w[i]), p(&b.qkv[i]), t, h, h)
            }?;
        }
        Ok(())
    })?;
    step("split_heads", &mut || {
        let a = HeadsArgs {
            q: p(&b.qkv[0]),
            k: p(&b.qkv[1]),
            v: p(&b.qkv[2]),
            layout: Layout::Padded,
            q_bias: p(&b.b[0]),
            k_bias: p(&b.b[1]),
            v_bias: p(&b.b[2]),
            q_out: p(&b.heads[0]),
            k_out: p(&b.heads[1]),
            v_out: p(&b.heads[2]),
            batch: s.batch,
            seq: s.seq,
            heads: nh,
            head_dim: hd,
            q_scale: 1.0 / (hd as f32).sqrt(),
        };
        // SAFETY: see above.
        unsafe { encoder::split_heads(cache, st, dtype, &a) }?;
        Ok(())
    })?;
    step("q·kᵀ", &mut || {
        let m = BatchedMatmul {
            a: p(&b.heads[0]),
            b: p(&b.heads[1]),
            c: p(&b.scores),
            m: s.seq,
            n: s.seq,
            k: hd,
            batch: bh,
            stride_a: s.seq * hd,
            stride_b: s.seq * hd,
            stride_c: s.seq * s.seq,
            b_transposed: true,
            alpha: 1.0,
        };
        // SAFETY: see above.
        unsafe { env.blas.batched_matmul(dtype, &m) }?;
        Ok(())
    })?;
    step("masked_softmax", &mut || {
        // SAFETY: see above.
        unsafe {
            encoder::masked_softmax(
                cache,
                st,
                dtype,
                p(&b.scores),
                p(&b.lengths),
                s.batch,
                nh,
                s.seq,
            )
        }?;
        Ok(())
    })?;
    Ok(())
}

/// Enqueues the attention output of the layer: P·V, the merged heads, the output projection
/// and the first residual LayerNorm (in place over `b.x`).
pub fn enqueue_attention_output(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    marks: &mut Option<&mut Marks>,
) -> Res<()> {
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let nh = s.heads;
    let hd = s.head_dim();
    let bh = s.batch * nh;
    let p = |buf: &Buf| buf.ptr(st);
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Res<()>| -> Res<()> {
        marked_step(st, marks, name, f)
    };
    // SAFETY (every unsafe block below): LayerBufs allocated each buffer with the
    // elements this layer reads or writes, on this stream; nothing else runs on them.
    step("p·v", &mut || {
        let m = BatchedMatmul {
            a: p(&b.scores),
            b: p(&b.heads[2]),
            c: p(&b.ctx),
            m: s.seq,
            n: hd,
            k: s.seq,
            batch: bh,
            stride_a: s.seq * s.seq,
            stride_b: s.seq * hd,
            stride_c: s.seq * hd,
            b_transposed: false,
            alpha: 1.0,
        };
        // SAFETY: see above.
        unsafe { env.blas.batched_matmul(dtype, &m) }?;
        Ok(())
    })?;
    step("merge_heads", &mut || {
        // SAFETY: see above.
        unsafe {
            encoder::merge_heads(
                cache,
                st,
                dtype,
                p(&b.ctx),
                p(&b.merged),
                Layout::Padded,
                s.batch,
                nh,
                s.seq,
                hd,
            )
        }?;
        Ok(())
    })?;
    step("linear out", &mut || {
        // SAFETY: see above.
        unsafe {
            env.blas
                .linear(dtype, p(&b.merged), p(&b.w[3]), p(&b.attn), t, h, h)
        }?;
        Ok(())
    })?;
    step("residual_ln 1 (in place)", &mut || {
        let a = ResidualNormArgs {
            out: p(&b.x),
            x: p(&b.attn),
            bias: p(&b.b[3]),
            residual: p(&b.x),
            gamma: p(&b.ln[0]),
            beta: p(&b.ln[1]),
            rows: t,
            cols: h,
            eps: EPS,
        };
        // SAFETY: see above; out is the residual itself, which the launcher allows.
        unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &a) }?;
        Ok(())
    })?;
    Ok(())
}

/// Enqueues the feed-forward half of the layer, the second residual LayerNorm and the
/// pooling.
pub fn enqueue_feed_forward(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    marks: &mut Option<&mut Marks>,
) -> Res<()> {
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let ffn = 4 * h;
    let p = |buf: &Buf| buf.ptr(st);
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Res<()>| -> Res<()> {
        marked_step(st, marks, name, f)
    };
    // SAFETY (every unsafe block below): LayerBufs allocated each buffer with the
    // elements this layer reads or writes, on this stream; nothing else runs on them.
    step("linear ffn up", &mut || {
        // SAFETY: see above.
        unsafe {
            env.blas
                .linear(dtype, p(&b.x), p(&b.w[4]), p(&b.f), t, h, ffn)
        }?;
        Ok(())
    })?;
    step("bias_gelu", &mut || {
        // SAFETY: see above.
        unsafe { encoder::bias_gelu(cache, st, dtype, p(&b.f), p(&b.b[4]), t, ffn) }?;
        Ok(())
    })?;
    step("linear ffn down", &mut || {
        // SAFETY: see above.
        unsafe {
            env.blas
                .linear(dtype, p(&b.f), p(&b.w[5]), p(&b.o), t, ffn, h)
        }?;
        Ok(())
    })?;
    step("residual_ln 2", &mut || {
        let a = ResidualNormArgs {
            out: p(&b.h2),
            x: p(&b.o),
            bias: p(&b.b[5]),
            residual: p(&b.x),
            gamma: p(&b.ln[2]),
            beta: p(&b.ln[3]),
            rows: t,
            cols: h,
            eps: EPS,
        };
        // SAFETY: see above.
        unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &a) }?;
        Ok(())
    })?;
    step("pool mean + normalize", &mut || {
        // SAFETY: see above.
        unsafe {
            encoder::pool(
                cache,
                st,
                dtype,
                p(&b.h2),
                Layout::Padded,
                p(&b.lengths),
                p(&b.pooled),
                s.batch,
                s.seq,
                h,
                Pooling::Mean,
                true,
            )
        }?;
        Ok(())
    })?;
    Ok(())
}
