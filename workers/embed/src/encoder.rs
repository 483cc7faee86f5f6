//! What a backend does: turn tokenized sequences into sentence vectors. The compute thread
//! owns one [`Encoder`] and calls it with sequences sorted and grouped to fit its limits,
//! catching a panic inside a call (see [`Encoder::survives_panic`]).

use modelshare_kernels::KernelError;

use crate::tokenize::Sequence;

/// A backend's failure on a whole group of sequences.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// A kernel or matrix product refused its arguments or failed to launch.
    #[error("{0}")]
    Kernel(#[from] KernelError),
    /// The device failed (a CUDA call, a copy).
    #[error("device: {0}")]
    Device(String),
    /// The weights could not be read (the arena's view).
    #[error("weights: {0}")]
    Weights(String),
    /// The encoder panicked on this group (the panic's message): a bug, caught on the
    /// compute thread so that only the batch in flight fails.
    #[error("the encoder panicked: {0}")]
    Panicked(String),
    /// The compute thread no longer takes work: the worker is stopping (after a panic its
    /// encoder cannot survive, or at shutdown). Another worker may take the batch.
    #[error("the encoder has stopped: {0}")]
    Stopped(String),
}

/// A forward pass of the encoder and its pooling.
pub trait Encoder: Send {
    /// Length of a sentence vector.
    fn hidden(&self) -> usize;

    /// Most tokens one call takes: its sequences times their padded length when it
    /// [`pads`](Encoder::pads), else the sum of their lengths.
    fn max_tokens(&self) -> usize;

    /// Most sequences one call takes.
    fn max_sequences(&self) -> usize;

    /// Whether a call pads its sequences to the longest (so groups should be of like
    /// lengths, and [`max_tokens`](Encoder::max_tokens) counts the padding).
    fn pads(&self) -> bool;

    /// Whether the encoder may be called again after a call of it panicked. `false` when a
    /// panic may leave state the encoder cannot check (a device stream with launches of the
    /// abandoned pass): the compute thread then stops, and the worker exits once it has
    /// answered what it holds.
    fn survives_panic(&self) -> bool;

    /// The sentence vectors of `seqs`, row-major `[seqs.len(), hidden]`. The caller keeps
    /// within [`max_tokens`](Encoder::max_tokens) and [`max_sequences`](Encoder::max_sequences)
    /// and passes sequences of at least one token, ids inside the vocabulary.
    fn encode(&mut self, seqs: &[&Sequence]) -> Result<Vec<f32>, EncodeError>;

    /// Whether [`encode_groups`](Encoder::encode_groups) queues the groups before it waits
    /// (the GPU goes from one group to the next without waiting on the host). The caller
    /// then hands it a job's groups at once; otherwise it encodes them one by one, looking at
    /// cancellations between them.
    fn queues_groups(&self) -> bool {
        false
    }

    /// The vectors of several groups, as `encode` gives each (by default, one `encode` each).
    fn encode_groups(&mut self, groups: &[Vec<&Sequence>]) -> Result<Vec<Vec<f32>>, EncodeError> {
        groups.iter().map(|g| self.encode(g)).collect()
    }

    /// Where the device's time went, stage by stage, when the encoder was asked to time its
    /// stages (`--profile-stages`); `None` otherwise or where it cannot.
    fn stage_report(&self) -> Option<String> {
        None
    }
}
