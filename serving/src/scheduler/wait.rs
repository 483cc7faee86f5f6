//! Admission by expected wait (issue 28): the wait a new request would face in its tenant's
//! sub-queue at its fair share of the model's measured rate ([`crate::rate::Rate`]). A request
//! that would outwait its own deadline is refused at once ([`Admission::Overloaded`], 429 with
//! `Retry-After`) instead of queued to fail with a 504 when the deadline passes.

use std::time::{Duration, Instant};

use super::{Admission, Scheduler, Tenant};
use crate::rate::Rate;

impl<O> Scheduler<O> {
    /// Refuses a request of `items` items of `tenant` for `model`, arriving at `arrival` with
    /// `deadline`, when the wait its last item would face exceeds the time it has: the work
    /// ahead of it in the tenant's sub-queue (and its own) over the model's measured rate times
    /// the tenant's fair share (its weight over the weights of the tenants with queued work).
    /// Admits while no rate is measured, or while no worker serves the model (the no-worker
    /// wait handles that).
    pub(super) fn check_wait(
        &self,
        model: &str,
        tenant: &Tenant,
        items: usize,
        arrival: Instant,
        deadline: Instant,
    ) -> Result<(), Admission> {
        let Some(rate) = self.rates.get(model).and_then(Rate::per_second) else {
            return Ok(());
        };
        if !self.workers.values().any(|w| w.spec.model == model) {
            return Ok(());
        }
        let Some(queue) = self.queues.get(model) else {
            return Ok(());
        };
        let weight = |t: &Tenant| f64::from(self.weights.get(t).copied().unwrap_or(1).max(1));
        let mut total_weight = weight(tenant);
        for (other, _) in queue.tenants() {
            if other != tenant {
                total_weight += weight(other);
            }
        }
        let share = weight(tenant) / total_weight;
        let (ahead, _, _) = queue.tenant_backlog(tenant);
        let wait = Duration::try_from_secs_f64((ahead + items) as f64 / (rate * share))
            .unwrap_or(Duration::MAX);
        let has = deadline.saturating_duration_since(arrival);
        if wait <= has {
            return Ok(());
        }
        let drain = Duration::try_from_secs_f64(queue.len() as f64 / rate).unwrap_or(Duration::MAX);
        Err(Admission::Overloaded {
            model: model.to_owned(),
            wait,
            deadline: has,
            retry_after: drain.max(Duration::from_secs(1)),
        })
    }
}
