//! What authentication costs an attach: Attach + Release round trips over the Unix socket
//! against an in-process server (host backend), without tenants (the anchor), and with a
//! tenants file of 1 and of 1000 tenants (every token hash is compared on every call).
//!
//! `cargo run --release -p modelshare-server --example auth_overhead [-- ROUNDS]`

use std::path::PathBuf;
use std::time::{Duration, Instant};

use modelshare_core::tenants::token::TokenHash;
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use modelshare_server::config::{BackendChoice, Config, ServeArgs};
use modelshare_server::daemon;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const TOKEN: &str = "ms_bench_tenant_token";

#[derive(Clone)]
struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut r: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            r.metadata_mut().insert("authorization", v.clone());
        }
        Ok(r)
    }
}

/// A one-tensor model (1 MiB) in safetensors format.
fn write_model(dir: &std::path::Path) {
    let n = 1 << 20;
    let header = format!(r#"{{"w":{{"dtype":"U8","shape":[{n}],"data_offsets":[0,{n}]}}}}"#);
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(std::iter::repeat_n(7u8, n));
    std::fs::create_dir_all(dir.join("m")).expect("mkdir");
    std::fs::write(dir.join("m/model.safetensors"), bytes).expect("write model");
}

/// `tenants` tenants; the bench's token belongs to the last one (the worst case for a scan).
fn tenants_file(dir: &std::path::Path, tenants: usize) -> std::path::PathBuf {
    let mut text = String::new();
    for i in 0..tenants {
        let token = if i + 1 == tenants {
            TOKEN.to_owned()
        } else {
            format!("ms_other_{i}")
        };
        text.push_str(&format!(
            "[[tenants]]\nname = \"t{i}\"\ntoken_hashes = [\"{}\"]\n",
            TokenHash::of(&token)
        ));
    }
    let path = dir.join(format!("tenants-{tenants}.toml"));
    std::fs::write(&path, text).expect("write tenants");
    path
}

/// A worker client carrying the bench's bearer token (or none).
type Worker = WorkerServiceClient<InterceptedService<Channel, Bearer>>;

/// An in-process server on a Unix socket in a temporary directory.
struct Server {
    /// The directory of the model, the tenants file and the sockets; removed when dropped.
    _dir: tempfile::TempDir,
    /// The gRPC socket.
    socket: PathBuf,
    /// Stops the server.
    stop: tokio::sync::oneshot::Sender<()>,
    /// The server, until it stops.
    task: tokio::task::JoinHandle<Result<(), daemon::ServeError>>,
}

/// Starts a server (host backend) over a directory holding the model, with a tenants file of
/// `tenants` tenants (none: no tenants), and waits until it is ready.
async fn start_server(tenants: Option<usize>) -> Server {
    let dir = tempfile::tempdir().expect("tmp");
    write_model(dir.path());
    let socket = dir.path().join("grpc.sock");
    let config = Config::from_args(ServeArgs {
        unix_socket: Some(socket.clone()),
        handle_socket: Some(dir.path().join("handles.sock")),
        model_root: Some(dir.path().to_owned()),
        backend: Some(BackendChoice::Host),
        tenants_file: tenants.map(|n| tenants_file(dir.path(), n)),
        ..ServeArgs::default()
    })
    .expect("config");
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(daemon::run_notify(
        config,
        async move {
            let _ = stop_rx.await;
        },
        Some(ready_tx),
    ));
    ready_rx.await.expect("server ready");
    Server {
        _dir: dir,
        socket,
        stop: stop_tx,
        task,
    }
}

/// Loads the model `m`, waiting for the load's stream to end.
async fn load_model(ch: Channel, auth: Bearer) {
    let mut admin = AdminServiceClient::with_interceptor(ch, auth);
    let mut load = admin
        .load_model(pb::LoadModelRequest {
            name: "m".into(),
            path: "m".into(),
            ..Default::default()
        })
        .await
        .expect("load")
        .into_inner();
    while load.message().await.expect("progress").is_some() {}
}

/// Opens a worker session: its id, its events (open while the session is), and the task that
/// heartbeats it.
async fn open_session(
    worker: &mut Worker,
) -> (
    String,
    tonic::Streaming<pb::SessionEvent>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SessionRequest {
        kind: Some(pb::session_request::Kind::Hello(pb::Hello {
            worker_name: "bench".into(),
            pid: std::process::id(),
            ..Default::default()
        })),
    })
    .await
    .expect("hello");
    let mut events = worker
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .expect("session")
        .into_inner();
    let session_id = match events
        .message()
        .await
        .expect("welcome")
        .and_then(|e| e.kind)
    {
        Some(pb::session_event::Kind::Welcome(w)) => w.session_id,
        other => panic!("expected a welcome, got {other:?}"),
    };
    let beat = tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let hb = pb::SessionRequest {
                kind: Some(pb::session_request::Kind::Heartbeat(pb::Heartbeat {})),
            };
            if tx.send(hb).await.is_err() {
                return;
            }
        }
    });
    (session_id, events, beat)
}

/// The times of `rounds` Attach + Release pairs, in microseconds, after a tenth as many to
/// warm up.
async fn attach_release_rounds(worker: &mut Worker, session_id: &str, rounds: usize) -> Vec<f64> {
    let mut samples = Vec::with_capacity(rounds);
    for i in 0..rounds + rounds / 10 {
        let t = Instant::now();
        let lease = worker
            .attach(pb::AttachRequest {
                device_uuid: String::new(),
                session_id: session_id.to_owned(),
                model: "m".into(),
                version: 0,
            })
            .await
            .expect("attach")
            .into_inner()
            .lease_id;
        worker
            .release(pb::ReleaseRequest {
                session_id: session_id.to_owned(),
                lease_id: lease,
            })
            .await
            .expect("release");
        // The first tenth warms up.
        if i >= rounds / 10 {
            samples.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    samples
}

/// Median and 99th percentile of `rounds` Attach + Release pairs, in microseconds.
async fn run(tenants: Option<usize>, rounds: usize) -> (f64, f64) {
    let server = start_server(tenants).await;
    let address = format!("unix:{}", server.socket.display());
    let ch = modelshare_worker::connect::channel(&address)
        .await
        .expect("connect");
    let auth = Bearer(tenants.map(|_| format!("Bearer {TOKEN}").parse().expect("ascii")));
    load_model(ch.clone(), auth.clone()).await;
    let mut worker = WorkerServiceClient::with_interceptor(ch, auth);
    let (session_id, events, beat) = open_session(&mut worker).await;
    let mut samples = attach_release_rounds(&mut worker, &session_id, rounds).await;
    beat.abort();
    drop(events);
    let _ = server.stop.send(());
    let _ = server.task.await;
    samples.sort_by(f64::total_cmp);
    let pct = |p: f64| samples[((samples.len() - 1) as f64 * p) as usize];
    (pct(0.5), pct(0.99))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let rounds: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    println!("Attach + Release round trip, Unix socket, host backend, {rounds} rounds each");
    println!("| setup | p50 µs | p99 µs | p50 vs anchor |");
    println!("| --- | ---: | ---: | ---: |");
    let (anchor, anchor99) = run(None, rounds).await;
    println!("| no tenants (anchor) | {anchor:.0} | {anchor99:.0} | 1.00 |");
    for n in [1, 1000] {
        let (p50, p99) = run(Some(n), rounds).await;
        println!(
            "| tenants file, {n} tenant(s) | {p50:.0} | {p99:.0} | {:.2} |",
            p50 / anchor
        );
    }
}
