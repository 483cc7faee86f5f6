//! The front doors end to end: the real server with its HTTP port, a test worker on
//! `WorkerService.Serve` (`worker_util`: text → `embedding` FP32 `[byte length, version]` and
//! `prompt_tokens` = words; tensors → `echo`, the first input as is), and callers on each door
//! through their wire protocols only: the generated OIP gRPC client, and plain HTTP/1.1 over a
//! TCP stream for the OIP REST and OpenAI routes (JSON, Triton's binary tensor extension),
//! with the documented error statuses and shapes.

use std::time::Duration;

use base64::Engine as _;
use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;
use tonic::transport::Channel;

use crate::common::Server;
use crate::tenants::{self as tn, ADMIN, TA, TB, TenantsFile, abc_tenants};
use crate::worker_util::{Offer, TestWorker, serve, try_serve};

/// The server's limit on request bodies in these tests.
const BODY_LIMIT: usize = 64 << 10;

/// A server with start-up model `enc` and its HTTP port, and a worker serving `enc`.
async fn stack() -> (Server, TestWorker, tempfile::NamedTempFile) {
    let config = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(
        config.path(),
        format!("[serving]\nmax_request_bytes = {BODY_LIMIT}\n"),
    )
    .expect("write config");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let server = Server::start_with(
        &[
            "--http-listen",
            "127.0.0.1:0",
            "--config",
            &path,
            "--model",
            "enc=enc",
            "--no-worker-wait-ms",
            "300",
        ],
        |root| tn::models(root, &["enc"]),
    )
    .await;
    let worker = serve(&server.address, "enc", Offer::default()).await;
    (server, worker, config)
}

async fn grpc(server: &Server) -> GrpcInferenceServiceClient<Channel> {
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    GrpcInferenceServiceClient::new(ch)
}

/// An HTTP answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One HTTP/1.1 request on its own connection. The body is written while the answer is read,
/// and a failed write is ignored (a server may answer before it has read everything), as a
/// client that sends its whole body first would still see the answer.
pub(crate) async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut raw))
        .await
        .expect("answer within 20 s")
        .expect("read the answer");
    drop(writer.await);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

