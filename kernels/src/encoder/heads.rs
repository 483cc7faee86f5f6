//! The attention heads' layout: the Q, K, V projections split into per-head matrices with
//! their biases ([`split_heads`]), and the context merged back ([`merge_heads`]).

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::{Buf, buf, count, disjoint, int};
use super::layout::Layout;
use super::names::{MERGE_HEADS, SPLIT_HEADS, pick};
use super::plan::{Plan, heads_plan, vec_width, vectorizable};
use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// Arguments of [`split_heads`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadsArgs {
    /// Query projection without bias, `[rows, heads * head_dim]`, its sequences laid out as
    /// `layout` says.
    pub q: u64,
    /// Key projection without bias, same shape.
    pub k: u64,
    /// Value projection without bias, same shape.
    pub v: u64,
    /// Where the sequences' rows lie in q, k and v.
    pub layout: Layout,
    /// Query bias `[heads * head_dim]`.
    pub q_bias: u64,
    /// Key bias.
    pub k_bias: u64,
    /// Value bias.
    pub v_bias: u64,
    /// Output `[batch * heads, seq, head_dim]`, zeros past each sequence's end.
    pub q_out: u64,
    /// Output, same shape.
    pub k_out: u64,
    /// Output, same shape.
    pub v_out: u64,
    /// Sequences.
    pub batch: usize,
    /// Tokens per sequence.
    pub seq: usize,
    /// Attention heads.
    pub heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Multiplies q after its bias, e.g. `1 / sqrt(head_dim)`.
    pub q_scale: f32,
}

/// The checked launch of [`split_heads`], `None` for an empty shape.
pub(super) fn plan_split(dtype: WeightDtype, a: &HeadsArgs) -> Result<Option<Plan>, KernelError> {
    let n = count("split_heads", &[a.batch, a.seq, a.heads, a.head_dim])?;
    if n == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes();
    int("seq", a.seq)?;
    int("heads * head_dim", a.heads * a.head_dim)?;
    let rows = a.layout.rows(a.batch, a.seq)?;
    let n_in = count("split_heads input", &[rows, a.heads, a.head_dim])?;
    let (_, offsets) = a.layout.offsets(a.batch)?;
    if !a.q_scale.is_finite() {
        return Err(KernelError::bad(format!(
            "q_scale {} is not finite",
            a.q_scale
        )));
    }
    let width = (a.heads * a.head_dim) as u64;
    let mut inputs = vec![
        buf("q", a.q, n_in, es)?,
        buf("k", a.k, n_in, es)?,
        buf("v", a.v, n_in, es)?,
        buf("q_bias", a.q_bias, width, es)?,
        buf("k_bias", a.k_bias, width, es)?,
        buf("v_bias", a.v_bias, width, es)?,
    ];
    inputs.extend(offsets);
    let outs = [
        buf("q_out", a.q_out, n, es)?,
        buf("k_out", a.k_out, n, es)?,
        buf("v_out", a.v_out, n, es)?,
    ];
    for (i, out) in outs.iter().enumerate() {
        disjoint(out, &inputs.iter().collect::<Vec<_>>())?;
        disjoint(out, &outs[i + 1..].iter().collect::<Vec<_>>())?;
    }
    let vec = vectorizable(
        dtype,
        a.head_dim,
        &[
            a.q, a.k, a.v, a.q_bias, a.k_bias, a.v_bias, a.q_out, a.k_out, a.v_out,
        ],
    );
    let w = if vec { vec_width(dtype) } else { 1 };
    let rows = count("split_heads rows", &[a.batch, a.seq])?;
    heads_plan(pick(&SPLIT_HEADS, dtype, vec), rows, width as usize / w, 3).map(Some)
}

