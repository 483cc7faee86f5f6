//! [`Event`]: a CUDA event, plain or inter-process (made here or opened from another
//! process's handle), recorded, waited for, queried; destroyed on drop.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUevent};
use cudarc::driver::{CudaContext, CudaStream, result};

use super::common::{bind, driver};
use super::ipc::IPC_HANDLE_BYTES;
use crate::error::{DeviceError, Result};

/// A CUDA event, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<CudaContext>,
    ev: CUevent,
}

// SAFETY: an event handle is usable from any thread that binds its context (every method does).
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronises event operations.
unsafe impl Sync for Event {}

impl Event {
    fn create(ctx: &Arc<CudaContext>, flags: u32) -> Result<Self> {
        bind(ctx)?;
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: `ev` is a valid out-parameter.
        unsafe { sys::cuEventCreate(&mut ev, flags) }
            .result()
            .map_err(driver("cuEventCreate"))?;
        Ok(Self {
            ctx: ctx.clone(),
            ev,
        })
    }

    /// A timing-disabled event, for ordering within this process.
    pub fn plain(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::create(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    /// An inter-process, timing-disabled event.
    pub fn interprocess(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::create(
            ctx,
            sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
                | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    }

    /// Opens another process's event handle.
    pub fn open_ipc(ctx: &Arc<CudaContext>, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self> {
        bind(ctx)?;
        let h = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: `ev` is a valid out-parameter; the driver validates the handle.
        unsafe { sys::cuIpcOpenEventHandle(&mut ev, h) }
            .result()
            .map_err(driver("cuIpcOpenEventHandle"))?;
        Ok(Self {
            ctx: ctx.clone(),
            ev,
        })
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: both handles are live (owned by `self` and `stream`).
        unsafe { result::event::record(self.ev, stream.cu_stream()) }
            .map_err(driver("cuEventRecord"))
    }

    /// Waits on the host for the last record.
    pub fn synchronize(&self) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: the event is live.
        unsafe { result::event::synchronize(self.ev) }.map_err(driver("cuEventSynchronize"))
    }

    /// Whether the last record has completed.
    pub fn is_done(&self) -> Result<bool> {
        bind(&self.ctx)?;
        // SAFETY: the event is live.
        match unsafe { result::event::query(self.ev) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(DeviceError::Cuda {
                op: "cuEventQuery",
                source: e,
            }),
        }
    }

    /// Makes `stream` wait, on the device, for the last record.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: both handles are live.
        unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), self.ev, 0) }
            .result()
            .map_err(driver("cuStreamWaitEvent"))
    }

    /// Makes another library's `stream` wait, on the device, for the last record.
    pub fn wait_on_foreign(&self, stream: crate::ForeignStream) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: the event is live; `ForeignStream::from_raw`'s caller vouched for the stream.
        unsafe { sys::cuStreamWaitEvent(stream.handle(), self.ev, 0) }
            .result()
            .map_err(driver("cuStreamWaitEvent"))
    }

    /// The IPC handle (the event must be inter-process).
    pub fn ipc_handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]> {
        bind(&self.ctx)?;
        let mut handle = sys::CUipcEventHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: `handle` is a valid out-parameter; the event is live.
        unsafe { sys::cuIpcGetEventHandle(&mut handle, self.ev) }
            .result()
            .map_err(driver("cuIpcGetEventHandle"))?;
        Ok(handle.reserved.map(|c| c as u8))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: the event is ours and used by nothing after drop.
        if let Err(e) = unsafe { result::event::destroy(self.ev) } {
            tracing::warn!(error = %e, "cuEventDestroy failed");
        }
    }
}
