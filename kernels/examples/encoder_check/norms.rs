//! The LayerNorm kernels: embeddings + LayerNorm, and bias + residual + LayerNorm (into a new
//! buffer, in place, and on wide rows).

use modelshare_kernels::WeightDtype;
use modelshare_kernels::encoder::{self, EmbedArgs, ResidualNormArgs};
use modelshare_kernels::reference;

use crate::buf::{Buf, round};
use crate::compare::{Check, compare, unit_tol};
use crate::env::{EPS, Env, Pieces, Res};
use crate::rng::Rng;

/// The LayerNorm parameters of the embeddings check, on the host and on the device, which the
/// residual LayerNorm check takes again.
pub struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    d_gamma: Buf,
    d_beta: Buf,
}

/// Embeddings + LayerNorm, with ids out of range at both ends; gives back the norm
/// parameters (γ, β) for the residual LayerNorm.
pub fn check_embed_layer_norm(
    cx: &Pieces<'_>,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<Norm> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let (vocab, type_vocab) = (50usize, 2usize);
    let positions = s.seq + s.position_offset;
    let ids: Vec<i32> = (0..t)
        .map(|i| match i % 9 {
            4 => -1,
            7 => vocab as i32 + 3,
            _ => rng.below(vocab as u64) as i32,
        })
        .collect();
    let type_ids: Vec<i32> = (0..t)
        .map(|i| if i % 5 == 3 { 9 } else { rng.below(2) as i32 })
        .collect();
    let word = rng.values(dtype, vocab * h, 1.0);
    let position = rng.values(dtype, positions * h, 1.0);
    let token_type = rng.values(dtype, type_vocab * h, 1.0);
    let gamma = rng
        .values(dtype, h, 1.0)
        .iter()
        .map(|g| round(dtype, 1.0 + 0.5 * g))
        .collect::<Vec<_>>();
    let beta = rng.values(dtype, h, 0.5);
    let mut want = vec![0.0; t * h];
    reference::embed_layer_norm(
        &mut want,
        &ids,
        s.type_ids.then_some(&type_ids[..]),
        &word,
        &position,
        &token_type,
        &gamma,
        &beta,
        s.seq,
        s.position_offset,
        EPS,
    );
    let d_ids = Buf::ints(st, &ids)?;
    let d_types = Buf::ints(st, &type_ids)?;
    let d_word = Buf::input(st, dtype, &word, off)?;
    let d_pos = Buf::input(st, dtype, &position, off)?;
    let d_tt = Buf::input(st, dtype, &token_type, off)?;
    let d_gamma = Buf::input(st, dtype, &gamma, off)?;
    let d_beta = Buf::input(st, dtype, &beta, off)?;
    let d_out = Buf::output(st, dtype, t * h, off)?;
    let args = EmbedArgs {
        out: d_out.ptr(st),
        ids: d_ids.ptr(st),
        type_ids: if s.type_ids { d_types.ptr(st) } else { 0 },
        position_ids: 0,
        word: d_word.ptr(st),
        position: d_pos.ptr(st),
        token_type: d_tt.ptr(st),
        gamma: d_gamma.ptr(st),
        beta: d_beta.ptr(st),
        tokens: t,
        seq_len: s.seq,
        hidden: h,
        vocab,
        positions,
        type_vocab,
        position_offset: s.position_offset,
        eps: EPS,
    };
    // SAFETY: every buffer above holds the elements EmbedArgs says, on this stream.
    unsafe { encoder::embed_layer_norm(cache, st, dtype, &args) }?;
    checks.push(compare(
        "embed_layer_norm",
        dtype,
        label,
        &d_out.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(Norm {
        gamma,
        beta,
        d_gamma,
        d_beta,
    })
}

/// Bias + residual + LayerNorm: into a new buffer, then in place over the residual, with
/// `norm`'s γ and β.
pub fn check_residual_layer_norm(
    cx: &Pieces<'_>,
    norm: &Norm,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let x = rng.values(dtype, t * h, 2.0);
    let residual = rng.values(dtype, t * h, 2.0);
    let bias = rng.values(dtype, h, 1.0);
    let mut want = vec![0.0; t * h];
    reference::bias_residual_layer_norm(
        &mut want,
        &x,
        &bias,
        &residual,
        &norm.gamma,
        &norm.beta,
        EPS,
    );
    let d_x = Buf::input(st, dtype, &x, off)?;
    let d_res = Buf::input(st, dtype, &residual, off)?;
    let d_bias = Buf::input(st, dtype, &bias, off)?;
    let d_out = Buf::output(st, dtype, t * h, off)?;
    let mut args = ResidualNormArgs {
        out: d_out.ptr(st),
        x: d_x.ptr(st),
        bias: d_bias.ptr(st),
        residual: d_res.ptr(st),
        gamma: norm.d_gamma.ptr(st),
        beta: norm.d_beta.ptr(st),
        rows: t,
        cols: h,
        eps: EPS,
    };
    // SAFETY: all buffers hold the [t, h] or [h] elements the arguments say.
    unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &args) }?;
    checks.push(compare(
        "residual_layer_norm",
        dtype,
        label,
        &d_out.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    args.out = args.residual;
    // SAFETY: as above; out is the residual buffer itself, which the launcher allows.
    unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &args) }?;
    checks.push(compare(
        "residual_ln_in_place",
        dtype,
        label,
        &d_res.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(())
}

/// LayerNorm rows wider than the BERT sizes: several warps per row, up to the limit.
pub fn check_wide_norm(
    env: &Env,
    dtype: WeightDtype,
    cols: usize,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let st = &env.stream;
    let rows = 33;
    let x = rng.values(dtype, rows * cols, 2.0);
    let residual = rng.values(dtype, rows * cols, 2.0);
    let bias = rng.values(dtype, cols, 1.0);
    let gamma = rng.values(dtype, cols, 1.0);
    let beta = rng.values(dtype, cols, 1.0);
    let mut want = vec![0.0; rows * cols];
    reference::bias_residual_layer_norm(&mut want, &x, &bias, &residual, &gamma, &beta, EPS);
    let bufs: Vec<Buf> = [&x, &bias, &residual, &gamma, &beta]
        .iter()
        .map(|v| Buf::input(st, dtype, v, 0))
        .collect::<Res<_>>()?;
    let d_out = Buf::output(st, dtype, rows * cols, 0)?;
    let args = ResidualNormArgs {
        out: d_out.ptr(st),
        x: bufs[0].ptr(st),
        bias: bufs[1].ptr(st),
        residual: bufs[2].ptr(st),
        gamma: bufs[3].ptr(st),
        beta: bufs[4].ptr(st),
        rows,
        cols,
        eps: EPS,
    };
    // SAFETY: the buffers hold [rows, cols] or [cols] elements.
    unsafe { encoder::bias_residual_layer_norm(&env.cache, st, dtype, &args) }?;
    let label = format!("rows {rows} cols {cols}");
    checks.push(compare(
        "residual_ln wide",
        dtype,
        &label,
        &d_out.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(())
}
