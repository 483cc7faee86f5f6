//! The host backend: arenas of shared host memory, one `memfd` each.
//!
//! Server side, a [`HostArena`] is a memfd created with `MFD_ALLOW_SEALING`, sized with
//! `ftruncate` and at once sealed against shrinking and growing. It is written with `pwrite`
//! (never through a writable mapping, which would make `F_SEAL_WRITE` impossible to add), then
//! [`seal`](Arena::seal)ed with `F_SEAL_WRITE | F_SEAL_SEAL`, then exported as a `dup` of its
//! descriptor. Worker side, a [`HostMapping`] checks the received descriptor's seals and size
//! and maps it read-only. The kernel frees the memory once the arena, every exported
//! descriptor and every mapping are gone.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;

use crate::backend::{ArenaWriter, BackendKind, BufferedWriter, DeviceInfo, Mapped, check_range};
use crate::error::{DeviceError, Result};
use crate::export::{Export, Import};
use crate::host_memory::HostMemory;
use crate::sys::SealedMapping;
use crate::thread::{Arena, ArenaHandle, Backend, DeviceThread};

/// The longest memfd name Linux accepts (249 bytes, without the NUL).
const MEMFD_NAME_MAX: usize = 249;

/// Shared host memory as a backend. Cheap to create; holds nothing but its description.
#[derive(Debug, Clone)]
pub struct HostBackend {
    info: DeviceInfo,
    memory: HostMemory,
}

impl HostBackend {
    /// A host backend; its total is `MemTotal` from `/proc/meminfo`, bounded by this process's
    /// cgroup memory limit (0 where unreadable), and its free memory `MemAvailable` bounded by
    /// the cgroup's room (see [`crate::host_memory`]).
    pub fn new() -> Self {
        Self::reading(HostMemory::default())
    }

    /// A host backend whose memory figures are read from `memory` (a fake `/proc` and cgroup
    /// tree in tests).
    pub fn reading(memory: HostMemory) -> Self {
        HostBackend {
            info: DeviceInfo {
                backend: BackendKind::Host,
                uuid: "host".into(),
                name: "host memory".into(),
                total_bytes: memory.total().unwrap_or(0),
                numa_node: None,
            },
            memory,
        }
    }
}

impl HostBackend {
    /// Host memory standing in for one of several devices, under its own `uuid` (placement
    /// and replicas run without a GPU). `"host"` is [`HostBackend::new`]'s.
    pub fn named(uuid: &str) -> Self {
        Self::named_reading(uuid, HostMemory::default())
    }

    /// [`HostBackend::named`], its memory figures read from `memory`.
    pub fn named_reading(uuid: &str, memory: HostMemory) -> Self {
        let mut backend = HostBackend::reading(memory);
        if uuid != backend.info.uuid {
            backend.info.name = format!("host memory ({uuid})");
            backend.info.uuid = uuid.to_owned();
        }
        backend
    }

    /// A device thread serving host memory (the same seam as a GPU's, so that everything
    /// above it is tested without one).
    pub fn thread() -> Result<DeviceThread> {
        Self::thread_named("host")
    }

    /// A device thread serving host memory as the device `uuid` (see [`HostBackend::named`]).
    pub fn thread_named(uuid: &str) -> Result<DeviceThread> {
        Self::thread_reading(uuid, HostMemory::default())
    }

