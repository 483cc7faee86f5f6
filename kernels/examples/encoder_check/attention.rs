//! The attention kernels: split heads (with bias and the q scale), merge heads, masked
//! softmax.

use modelshare_kernels::encoder::{self, HeadsArgs, Layout};
use modelshare_kernels::reference;

use crate::buf::Buf;
use crate::compare::{Check, Tol, compare, unit_tol};
use crate::env::{Pieces, Res};
use crate::rng::Rng;

/// Split heads (with bias and the q scale), then merge back; gives back the q scale.
pub fn check_heads(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<f32> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let nh = s.heads;
    let hd = s.head_dim();
    let scale = 1.0 / (hd as f32).sqrt();
    let qkv: Vec<Vec<f32>> = (0..3).map(|_| rng.values(dtype, t * h, 2.0)).collect();
    let biases: Vec<Vec<f32>> = (0..3).map(|_| rng.values(dtype, h, 1.0)).collect();
    let d_in: Vec<Buf> = qkv
        .iter()
        .map(|v| Buf::input(st, dtype, v, off))
        .collect::<Res<_>>()?;
    let d_b: Vec<Buf> = biases
        .iter()
        .map(|v| Buf::input(st, dtype, v, off))
        .collect::<Res<_>>()?;
    let d_split: Vec<Buf> = (0..3)
        .map(|_| Buf::output(st, dtype, t * h, off))
        .collect::<Res<_>>()?;
    let heads = HeadsArgs {
        q: d_in[0].ptr(st),
        k: d_in[1].ptr(st),
        v: d_in[2].ptr(st),
        layout: Layout::Padded,
        q_bias: d_b[0].ptr(st),
        k_bias: d_b[1].ptr(st),
        v_bias: d_b[2].ptr(st),
        q_out: d_split[0].ptr(st),
        k_out: d_split[1].ptr(st),
        v_out: d_split[2].ptr(st),
        batch: s.batch,
        seq: s.seq,
        heads: nh,
        head_dim: hd,
        q_scale: scale,
    };
    // SAFETY: nine buffers of [t, h] or [h] elements on this stream.
    unsafe { encoder::split_heads(cache, st, dtype, &heads) }?;
    for (i, name) in ["split_heads q", "split_heads k", "split_heads v"]
        .iter()
        .enumerate()
    {
        let mut want = vec![0.0; t * h];
        let sc = if i == 0 { scale } else { 1.0 };
        reference::split_heads(&qkv[i], &biases[i], &mut want, s.batch, s.seq, nh, hd, sc);
        checks.push(compare(
            name,
            dtype,
            label,
            &d_split[i].read(st)?,
            &want,
            unit_tol(dtype),
        ));
    }
    let ctx = rng.values(dtype, t * h, 2.0);
    let mut want = vec![0.0; t * h];
    reference::merge_heads(&ctx, &mut want, s.batch, s.seq, nh, hd);
    let d_ctx = Buf::input(st, dtype, &ctx, off)?;
    let d_merged = Buf::output(st, dtype, t * h, off)?;
    // SAFETY: both buffers hold t·h elements.
    unsafe {
        encoder::merge_heads(
            cache,
            st,
            dtype,
            d_ctx.ptr(st),
            d_merged.ptr(st),
            Layout::Padded,
            s.batch,
            nh,
            s.seq,
            hd,
        )
    }?;
    checks.push(compare(
        "merge_heads",
        dtype,
        label,
        &d_merged.read(st)?,
        &want,
        Tol { rel: 0.0, abs: 0.0 },
    ));
    Ok(scale)
}

/// Masked softmax on [batch·heads, seq, seq]; gives back the lengths on the device.
pub fn check_masked_softmax(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<Buf> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let off = s.offset;
    let nh = s.heads;
    let n_scores = s.batch * nh * s.seq * s.seq;
    let scores = rng.values(dtype, n_scores, 6.0);
    let mut want = scores.clone();
    reference::masked_softmax(&mut want, &s.lengths, s.batch, nh, s.seq);
    let d_scores = Buf::input(st, dtype, &scores, off)?;
    let d_len = Buf::ints(st, &s.lengths)?;
    // SAFETY: d_scores holds batch·heads·seq² elements, d_len batch i32.
    unsafe {
        encoder::masked_softmax(
            cache,
            st,
            dtype,
            d_scores.ptr(st),
            d_len.ptr(st),
            s.batch,
            nh,
            s.seq,
        )
    }?;
    checks.push(compare(
        "masked_softmax",
        dtype,
        label,
        &d_scores.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(d_len)
}
