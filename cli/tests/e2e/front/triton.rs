//! Triton's extensions on both OIP doors: a model's configuration, the repository index and
//! request statistics, and their refusals (an unknown model, a malformed index request).

use modelshare_proto::inference as oip;
use serde_json::json;
use tonic::Code;

use super::{grpc, http, stack, texts_request};

/// The doors would answer Triton's config, index or statistics calls with nothing (404,
/// UNIMPLEMENTED), with figures that do not count the requests served, or leak an unknown
/// model.
#[tokio::test]
async fn config_index_and_statistics_on_both_doors() {
    let (server, worker, _config) = stack().await;
    let mut c = grpc(&server).await;
    let addr = server.http_address();
    for texts in [&["a", "bb", "ccc"][..], &["d"]] {
        c.model_infer(texts_request("enc", texts))
            .await
            .expect("served");
    }

    // The configuration: the model, batched (the first dimension is the batch), dynamic
    // batching with the server's queue delay (1 ms by default).
    let config = c
        .model_config(oip::ModelConfigRequest {
            name: "enc".into(),
            version: String::new(),
        })
        .await
        .expect("config")
        .into_inner()
        .config
        .expect("a config");
    assert_eq!(
        (config.name.as_str(), config.platform.as_str()),
        ("enc", "modelshare")
    );
    assert!(config.max_batch_size > 0, "{config:?}");
    let batching = config.dynamic_batching.expect("dynamic batching");
    assert_eq!(batching.max_queue_delay_microseconds, 1000);
    let rest = http(&addr, "GET", "/v2/models/enc/config", &[], b"").await;
    assert_eq!(rest.status, 200);
    let rest = rest.json();
    assert_eq!(rest["name"], "enc");
    assert_eq!(rest["max_batch_size"], json!(config.max_batch_size));
    assert_eq!(
        rest["dynamic_batching"]["max_queue_delay_microseconds"],
        1000
    );

    // The index: version 1, served by the worker.
    let index = c
        .repository_index(oip::RepositoryIndexRequest {
            repository_name: String::new(),
            ready: true,
        })
        .await
        .expect("index")
        .into_inner();
    let entries: Vec<(&str, &str, &str)> = index
        .models
        .iter()
        .map(|m| (m.name.as_str(), m.version.as_str(), m.state.as_str()))
        .collect();
    assert_eq!(entries, [("enc", "1", "READY")]);
    let rest = http(&addr, "POST", "/v2/repository/index", &[], b"").await;
    assert_eq!(rest.status, 200);
    assert_eq!(
        rest.json(),
        json!([{"name": "enc", "version": "1", "state": "READY", "reason": ""}])
    );
    let bad = http(
        &addr,
        "POST",
        "/v2/repository/index",
        &[],
        br#"{"ready": "yes"}"#,
    )
    .await;
    assert_eq!(bad.status, 400);

    // Statistics: two requests, four items, as the door counted them.
    let stats = c
        .model_statistics(oip::ModelStatisticsRequest {
            name: "enc".into(),
            version: String::new(),
        })
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.model_stats.len(), 1, "{stats:?}");
    let s = &stats.model_stats[0];
    assert_eq!((s.name.as_str(), s.version.as_str()), ("enc", "1"));
    assert_eq!(s.inference_count, 4);
    assert!((1..=2).contains(&s.execution_count), "{s:?}");
    let inference = s.inference_stats.as_ref().expect("inference stats");
    assert_eq!(inference.success.as_ref().map(|d| d.count), Some(2));
    assert_eq!(inference.queue.as_ref().map(|d| d.count), Some(4));
    assert!(s.last_inference > 0);
    let rest = http(&addr, "GET", "/v2/models/stats", &[], b"").await;
    assert_eq!(rest.status, 200);
    let rest = rest.json();
    assert_eq!(rest["model_stats"][0]["name"], "enc");
    assert_eq!(rest["model_stats"][0]["inference_count"], 4);
    assert_eq!(
        rest["model_stats"][0]["inference_stats"]["success"]["count"],
        2
    );
    let v1 = http(&addr, "GET", "/v2/models/enc/versions/1/stats", &[], b"").await;
    assert_eq!(v1.json()["model_stats"][0]["version"], "1");
    let v9 = http(&addr, "GET", "/v2/models/enc/versions/9/stats", &[], b"").await;
    assert_eq!(v9.json()["model_stats"], json!([]));

    // An unknown model is NOT_FOUND / 404 on every call that names one.
    let e = c
        .model_config(oip::ModelConfigRequest {
            name: "missing".into(),
            version: String::new(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    let e = c
        .model_statistics(oip::ModelStatisticsRequest {
            name: "missing".into(),
            version: String::new(),
        })
        .await
        .expect_err("unknown");
    assert_eq!(e.code(), Code::NotFound);
    for path in ["/v2/models/missing/config", "/v2/models/missing/stats"] {
        let r = http(&addr, "GET", path, &[], b"").await;
        assert_eq!(r.status, 404, "{path}");
        assert!(r.json()["error"].is_string(), "{path}");
    }
    worker.kill();

    // Unloaded and loaded again, the name starts over at version 1: the figures of the earlier
    // model are not the new one's.
    let mut admin = server.admin().await;
    admin
        .unload_model(modelshare_proto::v1::UnloadModelRequest {
            name: "enc".into(),
            force: true,
            ..Default::default()
        })
        .await
        .expect("unload");
    crate::common::eventually(
        std::time::Duration::from_secs(10),
        "the record goes",
        || {
            let server = &server;
            async move {
                let mut admin = server.admin().await;
                crate::common::load(&mut admin, "enc", "enc").await.is_ok()
            }
        },
    )
    .await;
    let rest = http(&addr, "GET", "/v2/models/enc/stats", &[], b"").await;
    assert_eq!(
        rest.json()["model_stats"],
        json!([]),
        "an earlier model's figures"
    );
}
