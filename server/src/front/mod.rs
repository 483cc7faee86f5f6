//! What the inference front doors share: the gRPC `GRPCInferenceService` (KServe v2 / OIP), the
//! OIP REST routes and the OpenAI routes all turn a caller's request into items and hand them
//! to [`infer`], which checks the model is one the caller may see, applies the tenant's request
//! quota and the deadline, and waits on the [`modelshare_serving::Engine`].
//!
//! - [`oip`]: the OIP tensors shared by its gRPC and REST doors (datatypes, raw layout, split
//!   into items, stack of outputs).
//! - [`cpu`]: the bounded pool a request's heavy parsing and conversion run on, off the async
//!   runtime.
//! - [`generation`]: generation items (a prompt or chat messages, sampling parameters, the
//!   streamed text and its end), as the OpenAI completion doors ask a worker for them.
//! - [`deadline`]: a request's deadline from `grpc-timeout` or an HTTP timeout header, bounded
//!   by the server's longest request time.

pub mod deadline;
pub mod generation;
pub mod oip;
pub mod triton;

use std::time::Instant;

use modelshare_proto::v1 as pb;

use crate::app::App;
use modelshare_core::tenants::Caller;
use modelshare_serving::engine::ModelServing;
use modelshare_serving::{InferError, InferRequest, InferResponse};

/// Item parameters only the generation doors set ([`generation`]), which the other doors
/// refuse: `task` makes an item a generation, `max_prompt_tokens` carries a tenant's cap.
pub const GENERATION_PARAMETERS: [&str; 2] = ["task", "max_prompt_tokens"];

/// The OIP and Triton extensions both doors serve (server metadata's `extensions`).
pub const EXTENSIONS: &[&str] = &["binary_tensor_data", "model_configuration", "statistics"];

/// Whether `caller` may send requests to `model`: a model it may not see is answered as if it
/// did not exist. The doors ask this before they parse a request's tensors, so that no work
/// proportional to the request is done for a model that is not the caller's.
pub fn check_visible(app: &App, caller: &Caller, model: &str) -> Result<(), InferError> {
    visible_model(app, caller, model).map(|_| ())
}

/// The recorded spelling of `model` (names are found in any case) when `caller` may see it;
/// else unknown, in the caller's own spelling. The request path knows a model by that spelling.
pub fn visible_model(app: &App, caller: &Caller, model: &str) -> Result<String, InferError> {
    app.host
        .registry
        .resolve(caller, model)
        .ok_or_else(|| InferError::ModelNotFound(model.to_owned()))
}

/// The most items one request may have: what a model's whole queue holds (a larger request
/// could never be admitted).
pub fn max_items(app: &App) -> usize {
    app.config.serving.max_queue_items
}

/// Computes `items` on `model` for `caller`, answering by `deadline`. `text_input`: the OIP
/// input text items came from (`None` for OpenAI texts), which a worker that declares its
/// inputs must know. A model the caller may not see is answered as if it did not exist.
/// Dropping the future cancels the request.
pub async fn infer(
    app: &App,
    caller: &Caller,
    model: &str,
    items: Vec<pb::Item>,
    text_input: Option<String>,
    deadline: Instant,
) -> Result<InferResponse, InferError> {
    let model = &visible_model(app, caller, model)?;
    // A generation's parameters come only through the generation doors, which bound them and
    // apply the tenant's caps: here they would pass unchecked, and uncharged in the queue.
    if let Some(name) = items.iter().find_map(|i| {
        GENERATION_PARAMETERS
            .iter()
            .find(|p| i.parameters.contains_key(**p))
    }) {
        return Err(InferError::InvalidInput(format!(
            "parameter '{name}' is for generation, through /v1/completions, /v1/chat/completions, .../generate or ModelStreamInfer with a text_input"
        )));
    }
    app.engine
        .infer(request(caller, model, items, deadline, text_input))
        .await
}

/// The request of `caller` for `model` (its recorded spelling), with the tenant's own request
/// quota; without one the scheduler applies the server's `max_tenant_requests`, and the admin
/// has none.
pub fn request(
    caller: &Caller,
    model: &str,
    items: Vec<pb::Item>,
    deadline: Instant,
    text_input: Option<String>,
) -> InferRequest {
    let max_outstanding = match caller {
        Caller::Admin => None,
        Caller::Tenant { quota, .. } => quota.requests.and_then(|n| usize::try_from(n).ok()),
    };
    InferRequest {
        tenant: caller.tenant().map(str::to_owned),
        model: model.to_owned(),
        items,
        deadline,
        max_outstanding,
        text_input,
    }
}

/// What the request path knows of `model` for `caller` (its serving versions, and the inputs
/// and outputs its newest worker declared), for the OIP's model metadata, the shapes as a
/// request has them ([`request_shapes`]). A model the caller may not see is unknown.
pub async fn model_serving(
    app: &App,
    caller: &Caller,
    model: &str,
) -> Result<ModelServing, InferError> {
    let mut serving = declared_serving(app, caller, model).await?;
    request_shapes(&mut serving.inputs);
    request_shapes(&mut serving.outputs);
    Ok(serving)
}

/// [`model_serving`] with one item's shapes, as the workers declared them (Triton's model
/// configuration: the batch dimension is its `max_batch_size`'s).
pub async fn declared_serving(
    app: &App,
    caller: &Caller,
    model: &str,
) -> Result<ModelServing, InferError> {
    let model = visible_model(app, caller, model)?;
    let snapshot = app.engine.snapshot().await;
    Ok(snapshot
        .model(&model)
        .cloned()
        .unwrap_or_else(|| ModelServing {
            model,
            ..ModelServing::default()
        }))
}

/// A worker declares one item's tensors; the OIP doors stack a request's items along a first
/// (batch) dimension, splitting inputs on it and joining outputs along it: the metadata says
/// what a request sends and gets, so each shape gains a leading -1 (an embedding of `[384]` per
/// item is `[-1, 384]` per request, token ids of `[-1]` are `[-1, -1]`).
pub fn request_shapes(specs: &mut [pb::TensorSpec]) {
    for spec in specs {
        spec.shape.insert(0, -1);
    }
}

/// Whether `caller`'s requests for `model` (of `version`, if named) would be taken now: a
/// worker that is not draining may receive them. An unknown or invisible model is not ready.
pub async fn model_ready(app: &App, caller: &Caller, model: &str, version: Option<u32>) -> bool {
    let Ok(model) = &visible_model(app, caller, model) else {
        return false;
    };
    let tenant = caller.tenant().map(str::to_owned);
    app.engine
        .snapshot()
        .await
        .ready_for(model, version, &tenant)
}
