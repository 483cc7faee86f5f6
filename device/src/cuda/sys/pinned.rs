//! [`Pinned`]: page-locked host memory, the staging buffers of asynchronous copies.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, result};

use super::common::bind;
use crate::error::{DeviceError, Result};

/// Page-locked host memory, for asynchronous copies.
#[derive(Debug)]
pub struct Pinned {
    ctx: Arc<CudaContext>,
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through `&`/`&mut self`.
unsafe impl Send for Pinned {}

impl Pinned {
    /// Allocates `len` bytes of pinned memory for `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        bind(ctx)?;
        // SAFETY: fresh allocation; flags 0 = plain page-locked memory.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(|e| {
            DeviceError::AllocationFailed {
                bytes: len as u64,
                reason: format!("pinned host memory: {e}"),
            }
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr: ptr.cast::<u8>(),
            len,
        })
    }

    /// The buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes owned by `self`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: `ptr` came from `malloc_host` and is freed once, here.
        if let Err(e) = unsafe { result::free_host(self.ptr.cast::<c_void>()) } {
            tracing::warn!(error = %e, "cuMemFreeHost failed");
        }
    }
}
