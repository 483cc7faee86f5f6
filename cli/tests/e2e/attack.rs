//! The inference doors under attack: hostile requests that once crashed or starved the server.
//! Each test asserts what the server does (answers, closes, refuses, stays up), not timings.

use std::time::Duration;

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

use crate::front::http;
use crate::tenants::{self as tn, TA, TC, TenantsFile, abc_tenants};
use crate::worker_util::{Offer, try_serve};

/// A bomb: a batch dimension of 2^32 rows of nothing (zero elements, so no data is needed).
fn bomb_rest() -> Vec<u8> {
    json!({"inputs": [{"name": "x", "shape": [4_294_967_296_u64, 0], "datatype": "FP32", "data": []}]})
        .to_string()
        .into_bytes()
}

fn bomb_grpc(model: &str) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: model.into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![4_294_967_296, 0],
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// An 85-byte OIP request of shape `[4294967296, 0]` aborted the server (one item built per
/// row: a 137 GB allocation) through REST and gRPC, from any tenant, even one with no model.
/// Now a tenant that may not see the model gets 404 before anything is parsed, and one that
/// may gets 413 / INVALID_ARGUMENT naming the limit; the server stays up and serves.
#[tokio::test]
async fn a_batch_dimension_of_billions_of_empty_rows_is_refused_and_the_server_stays_up() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(&tenants, &["--http-listen", "127.0.0.1:0"], &["enc"]).await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads enc");
    let _worker = try_serve(&server.address, Some(TA), "enc", Offer::default())
        .await
        .expect("a serves enc");
    let addr = server.metrics_address();
    let json_type = ("content-type", "application/json");
    let (ta, tc) = (format!("Bearer {TA}"), format!("Bearer {TC}"));

    // c has no model at all: not found, and nothing of the body is looked at.
    let r = http(
        &addr,
        "POST",
        "/v2/models/enc/infer",
        &[("authorization", &tc), json_type],
        &bomb_rest(),
    )
    .await;
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
    // a owns enc: the request can never fit a queue.
    for _ in 0..3 {
        let r = http(
            &addr,
            "POST",
            "/v2/models/enc/infer",
            &[("authorization", &ta), json_type],
            &bomb_rest(),
        )
        .await;
        assert_eq!(r.status, 413, "{}", String::from_utf8_lossy(&r.body));
        let message = r.json()["error"].as_str().expect("message").to_owned();
        assert!(message.contains("max_queue_items"), "{message}");
        assert_eq!(r.header("x-should-retry"), Some("false"));
    }

    // The same over gRPC.
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    let mut grpc = GrpcInferenceServiceClient::with_interceptor(ch, tn::bearer(Some(TA)));
    let e = grpc
        .model_infer(bomb_grpc("enc"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("max_queue_items"), "{e:?}");
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    let mut grpc_c = GrpcInferenceServiceClient::with_interceptor(ch, tn::bearer(Some(TC)));
    let e = grpc_c
        .model_infer(bomb_grpc("enc"))
        .await
        .expect_err("refused");
    assert_eq!(e.code(), Code::NotFound, "{e:?}");

    // Still up, and still computing.
    let body =
        json!({"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["abc"]}]});
    let r = http(
        &addr,
        "POST",
        "/v2/models/enc/infer",
        &[("authorization", &ta), json_type],
        body.to_string().as_bytes(),
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let mut admin = tn::admin_as(&server, Some(TA)).await;
    admin
        .get_stats(modelshare_proto::v1::GetStatsRequest::default())
        .await
        .expect("the server answers");
}

/// Sends `head` (request line and headers, with the blank line) and `body_part` on a new
/// connection, and reads the status line the server answers within `within` (`None`: no
/// answer). The connection is returned to keep it open.
async fn send_head(
    addr: &str,
    head: &str,
    body_part: &[u8],
    within: Duration,
) -> (tokio::net::TcpStream, Option<u16>) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(body_part).await.expect("body part");
    let status = read_status(&mut s, within).await;
    (s, status)
}

async fn read_status(s: &mut tokio::net::TcpStream, within: Duration) -> Option<u16> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) | Ok(Err(_)) | Ok(Ok(0)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
        if got.windows(2).any(|w| w == b"\r\n") {
            break;
        }
    }
    let line = String::from_utf8_lossy(&got).into_owned();
    line.split_whitespace().nth(1).and_then(|c| c.parse().ok())
}