/// Enqueues, for each of q, k and v: `out[(b·heads + h)·seq + s, d] = (in[row(b, s),
/// h·head_dim + d] + bias[h·head_dim + d]) · scale`, with `row(b, s)` the row of token `s`
/// of sequence `b` as `layout` says (0 past the sequence's end) and `scale = q_scale` for q
/// and 1 for k and v: the linear layers' outputs (without their bias) to the padded
/// per-head layout `[batch·heads, seq, head_dim]` the batched matmuls take. Outputs must not
/// overlap any input or each other. Empty shapes are a no-op.
///
/// # Safety
///
/// The inputs must be valid for `rows·heads·head_dim` elements (`rows` as `layout` says),
/// the outputs for `batch·seq·heads·head_dim`, the biases for `heads·head_dim` and a packed
/// layout's offsets for `batch + 1` i32 on `stream`'s device until the kernel completes;
/// nothing else may write the inputs or touch the outputs while it runs.
pub unsafe fn split_heads(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    a: &HeadsArgs,
) -> Result<(), KernelError> {
    let Some(plan) = plan_split(dtype, a)? else {
        return Ok(());
    };
    let (offsets, _) = a.layout.offsets(a.batch)?;
    let (batch, rows) = (a.batch as i64, a.layout.rows(a.batch, a.seq)? as i64);
    let (seq, heads, head_dim) = (a.seq as i32, a.heads as i32, a.head_dim as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&a.q)
        .arg(&a.k)
        .arg(&a.v)
        .arg(&a.q_bias)
        .arg(&a.k_bias)
        .arg(&a.v_bias)
        .arg(&a.q_out)
        .arg(&a.k_out)
        .arg(&a.v_out)
        .arg(&offsets)
        .arg(&batch)
        .arg(&rows)
        .arg(&seq)
        .arg(&heads)
        .arg(&head_dim)
        .arg(&a.q_scale);
    // SAFETY: the arguments match `MS_SPLIT_HEADS` (ten pointers, two long longs, three
    // ints, float); checked by plan_split, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}

/// The checked launch of [`merge_heads`], `None` for an empty shape.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub(super) fn plan_merge(
    dtype: WeightDtype,
    ctx: u64,
    out: u64,
    layout: Layout,
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
) -> Result<Option<Plan>, KernelError> {
    let n = count("merge_heads", &[batch, seq, heads, head_dim])?;
    if n == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes();
    int("seq", seq)?;
    int("heads * head_dim", heads * head_dim)?;
    let rows = layout.rows(batch, seq)?;
    let c = buf("ctx", ctx, n, es)?;
    let o = buf(
        "merge_heads out",
        out,
        count("merge_heads out", &[rows, heads, head_dim])?,
        es,
    )?;
    let (_, offsets) = layout.offsets(batch)?;
    let inputs: Vec<&Buf> = std::iter::once(&c).chain(offsets.as_ref()).collect();
    disjoint(&o, &inputs)?;
    let vec = vectorizable(dtype, head_dim, &[ctx, out]);
    let w = if vec { vec_width(dtype) } else { 1 };
    let padded = count("merge_heads rows", &[batch, seq])?;
    heads_plan(
        pick(&MERGE_HEADS, dtype, vec),
        padded,
        heads * head_dim / w,
        1,
    )
    .map(Some)
}

/// Enqueues `out[row(b, s), h·head_dim + d] = ctx[(b·heads + h)·seq + s, d]`, with
/// `row(b, s)` the row of token `s` of sequence `b` as `layout` says: the attention context
/// `[batch·heads, seq, head_dim]` back to token rows `[rows, heads·head_dim]` (a padded
/// layout's rows past a sequence's end are written too, a packed one's padding is
/// dropped). `out` must not overlap `ctx`. Empty shapes are a no-op.
///
/// # Safety
///
/// `ctx` must be valid for `batch·seq·heads·head_dim` elements, `out` for
/// `rows·heads·head_dim` (`rows` as `layout` says) and a packed layout's offsets for
/// `batch + 1` i32 on `stream`'s device until the kernel completes; nothing else may write
/// `ctx` or touch `out` while it runs.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub unsafe fn merge_heads(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    ctx: u64,
    out: u64,
    layout: Layout,
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
) -> Result<(), KernelError> {
    let Some(plan) = plan_merge(dtype, ctx, out, layout, batch, heads, seq, head_dim)? else {
        return Ok(());
    };
    let (offsets, _) = layout.offsets(batch)?;
    let rows = layout.rows(batch, seq)? as i64;
    let batch = batch as i64;
    let (seq, heads, head_dim) = (seq as i32, heads as i32, head_dim as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&ctx)
        .arg(&out)
        .arg(&offsets)
        .arg(&batch)
        .arg(&rows)
        .arg(&seq)
        .arg(&heads)
        .arg(&head_dim);
    // SAFETY: the arguments match `MS_MERGE_HEADS` (three pointers, two long longs, three
    // ints);
    // checked by plan_merge, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
