//! How the workers of one GPU share it ([`GpuSharing`]): side by side, each taking its own
//! credits of batches (the driver then time-slices their CUDA contexts), or taking turns, at
//! most one worker's credits of batches on the GPU at once, sent first to the worker that holds
//! the most, then to the longest serving (so the GPU runs one context at a time, mostly the
//! same one).
//!
//! Which is faster depends on the model and its workers. One that keeps the GPU busy loses to
//! the time-slicing (BERT-large on an H200: two workers side by side 0.92× one, four 0.89×;
//! taking turns 0.99× and 0.98×). Workers limited by their host side may gain from running
//! side by side (MiniLM's, before its worker spread its tokenization over the cores: four
//! 1.05× one side by side, 0.91× taking turns). So by default
//! ([`GpuSharing::Auto`]) each GPU with two workers or more measures both ([`Turns`]): four
//! epochs, the way it runs now, the other, the other again, the first again (so that a load
//! that grows or shrinks steadily meanwhile favours neither), counting the items its workers
//! complete; it takes turns when that completed at least [`TURNS_MARGIN`] more, keeps the
//! choice for [`KEEP_EPOCHS`] epochs, then measures again. Under a load both ways keep up
//! with, both complete the same and the GPU stays side by side. Measuring starts once every
//! worker of the GPU has completed [`WARM_BATCHES`] batches (a new worker's first batches
//! load its kernels), and starts again when a worker comes or goes.

use std::time::{Duration, Instant};

use tracing::info;

use crate::types::GpuSharing;

/// The length of one epoch.
pub const EPOCH: Duration = Duration::from_millis(1500);
/// Epochs the chosen way is kept before both are measured again.
pub const KEEP_EPOCHS: u32 = 30;
/// Taking turns is chosen only when it completes at least this much more than side by side
/// (side by side is the simpler state: no worker waits for another).
pub const TURNS_MARGIN: f64 = 1.02;
/// Batches each worker of a GPU completes before its ways are measured.
pub const WARM_BATCHES: u64 = 16;
/// The measuring epochs, as "the other way than at the start" or not.
const PROBE: [bool; 4] = [false, true, true, false];

/// One GPU's way of sharing and its measurements.
#[derive(Debug, Clone)]
pub struct Turns {
    policy: GpuSharing,
    /// Whether its workers take turns now.
    taking_turns: bool,
    epoch_start: Instant,
    /// Items its workers completed in this epoch.
    items: u64,
    /// The measuring epoch now (`PROBE`'s index), while measuring.
    probe: Option<usize>,
    /// Whether they took turns when this measuring began.
    first: bool,
    /// Items and seconds of each way in this measuring: side by side, taking turns.
    counted: [(u64, f64); 2],
    /// Epochs left before measuring again.
    keep: u32,
    /// Its workers when last ticked.
    workers: usize,
}

impl Turns {
    pub fn new(policy: GpuSharing, now: Instant) -> Self {
        Self {
            policy,
            taking_turns: policy == GpuSharing::Turns,
            epoch_start: now,
            items: 0,
            probe: None,
            first: false,
            counted: [(0, 0.0); 2],
            keep: 0,
            workers: 0,
        }
    }

    /// Whether the GPU's workers take turns now.
    pub fn taking_turns(&self) -> bool {
        self.taking_turns
    }

    /// `items` completed by one of the GPU's workers.
    pub fn completed(&mut self, items: usize) {
        self.items = self.items.saturating_add(items as u64);
    }

    /// Ends the epoch when it is over (counted while measuring; the way chosen after the last
    /// measuring epoch). `workers`: the GPU's workers now, `warm`: whether each has completed
    /// [`WARM_BATCHES`]; `gpu` names the GPU in the log.
    pub fn tick(&mut self, gpu: &str, now: Instant, workers: usize, warm: bool) {
        if self.policy != GpuSharing::Auto {
            return;
        }
        if workers != self.workers {
            // Another count of workers: measure again, once they are warm.
            (self.workers, self.keep, self.probe) = (workers, 0, None);
            (self.epoch_start, self.items) = (now, 0);
        }
        if !warm {
            if self.probe.is_some() {
                self.probe = None;
                self.taking_turns = self.first;
            }
            (self.epoch_start, self.items) = (now, 0);
            return;
        }
        let elapsed = now.saturating_duration_since(self.epoch_start);
        if elapsed < EPOCH {
            return;
        }
        let items = std::mem::take(&mut self.items);
        self.epoch_start = now;
        if self.keep > 0 {
            self.keep -= 1;
            return;
        }
        let Some(step) = self.probe else {
            // Measuring begins: this epoch was the way it runs now, and counts.
            (self.first, self.counted) = (self.taking_turns, [(0, 0.0); 2]);
            self.count(items, elapsed);
            return self.next_probe(1, gpu);
        };
        self.count(items, elapsed);
        self.next_probe(step + 1, gpu);
    }

    fn count(&mut self, items: u64, elapsed: Duration) {
        let way = &mut self.counted[usize::from(self.taking_turns)];
        way.0 = way.0.saturating_add(items);
        way.1 += elapsed.as_secs_f64();
    }