/// Whether the server closes `s` within `within` (reads to EOF or a reset).
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let until = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(until, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
        }
    }
}

fn post_head(path: &str, token: Option<&str>, length: usize) -> String {
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}Content-Length: {length}\r\n\r\n"
    )
}

/// A config file of `text` (kept alive by the returned handle).
fn config(text: &str) -> (tempfile::NamedTempFile, String) {
    let file = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(file.path(), text).expect("write config");
    let path = file.path().to_str().expect("utf-8").to_owned();
    (file, path)
}

/// The REST doors read a body whole (64 MiB) before checking its token, and a
/// `content-length` past the limit with no body got no answer. Now: no token, 401 before a
/// body byte is sent; past the limit, 413 at once (a configuration the old server read too).
#[tokio::test]
async fn bodies_are_read_only_after_the_token() {
    let (_cfg, cfg) = config("[serving]\nmax_request_bytes = 1048576\n");
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(
        &tenants,
        &["--http-listen", "127.0.0.1:0", "--config", &cfg],
        &["enc"],
    )
    .await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads enc");
    let addr = server.metrics_address();
    let quick = Duration::from_secs(5);
    for path in ["/v1/embeddings", "/v2/models/enc/infer"] {
        // No token, 64 MiB announced, nothing sent: 401 at once.
        let (_s, status) = send_head(&addr, &post_head(path, None, 64 << 20), b"", quick).await;
        assert_eq!(status, Some(401), "{path}");
        let (_s, status) = send_head(
            &addr,
            &post_head(path, Some("wrong"), 64 << 20),
            b"{",
            quick,
        )
        .await;
        assert_eq!(status, Some(401), "{path}");
        // A token, and a length past the limit: 413 at once, without the body.
        let (_s, status) = send_head(&addr, &post_head(path, Some(TA), 2 << 20), b"", quick).await;
        assert_eq!(status, Some(413), "{path}");
    }
}

/// Stalled uploads of a tenant with a token were buffered without bound (60 of them took the
/// server to 3.8 GiB). Now the listener's budget of bodies in flight, once spent, answers 503
/// with Retry-After and takes no memory; stalled bodies end at the body timeout (408) and
/// their connections close; then the budget is free again.
#[tokio::test]
async fn bodies_in_flight_are_within_a_budget_and_a_timeout() {
    let (_cfg, cfg) = config(
        "[serving]\nmax_request_bytes = 1048576\nmax_body_bytes_in_flight = 2097152\nrequest_body_timeout_ms = 2000\n",
    );
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(
        &tenants,
        &["--http-listen", "127.0.0.1:0", "--config", &cfg],
        &["enc"],
    )
    .await;
    let mut admin_a = tn::admin_as(&server, Some(TA)).await;
    tn::load_as(&mut admin_a, "enc", "enc", "", None)
        .await
        .expect("a loads enc");
    let addr = server.metrics_address();
    let quick = Duration::from_secs(5);

    // Two stalled 1 MiB uploads of a's fill the 2 MiB budget: the third is 503, at once.
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let (s, status) = send_head(
            &addr,
            &post_head("/v1/embeddings", Some(TA), 1 << 20),
            b"{\"model\":",
            Duration::from_millis(300),
        )
        .await;
        assert_eq!(status, None, "a stalled body is waited for");
        stalled.push(s);
    }
    let answered = {
        let body = json!({"model": "enc", "input": "x"}).to_string();
        send_head(
            &addr,
            &post_head("/v1/embeddings", Some(TC), body.len()),
            body.as_bytes(),
            quick,
        )
        .await
        .1
    };
    assert_eq!(answered, Some(503), "the listener's budget is spent");
    // The stalled ones end at the body timeout, and their connections close.
    for s in &mut stalled {
        assert_eq!(read_status(s, quick).await, Some(408));
        assert!(closed_within(s, quick).await, "closed after the 408");
    }
    let body = json!({"model": "enc", "input": "x"}).to_string();
    let (_s, status) = send_head(
        &addr,
        &post_head("/v1/embeddings", Some(TC), body.len()),
        body.as_bytes(),
        quick,
    )
    .await;
    assert_eq!(
        status,
        Some(404),
        "the budget is free again (c may not see enc)"
    );
}

