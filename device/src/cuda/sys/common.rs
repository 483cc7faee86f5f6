//! Helpers every `unsafe` wrapper of the backend shares: the driver-error mapping, binding a
//! context, range checks. A leaf: it uses nothing of its siblings.

use cudarc::driver::{CudaContext, DriverError};

use crate::error::{DeviceError, Result};

/// Maps a driver error of `op` to a [`DeviceError::Cuda`].
pub(super) fn driver(op: &'static str) -> impl Fn(DriverError) -> DeviceError {
    move |e| DeviceError::Cuda { op, source: e }
}

/// Checks that `len` bytes at `offset` lie within `total` bytes.
pub(super) fn check(op: &'static str, offset: u64, len: usize, total: u64) -> Result<()> {
    crate::backend::check_range(op, offset, len, total)
}

/// Makes `ctx` current on the calling thread.
pub(super) fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))
}
