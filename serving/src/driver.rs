//! The driver: the one task that owns the [`Scheduler`], the items' payloads, the callers
//! waiting for answers and the workers' outbound streams. It is fed by the [`super::Engine`]'s
//! channel and woken at the scheduler's next deadline; after each wake it expires what is due
//! and hands every worker with a credit the batches that close.
//!
//! The scheduler keeps sizes only; the payload of each item (its `pb::Item`, whose tensor data
//! are `Bytes`, so a clone shares them) stays here until its request completes or is
//! cancelled, so that an item can be sent again if its worker is lost.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use modelshare_proto::v1 as pb;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::error::InferError;
use super::kind::Kind;
use super::scheduler::{
    Batch, BatchId, Completed, ItemError, ItemId, NewRequest, RequestId, Scheduler, Tenant,
    WorkerId,
};
use super::types::{
    EngineConfig, InferRequest, InferResponse, ModelServing, ServingSnapshot, StreamEnd,
    StreamError, WorkerInfo, WorkerOffer,
};
use modelshare_core::metrics::Metrics;

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
    Weights {
        weights: HashMap<String, u32>,
    },
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Self::Submit { .. } => "Submit",
            Self::Cancel { .. } => "Cancel",
            Self::OpenWorker { .. } => "OpenWorker",
            Self::Result { .. } => "Result",
            Self::Ended { .. } => "Ended",
            Self::ProtocolError { .. } => "ProtocolError",
            Self::Drain { .. } => "Drain",
            Self::Snapshot { .. } => "Snapshot",
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
}

