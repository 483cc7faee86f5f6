//! The matrix products: a linear layer without bias, and the attention's batched products.

use super::slices::sum;

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
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
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
