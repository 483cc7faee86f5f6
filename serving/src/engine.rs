//! [`Engine`]: the handle to the request path that the front doors and the Serve streams hold.
//! Every call is a message to the driver task (`super::driver`), which owns all the state.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::driver::{self, Command};
use super::error::InferError;
use super::kind::Kind;
use super::scheduler::WorkerId;
use super::stats::VersionStats;
pub use super::types::{
    EngineConfig, GpuSharing, InferRequest, InferResponse, MAILBOX, ModelServing, Part,
    STREAM_WINDOW, ServingSnapshot, StreamEnd, StreamError, WorkerInfo, WorkerOffer,
};
use modelshare_core::metrics::Metrics;

/// A registered Serve stream: its id and the events to send it. The stream ends when the
/// sender is dropped (the driver let it go) or an `Err` comes (a protocol error, a shutdown).
#[derive(Debug)]
pub struct WorkerStream {
    /// The worker's id.
    pub id: WorkerId,
    /// What to send it.
    pub events: mpsc::UnboundedReceiver<Result<pb::ServeEvent, StreamError>>,
}

/// The handle to the request path. Cheap to clone.
///
/// Two mailboxes lead to the driver. New work (requests, results, Serve streams opening,
/// snapshots) goes through a bounded one ([`EngineConfig::mailbox`]): a request that finds it
/// full is refused at once, a worker's result waits for room (its stream is read no further
/// meanwhile). What releases state (a cancel, a stream's end, a drain, new weights) goes
/// through an unbounded one, read first: each is at most one per request or stream that the
/// bounded one let in, and it must never be lost.
#[derive(Debug, Clone)]
pub struct Engine {
    work: mpsc::Sender<Command>,
    tx: mpsc::UnboundedSender<Command>,
    tickets: Arc<AtomicU64>,
    workers: Arc<AtomicU64>,
}

