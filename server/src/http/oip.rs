//! The KServe v2 / Open Inference Protocol REST routes, with Triton's binary tensor extension
//! (what `tritonclient.http` sends by default):
//!
//! - `GET /v2`: server metadata; `GET /v2/health/live`, `GET /v2/health/ready`.
//! - `GET /v2/models/{name}[/versions/{v}]`: model metadata; `.../ready`: 200 when a worker
//!   serves it (of that version, if named), else 400 as Triton answers.
//! - `POST /v2/models/{name}[/versions/{v}]/infer`: inputs as JSON `data` (flat or nested) or,
//!   with an `Inference-Header-Content-Length` header, binary blobs after the JSON for inputs
//!   whose `parameters.binary_data_size` is set. Outputs come back as JSON `data`, or as blobs
//!   after the JSON when asked (`outputs[].parameters.binary_data`, or the request parameter
//!   `binary_data_output`).
//!
//! Errors are `{"error": "<message>"}` with the status of [`DoorError`].

use std::collections::HashMap;
use std::time::Instant;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use modelshare_proto::v1 as pb;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::door::{self, DoorError};
use super::json;
use super::state::HttpState;
use crate::connections::Connection;
use crate::front::{self, oip};
use crate::request_id::RequestTrace;
use modelshare_serving::InferResponse;

/// The header that carries the length of the JSON part of a binary request or response.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// An error in the OIP REST shape.
pub(super) fn error(e: impl Into<DoorError>) -> Response {
    let e = e.into();
    let response = (e.status, Json(json!({ "error": e.message }))).into_response();
    e.decorate(response)
}

/// `GET /v2`.
pub async fn server_metadata() -> Response {
    Json(json!({
        "name": "modelshare",
        "version": env!("CARGO_PKG_VERSION"),
        "extensions": front::EXTENSIONS,
    }))
    .into_response()
}

/// `GET /v2/health/live`.
pub async fn live() -> Response {
    Json(json!({ "live": true })).into_response()
}

/// `GET /v2/health/ready`: 200 once the start-up models are loaded, 503 before and at
/// shutdown.
pub async fn ready(State(state): State<HttpState>) -> Response {
    let ready = state.app.host.takes_requests();
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(json!({ "ready": ready }))).into_response()
}

/// A version from a path segment.
pub(super) fn version(text: Option<&str>) -> Result<Option<u32>, DoorError> {
    match text {
        None | Some("") => Ok(None),
        Some(v) => v.parse().map(Some).map_err(|_| {
            DoorError::bad_request(format!(
                "version '{}' is not a version number",
                v.escape_debug()
            ))
        }),
    }
}

/// The model and optional version of a route's path. A model named `owner/name` (a Hugging
/// Face id) takes two path segments: the routes have a second form with `{rest}`, which this
/// joins back.
#[derive(Debug, Deserialize)]
#[serde(from = "RawModelPath")]
pub struct ModelPath {
    pub(super) name: String,
    pub(super) version: Option<String>,
}

/// The path's parameters as the router gives them.
#[derive(Debug, Deserialize)]
struct RawModelPath {
    name: String,
    rest: Option<String>,
    version: Option<String>,
}

impl From<RawModelPath> for ModelPath {
    fn from(raw: RawModelPath) -> Self {
        let name = match raw.rest {
            Some(rest) => format!("{}/{rest}", raw.name),
            None => raw.name,
        };
        Self {
            name,
            version: raw.version,
        }
    }
}

/// `GET /v2/models/{name}[/versions/{version}]`.
pub async fn model_metadata(
    State(state): State<HttpState>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let (caller, _guard) = door::admit(&state, "/v2/models", &headers)?;
        version(path.version.as_deref())?;
        let serving = front::model_serving(&state.app, &caller, &path.name).await?;
        let specs = |s: &[pb::TensorSpec]| -> Vec<Value> {
            s.iter()
                .map(|t| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape}))
                .collect()
        };
        Ok::<_, DoorError>(Json(json!({
            "name": path.name,
            "versions": serving.versions.iter().map(u32::to_string).collect::<Vec<_>>(),
            "platform": "modelshare",
            "inputs": specs(&serving.inputs),
            "outputs": specs(&serving.outputs),
        })))
    }
    .await;
    result.map_or_else(error, IntoResponse::into_response)
}

