use std::time::{Duration, Instant};

use super::*;

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

/// A flooding tenant would starve a quiet one (no round robin across tenants).
#[test]
fn drr_flood_does_not_starve_a_quiet_tenant() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        max_tenant_requests: 1000,
        ..Limits::default()
    });
    let w = register(&mut s, 1, spec(1, 1, 1, u64::MAX));
    let (a, b) = (tenant("a"), tenant("b"));
    let mut owners = Vec::new();
    // A submits 50 requests for each one of B, ten times over.
    for _ in 0..10 {
        for _ in 0..50 {
            owners.push((submit(&mut s, &a, &[8], t0), a.clone()));
        }
        owners.push((submit(&mut s, &b, &[8], t0), b.clone()));
    }
    let got = dispatch_one_by_one(&mut s, w, &owners, 20, t0 + ms(2));
    let for_b = got.iter().filter(|t| **t == b).count();
    assert_eq!(
        for_b, 10,
        "equal weights: B gets half of the first 20: {got:?}"
    );
    assert_eq!(s.queued_for_tenant(&b), 0);
    assert_eq!(s.queued_for_tenant(&a), 490);
}

/// Tenant weights are not honoured (a 2:1 weight does not give a 2:1 split).
#[test]
fn drr_weights_split_two_to_one() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 1, 1, u64::MAX));
    let (a, b) = (tenant("a"), tenant("b"));
    s.set_tenant_weight(a.clone(), 2);
    let mut owners = Vec::new();
    for _ in 0..40 {
        owners.push((submit(&mut s, &b, &[1], t0), b.clone()));
        owners.push((submit(&mut s, &a, &[1], t0), a.clone()));
    }
    let got = dispatch_one_by_one(&mut s, w, &owners, 30, t0 + ms(2));
    let for_a = got.iter().filter(|t| **t == a).count();
    assert_eq!((for_a, 30 - for_a), (20, 10), "{got:?}");
    // And within a batch of several items the split holds too.
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 1, 9, u64::MAX));
    s.set_tenant_weight(a.clone(), 2);
    submit(&mut s, &a, &[1; 20], t0);
    submit(&mut s, &b, &[1; 20], t0);
    let batch = s.next_batch(w, t0).batch.expect("nine items close a batch");
    assert_eq!(batch.items.len(), 9);
    assert_eq!(s.queued_for_tenant(&a), 14);
    assert_eq!(s.queued_for_tenant(&b), 17);
}

/// A batch does not close at the worker's max items, or takes more than that.
#[test]
fn batch_closes_at_max_items() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 4, 4, u64::MAX));
    submit(&mut s, &None, &[1, 1, 1], t0);
    let d = s.next_batch(w, t0);
    assert_eq!(d.batch, None, "three of four items, young: wait");
    assert_eq!(d.retry_at, Some(t0 + ms(1)));
    submit(&mut s, &None, &[1, 1, 1], t0);
    let batch = s
        .next_batch(w, t0)
        .batch
        .expect("six queued, max four: close");
    assert_eq!(batch.items.len(), 4);
    assert_eq!(s.queue_depth(MODEL), 2);
}

/// A batch does not close at the worker's max bytes, passes them, or drops an oversized item.
#[test]
fn batch_closes_at_max_bytes() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 4, 100, 100));
    submit(&mut s, &None, &[40, 40], t0);
    assert_eq!(
        s.next_batch(w, t0).batch,
        None,
        "80 of 100 bytes, young: wait"
    );
    submit(&mut s, &None, &[40], t0);
    let batch = s.next_batch(w, t0).batch.expect("120 bytes queued: close");
    let sizes: Vec<u64> = batch.items.iter().map(|i| i.bytes).collect();
    assert_eq!(sizes, [40, 40], "the third would pass 100 bytes");
    // An item larger than the limit goes alone.
    submit(&mut s, &None, &[250, 10], t0);
    let batch = s
        .next_batch(w, t0)
        .batch
        .expect("bytes over the limit: close");
    let sizes: Vec<u64> = batch.items.iter().map(|i| i.bytes).collect();
    assert_eq!(sizes, [40], "the oldest first, alone since 250 would pass");
    let batch = s.next_batch(w, t0).batch.expect("250 bytes queued: close");
    let sizes: Vec<u64> = batch.items.iter().map(|i| i.bytes).collect();
    assert_eq!(sizes, [250]);
}

