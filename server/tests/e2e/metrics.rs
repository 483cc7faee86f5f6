//! The metrics port: `/metrics`, `/healthz`, `/readyz`, and series that move as they should.

use std::io::{Read, Write};
use std::time::Duration;

use modelshare_proto::v1 as pb;
use safetensors::Dtype;

use crate::common::{self, Server, t};

/// The metrics address the server logged (it listens on port 0).
fn metrics_addr(server: &Server) -> String {
    let log = server.log();
    let at = log
        .find("metrics=Some(")
        .unwrap_or_else(|| panic!("no metrics address in log:\n{log}"));
    let rest = &log[at + "metrics=Some(".len()..];
    rest[..rest.find(')').expect("paren")].to_owned()
}

/// A plain HTTP/1.1 GET: (status, body).
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics port");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .expect("write");
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The value of the series `name` (with its exact label set, as exposed), or 0 when absent.
fn value(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Key series must be exposed and move with loads, attaches and session ends; gRPC requests
/// are counted by method and code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_follow_loads_sessions_and_attaches() {
    let server = Server::start_with(&["--metrics-listen", "127.0.0.1:0"], |root| {
        common::write_safetensors(
            &root.join("m/model.safetensors"),
            &[t("w", Dtype::F32, &[256, 256], 1)],
        );
    })
    .await;
    let addr = metrics_addr(&server);
    assert_eq!(get(&addr, "/healthz").0, 200);
    assert_eq!(get(&addr, "/readyz").0, 200);
    assert_eq!(get(&addr, "/nope").0, 404);

    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "m", "m").await.expect("load");
    let _ = admin
        .describe_model(pb::DescribeModelRequest {
            name: "nope".into(),
            version: 0,
        })
        .await
        .expect_err("unknown model");
    let (status, body) = get(&addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(
        value(&body, r#"modelshare_arena_bytes{device="host",model="m"}"#),
        v.arena_bytes as f64,
        "{body}"
    );
    assert_eq!(
        value(&body, r#"modelshare_model_versions{state="ready"}"#),
        1.0
    );
    assert_eq!(value(&body, r#"modelshare_loads_total{result="ok"}"#), 1.0);
    assert_eq!(
        value(&body, "modelshare_load_bytes_total"),
        (256 * 256 * 4) as f64
    );
    assert_eq!(value(&body, "modelshare_load_duration_seconds_count"), 1.0);
    assert_eq!(
        value(
            &body,
            r#"modelshare_grpc_requests_total{code="NOT_FOUND",method="DescribeModel",service="modelshare.v1.AdminService"}"#
        ),
        1.0,
        "{body}"
    );
    assert_eq!(
        value(
            &body,
            r#"modelshare_grpc_requests_total{code="OK",method="LoadModel",service="modelshare.v1.AdminService"}"#
        ),
        1.0
    );
    assert_eq!(value(&body, "modelshare_sessions"), 0.0);

    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    let model = session.attach("m").await.expect("attach");
    let body = get(&addr, "/metrics").1;
    assert_eq!(value(&body, "modelshare_sessions"), 1.0);
    assert_eq!(value(&body, "modelshare_leases"), 1.0);
    assert_eq!(
        value(&body, r#"modelshare_attaches_total{result="ok"}"#),
        1.0
    );
    assert_eq!(
        value(&body, "modelshare_attach_duration_seconds_count"),
        1.0
    );
    model.release().await.expect("release");
    drop(session);
    common::eventually(Duration::from_secs(3), "sessions back to 0", || {
        let addr = addr.clone();
        async move {
            let body = get(&addr, "/metrics").1;
            value(&body, "modelshare_sessions") == 0.0
                && value(&body, "modelshare_leases") == 0.0
                && value(&body, r#"modelshare_sessions_ended_total{reason="closed"}"#)
                    + value(
                        &body,
                        r#"modelshare_sessions_ended_total{reason="stream_error"}"#,
                    )
                    + value(
                        &body,
                        r#"modelshare_sessions_ended_total{reason="peer_exited"}"#,
                    )
                    == 1.0
        }
    })
    .await;
}