/// `GET /v2/models/{name}[/versions/{version}]/ready`: 200 when a worker that is not draining
/// would take this caller's requests for the model, else 400 (unknown and invisible models
/// too).
pub async fn model_ready(
    State(state): State<HttpState>,
    Path(path): Path<ModelPath>,
    headers: HeaderMap,
) -> Response {
    let result = async {
        let (caller, _guard) = door::admit(&state, "/v2/models", &headers)?;
        let wanted = version(path.version.as_deref())?;
        // An unknown or invisible model is not ready (400, as Triton answers).
        let ready = front::model_ready(&state.app, &caller, &path.name, wanted).await;
        let status = if ready {
            StatusCode::OK
        } else {
            StatusCode::BAD_REQUEST
        };
        Ok::<_, DoorError>((status, Json(json!({ "name": path.name, "ready": ready }))))
    }
    .await;
    result.map_or_else(error, IntoResponse::into_response)
}

#[derive(Debug, Deserialize)]
struct InferBody {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Map<String, Value>,
    #[serde(deserialize_with = "json::objects")]
    inputs: Vec<InputBody>,
    #[serde(default, deserialize_with = "json::objects")]
    outputs: Vec<OutputBody>,
}

#[derive(Debug, Deserialize)]
struct InputBody {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Map<String, Value>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Debug, Deserialize)]
struct OutputBody {
    name: String,
    #[serde(default)]
    parameters: Map<String, Value>,
}

/// A JSON parameter as the worker protocol carries it (objects and arrays are refused).
fn parameter(name: &str, v: &Value) -> Result<pb::Parameter, DoorError> {
    use pb::parameter::Value as V;
    let value = match v {
        Value::Bool(b) => V::BoolValue(*b),
        Value::String(s) => V::StringValue(s.clone()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => V::Int64Value(i),
            (None, Some(u), _) => V::Uint64Value(u),
            (_, _, Some(f)) => V::DoubleValue(f),
            _ => {
                return Err(DoorError::bad_request(format!(
                    "parameter '{name}' is not a number"
                )));
            }
        },
        _ => {
            return Err(DoorError::bad_request(format!(
                "parameter '{name}' must be a boolean, a number or a string"
            )));
        }
    };
    Ok(pb::Parameter { value: Some(value) })
}

/// The body's JSON part and its binary part (empty without the binary extension).
fn split_body<'a>(headers: &HeaderMap, body: &'a Bytes) -> Result<(&'a [u8], Bytes), DoorError> {
    let Some(len) = headers.get(HEADER_LENGTH) else {
        return Ok((&body[..], Bytes::new()));
    };
    let len: usize = len
        .to_str()
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| DoorError::bad_request(format!("malformed {HEADER_LENGTH} header")))?;
    if len > body.len() {
        return Err(DoorError::bad_request(format!(
            "{HEADER_LENGTH} is {len} but the body has {} bytes",
            body.len()
        )));
    }
    Ok((&body[..len], body.slice(len..)))
}

/// A parsed request: its body (what it asks of the outputs), its inputs as tensors in the raw
/// layout, and its parameters for the items.
type Parsed = (InferBody, Vec<oip::Tensor>, HashMap<String, pb::Parameter>);

