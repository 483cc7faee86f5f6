//! The request path's scheduler: admission, per-tenant fair queues, batching and dispatch to
//! worker streams, and the reassembly of results. Pure and synchronous: no I/O, no clock (every
//! call that depends on time takes `now`), no lock. The driver task (`super::driver`) owns it.
//!
//! [`Scheduler`] is the facade over `ids`, `request`, `queue` and `batch` (siblings of this
//! file), and [`Admission`] its one refusal type; every public type of those files is
//! re-exported here. Imports go one way: `ids` ← `request`, `queue` ← `batch` ← this file, and
//! `rate` ← this file. What time alone does (deadlines, the no-worker wait, cancels past their
//! grace) is in its child `expiry`; admission by expected wait in its child `wait`.
//!
//! # The path of a request
//! [`Scheduler::submit`] admits it (or refuses at once, changing nothing) and queues its items
//! under its tenant. [`Scheduler::next_batch`], asked for a worker with a credit left, cuts a
//! batch at once when the worker is idle (no batch in flight), else when enough items or bytes
//! wait or the oldest has waited the model's queue delay (work piles up: let it batch); it
//! fails items whose deadline has passed instead of sending them. [`Scheduler::complete`]
//! records the worker's results and returns the requests that are now complete. A worker that
//! goes away ([`Scheduler::unregister_worker`]) has its items requeued once; an item that loses
//! a second worker fails with [`ItemError::Unavailable`], and one whose worker had begun to
//! stream its answer ([`Scheduler::started`]) with [`ItemError::Interrupted`].
//!
//! # Versions
//! A worker of an older version of a model gets no batch while a worker of the model's newest
//! registered version has a credit left: old workers take only the overflow. The caller should
//! ask every idle worker again when a credit is returned or items are queued.
//!
//! # Limits of this version
//! Deadline expiry and [`Scheduler::next_deadline`] scan the queued items (queues are bounded by
//! [`Limits::max_queue_items`]); a batch stops at the first item of the round that would pass
//! its byte limit rather than looking further for smaller ones.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::batch::{self, Backlog, Closing, Worker};
pub use super::batch::{Batch, BatchItem, WorkerSpec};
pub use super::ids::{BatchId, ItemId, RequestId, Serves, Tenant, WorkerId};
use super::queue::{Cut, ModelQueue, QueuedItem};
use super::rate::Rate;
use super::request::Requests;
pub use super::request::{Completed, InFlightItem, ItemError, NewRequest, Outcome};

mod expiry;
mod wait;

/// Limits and defaults of a [`Scheduler`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Most items queued (not in flight) per model.
    pub max_queue_items: usize,
    /// Most requests a named tenant may have outstanding (queued or in flight), over all
    /// models; the admin (`None`) has no quota.
    pub max_tenant_requests: usize,
    /// How long the oldest item of a model may wait for a batch to fill while the worker asking
    /// has a batch in flight, unless the model has its own ([`Scheduler::set_queue_delay`]); an
    /// idle worker takes what is queued at once.
    pub max_queue_delay: Duration,
    /// Items a weight-1 tenant may take per turn of the round robin (0 is taken as 1).
    pub quantum: u32,
    /// How long past a cancelled request's deadline its workers may take to answer or
    /// acknowledge the cancel (it counts in its tenant's share until then); past it, their
    /// streams are ended ([`Scheduler::overdue_workers`]).
    pub cancel_grace: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_queue_items: 4096,
            max_tenant_requests: 256,
            max_queue_delay: Duration::from_millis(1),
            quantum: 1,
            cancel_grace: Duration::from_secs(5),
        }
    }
}

