//! What time alone does to the scheduler's state: deadlines and the no-worker wait expire
//! queued items, cancelled requests held past their grace name their workers, and the next
//! instant any of that happens.

use std::time::{Duration, Instant};

use super::*;

impl<O> Scheduler<O> {
    /// The workers that hold items of a cancelled request past its deadline plus the grace
    /// ([`Limits::cancel_grace`]): they neither answered nor acknowledged the cancel, so their
    /// streams are to be ended (which settles those items). A request none of whose items a
    /// worker holds any more stops counting.
    pub fn overdue_workers(&mut self, now: Instant) -> Vec<WorkerId> {
        let mut out = Vec::new();
        for request in self.requests.overdue(now) {
            let holders: Vec<WorkerId> = self
                .workers
                .iter()
                .filter(|(_, w)| {
                    w.in_flight
                        .values()
                        .flatten()
                        .any(|item| item.id.request == request)
                })
                .map(|(id, _)| *id)
                .collect();
            if holders.is_empty() {
                self.requests.forget(request);
            }
            for h in holders {
                if !out.contains(&h) {
                    out.push(h);
                }
            }
        }
        out
    }

    /// Tenants whose cancelled requests stopped counting since the last call.
    pub fn take_settled_tenants(&mut self) -> Vec<Tenant> {
        self.requests.take_settled()
    }

    /// Every tenant with a request counted against its share (queued, in flight, or cancelled
    /// while a worker still holds it).
    pub fn counted_tenants(&self) -> Vec<Tenant> {
        self.requests.counted_tenants().cloned().collect()
    }

    /// When the next cancelled request's workers are due to have answered.
    pub fn next_cancel_due(&self) -> Option<Instant> {
        self.requests.next_due()
    }

    /// Fails the queued items of every model whose deadline has passed.
    pub fn expire_deadlines(&mut self, now: Instant) -> Vec<Completed<O>> {
        let models: Vec<String> = self.queues.keys().cloned().collect();
        models
            .iter()
            .flat_map(|model| self.expire_model(model, now))
            .collect()
    }

    pub(super) fn expire_model(&mut self, model: &str, now: Instant) -> Vec<Completed<O>> {
        self.fail_queued(model, ItemError::DeadlineExceeded, |_, item| {
            now >= item.deadline
        })
    }

    /// Whether some worker of `model` may receive `tenant`'s requests.
    pub(super) fn served(&self, model: &str, tenant: &Tenant) -> bool {
        self.workers
            .values()
            .any(|w| w.spec.model == model && w.spec.serves.admits(tenant))
    }

    /// Fails, with [`ItemError::NoWorker`], the queued items that have waited `wait` or longer
    /// while no worker of their model may receive their tenant's requests (none serves the
    /// model, or only other tenants' workers do).
    pub fn expire_without_workers(&mut self, now: Instant, wait: Duration) -> Vec<Completed<O>> {
        let unserved: Vec<(String, Tenant)> = self
            .queues
            .iter()
            .flat_map(|(model, queue)| {
                queue
                    .tenants()
                    .filter(|(tenant, _)| !self.served(model, tenant))
                    .map(|(tenant, _)| (model.clone(), tenant.clone()))
                    .collect::<Vec<_>>()
            })
            .collect();
        unserved
            .iter()
            .flat_map(|(model, tenant)| {
                self.fail_queued(model, ItemError::NoWorker, |t, item| {
                    t == tenant && now.saturating_duration_since(item.arrival) >= wait
                })
            })
            .collect()
    }

    /// Fails every queued item of every model with `error` (at shutdown).
    pub fn fail_all_queued(&mut self, error: &ItemError) -> Vec<Completed<O>> {
        let models: Vec<String> = self.queues.keys().cloned().collect();
        models
            .iter()
            .flat_map(|model| self.fail_queued(model, error.clone(), |_, _| true))
            .collect()
    }

    /// Removes the queued items of `model` that `pred` picks and fails them with `error`.
    pub(super) fn fail_queued(
        &mut self,
        model: &str,
        error: ItemError,
        pred: impl FnMut(&Tenant, &QueuedItem) -> bool,
    ) -> Vec<Completed<O>> {
        let Some(queue) = self.queues.get_mut(model) else {
            return Vec::new();
        };
        let removed = queue.remove_where(pred);
        if queue.is_empty() {
            self.queues.remove(model);
        }
        removed
            .into_iter()
            .filter_map(|item| {
                self.requests
                    .finish(item.id, Outcome::failed(error.clone()))
            })
            .collect()
    }

    /// The next instant at which time alone changes something: the earliest deadline of a
    /// queued item, or when the oldest item of a model that has a worker with credit reaches the
    /// model's queue delay. `None` if nothing is queued.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.queues
            .iter()
            .flat_map(|(model, queue)| {
                let servable = self
                    .workers
                    .values()
                    .any(|w| &w.spec.model == model && w.has_credit());
                let due = if servable {
                    queue
                        .oldest_arrival()
                        .and_then(|t| t.checked_add(self.queue_delay(model)))
                } else {
                    None
                };
                [queue.earliest_deadline(), due]
            })
            .flatten()
            .min()
    }

    /// When the oldest queued item that no worker may receive will have waited `wait`: the next
    /// instant at which [`Self::expire_without_workers`] fails something. `None` if every
    /// tenant with queued items has a worker for them.
    pub fn next_no_worker_expiry(&self, wait: Duration) -> Option<Instant> {
        self.queues
            .iter()
            .flat_map(|(model, queue)| {
                queue
                    .tenants()
                    .filter(|(tenant, _)| !self.served(model, tenant))
                    .filter_map(|(_, oldest)| oldest?.checked_add(wait))
                    .collect::<Vec<_>>()
            })
            .min()
    }
}