/// A short queue is dispatched before its delay, or never after it.
#[test]
fn batch_closes_by_delay_not_before() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    s.set_queue_delay(MODEL, ms(5));
    let w = register(&mut s, 1, spec(1, 1, 8, u64::MAX));
    submit(&mut s, &None, &[1], t0);
    let d = s.next_batch(w, t0 + ms(4));
    assert_eq!((d.batch, d.retry_at), (None, Some(t0 + ms(5))));
    assert_eq!(s.next_deadline(), Some(t0 + ms(5)));
    let batch = s
        .next_batch(w, t0 + ms(5))
        .batch
        .expect("the delay has passed");
    assert_eq!(batch.items.len(), 1);
    assert_eq!(s.next_deadline(), None);
}

/// A worker gets batches beyond its credits, or completing a batch does not return its credit.
#[test]
fn credits_bound_batches_in_flight() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 2, 1, u64::MAX));
    submit(&mut s, &None, &[1, 1, 1], t0);
    let first = s.next_batch(w, t0).batch.expect("credit 1 of 2");
    let _second = s.next_batch(w, t0).batch.expect("credit 2 of 2");
    assert_eq!(s.next_batch(w, t0).batch, None, "no credit left");
    assert_eq!(s.in_flight(w), Some(2));
    let _ = s.complete(w, first.id, ok(1));
    assert!(s.next_batch(w, t0).batch.is_some(), "the credit came back");
}

/// An item past its deadline is dispatched, or its request never completes.
#[test]
fn deadline_expired_items_are_never_dispatched() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 1, 8, u64::MAX));
    let mut late = request(&None, &[1, 1], t0);
    late.deadline = t0 + ms(3);
    let late = s.submit(late).expect("admitted");
    let on_time = submit(&mut s, &None, &[1], t0);
    let d = s.next_batch(w, t0 + ms(3));
    let batch = d.batch.expect("the other request still goes");
    assert!(batch.items.iter().all(|i| i.id.request == on_time));
    let expired = d.expired.first().expect("the late request completed");
    assert_eq!(expired.id, late);
    assert_eq!(expired.outcomes.len(), 2);
    assert!(
        expired
            .outcomes
            .iter()
            .all(|o| o.result == Err(ItemError::DeadlineExceeded) && o.version.is_none())
    );
    let _ = s.complete(w, batch.id, ok(1));
    // Expiry with no batch asked for: the sweep.
    let mut lone = request(&None, &[1], t0);
    lone.deadline = t0 + ms(10);
    s.submit(lone).expect("admitted");
    assert_eq!(
        s.next_deadline(),
        Some(t0 + ms(1)),
        "the queue delay comes first"
    );
    assert!(s.expire_deadlines(t0 + ms(9)).is_empty());
    assert_eq!(s.expire_deadlines(t0 + ms(10)).len(), 1);
    assert_eq!(s.queue_depth(MODEL), 0);
}

/// A full queue admits a request, or a refusal leaves something counted.
#[test]
fn queue_full_refuses_and_changes_nothing() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        max_queue_items: 4,
        ..Limits::default()
    });
    let a = tenant("a");
    submit(&mut s, &a, &[1, 1, 1], t0);
    let refused = s.submit(request(&a, &[1, 1], t0));
    assert_eq!(
        refused,
        Err(Admission::QueueFull {
            model: MODEL.to_owned(),
            limit: 4
        })
    );
    assert_eq!(s.queue_depth(MODEL), 3);
    assert_eq!(s.outstanding_for_tenant(&a), 1);
    assert_eq!(s.outstanding(), 1);
    assert!(
        s.submit(request(&a, &[1], t0)).is_ok(),
        "one more still fits"
    );
    assert!(matches!(
        s.submit(request(&a, &[], t0)),
        Err(Admission::NoItems { .. })
    ));
}

/// A request larger than the whole queue was refused as "queue full" (429 + Retry-After)
/// though no retry could ever pass; it is refused as too large (413 / INVALID_ARGUMENT).
#[test]
fn a_request_larger_than_the_queue_is_too_large_not_full() {
    let t0 = Instant::now();
    let mut s: Scheduler = Scheduler::new(Limits {
        max_queue_items: 4,
        ..Limits::default()
    });
    let a = tenant("a");
    let refused = s.submit(request(&a, &[1, 1, 1, 1, 1], t0));
    assert_eq!(
        refused,
        Err(Admission::TooLarge {
            model: MODEL.to_owned(),
            items: 5,
            limit: 4
        })
    );
    let e = super::InferError::Refused(refused.expect_err("refused"));
    assert_eq!(e.kind(), crate::Kind::InvalidArgument);
    assert!(e.never_fits());
    assert_eq!(e.retry_after(), None);
    assert_eq!(s.outstanding(), 0);
    assert!(s.submit(request(&a, &[1, 1, 1, 1], t0)).is_ok(), "4 fit");
}

