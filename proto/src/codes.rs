//! The canonical status codes' names (`OK`, `NOT_FOUND`, ...), by number: gRPC numbers its
//! codes this way, and so do the contract's item results (`ItemResult.code`). One table for
//! the server's metrics, the request path, the SDK and the Python package.

/// The names, indexed by code number.
const NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The name of code `code`; a number outside the table is `UNKNOWN`.
pub fn name(code: i32) -> &'static str {
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i).copied())
        .unwrap_or("UNKNOWN")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_numbered_as_grpc_numbers_its_codes() {
        assert_eq!(name(0), "OK");
        assert_eq!(name(5), "NOT_FOUND");
        assert_eq!(name(16), "UNAUTHENTICATED");
        assert_eq!(name(17), "UNKNOWN");
        assert_eq!(name(-1), "UNKNOWN");
    }
}
