//! Load benchmark of the request path (not a test): requests/s and p50/p99 latency at several
//! concurrencies through modelshare (KServe v2 `ModelInfer` over gRPC → queue → an echo worker
//! process over `Serve` → back), beside a bare tonic unary server answering the same
//! `ModelInfer` at once, measured in the same run on the same machine.
//!
//! ```text
//! cargo run --release --example request_bench -- \
//!     --server-bin target/release/modelshare --worker-bin target/release/modelshare-echo-worker
//! ```
//! Prints a Markdown table (for BENCHMARKS.md). Every request carries one FP32 tensor of shape
//! [1, 16] in `raw_input_contents`; the echo worker returns it (and its sum with the weights).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use modelshare_proto::inference::grpc_inference_service_server::{
    GrpcInferenceService, GrpcInferenceServiceServer,
};
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// Requests in flight per connection (the server serves 256 at once on one).
const PER_CONNECTION: usize = 128;

#[derive(Debug)]
struct Args {
    server_bin: PathBuf,
    worker_bin: PathBuf,
    concurrency: Vec<usize>,
    seconds: f64,
    workers: usize,
}

fn args() -> Args {
    let mut a = Args {
        server_bin: PathBuf::from("target/release/modelshare"),
        worker_bin: PathBuf::from("target/release/modelshare-echo-worker"),
        concurrency: vec![1, 64, 1024],
        seconds: 5.0,
        workers: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().unwrap_or_default();
        match flag.as_str() {
            "--server-bin" => a.server_bin = value.into(),
            "--worker-bin" => a.worker_bin = value.into(),
            "--seconds" => a.seconds = value.parse().expect("--seconds"),
            "--workers" => a.workers = value.parse().expect("--workers"),
            "--concurrency" => {
                a.concurrency = value
                    .split(',')
                    .map(|c| c.parse().expect("--concurrency"))
                    .collect()
            }
            other => panic!("unknown flag {other}"),
        }
    }
    a
}

/// The bare server: answers ModelInfer with its input, at once.
#[derive(Debug, Default)]
struct Bare;

#[tonic::async_trait]
impl GrpcInferenceService for Bare {
    async fn server_live(
        &self,
        _: Request<oip::ServerLiveRequest>,
    ) -> Result<Response<oip::ServerLiveResponse>, Status> {
        Ok(Response::new(oip::ServerLiveResponse { live: true }))
    }
    async fn server_ready(
        &self,
        _: Request<oip::ServerReadyRequest>,
    ) -> Result<Response<oip::ServerReadyResponse>, Status> {
        Ok(Response::new(oip::ServerReadyResponse { ready: true }))
    }
    async fn model_ready(
        &self,
        _: Request<oip::ModelReadyRequest>,
    ) -> Result<Response<oip::ModelReadyResponse>, Status> {
        Ok(Response::new(oip::ModelReadyResponse { ready: true }))
    }
    async fn server_metadata(
        &self,
        _: Request<oip::ServerMetadataRequest>,
    ) -> Result<Response<oip::ServerMetadataResponse>, Status> {
        Ok(Response::new(oip::ServerMetadataResponse::default()))
    }
    async fn model_metadata(
        &self,
        _: Request<oip::ModelMetadataRequest>,
    ) -> Result<Response<oip::ModelMetadataResponse>, Status> {
        Ok(Response::new(oip::ModelMetadataResponse::default()))
    }
    async fn model_config(
        &self,
        _: Request<oip::ModelConfigRequest>,
    ) -> Result<Response<oip::ModelConfigResponse>, Status> {
        Ok(Response::new(oip::ModelConfigResponse::default()))
    }
    async fn model_statistics(
        &self,
        _: Request<oip::ModelStatisticsRequest>,
    ) -> Result<Response<oip::ModelStatisticsResponse>, Status> {
        Ok(Response::new(oip::ModelStatisticsResponse::default()))
    }
    async fn repository_index(
        &self,
        _: Request<oip::RepositoryIndexRequest>,
    ) -> Result<Response<oip::RepositoryIndexResponse>, Status> {
        Ok(Response::new(oip::RepositoryIndexResponse::default()))
    }
    type ModelStreamInferStream = std::pin::Pin<
        Box<
            dyn tonic::codegen::tokio_stream::Stream<
                    Item = Result<oip::ModelStreamInferResponse, Status>,
                > + Send,
        >,
    >;

    async fn model_stream_infer(
        &self,
        _: Request<tonic::Streaming<oip::ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        Err(Status::unimplemented(
            "the bare server answers ModelInfer only",
        ))
    }

    async fn model_infer(
        &self,
        request: Request<oip::ModelInferRequest>,
    ) -> Result<Response<oip::ModelInferResponse>, Status> {
        let r = request.into_inner();
        let outputs = r
            .inputs
            .iter()
            .map(|i| oip::model_infer_response::InferOutputTensor {
                name: "echo".into(),
                datatype: i.datatype.clone(),
                shape: i.shape.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(oip::ModelInferResponse {
            model_name: r.model_name,
            model_version: "1".into(),
            id: r.id,
            outputs,
            raw_output_contents: r.raw_input_contents,
            ..Default::default()
        }))
    }
}

fn request() -> oip::ModelInferRequest {
    let values: Vec<u8> = (0..16).flat_map(|i| (i as f32).to_le_bytes()).collect();
    oip::ModelInferRequest {
        model_name: "echo".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "x".into(),
            datatype: "FP32".into(),
            shape: vec![1, 16],
            ..Default::default()
        }],
        raw_input_contents: vec![values.into()],
        ..Default::default()
    }
}

