//! The attention's masked softmax over each sequence's keys ([`masked_softmax`]), in place on
//! the scores.

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::{buf, count, disjoint, int};
use super::names::{SOFTMAX, pick};
use super::plan::{Plan, row_plan, vec_width, vectorizable};
use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// The checked launch of [`masked_softmax`], `None` for an empty shape.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub(super) fn plan_softmax(
    dtype: WeightDtype,
    scores: u64,
    lengths: u64,
    batch: usize,
    heads: usize,
    seq: usize,
) -> Result<Option<Plan>, KernelError> {
    let rows = count("masked_softmax", &[batch, heads, seq])?;
    if rows == 0 {
        return Ok(None);
    }
    int("heads", heads)?;
    let s = buf(
        "scores",
        scores,
        count("scores", &[batch, heads, seq, seq])?,
        dtype.size_bytes(),
    )?;
    let l = buf("lengths", lengths, batch as u64, 4)?;
    disjoint(&s, &[&l])?;
    let vec = vectorizable(dtype, seq, &[scores]);
    let width = if vec { vec_width(dtype) } else { 1 };
    row_plan(pick(&SOFTMAX, dtype, vec), rows, seq, width).map(Some)
}

/// Enqueues, in place on `scores [batch·heads, seq, seq]`, a softmax of each row over the
/// keys `j < lengths[b]` (`b` the row's sequence, lengths i32 `[batch]`, clamped to
/// `0..=seq`), with the keys `j ≥ lengths[b]` set to 0; a row of length 0 becomes all zeros.
/// Max-subtracted, f32 math. Empty shapes are a no-op; `seq` is at most
/// [`MAX_ROW_LEN`](super::MAX_ROW_LEN).
///
/// # Safety
///
/// `scores` must be valid for `batch·heads·seq·seq` elements (read and written) and
/// `lengths` for `batch` i32 on `stream`'s device until the kernel completes; nothing else
/// may touch `scores` or write `lengths` while it runs.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub unsafe fn masked_softmax(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    scores: u64,
    lengths: u64,
    batch: usize,
    heads: usize,
    seq: usize,
) -> Result<(), KernelError> {
    let Some(plan) = plan_softmax(dtype, scores, lengths, batch, heads, seq)? else {
        return Ok(());
    };
    let rows = (batch * heads * seq) as i64;
    let (seq, heads) = (seq as i32, heads as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&scores)
        .arg(&lengths)
        .arg(&rows)
        .arg(&seq)
        .arg(&heads);
    // SAFETY: the arguments match `MS_SOFTMAX` (two pointers, long long, two ints); checked
    // by plan_softmax, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