    fn next_probe(&mut self, step: usize, gpu: &str) {
        if let Some(&other) = PROBE.get(step) {
            self.probe = Some(step);
            self.taking_turns = self.first != other;
            return;
        }
        let rate = |(items, secs): (u64, f64)| if secs > 0.0 { items as f64 / secs } else { 0.0 };
        let (side, turns) = (rate(self.counted[0]), rate(self.counted[1]));
        self.taking_turns = turns > side * TURNS_MARGIN;
        (self.probe, self.keep) = (None, KEEP_EPOCHS);
        info!(%gpu, workers = self.workers, side_by_side_items_per_s = side.round(),
              turns_items_per_s = turns.round(), taking_turns = self.taking_turns,
              "the workers of a GPU: measured both ways");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `epochs` epochs from `now` with two warm workers, each epoch completing
    /// `rate(taking_turns)` items a second; returns the time after them.
    fn run(t: &mut Turns, now: Instant, epochs: u32, rate: impl Fn(bool) -> f64) -> Instant {
        run_with(t, now, epochs, 2, rate)
    }

    /// [`run`] with `workers` warm workers.
    fn run_with(
        t: &mut Turns,
        mut now: Instant,
        epochs: u32,
        workers: usize,
        rate: impl Fn(bool) -> f64,
    ) -> Instant {
        for _ in 0..epochs {
            t.completed((rate(t.taking_turns()) * EPOCH.as_secs_f64()) as usize);
            now += EPOCH;
            t.tick("GPU-0", now, workers, true);
        }
        now
    }

    const MEASURE: u32 = PROBE.len() as u32;

    /// A GPU's state as the driver makes it when a second worker comes: ticked at once.
    fn started(policy: GpuSharing, now: Instant) -> Turns {
        let mut t = Turns::new(policy, now);
        t.tick("GPU-0", now, 2, true);
        t
    }

    #[test]
    fn the_faster_way_is_kept_and_measured_again_later() {
        let t0 = Instant::now();
        let mut t = started(GpuSharing::Auto, t0);
        assert!(!t.taking_turns(), "side by side until measured");
        // A GPU-bound model: taking turns completes 8% more.
        let now = run(
            &mut t,
            t0,
            MEASURE,
            |turns| if turns { 108.0 } else { 100.0 },
        );
        assert!(t.taking_turns());
        // Kept for KEEP_EPOCHS epochs whatever the rates do meanwhile.
        let now = run(
            &mut t,
            now,
            KEEP_EPOCHS,
            |turns| if turns { 50.0 } else { 100.0 },
        );
        assert!(t.taking_turns());
        // Then measured again: the load changed and side by side is faster now.
        run(
            &mut t,
            now,
            MEASURE,
            |turns| if turns { 50.0 } else { 100.0 },
        );
        assert!(!t.taking_turns());
    }

    #[test]
    fn a_host_bound_model_stays_side_by_side_and_a_small_gain_does_not_switch() {
        let t0 = Instant::now();
        for turns_rate in [91.0, 101.0, 100.0] {
            let mut t = started(GpuSharing::Auto, t0);
            run(
                &mut t,
                t0,
                MEASURE,
                |turns| if turns { turns_rate } else { 100.0 },
            );
            assert!(!t.taking_turns(), "{turns_rate}");
        }
    }

    /// A load that grows steadily while both ways are measured favours neither: the same
    /// completion rate either way, rising 10% an epoch, keeps the GPU side by side.
    #[test]
    fn a_growing_load_favours_neither_way() {
        let t0 = Instant::now();
        let mut t = started(GpuSharing::Auto, t0);
        let mut now = t0;
        for epoch in 0..MEASURE {
            t.completed((150.0 * (1.0 + 0.1 * f64::from(epoch))) as usize);
            now += EPOCH;
            t.tick("GPU-0", now, 2, true);
        }
        assert!(!t.taking_turns());
    }

    #[test]
    fn a_fixed_policy_never_changes_and_a_short_epoch_is_not_over() {
        let t0 = Instant::now();
        for (policy, turns) in [(GpuSharing::Turns, true), (GpuSharing::SideBySide, false)] {
            let mut t = started(policy, t0);
            run(&mut t, t0, 40, |turns| if turns { 1.0 } else { 1000.0 });
            assert_eq!(t.taking_turns(), turns);
        }
        let mut t = started(GpuSharing::Auto, t0);
        t.completed(1000);
        t.tick("GPU-0", t0 + EPOCH / 2, 2, true);
        assert!(!t.taking_turns(), "the epoch is not over");
        t.tick("GPU-0", t0 + EPOCH, 2, true);
        assert!(t.taking_turns(), "measuring the other way");
    }

    /// Measuring waits for the workers to be warm (a cold worker's first batches would make
    /// its way look slow), and starts again when a worker comes.
    #[test]
    fn measuring_waits_for_warm_workers_and_starts_again_with_another_worker() {
        let t0 = Instant::now();
        let mut t = started(GpuSharing::Auto, t0);
        let mut now = t0;
        for _ in 0..10 {
            t.completed(10);
            now += EPOCH;
            t.tick("GPU-0", now, 2, false);
            assert!(!t.taking_turns(), "not measuring while cold");
        }
        let now = run(
            &mut t,
            now,
            MEASURE,
            |turns| if turns { 120.0 } else { 100.0 },
        );
        assert!(t.taking_turns());
        // A third worker comes, cold: side by side is measured again once it is warm.
        t.tick("GPU-0", now, 3, false);
        assert!(t.taking_turns(), "kept while the new worker warms");
        run_with(
            &mut t,
            now,
            MEASURE,
            3,
            |turns| if turns { 90.0 } else { 100.0 },
        );
        assert!(
            !t.taking_turns(),
            "three workers: side by side measured faster"
        );
    }
}
