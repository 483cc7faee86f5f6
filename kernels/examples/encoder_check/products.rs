//! The cuBLAS products: a linear layer (BERT-sized, and odd-sized at unaligned addresses) and
//! attention's batched Q·Kᵀ and P·V.

use modelshare_kernels::reference;
use modelshare_kernels::{BatchedMatmul, WeightDtype};

use crate::buf::Buf;
use crate::compare::{Check, compare, matmul_tol};
use crate::env::{Env, Pieces, Res};
use crate::rng::Rng;

/// The products: a linear layer.
pub fn check_blas_linear(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let ffn = 4 * h;
    let x = rng.values(dtype, t * h, 1.0);
    let w = rng.values(dtype, ffn * h, 1.0);
    let mut want = vec![0.0; t * ffn];
    reference::linear(&x, &w, &mut want, t, h, ffn);
    let d_x = Buf::input(st, dtype, &x, off)?;
    let d_w = Buf::input(st, dtype, &w, off)?;
    let d_y = Buf::output(st, dtype, t * ffn, off)?;
    // SAFETY: x [t, h], w [ffn, h], y [t, ffn] on the blas stream.
    unsafe {
        env.blas
            .linear(dtype, d_x.ptr(st), d_w.ptr(st), d_y.ptr(st), t, h, ffn)
    }?;
    checks.push(compare(
        "blas linear",
        dtype,
        label,
        &d_y.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));
    Ok(())
}

/// The products: attention's Q·Kᵀ (scaled by `scale`) and P·V.
pub fn check_blas_attention(
    cx: &Pieces<'_>,
    scale: f32,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let nh = s.heads;
    let hd = s.head_dim();
    let bh = s.batch * nh;
    let (q, k) = (rng.values(dtype, t * h, 1.0), rng.values(dtype, t * h, 1.0));
    let mut want = vec![0.0; bh * s.seq * s.seq];
    reference::batched_matmul(&q, &k, &mut want, s.seq, s.seq, hd, bh, true, scale);
    let (d_q, d_k) = (
        Buf::input(st, dtype, &q, off)?,
        Buf::input(st, dtype, &k, off)?,
    );
    let d_s = Buf::output(st, dtype, bh * s.seq * s.seq, off)?;
    let qk = BatchedMatmul {
        a: d_q.ptr(st),
        b: d_k.ptr(st),
        c: d_s.ptr(st),
        m: s.seq,
        n: s.seq,
        k: hd,
        batch: bh,
        stride_a: s.seq * hd,
        stride_b: s.seq * hd,
        stride_c: s.seq * s.seq,
        b_transposed: true,
        alpha: scale,
    };
    // SAFETY: bh matrices of [seq, hd] in q and k, [seq, seq] in s, packed.
    unsafe { env.blas.batched_matmul(dtype, &qk) }?;
    checks.push(compare(
        "blas q·kᵀ",
        dtype,
        label,
        &d_s.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));

    let p = rng.values(dtype, bh * s.seq * s.seq, 1.0);
    let v = rng.values(dtype, t * h, 1.0);
    let mut want = vec![0.0; t * h];
    reference::batched_matmul(&p, &v, &mut want, s.seq, hd, s.seq, bh, false, 1.0);
    let (d_p, d_v) = (
        Buf::input(st, dtype, &p, off)?,
        Buf::input(st, dtype, &v, off)?,
    );
    let d_c = Buf::output(st, dtype, t * h, off)?;
    let pv = BatchedMatmul {
        a: d_p.ptr(st),
        b: d_v.ptr(st),
        c: d_c.ptr(st),
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
    // SAFETY: bh matrices of [seq, seq] in p, [seq, hd] in v and c, packed.
    unsafe { env.blas.batched_matmul(dtype, &pv) }?;
    checks.push(compare(
        "blas p·v",
        dtype,
        label,
        &d_c.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));
    Ok(())
}

/// A linear layer of odd sizes at unaligned addresses.
pub fn check_odd_linear(
    env: &Env,
    dtype: WeightDtype,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let st = &env.stream;
    let (rows, inf, outf) = (5, 37, 19);
    let x = rng.values(dtype, rows * inf, 1.0);
    let w = rng.values(dtype, outf * inf, 1.0);
    let mut want = vec![0.0; rows * outf];
    reference::linear(&x, &w, &mut want, rows, inf, outf);
    let (d_x, d_w) = (Buf::input(st, dtype, &x, 1)?, Buf::input(st, dtype, &w, 3)?);
    let d_y = Buf::output(st, dtype, rows * outf, 1)?;
    // SAFETY: x [rows, in], w [out, in], y [rows, out].
    unsafe {
        env.blas.linear(
            dtype,
            d_x.ptr(st),
            d_w.ptr(st),
            d_y.ptr(st),
            rows,
            inf,
            outf,
        )
    }?;
    checks.push(compare(
        "blas linear odd",
        dtype,
        "5x37 · 19x37ᵀ, +1/+3",
        &d_y.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));
    Ok(())
}
