//! The compute thread: one OS thread owns the [`Encoder`] (and, for CUDA, its context,
//! stream and buffers), so that no device work runs on the async runtime or under a lock.
//! Handlers send it whole batches of sequences; it sorts them by length, cuts them into
//! groups that fit the encoder's limits (padding only to each group's longest), runs them
//! and answers in the caller's order. Between groups it looks at each sequence's cancellation
//! (the server cancelled its item: the caller went away or its deadline passed): a cancelled
//! sequence is not encoded, and a group left with none is skipped.

use std::sync::mpsc;
use std::thread;

use modelshare_worker::CancellationToken;
use tokio::sync::oneshot;
use tracing::error;

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

/// A handle on the compute thread; the thread ends when the last handle is dropped.
#[derive(Debug, Clone)]
pub struct Engine {
    jobs: mpsc::Sender<Job>,
    hidden: usize,
}

impl Engine {
    /// Starts the thread and builds the encoder on it with `make` (a CUDA encoder binds its
    /// context to the thread that makes it). Returns once it is built, or its error.
    pub fn start<F>(name: &str, make: F) -> Result<Self, EncodeError>
    where
        F: FnOnce() -> Result<Box<dyn Encoder>, EncodeError> + Send + 'static,
    {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (ready_tx, ready_rx) = mpsc::channel();
        thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut encoder = match make() {
                    Ok(e) => {
                        let _ = ready_tx.send(Ok(e.hidden()));
                        e
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                while let Ok(job) = rx.recv() {
                    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run(encoder.as_mut(), &job.seqs, &job.cancels)
                    }));
                    match result {
                        Ok(r) => {
                            let _ = job.reply.send(r);
                        }
                        Err(_) => {
                            // The encoder's state is unknown now: a worker that stayed up
                            // would fail every request. Exit, so that a supervisor restarts it.
                            error!("the compute thread panicked; exiting");
                            eprintln!("error: the compute thread panicked; exiting");
                            std::process::exit(70);
                        }
                    }
                }
            })
            .map_err(|e| EncodeError::Device(format!("cannot start the compute thread: {e}")))?;
        let hidden = ready_rx
            .recv()
            .map_err(|_| EncodeError::Device("the compute thread ended while starting".into()))??;
        Ok(Self { jobs, hidden })
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
        let (reply, answer) = oneshot::channel();
        self.jobs
            .send(Job {
                seqs,
                cancels,
                reply,
            })
            .map_err(|_| EncodeError::Device("the compute thread has ended".into()))?;
        answer.await.unwrap_or_else(|_| {
            error!("the compute thread dropped a job");
            Err(EncodeError::Device("the compute thread has ended".into()))
        })
    }
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
        let vectors = encoder.encode(&members)?;
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