/// A connection with an open request was never idle: an unauthenticated Health/Watch never
/// ended, so a few of them filled the gRPC listener and the admin over TCP was refused. Now a
/// Watch ends after the idle period, its connection then closes as idle, and the admin over
/// TCP is answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watches_end_and_their_connections_close_while_the_admin_answers_again() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let (_cfg, cfg) = config(
        "[limits]\nmax_connections = 4\nmax_connections_per_peer = 4\nconnection_idle_timeout_ms = 1500\n",
    );
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(
        &tenants,
        &["--listen", &format!("127.0.0.1:{port}"), "--config", &cfg],
        &[],
    )
    .await;
    let tcp = format!("http://127.0.0.1:{port}");
    let mut watches = Vec::new();
    for _ in 0..4 {
        let ch = tonic::transport::Endpoint::from_shared(tcp.clone())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
        let stream = health
            .watch(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("watch")
            .into_inner();
        watches.push(stream);
    }
    // The listener is full of watches: an admin call over TCP is refused now.
    let full = admin_over_tcp(&tcp).await;
    assert!(full.is_err(), "the listener is full: {full:?}");
    // Each watch ends by itself (OK, no more messages).
    for w in &mut watches {
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(_)) = w.message().await {}
        })
        .await;
        assert!(ended.is_ok(), "a watch outlived its limit");
    }
    // Its connections close as idle, and the admin is answered.
    crate::common::eventually(
        Duration::from_secs(15),
        "the admin answers over TCP",
        || {
            let tcp = tcp.clone();
            async move { admin_over_tcp(&tcp).await.is_ok() }
        },
    )
    .await;
    drop(server);
}

