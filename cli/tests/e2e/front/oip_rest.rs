//! The OIP REST door: health, metadata, JSON and binary tensors, refusals.

use serde_json::{Value, json};

use super::{BODY_LIMIT, f32s, floats, http, post_json, stack};

/// The OIP REST door would misread JSON or binary tensors, or answer in the wrong form or
/// with the wrong status.
#[tokio::test]
async fn rest_infer_takes_json_and_binary_tensors_and_answers_in_the_form_asked() {
    let (server, worker, _config) = stack().await;
    let addr = server.http_address();

    assert_health_and_metadata(&addr).await;
    assert_json_in_json_out(&addr).await;
    assert_binary_in_binary_out(&addr).await;
    assert_texts_as_json_strings_answer_in_binary(&addr).await;
    assert_refusals_with_their_status(&addr).await;
    worker.kill();
}

/// Health and readiness routes, model and server metadata, an unknown model's 404.
async fn assert_health_and_metadata(addr: &str) {
    for (path, status) in [
        ("/v2/health/live", 200),
        ("/v2/health/ready", 200),
        ("/v2/models/enc/ready", 200),
        ("/v2/models/enc/versions/1/ready", 200),
        ("/v2/models/missing/ready", 400),
    ] {
        assert_eq!(
            http(addr, "GET", path, &[], b"").await.status,
            status,
            "{path}"
        );
    }
    let meta = http(addr, "GET", "/v2/models/enc", &[], b"").await;
    assert_eq!(meta.status, 200);
    assert_eq!(meta.json()["versions"], json!(["1"]));
    assert_eq!(
        http(addr, "GET", "/v2", &[], b"").await.json()["name"],
        "modelshare"
    );
    let unknown = http(addr, "GET", "/v2/models/missing", &[], b"").await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.json()["error"].is_string());
}

/// JSON in, JSON out (nested data).
async fn assert_json_in_json_out(addr: &str) {
    let r = post_json(
        addr,
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
}

/// Binary in (Triton's extension), binary out.
async fn assert_binary_in_binary_out(addr: &str) {
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
        addr,
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
}

/// Texts as JSON strings, every output binary by the request parameter.
async fn assert_texts_as_json_strings_answer_in_binary(addr: &str) {
    let r = post_json(
        addr,
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
}

/// Refusals: unknown model, malformed JSON, a count that disagrees with the shape, an
/// unknown datatype, a body over the limit.
async fn assert_refusals_with_their_status(addr: &str) {
    let one = json!({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]});
    let r = post_json(addr, "/v2/models/missing/infer", &one).await;
    assert_eq!(r.status, 404);
    assert!(
        r.json()["error"]
            .as_str()
            .expect("message")
            .contains("missing")
    );
    let r = http(addr, "POST", "/v2/models/enc/infer", &[], b"{not json").await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].is_string());
    let r = post_json(
        addr,
        "/v2/models/enc/infer",
        &json!({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [1, 2, 3]}]}),
    )
    .await;
    assert_eq!(r.status, 400);
    assert!(r.json()["error"].as_str().expect("message").contains("'x'"));
    let r = post_json(
        addr,
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
    let r = post_json(addr, "/v2/models/enc/infer", &big).await;
    assert_eq!(r.status, 413);
    assert!(r.json()["error"].is_string());
}
