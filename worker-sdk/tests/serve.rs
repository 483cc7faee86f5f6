//! `Session::serve` against the fake server of `common`, which hands each Serve call to the
//! test to drive by hand: the offer, credits, per-item errors, cancels, drains from either
//! side, heartbeats, refusals and the offer again after a reconnection.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Fake, ServeCall, ServeCalls, open, start};
use modelshare_proto::v1 as pb;
use modelshare_worker::serve::{
    Accepts, Batch, Input, ItemFailure, Outcome, Output, ServeEnd, ServeOptions, tensor_spec,
};
use modelshare_worker::{Handler, Session, WorkerError};
use pb::serve_event::Kind as Event;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tonic::{Code, Status};

/// A handler that records what it is given and how many calls run at once, and answers only
/// when the test lets it (one permit of `gate` per call). Text "fail" fails its item with
/// INVALID_ARGUMENT, "panic" panics; other items output `len`, their text length.
#[derive(Clone)]
struct Probe {
    gate: Arc<Semaphore>,
    running: Arc<AtomicUsize>,
    max_running: Arc<AtomicUsize>,
    seen: Arc<Mutex<Vec<u64>>>,
    started: mpsc::UnboundedSender<u64>,
}

impl Probe {
    /// A probe whose calls wait for the test, and the ids of the batches it starts.
    fn gated() -> (Self, mpsc::UnboundedReceiver<u64>) {
        let (started, rx) = mpsc::unbounded_channel();
        let probe = Self {
            gate: Arc::new(Semaphore::new(0)),
            running: Arc::default(),
            max_running: Arc::default(),
            seen: Arc::default(),
            started,
        };
        (probe, rx)
    }

    /// A probe whose calls answer at once.
    fn open() -> Self {
        let (probe, _) = Self::gated();
        probe.gate.add_permits(Semaphore::MAX_PERMITS);
        probe
    }

    fn seen(&self) -> Vec<u64> {
        self.seen.lock().unwrap().clone()
    }
}

impl Handler for Probe {
    async fn handle(&self, batch: Batch) -> Vec<Outcome> {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_running.fetch_max(now, Ordering::SeqCst);
        self.seen
            .lock()
            .unwrap()
            .extend(batch.items.iter().map(|i| i.id));
        let _ = self.started.send(batch.id);
        self.gate.acquire().await.unwrap().forget();
        self.running.fetch_sub(1, Ordering::SeqCst);
        batch
            .items
            .iter()
            .map(|item| match &item.input {
                Input::Text(s) if s == "fail" => Err(ItemFailure::invalid_argument("told to")),
                Input::Text(s) if s == "panic" => panic!("told to"),
                Input::Text(s) => Ok(Output::tensor_f32("len", [1], &[s.len() as f32])
                    .with_parameter("prompt_tokens", 1i64)),
                Input::Tensors(_) => Ok(Output::new()),
            })
            .collect()
    }
}

/// A fake server, a session with `tiny` attached, serving with `handler` on a task.
struct Setup {
    _dir: tempfile::TempDir,
    fake: Arc<Fake>,
    session: Session,
    calls: ServeCalls,
    serving: JoinHandle<Result<ServeEnd, WorkerError>>,
}

async fn setup<H: Handler>(options: ServeOptions, handler: H) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let (fake, address) = start(dir.path()).await;
    let calls = fake.serve_calls();
    let session = open(&address).await;
    let model = session.attach("tiny").await.unwrap();
    let s = session.clone();
    let serving = tokio::spawn(async move { s.serve(&model, options, handler).await });
    Setup {
        _dir: dir,
        fake,
        session,
        calls,
        serving,
    }
}

/// How serving ended, within 5 s.
async fn ended(
    serving: JoinHandle<Result<ServeEnd, WorkerError>>,
) -> Result<ServeEnd, WorkerError> {
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("serve returns within 5 s")
        .expect("serve does not panic")
}

fn text(id: u64, s: &str) -> pb::Item {
    pb::Item {
        item_id: id,
        input: Some(pb::item::Input::Text(pb::TextInput { text: s.into() })),
        ..Default::default()
    }
}

fn batch(id: u64, items: Vec<pb::Item>) -> Event {
    Event::Batch(pb::Batch {
        batch_id: id,
        version: 1,
        items,
    })
}

