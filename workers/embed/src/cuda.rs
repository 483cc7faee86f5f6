//! The CUDA backend (see its module docs once built).

use std::sync::Arc;

use modelshare_worker::Tensor;

use crate::encoder::{EncodeError, Encoder};
use crate::spec::ModelSpec;
use crate::weights::EncoderWeights;

/// The encoder on the GPU of the arena.
pub fn encoder(
    _spec: Arc<ModelSpec>,
    _weights: &EncoderWeights<Tensor>,
    _max_tokens: usize,
    _max_sequences: usize,
) -> Result<Box<dyn Encoder>, EncodeError> {
    Err(EncodeError::Device(
        "the CUDA backend is not built yet".into(),
    ))
}
