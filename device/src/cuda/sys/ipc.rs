//! Legacy IPC: [`IpcMemory`], another process's allocation opened from its handle, and the
//! size of the handles (memory and event).

use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, result};

use super::common::{bind, check, driver};
use crate::error::Result;

/// Size of a legacy IPC handle (memory or event).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Another process's allocation, opened with `cuIpcOpenMemHandle`; closed on drop.
#[derive(Debug)]
pub struct IpcMemory {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
}

// SAFETY: as for `DeviceMemory`: a device address, used with the context bound.
unsafe impl Send for IpcMemory {}
// SAFETY: as above; no method mutates `self`.
unsafe impl Sync for IpcMemory {}

impl IpcMemory {
    /// Opens `handle` in `ctx`.
    pub fn open(ctx: &Arc<CudaContext>, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self> {
        bind(ctx)?;
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-parameter; the driver validates the handle and fails on
        // one that names nothing.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(driver("cuIpcOpenMemHandle"))?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
        })
    }

    /// The address in this process.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Synchronous copy from `offset` into `dst`; `total` is the arena's length.
    pub fn read(&self, offset: u64, dst: &mut [u8], total: u64) -> Result<()> {
        check("read", offset, dst.len(), total)?;
        bind(&self.ctx)?;
        // SAFETY: the range lies inside the opened allocation of `total` bytes.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset) }.map_err(driver("cuMemcpyDtoH"))
    }
}

impl Drop for IpcMemory {
    fn drop(&mut self) {
        if bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: opened by `open`, closed once here; nothing uses it afterwards.
        if let Err(e) = unsafe { sys::cuIpcCloseMemHandle(self.ptr) }.result() {
            tracing::warn!(error = %e, "cuIpcCloseMemHandle failed");
        }
    }
}
