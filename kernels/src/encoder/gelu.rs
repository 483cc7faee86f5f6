//! Bias + exact GELU after the feed-forward's up projection ([`bias_gelu`]), in place.

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::{buf, count, disjoint, int};
use super::names::{BIAS_GELU, pick};
use super::plan::{Plan, flat_plan, vec_width, vectorizable};
use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// The checked launch of [`bias_gelu`], `None` for an empty shape.
pub(super) fn plan_bias_gelu(
    dtype: WeightDtype,
    x: u64,
    bias: u64,
    rows: usize,
    cols: usize,
    multiprocessors: u32,
) -> Result<Option<Plan>, KernelError> {
    if rows == 0 || cols == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes();
    int("bias_gelu cols", cols)?;
    let xb = buf("bias_gelu x", x, count("x", &[rows, cols])?, es)?;
    let bb = buf("bias_gelu bias", bias, cols as u64, es)?;
    disjoint(&xb, &[&bb])?;
    let vec = vectorizable(dtype, cols, &[x, bias]);
    let width = if vec { vec_width(dtype) } else { 1 };
    let chunks = xb.bytes / es as u64 / width as u64;
    Ok(Some(flat_plan(
        pick(&BIAS_GELU, dtype, vec),
        chunks,
        1,
        multiprocessors,
    )))
}

/// Enqueues `x[r, c] = gelu(x[r, c] + bias[c])` in place on `x [rows, cols]`, with the
/// exact erf GELU `0.5·v·(1 + erf(v/√2))` (BERT's `"gelu"`). Empty shapes are a no-op.
///
/// # Safety
///
/// `x` must be valid for `rows * cols` elements (read and written) and `bias` for `cols`
/// (read) on `stream`'s device until the kernel completes, and nothing else may touch `x`
/// or write `bias` while it runs.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub unsafe fn bias_gelu(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    x: u64,
    bias: u64,
    rows: usize,
    cols: usize,
) -> Result<(), KernelError> {
    if rows == 0 || cols == 0 {
        return Ok(());
    }
    let sms = cache.device_info(stream.context())?.multiprocessors;
    let Some(plan) = plan_bias_gelu(dtype, x, bias, rows, cols, sms)? else {
        return Ok(());
    };
    let (rows, cols) = (rows as i64, cols as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch.arg(&x).arg(&bias).arg(&rows).arg(&cols);
    // SAFETY: the arguments match `MS_BIAS_GELU` (two pointers, long long, int); sizes and
    // pointers checked by plan_bias_gelu, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
