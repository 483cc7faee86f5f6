//! One whole encoder layer on the GPU against a CPU composite that rounds its intermediates
//! to the dtype where the GPU stores them.

use modelshare_kernels::reference;
use modelshare_kernels::{Pooling, WeightDtype};

use crate::buf::round_all;
use crate::compare::{Check, compare_norm};
use crate::enqueue::enqueue_layer;
use crate::env::{EPS, Env, Res};
use crate::layer::{LayerWeights, layer_bufs, layer_weights};
use crate::rng::Rng;
use crate::shape::Shape;

/// The CPU composite: returns (layer output [tokens, h], pooled [batch, h]), rounding to the
/// dtype wherever the GPU stores an intermediate.
pub fn cpu_layer(
    dtype: WeightDtype,
    s: &Shape,
    x: &[f32],
    lw: &LayerWeights,
) -> (Vec<f32>, Vec<f32>) {
    let (t, h, nh, hd) = (s.tokens(), s.hidden, s.heads, s.head_dim());
    let ffn = 4 * h;
    let bh = s.batch * nh;
    let r = |v: &mut Vec<f32>| round_all(dtype, v);
    let lin = |x: &[f32], w: &[f32], inf: usize, outf: usize| {
        let mut y = vec![0.0; t * outf];
        reference::linear(x, w, &mut y, t, inf, outf);
        round_all(dtype, &mut y);
        y
    };
    let scale = 1.0 / (hd as f32).sqrt();
    let mut heads = Vec::new();
    for i in 0..3 {
        let p = lin(x, &lw.w[i], h, h);
        let mut o = vec![0.0; t * h];
        reference::split_heads(
            &p,
            &lw.b[i],
            &mut o,
            s.batch,
            s.seq,
            nh,
            hd,
            if i == 0 { scale } else { 1.0 },
        );
        r(&mut o);
        heads.push(o);
    }
    let mut scores = vec![0.0; bh * s.seq * s.seq];
    reference::batched_matmul(
        &heads[0],
        &heads[1],
        &mut scores,
        s.seq,
        s.seq,
        hd,
        bh,
        true,
        1.0,
    );
    r(&mut scores);
    reference::masked_softmax(&mut scores, &s.lengths, s.batch, nh, s.seq);
    r(&mut scores);
    let mut ctx = vec![0.0; t * h];
    reference::batched_matmul(
        &scores, &heads[2], &mut ctx, s.seq, hd, s.seq, bh, false, 1.0,
    );
    r(&mut ctx);
    let mut merged = vec![0.0; t * h];
    reference::merge_heads(&ctx, &mut merged, s.batch, s.seq, nh, hd);
    let attn = lin(&merged, &lw.w[3], h, h);
    let mut h1 = x.to_vec();
    reference::bias_residual_layer_norm_in_place(
        &mut h1, &attn, &lw.b[3], &lw.ln[0], &lw.ln[1], EPS,
    );
    r(&mut h1);
    let mut f = lin(&h1, &lw.w[4], h, ffn);
    reference::bias_gelu(&mut f, &lw.b[4]);
    r(&mut f);
    let o = lin(&f, &lw.w[5], ffn, h);
    let mut h2 = vec![0.0; t * h];
    reference::bias_residual_layer_norm(&mut h2, &o, &lw.b[5], &h1, &lw.ln[2], &lw.ln[3], EPS);
    r(&mut h2);
    let mut pooled = vec![0.0; s.batch * h];
    reference::pool(
        &h2,
        &s.lengths,
        &mut pooled,
        s.batch,
        s.seq,
        h,
        Pooling::Mean,
        true,
    );
    (h2, pooled)
}

/// One whole layer on the GPU against the CPU composite.
pub fn check_layer(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let h = s.hidden;
    let lw = layer_weights(dtype, h, 4 * h, rng);
    let x = rng.values(dtype, s.tokens() * h, 1.0);
    let (want_h2, want_pooled) = cpu_layer(dtype, s, &x, &lw);
    let bufs = layer_bufs(&env.stream, dtype, s, &x, &lw)?;
    enqueue_layer(env, dtype, s, &bufs, None)?;
    let limit = match dtype {
        WeightDtype::F32 => 1e-4,
        WeightDtype::F16 => 5e-3,
        WeightDtype::BF16 => 3e-2,
    };
    let label = s.label();
    let st = &env.stream;
    checks.push(compare_norm(
        "layer output",
        dtype,
        &label,
        &bufs.h2.read(st)?,
        &want_h2,
        limit,
    ));
    checks.push(compare_norm(
        "layer pooled",
        dtype,
        &label,
        &bufs.pooled.read(st)?,
        &want_pooled,
        limit,
    ));
    Ok(())
}
