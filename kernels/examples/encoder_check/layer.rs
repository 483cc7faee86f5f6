//! One encoder layer's data: its weights on the host, and every buffer it reads or writes on
//! the device.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use modelshare_kernels::WeightDtype;

use crate::buf::{Buf, round};
use crate::env::Res;
use crate::rng::Rng;
use crate::shape::Shape;

/// One encoder layer's weights, rounded to the dtype.
pub struct LayerWeights {
    pub w: [Vec<f32>; 6],
    pub b: [Vec<f32>; 6],
    pub ln: [Vec<f32>; 4],
}

/// The weights of a layer: Wq, Wk, Wv, Wo [h, h], W1 [ffn, h], W2 [h, ffn], scaled by
/// 1/√fan_in; biases; LayerNorm gammas (around 1) and betas.
pub fn layer_weights(dtype: WeightDtype, h: usize, ffn: usize, rng: &mut Rng) -> LayerWeights {
    let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (ffn as f32).sqrt());
    let mut w = |n, s| rng.values(dtype, n, s);
    let weights = [
        w(h * h, sh),
        w(h * h, sh),
        w(h * h, sh),
        w(h * h, sh),
        w(ffn * h, sh),
        w(h * ffn, sf),
    ];
    let biases = [
        w(h, 0.1),
        w(h, 0.1),
        w(h, 0.1),
        w(h, 0.1),
        w(ffn, 0.1),
        w(h, 0.1),
    ];
    let g1: Vec<f32> = w(h, 0.2).iter().map(|v| round(dtype, 1.0 + v)).collect();
    let g2: Vec<f32> = w(h, 0.2).iter().map(|v| round(dtype, 1.0 + v)).collect();
    let ln = [g1, w(h, 0.1), g2, w(h, 0.1)];
    LayerWeights {
        w: weights,
        b: biases,
        ln,
    }
}

/// Device buffers of one layer.
pub struct LayerBufs {
    pub x: Buf,
    pub w: Vec<Buf>,
    pub b: Vec<Buf>,
    pub ln: Vec<Buf>,
    pub qkv: Vec<Buf>,
    pub heads: Vec<Buf>,
    pub scores: Buf,
    pub ctx: Buf,
    pub merged: Buf,
    pub attn: Buf,
    pub f: Buf,
    pub o: Buf,
    pub h2: Buf,
    pub pooled: Buf,
    pub lengths: Buf,
}

pub fn layer_bufs(
    st: &Arc<CudaStream>,
    dtype: WeightDtype,
    s: &Shape,
    x: &[f32],
    lw: &LayerWeights,
) -> Res<LayerBufs> {
    let (t, h) = (s.tokens(), s.hidden);
    let off = s.offset;
    let out = |n| Buf::output(st, dtype, n, off);
    Ok(LayerBufs {
        x: Buf::input(st, dtype, x, off)?,
        w: lw
            .w
            .iter()
            .map(|v| Buf::input(st, dtype, v, off))
            .collect::<Res<_>>()?,
        b: lw
            .b
            .iter()
            .map(|v| Buf::input(st, dtype, v, off))
            .collect::<Res<_>>()?,
        ln: lw
            .ln
            .iter()
            .map(|v| Buf::input(st, dtype, v, off))
            .collect::<Res<_>>()?,
        qkv: (0..3).map(|_| out(t * h)).collect::<Res<_>>()?,
        heads: (0..3).map(|_| out(t * h)).collect::<Res<_>>()?,
        scores: out(s.batch * s.heads * s.seq * s.seq)?,
        ctx: out(t * h)?,
        merged: out(t * h)?,
        attn: out(t * h)?,
        f: out(t * 4 * h)?,
        o: out(t * h)?,
        h2: out(t * h)?,
        pooled: Buf::output(st, WeightDtype::F32, s.batch * h, 0)?,
        lengths: Buf::ints(st, &s.lengths)?,
    })
}
