//! Launchers of the BERT encoder's element-wise and row-wise pieces (`cuda/encoder.cu`):
//! embeddings + LayerNorm, bias + GELU, bias + residual + LayerNorm, head split and merge,
//! masked softmax and pooling. The matrix products are cuBLAS ([`crate::blas`]).
//!
//! Activations and weights share one [`WeightDtype`]; the kernels compute in f32 and round
//! once on store. Every pointer is a raw device address (`u64`), as in [`crate::gemv`],
//! because weights live in an IPC-imported arena; index arrays (token ids, lengths) are
//! `i32`. Launchers check sizes (overflow, the kernels' 32-bit limits), null and misaligned
//! pointers and outputs overlapping inputs, pick a 16-byte-vector or a scalar kernel, and
//! enqueue on the caller's stream: they never synchronize, allocate or copy, so a sequence
//! of them can be captured in a CUDA graph. Whether the memory behind a pointer is large
//! enough is the caller's promise, hence `unsafe`.
//!
//! Row kernels (the LayerNorms and the softmax) hold a row in registers, at most
//! [`MAX_ROW_LEN`] elements (short rows share a warp); other sizes are limited only by
//! 64-bit sizes and `i32` widths.
//!
//! Measured on an H100 (`examples/encoder_check.rs`, a BERT-large layer in f16, batch 128,
//! seq 64, against the device's ~3.0 TB/s copy): LayerNorms, head split/merge and
//! bias_gelu move 2.6-2.75 TB/s, the masked softmax 2.2 TB/s, pooling 1.6 TB/s. The whole
//! layer takes 514 µs (405 TFLOP/s): cuBLAS's linears run at 590-750 TFLOP/s, attention's
//! 64×64 batched products at 45-56, and bias_gelu (51 µs) and split_heads (37 µs) are the
//! largest non-matmul steps (fusing them into the products' epilogues would save most).

use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchConfig, PushKernelArg};

use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::{WeightDtype, check_range, overlaps};

/// The longest row the row kernels (LayerNorm, softmax) take: 512 threads of 16 elements.
pub const MAX_ROW_LEN: usize = 8192;
/// Elements per thread of a row kernel (`MS_ROW_ELEMS` in `encoder.cu`).
const ROW_ELEMS: usize = 16;
/// Most threads per row (and per block) of a row kernel (their `__launch_bounds__`).
const ROW_MAX_THREADS: usize = 512;
/// Threads per block of the element-wise kernels.
const FLAT_THREADS: u32 = 256;
/// Threads per block of the pooling kernel, at most (a column each, for hidden ≤ 1024).
const POOL_THREADS: usize = 1024;
/// Element-wise grids stop at this many blocks per multiprocessor (they stride).
const FLAT_BLOCKS_PER_SM: u64 = 32;

/// Arguments of [`embed_layer_norm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmbedArgs {
    /// Output `[tokens, hidden]`.
    pub out: u64,
    /// Token ids, i32 `[tokens]`.
    pub ids: u64,
    /// Token type ids, i32 `[tokens]`; 0: every token has type 0.
    pub type_ids: u64,
    /// Word embeddings `[vocab, hidden]`.
    pub word: u64,
    /// Position embeddings `[positions, hidden]`.
    pub position: u64,
    /// Token type embeddings `[type_vocab, hidden]`.
    pub token_type: u64,
    /// LayerNorm weight `[hidden]`.
    pub gamma: u64,
    /// LayerNorm bias `[hidden]`.
    pub beta: u64,
    /// Tokens, `batch * seq_len`.
    pub tokens: usize,
    /// Tokens per sequence: token `t` is at position `t % seq_len`.
    pub seq_len: usize,
    /// Hidden size, at most [`MAX_ROW_LEN`].
    pub hidden: usize,
    /// Rows of `word`.
    pub vocab: usize,
    /// Rows of `position`.
    pub positions: usize,
    /// Rows of `token_type`.
    pub type_vocab: usize,
    /// Added to every position (RoBERTa-style models start at `padding_idx + 1`).
    pub position_offset: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
}

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
    /// Columns (hidden size), at most [`MAX_ROW_LEN`].
    pub cols: usize,
    /// LayerNorm epsilon.
    pub eps: f32,
}

/// Arguments of [`split_heads`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HeadsArgs {
    /// Query projection without bias, `[batch * seq, heads * head_dim]`.
    pub q: u64,
    /// Key projection without bias, same shape.
    pub k: u64,
    /// Value projection without bias, same shape.
    pub v: u64,
    /// Query bias `[heads * head_dim]`.
    pub q_bias: u64,
    /// Key bias.
    pub k_bias: u64,
    /// Value bias.
    pub v_bias: u64,
    /// Output `[batch * heads, seq, head_dim]`.
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

