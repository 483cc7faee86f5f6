//! Tenants on the request path: what they reach, and a flooding tenant beside another.

use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use tonic::Code;

use super::{assert_drained_as, oip_client, texts};
use crate::common::Server;
use crate::tenants::{self as tn, TA, TB, TC, TenantsFile, abc_tenants};
use crate::worker_util::{Offer, try_serve};

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
    // a floods at 50x b's rate; b's p99 latency stays within 3x of its p99 alone. The worker
    // takes one item a batch, 50 ms ± 20% each, four at once: 80 items/s, so a's 100 requests/s
    // fill the queue up to a's quota (64) and the rest are refused; b still gets every other
    // turn. Fair turns add up to one batch's time (a slot freeing, ~60 ms) to b's ~60 ms alone,
    // so its p99 may double by design (2.03x was seen on a loaded 2-core machine); starved
    // behind a's 64 queued items it would wait ~800 ms, past 10x.
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
        flooded <= alone * 3,
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
