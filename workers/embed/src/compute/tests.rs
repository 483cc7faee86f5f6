//! Tests of the compute thread: grouping, cancellation, and panics in the encoder.

use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::Duration;

use modelshare_worker::CancellationToken;

use super::Slots;
use super::plan::{MIN_GROUP, plan};
use super::run::run;
use super::thread::ComputeThread;
use crate::encoder::{EncodeError, Encoder};
use crate::tokenize::Sequence;

/// Records the groups it is given; each vector is the sequence's length.
struct Counting {
    calls: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    cancel_after_first: Option<CancellationToken>,
}

impl Encoder for Counting {
    fn hidden(&self) -> usize {
        1
    }
    fn max_tokens(&self) -> usize {
        1 << 20
    }
    fn max_sequences(&self) -> usize {
        2
    }
    fn pads(&self) -> bool {
        false
    }
    fn survives_panic(&self) -> bool {
        true
    }
    fn encode(&mut self, seqs: &[&Sequence]) -> Result<Vec<f32>, EncodeError> {
        self.calls.lock().expect("calls").push(seqs.len());
        if let Some(t) = self.cancel_after_first.take() {
            t.cancel();
        }
        Ok(seqs.iter().map(|s| s.len() as f32).collect())
    }
}

/// A cancelled item's sequence was encoded to the end with the rest of its batch; now the
/// compute thread stops encoding it at the next group, and skips a group left empty.
#[test]
fn cancelled_sequences_are_not_encoded_past_the_current_group() {
    let seqs: Vec<Sequence> = [6, 5, 4, 3]
        .iter()
        .map(|&n| Sequence {
            ids: vec![1; n],
            type_ids: vec![0; n],
        })
        .collect();
    let tokens: Vec<CancellationToken> = (0..4).map(|_| CancellationToken::new()).collect();
    // Groups of two, longest first: [0, 1] then [2, 3]; items 2 and 3 are cancelled
    // while the first group runs.
    let calls = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let shared = CancellationToken::new();
    let tokens2: Vec<CancellationToken> = vec![
        tokens[0].clone(),
        tokens[1].clone(),
        shared.clone(),
        shared.clone(),
    ];
    let mut enc = Counting {
        calls: calls.clone(),
        cancel_after_first: Some(shared),
    };
    let got = run(&mut enc, &seqs, &tokens2).expect("run");
    assert_eq!(
        *calls.lock().expect("calls"),
        vec![2],
        "the second group was skipped"
    );
    assert_eq!(got.cancelled, vec![false, false, true, true]);
    assert_eq!(got.vectors, vec![6.0, 5.0, 0.0, 0.0]);
    // Nothing cancelled: every group runs.
    let mut enc = Counting {
        calls: calls.clone(),
        cancel_after_first: None,
    };
    let got = run(&mut enc, &seqs, &tokens).expect("run");
    assert_eq!(got.cancelled, vec![false; 4]);
    assert_eq!(got.vectors, vec![6.0, 5.0, 4.0, 3.0]);
}

/// The token id on which [`Panicky`] panics.
const PANIC_ID: u32 = 666;

/// Each vector is `[length, first id]`; panics (as an out-of-bounds index would) on a
/// sequence starting with [`PANIC_ID`], after `gate` lets it (when there is one). Records
/// the thread it is dropped on.
struct Panicky {
    survives: bool,
    gate: Option<mpsc::Receiver<()>>,
    dropped_on: Arc<Mutex<Option<String>>>,
}

impl Encoder for Panicky {
    fn hidden(&self) -> usize {
        2
    }
    fn max_tokens(&self) -> usize {
        1 << 20
    }
    fn max_sequences(&self) -> usize {
        64
    }
    fn pads(&self) -> bool {
        false
    }
    fn survives_panic(&self) -> bool {
        self.survives
    }
    fn encode(&mut self, seqs: &[&Sequence]) -> Result<Vec<f32>, EncodeError> {
        if seqs.iter().any(|s| s.ids[0] == PANIC_ID) {
            if let Some(gate) = &self.gate {
                let _ = gate.recv();
            }
            let table = [0.0f32; 3];
            let at = seqs.len() + 6;
            let _ = table[at];
        }
        Ok(seqs
            .iter()
            .flat_map(|s| [s.len() as f32, s.ids[0] as f32])
            .collect())
    }
}

impl Drop for Panicky {
    fn drop(&mut self) {
        // Slow enough that an compute that did not wait for its thread would be seen
        // returning before this ran.
        thread::sleep(Duration::from_millis(50));
        *self.dropped_on.lock().expect("lock") = thread::current().name().map(String::from);
    }
}

fn seq(first: u32, len: usize) -> Sequence {
    let mut ids = vec![first];
    ids.resize(len, 7);
    Sequence {
        ids,
        type_ids: vec![0; len],
    }
}

