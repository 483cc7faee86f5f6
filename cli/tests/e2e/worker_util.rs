//! A test worker in the test process, on the raw generated client (no SDK): a session with
//! heartbeats, a lease, and a Serve stream whose batches it answers like the echo worker:
//! - text `fail:MSG` fails with INVALID_ARGUMENT and MSG;
//! - text `sleep:N ...` waits N ms first (cancellation and deadline tests);
//! - other text: output `embedding` FP32 [2] = [UTF-8 byte length, version], parameter
//!   `prompt_tokens` = words;
//! - tensors: output `echo` = the first input as is.
//!
//! It records what it saw (batches, the most held at once, cancels) for the tests to check.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use modelshare_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::common::raw_session;

/// What a test worker saw.
#[derive(Debug, Default, Clone)]
pub struct Seen {
    /// Batches received.
    pub batches: usize,
    /// Items received.
    pub items: usize,
    /// Items of each batch, in order.
    pub sizes: Vec<usize>,
    /// The most batches it held at once.
    pub max_held: usize,
    /// Batches held now.
    pub held: usize,
    /// Item ids cancelled by the server.
    pub cancelled: Vec<u64>,
    /// Drains received.
    pub drains: usize,
    /// Each item's request id and traceparent, in the order received.
    pub traces: Vec<(String, String)>,
}

/// How a test worker offers itself.
#[derive(Debug, Clone)]
pub struct Offer {
    pub credits: u32,
    pub max_batch_items: u32,
    pub max_batch_bytes: u64,
    pub accepts: Vec<String>,
    pub version: u32,
    /// Milliseconds each batch takes, whatever its size (as a GPU batch roughly does).
    pub batch_ms: u64,
    /// Items streamed at once (ServeOffer.streams; 0: not a streaming worker).
    pub streams: u32,
}

impl Default for Offer {
    fn default() -> Self {
        Self {
            credits: 2,
            max_batch_items: 32,
            max_batch_bytes: 0,
            accepts: vec!["text".into(), "tensor".into()],
            version: 0,
            batch_ms: 0,
            streams: 0,
        }
    }
}

/// A running test worker.
pub struct TestWorker {
    pub seen: Arc<Mutex<Seen>>,
    pub accepted: pb::ServeAccepted,
    pub session_id: String,
    stop: tokio_util::sync::CancellationToken,
    dead: tokio_util::sync::CancellationToken,
    task: JoinHandle<Result<(), tonic::Status>>,
    beats: JoinHandle<()>,
}

/// Opens a session (with `token` when given) on `address`, attaches `model` and serves it.
/// `Err` is the status that refused the offer.
pub async fn try_serve(
    address: &str,
    token: Option<&str>,
    model: &str,
    offer: Offer,
) -> Result<TestWorker, tonic::Status> {
    let hello = pb::Hello {
        worker_name: "test-worker".into(),
        pid: std::process::id(),
        ..Default::default()
    };
    let session = match token {
        None => raw_session(address, hello).await,
        Some(t) => crate::common::raw_session_with_token(address, hello, t).await,
    };
    let session_id = session.welcome.session_id.clone();
    let mut worker = session.worker.clone();
    let attach = worker
        .attach(with_token(
            pb::AttachRequest {
                device_uuid: String::new(),
                session_id: session_id.clone(),
                model: model.into(),
                version: offer.version,
            },
            token,
        ))
        .await?
        .into_inner();
    let version = attach.manifest.as_ref().map_or(0, |m| m.version);
    // Session heartbeats, for as long as the worker lives.
    let session_tx = session.tx.clone();
    let beats = tokio::spawn(async move {
        let _events = session.events;
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let beat = pb::SessionRequest {
                kind: Some(pb::session_request::Kind::Heartbeat(
                    pb::Heartbeat::default(),
                )),
            };
            if session_tx.send(beat).await.is_err() {
                return;
            }
        }
    });
    let (tx, rx) = mpsc::channel(64);
    tx.send(pb::ServeRequest {
        kind: Some(pb::serve_request::Kind::Offer(pb::ServeOffer {
            session_id: session_id.clone(),
            model: model.into(),
            version: offer.version,
            credits: offer.credits,
            max_batch_items: offer.max_batch_items,
            max_batch_bytes: offer.max_batch_bytes,
            accepts: offer.accepts.clone(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            streams: offer.streams,
        })),
    })
    .await
    .expect("offer");
    let mut events = worker
        .serve(with_token(
            tokio_stream::wrappers::ReceiverStream::new(rx),
            token,
        ))
        .await?
        .into_inner();
    let accepted = match events.message().await?.and_then(|e| e.kind) {
        Some(pb::serve_event::Kind::Accepted(a)) => a,
        other => panic!("expected ServeAccepted, got {other:?}"),
    };
    assert_eq!(accepted.version, version);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let dead = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        events,
        tx,
        seen.clone(),
        version,
        offer.batch_ms,
        stop.clone(),
        dead.clone(),
    ));
    Ok(TestWorker {
        seen,
        accepted,
        session_id,
        stop,
        dead,
        task,
        beats,
    })
}

