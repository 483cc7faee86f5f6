//! The attention heads' layout: projections split into per-head matrices (with their bias
//! and a scale), and the context merged back.

/// `out[(b·heads + h)·seq + s, d] = (input[b·seq + s, h·head_dim + d] + bias[h·head_dim +
/// d]) · scale`: `[batch·seq, heads·head_dim]` to `[batch·heads, seq, head_dim]`.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub fn split_heads(
    input: &[f32],
    bias: &[f32],
    out: &mut [f32],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    scale: f32,
) {
    let width = heads * head_dim;
    let n = batch * seq * width;
    assert!(
        input.len() == n && out.len() == n && bias.len() == width,
        "split_heads: shapes"
    );
    for b in 0..batch {
        for s in 0..seq {
            let row = &input[(b * seq + s) * width..][..width];
            for h in 0..heads {
                let dst = &mut out[((b * heads + h) * seq + s) * head_dim..][..head_dim];
                let src = &row[h * head_dim..][..head_dim];
                let bh = &bias[h * head_dim..][..head_dim];
                for ((o, x), bv) in dst.iter_mut().zip(src).zip(bh) {
                    *o = (x + bv) * scale;
                }
            }
        }
    }
}

/// `out[b·seq + s, h·head_dim + d] = ctx[(b·heads + h)·seq + s, d]`.
pub fn merge_heads(
    ctx: &[f32],
    out: &mut [f32],
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
) {
    let width = heads * head_dim;
    let n = batch * seq * width;
    assert!(ctx.len() == n && out.len() == n, "merge_heads: shapes");
    for b in 0..batch {
        for s in 0..seq {
            for h in 0..heads {
                let src = &ctx[((b * heads + h) * seq + s) * head_dim..][..head_dim];
                out[(b * seq + s) * width + h * head_dim..][..head_dim].copy_from_slice(src);
            }
        }
    }
}
