//! The bias + GELU kernel.

use modelshare_kernels::encoder;
use modelshare_kernels::reference;

use crate::buf::Buf;
use crate::compare::{Check, compare, unit_tol};
use crate::env::{Pieces, Res};
use crate::rng::Rng;

/// Bias + GELU, in place on [tokens, 4·hidden].
pub fn check_bias_gelu(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let ffn = 4 * h;
    let x = rng.values(dtype, t * ffn, 3.0);
    let bias = rng.values(dtype, ffn, 1.0);
    let mut want = x.clone();
    reference::bias_gelu(&mut want, &bias);
    let d_x = Buf::input(st, dtype, &x, off)?;
    let d_bias = Buf::input(st, dtype, &bias, off)?;
    // SAFETY: d_x holds t·ffn elements and d_bias ffn, on this stream.
    unsafe { encoder::bias_gelu(cache, st, dtype, d_x.ptr(st), d_bias.ptr(st), t, ffn) }?;
    checks.push(compare(
        "bias_gelu",
        dtype,
        label,
        &d_x.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(())
}
