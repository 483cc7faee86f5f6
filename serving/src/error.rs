//! [`InferError`]: why a request got no answer, and its [`Kind`]; each door maps kinds to its
//! transport's statuses once.

use std::time::Duration;

use super::kind::Kind;
use super::scheduler::Admission;

/// Why a request got no answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InferError {
    /// The model is not on record, or the caller may not see it.
    #[error("model '{0}' not found")]
    ModelNotFound(String),
    /// The request is malformed (shape, dtype, encoding, sizes).
    #[error("{0}")]
    InvalidInput(String),
    /// The request has more items than the model's whole queue holds: it can never pass.
    #[error(
        "the request has {items} items but a model queues at most {limit} (max_queue_items); split it"
    )]
    TooLarge {
        /// The request's items.
        items: usize,
        /// The most a model's queue holds.
        limit: usize,
    },
    /// Refused at admission: the model's queue or the tenant's quota is full.
    #[error("{0}")]
    Refused(Admission),
    /// The deadline passed before the request was computed.
    #[error("the deadline passed before model '{model}' computed the request")]
    DeadlineExceeded {
        /// The model.
        model: String,
    },
    /// No worker served the model within the wait.
    #[error("no worker serves model '{model}' (waited {} ms for one)", waited.as_millis())]
    NoWorker {
        /// The model.
        model: String,
        /// How long the request waited.
        waited: Duration,
    },
    /// The workers computing the request were lost, twice.
    #[error("the workers computing this request for model '{model}' went away (twice)")]
    WorkersLost {
        /// The model.
        model: String,
    },
    /// The worker streaming an answer went away after it had sent part of it (a streamed
    /// item is never moved to another worker).
    #[error("the worker streaming this answer for model '{model}' went away mid-stream")]
    StreamInterrupted {
        /// The model.
        model: String,
    },
    /// A streamed answer's worker sent no part for the stream's idle limit.
    #[error("model '{model}' sent no part of this streamed answer for {} ms", idle.as_millis())]
    StreamStalled {
        /// The model.
        model: String,
        /// The idle limit.
        idle: Duration,
    },
    /// A streamed answer ran past the longest time a stream may last.
    #[error("this streamed answer of model '{model}' ran past the longest a stream lasts ({} s)", longest.as_secs())]
    StreamTooLong {
        /// The model.
        model: String,
        /// The longest a stream lasts.
        longest: Duration,
    },
    /// A worker failed an item of the request.
    #[error("input {index}: {message}")]
    Item {
        /// The item's place in the request, from 0.
        index: usize,
        /// The worker's code.
        code: Kind,
        /// The worker's message.
        message: String,
    },
    /// A worker's answer cannot be made into this front door's response.
    #[error("the worker's output for model '{model}' is not usable here: {reason}")]
    BadOutput {
        /// The model.
        model: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The server is shutting down and takes no new requests.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// The request path has more new work waiting than its mailbox holds; retry shortly.
    #[error("the server's request path is busy; retry shortly")]
    Busy,
}

impl InferError {
    /// The kind of failure.
    pub fn kind(&self) -> Kind {
        match self {
            Self::ModelNotFound(_) => Kind::NotFound,
            Self::InvalidInput(_) | Self::TooLarge { .. } => Kind::InvalidArgument,
            Self::Refused(Admission::NoItems { .. } | Admission::TooLarge { .. }) => {
                Kind::InvalidArgument
            }
            Self::Refused(_) => Kind::ResourceExhausted,
            Self::DeadlineExceeded { .. }
            | Self::StreamStalled { .. }
            | Self::StreamTooLong { .. } => Kind::DeadlineExceeded,
            Self::NoWorker { .. }
            | Self::WorkersLost { .. }
            | Self::StreamInterrupted { .. }
            | Self::ShuttingDown
            | Self::Busy => Kind::Unavailable,
            Self::Item { code, .. } => *code,
            Self::BadOutput { .. } => Kind::Internal,
        }
    }

    /// Whether the request can never pass, however long the caller waits: it is larger than a
    /// whole queue (HTTP doors answer 413).
    pub fn never_fits(&self) -> bool {
        matches!(
            self,
            Self::TooLarge { .. } | Self::Refused(Admission::TooLarge { .. })
        )
    }

    /// How long the caller should wait before retrying, for refusals that a retry may pass: an
    /// overloaded model's estimate of its queue's drain, else the kind's usual pause.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused(Admission::Overloaded { retry_after, .. }) => Some(*retry_after),
            _ => self.kind().retry_after(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_resource_exhausted_and_429_with_a_retry() {
        let e = InferError::Refused(Admission::QueueFull {
            model: "m".into(),
            limit: 4,
        });
        assert_eq!(e.kind(), Kind::ResourceExhausted);
        assert_eq!(e.retry_after(), Some(super::super::kind::RETRY_AFTER));
        let e = InferError::NoWorker {
            model: "m".into(),
            waited: Duration::from_secs(5),
        };
        assert_eq!(e.kind(), Kind::Unavailable);
        assert!(e.to_string().contains("no worker serves model 'm'"));
        let e = InferError::Item {
            index: 2,
            code: Kind::InvalidArgument,
            message: "too long".into(),
        };
        assert_eq!(e.kind(), Kind::InvalidArgument);
        assert_eq!(e.retry_after(), None);
    }
}
