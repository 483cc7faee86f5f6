//! The engine and its driver in process: fake workers on the engine's own channels, real
//! time (short), real tasks. The failure paths: no worker, expired deadline, cancelled caller,
//! lost workers, full queue, and the credit rule.

use std::sync::Arc;
use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use tokio_util::sync::CancellationToken;

use super::engine::{StreamEnd, WorkerOffer, WorkerStream};
use super::*;
use modelshare_core::metrics::Metrics;

const MODEL: &str = "enc";

fn engine(config: EngineConfig) -> Engine {
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    Engine::start(config, metrics, CancellationToken::new())
}

fn quick() -> EngineConfig {
    let mut c = EngineConfig {
        no_worker_wait: Duration::from_millis(100),
        ..EngineConfig::default()
    };
    c.limits.max_queue_delay = Duration::ZERO;
    c
}

fn text(s: &str) -> pb::Item {
    pb::Item {
        input: Some(pb::item::Input::Text(pb::TextInput { text: s.into() })),
        ..Default::default()
    }
}

fn request(tenant: Option<&str>, texts: &[&str], timeout: Duration) -> InferRequest {
    InferRequest {
        tenant: tenant.map(str::to_owned),
        model: MODEL.into(),
        items: texts.iter().map(|t| text(t)).collect(),
        deadline: Instant::now() + timeout,
        max_outstanding: None,
        text_input: None,
    }
}

fn offer(version: u32, credits: u32, max_items: usize) -> WorkerOffer {
    WorkerOffer {
        spec: WorkerSpec {
            model: MODEL.into(),
            version,
            credits,
            max_items,
            max_bytes: 1 << 20,
            serves: Serves::Everyone,
        },
        serve_id: format!("w{version}"),
        session_id: "s".into(),
        tenant: None,
        accepts_text: true,
        accepts_tensors: true,
        inputs: Vec::new(),
        outputs: Vec::new(),
        device: None,
    }
}

/// The next event sent to a worker (within 2 s).
async fn next(w: &mut WorkerStream) -> pb::serve_event::Kind {
    tokio::time::timeout(Duration::from_secs(2), w.events.recv())
        .await
        .expect("an event in time")
        .expect("stream open")
        .expect("not an error")
        .kind
        .expect("kind")
}

async fn next_batch(w: &mut WorkerStream) -> pb::Batch {
    match next(w).await {
        pb::serve_event::Kind::Batch(b) => b,
        other => panic!("expected a batch, got {other:?}"),
    }
}

/// Answers every item of `batch` with its text's length in one byte.
fn answer(batch: &pb::Batch) -> pb::BatchResult {
    pb::BatchResult {
        batch_id: batch.batch_id,
        results: batch
            .items
            .iter()
            .map(|item| {
                let len = match &item.input {
                    Some(pb::item::Input::Text(t)) => t.text.len(),
                    _ => 0,
                };
                pb::ItemResult {
                    item_id: item.item_id,
                    outcome: Some(pb::item_result::Outcome::Output(pb::ItemOutput {
                        tensors: vec![pb::TensorOutput {
                            name: "len".into(),
                            data: vec![u8::try_from(len).unwrap_or(0)].into(),
                            ..Default::default()
                        }],
                        parameters: Default::default(),
                    })),
                }
            })
            .collect(),
    }
}

fn lens(r: &InferResponse) -> Vec<u8> {
    r.outputs.iter().map(|o| o.tensors[0].data[0]).collect()
}

