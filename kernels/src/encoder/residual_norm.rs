//! Bias + residual + LayerNorm after a linear layer ([`bias_residual_layer_norm`]), in place
//! on the hidden states or not.

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::{buf, check_eps, count, disjoint};
use super::names::{RESIDUAL_LN, pick};
use super::plan::{Plan, row_plan, vec_width, vectorizable};
use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// Arguments of [`bias_residual_layer_norm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResidualNormArgs {
    /// Output `[rows, cols]`; may be the same buffer as `x` or `residual`.
    pub out: u64,
    /// A linear layer's output without its bias, `[rows, cols]`.
    pub x: u64,
    /// That layer's bias, `[cols]`.
    pub bias: u64,
    /// The residual, `[rows, cols]`.
    pub residual: u64,
    /// LayerNorm weight `[cols]`.
    pub gamma: u64,
    /// LayerNorm bias `[cols]`.
    pub beta: u64,
    /// Rows (tokens).
    pub rows: usize,
    /// Columns (hidden size), at most [`MAX_ROW_LEN`](super::MAX_ROW_LEN).
    pub cols: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
}

/// The checked launch of [`bias_residual_layer_norm`], `None` for no rows.
pub(super) fn plan_residual(
    dtype: WeightDtype,
    a: &ResidualNormArgs,
) -> Result<Option<Plan>, KernelError> {
    if a.rows == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes();
    check_eps(a.eps)?;
    let n = count("residual layer norm", &[a.rows, a.cols])?;
    let out = buf("residual layer norm out", a.out, n, es)?;
    let x = buf("x", a.x, n, es)?;
    let residual = buf("residual", a.residual, n, es)?;
    let params = [
        buf("bias", a.bias, a.cols as u64, es)?,
        buf("gamma", a.gamma, a.cols as u64, es)?,
        buf("beta", a.beta, a.cols as u64, es)?,
    ];
    disjoint(&out, &params.iter().collect::<Vec<_>>())?;
    // `out` may be exactly `x` or `residual` (each element is read by the thread that
    // writes it), but not shifted against them.
    for full in [&x, &residual] {
        if full.ptr != out.ptr {
            disjoint(&out, &[full])?;
        }
    }
    let vec = vectorizable(
        dtype,
        a.cols,
        &[a.out, a.x, a.bias, a.residual, a.gamma, a.beta],
    );
    let width = if vec { vec_width(dtype) } else { 1 };
    row_plan(pick(&RESIDUAL_LN, dtype, vec), a.rows as u64, a.cols, width).map(Some)
}

/// Enqueues `out[r, :] = LayerNorm(x[r, :] + bias + residual[r, :]) * gamma + beta`. `out`
/// may be the same buffer as `x` or `residual` (each row is read fully before it is
/// written), but not partly overlap either. `rows == 0` is a no-op; `cols` must be in
/// `1..=MAX_ROW_LEN`.
///
/// # Safety
///
/// `out`, `x` and `residual` must be valid for `rows * cols` elements and `bias`, `gamma`,
/// `beta` for `cols` on `stream`'s device until the kernel completes; nothing else may
/// write the inputs or touch `out` while it runs.
pub unsafe fn bias_residual_layer_norm(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    a: &ResidualNormArgs,
) -> Result<(), KernelError> {
    let Some(plan) = plan_residual(dtype, a)? else {
        return Ok(());
    };
    let (rows, cols) = (a.rows as i64, a.cols as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&a.out)
        .arg(&a.x)
        .arg(&a.bias)
        .arg(&a.residual)
        .arg(&a.gamma)
        .arg(&a.beta)
        .arg(&rows)
        .arg(&cols)
        .arg(&a.eps);
    // SAFETY: the arguments match `MS_RESIDUAL_LN` (six pointers, long long, int, float);
    // checked by plan_residual, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
