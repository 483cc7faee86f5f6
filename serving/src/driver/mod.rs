//! The driver: the one task that owns the [`Scheduler`], the items' payloads, the callers
//! waiting for answers and the workers' outbound streams. It is fed by the [`super::Engine`]'s
//! channel and woken at the scheduler's next deadline; after each wake it expires what is due
//! and hands every worker with a credit the batches that close.
//!
//! The scheduler keeps sizes only; the payload of each item (its `pb::Item`, whose tensor data
//! are `Bytes`, so a clone shares them) stays here until its request completes or is
//! cancelled, so that an item can be sent again if its worker is lost.
//!
//! This file holds the driver's state, its mailboxes and its loop; its handling is split by
//! whom it concerns: `requests` (callers: submit, cancel, finish), `workers` (Serve streams:
//! open, end, drain, results, and the batches sent), `report` (gauges, the snapshot).

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use modelshare_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::error::InferError;
use super::kind::Kind;
use super::queue::generation_cost;
use super::scheduler::{
    Batch, BatchId, Completed, ItemError, ItemId, NewRequest, RequestId, Scheduler, Tenant,
    WorkerId,
};
use super::stats::{Stats, VersionStats};
use super::types::{
    EngineConfig, InferRequest, InferResponse, ModelServing, Part, ServingSnapshot, StreamEnd,
    StreamError, WorkerInfo, WorkerOffer,
};
use modelshare_core::metrics::Metrics;

mod gpus;
mod inputs;
mod report;
mod requests;
mod streams;
mod workers;

/// Statistics by model, then version (`Engine::stats`).
pub(super) type ModelStats = Vec<(String, Vec<VersionStats>)>;

/// Bits of a wire item id that hold the item's place in its request; the rest is the request.
const INDEX_BITS: u32 = 24;
/// Most items one request may have (its index must fit [`INDEX_BITS`]).
pub(super) const MAX_ITEMS_PER_REQUEST: usize = 1 << INDEX_BITS;

type Reply = oneshot::Sender<Result<InferResponse, InferError>>;
type Events = mpsc::UnboundedSender<Result<pb::ServeEvent, StreamError>>;

/// What the engine asks of the driver.
pub(super) enum Command {
    Submit {
        ticket: u64,
        request: InferRequest,
        arrival: Instant,
        reply: Reply,
        /// For a streamed item: where its parts go (bounded: the stream's window).
        parts: Option<mpsc::Sender<Part>>,
    },
    /// A worker sent part of a streamed item's answer.
    Part {
        id: WorkerId,
        part: pb::ItemPart,
    },
    /// The caller of `ticket` took one part of its stream: the worker may send one more.
    Took {
        ticket: u64,
    },
    Cancel {
        ticket: u64,
        why: Kind,
    },
    OpenWorker {
        id: WorkerId,
        offer: WorkerOffer,
        events: Events,
    },
    Result {
        id: WorkerId,
        result: pb::BatchResult,
    },
    Ended {
        id: WorkerId,
        end: StreamEnd,
    },
    ProtocolError {
        id: WorkerId,
        message: String,
    },
    Drain {
        id: WorkerId,
        reason: String,
    },
    Snapshot {
        reply: oneshot::Sender<ServingSnapshot>,
    },
    Stats {
        model: Option<String>,
        reply: oneshot::Sender<ModelStats>,
    },
    Weights {
        weights: HashMap<String, u32>,
    },
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Self::Submit { .. } => "Submit",
            Self::Part { .. } => "Part",
            Self::Took { .. } => "Took",
            Self::Cancel { .. } => "Cancel",
            Self::OpenWorker { .. } => "OpenWorker",
            Self::Result { .. } => "Result",
            Self::Ended { .. } => "Ended",
            Self::ProtocolError { .. } => "ProtocolError",
            Self::Drain { .. } => "Drain",
            Self::Snapshot { .. } => "Snapshot",
            Self::Stats { .. } => "Stats",
            Self::Weights { .. } => "Weights",
        };
        f.write_str(name)
    }
}

/// A caller waiting for its request.
struct Waiter {
    ticket: u64,
    reply: Reply,
    model: String,
    tenant: Tenant,
    items: usize,
    arrival: Instant,
    /// The request's `text_input`.
    text_input: Option<String>,
    /// A streamed request (one item): where its parts go, and the worker and wire item id
    /// streaming it once its first part came.
    parts: Option<mpsc::Sender<Part>>,
    streaming: Option<(WorkerId, u64)>,
    /// When its last part came (for the part-interval metric).
    last_part: Option<Instant>,
    /// What its item cost its tenant in the fair queue (a generation: its `max_tokens`).
    cost: u64,
    /// Parts forwarded (a streamed item's tokens, as near as the server can count them).
    parts_sent: u64,
}

/// A batch sent to a worker: its items in order, and those failed here instead of being sent
/// (an input kind the worker does not take, or too large for it).
struct SentBatch {
    items: Vec<ItemId>,
    local: HashMap<ItemId, ItemError>,
    sent_at: Instant,
}

/// A registered Serve stream.
struct Conn {
    offer: WorkerOffer,
    events: Events,
    batches: HashMap<BatchId, SentBatch>,
    batches_done: u64,
    draining: bool,
}

struct Driver {
    config: EngineConfig,
    metrics: Arc<Metrics>,
    sched: Scheduler<pb::ItemOutput>,
    payloads: HashMap<ItemId, pb::Item>,
    waiters: HashMap<RequestId, Waiter>,
    tickets: HashMap<u64, RequestId>,
    conns: HashMap<WorkerId, Conn>,
    /// When a batch that did not close yet will (the earliest `retry_at` of the last pump).
    retry_at: Option<Instant>,
    /// Models whose gauges changed since the last refresh.
    dirty: BTreeSet<String>,
    /// Tenants whose outstanding count changed since the last refresh.
    dirty_tenants: BTreeSet<Tenant>,
    shutting_down: bool,
    stats: Stats,
    /// How each GPU with workers is shared now, by its name (a lease's device).
    gpus: HashMap<String, gpus::Turns>,
}

