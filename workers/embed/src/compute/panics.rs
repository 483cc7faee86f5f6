//! Panics inside the encoder: caught around each call, and their messages.

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};

use crate::encoder::{EncodeError, Encoder};
use crate::tokenize::Sequence;

/// The message of a panic's payload (`panic!` with a literal or a format).
pub(super) fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".to_owned()
    }
}

/// `encoder.encode(seqs)`, a panic inside it caught and returned as
/// [`EncodeError::Panicked`].
pub(super) fn encode_caught(
    encoder: &mut dyn Encoder,
    seqs: &[&Sequence],
) -> Result<Vec<f32>, EncodeError> {
    // AssertUnwindSafe: after a panic the encoder is called again only if it says it
    // survives one (`take_jobs`).
    panic::catch_unwind(AssertUnwindSafe(|| encoder.encode(seqs)))
        .unwrap_or_else(|payload| Err(EncodeError::Panicked(panic_message(payload.as_ref()))))
}

/// `encoder.encode_groups(groups)`, a panic in it caught as [`encode_caught`] does.
pub(super) fn encode_groups_caught(
    encoder: &mut dyn Encoder,
    groups: &[Vec<&Sequence>],
) -> Result<Vec<Vec<f32>>, EncodeError> {
    panic::catch_unwind(AssertUnwindSafe(|| encoder.encode_groups(groups)))
        .unwrap_or_else(|payload| Err(EncodeError::Panicked(panic_message(payload.as_ref()))))
}
