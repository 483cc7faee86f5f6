//! Embeddings + LayerNorm: each token's word, position and token-type rows summed and
//! normalized ([`embed_layer_norm`]).

use std::sync::Arc;

use cudarc::driver::{CudaStream, PushKernelArg};

use super::checks::{buf, check_eps, count, disjoint, int};
use super::names::{EMBED_LN, pick};
use super::plan::{Plan, row_plan, vec_width, vectorizable};
use crate::compile::{ENCODER_SOURCE, KernelCache};
use crate::error::KernelError;
use crate::gemv::WeightDtype;

/// Arguments of [`embed_layer_norm`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmbedArgs {
    /// Output `[tokens, hidden]`.
    pub out: u64,
    /// Token ids, i32 `[tokens]`.
    pub ids: u64,
    /// Token type ids, i32 `[tokens]`; 0: every token has type 0.
    pub type_ids: u64,
    /// Each token's position in its sequence, i32 `[tokens]` (packed sequences); 0: token
    /// `t` is at position `t % seq_len` (sequences padded to `seq_len`).
    pub position_ids: u64,
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
    /// Tokens per sequence, at most: every position is below it.
    pub seq_len: usize,
    /// Hidden size, at most [`MAX_ROW_LEN`](super::MAX_ROW_LEN).
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

/// The checked launch of [`embed_layer_norm`], `None` for no tokens.
pub(super) fn plan_embed(dtype: WeightDtype, a: &EmbedArgs) -> Result<Option<Plan>, KernelError> {
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
    if a.position_ids != 0 {
        inputs.push(buf("position_ids", a.position_ids, a.tokens as u64, 4)?);
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

/// Enqueues `out[t, :] = LayerNorm(word[ids[t]] + position[p + position_offset] +
/// token_type[type_ids[t]]) * gamma + beta` for every token `t`, with `p = position_ids[t]`
/// (or `t % seq_len` without them). An id, type id or position outside its table
/// contributes a zero row, never an out-of-bounds read. `tokens == 0` is a no-op.
///
/// Fails (enqueuing nothing) on `seq_len + position_offset > positions`, `hidden` outside
/// `1..=MAX_ROW_LEN`, a non-finite or negative `eps`, null or misaligned pointers, and an
/// `out` overlapping an input.
///
/// # Safety
///
/// Every pointer must be valid on `stream`'s device for the sizes in [`EmbedArgs`]
/// (`type_ids` and `position_ids` only when non-zero), the inputs readable and `out` writable until the kernel
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
        .arg(&a.position_ids)
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
    // SAFETY: the arguments match `MS_EMBED_LN`'s signature (nine pointers, long long, six
    // ints, float); plan_embed checked sizes and pointers, and the caller promised the
    // memory behind them.
    unsafe { launch.launch(plan.config()) }?;
    Ok(())
}
