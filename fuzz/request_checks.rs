//! What must hold for any request to the inference doors' parsers, shared by the fuzz targets
//! (`fuzz_targets/openai.rs`, `kserve.rs`, `oip_grpc.rs`) and by the replay of the kept corpus
//! in CI (`server/tests/fuzz_corpus.rs`). A panic here is a finding.
//!
//! - `openai`: a `/v1/embeddings` body through `http::openai::items`. What it accepts is the
//!   JSON a reference reading (`serde_json::Value`) sees: the same model, one item per string or
//!   token list (token ids as INT64 `input_ids` of shape [n], 8·n bytes), 1 to 2048 items,
//!   `dimensions` on every item when given.
//! - `kserve`: a KServe v2 REST body through `http::oip::parse_inputs`, then
//!   `front::oip::to_items`. The input's first 4 bytes (little-endian) are the
//!   `Inference-Header-Content-Length` header, `0xffffffff` for none; the rest is the body.
//!   What it accepts matches a reference reading of the JSON part (names, datatypes, shapes,
//!   the elements of `data`, each binary blob in order, parameters).
//! - `oip_grpc`: a protobuf `ModelInferRequest` decoded by prost, then
//!   `front::oip::grpc_inputs`, the request parameters and `front::oip::to_items`, as
//!   `service::inference` `model_infer` does. What it accepts matches the request (names,
//!   datatypes, shapes, the raw contents or the typed contents element by element).
//!
//! - `generate`: a body of the generating doors: its first byte picks the parser (0:
//!   `/v1/completions`, 1: `/v1/chat/completions`, 2: KServe's `generate`, through
//!   `http::completions::asked` and `http::generate::asked`), the rest is the body. What they
//!   accept is within the generation bounds (`Generation::check` holds again), names the model
//!   the body does, and keeps the prompt as sent: a completion's string (or list of one), a
//!   chat's messages (each an object with a string `role`), KServe's `text_input`.
//!
//! For both OIP doors, every accepted tensor holds exactly what its shape and datatype say
//! (shape × element size bytes, or that many well-formed BYTES elements), and the items split
//! from it number its batch dimension (1 to [`MAX_ITEMS`]), each with the row's shape and data,
//! the rows together the whole tensor, the request's parameters on each. Errors are client
//! errors with messages under 8 KiB. That nothing is allocated in proportion to a number in the
//! request rather than to its size is what the fuzzers' `-malloc_limit_mb` checks.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue};
use modelshare_proto::inference as oip;
use modelshare_proto::v1 as pb;
use modelshare_server::front::generation::Task;
use modelshare_server::front::oip::{self as tensors, Tensor};
use modelshare_server::http::door::DoorError;
use modelshare_server::http::oip::{HEADER_LENGTH, parse_inputs};
use modelshare_server::http::openai;
use modelshare_server::http::{completions, generate as kserve_generate};
use modelshare_serving::InferError;
use prost::Message as _;
use serde_json::Value;

/// Longest error message accepted: a hostile request must not turn into a huge message.
const MAX_ERROR_BYTES: usize = 8 << 10;

/// Rows one request may have (the server's `max_queue_items`): small, so that the fuzzer
/// reaches it.
pub const MAX_ITEMS: usize = 64;

/// Most inputs of one OpenAI request (OpenAI's own limit, as the door has it).
const OPENAI_MAX_INPUTS: usize = 2048;

/// The KServe input's header-length word that means "no header".
pub const NO_HEADER: u32 = u32::MAX;

/// A refusal of a REST door: a client error, with a short message.
fn door_error(e: &DoorError) {
    assert!(
        e.status.is_client_error(),
        "{} for a client's input: {}",
        e.status,
        e.message
    );
    assert!(
        e.message.len() < MAX_ERROR_BYTES,
        "error of {} bytes",
        e.message.len()
    );
}

/// A refusal of the gRPC door, as the service answers it: INVALID_ARGUMENT, a short message.
fn grpc_error(e: InferError) {
    let status = modelshare_server::status::from_infer(e);
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().len() < MAX_ERROR_BYTES,
        "error of {} bytes",
        status.message().len()
    );
}

