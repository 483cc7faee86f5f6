//! Pooling: a sequence's token vectors reduced to one ([`Pooling`]), optionally
//! L2-normalized ([`pool`]).

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::{buf, count, disjoint, int};
use super::layout::Layout;
use super::names::{POOL, dtype_index};
use super::plan::Plan;
use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// Threads per block of the pooling kernel, at most (a column each, for hidden ≤ 1024).
const POOL_THREADS: usize = 1024;

/// How [`pool`] reduces a sequence's token vectors to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pooling {
    /// The average over the sequence's tokens.
    Mean,
    /// The first token's vector.
    Cls,
    /// The element-wise maximum.
    Max,
    /// The sum divided by the square root of the length.
    MeanSqrtLen,
}

impl Pooling {
    /// The kernel's `mode` argument.
    const fn code(self) -> i32 {
        match self {
            Self::Mean => 0,
            Self::Cls => 1,
            Self::Max => 2,
            Self::MeanSqrtLen => 3,
        }
    }
}

/// The checked launch of [`pool`], `None` for no sequences or no columns.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub(super) fn plan_pool(
    dtype: WeightDtype,
    x: u64,
    layout: Layout,
    lengths: u64,
    out: u64,
    batch: usize,
    seq: usize,
    hidden: usize,
) -> Result<Option<Plan>, KernelError> {
    if batch == 0 || hidden == 0 {
        return Ok(None);
    }
    let blocks = int("pool batch", batch)? as u32;
    int("seq", seq)?;
    int("hidden", hidden)?;
    let rows = layout.rows(batch, seq)?;
    let xb = buf(
        "pool x",
        x,
        count("x", &[rows, hidden])?,
        dtype.size_bytes(),
    )?;
    let lb = buf("lengths", lengths, batch as u64, 4)?;
    let ob = buf("pool out", out, count("out", &[batch, hidden])?, 4)?;
    let (_, offsets) = layout.offsets(batch)?;
    let inputs: Vec<_> = [&xb, &lb].into_iter().chain(offsets.as_ref()).collect();
    disjoint(&ob, &inputs)?;
    let threads = hidden.next_multiple_of(32).min(POOL_THREADS) as u32;
    Ok(Some(Plan {
        kernel: POOL[dtype_index(dtype)],
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
    }))
}

/// Enqueues `out` (f32 `[batch, hidden]`) = a pooling of the token rows `x [rows, hidden]`
/// over each sequence's tokens `t < lengths[b]` (i32, clamped to `0..=seq` and to the rows
/// there are), the sequences laid out as `layout` says: see [`Pooling`]. Then, if
/// `normalize`, each row is divided by `max(‖row‖₂, 1e-12)` (as
/// `torch.nn.functional.normalize`). A sequence of length 0 gives zeros. `batch == 0` or
/// `hidden == 0` is a no-op.
///
/// # Safety
///
/// `x` must be valid for `rows·hidden` elements (`rows` as `layout` says), `lengths` for
/// `batch` i32, a packed layout's offsets for `batch + 1` i32 and `out` for `batch·hidden`
/// f32 on `stream`'s device until the kernel completes; nothing else may write the inputs or
/// touch `out` while it runs.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub unsafe fn pool(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    x: u64,
    layout: Layout,
    lengths: u64,
    out: u64,
    batch: usize,
    seq: usize,
    hidden: usize,
    mode: Pooling,
    normalize: bool,
) -> Result<(), KernelError> {
    let Some(plan) = plan_pool(dtype, x, layout, lengths, out, batch, seq, hidden)? else {
        return Ok(());
    };
    let (offsets, _) = layout.offsets(batch)?;
    let rows = layout.rows(batch, seq)? as i64;
    let (seq, hidden) = (seq as i32, hidden as i32);
    let (mode, normalize) = (mode.code(), i32::from(normalize));
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&x)
        .arg(&lengths)
        .arg(&offsets)
        .arg(&out)
        .arg(&rows)
        .arg(&seq)
        .arg(&hidden)
        .arg(&mode)
        .arg(&normalize);
    // SAFETY: the arguments match `MS_POOL` (four pointers, long long, four ints); checked by
    // plan_pool, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
