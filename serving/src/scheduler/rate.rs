//! Admission by expected wait (issue 28): each model's service rate, measured from its
//! dispatches while work piles up, and the wait a new request would face in its tenant's
//! sub-queue at its fair share of that rate. A request that would outwait its own deadline is
//! refused at once ([`Admission::Overloaded`], 429 with `Retry-After`) instead of queued to
//! fail with a 504 when the deadline passes.

use std::time::{Duration, Instant};

use super::{Admission, Scheduler, Tenant};

/// A rate sample covers at least this long.
const WINDOW: Duration = Duration::from_millis(250);
/// The weight of a new sample in the running rate (the rest is the old rate's).
const NEW_SAMPLE: f64 = 0.5;

/// A model's measured service rate, in items per second.
#[derive(Debug, Default, Clone)]
pub(super) struct Rate {
    /// When the sample under way began, while the queue has stayed non-empty since.
    since: Option<Instant>,
    /// Items dispatched in the sample under way.
    items: u64,
    /// The running rate, once a sample has completed.
    per_second: Option<f64>,
}

impl Rate {
    /// Records a batch of `items` dispatched at `now`, with `backlog` items still queued after
    /// it. Only dispatches under backlog measure capacity: then batches leave as fast as the
    /// workers free their credits. An emptied queue ends the sample (idle time is not slowness).
    pub(super) fn dispatched(&mut self, items: usize, backlog: usize, now: Instant) {
        if backlog == 0 {
            self.since = None;
            self.items = 0;
            return;
        }
        let Some(since) = self.since else {
            // The first dispatch under backlog starts the clock; its items were taken before.
            self.since = Some(now);
            self.items = 0;
            return;
        };
        self.items += items as u64;
        let elapsed = now.saturating_duration_since(since);
        if elapsed >= WINDOW {
            let sample = self.items as f64 / elapsed.as_secs_f64();
            self.per_second = Some(match self.per_second {
                Some(old) => old * (1.0 - NEW_SAMPLE) + sample * NEW_SAMPLE,
                None => sample,
            });
            self.since = Some(now);
            self.items = 0;
        }
    }

    /// The running rate, items per second, once measured.
    pub(super) fn per_second(&self) -> Option<f64> {
        self.per_second.filter(|r| r.is_finite() && *r > 0.0)
    }
}

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