/// A batch sent to a worker: its items in order, and those failed here instead of being sent
/// (an input kind the worker does not take, or too large for it).
struct SentBatch {
    items: Vec<ItemId>,
    local: HashMap<ItemId, ItemError>,
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

/// The payload bytes of an item (text bytes, or tensor data bytes).
pub(super) fn item_bytes(item: &pb::Item) -> u64 {
    match &item.input {
        Some(pb::item::Input::Text(t)) => t.text.len() as u64,
        Some(pb::item::Input::Tensors(t)) => t.tensors.iter().map(|t| t.data.len() as u64).sum(),
        None => 0,
    }
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
            } => self.submit(ticket, request, arrival, reply),
            Command::Cancel { ticket, why } => self.cancel(ticket, why),
            Command::OpenWorker { id, offer, events } => self.open_worker(id, offer, events),
            Command::Result { id, result } => self.result(id, result),
            Command::Ended { id, end } => self.ended(id, end),
            Command::ProtocolError { id, message } => self.protocol_error(id, message),
            Command::Drain { id, reason } => self.drain(id, &reason),
            Command::Snapshot { reply } => {
                let _ = reply.send(self.snapshot());
            }
            Command::Weights { weights } => self.sched.set_tenant_weights(
                weights
                    .into_iter()
                    .map(|(tenant, weight)| (Some(tenant), weight))
                    .collect(),
            ),
        }
    }

    fn answer_now(&self, request: &InferRequest, reply: Reply, error: InferError) {
        self.metrics
            .inference_requests
            .with_label_values(&[
                request.model.as_str(),
                tenant_label(&request.tenant),
                error.kind().label(),
            ])
            .inc();
        let _ = reply.send(Err(error));
    }

    fn submit(&mut self, ticket: u64, request: InferRequest, arrival: Instant, reply: Reply) {
        if self.shutting_down {
            return self.answer_now(&request, reply, InferError::ShuttingDown);
        }
        if request.items.len() >= MAX_ITEMS_PER_REQUEST {
            let error = InferError::InvalidInput(format!(
                "a request has at most {} inputs",
                MAX_ITEMS_PER_REQUEST - 1
            ));
            return self.answer_now(&request, reply, error);
        }
        if let Some(index) = request.items.iter().position(|i| i.input.is_none()) {
            let error = InferError::InvalidInput(format!("input {index} is empty"));
            return self.answer_now(&request, reply, error);
        }
        if Instant::now() >= request.deadline {
            let error = InferError::DeadlineExceeded {
                model: request.model.clone(),
            };
            return self.answer_now(&request, reply, error);
        }
        let new = NewRequest {
            tenant: request.tenant.clone(),
            model: request.model.clone(),
            item_bytes: request.items.iter().map(item_bytes).collect(),
            deadline: request.deadline,
            arrival,
            quota: request.max_outstanding,
        };
        let id = match self.sched.submit(new) {
            Ok(id) => id,
            Err(refusal) => {
                if let Some(tenant) = request.tenant.as_deref() {
                    self.metrics.quota_denied(tenant, "requests");
                }
                return self.answer_now(&request, reply, InferError::Refused(refusal));
            }
        };
        let deadline_unix_ms = unix_ms(request.deadline);
        let items = request.items.len();
        for (index, mut item) in request.items.into_iter().enumerate() {
            let id = ItemId { request: id, index };
            item.item_id = wire_id(id);
            item.deadline_unix_ms = deadline_unix_ms;
            self.payloads.insert(id, item);
        }
        self.dirty.insert(request.model.clone());
        self.dirty_tenants.insert(request.tenant.clone());
        self.tickets.insert(ticket, id);
        self.waiters.insert(
            id,
            Waiter {
                ticket,
                reply,
                model: request.model,
                tenant: request.tenant,
                items,
                arrival,
            },
        );
    }

    /// Drops a request whose caller stopped waiting (`why`: CANCELLED, or DEADLINE_EXCEEDED
    /// when its deadline passed while its items were in flight), and tells its workers.
    fn cancel(&mut self, ticket: u64, why: Kind) {
        let Some(id) = self.tickets.remove(&ticket) else {
            return;
        };
        let Some(waiter) = self.waiters.remove(&id) else {
            return;
        };
        self.drop_payloads(id, waiter.items);
        self.dirty.insert(waiter.model.clone());
        self.dirty_tenants.insert(waiter.tenant.clone());
        self.count(&waiter, why);
        let in_flight = self.sched.cancel(id).unwrap_or_default();
        let mut by_worker: HashMap<WorkerId, Vec<u64>> = HashMap::new();
        for item in in_flight {
            by_worker
                .entry(item.worker)
                .or_default()
                .push(wire_id(item.item));
        }
        for (worker, item_ids) in by_worker {
            if let Some(conn) = self.conns.get(&worker) {
                let cancel = pb::serve_event::Kind::Cancel(pb::Cancel { item_ids });
                let _ = conn.events.send(Ok(pb::ServeEvent { kind: Some(cancel) }));
            }
        }
        debug!(request = id.0, model = %waiter.model, ?why, "request given up by its caller");
    }

    fn drop_payloads(&mut self, request: RequestId, items: usize) {
        for index in 0..items {
            self.payloads.remove(&ItemId { request, index });
        }
    }

    fn open_worker(&mut self, id: WorkerId, offer: WorkerOffer, events: Events) {
        if self.shutting_down {
            let _ = events.send(Err(StreamError::new(
                Kind::Unavailable,
                "the server is shutting down",
            )));
            return;
        }
        if !self.sched.register_worker(id, offer.spec.clone()) {
            let _ = events.send(Err(StreamError::new(Kind::Internal, "worker id taken")));
            return;
        }
        info!(serve = %offer.serve_id, session = %offer.session_id, model = %offer.spec.model,
              version = offer.spec.version, credits = offer.spec.credits, "worker serving");
        self.dirty.insert(offer.spec.model.clone());
        self.conns.insert(
            id,
            Conn {
                offer,
                events,
                batches: HashMap::new(),
                batches_done: 0,
                draining: false,
            },
        );
    }

    fn ended(&mut self, id: WorkerId, end: StreamEnd) {
        let Some(conn) = self.conns.remove(&id) else {
            return;
        };
        let held: usize = conn.batches.values().map(|b| b.items.len()).sum();
        if held > 0 || end == StreamEnd::Lost {
            warn!(serve = %conn.offer.serve_id, model = %conn.offer.spec.model, items_in_flight = held,
                  ?end, "worker stream ended; its items in flight go back to the queue once");
        } else {
            info!(serve = %conn.offer.serve_id, model = %conn.offer.spec.model, "worker stopped serving");
        }
        self.dirty.insert(conn.offer.spec.model.clone());
        let completed = self.sched.unregister_worker(id);
        self.finish_all(completed);
    }

    fn drain(&mut self, id: WorkerId, reason: &str) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        if conn.draining {
            return;
        }
        conn.draining = true;
        self.sched.set_credits(id, 0);
        let drain = pb::serve_event::Kind::Drain(pb::Drain {
            reason: reason.to_owned(),
        });
        let _ = conn.events.send(Ok(pb::ServeEvent { kind: Some(drain) }));
        info!(serve = %conn.offer.serve_id, %reason, "worker told to drain");
    }

    fn begin_shutdown(&mut self) {
        self.shutting_down = true;
        let ids: Vec<WorkerId> = self.conns.keys().copied().collect();
        for id in ids {
            self.drain(id, "the server is shutting down");
        }
        let completed = self.sched.fail_all_queued(&ItemError::ShuttingDown);
        self.finish_all(completed);
    }

    /// Ends the stream of a worker that held cancelled items past their request's deadline
    /// plus the grace without answering them: the tenant's share they held is given back, and
    /// the metric counts it. Its other items go back to the queue once.
    fn overran(&mut self, id: WorkerId) {
        if let Some(conn) = self.conns.get(&id) {
            let model = conn.offer.spec.model.clone();
            warn!(serve = %conn.offer.serve_id, %model,
                  "worker held cancelled items past their deadline and the grace; its stream is ended");
            self.metrics
                .cancel_overruns
                .with_label_values(&[model.as_str()])
                .inc();
            let _ = conn.events.send(Err(StreamError::new(
                Kind::DeadlineExceeded,
                "cancelled items were neither answered nor acknowledged within their deadline and the grace; this Serve stream is ended",
            )));
        }
        self.ended(id, StreamEnd::Lost);
    }

    /// Ends a worker's stream for breaking the protocol; its items go back to the queue.
    fn protocol_error(&mut self, id: WorkerId, message: String) {
        if let Some(conn) = self.conns.get(&id) {
            warn!(serve = %conn.offer.serve_id, %message, "worker broke the Serve protocol");
            let _ = conn
                .events
                .send(Err(StreamError::new(Kind::InvalidArgument, message)));
        }
        self.ended(id, StreamEnd::Lost);
    }

    fn result(&mut self, id: WorkerId, result: pb::BatchResult) {
        let Some(conn) = self.conns.get_mut(&id) else {
            return;
        };
        let batch_id = BatchId(result.batch_id);
        let Some(sent) = conn.batches.remove(&batch_id) else {
            let message = format!(
                "a result for batch {}, which this stream does not hold (unknown, or answered already)",
                result.batch_id
            );
            return self.protocol_error(id, message);
        };
        conn.batches_done += 1;
        let mut given: HashMap<u64, pb::item_result::Outcome> = HashMap::new();
        for r in result.results {
            if let Some(outcome) = r.outcome {
                given.insert(r.item_id, outcome);
            }
        }
        let results: Vec<Result<pb::ItemOutput, ItemError>> =
            sent.items
                .iter()
                .map(|item| {
                    if let Some(error) = sent.local.get(item) {
                        return Err(error.clone());
                    }
                    match given.remove(&wire_id(*item)) {
                        Some(pb::item_result::Outcome::Output(output)) => Ok(output),
                        Some(pb::item_result::Outcome::Error(e)) if e.code != 0 => {
                            Err(ItemError::Worker {
                                code: e.code,
                                message: e.message,
                            })
                        }
                        Some(pb::item_result::Outcome::Error(e)) => Err(ItemError::Failed(
                            format!("the worker failed the item with code OK: {}", e.message),
                        )),
                        None => Err(ItemError::Failed(
                            "the worker's result for the batch did not include this item".into(),
                        )),
                    }
                })
                .collect();
        let completed = self.sched.complete(id, batch_id, results);
        self.finish_all(completed);
    }

    /// Hands every worker with a credit the batches that close now, and expires what is due.
    fn pump(&mut self, now: Instant) {
        let expired = self.sched.expire_deadlines(now);
        self.finish_all(expired);
        for id in self.sched.overdue_workers(now) {
            self.overran(id);
        }
        let no_worker = self
            .sched
            .expire_without_workers(now, self.config.no_worker_wait);
        self.finish_all(no_worker);
        self.retry_at = None;
        // Newest versions first, so that a worker of an older one takes only the overflow.
        let mut ids: Vec<(u32, WorkerId)> = self
            .conns
            .iter()
            .map(|(id, c)| (c.offer.spec.version, *id))
            .collect();
        ids.sort_by(|a, b| b.cmp(a));
        for (_, id) in ids {
            loop {
                let dispatch = self.sched.next_batch(id, now);
                self.finish_all(dispatch.expired);
                if let Some(at) = dispatch.retry_at {
                    self.retry_at = Some(self.retry_at.map_or(at, |r| r.min(at)));
                }
                match dispatch.batch {
                    Some(batch) => self.send_batch(batch, now),
                    None => break,
                }
            }
        }
    }

    fn send_batch(&mut self, batch: Batch, now: Instant) {
        let Some(conn) = self.conns.get_mut(&batch.worker) else {
            return;
        };
        let metrics = &self.metrics;
        metrics
            .inference_batch_items
            .with_label_values(&[batch.model.as_str()])
            .observe(batch.items.len() as f64);
        self.dirty.insert(batch.model.clone());
        let max_bytes = conn.offer.spec.max_bytes;
        let mut local = HashMap::new();
        let mut items = Vec::with_capacity(batch.items.len());
        for item in &batch.items {
            let Some(payload) = self.payloads.get(&item.id) else {
                local.insert(
                    item.id,
                    ItemError::Failed("the item's input is gone".into()),
                );
                continue;
            };
            if let Some(waiter) = self.waiters.get(&item.id.request) {
                metrics
                    .inference_queue_seconds
                    .with_label_values(&[batch.model.as_str()])
                    .observe(now.saturating_duration_since(waiter.arrival).as_secs_f64());
            }
            let text = matches!(payload.input, Some(pb::item::Input::Text(_)));
            let refusal = if text && !conn.offer.accepts_text {
                Some(format!(
                    "the workers of model '{}' take tensor inputs, not text",
                    batch.model
                ))
            } else if !text && !conn.offer.accepts_tensors {
                Some(format!(
                    "the workers of model '{}' take text inputs, not tensors",
                    batch.model
                ))
            } else if item.bytes > max_bytes {
                Some(format!(
                    "an input of {} bytes is larger than the {} bytes a worker of model '{}' takes at once",
                    item.bytes, max_bytes, batch.model
                ))
            } else {
                None
            };
            match refusal {
                Some(message) => {
                    local.insert(
                        item.id,
                        ItemError::Worker {
                            code: Kind::InvalidArgument.number(),
                            message,
                        },
                    );
                }
                None => items.push(payload.clone()),
            }
        }
        let sent = SentBatch {
            items: batch.items.iter().map(|i| i.id).collect(),
            local,
        };
        if items.is_empty() {
            // Nothing to send: answer the batch here, which returns its credit.
            let results: Vec<Result<pb::ItemOutput, ItemError>> = sent
                .items
                .iter()
                .map(|id| {
                    Err(sent
                        .local
                        .get(id)
                        .cloned()
                        .unwrap_or(ItemError::Failed("not sent".into())))
                })
                .collect();
            let completed = self.sched.complete(batch.worker, batch.id, results);
            self.finish_all(completed);
            return;
        }
        let event = pb::ServeEvent {
            kind: Some(pb::serve_event::Kind::Batch(pb::Batch {
                batch_id: batch.id.0,
                version: batch.version,
                items,
            })),
        };
        conn.batches.insert(batch.id, sent);
        if conn.events.send(Ok(event)).is_err() {
            // The stream is gone; its handler will say so too.
            self.ended(batch.worker, StreamEnd::Lost);
        }
    }

    fn finish_all(&mut self, completed: Vec<Completed<pb::ItemOutput>>) {
        for c in completed {
            self.finish(c);
        }
    }

    fn count(&self, waiter: &Waiter, code: Kind) {
        let model = waiter.model.as_str();
        self.metrics
            .inference_requests
            .with_label_values(&[model, tenant_label(&waiter.tenant), code.label()])
            .inc();
        self.metrics
            .inference_seconds
            .with_label_values(&[model])
            .observe(waiter.arrival.elapsed().as_secs_f64());
    }

    fn finish(&mut self, completed: Completed<pb::ItemOutput>) {
        let Some(waiter) = self.waiters.remove(&completed.id) else {
            return;
        };
        self.tickets.remove(&waiter.ticket);
        self.drop_payloads(completed.id, waiter.items);
        self.dirty.insert(waiter.model.clone());
        self.dirty_tenants.insert(waiter.tenant.clone());
        let model = completed.model;
        let mut outputs = Vec::with_capacity(completed.outcomes.len());
        let mut versions = Vec::with_capacity(completed.outcomes.len());
        let mut failure = None;
        for (index, outcome) in completed.outcomes.into_iter().enumerate() {
            match outcome.result {
                Ok(output) => {
                    outputs.push(output);
                    versions.push(outcome.version.unwrap_or(0));
                }
                Err(error) => {
                    failure = Some(self.infer_error(&model, index, error, waiter.arrival));
                    break;
                }
            }
        }
        let result = match failure {
            Some(error) => Err(error),
            None => Ok(InferResponse {
                model,
                versions,
                outputs,
            }),
        };
        let code = result.as_ref().map_or_else(InferError::kind, |_| Kind::Ok);
        self.count(&waiter, code);
        let _ = waiter.reply.send(result);
    }

    fn infer_error(
        &self,
        model: &str,
        index: usize,
        error: ItemError,
        arrival: Instant,
    ) -> InferError {
        let model = model.to_owned();
        match error {
            ItemError::DeadlineExceeded => InferError::DeadlineExceeded { model },
            ItemError::Unavailable => InferError::WorkersLost { model },
            ItemError::NoWorker => InferError::NoWorker {
                model,
                waited: arrival.elapsed(),
            },
            ItemError::ShuttingDown => InferError::ShuttingDown,
            ItemError::Failed(message) => InferError::Item {
                index,
                code: Kind::Internal,
                message,
            },
            ItemError::Worker { code, message } => InferError::Item {
                index,
                code: Kind::from_number(code),
                message,
            },
        }
    }

    fn refresh_gauges(&mut self) {
        for model in std::mem::take(&mut self.dirty) {
            let depth = i64::try_from(self.sched.queue_depth(&model)).unwrap_or(i64::MAX);
            let workers = i64::try_from(self.sched.serving_workers(&model)).unwrap_or(i64::MAX);
            let m = &self.metrics;
            m.inference_queue_items
                .with_label_values(&[model.as_str()])
                .set(depth);
            m.serving_workers
                .with_label_values(&[model.as_str()])
                .set(workers);
        }
        self.dirty_tenants.extend(self.sched.take_settled_tenants());
        for tenant in std::mem::take(&mut self.dirty_tenants) {
            let n = self.sched.outstanding_for_tenant(&tenant);
            self.metrics
                .inference_outstanding
                .with_label_values(&[tenant_label(&tenant)])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    fn snapshot(&self) -> ServingSnapshot {
        let mut workers: Vec<WorkerInfo> = self
            .conns
            .iter()
            .map(|(id, c)| WorkerInfo {
                serve_id: c.offer.serve_id.clone(),
                session_id: c.offer.session_id.clone(),
                tenant: c.offer.tenant.clone(),
                model: c.offer.spec.model.clone(),
                version: c.offer.spec.version,
                credits: c.offer.spec.credits,
                batches_in_flight: c.batches.len(),
                items_in_flight: self.sched.in_flight(*id).unwrap_or(0),
                batches_done: c.batches_done,
                draining: c.draining,
                serves: c.offer.spec.serves.clone(),
            })
            .collect();
        workers.sort_by(|a, b| a.serve_id.cmp(&b.serve_id));
        let mut names: BTreeSet<String> = self.waiters.values().map(|w| w.model.clone()).collect();
        names.extend(self.conns.values().map(|c| c.offer.spec.model.clone()));
        let models = names
            .into_iter()
            .map(|model| {
                let mut conns: Vec<&Conn> = self
                    .conns
                    .values()
                    .filter(|c| c.offer.spec.model == model)
                    .collect();
                conns.sort_by_key(|c| std::cmp::Reverse(c.offer.spec.version));
                let mut versions: Vec<u32> = conns.iter().map(|c| c.offer.spec.version).collect();
                versions.dedup();
                let newest = conns.first();
                ModelServing {
                    queued_items: self.sched.queue_depth(&model),
                    workers: conns.len(),
                    versions,
                    inputs: newest.map(|c| c.offer.inputs.clone()).unwrap_or_default(),
                    outputs: newest.map(|c| c.offer.outputs.clone()).unwrap_or_default(),
                    model,
                }
            })
            .collect();
        // Cancelled requests whose items a worker still holds count too (no waiter is left).
        let tenants: BTreeSet<Tenant> = self.sched.counted_tenants().into_iter().collect();
        ServingSnapshot {
            workers,
            models,
            tenants: tenants
                .into_iter()
                .map(|t| {
                    let n = self.sched.outstanding_for_tenant(&t);
                    (t, n)
                })
                .collect(),
            outstanding: self.sched.outstanding(),
            drained: self.sched.is_drained() && self.payloads.is_empty() && self.waiters.is_empty(),
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