async fn drained(e: &Engine) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let s = e.snapshot().await;
        if s.drained && s.outstanding == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "not drained: {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn a_request_is_batched_to_a_worker_and_answered_in_item_order() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(3, 1, 8)).expect("open");
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(
                Some("a"),
                &["x", "yyy", "zz"],
                Duration::from_secs(5),
            ))
            .await
        }
    });
    let batch = next_batch(&mut w).await;
    assert_eq!(batch.items.len(), 3);
    assert_eq!(batch.version, 3);
    assert!(batch.items.iter().all(|i| i.deadline_unix_ms > 0));
    // Results in any order.
    let mut result = answer(&batch);
    result.results.reverse();
    e.worker_result(w.id, result).await;
    let r = call.await.expect("task").expect("answered");
    assert_eq!(lens(&r), vec![1, 3, 2]);
    assert_eq!((r.version(), r.versions.clone()), (3, vec![3, 3, 3]));
    drained(&e).await;
}

#[tokio::test]
async fn with_no_worker_a_request_waits_then_is_unavailable_naming_the_model() {
    let e = engine(quick());
    let started = Instant::now();
    let err = e
        .infer(request(None, &["x"], Duration::from_secs(5)))
        .await
        .expect_err("no worker");
    assert!(started.elapsed() >= Duration::from_millis(100));
    assert!(matches!(err, InferError::NoWorker { .. }), "{err:?}");
    assert_eq!(err.kind(), crate::Kind::Unavailable);
    assert!(err.to_string().contains("no worker serves model 'enc'"));
    // A worker that arrives within the wait gets it.
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(None, &["abcd"], Duration::from_secs(5)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(30)).await;
    let mut w = e.open_worker(offer(1, 1, 8)).expect("open");
    let batch = next_batch(&mut w).await;
    e.worker_result(w.id, answer(&batch)).await;
    assert_eq!(lens(&call.await.expect("task").expect("answered")), vec![4]);
    drained(&e).await;
}

#[tokio::test]
async fn an_expired_deadline_is_never_dispatched() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 1)).expect("open");
    // The worker's one credit is taken by a first request...
    let first = tokio::spawn({
        let e = e.clone();
        async move { e.infer(request(None, &["a"], Duration::from_secs(5))).await }
    });
    let b1 = next_batch(&mut w).await;
    // ...so the second waits in the queue past its deadline.
    let err = e
        .infer(request(None, &["b"], Duration::from_millis(50)))
        .await
        .expect_err("deadline");
    assert_eq!(err.kind(), crate::Kind::DeadlineExceeded);
    e.worker_result(w.id, answer(&b1)).await;
    first.await.expect("task").expect("first answered");
    // Nothing more was sent.
    assert!(w.events.try_recv().is_err());
    drained(&e).await;
}

#[tokio::test]
async fn a_cancelled_caller_leaves_the_queue_and_its_worker_is_told() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 8)).expect("open");
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(Some("a"), &["a", "b"], Duration::from_secs(5)))
                .await
        }
    });
    let batch = next_batch(&mut w).await;
    call.abort();
    match next(&mut w).await {
        pb::serve_event::Kind::Cancel(c) => {
            let sent: Vec<u64> = batch.items.iter().map(|i| i.item_id).collect();
            assert_eq!(c.item_ids.len(), 2);
            assert!(c.item_ids.iter().all(|id| sent.contains(id)));
        }
        other => panic!("expected a cancel, got {other:?}"),
    }
    // The late answer is discarded and returns the credit.
    e.worker_result(w.id, answer(&batch)).await;
    drained(&e).await;
    // The credit came back: the next request is served.
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(None, &["xyz"], Duration::from_secs(5)))
                .await
        }
    });
    let batch = next_batch(&mut w).await;
    e.worker_result(w.id, answer(&batch)).await;
    assert_eq!(lens(&call.await.expect("task").expect("answered")), vec![3]);
}

