//! What passes between the [`ComputeThread`](super::ComputeThread) and its thread: a job
//! and its answer, and how the thread ends.

use std::time::Instant;

use modelshare_worker::CancellationToken;
use tokio::sync::oneshot;

use crate::encoder::EncodeError;
use crate::tokenize::Sequence;

/// A batch of sequences to encode, the cancellation of each, where to answer, and when it
/// was sent (the thread's profile counts the time it waited).
pub(super) struct Job {
    pub(super) seqs: Vec<Sequence>,
    pub(super) sent: Instant,
    pub(super) cancels: Vec<CancellationToken>,
    pub(super) reply: oneshot::Sender<Result<Encoded, EncodeError>>,
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
/// panicked and does not [survive it](crate::encoder::Encoder::survives_panic) (or the
/// thread's own loop panicked); given the reason.
pub type OnFatal = Box<dyn FnOnce(String) + Send>;

/// How the compute thread ended, checked when it is joined: `Err` with the reason when it
/// stopped after a panic.
pub(super) type ThreadEnd = Result<(), String>;
