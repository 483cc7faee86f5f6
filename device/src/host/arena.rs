//! [`HostArena`]: one sealable memfd, written with `pwrite`, sealed, exported as a `dup` of its
//! descriptor, and the source or target of a replica copy.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::SealFlags;
use rustix::io::Errno;

use super::memfd::{copy_by_pread, create_memfd, memfd_name, pwrite_all};
use crate::backend::{ArenaReader, ArenaWriter, BufferedReader, BufferedWriter, check_range};
use crate::error::{DeviceError, Result};
use crate::export::Export;
use crate::sys::SealedMapping;
use crate::thread::{Arena, ArenaHandle};

/// An arena of shared host memory: one sealable memfd.
#[derive(Debug)]
pub struct HostArena {
    pub(super) fd: OwnedFd,
    len: u64,
    sealed: AtomicBool,
    /// The device it stands for (`"host"` unless host memory stands in for several).
    device_uuid: String,
}

impl HostArena {
    /// Creates a zero-filled memfd of `len` bytes named after `label`, sealed against shrinking
    /// and growing, still writable.
    ///
    /// Out of memory, space or descriptors is [`DeviceError::AllocationFailed`]. On tmpfs the
    /// size is reserved lazily: pages are taken as they are written.
    pub fn new(len: u64, label: &str) -> Result<Self> {
        let name = memfd_name(label);
        let fd = create_memfd(&name, len)?;
        rustix::fs::ftruncate(&fd, len).map_err(|e| match e {
            Errno::INVAL | Errno::FBIG | Errno::NOSPC | Errno::NOMEM => {
                DeviceError::AllocationFailed {
                    bytes: len,
                    reason: format!("ftruncate of memfd '{name}': {e}"),
                }
            }
            e => DeviceError::io("ftruncate of the arena's memfd", e),
        })?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW)
            .map_err(|e| DeviceError::io("sealing the arena's size (F_ADD_SEALS)", e))?;
        tracing::debug!(len, label, "allocated host arena");
        Ok(HostArena {
            fd,
            len,
            sealed: AtomicBool::new(false),
            device_uuid: "host".into(),
        })
    }

    /// The arena a worker kept alive across a server restart, from its descriptor: checked,
    /// as a worker checks one, to be a memory file of `len` bytes sealed against writes,
    /// shrinking and growing ([`DeviceError::BadHandle`] otherwise).
    pub fn adopt(fd: OwnedFd, len: u64) -> Result<Self> {
        // Mapping checks the seals and the size; the mapping itself is not kept.
        drop(SealedMapping::map(fd.as_fd(), len)?);
        Ok(HostArena {
            fd,
            len,
            sealed: AtomicBool::new(true),
            device_uuid: "host".into(),
        })
    }

    /// The same arena, as one of the device `uuid`'s (host memory standing in for several).
    pub fn on_device(mut self, uuid: &str) -> Self {
        uuid.clone_into(&mut self.device_uuid);
        self
    }

    /// Whether [`seal`](Arena::seal) has completed.
    pub fn is_sealed(&self) -> bool {
        self.sealed.load(Ordering::Acquire)
    }
}

impl HostArena {
    /// A new descriptor of the memfd. Out of descriptors is an [`DeviceError::Io`] that
    /// [`DeviceError::is_resource_exhausted`] recognizes (nothing is allocated here).
    pub(super) fn dup(&self) -> Result<OwnedFd> {
        self.fd
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| DeviceError::Io {
                op: "duplicating the arena's memfd descriptor",
                source,
            })
    }
}

impl Arena for HostArena {
    fn len(&self) -> u64 {
        self.len
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        check_range("write", offset, bytes.len(), self.len)?;
        if self.is_sealed() {
            return Err(DeviceError::Sealed);
        }
        pwrite_all(&self.fd, offset, bytes, self.len)
    }

    fn seal(&self) -> Result<()> {
        if self.is_sealed() {
            return Ok(());
        }
        match rustix::fs::fcntl_add_seals(&self.fd, SealFlags::WRITE | SealFlags::SEAL) {
            Ok(()) => {}
            // F_SEAL_SEAL already set: another thread sealed it first, if WRITE is there.
            Err(Errno::PERM)
                if rustix::fs::fcntl_get_seals(&self.fd)
                    .is_ok_and(|s| s.contains(SealFlags::WRITE)) => {}
            Err(e) => return Err(DeviceError::io("sealing the arena (F_SEAL_WRITE)", e)),
        }
        self.sealed.store(true, Ordering::Release);
        Ok(())
    }

