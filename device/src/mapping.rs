//! A worker's view of an attached arena, whatever the backend: [`Mapping`].
//!
//! [`Mapping::import`] turns an [`Import`] into a mapping by handing it to the module of its
//! kind (`host`: a sealed memfd mapped read-only; `cuda`: a legacy IPC handle opened in the
//! device's primary context). Everything else — the SDK's tensors, device views, checksums —
//! works on the neutral `Mapping`, so a new handle kind adds one module here and nothing else
//! changes shape. The mapping is closed when the last clone of it goes.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::backend::{BackendKind, Mapped};
use crate::error::Result;
use crate::export::Import;
use crate::reservation::Reservation;

/// An attached arena as a worker holds it: base address, length, whether it is read-only.
/// Cheap to clone; closed (unmapped) when the last clone goes.
#[derive(Debug, Clone)]
pub struct Mapping(Arc<dyn Mapped>);

impl Mapping {
    /// Maps what a worker received. Blocks (a CUDA import may create the device's context):
    /// call it from a blocking thread in async code.
    pub fn import(import: Import) -> Result<Self> {
        Self::import_reserved(import, None)
    }

    /// As [`Mapping::import`], at `reserved` when address space was set aside for the arena
    /// ([`Mapping::reserve`], made for this handle's kind, device and size).
    pub fn import_reserved(import: Import, reserved: Option<Reservation>) -> Result<Self> {
        match import.kind() {
            BackendKind::Host => crate::host::import(import).map(Self),
            BackendKind::CudaIpc => crate::cuda::import(import).map(Self),
            BackendKind::CudaVmm => {
                crate::cuda::import_vmm(import, reserved.map(|r| r.0)).map(Self)
            }
        }
    }

    /// Reserves the address space an arena shared with handles of `kind` (`alloc_len` bytes on
    /// the device `device_uuid`) will be mapped at, before its handle is received: `None` for
    /// kinds whose address is the driver's choice at import (host memory, legacy CUDA IPC).
    /// Blocks (the device's context may be made): call it from a blocking thread in async code.
    pub fn reserve(
        kind: BackendKind,
        device_uuid: &str,
        alloc_len: u64,
    ) -> Result<Option<Reservation>> {
        match kind {
            BackendKind::CudaVmm => {
                crate::cuda::reserve_vmm(device_uuid, alloc_len).map(|r| Some(Reservation(r)))
            }
            BackendKind::Host | BackendKind::CudaIpc => Ok(None),
        }
    }

    /// The kind of handle it was imported from.
    pub fn kind(&self) -> BackendKind {
        self.0.kind()
    }

    /// The arena's length in bytes.
    pub fn len(&self) -> u64 {
        self.0.len()
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether writes through the mapping are impossible (host: a `PROT_READ` mapping of a
    /// write-sealed memfd; CUDA VMM: mapped with read-only access). Legacy CUDA IPC mappings
    /// are writable: `false`.
    pub fn read_only(&self) -> bool {
        self.0.read_only()
    }

    /// The device the arena lives on (`"host"` for host memory).
    pub fn device_uuid(&self) -> &str {
        self.0.device_uuid()
    }

    /// The arena's bytes, where they are mapped into this process (host memory).
    pub fn host_bytes(&self) -> Option<&[u8]> {
        self.0.host_bytes()
    }

    /// The arena's device address in this process (device memory).
    pub fn device_ptr(&self) -> Option<u64> {
        self.0.device_ptr()
    }

    /// Whether the arena is in device memory.
    pub fn is_on_device(&self) -> bool {
        self.0.device_ptr().is_some()
    }

    /// The CUDA context the arena is mapped in (device memory only).
    pub fn context(&self) -> Option<&Arc<CudaContext>> {
        self.0.context()
    }

    /// Makes `stream` wait, on the device, until the arena is fully loaded; kernels enqueued
    /// on `stream` afterwards see every byte. A no-op for host memory (only loaded arenas are
    /// exported there).
    pub fn wait_ready(&self, stream: &CudaStream) -> Result<()> {
        self.0.wait_ready(stream)
    }

    /// Makes another library's `stream` (a DLPack consumer's) wait, on the device, until the
    /// arena is fully loaded. A no-op for host memory.
    pub fn wait_ready_foreign(&self, stream: crate::ForeignStream) -> Result<()> {
        self.0.wait_ready_foreign(stream)
    }

    /// Whether the load has completed (a host-side check; prefer [`Mapping::wait_ready`]).
    pub fn is_ready(&self) -> Result<bool> {
        self.0.is_ready()
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`, after waiting for the load.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        crate::backend::check_range("read", offset, dst.len(), self.len())?;
        self.0.read(offset, dst)
    }

    /// The size of the allocation behind the mapping (CUDA VMM: rounded up to the device's
    /// granularity; otherwise the arena's length).
    pub fn allocation_len(&self) -> u64 {
        self.0.allocation_len()
    }

    /// The descriptor the arena came as (host, CUDA VMM), kept while the mapping lives; offered
    /// back to a restarted server so that it adopts the memory instead of loading it again.
    pub fn descriptor(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.0.descriptor()
    }

    /// Bytes `[offset, offset + len)` of a host mapping, or `None` if out of range or in device
    /// memory.
    pub fn host_range(&self, offset: u64, len: u64) -> Option<&[u8]> {
        let all = self.0.host_bytes()?;
        let start = usize::try_from(offset).ok()?;
        let end = start.checked_add(usize::try_from(len).ok()?)?;
        all.get(start..end)
    }
}
