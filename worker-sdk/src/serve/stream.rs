//! One Serve stream, from the offer to its end: the handler calls it runs (never more than
//! the credits at once), the one result per batch, cancels, heartbeats, and the drain.
//!
//! One task owns the stream: it reads the server's events, starts handler calls as tasks of a
//! `JoinSet`, and sends each batch's result when its call ends. Nothing is shared with the
//! handler tasks but their batch (and each item's cancellation token).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use modelshare_proto::v1 as pb;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::failure::ItemFailure;
use super::handler::Handler;
use super::item::{Accepts, Batch, Item, deadline};
use super::output::{Outcome, item_result};
use super::sink::{PartSink, grant};
use crate::WorkerError;
use crate::link::Link;

/// How long the server has to accept an offer.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the server has to end the stream after the worker closed its side.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// How a stream ended.
#[derive(Debug)]
pub(super) enum StreamEnd {
    /// The server drained it (the reason); what the worker held was answered.
    Drained(String),
    /// The worker stopped it; what it held was answered.
    Stopped,
    /// It broke, or the offer was refused: the server's status if it gave one.
    Broken {
        /// Whether the server had accepted the offer.
        accepted: bool,
        /// The status the stream ended with (`None`: it ended with OK, or timed out).
        status: Option<tonic::Status>,
    },
}

/// The batch limits of an offer, as the worker enforces them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Limits {
    pub(super) credits: usize,
    pub(super) max_items: usize,
    /// Items come one a batch and go to `handle_stream` (`credits` is then the streams).
    pub(super) streaming: bool,
    pub(super) max_bytes: u64,
    pub(super) accepts: Accepts,
}

/// Offers on `link`, and serves until the stream ends.
pub(super) async fn run<H: Handler>(
    link: Link,
    offer: pb::ServeOffer,
    limits: Limits,
    heartbeat: Duration,
    handler: Arc<H>,
    stop: &CancellationToken,
) -> Result<StreamEnd, WorkerError> {
    let (model, version) = (offer.model.clone(), offer.version);
    let (tx, rx) = mpsc::channel(limits.credits.saturating_add(2));
    let offer = pb::ServeRequest {
        kind: Some(pb::serve_request::Kind::Offer(offer)),
    };
    if tx.send(offer).await.is_err() {
        return Err(WorkerError::SessionEnded);
    }
    let mut client = link.client.clone();
    let opened = tokio::select! {
        r = tokio::time::timeout(ACCEPT_TIMEOUT, client.serve(ReceiverStream::new(rx))) => r,
        () = stop.cancelled() => return Ok(StreamEnd::Stopped),
    };
    let mut inbound = match opened {
        Ok(Ok(response)) => response.into_inner(),
        Ok(Err(status)) => return Ok(broken(false, Some(status))),
        Err(_) => return Ok(broken(false, None)),
    };
    let first = tokio::select! {
        r = tokio::time::timeout(ACCEPT_TIMEOUT, inbound.next()) => r,
        () = stop.cancelled() => return Ok(StreamEnd::Stopped),
    };
    let accepted = match first {
        Ok(Some(Ok(pb::ServeEvent {
            kind: Some(pb::serve_event::Kind::Accepted(a)),
        }))) => a,
        Ok(Some(Err(status))) => return Ok(broken(false, Some(status))),
        Ok(None) | Err(_) => return Ok(broken(false, None)),
        Ok(Some(Ok(other))) => {
            return Err(WorkerError::Protocol(format!(
                "the server's first serve message was not ServeAccepted but {:?}",
                other.kind
            )));
        }
    };
    info!(
        %model, offered = version, version = accepted.version, serve_id = %accepted.serve_id,
        credits = limits.credits, "serving"
    );
    let mut serving = Serving {
        tx: Some(tx),
        handler,
        limits,
        running: JoinSet::new(),
        pending: HashMap::new(),
        queued: VecDeque::new(),
        tokens: HashMap::new(),
        windows: HashMap::new(),
        initial_window: accepted.initial_window,
        heartbeat,
        next_beat: Instant::now() + heartbeat,
        warned_over_credit: false,
    };
    let end = serving.serve(&mut inbound, stop).await;
    // A broken stream's calls are abandoned (the server requeues their items); wait for them
    // to stop, so that a new stream never runs more than the credits at once.
    serving.running.shutdown().await;
    let end = match end {
        Ended::Finished(phase) => {
            // Close our side, then give the server a moment to end the stream with OK.
            drop(serving.tx.take());
            let deadline = Instant::now() + CLOSE_TIMEOUT;
            while let Ok(Some(Ok(_))) = tokio::time::timeout_at(deadline, inbound.next()).await {}
            phase.end()
        }
        Ended::Broken(Phase::Serving, status) => StreamEnd::Broken {
            accepted: true,
            status,
        },
        // Drained or stopping already: the server requeues what was not answered.
        Ended::Broken(phase, _) => phase.end(),
    };
    Ok(end)
}

