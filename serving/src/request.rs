//! Requests, their items and outcomes: where each item is (queued, in flight, done), and the
//! reassembly of a request's outcomes in item order once the last one is in.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::ids::{BatchId, ItemId, RequestId, Tenant, WorkerId};

/// A request as a front door hands it in. The scheduler keeps only the sizes of the items; the
/// caller keeps their bytes, keyed by [`ItemId`], and sends them with the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewRequest {
    /// Who asks.
    pub tenant: Tenant,
    /// The model asked.
    pub model: String,
    /// The payload size in bytes of each item, in item order.
    pub item_bytes: Vec<u64>,
    /// After this instant no item of the request is dispatched.
    pub deadline: Instant,
    /// When the request arrived (the start of its items' queue delay).
    pub arrival: Instant,
    /// The tenant's own limit on requests outstanding (its quota), instead of
    /// [`super::Limits::max_tenant_requests`].
    pub quota: Option<usize>,
    /// What each item costs its tenant in the fair queue: 1, or for a generation the tokens it
    /// may generate (see [`super::queue`]).
    pub cost: u64,
}

/// Why an item has no result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ItemError {
    /// Its deadline passed before it was dispatched.
    DeadlineExceeded,
    /// Two workers were lost while computing it (it is requeued once, not twice).
    Unavailable,
    /// Its worker was lost after it had sent part of a streamed answer (never requeued: the
    /// caller has those parts).
    Interrupted,
    /// No worker served its model within the wait given to
    /// [`super::Scheduler::expire_without_workers`].
    NoWorker,
    /// The server began to shut down before it was dispatched.
    ShuttingDown,
    /// The worker reported a failure, with its message.
    Failed(String),
    /// The worker reported a failure with a status code (a `google.rpc.Code` value).
    Worker {
        /// The code.
        code: i32,
        /// The worker's message.
        message: String,
    },
}

impl From<String> for ItemError {
    fn from(message: String) -> Self {
        Self::Failed(message)
    }
}

/// The outcome of one item; `O` is the worker's output (bytes in tests, the protocol's
/// `ItemOutput` in the server).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome<O = Vec<u8>> {
    /// The output, or why there is none.
    pub result: Result<O, ItemError>,
    /// The version of the worker that computed it; `None` when the scheduler decided it
    /// (deadline, no worker, unavailable).
    pub version: Option<u32>,
}

impl<O> Outcome<O> {
    /// An outcome the scheduler decided, with no worker's version.
    pub(super) fn failed(error: ItemError) -> Self {
        Self {
            result: Err(error),
            version: None,
        }
    }
}

/// A request whose items all have an outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completed<O = Vec<u8>> {
    /// The request.
    pub id: RequestId,
    /// Who asked.
    pub tenant: Tenant,
    /// The model asked.
    pub model: String,
    /// One outcome per item, in item order.
    pub outcomes: Vec<Outcome<O>>,
}

/// An item of a cancelled request that a worker is computing: the caller may tell the worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InFlightItem {
    /// The item.
    pub item: ItemId,
    /// The worker computing it.
    pub worker: WorkerId,
    /// The batch it was sent in.
    pub batch: BatchId,
}

/// Where one item is.
#[derive(Debug)]
enum Slot<O> {
    Queued,
    InFlight { worker: WorkerId, batch: BatchId },
    Done(Outcome<O>),
}

/// An outstanding request.
#[derive(Debug)]
struct Record<O> {
    tenant: Tenant,
    model: String,
    deadline: Instant,
    slots: Vec<Slot<O>>,
    /// Slots not yet `Done`.
    remaining: usize,
}

/// A cancelled request whose items a worker still computes: it still counts in its tenant's
/// share until each of those items is answered (its batch's result, or its worker gone), or
/// until `until` (its deadline plus the grace), when its workers are ended.
#[derive(Debug)]
struct Lingering {
    tenant: Tenant,
    /// Items still at a worker.
    items: usize,
    /// When its workers must have answered.
    until: Instant,
}

/// The outstanding requests, and how many each tenant has (cancelled ones whose items a
/// worker still computes included).
#[derive(Debug)]
pub(super) struct Requests<O> {
    records: HashMap<RequestId, Record<O>>,
    lingering: HashMap<RequestId, Lingering>,
    /// Tenants whose lingering requests stopped counting since [`Self::take_settled`].
    settled: Vec<Tenant>,
    per_tenant: HashMap<Tenant, usize>,
    next_id: u64,
}

impl<O> Default for Requests<O> {
    fn default() -> Self {
        Self {
            records: HashMap::new(),
            lingering: HashMap::new(),
            settled: Vec::new(),
            per_tenant: HashMap::new(),
            next_id: 0,
        }
    }
}

impl<O> Requests<O> {
    /// Requests outstanding (not complete, not cancelled), over all tenants.
    pub(super) fn len(&self) -> usize {
        self.records.len()
    }

    /// Requests `tenant` has outstanding.
    pub(super) fn outstanding(&self, tenant: &Tenant) -> usize {
        self.per_tenant.get(tenant).copied().unwrap_or(0)
    }

    /// Tenants with any request outstanding.
    pub(super) fn tenants(&self) -> usize {
        self.per_tenant.len()
    }

    /// Records a new request of `items` queued items and returns its id.
    pub(super) fn insert(
        &mut self,
        tenant: Tenant,
        model: String,
        items: usize,
        deadline: Instant,
    ) -> RequestId {
        self.next_id = self.next_id.wrapping_add(1);
        let id = RequestId(self.next_id);
        *self.per_tenant.entry(tenant.clone()).or_insert(0) += 1;
        let slots = (0..items).map(|_| Slot::Queued).collect();
        self.records.insert(
            id,
            Record {
                tenant,
                model,
                deadline,
                slots,
                remaining: items,
            },
        );
        id
    }