/// A tenant passes its request quota, or the refusal counts, or it limits others.
#[test]
fn tenant_quota_refuses_and_changes_nothing() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        max_tenant_requests: 2,
        ..Limits::default()
    });
    let (a, b) = (tenant("a"), tenant("b"));
    submit(&mut s, &a, &[1], t0);
    submit(&mut s, &a, &[1], t0);
    let refused = s.submit(request(&a, &[1], t0));
    assert_eq!(
        refused,
        Err(Admission::TenantQuota {
            tenant: "a".to_owned(),
            limit: 2
        })
    );
    assert_eq!(
        refused.map_err(|e| e.to_string()),
        Err("tenant 'a' may have at most 2 requests outstanding".to_owned())
    );
    assert_eq!((s.outstanding_for_tenant(&a), s.queue_depth(MODEL)), (2, 2));
    assert!(
        s.submit(request(&b, &[1], t0)).is_ok(),
        "another tenant is not limited"
    );
    for _ in 0..3 {
        assert!(
            s.submit(request(&None, &[1], t0)).is_ok(),
            "the admin has no quota"
        );
    }
}

/// Cancelling leaves queued items to be dispatched, or a cancelled request completes.
#[test]
fn cancel_queued_and_in_flight() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 1, 2, u64::MAX));
    let r = submit(&mut s, &None, &[1, 1, 1], t0);
    let batch = s.next_batch(w, t0).batch.expect("two of three");
    let in_flight = s.cancel(r).expect("outstanding");
    let ids: Vec<ItemId> = in_flight.iter().map(|i| i.item).collect();
    let sent: Vec<ItemId> = batch.items.iter().map(|i| i.id).collect();
    assert_eq!(ids, sent);
    assert!(
        in_flight
            .iter()
            .all(|i| i.worker == w && i.batch == batch.id)
    );
    assert_eq!(s.queue_depth(MODEL), 0, "the third item is gone");
    assert_eq!(s.cancel(r), None, "cancelled once");
    assert!(
        s.complete(w, batch.id, ok(2)).is_empty(),
        "results are dropped"
    );
    assert_eq!(s.in_flight(w), Some(0));
    // Queued only.
    let r = submit(&mut s, &None, &[1], t0);
    assert_eq!(s.cancel(r), Some(Vec::new()));
    assert_eq!(s.next_batch(w, t0 + ms(9)).batch, None);
    assert!(s.is_drained());
}

/// A lost worker's items are lost, requeued behind others, or requeued forever.
#[test]
fn lost_worker_requeues_once_then_unavailable() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w1 = register(&mut s, 1, spec(1, 1, 2, u64::MAX));
    let first = submit(&mut s, &None, &[1, 1], t0);
    let second = submit(&mut s, &None, &[1], t0);
    let b1 = s.next_batch(w1, t0).batch.expect("a batch");
    assert!(b1.items.iter().all(|i| i.id.request == first));
    assert!(s.unregister_worker(w1).is_empty(), "requeued, not failed");
    assert_eq!(s.queue_depth(MODEL), 3);
    let w2 = register(&mut s, 2, spec(1, 1, 1, u64::MAX));
    let w3 = register(&mut s, 3, spec(1, 1, 1, u64::MAX));
    let now = t0 + ms(1);
    let b2 = s.next_batch(w2, now).batch.expect("a batch");
    let b3 = s.next_batch(w3, now).batch.expect("a batch");
    let got = [&b2, &b3].map(|b| b.items.first().map(|i| i.id));
    let want = [0, 1].map(|index| {
        Some(ItemId {
            request: first,
            index,
        })
    });
    assert_eq!(got, want, "at the front, in their order");
    assert!(s.unregister_worker(w2).is_empty(), "item 1 is still out");
    let done = s.unregister_worker(w3);
    let failed = done.first().expect("the first request failed");
    assert_eq!(failed.id, first);
    assert_eq!(
        failed.outcomes,
        vec![Outcome::failed(ItemError::Unavailable); 2]
    );
    let late = s.complete(w2, b2.id, ok(1));
    assert_eq!(late, Vec::new(), "a late result is ignored");
    assert_eq!(s.queue_depth(MODEL), 1);
    assert_eq!(s.outstanding(), 1, "only the second is left");
    assert!(s.cancel(second).is_some());
    assert!(s.is_drained());
}