/// The code of each item's outcome (OK for an output), by item id.
fn codes(result: &pb::BatchResult) -> Vec<(u64, Code)> {
    let mut codes: Vec<(u64, Code)> = result
        .results
        .iter()
        .map(|r| match &r.outcome {
            Some(pb::item_result::Outcome::Output(_)) => (r.item_id, Code::Ok),
            Some(pb::item_result::Outcome::Error(e)) => (r.item_id, Code::from_i32(e.code)),
            None => panic!("an item result without an outcome"),
        })
        .collect();
    codes.sort_by_key(|c| c.0);
    codes
}

/// Reads results until the stream closes; `(batch id, results)` sorted by batch.
async fn results_until_closed(call: &mut ServeCall) -> Vec<pb::BatchResult> {
    let mut results = Vec::new();
    while let Some(m) = call.recv_no_beat().await {
        match m {
            pb::serve_request::Kind::Result(r) => results.push(r),
            other => panic!("unexpected {other:?}"),
        }
    }
    results.sort_by_key(|r| r.batch_id);
    results
}

/// The offer does not carry the session, the model's name and version, the limits, the
/// accepted kinds and the tensor specs, or a server drain does not end serving.
#[tokio::test]
async fn offer_names_the_session_model_and_limits() {
    let options = ServeOptions {
        credits: 3,
        max_batch_items: 8,
        max_batch_bytes: 1024,
        accepts: Accepts {
            text: true,
            tensor: false,
        },
        inputs: vec![tensor_spec("text", pb::DType::DtypeBytes, &[-1])],
        outputs: vec![tensor_spec("len", pb::DType::DtypeF32, &[1])],
        ..Default::default()
    };
    let mut s = setup(options, Probe::open()).await;
    let (mut call, offer) = s.calls.accept().await;
    assert_eq!(offer.session_id, s.session.id());
    assert_eq!((offer.model.as_str(), offer.version), ("tiny", 1));
    assert_eq!(
        (offer.credits, offer.max_batch_items, offer.max_batch_bytes),
        (3, 8, 1024)
    );
    assert_eq!(offer.accepts, vec!["text".to_owned()]);
    assert_eq!(
        offer.inputs,
        vec![pb::TensorSpec {
            name: "text".into(),
            datatype: "BYTES".into(),
            shape: vec![-1]
        }]
    );
    assert_eq!(offer.outputs[0].datatype, "FP32");

    call.send(Event::Drain(pb::Drain {
        reason: "bye".into(),
    }))
    .await;
    assert!(results_until_closed(&mut call).await.is_empty());
    drop(call);
    assert_eq!(
        ended(s.serving).await.unwrap(),
        ServeEnd::Drained {
            reason: "bye".into()
        }
    );
}

/// The handler runs more calls at once than the worker has credits (even when the server
/// wrongly sends more batches), or a batch is not answered exactly once.
#[tokio::test]
async fn never_more_than_credits_at_the_handler() {
    let (probe, mut started) = Probe::gated();
    let options = ServeOptions {
        credits: 2,
        ..Default::default()
    };
    let mut s = setup(options, probe.clone()).await;
    let (mut call, _) = s.calls.accept().await;
    for b in 1..=5 {
        call.send(batch(b, vec![text(b * 10, "x")])).await;
    }
    let mut got = Vec::new();
    for _ in 0..5 {
        started.recv().await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(probe.running.load(Ordering::SeqCst) <= 2);
        probe.gate.add_permits(1);
        let r = call.result().await;
        assert_eq!(codes(&r), vec![(r.batch_id * 10, Code::Ok)]);
        got.push(r.batch_id);
    }
    got.sort_unstable();
    assert_eq!(got, vec![1, 2, 3, 4, 5]);
    assert_eq!(probe.max_running.load(Ordering::SeqCst), 2);
    call.send(Event::Drain(pb::Drain::default())).await;
    assert!(results_until_closed(&mut call).await.is_empty());
}

