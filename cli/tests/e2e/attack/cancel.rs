//! Cancelled requests: the worker hears of it, the share is held until it answers, and a
//! worker that holds cancelled items too long is ended.

use std::time::Duration;

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::Code;

use super::config;
use crate::tenants::{self as tn, TA, TenantsFile, abc_tenants};
use crate::worker_util::{Offer, try_serve};

fn one_text(
    model: &str,
    text: &str,
    timeout: Option<Duration>,
) -> tonic::Request<oip::ModelInferRequest> {
    let mut r = tonic::Request::new(oip::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "text".into(),
            datatype: "BYTES".into(),
            shape: vec![1],
            contents: Some(oip::InferTensorContents {
                bytes_contents: vec![text.as_bytes().to_vec()],
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    if let Some(t) = timeout {
        r.set_timeout(t);
    }
    r
}

fn metric_value(http_addr: &str, line_start: &str) -> f64 {
    let (_, body) = crate::common::http_get(http_addr, "/metrics");
    body.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Items cancelled at their deadline left the tenant's count at once while the worker
/// computed them to the end, so a tenant could keep workers busy past its quota. Now the
/// worker is sent the cancel (it sees it), the tenant's share stays taken until the worker
/// answers, and a worker that never answers is ended at the deadline plus the grace (counted
/// in `modelshare_inference_cancel_overruns_total`), which gives the share back.
#[tokio::test]
async fn a_cancel_reaches_the_worker_and_the_share_is_held_until_it_answers() {
    let tenants = TenantsFile::new(&abc_tenants("[tenants.quota]\nrequests = 1"));
    let server = tn::start(
        &tenants,
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--no-worker-wait-ms",
            "300",
        ],
        &["enc"],
    )
    .await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads enc");
    let slow = try_serve(
        &server.address,
        Some(TA),
        "enc",
        Offer {
            batch_ms: 1500,
            ..Offer::default()
        },
    )
    .await
    .expect("a serves enc");
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    let mut a = GrpcInferenceServiceClient::with_interceptor(ch, tn::bearer(Some(TA)));

    let e = a
        .model_infer(one_text("enc", "late", Some(Duration::from_millis(300))))
        .await
        .expect_err("past its deadline");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    crate::common::eventually(Duration::from_secs(5), "the worker sees the cancel", || {
        let n = slow.seen().cancelled.len();
        async move { n == 1 }
    })
    .await;
    // The item is still at the worker: a's one request of quota is still taken.
    let e = a
        .model_infer(one_text("enc", "now", None))
        .await
        .expect_err("quota held");
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    // Once the worker answers it, the share is back.
    crate::common::eventually(Duration::from_secs(10), "the share comes back", || {
        let mut a = a.clone();
        async move { a.model_infer(one_text("enc", "again", None)).await.is_ok() }
    })
    .await;
    slow.kill();
}

/// A worker that neither answers nor acknowledges cancelled items kept its tenant's share for
/// ever: it is ended at the request's deadline plus the grace, counted in
/// `modelshare_inference_cancel_overruns_total`, and the share comes back.
#[tokio::test]
async fn a_worker_holding_cancelled_items_past_the_grace_is_ended() {
    let (_cfg, cfg) = config("[serving]\ncancel_grace_ms = 1000\n");
    let tenants = TenantsFile::new(&abc_tenants("[tenants.quota]\nrequests = 1"));
    let server = tn::start(
        &tenants,
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--config",
            &cfg,
            "--no-worker-wait-ms",
            "300",
        ],
        &["enc"],
    )
    .await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads enc");
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    let mut a = GrpcInferenceServiceClient::with_interceptor(ch, tn::bearer(Some(TA)));
    let stuck = try_serve(
        &server.address,
        Some(TA),
        "enc",
        Offer {
            batch_ms: 120_000,
            ..Offer::default()
        },
    )
    .await
    .expect("a serves enc");
    let http = server.metrics_address();
    let overruns = r#"modelshare_inference_cancel_overruns_total{model="enc"}"#;
    assert_eq!(metric_value(&http, overruns), 0.0);
    let e = a
        .model_infer(one_text("enc", "stuck", Some(Duration::from_millis(300))))
        .await
        .expect_err("past its deadline");
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    crate::common::eventually(Duration::from_secs(10), "the stuck worker is ended", || {
        let http = http.clone();
        async move { metric_value(&http, overruns) == 1.0 }
    })
    .await;
    // Its share is back: with no worker left, the next request waits for one and is told so.
    let e = a
        .model_infer(one_text("enc", "after", None))
        .await
        .expect_err("no worker");
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    drop(stuck);
}