async fn admin_over_tcp(tcp: &str) -> Result<(), String> {
    let ch = tonic::transport::Endpoint::from_shared(tcp.to_owned())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut admin =
        modelshare_proto::v1::admin_service_client::AdminServiceClient::with_interceptor(
            ch,
            tn::bearer(Some(crate::tenants::ADMIN)),
        );
    admin
        .get_stats(modelshare_proto::v1::GetStatsRequest::default())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A server of tenants a, b and c started with `extra`, where b owns `encb` and a test
/// worker of b's serves it; b's admin client. The tenants file must outlive the server.
async fn b_serves_encb(
    extra: &[&str],
) -> (
    TenantsFile,
    crate::common::Server,
    crate::worker_util::TestWorker,
    modelshare_proto::v1::admin_service_client::AdminServiceClient<tn::Authed>,
) {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(&tenants, extra, &["encb"]).await;
    let mut admin_b = tn::admin_as(&server, Some(crate::tenants::TB)).await;
    tn::load_as(&mut admin_b, "encb", "encb", "", None)
        .await
        .expect("b loads encb");
    let worker = try_serve(
        &server.address,
        Some(crate::tenants::TB),
        "encb",
        Offer::default(),
    )
    .await
    .expect("b serves encb");
    (tenants, server, worker, admin_b)
}

/// 8 MiB of token ids for a model tenant a does not have: parsed in full, then 404.
fn big_token_body() -> std::sync::Arc<String> {
    let ids = vec!["12345"; (8 << 20) / 6].join(",");
    std::sync::Arc::new(format!(r#"{{"model":"nothing","input":[{ids}]}}"#))
}

/// Large token-id bodies were parsed on the async runtime (as `serde_json::Value`, 33 times
/// the body): a few at once held its threads for seconds, so another tenant's worker session
/// was ended by heartbeat timeout and its requests waited. Now parsing runs on the bounded
/// request pool (and small ones at once): while tenant a sends 8 × 8 MiB bodies at once, tenant b's session (600 ms
/// of heartbeat slack) stays open and every one of b's one-input requests is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn big_token_bodies_of_one_tenant_do_not_end_another_tenants_session() {
    let (_cfg, cfg) = config("heartbeat_interval_ms = 200\nheartbeat_misses = 3\n");
    let (_tenants, server, worker, mut admin_b) =
        b_serves_encb(&["--http-listen", "127.0.0.1:0", "--config", &cfg]).await;
    let addr = server.metrics_address();
    let big = big_token_body();
    let attack: Vec<_> = (0..8)
        .map(|_| {
            let (addr, big) = (addr.clone(), big.clone());
            tokio::spawn(async move {
                let auth = format!("Bearer {TA}");
                http(
                    &addr,
                    "POST",
                    "/v1/embeddings",
                    &[
                        ("authorization", &auth),
                        ("content-type", "application/json"),
                    ],
                    big.as_bytes(),
                )
                .await
                .status
            })
        })
        .collect();
    let mut latencies = Vec::new();
    let auth_b = format!("Bearer {}", crate::tenants::TB);
    let one = json!({"model": "encb", "input": "hello"}).to_string();
    while !attack.iter().all(|a| a.is_finished()) || latencies.len() < 5 {
        let t = std::time::Instant::now();
        let r = http(
            &addr,
            "POST",
            "/v1/embeddings",
            &[
                ("authorization", &auth_b),
                ("content-type", "application/json"),
            ],
            one.as_bytes(),
        )
        .await;
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        latencies.push(t.elapsed());
    }
    for a in attack {
        assert_eq!(
            a.await.expect("join"),
            404,
            "a's bodies were parsed, then not found"
        );
    }
    latencies.sort();
    println!(
        "b's one-input requests during the attack: {} answered, p50 {:?}, max {:?}",
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1]
    );
    // b's session is still the one it opened.
    let sessions = admin_b
        .list_sessions(modelshare_proto::v1::ListSessionsRequest {})
        .await
        .expect("sessions")
        .into_inner()
        .sessions;
    assert!(
        sessions.iter().any(|s| s.session_id == worker.session_id),
        "b's session was ended: {sessions:?}"
    );
    assert!(
        !server.log().contains("heartbeat"),
        "a session missed its heartbeats:\n{}",
        server.log()
    );
}

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
        &["--http-listen", "127.0.0.1:0", "--no-worker-wait-ms", "300"],
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
            "--http-listen",
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

/// A gRPC request whose message never arrives kept its stream, and so its connection, open
/// for ever (a stream with a request open is never idle). Now a one-message request must
/// arrive within `request_body_timeout_ms`: the call ends with DEADLINE_EXCEEDED, and the
/// workers' long-lived streams are not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_request_whose_message_never_arrives_ends_at_the_body_timeout() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let (_cfg, cfg) = config("[serving]\nrequest_body_timeout_ms = 1000\n");
    let server = crate::common::Server::start_with(
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--unauthenticated-tcp",
            "--config",
            &cfg,
            "--model",
            "enc=enc",
        ],
        |root| tn::models(root, &["enc"]),
    )
    .await;
    let stalled = stalled_model_infer(port, 100).await;
    let status = tokio::time::timeout(Duration::from_secs(10), stalled.status())
        .await
        .expect("answered within 10 s");
    assert_eq!(status, "4", "DEADLINE_EXCEEDED");
    drop(server);
}