/// Results are reassembled out of item order, or lose the version that computed them.
#[test]
fn reassembly_in_item_order_across_batches_and_workers() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w1 = register(&mut s, 1, spec(3, 2, 2, u64::MAX));
    let w2 = register(&mut s, 2, spec(3, 2, 2, u64::MAX));
    let r = submit(&mut s, &None, &[1; 5], t0);
    let now = t0 + ms(1);
    let b1 = s.next_batch(w1, now).batch.expect("items 0, 1");
    let b2 = s.next_batch(w2, now).batch.expect("items 2, 3");
    let b3 = s.next_batch(w1, now).batch.expect("item 4");
    let result = |b: &Batch| -> Vec<Result<Vec<u8>, String>> {
        b.items
            .iter()
            .map(|i| match i.id.index {
                3 => Err("bad input".to_owned()),
                n => Ok(vec![u8::try_from(n).unwrap_or(0)]),
            })
            .collect()
    };
    assert!(s.complete(w1, b3.id, result(&b3)).is_empty());
    assert!(s.complete(w2, b2.id, result(&b2)).is_empty());
    let done = s.complete(w1, b1.id, result(&b1));
    assert_eq!(done.len(), 1);
    let c = done.first().expect("complete");
    assert_eq!((c.id, c.model.as_str()), (r, MODEL));
    let got: Vec<Result<Vec<u8>, ItemError>> =
        c.outcomes.iter().map(|o| o.result.clone()).collect();
    assert_eq!(
        got,
        [
            Ok(vec![0]),
            Ok(vec![1]),
            Ok(vec![2]),
            Err(ItemError::Failed("bad input".to_owned())),
            Ok(vec![4])
        ]
    );
    assert!(c.outcomes.iter().all(|o| o.version == Some(3)));
}

/// Requests for a model nobody serves wait forever, or fail before their wait, or a served
/// model's requests fail as if unserved.
#[test]
fn no_worker_expiry() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let r = submit(&mut s, &None, &[1, 1], t0);
    let mut other = request(&None, &[1], t0);
    other.model = "served".to_owned();
    s.submit(other).expect("admitted");
    let mut served = spec(1, 0, 1, 1);
    served.model = "served".to_owned();
    register(&mut s, 1, served);
    assert!(s.expire_without_workers(t0 + ms(4999), ms(5000)).is_empty());
    let done = s.expire_without_workers(t0 + ms(5000), ms(5000));
    assert_eq!(done.len(), 1);
    let c = done.first().expect("one");
    assert_eq!(c.id, r);
    assert_eq!(c.outcomes, vec![Outcome::failed(ItemError::NoWorker); 2]);
    assert_eq!((s.queue_depth(MODEL), s.queue_depth("served")), (0, 1));
}

/// An old version's worker competes with the newest one, or outcomes misname the version.
#[test]
fn newest_version_takes_priority() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let old = register(&mut s, 1, spec(1, 4, 1, u64::MAX));
    let new = register(&mut s, 2, spec(2, 1, 1, u64::MAX));
    submit(&mut s, &None, &[1], t0);
    submit(&mut s, &None, &[1], t0);
    let now = t0 + ms(1);
    assert_eq!(s.next_batch(old, now).batch, None, "v2 has credit");
    let b = s.next_batch(new, now).batch.expect("v2 first");
    assert_eq!(b.version, 2);
    let spill = s
        .next_batch(old, now)
        .batch
        .expect("v2 is full: v1 takes the overflow");
    assert_eq!(spill.version, 1);
    let done = s.complete(old, spill.id, ok(1));
    assert_eq!(
        done.first().map(|c| c.outcomes.clone()),
        Some(vec![Outcome {
            result: Ok(vec![0]),
            version: Some(1)
        }])
    );
    let done = s.complete(new, b.id, ok(1));
    assert_eq!(
        done.first()
            .and_then(|c| c.outcomes.first())
            .and_then(|o| o.version),
        Some(2)
    );
}

