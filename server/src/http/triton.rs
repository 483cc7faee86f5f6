//! Triton's extension routes of the OIP REST door (what `tritonclient.http` calls besides the
//! core), in Triton's JSON shapes:
//!
//! - `GET /v2/models/{name}[/versions/{v}]/config`: the model's configuration.
//! - `POST /v2/repository/index` (body optional: `{"ready": true}`): the models and versions
//!   the caller may see, with their states.
//! - `GET /v2/models/stats`, `GET /v2/models/{name}[/versions/{v}]/stats`: request statistics.
//!
//! Errors are the OIP's `{"error": "<message>"}`; a model the caller may not see is 404.

use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use modelshare_serving::{Tally, VersionStats};
use serde_json::{Value, json};

use super::door::{self, DoorError};
use super::oip::{ModelPath, error, version};
use super::state::HttpState;
use crate::connections::Connection;
use crate::front::triton::{self, config_type};

/// `GET /v2/models/{name}[/versions/{version}]/config`.
pub async fn model_config(
    State(state): State<HttpState>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let (caller, _guard) = door::admit(&state, "/v2/models", &headers)?;
        version(path.version.as_deref())?;
        let c = triton::model_config(&state.app, &caller, &path.name).await?;
        let tensors = |specs: &[modelshare_proto::v1::TensorSpec]| -> Vec<Value> {
            specs
                .iter()
                .map(|s| json!({"name": s.name, "data_type": config_type(&s.datatype), "dims": s.shape}))
                .collect()
        };
        Ok::<_, DoorError>(Json(json!({
            "name": c.name,
            "platform": "modelshare",
            "backend": "modelshare",
            "max_batch_size": c.max_batch_size,
            "input": tensors(&c.inputs),
            "output": tensors(&c.outputs),
            "dynamic_batching": {
                "preferred_batch_size": [],
                "max_queue_delay_microseconds": c.max_queue_delay_us,
            },
        })))
    }
    .await;
    result.map_or_else(error, IntoResponse::into_response)
}

/// `POST /v2/repository/index`: a JSON array of `{name, version, state, reason}`.
pub async fn repository_index(
    State(state): State<HttpState>,
    connection: Option<Extension<Connection>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let declared = super::body::declared_length(&headers);
    let mut body = Some(body);
    let result = async {
        let (caller, _guard) = door::admit(&state, "/v2/repository", &headers)?;
        // The body is read only now, after the caller is admitted, within the request budgets.
        let connection = connection.as_ref().map(|c| &c.0);
        let (body, _hold) = door::body(&state, connection, &headers, arrived, &mut body).await?;
        let ready = if body.iter().all(u8::is_ascii_whitespace) {
            false
        } else {
            let asked: Value = serde_json::from_slice(&body).map_err(|e| {
                DoorError::bad_request(format!("the request body is not JSON: {e}"))
            })?;
            match asked.get("ready") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(DoorError::bad_request(format!(
                        "'ready' must be true or false, not {other}"
                    )));
                }
            }
        };
        let entries = triton::repository_index(&state.app, &caller, ready).await;
        let models: Vec<Value> = entries
            .into_iter()
            .map(|e| {
                json!({"name": e.name, "version": e.version.to_string(), "state": e.state, "reason": e.reason})
            })
            .collect();
        Ok::<_, DoorError>(Json(Value::Array(models)))
    }
    .await;
    // A body not read (refused before) is drained in the background, as the other doors do.
    door::drain(&state, declared, body);
    result.map_or_else(error, IntoResponse::into_response)
}

/// `GET /v2/models/stats`: every model the caller may see.
pub async fn all_statistics(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    statistics(&state, &headers, None, None).await
}

/// `GET /v2/models/{name}[/versions/{version}]/stats`.
pub async fn model_statistics(
    State(state): State<HttpState>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Response {
    statistics(&state, &headers, Some(&path.name), path.version.as_deref()).await
}

async fn statistics(
    state: &HttpState,
    headers: &HeaderMap,
    model: Option<&str>,
    wanted: Option<&str>,
) -> Response {
    let result = async {
        let (caller, _guard) = door::admit(state, "/v2/models", headers)?;
        let wanted = version(wanted)?;
        let stats = triton::statistics(&state.app, &caller, model, wanted).await?;
        let model_stats: Vec<Value> = stats.into_iter().map(|(n, v)| stats_json(&n, v)).collect();
        Ok::<_, DoorError>(Json(json!({ "model_stats": model_stats })))
    }
    .await;
    result.map_or_else(error, IntoResponse::into_response)
}

/// One version's statistics in Triton's JSON (the worker's time is all `compute_infer`; the
/// input and output steps keep its count, readers divide by it).
fn stats_json(name: &str, v: VersionStats) -> Value {
    let d = |t: Tally| json!({"count": t.count, "ns": t.ns});
    let none = |t: Tally| json!({"count": t.count, "ns": 0});
    let batches: Vec<Value> = v
        .by_batch_size
        .iter()
        .map(|(size, t)| {
            json!({"batch_size": size, "compute_input": none(*t), "compute_infer": d(*t), "compute_output": none(*t)})
        })
        .collect();
    json!({
        "name": name,
        "version": v.version.to_string(),
        "last_inference": v.last_answer_unix_ms,
        "inference_count": v.items,
        "execution_count": v.compute.count,
        "inference_stats": {
            "success": d(v.success),
            "fail": d(v.fail),
            "queue": d(v.queue),
            "compute_input": none(v.compute),
            "compute_infer": d(v.compute),
            "compute_output": none(v.compute),
        },
        "batch_stats": batches,
    })
}