/// An compute over a [`Panicky`] on the thread `test-compute`; `on_fatal`'s reasons come
/// on the receiver.
fn panicky_compute(
    survives: bool,
    gate: Option<mpsc::Receiver<()>>,
) -> (
    ComputeThread,
    Arc<Mutex<Option<String>>>,
    mpsc::Receiver<String>,
) {
    let dropped_on = Arc::new(Mutex::new(None));
    let (fatal_tx, fatal_rx) = mpsc::channel();
    let encoder = Panicky {
        survives,
        gate,
        dropped_on: dropped_on.clone(),
    };
    let compute = ComputeThread::start(
        "test-compute",
        move || Ok(Box::new(encoder) as Box<dyn Encoder>),
        Box::new(move |reason| {
            let _ = fatal_tx.send(reason);
        }),
        true,
    )
    .expect("starts");
    (compute, dropped_on, fatal_rx)
}

/// A panic in an encoder (a CPU backend's out-of-bounds index) exited the whole worker
/// with code 70 and the compute thread was never joined: now the batch in flight fails
/// with the panic's message, the next batch is served, and dropping the compute returns
/// only after the encoder was dropped on its own thread.
#[tokio::test]
async fn a_panic_fails_its_batch_and_the_next_is_served() {
    let (compute, dropped_on, fatal) = panicky_compute(true, None);
    let err = compute
        .encode(vec![seq(5, 3), seq(PANIC_ID, 2)], Vec::new())
        .await
        .expect_err("the batch fails");
    assert!(matches!(err, EncodeError::Panicked(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("the encoder panicked")
            && message.contains("index out of bounds: the len is 3 but the index is 8"),
        "{message}"
    );
    let ok = compute
        .encode(vec![seq(5, 3), seq(9, 4)], Vec::new())
        .await
        .expect("the next batch is served");
    assert_eq!(ok.vectors, vec![3.0, 5.0, 4.0, 9.0]);
    assert!(fatal.try_recv().is_err(), "no stop asked for");
    assert_eq!(*dropped_on.lock().expect("lock"), None);
    drop(compute);
    assert_eq!(
        dropped_on.lock().expect("lock").as_deref(),
        Some("test-compute"),
        "the encoder was dropped on the compute thread before the compute's drop returned"
    );
}

/// An encoder whose state a panic may corrupt (CUDA) would be called again, or the worker
/// would not be told to stop, or the batch queued behind would wait forever.
#[tokio::test]
async fn a_panic_the_encoder_does_not_survive_stops_the_engine() {
    let (gate_tx, gate) = mpsc::channel();
    let (compute, dropped_on, fatal) = panicky_compute(false, Some(gate));
    // The panicking batch waits at the gate until the second one is queued behind it.
    let (panicked, queued, ()) = tokio::join!(
        compute.encode(vec![seq(PANIC_ID, 2)], Vec::new()),
        compute.encode(vec![seq(5, 3)], Vec::new()),
        async {
            gate_tx.send(()).expect("gate");
        },
    );
    let panicked = panicked.expect_err("the batch fails");
    assert!(matches!(panicked, EncodeError::Panicked(_)), "{panicked:?}");
    assert!(
        panicked.to_string().contains("index out of bounds"),
        "{panicked}"
    );
    let queued = queued.expect_err("the queued batch is refused");
    assert!(matches!(queued, EncodeError::Stopped(_)), "{queued:?}");
    let reason = fatal
        .recv_timeout(Duration::from_secs(10))
        .expect("the worker is told to stop");
    assert!(
        reason.contains("the encoder panicked: index out of bounds"),
        "{reason}"
    );
    let later = compute
        .encode(vec![seq(5, 3)], Vec::new())
        .await
        .expect_err("no batch runs after it");
    assert!(matches!(later, EncodeError::Stopped(_)), "{later:?}");
    drop(compute);
    assert_eq!(
        dropped_on.lock().expect("lock").as_deref(),
        Some("test-compute")
    );
}

/// A panic while the encoder is built would leave `start` waiting, or lose its message.
#[test]
fn a_panic_while_building_is_an_error() {
    let started = ComputeThread::start(
        "test-compute",
        || panic!("no device 3"),
        Box::new(|_| unreachable!("not serving yet")),
        false,
    );
    let err = started.expect_err("fails");
    assert!(err.to_string().contains("no device 3"), "{err}");
}

/// Groups would exceed the encoder's limits, lose a sequence, or pad short ones to long.
#[test]
fn plans_groups_within_limits_longest_first() {
    let lengths = [3, 10, 2, 10, 7, 1, 30];
    let groups = plan(&lengths, 24, 3, Some(1.0));
    assert_eq!(groups, vec![vec![6], vec![1, 3], vec![4, 0, 2], vec![5]]);
    let mut all: Vec<usize> = groups.concat();
    all.sort_unstable();
    assert_eq!(all, (0..lengths.len()).collect::<Vec<_>>());
    for g in &groups {
        assert!(g.len() <= 3);
        assert!(g.len() == 1 || g.len() * lengths[g[0]] <= 24);
    }
    assert!(plan(&[], 10, 10, Some(1.0)).is_empty());
}

/// A padding encoder would get short sequences padded to long ones.
#[test]
fn bounds_padding_once_groups_are_big_enough() {
    let lengths: Vec<usize> = (0..64).map(|i| 100 - i).collect(); // 100 down to 37
    let groups = plan(&lengths, 1 << 20, 1000, Some(0.25));
    for g in &groups {
        let (first, last) = (lengths[g[0]], lengths[*g.last().expect("member")]);
        assert!(
            g.len() <= MIN_GROUP || last as f64 >= 0.75 * first as f64,
            "{first}..{last}"
        );
    }
    assert_eq!(groups.len(), 4, "{groups:?}");
    // Without the bound: one group.
    assert_eq!(plan(&lengths, 1 << 20, 1000, Some(1.0)).len(), 1);
}

/// An encoder that computes only the real tokens gets groups bounded by their sum, whatever
/// the lengths: one long sequence does not make the short ones count as long.
#[test]
fn packs_real_tokens_without_padding() {
    let lengths = [3, 10, 2, 10, 7, 1, 30];
    let groups = plan(&lengths, 24, 8, None);
    assert_eq!(groups, vec![vec![6], vec![1, 3], vec![4, 0, 2, 5]]);
    assert_eq!(
        plan(&lengths, 24, 8, Some(1.0)).len(),
        4,
        "padded: 4 × 7 > 24"
    );
    for g in &groups {
        assert!(g.len() == 1 || g.iter().map(|&i| lengths[i]).sum::<usize>() <= 24);
    }
    // One 30 and a hundred 2s: padded, the 2s would count as 30 each.
    let mut mixed = vec![30];
    mixed.extend([2; 100]);
    let groups = plan(&mixed, 256, 1000, None);
    assert_eq!(groups.len(), 1, "230 real tokens fit 256");
    assert!(plan(&mixed, 256, 1000, Some(1.0)).len() > 1);
    assert!(plan(&[], 10, 10, None).is_empty());
}

/// Meets the other slots' encoders inside `encode`: each call waits (up to `wait`) until
/// `expected` calls are inside at once, and fails if they never are.
struct Meeting {
    inside: Arc<(Mutex<usize>, std::sync::Condvar)>,
    expected: usize,
    wait: Duration,
}

impl Encoder for Meeting {
    fn hidden(&self) -> usize {
        1
    }
    fn max_tokens(&self) -> usize {
        1 << 20
    }
    fn max_sequences(&self) -> usize {
        1 << 10
    }
    fn pads(&self) -> bool {
        false
    }
    fn survives_panic(&self) -> bool {
        true
    }
    fn encode(&mut self, seqs: &[&Sequence]) -> Result<Vec<f32>, EncodeError> {
        let (count, met) = &*self.inside;
        let mut inside = count.lock().expect("count");
        *inside += 1;
        met.notify_all();
        let (inside, waited) = met
            .wait_timeout_while(inside, self.wait, |n| *n < self.expected)
            .expect("count");
        drop(inside);
        if waited.timed_out() {
            return Err(EncodeError::Device(
                "the other slot's batch never ran meanwhile".into(),
            ));
        }
        Ok(seqs.iter().map(|s| s.ids[0] as f32).collect())
    }
}

/// Slots of `Meeting` encoders that wait up to `wait` for each other.
fn meeting_slots(n: usize, wait: Duration) -> Slots {
    let inside = Arc::new((Mutex::new(0), std::sync::Condvar::new()));
    let make = |_slot: usize| {
        let inside = inside.clone();
        move || {
            let meeting = Meeting {
                inside,
                expected: 2,
                wait,
            };
            Ok(Box::new(meeting) as Box<dyn Encoder>)
        }
    };
    Slots::start(
        n,
        "test-slots",
        make,
        Arc::new(|_| unreachable!("no panic")),
        false,
    )
    .expect("starts")
}

/// With --compute-slots 2, two batches would run one after the other on one compute thread:
/// now each slot's encoder takes one, both inside their encode at once, and each batch gets
/// its own answers. One slot (the check's own control) runs them one after the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_slots_encode_two_batches_at_once() {
    let slots = meeting_slots(2, Duration::from_secs(5));
    assert_eq!(slots.hidden(), 1);
    let (a, b) = tokio::join!(
        slots.encode(vec![seq(11, 3), seq(12, 2)], Vec::new()),
        slots.encode(vec![seq(21, 4)], Vec::new()),
    );
    assert_eq!(a.expect("first batch").vectors, vec![11.0, 12.0]);
    assert_eq!(b.expect("second batch").vectors, vec![21.0]);

    let one = meeting_slots(1, Duration::from_millis(200));
    let (a, b) = tokio::join!(
        one.encode(vec![seq(11, 3)], Vec::new()),
        one.encode(vec![seq(21, 4)], Vec::new()),
    );
    assert!(a.is_err(), "one slot runs one batch at a time");
    assert!(b.is_ok(), "the second meets the first's count once it runs");
}