/// A reference reading of JSON the parser accepted, or `None` where the reference cannot read
/// what JSON's grammar allows in a part the parser skips.
///
/// Invalid UTF-8 in a skipped string is read leniently (serde skips such strings without
/// checking them, and the doors never read them); numbers past f64 (`8e755`) and unpaired
/// surrogate escapes are JSON that serde_json's `Value` refuses. A part the parser reads is
/// compared exactly: bytes that change in the lossy reading would have been refused there.
fn reference(json: &[u8]) -> Option<Value> {
    let text = String::from_utf8_lossy(json);
    match serde_json::from_str(&text) {
        Ok(v) => Some(v),
        Err(e)
            if e.to_string().starts_with("number out of range")
                || e.to_string().contains("surrogate")
                || e.to_string().contains("hex escape") =>
        {
            None
        }
        Err(e) => panic!("accepted a body that is not JSON: {e}"),
    }
}

/// A JSON object as the doors read it: only an object (serde's derive would also take an
/// array of the struct's fields in order; the doors refuse that since the `openai` fuzzer found
/// it, `regressions/openai/body-as-array-of-fields`).
fn positional(v: Value, _fields: &[&str]) -> Value {
    assert!(v.is_object(), "accepted {v} where an object is due");
    v
}

// ---------------------------------------------------------------------------------------------
// OpenAI

/// One `/v1/embeddings` body; whether it was accepted.
pub fn openai(data: &[u8]) -> bool {
    let (model, items, floats) = match openai::items(data) {
        Ok(v) => v,
        Err(e) => {
            door_error(&e);
            return false;
        }
    };
    assert!(
        (1..=OPENAI_MAX_INPUTS).contains(&items.len()),
        "{} items accepted",
        items.len()
    );
    let Some(body) = reference(data) else {
        return true;
    };
    let body = positional(
        body,
        &["input", "model", "encoding_format", "dimensions", "user"],
    );
    assert_eq!(body["model"].as_str(), Some(model.as_str()), "model");
    let want_floats = match &body["encoding_format"] {
        Value::Null => true,
        Value::String(s) if s == "float" => true,
        Value::String(s) if s == "base64" => false,
        other => panic!("accepted encoding_format {other}"),
    };
    assert_eq!(floats, want_floats, "encoding_format");
    let dimensions = match &body["dimensions"] {
        Value::Null => None,
        v => {
            let d = v.as_i64().expect("accepted dimensions that are not an i64");
            assert!(d >= 1, "accepted dimensions {d}");
            Some(d)
        }
    };
    let want = openai_inputs(&body["input"]);
    assert_eq!(items.len(), want.len(), "items ≠ inputs");
    for (item, want) in items.iter().zip(&want) {
        match (&item.input, want) {
            (Some(pb::item::Input::Text(t)), OpenAiInput::Text(s)) => assert_eq!(&t.text, s),
            (Some(pb::item::Input::Tensors(t)), OpenAiInput::Tokens(ids)) => {
                let [t] = &t.tensors[..] else {
                    panic!("{} tensors for one token list", t.tensors.len())
                };
                assert_eq!(t.name, "input_ids");
                assert_eq!(t.dtype, pb::DType::DtypeI64 as i32);
                assert_eq!(t.shape, [ids.len() as i64]);
                let raw: Vec<u8> = ids.iter().flat_map(|i| i.to_le_bytes()).collect();
                assert_eq!(t.data[..], raw[..], "token ids");
            }
            (got, want) => panic!("item {got:?} for input {want:?}"),
        }
        let want_params: HashMap<String, pb::Parameter> = dimensions
            .map(|d| {
                let value = Some(pb::parameter::Value::Int64Value(d));
                ("dimensions".to_owned(), pb::Parameter { value })
            })
            .into_iter()
            .collect();
        assert_same_parameters(&item.parameters, &want_params);
    }
    true
}

/// One OpenAI input as a reference reads it.
#[derive(Debug)]
enum OpenAiInput {
    Text(String),
    Tokens(Vec<i64>),
}

