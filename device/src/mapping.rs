//! A worker's view of an attached arena, whatever the backend: [`Mapping`].
//!
//! [`Mapping::import`] turns an [`Import`] into a mapping by handing it to the module of its
//! kind (`host`: a sealed memfd mapped read-only; `cuda`: a legacy IPC handle opened in the
//! device's primary context). Everything else — the SDK's tensors, device views, checksums —
//! works on the neutral `Mapping`, so a new handle kind adds one module here and nothing else
//! changes shape. The mapping is closed when the last clone of it goes.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::backend::BackendKind;
use crate::error::{DeviceError, Result};
use crate::export::Import;

/// What each kind of mapping provides.
pub(crate) trait Mapped: Send + Sync + std::fmt::Debug {
    fn kind(&self) -> BackendKind;
    fn len(&self) -> u64;
    fn read_only(&self) -> bool;
    fn device_uuid(&self) -> &str;
    /// The bytes, where they are mapped into this process's address space.
    fn host_bytes(&self) -> Option<&[u8]>;
    /// The device address in this process, where the arena is in device memory.
    fn device_ptr(&self) -> Option<u64>;
    fn context(&self) -> Option<&Arc<CudaContext>>;
    fn wait_ready(&self, stream: &CudaStream) -> Result<()>;
    fn is_ready(&self) -> Result<bool>;
    /// Copies `dst.len()` bytes at `offset` to the host (after the load completed).
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()>;
}

/// An attached arena as a worker holds it: base address, length, whether it is read-only.
/// Cheap to clone; closed (unmapped) when the last clone goes.
#[derive(Debug, Clone)]
pub struct Mapping(Arc<dyn Mapped>);

impl Mapping {
    /// Maps what a worker received. Blocks (a CUDA import may create the device's context):
    /// call it from a blocking thread in async code.
    pub fn import(import: Import) -> Result<Self> {
        match import.kind {
            BackendKind::Host => crate::host::import(import),
            BackendKind::CudaIpc => crate::cuda::import(import),
        }
    }

    pub(crate) fn new(inner: Arc<dyn Mapped>) -> Self {
        Self(inner)
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
    /// write-sealed memfd). Legacy CUDA IPC mappings are writable: `false`.
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

    /// Whether the load has completed (a host-side check; prefer [`Mapping::wait_ready`]).
    pub fn is_ready(&self) -> Result<bool> {
        self.0.is_ready()
    }

    /// Copies `dst.len()` bytes at `offset` into `dst`, after waiting for the load.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        crate::backend::check_range("read", offset, dst.len(), self.len())?;
        self.0.read(offset, dst)
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

/// The one handle-bytes accessor the kinds share: element `i` of an import, of `len` bytes.
pub(crate) fn handle_bytes<const N: usize>(
    import: &Import,
    i: usize,
    what: &str,
) -> Result<[u8; N]> {
    let bytes = import
        .handles
        .get(i)
        .ok_or_else(|| DeviceError::BadHandle {
            reason: format!("{what} is missing"),
        })?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| DeviceError::BadHandle {
            reason: format!("{what} is {} bytes, not {N}", bytes.len()),
        })
}
