//! CPU references of the encoder kernels (`crate::encoder`) and of the cuBLAS products
//! (`crate::blas`), on row-major f32 slices.
//!
//! They double as the building blocks of a CPU encoder forward pass, so they are written to
//! be reasonably fast: f32 math (as the kernels), no allocation per row, contiguous inner
//! loops. They are not bit-equal to the GPU (its reductions add in another order; it rounds
//! f16/bf16 outputs), which the GPU checks allow for.
//!
//! # Panics
//!
//! Every function panics if a slice is shorter than the shape it is given says (these are
//! references and CPU building blocks: the device launchers return errors instead).

use crate::encoder::Pooling;

/// `v = (v - mean) / sqrt(var + eps) * gamma + beta` over one row (biased variance, as
/// PyTorch's LayerNorm); the row's length is `gamma.len()`.
pub fn layer_norm_row(v: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let n = gamma.len();
    assert!(
        v.len() == n && beta.len() == n,
        "layer norm: row, gamma, beta lengths differ"
    );
    if n == 0 {
        return;
    }
    let mean = sum(v) / n as f32;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f32>() / n as f32;
    let rstd = 1.0 / (var + eps).sqrt();
    for ((x, g), b) in v.iter_mut().zip(gamma).zip(beta) {
        *x = (*x - mean) * rstd * g + b;
    }
}

/// [`layer_norm_row`] on each row of `x` (rows of `gamma.len()` elements), in place.
pub fn layer_norm_rows(x: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let cols = gamma.len();
    if cols == 0 {
        return;
    }
    assert!(
        x.len().is_multiple_of(cols),
        "layer norm: {} is not whole rows of {cols}",
        x.len()
    );
    for row in x.chunks_exact_mut(cols) {
        layer_norm_row(row, gamma, beta, eps);
    }
}

/// `out[t, :] = LayerNorm(word[ids[t]] + position[t % seq_len + position_offset] +
/// token_type[type_ids[t]]) * gamma + beta`, with `hidden = gamma.len()`, one row of `out`
/// per id. An id (or type id) outside its table contributes zeros; `type_ids: None` means
/// type 0 for every token.
///
/// # Panics
///
/// Also if `seq_len` is 0 or a position is past the position table.
#[allow(clippy::too_many_arguments)] // The embedding's own tables.
pub fn embed_layer_norm(
    out: &mut [f32],
    ids: &[i32],
    type_ids: Option<&[i32]>,
    word: &[f32],
    position: &[f32],
    token_type: &[f32],
    gamma: &[f32],
    beta: &[f32],
    seq_len: usize,
    position_offset: usize,
    eps: f32,
) {
    let hidden = gamma.len();
    assert!(
        seq_len > 0 && hidden > 0,
        "embeddings: seq_len and hidden must be positive"
    );
    assert_eq!(
        out.len(),
        ids.len() * hidden,
        "embeddings: out is not [tokens, hidden]"
    );
    assert!(
        type_ids.is_none_or(|t| t.len() == ids.len()),
        "embeddings: type_ids length"
    );
    for (t, (o, id)) in out.chunks_exact_mut(hidden).zip(ids).enumerate() {
        let p = t % seq_len + position_offset;
        let prow = &position[p * hidden..(p + 1) * hidden];
        o.copy_from_slice(prow);
        if let Some(w) = table_row(word, *id, hidden) {
            add(o, w);
        }
        let tt = type_ids.map_or(0, |types| types[t]);
        if let Some(w) = table_row(token_type, tt, hidden) {
            add(o, w);
        }
        layer_norm_row(o, gamma, beta, eps);
    }
}

/// Row `i` of a `[_, hidden]` table, or `None` when `i` is outside it.
fn table_row(table: &[f32], i: i32, hidden: usize) -> Option<&[f32]> {
    let i = usize::try_from(i).ok()?;
    table.get(i * hidden..(i + 1) * hidden)
}

