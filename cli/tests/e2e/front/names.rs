//! Model names as people write them: upper case (`All-MiniLM-L6-v2`) and Hugging Face ids
//! (`sentence-transformers/all-MiniLM-L6-v2`), unique without regard to case, shown as first
//! loaded, reachable on every door in any case (an owner/name id as two path segments), and
//! the names that would make a route ambiguous refused.

use serde_json::json;
use tonic::Code;

use super::{doors_server, grpc, http, post_json, texts_request};
use crate::common::load;
use crate::worker_util::{Offer, serve};

/// Upper-case and owner/name models would be refused at load, unreachable under another case
/// or through the two-segment routes, or loaded twice under two spellings.
#[tokio::test]
async fn names_people_use_reach_every_door_in_any_case() {
    // A start-up model in upper case.
    let (server, _config) = doors_server("All-MiniLM-Demo=enc", &["enc", "hf"]).await;
    let mut admin = server.admin().await;
    let hf = "Sentence-Transformers/All-MiniLM-L6-v2";
    let v = load(&mut admin, hf, "hf")
        .await
        .expect("an owner/name model loads");
    assert_eq!(v.version, 1);
    // Another spelling is the same model: its version 2, not a second model.
    let v = load(&mut admin, &hf.to_lowercase(), "hf")
        .await
        .expect("reload");
    assert_eq!(v.version, 2);
    for bad in ["org/infer", "a/b/c", "Stats", "-x"] {
        let e = load(&mut admin, bad, "hf").await.expect_err(bad);
        assert_eq!(e.code(), Code::InvalidArgument, "{bad}: {e}");
    }

    // Workers attach and serve under any case.
    let enc_worker = serve(&server.address, "all-minilm-demo", Offer::default()).await;
    let hf_worker = serve(
        &server.address,
        "sentence-transformers/all-minilm-l6-v2",
        Offer::default(),
    )
    .await;
    let addr = server.http_address();

    // /v1/models shows each once, spelled as first loaded.
    let models = http(&addr, "GET", "/v1/models", &[], b"").await.json();
    let mut ids: Vec<String> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id").to_owned())
        .collect();
    ids.sort();
    assert_eq!(ids, ["All-MiniLM-Demo", hf]);
    let one = http(
        &addr,
        "GET",
        "/v1/models/sentence-transformers/all-minilm-l6-v2",
        &[],
        b"",
    )
    .await;
    assert_eq!((one.status, one.json()["id"].clone()), (200, json!(hf)));

    // OpenAI, in other cases.
    for model in ["ALL-MINILM-DEMO", "sentence-transformers/all-MiniLM-L6-v2"] {
        let r = post_json(
            &addr,
            "/v1/embeddings",
            &json!({"model": model, "input": ["hi"]}),
        )
        .await;
        assert_eq!(
            r.status,
            200,
            "{model}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    // OIP REST: an owner/name model as two segments, with and without a version.
    for path in [
        "/v2/models/sentence-transformers/all-minilm-l6-v2/ready",
        "/v2/models/Sentence-Transformers/All-MiniLM-L6-v2/versions/2/ready",
        "/v2/models/all-minilm-demo/ready",
    ] {
        assert_eq!(
            http(&addr, "GET", path, &[], b"").await.status,
            200,
            "{path}"
        );
    }
    let meta = http(
        &addr,
        "GET",
        "/v2/models/sentence-transformers/ALL-minilm-l6-v2",
        &[],
        b"",
    )
    .await;
    assert_eq!(meta.status, 200);
    let body =
        json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["hello"]}]});
    for path in [
        "/v2/models/sentence-transformers/all-minilm-l6-v2/infer",
        "/v2/models/Sentence-Transformers/All-MiniLM-L6-v2/versions/2/infer",
        "/v2/models/ALL-MINILM-DEMO/infer",
    ] {
        let r = post_json(&addr, path, &body).await;
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    // OIP gRPC.
    let mut c = grpc(&server).await;
    c.model_infer(texts_request(
        "SENTENCE-TRANSFORMERS/all-minilm-l6-v2",
        &["x"],
    ))
    .await
    .expect("grpc, another case");
    // Unknown stays unknown.
    let r = post_json(&addr, "/v2/models/sentence-transformers/nope/infer", &body).await;
    assert_eq!(r.status, 404);
    assert_eq!((enc_worker.seen().items, hf_worker.seen().items), (2, 4));
    enc_worker.kill();
    hf_worker.kill();
}