/// Odd settings (zero weight, quantum, max items, credits) hang or panic the scheduler.
#[test]
fn zero_settings_neither_hang_nor_panic() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        quantum: 0,
        max_queue_delay: Duration::MAX,
        ..Limits::default()
    });
    s.set_tenant_weight(tenant("a"), 0);
    let none = register(&mut s, 1, spec(1, 0, 1, 1));
    let w = register(&mut s, 2, spec(1, 1, 0, 0));
    assert!(!s.register_worker(w, spec(1, 1, 1, 1)), "the id is taken");
    submit(&mut s, &tenant("a"), &[5, 5], t0);
    assert_eq!(s.next_batch(none, t0).batch, None, "no credits");
    let b = s.next_batch(w, t0).batch.expect("max items 0 counts as 1");
    assert_eq!(b.items.len(), 1);
    assert_eq!(s.next_batch(WorkerId(99), t0), Dispatch::default());
    assert!(s.complete(WorkerId(99), b.id, ok(1)).is_empty());
    assert!(s.complete(w, BatchId(12345), ok(1)).is_empty());
    let _ = s.complete(w, b.id, Vec::<Result<Vec<u8>, String>>::new());
    let b = s.next_batch(w, t0).batch.expect("the second item");
    let done = s.complete(w, b.id, ok(3));
    let c = done.first().expect("complete");
    assert!(matches!(
        c.outcomes.first().map(|o| &o.result),
        Some(Err(ItemError::Failed(_)))
    ));
}

/// Some count (queue, tenant, in flight, request) stays up after every request has ended.
#[test]
fn nothing_leaks_after_a_mixed_workload() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w1 = register(&mut s, 1, spec(1, 2, 3, 64));
    let w2 = register(&mut s, 2, spec(2, 1, 2, 64));
    let tenants = [tenant("a"), tenant("b"), None];
    s.set_tenant_weight(tenant("b"), 3);
    let mut cancel_me = Vec::new();
    for (i, who) in tenants.iter().cycle().take(30).enumerate() {
        let mut r = request(who, &[8, 16, 4], t0);
        if i % 7 == 0 {
            r.deadline = t0 + ms(2);
        }
        let id = s.submit(r).expect("admitted");
        if i % 5 == 0 {
            cancel_me.push(id);
        }
    }
    let mut now = t0 + ms(1);
    let mut finished: Vec<Completed> = Vec::new();
    let mut lost_once = false;
    for round in 0..200 {
        if round == 1 {
            for id in cancel_me.drain(..) {
                let _ = s.cancel(id);
            }
        }
        for w in [w1, w2] {
            let d = s.next_batch(w, now);
            finished.extend(d.expired);
            if let Some(b) = d.batch {
                if w == w2 && !lost_once {
                    lost_once = true;
                    finished.extend(s.unregister_worker(w2));
                    assert!(s.register_worker(w2, spec(2, 1, 2, 64)));
                    continue;
                }
                finished.extend(s.complete(w, b.id, ok(b.items.len())));
            }
        }
        if s.is_drained() {
            break;
        }
        now += ms(1);
    }
    // Every request ended one way: completed (some by deadline) or cancelled.
    let expired = finished
        .iter()
        .filter(|c| {
            c.outcomes
                .iter()
                .any(|o| o.result == Err(ItemError::DeadlineExceeded))
        })
        .count();
    assert!(
        lost_once && expired > 0,
        "the workload lost a worker and expired items"
    );
    assert_eq!(finished.len() + 6, 30, "30 requests, 6 cancelled");
    assert!(s.is_drained(), "outstanding {}", s.outstanding());
    for who in &tenants {
        assert_eq!(
            (s.queued_for_tenant(who), s.outstanding_for_tenant(who)),
            (0, 0)
        );
    }
    assert_eq!(
        (s.queue_depth(MODEL), s.in_flight(w1), s.in_flight(w2)),
        (0, Some(0), Some(0))
    );
    assert_eq!(s.serving_workers(MODEL), 2);
    assert!(s.unregister_worker(w1).is_empty());
    assert!(s.unregister_worker(w2).is_empty());
    assert_eq!((s.serving_workers(MODEL), s.next_deadline()), (0, None));
}