/// A worker that answers its batch and closes its stream at once (a worker stopping, SIGTERM):
/// the answer counts. Fails if the stream's end overtakes the result read just before it (the
/// batch then requeued with no worker left, and the caller answered 503 after its wait).
#[tokio::test]
async fn an_answer_just_before_the_stream_ends_counts() {
    let e = engine(quick());
    for _ in 0..50 {
        let mut w = e.open_worker(offer(1, 1, 8)).expect("open");
        let call = tokio::spawn({
            let e = e.clone();
            async move {
                e.infer(request(None, &["abc"], Duration::from_secs(5)))
                    .await
            }
        });
        let batch = next_batch(&mut w).await;
        e.worker_result(w.id, answer(&batch)).await;
        e.worker_ended(w.id, StreamEnd::Closed).await;
        let answered = call.await.expect("task").expect("answered, not requeued");
        assert_eq!(lens(&answered), vec![3]);
    }
    drained(&e).await;
}

#[tokio::test]
async fn a_lost_workers_items_go_to_another_once_then_fail_unavailable() {
    let e = engine(quick());
    let mut w1 = e.open_worker(offer(1, 1, 8)).expect("open");
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(None, &["abc"], Duration::from_secs(5)))
                .await
        }
    });
    let _ = next_batch(&mut w1).await;
    e.worker_ended(w1.id, StreamEnd::Lost).await;
    let mut w2 = e.open_worker(offer(1, 1, 8)).expect("open");
    let b = next_batch(&mut w2).await;
    e.worker_result(w2.id, answer(&b)).await;
    assert_eq!(lens(&call.await.expect("task").expect("requeued")), vec![3]);

    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(None, &["abc"], Duration::from_secs(5)))
                .await
        }
    });
    let _ = next_batch(&mut w2).await;
    e.worker_ended(w2.id, StreamEnd::Lost).await;
    let mut w3 = e.open_worker(offer(1, 1, 8)).expect("open");
    let _ = next_batch(&mut w3).await;
    e.worker_ended(w3.id, StreamEnd::Lost).await;
    let err = call.await.expect("task").expect_err("lost twice");
    assert_eq!(err.kind(), crate::Kind::Unavailable);
    assert!(matches!(err, InferError::WorkersLost { .. }));
    drained(&e).await;
}

#[tokio::test]
async fn a_worker_never_holds_more_batches_than_its_credits() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 2, 1)).expect("open");
    let calls: Vec<_> = (0..5)
        .map(|i| {
            let e = e.clone();
            tokio::spawn(async move {
                e.infer(request(None, &[&"x".repeat(i + 1)], Duration::from_secs(5)))
                    .await
            })
        })
        .collect();
    let b1 = next_batch(&mut w).await;
    let b2 = next_batch(&mut w).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(w.events.try_recv().is_err(), "a third batch without credit");
    e.worker_result(w.id, answer(&b1)).await;
    let b3 = next_batch(&mut w).await;
    for b in [b2, b3] {
        e.worker_result(w.id, answer(&b)).await;
    }
    let b4 = next_batch(&mut w).await;
    let b5 = next_batch(&mut w).await;
    for b in [b4, b5] {
        e.worker_result(w.id, answer(&b)).await;
    }
    for c in calls {
        c.await.expect("task").expect("answered");
    }
    drained(&e).await;
}

