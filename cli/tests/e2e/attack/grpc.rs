//! gRPC (HTTP/2) bodies: messages that never arrive, bodies that wait for the token, and
//! messages within the body budget.

use std::time::Duration;

use super::config;
use crate::tenants::{self as tn, TA, TenantsFile, abc_tenants};

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
    let addr = server.http_address();
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