/// The status a stream ended with, after a send failed (the call is over: its status is
/// next on the inbound side, or there is none).
async fn call_status(inbound: &mut tonic::Streaming<pb::ServeEvent>) -> Option<tonic::Status> {
    let deadline = Instant::now() + CLOSE_TIMEOUT;
    loop {
        match tokio::time::timeout_at(deadline, inbound.next()).await {
            Ok(Some(Ok(_))) => {}
            Ok(Some(Err(status))) => return Some(status),
            Ok(None) | Err(_) => return None,
        }
    }
}

fn broken(accepted: bool, status: Option<tonic::Status>) -> StreamEnd {
    StreamEnd::Broken { accepted, status }
}

/// Where an accepted stream is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// Taking batches.
    Serving,
    /// The server drained the stream (the reason): answer what is held, then close.
    Draining(String),
    /// The worker is stopping: answer what is held, then close.
    Stopping,
}

impl Phase {
    /// The end of a stream that finished (or broke) in this phase, after it was accepted.
    fn end(self) -> StreamEnd {
        match self {
            Phase::Serving => StreamEnd::Broken {
                accepted: true,
                status: None,
            },
            Phase::Draining(reason) => StreamEnd::Drained(reason),
            Phase::Stopping => StreamEnd::Stopped,
        }
    }
}

/// How the serving loop ended.
enum Ended {
    /// Drained or stopped, everything held answered: close our side.
    Finished(Phase),
    /// The stream ended (with this status, or OK) or a send failed, in this phase.
    Broken(Phase, Option<tonic::Status>),
}

/// A send failed: the call is over.
struct Gone;

/// A batch whose handler call is running.
struct Pending {
    batch_id: u64,
    /// The items given to the handler, in order.
    ran: Vec<u64>,
    /// Every item of the batch (for the cancellation tokens).
    all: Vec<u64>,
    /// Results of the items the SDK answered itself.
    answered: Vec<pb::ItemResult>,
}

/// An accepted stream's state.
struct Serving<H> {
    /// Our side of the stream (`None` once closed).
    tx: Option<mpsc::Sender<pb::ServeRequest>>,
    handler: Arc<H>,
    limits: Limits,
    /// The handler calls, each returning one outcome per item it was given.
    running: JoinSet<Vec<Outcome>>,
    pending: HashMap<Id, Pending>,
    /// Batches sent beyond the credits (a server bug): they wait for a free call.
    queued: VecDeque<pb::Batch>,
    /// The cancellation token of every item held (running or queued).
    tokens: HashMap<u64, CancellationToken>,
    /// The window of every streamed item running: parts it may still send.
    windows: HashMap<u64, Arc<Semaphore>>,
    /// Parts a streamed item may send before the server grants more.
    initial_window: u32,
    heartbeat: Duration,
    next_beat: Instant,
    warned_over_credit: bool,
}

impl<H: Handler> Serving<H> {
    /// Runs until drained or stopped with nothing held, or until the stream breaks.
    async fn serve(
        &mut self,
        inbound: &mut tonic::Streaming<pb::ServeEvent>,
        stop: &CancellationToken,
    ) -> Ended {
        let mut phase = Phase::Serving;
        loop {
            if phase != Phase::Serving && self.running.is_empty() && self.queued.is_empty() {
                return Ended::Finished(phase);
            }
            let step = tokio::select! {
                msg = inbound.next() => match msg {
                    Some(Ok(event)) => self.on_event(event, &mut phase).await,
                    Some(Err(status)) => return Ended::Broken(phase, Some(status)),
                    None => return Ended::Broken(phase, None),
                },
                Some(joined) = self.running.join_next_with_id() => self.on_done(joined).await,
                () = tokio::time::sleep_until(self.next_beat) => {
                    self.send(pb::serve_request::Kind::Heartbeat(pb::Heartbeat {})).await
                }
                () = stop.cancelled(), if phase == Phase::Serving => {
                    info!("stopping: answering the batches held, then closing the stream");
                    phase = Phase::Stopping;
                    Ok(())
                }
            };
            if step.is_err() {
                // The call is over: its status is next on the inbound side, if any.
                return Ended::Broken(phase, call_status(inbound).await);
            }
        }
    }

