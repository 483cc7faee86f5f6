//! The worker side of the host backend: [`HostMapping`], a received descriptor checked and
//! mapped read-only, and the import of a host handle.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::backend::{BackendKind, Mapped, check_range};
use crate::error::{DeviceError, Result};
use crate::export::Import;
use crate::sys::SealedMapping;

/// Worker side: a read-only mapping of an arena received as a descriptor.
///
/// Send and Sync; unmapped on drop. It keeps the memory alive by itself (the server may drop
/// its arena meanwhile), and keeps the descriptor it was made from: that is what a restarted
/// server can adopt the memory by.
#[derive(Debug)]
pub struct HostMapping {
    mapping: SealedMapping,
    fd: OwnedFd,
}

impl HostMapping {
    /// Maps `fd` read-only after checking that it is `expected_len` bytes long and sealed
    /// against writes, shrinking and growing ([`DeviceError::BadHandle`] otherwise: unsealed, the
    /// bytes could change or the file shrink under the reader, a `SIGBUS`). Consumes `fd`.
    pub fn map(fd: OwnedFd, expected_len: u64) -> Result<HostMapping> {
        let mapping = SealedMapping::map(fd.as_fd(), expected_len)?;
        Ok(HostMapping { mapping, fd })
    }

    /// The arena's bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.mapping.as_slice()
    }

    /// The arena's length in bytes.
    pub fn len(&self) -> u64 {
        self.mapping.len() as u64
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.mapping.len() == 0
    }
}

impl Mapped for HostMapping {
    fn kind(&self) -> BackendKind {
        BackendKind::Host
    }
    fn len(&self) -> u64 {
        HostMapping::len(self)
    }
    fn read_only(&self) -> bool {
        true
    }
    fn device_uuid(&self) -> &str {
        "host"
    }
    fn host_bytes(&self) -> Option<&[u8]> {
        Some(self.as_slice())
    }
    fn device_ptr(&self) -> Option<u64> {
        None
    }
    fn context(&self) -> Option<&std::sync::Arc<cudarc::driver::CudaContext>> {
        None
    }
    fn wait_ready(&self, _stream: &cudarc::driver::CudaStream) -> Result<()> {
        Ok(())
    }
    fn wait_ready_foreign(&self, _stream: crate::ForeignStream) -> Result<()> {
        Ok(())
    }
    fn is_ready(&self) -> Result<bool> {
        Ok(true)
    }
    fn descriptor(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check_range("read", offset, dst.len(), HostMapping::len(self))?;
        let start = offset as usize;
        dst.copy_from_slice(&self.as_slice()[start..start + dst.len()]);
        Ok(())
    }
}

/// Maps a received host handle: the descriptor, checked and mapped read-only.
pub(crate) fn import(import: Import) -> Result<std::sync::Arc<dyn Mapped>> {
    let fd = import.fd.ok_or_else(|| DeviceError::BadHandle {
        reason: "a host arena handle carries a descriptor, and none came".into(),
    })?;
    Ok(std::sync::Arc::new(HostMapping::map(fd, import.len)?))
}
