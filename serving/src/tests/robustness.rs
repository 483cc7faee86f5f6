//! Odd settings and a mixed workload: no hang, no panic, nothing left counted.

use std::time::{Duration, Instant};

use super::*;

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
                let _ = s.cancel(id, now);
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