#[tokio::test]
async fn a_full_queue_and_a_tenant_over_quota_are_refused_at_once() {
    let mut config = quick();
    config.limits.max_queue_items = 3;
    config.no_worker_wait = Duration::from_secs(5);
    let e = engine(config);
    let waiting = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(Some("a"), &["1", "2"], Duration::from_secs(5)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let err = e
        .infer(request(Some("b"), &["3", "4"], Duration::from_secs(5)))
        .await
        .expect_err("full");
    assert_eq!(err.kind(), crate::Kind::ResourceExhausted);
    assert!(err.retry_after().is_some());
    let mut quota = request(Some("a"), &["5"], Duration::from_secs(5));
    quota.max_outstanding = Some(1);
    let err = e.infer(quota).await.expect_err("over quota");
    assert!(err.to_string().contains("tenant 'a'"), "{err}");
    let snap = e.snapshot().await;
    assert_eq!(snap.outstanding_for(&Some("a".into())), 1);
    assert_eq!(snap.model(MODEL).map(|m| m.queued_items), Some(2));
    waiting.abort();
    drained(&e).await;
}

#[tokio::test]
async fn items_go_to_the_newest_version_and_a_worker_error_fails_its_request_only() {
    let e = engine(quick());
    let mut old = e.open_worker(offer(1, 4, 8)).expect("open");
    let mut new = e.open_worker(offer(2, 4, 8)).expect("open");
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(None, &["a", "b"], Duration::from_secs(5)))
                .await
        }
    });
    let b = next_batch(&mut new).await;
    assert_eq!(b.version, 2);
    let mut result = answer(&b);
    result.results[1].outcome = Some(pb::item_result::Outcome::Error(pb::ItemError {
        code: crate::Kind::InvalidArgument.number(),
        message: "input too long".into(),
    }));
    e.worker_result(new.id, result).await;
    let err = call.await.expect("task").expect_err("item failed");
    assert_eq!(err.kind(), crate::Kind::InvalidArgument);
    assert_eq!(err.to_string(), "input 1: input too long");
    assert!(old.events.try_recv().is_err());
    drained(&e).await;
}

#[tokio::test]
async fn a_result_for_an_unknown_batch_ends_the_stream_with_invalid_argument() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 8)).expect("open");
    e.worker_result(
        w.id,
        pb::BatchResult {
            batch_id: 999,
            results: Vec::new(),
        },
    )
    .await;
    let status = tokio::time::timeout(Duration::from_secs(2), w.events.recv())
        .await
        .expect("in time")
        .expect("an event")
        .expect_err("an error");
    assert_eq!(status.kind, crate::Kind::InvalidArgument);
    assert!(e.snapshot().await.workers.is_empty());
}

#[tokio::test]
async fn a_deadline_that_passes_in_flight_answers_deadline_exceeded_and_cancels() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 8)).expect("open");
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(None, &["slow"], Duration::from_millis(100)))
                .await
        }
    });
    let batch = next_batch(&mut w).await;
    let err = call.await.expect("task").expect_err("deadline");
    assert_eq!(err.kind(), crate::Kind::DeadlineExceeded);
    assert!(matches!(
        next(&mut w).await,
        pb::serve_event::Kind::Cancel(_)
    ));
    e.worker_result(w.id, answer(&batch)).await;
    drained(&e).await;
}

/// The driver's mailbox of new work is bounded: with the driver not yet running, the requests
/// past its capacity are refused at once (UNAVAILABLE, with a retry), not queued in memory,
/// and those let in are served normally once it runs.
#[tokio::test(flavor = "current_thread")]
async fn a_full_mailbox_refuses_new_requests_at_once() {
    let mut config = quick();
    config.mailbox = 4;
    let e = engine(config);
    // Each task offers its request on its first poll; none lets the driver run before all
    // ten have offered (one thread, tasks run in the order spawned, the driver waiting).
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            let e = e.clone();
            let text = format!("t{i}");
            tokio::spawn(async move {
                e.infer(request(None, &[text.as_str()], Duration::from_secs(5)))
                    .await
            })
        })
        .collect();
    let mut busy = 0;
    let mut other = 0;
    for t in tasks {
        match t.await.expect("task") {
            Err(InferError::Busy) => busy += 1,
            Err(err) => {
                // No worker serves the model: the requests let in wait for one, then fail.
                assert!(matches!(err, InferError::NoWorker { .. }), "{err:?}");
                other += 1;
            }
            Ok(_) => panic!("no worker serves the model"),
        }
    }
    assert_eq!((busy, other), (6, 4), "4 fit the mailbox, 6 are refused");
    let refused = InferError::Busy;
    assert_eq!(refused.kind(), crate::Kind::Unavailable);
    assert!(refused.retry_after().is_some());
    // Room again once the driver has taken them: the next request is let in.
    let err = e
        .infer(request(None, &["again"], Duration::from_secs(5)))
        .await
        .expect_err("no worker");
    assert!(matches!(err, InferError::NoWorker { .. }), "{err:?}");
}

