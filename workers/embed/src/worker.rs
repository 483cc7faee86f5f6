//! Serving a model: for each version attached, read its spec and tokenizer from its files,
//! find its tensors, start the compute thread with the backend its arena calls for (CUDA
//! for an arena in device memory, the CPU for one in host memory), and offer it.

use std::sync::Arc;

use modelshare_proto::v1 as pb;
use modelshare_worker::serve::{ServeOptions, tensor_spec};
use modelshare_worker::{Model, Tensor, WorkerError};
use tracing::info;

use crate::compute::Slots;
use crate::cpu::CpuEncoder;
use crate::encoder::Encoder;
use crate::handler::{Embedder, INPUT_IDS, OUTPUT};
use crate::process::Stop;
use crate::spec::{ModelSpec, Overrides, SpecError, TOKENIZER_FILE};
use crate::tokenize::TextEncoder;
use crate::weights::{Found, find};

/// How the worker serves.
#[derive(Debug, Clone)]
pub struct Config {
    /// Batches taken at once (`None`: one more than the compute slots).
    pub credits: Option<u32>,
    /// Most items in one batch.
    pub max_batch_items: u32,
    /// Most input bytes in one batch.
    pub max_batch_bytes: u64,
    /// Most tokens (sequences × padded length) in one forward pass.
    pub max_batch_tokens: usize,
    /// The operator's settings over the model's files.
    pub overrides: Overrides,
    /// Failed by the compute thread when its encoder cannot go on after a panic.
    pub stop: Stop,
    /// Log, when serving a version ends, where the time went: the compute thread's busy and
    /// idle time, tokenization, and each stage's GPU time (CUDA events between stages).
    pub profile: bool,
    /// Compute threads, each with an encoder (and on CUDA its stream and buffers) of its own:
    /// batches in flight on the GPU at once (`None`: [`default_slots`]).
    pub compute_slots: Option<usize>,
}

/// Models of at most this many bytes of weights get [`SMALL_MODEL_SLOTS`] compute slots on
/// CUDA by default, larger ones [`LARGE_MODEL_SLOTS`].
pub const SMALL_MODEL_BYTES: u64 = 256 << 20;
/// The default compute slots of a small model on CUDA.
pub const SMALL_MODEL_SLOTS: usize = 4;
/// The default compute slots of a larger model on CUDA.
pub const LARGE_MODEL_SLOTS: usize = 2;

/// The compute slots when the operator names none: on CUDA [`SMALL_MODEL_SLOTS`] for a model
/// of at most [`SMALL_MODEL_BYTES`] of weights, else [`LARGE_MODEL_SLOTS`]; on the CPU 1 (the
/// slots would share the cores, each with its own copy of widened weights). A small model's
/// groups take little GPU time, so one thread's host work between batches (packing, launches,
/// the copy down, the answer) leaves the GPU idle, and several slots overlap it; a large
/// model's second slot fills the gaps between one batch and the next.
pub fn default_slots(on_device: bool, weight_bytes: u64) -> usize {
    match (on_device, weight_bytes <= SMALL_MODEL_BYTES) {
        (true, true) => SMALL_MODEL_SLOTS,
        (true, false) => LARGE_MODEL_SLOTS,
        (false, _) => 1,
    }
}