/// Runs `concurrency` callers for `seconds` (after a 1 s warm-up); returns (requests/s, p50,
/// p99, errors).
async fn load(
    endpoint: &str,
    concurrency: usize,
    seconds: f64,
) -> (f64, Duration, Duration, usize) {
    let connections = concurrency.div_ceil(PER_CONNECTION).max(1);
    let mut channels: Vec<Channel> = Vec::new();
    for _ in 0..connections {
        channels.push(
            Endpoint::from_shared(endpoint.to_owned())
                .expect("endpoint")
                .connect()
                .await
                .expect("connect"),
        );
    }
    let start = Instant::now();
    let warm = start + Duration::from_secs(1);
    let end = warm + Duration::from_secs_f64(seconds);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..concurrency {
        let mut client = GrpcInferenceServiceClient::new(channels[i % connections].clone());
        tasks.spawn(async move {
            let mut latencies = Vec::new();
            let mut errors = 0;
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                let ok = client.model_infer(request()).await.is_ok();
                if t >= warm {
                    if ok {
                        latencies.push(t.elapsed());
                    } else {
                        errors += 1;
                    }
                }
            }
            (latencies, errors)
        });
    }
    let mut all = Vec::new();
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        let (l, e) = r.expect("task");
        all.extend(l);
        errors += e;
    }
    all.sort();
    let q = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    (all.len() as f64 / seconds, q(0.5), q(0.99), errors)
}

/// A child process, killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes a small model (one F32 tensor of 16 values) under `root/echo`.
fn write_model(root: &std::path::Path) {
    let dir = root.join("echo");
    std::fs::create_dir_all(&dir).expect("mkdir");
    let data: Vec<u8> = (0..16)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let header = r#"{"w":{"dtype":"F32","shape":[16],"data_offsets":[0,64]}}"#;
    let mut header = header.as_bytes().to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut file = (header.len() as u64).to_le_bytes().to_vec();
    file.extend(header);
    file.extend(data);
    std::fs::write(dir.join("model.safetensors"), file).expect("write model");
}

/// Starts modelshare with the echo model and `workers` echo workers; returns the gRPC TCP
/// endpoint once a worker serves.
async fn start_modelshare(
    args: &Args,
    dir: &std::path::Path,
    port: u16,
    delay_us: u64,
) -> (String, Vec<Proc>) {
    let root = dir.join("models");
    write_model(&root);
    let socket = dir.join(format!("grpc-{port}.sock"));
    let server = Command::new(&args.server_bin)
        .args(["serve", "--backend", "host", "--model", "echo=echo"])
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--unauthenticated-tcp")
        .arg("--unix-socket")
        .arg(&socket)
        .arg("--handle-socket")
        .arg(dir.join(format!("handles-{port}.sock")))
        .arg("--model-root")
        .arg(&root)
        .arg("--max-queue-delay-us")
        .arg(delay_us.to_string())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start modelshare");
    let mut procs = vec![Proc(server)];
    let endpoint = format!("http://127.0.0.1:{port}");
    for _ in 0..100 {
        if socket.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for _ in 0..args.workers {
        let worker = Command::new(&args.worker_bin)
            .arg("--server")
            .arg(format!("unix:{}", socket.display()))
            .args([
                "--model",
                "echo",
                "--credits",
                "4",
                "--max-batch-items",
                "64",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start echo worker");
        procs.push(Proc(worker));
    }
    // Ready when a request is answered.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(ch) = Endpoint::from_shared(endpoint.clone())
            .expect("endpoint")
            .connect()
            .await
        {
            let mut c = GrpcInferenceServiceClient::new(ch);
            if c.model_infer(request()).await.is_ok() {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "modelshare with an echo worker never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (endpoint, procs)
}

#[tokio::main]
async fn main() {
    let args = args();
    let dir = tempfile::tempdir().expect("tmp");
    // The bare server, in process.
    let bare_listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let bare_addr: SocketAddr = bare_listener.local_addr().expect("addr");
    tokio::spawn(
        Server::builder()
            .add_service(GrpcInferenceServiceServer::new(Bare))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(
                bare_listener,
            )),
    );
    let bare = format!("http://{bare_addr}");
    let port = |n: u16| 40000 + (std::process::id() % 10000) as u16 + n;
    let (fast, _procs0) = start_modelshare(&args, dir.path(), port(1), 0).await;
    let (default, _procs1) = start_modelshare(&args, dir.path(), port(2), 1000).await;
    let targets: Vec<(&str, String)> = vec![
        ("bare tonic unary echo (same ModelInfer messages)", bare),
        ("modelshare → echo worker, max_queue_delay 0", fast),
        (
            "modelshare → echo worker, max_queue_delay 1 ms (default)",
            default,
        ),
    ];
    let cores = std::thread::available_parallelism().map_or(0, usize::from);
    println!(
        "{} echo worker(s) of 4 credits and 64 items each; {} s per row after 1 s warm-up; {cores} cores\n",
        args.workers, args.seconds
    );
    println!("| server | concurrency | requests/s | p50 | p99 | errors |");
    println!("|---|---:|---:|---:|---:|---:|");
    for c in &args.concurrency {
        for (name, endpoint) in &targets {
            let (rps, p50, p99, errors) = load(endpoint, *c, args.seconds).await;
            println!(
                "| {name} | {c} | {rps:.0} | {:.3} ms | {:.3} ms | {errors} |",
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3
            );
        }
    }
}
