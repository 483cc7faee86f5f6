//! Triton's extensions of the OIP that its clients call on any server, shared by the gRPC and
//! REST doors: a model's configuration, the repository index and request statistics. Each is
//! scoped to the caller like the rest of the doors: a model the caller may not see is unknown
//! (NOT_FOUND / 404), and the index and statistics list only the models it may see.

use modelshare_core::model::VersionState;
use modelshare_core::tenants::{Caller, policy};
use modelshare_proto::v1 as pb;
use modelshare_serving::{InferError, VersionStats};

use super::{declared_serving, max_items, visible_model};
use crate::app::App;

/// What Triton calls a model's configuration, as the workers of its newest version declared
/// it: the per-item shapes are the config's `dims`, the batch dimension left out
/// (`max_batch_size` > 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelConfig {
    pub name: String,
    /// The largest request (rows of its first dimension): what the model's queue holds.
    pub max_batch_size: i32,
    pub inputs: Vec<pb::TensorSpec>,
    pub outputs: Vec<pb::TensorSpec>,
    /// How long a batch may wait to fill while its worker is busy, in microseconds.
    pub max_queue_delay_us: u64,
}

/// The configuration of `model` for `caller`.
pub async fn model_config(
    app: &App,
    caller: &Caller,
    model: &str,
) -> Result<ModelConfig, InferError> {
    // One item's shapes: the config's dims leave the batch dimension to max_batch_size.
    let serving = declared_serving(app, caller, model).await?;
    let serving_config = &app.config.serving;
    // The configured delays' keys are model names, found in any case as the models are.
    let delay = serving_config
        .queue_delays
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(&serving.model))
        .map_or(serving_config.max_queue_delay, |(_, d)| *d);
    Ok(ModelConfig {
        name: serving.model.clone(),
        max_batch_size: i32::try_from(max_items(app)).unwrap_or(i32::MAX),
        inputs: serving.inputs,
        outputs: serving.outputs,
        max_queue_delay_us: u64::try_from(delay.as_micros()).unwrap_or(u64::MAX),
    })
}

/// Triton's name of an OIP datatype in a model configuration (`FP32` is `TYPE_FP32`, `BYTES`
/// is `TYPE_STRING`); `TYPE_INVALID` for a name it does not know.
pub fn config_type(datatype: &str) -> &'static str {
    match datatype {
        "BOOL" => "TYPE_BOOL",
        "UINT8" => "TYPE_UINT8",
        "UINT16" => "TYPE_UINT16",
        "UINT32" => "TYPE_UINT32",
        "UINT64" => "TYPE_UINT64",
        "INT8" => "TYPE_INT8",
        "INT16" => "TYPE_INT16",
        "INT32" => "TYPE_INT32",
        "INT64" => "TYPE_INT64",
        "FP16" => "TYPE_FP16",
        "FP32" => "TYPE_FP32",
        "FP64" => "TYPE_FP64",
        "BYTES" => "TYPE_STRING",
        "BF16" => "TYPE_BF16",
        _ => "TYPE_INVALID",
    }
}

/// One model version of the repository index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub name: String,
    pub version: u32,
    /// `READY` (a worker serves it to this caller), `LOADING`, `UNLOADING` (draining),
    /// `UNAVAILABLE` (loaded without a worker for this caller, failed, or freed).
    pub state: &'static str,
    pub reason: String,
}

/// Every version of every model `caller` may see (only the ready ones with `ready_only`), by
/// model name then version.
pub async fn repository_index(app: &App, caller: &Caller, ready_only: bool) -> Vec<IndexEntry> {
    let snapshot = app.engine.snapshot().await;
    let tenant = caller.tenant().map(str::to_owned);
    let mut models = app.host.registry.list(caller);
    models.sort_by(|a, b| a.name.cmp(&b.name));
    let mut entries = Vec::new();
    for model in models {
        // A failed load's message (paths under the model root among it) is the owner's to read.
        let owner = policy::owns(model.owner.as_deref(), caller);
        for v in &model.versions {
            let served = snapshot.ready_for(&model.name, Some(v.version), &tenant);
            let (state, reason) = match v.state {
                VersionState::Ready if served => ("READY", String::new()),
                VersionState::Ready => ("UNAVAILABLE", "no worker serves it".to_owned()),
                VersionState::Loading => ("LOADING", String::new()),
                VersionState::Draining => ("UNLOADING", "unloaded; draining".to_owned()),
                VersionState::Freed => ("UNAVAILABLE", "unloaded".to_owned()),
                VersionState::Failed => (
                    "UNAVAILABLE",
                    v.error
                        .clone()
                        .filter(|_| owner)
                        .unwrap_or_else(|| "the load failed".into()),
                ),
            };
            if ready_only && state != "READY" {
                continue;
            }
            entries.push(IndexEntry {
                name: model.name.clone(),
                version: v.version,
                state,
                reason,
            });
        }
    }
    entries
}

/// The statistics of `model` (of its `version` only, if given), or of every model `caller`
/// may see when `model` is `None`: by model name, then version. A named model the caller may
/// not see is unknown; one that served no request yet has no entry.
pub async fn statistics(
    app: &App,
    caller: &Caller,
    model: Option<&str>,
    version: Option<u32>,
) -> Result<Vec<(String, VersionStats)>, InferError> {
    let model = model.map(|m| visible_model(app, caller, m)).transpose()?;
    let stats = app.engine.stats(model.as_deref()).await;
    // Only versions the registry holds now, and only figures of this model of the name: a
    // model unloaded and loaded again (by another tenant, perhaps) starts over from version 1,
    // and the figures of the earlier one, which began before this one was loaded, are not its.
    let models = app.host.registry.list(caller);
    let current = |name: &str, v: &VersionStats| {
        models.iter().filter(|m| m.name == name).any(|m| {
            m.versions.iter().any(|r| {
                r.version == v.version
                    && i64::try_from(v.first_unix_ms).unwrap_or(i64::MAX) >= r.created_unix_ms
            })
        })
    };
    Ok(stats
        .into_iter()
        .flat_map(|(name, versions)| {
            versions
                .into_iter()
                .filter(|v| version.is_none_or(|want| v.version == want))
                .filter(|v| current(&name, v))
                .map(|v| (name.clone(), v))
                .collect::<Vec<_>>()
        })
        .collect())
}