    /// [`HostBackend::thread_named`], its memory figures read from `memory`.
    pub fn thread_reading(uuid: &str, memory: HostMemory) -> Result<DeviceThread> {
        let uuid = uuid.to_owned();
        DeviceThread::start(&format!("{uuid}-mem"), move || {
            Ok(Box::new(HostBackend::named_reading(&uuid, memory)) as Box<dyn Backend>)
        })
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for HostBackend {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn allocate(&mut self, len: u64, label: &str) -> Result<Box<dyn Arena>> {
        Ok(Box::new(
            HostArena::new(len, label)?.on_device(&self.info.uuid),
        ))
    }

    fn used_bytes(&mut self) -> Option<u64> {
        None
    }

    fn free_bytes(&mut self) -> Option<u64> {
        self.memory.available()
    }

    fn adopt(&mut self, fd: OwnedFd, _alloc_len: u64, len: u64) -> Result<Box<dyn Arena>> {
        Ok(Box::new(
            HostArena::adopt(fd, len)?.on_device(&self.info.uuid),
        ))
    }
}

/// An arena of shared host memory: one sealable memfd.
#[derive(Debug)]
pub struct HostArena {
    fd: OwnedFd,
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
    fn dup(&self) -> Result<OwnedFd> {
        self.fd
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| DeviceError::Io {
                op: "duplicating the arena's memfd descriptor",
                source,
            })
    }
}

/// `pwrite` of all of `bytes` at `offset` of an arena of `len` bytes.
fn pwrite_all(fd: &OwnedFd, offset: u64, bytes: &[u8], len: u64) -> Result<()> {
    let mut done = 0;
    while done < bytes.len() {
        match rustix::io::pwrite(fd, &bytes[done..], offset + done as u64) {
            Ok(0) => {
                return Err(DeviceError::io("pwrite to the arena", Errno::IO));
            }
            Ok(n) => done += n,
            Err(Errno::INTR) => {}
            // A seal raced with this write.
            Err(Errno::PERM) => return Err(DeviceError::Sealed),
            Err(e @ (Errno::NOSPC | Errno::NOMEM | Errno::FBIG)) => {
                return Err(DeviceError::AllocationFailed {
                    bytes: len,
                    reason: format!("pwrite of {} bytes at offset {offset}: {e}", bytes.len()),
                });
            }
            Err(e) => return Err(DeviceError::io("pwrite to the arena", e)),
        }
    }
    Ok(())
}

/// Copies bytes `from..len` of `src` to the same offsets of `dst` (an arena of `dst_len`
/// bytes) through a buffer.
fn copy_by_pread(src: &OwnedFd, dst: &OwnedFd, from: u64, len: u64, dst_len: u64) -> Result<()> {
    let mut buf = vec![0u8; crate::backend::BUFFERED_BYTES];
    let mut at = from;
    while at < len {
        let n = usize::try_from(len - at)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let mut got = 0;
        while got < n {
            match rustix::io::pread(src, &mut buf[got..n], at + got as u64) {
                Ok(0) => return Err(DeviceError::io("pread from the source arena", Errno::IO)),
                Ok(k) => got += k,
                Err(Errno::INTR) => {}
                Err(e) => return Err(DeviceError::io("pread from the source arena", e)),
            }
        }
        pwrite_all(dst, at, &buf[..n], dst_len)?;
        at += n as u64;
    }
    Ok(())
}

/// `modelshare:<label>`, cut to the kernel's limit at a character boundary, without NULs.
fn memfd_name(label: &str) -> String {
    let mut name = String::with_capacity(MEMFD_NAME_MAX);
    for c in "modelshare:".chars().chain(label.chars()) {
        let c = if c == '\0' { '_' } else { c };
        if name.len() + c.len_utf8() > MEMFD_NAME_MAX {
            break;
        }
        name.push(c);
    }
    name
}

/// `memfd_create`, with `MFD_NOEXEC_SEAL` where the kernel knows it (6.3+), else without.
fn create_memfd(name: &str, len: u64) -> Result<OwnedFd> {
    let base = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
    let created = match rustix::fs::memfd_create(name, base | MemfdFlags::NOEXEC_SEAL) {
        Err(Errno::INVAL) => rustix::fs::memfd_create(name, base),
        other => other,
    };
    created.map_err(|e| match e {
        Errno::NOMEM | Errno::NOSPC | Errno::MFILE | Errno::NFILE => {
            DeviceError::AllocationFailed {
                bytes: len,
                reason: format!("memfd_create '{name}': {e}"),
            }
        }
        e => DeviceError::io("memfd_create for an arena", e),
    })
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
        check_range("read", offset, buf.len(), self.len)?;
        let mut done = 0;
        while done < buf.len() {
            match rustix::io::pread(&self.fd, &mut buf[done..], offset + done as u64) {
                Ok(0) => return Err(DeviceError::io("pread from the arena", Errno::IO)),
                Ok(n) => done += n,
                Err(Errno::INTR) => {}
                Err(e) => return Err(DeviceError::io("pread from the arena", e)),
            }
        }
        Ok(())
    }
}

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

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use rustix::fs::{MemfdFlags, SealFlags};
    use rustix::io::Errno;

    use super::*;
    use crate::test_util::random_bytes;

    fn exported_fd(arena: &dyn Arena) -> OwnedFd {
        let export = arena.export().unwrap();
        assert_eq!(export.kind(), BackendKind::Host);
        export.fd.expect("a host export carries a descriptor")
    }

    /// A descriptor of an unsealed memory file is no longer refused for adoption (its bytes
    /// could change under the server), or one of the wrong size is accepted.
    #[test]
    fn adoption_takes_only_sealed_files_of_the_right_size() {
        let arena = HostArena::new(4096, "adopt").unwrap();
        let unsealed = arena.dup().unwrap();
        assert!(matches!(
            HostArena::adopt(unsealed, 4096),
            Err(DeviceError::BadHandle { .. })
        ));
        arena.seal().unwrap();
        assert!(matches!(
            HostArena::adopt(arena.dup().unwrap(), 8192),
            Err(DeviceError::BadHandle { .. })
        ));
        let adopted = HostArena::adopt(arena.dup().unwrap(), 4096).unwrap();
        assert!(adopted.is_sealed());
        assert!(adopted.export().unwrap().fd.is_some());
    }

    /// Several MiB written from several threads, sealed, exported and mapped come back intact.
    #[test]
    fn write_seal_export_map_round_trips() {
        let mut backend: Box<dyn Backend> = Box::new(HostBackend::new());
        let data = random_bytes(5 * 1024 * 1024 + 123, 7);
        let arena = backend.allocate(data.len() as u64, "round-trip@1").unwrap();
        assert_eq!(arena.len(), data.len() as u64);
        let chunk = 1024 * 1024 + 17;
        std::thread::scope(|s| {
            for (i, part) in data.chunks(chunk).enumerate() {
                let arena = &arena;
                s.spawn(move || arena.write_at((i * chunk) as u64, part).unwrap());
            }
        });
        arena.seal().unwrap();
        let mut back = vec![0; data.len()];
        arena.read_at(0, &mut back).unwrap();
        assert!(back == data, "read_at differs from what was written");
        let mapping = HostMapping::map(exported_fd(&*arena), data.len() as u64).unwrap();
        assert_eq!(mapping.len(), data.len() as u64);
        assert!(
            mapping.as_slice() == data,
            "mapping differs from what was written"
        );
    }

    /// A new arena reads as zeros where nothing was written.
    #[test]
    fn new_arena_is_zero_filled() {
        let arena = HostArena::new(10_000, "zeros").unwrap();
        arena.write_at(100, &[1, 2, 3]).unwrap();
        let mut buf = vec![0xff; 10_000];
        arena.read_at(0, &mut buf).unwrap();
        assert!(buf[..100].iter().all(|&b| b == 0));
        assert_eq!(&buf[100..103], &[1, 2, 3]);
        assert!(buf[103..].iter().all(|&b| b == 0));
    }

    /// Writes after seal are refused, and sealing twice is harmless.
    #[test]
    fn write_after_seal_is_refused() {
        let arena = HostArena::new(4096, "sealed").unwrap();
        arena.write_at(0, b"before").unwrap();
        arena.seal().unwrap();
        arena.seal().unwrap();
        assert!(arena.is_sealed());
        assert!(matches!(
            arena.write_at(0, b"after"),
            Err(DeviceError::Sealed)
        ));
        let mut buf = [0; 6];
        arena.read_at(0, &mut buf).unwrap();
        assert_eq!(&buf, b"before");
    }

    /// Reads and writes past the end (or whose end overflows u64) are refused with the numbers.
    #[test]
    fn out_of_range_access_is_refused() {
        let arena = HostArena::new(2048, "range").unwrap();
        let err = arena.write_at(100, &[0; 4096]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "write of 4096 bytes at offset 100 runs past the arena's 2048 bytes"
        );
        assert!(matches!(
            arena.write_at(u64::MAX, &[1]),
            Err(DeviceError::OutOfRange { .. })
        ));
        assert!(matches!(
            arena.write_at(2049, &[]),
            Err(DeviceError::OutOfRange { .. })
        ));
        arena.write_at(2048, &[]).unwrap();
        arena.write_at(2047, &[9]).unwrap();
        let mut buf = [0; 2];
        assert!(matches!(
            arena.read_at(2047, &mut buf),
            Err(DeviceError::OutOfRange { op: "read", .. })
        ));
    }

    /// A zero-length arena allocates, seals, exports and maps to an empty slice.
    #[test]
    fn zero_length_arena_works_end_to_end() {
        let arena = HostBackend::new().allocate(0, "empty").unwrap();
        assert!(arena.is_empty());
        arena.write_at(0, &[]).unwrap();
        arena.read_at(0, &mut []).unwrap();
        arena.seal().unwrap();
        let mapping = HostMapping::map(exported_fd(&*arena), 0).unwrap();
        assert!(mapping.is_empty());
        assert_eq!(mapping.as_slice(), &[] as &[u8]);
    }

    /// Exporting a still-writable arena is refused, so no worker gets a writable descriptor.
    #[test]
    fn export_before_seal_is_refused() {
        let arena = HostArena::new(64, "unsealed").unwrap();
        assert!(matches!(arena.export(), Err(DeviceError::NotSealed)));
    }

    /// Mapping a descriptor whose bytes could change or whose size is wrong is refused.
    #[test]
    fn map_refuses_unsealed_or_wrong_size() {
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        // Sealable but no seals yet.
        let fd = rustix::fs::memfd_create("unsealed", flags).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        let err = HostMapping::map(fd, 4096).unwrap_err();
        assert!(
            matches!(&err, DeviceError::BadHandle { reason } if reason.contains("seal")),
            "{err}"
        );
        // Size sealed, writes not.
        let fd = rustix::fs::memfd_create("half-sealed", flags).unwrap();
        rustix::fs::ftruncate(&fd, 4096).unwrap();
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW).unwrap();
        assert!(matches!(
            HostMapping::map(fd, 4096),
            Err(DeviceError::BadHandle { .. })
        ));
        // Not sealable at all.
        let fd = rustix::fs::memfd_create("no-sealing", MemfdFlags::CLOEXEC).unwrap();
        assert!(matches!(
            HostMapping::map(fd, 0),
            Err(DeviceError::BadHandle { .. })
        ));
        // Not a memory file.
        let (pipe, _w) = std::io::pipe().unwrap();
        assert!(matches!(
            HostMapping::map(pipe.into(), 0),
            Err(DeviceError::BadHandle { .. })
        ));
        // Fully sealed, wrong size.
        let arena = HostArena::new(4096, "size").unwrap();
        arena.seal().unwrap();
        let err = HostMapping::map(exported_fd(&arena), 8192).unwrap_err();
        assert_eq!(
            err.to_string(),
            "bad memory handle: the memory file has 4096 bytes, expected 8192"
        );
    }

    /// After seal, the exported descriptor can neither write, resize nor map writable.
    #[test]
    fn exported_fd_cannot_modify_after_seal() {
        let arena = HostArena::new(4096, "readonly").unwrap();
        arena.write_at(0, &[7; 4096]).unwrap();
        arena.seal().unwrap();
        let fd = exported_fd(&arena);
        assert_eq!(rustix::io::pwrite(&fd, b"x", 0), Err(Errno::PERM));
        assert_eq!(rustix::fs::ftruncate(&fd, 0), Err(Errno::PERM));
        assert_eq!(rustix::fs::ftruncate(&fd, 8192), Err(Errno::PERM));
        assert_eq!(
            rustix::fs::fcntl_add_seals(&fd, SealFlags::FUTURE_WRITE),
            Err(Errno::PERM)
        );
        let mut buf = [0; 1];
        arena.read_at(0, &mut buf).unwrap();
        assert_eq!(buf, [7]);
    }

    /// A worker's mapping stays readable after the server drops the arena and the descriptor.
    #[test]
    fn mapping_outlives_arena() {
        let data = random_bytes(3 * 4096 + 5, 11);
        let arena = HostArena::new(data.len() as u64, "outlive").unwrap();
        arena.write_at(0, &data).unwrap();
        arena.seal().unwrap();
        let fd = exported_fd(&arena);
        drop(arena);
        let mapping = HostMapping::map(fd, data.len() as u64).unwrap();
        let mapping = std::thread::spawn(move || mapping).join().unwrap();
        assert!(mapping.as_slice() == data);
    }

    /// An impossible size is a resource error the server can answer RESOURCE_EXHAUSTED with.
    #[test]
    fn impossible_size_is_allocation_failed() {
        let err = HostArena::new(u64::MAX, "huge").unwrap_err();
        assert!(
            matches!(
                err,
                DeviceError::AllocationFailed {
                    bytes: u64::MAX,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.is_resource_exhausted());
        assert!(!DeviceError::Sealed.is_resource_exhausted());
    }

    /// The memfd's name carries the label, within the kernel's limit, whatever the label.
    #[test]
    fn memfd_names_are_bounded() {
        assert_eq!(memfd_name("llama-7b@3"), "modelshare:llama-7b@3");
        let long = "é".repeat(300);
        let name = memfd_name(&long);
        assert!(name.len() <= MEMFD_NAME_MAX && name.len() >= MEMFD_NAME_MAX - 1);
        assert_eq!(memfd_name("a\0b"), "modelshare:a_b");
        let arena = HostArena::new(1, &format!("{long}\0")).unwrap();
        assert!(arena.fd.as_fd().try_clone_to_owned().is_ok());
    }

    /// The host backend describes itself as host memory with the machine's total.
    #[test]
    fn host_info() {
        let mut backend = HostBackend::new();
        let info = backend.info();
        assert_eq!(info.backend, BackendKind::Host);
        assert_eq!(info.uuid, "host");
        assert_eq!(info.name, "host memory");
        assert!(info.total_bytes > 0, "MemTotal not read from /proc/meminfo");
        assert_eq!(backend.used_bytes(), None);
    }

    /// Mappings and arenas can be shared between threads.
    #[test]
    fn types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<HostMapping>();
        check::<HostArena>();
        check::<HostBackend>();
        check::<Box<dyn Arena>>();
    }

    /// A replica copy between two host "devices" moves every byte, only out of a sealed
    /// arena, only into an unsealed one of the same length.
    #[test]
    fn replica_copies_between_devices() {
        let a = HostBackend::thread_named("host").unwrap();
        let b = HostBackend::thread_named("host-1").unwrap();
        assert_eq!(b.uuid(), "host-1");
        let data = random_bytes(9 * 1024 * 1024 + 77, 11);
        let src = a.allocate(data.len() as u64, "m@1").wait().unwrap();
        src.write_at(0, data.clone()).wait().unwrap();
        // Not sealed yet: no source.
        assert!(matches!(
            src.peer_source(None).wait(),
            Err(DeviceError::NotSealed)
        ));
        src.seal().wait().unwrap();
        let dst = b.allocate(data.len() as u64, "m@1").wait().unwrap();
        dst.copy_from(src.peer_source(None).wait().unwrap())
            .wait()
            .unwrap();
        dst.seal().wait().unwrap();
        assert_eq!(dst.read_at(0, data.len()).wait().unwrap(), data);
        assert_eq!(dst.export().wait().unwrap().device_uuid, "host-1");
        // Into a sealed arena, or of another length: refused.
        assert!(matches!(
            dst.copy_from(src.peer_source(None).wait().unwrap()).wait(),
            Err(DeviceError::Sealed)
        ));
        let short = b.allocate(100, "short").wait().unwrap();
        assert!(matches!(
            short
                .copy_from(src.peer_source(None).wait().unwrap())
                .wait(),
            Err(DeviceError::Protocol { .. })
        ));
    }
}
