//! [`InferError`]: why a request got no answer, with its gRPC code and its HTTP status, mapped
//! here once for every front door (OIP over gRPC and REST, OpenAI).

use std::time::Duration;

use axum::http::StatusCode;
use tonic::Code;

use super::scheduler::Admission;

/// How long a refused caller is told to wait before trying again (`Retry-After`).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

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
    /// A worker failed an item of the request.
    #[error("input {index}: {message}")]
    Item {
        /// The item's place in the request, from 0.
        index: usize,
        /// The worker's code.
        code: Code,
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
}

impl InferError {
    /// The gRPC code.
    pub fn code(&self) -> Code {
        match self {
            Self::ModelNotFound(_) => Code::NotFound,
            Self::InvalidInput(_) | Self::TooLarge { .. } => Code::InvalidArgument,
            Self::Refused(Admission::NoItems { .. } | Admission::TooLarge { .. }) => {
                Code::InvalidArgument
            }
            Self::Refused(_) => Code::ResourceExhausted,
            Self::DeadlineExceeded { .. } => Code::DeadlineExceeded,
            Self::NoWorker { .. } | Self::WorkersLost { .. } | Self::ShuttingDown => {
                Code::Unavailable
            }
            Self::Item { code, .. } => *code,
            Self::BadOutput { .. } => Code::Internal,
        }
    }

    /// The HTTP status: 413 for a request that can never fit, else the code's.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::TooLarge { .. } | Self::Refused(Admission::TooLarge { .. }) => {
                StatusCode::PAYLOAD_TOO_LARGE
            }
            _ => http_status(self.code()),
        }
    }

    /// How long the caller should wait before retrying, for refusals that a retry may pass.
    pub fn retry_after(&self) -> Option<Duration> {
        retry_after(self.code())
    }
}

/// How long a caller refused with `code` should wait before retrying: [`RETRY_AFTER`] for
/// refusals that a retry may pass (RESOURCE_EXHAUSTED, UNAVAILABLE), else none.
pub fn retry_after(code: Code) -> Option<Duration> {
    match code {
        Code::ResourceExhausted | Code::Unavailable => Some(RETRY_AFTER),
        _ => None,
    }
}

/// The HTTP status for a gRPC code (the usual correspondence, as grpc-gateway draws it).
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<InferError> for tonic::Status {
    fn from(e: InferError) -> Self {
        tonic::Status::new(e.code(), crate::error::bounded_message(e.to_string()))
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
        assert_eq!(e.code(), Code::ResourceExhausted);
        assert_eq!(e.http_status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(e.retry_after(), Some(RETRY_AFTER));
        let e = InferError::NoWorker {
            model: "m".into(),
            waited: Duration::from_secs(5),
        };
        assert_eq!(e.http_status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(e.to_string().contains("no worker serves model 'm'"));
        let e = InferError::Item {
            index: 2,
            code: Code::InvalidArgument,
            message: "too long".into(),
        };
        assert_eq!(e.http_status(), StatusCode::BAD_REQUEST);
        assert_eq!(e.retry_after(), None);
    }
}
