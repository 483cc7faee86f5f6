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
    /// Batches taken at once (`None`: [`Defaults`]).
    pub credits: Option<u32>,
    /// Most items in one batch (`None`: [`Defaults`]).
    pub max_batch_items: Option<u32>,
    /// Most input bytes in one batch.
    pub max_batch_bytes: u64,
    /// Most tokens in one forward pass (`None`: [`Defaults`]).
    pub max_batch_tokens: Option<usize>,
    /// The operator's settings over the model's files.
    pub overrides: Overrides,
    /// Failed by the compute thread when its encoder cannot go on after a panic.
    pub stop: Stop,
    /// Log, when serving a version ends, where the time went: the compute thread's busy and
    /// idle time, tokenization, and each stage's GPU time (CUDA events between stages).
    pub profile: bool,
    /// Compute threads, each with an encoder (and on CUDA its stream and buffers) of its own:
    /// batches in flight on the GPU at once (`None`: [`Defaults`]).
    pub compute_slots: Option<usize>,
    /// On CUDA, replay each batch's forward pass as a CUDA graph (one launch instead of ~50;
    /// see `modelshare_kernels::bert`), else launch every kernel.
    pub cuda_graphs: bool,
}

/// Models of at most this many bytes of weights are small: on CUDA they get
/// [`Defaults::SMALL_ON_DEVICE`].
pub const SMALL_MODEL_BYTES: u64 = 256 << 20;

/// How the worker batches and computes when the operator names nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    pub compute_slots: usize,
    /// Batches taken per compute slot, beyond one more for the whole worker (see
    /// [`Defaults::credits`]).
    pub batches_per_slot: u32,
    pub max_batch_items: u32,
    pub max_batch_tokens: usize,
}

impl Defaults {
    /// A small model on CUDA: its batches take little GPU time, so many small ones in flight
    /// (eight slots, two batches each and one more, up to 128 items) keep the GPU busy while
    /// the host tokenizes, packs and answers others. One MiniLM worker on an H200 went from
    /// 90,027 sentences/s (4 slots, 5 credits, batches of up to 1024) to 129,836, above four
    /// workers under MPS (108,519). Their buffers are sized for 16384 tokens (a batch of 128
    /// is ~11,000 on mixed sentences), so eight slots take the memory four did.
    pub const SMALL_ON_DEVICE: Self = Self {
        compute_slots: 8,
        batches_per_slot: 2,
        max_batch_items: 128,
        max_batch_tokens: 16384,
    };
    /// A larger model on CUDA: two slots (the second fills the gaps between one batch and
    /// the next: BERT-large +2 to +4%), big batches (its products want rows).
    pub const LARGE_ON_DEVICE: Self = Self {
        compute_slots: 2,
        batches_per_slot: 1,
        max_batch_items: 1024,
        max_batch_tokens: 32768,
    };
    /// On the CPU: one slot (slots would share the cores, each with its own copy of widened
    /// weights), one batch tokenized while one computes.
    pub const HOST: Self = Self {
        compute_slots: 1,
        batches_per_slot: 1,
        max_batch_items: 1024,
        max_batch_tokens: 32768,
    };

    /// The credits of `slots` compute slots: [`Defaults::batches_per_slot`] each, and one
    /// more (a batch tokenized while the slots compute).
    pub fn credits(&self, slots: usize) -> u32 {
        u32::try_from(slots)
            .unwrap_or(u32::MAX)
            .saturating_mul(self.batches_per_slot)
            .saturating_add(1)
    }

    /// The defaults for weights of `weight_bytes` on the device or on the host.
    pub fn of(on_device: bool, weight_bytes: u64) -> Self {
        match (on_device, weight_bytes <= SMALL_MODEL_BYTES) {
            (true, true) => Self::SMALL_ON_DEVICE,
            (true, false) => Self::LARGE_ON_DEVICE,
            (false, _) => Self::HOST,
        }
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
    let defaults = Defaults::of(on_device, weight_bytes);
    let compute_slots = config.compute_slots.unwrap_or(defaults.compute_slots);
    let credits = config
        .credits
        .unwrap_or_else(|| defaults.credits(compute_slots));
    let max_batch_items = config.max_batch_items.unwrap_or(defaults.max_batch_items);
    let max_batch_tokens = config.max_batch_tokens.unwrap_or(defaults.max_batch_tokens);
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
        max_batch_items,
        max_batch_tokens,
        cuda_graphs = on_device && config.cuda_graphs,
        "model read"
    );
    let max_tokens = max_batch_tokens.max(spec.max_seq_len);
    let max_sequences = max_batch_items.max(1) as usize;
    let arena = model.view();
    let stop = config.stop.clone();
    let on_fatal: Arc<dyn Fn(String) + Send + Sync> = Arc::new(move |reason| stop.fail(reason));
    let (profile, graphs) = (config.profile, config.cuda_graphs);
    let make = |_slot: usize| {
        let (spec, arena, weights) = (spec.clone(), arena.clone(), weights.clone());
        move || {
            let encoder: Box<dyn Encoder> = if on_device {
                crate::cuda::encoder(
                    spec,
                    &arena,
                    &weights,
                    max_tokens,
                    max_sequences,
                    profile,
                    graphs,
                )?
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
        max_batch_items,
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
    use super::{Defaults, SMALL_MODEL_BYTES};

    /// A small model on CUDA would get one slot and big batches (its GPU idle between them),
    /// or the CPU backend several slots (sharing its cores, each with its own widened
    /// weights).
    #[test]
    fn defaults_by_backend_and_model_size() {
        let minilm = 45 << 20;
        let bert_large = 670 << 20;
        assert_eq!(Defaults::of(true, minilm), Defaults::SMALL_ON_DEVICE);
        assert_eq!(
            Defaults::of(true, SMALL_MODEL_BYTES),
            Defaults::SMALL_ON_DEVICE
        );
        assert_eq!(
            Defaults::of(true, SMALL_MODEL_BYTES + 1),
            Defaults::LARGE_ON_DEVICE
        );
        assert_eq!(Defaults::of(true, bert_large), Defaults::LARGE_ON_DEVICE);
        assert_eq!(Defaults::of(false, bert_large), Defaults::HOST);
        assert_eq!(Defaults::of(false, minilm), Defaults::HOST);
        assert_eq!(Defaults::SMALL_ON_DEVICE.credits(8), 17);
        assert_eq!(Defaults::LARGE_ON_DEVICE.credits(2), 3);
        assert_eq!(
            Defaults::SMALL_ON_DEVICE.credits(1),
            3,
            "named slots keep the ratio"
        );
        for d in [
            Defaults::SMALL_ON_DEVICE,
            Defaults::LARGE_ON_DEVICE,
            Defaults::HOST,
        ] {
            assert!(
                d.credits(d.compute_slots) as usize > d.compute_slots,
                "{d:?}: a batch waits"
            );
            assert!(d.max_batch_items > 0 && d.max_batch_tokens > 0);
        }
    }
}