/// The handler and options for one attached version.
pub fn setup(model: Arc<Model>, config: &Config) -> Result<(ServeOptions, Embedder), WorkerError> {
    let unservable = |reason: String| WorkerError::Unservable {
        model: model.name().to_owned(),
        version: model.version(),
        reason,
    };
    let file = |name: &str| model.metadata(name);
    let spec =
        Arc::new(ModelSpec::read(&file, &config.overrides).map_err(|e| unservable(e.to_string()))?);
    let tokenizer = file(TOKENIZER_FILE)
        .ok_or_else(|| unservable(SpecError::new(TOKENIZER_FILE, "is missing").to_string()))?;
    let text =
        Arc::new(TextEncoder::new(&tokenizer, &spec).map_err(|e| unservable(e.to_string()))?);
    let weights =
        find(&spec.encoder, &|name| found(&model, name)).map_err(|e| unservable(e.to_string()))?;
    let on_device = model.view().is_on_device();
    let weight_bytes = model.manifest().arena_bytes;
    let compute_slots = config
        .compute_slots
        .unwrap_or_else(|| default_slots(on_device, weight_bytes));
    let credits = config.credits.unwrap_or(compute_slots as u32 + 1);
    info!(
        model = %model.name(),
        version = model.version(),
        backend = if on_device { "cuda" } else { "cpu" },
        dtype = weights.dtype.name(),
        layers = spec.encoder.layers,
        hidden = spec.encoder.hidden,
        max_seq_len = spec.max_seq_len,
        pooling = ?spec.pooling,
        normalize = spec.normalize,
        compute_slots,
        credits,
        "model read"
    );
    let max_tokens = config.max_batch_tokens.max(spec.max_seq_len);
    let max_sequences = config.max_batch_items.max(1) as usize;
    let arena = model.view();
    let stop = config.stop.clone();
    let on_fatal: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |reason| stop.fail(reason));
    let profile = config.profile;
    let make = |_slot: usize| {
        let (spec, arena, weights) = (spec.clone(), arena.clone(), weights.clone());
        move || {
            let encoder: Box<dyn Encoder> = if on_device {
                crate::cuda::encoder(spec, &arena, &weights, max_tokens, max_sequences, profile)?
            } else {
                Box::new(CpuEncoder::new(spec, &weights, max_tokens, max_sequences)?)
            };
            Ok(encoder)
        }
    };
    let compute = tokio::task::block_in_place(|| {
        Slots::start(compute_slots, "embed-compute", make, on_fatal, profile)
    })
    .map_err(|e| unservable(e.to_string()))?;
    let options = ServeOptions {
        credits,
        max_batch_items: config.max_batch_items,
        max_batch_bytes: config.max_batch_bytes,
        inputs: vec![
            tensor_spec("text", pb::DType::DtypeBytes, &[-1]),
            tensor_spec(INPUT_IDS, pb::DType::DtypeI64, &[-1]),
        ],
        outputs: vec![tensor_spec(
            OUTPUT,
            pb::DType::DtypeF32,
            &[spec.encoder.hidden as i64],
        )],
        ..ServeOptions::default()
    };
    Ok((options, Embedder::new(text, compute, model, config.profile)))
}

/// A tensor of the model as the weight finder sees it.
fn found(model: &Model, name: &str) -> Option<Found<Tensor>> {
    let t = model.tensor(name).ok()?;
    let dtype = match t.dtype() {
        pb::DType::DtypeF32 => Some(modelshare_kernels::WeightDtype::F32),
        pb::DType::DtypeF16 => Some(modelshare_kernels::WeightDtype::F16),
        pb::DType::DtypeBf16 => Some(modelshare_kernels::WeightDtype::BF16),
        _ => None,
    };
    Some(Found {
        dtype,
        shape: t.shape().to_vec(),
        handle: t,
    })
}

#[cfg(test)]
mod tests {
    use super::{LARGE_MODEL_SLOTS, SMALL_MODEL_BYTES, SMALL_MODEL_SLOTS, default_slots};

    /// A small model on CUDA would get one slot (its GPU idle between batches), or the CPU
    /// backend several (sharing its cores, each with its own widened weights).
    #[test]
    fn slots_by_backend_and_model_size() {
        let minilm = 45 << 20;
        let bert_large = 670 << 20;
        assert_eq!(default_slots(true, minilm), SMALL_MODEL_SLOTS);
        assert_eq!(default_slots(true, SMALL_MODEL_BYTES), SMALL_MODEL_SLOTS);
        assert_eq!(
            default_slots(true, SMALL_MODEL_BYTES + 1),
            LARGE_MODEL_SLOTS
        );
        assert_eq!(default_slots(true, bert_large), LARGE_MODEL_SLOTS);
        assert_eq!(default_slots(false, bert_large), 1);
        assert_eq!(default_slots(false, minilm), 1);
    }
}
