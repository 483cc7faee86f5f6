//! LayerNorm: of one row, of every row, and after a linear layer's bias and the residual.

use super::slices::sum;

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