/// Exact GELU, `0.5·v·(1 + erf(v/√2))` (BERT's `"gelu"`).
pub fn gelu(v: f32) -> f32 {
    0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2))
}

/// `x[r, c] = gelu(x[r, c] + bias[c])` in place, rows of `bias.len()` elements.
pub fn bias_gelu(x: &mut [f32], bias: &[f32]) {
    if bias.is_empty() {
        return;
    }
    assert!(
        x.len().is_multiple_of(bias.len()),
        "bias_gelu: x is not whole rows"
    );
    for row in x.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v = gelu(*v + b);
        }
    }
}

/// `out[r, :] = LayerNorm(x[r, :] + bias + residual[r, :]) * gamma + beta`, rows of
/// `gamma.len()` elements.
pub fn bias_residual_layer_norm(
    out: &mut [f32],
    x: &[f32],
    bias: &[f32],
    residual: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) {
    assert!(
        out.len() == x.len(),
        "residual layer norm: out and x lengths differ"
    );
    out.copy_from_slice(residual);
    bias_residual_layer_norm_in_place(out, x, bias, gamma, beta, eps);
}

/// [`bias_residual_layer_norm`] with the result written over the residual (the usual
/// `h = LayerNorm(h + attention(h))`).
pub fn bias_residual_layer_norm_in_place(
    residual: &mut [f32],
    x: &[f32],
    bias: &[f32],
    gamma: &[f32],
    beta: &[f32],
    eps: f32,
) {
    let cols = gamma.len();
    assert!(
        bias.len() == cols
            && x.len() == residual.len()
            && (cols == 0 || x.len().is_multiple_of(cols)),
        "residual layer norm: shapes differ"
    );
    if cols == 0 {
        return;
    }
    for (r, xr) in residual.chunks_exact_mut(cols).zip(x.chunks_exact(cols)) {
        for ((o, xv), b) in r.iter_mut().zip(xr).zip(bias) {
            *o += xv + b;
        }
        layer_norm_row(r, gamma, beta, eps);
    }
}

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

/// In place on `scores [batch·heads, seq, seq]`: each row's softmax over the keys
/// `j < lengths[b]` (clamped to `0..=seq`), the other keys set to 0; a row of length 0
/// becomes zeros. Max-subtracted, f32.
pub fn masked_softmax(scores: &mut [f32], lengths: &[i32], batch: usize, heads: usize, seq: usize) {
    assert!(
        scores.len() == batch * heads * seq * seq && lengths.len() >= batch,
        "masked_softmax: shapes"
    );
    if seq == 0 {
        return;
    }
    for (r, row) in scores.chunks_exact_mut(seq).enumerate() {
        let len = clamp_len(lengths[r / (heads * seq)], seq);
        let (keep, masked) = row.split_at_mut(len);
        masked.fill(0.0);
        if keep.is_empty() {
            continue;
        }
        let m = keep.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let mut s = 0.0;
        for v in keep.iter_mut() {
            *v = (*v - m).exp();
            s += *v;
        }
        let inv = 1.0 / s;
        for v in keep.iter_mut() {
            *v *= inv;
        }
    }
}

fn clamp_len(len: i32, seq: usize) -> usize {
    usize::try_from(len).unwrap_or(0).min(seq)
}

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

/// `y [rows, out] = x [rows, in] · w [out, in]ᵀ` (a linear layer without bias, as
/// [`Blas::linear`](crate::blas::Blas::linear)), with `in = x.len() / rows`.
pub fn linear(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    rows: usize,
    in_features: usize,
    out_features: usize,
) {
    assert!(
        x.len() == rows * in_features
            && w.len() == out_features * in_features
            && y.len() == rows * out_features,
        "linear: shapes"
    );
    if in_features == 0 {
        y.fill(0.0);
        return;
    }
    for (xr, yr) in x
        .chunks_exact(in_features)
        .zip(y.chunks_exact_mut(out_features.max(1)))
    {
        for (o, wr) in yr.iter_mut().zip(w.chunks_exact(in_features)) {
            *o = dot(xr, wr);
        }
    }
}