    async fn on_event(&mut self, event: pb::ServeEvent, phase: &mut Phase) -> Result<(), Gone> {
        use pb::serve_event::Kind;
        match event.kind {
            Some(Kind::Batch(batch)) => match phase {
                Phase::Serving => self.receive(batch).await?,
                Phase::Draining(_) => {
                    warn!(
                        batch = batch.batch_id,
                        "a batch after the drain: answered UNAVAILABLE"
                    );
                    let failure = ItemFailure::unavailable("the worker's stream is draining");
                    let results = batch
                        .items
                        .iter()
                        .map(|i| item_result(i.item_id, Err(failure.clone())))
                        .collect();
                    self.answer(batch.batch_id, results).await?;
                }
                // Left unanswered: when the worker closes its side, the server requeues it.
                Phase::Stopping => {
                    debug!(
                        batch = batch.batch_id,
                        "stopping: a new batch left to the server"
                    )
                }
            },
            Some(Kind::Cancel(cancel)) => {
                for id in cancel.item_ids {
                    if let Some(token) = self.tokens.get(&id) {
                        token.cancel();
                    }
                }
            }
            Some(Kind::Drain(drain)) => {
                info!(reason = %drain.reason, "drained by the server: answering the batches held, then closing the stream");
                if *phase == Phase::Serving {
                    *phase = Phase::Draining(drain.reason);
                }
            }
            Some(Kind::Accepted(_)) => warn!("a second ServeAccepted on one stream: ignored"),
            // A window of an item already answered is late, not wrong.
            Some(Kind::Window(window)) => match self.windows.get(&window.item_id) {
                Some(open) => grant(open, window.parts),
                None => debug!(
                    item = window.item_id,
                    "a window for no running item: ignored"
                ),
            },
            None => {}
        }
        Ok(())
    }

    /// Takes a batch: starts it, or queues it when the server sent it beyond the credits.
    async fn receive(&mut self, batch: pb::Batch) -> Result<(), Gone> {
        for item in &batch.items {
            self.tokens.entry(item.item_id).or_default();
        }
        if self.running.len() < self.limits.credits {
            return self.start(batch).await;
        }
        if !self.warned_over_credit {
            warn!(
                credits = self.limits.credits,
                "the server sent a batch beyond the credits: it waits for a free handler call"
            );
            self.warned_over_credit = true;
        }
        self.queued.push_back(batch);
        Ok(())
    }

    /// Starts the handler on a batch's runnable items; answers at once the items it cannot
    /// run (cancelled, past their deadline, malformed), and the whole batch if none is left.
    async fn start(&mut self, batch: pb::Batch) -> Result<(), Gone> {
        let all: Vec<u64> = batch.items.iter().map(|i| i.item_id).collect();
        if let Some(failure) = self.over_limits(&batch) {
            warn!(batch = batch.batch_id, error = %failure.message, "a batch over the offer's limits");
            let results = all.iter().map(|&id| item_result(id, Err(failure.clone())));
            let results = results.collect();
            return self.finish(batch.batch_id, &all, results).await;
        }
        let now = SystemTime::now();
        let streamed = batch.items.iter().any(|i| i.stream);
        let mut answered = Vec::new();
        let mut items = Vec::with_capacity(batch.items.len());
        for item in batch.items {
            let id = item.item_id;
            let token = self.tokens.get(&id).cloned().unwrap_or_default();
            let ready = if token.is_cancelled() {
                Err(cancelled())
            } else if deadline(item.deadline_unix_ms).is_some_and(|d| d <= now) {
                Err(ItemFailure::deadline_exceeded(
                    "the item's deadline passed before it ran",
                ))
            } else {
                Item::from_pb(item, self.limits.accepts, token)
            };
            match ready {
                Ok(item) => items.push(item),
                Err(failure) => answered.push(item_result(id, Err(failure))),
            }
        }
        if items.is_empty() {
            return self.finish(batch.batch_id, &all, answered).await;
        }
        let ran = items.iter().map(|i| i.id).collect();
        let handler = self.handler.clone();
        let task = if self.limits.streaming {
            // over_limits let one item through: the batch is that item.
            let Some(item) = items.pop() else {
                return self.finish(batch.batch_id, &all, answered).await;
            };
            let sink = self.sink(batch.batch_id, batch.version, &item, streamed)?;
            self.running
                .spawn(async move { vec![handler.handle_stream(item, sink).await] })
        } else {
            let typed = Batch {
                id: batch.batch_id,
                version: batch.version,
                items,
            };
            self.running
                .spawn(async move { handler.handle(typed).await })
        };
        self.pending.insert(
            task.id(),
            Pending {
                batch_id: batch.batch_id,
                ran,
                all,
                answered,
            },
        );
        Ok(())
    }

