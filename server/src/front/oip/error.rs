//! The error of a client's request that is not valid.

use modelshare_serving::InferError;

/// A client's request that is not valid, saying why.
pub(super) fn invalid(message: String) -> InferError {
    InferError::InvalidInput(message)
}