/// A checked launch: the kernel and its grid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    kernel: &'static str,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
}

impl Plan {
    fn config(&self) -> LaunchConfig {
        LaunchConfig {
            grid_dim: self.grid,
            block_dim: self.block,
            shared_mem_bytes: 0,
        }
    }
}

/// One kernel in each width for each dtype: f32, f16, bf16 × scalar, 16-byte vector.
type Names = [&'static str; 6];

// As `encoder.cu`'s `MS_ALL_WIDTHS` names them.
const EMBED_LN: Names = [
    "ms_embed_ln_f32_s",
    "ms_embed_ln_f32_v",
    "ms_embed_ln_f16_s",
    "ms_embed_ln_f16_v",
    "ms_embed_ln_bf16_s",
    "ms_embed_ln_bf16_v",
];

const RESIDUAL_LN: Names = [
    "ms_residual_ln_f32_s",
    "ms_residual_ln_f32_v",
    "ms_residual_ln_f16_s",
    "ms_residual_ln_f16_v",
    "ms_residual_ln_bf16_s",
    "ms_residual_ln_bf16_v",
];

const SOFTMAX: Names = [
    "ms_softmax_f32_s",
    "ms_softmax_f32_v",
    "ms_softmax_f16_s",
    "ms_softmax_f16_v",
    "ms_softmax_bf16_s",
    "ms_softmax_bf16_v",
];

const BIAS_GELU: Names = [
    "ms_bias_gelu_f32_s",
    "ms_bias_gelu_f32_v",
    "ms_bias_gelu_f16_s",
    "ms_bias_gelu_f16_v",
    "ms_bias_gelu_bf16_s",
    "ms_bias_gelu_bf16_v",
];

const SPLIT_HEADS: Names = [
    "ms_split_heads_f32_s",
    "ms_split_heads_f32_v",
    "ms_split_heads_f16_s",
    "ms_split_heads_f16_v",
    "ms_split_heads_bf16_s",
    "ms_split_heads_bf16_v",
];

const MERGE_HEADS: Names = [
    "ms_merge_heads_f32_s",
    "ms_merge_heads_f32_v",
    "ms_merge_heads_f16_s",
    "ms_merge_heads_f16_v",
    "ms_merge_heads_bf16_s",
    "ms_merge_heads_bf16_v",
];
const POOL: [&str; 3] = ["ms_pool_f32", "ms_pool_f16", "ms_pool_bf16"];

/// Every kernel name the launchers use, for the NVRTC compile test.
pub fn kernel_names() -> impl Iterator<Item = &'static str> {
    [
        EMBED_LN,
        RESIDUAL_LN,
        SOFTMAX,
        BIAS_GELU,
        SPLIT_HEADS,
        MERGE_HEADS,
    ]
    .into_iter()
    .flatten()
    .chain(POOL)
}

const fn dtype_index(dtype: WeightDtype) -> usize {
    match dtype {
        WeightDtype::F32 => 0,
        WeightDtype::F16 => 1,
        WeightDtype::BF16 => 2,
    }
}

/// Elements in one 16-byte chunk.
const fn vec_width(dtype: WeightDtype) -> usize {
    16 / dtype.size_bytes()
}

fn pick(names: &Names, dtype: WeightDtype, vec: bool) -> &'static str {
    names[2 * dtype_index(dtype) + usize::from(vec)]
}

/// Whether the 16-byte kernels apply: every pointer 16-byte aligned and `unit` (a row, or a
/// head) a whole number of chunks.
fn vectorizable(dtype: WeightDtype, unit: usize, ptrs: &[u64]) -> bool {
    unit.is_multiple_of(vec_width(dtype)) && ptrs.iter().all(|p| p.is_multiple_of(16))
}

/// A device buffer as the launchers see it.
#[derive(Clone, Copy, Debug)]
struct Buf {
    what: &'static str,
    ptr: u64,
    bytes: u64,
}

/// `dims` multiplied, or an error naming `what` if it overflows `i64`.
fn count(what: &str, dims: &[usize]) -> Result<u64, KernelError> {
    dims.iter()
        .try_fold(1u64, |n, d| n.checked_mul(*d as u64))
        .filter(|n| *n <= i64::MAX as u64)
        .ok_or_else(|| KernelError::bad(format!("{what} of shape {dims:?} overflows 64-bit sizes")))
}