/// A worker that declares its inputs no longer refuses, naming it, an input it did not declare
/// (an OIP text input of another name, or a tensor), or a declared name is no longer served.
#[tokio::test]
async fn an_input_the_worker_did_not_declare_is_refused() {
    let e = engine(quick());
    let mut declaring = offer(1, 4, 8);
    declaring.inputs = vec![pb::TensorSpec {
        name: "text".into(),
        datatype: "BYTES".into(),
        shape: vec![-1],
    }];
    let mut w = e.open_worker(declaring).expect("open");
    let mut misnamed = request(None, &["hi"], Duration::from_secs(5));
    misnamed.text_input = Some("sentences".into());
    let mut tensor = request(None, &[], Duration::from_secs(5));
    tensor.items = vec![pb::Item {
        input: Some(pb::item::Input::Tensors(pb::Tensors {
            tensors: vec![pb::TensorInput {
                name: "x".into(),
                ..Default::default()
            }],
        })),
        ..Default::default()
    }];
    for (req, name) in [(misnamed, "sentences"), (tensor, "x")] {
        match e.infer(req).await {
            Err(InferError::Item { code, message, .. }) => {
                assert_eq!(code, crate::Kind::InvalidArgument);
                assert!(message.contains(&format!("no input '{name}'")), "{message}");
                assert!(message.contains("its inputs: text"), "{message}");
            }
            other => panic!("expected a refusal of '{name}', got {other:?}"),
        }
    }
    // The declared name and an OpenAI text (no name) reach the worker.
    let mut named = request(None, &["abc"], Duration::from_secs(5));
    named.text_input = Some("text".into());
    for req in [named, request(None, &["de"], Duration::from_secs(5))] {
        let call = tokio::spawn({
            let e = e.clone();
            async move { e.infer(req).await }
        });
        let batch = next_batch(&mut w).await;
        e.worker_result(w.id, answer(&batch)).await;
        call.await.expect("join").expect("served");
    }
}

/// A served request no longer shows in its version's statistics (items, batch, queue, answer),
/// or a failed one in `fail`; a request no worker took is in none.
#[tokio::test]
async fn statistics_count_what_each_version_computed() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(7, 1, 8)).expect("open");
    let call = tokio::spawn({
        let e = e.clone();
        async move {
            e.infer(request(None, &["a", "bb", "ccc"], Duration::from_secs(5)))
                .await
        }
    });
    let batch = next_batch(&mut w).await;
    e.worker_result(w.id, answer(&batch)).await;
    call.await.expect("join").expect("served");
    let failing = tokio::spawn({
        let e = e.clone();
        async move { e.infer(request(None, &["x"], Duration::from_secs(5))).await }
    });
    let batch = next_batch(&mut w).await;
    let mut result = answer(&batch);
    result.results[0].outcome = Some(pb::item_result::Outcome::Error(pb::ItemError {
        code: 3,
        message: "no".into(),
    }));
    e.worker_result(w.id, result).await;
    failing.await.expect("join").expect_err("failed");
    let stats = e.stats(Some(MODEL)).await;
    assert_eq!(stats.len(), 1, "{stats:?}");
    let v = &stats[0].1[0];
    assert_eq!(v.version, 7);
    assert_eq!((v.success.count, v.fail.count, v.items), (1, 1, 3));
    assert_eq!((v.queue.count, v.compute.count), (4, 2));
    assert_eq!(v.by_batch_size.keys().copied().collect::<Vec<_>>(), [1, 3]);
    assert!(v.last_answer_unix_ms > 0 && v.success.ns > 0);
    assert!(e.stats(Some("other")).await.is_empty());
}

