//! Admission and expiry: deadlines, a full queue, requests larger than the queue, tenant
//! quotas, models nobody (or no allowed worker) serves, and admission by expected wait.

use std::time::{Duration, Instant};

use super::*;

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

/// Dispatches one-item batches to `w` every `every`, completing each, `n` times from `t0`,
/// with `backlog` items kept queued behind them (so that the dispatches measure the rate).
fn serve_under_backlog(
    s: &mut Scheduler,
    w: WorkerId,
    t0: Instant,
    every: Duration,
    n: u32,
) -> Instant {
    let mut now = t0;
    for _ in 0..n {
        submit(s, &None, &[1], now);
        let batch = s.next_batch(w, now).batch.expect("a batch");
        let _ = s.complete(w, batch.id, ok(batch.items.len()));
        now += every;
    }
    now
}

/// A request that would outwait its deadline is queued (to fail when the deadline passes, a
/// 504 a minute late) instead of refused at once with the wait and a retry hint; or one that
/// fits is refused; or a model whose rate is not measured yet refuses anything.
#[test]
fn a_request_that_would_outwait_its_deadline_is_refused_at_once() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        max_queue_delay: Duration::ZERO,
        ..Limits::default()
    });
    let w = register(&mut s, 1, spec(1, 1, 1, u64::MAX));
    // No rate yet: a deep queue is admitted.
    for _ in 0..50 {
        submit(&mut s, &None, &[1], t0);
    }
    // One item every 10 ms with 50 behind: 100 items/s.
    let now = serve_under_backlog(&mut s, w, t0, ms(10), 60);
    let queued = s.queue_depth(MODEL);
    assert!(queued >= 50, "{queued}");
    // 50 ahead at 100/s: about half a second. A 2 s deadline fits, a 100 ms one does not.
    let mut fits = request(&None, &[1], now);
    fits.deadline = now + Duration::from_secs(2);
    s.submit(fits).expect("0.5 s of wait within 2 s");
    let mut late = request(&None, &[1], now);
    late.deadline = now + ms(100);
    match s.submit(late) {
        Err(Admission::Overloaded {
            wait, retry_after, ..
        }) => {
            assert!(wait > ms(400) && wait < ms(700), "{wait:?}");
            assert!(retry_after >= Duration::from_secs(1), "{retry_after:?}");
        }
        other => panic!("expected Overloaded, got {other:?}"),
    }
}

/// A tenant's wait counts its own sub-queue at its fair share: another tenant's deep backlog
/// does not refuse a light tenant, whose turn comes each round.
#[test]
fn the_wait_is_the_tenants_own_at_its_fair_share() {
    let t0 = Instant::now();
    let mut s = Scheduler::new(Limits {
        max_queue_delay: Duration::ZERO,
        ..Limits::default()
    });
    let w = register(&mut s, 1, spec(1, 1, 1, u64::MAX));
    for _ in 0..200 {
        submit(&mut s, &tenant("heavy"), &[1], t0);
    }
    let now = serve_under_backlog(&mut s, w, t0, ms(10), 60);
    // heavy: ~200 ahead at half of 100/s: about 4 s. light: its one item at half the rate.
    let mut light = request(&tenant("light"), &[1], now);
    light.deadline = now + ms(500);
    s.submit(light)
        .expect("the light tenant's turn comes within 20 ms");
    let mut heavy = request(&tenant("heavy"), &[1], now);
    heavy.deadline = now + ms(500);
    assert!(
        matches!(s.submit(heavy), Err(Admission::Overloaded { .. })),
        "the heavy tenant's item waits behind its own 200"
    );
}
