//! The OpenAI-compatible routes: `POST /v1/embeddings`, `GET /v1/models`,
//! `GET /v1/models/{id}`; many models behind one endpoint, chosen by `model`.
//!
//! - `input`: a string, a list of strings, a list of token ids, or a list of lists of token ids;
//!   each string or token list is one item (strings as text items, token ids as a tensor item
//!   `input_ids`, INT64 [n]).
//! - `encoding_format`: `float` (default) or `base64` (the little-endian f32 bytes).
//! - `dimensions`: passed to the worker as the item parameter `dimensions`; the worker refuses
//!   it when the model cannot.
//! - The embedding is the output tensor `embedding` (else the first FP32/FP16/BF16 one), rank 1
//!   or [1, d]; `usage.prompt_tokens` sums the items' `prompt_tokens` output parameters.
//! - Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

use std::collections::HashMap;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use modelshare_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{Value, json};

use super::door::{self, DoorError};
use super::state::HttpState;
use crate::connections::Connection;
use crate::front;
use crate::request_id::RequestTrace;
use modelshare_serving::InferError;

/// Most inputs in one request (OpenAI's own limit).
const MAX_INPUTS: usize = 2048;

/// An error in OpenAI's shape (a 404 of these routes is a model not found).
pub(super) fn error(e: impl Into<DoorError>) -> Response {
    let e = e.into();
    let (kind, code) = match e.status {
        StatusCode::UNAUTHORIZED => ("authentication_error", Some("invalid_api_key")),
        StatusCode::FORBIDDEN => ("permission_error", None),
        StatusCode::NOT_FOUND => ("invalid_request_error", Some("model_not_found")),
        StatusCode::TOO_MANY_REQUESTS => ("rate_limit_error", Some("rate_limit_exceeded")),
        s if s.is_client_error() => ("invalid_request_error", None),
        _ => ("server_error", None),
    };
    shaped(e, kind, code)
}

/// A path or method under `/v1` that no route takes, as OpenAI answers one (no `code`).
pub(super) fn no_route(e: DoorError) -> Response {
    shaped(e, "invalid_request_error", None)
}

fn shaped(e: DoorError, kind: &str, code: Option<&str>) -> Response {
    let body = json!({
        "error": { "message": e.message, "type": kind, "param": Value::Null, "code": code }
    });
    let response = (e.status, Json(body)).into_response();
    e.decorate(response)
}

