//! The scheduler driven by hand, without an engine: fairness, batching, admission, workers
//! and their versions, odd settings and leaks.
//!
//! Here: the request, worker and dispatch helpers; the tests by subject in the submodules.

use std::time::{Duration, Instant};

use super::*;

mod admission;
mod batching;
mod fairness;
mod robustness;
mod workers;

const MODEL: &str = "enc";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn tenant(name: &str) -> Tenant {
    Some(name.to_owned())
}

/// A request of `sizes` items for [`MODEL`], arriving at `at`, with a deadline far off.
fn request(who: &Tenant, sizes: &[u64], at: Instant) -> NewRequest {
    NewRequest {
        tenant: who.clone(),
        model: MODEL.to_owned(),
        item_bytes: sizes.to_vec(),
        deadline: at + Duration::from_secs(60),
        arrival: at,
        quota: None,
        cost: 1,
    }
}

fn spec(version: u32, credits: u32, max_items: usize, max_bytes: u64) -> WorkerSpec {
    WorkerSpec {
        model: MODEL.to_owned(),
        version,
        credits,
        max_items,
        max_bytes,
        serves: Serves::Everyone,
    }
}

fn register(s: &mut Scheduler, id: u64, spec: WorkerSpec) -> WorkerId {
    let id = WorkerId(id);
    assert!(s.register_worker(id, spec));
    id
}

fn submit(s: &mut Scheduler, who: &Tenant, sizes: &[u64], at: Instant) -> RequestId {
    s.submit(request(who, sizes, at)).expect("admitted")
}

fn ok(n: usize) -> Vec<Result<Vec<u8>, String>> {
    (0..n)
        .map(|i| Ok(vec![u8::try_from(i).unwrap_or(0)]))
        .collect()
}

/// Dispatches `n` one-item batches (completing each at once) and returns whose each was.
fn dispatch_one_by_one(
    s: &mut Scheduler,
    w: WorkerId,
    owners: &[(RequestId, Tenant)],
    n: usize,
    now: Instant,
) -> Vec<Tenant> {
    let mut got = Vec::new();
    for _ in 0..n {
        let batch = s.next_batch(w, now).batch.expect("a batch");
        let item = batch.items.first().expect("an item").id;
        let owner = owners
            .iter()
            .find(|(id, _)| *id == item.request)
            .map(|(_, t)| t.clone())
            .expect("a known request");
        got.push(owner);
        let _ = s.complete(w, batch.id, ok(batch.items.len()));
    }
    got
}