/// A checked buffer of `elems` elements of `elem_bytes` (also its alignment).
fn buf(what: &'static str, ptr: u64, elems: u64, elem_bytes: usize) -> Result<Buf, KernelError> {
    let bytes = elems
        .checked_mul(elem_bytes as u64)
        .filter(|b| *b <= i64::MAX as u64)
        .ok_or_else(|| KernelError::bad(format!("{what} of {elems} elements overflows")))?;
    check_range(what, ptr, bytes, elem_bytes as u64)?;
    Ok(Buf { what, ptr, bytes })
}

/// `out` shares no byte with any of `inputs`.
fn disjoint(out: &Buf, inputs: &[&Buf]) -> Result<(), KernelError> {
    for input in inputs {
        if overlaps(out.ptr, out.bytes, input.ptr, input.bytes) {
            return Err(KernelError::bad(format!(
                "{} at {:#x} ({} bytes) overlaps {} at {:#x} ({} bytes)",
                out.what, out.ptr, out.bytes, input.what, input.ptr, input.bytes
            )));
        }
    }
    Ok(())
}

/// `v` as an `i32` kernel argument, or an error naming it.
fn int(what: &str, v: usize) -> Result<i32, KernelError> {
    i32::try_from(v)
        .map_err(|_| KernelError::bad(format!("{what} = {v} does not fit the kernels' i32")))
}

fn check_eps(eps: f32) -> Result<(), KernelError> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(KernelError::bad(format!(
            "layer norm eps {eps} is not finite and non-negative"
        )))
    }
}

/// The grid of a row kernel: rows of `len` elements in chunks of `width`.
fn row_plan(
    kernel: &'static str,
    rows: u64,
    len: usize,
    width: usize,
) -> Result<Plan, KernelError> {
    if len == 0 || len > MAX_ROW_LEN {
        return Err(KernelError::bad(format!(
            "rows of {len} elements: the row kernels take 1 to {MAX_ROW_LEN}"
        )));
    }
    let chunks = len / width;
    let per_thread = ROW_ELEMS / width;
    let needed = chunks.div_ceil(per_thread).max(1);
    // Short rows: a power-of-two group of lanes each, several rows per warp (the kernels'
    // reductions shuffle within the group); long rows: whole warps.
    let threads = if needed < 32 {
        needed.next_power_of_two()
    } else {
        needed.next_multiple_of(32)
    };
    debug_assert!(threads <= ROW_MAX_THREADS);
    // Blocks of at least 128 threads, whatever the row length.
    let rows_per_block = (128 / threads).max(1);
    let blocks = rows.div_ceil(rows_per_block as u64);
    let blocks = u32::try_from(blocks)
        .ok()
        .filter(|b| *b <= i32::MAX as u32)
        .ok_or_else(|| KernelError::bad(format!("{rows} rows need too many blocks")))?;
    Ok(Plan {
        kernel,
        grid: (blocks, 1, 1),
        block: (threads as u32, rows_per_block as u32, 1),
    })
}

/// The grid of an element-wise kernel over `chunks` chunks, `y` grid rows.
fn flat_plan(kernel: &'static str, chunks: u64, y: u32, multiprocessors: u32) -> Plan {
    let cap = u64::from(multiprocessors.max(1)) * FLAT_BLOCKS_PER_SM;
    let blocks = chunks.div_ceil(u64::from(FLAT_THREADS)).clamp(1, cap);
    Plan {
        kernel,
        grid: (blocks as u32, y, 1),
        block: (FLAT_THREADS, 1, 1),
    }
}

fn plan_embed(dtype: WeightDtype, a: &EmbedArgs) -> Result<Option<Plan>, KernelError> {
    if a.tokens == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes();
    if a.seq_len == 0 {
        return Err(KernelError::bad("embeddings with seq_len 0"));
    }
    match a.seq_len.checked_add(a.position_offset) {
        Some(end) if end <= a.positions => {}
        _ => {
            return Err(KernelError::bad(format!(
                "embeddings: seq_len {} + position_offset {} exceeds the {} positions",
                a.seq_len, a.position_offset, a.positions
            )));
        }
    }
    for (what, v) in [
        ("tokens", a.tokens),
        ("vocab", a.vocab),
        ("positions", a.positions),
        ("type_vocab", a.type_vocab),
    ] {
        int(what, v)?;
    }
    check_eps(a.eps)?;
    let h = a.hidden;
    let out = buf("embeddings out", a.out, count("out", &[a.tokens, h])?, es)?;
    let ids = buf("ids", a.ids, a.tokens as u64, 4)?;
    let mut inputs = vec![
        ids,
        buf("word embeddings", a.word, count("word", &[a.vocab, h])?, es)?,
        buf(
            "position embeddings",
            a.position,
            count("position", &[a.positions, h])?,
            es,
        )?,
        buf(
            "token type embeddings",
            a.token_type,
            count("token_type", &[a.type_vocab, h])?,
            es,
        )?,
        buf("gamma", a.gamma, h as u64, es)?,
        buf("beta", a.beta, h as u64, es)?,
    ];
    if a.type_ids != 0 {
        inputs.push(buf("type_ids", a.type_ids, a.tokens as u64, 4)?);
    }
    disjoint(&out, &inputs.iter().collect::<Vec<_>>())?;
    let vec = vectorizable(
        dtype,
        h,
        &[a.out, a.word, a.position, a.token_type, a.gamma, a.beta],
    );
    let width = if vec { vec_width(dtype) } else { 1 };
    row_plan(pick(&EMBED_LN, dtype, vec), a.tokens as u64, h, width).map(Some)
}