/// For `i` in `0..batch`, `c_i [m, n] = alpha · a_i [m, k] · op(b_i)` with the matrices
/// packed one after another; `b_i` is `[n, k]` used transposed when `b_transposed`, else
/// `[k, n]` (as [`Blas::batched_matmul`](crate::blas::Blas::batched_matmul) with packed
/// strides).
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub fn batched_matmul(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    batch: usize,
    b_transposed: bool,
    alpha: f32,
) {
    assert!(
        a.len() == batch * m * k && b.len() == batch * n * k && c.len() == batch * m * n,
        "batched_matmul: shapes"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        c.fill(0.0);
        return;
    }
    for ((ai, bi), ci) in a
        .chunks_exact(m * k)
        .zip(b.chunks_exact(n * k))
        .zip(c.chunks_exact_mut(m * n))
    {
        if b_transposed {
            for (ar, cr) in ai.chunks_exact(k).zip(ci.chunks_exact_mut(n)) {
                for (o, br) in cr.iter_mut().zip(bi.chunks_exact(k)) {
                    *o = alpha * dot(ar, br);
                }
            }
        } else {
            // Row r of C accumulates a[r, j] · B[j, :], rows of B read contiguously.
            for (ar, cr) in ai.chunks_exact(k).zip(ci.chunks_exact_mut(n)) {
                cr.fill(0.0);
                for (av, br) in ar.iter().zip(bi.chunks_exact(n)) {
                    for (o, bv) in cr.iter_mut().zip(br) {
                        *o += av * bv;
                    }
                }
                for o in cr.iter_mut() {
                    *o *= alpha;
                }
            }
        }
    }
}

/// `Σ a·b` in eight independent f32 lanes (so the compiler can vectorize it).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ac
        .remainder()
        .iter()
        .zip(bc.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ac.zip(bc) {
        for i in 0..8 {
            lanes[i] += x[i] * y[i];
        }
    }
    sum(&lanes) + tail
}

fn sum(v: &[f32]) -> f32 {
    v.iter().sum()
}

