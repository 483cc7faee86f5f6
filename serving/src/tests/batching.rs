//! Batches: taken at once by an idle worker; for a busy one, closed at max items, max bytes or
//! the delay; bounded by credits.

use std::time::Instant;

use super::*;

/// Gives worker `w` (of at least two credits) a one-item batch to hold, so that it is busy and
/// the next batch waits for company; returns the queue to empty.
fn make_busy(s: &mut Scheduler, w: WorkerId, t0: Instant) {
    submit(s, &None, &[1], t0);
    let held = s
        .next_batch(w, t0)
        .batch
        .expect("an idle worker takes a lone item");
    assert_eq!(held.items.len(), 1);
}

/// A lone request waits the queue delay although a worker sits idle (every request then pays
/// it), or a busy worker takes a lone item before the delay (no batching under load).
#[test]
fn an_idle_worker_takes_a_lone_item_at_once_a_busy_one_lets_it_batch() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    s.set_queue_delay(MODEL, ms(5));
    let w = register(&mut s, 1, spec(1, 2, 8, u64::MAX));
    submit(&mut s, &None, &[1], t0);
    let first = s.next_batch(w, t0).batch.expect("idle: at once, no delay");
    submit(&mut s, &None, &[1], t0);
    let d = s.next_batch(w, t0 + ms(1));
    assert_eq!(
        (d.batch, d.retry_at),
        (None, Some(t0 + ms(5))),
        "busy: let it batch"
    );
    submit(&mut s, &None, &[1], t0 + ms(2));
    let _ = s.complete(w, first.id, ok(1));
    let both = s
        .next_batch(w, t0 + ms(2))
        .batch
        .expect("idle again: at once");
    assert_eq!(both.items.len(), 2, "what piled up meanwhile goes together");
}

/// A batch does not close at the worker's max items, or takes more than that.
#[test]
fn batch_closes_at_max_items() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits::default());
    let w = register(&mut s, 1, spec(1, 4, 4, u64::MAX));
    make_busy(&mut s, w, t0);
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
    make_busy(&mut s, w, t0);
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
    let w = register(&mut s, 1, spec(1, 2, 8, u64::MAX));
    make_busy(&mut s, w, t0);
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