/// Why a request was refused at submission. Nothing was queued or counted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Admission {
    /// The model's queue would hold more than its limit of items.
    #[error("model '{model}' queues at most {limit} items; this request would pass that")]
    QueueFull {
        /// The model.
        model: String,
        /// Its limit, in items.
        limit: usize,
    },
    /// The tenant already has its limit of requests outstanding.
    #[error("tenant '{tenant}' may have at most {limit} requests outstanding")]
    TenantQuota {
        /// The tenant.
        tenant: String,
        /// Its limit, in requests.
        limit: usize,
    },
    /// The request alone has more items than the model's queue holds: it can never pass.
    #[error(
        "the request has {items} items but model '{model}' queues at most {limit} (max_queue_items); split it"
    )]
    TooLarge {
        /// The model.
        model: String,
        /// The request's items.
        items: usize,
        /// The queue's limit, in items.
        limit: usize,
    },
    /// The request has no items.
    #[error("request for model '{model}' has no items")]
    NoItems {
        /// The model.
        model: String,
    },
    /// The request would wait longer than its deadline: the work ahead of it over the model's
    /// measured rate at the tenant's fair share.
    #[error(
        "model '{model}' is overloaded: this request would wait about {:.1} s for its turn, longer than its deadline allows ({:.1} s); retry in {} s", wait.as_secs_f64(), deadline.as_secs_f64(), retry_after.as_secs()
    )]
    Overloaded {
        /// The model.
        model: String,
        /// The expected wait.
        wait: Duration,
        /// The time the request had.
        deadline: Duration,
        /// About how long until the model's queue drains.
        retry_after: Duration,
    },
}

/// What [`Scheduler::next_batch`] did.
#[derive(Debug, PartialEq, Eq)]
#[must_use]
pub struct Dispatch<O = Vec<u8>> {
    /// The batch for the worker, if one closed.
    pub batch: Option<Batch>,
    /// Requests completed because items of theirs passed their deadline while queued.
    pub expired: Vec<Completed<O>>,
    /// When no batch closed because the queue is short and young: when to ask again.
    pub retry_at: Option<Instant>,
}

impl<O> Default for Dispatch<O> {
    fn default() -> Self {
        Self {
            batch: None,
            expired: Vec::new(),
            retry_at: None,
        }
    }
}

/// The scheduler: every model's queue, the outstanding requests and the workers. `O` is the
/// type of a worker's output for one item.
#[derive(Debug)]
pub struct Scheduler<O = Vec<u8>> {
    limits: Limits,
    delays: HashMap<String, Duration>,
    weights: HashMap<Tenant, u32>,
    queues: HashMap<String, ModelQueue>,
    requests: Requests<O>,
    workers: BTreeMap<WorkerId, Worker>,
    /// Each model's measured service rate.
    rates: HashMap<String, Rate>,
    next_batch_id: u64,
}

impl<O> Scheduler<O> {
    /// An empty scheduler with `limits`.
    pub fn new(limits: Limits) -> Self {
        Self {
            limits,
            delays: HashMap::new(),
            weights: HashMap::new(),
            queues: HashMap::new(),
            requests: Requests::default(),
            workers: BTreeMap::new(),
            rates: HashMap::new(),
            next_batch_id: 0,
        }
    }

    /// Sets a model's queue delay (the default is [`Limits::max_queue_delay`]). Model names
    /// are unique without regard to case: so are these keys.
    pub fn set_queue_delay(&mut self, model: &str, delay: Duration) {
        self.delays.insert(model.to_ascii_lowercase(), delay);
    }

    /// Sets a tenant's weight in the round robin (the default is 1; 0 is taken as 1).
    pub fn set_tenant_weight(&mut self, tenant: Tenant, weight: u32) {
        self.weights.insert(tenant, weight.max(1));
    }

    /// Replaces every tenant's weight (tenants not named get the default, 1).
    pub fn set_tenant_weights(&mut self, weights: HashMap<Tenant, u32>) {
        self.weights = weights.into_iter().map(|(t, w)| (t, w.max(1))).collect();
    }

    fn queue_delay(&self, model: &str) -> Duration {
        let delay = if model.bytes().any(|b| b.is_ascii_uppercase()) {
            self.delays.get(&model.to_ascii_lowercase())
        } else {
            self.delays.get(model)
        };
        delay.copied().unwrap_or(self.limits.max_queue_delay)
    }