    /// The sink of a streamed item, its window opened at the stream's initial window.
    fn sink(
        &mut self,
        batch_id: u64,
        version: u32,
        item: &Item,
        streamed: bool,
    ) -> Result<PartSink, Gone> {
        let tx = self.tx.clone().ok_or(Gone)?;
        let window = Arc::new(Semaphore::new(0));
        grant(&window, self.initial_window);
        self.windows.insert(item.id, window.clone());
        Ok(PartSink::new(
            tx,
            batch_id,
            item.id,
            version,
            window,
            item.cancellation(),
            streamed,
        ))
    }

    /// Why a batch breaks the offer's limits, if it does.
    fn over_limits(&self, batch: &pb::Batch) -> Option<ItemFailure> {
        let items = batch.items.len();
        if items > self.limits.max_items {
            return Some(ItemFailure::internal(format!(
                "the server sent a batch of {items} items, over the offer's max_batch_items {}",
                self.limits.max_items
            )));
        }
        let bytes: u64 = batch.items.iter().map(input_bytes).sum();
        if self.limits.max_bytes > 0 && bytes > self.limits.max_bytes {
            return Some(ItemFailure::internal(format!(
                "the server sent a batch of {bytes} input bytes, over the offer's max_batch_bytes {}",
                self.limits.max_bytes
            )));
        }
        None
    }

    /// A handler call ended: answers its batch, and starts a queued one.
    async fn on_done(&mut self, joined: Result<(Id, Vec<Outcome>), JoinError>) -> Result<(), Gone> {
        let (id, outcomes) = match joined {
            Ok((id, outcomes)) => (id, Some(outcomes)),
            Err(e) => {
                warn!(error = %e, "a handler call panicked: its items fail with INTERNAL");
                (e.id(), None)
            }
        };
        let Some(pending) = self.pending.remove(&id) else {
            return Ok(());
        };
        let mut results = pending.answered;
        match outcomes {
            Some(outcomes) => {
                if outcomes.len() != pending.ran.len() {
                    warn!(
                        batch = pending.batch_id,
                        items = pending.ran.len(),
                        outcomes = outcomes.len(),
                        "the handler did not return one outcome per item"
                    );
                }
                let mut outcomes = outcomes.into_iter();
                for &item in &pending.ran {
                    let outcome = outcomes.next().unwrap_or_else(|| {
                        Err(ItemFailure::internal(
                            "the worker's handler returned no outcome for this item",
                        ))
                    });
                    results.push(item_result(item, outcome));
                }
            }
            None => {
                let failure = ItemFailure::internal("the worker's handler panicked");
                let ran = pending.ran.iter();
                results.extend(ran.map(|&item| item_result(item, Err(failure.clone()))));
            }
        }
        self.finish(pending.batch_id, &pending.all, results).await?;
        while self.running.len() < self.limits.credits {
            let Some(batch) = self.queued.pop_front() else {
                break;
            };
            self.start(batch).await?;
        }
        Ok(())
    }

    /// Answers a batch: outputs of items cancelled meanwhile are replaced with CANCELLED (the
    /// server discards them anyway), and the items' tokens are dropped.
    async fn finish(
        &mut self,
        batch_id: u64,
        all: &[u64],
        mut results: Vec<pb::ItemResult>,
    ) -> Result<(), Gone> {
        for r in &mut results {
            if self
                .tokens
                .get(&r.item_id)
                .is_some_and(|t| t.is_cancelled())
            {
                *r = item_result(r.item_id, Err(cancelled()));
            }
        }
        for id in all {
            self.tokens.remove(id);
            // A part still waiting for room ends with StreamEnded.
            if let Some(window) = self.windows.remove(id) {
                window.close();
            }
        }
        self.answer(batch_id, results).await
    }

    async fn answer(&mut self, batch_id: u64, results: Vec<pb::ItemResult>) -> Result<(), Gone> {
        self.send(pb::serve_request::Kind::Result(pb::BatchResult {
            batch_id,
            results,
        }))
        .await
    }

    /// Sends a message; the next heartbeat is due one interval later.
    async fn send(&mut self, kind: pb::serve_request::Kind) -> Result<(), Gone> {
        let tx = self.tx.as_ref().ok_or(Gone)?;
        tx.send(pb::ServeRequest { kind: Some(kind) })
            .await
            .map_err(|_| Gone)?;
        self.next_beat = Instant::now() + self.heartbeat;
        Ok(())
    }
}

fn cancelled() -> ItemFailure {
    ItemFailure::cancelled("the server cancelled the item")
}

/// The input bytes of an item, as the offer's max_batch_bytes counts them.
fn input_bytes(item: &pb::Item) -> u64 {
    let bytes = match &item.input {
        Some(pb::item::Input::Text(t)) => t.text.len(),
        Some(pb::item::Input::Tensors(t)) => t.tensors.iter().map(|t| t.data.len()).sum(),
        None => 0,
    };
    u64::try_from(bytes).unwrap_or(u64::MAX)
}