/// One item's failure (from the handler, a kind the worker does not take, a passed
/// deadline, no input, a panic) fails more than that item, reaches the handler when the SDK
/// should answer it, or ends the stream.
#[tokio::test]
async fn item_errors_fail_only_their_item() {
    let probe = Probe::open();
    let options = ServeOptions {
        accepts: Accepts {
            text: true,
            tensor: false,
        },
        ..Default::default()
    };
    let mut s = setup(options, probe.clone()).await;
    let (mut call, _) = s.calls.accept().await;
    let tensors = pb::Item {
        item_id: 3,
        input: Some(pb::item::Input::Tensors(pb::Tensors::default())),
        ..Default::default()
    };
    let late = pb::Item {
        deadline_unix_ms: 1,
        ..text(4, "late")
    };
    let empty = pb::Item {
        item_id: 5,
        ..Default::default()
    };
    let items = vec![text(1, "hello"), text(2, "fail"), tensors, late, empty];
    call.send(batch(7, items)).await;
    let r = call.result().await;
    assert_eq!(r.batch_id, 7);
    assert_eq!(
        codes(&r),
        vec![
            (1, Code::Ok),
            (2, Code::InvalidArgument),
            (3, Code::InvalidArgument),
            (4, Code::DeadlineExceeded),
            (5, Code::InvalidArgument),
        ]
    );
    let out = r.results.iter().find(|r| r.item_id == 1).unwrap();
    let Some(pb::item_result::Outcome::Output(out)) = &out.outcome else {
        unreachable!()
    };
    assert_eq!(out.tensors[0].name, "len");
    assert_eq!(&out.tensors[0].data[..], &5f32.to_le_bytes());
    assert_eq!(
        out.parameters["prompt_tokens"].value,
        Some(pb::parameter::Value::Int64Value(1))
    );
    assert_eq!(probe.seen(), vec![1, 2]);

    call.send(batch(8, vec![text(6, "panic"), text(7, "ok")]))
        .await;
    let r = call.result().await;
    assert_eq!(codes(&r), vec![(6, Code::Internal), (7, Code::Internal)]);
    call.send(batch(9, vec![text(8, "still serving")])).await;
    assert_eq!(codes(&call.result().await), vec![(8, Code::Ok)]);
}

/// A batch over the offer's max_batch_items or max_batch_bytes reaches the handler, or is
/// not answered.
#[tokio::test]
async fn oversized_batches_are_answered_without_the_handler() {
    let probe = Probe::open();
    let options = ServeOptions {
        max_batch_items: 2,
        max_batch_bytes: 10,
        ..Default::default()
    };
    let mut s = setup(options, probe.clone()).await;
    let (mut call, _) = s.calls.accept().await;
    call.send(batch(1, vec![text(1, "a"), text(2, "b"), text(3, "c")]))
        .await;
    let r = call.result().await;
    assert_eq!(
        codes(&r),
        vec![
            (1, Code::Internal),
            (2, Code::Internal),
            (3, Code::Internal)
        ]
    );
    call.send(batch(2, vec![text(4, "eleven byte")])).await;
    assert_eq!(codes(&call.result().await), vec![(4, Code::Internal)]);
    call.send(batch(3, vec![text(5, "ten bytes!")])).await;
    assert_eq!(codes(&call.result().await), vec![(5, Code::Ok)]);
    assert_eq!(probe.seen(), vec![5]);
}

