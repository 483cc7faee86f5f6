//! [`CudaBert`]: the encoder on the GPU, made over an arena's weights, and its call.

use std::sync::Arc;

use cudarc::driver::CudaStream;
use modelshare_device::Mapping;

use super::buffers::Buffers;
use super::pack::{Tokens, pack};
use super::placement::{Placed, place};
use super::sizes::{Dims, Limits, check_dims, scores_elems};
use super::stages::{Marks, Stage, StageTimes};
use super::weights::EncoderWeights;
use crate::blas::Blas;
use crate::error::KernelError;
use crate::{KernelCache, WeightDtype, sys};

/// A BERT encoder on the GPU holding an arena.
#[derive(Debug)]
pub struct CudaBert {
    pub(super) dims: Dims,
    limits: Limits,
    pub(super) dtype: WeightDtype,
    /// Absolute device addresses of the weights (checked inside `_arena`).
    pub(super) weights: EncoderWeights<u64>,
    /// Keeps the arena (and so every address in `weights`) alive.
    _arena: Mapping,
    pub(super) stream: Arc<CudaStream>,
    pub(super) blas: Blas,
    pub(super) cache: KernelCache,
    pub(super) buffers: Buffers,
    /// Elements of the scores buffer.
    pub(super) scores_elems: usize,
    /// The stages' GPU time, once [`CudaBert::time_stages`] asked for it.
    stages: Option<StageTimes>,
}

impl CudaBert {
    /// An encoder over `weights` (placed in `arena`, of `dtype`), on the arena's device and
    /// context, which is bound to the calling thread. Checks every tensor's size against
    /// `dims` and its range against the arena, makes a stream that waits for the arena's
    /// load, and allocates the buffers.
    pub fn new(
        arena: &Mapping,
        weights: &EncoderWeights<Placed>,
        dtype: WeightDtype,
        dims: Dims,
        limits: Limits,
    ) -> Result<Self, KernelError> {
        sys::driver_available()?;
        let (Some(base), Some(ctx)) = (arena.device_ptr(), arena.context()) else {
            return Err(KernelError::bad("the arena is not in device memory"));
        };
        check_dims(&dims, &limits)?;
        let weights = place(arena, base, weights, dtype, &dims)?;
        ctx.bind_to_thread()?;
        let stream = ctx.new_stream()?;
        arena
            .wait_ready(&stream)
            .map_err(|e| KernelError::bad(format!("cannot wait for the arena's load: {e}")))?;
        let blas = Blas::new(stream.clone())?;
        let es = dtype.size_bytes();
        let buffers = Buffers::new(&stream, &dims, &limits, es)?;
        Ok(Self {
            dims,
            limits,
            dtype,
            weights,
            _arena: arena.clone(),
            stream,
            blas,
            cache: KernelCache::new(),
            buffers,
            scores_elems: scores_elems(&dims, &limits, es),
            stages: None,
        })
    }

    /// From now on, times each stage of every call on the GPU (an event after each; see
    /// [`CudaBert::stage_times`]).
    pub fn time_stages(&mut self) {
        self.stages.get_or_insert_with(StageTimes::default);
    }

    /// The stages' GPU time so far, if [`CudaBert::time_stages`] turned timing on.
    pub fn stage_times(&self) -> Option<&StageTimes> {
        self.stages.as_ref()
    }

    /// The limits the buffers were sized for.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The pooled vectors of `seqs`, row-major `[seqs.len(), hidden]` f32. The group must fit
    /// the limits (sequences of 1 to `max_seq_len` tokens; their count times the longest at
    /// most `max_tokens`), ids inside the vocabularies. Blocks until the result is on the host.
    pub fn encode(&mut self, seqs: &[Tokens<'_>]) -> Result<Vec<f32>, KernelError> {
        let Some(packed) = pack(self.dims, self.limits, seqs)? else {
            return Ok(Vec::new());
        };
        let g = packed.group;
        let mut marks = match self.stages {
            Some(_) => Some(Marks::start(&self.stream)?),
            None => None,
        };
        let stream = self.stream.clone();
        let mut mark = |stage: Stage| match marks.as_mut() {
            Some(m) => m.mark(&stream, stage),
            None => Ok(()),
        };
        self.upload(&packed)?;
        mark(Stage::Upload)?;
        self.embed(g)?;
        mark(Stage::Embed)?;
        for layer in &self.weights.layers {
            self.project_heads(layer, g)?;
            mark(Stage::Projections)?;
            self.attend(g)?;
            mark(Stage::Attention)?;
            self.attention_output(layer, g)?;
            mark(Stage::AttentionOutput)?;
            self.feed_forward(layer, g)?;
            mark(Stage::FeedForward)?;
        }
        let pooled = self.pool(g)?;
        mark(Stage::Pool)?;
        if let (Some(marks), Some(times)) = (marks, self.stages.as_mut()) {
            // The last event completes at once: the stream is idle after the pool's wait.
            self.stream.synchronize()?;
            let tokens = packed.lengths.iter().map(|&l| l as usize).sum();
            marks.add_to(times, g.b, tokens, g.t)?;
        }
        Ok(pooled)
    }
}
