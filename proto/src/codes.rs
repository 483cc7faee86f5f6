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

/// The number of the code named `name` (`"NOT_FOUND"` → 5); `None` for a name no code has.
pub fn from_name(name: &str) -> Option<i32> {
    NAMES
        .iter()
        .position(|n| *n == name)
        .and_then(|i| i32::try_from(i).ok())
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

    /// A name read back gives its number again, for every code; other names none.
    #[test]
    fn names_read_back_to_their_numbers() {
        for code in 0..17 {
            assert_eq!(from_name(name(code)), Some(code));
        }
        assert_eq!(from_name("not_found"), None);
        assert_eq!(from_name("NOPE"), None);
    }
}