/// The same over HTTP/2 (h2c, what one connection of 100 stalled 60 MiB uploads used): a
/// POST without a token that announces 64 MiB and sends none of it is answered 401 at once,
/// and one with a token past the limit 413, each on its own stream of one connection.
#[tokio::test]
async fn over_http2_too_bodies_wait_for_the_token() {
    let (_cfg, cfg) = config("[serving]\nmax_request_bytes = 1048576\n");
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(
        &tenants,
        &["--http-listen", "127.0.0.1:0", "--config", &cfg],
        &[],
    )
    .await;
    let addr = server.metrics_address();
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2c handshake");
    tokio::spawn(connection);
    let mut streams = Vec::new();
    for (token, length) in [(None, 64usize << 20), (Some(TA), 2 << 20)] {
        let mut client = client.clone().ready().await.expect("ready");
        let mut request =
            tonic::codegen::http::Request::post(format!("http://{addr}/v1/embeddings"))
                .header("content-type", "application/json")
                .header("content-length", length.to_string());
        if let Some(t) = token {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        let (response, body) = client
            .send_request(request.body(()).expect("request"), false)
            .expect("send");
        let response = tokio::time::timeout(Duration::from_secs(5), response)
            .await
            .expect("answered before the body")
            .expect("response");
        streams.push((response.status().as_u16(), body));
    }
    assert_eq!(streams[0].0, 401);
    assert_eq!(streams[1].0, 413);
}

/// A `ModelInfer` call on its own HTTP/2 connection whose message declares `declared` bytes
/// and sends none of them, its stream left open.
struct StalledCall {
    response: h2::client::ResponseFuture,
    _body: h2::SendStream<tonic::codegen::Bytes>,
}

async fn stalled_model_infer(port: u16, declared: u32) -> StalledCall {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let request = tonic::codegen::http::Request::post(format!(
        "http://127.0.0.1:{port}/inference.GRPCInferenceService/ModelInfer"
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(())
    .expect("request");
    let (response, mut body) = client.send_request(request, false).expect("send");
    let mut prefix = vec![0u8];
    prefix.extend_from_slice(&declared.to_be_bytes());
    body.send_data(prefix.into(), false).expect("prefix");
    StalledCall {
        response,
        _body: body,
    }
}

impl StalledCall {
    /// The call's `grpc-status` (from the headers, or the trailers).
    async fn status(self) -> String {
        let response = self.response.await.expect("response");
        if let Some(s) = response.headers().get("grpc-status") {
            return s.to_str().unwrap_or("").to_owned();
        }
        let mut recv = response.into_body();
        while let Some(chunk) = recv.data().await {
            drop(chunk);
        }
        recv.trailers()
            .await
            .expect("trailers")
            .and_then(|t| {
                t.get("grpc-status")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            })
            .unwrap_or_default()
    }
}

/// Large gRPC messages were buffered without a server-wide bound. Now a `ModelInfer` message
/// reserves its declared size from the same budget as the REST bodies
/// (`max_body_bytes_in_flight`): while one stalled 1.5 MiB message holds 1.5 of the 2 MiB,
/// a second is refused at once with UNAVAILABLE; once the first ends at its body timeout, a
/// third is taken (and itself ends at the timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_messages_are_within_the_servers_body_budget() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let (_cfg, cfg) = config(
        "[serving]\nmax_request_bytes = 1048576\nmax_body_bytes_in_flight = 2097152\nrequest_body_timeout_ms = 2000\n",
    );
    let server = crate::common::Server::start_with(
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--unauthenticated-tcp",
            "--config",
            &cfg,
        ],
        |_| {},
    )
    .await;
    let size = 1536 << 10;
    let first = stalled_model_infer(port, size).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let second = stalled_model_infer(port, size).await;
    let refused = tokio::time::timeout(Duration::from_millis(1500), second.status())
        .await
        .expect("refused at once");
    assert_eq!(refused, "14", "UNAVAILABLE: the budget is spent");
    let timed_out = tokio::time::timeout(Duration::from_secs(10), first.status())
        .await
        .expect("the first ends");
    assert_eq!(timed_out, "4", "DEADLINE_EXCEEDED at the body timeout");
    let third = stalled_model_infer(port, size).await;
    let status = tokio::time::timeout(Duration::from_secs(10), third.status())
        .await
        .expect("the third ends");
    assert_eq!(
        status, "4",
        "taken, then timed out: the budget was given back"
    );
    drop(server);
}

