//! Cumulative statistics of each model version's requests, as Triton's `ModelStatistics`
//! reports them (the OIP doors serve them to tritonclient and perf_analyzer): requests answered
//! and failed with their time from arrival to answer, items' time queued, batches computed with
//! their time at the worker (overall and per batch size), items computed, the last answer.
//!
//! A request is counted under the version that computed its first item: one that failed before
//! any worker took it (refused, no worker, deadline while queued) belongs to no version and is
//! counted only in the Prometheus families. Pure bookkeeping, owned by the driver.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A count and the total of their durations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// How many times it happened.
    pub count: u64,
    /// Their total duration, in nanoseconds.
    pub ns: u64,
}

impl Tally {
    fn add(&mut self, took: Duration) {
        self.count += 1;
        self.ns = self
            .ns
            .saturating_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }
}

/// The statistics of one model version.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VersionStats {
    /// The version.
    pub version: u32,
    /// When these statistics began (the version's first item sent), in milliseconds since the
    /// Unix epoch: a version of an earlier model of the same name began before the current
    /// one was loaded.
    pub first_unix_ms: u64,
    /// When its last request was answered, in milliseconds since the Unix epoch (0: never).
    pub last_answer_unix_ms: u64,
    /// Items computed successfully (a request of 8 rows counts 8).
    pub items: u64,
    /// Requests answered, and their time from arrival to answer.
    pub success: Tally,
    /// Requests failed after a worker took an item of theirs, and their time.
    pub fail: Tally,
    /// Items' time queued before a worker took them.
    pub queue: Tally,
    /// Batches computed, and their time at the worker (sent to answered).
    pub compute: Tally,
    /// `compute` per batch size (items in the batch).
    pub by_batch_size: BTreeMap<u64, Tally>,
}

/// Versions kept per model (the newest; an older one's figures go).
pub(crate) const MAX_VERSIONS: usize = 16;

/// Models kept (the least recently active goes first): names come and go with loads.
pub(crate) const MAX_MODELS: usize = 4096;

/// Every model version's statistics, bounded ([`MAX_VERSIONS`], [`MAX_MODELS`]).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    by_model: HashMap<String, Versions>,
    /// Counts updates, to tell the least recently active model.
    tick: u64,
}

/// One model's versions, and when it was last active.
#[derive(Debug, Default)]
struct Versions {
    versions: BTreeMap<u32, VersionStats>,
    active: u64,
}

impl Stats {
    fn entry(&mut self, model: &str, version: u32) -> &mut VersionStats {
        self.tick += 1;
        if !self.by_model.contains_key(model) {
            if self.by_model.len() >= MAX_MODELS
                && let Some(idle) = self
                    .by_model
                    .iter()
                    .min_by_key(|(_, v)| v.active)
                    .map(|(name, _)| name.clone())
            {
                self.by_model.remove(&idle);
            }
            self.by_model.insert(model.to_owned(), Versions::default());
        }
        let tick = self.tick;
        let entry = self
            .by_model
            .get_mut(model)
            .expect("the model's entry was just made");
        entry.active = tick;
        let versions = &mut entry.versions;
        if !versions.contains_key(&version) && versions.len() >= MAX_VERSIONS {
            versions.pop_first();
        }
        versions.entry(version).or_insert_with(|| VersionStats {
            version,
            first_unix_ms: unix_ms_now(),
            ..VersionStats::default()
        })
    }

    /// An item of `model` was sent to a worker of `version` after waiting `waited`.
    pub(crate) fn queued(&mut self, model: &str, version: u32, waited: Duration) {
        self.entry(model, version).queue.add(waited);
    }

    /// A batch of `items` came back from a worker of `version` after `took`.
    pub(crate) fn computed(&mut self, model: &str, version: u32, items: usize, took: Duration) {
        let entry = self.entry(model, version);
        entry.compute.add(took);
        entry
            .by_batch_size
            .entry(items as u64)
            .or_default()
            .add(took);
    }

    /// A request whose first item `version` computed was answered (`items` computed) or failed
    /// (`None`), `took` after it arrived; `now_unix_ms` is the time of the answer.
    pub(crate) fn answered(
        &mut self,
        model: &str,
        version: u32,
        items: Option<usize>,
        took: Duration,
        now_unix_ms: u64,
    ) {
        let entry = self.entry(model, version);
        match items {
            Some(items) => {
                entry.success.add(took);
                entry.items += items as u64;
                entry.last_answer_unix_ms = now_unix_ms;
            }
            None => entry.fail.add(took),
        }
    }

    /// The statistics of `model` (every model when `None`), by model then version.
    pub(crate) fn of(&self, model: Option<&str>) -> Vec<(String, Vec<VersionStats>)> {
        let mut out: Vec<(String, Vec<VersionStats>)> = self
            .by_model
            .iter()
            .filter(|(name, _)| model.is_none_or(|m| m == name.as_str()))
            .map(|(name, v)| (name.clone(), v.versions.values().cloned().collect()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Now, in milliseconds since the Unix epoch.
fn unix_ms_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts no longer add up per version: requests, items, queue and compute time, batch
    /// sizes, the last answer.
    #[test]
    fn counts_add_up_per_model_version() {
        let mut s = Stats::default();
        let ms = Duration::from_millis;
        s.queued("m", 2, ms(1));
        s.queued("m", 2, ms(3));
        s.computed("m", 2, 2, ms(10));
        s.computed("m", 2, 1, ms(4));
        s.computed("m", 2, 2, ms(6));
        s.answered("m", 2, Some(2), ms(20), 1_000);
        s.answered("m", 2, None, ms(7), 2_000);
        s.answered("m", 3, Some(1), ms(5), 3_000);
        s.queued("other", 1, ms(1));
        let m = s.of(Some("m"));
        assert_eq!(m.len(), 1);
        let (name, versions) = &m[0];
        assert_eq!(name, "m");
        let v2 = &versions[0];
        assert_eq!(v2.version, 2);
        assert_eq!(
            v2.queue,
            Tally {
                count: 2,
                ns: 4_000_000
            }
        );
        assert_eq!(
            v2.compute,
            Tally {
                count: 3,
                ns: 20_000_000
            }
        );
        assert_eq!(
            v2.by_batch_size[&2],
            Tally {
                count: 2,
                ns: 16_000_000
            }
        );
        assert_eq!(
            v2.by_batch_size[&1],
            Tally {
                count: 1,
                ns: 4_000_000
            }
        );
        assert_eq!((v2.success.count, v2.fail.count, v2.items), (1, 1, 2));
        assert_eq!(v2.last_answer_unix_ms, 1_000, "a failure is not an answer");
        assert_eq!(versions[1].version, 3);
        assert_eq!(s.of(None).len(), 2);
        assert!(s.of(Some("nope")).is_empty());
        assert!(v2.first_unix_ms > 0);
    }

    /// The figures would grow with every version and every name ever served.
    #[test]
    fn versions_and_models_are_bounded() {
        let mut s = Stats::default();
        for v in 1..=40 {
            s.queued("m", v, Duration::from_millis(1));
        }
        let kept: Vec<u32> = s.of(Some("m"))[0].1.iter().map(|v| v.version).collect();
        assert_eq!(kept, (25..=40).collect::<Vec<_>>());
        for i in 0..MAX_MODELS + 10 {
            s.queued(&format!("n{i}"), 1, Duration::from_millis(1));
        }
        assert_eq!(s.of(None).len(), MAX_MODELS);
        // The least recently active went first: the last ones are there.
        assert!(!s.of(Some(&format!("n{}", MAX_MODELS + 9))).is_empty());
    }
}
