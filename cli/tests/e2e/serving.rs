//! The request path end to end: the real server, a test worker on `WorkerService.Serve`, and
//! callers on the KServe v2 gRPC front door (`inference.GRPCInferenceService.ModelInfer`, the
//! generated client: an independent client of the wire contract). The failure paths (refused
//! offers, unknown model, wrong tenant, full queue, expired deadline, cancelled caller, lost
//! worker) and, after each, that nothing is left behind, through the admin API.

use std::time::{Duration, Instant};

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use modelshare_proto::v1 as pb;
use tonic::Code;

use crate::common::{Server, eventually, stats};
use crate::tenants::{self as tn, Authed, TA, TB, TC, TenantsFile, abc_tenants, bearer};
use crate::worker_util::{Offer, serve, try_serve};

async fn oip_client(server: &Server, token: Option<&str>) -> GrpcInferenceServiceClient<Authed> {
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    GrpcInferenceServiceClient::with_interceptor(ch, bearer(token))
}

/// A ModelInfer request of `texts` as one BYTES input of shape [N] (text items).
fn texts(model: &str, texts: &[&str]) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: model.into(),
        id: "req-1".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "text".into(),
            datatype: "BYTES".into(),
            shape: vec![texts.len() as i64],
            contents: Some(oip::InferTensorContents {
                bytes_contents: texts.iter().map(|t| t.as_bytes().to_vec()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// `message` with a `grpc-timeout` header of `ms` milliseconds, and no client-side timer: the
/// server's answer is what is checked.
fn with_timeout<T>(message: T, ms: u64) -> tonic::Request<T> {
    let mut r = tonic::Request::new(message);
    r.metadata_mut()
        .insert("grpc-timeout", format!("{ms}m").parse().expect("header"));
    r
}

/// The `embedding` output's rows.
fn rows(r: &oip::ModelInferResponse) -> Vec<Vec<f32>> {
    let i = r
        .outputs
        .iter()
        .position(|o| o.name == "embedding")
        .expect("embedding output");
    let o = &r.outputs[i];
    let width = *o.shape.last().expect("shape") as usize;
    let values: Vec<f32> = r.raw_output_contents[i]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    values.chunks(width).map(<[f32]>::to_vec).collect()
}

async fn server_with(extra: &[&str], models: &[&str]) -> Server {
    let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
    for m in models {
        args.push("--model".into());
        args.push(format!("{m}={m}"));
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let names: Vec<String> = models.iter().map(|s| s.to_string()).collect();
    Server::start_with(&refs, move |root| {
        let n: Vec<&str> = names.iter().map(String::as_str).collect();
        tn::models(root, &n);
    })
    .await
}

/// Waits until the request path holds nothing: no request outstanding, no item queued.
async fn assert_drained(server: &Server) {
    assert_drained_as(server, None).await;
}

/// [`assert_drained`] with the admin's token.
async fn assert_drained_as(server: &Server, token: Option<&str>) {
    let admin = tn::admin_as(server, token).await;
    eventually(Duration::from_secs(5), "request path drained", || {
        let mut admin = admin.clone();
        async move {
            let s = admin
                .get_stats(pb::GetStatsRequest {})
                .await
                .expect("GetStats")
                .into_inner();
            s.requests_outstanding == 0
                && s.serving.iter().all(|m| m.queued_items == 0)
                && s.tenants.iter().all(|t| t.requests == 0)
        }
    })
    .await;
}

#[tokio::test]
async fn a_request_is_computed_by_a_worker_and_the_answer_names_its_version() {
    let server = server_with(&[], &["enc"]).await;
    let worker = serve(&server.address, "enc", Offer::default()).await;
    assert_eq!(worker.accepted.version, 1);
    let mut client = oip_client(&server, None).await;
    let r = client
        .model_infer(texts("enc", &["a", "hello world", ""]))
        .await
        .expect("infer")
        .into_inner();
    assert_eq!(r.model_name, "enc");
    assert_eq!(r.model_version, "1");
    assert_eq!(r.id, "req-1");
    assert_eq!(
        rows(&r),
        vec![vec![1.0, 1.0], vec![11.0, 1.0], vec![0.0, 1.0]]
    );
    let seen = worker.seen();
    assert_eq!(seen.items, 3);
    // ps shows the stream; stats the model's request path.
    let mut admin = server.admin().await;
    let sessions = admin
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("ps")
        .into_inner()
        .sessions;
    let s = sessions
        .iter()
        .find(|s| s.session_id == worker.session_id)
        .expect("session");
    assert_eq!(s.serving.len(), 1);
    assert_eq!(
        (s.serving[0].model.as_str(), s.serving[0].version),
        ("enc", 1)
    );
    assert_eq!(s.serving[0].batches_done, seen.batches as u64);
    let st = stats(&mut admin).await;
    let m = st.serving.iter().find(|m| m.model == "enc").expect("enc");
    assert_eq!(m.serving_workers, 1);
    assert_drained(&server).await;
    worker.close().await.expect("clean close");
}

#[tokio::test]
async fn bad_offers_are_refused_with_the_documented_codes() {
    let server = server_with(&[], &["enc"]).await;
    let bad = |f: fn(&mut Offer)| {
        let mut o = Offer::default();
        f(&mut o);
        o
    };
    for (offer, code) in [
        (bad(|o| o.credits = 0), Code::InvalidArgument),
        (bad(|o| o.max_batch_items = 0), Code::InvalidArgument),
        (
            bad(|o| o.accepts = vec!["audio".into()]),
            Code::InvalidArgument,
        ),
        (bad(|o| o.accepts.clear()), Code::InvalidArgument),
        (bad(|o| o.max_batch_bytes = 1 << 40), Code::InvalidArgument),
        (bad(|o| o.version = 7), Code::NotFound),
    ] {
        let got = try_serve(&server.address, None, "enc", offer.clone()).await;
        let status = got.err().unwrap_or_else(|| panic!("{offer:?} accepted"));
        assert_eq!(status.code(), code, "{offer:?}: {status:?}");
    }
    // An unknown model: the attach fails first, as it should.
    let status = try_serve(&server.address, None, "nope", Offer::default())
        .await
        .err()
        .expect("refused");
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn unknown_models_and_a_model_with_no_worker_are_answered_clearly() {
    let server = server_with(&["--no-worker-wait-ms", "300"], &["enc"]).await;
    let mut client = oip_client(&server, None).await;
    let status = client
        .model_infer(texts("missing", &["x"]))
        .await
        .expect_err("unknown");
    assert_eq!(status.code(), Code::NotFound);
    let started = Instant::now();
    let status = client
        .model_infer(texts("enc", &["x"]))
        .await
        .expect_err("no worker");
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status.message().contains("no worker serves model 'enc'"),
        "{status:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_drained(&server).await;
}

#[tokio::test]
async fn an_expired_deadline_is_never_dispatched_and_a_cancelled_call_reaches_the_worker() {
    let server = server_with(&[], &["enc"]).await;
    let offer = Offer {
        credits: 1,
        ..Offer::default()
    };
    let worker = serve(&server.address, "enc", offer).await;
    let mut client = oip_client(&server, None).await;
    // The one credit is busy for 1.5 s...
    let busy = tokio::spawn({
        let mut c = client.clone();
        async move { c.model_infer(texts("enc", &["sleep:1500"])).await }
    });
    eventually(Duration::from_secs(5), "the slow item in flight", || {
        let items = worker.seen().items;
        async move { items == 1 }
    })
    .await;
    // ...so this one's 200 ms deadline passes in the queue.
    let status = client
        .model_infer(with_timeout(texts("enc", &["late"]), 200))
        .await
        .expect_err("deadline");
    // The request path answers DEADLINE_EXCEEDED a little before the header's time; on a
    // starved machine tonic's own timer on the header may still answer first, with CANCELLED
    // "Timeout expired". Either way the item must never reach the worker (below).
    assert!(
        status.code() == Code::DeadlineExceeded
            || (status.code() == Code::Cancelled && status.message().contains("Timeout expired")),
        "{status:?}"
    );
    busy.await.expect("task").expect("slow one answered");
    assert_eq!(worker.seen().items, 1, "the expired item was dispatched");

    // A caller that goes away: its item in flight is cancelled at the worker.
    let call = tokio::spawn({
        let mut c = client.clone();
        async move { c.model_infer(texts("enc", &["sleep:1000"])).await }
    });
    eventually(Duration::from_secs(5), "the second item in flight", || {
        let items = worker.seen().items;
        async move { items == 2 }
    })
    .await;
    call.abort();
    eventually(
        Duration::from_secs(5),
        "the worker told of the cancel",
        || {
            let n = worker.seen().cancelled.len();
            async move { n == 1 }
        },
    )
    .await;
    assert_drained(&server).await;
    worker.close().await.expect("clean close");
}

#[tokio::test]
async fn a_full_queue_is_refused_at_once_and_a_lost_workers_items_go_to_another() {
    let config = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(config.path(), "[serving]\nmax_queue_items = 2\n").expect("write");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let server = server_with(
        &["--config", &path, "--no-worker-wait-ms", "5000"],
        &["enc"],
    )
    .await;
    let mut client = oip_client(&server, None).await;
    let waiting = tokio::spawn({
        let mut c = client.clone();
        async move { c.model_infer(texts("enc", &["abc", "de"])).await }
    });
    let mut admin = server.admin().await;
    eventually(Duration::from_secs(5), "two items queued", || {
        let mut admin = admin.clone();
        async move {
            stats(&mut admin)
                .await
                .serving
                .iter()
                .any(|m| m.queued_items == 2)
        }
    })
    .await;
    let status = client
        .model_infer(texts("enc", &["x"]))
        .await
        .expect_err("full");
    assert_eq!(status.code(), Code::ResourceExhausted);
    // A worker takes the queued request and is lost with it in flight...
    let first = serve(
        &server.address,
        "enc",
        Offer {
            batch_ms: 60_000,
            ..Offer::default()
        },
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "the items at the first worker",
        || {
            let n = first.seen().items;
            async move { n == 2 }
        },
    )
    .await;
    first.kill();
    // ...and a second computes it.
    let second = serve(&server.address, "enc", Offer::default()).await;
    let r = waiting
        .await
        .expect("task")
        .expect("requeued and answered")
        .into_inner();
    assert_eq!(rows(&r), vec![vec![3.0, 1.0], vec![2.0, 1.0]]);
    assert_eq!(second.seen().items, 2);
    assert_drained(&server).await;
    let _ = stats(&mut admin).await;
}

#[tokio::test]
async fn tenants_reach_only_models_they_see_and_a_payload_never_reaches_a_third_tenant() {
    // a owns "enc", shared with b and c; c runs a worker of its own; b has none.
    let tenants = TenantsFile::new(&abc_tenants("[tenants.quota]\nrequests = 1"));
    let server = tn::start(&tenants, &["--no-worker-wait-ms", "300"], &["enc", "priv"]).await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    let shared = pb::ModelAccess {
        shared_with: vec!["b".into(), "c".into()],
        public: false,
    };
    tn::load_as(&mut admin_a, "enc", "enc", "", Some(shared))
        .await
        .expect("load enc");
    tn::load_as(&mut admin_a, "priv", "priv", "", None)
        .await
        .expect("load priv");
    let c_worker = try_serve(&server.address, Some(TC), "enc", Offer::default())
        .await
        .expect("c serves");
    // b may not see a's private model: as if it did not exist.
    let mut b = oip_client(&server, Some(TB)).await;
    let status = b
        .model_infer(texts("priv", &["x"]))
        .await
        .expect_err("hidden");
    assert_eq!(status.code(), Code::NotFound);
    // b's request never goes to c's worker: no worker serves b.
    let status = b
        .model_infer(texts("enc", &["for b"]))
        .await
        .expect_err("no worker for b");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(c_worker.seen().items, 0, "b's payload reached c's worker");
    // c's own request does.
    let mut c = oip_client(&server, Some(TC)).await;
    c.model_infer(texts("enc", &["for c"]))
        .await
        .expect("c served");
    assert_eq!(c_worker.seen().items, 1);
    // The owner's worker serves b, and a's quota of one request outstanding holds.
    let a_worker = try_serve(
        &server.address,
        Some(TA),
        "enc",
        Offer {
            batch_ms: 300,
            ..Offer::default()
        },
    )
    .await
    .expect("a serves");
    b.model_infer(texts("enc", &["for b"]))
        .await
        .expect("b served by a's worker");
    assert_eq!(a_worker.seen().items, 1);
    let mut a = oip_client(&server, Some(TA)).await;
    let slow = tokio::spawn({
        let mut a = a.clone();
        async move { a.model_infer(texts("enc", &["one"])).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let status = a
        .model_infer(texts("enc", &["two"]))
        .await
        .expect_err("quota");
    assert_eq!(status.code(), Code::ResourceExhausted);
    slow.await.expect("task").expect("first served");
    assert_drained_as(&server, Some(crate::tenants::ADMIN)).await;
}

#[tokio::test]
async fn a_flooding_tenant_does_not_starve_another() {
    // a floods at 50x b's rate; b's p99 latency stays within 2x of its p99 alone. The worker
    // takes one item a batch, 50 ms ± 20% each, four at once: 80 items/s, so a's 100 requests/s
    // fill the queue up to a's quota (64) and the rest are refused; b still gets every other
    // turn.
    let tenants = TenantsFile::new(&abc_tenants("[tenants.quota]\nrequests = 64"));
    let server = tn::start(&tenants, &[], &["enc"]).await;
    let mut admin = tn::admin_as(&server, Some(crate::tenants::ADMIN)).await;
    tn::load_as(
        &mut admin,
        "enc",
        "enc",
        "",
        Some(pb::ModelAccess {
            shared_with: Vec::new(),
            public: true,
        }),
    )
    .await
    .expect("load");
    let _worker = try_serve(
        &server.address,
        Some(crate::tenants::ADMIN),
        "enc",
        Offer {
            credits: 4,
            max_batch_items: 1,
            batch_ms: 50,
            ..Offer::default()
        },
    )
    .await
    .expect("serve");
    let b_rate = 2.0;
    let b_alone = b_latencies(&server, b_rate, Duration::from_secs(8)).await;
    let flood = tokio::spawn({
        let client = oip_client(&server, Some(TA)).await;
        async move {
            // 50x b's rate, each call on its own task (refusals for a's quota are expected).
            let period = Duration::from_secs_f64(1.0 / (b_rate * 50.0));
            let mut tick = tokio::time::interval(period);
            let (mut ok, mut refused) = (0u32, 0u32);
            let mut calls = tokio::task::JoinSet::new();
            let end = Instant::now() + Duration::from_secs(9);
            while Instant::now() < end {
                tick.tick().await;
                let mut c = client.clone();
                calls.spawn(async move { c.model_infer(texts("enc", &["flood"])).await });
                while let Some(r) = calls.try_join_next() {
                    match r.expect("task") {
                        Ok(_) => ok += 1,
                        Err(_) => refused += 1,
                    }
                }
            }
            while let Some(r) = calls.join_next().await {
                match r.expect("task") {
                    Ok(_) => ok += 1,
                    Err(_) => refused += 1,
                }
            }
            (ok, refused)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let b_flooded = b_latencies(&server, b_rate, Duration::from_secs(8)).await;
    let (a_ok, a_refused) = flood.await.expect("flood");
    let p99 = |mut v: Vec<Duration>| {
        v.sort();
        v[(v.len() * 99 / 100).min(v.len() - 1)]
    };
    let (alone, flooded) = (p99(b_alone), p99(b_flooded));
    eprintln!(
        "fairness: b p99 alone {alone:?}, with a flooding {flooded:?}; a served {a_ok}, refused {a_refused}"
    );
    assert!(a_ok > 0);
    assert!(
        flooded <= alone * 2,
        "b's p99 went from {alone:?} alone to {flooded:?} under a's flood"
    );
    assert_drained_as(&server, Some(crate::tenants::ADMIN)).await;
}

/// b's request latencies at `rate` per second for `time`, all answered.
async fn b_latencies(server: &Server, rate: f64, time: Duration) -> Vec<Duration> {
    let client = oip_client(server, Some(TB)).await;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut calls = tokio::task::JoinSet::new();
    let end = Instant::now() + time;
    while Instant::now() < end {
        tick.tick().await;
        let mut c = client.clone();
        calls.spawn(async move {
            let t = Instant::now();
            c.model_infer(texts("enc", &["b"])).await.expect("b served");
            t.elapsed()
        });
    }
    let mut out = Vec::new();
    while let Some(r) = calls.join_next().await {
        out.push(r.expect("task"));
    }
    out
}

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

#[tokio::test]
async fn in_a_hot_swap_new_items_go_to_the_new_version_and_the_old_worker_drains() {
    let server = server_with(&[], &["enc"]).await;
    let old = serve(&server.address, "enc", Offer::default()).await;
    let mut client = oip_client(&server, None).await;
    let r = client
        .model_infer(texts("enc", &["x"]))
        .await
        .expect("v1")
        .into_inner();
    assert_eq!(r.model_version, "1");
    // Version 2 replaces version 1: its worker comes, the old one is told to drain.
    let mut admin = server.admin().await;
    crate::common::load(&mut admin, "enc", "enc")
        .await
        .expect("load v2");
    let new = serve(&server.address, "enc", Offer::default()).await;
    assert_eq!(new.accepted.version, 2);
    eventually(
        Duration::from_secs(5),
        "the old worker told to drain",
        || {
            let drains = old.seen().drains;
            async move { drains == 1 }
        },
    )
    .await;
    for _ in 0..5 {
        let r = client
            .model_infer(texts("enc", &["y"]))
            .await
            .expect("v2")
            .into_inner();
        assert_eq!(r.model_version, "2");
        assert_eq!(rows(&r), vec![vec![1.0, 2.0]]);
    }
    assert_eq!(old.seen().items, 1, "the draining worker got new items");
    old.close().await.expect("the old worker leaves cleanly");
    assert_drained(&server).await;
}