impl Engine {
    /// Starts the driver task; it stops when `shutdown` is cancelled (queued requests then fail
    /// with UNAVAILABLE, workers are told to drain) or when every handle is gone.
    pub fn start(config: EngineConfig, metrics: Arc<Metrics>, shutdown: CancellationToken) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let (work, work_rx) = mpsc::channel(config.mailbox.max(1));
        tokio::spawn(driver::run(config, metrics, work_rx, rx, shutdown));
        Self {
            work,
            tx,
            tickets: Arc::new(AtomicU64::new(0)),
            workers: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Sends what releases state (never refused while the driver runs).
    fn send(&self, command: Command) -> Result<(), InferError> {
        self.tx.send(command).map_err(|_| InferError::ShuttingDown)
    }

    /// Offers new work; a full mailbox refuses it at once.
    fn offer(&self, command: Command) -> Result<(), InferError> {
        self.work.try_send(command).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => InferError::Busy,
            mpsc::error::TrySendError::Closed(_) => InferError::ShuttingDown,
        })
    }

    /// Submits a request and waits for its answer, until its deadline at most. Dropping the
    /// returned future (the caller went away) cancels the request: its queued items leave the
    /// queue and the workers computing the others are told; so does the deadline.
    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse, InferError> {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let deadline = request.deadline;
        let request_model = request.model.clone();
        self.offer(Command::Submit {
            ticket,
            request,
            arrival: Instant::now(),
            reply,
            parts: None,
        })?;
        let mut guard = CancelOnDrop {
            tx: &self.tx,
            ticket,
            armed: true,
            why: Kind::Cancelled,
        };
        // The driver fails items still queued at the deadline; one in flight is given up here
        // (the guard then cancels it, and its worker is told).
        let model = request_model;
        let result = match tokio::time::timeout_at(deadline.into(), answer).await {
            Ok(answer) => answer.unwrap_or(Err(InferError::ShuttingDown)),
            Err(_) => {
                guard.why = Kind::DeadlineExceeded;
                return Err(InferError::DeadlineExceeded { model });
            }
        };
        guard.armed = false;
        result
    }

    /// Submits a request of one item whose answer streams: its parts come from
    /// [`PartStream::next`] as the worker sends them (at most `limits.window` ahead of the
    /// reader, the stream's back-pressure; it must be the window the workers were granted,
    /// [`EngineConfig::stream_window`]), then [`PartStream::finish`] gives the final answer.
    /// Dropping the stream cancels the request at its worker. The request's deadline bounds
    /// the time to the first part (or the answer); after it, `limits.idle` between parts and
    /// `limits.longest` for the whole stream.
    pub fn infer_stream(
        &self,
        request: InferRequest,
        limits: StreamLimits,
    ) -> Result<PartStream, InferError> {
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        let (reply, answer) = oneshot::channel();
        let (parts_tx, parts) = mpsc::channel(limits.window.max(1) as usize);
        let model = request.model.clone();
        let deadline = request.deadline;
        let arrival = Instant::now();
        self.offer(Command::Submit {
            ticket,
            request,
            arrival,
            reply,
            parts: Some(parts_tx),
        })?;
        Ok(PartStream {
            tx: self.tx.clone(),
            ticket,
            parts,
            answer: Some(answer),
            model,
            deadline,
            limits,
            arrival,
            last_part: None,
            done: false,
        })
    }

    /// Registers a Serve stream.
    pub fn open_worker(&self, offer: WorkerOffer) -> Result<WorkerStream, InferError> {
        let id = WorkerId(self.workers.fetch_add(1, Ordering::Relaxed) + 1);
        let (events_tx, events) = mpsc::unbounded_channel();
        self.offer(Command::OpenWorker {
            id,
            offer,
            events: events_tx,
        })?;
        Ok(WorkerStream { id, events })
    }

    /// A worker's answer to a batch; waits while the mailbox is full.
    pub async fn worker_result(&self, id: WorkerId, result: pb::BatchResult) {
        let _ = self.work.send(Command::Result { id, result }).await;
    }

    /// Hands in part of a streamed item's answer from worker `id` (waits for room in the
    /// driver's mailbox, as a result does).
    pub async fn worker_part(&self, id: WorkerId, part: pb::ItemPart) {
        let _ = self.work.send(Command::Part { id, part }).await;
    }

    /// A worker broke the protocol: its stream ends with INVALID_ARGUMENT and `message`.
    /// Behind the worker's results sent before it, in the same mailbox (see `worker_ended`).
    pub async fn worker_protocol_error(&self, id: WorkerId, message: String) {
        let _ = self.work.send(Command::ProtocolError { id, message }).await;
    }

    /// A Serve stream ended. Sent through the same mailbox as the worker's results, after
    /// them: a result read just before the stream's end answers its batch, instead of the
    /// end requeueing the batch first (the control channel is read before the mailbox).
    pub async fn worker_ended(&self, id: WorkerId, end: StreamEnd) {
        let _ = self.work.send(Command::Ended { id, end }).await;
    }

    /// Sends a worker no more batches and tells it to drain.
    pub fn drain_worker(&self, id: WorkerId, reason: String) {
        let _ = self.send(Command::Drain { id, reason });
    }

    /// Replaces the tenants' weights in the fair queues (after the tenants file is reloaded);
    /// a tenant not named gets the default, 1.
    pub fn set_tenant_weights(&self, weights: std::collections::HashMap<String, u32>) {
        let _ = self.send(Command::Weights { weights });
    }

    /// The request path as it stands.
    pub async fn snapshot(&self) -> ServingSnapshot {
        let (reply, answer) = oneshot::channel();
        if self.work.send(Command::Snapshot { reply }).await.is_err() {
            return ServingSnapshot::default();
        }
        answer.await.unwrap_or_default()
    }

    /// The cumulative statistics of `model`'s versions (every model's when `None`) that served
    /// requests, by model name then version (Triton's `ModelStatistics`).
    pub async fn stats(&self, model: Option<&str>) -> Vec<(String, Vec<VersionStats>)> {
        let (reply, answer) = oneshot::channel();
        let command = Command::Stats {
            model: model.map(str::to_owned),
            reply,
        };
        if self.work.send(command).await.is_err() {
            return Vec::new();
        }
        answer.await.unwrap_or_default()
    }
}

/// Cancels a submitted request unless disarmed (the answer came), saying why: the caller went
/// away (CANCELLED) or its deadline passed (DEADLINE_EXCEEDED).
struct CancelOnDrop<'a> {
    tx: &'a mpsc::UnboundedSender<Command>,
    ticket: u64,
    armed: bool,
    why: Kind,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.tx.send(Command::Cancel {
                ticket: self.ticket,
                why: self.why,
            });
        }
    }
}

