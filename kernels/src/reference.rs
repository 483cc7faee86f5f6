//! CPU references of the device kernels: `gemv` in three weight types, the ms64
//! checksum (which is also what the server's loader puts in the manifest), and the encoder's
//! pieces (in [`encoder`](mod@encoder), re-exported here).
//!
//! The gemv references accumulate in f64 and round once to f32; they are the yardstick
//! the GPU results are measured against, not fast paths. [`ms64`] and [`ms64_parallel`]
//! are fast: they run over every byte a server loads.

use half::{bf16, f16};

pub mod encoder;

pub use encoder::{
    batched_matmul, bias_gelu, bias_residual_layer_norm, bias_residual_layer_norm_in_place,
    embed_layer_norm, gelu, layer_norm_row, layer_norm_rows, linear, masked_softmax, merge_heads,
    pool, split_heads,
};

pub use modelshare_device::checksum::{
    MS64_INDEX_MUL, MS64_LEN_MUL, ms64, ms64_parallel, splitmix64,
};

/// `y = W·x` for a row-major `w` of `rows × cols` f32, accumulated in f64.
///
/// # Panics
///
/// If `w` holds fewer than `rows * cols` elements or `x` fewer than `cols` (a reference for
/// tests: the device launchers return errors instead).
pub fn gemv_f32(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    gemv_by(w, x, rows, cols, |v| f64::from(*v))
}

/// `y = W·x` for a row-major `w` of `rows × cols` f16, accumulated in f64.
///
/// # Panics
///
/// As [`gemv_f32`].
pub fn gemv_f16(w: &[f16], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    gemv_by(w, x, rows, cols, |v| v.to_f64())
}

/// `y = W·x` for a row-major `w` of `rows × cols` bf16, accumulated in f64.
///
/// # Panics
///
/// As [`gemv_f32`].
pub fn gemv_bf16(w: &[bf16], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    gemv_by(w, x, rows, cols, |v| v.to_f64())
}

fn gemv_by<T>(
    w: &[T],
    x: &[f32],
    rows: usize,
    cols: usize,
    to_f64: impl Fn(&T) -> f64,
) -> Vec<f32> {
    let elems = rows.checked_mul(cols);
    assert!(
        elems.is_some_and(|n| n <= w.len()) && x.len() >= cols,
        "gemv reference: {rows}x{cols} needs {elems:?} weights and {cols} inputs, got {} and {}",
        w.len(),
        x.len()
    );
    if cols == 0 {
        return vec![0.0; rows];
    }
    w.chunks_exact(cols)
        .take(rows)
        .map(|row| {
            row.iter()
                .zip(x)
                .map(|(wv, xv)| to_f64(wv) * f64::from(*xv))
                .sum::<f64>() as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator for test inputs (never all zeros).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(1);
            splitmix64(self.0.wrapping_mul(0x2545_F491_4F6C_DD1D))
        }
        fn unit(&mut self) -> f32 {
            // Uniform in [-1, 1).
            ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
    }

    fn naive_gemv(w: &[f64], x: &[f64], rows: usize, cols: usize) -> Vec<f64> {
        let mut y = vec![0.0; rows];
        for (r, out) in y.iter_mut().enumerate() {
            for c in 0..cols {
                *out += w[r * cols + c] * x[c];
            }
        }
        y
    }

    fn rel_err(y: &[f32], reference: &[f64]) -> f64 {
        let diff: f64 = y
            .iter()
            .zip(reference)
            .map(|(a, b)| (f64::from(*a) - b).powi(2))
            .sum();
        let norm: f64 = reference.iter().map(|b| b * b).sum();
        (diff / norm).sqrt()
    }

    /// A gemv reference indexes rows or columns wrongly.
    #[test]
    fn gemv_references_match_naive_loop() {
        let mut rng = Rng(23);
        for (rows, cols) in [(1, 1), (1, 17), (3, 5), (7, 64), (33, 129), (64, 4097)] {
            let w: Vec<f32> = (0..rows * cols).map(|_| rng.unit()).collect();
            let x: Vec<f32> = (0..cols).map(|_| rng.unit()).collect();
            let x64: Vec<f64> = x.iter().map(|v| f64::from(*v)).collect();

            let w64: Vec<f64> = w.iter().map(|v| f64::from(*v)).collect();
            let reference = naive_gemv(&w64, &x64, rows, cols);
            assert!(rel_err(&gemv_f32(&w, &x, rows, cols), &reference) < 1e-6);

            let wh: Vec<f16> = w.iter().map(|v| f16::from_f32(*v)).collect();
            let wh64: Vec<f64> = wh.iter().map(|v| v.to_f64()).collect();
            let reference = naive_gemv(&wh64, &x64, rows, cols);
            assert!(rel_err(&gemv_f16(&wh, &x, rows, cols), &reference) < 1e-6);

            let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
            let wb64: Vec<f64> = wb.iter().map(|v| v.to_f64()).collect();
            let reference = naive_gemv(&wb64, &x64, rows, cols);
            assert!(rel_err(&gemv_bf16(&wb, &x, rows, cols), &reference) < 1e-6);
        }
    }

    /// The hand-computed 2x3 product is wrong (rows and columns swapped, say).
    #[test]
    fn gemv_known_small_case() {
        let w = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let x = [1.0f32, 0.5, -1.0];
        assert_eq!(gemv_f32(&w, &x, 2, 3), vec![-1.0, 0.5]);
        let wh: Vec<f16> = w.iter().map(|v| f16::from_f32(*v)).collect();
        assert_eq!(gemv_f16(&wh, &x, 2, 3), vec![-1.0, 0.5]);
        let wb: Vec<bf16> = w.iter().map(|v| bf16::from_f32(*v)).collect();
        assert_eq!(gemv_bf16(&wb, &x, 2, 3), vec![-1.0, 0.5]);
    }

    /// Zero columns give zero rows' worth of zeros, not a panic in `chunks_exact(0)`.
    #[test]
    fn gemv_with_zero_cols_is_zeros() {
        assert_eq!(gemv_f32(&[], &[], 3, 0), vec![0.0; 3]);
        assert!(gemv_f32(&[], &[], 0, 0).is_empty());
    }
}
