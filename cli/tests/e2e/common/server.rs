//! The server process under test, and a plain HTTP GET on its HTTP port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use tonic::transport::Channel;

use super::BIN;

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
        self.logged_address("metrics")
    }

    /// The inference port's address (`--http-listen`), as the server logged it.
    pub fn http_address(&self) -> String {
        self.logged_address("http")
    }

    fn logged_address(&self, which: &str) -> String {
        let log = self.log();
        let key = format!("{which}=Some(");
        let at = log
            .find(&key)
            .unwrap_or_else(|| panic!("no {which} address in log:\n{log}"));
        let rest = &log[at + key.len()..];
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
