//! [`Kind`]: what kind of failure an error is, in the canonical error space that gRPC, the
//! workers' results (`ItemResult.code`) and the metrics' `code` label all number the same way.
//! The request path speaks only of kinds; each door turns a kind into its transport's status
//! once (gRPC: the code of the same number; HTTP: the usual correspondence).

use std::time::Duration;

/// How long a refused caller is told to wait before trying again (`Retry-After`).
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The canonical error kinds, numbered as gRPC numbers its codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i32)]
pub enum Kind {
    /// Not an error.
    Ok = 0,
    /// The caller cancelled.
    Cancelled = 1,
    /// Unknown.
    Unknown = 2,
    /// The caller's input is malformed.
    InvalidArgument = 3,
    /// The deadline passed.
    DeadlineExceeded = 4,
    /// Not found (or not visible to the caller).
    NotFound = 5,
    /// Already exists.
    AlreadyExists = 6,
    /// Not permitted.
    PermissionDenied = 7,
    /// A quota or a queue is full.
    ResourceExhausted = 8,
    /// The system is not in a state that allows it.
    FailedPrecondition = 9,
    /// Aborted.
    Aborted = 10,
    /// Out of range.
    OutOfRange = 11,
    /// Not implemented.
    Unimplemented = 12,
    /// A bug.
    Internal = 13,
    /// Not available now; a retry may pass.
    Unavailable = 14,
    /// Data lost.
    DataLoss = 15,
    /// No valid credentials.
    Unauthenticated = 16,
}

impl Kind {
    /// Every kind, in number order.
    pub const ALL: [Kind; 17] = [
        Kind::Ok,
        Kind::Cancelled,
        Kind::Unknown,
        Kind::InvalidArgument,
        Kind::DeadlineExceeded,
        Kind::NotFound,
        Kind::AlreadyExists,
        Kind::PermissionDenied,
        Kind::ResourceExhausted,
        Kind::FailedPrecondition,
        Kind::Aborted,
        Kind::OutOfRange,
        Kind::Unimplemented,
        Kind::Internal,
        Kind::Unavailable,
        Kind::DataLoss,
        Kind::Unauthenticated,
    ];

    /// The kind numbered `n` (a worker's `ItemResult.code`); an unknown number is
    /// [`Kind::Unknown`].
    pub fn from_number(n: i32) -> Kind {
        usize::try_from(n)
            .ok()
            .and_then(|i| Self::ALL.get(i).copied())
            .unwrap_or(Kind::Unknown)
    }

    /// Its number.
    pub fn number(self) -> i32 {
        self as i32
    }

    /// Its name as the metrics label it (`OK`, `NOT_FOUND`, ...).
    pub fn label(self) -> &'static str {
        modelshare_proto::codes::name(self.number())
    }

    /// How long a caller refused with this kind should wait before retrying: [`RETRY_AFTER`]
    /// for refusals that a retry may pass (RESOURCE_EXHAUSTED, UNAVAILABLE), else none.
    pub fn retry_after(self) -> Option<Duration> {
        match self {
            Kind::ResourceExhausted | Kind::Unavailable => Some(RETRY_AFTER),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_numbered_in_order_and_unknown_numbers_are_unknown() {
        for (i, kind) in Kind::ALL.iter().enumerate() {
            assert_eq!(kind.number(), i as i32);
            assert_eq!(Kind::from_number(i as i32), *kind);
        }
        assert_eq!(Kind::from_number(-1), Kind::Unknown);
        assert_eq!(Kind::from_number(17), Kind::Unknown);
        assert_eq!(Kind::ResourceExhausted.label(), "RESOURCE_EXHAUSTED");
    }
}
