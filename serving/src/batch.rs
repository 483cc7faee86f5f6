//! Workers, their batches, and when a batch closes.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::ids::{BatchId, ItemId, Serves, WorkerId};
use super::queue::QueuedItem;

/// What a worker serves and how much it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// The model it serves.
    pub model: String,
    /// The version of the model it has attached.
    pub version: u32,
    /// Batches it may have in flight at once (0: it gets none).
    pub credits: u32,
    /// Most items in one batch (0 is taken as 1).
    pub max_items: usize,
    /// Most payload bytes in one batch; an item larger than this is sent alone.
    pub max_bytes: u64,
    /// Whose requests it may receive.
    pub serves: Serves,
}

/// One item of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchItem {
    /// The item (the caller looks up its bytes by this id).
    pub id: ItemId,
    /// Its payload size.
    pub bytes: u64,
}

/// A batch handed to a worker. Its results go back through [`super::Scheduler::complete`], one
/// per item in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// The batch's id.
    pub id: BatchId,
    /// The worker it is for.
    pub worker: WorkerId,
    /// The model.
    pub model: String,
    /// The worker's version of the model.
    pub version: u32,
    /// The items, in the order the results must come back.
    pub items: Vec<BatchItem>,
}

/// A registered worker and its batches in flight.
#[derive(Debug)]
pub(super) struct Worker {
    pub(super) spec: WorkerSpec,
    pub(super) in_flight: BTreeMap<BatchId, Vec<QueuedItem>>,
}

impl Worker {
    pub(super) fn new(spec: WorkerSpec) -> Self {
        Self {
            spec,
            in_flight: BTreeMap::new(),
        }
    }

    /// Whether it may take one more batch.
    pub(super) fn has_credit(&self) -> bool {
        // `credits` is a u32, so it always fits a usize on the platforms the server runs on;
        // if it did not, the worker would simply have no credit.
        let credits = usize::try_from(self.spec.credits).unwrap_or(0);
        self.in_flight.len() < credits
    }

    /// Items in flight, over all its batches.
    pub(super) fn in_flight_items(&self) -> usize {
        self.in_flight.values().map(Vec::len).sum()
    }
}

/// Whether a batch should close now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Closing {
    /// Nothing queued.
    Empty,
    /// Enough items or bytes queued, or the oldest has waited long enough.
    Now,
    /// Not yet: ask again at this instant (or when more is queued).
    At(Instant),
    /// Not by time: the delay is too large to add to the oldest arrival.
    Never,
}

/// What a model's queue holds, as [`closing`] needs it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Backlog {
    pub(super) items: usize,
    pub(super) bytes: u64,
    pub(super) oldest: Option<Instant>,
}

/// Whether a batch for a worker with `spec` closes at `now`: at once for an `idle` worker (no
/// batch in flight: waiting for company would only leave it idle), else at its max items or max
/// bytes, or once the oldest item has waited `delay` (while the worker computes, the next batch
/// fills).
pub(super) fn closing(
    backlog: Backlog,
    spec: &WorkerSpec,
    delay: Duration,
    now: Instant,
    idle: bool,
) -> Closing {
    let Some(oldest) = backlog.oldest else {
        return Closing::Empty;
    };
    if backlog.items == 0 {
        return Closing::Empty;
    }
    if idle || backlog.items >= spec.max_items.max(1) || backlog.bytes >= spec.max_bytes {
        return Closing::Now;
    }
    match oldest.checked_add(delay) {
        Some(due) if now >= due => Closing::Now,
        Some(due) => Closing::At(due),
        None => Closing::Never,
    }
}
