//! Requests that can be followed: the caller's `x-request-id` (or one the server makes) comes
//! back on every answer, errors included, on both ports, and reaches the worker with the
//! caller's W3C `traceparent`.

use serde_json::json;

use super::{grpc, http, stack, texts_request};

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// An id would not come back, a made one would be missing, or the worker would not see the id
/// and the trace context.
#[tokio::test]
async fn request_ids_come_back_and_reach_the_worker() {
    let (server, worker, _config) = stack().await;
    let addr = server.http_address();
    let body = json!({"model": "enc", "input": ["a", "b"]}).to_string();
    let headers = [
        ("content-type", "application/json"),
        ("x-request-id", "req-openai-1"),
        ("traceparent", TRACEPARENT),
    ];
    let r = http(&addr, "POST", "/v1/embeddings", &headers, body.as_bytes()).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some("req-openai-1"));
    let seen = worker.seen().traces;
    assert_eq!(
        seen,
        vec![("req-openai-1".to_owned(), TRACEPARENT.to_owned()); 2]
    );

    // None given: one is made, returned, and the worker sees that one (no traceparent).
    let oip =
        json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["x"]}]});
    let r = http(
        &addr,
        "POST",
        "/v2/models/enc/infer",
        &[("content-type", "application/json")],
        oip.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200);
    let made = r.header("x-request-id").expect("a made id").to_owned();
    assert_eq!(made.len(), 32, "{made}");
    assert_eq!(worker.seen().traces.last(), Some(&(made, String::new())));

    // Errors carry it too: an unknown model, a malformed traceparent dropped.
    let r = http(
        &addr,
        "POST",
        "/v1/embeddings",
        &[
            ("content-type", "application/json"),
            ("x-request-id", "req-missing"),
            ("traceparent", "not-a-trace"),
        ],
        json!({"model": "missing", "input": "x"})
            .to_string()
            .as_bytes(),
    )
    .await;
    assert_eq!(
        (r.status, r.header("x-request-id")),
        (404, Some("req-missing"))
    );

    // gRPC: the id as request metadata comes back as response metadata, and reaches the
    // worker; an error's metadata has it too.
    let mut c = grpc(&server).await;
    let mut request = tonic::Request::new(texts_request("enc", &["grpc"]));
    request
        .metadata_mut()
        .insert("x-request-id", "req-grpc-7".parse().expect("ascii"));
    request
        .metadata_mut()
        .insert("traceparent", TRACEPARENT.parse().expect("ascii"));
    let answer = c.model_infer(request).await.expect("served");
    assert_eq!(
        answer
            .metadata()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok()),
        Some("req-grpc-7")
    );
    assert_eq!(
        worker.seen().traces.last(),
        Some(&("req-grpc-7".to_owned(), TRACEPARENT.to_owned()))
    );
    let mut request = tonic::Request::new(texts_request("missing", &["x"]));
    request
        .metadata_mut()
        .insert("x-request-id", "req-grpc-404".parse().expect("ascii"));
    let e = c.model_infer(request).await.expect_err("unknown model");
    assert_eq!(
        e.metadata()
            .get("x-request-id")
            .and_then(|v| v.to_str().ok()),
        Some("req-grpc-404")
    );
    worker.kill();
}