/// The inputs of an accepted `input`: a string, strings, token ids, or lists of token ids.
fn openai_inputs(input: &Value) -> Vec<OpenAiInput> {
    let ids = |v: &Value| -> Option<Vec<i64>> { v.as_array()?.iter().map(Value::as_i64).collect() };
    if let Some(s) = input.as_str() {
        return vec![OpenAiInput::Text(s.to_owned())];
    }
    let list = input.as_array().expect("accepted an input that is no list");
    if let Some(texts) = list
        .iter()
        .map(|v| v.as_str().map(str::to_owned))
        .collect::<Option<Vec<_>>>()
    {
        return texts.into_iter().map(OpenAiInput::Text).collect();
    }
    if let Some(tokens) = ids(input) {
        return vec![OpenAiInput::Tokens(tokens)];
    }
    list.iter()
        .map(|l| OpenAiInput::Tokens(ids(l).expect("accepted an input of mixed kinds")))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// KServe v2 REST

/// One KServe v2 REST request: the header-length word, then the body; whether it was split
/// into items.
pub fn kserve(data: &[u8]) -> bool {
    let Some((word, body)) = data.split_first_chunk::<4>() else {
        return false;
    };
    let header = u32::from_le_bytes(*word);
    let mut headers = HeaderMap::new();
    if header != NO_HEADER {
        headers.insert(HEADER_LENGTH, HeaderValue::from(header));
    }
    let body = Bytes::copy_from_slice(body);
    let (inputs, parameters) = match parse_inputs(&headers, &body) {
        Ok(v) => v,
        Err(e) => {
            door_error(&e);
            return false;
        }
    };
    let json_len = if header == NO_HEADER {
        body.len()
    } else {
        header as usize
    };
    let Some(request) = reference(&body[..json_len]) else {
        return items_hold(inputs, &parameters, |e| door_error(&DoorError::from(e)));
    };
    let mut request = positional(request, &["id", "parameters", "inputs", "outputs"]);
    let declared = match request["inputs"].take() {
        Value::Array(inputs) => inputs,
        other => panic!("accepted inputs {other}"),
    };
    let declared = declared
        .into_iter()
        .map(|d| positional(d, &["name", "shape", "datatype", "parameters", "data"]));
    assert_eq!(inputs.len(), declared.len(), "tensors ≠ inputs");
    let mut blobs = &body[json_len..];
    for (t, d) in inputs.iter().zip(declared) {
        assert_eq!(d["name"].as_str(), Some(t.name.as_str()), "name");
        assert_eq!(d["datatype"].as_str(), Some(t.datatype()), "datatype");
        let shape: Option<Vec<i64>> = d["shape"]
            .as_array()
            .and_then(|s| s.iter().map(Value::as_i64).collect());
        assert_eq!(shape.as_ref(), Some(&t.shape), "shape");
        layout_holds(t.dtype, &t.shape, &t.data);
        match d["parameters"]["binary_data_size"].as_u64() {
            Some(n) => {
                let n = n as usize;
                assert!(n <= blobs.len(), "a blob past the body's end");
                assert_eq!(t.data[..], blobs[..n], "the blob of '{}'", t.name);
                blobs = &blobs[n..];
            }
            None => {
                let mut flat = Vec::new();
                flatten(&d["data"], &mut flat);
                let want = flat
                    .iter()
                    .map(|v| json_element(t.dtype, v))
                    .collect::<Option<Vec<_>>>()
                    .expect("accepted data of the wrong type");
                assert_eq!(elements(t.dtype, &t.data), want, "the data of '{}'", t.name);
            }
        }
    }
    assert!(blobs.is_empty(), "{} bytes no input claims", blobs.len());
    let mut want = HashMap::new();
    if let Some(p) = request["parameters"].as_object() {
        for (k, v) in p.iter().filter(|(k, _)| *k != "binary_data_output") {
            want.insert(k.clone(), json_parameter(v));
        }
    }
    assert_same_parameters(&parameters, &want);
    items_hold(inputs, &parameters, |e| door_error(&DoorError::from(e)))
}

/// JSON `data`, nested lists flattened row-major.
fn flatten<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other),
    }
}

/// A JSON request parameter as the worker protocol should carry it.
fn json_parameter(v: &Value) -> pb::Parameter {
    use pb::parameter::Value as V;
    let value = match v {
        Value::Bool(b) => V::BoolValue(*b),
        Value::String(s) => V::StringValue(s.clone()),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => V::Int64Value(i),
            (None, Some(u), _) => V::Uint64Value(u),
            (_, _, Some(f)) => V::DoubleValue(f),
            _ => panic!("accepted parameter {n}"),
        },
        other => panic!("accepted parameter {other}"),
    };
    pb::Parameter { value: Some(value) }
}

