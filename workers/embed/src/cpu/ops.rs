//! The element-wise parts of the encoder on the host, on f32 rows: LayerNorm, GELU, masked
//! softmax and pooling. Matrix products are `modelshare_kernels::host_gemm`'s.

use crate::spec::Pooling;

/// `row = LayerNorm(row) · gamma + beta`, in place.
pub fn layer_norm(row: &mut [f32], gamma: &[f32], beta: &[f32], eps: f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, g), b) in row.iter_mut().zip(gamma).zip(beta) {
        *v = (*v - mean) * inv * g + b;
    }
}

/// `residual = LayerNorm(x + residual) · gamma + beta`, one row.
pub fn add_norm(residual: &mut [f32], x: &[f32], gamma: &[f32], beta: &[f32], eps: f32) {
    for (r, v) in residual.iter_mut().zip(x) {
        *r += v;
    }
    layer_norm(residual, gamma, beta, eps);
}

/// GELU, the exact erf form BERT's `gelu` is.
pub fn gelu(v: f32) -> f32 {
    0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2))
}

/// Softmax of one row, in place (max-subtracted).
pub fn softmax(row: &mut [f32]) {
    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in row.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// The sentence vector of one sequence's token vectors `x` (`[len, hidden]`, `len ≥ 1`).
pub fn pool(x: &[f32], hidden: usize, mode: Pooling, normalize: bool) -> Vec<f32> {
    let len = x.len() / hidden;
    let rows = x.chunks_exact(hidden);
    let mut out = match mode {
        Pooling::Cls => x[..hidden].to_vec(),
        Pooling::Max => rows.fold(vec![f32::NEG_INFINITY; hidden], |mut m, r| {
            m.iter_mut().zip(r).for_each(|(m, v)| *m = m.max(*v));
            m
        }),
        Pooling::Mean | Pooling::MeanSqrtLen => {
            let mut sum = vec![0.0f32; hidden];
            for r in rows {
                sum.iter_mut().zip(r).for_each(|(s, v)| *s += v);
            }
            let div = if mode == Pooling::Mean {
                len as f32
            } else {
                (len as f32).sqrt()
            };
            sum.iter_mut().for_each(|s| *s /= div);
            sum
        }
    };
    if normalize {
        let norm = out.iter().map(|v| v * v).sum::<f32>().sqrt().max(1e-12);
        out.iter_mut().for_each(|v| *v /= norm);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The operations would drift from their definitions.
    #[test]
    fn ops_match_hand_computed_values() {
        assert!((gelu(1.0) - 0.841_344_7).abs() < 1e-6);
        assert!((gelu(-1.0) + 0.158_655_3).abs() < 1e-6);
        assert_eq!(gelu(0.0), 0.0);
        let mut row = [1.0, 2.0, 3.0, 4.0];
        layer_norm(&mut row, &[1.0; 4], &[0.5; 4], 0.0);
        let s = 1.0 / 1.25f32.sqrt();
        for (v, want) in row.iter().zip([-1.5 * s, -0.5 * s, 0.5 * s, 1.5 * s]) {
            assert!((v - (want + 0.5)).abs() < 1e-6, "{v}");
        }
        let mut p = [0.0, 0.0, f32::ln(2.0)];
        softmax(&mut p);
        assert!((p[0] - 0.25).abs() < 1e-6 && (p[2] - 0.5).abs() < 1e-6);
        let x = [1.0, -2.0, 3.0, 4.0]; // two tokens of width 2
        assert_eq!(pool(&x, 2, Pooling::Mean, false), [2.0, 1.0]);
        assert_eq!(pool(&x, 2, Pooling::Cls, false), [1.0, -2.0]);
        assert_eq!(pool(&x, 2, Pooling::Max, false), [3.0, 4.0]);
        let r = pool(&x, 2, Pooling::MeanSqrtLen, false);
        assert!((r[0] - 4.0 / 2f32.sqrt()).abs() < 1e-6);
        let n = pool(&x, 2, Pooling::Max, true);
        assert!((n[0] - 0.6).abs() < 1e-6 && (n[1] - 0.8).abs() < 1e-6);
    }
}
