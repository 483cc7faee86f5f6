//! One model's queue: a sub-queue per tenant, drained by deficit round robin.
//!
//! Tenants with queued items take turns in `active` order. At the start of its turn a tenant's
//! deficit grows by `quantum × weight`; it then gives items while its head item's cost fits in
//! the deficit (the cost taken from it), and goes to the back of the round when it does not
//! fit or its queue runs out. An item costs 1, and a generation the tokens it may generate
//! (`min(max_tokens, TOKEN_COST_CAP)`, [`generation_cost`]): tenants share a generation model
//! by tokens, not by requests, and what a generation did not use is given back to its tenant's
//! deficit when it ends ([`ModelQueue::refund`]). A batch may end in the middle of a turn: the
//! turn goes on at the next batch, without a second quantum. A tenant whose queue empties
//! leaves the round and loses its deficit (it cannot save up while idle). So a tenant with
//! weight `w` gets `w` units of cost for every unit of a weight-1 tenant that has items
//! waiting, however many the first one queues.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use super::ids::{ItemId, RequestId, Tenant};

/// An item waiting in a queue (or, in a worker's batch, an item in flight).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct QueuedItem {
    pub(super) id: ItemId,
    pub(super) bytes: u64,
    pub(super) arrival: Instant,
    pub(super) deadline: Instant,
    /// Already requeued once after a lost worker.
    pub(super) requeued: bool,
    /// The worker has sent part of its answer (a streamed item): it is never requeued.
    pub(super) started: bool,
    /// What it costs its tenant's deficit (at least 1).
    pub(super) cost: u64,
}

/// The most one item costs: a generation's `max_tokens` past it is charged this.
pub const TOKEN_COST_CAP: u64 = 4096;

/// What a streamed item costs in the fair queue: its `max_tokens` (int64 parameter, the
/// generation convention), at most [`TOKEN_COST_CAP`]; one that names none may generate any
/// number, and costs [`TOKEN_COST_CAP`] (what it does not use is refunded).
pub fn generation_cost(item: &modelshare_proto::v1::Item) -> u64 {
    use modelshare_proto::v1::parameter::Value;
    match item
        .parameters
        .get("max_tokens")
        .and_then(|p| p.value.as_ref())
    {
        Some(Value::Int64Value(n)) => u64::try_from(*n).unwrap_or(1).clamp(1, TOKEN_COST_CAP),
        _ => TOKEN_COST_CAP,
    }
}

/// One tenant's waiting items and its deficit.
#[derive(Debug, Default)]
struct TenantQueue {
    items: VecDeque<QueuedItem>,
    deficit: u64,
}

/// How a batch is cut from a queue.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cut {
    /// Most items (at least one is taken).
    pub(super) max_items: usize,
    /// Most bytes; a first item larger than this still goes, alone.
    pub(super) max_bytes: u64,
    /// Items added to a tenant's deficit per unit of weight at the start of its turn.
    pub(super) quantum: u64,
}

/// One model's queued items, by tenant.
#[derive(Debug, Default)]
pub(super) struct ModelQueue {
    tenants: HashMap<Tenant, TenantQueue>,
    /// Tenants with queued items, in round order; the head's turn is under way if `head_started`.
    active: VecDeque<Tenant>,
    head_started: bool,
    items: usize,
    bytes: u64,
}

impl ModelQueue {
    /// Items queued.
    pub(super) fn len(&self) -> usize {
        self.items
    }

    /// Bytes queued.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether nothing is queued.
    pub(super) fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// Items `tenant` has queued.
    pub(super) fn tenant_len(&self, tenant: &Tenant) -> usize {
        self.tenants.get(tenant).map_or(0, |q| q.items.len())
    }

    /// The arrival of the oldest item: the earliest of each tenant's first (each sub-queue is in
    /// arrival order, requeued items first, as long as arrivals are handed in in order).
    pub(super) fn oldest_arrival(&self) -> Option<Instant> {
        self.tenants
            .values()
            .filter_map(|q| q.items.front().map(|item| item.arrival))
            .min()
    }

    /// The earliest deadline of any queued item (a scan).
    pub(super) fn earliest_deadline(&self) -> Option<Instant> {
        self.tenants
            .values()
            .flat_map(|q| q.items.iter().map(|item| item.deadline))
            .min()
    }

    /// The items, bytes and oldest arrival of `tenant`'s sub-queue.
    pub(super) fn tenant_backlog(&self, tenant: &Tenant) -> (usize, u64, Option<Instant>) {
        self.tenants.get(tenant).map_or((0, 0, None), |q| {
            let bytes = q.items.iter().map(|item| item.bytes).sum();
            (
                q.items.len(),
                bytes,
                q.items.front().map(|item| item.arrival),
            )
        })
    }

