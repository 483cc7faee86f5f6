//! The worker side of VMM arenas: the allocation's descriptor (received over the handle
//! socket) imported with `cuMemImportFromShareableHandle` and mapped **read-only**; the ready
//! event opened from its IPC handle, as for legacy arenas.
//!
//! A write through the mapping fails: a copy or memset into it returns
//! `CUDA_ERROR_INVALID_VALUE`, and a kernel that stores into it faults with
//! `CUDA_ERROR_ILLEGAL_ADDRESS` in the writing process only (its context is lost; the server's
//! and other workers' are not). The descriptor is kept with the mapping: the memory stays
//! valid after the server exits, and the descriptor is what could hand it back to a restarted
//! server.
//!
//! What read-only does *not* stop: a process holding the descriptor may import it again on its
//! own and ask for read-write access; the driver grants it (see `docs/ARCHITECTURE.md`, "VMM
//! handles"). It stops accidental writes by any worker that maps through this SDK or follows
//! the protocol, not deliberate ones by code that calls the driver itself.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use super::sys::{self, IPC_HANDLE_BYTES};
use crate::backend::{BackendKind, Mapped};
use crate::error::{DeviceError, Result};
use crate::export::{Handles, Import, key};

/// A worker's read-only view of a VMM arena.
#[derive(Debug)]
pub struct VmmMapping {
    ctx: Arc<CudaContext>,
    mem: sys::VmmImport,
    ready: sys::Event,
    len: u64,
    device_uuid: String,
    /// The allocation's descriptor, kept while the mapping lives.
    fd: OwnedFd,
}

impl VmmMapping {
    /// Maps the allocation `fd` names (`alloc_len` bytes, holding an arena of `len`) read-only
    /// on the device `device_uuid`, with its ready event `event`: at `range` when one was
    /// reserved for it ([`reserve`]), else at a range of its own.
    pub fn open(
        fd: OwnedFd,
        alloc_len: u64,
        event: &[u8; IPC_HANDLE_BYTES],
        device_uuid: &str,
        len: u64,
        range: Option<Arc<sys::AddressRange>>,
    ) -> Result<Self> {
        if alloc_len < len {
            return Err(DeviceError::BadHandle {
                reason: format!(
                    "the allocation ({alloc_len} bytes) is smaller than the arena ({len} bytes)"
                ),
            });
        }
        let (ctx, mem) = match range {
            Some(range) => {
                let ctx = range.context().clone();
                (ctx, sys::VmmImport::open_in(range, fd.as_fd(), alloc_len)?)
            }
            None => {
                let ctx = super::context::primary(super::ordinal_of(device_uuid)?)?;
                let mem = sys::VmmImport::open(&ctx, fd.as_fd(), alloc_len)?;
                (ctx, mem)
            }
        };
        let ready = sys::Event::open_ipc(&ctx, event)?;
        Ok(Self {
            ctx,
            mem,
            ready,
            len,
            device_uuid: device_uuid.to_owned(),
            fd,
        })
    }
}

impl Mapped for VmmMapping {
    fn kind(&self) -> BackendKind {
        BackendKind::CudaVmm
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn read_only(&self) -> bool {
        true
    }
    fn device_uuid(&self) -> &str {
        &self.device_uuid
    }
    fn host_bytes(&self) -> Option<&[u8]> {
        None
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.mem.ptr())
    }
    fn context(&self) -> Option<&Arc<CudaContext>> {
        Some(&self.ctx)
    }
    fn wait_ready(&self, stream: &CudaStream) -> Result<()> {
        self.ready.wait_on(stream)
    }
    fn wait_ready_foreign(&self, stream: crate::ForeignStream) -> Result<()> {
        self.ready.wait_on_foreign(stream)
    }
    fn is_ready(&self) -> Result<bool> {
        self.ready.is_done()
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.ready.synchronize()?;
        self.mem.read(offset, dst, self.len)
    }
    fn allocation_len(&self) -> u64 {
        self.mem.size()
    }
    fn descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }
}

/// Maps a received VMM arena: handles `[ready event]` (64 bytes), the descriptor, and the
/// allocation's size.
pub(crate) fn import(
    import: Import,
    reserved: Option<Arc<sys::AddressRange>>,
) -> Result<Arc<dyn Mapped>> {
    let Handles::CudaVmm { event } = &import.handles else {
        return Err(DeviceError::BadHandle {
            reason: "not a CUDA VMM handle".into(),
        });
    };
    let event: [u8; IPC_HANDLE_BYTES] = key(event, "the event handle")?;
    let fd = import.fd.ok_or_else(|| DeviceError::BadHandle {
        reason: "a CUDA VMM handle carries a descriptor, and none came".into(),
    })?;
    Ok(Arc::new(VmmMapping::open(
        fd,
        import.alloc_len,
        &event,
        &import.device_uuid,
        import.len,
        reserved,
    )?))
}

/// Address space on the device `device_uuid` for a VMM allocation of `alloc_len` bytes not yet
/// received (its primary context made current first, as the import would).
pub(crate) fn reserve(device_uuid: &str, alloc_len: u64) -> Result<Arc<sys::AddressRange>> {
    let ctx = super::context::primary(super::ordinal_of(device_uuid)?)?;
    Ok(Arc::new(sys::AddressRange::reserve(&ctx, alloc_len)?))
}
