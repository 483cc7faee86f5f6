//! The front doors end to end: the real server with its HTTP port, a test worker on
//! `WorkerService.Serve` (`worker_util`: text → `embedding` FP32 `[byte length, version]` and
//! `prompt_tokens` = words; tensors → `echo`, the first input as is), and callers on each door
//! through their wire protocols only: the generated OIP gRPC client, and plain HTTP/1.1 over a
//! TCP stream for the OIP REST and OpenAI routes (JSON, Triton's binary tensor extension),
//! with the documented error statuses and shapes.
//!
//! Here: the stack, the clients and the codecs the tests share; the tests by door in the
//! submodules.

use std::time::Duration;

use modelshare_proto::inference as oip;
use modelshare_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

use crate::common::Server;
use crate::tenants as tn;
use crate::worker_util::{Offer, TestWorker, serve};

mod auth;
mod names;
mod oip_grpc;
mod oip_rest;
mod openai;
mod request_ids;
mod triton;

/// The server's limit on request bodies in these tests.
const BODY_LIMIT: usize = 64 << 10;

/// A server with its HTTP port, the start-up model `start_up` (`NAME=FOLDER`), model folders
/// `folders` under its root, and the tests' body limit (the configuration file is returned: it
/// must outlive the server).
async fn doors_server(start_up: &str, folders: &[&str]) -> (Server, tempfile::NamedTempFile) {
    let config = tempfile::NamedTempFile::new().expect("tmp");
    std::fs::write(
        config.path(),
        format!("[serving]\nmax_request_bytes = {BODY_LIMIT}\n"),
    )
    .expect("write config");
    let path = config.path().to_str().expect("utf-8").to_owned();
    let folders: Vec<String> = folders.iter().map(|f| f.to_string()).collect();
    let server = Server::start_with(
        &[
            "--http-listen",
            "127.0.0.1:0",
            "--config",
            &path,
            "--model",
            start_up,
            "--no-worker-wait-ms",
            "300",
        ],
        move |root| {
            let folders: Vec<&str> = folders.iter().map(String::as_str).collect();
            tn::models(root, &folders);
        },
    )
    .await;
    (server, config)
}

/// A server with start-up model `enc` and its HTTP port, and a worker serving `enc`.
async fn stack() -> (Server, TestWorker, tempfile::NamedTempFile) {
    let (server, config) = doors_server("enc=enc", &["enc"]).await;
    let worker = serve(&server.address, "enc", Offer::default()).await;
    (server, worker, config)
}

async fn grpc(server: &Server) -> GrpcInferenceServiceClient<Channel> {
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    GrpcInferenceServiceClient::new(ch)
}

/// An HTTP answer.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "status {}: body is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        })
    }
}

/// One HTTP/1.1 request on its own connection. The body is written while the answer is read,
/// and a failed write is ignored (a server may answer before it has read everything), as a
/// client that sends its whole body first would still see the answer.
pub(crate) async fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Answer {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    let mut request = head.into_bytes();
    request.extend_from_slice(body);
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        wr
    });
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(20), rd.read_to_end(&mut raw))
        .await
        .expect("answer within 20 s")
        .expect("read the answer");
    drop(writer.await);
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in {:?}", String::from_utf8_lossy(&raw)));
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .expect("status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    Answer {
        status,
        headers,
        body: raw[split + 4..].to_vec(),
    }
}

async fn post_json(addr: &str, path: &str, body: &Value) -> Answer {
    http(
        addr,
        "POST",
        path,
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )
    .await
}

fn f32s(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn floats(raw: &[u8]) -> Vec<f32> {
    raw.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn texts_request(model: &str, texts: &[&str]) -> oip::ModelInferRequest {
    oip::ModelInferRequest {
        model_name: model.into(),
        id: "t1".into(),
        inputs: vec![oip::model_infer_request::InferInputTensor {
            name: "text".into(),
            datatype: "BYTES".into(),
            shape: vec![texts.len() as i64, 1],
            contents: Some(oip::InferTensorContents {
                bytes_contents: texts.iter().map(|t| t.as_bytes().to_vec()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    }
}