/// A part of `item` numbered `seq`, holding the byte `b`.
fn part(batch: &pb::Batch, seq: u64, b: u8) -> pb::ItemPart {
    pb::ItemPart {
        batch_id: batch.batch_id,
        item_id: batch.items[0].item_id,
        seq,
        output: Some(pb::ItemOutput {
            tensors: vec![pb::TensorOutput {
                name: "part".into(),
                data: vec![b].into(),
                ..Default::default()
            }],
            parameters: Default::default(),
        }),
    }
}

/// The worker's Serve stream is ended with an error (a protocol error), and once the stream is
/// gone its started item's caller hears StreamInterrupted.
async fn broken_and_interrupted(e: &Engine, w: &mut WorkerStream, stream: PartStream) {
    let ended = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match w.events.recv().await {
                Some(Err(_)) | None => break,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the stream was ended with an error");
    e.worker_ended(w.id, StreamEnd::Lost).await;
    let error = stream.finish().await.expect_err("interrupted");
    assert!(
        matches!(error, InferError::StreamInterrupted { .. }),
        "{error:?}"
    );
    drained(e).await;
}

/// Stream limits of `window` parts, a minute idle and an hour long.
fn window(window: u32) -> StreamLimits {
    StreamLimits {
        window,
        ..StreamLimits::default()
    }
}

/// A worker that stops sending mid-stream would hold its caller (and its slot) for ever; the
/// deadline, meant for the first part, would cut a long healthy stream.
#[tokio::test]
async fn a_stalled_stream_ends_after_its_idle_limit_and_is_cancelled_at_the_worker() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 1)).expect("open");
    let limits = StreamLimits {
        window: 4,
        idle: Duration::from_millis(300),
        longest: Duration::from_secs(60),
    };
    // A deadline shorter than the stream: it bounds the first part only.
    let mut stream = e
        .infer_stream(request(None, &["abc"], Duration::from_millis(200)), limits)
        .expect("submitted");
    let batch = next_batch(&mut w).await;
    let mut last = Instant::now();
    for seq in 0..3 {
        // Parts 150 ms apart: the whole stream outlives the 200 ms deadline.
        tokio::time::sleep(Duration::from_millis(150)).await;
        e.worker_part(w.id, part(&batch, seq, 0)).await;
        assert!(stream.next().await.expect("in time").is_some());
        last = Instant::now();
        assert!(matches!(
            next(&mut w).await,
            pb::serve_event::Kind::Window(_)
        ));
    }
    let error = stream.next().await.expect_err("stalled");
    assert!(
        matches!(error, InferError::StreamStalled { .. }),
        "{error:?}"
    );
    assert!(
        last.elapsed() >= Duration::from_millis(290),
        "{:?}",
        last.elapsed()
    );
    match next(&mut w).await {
        pb::serve_event::Kind::Cancel(c) => assert_eq!(c.item_ids, vec![batch.items[0].item_id]),
        other => panic!("expected a cancel, got {other:?}"),
    }
    e.worker_result(w.id, answer(&batch)).await;
    drained(&e).await;
}

/// A streamed item's parts would not reach its caller in order, the reader's pace would not
/// come back to the worker as window, or the final answer would be lost.
#[tokio::test]
async fn streamed_parts_reach_the_caller_and_reading_grants_window() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 1)).expect("open");
    let mut stream = e
        .infer_stream(request(None, &["abc"], Duration::from_secs(5)), window(2))
        .expect("submitted");
    let batch = next_batch(&mut w).await;
    for seq in 0..2 {
        e.worker_part(w.id, part(&batch, seq, seq as u8)).await;
    }
    for seq in 0..2 {
        let p = stream.next().await.expect("in time").expect("a part");
        assert_eq!((p.seq, p.output.tensors[0].data[0]), (seq, seq as u8));
        match next(&mut w).await {
            pb::serve_event::Kind::Window(win) => {
                assert_eq!((win.item_id, win.parts), (batch.items[0].item_id, 1))
            }
            other => panic!("expected a window, got {other:?}"),
        }
    }
    e.worker_result(w.id, answer(&batch)).await;
    let response = stream.finish().await.expect("answered");
    assert_eq!(lens(&response), vec![3]);
    drained(&e).await;
}

