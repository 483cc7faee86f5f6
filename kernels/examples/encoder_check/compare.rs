//! The tolerances, and the comparison of an output read back with its CPU reference.

use modelshare_kernels::WeightDtype;

use crate::buf::Out;

/// The outcome of one comparison.
pub struct Check {
    pub name: String,
    pub dtype: WeightDtype,
    pub shape: String,
    /// Largest |gpu − cpu| over its tolerance (≤ 1 passes).
    pub worst: f64,
    pub rel_norm: f64,
    pub bad: usize,
    pub unwritten: usize,
    pub guard_ok: bool,
    pub ok: bool,
}

/// Per-element tolerance `rel·|want| + abs`.
#[derive(Clone, Copy)]
pub struct Tol {
    pub rel: f64,
    pub abs: f64,
}

pub fn unit_tol(dtype: WeightDtype) -> Tol {
    let u = match dtype {
        WeightDtype::F32 => 1e-5,
        WeightDtype::F16 => 1.0 / 1024.0,
        WeightDtype::BF16 => 1.0 / 128.0,
    };
    Tol { rel: u, abs: u }
}

/// For matrix products: `abs` scaled by the RMS of the reference.
pub fn matmul_tol(dtype: WeightDtype, want: &[f32]) -> Tol {
    let t = unit_tol(dtype);
    Tol {
        rel: t.rel,
        abs: t.abs * rms(want).max(1e-30),
    }
}

pub const POOL_TOL: Tol = Tol {
    rel: 2e-5,
    abs: 2e-5,
};

pub fn rms(v: &[f32]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    (v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

pub fn compare(
    name: &str,
    dtype: WeightDtype,
    shape: &str,
    got: &Out,
    want: &[f32],
    tol: Tol,
) -> Check {
    let mut worst = 0.0f64;
    let mut bad = 0;
    let mut unwritten = 0;
    let (mut diff2, mut norm2) = (0.0f64, 0.0f64);
    for (g, w) in got.values.iter().zip(want) {
        let (g, w) = (f64::from(*g), f64::from(*w));
        if g.is_nan() {
            unwritten += 1;
            continue;
        }
        let d = (g - w).abs();
        let e = if d == 0.0 {
            0.0
        } else {
            d / (tol.rel * w.abs() + tol.abs)
        };
        if e.is_nan() || e > 1.0 {
            bad += 1;
        }
        worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
        diff2 += (g - w).powi(2);
        norm2 += w * w;
    }
    let rel_norm = if norm2 > 0.0 {
        (diff2 / norm2).sqrt()
    } else {
        diff2.sqrt()
    };
    let len_ok = got.values.len() == want.len();
    Check {
        name: name.to_owned(),
        dtype,
        shape: shape.to_owned(),
        worst,
        rel_norm,
        bad,
        unwritten,
        guard_ok: got.guard_ok,
        ok: len_ok && bad == 0 && unwritten == 0 && got.guard_ok,
    }
}

/// A norm-relative comparison (the composite layer).
pub fn compare_norm(
    name: &str,
    dtype: WeightDtype,
    shape: &str,
    got: &Out,
    want: &[f32],
    limit: f64,
) -> Check {
    let mut c = compare(name, dtype, shape, got, want, Tol { rel: 0.0, abs: 1.0 });
    c.bad = 0;
    c.worst = c.rel_norm / limit;
    c.ok = got.values.len() == want.len() && c.rel_norm <= limit && c.unwritten == 0 && c.guard_ok;
    c
}
