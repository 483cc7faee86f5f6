//! Connection caps and timeouts, against hostile clients on real sockets: silent connections,
//! half a handshake, unfinished HTTP headers, an idle HTTP/2 client that answers PINGs, and a
//! flood of idle clients on a server with few descriptors.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;

use crate::common::{self, Server};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port()
}

/// Connects to `port`, sends `bytes`, and returns how long until the server closed the
/// connection (`None`: still open after `within`).
fn closed_after(port: u16, bytes: &[u8], within: Duration) -> Option<Duration> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.write_all(bytes).expect("write");
    let start = Instant::now();
    s.set_read_timeout(Some(within)).expect("timeout");
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Some(start.elapsed()),
            Ok(_) => {} // a SETTINGS frame, an error page: read on
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return Some(start.elapsed());
            }
            Err(_) => return None,
        }
        if start.elapsed() > within {
            return None;
        }
    }
}

fn metric(http: &str, line_start: &str) -> f64 {
    let (_, body) = common::http_get(http, "/metrics");
    body.lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// Silent connections, half an HTTP/2 preface and unfinished HTTP/1.1 headers are closed after
/// the handshake timeout; an HTTP/2 client that made a call and then only answers PINGs is
/// closed once idle (and reconnects on its next call); a worker's open session stream keeps
/// its connection past the idle timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_half_open_and_idle_connections_are_closed() {
    let (grpc, http) = (free_port(), free_port());
    let cfg_dir = tempfile::tempdir().expect("tempdir");
    let cfg = cfg_dir.path().join("modelshare.toml");
    std::fs::write(
        &cfg,
        "[limits]\nconnection_handshake_timeout_ms = 500\nconnection_idle_timeout_ms = 1000\n",
    )
    .expect("config");
    let server = Server::start_with(
        &[
            "--listen",
            &format!("127.0.0.1:{grpc}"),
            "--unauthenticated-tcp",
            "--metrics-listen",
            &format!("127.0.0.1:{http}"),
            "--config",
            cfg.to_str().expect("utf8"),
        ],
        |_| {},
    )
    .await;
    let http_addr = format!("127.0.0.1:{http}");
    let tcp = format!("http://127.0.0.1:{grpc}");
    let session = common::raw_session(&tcp, pb::Hello::default()).await;
    // The worker's heartbeats travel on its session stream, as the SDK sends them.
    let heartbeat = session.heartbeats();

    let within = Duration::from_secs(5);
    for (what, port, bytes) in [
        ("a silent gRPC connection", grpc, &b""[..]),
        (
            "half an HTTP/2 preface",
            grpc,
            &b"PRI * HTTP/2.0\r\n\r\nSM"[..],
        ),
        (
            "unfinished HTTP/1.1 headers",
            http,
            &b"GET /metrics HTTP/1.1\r\nHost: x\r\n"[..],
        ),
        ("a silent HTTP connection", http, &b""[..]),
    ] {
        let took = closed_after(port, bytes, within)
            .unwrap_or_else(|| panic!("{what} still open after {within:?}"));
        assert!(
            took >= Duration::from_millis(300),
            "{what} closed too early: {took:?}"
        );
    }

    // A client that called once and then idles (its HTTP/2 stack answers the server's PINGs).
    let channel = modelshare_worker::connect::channel(&tcp)
        .await
        .expect("channel");
    let mut admin = pb::admin_service_client::AdminServiceClient::new(channel);
    admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("call");
    let idle = "modelshare_connections_closed_total{listener=\"grpc_tcp\",reason=\"idle_timeout\"}";
    let before = metric(&http_addr, idle);
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert!(
        metric(&http_addr, idle) > before,
        "the idle client was not closed"
    );
    admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("the client reconnects on its next call");

    // The session stream opened before all that is still open.
    let mut admin = server.admin().await;
    let stats = common::stats(&mut admin).await;
    assert_eq!(
        stats.sessions, 1,
        "the worker's session lost its connection"
    );
    heartbeat.abort();
    drop(session);
    let handshake =
        "modelshare_connections_closed_total{listener=\"metrics\",reason=\"handshake_timeout\"}";
    assert!(metric(&http_addr, handshake) >= 2.0);
}

/// A server with 512 descriptors and 600 idle clients on its Unix socket: the connections past
/// its cap are closed at once (its descriptors are not exhausted), the admitted ones when their
/// handshake time is up, and the admin is served again while the clients still hold their
/// sockets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_cannot_starve_the_admin_socket() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = dir.path().join("modelshare.toml");
    std::fs::write(&cfg, "[limits]\nconnection_handshake_timeout_ms = 1000\n").expect("config");
    let socket = dir.path().join("g.sock");
    let mut server = std::process::Command::new("prlimit")
        .arg("--nofile=512:512")
        .arg(common::BIN)
        .args(["serve", "--backend", "host", "--model-root"])
        .arg(dir.path())
        .arg("--unix-socket")
        .arg(&socket)
        .arg("--handle-socket")
        .arg(dir.path().join("h.sock"))
        .arg("--config")
        .arg(&cfg)
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(common::KillOnDrop)
        .expect("prlimit and the server");
    let address = format!("unix:{}", socket.display());
    let mut up = false;
    for _ in 0..200 {
        if modelshare_worker::connect::channel(&address).await.is_ok() {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(up, "the server did not start");
    let mut idle = Vec::new();
    for _ in 0..600 {
        idle.push(std::os::unix::net::UnixStream::connect(&socket).expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fds = common::open_fds(server.id());
    assert!(
        fds < 400,
        "the server holds {fds} descriptors for idle clients"
    );
    // Served again within the handshake time, the 600 sockets still open on this side.
    let start = Instant::now();
    let mut served = false;
    while start.elapsed() < Duration::from_secs(6) {
        if let Ok(ch) = modelshare_worker::connect::channel(&address).await {
            let mut admin = pb::admin_service_client::AdminServiceClient::new(ch);
            if admin.list_models(pb::ListModelsRequest {}).await.is_ok() {
                served = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = server.kill();
    let _ = server.wait();
    drop(idle);
    assert!(
        served,
        "the admin was not served with idle clients connected"
    );
}
