//! The serving side of the echo worker: the [`Echo`] handler over the attached weights, the
//! offer's options, and the [`target`] the SDK's `run_process` serves until the worker is
//! stopped.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_worker::serve::{
    Batch, Item, ItemFailure, Outcome, PartSink, ServeOptions, Target, handle_alone, tensor_spec,
};
use modelshare_worker::{ConnectOptions, Handler, Model, TokenArg, WorkerError};
use tracing::info;

use crate::echo::{Weights, compute, sleep_ms};
use crate::generate::{generate, is_generation};

/// What the worker serves, and how.
#[derive(Debug, Clone)]
pub struct Config {
    /// Server address (`None`: found by the SDK's rule).
    pub server: Option<String>,
    /// Model to serve.
    pub model: String,
    /// Worker name shown by `modelshare ps`.
    pub name: String,
    /// Batches at once.
    pub credits: u32,
    /// Most items per batch.
    pub max_batch_items: u32,
    /// Most input bytes per batch.
    pub max_batch_bytes: u64,
    /// Items answered at once as a streaming worker (0: a batch worker).
    pub streams: u32,
    /// `--token`.
    pub token: Option<TokenArg>,
    /// `--token-file`.
    pub token_file: Option<PathBuf>,
}

/// The offer's options: both input kinds, and the tensors the echo computation reads and
/// writes: inputs `text` BYTES `[-1]` (a KServe request's texts), `input_ids` INT64 `[-1]`
/// and `input` FP32 `[-1]` (the server refuses any other name, as it does for every worker that
/// declares its inputs); outputs `embedding` FP32 `[-1]`, `echo` (the input's dtype and shape,
/// FP32 `[-1]` here) and `plus_weights` FP32 `[-1]`.
pub fn serve_options(config: &Config) -> ServeOptions {
    use pb::DType::{DtypeBytes, DtypeF32, DtypeI64};
    ServeOptions {
        credits: config.credits,
        max_batch_items: config.max_batch_items,
        max_batch_bytes: config.max_batch_bytes,
        streams: config.streams,
        inputs: vec![
            tensor_spec("text", DtypeBytes, &[-1]),
            tensor_spec("input_ids", DtypeI64, &[-1]),
            tensor_spec("input", DtypeF32, &[-1]),
        ],
        outputs: vec![
            tensor_spec("embedding", DtypeF32, &[-1]),
            tensor_spec("echo", DtypeF32, &[-1]),
            tensor_spec("plus_weights", DtypeF32, &[-1]),
        ],
        ..ServeOptions::default()
    }
}

/// The echo handler: the computation of [`crate::echo`] over the model's weights (read
/// again when the attached version changes).
#[derive(Debug)]
pub struct Echo {
    model: Arc<Model>,
    weights: Mutex<Option<(u32, Arc<Weights>)>>,
}

impl Echo {
    /// A handler over `model`'s weights.
    pub fn new(model: Arc<Model>) -> Self {
        Self {
            model,
            weights: Mutex::new(None),
        }
    }

    /// `w` of the version attached now.
    fn weights(&self) -> Result<Arc<Weights>, WorkerError> {
        let version = self.model.version();
        let mut cached = self.weights.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((v, w)) = cached.as_ref()
            && *v == version
        {
            return Ok(w.clone());
        }
        let w = Arc::new(Weights::of(&self.model)?);
        *cached = Some((version, w.clone()));
        Ok(w)
    }
}

impl Handler for Echo {
    async fn handle(&self, batch: Batch) -> Vec<Outcome> {
        let w = match self.weights() {
            Ok(w) => w,
            Err(e) => {
                let failure = ItemFailure::internal(format!("cannot read the weights: {e}"));
                return batch.items.iter().map(|_| Err(failure.clone())).collect();
            }
        };
        let sleeps: Vec<Result<u64, ItemFailure>> = batch.items.iter().map(sleep_ms).collect();
        let longest = sleeps.iter().filter_map(|s| s.as_ref().ok()).max();
        if let Some(&ms) = longest.filter(|&&ms| ms > 0) {
            // The items of a batch sleep together; all of them cancelled ends the sleep.
            let all_cancelled = async {
                for item in &batch.items {
                    item.cancelled().await;
                }
            };
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(ms)) => {}
                () = all_cancelled => {}
            }
        }
        batch
            .items
            .iter()
            .zip(sleeps)
            .map(|(item, slept)| slept.and_then(|_| compute(&w, item)))
            .collect()
    }

    /// A generation request streams its tokens ([`crate::generate`]); any other item is
    /// answered whole, as in a batch of its own.
    async fn handle_stream(&self, item: Item, mut sink: PartSink) -> Outcome {
        if is_generation(&item) {
            let outcome = generate(&item, &mut sink).await;
            if item.is_cancelled() {
                info!(
                    item = item.id,
                    parts = sink.sent(),
                    "generation cancelled by the server"
                );
            }
            return outcome;
        }
        handle_alone(self, item, &sink).await
    }
}

/// Where the worker serves: the server of `config` (else the one the SDK's rule finds) and its
/// model, with the token of the flags (else of the environment) and the TLS settings of the
/// environment (a token file is read again at every connection).
pub fn target(config: &Config) -> Result<Target, WorkerError> {
    let connect =
        ConnectOptions::from_env_and_flags(config.token.as_ref(), config.token_file.clone())?;
    let server = modelshare_worker::discover(config.server.as_deref())?;
    info!(%server, "connecting");
    Ok(Target {
        server: server.address,
        model: config.model.clone(),
        worker_name: config.name.clone(),
        connect,
    })
}
