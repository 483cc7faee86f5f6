//! Fairness between tenants: deficit round robin, weights, the share of a cancelled request.

use std::time::{Duration, Instant};

use super::*;

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
    assert_eq!(s.cancel(id, t0).expect("outstanding").len(), 1, "in flight");
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
    s.cancel(id, t0).expect("outstanding");
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

/// A streamed answer outlives its deadline (which bounds its first part): cancelled long after
/// it, its worker was named overdue at once, and its whole Serve stream (every other tenant's
/// stream on it) was ended. Its grace now runs from the cancel.
#[test]
fn a_stream_cancelled_after_its_deadline_gets_the_grace_from_the_cancel() {
    let t0 = Instant::now();
    let grace = Duration::from_secs(5);
    let mut s: Scheduler = Scheduler::new(Limits {
        cancel_grace: grace,
        ..Limits::default()
    });
    let a = tenant("a");
    let w = WorkerId(1);
    assert!(s.register_worker(w, spec(1, 4, 1, 0)));
    let id = s
        .submit(NewRequest {
            deadline: t0 + Duration::from_secs(1),
            ..request(&a, &[1], t0)
        })
        .expect("admitted");
    let _streaming = s.next_batch(w, t0).batch.expect("dispatched");
    // Cancelled (the client went away) 30 s into the stream.
    let cancelled = t0 + Duration::from_secs(30);
    s.cancel(id, cancelled).expect("outstanding");
    assert_eq!(s.next_cancel_due(), Some(cancelled + grace));
    assert!(
        s.overdue_workers(cancelled + Duration::from_secs(1))
            .is_empty()
    );
    assert_eq!(s.overdue_workers(cancelled + grace), vec![w]);
}

/// Generations would be shared by requests: a tenant asking 1,000 tokens a request would get
/// as much of the model as one asking 10. They are shared by the tokens asked (each item costs
/// its `max_tokens`), and what a generation did not use goes back to its tenant.
#[test]
fn generations_share_a_model_by_tokens_and_unused_tokens_come_back() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        max_tenant_requests: 1000,
        ..Limits::default()
    });
    let w = register(&mut s, 1, spec(1, 1, 1, u64::MAX));
    let (a, b) = (tenant("a"), tenant("b"));
    let generation = |who: &Tenant, tokens: u64| NewRequest {
        cost: tokens,
        ..request(who, &[8], t0)
    };
    let mut owners = Vec::new();
    for _ in 0..20 {
        owners.push((s.submit(generation(&a, 1000)).expect("a"), a.clone()));
    }
    for _ in 0..400 {
        owners.push((s.submit(generation(&b, 10)).expect("b"), b.clone()));
    }
    let got = dispatch_one_by_one(&mut s, w, &owners, 202, t0 + ms(2));
    let for_a = got.iter().filter(|t| **t == a).count();
    // 2,000 tokens each: two of A's for two hundred of B's.
    assert_eq!((for_a, 202 - for_a), (2, 200), "{got:?}");
    // A refund of unused tokens brings A's next generation forward.
    let mut s = Scheduler::new(Limits {
        max_tenant_requests: 1000,
        ..Limits::default()
    });
    let w = register(&mut s, 1, spec(1, 1, 1, u64::MAX));
    let mut owners = Vec::new();
    for _ in 0..3 {
        owners.push((s.submit(generation(&a, 1000)).expect("a"), a.clone()));
    }
    for _ in 0..400 {
        owners.push((s.submit(generation(&b, 10)).expect("b"), b.clone()));
    }
    // B's items go until A has saved up for its first generation; then A's goes.
    let mut before = 0;
    while dispatch_one_by_one(&mut s, w, &owners, 1, t0 + ms(2)) == vec![b.clone()] {
        before += 1;
    }
    assert!(
        (95..=105).contains(&before),
        "{before} of B's before A's first"
    );
    // That generation stopped after 10 tokens: 990 come back, and A's next goes after a few
    // of B's instead of about a hundred.
    s.refund(MODEL, &a, 990);
    let mut between = 0;
    while dispatch_one_by_one(&mut s, w, &owners, 1, t0 + ms(2)) == vec![b.clone()] {
        between += 1;
    }
    assert!(
        between <= 5,
        "{between} of B's between A's first and second"
    );
}

/// A generation whose worker was lost before it started goes back to the front of its
/// tenant's queue, and is charged once: its cost comes back to its tenant as it is requeued, so
/// it goes again at once instead of after another turn's worth of the other tenant's items.
#[test]
fn a_requeued_generation_is_charged_once() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        max_tenant_requests: 1000,
        ..Limits::default()
    });
    let w1 = register(&mut s, 1, spec(1, 1, 1, u64::MAX));
    let (a, b) = (tenant("a"), tenant("b"));
    let generation = |who: &Tenant, tokens: u64| NewRequest {
        cost: tokens,
        ..request(who, &[8], t0)
    };
    let mut owners = Vec::new();
    owners.push((s.submit(generation(&a, 1000)).expect("a"), a.clone()));
    for _ in 0..400 {
        owners.push((s.submit(generation(&b, 10)).expect("b"), b.clone()));
    }
    let owner = |batch: &crate::Batch| {
        let request = batch.items[0].id.request;
        owners
            .iter()
            .find(|(id, _)| *id == request)
            .map(|(_, t)| t.clone())
    };
    // B's items go (each answered) until A has saved up for its generation, which stays on w1.
    let mut before = 0;
    loop {
        let batch = s.next_batch(w1, t0 + ms(2)).batch.expect("a batch");
        if owner(&batch) == Some(a.clone()) {
            break;
        }
        before += 1;
        let _ = s.complete(w1, batch.id, ok(batch.items.len()));
    }
    assert!((95..=105).contains(&before), "{before} of B's before A's");
    // w1 is lost: A's generation is requeued, and goes first on the next worker.
    assert!(s.unregister_worker(w1).is_empty(), "requeued, not failed");
    let w2 = register(&mut s, 2, spec(1, 1, 1, u64::MAX));
    let mut between = 0;
    while dispatch_one_by_one(&mut s, w2, &owners, 1, t0 + ms(3)) == vec![b.clone()] {
        between += 1;
    }
    assert!(
        between <= 1,
        "{between} of B's before A's requeued generation"
    );
}