/// A worker that sends more parts than the window would make the server buffer without
/// bound; one lost after a part would have its item sent to another worker.
#[tokio::test]
async fn past_the_window_ends_the_worker_and_a_started_item_is_not_requeued() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 1)).expect("open");
    let stream = e
        .infer_stream(request(None, &["abc"], Duration::from_secs(5)), window(1))
        .expect("submitted");
    let batch = next_batch(&mut w).await;
    e.worker_part(w.id, part(&batch, 0, 0)).await;
    e.worker_part(w.id, part(&batch, 1, 1)).await;
    broken_and_interrupted(&e, &mut w, stream).await;
}

/// A caller that goes away mid-stream leaves its item running at the worker.
#[tokio::test]
async fn a_dropped_stream_cancels_its_item_at_the_worker() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 1)).expect("open");
    let mut stream = e
        .infer_stream(request(None, &["abc"], Duration::from_secs(5)), window(4))
        .expect("submitted");
    let batch = next_batch(&mut w).await;
    e.worker_part(w.id, part(&batch, 0, 0)).await;
    assert!(stream.next().await.expect("in time").is_some());
    assert!(matches!(
        next(&mut w).await,
        pb::serve_event::Kind::Window(_)
    ));
    drop(stream);
    match next(&mut w).await {
        pb::serve_event::Kind::Cancel(c) => assert_eq!(c.item_ids, vec![batch.items[0].item_id]),
        other => panic!("expected a cancel, got {other:?}"),
    }
    e.worker_result(w.id, answer(&batch)).await;
    drained(&e).await;
}

/// A worker's parts wait at the server for a slow reader, a window of them: unbounded in
/// bytes, one stream could hold gigabytes. A part over MAX_PART_BYTES ends the worker's stream.
#[tokio::test]
async fn a_part_over_the_size_limit_ends_the_worker_and_interrupts_its_stream() {
    let e = engine(quick());
    let mut w = e.open_worker(offer(1, 1, 1)).expect("open");
    let stream = e
        .infer_stream(request(None, &["abc"], Duration::from_secs(5)), window(4))
        .expect("submitted");
    let batch = next_batch(&mut w).await;
    e.worker_part(w.id, part(&batch, 0, 0)).await;
    let mut big = part(&batch, 1, 0);
    big.output = Some(pb::ItemOutput {
        tensors: vec![pb::TensorOutput {
            name: "part".into(),
            data: vec![0u8; (1 << 20) + 1].into(),
            ..Default::default()
        }],
        parameters: Default::default(),
    });
    e.worker_part(w.id, big).await;
    broken_and_interrupted(&e, &mut w, stream).await;
}

