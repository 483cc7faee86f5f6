//! Tests of the references on small known cases.

use super::matmul::dot;
use super::*;
use crate::encoder::Pooling;

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