    /// Gives `tokens` back to `tenant`'s share of `model`'s queue: what a generation was
    /// charged at dispatch and did not generate (see `queue`).
    pub fn refund(&mut self, model: &str, tenant: &Tenant, tokens: u64) {
        if let Some(queue) = self.queues.get_mut(model) {
            queue.refund(tenant, tokens);
        }
    }

    /// Admits a request and queues its items, or refuses it with nothing changed.
    pub fn submit(&mut self, request: NewRequest) -> Result<RequestId, Admission> {
        let NewRequest {
            tenant,
            model,
            item_bytes,
            deadline,
            arrival,
            quota,
            cost,
        } = request;
        if item_bytes.is_empty() {
            return Err(Admission::NoItems { model });
        }
        let queued = self.queues.get(&model).map_or(0, ModelQueue::len);
        let limit = self.limits.max_queue_items;
        if item_bytes.len() > limit {
            let items = item_bytes.len();
            return Err(Admission::TooLarge {
                model,
                items,
                limit,
            });
        }
        if queued.saturating_add(item_bytes.len()) > limit {
            return Err(Admission::QueueFull { model, limit });
        }
        if let Some(name) = &tenant {
            let limit = quota.unwrap_or(self.limits.max_tenant_requests);
            if self.requests.outstanding(&tenant) >= limit {
                return Err(Admission::TenantQuota {
                    tenant: name.clone(),
                    limit,
                });
            }
        }
        self.check_wait(&model, &tenant, item_bytes.len(), arrival, deadline)?;
        let id = self
            .requests
            .insert(tenant.clone(), model.clone(), item_bytes.len(), deadline);
        let queue = self.queues.entry(model).or_default();
        for (index, bytes) in item_bytes.into_iter().enumerate() {
            let item = QueuedItem {
                id: ItemId { request: id, index },
                bytes,
                arrival,
                deadline,
                requeued: false,
                started: false,
                cost: cost.max(1),
            };
            queue.push_back(&tenant, item);
        }
        Ok(id)
    }

    /// Registers a worker stream. Returns false, changing nothing, if the id is taken.
    #[must_use]
    pub fn register_worker(&mut self, id: WorkerId, spec: WorkerSpec) -> bool {
        if self.workers.contains_key(&id) {
            return false;
        }
        self.workers.insert(id, Worker::new(spec));
        true
    }

    /// Changes how many batches a worker may hold (0: it gets no more, e.g. while it drains).
    pub fn set_credits(&mut self, id: WorkerId, credits: u32) {
        if let Some(worker) = self.workers.get_mut(&id) {
            worker.spec.credits = credits;
        }
    }

    /// Removes a worker that left or was lost. Its items in flight go back to the front of
    /// their tenants' queues, once, their cost given back to their tenants' deficits (they are
    /// charged again when dispatched again): an item already requeued fails with
    /// [`ItemError::Unavailable`], and a started one (part of its answer sent,
    /// [`Scheduler::started`]) with [`ItemError::Interrupted`]. Returns the requests that this
    /// completed.
    pub fn unregister_worker(&mut self, id: WorkerId) -> Vec<Completed<O>> {
        let Some(worker) = self.workers.remove(&id) else {
            return Vec::new();
        };
        let mut completed = Vec::new();
        let mut requeue: Vec<(Tenant, QueuedItem)> = Vec::new();
        for item in worker.in_flight.into_values().flatten() {
            let Some(tenant) = self.requests.tenant_of(item.id.request).cloned() else {
                // Cancelled while in flight: its worker is gone, so it is answered.
                self.requests.settle(item.id);
                continue;
            };
            if item.started {
                // Its caller has parts of an answer: another worker's would not continue it.
                let outcome = Outcome::failed(ItemError::Interrupted);
                completed.extend(self.requests.finish(item.id, outcome));
            } else if item.requeued {
                let outcome = Outcome::failed(ItemError::Unavailable);
                completed.extend(self.requests.finish(item.id, outcome));
            } else {
                requeue.push((tenant, item));
            }
        }
        if !requeue.is_empty() {
            let queue = self.queues.entry(worker.spec.model).or_default();
            // In reverse, so that each tenant's items keep their order at the front.
            for (tenant, mut item) in requeue.into_iter().rev() {
                item.requeued = true;
                self.requests.set_queued(item.id);
                // It was charged when dispatched and will be again: what it cost comes back.
                let cost = item.cost;
                queue.push_front(&tenant, item);
                queue.refund(&tenant, cost);
            }
        }
        completed
    }