#[test]
fn a_worker_that_serves_one_tenant_takes_only_that_tenants_items() {
    let mut s = Scheduler::new(Limits::default());
    let t0 = Instant::now();
    let (a, b) = (tenant("a"), tenant("b"));
    let mut only_b = spec(1, 1, 8, 1 << 20);
    only_b.serves = Serves::Only(b.clone());
    let w = register(&mut s, 1, only_b);
    submit(&mut s, &a, &[1, 1, 1], t0);
    let rb = submit(&mut s, &b, &[1, 1], t0);
    let batch = s.next_batch(w, t0 + ms(5)).batch.expect("b's items");
    assert_eq!(batch.items.len(), 2);
    assert!(batch.items.iter().all(|i| i.id.request == rb));
    let done = s.complete(w, batch.id, ok(1));
    assert_eq!(done.len(), 1);
    // a's items stay queued: this worker never takes them.
    assert!(s.next_batch(w, t0 + ms(10)).batch.is_none());
    assert_eq!(s.queue_depth(MODEL), 3);
    // ...and with nothing of b's queued, no time-based retry is asked for a's items.
    assert_eq!(s.queued_for_tenant(&a), 3);
}

#[test]
fn items_no_worker_may_receive_expire_even_when_the_model_has_workers() {
    let mut s = Scheduler::new(Limits::default());
    let t0 = Instant::now();
    let (a, b) = (tenant("a"), tenant("b"));
    let mut only_b = spec(1, 1, 8, 1 << 20);
    only_b.serves = Serves::Only(b.clone());
    register(&mut s, 1, only_b);
    let ra = submit(&mut s, &a, &[1], t0);
    submit(&mut s, &b, &[1], t0);
    assert_eq!(s.next_no_worker_expiry(ms(100)), Some(t0 + ms(100)));
    assert!(s.expire_without_workers(t0 + ms(50), ms(100)).is_empty());
    let done = s.expire_without_workers(t0 + ms(100), ms(100));
    assert_eq!(done.len(), 1);
    assert_eq!(done[0].id, ra);
    assert_eq!(done[0].outcomes[0].result, Err(ItemError::NoWorker));
    assert_eq!(s.queued_for_tenant(&b), 1);
    assert_eq!(s.next_no_worker_expiry(ms(100)), None);
}

/// A cancelled request gave its tenant's share back at once while its worker still computed
/// it: a tenant could keep a worker busy without end by cancelling. It now counts until the
/// worker answers its batch, or until its deadline plus the grace, when that worker is named
/// to be ended (and once it is, the share is free).
#[test]
fn a_cancelled_request_counts_until_its_worker_answers_or_overruns_the_grace() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(5);
    let mut s: Scheduler = Scheduler::new(Limits {
        max_tenant_requests: 1,
        max_queue_delay: Duration::ZERO,
        cancel_grace: grace,
        ..Limits::default()
    });
    let a = tenant("a");
    let w = WorkerId(1);
    assert!(s.register_worker(w, spec(1, 4, 8, 0)));

    // Answered after the cancel: the share comes back with the answer.
    let id = submit(&mut s, &a, &[1], t0);
    let batch = s.next_batch(w, t0).batch.expect("dispatched");
    assert_eq!(s.cancel(id).expect("outstanding").len(), 1, "in flight");
    assert_eq!(s.outstanding_for_tenant(&a), 1, "still at the worker");
    assert_eq!(
        s.counted_tenants(),
        vec![a.clone()],
        "listed while it counts"
    );
    assert!(matches!(
        s.submit(request(&a, &[1], t0)),
        Err(Admission::TenantQuota { .. })
    ));
    let done = s.complete(w, batch.id, ok(1));
    assert!(done.is_empty(), "a cancelled request completes nothing");
    assert_eq!(s.outstanding_for_tenant(&a), 0);
    assert_eq!(
        s.take_settled_tenants(),
        vec![a.clone()],
        "its gauge is to be refreshed"
    );
    assert!(s.counted_tenants().is_empty());
    assert!(s.is_drained());

    // Never answered: at its deadline plus the grace its worker is named, and once that
    // worker is gone the share is free.
    let id = submit(&mut s, &a, &[1], t0);
    let _held = s.next_batch(w, t0).batch.expect("dispatched");
    s.cancel(id).expect("outstanding");
    let deadline = t0 + Duration::from_secs(60);
    assert_eq!(s.next_cancel_due(), Some(deadline + grace));
    assert!(s.overdue_workers(deadline).is_empty(), "within the grace");
    assert_eq!(s.overdue_workers(deadline + grace), vec![w]);
    assert_eq!(s.outstanding_for_tenant(&a), 1);
    let completed = s.unregister_worker(w);
    assert!(completed.is_empty());
    assert_eq!(s.outstanding_for_tenant(&a), 0);
    assert_eq!(s.next_cancel_due(), None);
    assert!(s.is_drained());
}
