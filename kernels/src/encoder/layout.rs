//! How a batch's sequences lie in a token-major tensor (`[rows, width]`): each padded to the
//! longest, or packed one after the other ([`Layout`]).

use super::checks::{Buf, buf, int};
use crate::error::KernelError;

/// Where the rows of a batch's sequences lie in a tensor of token rows. The per-head tensors
/// of attention (`[batch·heads, seq, head_dim]`) are always padded; the position-wise steps
/// (projections, feed-forward, norms) run on whatever rows this says, so packed sequences
/// compute no padded token there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Each sequence padded to `seq` rows: sequence `b` starts at row `b·seq`, `batch·seq`
    /// rows in all.
    Padded,
    /// The sequences one after the other: sequence `b` starts at row `offsets[b]` and has
    /// `offsets[b + 1] − offsets[b]` rows (at most `seq`); `offsets` is an i32 device array
    /// of `batch + 1` entries from 0 (FlashAttention's `cu_seqlens`), `rows` the tensor's
    /// rows. The kernels never touch a row at or past `rows`, whatever `offsets` holds.
    Packed {
        /// Device address of the i32 `[batch + 1]` starts.
        offsets: u64,
        /// Rows of the tensor.
        rows: usize,
    },
}

impl Layout {
    /// The tensor's rows for a batch of `batch` sequences of at most `seq` tokens.
    pub(super) fn rows(self, batch: usize, seq: usize) -> Result<usize, KernelError> {
        match self {
            Self::Padded => batch.checked_mul(seq).ok_or_else(|| {
                KernelError::bad(format!("{batch} sequences of {seq} rows overflow"))
            }),
            Self::Packed { rows, .. } => Ok(rows),
        }
    }

    /// The kernels' `offsets` argument (0 for padded) and its checked buffer, if any.
    pub(super) fn offsets(self, batch: usize) -> Result<(u64, Option<Buf>), KernelError> {
        match self {
            Self::Padded => Ok((0, None)),
            Self::Packed { offsets, rows } => {
                int("packed rows", rows)?;
                let n = batch.checked_add(1).ok_or_else(|| {
                    KernelError::bad(format!("{batch} sequences overflow their offsets"))
                })?;
                Ok((offsets, Some(buf("offsets", offsets, n as u64, 4)?)))
            }
        }
    }
}
