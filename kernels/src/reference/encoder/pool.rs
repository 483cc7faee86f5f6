//! Pooling: each sequence's token vectors reduced to one, optionally L2-normalized.

use super::slices::{add, clamp_len};
use crate::encoder::Pooling;

/// `out [batch, hidden]` from `x [batch, seq, hidden]` over each sequence's tokens
/// `t < lengths[b]` (clamped to `0..=seq`): see [`Pooling`]; then, if `normalize`, each row
/// divided by `max(‖row‖₂, 1e-12)`. Length 0 gives zeros.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub fn pool(
    x: &[f32],
    lengths: &[i32],
    out: &mut [f32],
    batch: usize,
    seq: usize,
    hidden: usize,
    mode: Pooling,
    normalize: bool,
) {
    assert!(
        x.len() == batch * seq * hidden && out.len() == batch * hidden && lengths.len() >= batch,
        "pool: shapes"
    );
    if hidden == 0 {
        return;
    }
    for (b, o) in out.chunks_exact_mut(hidden).enumerate() {
        let len = clamp_len(lengths[b], seq);
        let tokens = x[b * seq * hidden..][..len * hidden].chunks_exact(hidden);
        o.fill(0.0);
        if len == 0 {
            continue;
        }
        match mode {
            Pooling::Cls => o.copy_from_slice(&x[b * seq * hidden..][..hidden]),
            Pooling::Max => {
                o.fill(f32::NEG_INFINITY);
                for t in tokens {
                    for (m, v) in o.iter_mut().zip(t) {
                        *m = m.max(*v);
                    }
                }
            }
            Pooling::Mean | Pooling::MeanSqrtLen => {
                for t in tokens {
                    add(o, t);
                }
                let div = if mode == Pooling::Mean {
                    len as f32
                } else {
                    (len as f32).sqrt()
                };
                for v in o.iter_mut() {
                    *v /= div;
                }
            }
        }
        if normalize {
            let norm = o.iter().map(|v| v * v).sum::<f32>().sqrt();
            let inv = 1.0 / norm.max(1e-12);
            for v in o.iter_mut() {
                *v *= inv;
            }
        }
    }
}