// ---------------------------------------------------------------------------------------------
// OIP gRPC

/// One protobuf `ModelInferRequest`; whether it was split into items.
pub fn oip_grpc(data: &[u8]) -> bool {
    let Ok(mut req) = oip::ModelInferRequest::decode(data) else {
        return false;
    };
    let sent = req.clone();
    let inputs = match tensors::grpc_inputs(&mut req) {
        Ok(v) => v,
        Err(e) => {
            grpc_error(e);
            return false;
        }
    };
    assert_eq!(inputs.len(), sent.inputs.len(), "tensors ≠ inputs");
    for (i, (t, d)) in inputs.iter().zip(&sent.inputs).enumerate() {
        assert_eq!(t.name, d.name, "name");
        assert_eq!(t.datatype(), d.datatype, "datatype");
        assert_eq!(t.shape, d.shape, "shape");
        layout_holds(t.dtype, &t.shape, &t.data);
        match (&d.contents, sent.raw_input_contents.get(i)) {
            (None, Some(raw)) => {
                assert_eq!(t.data[..], raw[..], "the raw contents of '{}'", t.name)
            }
            (Some(c), None) => assert_eq!(
                elements(t.dtype, &t.data),
                typed_elements(t.dtype, c),
                "the contents of '{}'",
                t.name
            ),
            (None, None) => assert!(t.data.is_empty(), "data from nowhere"),
            (Some(_), Some(_)) => panic!("accepted both contents and raw contents"),
        }
    }
    // As `model_infer` reads them.
    let parameters = tensors::parameters(&req.parameters);
    items_hold(inputs, &parameters, grpc_error)
}

/// The elements of typed contents, as the datatype's field holds them.
fn typed_elements(dtype: pb::DType, c: &oip::InferTensorContents) -> Vec<Element> {
    use pb::DType as D;
    let ints = |v: &[i32]| v.iter().map(|x| Element::Int(i128::from(*x))).collect();
    let uints = |v: &[u32]| v.iter().map(|x| Element::Int(i128::from(*x))).collect();
    match dtype {
        D::DtypeBool => c.bool_contents.iter().map(|b| Element::Bool(*b)).collect(),
        D::DtypeI8 | D::DtypeI16 | D::DtypeI32 => ints(&c.int_contents),
        D::DtypeI64 => c
            .int64_contents
            .iter()
            .map(|x| Element::Int(i128::from(*x)))
            .collect(),
        D::DtypeU8 | D::DtypeU16 | D::DtypeU32 => uints(&c.uint_contents),
        D::DtypeU64 => c
            .uint64_contents
            .iter()
            .map(|x| Element::Int(i128::from(*x)))
            .collect(),
        D::DtypeF32 => c
            .fp32_contents
            .iter()
            .map(|x| Element::Bits(u64::from(x.to_bits())))
            .collect(),
        D::DtypeF64 => c
            .fp64_contents
            .iter()
            .map(|x| Element::Bits(x.to_bits()))
            .collect(),
        D::DtypeBytes => c
            .bytes_contents
            .iter()
            .map(|b| Element::Bytes(b.clone()))
            .collect(),
        other => panic!("accepted typed contents for {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared: tensors and items

/// One element of a tensor, as compared with what the request said.
#[derive(Debug, PartialEq)]
enum Element {
    Bool(bool),
    Int(i128),
    /// A float's bits in its own width.
    Bits(u64),
    Bytes(Vec<u8>),
}

/// The same parameters, compared by their encoding: a double parameter may be NaN (the gRPC
/// door passes it on as sent), which `==` never finds equal to itself.
fn assert_same_parameters(
    got: &HashMap<String, pb::Parameter>,
    want: &HashMap<String, pb::Parameter>,
) {
    let encode =
        |m: &HashMap<String, pb::Parameter>| -> std::collections::BTreeMap<String, Vec<u8>> {
            m.iter()
                .map(|(k, v)| (k.clone(), v.encode_to_vec()))
                .collect()
        };
    assert_eq!(encode(got), encode(want), "parameters");
}

/// Bytes per element of an OIP datatype, `None` for BYTES.
fn size(dtype: pb::DType) -> Option<usize> {
    use pb::DType as D;
    match dtype {
        D::DtypeBool | D::DtypeU8 | D::DtypeI8 => Some(1),
        D::DtypeU16 | D::DtypeI16 | D::DtypeF16 | D::DtypeBf16 => Some(2),
        D::DtypeU32 | D::DtypeI32 | D::DtypeF32 => Some(4),
        D::DtypeU64 | D::DtypeI64 | D::DtypeF64 => Some(8),
        D::DtypeBytes => None,
        other => panic!("accepted a tensor of {other:?}, which the OIP has no name for"),
    }
}

/// BYTES elements in the raw layout (each a 4-byte little-endian length and its bytes), or
/// `None` where the data is not exactly a sequence of them.
fn bytes_elements(mut data: &[u8]) -> Option<Vec<&[u8]>> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let (len, rest) = data.split_first_chunk::<4>()?;
        let len = u32::from_le_bytes(*len) as usize;
        out.push(rest.get(..len)?);
        data = &rest[len..];
    }
    Some(out)
}

/// The elements of an accepted tensor's data (which [`layout_holds`] has checked).
fn elements(dtype: pb::DType, data: &[u8]) -> Vec<Element> {
    use pb::DType as D;
    let Some(n) = size(dtype) else {
        let all = bytes_elements(data).expect("checked");
        return all
            .into_iter()
            .map(|b| Element::Bytes(b.to_vec()))
            .collect();
    };
    data.chunks_exact(n)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..n].copy_from_slice(c);
            let u = u64::from_le_bytes(b);
            match dtype {
                D::DtypeBool => Element::Bool(u != 0),
                D::DtypeU8 | D::DtypeU16 | D::DtypeU32 | D::DtypeU64 => Element::Int(u.into()),
                D::DtypeI8 => Element::Int((u as u8 as i8).into()),
                D::DtypeI16 => Element::Int((u as u16 as i16).into()),
                D::DtypeI32 => Element::Int((u as u32 as i32).into()),
                D::DtypeI64 => Element::Int((u as i64).into()),
                _ => Element::Bits(u),
            }
        })
        .collect()
}

