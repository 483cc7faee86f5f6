//! Attention in one kernel ([`attention`]): scores, masked softmax and context over the split
//! heads, on the tensor cores, the scores never leaving registers (FlashAttention-2's loop).

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::{buf, count, disjoint, int};
use super::names::ATTENTION;
use super::plan::Plan;
use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// Query rows of one block (`MS_ATT_Q` in `encoder.cu`).
const QUERY_ROWS: usize = 64;
/// Threads of one block (four warps of 16 query rows).
const THREADS: u32 = 128;
/// The head sizes the kernel is built for.
pub const ATTENTION_HEAD_DIMS: [usize; 4] = [32, 64, 80, 128];

/// Arguments of [`attention`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionArgs {
    /// Queries `[batch·heads, seq, head_dim]`, already scaled; each row inside its sequence's
    /// length is overwritten with its context.
    pub q: u64,
    /// Keys, same shape.
    pub k: u64,
    /// Values, same shape.
    pub v: u64,
    /// Each sequence's length, i32 `[batch]` (clamped to `0..=seq`).
    pub lengths: u64,
    /// Sequences.
    pub batch: usize,
    /// Attention heads.
    pub heads: usize,
    /// Rows per sequence and head (the padded length).
    pub seq: usize,
    /// Elements per head: one of [`ATTENTION_HEAD_DIMS`].
    pub head_dim: usize,
}

/// Whether [`attention`] runs for `dtype` and `head_dim` on a device of compute capability
/// `major`: f16 or bf16, a head size of [`ATTENTION_HEAD_DIMS`], sm_80 or newer (its
/// tensor-core instructions).
pub fn attention_supported(dtype: WeightDtype, head_dim: usize, major: i32) -> bool {
    dtype != WeightDtype::F32 && ATTENTION_HEAD_DIMS.contains(&head_dim) && major >= 8
}

/// The checked launch of [`attention`], `None` for an empty shape.
pub(super) fn plan_attention(
    dtype: WeightDtype,
    a: &AttentionArgs,
) -> Result<Option<Plan>, KernelError> {
    let n = count("attention", &[a.batch, a.heads, a.seq, a.head_dim])?;
    if n == 0 {
        return Ok(None);
    }
    let Some(d) = ATTENTION_HEAD_DIMS.iter().position(|&d| d == a.head_dim) else {
        return Err(KernelError::bad(format!(
            "fused attention takes head sizes {ATTENTION_HEAD_DIMS:?}, not {}",
            a.head_dim
        )));
    };
    let kernel = match dtype {
        WeightDtype::F16 => ATTENTION[d],
        WeightDtype::BF16 => ATTENTION[ATTENTION_HEAD_DIMS.len() + d],
        WeightDtype::F32 => return Err(KernelError::bad("fused attention takes f16 or bf16")),
    };
    int("heads", a.heads)?;
    int("seq", a.seq)?;
    let heads = int("batch * heads", a.batch * a.heads)?;
    // 16-byte loads of the rows: every tensor 16-byte aligned (head_dim·2 bytes is a whole
    // number of 16).
    for (what, p) in [("q", a.q), ("k", a.k), ("v", a.v)] {
        if !p.is_multiple_of(16) {
            return Err(KernelError::bad(format!(
                "attention {what} at {p:#x} is not 16-byte aligned"
            )));
        }
    }
    let es = dtype.size_bytes();
    let q = buf("attention q", a.q, n, es)?;
    let inputs = [
        buf("attention k", a.k, n, es)?,
        buf("attention v", a.v, n, es)?,
        buf("lengths", a.lengths, a.batch as u64, 4)?,
    ];
    disjoint(&q, &inputs.iter().collect::<Vec<_>>())?;
    Ok(Some(Plan {
        kernel,
        grid: (heads as u32, a.seq.div_ceil(QUERY_ROWS) as u32, 1),
        block: (THREADS, 1, 1),
    }))
}

/// Enqueues, for every head of every sequence, `q[r] = softmax(q[r]·kᵀ over the keys
/// j < len)·v` for each query row `r < len` (`len` the sequence's length, clamped to
/// `0..=seq`), in place over q: the attention's scores, masked softmax and context in one
/// kernel, f32 accumulation, the probabilities rounded to the dtype before the context's
/// product (as FlashAttention). Rows at or past `len` are left as they were. Takes what
/// [`attention_supported`] says (the caller checks the device); q must not overlap k, v or
/// the lengths. Empty shapes are a no-op.
///
/// # Safety
///
/// q, k and v must be valid for `batch·heads·seq·head_dim` elements and `lengths` for
/// `batch` i32 on `stream`'s device until the kernel completes; nothing else may touch q or
/// write the others while it runs. The device must be sm_80 or newer.
pub unsafe fn attention(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    a: &AttentionArgs,
) -> Result<(), KernelError> {
    let Some(plan) = plan_attention(dtype, a)? else {
        return Ok(());
    };
    let info = cache.device_info(stream.context())?;
    if !attention_supported(dtype, a.head_dim, info.major) {
        return Err(KernelError::bad(format!(
            "fused attention needs sm_80 or newer, not sm_{}{}",
            info.major, info.minor
        )));
    }
    let (heads, seq) = (a.heads as i32, a.seq as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&a.q)
        .arg(&a.k)
        .arg(&a.v)
        .arg(&a.lengths)
        .arg(&heads)
        .arg(&seq);
    // SAFETY: the arguments match `MS_ATTENTION` (four pointers, two ints); checked by
    // plan_attention, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