    /// Marks an item of a worker's batch as started: the worker sent a part of its answer
    /// (a streamed item), so losing the worker now fails the item instead of requeuing it.
    /// Returns whether the item is in that batch (false for an unknown worker, batch or item,
    /// or one already answered: the caller should drop the part).
    pub fn started(&mut self, worker: WorkerId, batch: BatchId, item: ItemId) -> bool {
        let Some(items) = self
            .workers
            .get_mut(&worker)
            .and_then(|w| w.in_flight.get_mut(&batch))
        else {
            return false;
        };
        match items.iter_mut().find(|i| i.id == item) {
            Some(i) => {
                i.started = true;
                true
            }
            None => false,
        }
    }

    /// Whether a worker of a newer version of the worker's model has a credit left.
    fn outranked(&self, spec: &WorkerSpec) -> bool {
        self.workers
            .values()
            .any(|w| w.spec.model == spec.model && w.spec.version > spec.version && w.has_credit())
    }

    /// Whether the worker would take a batch that closes: it has a credit left and no worker
    /// of a newer version of its model has one.
    pub fn can_take(&self, worker_id: WorkerId) -> bool {
        self.workers
            .get(&worker_id)
            .is_some_and(|w| w.has_credit() && !self.outranked(&w.spec))
    }

    /// Cuts the next batch for a worker, if it has a credit and one closes; fails the model's
    /// queued items whose deadline has passed on the way.
    pub fn next_batch(&mut self, worker_id: WorkerId, now: Instant) -> Dispatch<O> {
        let mut dispatch = Dispatch::default();
        let Some(spec) = self.workers.get(&worker_id).map(|w| w.spec.clone()) else {
            return dispatch;
        };
        dispatch.expired = self.expire_model(&spec.model, now);
        let has_credit = self.workers.get(&worker_id).is_some_and(Worker::has_credit);
        if !has_credit || self.outranked(&spec) {
            return dispatch;
        }
        let idle = self
            .workers
            .get(&worker_id)
            .is_some_and(|w| w.in_flight.is_empty());
        let delay = self.queue_delay(&spec.model);
        let quantum = u64::from(self.limits.quantum);
        let weights = &self.weights;
        let Some(queue) = self.queues.get_mut(&spec.model) else {
            return dispatch;
        };
        let backlog = match &spec.serves {
            Serves::Everyone => Backlog {
                items: queue.len(),
                bytes: queue.bytes(),
                oldest: queue.oldest_arrival(),
            },
            Serves::Only(tenant) => {
                let (items, bytes, oldest) = queue.tenant_backlog(tenant);
                Backlog {
                    items,
                    bytes,
                    oldest,
                }
            }
        };
        match batch::closing(backlog, &spec, delay, now, idle) {
            Closing::Now => {}
            Closing::At(at) => {
                dispatch.retry_at = Some(at);
                return dispatch;
            }
            Closing::Empty | Closing::Never => return dispatch,
        }
        let cut = Cut {
            max_items: spec.max_items,
            max_bytes: spec.max_bytes,
            quantum,
        };
        let taken = match &spec.serves {
            Serves::Everyone => queue.take(cut, |t| weights.get(t).copied().unwrap_or(1)),
            Serves::Only(tenant) => queue.take_tenant(tenant, cut),
        };
        let backlog = queue.len();
        if queue.is_empty() {
            self.queues.remove(&spec.model);
        }
        self.rates
            .entry(spec.model.clone())
            .or_default()
            .dispatched(taken.len(), backlog, now);
        self.next_batch_id = self.next_batch_id.wrapping_add(1);
        let batch_id = BatchId(self.next_batch_id);
        let items: Vec<QueuedItem> = taken.into_iter().map(|(_, item)| item).collect();
        for item in &items {
            self.requests.set_in_flight(item.id, worker_id, batch_id);
        }
        let batch_items = items
            .iter()
            .map(|item| BatchItem {
                id: item.id,
                bytes: item.bytes,
            })
            .collect();
        if let Some(worker) = self.workers.get_mut(&worker_id) {
            worker.in_flight.insert(batch_id, items);
        }
        dispatch.batch = Some(Batch {
            id: batch_id,
            worker: worker_id,
            model: spec.model,
            version: spec.version,
            items: batch_items,
        });
        dispatch
    }

