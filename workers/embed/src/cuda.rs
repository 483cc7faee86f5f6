//! The CUDA backend: `modelshare_kernels::bert::CudaBert` (the forward pass on the GPU that
//! holds the arena, reading the weights in place) behind the worker's [`Encoder`].

use std::sync::Arc;

use modelshare_kernels::bert::{CudaBert, Dims, Limits, Placed, Tokens};
use modelshare_worker::{Mapping, Tensor};
use tracing::{debug, warn};

use crate::encoder::{EncodeError, Encoder};
use crate::spec::ModelSpec;
use crate::tokenize::Sequence;
use crate::weights::EncoderWeights;

/// The encoder on the GPU.
#[derive(Debug)]
struct CudaEncoder {
    hidden: usize,
    bert: CudaBert,
    /// Graphs the encoder had captured when last looked at.
    captured: usize,
}

/// The encoder on the GPU of `arena`, built on the calling (compute) thread.
pub fn encoder(
    spec: Arc<ModelSpec>,
    arena: &Mapping,
    weights: &EncoderWeights<Tensor>,
    max_tokens: usize,
    max_sequences: usize,
    time_stages: bool,
    graphs: bool,
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
    bert.use_graphs(graphs);
    Ok(Box::new(CudaEncoder {
        hidden: c.hidden,
        bert,
        captured: 0,
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
        let out = self.bert.encode(&tokens_of(seqs));
        self.say_graphs();
        Ok(out?)
    }

    fn queues_groups(&self) -> bool {
        true
    }

    fn encode_groups(&mut self, groups: &[Vec<&Sequence>]) -> Result<Vec<Vec<f32>>, EncodeError> {
        let tokens: Vec<Vec<Tokens<'_>>> = groups.iter().map(|g| tokens_of(g)).collect();
        let refs: Vec<&[Tokens<'_>]> = tokens.iter().map(Vec::as_slice).collect();
        let out = self.bert.encode_groups(&refs);
        self.say_graphs();
        Ok(out?)
    }

    fn stage_report(&self) -> Option<String> {
        self.bert.stage_times().map(|t| t.report())
    }
}

impl CudaEncoder {
    /// Logs a graph capture (debug), and, once, that one failed and the encoder launches
    /// every kernel since (warning).
    fn say_graphs(&mut self) {
        let captured = self.bert.graphs_captured();
        if captured != self.captured {
            self.captured = captured;
            debug!(captured, "captured a CUDA graph of the forward pass");
        }
        if let Some(reason) = self.bert.graphs_failure() {
            warn!(%reason, "CUDA graphs are off for this compute slot");
        }
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