/// [`try_serve`] that must succeed.
pub async fn serve(address: &str, model: &str, offer: Offer) -> TestWorker {
    try_serve(address, None, model, offer)
        .await
        .expect("serve accepted")
}

fn with_token<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(t) = token {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("header"),
        );
    }
    request
}

impl TestWorker {
    /// What it saw so far.
    pub fn seen(&self) -> Seen {
        self.seen.lock().expect("seen").clone()
    }

    /// Closes its side of the stream (a clean stop), then waits for the server to end it.
    pub async fn close(mut self) -> Result<(), tonic::Status> {
        self.stop.cancel();
        let r = tokio::time::timeout(Duration::from_secs(10), &mut self.task)
            .await
            .expect("stream ended")
            .expect("task");
        self.beats.abort();
        r
    }

    /// Drops everything at once, as a killed process would: no answer, no heartbeat, the
    /// streams gone.
    pub fn kill(self) {
        self.dead.cancel();
        self.task.abort();
        self.beats.abort();
    }
}

async fn run(
    mut events: tonic::Streaming<pb::ServeEvent>,
    tx: mpsc::Sender<pb::ServeRequest>,
    seen: Arc<Mutex<Seen>>,
    version: u32,
    batch_ms: u64,
    stop: tokio_util::sync::CancellationToken,
    dead: tokio_util::sync::CancellationToken,
) -> Result<(), tonic::Status> {
    let mut tx = Some(tx);
    let beat_tx = tx.clone().expect("sender");
    let beat_dead = dead.clone();
    let beats = tokio::spawn(async move {
        loop {
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = beat_dead.cancelled() => return,
            }
            let beat = pb::ServeRequest {
                kind: Some(pb::serve_request::Kind::Heartbeat(pb::Heartbeat::default())),
            };
            if beat_tx.send(beat).await.is_err() {
                return;
            }
        }
    });
    let result = loop {
        let message = tokio::select! {
            m = events.message() => m,
            () = stop.cancelled(), if tx.is_some() => {
                // Close our side: no more results or heartbeats; the server then ends the stream.
                beats.abort();
                tx = None;
                continue;
            }
        };
        let event = match message {
            Ok(Some(e)) => e,
            Ok(None) => break Ok(()),
            Err(status) => break Err(status),
        };
        match event.kind {
            Some(pb::serve_event::Kind::Batch(batch)) => {
                {
                    let mut s = seen.lock().expect("seen");
                    s.batches += 1;
                    s.items += batch.items.len();
                    s.sizes.push(batch.items.len());
                    s.traces.extend(
                        batch
                            .items
                            .iter()
                            .map(|i| (i.request_id.clone(), i.traceparent.clone())),
                    );
                    s.held += 1;
                    s.max_held = s.max_held.max(s.held);
                }
                let Some(tx) = tx.clone() else { continue };
                let (seen, dead) = (seen.clone(), dead.clone());
                // Batch times vary by ±20%, as real ones do (and so that slots do not stay in step).
                let jitter = 0.8
                    + 0.4 * ((batch.batch_id.wrapping_mul(2_654_435_761) % 1000) as f64 / 1000.0);
                let took = Duration::from_secs_f64(batch_ms as f64 * jitter / 1000.0);
                tokio::spawn(async move {
                    tokio::select! {
                        () = tokio::time::sleep(took) => {}
                        () = dead.cancelled() => return,
                    }
                    let mut results = Vec::new();
                    for item in batch.items {
                        tokio::select! {
                            r = answer(item, version) => results.push(r),
                            () = dead.cancelled() => return,
                        }
                    }
                    seen.lock().expect("seen").held -= 1;
                    let result = pb::BatchResult {
                        batch_id: batch.batch_id,
                        results,
                    };
                    let _ = tx
                        .send(pb::ServeRequest {
                            kind: Some(pb::serve_request::Kind::Result(result)),
                        })
                        .await;
                });
            }
            Some(pb::serve_event::Kind::Cancel(c)) => {
                seen.lock().expect("seen").cancelled.extend(c.item_ids);
            }
            Some(pb::serve_event::Kind::Drain(_)) => {
                seen.lock().expect("seen").drains += 1;
            }
            Some(pb::serve_event::Kind::Accepted(_) | pb::serve_event::Kind::Window(_)) | None => {}
        }
    };
    beats.abort();
    result
}