/// What `input` may be, read straight from the body (no intermediate JSON value: a body of
/// token ids as `serde_json::Value` took 33 times its size), at most [`MAX_INPUTS`] entries.
#[derive(Debug)]
enum Input {
    One(String),
    Many(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

/// The first element of a list decides what the list holds.
enum First {
    Text(String),
    Id(i64),
    Ids(Vec<i64>),
}

impl<'de> Deserialize<'de> for First {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = First;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a string, a token id or a list of token ids")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<First, E> {
                Ok(First::Text(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<First, E> {
                Ok(First::Text(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<First, E> {
                Ok(First::Id(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<First, E> {
                i64::try_from(v)
                    .map(First::Id)
                    .map_err(|_| E::custom("a token id is past i64"))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<First, A::Error> {
                bounded(seq).map(First::Ids)
            }
        }
        d.deserialize_any(V)
    }
}

/// A list's remaining elements, refusing more than [`MAX_INPUTS`] in all (`have` taken).
fn bounded_rest<'de, T: Deserialize<'de>, A: serde::de::SeqAccess<'de>>(
    mut seq: A,
    mut out: Vec<T>,
) -> Result<Vec<T>, A::Error> {
    while let Some(v) = seq.next_element()? {
        if out.len() == MAX_INPUTS {
            return Err(serde::de::Error::custom(format_args!(
                "'input' has more than {MAX_INPUTS} entries"
            )));
        }
        out.push(v);
    }
    Ok(out)
}

/// A list of token ids: bounded by the body's size, not by a count (one input may be long).
fn bounded<'de, A: serde::de::SeqAccess<'de>>(mut seq: A) -> Result<Vec<i64>, A::Error> {
    let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
    while let Some(v) = seq.next_element()? {
        out.push(v);
    }
    Ok(out)
}

impl<'de> Deserialize<'de> for Input {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Input;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(
                    "a string, a list of strings, a list of token ids, or a list of lists of token ids",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Input, E> {
                Ok(Input::One(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Input, E> {
                Ok(Input::One(v))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Input, A::Error> {
                Ok(match seq.next_element::<First>()? {
                    None => Input::Many(Vec::new()),
                    Some(First::Text(s)) => Input::Many(bounded_rest(seq, vec![s])?),
                    Some(First::Id(i)) => {
                        let mut ids = bounded(seq)?;
                        ids.insert(0, i);
                        Input::Tokens(ids)
                    }
                    Some(First::Ids(v)) => Input::TokenLists(bounded_rest(seq, vec![v])?),
                })
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
struct EmbeddingsBody {
    input: Input,
    model: String,
    #[serde(default)]
    encoding_format: Option<String>,
    #[serde(default)]
    dimensions: Option<i64>,
    #[serde(default)]
    #[allow(dead_code)]
    user: Option<String>,
}

fn text_item(text: String) -> pb::Item {
    pb::Item {
        input: Some(pb::item::Input::Text(pb::TextInput { text })),
        ..Default::default()
    }
}

fn tokens_item(ids: &[i64]) -> pb::Item {
    let data: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
    pb::Item {
        input: Some(pb::item::Input::Tensors(pb::Tensors {
            tensors: vec![pb::TensorInput {
                name: "input_ids".into(),
                dtype: pb::DType::DtypeI64 as i32,
                shape: vec![ids.len() as i64],
                data: data.into(),
            }],
        })),
        ..Default::default()
    }
}

/// The body's model, its items, and whether floats (not base64) are asked. Public for the
/// fuzz target `openai` (`fuzz/request_checks.rs`).
pub fn items(body: &[u8]) -> Result<(String, Vec<pb::Item>, bool), DoorError> {
    let super::json::Object(req) =
        serde_json::from_slice::<super::json::Object<EmbeddingsBody>>(body)
            .map_err(|e| DoorError::bad_request(format!("malformed request JSON: {e}")))?;
    let mut items = match req.input {
        Input::One(s) => vec![text_item(s)],
        Input::Many(v) => v.into_iter().map(text_item).collect(),
        Input::Tokens(ids) if ids.is_empty() => Vec::new(),
        Input::Tokens(ids) => vec![tokens_item(&ids)],
        Input::TokenLists(lists) => {
            if lists.iter().any(Vec::is_empty) {
                return Err(DoorError::bad_request(
                    "'input' has an empty list of token ids",
                ));
            }
            lists.iter().map(|l| tokens_item(l)).collect()
        }
    };
    if items.is_empty() {
        return Err(DoorError::bad_request("'input' is empty"));
    }
    if items.len() > MAX_INPUTS {
        return Err(DoorError::bad_request(format!(
            "'input' has {} entries; at most {MAX_INPUTS}",
            items.len()
        )));
    }
    let floats = match req.encoding_format.as_deref() {
        None | Some("float") => true,
        Some("base64") => false,
        Some(other) => {
            return Err(DoorError::bad_request(format!(
                "'encoding_format' must be 'float' or 'base64', not '{}'",
                other.escape_debug()
            )));
        }
    };
    if let Some(d) = req.dimensions {
        if d < 1 {
            return Err(DoorError::bad_request("'dimensions' must be at least 1"));
        }
        for item in &mut items {
            item.parameters.insert(
                "dimensions".into(),
                pb::Parameter {
                    value: Some(pb::parameter::Value::Int64Value(d)),
                },
            );
        }
    }
    Ok((req.model, items, floats))
}

/// One item's embedding as f32 values.
/// `POST /v1/embeddings`. The caller is admitted before a byte of the body is read; parsing
/// and rendering run on the request pool ([`crate::cpu`]), off the async runtime.
pub async fn embeddings(
    State(state): State<HttpState>,
    connection: Option<Extension<Connection>>,
    trace: Option<Extension<RequestTrace>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let declared = super::body::declared_length(&headers);
    let mut body = Some(body);
    let result = async {
        let (caller, _guard) = door::admit(&state, "/v1/embeddings", &headers)?;
        let deadline = door::deadline(&state, &headers, arrived)?;
        let connection = connection.as_ref().map(|c| &c.0);
        let (body, hold) = door::body(&state, connection, &headers, arrived, &mut body).await?;
        let (model, mut items, floats) = state
            .app
            .cpu
            .run_sized(body.len(), deadline, move || items(&body))
            .await??;
        drop(hold);
        if let Some(Extension(trace)) = &trace {
            trace.stamp(&mut items);
        }
        let r = front::infer(&state.app, &caller, &model, items, None, deadline).await?;
        let render_by = Instant::now() + state.app.config.serving.max_request_time;
        let size = r.outputs.iter().map(super::oip::output_bytes).sum();
        let rendered = state
            .app
            .cpu
            .run_sized(size, render_by, move || {
                super::embedding_json::render(&r, floats).map(|body| {
                    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
                })
            })
            .await??;
        Ok::<_, DoorError>(rendered)
    }
    .await;
    // Answered before its body was read: the client may still be sending it.
    door::drain(&state, declared, body);
    result.unwrap_or_else(error)
}

fn model_json(m: &modelshare_core::registry::ModelSnapshot) -> Value {
    let created = m.versions.first().map_or(0, |v| v.created_unix_ms / 1000);
    json!({
        "id": m.name,
        "object": "model",
        "created": created,
        "owned_by": m.owner.as_deref().unwrap_or("modelshare"),
    })
}

/// `GET /v1/models`: the models the caller may see.
pub async fn models(State(state): State<HttpState>, headers: HeaderMap) -> Response {
    match door::admit(&state, "/v1/models", &headers) {
        Err(e) => error(e),
        Ok((caller, _guard)) => {
            let data: Vec<Value> = state
                .app
                .host
                .registry
                .list(&caller)
                .iter()
                .map(model_json)
                .collect();
            Json(json!({ "object": "list", "data": data })).into_response()
        }
    }
}

/// `GET /v1/models/{id}`.
pub async fn model(
    State(state): State<HttpState>,
    Path(params): Path<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    // `/v1/models/{id}`, or `/v1/models/{id}/{rest}` for an owner/name id.
    let id = match (params.get("id"), params.get("rest")) {
        (Some(id), Some(rest)) => format!("{id}/{rest}"),
        (Some(id), None) => id.clone(),
        _ => String::new(),
    };
    match door::admit(&state, "/v1/models", &headers) {
        Err(e) => error(e),
        Ok((caller, _guard)) => {
            let found = state
                .app
                .host
                .registry
                .list(&caller)
                .into_iter()
                .find(|m| m.name.eq_ignore_ascii_case(&id));
            match found {
                Some(m) => Json(model_json(&m)).into_response(),
                None => error(InferError::ModelNotFound(id)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_input_form_becomes_items_and_bad_ones_are_400() {
        let (model, it, floats) = items(br#"{"model":"m","input":"hi"}"#).expect("string");
        assert_eq!((model.as_str(), it.len(), floats), ("m", 1, true));
        let (_, it, _) = items(br#"{"model":"m","input":["a","b"],"dimensions":4}"#).expect("list");
        assert_eq!(it.len(), 2);
        assert!(it[1].parameters.contains_key("dimensions"));
        let (_, it, _) = items(br#"{"model":"m","input":[1,2,3]}"#).expect("tokens");
        assert_eq!(it.len(), 1);
        let (_, it, floats) =
            items(br#"{"model":"m","input":[[1],[2,3]],"encoding_format":"base64"}"#)
                .expect("lists");
        assert_eq!((it.len(), floats), (2, false));
        for bad in [
            &br#"{"model":"m","input":[]}"#[..],
            br#"{"model":"m","input":[[]]}"#,
            br#"{"model":"m","input":{"x":1}}"#,
            br#"{"model":"m","input":"x","encoding_format":"int8"}"#,
            br#"{"model":"m","input":"x","dimensions":0}"#,
            br#"{"input":"x"}"#,
            br#"{"model":"m","input":"#,
            br#"{"model":"m","input":["a",1]}"#,
            br#"{"model":"m","input":[1,"a"]}"#,
            br#"{"model":"m","input":[[1],"a"]}"#,
            br#"{"model":"m","input":[1.5]}"#,
            br#"{"model":"m","input":[18446744073709551615]}"#,
        ] {
            let e = items(bad).expect_err("bad");
            assert_eq!(
                e.status,
                StatusCode::BAD_REQUEST,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
    #[test]
    fn errors_have_openais_shape() {
        let e = DoorError {
            status: StatusCode::TOO_MANY_REQUESTS,
            message: "full".into(),
            retry_after: Some(std::time::Duration::from_secs(1)),
        };
        let r = error(e);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()["retry-after"], "1");
    }
}