/// Enqueues `out[t, :] = LayerNorm(word[ids[t]] + position[t % seq_len + position_offset] +
/// token_type[type_ids[t]]) * gamma + beta` for every token `t`. An id (or type id) outside
/// its table contributes a zero row, never an out-of-bounds read. `tokens == 0` is a no-op.
///
/// Fails (enqueuing nothing) on `seq_len + position_offset > positions`, `hidden` outside
/// `1..=MAX_ROW_LEN`, a non-finite or negative `eps`, null or misaligned pointers, and an
/// `out` overlapping an input.
///
/// # Safety
///
/// Every pointer must be valid on `stream`'s device for the sizes in [`EmbedArgs`]
/// (`type_ids` only when non-zero), the inputs readable and `out` writable until the kernel
/// completes, and nothing else may write the inputs or touch `out` while it runs.
pub unsafe fn embed_layer_norm(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    a: &EmbedArgs,
) -> Result<(), KernelError> {
    let Some(plan) = plan_embed(dtype, a)? else {
        return Ok(());
    };
    // Checked by plan_embed: these fit in i32 (hidden ≤ MAX_ROW_LEN, tokens in i32).
    let tokens = a.tokens as i64;
    let (seq_len, hidden) = (int("seq_len", a.seq_len)?, a.hidden as i32);
    let (vocab, positions, type_vocab) = (a.vocab as i32, a.positions as i32, a.type_vocab as i32);
    let offset = int("position_offset", a.position_offset)?;
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&a.out)
        .arg(&a.ids)
        .arg(&a.type_ids)
        .arg(&a.word)
        .arg(&a.position)
        .arg(&a.token_type)
        .arg(&a.gamma)
        .arg(&a.beta)
        .arg(&tokens)
        .arg(&seq_len)
        .arg(&hidden)
        .arg(&vocab)
        .arg(&positions)
        .arg(&type_vocab)
        .arg(&offset)
        .arg(&a.eps);
    // SAFETY: the arguments match `MS_EMBED_LN`'s signature (eight pointers, long long, six
    // ints, float); plan_embed checked sizes and pointers, and the caller promised the
    // memory behind them.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}