async fn answer(item: pb::Item, version: u32) -> pb::ItemResult {
    let outcome = match item.input {
        Some(pb::item::Input::Text(t)) => {
            let text = t.text;
            if let Some(msg) = text.strip_prefix("fail:") {
                pb::item_result::Outcome::Error(pb::ItemError {
                    code: tonic::Code::InvalidArgument as i32,
                    message: msg.to_owned(),
                })
            } else {
                if let Some(rest) = text.strip_prefix("sleep:") {
                    let ms: u64 = rest
                        .split(' ')
                        .next()
                        .and_then(|n| n.parse().ok())
                        .unwrap_or(0);
                    tokio::time::sleep(Duration::from_millis(ms)).await;
                }
                let values = [text.len() as f32, version as f32];
                let mut parameters = HashMap::new();
                parameters.insert(
                    "prompt_tokens".to_owned(),
                    pb::Parameter {
                        value: Some(pb::parameter::Value::Int64Value(
                            text.split_whitespace().count() as i64,
                        )),
                    },
                );
                pb::item_result::Outcome::Output(pb::ItemOutput {
                    tensors: vec![pb::TensorOutput {
                        name: "embedding".into(),
                        dtype: pb::DType::DtypeF32 as i32,
                        shape: vec![2],
                        data: values
                            .iter()
                            .flat_map(|v| v.to_le_bytes())
                            .collect::<Vec<u8>>()
                            .into(),
                    }],
                    parameters,
                })
            }
        }
        Some(pb::item::Input::Tensors(t)) => match t.tensors.into_iter().next() {
            Some(first) => pb::item_result::Outcome::Output(pb::ItemOutput {
                tensors: vec![pb::TensorOutput {
                    name: "echo".into(),
                    dtype: first.dtype,
                    shape: first.shape,
                    data: first.data,
                }],
                parameters: HashMap::new(),
            }),
            None => pb::item_result::Outcome::Error(pb::ItemError {
                code: tonic::Code::InvalidArgument as i32,
                message: "no tensors".into(),
            }),
        },
        None => pb::item_result::Outcome::Error(pb::ItemError {
            code: tonic::Code::InvalidArgument as i32,
            message: "no input".into(),
        }),
    };
    pb::ItemResult {
        item_id: item.item_id,
        outcome: Some(outcome),
    }
}
