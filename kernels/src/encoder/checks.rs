//! The launchers' argument checks: buffers (sizes that overflow, null and misaligned
//! pointers, outputs overlapping inputs), `i32` kernel arguments, LayerNorm's epsilon.

use crate::error::KernelError;
use crate::gemv::{check_range, overlaps};

/// A device buffer as the launchers see it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Buf {
    pub(super) what: &'static str,
    pub(super) ptr: u64,
    pub(super) bytes: u64,
}

/// `dims` multiplied, or an error naming `what` if it overflows `i64`.
pub(super) fn count(what: &str, dims: &[usize]) -> Result<u64, KernelError> {
    dims.iter()
        .try_fold(1u64, |n, d| n.checked_mul(*d as u64))
        .filter(|n| *n <= i64::MAX as u64)
        .ok_or_else(|| KernelError::bad(format!("{what} of shape {dims:?} overflows 64-bit sizes")))
}

/// A checked buffer of `elems` elements of `elem_bytes` (also its alignment).
pub(super) fn buf(
    what: &'static str,
    ptr: u64,
    elems: u64,
    elem_bytes: usize,
) -> Result<Buf, KernelError> {
    let bytes = elems
        .checked_mul(elem_bytes as u64)
        .filter(|b| *b <= i64::MAX as u64)
        .ok_or_else(|| KernelError::bad(format!("{what} of {elems} elements overflows")))?;
    check_range(what, ptr, bytes, elem_bytes as u64)?;
    Ok(Buf { what, ptr, bytes })
}

/// `out` shares no byte with any of `inputs`.
pub(super) fn disjoint(out: &Buf, inputs: &[&Buf]) -> Result<(), KernelError> {
    for input in inputs {
        if overlaps(out.ptr, out.bytes, input.ptr, input.bytes) {
            return Err(KernelError::bad(format!(
                "{} at {:#x} ({} bytes) overlaps {} at {:#x} ({} bytes)",
                out.what, out.ptr, out.bytes, input.what, input.ptr, input.bytes
            )));
        }
    }
    Ok(())
}

/// `v` as an `i32` kernel argument, or an error naming it.
pub(super) fn int(what: &str, v: usize) -> Result<i32, KernelError> {
    i32::try_from(v)
        .map_err(|_| KernelError::bad(format!("{what} = {v} does not fit the kernels' i32")))
}

/// `eps` is a usable LayerNorm epsilon: finite and non-negative.
pub(super) fn check_eps(eps: f32) -> Result<(), KernelError> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(KernelError::bad(format!(
            "layer norm eps {eps} is not finite and non-negative"
        )))
    }
}
