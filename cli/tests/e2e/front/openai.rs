//! The OpenAI door: embeddings, models and errors in OpenAI's shapes.

use base64::Engine as _;
use serde_json::json;

use super::{Answer, BODY_LIMIT, floats, http, post_json, stack};

/// The OpenAI door would answer embeddings, models or errors in a shape its clients cannot
/// read.
#[tokio::test]
async fn openai_embeddings_and_models_answer_in_openais_shapes() {
    let (server, worker, _config) = stack().await;
    let addr = server.http_address();

    assert_embeddings_as_floats_and_base64(&addr).await;
    assert_models_listed(&addr).await;
    assert_errors_in_openais_shape(&addr).await;
    worker.kill();
}

/// Embeddings of a list of texts as floats, with their usage; of one text as base64.
async fn assert_embeddings_as_floats_and_base64(addr: &str) {
    let r = post_json(
        addr,
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
        addr,
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
}

/// The model list and one model.
async fn assert_models_listed(addr: &str) {
    let models = http(addr, "GET", "/v1/models", &[], b"").await.json();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "enc");
    assert_eq!(models["data"][0]["object"], "model");
    assert_eq!(models["data"][0]["owned_by"], "modelshare");
    assert!(models["data"][0]["created"].as_i64().expect("created") > 0);
    assert_eq!(
        http(addr, "GET", "/v1/models/enc", &[], b"").await.json()["id"],
        "enc"
    );
}

/// Errors in OpenAI's shape: unknown models, malformed or empty input, a body over the limit,
/// a worker's refusal of an item.
async fn assert_errors_in_openais_shape(addr: &str) {
    let error = |a: &Answer| a.json()["error"].clone();
    let r = http(addr, "GET", "/v1/models/missing", &[], b"").await;
    assert_eq!(r.status, 404);
    assert_eq!(error(&r)["code"], "model_not_found");
    let r = post_json(
        addr,
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
        addr,
        "POST",
        "/v1/embeddings",
        &[],
        b"{\"model\": \"enc\", \"input\": ",
    )
    .await;
    assert_eq!(r.status, 400);
    assert_eq!(error(&r)["type"], "invalid_request_error");
    let r = post_json(
        addr,
        "/v1/embeddings",
        &json!({"model": "enc", "input": []}),
    )
    .await;
    assert_eq!(r.status, 400);
    let r = post_json(
        addr,
        "/v1/embeddings",
        &json!({"model": "enc", "input": "x".repeat(2 * BODY_LIMIT)}),
    )
    .await;
    assert_eq!(r.status, 413);
    assert_eq!(error(&r)["type"], "invalid_request_error");
    // A worker's refusal of an item keeps its code: 400.
    let r = post_json(
        addr,
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
}
