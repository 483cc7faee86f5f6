//! [`DeviceMemory`]: a device allocation (`cuMemAlloc`, or `cuMemCreate` for VMM), made or
//! imported, range-checked copies in and out, its legacy IPC handle or its descriptor, freed
//! on drop.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaStream, result};

use super::common::{bind, check, driver};
use super::ipc::IPC_HANDLE_BYTES;
use super::pinned::Pinned;
use super::vmm;
use crate::error::{DeviceError, Result};

/// A device allocation (`cuMemAlloc`, or `cuMemCreate` for VMM), freed on drop. Every access
/// is range-checked.
#[derive(Debug)]
pub struct DeviceMemory {
    pub(super) ctx: Arc<CudaContext>,
    pub(super) ptr: CUdeviceptr,
    pub(super) len: u64,
    /// The physical allocation, for VMM memory (see [`DeviceMemory::alloc_vmm`]).
    pub(super) vmm: Option<vmm::VmmAlloc>,
}

// SAFETY: a device pointer is a plain number valid in any thread that binds the context (every
// method does); the driver serialises access to the allocation.
unsafe impl Send for DeviceMemory {}
// SAFETY: as above; no method mutates `self`.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// Allocates `len` bytes (at least 256: an IPC handle needs a real allocation).
    pub fn alloc(ctx: &Arc<CudaContext>, len: u64) -> Result<Self> {
        let bytes = usize::try_from(len).map_err(|_| DeviceError::AllocationFailed {
            bytes: len,
            reason: "larger than the address space".into(),
        })?;
        bind(ctx)?;
        // SAFETY: allocates fresh memory in the bound context; no aliasing.
        let ptr = unsafe { result::malloc_sync(bytes.max(256)) }.map_err(|e| {
            if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                DeviceError::AllocationFailed {
                    bytes: len,
                    reason: "out of device memory".into(),
                }
            } else {
                DeviceError::Cuda {
                    op: "cuMemAlloc",
                    source: e,
                }
            }
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: None,
        })
    }

    /// Allocates `len` bytes (rounded up to the granularity) with `cuMemCreate`, exportable as
    /// a file descriptor ([`DeviceMemory::export_fd`]), mapped read-write for this process.
    pub fn alloc_vmm(ctx: &Arc<CudaContext>, len: u64) -> Result<Self> {
        let (vmm, ptr) = vmm::VmmAlloc::create(ctx, len)?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: Some(vmm),
        })
    }

    /// Another process's VMM allocation of `size` bytes, imported from `fd` and mapped
    /// read-write for this process: a restarted server taking over an arena a worker kept
    /// alive. `len` is the arena's length inside it.
    pub fn import_vmm(
        ctx: &Arc<CudaContext>,
        fd: std::os::fd::BorrowedFd<'_>,
        size: u64,
        len: u64,
    ) -> Result<Self> {
        if len > size {
            return Err(DeviceError::BadHandle {
                reason: format!("the allocation ({size} bytes) is smaller than the arena ({len})"),
            });
        }
        let (vmm, ptr) = vmm::VmmAlloc::import(ctx, fd, size)?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: Some(vmm),
        })
    }

    /// The allocation's size (`len` rounded up to the granularity), for VMM memory.
    pub fn vmm_size(&self) -> Option<u64> {
        self.vmm.as_ref().map(vmm::VmmAlloc::size)
    }

    /// A new file descriptor for the allocation (VMM memory only), to pass to a worker.
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        let vmm = self.vmm.as_ref().ok_or(DeviceError::Unsupported {
            what: "a descriptor for memory not allocated with cuMemCreate".into(),
        })?;
        bind(&self.ctx)?;
        vmm.export_fd()
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Synchronous copy of `src` to `offset`.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        check("write", offset, src.len(), self.len)?;
        bind(&self.ctx)?;
        // SAFETY: the destination range lies inside this allocation (checked above).
        unsafe { result::memcpy_htod_sync(self.ptr + offset, src) }.map_err(driver("cuMemcpyHtoD"))
    }

    /// Asynchronous copy of the first `len` bytes of `src` to `offset` on `stream`. The caller
    /// must not touch `src` until work recorded after this on `stream` has completed (the
    /// writer keeps an event per buffer for that).
    pub fn write_async(
        &self,
        offset: u64,
        src: &Pinned,
        skip: usize,
        len: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        check("write", offset, len, self.len)?;
        if skip.checked_add(len).is_none_or(|end| end > src.len) {
            return Err(DeviceError::OutOfRange {
                op: "stage",
                offset: skip as u64,
                len: len as u64,
                arena_len: src.len as u64,
            });
        }
        bind(&self.ctx)?;
        // SAFETY: both ranges are checked (`skip + len` within `src`); `src` is pinned memory
        // that outlives the copy (its owner waits for the copy's event before reusing or
        // freeing it).
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.ptr + offset,
                src.ptr.add(skip).cast::<c_void>(),
                len,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(driver("cuMemcpyHtoDAsync"))
    }

    /// Asynchronous copy of `len` bytes at `offset` into the start of `dst` on `stream`. The
    /// caller must not read `dst` until work recorded after this on `stream` has completed.
    pub fn read_async(
        &self,
        offset: u64,
        dst: &mut Pinned,
        len: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        check("read", offset, len, self.len)?;
        if len > dst.len {
            return Err(DeviceError::OutOfRange {
                op: "read back",
                offset: 0,
                len: len as u64,
                arena_len: dst.len as u64,
            });
        }
        bind(&self.ctx)?;
        // SAFETY: the source range lies inside this allocation and `len` fits `dst` (both
        // checked above); `dst` is pinned memory that outlives the copy (its owner waits for
        // the copy's event before reading, reusing or freeing it).
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                dst.ptr.cast::<c_void>(),
                self.ptr + offset,
                len,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(driver("cuMemcpyDtoHAsync"))
    }

    /// Synchronous copy from `offset` into `dst`.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check("read", offset, dst.len(), self.len)?;
        bind(&self.ctx)?;
        // SAFETY: the source range lies inside this allocation (checked above).
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset) }.map_err(driver("cuMemcpyDtoH"))
    }

    /// The allocation's legacy IPC handle (memory from `cuMemAlloc` only).
    pub fn ipc_handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]> {
        bind(&self.ctx)?;
        let mut handle = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: `handle` is a valid out-parameter; `ptr` is this live allocation.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, self.ptr) }
            .result()
            .map_err(driver("cuIpcGetMemHandle"))?;
        Ok(handle.reserved.map(|c| c as u8))
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if let Err(e) = bind(&self.ctx) {
            tracing::warn!(error = %e, "cannot bind the context to free device memory; leaking it");
            return;
        }
        if let Some(vmm) = &self.vmm {
            vmm.free(self.ptr);
            return;
        }
        // SAFETY: the allocation is ours and nothing in this process uses it after drop.
        if let Err(e) = unsafe { result::free_sync(self.ptr) } {
            tracing::warn!(error = %e, "cuMemFree failed");
        }
    }
}
