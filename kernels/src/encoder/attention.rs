//! Attention in one kernel: scores, masked softmax and context on the tensor cores, the
//! scores never leaving registers (FlashAttention-2's loop), over the split heads
//! ([`attention`]) or straight over the packed projections with their biases, the split and
//! the merge folded in ([`attention_packed`]).

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::Buf;
use super::checks::{buf, count, disjoint, int};
use super::layout::Layout;
use super::names::{ATTENTION, ATTENTION_PACKED};
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

/// The kernel of `names` (f16 then bf16, each by [`ATTENTION_HEAD_DIMS`]) for `dtype` and
/// `head_dim`.
fn pick(
    names: &[&'static str; 8],
    dtype: WeightDtype,
    head_dim: usize,
) -> Result<&'static str, KernelError> {
    let Some(d) = ATTENTION_HEAD_DIMS.iter().position(|&d| d == head_dim) else {
        return Err(KernelError::bad(format!(
            "fused attention takes head sizes {ATTENTION_HEAD_DIMS:?}, not {head_dim}"
        )));
    };
    match dtype {
        WeightDtype::F16 => Ok(names[d]),
        WeightDtype::BF16 => Ok(names[ATTENTION_HEAD_DIMS.len() + d]),
        WeightDtype::F32 => Err(KernelError::bad("fused attention takes f16 or bf16")),
    }
}

/// A 16-byte aligned device pointer, or an error naming it (the kernels' row loads).
fn aligned(what: &str, p: u64) -> Result<(), KernelError> {
    if p.is_multiple_of(16) {
        Ok(())
    } else {
        Err(KernelError::bad(format!(
            "attention {what} at {p:#x} is not 16-byte aligned"
        )))
    }
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
    let kernel = pick(&ATTENTION, dtype, a.head_dim)?;
    int("heads", a.heads)?;
    int("seq", a.seq)?;
    let heads = int("batch * heads", a.batch * a.heads)?;
    // 16-byte loads of the rows: every tensor 16-byte aligned (head_dim·2 bytes is a whole
    // number of 16).
    for (what, p) in [("q", a.q), ("k", a.k), ("v", a.v)] {
        aligned(what, p)?;
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
    check_device(cache, stream, dtype, a.head_dim)?;
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

/// The device is one [`attention_supported`] takes (sm_80+).
fn check_device(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    head_dim: usize,
) -> Result<(), KernelError> {
    let info = cache.device_info(stream.context())?;
    if attention_supported(dtype, head_dim, info.major) {
        Ok(())
    } else {
        Err(KernelError::bad(format!(
            "fused attention needs sm_80 or newer, not sm_{}{}",
            info.major, info.minor
        )))
    }
}

/// Arguments of [`attention_packed`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PackedAttentionArgs {
    /// The query projection without bias, `[rows, heads·head_dim]`, the sequences packed;
    /// each row inside its sequence is overwritten with its context (head `h` in columns
    /// `h·head_dim..`), as the merge would write it.
    pub q: u64,
    /// The key projection without bias, same shape.
    pub k: u64,
    /// The value projection without bias, same shape.
    pub v: u64,
    /// Query bias `[heads·head_dim]`.
    pub q_bias: u64,
    /// Key bias.
    pub k_bias: u64,
    /// Value bias.
    pub v_bias: u64,
    /// Where the sequences' rows lie: [`Layout::Packed`] (its offsets and rows).
    pub layout: Layout,
    /// Sequences.
    pub batch: usize,
    /// Attention heads.
    pub heads: usize,
    /// The longest sequence (rows past it in a sequence are not read).
    pub seq: usize,
    /// Elements per head: one of [`ATTENTION_HEAD_DIMS`].
    pub head_dim: usize,
    /// Multiplies q after its bias, e.g. `1 / sqrt(head_dim)`.
    pub q_scale: f32,
}

/// The checked launch of [`attention_packed`], `None` for an empty shape.
pub(super) fn plan_attention_packed(
    dtype: WeightDtype,
    a: &PackedAttentionArgs,
) -> Result<Option<Plan>, KernelError> {
    let Layout::Packed { rows, .. } = a.layout else {
        return Err(KernelError::bad("packed attention takes a packed layout"));
    };
    if count("attention", &[a.batch, a.heads, a.seq, a.head_dim])? == 0 || rows == 0 {
        return Ok(None);
    }
    let kernel = pick(&ATTENTION_PACKED, dtype, a.head_dim)?;
    int("seq", a.seq)?;
    let width = int("heads * head_dim", a.heads * a.head_dim)? as u64;
    let heads = int("batch * heads", a.batch * a.heads)?;
    if !a.q_scale.is_finite() {
        return Err(KernelError::bad(format!(
            "q_scale {} is not finite",
            a.q_scale
        )));
    }
    for (what, p) in [
        ("q", a.q),
        ("k", a.k),
        ("v", a.v),
        ("q_bias", a.q_bias),
        ("k_bias", a.k_bias),
        ("v_bias", a.v_bias),
    ] {
        aligned(what, p)?;
    }
    let es = dtype.size_bytes();
    let n = count("attention rows", &[rows, width as usize])?;
    let q = buf("attention q", a.q, n, es)?;
    let (_, offsets) = a.layout.offsets(a.batch)?;
    let inputs: Vec<Buf> = [
        buf("attention k", a.k, n, es)?,
        buf("attention v", a.v, n, es)?,
        buf("q_bias", a.q_bias, width, es)?,
        buf("k_bias", a.k_bias, width, es)?,
        buf("v_bias", a.v_bias, width, es)?,
    ]
    .into_iter()
    .chain(offsets)
    .collect();
    disjoint(&q, &inputs.iter().collect::<Vec<_>>())?;
    Ok(Some(Plan {
        kernel,
        grid: (heads as u32, a.seq.div_ceil(QUERY_ROWS) as u32, 1),
        block: (THREADS, 1, 1),
    }))
}

/// Enqueues the attention of [`attention`] straight over the packed projections: for each
/// sequence and head, the head's columns of q, k and v get their bias (and q its scale) as
/// they are read, in f32 rounded once (the split's math), and the context is written over
/// q's columns of the head, rows inside the sequence only: what the split, the attention and
/// the merge into q did, in one kernel and without the per-head buffers. q must not overlap
/// k, v, the biases or the offsets. Empty shapes are a no-op.
///
/// # Safety
///
/// q, k and v must be valid for `rows·heads·head_dim` elements, the biases for
/// `heads·head_dim` and the offsets for `batch + 1` i32 on `stream`'s device until the
/// kernel completes; nothing else may touch q or write the others while it runs. The
/// device must be sm_80 or newer. (The kernel reads no row at or past `rows`, whatever the
/// offsets hold.)
pub unsafe fn attention_packed(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    a: &PackedAttentionArgs,
) -> Result<(), KernelError> {
    let Some(plan) = plan_attention_packed(dtype, a)? else {
        return Ok(());
    };
    check_device(cache, stream, dtype, a.head_dim)?;
    let (offsets, _) = a.layout.offsets(a.batch)?;
    let rows = a.layout.rows(a.batch, a.seq)? as i64;
    let (heads, seq) = (a.heads as i32, a.seq as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&a.q)
        .arg(&a.k)
        .arg(&a.v)
        .arg(&a.q_bias)
        .arg(&a.k_bias)
        .arg(&a.v_bias)
        .arg(&offsets)
        .arg(&rows)
        .arg(&heads)
        .arg(&seq)
        .arg(&a.q_scale);
    // SAFETY: the arguments match `MS_ATTENTION_PACKED` (seven pointers, long long, two
    // ints, float); checked by plan_attention_packed, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