/// Two workers on one GPU, each of two credits, take four batches at once side by side (the
/// driver time-slices their CUDA contexts), or, taking turns, hold together what one would
/// (two), the one holding the most first; a worker elsewhere is not held back. `Auto` starts
/// side by side (driver::gpus measures both ways under load).
#[tokio::test]
async fn the_workers_of_one_gpu_take_turns_or_run_side_by_side() {
    for (sharing, on_gpu) in [
        (GpuSharing::Turns, 2),
        (GpuSharing::SideBySide, 4),
        (GpuSharing::Auto, 4),
    ] {
        let e = engine(EngineConfig {
            limits: Limits {
                max_queue_delay: Duration::ZERO,
                ..Limits::default()
            },
            gpu_sharing: sharing,
            ..quick()
        });
        let on = |gpu: Option<&str>| WorkerOffer {
            device: gpu.map(str::to_owned),
            ..offer(1, 2, 1)
        };
        let mut a = e.open_worker(on(Some("GPU-0"))).expect("a");
        let mut b = e.open_worker(on(Some("GPU-0"))).expect("b");
        let mut host = e.open_worker(on(Some("host"))).expect("host");
        let mut requests = Vec::new();
        for _ in 0..8 {
            let e = e.clone();
            requests.push(tokio::spawn(async move {
                e.infer(request(None, &["x"], Duration::from_secs(5))).await
            }));
        }
        let mut got = [0usize; 3];
        for _ in 0..on_gpu + 2 {
            tokio::select! {
                Some(Ok(pb::ServeEvent { kind: Some(pb::serve_event::Kind::Batch(_)) })) = a.events.recv() => got[0] += 1,
                Some(Ok(pb::ServeEvent { kind: Some(pb::serve_event::Kind::Batch(_)) })) = b.events.recv() => got[1] += 1,
                Some(Ok(pb::ServeEvent { kind: Some(pb::serve_event::Kind::Batch(_)) })) = host.events.recv() => got[2] += 1,
            }
        }
        let more = tokio::time::timeout(Duration::from_millis(200), async {
            tokio::select! {
                Some(_) = a.events.recv() => true,
                Some(_) = b.events.recv() => true,
            }
        })
        .await;
        assert!(
            more.is_err(),
            "{sharing:?}: another batch on the GPU: {got:?}"
        );
        assert_eq!(got[0] + got[1], on_gpu, "{sharing:?}: {got:?}");
        assert_eq!(got[2], 2, "{sharing:?}: {got:?}");
        if sharing == GpuSharing::Turns {
            assert!(
                got.contains(&2) && got[..2].contains(&0),
                "one worker holds both: {got:?}"
            );
        }
        for r in requests {
            r.abort();
        }
    }
}

/// Taking turns, the worker with the turn batches as one worker would: while it holds a batch
/// (not idle) and waits `max_queue_delay` to fill the next, the other idle worker of its GPU
/// does not take the queued item at once (it would switch the GPU to its context for a small
/// batch).
#[tokio::test]
async fn the_worker_with_the_turn_keeps_it_while_it_batches() {
    let delay = Duration::from_millis(400);
    let e = engine(EngineConfig {
        limits: Limits {
            max_queue_delay: delay,
            ..Limits::default()
        },
        gpu_sharing: GpuSharing::Turns,
        ..quick()
    });
    let on_gpu = || WorkerOffer {
        device: Some("GPU-0".into()),
        ..offer(1, 2, 8)
    };
    let mut a = e.open_worker(on_gpu()).expect("a");
    let mut b = e.open_worker(on_gpu()).expect("b");
    let send = |text: &'static str| {
        let e = e.clone();
        tokio::spawn(async move {
            e.infer(request(None, &[text], Duration::from_secs(5)))
                .await
        })
    };
    // Both idle: the first item goes at once, to one of them (the turn).
    let first = send("x");
    let (mut turn, mut other) = tokio::select! {
        Some(Ok(pb::ServeEvent { kind: Some(pb::serve_event::Kind::Batch(batch)) })) = a.events.recv() => ((a, batch), b),
        Some(Ok(pb::ServeEvent { kind: Some(pb::serve_event::Kind::Batch(batch)) })) = b.events.recv() => ((b, batch), a),
    };
    let sent = Instant::now();
    let second = send("yy");
    // The worker with the turn holds a batch, so the second item waits for its batch to
    // fill or for the delay, as with one worker; the idle one takes nothing meanwhile.
    let batch = next_batch(&mut turn.0).await;
    assert!(
        sent.elapsed() >= delay - Duration::from_millis(50),
        "the second batch closed after {:?}, before the queue delay",
        sent.elapsed()
    );
    assert!(
        other.events.try_recv().is_err(),
        "the idle worker took a batch while the turn was another's"
    );
    e.worker_result(turn.0.id, answer(&turn.1)).await;
    e.worker_result(turn.0.id, answer(&batch)).await;
    assert_eq!(lens(&first.await.expect("join").expect("first")), [1]);
    assert_eq!(lens(&second.await.expect("join").expect("second")), [2]);
    drop(other);
}
