//! The pooling kernel, every mode, with and without normalize.

use modelshare_kernels::encoder::{self, Layout};
use modelshare_kernels::reference;
use modelshare_kernels::{Pooling, WeightDtype};

use crate::buf::Buf;
use crate::compare::{Check, POOL_TOL, compare};
use crate::env::{Pieces, Res};
use crate::rng::Rng;

/// Pooling, every mode, with and without normalize, over the lengths `d_len`.
pub fn check_pooling(
    cx: &Pieces<'_>,
    d_len: &Buf,
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
    let d_x = Buf::input(st, dtype, &x, off)?;
    for mode in [
        Pooling::Mean,
        Pooling::Cls,
        Pooling::Max,
        Pooling::MeanSqrtLen,
    ] {
        for normalize in [false, true] {
            let mut want = vec![0.0; s.batch * h];
            reference::pool(
                &x, &s.lengths, &mut want, s.batch, s.seq, h, mode, normalize,
            );
            let d_out = Buf::output(st, WeightDtype::F32, s.batch * h, 0)?;
            // SAFETY: d_x holds batch·seq·hidden elements, d_len batch i32, d_out
            // batch·hidden f32.
            unsafe {
                encoder::pool(
                    cache,
                    st,
                    dtype,
                    d_x.ptr(st),
                    Layout::Padded,
                    d_len.ptr(st),
                    d_out.ptr(st),
                    s.batch,
                    s.seq,
                    h,
                    mode,
                    normalize,
                )
            }?;
            let name = format!("pool {mode:?}{}", if normalize { " norm" } else { "" });
            checks.push(compare(
                &name,
                dtype,
                label,
                &d_out.read(st)?,
                &want,
                POOL_TOL,
            ));
        }
    }
    Ok(())
}