    /// Cuts a batch from `tenant`'s sub-queue alone, in order (for a worker that serves only
    /// that tenant: there is no round to take turns in). Same limits as [`Self::take`].
    pub(super) fn take_tenant(&mut self, tenant: &Tenant, cut: Cut) -> Vec<(Tenant, QueuedItem)> {
        let max_items = cut.max_items.max(1);
        let mut out: Vec<(Tenant, QueuedItem)> = Vec::new();
        let mut bytes: u64 = 0;
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return out;
        };
        while out.len() < max_items {
            let Some(front) = queue.items.front() else {
                break;
            };
            if !out.is_empty() && bytes.saturating_add(front.bytes) > cut.max_bytes {
                break;
            }
            let Some(item) = queue.items.pop_front() else {
                break;
            };
            bytes = bytes.saturating_add(item.bytes);
            out.push((tenant.clone(), item));
        }
        for (_, item) in &out {
            self.count_out(item);
        }
        self.prune();
        out
    }

    /// Queues an item behind `tenant`'s others.
    pub(super) fn push_back(&mut self, tenant: &Tenant, item: QueuedItem) {
        self.count_in(&item);
        self.sub_queue(tenant).items.push_back(item);
    }

    /// Queues an item before `tenant`'s others (a requeued item).
    pub(super) fn push_front(&mut self, tenant: &Tenant, item: QueuedItem) {
        self.count_in(&item);
        self.sub_queue(tenant).items.push_front(item);
    }

    fn count_in(&mut self, item: &QueuedItem) {
        self.items = self.items.saturating_add(1);
        self.bytes = self.bytes.saturating_add(item.bytes);
    }

    fn count_out(&mut self, item: &QueuedItem) {
        self.items = self.items.saturating_sub(1);
        self.bytes = self.bytes.saturating_sub(item.bytes);
    }

    /// `tenant`'s sub-queue, joining the round at the back if it was not in it.
    fn sub_queue(&mut self, tenant: &Tenant) -> &mut TenantQueue {
        if !self.tenants.contains_key(tenant) {
            self.active.push_back(tenant.clone());
        }
        self.tenants.entry(tenant.clone()).or_default()
    }

    /// Takes the head tenant out of the round (its queue is empty or gone).
    fn drop_head(&mut self) {
        if let Some(tenant) = self.active.pop_front() {
            self.tenants.remove(&tenant);
        }
        self.head_started = false;
    }

    /// Cuts a batch by deficit round robin; `weight` gives each tenant's weight (at least 1 is
    /// used). Stops at `cut.max_items`, or before an item that would pass `cut.max_bytes` (so a
    /// large item at the head of the round waits for the next batch rather than being skipped).
    pub(super) fn take(
        &mut self,
        cut: Cut,
        weight: impl Fn(&Tenant) -> u32,
    ) -> Vec<(Tenant, QueuedItem)> {
        let max_items = cut.max_items.max(1);
        let mut out: Vec<(Tenant, QueuedItem)> = Vec::new();
        let mut bytes: u64 = 0;
        // Turns ended in a row without an item: a whole round of them is skipped ahead.
        let mut idle_turns = 0usize;
        // Each pass takes an item or ends a turn; the deficits grow by at least 1 a turn, and
        // after a round with no item taken the rounds that would take none are granted at
        // once (`skip_empty_rounds`), so the next round takes one and the loop ends.
        while out.len() < max_items {
            let Some(tenant) = self.active.front().cloned() else {
                break;
            };
            let started = self.head_started;
            let Some(queue) = self.tenants.get_mut(&tenant) else {
                self.drop_head();
                continue;
            };
            if !started {
                let grant = cut
                    .quantum
                    .max(1)
                    .saturating_mul(u64::from(weight(&tenant).max(1)));
                queue.deficit = queue.deficit.saturating_add(grant);
            }
            let Some(front) = queue.items.front() else {
                self.drop_head();
                continue;
            };
            let cost = front.cost.max(1);
            if queue.deficit < cost {
                // The turn is over: to the back of the round, the deficit kept for the next.
                self.head_started = false;
                self.active.rotate_left(1);
                idle_turns += 1;
                if idle_turns >= self.active.len() {
                    self.skip_empty_rounds(cut, &weight);
                    idle_turns = 0;
                }
                continue;
            }
            if !out.is_empty() && bytes.saturating_add(front.bytes) > cut.max_bytes {
                self.head_started = true;
                break;
            }
            let Some(item) = queue.items.pop_front() else {
                self.drop_head();
                continue;
            };
            queue.deficit -= cost;
            idle_turns = 0;
            let emptied = queue.items.is_empty();
            self.head_started = true;
            bytes = bytes.saturating_add(item.bytes);
            self.count_out(&item);
            out.push((tenant, item));
            if emptied {
                self.drop_head();
            }
        }
        out
    }

    /// Gives `tokens` back to `tenant`'s deficit (what a generation charged and did not use),
    /// while it has items queued; a refund raises the deficit to at most [`TOKEN_COST_CAP`]
    /// (and never lowers it).
    pub(super) fn refund(&mut self, tenant: &Tenant, tokens: u64) {
        if let Some(queue) = self.tenants.get_mut(tenant) {
            let refunded = queue.deficit.saturating_add(tokens).min(TOKEN_COST_CAP);
            queue.deficit = queue.deficit.max(refunded);
        }
    }

    /// After a whole round in which no head item fitted its tenant's deficit: grants every
    /// tenant in the round the rounds after this one that would still take nothing, so that
    /// the next round takes an item (a 4,096-token head with a quantum of 1 would otherwise
    /// take 4,096 rounds of the driver's loop per tenant).
    fn skip_empty_rounds(&mut self, cut: Cut, weight: &impl Fn(&Tenant) -> u32) {
        let grant = |t: &Tenant| {
            cut.quantum
                .max(1)
                .saturating_mul(u64::from(weight(t).max(1)))
        };
        let rounds = self
            .active
            .iter()
            .filter_map(|t| {
                let q = self.tenants.get(t)?;
                let need = q.items.front()?.cost.max(1).saturating_sub(q.deficit);
                Some(need.div_ceil(grant(t)))
            })
            .min()
            .unwrap_or(0);
        if rounds > 1 {
            for t in &self.active {
                if let Some(q) = self.tenants.get_mut(t) {
                    q.deficit = q
                        .deficit
                        .saturating_add((rounds - 1).saturating_mul(grant(t)));
                }
            }
        }
    }

    /// The tenants with items queued.
    pub(super) fn tenants(&self) -> impl Iterator<Item = (&Tenant, Option<Instant>)> {
        self.tenants
            .iter()
            .map(|(t, q)| (t, q.items.front().map(|item| item.arrival)))
    }

    /// Removes every item `pred` picks, given its tenant (in queue order per tenant).
    pub(super) fn remove_where(
        &mut self,
        mut pred: impl FnMut(&Tenant, &QueuedItem) -> bool,
    ) -> Vec<QueuedItem> {
        let mut removed = Vec::new();
        for (tenant, queue) in self.tenants.iter_mut() {
            let (gone, kept): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut queue.items)
                .into_iter()
                .partition(|item| pred(tenant, item));
            queue.items = kept;
            removed.extend(gone);
        }
        for item in &removed {
            self.count_out(item);
        }
        self.prune();
        removed
    }

    /// Removes the queued items of one request of `tenant`; returns how many there were.
    pub(super) fn remove_request(&mut self, tenant: &Tenant, id: RequestId) -> usize {
        let Some(queue) = self.tenants.get_mut(tenant) else {
            return 0;
        };
        let before = queue.items.len();
        let mut gone = Vec::new();
        queue.items.retain(|item| {
            let keep = item.id.request != id;
            if !keep {
                gone.push(item.bytes);
            }
            keep
        });
        let removed = before.saturating_sub(queue.items.len());
        self.items = self.items.saturating_sub(removed);
        self.bytes = self.bytes.saturating_sub(gone.iter().sum());
        self.prune();
        removed
    }

    /// Drops tenants whose queue emptied from the round.
    fn prune(&mut self) {
        let head = self.active.front().cloned();
        self.tenants.retain(|_, q| !q.items.is_empty());
        let tenants = &self.tenants;
        self.active.retain(|t| tenants.contains_key(t));
        if self.active.front() != head.as_ref() {
            self.head_started = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use modelshare_proto::v1 as pb;

    use super::*;

    #[test]
    fn a_generation_costs_its_max_tokens_capped_or_the_cap_when_it_names_none() {
        let item = |max: Option<i64>| pb::Item {
            parameters: max
                .map(|n| {
                    let value = Some(pb::parameter::Value::Int64Value(n));
                    ("max_tokens".to_owned(), pb::Parameter { value })
                })
                .into_iter()
                .collect(),
            ..Default::default()
        };
        assert_eq!(generation_cost(&item(None)), TOKEN_COST_CAP);
        assert_eq!(generation_cost(&item(Some(300))), 300);
        assert_eq!(generation_cost(&item(Some(1 << 20))), TOKEN_COST_CAP);
        assert_eq!(generation_cost(&item(Some(-5))), 1);
        assert_eq!(generation_cost(&item(Some(0))), 1);
    }
}