/// Runs the driver until every engine handle is gone.
pub(super) async fn run(
    config: EngineConfig,
    metrics: Arc<Metrics>,
    mut work: mpsc::Receiver<Command>,
    mut rx: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
) {
    let mut d = Driver::new(config, metrics);
    loop {
        let wake = d.next_wake();
        tokio::select! {
            biased;
            Some(command) = rx.recv() => {
                d.handle(command);
                d.take_waiting(&mut work, &mut rx);
            }
            command = work.recv() => {
                let Some(command) = command else { break };
                d.handle(command);
                d.take_waiting(&mut work, &mut rx);
            }
            () = shutdown.cancelled(), if !d.shutting_down => d.begin_shutdown(),
            () = sleep_until(wake) => {}
        }
        d.pump(Instant::now());
        d.refresh_gauges();
    }
    debug!("request path driver stopped");
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// An item's id on the wire: request and index packed into one number.
fn wire_id(item: ItemId) -> u64 {
    (item.request.0 << INDEX_BITS) | item.index as u64
}

#[cfg(test)]
fn from_wire(id: u64) -> ItemId {
    ItemId {
        request: RequestId(id >> INDEX_BITS),
        index: usize::try_from(id & ((1 << INDEX_BITS) - 1)).unwrap_or(usize::MAX),
    }
}

/// Milliseconds since the Unix epoch at `deadline` (0 when it cannot be told).
fn unix_ms(deadline: Instant) -> i64 {
    let left = deadline.saturating_duration_since(Instant::now());
    SystemTime::now()
        .checked_add(left)
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_millis()).ok())
        .unwrap_or(0)
}

/// Now, in milliseconds since the Unix epoch.
fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The payload bytes of an item (text bytes, or tensor data bytes).
pub(super) fn item_bytes(item: &pb::Item) -> u64 {
    let input = match &item.input {
        Some(pb::item::Input::Text(t)) => t.text.len() as u64,
        Some(pb::item::Input::Tensors(t)) => t.tensors.iter().map(|t| t.data.len() as u64).sum(),
        None => 0,
    };
    // The request's id and trace context vary in length: they count with the payload, not in
    // the fixed per-item envelope (`modelshare_proto::limits::BATCH_ENVELOPE_BYTES`).
    input + (item.request_id.len() + item.traceparent.len()) as u64
}

fn tenant_label(tenant: &Tenant) -> &str {
    tenant
        .as_deref()
        .unwrap_or(modelshare_core::metrics::ADMIN_TENANT)
}

impl Driver {
    fn new(config: EngineConfig, metrics: Arc<Metrics>) -> Self {
        let mut sched = Scheduler::new(config.limits.clone());
        for (model, delay) in &config.queue_delays {
            sched.set_queue_delay(model, *delay);
        }
        for (tenant, weight) in &config.tenant_weights {
            sched.set_tenant_weight(Some(tenant.clone()), *weight);
        }
        Self {
            config,
            metrics,
            sched,
            payloads: HashMap::new(),
            waiters: HashMap::new(),
            tickets: HashMap::new(),
            conns: HashMap::new(),
            retry_at: None,
            dirty: BTreeSet::new(),
            dirty_tenants: BTreeSet::new(),
            shutting_down: false,
            stats: Stats::default(),
            gpus: HashMap::new(),
        }
    }

    /// Takes what else is waiting before pumping, what releases state first: a burst becomes
    /// one pass. At most one mailbox's worth of new work is taken.
    fn take_waiting(
        &mut self,
        work: &mut mpsc::Receiver<Command>,
        rx: &mut mpsc::UnboundedReceiver<Command>,
    ) {
        while let Ok(command) = rx.try_recv() {
            self.handle(command);
        }
        for _ in 0..work.max_capacity() {
            let Ok(command) = work.try_recv() else { break };
            self.handle(command);
        }
    }

    fn next_wake(&self) -> Option<Instant> {
        [
            self.retry_at,
            self.sched.next_deadline(),
            self.sched.next_no_worker_expiry(self.config.no_worker_wait),
            self.sched.next_cancel_due(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn handle(&mut self, command: Command) {
        match command {
            Command::Submit {
                ticket,
                request,
                arrival,
                reply,
                parts,
            } => self.submit(ticket, request, arrival, reply, parts),
            Command::Part { id, part } => self.part(id, part),
            Command::Took { ticket } => self.took(ticket),
            Command::Cancel { ticket, why } => self.cancel(ticket, why),
            Command::OpenWorker { id, offer, events } => self.open_worker(id, offer, events),
            Command::Result { id, result } => self.result(id, result),
            Command::Ended { id, end } => self.ended(id, end),
            Command::ProtocolError { id, message } => self.protocol_error(id, message),
            Command::Drain { id, reason } => self.drain(id, &reason),
            Command::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Command::Stats { model, reply } => {
                let _ = reply.send(self.stats.of(model.as_deref()));
            }
            Command::Weights { weights } => self.sched.set_tenant_weights(
                weights
                    .into_iter()
                    .map(|(tenant, weight)| (Some(tenant), weight))
                    .collect(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_ids_round_trip() {
        for (request, index) in [(1, 0), (7, 3), (1 << 30, MAX_ITEMS_PER_REQUEST - 1)] {
            let id = ItemId {
                request: RequestId(request),
                index,
            };
            assert_eq!(from_wire(wire_id(id)), id);
        }
    }
}
