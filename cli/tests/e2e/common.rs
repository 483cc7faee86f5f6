//! Test harness: starting the real server, writing models, talking to it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use safetensors::Dtype;
use safetensors::tensor::TensorView;
use serde_json::Value;
use tonic::transport::Channel;

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_modelshare");

/// A running `modelshare serve` in its own temporary directory.
pub struct Server {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    /// Model repository root (`<dir>/models`).
    pub root: PathBuf,
    /// gRPC Unix socket.
    pub socket: PathBuf,
    /// Handle socket.
    pub handles: PathBuf,
    /// `unix:<socket>`, for clients.
    pub address: String,
    extra: Vec<String>,
}

impl Server {
    /// A server with no start-up models.
    pub async fn start() -> Server {
        Self::start_with(&[], |_| {}).await
    }

    /// A server with extra flags, started but not waited for (its start-up models may still be
    /// loading); `setup` may write models under the root before it starts.
    pub fn spawn_with(extra: &[&str], setup: impl FnOnce(&Path)) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("models");
        std::fs::create_dir_all(&root).expect("mkdir models");
        setup(&root);
        let socket = dir.path().join("grpc.sock");
        let handles = dir.path().join("handles.sock");
        let mut s = Server {
            child: None,
            address: format!("unix:{}", socket.display()),
            root,
            socket,
            handles,
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        s.spawn();
        s
    }

