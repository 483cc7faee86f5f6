//! The host side of a gemv case: its inputs, the f64 CPU reference, and the verdict on the
//! device's y against it.

use half::{bf16, f16};
use modelshare_kernels::WeightDtype;
use modelshare_kernels::reference::{self, splitmix64};

use crate::gemv_cases::GemvCase;
use crate::host_data::{par_bytes, par_fill, par_rows, unit};

/// Per element, |y − ref| ≤ TOLERANCE_EPS · ε(f32) · √cols · Σ|w·x|: f32 accumulation error
/// grows like √cols relative to the sum of the magnitudes (a norm-relative test is
/// ill-conditioned for a single long row whose terms nearly cancel). A dropped element of a
/// 4097-column row (≈2.4e-4 of Σ|w·x|) is ~4× over this bound.
pub const TOLERANCE_EPS: f64 = 8.0;

/// Elements past the end of y, poisoned with a sentinel that must survive.
pub const Y_GUARD: usize = 64;
pub const GUARD_BITS: u32 = 0x7fc0_dead;

/// The host side of one gemv case: x, W as uploaded, the reference product and each row's
/// error scale.
pub struct HostGemv {
    pub x: Vec<f32>,
    pub w_bytes: Vec<u8>,
    pub reference: Vec<f32>,
    pub scale: Vec<f32>,
}

/// x and W for `case` (random from `seed`), W's bytes, and the reference computed from the
/// same values.
pub fn host_gemv(case: &GemvCase, seed: u64, threads: usize) -> HostGemv {
    let (rows, cols) = (case.rows, case.cols);
    let n = rows * cols;
    // An unrelated stream for x: W's rows must not be shifted copies of x.
    let x = par_fill(cols, splitmix64(seed ^ 0x5555), threads, unit);
    // W uploaded as bytes, and the reference computed from the same values.
    // Σ_j |w_ij · x_j| per row: the scale of row i's rounding error.
    let abs_sums = |wf: &(dyn Fn(usize) -> f32 + Sync)| -> Vec<f32> {
        par_rows(rows, threads, |r| {
            r.map(|i| {
                (0..cols)
                    .map(|j| f64::from(wf(i * cols + j)).abs() * f64::from(x[j]).abs())
                    .sum::<f64>() as f32
            })
            .collect()
        })
    };
    let (w_bytes, reference, scale): (Vec<u8>, Vec<f32>, Vec<f32>) = match case.dtype {
        WeightDtype::F32 => {
            let w = par_fill(n, seed, threads, unit);
            let y = par_rows(rows, threads, |r| {
                reference::gemv_f32(&w[r.start * cols..r.end * cols], &x, r.len(), cols)
            });
            let scale = abs_sums(&|k| w[k]);
            (par_bytes(&w, threads, |v| v.to_le_bytes()), y, scale)
        }
        WeightDtype::F16 => {
            let w = par_fill(n, seed, threads, |r| f16::from_f32(unit(r)));
            let y = par_rows(rows, threads, |r| {
                reference::gemv_f16(&w[r.start * cols..r.end * cols], &x, r.len(), cols)
            });
            let scale = abs_sums(&|k| w[k].to_f32());
            (par_bytes(&w, threads, |v| v.to_le_bytes()), y, scale)
        }
        WeightDtype::BF16 => {
            let w = par_fill(n, seed, threads, |r| bf16::from_f32(unit(r)));
            let y = par_rows(rows, threads, |r| {
                reference::gemv_bf16(&w[r.start * cols..r.end * cols], &x, r.len(), cols)
            });
            let scale = abs_sums(&|k| w[k].to_f32());
            (par_bytes(&w, threads, |v| v.to_le_bytes()), y, scale)
        }
    };
    HostGemv {
        x,
        w_bytes,
        reference,
        scale,
    }
}

/// How the device's `y` (rows values, then the guard) compares with `reference`: (unwritten
/// values, guard values hit, relative error, whether it passes).
pub fn verdict(
    y: &[f32],
    rows: usize,
    cols: usize,
    reference: &[f32],
    scale: &[f32],
) -> (usize, usize, f64, bool) {
    let unwritten = y[..rows].iter().filter(|v| v.is_nan()).count();
    let guard_hit = y[rows..]
        .iter()
        .filter(|v| v.to_bits() != GUARD_BITS)
        .count();
    let rel_err = rel_err(&y[..rows], reference);
    let bound = TOLERANCE_EPS * f64::from(f32::EPSILON) * (cols as f64).sqrt();
    let within = y[..rows]
        .iter()
        .zip(reference)
        .zip(scale)
        .all(|((a, b), s)| {
            (f64::from(*a) - f64::from(*b)).abs() <= bound * f64::from(*s).max(f64::MIN_POSITIVE)
        });
    let ok = unwritten == 0 && guard_hit == 0 && rel_err.is_finite() && within;
    (unwritten, guard_hit, rel_err, ok)
}

pub fn rel_err(y: &[f32], reference: &[f32]) -> f64 {
    if y.len() != reference.len() {
        return f64::INFINITY;
    }
    let mut diff = 0.0f64;
    let mut norm = 0.0f64;
    for (a, b) in y.iter().zip(reference) {
        let (a, b) = (f64::from(*a), f64::from(*b));
        diff += (a - b) * (a - b);
        norm += b * b;
    }
    if norm == 0.0 {
        diff.sqrt()
    } else {
        (diff / norm).sqrt()
    }
}
