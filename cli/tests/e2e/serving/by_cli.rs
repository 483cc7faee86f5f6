//! The `modelshare` client commands on the request path (embed, infer, workers).

use super::server_with;
use crate::worker_util::{Offer, serve};

/// Runs `modelshare --server <address> --output json <args>` and parses what it prints.
async fn cli_json(address: &str, args: &[&str]) -> serde_json::Value {
    let mut all = vec![
        "--server".to_owned(),
        address.to_owned(),
        "--output".into(),
        "json".into(),
    ];
    all.extend(args.iter().map(|s| s.to_string()));
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::common::BIN)
            .args(&all)
            .env_remove("MODELSHARE_SERVER")
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run modelshare")
    })
    .await
    .expect("join");
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

#[tokio::test]
async fn the_cli_embeds_infers_and_shows_serving_workers() {
    let server = server_with(&[], &["enc"]).await;
    let worker = serve(&server.address, "enc", Offer::default()).await;
    let v = cli_json(&server.address, &["embed", "--model", "enc", "ab", "cde"]).await;
    assert_eq!(v["version"], "1");
    assert_eq!(v["embeddings"], serde_json::json!([[2.0, 1.0], [3.0, 1.0]]));
    let v = cli_json(
        &server.address,
        &["infer", "--model", "enc", "--input", "x:INT32:2x2=1,2,3,4"],
    )
    .await;
    assert_eq!(v["outputs"][0]["name"], "echo");
    assert_eq!(v["outputs"][0]["shape"], serde_json::json!([2, 2]));
    assert_eq!(v["outputs"][0]["data"], serde_json::json!([1, 2, 3, 4]));
    let ps = cli_json(&server.address, &["ps"]).await;
    let serving = &ps["sessions"]
        .as_array()
        .expect("sessions")
        .iter()
        .find(|s| s["session_id"] == worker.session_id.as_str())
        .expect("the worker's session")["serving"][0];
    assert_eq!(serving["model"], "enc");
    assert_eq!(serving["items_in_flight"], 0);
    assert_eq!(serving["batches_done"], 2);
    let stats = cli_json(&server.address, &["stats"]).await;
    assert_eq!(stats["requests_outstanding"], 0);
    assert_eq!(stats["serving"][0]["serving_workers"], 1);
}