async fn post_json(addr: &str, path: &str, body: &Value) -> Answer {
    http(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn texts_request(model: &str, texts: &[&str]) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: model.into(),
        id: "t1".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "text".into(),
            datatype: "BYTES".into(),
            shape: vec![texts.len() as i64, 1],
            contents: Some(oip::InferTensorContents {
                bytes_contents: texts.iter().map(|t| t.as_bytes().to_vec()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// The OIP gRPC door would split, stack, report or refuse wrongly.
#[tokio::test]
async fn grpc_model_infer_splits_requests_into_items_and_stacks_the_answers() {
    let (server, worker, _config) = stack().await;
    let mut c = grpc(&server).await;

    // Texts: one BYTES input of shape [N, 1] becomes N text items.
    let r = c
        .model_infer(texts_request("enc", &["a", "hello world", ""]))
        .await
        .expect("texts")
        .into_inner();
    assert_eq!(
        (
            r.model_name.as_str(),
            r.model_version.as_str(),
            r.id.as_str()
        ),
        ("enc", "1", "t1")
    );
    assert_eq!(r.outputs.len(), 1);
    assert_eq!(r.outputs[0].name, "embedding");
    assert_eq!(r.outputs[0].datatype, "FP32");
    assert_eq!(r.outputs[0].shape, vec![3, 2]);
    assert_eq!(
        floats(&r.raw_output_contents[0]),
        vec![1.0, 1.0, 11.0, 1.0, 0.0, 1.0]
    );
    assert_eq!(worker.seen().items, 3);

    // Tensors in raw_input_contents: rows are items; the answer is the rows stacked back.
    let x = f32s(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let raw = oip::ModelInferRequest {
        model_name: "enc".into(),
        model_version: "1".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![2, 3],
            ..Default::default()
        }],
        outputs: vec![oip::model_infer_request::InferRequestedOutputTensor {
            name: "echo".into(),
            ..Default::default()
        }],
        raw_input_contents: vec![x.clone().into()],
        ..Default::default()
    };
    let r = c.model_infer(raw.clone()).await.expect("raw").into_inner();
    assert_eq!(r.outputs[0].shape, vec![2, 3]);
    assert_eq!(r.raw_output_contents[0].as_ref(), x.as_slice());
    assert_eq!(worker.seen().items, 5);

    // Typed contents of a narrow type.
    let typed = oip::ModelInferRequest {
        model_name: "enc".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "i".into(),
            datatype: "INT16".into(),
            shape: vec![2, 2],
            contents: Some(oip::InferTensorContents {
                int_contents: vec![1, -2, 3, -4],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let r = c.model_infer(typed).await.expect("typed").into_inner();
    assert_eq!(r.outputs[0].datatype, "INT16");
    let want: Vec<u8> = [1i16, -2, 3, -4]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    assert_eq!(r.raw_output_contents[0].as_ref(), want.as_slice());

    // Refusals, each with its code.
    let mut unknown_output = raw.clone();
    unknown_output.outputs[0].name = "nope".into();
    let mut short = raw.clone();
    short.raw_input_contents = vec![f32s(&[1.0]).into()];
    let mut mismatched = raw.clone();
    mismatched
        .inputs
        .push(oip::model_infer_request::InferInputTensor {
            name: "y".into(),
            datatype: "FP32".into(),
            shape: vec![3],
            ..Default::default()
        });
    mismatched
        .raw_input_contents
        .push(f32s(&[1.0, 2.0, 3.0]).into());
    let mut datatype = raw.clone();
    datatype.inputs[0].datatype = "FLOAT".into();
    let mut version = raw.clone();
    version.model_version = "latest".into();
    let mut missing = raw.clone();
    missing.model_name = "missing".into();
    for (request, code, needle) in [
        (unknown_output, Code::InvalidArgument, "nope"),
        (short, Code::InvalidArgument, "'x'"),
        (mismatched, Code::InvalidArgument, "'y'"),
        (datatype, Code::InvalidArgument, "FLOAT"),
        (version, Code::InvalidArgument, "latest"),
        (missing, Code::NotFound, "missing"),
    ] {
        let status = c.model_infer(request).await.expect_err("refused");
        assert_eq!(status.code(), code, "{status:?}");
        assert!(status.message().contains(needle), "{status:?}");
    }

    // Health and metadata.
    assert!(
        c.server_live(oip::ServerLiveRequest {})
            .await
            .expect("live")
            .into_inner()
            .live
    );
    assert!(
        c.server_ready(oip::ServerReadyRequest {})
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    let ready = |name: &str, version: &str| oip::ModelReadyRequest {
        name: name.into(),
        version: version.into(),
    };
    assert!(
        c.model_ready(ready("enc", ""))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    assert!(
        c.model_ready(ready("enc", "1"))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    assert!(
        !c.model_ready(ready("enc", "2"))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    assert!(
        !c.model_ready(ready("missing", ""))
            .await
            .expect("ready")
            .into_inner()
            .ready
    );
    let meta = c
        .model_metadata(oip::ModelMetadataRequest {
            name: "enc".into(),
            version: String::new(),
        })
        .await
        .expect("metadata")
        .into_inner();
    assert_eq!(
        (meta.name.as_str(), meta.versions.as_slice()),
        ("enc", &["1".to_owned()][..])
    );
    let status = c
        .model_metadata(oip::ModelMetadataRequest {
            name: "missing".into(),
            version: String::new(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound);
    let server_meta = c
        .server_metadata(oip::ServerMetadataRequest {})
        .await
        .expect("server metadata")
        .into_inner();
    assert_eq!(server_meta.name, "modelshare");
    worker.kill();
}

/// The OIP REST door would misread JSON or binary tensors, or answer in the wrong form or
/// with the wrong status.
#[tokio::test]
async fn rest_infer_takes_json_and_binary_tensors_and_answers_in_the_form_asked() {
    let (server, worker, _config) = stack().await;
    let addr = server.metrics_address();

    for (path, status) in [
        ("/v2/health/live", 200),
        ("/v2/health/ready", 200),
        ("/v2/models/enc/ready", 200),
        ("/v2/models/enc/versions/1/ready", 200),
        ("/v2/models/missing/ready", 400),
    ] {
        assert_eq!(
            http(&addr, "GET", path, &[], b"").await.status,
            status,
            "{path}"
        );
    }
    let meta = http(&addr, "GET", "/v2/models/enc", &[], b"").await;
    assert_eq!(meta.status, 200);
    assert_eq!(meta.json()["versions"], json!(["1"]));
    assert_eq!(
        http(&addr, "GET", "/v2", &[], b"").await.json()["name"],
        "modelshare"
    );
    let unknown = http(&addr, "GET", "/v2/models/missing", &[], b"").await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"].is_string());

    // JSON in, JSON out (nested data).
    let r = post_json(
        &addr,
        "/v2/models/enc/infer",
        &json!({
            "id": "j1",
            "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2.5], [3, 4]]}],
            "outputs": [{"name": "echo", "parameters": {"binary_data": false}}],
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["model_name"], "enc");
    assert_eq!(v["model_version"], "1");
    assert_eq!(v["id"], "j1");
    assert_eq!(
        v["outputs"][0],
        json!({"name": "echo", "datatype": "FP32", "shape": [2, 2], "data": [1.0, 2.5, 3.0, 4.0]})
    );

    // Binary in (Triton's extension), binary out.
    let x = f32s(&[0.5, -1.0, 2.0, 8.0]);
    let header = json!({
        "inputs": [{"name": "x", "shape": [4, 1], "datatype": "FP32", "parameters": {"binary_data_size": x.len()}}],
        "outputs": [{"name": "echo", "parameters": {"binary_data": true}}],
    })
    .to_string();
    let mut body = header.clone().into_bytes();
    body.extend_from_slice(&x);
    let len = header.len().to_string();
    let r = http(
        &addr,
        "POST",
        "/v2/models/enc/infer",
        &[
            ("content-type", "application/octet-stream"),
            ("Inference-Header-Content-Length", &len),
        ],
        &body,
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let n: usize = r
        .header("inference-header-content-length")
        .expect("binary answer header")
        .parse()
        .expect("length");
    let v: Value = serde_json::from_slice(&r.body[..n]).expect("json part");
    assert_eq!(v["outputs"][0]["shape"], json!([4, 1]));
    assert_eq!(v["outputs"][0]["parameters"]["binary_data_size"], 16);
    assert_eq!(&r.body[n..], x.as_slice());

    // Texts as JSON strings, every output binary by the request parameter.
    let r = post_json(
        &addr,
        "/v2/models/enc/versions/1/infer",
        &json!({
            "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["hi", "d\u{e9}j\u{e0}"]}],
            "parameters": {"binary_data_output": true},
        }),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let n: usize = r
        .header("inference-header-content-length")
        .expect("binary")
        .parse()
        .expect("length");
    assert_eq!(floats(&r.body[n..]), vec![2.0, 1.0, 6.0, 1.0]);

    // Refusals: unknown model, malformed JSON, a count that disagrees with the shape, an
    // unknown datatype, a body over the limit.
    let one = json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]});
    let r = post_json(&addr, "/v2/models/missing/infer", &one).await;
    assert_eq!(r.status, 404);
    assert!(
        r.json()["error"]
            .as_str()
            .expect("message")
            .contains("missing")
    );
    let r = http(&addr, "POST", "/v2/models/enc/infer", &[], b"{not json").await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].is_string());
    let r = post_json(
        &addr,
        "/v2/models/enc/infer",
        &json!({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}]}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().expect("message").contains("'x'"));
    let r = post_json(
        &addr,
        "/v2/models/enc/infer",
        &json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FLOAT", "data": [1]}]}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(
        r.json()["error"]
            .as_str()
            .expect("message")
            .contains("FLOAT")
    );
    let big = json!({"inputs": [{"name": "t", "shape": [1], "datatype": "BYTES", "data": ["x".repeat(2 * BODY_LIMIT)]}]});
    let r = post_json(&addr, "/v2/models/enc/infer", &big).await;
    assert_eq!(r.status, 413);
    assert!(r.json()["error"].is_string());
    worker.kill();
}

/// The OpenAI door would answer embeddings, models or errors in a shape its clients cannot
/// read.
#[tokio::test]
async fn openai_embeddings_and_models_answer_in_openais_shapes() {
    let (server, worker, _config) = stack().await;
    let addr = server.metrics_address();

    let r = post_json(
        &addr,
        "/v1/embeddings",
        &json!({"model": "enc", "input": ["a", "hello world"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    assert_eq!(
        r.json(),
        json!({
            "object": "list",
            "data": [
                {"object": "embedding", "index": 0, "embedding": [1.0, 1.0]},
                {"object": "embedding", "index": 1, "embedding": [11.0, 1.0]},
            ],
            "model": "enc",
            "usage": {"prompt_tokens": 3, "total_tokens": 3},
        })
    );
    let r = post_json(
        &addr,
        "/v1/embeddings",
        &json!({"model": "enc", "input": "four", "encoding_format": "base64"}),
    )
    .await;
    assert_eq!(r.status, 200);
    let b64 = r.json()["data"][0]["embedding"]
        .as_str()
        .expect("base64")
        .to_owned();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("valid base64");
    assert_eq!(floats(&bytes), vec![4.0, 1.0]);

    let models = http(&addr, "GET", "/v1/models", &[], b"").await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "enc");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["owned_by"], "modelshare");
    assert!(models["data"][0]["created"].as_i64().expect("created") > 0);
    assert_eq!(
        http(&addr, "GET", "/v1/models/enc", &[], b"").await.json()["id"],
        "enc"
    );

    // Errors in OpenAI's shape.
    let error = |a: &Answer| a.json()["error"].clone();
    let r = http(&addr, "GET", "/v1/models/missing", &[], b"").await;
    assert_eq!(r.status, 404);
    assert_eq!(error(&r)["code"], "model_not_found");
    let r = post_json(
        &addr,
        "/v1/embeddings",
        &json!({"model": "missing", "input": "x"}),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(error(&r)["type"], "invalid_request_error");
    assert!(
        error(&r)["message"]
            .as_str()
            .expect("message")
            .contains("not found")
    );
    let r = http(
        &addr,
        "POST",
        "/v1/embeddings",
        &[],
        b"{\"model\": \"enc\", \"input\": ",
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(error(&r)["type"], "invalid_request_error");
    let r = post_json(
        &addr,
        "/v1/embeddings",
        &json!({"model": "enc", "input": []}),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = post_json(
        &addr,
        "/v1/embeddings",
        &json!({"model": "enc", "input": "x".repeat(2 * BODY_LIMIT)}),
    )
    .await;
    assert_eq!(r.status, 413);
    assert_eq!(error(&r)["type"], "invalid_request_error");
    // A worker's refusal of an item keeps its code: 400.
    let r = post_json(
        &addr,
        "/v1/embeddings",
        &json!({"model": "enc", "input": ["ok", "fail:too long"]}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(
        error(&r)["message"]
            .as_str()
            .expect("message")
            .contains("too long")
    );
    worker.kill();
}

/// The HTTP doors would let a caller in without a valid token, or show it another tenant's
/// private model.
#[tokio::test]
async fn with_tenants_the_http_doors_need_a_token_and_hide_what_a_caller_may_not_see() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(&tenants, &["--http-listen", "127.0.0.1:0"], &["enc"]).await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads its private enc");
    let _worker = try_serve(&server.address, Some(TA), "enc", Offer::default())
        .await
        .expect("a serves enc");
    let addr = server.metrics_address();
    let bearer = |t: &str| format!("Bearer {t}");

    // Probes are open; everything else needs a token.
    assert_eq!(
        http(&addr, "GET", "/v2/health/live", &[], b"").await.status,
        200
    );
    assert_eq!(http(&addr, "GET", "/readyz", &[], b"").await.status, 200);
    let r = http(&addr, "GET", "/v1/models", &[], b"").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["type"], "authentication_error");
    let wrong = bearer("nope");
    let r = http(
        &addr,
        "GET",
        "/v2/models/enc",
        &[("authorization", &wrong)],
        b"",
    )
    .await;
    assert_eq!(r.status, 401);
    assert!(r.json()["error"].is_string());

    // a sees and computes on its model; b sees nothing of it.
    let (ta, tb, admin) = (bearer(TA), bearer(TB), bearer(ADMIN));
    let ids = |a: Answer| -> Vec<String> {
        a.json()["data"]
            .as_array()
            .expect("data")
            .iter()
            .map(|m| m["id"].as_str().expect("id").to_owned())
            .collect()
    };
    assert_eq!(
        ids(http(&addr, "GET", "/v1/models", &[("authorization", &ta)], b"").await),
        ["enc"]
    );
    assert_eq!(
        ids(http(
            &addr,
            "GET",
            "/v1/models",
            &[("authorization", &admin)],
            b""
        )
        .await),
        ["enc"]
    );
    assert!(ids(http(&addr, "GET", "/v1/models", &[("authorization", &tb)], b"").await).is_empty());
    let body = json!({"model": "enc", "input": "abc"}).to_string();
    let json_type = ("content-type", "application/json");
    let r = http(
        &addr,
        "POST",
        "/v1/embeddings",
        &[("authorization", &ta), json_type],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    let r = http(
        &addr,
        "POST",
        "/v1/embeddings",
        &[("authorization", &tb), json_type],
        body.as_bytes(),
    )
    .await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    let r = http(
        &addr,
        "GET",
        "/v2/models/enc/ready",
        &[("authorization", &tb)],
        b"",
    )
    .await;
    assert_eq!(r.status, 400, "b may not see enc: not ready for b");
    let r = http(
        &addr,
        "GET",
        "/v2/models/enc/ready",
        &[("authorization", &ta)],
        b"",
    )
    .await;
    assert_eq!(r.status, 200);
}

/// Unknown routes and methods answered with empty bodies (`/v1/chat/completions` 404,
/// `GET /v1/embeddings` 405): they answer in the door's error shape now.
#[tokio::test]
async fn unknown_routes_and_methods_answer_in_the_doors_error_shape() {
    let (server, _worker, _config) = stack().await;
    let addr = server.metrics_address();
    let r = http(&addr, "POST", "/v1/chat/completions", &[], b"{}").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    assert!(r.json()["error"]["code"].is_null(), "not a model not found");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("/v1/chat/completions")),
        "{:?}",
        r.json()
    );
    let r = http(&addr, "GET", "/v1/embeddings", &[], b"").await;
    assert_eq!(r.status, 405);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let r = http(&addr, "GET", "/v2/models/enc/infer", &[], b"").await;
    assert_eq!(r.status, 405);
    assert!(r.json()["error"].is_string());
    let r = http(&addr, "GET", "/v2/nothing/here", &[], b"").await;
    assert_eq!(r.status, 404);
    assert!(r.json()["error"].is_string());
}