/// A request body's inputs as tensors in the raw layout, and what it asks of the outputs.
fn parse(headers: &HeaderMap, body: &Bytes) -> Result<Parsed, DoorError> {
    let (json_part, mut binary) = split_body(headers, body)?;
    let json::Object(mut req) = serde_json::from_slice::<json::Object<InferBody>>(json_part)
        .map_err(|e| DoorError::bad_request(format!("malformed inference request JSON: {e}")))?;
    let mut tensors = Vec::with_capacity(req.inputs.len());
    for input in &mut req.inputs {
        let dtype = oip::dtype(&input.datatype)
            .map_err(|e| DoorError::bad_request(format!("input '{}': {e}", input.name)))?;
        let count = oip::element_count(&input.name, &input.shape)?;
        let binary_size = input
            .parameters
            .get("binary_data_size")
            .and_then(Value::as_u64);
        let data = match (binary_size, input.data.take()) {
            (Some(_), Some(_)) => {
                return Err(DoorError::bad_request(format!(
                    "input '{}' has both data and binary_data_size",
                    input.name
                )));
            }
            (Some(n), None) => {
                let n = usize::try_from(n).unwrap_or(usize::MAX);
                if n > binary.len() {
                    return Err(DoorError::bad_request(format!(
                        "input '{}': binary_data_size {n} is past the end of the body",
                        input.name
                    )));
                }
                let data = binary.slice(..n);
                binary = binary.slice(n..);
                data
            }
            (None, Some(data)) => oip::json_to_raw(&input.name, dtype, &data, count)?,
            (None, None) => {
                return Err(DoorError::bad_request(format!(
                    "input '{}' has no data",
                    input.name
                )));
            }
        };
        let t = oip::Tensor {
            name: input.name.clone(),
            dtype,
            shape: input.shape.clone(),
            data,
        };
        oip::check_data(&t)?;
        tensors.push(t);
    }
    if !binary.is_empty() {
        return Err(DoorError::bad_request(format!(
            "{} bytes of binary data follow the JSON that no input claims",
            binary.len()
        )));
    }
    let parameters = req
        .parameters
        .iter()
        .filter(|(k, _)| !matches!(k.as_str(), "binary_data_output"))
        .map(|(k, v)| Ok((k.clone(), parameter(k, v)?)))
        .collect::<Result<HashMap<_, _>, DoorError>>()?;
    Ok((req, tensors, parameters))
}

/// `POST /v2/models/{name}[/versions/{version}]/infer`. The caller is admitted and the model's
/// visibility checked before a byte of the body is read; parsing and rendering run on the
/// request pool ([`crate::cpu`]), off the async runtime.
pub async fn infer(
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
        let (caller, _guard) = door::admit(&state, "/v2/models/infer", &headers)?;
        let deadline = door::deadline(&state, &headers, arrived)?;
        version(path.version.as_deref())?;
        front::check_visible(&state.app, &caller, &path.name)?;
        let connection = connection.as_ref().map(|c| &c.0);
        let (body, _hold) = door::body(&state, connection, &headers, arrived, &mut body).await?;
        let max_items = front::max_items(&state.app);
        let (req, items) = state
            .app
            .cpu
            .run_sized(body.len(), deadline, move || {
                let (req, tensors, parameters) = parse(&headers, &body)?;
                let mut items = oip::to_items(tensors, &parameters, max_items)?;
                if let Some(Extension(trace)) = &trace {
                    trace.stamp(&mut items.items);
                }
                Ok::<_, DoorError>((req, items))
            })
            .await??;
        let answer = front::infer(
            &state.app,
            &caller,
            &path.name,
            items.items,
            items.text_input,
            deadline,
        )
        .await?;
        let model = path.name;
        let render_by = Instant::now() + state.app.config.serving.max_request_time;
        let size = answer.outputs.iter().map(output_bytes).sum();
        state
            .app
            .cpu
            .run_sized(size, render_by, move || render(&model, &req, &answer))
            .await?
    }
    .await;
    // Answered before its body was read: the client may still be sending it.
    door::drain(&state, declared, body);
    result.unwrap_or_else(error)
}

/// The bytes of one item's outputs (what rendering them costs is proportional to).
pub(crate) fn output_bytes(o: &pb::ItemOutput) -> usize {
    o.tensors.iter().map(|t| t.data.len()).sum()
}

