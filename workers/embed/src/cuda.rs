//! The CUDA backend: `modelshare_kernels::bert::CudaBert` (the forward pass on the GPU that
//! holds the arena, reading the weights in place) behind the worker's [`Encoder`].

use std::sync::Arc;

use modelshare_kernels::bert::{CudaBert, Dims, Limits, Placed, Tokens};
use modelshare_worker::{Mapping, Tensor};

use crate::encoder::{EncodeError, Encoder};
use crate::spec::ModelSpec;
use crate::tokenize::Sequence;
use crate::weights::EncoderWeights;

/// The encoder on the GPU.
#[derive(Debug)]
struct CudaEncoder {
    hidden: usize,
    bert: CudaBert,
}

/// The encoder on the GPU of `arena`, built on the calling (compute) thread.
pub fn encoder(
    spec: Arc<ModelSpec>,
    arena: &Mapping,
    weights: &EncoderWeights<Tensor>,
    max_tokens: usize,
    max_sequences: usize,
    time_stages: bool,
) -> Result<Box<dyn Encoder>, EncodeError> {
    let c = &spec.encoder;
    let placed = weights.try_map(|t| {
        Ok::<_, EncodeError>(Placed {
            offset: t.offset(),
            bytes: t.byte_length(),
        })
    })?;
    let dims = Dims {
        vocab: c.vocab,
        hidden: c.hidden,
        heads: c.heads,
        intermediate: c.intermediate,
        max_positions: c.max_positions,
        type_vocab: c.type_vocab,
        position_offset: c.position_offset,
        eps: c.eps,
        pooling: spec.pooling,
        normalize: spec.normalize,
    };
    let limits = Limits {
        max_tokens: max_tokens.max(spec.max_seq_len),
        max_sequences: max_sequences.max(1),
        max_seq_len: spec.max_seq_len,
    };
    let mut bert = CudaBert::new(arena, &placed, weights.dtype, dims, limits)?;
    if time_stages {
        bert.time_stages();
    }
    Ok(Box::new(CudaEncoder {
        hidden: c.hidden,
        bert,
    }))
}

impl Encoder for CudaEncoder {
    fn hidden(&self) -> usize {
        self.hidden
    }

    fn max_tokens(&self) -> usize {
        self.bert.limits().max_tokens
    }

    /// Only without the fused attention (see [`CudaBert::pads`]).
    fn pads(&self) -> bool {
        self.bert.pads()
    }

    fn max_sequences(&self) -> usize {
        self.bert.limits().max_sequences
    }

    /// No. The activation buffers are rewritten by every call before they are read (so stale
    /// values alone would not matter), but a panic means a size or pointer computation of the
    /// forward pass broke an invariant the safe layer relies on, and the launches already
    /// made in the abandoned pass are on the stream with arguments from that same
    /// computation: one may have written outside its buffer, into another allocation of this
    /// context or into the shared arena that other workers read, or left a sticky context
    /// error; cuBLAS or cudarc may also have been mid-call. None of this can be checked from
    /// here, so the worker answers the batch with the error and exits (its supervisor starts
    /// a fresh process: a new context, stream, cuBLAS handle and buffers).
    fn survives_panic(&self) -> bool {
        false
    }

    fn encode(&mut self, seqs: &[&Sequence]) -> Result<Vec<f32>, EncodeError> {
        Ok(self.bert.encode(&tokens_of(seqs))?)
    }

    fn queues_groups(&self) -> bool {
        true
    }

    fn encode_groups(&mut self, groups: &[Vec<&Sequence>]) -> Result<Vec<Vec<f32>>, EncodeError> {
        let tokens: Vec<Vec<Tokens<'_>>> = groups.iter().map(|g| tokens_of(g)).collect();
        let refs: Vec<&[Tokens<'_>]> = tokens.iter().map(Vec::as_slice).collect();
        Ok(self.bert.encode_groups(&refs)?)
    }

    fn stage_report(&self) -> Option<String> {
        self.bert.stage_times().map(|t| t.report())
    }
}

/// The kernels' view of the sequences.
fn tokens_of<'a>(seqs: &[&'a Sequence]) -> Vec<Tokens<'a>> {
    seqs.iter()
        .map(|s| Tokens {
            ids: &s.ids,
            type_ids: &s.type_ids,
        })
        .collect()
}