/// How long a streamed answer may take once its first part came ([`Engine::infer_stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamLimits {
    /// Parts the worker may send ahead of the reader ([`EngineConfig::stream_window`]).
    pub window: u32,
    /// The longest wait for the next part (or the final answer) after a part.
    pub idle: Duration,
    /// The longest a stream lasts from its arrival.
    pub longest: Duration,
}

impl Default for StreamLimits {
    fn default() -> Self {
        Self {
            window: STREAM_WINDOW,
            idle: STREAM_IDLE,
            longest: STREAM_LONGEST,
        }
    }
}

/// Default of [`StreamLimits::idle`]: a minute without a part.
pub const STREAM_IDLE: Duration = Duration::from_secs(60);
/// Default of [`StreamLimits::longest`]: an hour.
pub const STREAM_LONGEST: Duration = Duration::from_secs(3600);

/// A streamed request's parts and its final answer ([`Engine::infer_stream`]). Dropped before
/// [`PartStream::finish`] has answered, it cancels the request at its worker.
#[derive(Debug)]
pub struct PartStream {
    tx: mpsc::UnboundedSender<Command>,
    ticket: u64,
    parts: mpsc::Receiver<Part>,
    answer: Option<oneshot::Receiver<Result<InferResponse, InferError>>>,
    model: String,
    deadline: Instant,
    limits: StreamLimits,
    arrival: Instant,
    last_part: Option<Instant>,
    done: bool,
}

impl PartStream {
    /// The next part, or `None` once the worker has sent its last (then call
    /// [`PartStream::finish`]). Each part taken lets the worker send one more. A part (or the
    /// end of the parts) later than the stream's limits is an error, and the request is
    /// cancelled at its worker.
    pub async fn next(&mut self) -> Result<Option<Part>, InferError> {
        let by = self.limit();
        let part = match tokio::time::timeout_at(by.into(), self.parts.recv()).await {
            Ok(part) => part,
            Err(_) => return Err(self.expired()),
        };
        let Some(part) = part else {
            return Ok(None);
        };
        self.last_part = Some(Instant::now());
        let _ = self.tx.send(Command::Took {
            ticket: self.ticket,
        });
        Ok(Some(part))
    }

    /// The final answer, after the last part (parts not yet taken are dropped), or why there
    /// is none: the worker's error, [`InferError::StreamInterrupted`] when it was lost after a
    /// part, or a limit of the stream.
    pub async fn finish(mut self) -> Result<InferResponse, InferError> {
        let Some(answer) = self.answer.take() else {
            return Err(InferError::ShuttingDown);
        };
        let by = self.limit();
        let result = match tokio::time::timeout_at(by.into(), answer).await {
            Ok(answer) => answer.unwrap_or(Err(InferError::ShuttingDown)),
            Err(_) => return Err(self.expired()),
        };
        self.done = true;
        result
    }

    /// When the next part must have come: the deadline before the first, then the idle
    /// limit after the last, never past the longest stream.
    fn limit(&self) -> Instant {
        let longest = self.arrival + self.limits.longest;
        match self.last_part {
            None => self.deadline.min(longest),
            Some(last) => (last + self.limits.idle).min(longest),
        }
    }

    /// The stream ran past a limit: its request is cancelled, and the error says which.
    fn expired(&mut self) -> InferError {
        let _ = self.tx.send(Command::Cancel {
            ticket: self.ticket,
            why: Kind::DeadlineExceeded,
        });
        self.done = true;
        let model = self.model.clone();
        let now = Instant::now();
        if now >= self.arrival + self.limits.longest {
            InferError::StreamTooLong {
                model,
                longest: self.limits.longest,
            }
        } else if self.last_part.is_some() {
            InferError::StreamStalled {
                model,
                idle: self.limits.idle,
            }
        } else {
            InferError::DeadlineExceeded { model }
        }
    }
}

impl Drop for PartStream {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.tx.send(Command::Cancel {
                ticket: self.ticket,
                why: Kind::Cancelled,
            });
        }
    }
}