/// The response to a computed request: outputs as JSON `data`, or as blobs after the JSON
/// where asked.
fn render(model: &str, req: &InferBody, answer: &InferResponse) -> Result<Response, DoorError> {
    let requested: Vec<String> = req.outputs.iter().map(|o| o.name.clone()).collect();
    let stacked = oip::stack(model, &answer.outputs, &requested)?;
    let all_binary = req
        .parameters
        .get("binary_data_output")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let binary = |name: &str| {
        req.outputs
            .iter()
            .find(|o| o.name == name)
            .and_then(|o| o.parameters.get("binary_data").and_then(Value::as_bool))
            .unwrap_or(all_binary)
    };
    let mut outputs = Vec::with_capacity(stacked.len());
    let mut blobs: Vec<Bytes> = Vec::new();
    for t in &stacked {
        if binary(&t.name) {
            outputs.push(json!({
                "name": t.name, "datatype": t.datatype(), "shape": t.shape,
                "parameters": { "binary_data_size": t.data.len() },
            }));
            blobs.push(t.data.clone());
        } else {
            outputs.push(json!({
                "name": t.name, "datatype": t.datatype(), "shape": t.shape,
                "data": oip::raw_to_json(t.dtype, &t.data),
            }));
        }
    }
    let mut head = json!({
        "model_version": answer.version().to_string(),
        "model_name": answer.model,
        "outputs": outputs,
    });
    if let Some(id) = &req.id {
        head["id"] = json!(id);
    }
    if blobs.is_empty() {
        return Ok(Json(head).into_response());
    }
    let json = head.to_string();
    let mut body = Vec::with_capacity(json.len() + blobs.iter().map(Bytes::len).sum::<usize>());
    body.extend_from_slice(json.as_bytes());
    for b in &blobs {
        body.extend_from_slice(b);
    }
    let mut response = body.into_response();
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    if let Ok(v) = HeaderValue::from_str(&json.len().to_string()) {
        h.insert(HEADER_LENGTH, v);
    }
    Ok(response)
}

/// A request body's inputs as tensors in the raw layout and its parameters for the items, as
/// [`infer`] reads them from `headers` and `body`. Public for the fuzz target `kserve`
/// (`fuzz/request_checks.rs`).
pub fn parse_inputs(
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(Vec<oip::Tensor>, HashMap<String, pb::Parameter>), DoorError> {
    parse(headers, body).map(|(_, tensors, parameters)| (tensors, parameters))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_binary_inputs_parse_and_bad_ones_say_why() {
        let body = Bytes::from_static(
            br#"{"id":"7","inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}]}"#,
        );
        let (req, tensors, _) = parse(&HeaderMap::new(), &body).expect("json");
        assert_eq!(req.id.as_deref(), Some("7"));
        assert_eq!(tensors[0].data.len(), 16);
        // Binary: the JSON, then 8 bytes for x.
        let head = br#"{"inputs":[{"name":"x","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}}]}"#;
        let mut raw = head.to_vec();
        raw.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
        let mut headers = HeaderMap::new();
        headers.insert(
            HEADER_LENGTH,
            head.len().to_string().parse().expect("value"),
        );
        let (_, tensors, _) = parse(&headers, &Bytes::from(raw.clone())).expect("binary");
        assert_eq!(&tensors[0].data[..], &[0, 0, 128, 63, 0, 0, 0, 64]);
        // A short blob, a leftover, malformed JSON, a count that does not match.
        let short = Bytes::from(raw[..raw.len() - 1].to_vec());
        assert!(parse(&headers, &short).is_err());
        let mut long = raw.clone();
        long.push(0);
        assert!(parse(&headers, &Bytes::from(long)).is_err());
        let e = parse(&HeaderMap::new(), &Bytes::from_static(b"{nope")).expect_err("json");
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("malformed"), "{}", e.message);
        let bad = Bytes::from_static(
            br#"{"inputs":[{"name":"x","shape":[3],"datatype":"INT32","data":[1,2]}]}"#,
        );
        assert!(parse(&HeaderMap::new(), &bad).is_err());
    }
}