fn add(acc: &mut [f32], v: &[f32]) {
    for (a, b) in acc.iter_mut().zip(v) {
        *a += b;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: &[f32], b: &[f32], tol: f32) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() <= tol)
    }

    /// LayerNorm of a known row is wrong (variance biased the wrong way, gamma/beta unused).
    #[test]
    fn layer_norm_known_row() {
        let mut v = [1.0f32, 2.0, 3.0, 4.0];
        layer_norm_row(&mut v, &[1.0; 4], &[0.0; 4], 0.0);
        // mean 2.5, variance 1.25.
        assert!(
            close(
                &v,
                &[-1.341_640_8, -0.447_213_6, 0.447_213_6, 1.341_640_8],
                1e-6
            ),
            "{v:?}"
        );
        let mut rows = [1.0f32, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0];
        layer_norm_rows(&mut rows, &[2.0; 4], &[1.0; 4], 1e-5);
        assert!(
            close(&rows[..4], &[-1.683_27, 0.105_55, 1.894_43, 3.683_27], 1e-4),
            "{rows:?}"
        );
        // A constant row: zero variance, eps keeps it finite, output is beta.
        assert!(close(&rows[4..], &[1.0; 4], 1e-6), "{rows:?}");
    }

    /// GELU is the tanh approximation, or not GELU at all.
    #[test]
    fn gelu_known_values() {
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu(-1.0) + 0.158_655_26).abs() < 1e-6);
        assert_eq!(gelu(0.0), 0.0);
        assert!((gelu(3.0) - 2.995_950_5).abs() < 1e-5);
        let mut x = [0.0f32, 1.0, -1.0, 2.0];
        bias_gelu(&mut x, &[1.0, 0.0]);
        assert!(close(
            &x,
            &[gelu(1.0), gelu(1.0), gelu(0.0), gelu(2.0)],
            0.0
        ));
    }

    /// Out-of-range ids read past a table, positions restart wrongly, or type 0 is not the
    /// default.
    #[test]
    fn embeddings_known_case() {
        // hidden 2, vocab 2, 3 positions, 2 types; gamma 1, beta 0, so each output is
        // the normalized sum: ±1 for any two distinct values.
        let word = [1.0, 0.0, 0.0, 3.0];
        let position = [0.0, 0.5, 0.5, 0.0, 2.0, 2.0];
        let token_type = [0.0, 0.0, 10.0, 0.0];
        let mut out = [0.0f32; 8];
        let ids = [0, 1, 7, -1];
        embed_layer_norm(
            &mut out,
            &ids,
            None,
            &word,
            &position,
            &token_type,
            &[1.0, 1.0],
            &[0.0, 0.0],
            2,
            1,
            1e-12,
        );
        // t0: word0 + pos1 = [1.5, 0]; t1: word1 + pos2 = [2, 5]; t2 (id 7): pos1 only =
        // [0.5, 0]; t3 (id -1): pos2 only = [2, 2], a constant row, so beta.
        assert!(
            close(&out, &[1.0, -1.0, -1.0, 1.0, 1.0, -1.0, 0.0, 0.0], 1e-6),
            "{out:?}"
        );
        let mut out2 = [0.0f32; 2];
        embed_layer_norm(
            &mut out2,
            &[1],
            Some(&[1]),
            &word,
            &position,
            &token_type,
            &[1.0, 1.0],
            &[0.0, 0.0],
            1,
            0,
            1e-12,
        );
        // word1 + pos0 + type1 = [0, 3] + [0, 0.5] + [10, 0] = [10, 3.5].
        assert!(close(&out2, &[1.0, -1.0], 1e-6), "{out2:?}");
    }

    /// The residual norm forgets the bias or the residual, or in place differs.
    #[test]
    fn residual_norm_matches_in_place() {
        let x = [1.0f32, 0.0, 2.0, 0.0];
        let bias = [0.0f32, 1.0];
        let residual = [0.0f32, 0.0, 0.0, 5.0];
        let mut out = [0.0f32; 4];
        bias_residual_layer_norm(
            &mut out,
            &x,
            &bias,
            &residual,
            &[1.0, 1.0],
            &[0.0, 0.5],
            1e-6,
        );
        // Row 0: [1, 1], constant, so beta.
        assert!(close(&out[..2], &[0.0, 0.5], 1e-6), "{out:?}");
        // Row 1: [2, 6] -> [-1, 1] + beta.
        assert!(close(&out[2..], &[-1.0, 1.5], 1e-5), "{out:?}");
        let mut r = residual;
        bias_residual_layer_norm_in_place(&mut r, &x, &bias, &[1.0, 1.0], &[0.0, 0.5], 1e-6);
        assert_eq!(r, out);
    }

    /// Masked keys keep probability, the max subtraction is missing, or length 0 divides
    /// by zero.
    #[test]
    fn softmax_masks_keys() {
        // batch 2, heads 1, seq 3; lengths 2 and 0.
        let mut s = [
            0.0f32,
            3.0f32.ln(),
            5.0,
            1.0,
            1.0,
            9.0,
            0.0,
            0.0,
            0.0,
            1e4,
            1e4,
            1e4,
            1.0,
            2.0,
            3.0,
            4.0,
            5.0,
            6.0,
        ];
        masked_softmax(&mut s, &[2, 0], 2, 1, 3);
        assert!(close(&s[..3], &[0.25, 0.75, 0.0], 1e-6), "{s:?}");
        assert!(close(&s[3..6], &[0.5, 0.5, 0.0], 1e-6), "{s:?}");
        assert!(close(&s[9..], &[0.0; 9], 0.0), "{s:?}");
        // Large values: no overflow, thanks to the max subtraction; length past seq clamps.
        let mut big = [1e4f32; 9];
        masked_softmax(&mut big, &[7], 1, 1, 3);
        assert!(close(&big, &[1.0 / 3.0; 9], 1e-6), "{big:?}");
    }

    /// A pooling mode averages, picks or normalizes the wrong tokens.
    #[test]
    fn pooling_modes() {
        // batch 2, seq 3, hidden 2; lengths 2 and 0.
        let x = [
            1.0f32, 2.0, 3.0, 4.0, 100.0, 100.0, 7.0, 7.0, 7.0, 7.0, 7.0, 7.0,
        ];
        let run = |mode, normalize| {
            let mut out = [9.0f32; 4];
            pool(&x, &[2, 0], &mut out, 2, 3, 2, mode, normalize);
            out
        };
        let s2 = 2.0f32.sqrt();
        assert_eq!(run(Pooling::Mean, false), [2.0, 3.0, 0.0, 0.0]);
        assert_eq!(run(Pooling::Cls, false), [1.0, 2.0, 0.0, 0.0]);
        assert_eq!(run(Pooling::Max, false), [3.0, 4.0, 0.0, 0.0]);
        assert!(close(
            &run(Pooling::MeanSqrtLen, false),
            &[4.0 / s2, 6.0 / s2, 0.0, 0.0],
            1e-6
        ));
        let n = 13.0f32.sqrt();
        assert!(close(
            &run(Pooling::Mean, true),
            &[2.0 / n, 3.0 / n, 0.0, 0.0],
            1e-6
        ));
        assert!(close(
            &run(Pooling::MeanSqrtLen, true),
            &[2.0 / n, 3.0 / n, 0.0, 0.0],
            1e-6
        ));
    }

    /// The head layout transposes the wrong axes, or the bias/scale is misapplied.
    #[test]
    fn heads_round_trip() {
        let (batch, seq, heads, head_dim) = (2, 3, 2, 2);
        let n = batch * seq * heads * head_dim;
        let input: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let mut split = vec![0.0; n];
        split_heads(
            &input, &[0.0; 4], &mut split, batch, seq, heads, head_dim, 1.0,
        );
        // Batch 0, head 1, seq 2: input row 2, columns 2..4 = [10, 11].
        assert_eq!(&split[(seq + 2) * head_dim..][..2], &[10.0, 11.0]);
        let mut merged = vec![0.0; n];
        merge_heads(&split, &mut merged, batch, seq, heads, head_dim);
        assert_eq!(merged, input);
        split_heads(
            &input,
            &[1.0, 0.0, 0.0, 0.0],
            &mut split,
            batch,
            seq,
            heads,
            head_dim,
            0.5,
        );
        assert_eq!(&split[..4], &[0.5, 0.5, 2.5, 2.5]);
    }

    /// The matmul references index or transpose wrongly.
    #[test]
    fn matmuls_known_case() {
        // x [2, 3], w [2, 3]: y = x·wᵀ.
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let w = [1.0f32, 0.0, -1.0, 0.5, 0.5, 0.5];
        let mut y = [0.0f32; 4];
        linear(&x, &w, &mut y, 2, 3, 2);
        assert_eq!(y, [-2.0, 3.0, -2.0, 7.5]);
        // Same through batched_matmul, transposed and not (wᵀ laid out [3, 2]).
        let mut c = [0.0f32; 4];
        batched_matmul(&x, &w, &mut c, 2, 2, 3, 1, true, 2.0);
        assert_eq!(c, [-4.0, 6.0, -4.0, 15.0]);
        let wt = [1.0f32, 0.5, 0.0, 0.5, -1.0, 0.5];
        batched_matmul(&x, &wt, &mut c, 2, 2, 3, 1, false, 1.0);
        assert_eq!(c, y);
        // A long dot product exercises the eight lanes and the tail.
        let a: Vec<f32> = (0..37).map(|i| i as f32).collect();
        assert_eq!(dot(&a, &[1.0; 37]), 666.0);
    }
}