fn plan_bias_gelu(
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

fn plan_residual(dtype: WeightDtype, a: &ResidualNormArgs) -> Result<Option<Plan>, KernelError> {
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

fn plan_split(
    dtype: WeightDtype,
    a: &HeadsArgs,
    multiprocessors: u32,
) -> Result<Option<Plan>, KernelError> {
    let n = count("split_heads", &[a.batch, a.seq, a.heads, a.head_dim])?;
    if n == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes();
    int("seq", a.seq)?;
    int("heads * head_dim", a.heads * a.head_dim)?;
    if !a.q_scale.is_finite() {
        return Err(KernelError::bad(format!(
            "q_scale {} is not finite",
            a.q_scale
        )));
    }
    let width = (a.heads * a.head_dim) as u64;
    let inputs = [
        buf("q", a.q, n, es)?,
        buf("k", a.k, n, es)?,
        buf("v", a.v, n, es)?,
        buf("q_bias", a.q_bias, width, es)?,
        buf("k_bias", a.k_bias, width, es)?,
        buf("v_bias", a.v_bias, width, es)?,
    ];
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
    Ok(Some(flat_plan(
        pick(&SPLIT_HEADS, dtype, vec),
        n / w as u64,
        3,
        multiprocessors,
    )))
}

/// Enqueues, for each of q, k and v: `out[(b·heads + h)·seq + s, d] = (in[b·seq + s,
/// h·head_dim + d] + bias[h·head_dim + d]) · scale`, with `scale = q_scale` for q and 1 for
/// k and v: the linear layers' outputs `[batch·seq, heads·head_dim]` (without their bias)
/// to the per-head layout `[batch·heads, seq, head_dim]` the batched matmuls take. Outputs
/// must not overlap any input or each other. Empty shapes are a no-op.
///
/// # Safety
///
/// The six activations must be valid for `batch·seq·heads·head_dim` elements and the biases
/// for `heads·head_dim` on `stream`'s device until the kernel completes; nothing else may
/// write the inputs or touch the outputs while it runs.
pub unsafe fn split_heads(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    a: &HeadsArgs,
) -> Result<(), KernelError> {
    let sms = cache.device_info(stream.context())?.multiprocessors;
    let Some(plan) = plan_split(dtype, a, sms)? else {
        return Ok(());
    };
    let rows = (a.batch * a.seq) as i64;
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
        .arg(&rows)
        .arg(&seq)
        .arg(&heads)
        .arg(&head_dim)
        .arg(&a.q_scale);
    // SAFETY: the arguments match `MS_SPLIT_HEADS` (nine pointers, long long, three ints,
    // float); checked by plan_split, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}

#[allow(clippy::too_many_arguments)] // The operation's own parameters.
fn plan_softmax(
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
/// Max-subtracted, f32 math. Empty shapes are a no-op; `seq` is at most [`MAX_ROW_LEN`].
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

#[allow(clippy::too_many_arguments)] // The operation's own parameters.
fn plan_merge(
    dtype: WeightDtype,
    ctx: u64,
    out: u64,
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
    multiprocessors: u32,
) -> Result<Option<Plan>, KernelError> {
    let n = count("merge_heads", &[batch, seq, heads, head_dim])?;
    if n == 0 {
        return Ok(None);
    }
    let es = dtype.size_bytes();
    int("seq", seq)?;
    int("heads * head_dim", heads * head_dim)?;
    let c = buf("ctx", ctx, n, es)?;
    let o = buf("merge_heads out", out, n, es)?;
    disjoint(&o, &[&c])?;
    let vec = vectorizable(dtype, head_dim, &[ctx, out]);
    let w = if vec { vec_width(dtype) } else { 1 };
    Ok(Some(flat_plan(
        pick(&MERGE_HEADS, dtype, vec),
        n / w as u64,
        1,
        multiprocessors,
    )))
}

/// Enqueues `out[b·seq + s, h·head_dim + d] = ctx[(b·heads + h)·seq + s, d]`: the attention
/// context `[batch·heads, seq, head_dim]` back to `[batch·seq, heads·head_dim]`. `out` must
/// not overlap `ctx`. Empty shapes are a no-op.
///
/// # Safety
///
/// `ctx` and `out` must be valid for `batch·seq·heads·head_dim` elements on `stream`'s
/// device until the kernel completes; nothing else may write `ctx` or touch `out` while it
/// runs.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub unsafe fn merge_heads(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    ctx: u64,
    out: u64,
    batch: usize,
    heads: usize,
    seq: usize,
    head_dim: usize,
) -> Result<(), KernelError> {
    let sms = cache.device_info(stream.context())?.multiprocessors;
    let Some(plan) = plan_merge(dtype, ctx, out, batch, heads, seq, head_dim, sms)? else {
        return Ok(());
    };
    let rows = (batch * seq) as i64;
    let (seq, heads, head_dim) = (seq as i32, heads as i32, head_dim as i32);
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&ctx)
        .arg(&out)
        .arg(&rows)
        .arg(&seq)
        .arg(&heads)
        .arg(&head_dim);
    // SAFETY: the arguments match `MS_MERGE_HEADS` (two pointers, long long, three ints);
    // checked by plan_merge, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}

#[allow(clippy::too_many_arguments)] // The operation's own parameters.
fn plan_pool(
    dtype: WeightDtype,
    x: u64,
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
    let xb = buf(
        "pool x",
        x,
        count("x", &[batch, seq, hidden])?,
        dtype.size_bytes(),
    )?;
    let lb = buf("lengths", lengths, batch as u64, 4)?;
    let ob = buf("pool out", out, count("out", &[batch, hidden])?, 4)?;
    disjoint(&ob, &[&xb, &lb])?;
    let threads = hidden.next_multiple_of(32).min(POOL_THREADS) as u32;
    Ok(Some(Plan {
        kernel: POOL[dtype_index(dtype)],
        grid: (blocks, 1, 1),
        block: (threads, 1, 1),
    }))
}

/// Enqueues `out` (f32 `[batch, hidden]`) = a pooling of `x [batch, seq, hidden]` over each
/// sequence's tokens `t < lengths[b]` (i32, clamped to `0..=seq`): see [`Pooling`]. Then, if
/// `normalize`, each row is divided by `max(‖row‖₂, 1e-12)` (as
/// `torch.nn.functional.normalize`). A sequence of length 0 gives zeros. `batch == 0` or
/// `hidden == 0` is a no-op.
///
/// # Safety
///
/// `x` must be valid for `batch·seq·hidden` elements, `lengths` for `batch` i32 and `out`
/// for `batch·hidden` f32 on `stream`'s device until the kernel completes; nothing else may
/// write the inputs or touch `out` while it runs.
#[allow(clippy::too_many_arguments)] // The operation's own parameters.
pub unsafe fn pool(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    dtype: WeightDtype,
    x: u64,
    lengths: u64,
    out: u64,
    batch: usize,
    seq: usize,
    hidden: usize,
    mode: Pooling,
    normalize: bool,
) -> Result<(), KernelError> {
    let Some(plan) = plan_pool(dtype, x, lengths, out, batch, seq, hidden)? else {
        return Ok(());
    };
    let (seq, hidden) = (seq as i32, hidden as i32);
    let (mode, normalize) = (mode.code(), i32::from(normalize));
    let f = cache.function(stream.context(), &ENCODER_SOURCE, plan.kernel)?;
    let mut launch = stream.launch_builder(&f);
    launch
        .arg(&x)
        .arg(&lengths)
        .arg(&out)
        .arg(&seq)
        .arg(&hidden)
        .arg(&mode)
        .arg(&normalize);
    // SAFETY: the arguments match `MS_POOL` (three pointers, four ints); checked by
    // plan_pool, the memory promised by the caller.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 0x7f00_0000_0000;
    const B: u64 = 0x7f10_0000_0000;
    const C: u64 = 0x7f20_0000_0000;
    const D: u64 = 0x7f30_0000_0000;
    const E: u64 = 0x7f40_0000_0000;
    const F: u64 = 0x7f50_0000_0000;
    const G: u64 = 0x7f60_0000_0000;
    const H: u64 = 0x7f70_0000_0000;
    const I: u64 = 0x7f80_0000_0000;

    fn embed(hidden: usize) -> EmbedArgs {
        EmbedArgs {
            out: A,
            ids: B,
            type_ids: C,
            word: D,
            position: E,
            token_type: F,
            gamma: G,
            beta: H,
            tokens: 6,
            seq_len: 3,
            hidden,
            vocab: 100,
            positions: 512,
            type_vocab: 2,
            position_offset: 0,
            eps: 1e-12,
        }
    }

    /// A launcher picks a kernel name that `encoder.cu` does not define.
    #[test]
    fn kernel_names_are_in_the_source() {
        let code = ENCODER_SOURCE.code;
        for op in [
            "embed_ln",
            "residual_ln",
            "softmax",
            "bias_gelu",
            "split_heads",
            "merge_heads",
        ] {
            assert!(code.contains(&format!(", {op})")), "{op}");
        }
        for name in POOL {
            assert!(code.contains(name), "{name}");
        }
        assert_eq!(kernel_names().count(), 39);
        assert_eq!(pick(&SOFTMAX, WeightDtype::BF16, true), "ms_softmax_bf16_v");
        assert_eq!(
            pick(&EMBED_LN, WeightDtype::F32, false),
            "ms_embed_ln_f32_s"
        );
        assert_eq!(
            pick(&MERGE_HEADS, WeightDtype::F16, true),
            "ms_merge_heads_f16_v"
        );
    }

    /// Row kernels get blocks that do not cover the row, or exceed their launch bounds.
    #[test]
    fn row_plans_cover_the_row() {
        for (len, width, threads, rows_per_block) in [
            (1, 1, 1, 128),
            (8, 8, 1, 128),
            (64, 8, 4, 32),
            (100, 1, 8, 16),
            (500, 1, 32, 4),
            (384, 8, 32, 4),
            (384, 4, 32, 4),
            (384, 1, 32, 4),
            (768, 8, 64, 2),
            (1024, 8, 64, 2),
            (1024, 4, 64, 2),
            (4096, 8, 256, 1),
            (4096, 1, 256, 1),
            (MAX_ROW_LEN, 1, 512, 1),
            (513, 1, 64, 2),
        ] {
            let p = row_plan("k", 10, len, width).expect("plan");
            assert_eq!(p.block, (threads, rows_per_block, 1), "{len}/{width}");
            assert!(p.block.0 as usize * ROW_ELEMS >= len, "{len}");
            assert!(p.block.0 * p.block.1 <= ROW_MAX_THREADS as u32);
            assert_eq!((p.block.0 * p.block.1) % 32, 0, "whole warps");
            assert_eq!(p.grid.0 as u64, 10u64.div_ceil(u64::from(rows_per_block)));
        }
        assert!(row_plan("k", 1, 0, 1).is_err());
        assert!(row_plan("k", 1, MAX_ROW_LEN + 1, 1).is_err());
    }

    /// The embedding would take the wrong kernel for its width or alignment, or launch for
    /// no tokens.
    #[test]
    fn embed_picks_its_kernel() {
        let ok = |a: &EmbedArgs| plan_embed(WeightDtype::F16, a);
        let plan = ok(&embed(384)).expect("plan").expect("some");
        assert_eq!(plan.kernel, "ms_embed_ln_f16_v");
        assert_eq!(
            ok(&embed(100)).expect("plan").expect("some").kernel,
            "ms_embed_ln_f16_s"
        );
        assert_eq!(
            ok(&EmbedArgs {
                tokens: 0,
                ..embed(384)
            })
            .expect("plan"),
            None
        );
        // Misaligned by 2 bytes: scalar kernel, not an error.
        assert_eq!(
            ok(&EmbedArgs {
                word: D + 2,
                ..embed(384)
            })
            .expect("plan")
            .expect("some")
            .kernel,
            "ms_embed_ln_f16_s"
        );
    }

    /// Embedding positions past the position table (with the offset) reach the device.
    #[test]
    fn embed_checks_positions() {
        let ok = |a: &EmbedArgs| plan_embed(WeightDtype::F16, a);
        // Positions: seq_len + offset must fit.
        assert!(
            ok(&EmbedArgs {
                seq_len: 512,
                ..embed(384)
            })
            .is_ok()
        );
        assert!(
            ok(&EmbedArgs {
                seq_len: 513,
                ..embed(384)
            })
            .is_err()
        );
        assert!(
            ok(&EmbedArgs {
                seq_len: 511,
                position_offset: 2,
                ..embed(384)
            })
            .is_err()
        );
        assert!(
            ok(&EmbedArgs {
                position_offset: usize::MAX,
                ..embed(384)
            })
            .is_err()
        );
        assert!(
            ok(&EmbedArgs {
                seq_len: 0,
                ..embed(384)
            })
            .is_err()
        );
    }

    /// Embedding pointers, sizes or eps that would read out of bounds reach the device.
    #[test]
    fn embed_checks_pointers_and_sizes() {
        let ok = |a: &EmbedArgs| plan_embed(WeightDtype::F16, a);
        // type_ids may be absent; other pointers may not.
        assert!(
            ok(&EmbedArgs {
                type_ids: 0,
                ..embed(384)
            })
            .is_ok()
        );
        assert!(
            ok(&EmbedArgs {
                word: 0,
                ..embed(384)
            })
            .is_err()
        );
        assert!(
            ok(&EmbedArgs {
                ids: B + 2,
                ..embed(384)
            })
            .is_err()
        );
        assert!(
            ok(&EmbedArgs {
                gamma: G + 1,
                ..embed(384)
            })
            .is_err()
        );
        // Out overlapping an input, bad eps, hidden limits.
        assert!(
            ok(&EmbedArgs {
                out: G - 2,
                ..embed(384)
            })
            .is_err()
        );
        assert!(
            ok(&EmbedArgs {
                eps: f32::NAN,
                ..embed(384)
            })
            .is_err()
        );
        assert!(
            ok(&EmbedArgs {
                eps: -1.0,
                ..embed(384)
            })
            .is_err()
        );
        assert!(ok(&embed(0)).is_err());
        assert!(ok(&embed(MAX_ROW_LEN + 1)).is_err());
        assert!(
            ok(&EmbedArgs {
                vocab: usize::MAX,
                ..embed(384)
            })
            .is_err()
        );
    }

    /// Residual LayerNorm refuses a legal in-place call or accepts a shifted overlap.
    #[test]
    fn residual_norm_aliasing() {
        let args = ResidualNormArgs {
            out: A,
            x: B,
            bias: C,
            residual: D,
            gamma: E,
            beta: F,
            rows: 8,
            cols: 768,
            eps: 1e-12,
        };
        let plan = |a: &ResidualNormArgs| plan_residual(WeightDtype::BF16, a);
        assert_eq!(
            plan(&args).expect("plan").expect("some").kernel,
            "ms_residual_ln_bf16_v"
        );
        assert!(
            plan(&ResidualNormArgs { out: B, ..args }).is_ok(),
            "out = x"
        );
        assert!(
            plan(&ResidualNormArgs { out: D, ..args }).is_ok(),
            "out = residual"
        );
        assert!(plan(&ResidualNormArgs { out: D + 2, ..args }).is_err());
        assert!(
            plan(&ResidualNormArgs {
                out: B - 16,
                ..args
            })
            .is_err()
        );
        assert!(
            plan(&ResidualNormArgs { out: C, ..args }).is_err(),
            "out = bias"
        );
        assert!(plan(&ResidualNormArgs { cols: 0, ..args }).is_err());
        assert_eq!(
            plan(&ResidualNormArgs { rows: 0, ..args }).expect("plan"),
            None
        );
        assert_eq!(
            plan(&ResidualNormArgs { cols: 100, ..args })
                .expect("plan")
                .expect("some")
                .kernel,
            "ms_residual_ln_bf16_s"
        );
    }

    /// Head split/merge accept overlapping outputs or vectorize across head boundaries.
    #[test]
    fn heads_checks() {
        let args = HeadsArgs {
            q: A,
            k: B,
            v: C,
            q_bias: D,
            k_bias: E,
            v_bias: F,
            q_out: G,
            k_out: H,
            v_out: I,
            batch: 2,
            seq: 5,
            heads: 3,
            head_dim: 64,
            q_scale: 0.125,
        };
        let plan = |a: &HeadsArgs| plan_split(WeightDtype::F32, a, 132);
        let p = plan(&args).expect("plan").expect("some");
        assert_eq!(p.kernel, "ms_split_heads_f32_v");
        assert_eq!(p.grid.1, 3);
        // head_dim 6 with f32: 24 bytes a head, not whole chunks.
        assert_eq!(
            plan(&HeadsArgs {
                head_dim: 6,
                ..args
            })
            .expect("plan")
            .expect("some")
            .kernel,
            "ms_split_heads_f32_s"
        );
        assert!(
            plan(&HeadsArgs {
                k_out: G + 4,
                ..args
            })
            .is_err()
        );
        assert!(plan(&HeadsArgs { v_out: A, ..args }).is_err());
        assert!(
            plan(&HeadsArgs {
                q_scale: f32::INFINITY,
                ..args
            })
            .is_err()
        );
        assert_eq!(plan(&HeadsArgs { batch: 0, ..args }).expect("plan"), None);

        let merge =
            |ctx, out, head_dim| plan_merge(WeightDtype::F16, ctx, out, 2, 3, 5, head_dim, 132);
        assert_eq!(
            merge(A, B, 64).expect("plan").expect("some").kernel,
            "ms_merge_heads_f16_v"
        );
        assert_eq!(
            merge(A, B, 12).expect("plan").expect("some").kernel,
            "ms_merge_heads_f16_s"
        );
        assert!(merge(A, A + 2, 64).is_err());
        assert!(merge(0, B, 64).is_err());
    }

    /// Softmax, GELU and pooling accept bad pointers or sizes.
    #[test]
    fn softmax_gelu_pool_checks() {
        let sm = |scores, lengths, seq| plan_softmax(WeightDtype::F16, scores, lengths, 2, 4, seq);
        assert_eq!(
            sm(A, B, 64).expect("plan").expect("some").kernel,
            "ms_softmax_f16_v"
        );
        assert_eq!(
            sm(A, B, 63).expect("plan").expect("some").kernel,
            "ms_softmax_f16_s"
        );
        assert!(sm(A, B + 2, 64).is_err(), "misaligned lengths");
        assert!(sm(A, A + 8, 64).is_err(), "lengths inside scores");
        assert!(sm(A, B, MAX_ROW_LEN + 1).is_err());
        assert_eq!(sm(A, B, 0).expect("plan"), None);

        let gelu = |x, bias, cols| plan_bias_gelu(WeightDtype::BF16, x, bias, 7, cols, 132);
        assert_eq!(
            gelu(A, B, 3072).expect("plan").expect("some").kernel,
            "ms_bias_gelu_bf16_v"
        );
        assert_eq!(
            gelu(A, B, 100).expect("plan").expect("some").kernel,
            "ms_bias_gelu_bf16_s"
        );
        assert!(gelu(A, A + 64, 100).is_err());
        assert!(gelu(A + 1, B, 100).is_err());
        assert_eq!(gelu(A, B, 0).expect("plan"), None);
        let big = plan_bias_gelu(WeightDtype::F32, A, B, 1 << 20, 4096, 132)
            .expect("plan")
            .expect("some");
        assert_eq!(big.grid.0 as u64, 132 * FLAT_BLOCKS_PER_SM);

        let pool =
            |x, lengths, out, batch| plan_pool(WeightDtype::F32, x, lengths, out, batch, 16, 100);
        let p = pool(A, B, C, 3).expect("plan").expect("some");
        assert_eq!((p.kernel, p.grid.0, p.block.0), ("ms_pool_f32", 3, 128));
        let wide = plan_pool(WeightDtype::F16, A, B, C, 3, 16, 4096)
            .expect("plan")
            .expect("some");
        assert_eq!(wide.block.0, 1024);
        assert!(pool(A, B, C + 2, 3).is_err());
        assert!(pool(A, B, A + 4, 3).is_err());
        assert_eq!(pool(A, B, C, 0).expect("plan"), None);
    }
}