/// A JSON element in `dtype`, as the OIP says it converts; `None` for a value of another type.
fn json_element(dtype: pb::DType, v: &Value) -> Option<Element> {
    use pb::DType as D;
    Some(match dtype {
        D::DtypeBool => Element::Bool(v.as_bool()?),
        D::DtypeBytes => Element::Bytes(v.as_str()?.as_bytes().to_vec()),
        D::DtypeF32 => Element::Bits(u64::from((v.as_f64()? as f32).to_bits())),
        D::DtypeF64 => Element::Bits(v.as_f64()?.to_bits()),
        D::DtypeF16 => Element::Bits(u64::from(half::f16::from_f64(v.as_f64()?).to_bits())),
        D::DtypeBf16 => Element::Bits(u64::from(half::bf16::from_f64(v.as_f64()?).to_bits())),
        _ => Element::Int(match v.as_i64() {
            Some(i) => i128::from(i),
            None => i128::from(v.as_u64()?),
        }),
    })
}

/// The number of elements of a shape, every dimension ≥ 0.
fn count(shape: &[i64]) -> u128 {
    shape.iter().fold(1u128, |n, d| {
        let d = u128::try_from(*d).expect("accepted a negative dimension");
        n.saturating_mul(d)
    })
}

/// `data` holds exactly the elements of `shape` in `dtype`.
fn layout_holds(dtype: pb::DType, shape: &[i64], data: &[u8]) {
    let count = count(shape);
    match size(dtype) {
        Some(n) => assert_eq!(
            data.len() as u128,
            count * n as u128,
            "{dtype:?} {shape:?} with {} bytes",
            data.len()
        ),
        None => {
            let got = bytes_elements(data).expect("accepted malformed BYTES data");
            assert_eq!(got.len() as u128, count, "BYTES {shape:?}");
        }
    }
}

