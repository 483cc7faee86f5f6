//! [`Rate`]: a model's service rate, measured from its dispatches while work piles up; what
//! the scheduler's admission by expected wait divides by (`scheduler/wait.rs`).

use std::time::{Duration, Instant};

/// A rate sample covers at least this long.
const WINDOW: Duration = Duration::from_millis(250);
/// The weight of a new sample in the running rate (the rest is the old rate's).
const NEW_SAMPLE: f64 = 0.5;

/// A model's measured service rate, in items per second.
#[derive(Debug, Default, Clone)]
pub(crate) struct Rate {
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
    pub(crate) fn dispatched(&mut self, items: usize, backlog: usize, now: Instant) {
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
    pub(crate) fn per_second(&self) -> Option<f64> {
        self.per_second.filter(|r| r.is_finite() && *r > 0.0)
    }
}
