//! Replica copies between devices: read access to an allocation granted to another device,
//! the peer copy into an allocation, and peer access between two contexts.

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{CudaContext, CudaStream, DriverError};

use super::common::{bind, check, driver};
use super::memory::DeviceMemory;
use super::vmm;
use crate::error::{DeviceError, Result};

impl DeviceMemory {
    /// Lets device `ordinal` read this allocation, for a replica copy from it. VMM memory is
    /// mapped for its own device only until granted; legacy memory needs nothing here (the
    /// reading context enables peer access, [`enable_peer_access`]).
    pub fn grant_read(&self, ordinal: usize) -> Result<()> {
        let Some(vmm) = &self.vmm else {
            return Ok(());
        };
        let size = usize::try_from(vmm.size()).map_err(|_| DeviceError::Protocol {
            reason: "an allocation larger than the address space".into(),
        })?;
        let id = i32::try_from(ordinal).map_err(|_| DeviceError::NoSuchDevice {
            device: ordinal.to_string(),
            reason: "ordinal out of range".into(),
        })?;
        bind(&self.ctx)?;
        vmm::grant(
            self.ptr,
            size,
            id,
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
        )
    }

    /// Copies all of this allocation's `len` bytes from `src`, a device address of `src_ctx`
    /// holding at least as many (another device's arena), on `stream`, and waits for it.
    pub fn copy_from_peer(
        &self,
        src_ctx: &CudaContext,
        src: CUdeviceptr,
        len: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| DeviceError::Protocol {
            reason: "a copy larger than the address space".into(),
        })?;
        check("peer copy", 0, n, self.len)?;
        bind(&self.ctx)?;
        // SAFETY: the destination range `self.ptr..+n` lies in this live allocation (checked
        // above); the source is a live allocation of `src_ctx` of at least `n` bytes, which the
        // caller keeps alive (the server holds the source arena) until the stream is
        // synchronised below, before this returns.
        unsafe {
            sys::cuMemcpyPeerAsync(
                self.ptr,
                self.ctx.cu_ctx(),
                src,
                src_ctx.cu_ctx(),
                n,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(driver("cuMemcpyPeerAsync"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }
}

/// Lets `ctx` access `peer`'s memory directly (NVLink or PCIe peer-to-peer) where the devices
/// can; `false` where they cannot (copies are then staged by the driver). Enabling twice is
/// fine.
pub fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext) -> Result<bool> {
    let mut can: std::ffi::c_int = 0;
    // SAFETY: `can` is a valid out-parameter; both devices come from live contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) }
        .result()
        .map_err(driver("cuDeviceCanAccessPeer"))?;
    if can == 0 {
        return Ok(false);
    }
    bind(ctx)?;
    // SAFETY: `peer` is a live context of another device; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) } {
        sys::cudaError_enum::CUDA_SUCCESS
        | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        e => Err(DeviceError::Cuda {
            op: "cuCtxEnablePeerAccess",
            source: DriverError(e),
        }),
    }
}