/// The items of accepted tensors: one per row of the batch dimension, each holding its rows;
/// whether the tensors were split (else `refused` checks why not).
fn items_hold(
    inputs: Vec<Tensor>,
    parameters: &HashMap<String, pb::Parameter>,
    refused: impl Fn(InferError),
) -> bool {
    let sent = inputs.clone();
    let items = match tensors::to_items(inputs, parameters, MAX_ITEMS) {
        Ok(v) => v.items,
        Err(e) => {
            refused(e);
            return false;
        }
    };
    let first = &sent[0];
    let rows = first.shape[0];
    assert!(
        (1..=MAX_ITEMS as i64).contains(&rows),
        "accepted a batch of {rows}"
    );
    assert_eq!(items.len() as i64, rows, "items ≠ the batch dimension");
    for t in &sent {
        assert_eq!(t.shape.first(), Some(&rows), "inputs disagree on the batch");
    }
    for item in &items {
        assert_same_parameters(&item.parameters, parameters);
    }
    // One BYTES input of shape [n] or [n, 1] is n texts.
    let text = sent.len() == 1
        && first.dtype == pb::DType::DtypeBytes
        && (first.shape == [rows] || first.shape == [rows, 1]);
    if text {
        let mut joined = Vec::new();
        for item in &items {
            let Some(pb::item::Input::Text(t)) = &item.input else {
                panic!("text and tensor items mixed")
            };
            joined.extend_from_slice(&(t.text.len() as u32).to_le_bytes());
            joined.extend_from_slice(t.text.as_bytes());
        }
        assert_eq!(joined[..], first.data[..], "the texts ≠ the tensor");
        return true;
    }
    let mut joined: Vec<Vec<u8>> = vec![Vec::new(); sent.len()];
    for item in &items {
        let Some(pb::item::Input::Tensors(row)) = &item.input else {
            panic!("text and tensor items mixed")
        };
        assert_eq!(row.tensors.len(), sent.len(), "tensors per item");
        for ((r, t), all) in row.tensors.iter().zip(&sent).zip(&mut joined) {
            assert_eq!(r.name, t.name);
            assert_eq!(r.dtype, t.dtype as i32);
            assert_eq!(r.shape[..], t.shape[1..], "row shape");
            layout_holds(t.dtype, &r.shape, &r.data);
            all.extend_from_slice(&r.data);
        }
    }
    for (t, all) in sent.iter().zip(&joined) {
        assert_eq!(all[..], t.data[..], "the rows of '{}' ≠ the tensor", t.name);
    }
    true
}

// ---------------------------------------------------------------------------------------------
// Generation

/// One body of a generating door (the first byte picks which); whether it was accepted.
pub fn generate(data: &[u8]) -> bool {
    let Some((&door, body)) = data.split_first() else {
        return false;
    };
    let (generation, model) = match door % 3 {
        0 | 1 => {
            let task = if door % 3 == 0 {
                Task::Completion
            } else {
                Task::Chat
            };
            match completions::asked(task, body) {
                Ok(a) => (a.generation, Some(a.model)),
                Err(e) => {
                    door_error(&e);
                    return false;
                }
            }
        }
        _ => match kserve_generate::asked(body) {
            Ok((g, _)) => (g, None),
            Err(e) => {
                door_error(&e);
                return false;
            }
        },
    };
    assert!(
        generation.check().is_ok(),
        "accepted out of bounds: {generation:?}"
    );
    let Some(body) = reference(body) else {
        return true;
    };
    let body = positional(body, &[]);
    if let Some(model) = model {
        assert_eq!(body["model"].as_str(), Some(model.as_str()), "model");
    }
    match (door % 3, &body) {
        (0, b) => {
            let prompt = match &b["prompt"] {
                Value::String(s) => s.clone(),
                Value::Array(v) if v.len() == 1 => {
                    v[0].as_str().expect("a string prompt").to_owned()
                }
                other => panic!("accepted prompt {other}"),
            };
            assert_eq!(generation.input, prompt, "prompt");
        }
        (1, b) => {
            let sent = b["messages"]
                .as_array()
                .expect("accepted messages that are not a list");
            let kept: Value = serde_json::from_str(&generation.input).expect("messages as JSON");
            assert_eq!(kept.as_array().map(Vec::len), Some(sent.len()), "messages");
            assert!(
                sent.iter().all(|m| m["role"].is_string()),
                "a message without a role"
            );
            assert_eq!(&kept, &b["messages"], "messages changed");
        }
        (_, b) => assert_eq!(
            b["text_input"].as_str(),
            Some(generation.input.as_str()),
            "text_input"
        ),
    }
    true
}