    /// The tenant of an outstanding request.
    pub(super) fn tenant_of(&self, id: RequestId) -> Option<&Tenant> {
        self.records.get(&id).map(|r| &r.tenant)
    }

    /// Marks an item as sent to `worker` in `batch` (unknown items are ignored).
    pub(super) fn set_in_flight(&mut self, item: ItemId, worker: WorkerId, batch: BatchId) {
        if let Some(slot) = self.slot_mut(item) {
            *slot = Slot::InFlight { worker, batch };
        }
    }

    /// Marks an item as queued again (unknown items are ignored).
    pub(super) fn set_queued(&mut self, item: ItemId) {
        if let Some(slot) = self.slot_mut(item) {
            *slot = Slot::Queued;
        }
    }

    fn slot_mut(&mut self, item: ItemId) -> Option<&mut Slot<O>> {
        let record = self.records.get_mut(&item.request)?;
        match record.slots.get_mut(item.index) {
            Some(Slot::Done(_)) | None => None,
            Some(slot) => Some(slot),
        }
    }

    /// Records an item's outcome. If it was the request's last, the request is removed and
    /// returned with its outcomes in item order. Items of unknown (cancelled) requests, and items
    /// that already have an outcome, are ignored.
    pub(super) fn finish(&mut self, item: ItemId, outcome: Outcome<O>) -> Option<Completed<O>> {
        let slot = self.slot_mut(item)?;
        *slot = Slot::Done(outcome);
        let record = self.records.get_mut(&item.request)?;
        record.remaining = record.remaining.saturating_sub(1);
        if record.remaining > 0 {
            return None;
        }
        let record = self.remove_record(item.request)?;
        let outcomes = record
            .slots
            .into_iter()
            .filter_map(|slot| match slot {
                Slot::Done(outcome) => Some(outcome),
                Slot::Queued | Slot::InFlight { .. } => None,
            })
            .collect();
        Some(Completed {
            id: item.request,
            tenant: record.tenant,
            model: record.model,
            outcomes,
        })
    }

    /// Removes a request (cancellation): returns its tenant, its model and its items in flight.
    /// While items of it are in flight it still counts in its tenant's share (see
    /// [`Self::settle`]), until its deadline plus `grace`.
    pub(super) fn cancel(
        &mut self,
        id: RequestId,
        grace: Duration,
        now: Instant,
    ) -> Option<(Tenant, String, Vec<InFlightItem>)> {
        let record = self.records.remove(&id)?;
        let in_flight: Vec<InFlightItem> = record
            .slots
            .iter()
            .enumerate()
            .filter_map(|(index, slot)| match slot {
                Slot::InFlight { worker, batch } => Some(InFlightItem {
                    item: ItemId { request: id, index },
                    worker: *worker,
                    batch: *batch,
                }),
                Slot::Queued | Slot::Done(_) => None,
            })
            .collect();
        if in_flight.is_empty() {
            self.uncount(&record.tenant);
        } else {
            self.lingering.insert(
                id,
                Lingering {
                    tenant: record.tenant.clone(),
                    items: in_flight.len(),
                    // A streamed request lives past its deadline (which bounds its first
                    // part only): its worker gets the grace from the cancel.
                    until: record.deadline.max(now) + grace,
                },
            );
        }
        Some((record.tenant, record.model, in_flight))
    }

    /// An item of a cancelled request was answered by its worker (or its worker is gone):
    /// once none is left at a worker, the request stops counting in its tenant's share.
    pub(super) fn settle(&mut self, item: ItemId) {
        let Some(l) = self.lingering.get_mut(&item.request) else {
            return;
        };
        l.items = l.items.saturating_sub(1);
        if l.items == 0 {
            let tenant = l.tenant.clone();
            self.lingering.remove(&item.request);
            self.uncount(&tenant);
            self.settled.push(tenant);
        }
    }

    /// Whether `request` was cancelled with items still at a worker.
    pub(super) fn is_lingering(&self, request: RequestId) -> bool {
        self.lingering.contains_key(&request)
    }

    /// Cancelled requests whose workers are past their deadline plus the grace.
    pub(super) fn overdue(&self, now: Instant) -> Vec<RequestId> {
        self.lingering
            .iter()
            .filter(|(_, l)| now >= l.until)
            .map(|(id, _)| *id)
            .collect()
    }

    /// When the next cancelled request's workers are due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.lingering.values().map(|l| l.until).min()
    }

    /// Stops counting a lingering request (its workers were ended).
    pub(super) fn forget(&mut self, request: RequestId) {
        if let Some(l) = self.lingering.remove(&request) {
            self.uncount(&l.tenant);
            self.settled.push(l.tenant);
        }
    }

    /// Tenants whose cancelled requests stopped counting since the last call (their counts
    /// changed with no request of theirs finishing).
    pub(super) fn take_settled(&mut self) -> Vec<Tenant> {
        std::mem::take(&mut self.settled)
    }

    /// Every tenant with a request counted (cancelled ones still at a worker included).
    pub(super) fn counted_tenants(&self) -> impl Iterator<Item = &Tenant> {
        self.per_tenant.keys()
    }

    fn uncount(&mut self, tenant: &Tenant) {
        if let Some(count) = self.per_tenant.get_mut(tenant) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_tenant.remove(tenant);
            }
        }
    }

    fn remove_record(&mut self, id: RequestId) -> Option<Record<O>> {
        let record = self.records.remove(&id)?;
        self.uncount(&record.tenant);
        Some(record)
    }
}
