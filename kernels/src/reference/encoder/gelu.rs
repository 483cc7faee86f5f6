//! The exact GELU, and bias + GELU after the feed-forward's up projection.

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