/// Items cancelled before their batch started reach the handler, or an item cancelled while
/// it ran is answered with its output rather than CANCELLED.
#[tokio::test]
async fn cancelled_items_are_answered_without_the_handler() {
    let (probe, mut started) = Probe::gated();
    let mut s = setup(ServeOptions::default(), probe.clone()).await;
    let (mut call, _) = s.calls.accept().await;
    call.send(batch(1, vec![text(1, "a"), text(2, "b")])).await;
    assert_eq!(started.recv().await, Some(1));
    // Beyond the one credit: it waits for the running call, then is cancelled whole.
    call.send(batch(2, vec![text(3, "c"), text(4, "d")])).await;
    call.send(Event::Cancel(pb::Cancel {
        item_ids: vec![2, 3, 4, 99],
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    probe.gate.add_permits(1);
    let first = call.result().await;
    assert_eq!(first.batch_id, 1);
    assert_eq!(codes(&first), vec![(1, Code::Ok), (2, Code::Cancelled)]);
    let second = call.result().await;
    assert_eq!(second.batch_id, 2);
    assert_eq!(
        codes(&second),
        vec![(3, Code::Cancelled), (4, Code::Cancelled)]
    );
    assert_eq!(probe.seen(), vec![1, 2]);
}

/// A server drain ends serving before the batch in flight is answered, or leaves the stream
/// open.
#[tokio::test]
async fn drain_answers_in_flight_and_closes() {
    let (probe, mut started) = Probe::gated();
    let mut s = setup(ServeOptions::default(), probe.clone()).await;
    let (mut call, _) = s.calls.accept().await;
    call.send(batch(1, vec![text(1, "a")])).await;
    assert_eq!(started.recv().await, Some(1));
    call.send(Event::Drain(pb::Drain {
        reason: "version 1 is draining".into(),
    }))
    .await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!s.serving.is_finished());
    probe.gate.add_permits(1);
    let results = results_until_closed(&mut call).await;
    assert_eq!(results.len(), 1);
    assert_eq!(codes(&results[0]), vec![(1, Code::Ok)]);
    drop(call);
    assert_eq!(
        ended(s.serving).await.unwrap(),
        ServeEnd::Drained {
            reason: "version 1 is draining".into()
        }
    );
}

/// Stopping from the worker's side does not answer the batch in flight, runs batches sent
/// after the stop, or leaves the stream open.
#[tokio::test]
async fn stop_answers_in_flight_and_closes() {
    let (probe, mut started) = Probe::gated();
    let options = ServeOptions {
        credits: 2,
        ..Default::default()
    };
    let stop = options.stop.clone();
    let mut s = setup(options, probe.clone()).await;
    let (mut call, _) = s.calls.accept().await;
    call.send(batch(1, vec![text(1, "a")])).await;
    assert_eq!(started.recv().await, Some(1));
    stop.cancel();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Left unanswered: the server requeues it when the stream closes.
    call.send(batch(2, vec![text(2, "b")])).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    probe.gate.add_permits(2);
    let results = results_until_closed(&mut call).await;
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].batch_id, 1);
    drop(call);
    assert_eq!(ended(s.serving).await.unwrap(), ServeEnd::Stopped);
    assert_eq!(probe.seen(), vec![1]);
}

/// An idle worker does not send heartbeats at the session's welcome interval (20 ms in the
/// fake), so the server would take the stream for dead.
#[tokio::test]
async fn heartbeats_when_idle() {
    let mut s = setup(ServeOptions::default(), Probe::open()).await;
    let (mut call, _) = s.calls.accept().await;
    let start = tokio::time::Instant::now();
    let mut beats = 0;
    while start.elapsed() < Duration::from_millis(300) {
        match call.recv().await {
            Some(pb::serve_request::Kind::Heartbeat(_)) => beats += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(beats >= 5, "{beats} heartbeats in 300 ms at 20 ms");
    assert!(beats <= 20, "{beats} heartbeats in 300 ms at 20 ms");
}

/// After the session is revoked and reconnects, serving stops instead of offering again on
/// the new session once the model is re-attached there.
#[tokio::test]
async fn broken_stream_is_offered_again_after_a_reconnect() {
    let mut s = setup(ServeOptions::default(), Probe::open()).await;
    let (call, offer) = s.calls.accept().await;
    s.fake.revoke(&offer.session_id).await;
    call.fail(Status::unavailable("the session ended")).await;
    drop(call);
    let (mut call, again) = s.calls.accept().await;
    assert_ne!(again.session_id, offer.session_id);
    assert_eq!(again.session_id, s.session.id());
    assert_eq!(s.fake.state().attaches, 2, "re-attached before offering");
    call.send(batch(1, vec![text(1, "after")])).await;
    assert_eq!(codes(&call.result().await), vec![(1, Code::Ok)]);
}

/// A refusal that retrying cannot fix is retried forever, or an UNAVAILABLE one is not
/// retried; options the server would refuse are sent.
#[tokio::test]
async fn refusals() {
    let mut s = setup(ServeOptions::default(), Probe::open()).await;
    let mut first = s.calls.next().await;
    assert!(matches!(
        first.recv().await,
        Some(pb::serve_request::Kind::Offer(_))
    ));
    first.fail(Status::unavailable("starting")).await;
    let mut second = s.calls.next().await;
    assert!(matches!(
        second.recv().await,
        Some(pb::serve_request::Kind::Offer(_))
    ));
    second.fail(Status::invalid_argument("no")).await;
    let e = ended(s.serving).await.unwrap_err();
    assert_eq!(e.code(), Some(Code::InvalidArgument), "{e}");

    let model = s.session.attach("tiny").await.unwrap();
    let options = ServeOptions {
        credits: 0,
        ..Default::default()
    };
    let e = s
        .session
        .serve(&model, options, Probe::open())
        .await
        .unwrap_err();
    assert!(matches!(e, WorkerError::BadServeOptions(_)), "{e}");
}
