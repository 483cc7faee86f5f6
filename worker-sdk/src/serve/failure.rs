//! [`ItemFailure`]: why one item failed, a status code and a message for the caller; the
//! lowest of the serve modules (the item checks and the handlers both fail with it).

use modelshare_proto::v1 as pb;

/// Why one item failed: a gRPC status code and a message, both passed on to the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} ({code:?})")]
pub struct ItemFailure {
    /// The status code (OK is sent as INTERNAL: a failure needs a failing code).
    pub code: tonic::Code,
    /// What went wrong, for the caller.
    pub message: String,
}

impl ItemFailure {
    /// A failure with `code` and `message`.
    pub fn new(code: tonic::Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// INVALID_ARGUMENT: the item's input or parameters are wrong.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::InvalidArgument, message)
    }

    /// UNIMPLEMENTED: the worker does not answer this kind of item.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::Unimplemented, message)
    }

    /// INTERNAL: the worker failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::Internal, message)
    }

    /// RESOURCE_EXHAUSTED: the item is too large for the worker now.
    pub fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::ResourceExhausted, message)
    }

    /// UNAVAILABLE: the worker cannot run the item now; another may.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::Unavailable, message)
    }

    /// CANCELLED: the server cancelled the item.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::Cancelled, message)
    }

    /// DEADLINE_EXCEEDED: the item's deadline passed before it ran.
    pub fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(tonic::Code::DeadlineExceeded, message)
    }

    /// The wire form.
    pub(super) fn to_pb(&self) -> pb::ItemError {
        let code = match self.code {
            tonic::Code::Ok => tonic::Code::Internal,
            code => code,
        };
        pb::ItemError {
            code: code as i32,
            message: self.message.clone(),
        }
    }
}