    /// A server with extra flags; `setup` may write models under the root before it starts.
    pub async fn start_with(extra: &[&str], setup: impl FnOnce(&Path)) -> Server {
        let mut s = Self::spawn_with(extra, setup);
        s.wait_ready().await;
        s
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Replaces the extra flags the next [`Server::spawn`] passes.
    pub fn set_extra(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
    }

    /// Starts the process (again, after a stop).
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        // Host memory unless the test picks a backend.
        let backend: &[&str] = if self.extra.iter().any(|a| a == "--backend") {
            &[]
        } else {
            &["--backend", "host"]
        };
        let child = Command::new(BIN)
            .arg("serve")
            .args(backend)
            .arg("--unix-socket")
            .arg(&self.socket)
            .arg("--handle-socket")
            .arg(&self.handles)
            .arg("--model-root")
            .arg(&self.root)
            .args(&self.extra)
            .env(
                "RUST_LOG",
                "info,modelshare_server=debug,modelshare_core=debug,modelshare_serving=debug",
            )
            .env_remove("MODELSHARE_LISTEN")
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .spawn()
            .expect("spawn modelshare serve");
        self.child = Some(child);
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Waits until gRPC health says SERVING (20 s at most).
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!("server exited early with {status}; log:\n{}", self.log());
            }
            if let Ok(ch) = modelshare_worker::connect::channel(&self.address).await {
                let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
                let reply = health
                    .check(tonic_health::pb::HealthCheckRequest {
                        service: String::new(),
                    })
                    .await;
                let serving =
                    tonic_health::pb::health_check_response::ServingStatus::Serving as i32;
                if reply.is_ok_and(|r| r.into_inner().status == serving) {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "server not ready in 20 s; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The TCP address the server logged it listens on.
    pub fn tcp_address(&self) -> String {
        self.log()
            .lines()
            .find_map(|l| {
                l.split("tcp=Some(")
                    .nth(1)
                    .and_then(|r| r.split(')').next())
                    .map(str::to_owned)
            })
            .expect("tcp address in the log")
    }

    /// The metrics address the server logged (it listens on port 0).
    pub fn metrics_address(&self) -> String {
        let log = self.log();
        let at = log
            .find("http=Some(")
            .unwrap_or_else(|| panic!("no http address in log:\n{log}"));
        let rest = &log[at + "http=Some(".len()..];
        rest[..rest.find(')').expect("paren")].to_owned()
    }

    /// An admin client.
    pub async fn admin(&self) -> AdminServiceClient<Channel> {
        let ch = modelshare_worker::connect::channel(&self.address)
            .await
            .expect("connect");
        AdminServiceClient::new(ch).max_decoding_message_size(256 << 20)
    }

    /// Sends `signal` and waits for the exit (10 s at most).
    pub fn stop_with(&mut self, signal: &str) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let ok = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(child.id().to_string())
            .status()
            .expect("kill");
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "server did not exit within 10 s of SIG{signal}; log:\n{}",
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A plain HTTP/1.1 GET: (status, body).
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
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

/// Deterministic pseudo-random bytes (xorshift64*), never all zeros.
pub fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        out.extend_from_slice(&s.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(n);
    out
}

/// One tensor to write.
#[derive(Debug, Clone)]
pub struct T {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

/// A tensor of random contents.
pub fn t(name: &str, dtype: Dtype, shape: &[usize], seed: u64) -> T {
    let n: usize = shape.iter().product::<usize>() * dtype.size();
    T {
        name: name.to_owned(),
        dtype,
        shape: shape.to_vec(),
        data: random_bytes(seed, n),
    }
}

/// Writes `tensors` as a safetensors file with the official crate.
pub fn write_safetensors(path: &Path, tensors: &[T]) {
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            (
                t.name.clone(),
                TensorView::new(t.dtype, t.shape.clone(), &t.data).expect("view"),
            )
        })
        .collect();
    let meta: Option<HashMap<String, String>> =
        Some([("format".to_string(), "pt".to_string())].into());
    safetensors::serialize_to_file(views, &meta, path).expect("serialize");
}

/// Writes a sharded model: `shards[i]` goes to `model-0000{i+1}-of-0000{n}.safetensors`, with
/// the index beside them.
pub fn write_sharded(dir: &Path, shards: &[Vec<T>]) {
    std::fs::create_dir_all(dir).expect("mkdir");
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (i, tensors) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{:05}.safetensors", i + 1, n);
        write_safetensors(&dir.join(&file), tensors);
        for t in tensors {
            weight_map.insert(t.name.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index = serde_json::json!({"metadata": {"total_size": 0}, "weight_map": weight_map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
}

/// Runs a load to its end; the finished version or the error status.
pub async fn load(
    admin: &mut AdminServiceClient<Channel>,
    name: &str,
    path: &str,
) -> Result<pb::VersionInfo, tonic::Status> {
    let mut stream = admin
        .load_model(pb::LoadModelRequest {
            name: name.into(),
            path: path.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut started = false;
    while let Some(msg) = stream.message().await? {
        match msg.event {
            Some(pb::load_model_progress::Event::Started(_)) => started = true,
            Some(pb::load_model_progress::Event::Done(v)) => {
                assert!(started, "Done before Started");
                return Ok(v);
            }
            _ => {}
        }
    }
    panic!("load stream ended without Done");
}

/// Reads a load's progress stream to its `Done`: the finished version, or the error status.
pub async fn until_done(
    mut stream: tonic::Streaming<pb::LoadModelProgress>,
) -> Result<pb::VersionInfo, tonic::Status> {
    while let Some(msg) = stream.message().await? {
        if let Some(pb::load_model_progress::Event::Done(v)) = msg.event {
            return Ok(v);
        }
    }
    panic!("load stream ended without Done");
}

/// GetStats.
pub async fn stats(admin: &mut AdminServiceClient<Channel>) -> pb::GetStatsResponse {
    admin
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("GetStats")
        .into_inner()
}

/// Count of versions in `state` in a stats reply.
pub fn count(stats: &pb::GetStatsResponse, state: pb::VersionState) -> u32 {
    stats
        .versions_by_state
        .iter()
        .find(|c| c.state == state as i32)
        .map(|c| c.count)
        .unwrap_or(0)
}

/// Descriptors the process `pid` has open, all kinds together.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Descriptors of `pid` that are memfds: the host backend's arenas and the copies of them that
/// unredeemed tickets hold. Counting only these keeps a ticket count exact while the server
/// opens and closes other files (a held-memory record written after a load, a log, a socket).
pub fn memfd_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter_map(|entry| std::fs::read_link(entry.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("/memfd:"))
            .count()
    })
}

/// Polls `check` every 20 ms until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A session opened with the raw generated client (no SDK): heartbeats are up to the test.
pub struct RawSession {
    /// The worker client on the same channel.
    pub worker: modelshare_proto::v1::worker_service_client::WorkerServiceClient<Channel>,
    /// Sends requests on the stream; dropping it closes the stream.
    pub tx: tokio::sync::mpsc::Sender<pb::SessionRequest>,
    /// The server's events.
    pub events: tonic::Streaming<pb::SessionEvent>,
    /// The welcome.
    pub welcome: pb::Welcome,
}

impl RawSession {
    /// Sends a heartbeat every 300 ms on the session stream (as the SDK does), until the
    /// stream closes or the task is aborted.
    pub fn heartbeats(&self) -> tokio::task::JoinHandle<()> {
        let beats = self.tx.clone();
        tokio::spawn(async move {
            loop {
                let beat = pb::SessionRequest {
                    kind: Some(pb::session_request::Kind::Heartbeat(
                        pb::Heartbeat::default(),
                    )),
                };
                if beats.send(beat).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    }
}

/// Opens a session with `hello` and waits for the welcome.
pub async fn raw_session(address: &str, hello: pb::Hello) -> RawSession {
    open_raw_session(address, hello, None).await
}

/// [`raw_session`] with a bearer token on the session call.
pub async fn raw_session_with_token(address: &str, hello: pb::Hello, token: &str) -> RawSession {
    open_raw_session(address, hello, Some(token)).await
}

async fn open_raw_session(address: &str, hello: pb::Hello, token: Option<&str>) -> RawSession {
    let ch = modelshare_worker::connect::channel(address)
        .await
        .expect("channel");
    let worker = modelshare_proto::v1::worker_service_client::WorkerServiceClient::new(ch);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SessionRequest {
        kind: Some(pb::session_request::Kind::Hello(hello)),
    })
    .await
    .expect("hello");
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header");
        request.metadata_mut().insert("authorization", value);
    }
    let mut events = worker
        .clone()
        .session(request)
        .await
        .expect("session")
        .into_inner();
    let welcome = match events
        .message()
        .await
        .expect("welcome")
        .and_then(|e| e.kind)
    {
        Some(pb::session_event::Kind::Welcome(w)) => w,
        other => panic!("expected a welcome, got {other:?}"),
    };
    RawSession {
        worker,
        tx,
        events,
        welcome,
    }
}

/// A worker process holding a lease.
pub struct Worker {
    child: Child,
    lines: BufReader<ChildStdout>,
    /// The JSON report the worker printed after attaching.
    pub report: Value,
}

impl Worker {
    /// Starts `modelshare probe MODEL --hold --output json` and waits for its report.
    pub fn start(server: &Server, model: &str, name: &str) -> Worker {
        let mut child = Command::new(BIN)
            .args([
                "--server",
                &server.address,
                "--output",
                "json",
                "probe",
                model,
                "--hold",
                "--name",
                name,
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn probe");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let report = read_json_line(&mut lines);
        assert_eq!(report["event"], "attached", "{report}");
        Worker {
            child,
            lines,
            report,
        }
    }

    /// Runs `modelshare probe MODEL --hold` with `env` (a token, say) and, when given, as
    /// `uid`. `Err` carries the probe's exit status and error output when it did not attach.
    pub fn try_start_as(
        address: &str,
        model: &str,
        name: &str,
        env: &[(&str, &str)],
        uid: Option<u32>,
    ) -> Result<Worker, String> {
        use std::io::Read;
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(BIN);
        cmd.args([
            "--server", address, "--output", "json", "probe", model, "--hold", "--name", name,
        ])
        .env_remove("MODELSHARE_TOKEN")
        .env_remove("MODELSHARE_TOKEN_FILE")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let mut child = cmd.spawn().expect("spawn probe");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        let n = lines.read_line(&mut line).expect("read");
        if n == 0 {
            let status = child.wait().expect("wait");
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("{status}: {err}"));
        }
        let report: Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(report["event"], "attached", "{report}");
        Ok(Worker {
            child,
            lines,
            report,
        })
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn next_event(&mut self) -> Value {
        read_json_line(&mut self.lines)
    }

    /// Waits for the process to exit.
    pub fn wait(&mut self) {
        let _ = self.child.wait();
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("kill");
        assert!(ok.success());
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn read_json_line(lines: &mut BufReader<ChildStdout>) -> Value {
    let mut line = String::new();
    let n = lines
        .read_line(&mut line)
        .expect("read a line from the worker");
    assert!(n > 0, "the worker closed its output");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

/// A child process killed (and reaped) when dropped, so that a failing test does not leave its
/// server running.
pub struct KillOnDrop(pub Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
