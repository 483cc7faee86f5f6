//! Workers and their results: cancellation, lost workers, reassembly, versions, workers of
//! one tenant.

use std::time::Instant;

use super::*;

/// Cancelling leaves queued items to be dispatched, or a cancelled request completes.
#[test]
fn cancel_queued_and_in_flight() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 1, 2, u64::MAX));
    let r = submit(&mut s, &None, &[1, 1, 1], t0);
    let batch = s.next_batch(w, t0).batch.expect("two of three");
    let in_flight = s.cancel(r, t0).expect("outstanding");
    let ids: Vec<ItemId> = in_flight.iter().map(|i| i.item).collect();
    let sent: Vec<ItemId> = batch.items.iter().map(|i| i.id).collect();
    assert_eq!(ids, sent);
    assert!(
        in_flight
            .iter()
            .all(|i| i.worker == w && i.batch == batch.id)
    );
    assert_eq!(s.queue_depth(MODEL), 0, "the third item is gone");
    assert_eq!(s.cancel(r, t0), None, "cancelled once");
    assert!(
        s.complete(w, batch.id, ok(2)).is_empty(),
        "results are dropped"
    );
    assert_eq!(s.in_flight(w), Some(0));
    // Queued only.
    let r = submit(&mut s, &None, &[1], t0);
    assert_eq!(s.cancel(r, t0), Some(Vec::new()));
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
    assert!(s.cancel(second, t0).is_some());
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

/// A streamed item whose worker is lost after its first part would be requeued (its caller
/// would get a second answer's parts after the first's), or an unstarted one failed.
#[test]
fn started_items_fail_when_their_worker_is_lost() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w1 = register(&mut s, 1, spec(1, 2, 1, u64::MAX));
    let r = submit(&mut s, &None, &[1, 1], t0);
    let b0 = s.next_batch(w1, t0).batch.expect("item 0");
    let b1 = s.next_batch(w1, t0).batch.expect("item 1");
    let item0 = b0.items[0].id;
    assert!(s.started(w1, b0.id, item0), "its first part");
    assert!(s.started(w1, b0.id, item0), "later parts too");
    assert!(!s.started(w1, b1.id, item0), "not in that batch");
    assert!(!s.started(WorkerId(9), b0.id, item0), "unknown worker");
    assert!(s.unregister_worker(w1).is_empty(), "item 1 is requeued");
    assert_eq!(s.queue_depth(MODEL), 1, "only the unstarted item");
    let w2 = register(&mut s, 2, spec(1, 1, 1, u64::MAX));
    let b2 = s.next_batch(w2, t0 + ms(1)).batch.expect("item 1 again");
    assert_eq!(b2.items[0].id, b1.items[0].id);
    let done = s.complete(w2, b2.id, ok(1));
    let request = done.first().expect("complete");
    assert_eq!(request.id, r);
    assert_eq!(request.outcomes[0], Outcome::failed(ItemError::Interrupted));
    assert!(request.outcomes[1].result.is_ok());
    assert!(
        !s.started(w2, b2.id, b2.items[0].id),
        "answered: a late part is dropped"
    );
    assert!(s.is_drained());
}