    /// Records a worker's results for a batch, one per item in batch order (`Err` carries the
    /// worker's message; a missing result fails its item), and returns the batch's credit.
    /// Returns the requests now complete. A batch the worker no longer holds (it was
    /// unregistered, or the batch was completed already) is ignored.
    pub fn complete<E: Into<ItemError>>(
        &mut self,
        worker_id: WorkerId,
        batch: BatchId,
        results: Vec<Result<O, E>>,
    ) -> Vec<Completed<O>> {
        let Some(worker) = self.workers.get_mut(&worker_id) else {
            return Vec::new();
        };
        let Some(items) = worker.in_flight.remove(&batch) else {
            return Vec::new();
        };
        let version = Some(worker.spec.version);
        let count = items.len();
        let mut results = results.into_iter();
        let mut completed = Vec::new();
        for item in items {
            if self.requests.is_lingering(item.id.request) {
                results.next();
                self.requests.settle(item.id);
                continue;
            }
            let result = match results.next() {
                Some(Ok(output)) => Ok(output),
                Some(Err(error)) => Err(error.into()),
                None => Err(ItemError::Failed(format!(
                    "the worker returned fewer results than the batch's {count} items"
                ))),
            };
            completed.extend(self.requests.finish(item.id, Outcome { result, version }));
        }
        completed
    }

    /// Cancels a request at `now`: its queued items are dropped and it will not complete.
    /// Returns its items in flight (their results will be ignored; the caller may tell the
    /// workers), or `None` if the request is not outstanding. Their workers have until the
    /// later of its deadline and `now`, plus the cancel grace, to answer them.
    pub fn cancel(&mut self, id: RequestId, now: Instant) -> Option<Vec<InFlightItem>> {
        let grace = self.limits.cancel_grace;
        let (tenant, model, in_flight) = self.requests.cancel(id, grace, now)?;
        if let Some(queue) = self.queues.get_mut(&model) {
            queue.remove_request(&tenant, id);
            if queue.is_empty() {
                self.queues.remove(&model);
            }
        }
        Some(in_flight)
    }

    /// Items queued for a model.
    pub fn queue_depth(&self, model: &str) -> usize {
        self.queues.get(model).map_or(0, ModelQueue::len)
    }

    /// Items a tenant has queued, over all models.
    pub fn queued_for_tenant(&self, tenant: &Tenant) -> usize {
        self.queues.values().map(|q| q.tenant_len(tenant)).sum()
    }

    /// Requests a tenant has outstanding (queued or in flight).
    pub fn outstanding_for_tenant(&self, tenant: &Tenant) -> usize {
        self.requests.outstanding(tenant)
    }

    /// Requests outstanding, over all tenants.
    pub fn outstanding(&self) -> usize {
        self.requests.len()
    }

    /// Items a worker has in flight (`None` for an unknown worker).
    pub fn in_flight(&self, worker: WorkerId) -> Option<usize> {
        self.workers.get(&worker).map(Worker::in_flight_items)
    }

    /// Workers registered for a model.
    pub fn serving_workers(&self, model: &str) -> usize {
        self.workers
            .values()
            .filter(|w| w.spec.model == model)
            .count()
    }

    /// Whether nothing is held: no request outstanding, no item queued or in flight, no
    /// per-model queue or per-tenant count left behind (workers may stay registered).
    pub fn is_drained(&self) -> bool {
        self.requests.len() == 0
            && self.requests.tenants() == 0
            && self.queues.is_empty()
            && self.workers.values().all(|w| w.in_flight.is_empty())
    }
}
