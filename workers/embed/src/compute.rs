//! The compute thread: one OS thread owns the [`Encoder`] (and, for CUDA, its context,
//! stream and buffers), so that no device work runs on the async runtime or under a lock.
//! Handlers send it whole batches of sequences; it sorts them by length, cuts them into
//! groups that fit the encoder's limits (padding only to each group's longest), runs them
//! and answers in the caller's order. Between groups it looks at each sequence's cancellation
//! (the server cancelled its item: the caller went away or its deadline passed): a cancelled
//! sequence is not encoded, and a group left with none is skipped.
//!
//! A panic inside an encode call is caught there and fails the batch in flight
//! ([`EncodeError::Panicked`], logged at error level). An encoder that
//! [survives a panic](Encoder::survives_panic) takes the next batch; one that does not is
//! never called again: the thread answers what is queued with [`EncodeError::Stopped`],
//! calls the compute's `on_fatal` with the reason (the worker then stops serving and exits),
//! and ends. Dropping the [`ComputeThread`] closes its channel and joins the thread, once it has
//! finished the batch at hand; the encoder is dropped on the thread that made it.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use modelshare_worker::CancellationToken;
use tokio::sync::oneshot;
use tracing::{debug, error};

use crate::encoder::{EncodeError, Encoder};
use crate::tokenize::Sequence;

struct Job {
    seqs: Vec<Sequence>,
    cancels: Vec<CancellationToken>,
    reply: oneshot::Sender<Result<Encoded, EncodeError>>,
}

/// What a job computed: `[seqs, hidden]` row-major, and which sequences were cancelled
/// before their group ran (their rows are zeros).
#[derive(Debug, Clone, PartialEq)]
pub struct Encoded {
    /// The rows, in the caller's order.
    pub vectors: Vec<f32>,
    /// Per sequence: cancelled before it was encoded.
    pub cancelled: Vec<bool>,
}

/// Called once, on the compute thread, when it stops taking work because its encoder
/// panicked and does not [survive it](Encoder::survives_panic) (or the thread's own loop
/// panicked); given the reason.
pub type OnFatal = Box<dyn FnOnce(String) + Send>;

/// How the compute thread ended, checked when it is joined: `Err` with the reason when it
/// stopped after a panic.
type ThreadEnd = Result<(), String>;

/// The handle on the compute thread. Dropping it ends the thread: its channel closes, the
/// thread finishes the job at hand (and those queued whose callers still wait), drops the
/// encoder and is joined.
#[derive(Debug)]
pub struct ComputeThread {
    /// `None` only while dropping.
    jobs: Option<mpsc::Sender<Job>>,
    /// `None` only while dropping.
    thread: Option<JoinHandle<ThreadEnd>>,
    hidden: usize,
}

impl ComputeThread {
    /// Starts the thread and builds the encoder on it with `make` (a CUDA encoder binds its
    /// context to the thread that makes it). Returns once it is built, or its error (the
    /// thread joined).
    pub fn start<F>(name: &str, make: F, on_fatal: OnFatal) -> Result<Self, EncodeError>
    where
        F: FnOnce() -> Result<Box<dyn Encoder>, EncodeError> + Send + 'static,
    {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread = thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || match make() {
                Ok(encoder) => {
                    let _ = ready_tx.send(Ok(encoder.hidden()));
                    drop(ready_tx);
                    serve(encoder, rx, on_fatal)
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    Ok(())
                }
            })
            .map_err(|e| EncodeError::Device(format!("cannot start the compute thread: {e}")))?;
        let mut compute = Self {
            jobs: Some(jobs),
            thread: Some(thread),
            hidden: 0,
        };
        match ready_rx.recv() {
            Ok(Ok(hidden)) => {
                compute.hidden = hidden;
                Ok(compute)
            }
            Ok(Err(e)) => Err(e),
            // `make` panicked: the thread has ended; its panic is logged when it is joined.
            Err(_) => {
                let reason = compute
                    .join()
                    .err()
                    .unwrap_or_else(|| "it ended".to_owned());
                Err(EncodeError::Device(format!(
                    "the compute thread failed while starting: {reason}"
                )))
            }
        }
    }

    /// Length of a sentence vector.
    pub fn hidden(&self) -> usize {
        self.hidden
    }

    /// The sentence vectors of `seqs`, `[seqs.len(), hidden]` row-major, in their order;
    /// `cancels` (one per sequence, or none) are looked at between groups.
    pub async fn encode(
        &self,
        seqs: Vec<Sequence>,
        cancels: Vec<CancellationToken>,
    ) -> Result<Encoded, EncodeError> {
        let ended = || EncodeError::Stopped("the compute thread has ended".into());
        let (reply, answer) = oneshot::channel();
        self.jobs
            .as_ref()
            .ok_or_else(ended)?
            .send(Job {
                seqs,
                cancels,
                reply,
            })
            .map_err(|_| ended())?;
        // The thread drops a job unanswered only as it ends (after a panic).
        answer.await.unwrap_or_else(|_| Err(ended()))
    }

    /// Closes the channel and joins the thread, logging how it ended; `Err` with a panic's
    /// message if it panicked outside the loop's own catch (in `make`, or dropping the
    /// encoder). This blocks (on the runtime, where the handler is dropped) for the job at
    /// hand at most: the serve loop has answered every batch before it drops the handler,
    /// and jobs whose callers went away are skipped.
    fn join(&mut self) -> Result<(), String> {
        drop(self.jobs.take());
        let Some(thread) = self.thread.take() else {
            return Ok(());
        };
        match thread.join() {
            Ok(Ok(())) => {
                debug!("the compute thread has ended");
                Ok(())
            }
            // Logged at error level when it happened.
            Ok(Err(reason)) => {
                debug!(%reason, "the compute thread had stopped");
                Ok(())
            }
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                error!(panic = %message, "the compute thread panicked");
                Err(message)
            }
        }
    }
}