    fn export(&self) -> Result<Export> {
        if !self.is_sealed() {
            return Err(DeviceError::NotSealed);
        }
        Ok(Export {
            device_uuid: self.device_uuid.clone(),
            handles: crate::export::Handles::Host,
            fd: Some(self.dup()?),
            alloc_len: 0,
        })
    }

    /// Loading threads write with `pwrite` on their own descriptor of the memfd: plain file
    /// writes, nothing for the device thread to do. Once the arena is sealed they fail.
    fn writer(&self, _this: &ArenaHandle) -> Result<Box<dyn ArenaWriter + Send>> {
        let (fd, len) = (self.dup()?, self.len);
        Ok(Box::new(BufferedWriter::new(
            move |offset, bytes: &[u8]| {
                check_range("write", offset, bytes.len(), len)?;
                pwrite_all(&fd, offset, bytes, len)
            },
        )))
    }

    /// `pread` on the caller's thread, from a descriptor of its own: no device work.
    fn reader(&self, _this: &ArenaHandle) -> Result<Box<dyn ArenaReader + Send>> {
        let (fd, len) = (self.dup()?, self.len);
        Ok(Box::new(BufferedReader::new(
            move |offset, buf: &mut [u8]| pread_all(&fd, offset, buf, len),
        )))
    }

    fn peer_source(&self, _to: Option<usize>) -> Result<crate::PeerSource> {
        if !self.is_sealed() {
            return Err(DeviceError::NotSealed);
        }
        Ok(crate::PeerSource::Host {
            fd: self.dup()?,
            len: self.len,
        })
    }

    /// Copies in the kernel (`copy_file_range` between the two memfds), falling back to
    /// `pread`/`pwrite` where the kernel refuses.
    fn copy_from(&self, source: &crate::PeerSource) -> Result<()> {
        let crate::PeerSource::Host { fd, len } = source else {
            return Err(DeviceError::Unsupported {
                what: "a host arena copied from device memory".into(),
            });
        };
        if self.is_sealed() {
            return Err(DeviceError::Sealed);
        }
        check_range(
            "write",
            0,
            usize::try_from(*len).unwrap_or(usize::MAX),
            self.len,
        )?;
        let mut done = 0u64;
        while done < *len {
            let want = usize::try_from(*len - done)
                .unwrap_or(usize::MAX)
                .min(1 << 30);
            let (mut off_in, mut off_out) = (done, done);
            match rustix::fs::copy_file_range(
                fd,
                Some(&mut off_in),
                &self.fd,
                Some(&mut off_out),
                want,
            ) {
                Ok(0) => return Err(DeviceError::io("copy_file_range between arenas", Errno::IO)),
                Ok(n) => done += n as u64,
                Err(Errno::INTR) => {}
                Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                    return copy_by_pread(fd, &self.fd, done, *len, self.len);
                }
                Err(e @ (Errno::NOSPC | Errno::NOMEM)) => {
                    return Err(DeviceError::AllocationFailed {
                        bytes: self.len,
                        reason: format!("copy_file_range into a replica: {e}"),
                    });
                }
                Err(e) => return Err(DeviceError::io("copy_file_range between arenas", e)),
            }
        }
        Ok(())
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        pread_all(&self.fd, offset, buf, self.len)
    }
}

/// Fills `buf` from `fd` (an arena of `len` bytes) at `offset`.
fn pread_all(fd: &OwnedFd, offset: u64, buf: &mut [u8], len: u64) -> Result<()> {
    check_range("read", offset, buf.len(), len)?;
    let mut done = 0;
    while done < buf.len() {
        match rustix::io::pread(fd, &mut buf[done..], offset + done as u64) {
            Ok(0) => return Err(DeviceError::io("pread from the arena", Errno::IO)),
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(DeviceError::io("pread from the arena", e)),
        }
    }
    Ok(())
}
