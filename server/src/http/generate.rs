//! KServe's (Triton's) generate extension: `POST /v2/models/{name}[/versions/{v}]/generate` and
//! `.../generate_stream`, over a streaming worker's generation items
//! ([`crate::front::generation`]).
//!
//! - The request is a JSON object: `text_input` (the prompt) and optional `parameters`
//!   (`max_tokens`, `temperature`, `top_p`, `seed`, `stop`: a string or a list of strings); the
//!   same names at the top level are taken too (top-level wins). Other fields are ignored.
//! - `generate` answers one JSON object: `model_name`, `model_version`, `text_output` (the whole
//!   text), `finish_reason`, `prompt_tokens`, `completion_tokens` (and `id` when the request
//!   gave one).
//! - `generate_stream` answers server-sent events, one per part, each such an object with the
//!   part's text in `text_output`; the last one carries the end (`finish_reason` and usage).
//! - Errors are `{"error": "<message>"}` with the status of [`DoorError`]; after the stream
//!   started, an event of that object, and the stream ends.

use std::collections::HashMap;
use std::time::Instant;

use axum::Json;
use axum::body::Body;
use axum::extract::{Extension, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use modelshare_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::door::{self, DoorError};
use super::oip::{ModelPath, error, version};
use super::state::HttpState;
use super::streamed::{self, Events};
use crate::connections::Connection;
use crate::front::generation::{self, Finish, Generation, Tokens};
use crate::request_id::RequestTrace;
use modelshare_serving::InferError;

/// The request's fields this door reads.
#[derive(Debug, Deserialize)]
struct GenerateBody {
    text_input: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(flatten)]
    rest: Map<String, Value>,
}

/// The generation parameters' names.
const PARAMETERS: [&str; 5] = ["max_tokens", "temperature", "top_p", "seed", "stop"];

/// A JSON value as a request parameter (`stop` lists as a JSON array string).
fn parameter(name: &str, v: &Value) -> Result<pb::Parameter, InferError> {
    use pb::parameter::Value as P;
    let value = match v {
        Value::Bool(b) => P::BoolValue(*b),
        Value::Number(n) if n.is_i64() => P::Int64Value(n.as_i64().unwrap_or_default()),
        Value::Number(n) => P::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => P::StringValue(s.clone()),
        Value::Array(_) if name == "stop" => P::StringValue(v.to_string()),
        _ => {
            return Err(InferError::InvalidInput(format!(
                "parameter '{name}' must be a number, a string or a boolean"
            )));
        }
    };
    Ok(pb::Parameter { value: Some(value) })
}

/// Reads a request body. Public for the fuzz target.
pub fn asked(body: &[u8]) -> Result<(Generation, Option<String>), DoorError> {
    let super::json::Object(b) = serde_json::from_slice::<super::json::Object<GenerateBody>>(body)
        .map_err(|e| DoorError::bad_request(format!("malformed request JSON: {e}")))?;
    let mut parameters = HashMap::new();
    let given = b.parameters.iter().flatten().chain(b.rest.iter());
    for (name, value) in given {
        if PARAMETERS.contains(&name.as_str()) && !value.is_null() {
            parameters.insert(name.clone(), parameter(name, value)?);
        }
    }
    let generation = generation::kserve(b.text_input, &parameters)?;
    Ok((generation, b.id))
}

/// `POST .../generate` (`STREAM` false) and `POST .../generate_stream` (`STREAM` true).
pub async fn generate<const STREAM: bool>(
    State(state): State<HttpState>,
    Path(path): Path<ModelPath>,
    connection: Option<Extension<Connection>>,
    trace: Option<Extension<RequestTrace>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let arrived = Instant::now();
    let declared = super::body::declared_length(&headers);
    let mut body = Some(body);
    let result = async {
        let (caller, guard) = door::admit(&state, "/v2/models/generate", &headers)?;
        let deadline = door::deadline(&state, &headers, arrived)?;
        version(path.version.as_deref())?;
        let connection = connection.as_ref().map(|c| &c.0);
        let (bytes, hold) = door::body(&state, connection, &headers, arrived, &mut body).await?;
        let (asked, id) = state
            .app
            .cpu
            .run_sized(bytes.len(), deadline, move || asked(&bytes))
            .await??;
        drop(hold);
        let trace = trace.as_ref().map(|Extension(t)| t);
        let parts = generation::stream(&state.app, &caller, &path.name, asked, trace, deadline)?;
        let opening = streamed::open(parts).await?;
        let reply = Reply {
            model: path.name,
            id,
            tokens: Tokens::of(&state.app, &caller),
        };
        if STREAM {
            Ok::<_, DoorError>(streamed::sse(
                reply,
                opening,
                guard,
                state.app.config.serving.stream_idle,
            ))
        } else {
            let (text, finish, version) = opening.collect(&reply.tokens).await?;
            drop(guard);
            Ok(Json(reply.object(&text, Some((&finish, version)))).into_response())
        }
    }
    .await;
    door::drain(&state, declared, body);
    result.unwrap_or_else(error)
}

/// What every answer of one request repeats.
#[derive(Debug, Clone)]
struct Reply {
    model: String,
    id: Option<String>,
    tokens: Tokens,
}

impl Reply {
    /// One answer object: `text`, and with `end` the answer's end and version.
    fn object(&self, text: &str, end: Option<(&Finish, u32)>) -> Value {
        let mut o = json!({ "model_name": self.model, "text_output": text });
        if let Some(id) = &self.id {
            o["id"] = json!(id);
        }
        if let Some((f, version)) = end {
            o["model_version"] = json!(version.to_string());
            o["finish_reason"] = json!(f.reason);
            o["prompt_tokens"] = json!(f.prompt_tokens);
            o["completion_tokens"] = json!(f.completion_tokens);
        }
        o
    }
}

impl Events for Reply {
    fn part(&self, text: &str, _first: bool) -> Value {
        self.object(text, None)
    }

    fn last(&self, text: Option<&str>, _first: bool, finish: &Finish, version: u32) -> Vec<Value> {
        vec![self.object(text.unwrap_or(""), Some((finish, version)))]
    }

    fn error(&self, e: &InferError) -> Value {
        json!({ "error": e.to_string() })
    }

    fn done(&self) -> Option<&'static str> {
        None
    }

    fn tokens(&self) -> &Tokens {
        &self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_parameters_from_either_place() {
        let (g, id) = asked(
            br#"{"text_input":"hi","id":"r1","parameters":{"max_tokens":3,"stop":["x"]},"temperature":0}"#,
        )
        .expect("read");
        assert_eq!(
            (g.input.as_str(), g.max_tokens, g.temperature),
            ("hi", Some(3), Some(0.0))
        );
        assert_eq!((g.stop, id.as_deref()), (vec!["x".to_owned()], Some("r1")));
        // One stop string that begins with `[` is one string, not a malformed list.
        let (g, _) = asked(br#"{"text_input":"hi","stop":"[/INST]"}"#).expect("read");
        assert_eq!(g.stop, vec!["[/INST]".to_owned()]);
        for bad in [
            &br#"{"parameters":{}}"#[..],
            br#"{"text_input":1}"#,
            br#"{"text_input":"x","max_tokens":0}"#,
            br#"{"text_input":"x","parameters":{"top_p":{}}}"#,
            br#"["x"]"#,
        ] {
            assert!(asked(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }
}