impl Drop for ComputeThread {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

/// The compute thread's life once its encoder is built: runs jobs until every handle is
/// gone (`Ok`), or until a panic the encoder does not survive (or one of the loop itself).
/// Then it answers the jobs queued, refuses later ones, calls `on_fatal`, and drops the
/// encoder last (after a panic, even its drop might misbehave).
fn serve(mut encoder: Box<dyn Encoder>, jobs: mpsc::Receiver<Job>, on_fatal: OnFatal) -> ThreadEnd {
    let ended = panic::catch_unwind(AssertUnwindSafe(|| take_jobs(encoder.as_mut(), &jobs)))
        .unwrap_or_else(|payload| {
            let message = panic_message(payload.as_ref());
            error!(panic = %message, "the compute thread's loop panicked");
            Err(format!("the compute thread panicked: {message}"))
        });
    if let Err(reason) = &ended {
        for job in jobs.try_iter() {
            let _ = job.reply.send(Err(EncodeError::Stopped(reason.clone())));
        }
        drop(jobs);
        on_fatal(reason.clone());
    }
    drop(encoder);
    ended
}

/// Runs jobs in turn until the channel closes (`Ok`) or the encoder panicked and does not
/// survive it (`Err`, the reason). A job whose caller has gone (its handler call aborted) is
/// skipped.
fn take_jobs(encoder: &mut dyn Encoder, jobs: &mpsc::Receiver<Job>) -> ThreadEnd {
    while let Ok(job) = jobs.recv() {
        if job.reply.is_closed() {
            continue;
        }
        let result = run(encoder, &job.seqs, &job.cancels);
        let fatal = match &result {
            Err(EncodeError::Panicked(message)) => {
                let survives = encoder.survives_panic();
                error!(
                    panic = %message,
                    sequences = job.seqs.len(),
                    survives,
                    "the encoder panicked; its batch fails"
                );
                (!survives).then(|| format!("the encoder panicked: {message}"))
            }
            _ => None,
        };
        let _ = job.reply.send(result);
        if let Some(reason) = fatal {
            return Err(reason);
        }
    }
    Ok(())
}

/// The message of a panic's payload (`panic!` with a literal or a format).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// `encoder.encode(seqs)`, a panic inside it caught and returned as
/// [`EncodeError::Panicked`].
fn encode_caught(encoder: &mut dyn Encoder, seqs: &[&Sequence]) -> Result<Vec<f32>, EncodeError> {
    // AssertUnwindSafe: after a panic the encoder is called again only if it says it
    // survives one (`take_jobs`).
    panic::catch_unwind(AssertUnwindSafe(|| encoder.encode(seqs)))
        .unwrap_or_else(|payload| Err(EncodeError::Panicked(panic_message(payload.as_ref()))))
}

/// Runs one job: groups by length, encodes each group's members not cancelled by then, puts
/// rows back in order.
fn run(
    encoder: &mut dyn Encoder,
    seqs: &[Sequence],
    cancels: &[CancellationToken],
) -> Result<Encoded, EncodeError> {
    let hidden = encoder.hidden();
    let lengths: Vec<usize> = seqs.iter().map(Sequence::len).collect();
    let mut out = vec![0.0f32; seqs.len() * hidden];
    let mut cancelled = vec![false; seqs.len()];
    let waste = if encoder.pads() { MAX_PADDING } else { 1.0 };
    for group in plan(
        &lengths,
        encoder.max_tokens(),
        encoder.max_sequences(),
        waste,
    ) {
        let group: Vec<usize> = group
            .into_iter()
            .filter(|&i| {
                let gone = cancels.get(i).is_some_and(CancellationToken::is_cancelled);
                cancelled[i] = gone;
                !gone
            })
            .collect();
        if group.is_empty() {
            continue;
        }
        let members: Vec<&Sequence> = group.iter().map(|&i| &seqs[i]).collect();
        let vectors = encode_caught(encoder, &members)?;
        if vectors.len() != group.len() * hidden {
            return Err(EncodeError::Device(format!(
                "the encoder returned {} values for {} sequences of {hidden}",
                vectors.len(),
                group.len()
            )));
        }
        for (row, &i) in vectors.chunks_exact(hidden).zip(&group) {
            out[i * hidden..(i + 1) * hidden].copy_from_slice(row);
        }
    }
    Ok(Encoded {
        vectors: out,
        cancelled,
    })
}

/// The most padding a group of a padding encoder may carry, as a fraction of its first
/// (longest) sequence: a sequence shorter than that starts a new group.
const MAX_PADDING: f64 = 0.25;
/// Groups smaller than this take shorter sequences anyway (a group has a fixed cost).
const MIN_GROUP: usize = 16;

/// Groups of sequence indices, longest first, each with at most `max_sequences` members
/// and `members × longest ≤ max_tokens` (a sequence longer than `max_tokens` alone); once a
/// group has [`MIN_GROUP`] members, a sequence shorter than `(1 − max_padding) × longest`
/// starts the next (padding bounded where it costs: on the GPU, attention grows as S²).
pub fn plan(
    lengths: &[usize],
    max_tokens: usize,
    max_sequences: usize,
    max_padding: f64,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lengths[i]));
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in order {
        match groups.last_mut() {
            // Sorted longest first: the group's first member is its longest.
            Some(g)
                if g.len() < max_sequences.max(1)
                    && (g.len() + 1) * lengths[g[0]] <= max_tokens
                    && (g.len() < MIN_GROUP
                        || lengths[i] as f64 >= (1.0 - max_padding) * lengths[g[0]] as f64) =>
            {
                g.push(i)
            }
            _ => groups.push(vec![i]),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;

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
        );
        let err = started.expect_err("fails");
        assert!(err.to_string().contains("no device 3"), "{err}");
    }

    /// Groups would exceed the encoder's limits, lose a sequence, or pad short ones to long.
    #[test]
    fn plans_groups_within_limits_longest_first() {
        let lengths = [3, 10, 2, 10, 7, 1, 30];
        let groups = plan(&lengths, 24, 3, 1.0);
        assert_eq!(groups, vec![vec![6], vec![1, 3], vec![4, 0, 2], vec![5]]);
        let mut all: Vec<usize> = groups.concat();
        all.sort_unstable();
        assert_eq!(all, (0..lengths.len()).collect::<Vec<_>>());
        for g in &groups {
            assert!(g.len() <= 3);
            assert!(g.len() == 1 || g.len() * lengths[g[0]] <= 24);
        }
        assert!(plan(&[], 10, 10, 1.0).is_empty());
    }

    /// A padding encoder would get short sequences padded to long ones.
    #[test]
    fn bounds_padding_once_groups_are_big_enough() {
        let lengths: Vec<usize> = (0..64).map(|i| 100 - i).collect(); // 100 down to 37
        let groups = plan(&lengths, 1 << 20, 1000, 0.25);
        for g in &groups {
            let (first, last) = (lengths[g[0]], lengths[*g.last().expect("member")]);
            assert!(
                g.len() <= MIN_GROUP || last as f64 >= 0.75 * first as f64,
                "{first}..{last}"
            );
        }
        assert_eq!(groups.len(), 4, "{groups:?}");
        // Without the bound: one group.
        assert_eq!(plan(&lengths, 1 << 20, 1000, 1.0).len(), 1);
    }
}