/// Writes `head` and all of `body`, then reads the status line: as urllib and many simple
/// clients do (nothing is read until the whole body is written). `None`: the write failed.
fn write_all_then_read(addr: &str, head: &str, body: &[u8]) -> Option<u16> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while !got.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
}

/// Answering before the body is read must not cost a client that writes its whole body
/// first its answer (urllib got a broken pipe for a 2 MiB body past a 1 MiB limit; 16 MiB here, past what socket buffers hold): the unread
/// body is drained in the background, discarded, within bounds; then the client reads 413 or
/// 401.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_writes_its_whole_body_first_reads_the_early_answer() {
    let (_cfg, cfg) = config("[serving]\nmax_request_bytes = 1048576\n");
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(
        &tenants,
        &["--http-listen", "127.0.0.1:0", "--config", &cfg],
        &[],
    )
    .await;
    let addr = server.metrics_address();
    let body = vec![b'x'; 16 << 20];
    for (token, want) in [(Some(TA), 413), (None, 401)] {
        let head = post_head("/v1/embeddings", token, body.len());
        let (addr, body) = (addr.clone(), body.clone());
        let status = tokio::task::spawn_blocking(move || write_all_then_read(&addr, &head, &body))
            .await
            .expect("join");
        assert_eq!(status, Some(want), "token {token:?}");
    }
}

/// The same without timings: once tenant a's eight 8 MiB token bodies are all uploaded, b
/// sends one small request. If a's bodies were parsed on the runtime's threads (as before),
/// those threads are busy until a parse ends, and b's answer comes after one of a's 404s; now
/// they are parsed on the request pool and b's small one inline, so b is answered before any
/// of a's answers that were still outstanding when it asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_request_is_answered_while_big_bodies_are_parsed() {
    use std::sync::{Arc, Mutex};
    use std::time::Instant;
    let (_tenants, server, _worker, _admin_b) =
        b_serves_encb(&["--http-listen", "127.0.0.1:0"]).await;
    let addr = server.metrics_address();
    let big = big_token_body();
    let uploaded = Arc::new(tokio::sync::Semaphore::new(0));
    let answers: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let attack: Vec<_> = (0..8)
        .map(|_| {
            let (addr, big) = (addr.clone(), big.clone());
            let (uploaded, answers) = (uploaded.clone(), answers.clone());
            tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(&addr)
                    .await
                    .expect("connect");
                let head = post_head("/v1/embeddings", Some(TA), big.len());
                s.write_all(head.as_bytes()).await.expect("head");
                s.write_all(big.as_bytes()).await.expect("body");
                uploaded.add_permits(1);
                let status = read_status(&mut s, Duration::from_secs(120)).await;
                answers.lock().expect("answers").push(Instant::now());
                status
            })
        })
        .collect();
    let _all = uploaded.acquire_many(8).await.expect("uploaded");
    let asked = Instant::now();
    let one = json!({"model": "encb", "input": "hello"}).to_string();
    let auth_b = format!("Bearer {}", crate::tenants::TB);
    let r = http(
        &addr,
        "POST",
        "/v1/embeddings",
        &[
            ("authorization", &auth_b),
            ("content-type", "application/json"),
        ],
        one.as_bytes(),
    )
    .await;
    let answered = Instant::now();
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let (ahead, outstanding) = {
        let a = answers.lock().expect("answers");
        let ahead = a.iter().filter(|t| **t > asked && **t < answered).count();
        (ahead, 8 - a.iter().filter(|t| **t <= answered).count())
    };
    for a in attack {
        assert_eq!(a.await.expect("join"), Some(404));
    }
    println!(
        "b answered in {:?}; a's answers outstanding then: {outstanding}, answered while b waited: {ahead}",
        answered - asked
    );
    assert!(
        outstanding + ahead > 0,
        "every one of a's bodies was parsed before b asked: nothing was measured"
    );
    assert_eq!(
        ahead, 0,
        "{ahead} of a's big bodies were answered while b's small request waited"
    );
}
