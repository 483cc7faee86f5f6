//! The metrics port: `/metrics`, `/healthz`, `/readyz`, and series that move as they should.

use std::io::Write;
use std::time::Duration;

use modelshare_proto::v1 as pb;
use safetensors::Dtype;

use crate::common::{self, Server, http_get, t};

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
    let addr = server.metrics_address();
    assert_eq!(http_get(&addr, "/healthz").0, 200);
    assert_eq!(http_get(&addr, "/readyz").0, 200);
    assert_eq!(http_get(&addr, "/nope").0, 404);

    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "m", "m").await.expect("load");
    let _ = admin
        .describe_model(pb::DescribeModelRequest {
            name: "nope".into(),
            version: 0,
        })
        .await
        .expect_err("unknown model");
    assert_series_after_a_load_and_a_refusal(&addr, v.arena_bytes);

    // A real worker process attaches and holds its lease.
    let mut worker = common::Worker::start(&server, "m", "metrics-worker");
    assert_eq!(worker.report["verified"], true, "{}", worker.report);
    assert_series_of_a_held_lease(&addr);
    // The worker leaves (SIGTERM: it releases and closes its session).
    worker.signal("TERM");
    worker.wait();
    assert_series_after_the_worker_left(&addr).await;
}

/// After a load of `m` (`arena_bytes` in its arena) and a DescribeModel refused NOT_FOUND:
/// the model, load and request series, and no session.
fn assert_series_after_a_load_and_a_refusal(addr: &str, arena_bytes: u64) {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(
        value(&body, r#"modelshare_arena_bytes{device="host",model="m"}"#),
        arena_bytes as f64,
        "{body}"
    );
    assert_eq!(
        value(&body, r#"modelshare_model_versions{state="ready"}"#),
        1.0
    );
    assert_eq!(value(&body, "modelshare_models"), 1.0);
    assert_eq!(
        value(
            &body,
            r#"modelshare_grpc_request_duration_seconds_count{code="NOT_FOUND",method="DescribeModel",service="modelshare.v1.AdminService"}"#
        ),
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
    assert_eq!(value(&body, r#"modelshare_sessions{tenant="admin"}"#), 0.0);
}

/// While a worker holds its lease: a session, a lease, an attach counted and timed.
fn assert_series_of_a_held_lease(addr: &str) {
    let body = http_get(addr, "/metrics").1;
    assert_eq!(value(&body, r#"modelshare_sessions{tenant="admin"}"#), 1.0);
    assert_eq!(value(&body, r#"modelshare_leases{tenant="admin"}"#), 1.0);
    assert_eq!(
        value(&body, r#"modelshare_attaches_total{result="ok"}"#),
        1.0
    );
    assert_eq!(
        value(&body, "modelshare_attach_duration_seconds_count"),
        1.0
    );
}

/// Once the worker has left: no session or lease (within 3 s), its release counted, and one
/// session ended.
async fn assert_series_after_the_worker_left(addr: &str) {
    common::eventually(
        Duration::from_secs(3),
        "sessions and leases back to 0",
        || {
            let addr = addr.to_owned();
            async move {
                let body = http_get(&addr, "/metrics").1;
                value(&body, r#"modelshare_sessions{tenant="admin"}"#) == 0.0
                    && value(&body, r#"modelshare_leases{tenant="admin"}"#) == 0.0
            }
        },
    )
    .await;
    let body = http_get(addr, "/metrics").1;
    assert_eq!(
        value(
            &body,
            r#"modelshare_grpc_requests_total{code="OK",method="Release",service="modelshare.v1.WorkerService"}"#
        ),
        1.0,
        "the worker released its lease: {body}"
    );
    let ended: f64 = ["closed", "stream_error", "peer_exited"]
        .iter()
        .map(|r| {
            value(
                &body,
                &format!(r#"modelshare_sessions_ended_total{{reason="{r}"}}"#),
            )
        })
        .sum();
    assert_eq!(ended, 1.0, "{body}");
}

/// The device memory gauges must carry the device's UUID, like the arena bytes: on the host
/// backend `host`, with MemTotal and the arena bytes held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_memory_is_labelled_by_device() {
    let server = Server::start_with(&["--metrics-listen", "127.0.0.1:0"], |root| {
        common::write_safetensors(
            &root.join("m/model.safetensors"),
            &[t("w", Dtype::F32, &[64, 64], 1)],
        );
    })
    .await;
    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "m", "m").await.expect("load");
    let body = http_get(&server.metrics_address(), "/metrics").1;
    assert_eq!(
        value(
            &body,
            r#"modelshare_device_memory_used_bytes{device="host"}"#
        ),
        v.arena_bytes as f64,
        "{body}"
    );
    assert!(
        value(
            &body,
            r#"modelshare_device_memory_total_bytes{device="host"}"#
        ) > 0.0,
        "{body}"
    );
}

/// `deploy/` at the repository root.
fn deploy_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Runs a tool, failing the test with a clear message when it is not installed.
fn tool(name: &str) -> std::process::Command {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is not installed: `apt-get install prometheus` (scripts/test does it)"
    );
    std::process::Command::new(name)
}

/// The exposition must pass the real `promtool check metrics` (names, units, types, help).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exposition_passes_promtool() {
    let server = Server::start_with(&["--metrics-listen", "127.0.0.1:0"], |root| {
        common::write_safetensors(
            &root.join("m/model.safetensors"),
            &[t("w", Dtype::F32, &[64], 1)],
        );
    })
    .await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    let _model = session.attach("m").await.expect("attach");
    let body = http_get(&server.metrics_address(), "/metrics").1;
    let mut child = tool("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(body.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}\n{body}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The shipped alert rules must be valid and their unit tests pass (`promtool test rules`).
#[test]
fn shipped_alert_rules_pass_promtool() {
    let dir = deploy_dir().join("prometheus");
    for args in [
        &["check", "rules", "alerts.yml"][..],
        &["test", "rules", "alerts_test.yml"],
        &["check", "config", "prometheus.yml"],
    ] {
        let out = tool("promtool")
            .args(args)
            .current_dir(&dir)
            .output()
            .expect("promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A real Prometheus with the shipped scrape config must scrape the server, and a series must
/// come back through its HTTP query API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_prometheus_scrapes_the_server() {
    let server = Server::start_with(&["--metrics-listen", "127.0.0.1:0"], |_| {}).await;
    let target = server.metrics_address();
    let _session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");

    // The shipped config, pointed at this server and scraping every second.
    let shipped =
        std::fs::read_to_string(deploy_dir().join("prometheus/prometheus.yml")).expect("config");
    assert!(shipped.contains("modelshare:9401") && shipped.contains("scrape_interval: 15s"));
    let config = shipped
        .replace("modelshare:9401", &target)
        .replace("scrape_interval: 15s", "scrape_interval: 1s");
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("prometheus.yml"), config).expect("write config");
    std::fs::copy(
        deploy_dir().join("prometheus/alerts.yml"),
        dir.path().join("alerts.yml"),
    )
    .expect("rules");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let mut prom = tool("prometheus")
        .arg(format!(
            "--config.file={}",
            dir.path().join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.path().join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("prometheus.log")).expect("log"))
        .spawn()
        .expect("prometheus");
    let api = format!("127.0.0.1:{port}");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    let found = loop {
        if std::net::TcpStream::connect(&api).is_ok() {
            let (status, body) = http_get(&api, "/api/v1/query?query=modelshare_sessions");
            last = body.clone();
            if status == 200 && body.contains(r#""__name__":"modelshare_sessions""#) {
                break body;
            }
        }
        if std::time::Instant::now() > deadline {
            let _ = prom.kill();
            panic!(
                "no modelshare_sessions from Prometheus in 30 s; last answer: {last}\nlog: {}",
                std::fs::read_to_string(dir.path().join("prometheus.log")).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = prom.kill();
    let _ = prom.wait();
    // One session is open: the value is the string "1" in the vector result.
    assert!(found.contains(r#","1"]"#), "{found}");
}

/// The inference port would serve `/metrics` or name models in `/readyz` (every tenant's
/// names, to anyone who reaches it), or the operators' port would lose them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operators_endpoints_have_their_own_port() {
    let server = Server::start_with(
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--model",
            "secret-model=m",
        ],
        |root| {
            common::write_safetensors(
                &root.join("m/model.safetensors"),
                &[t("w", Dtype::F32, &[16, 16], 1)],
            );
        },
    )
    .await;
    let (operators, inference) = (server.metrics_address(), server.http_address());
    assert_ne!(operators, inference);
    let (status, body) = http_get(&operators, "/metrics");
    assert!(
        status == 200 && body.contains("modelshare_models"),
        "{status}"
    );
    let (status, body) = http_get(&operators, "/readyz");
    assert!(status == 200 && body.contains("secret-model"), "{body}");

    assert_eq!(http_get(&inference, "/metrics").0, 404);
    assert_eq!(http_get(&inference, "/healthz").0, 200);
    let (status, body) = http_get(&inference, "/readyz");
    assert_eq!((status, body.as_str()), (200, "ready\n"));
    // The doors are there and the operators' port has none of them.
    assert_eq!(http_get(&inference, "/v2/health/live").0, 200);
    assert_eq!(http_get(&operators, "/v2/health/live").0, 404);
}
