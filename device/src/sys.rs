//! The crate's only `unsafe` code outside the CUDA backend: a read-only shared mapping of a
//! sealed file ([`SealedMapping`]), the page-cache residency of a file range
//! ([`resident`]), and SIGHUP ignored at a program's start ([`ignore_hangup`]). The checks that make the mapping sound (the file is sealed against writes,
//! shrinking and growing, and has the expected size) live here, next to the `mmap` they
//! justify, so that nothing outside this module can build a mapping without them.

use std::os::fd::BorrowedFd;
use std::ptr::NonNull;

use rustix::fs::SealFlags;
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

use crate::error::{DeviceError, Result};

/// The seals without which a mapped file could change (`WRITE`) or shrink under the reader
/// (`SHRINK`, a `SIGBUS` on access), or grow past what was checked (`GROW`).
pub(crate) const REQUIRED_SEALS: SealFlags = SealFlags::WRITE
    .union(SealFlags::SHRINK)
    .union(SealFlags::GROW);

/// A read-only `MAP_SHARED` mapping of a whole sealed file; unmapped on drop.
///
/// A zero-length file is not mapped at all: the mapping is an empty slice.
#[derive(Debug)]
pub(crate) struct SealedMapping {
    /// Start of the mapping; dangling (never dereferenced) when `len` is 0.
    ptr: NonNull<u8>,
    /// Length in bytes, equal to the file's size.
    len: usize,
}

// SAFETY: the mapping is read-only and its contents never change (the file is sealed against
// writes), so sharing or sending the pointer between threads is as safe as for a `&'static [u8]`.
unsafe impl Send for SealedMapping {}
// SAFETY: as for `Send`: only shared reads ever go through the pointer.
unsafe impl Sync for SealedMapping {}

impl SealedMapping {
    /// Maps all of `fd` read-only, after checking that its seals include
    /// [`REQUIRED_SEALS`] and that its size is `expected_len`.
    pub(crate) fn map(fd: BorrowedFd<'_>, expected_len: u64) -> Result<Self> {
        // Seals first: once they are in place the size can no longer change, so the size
        // checked below is the size mapped.
        let seals = match rustix::fs::fcntl_get_seals(fd) {
            Ok(seals) => seals,
            Err(Errno::INVAL) => {
                return Err(DeviceError::BadHandle {
                    reason: "the descriptor is not a sealable memory file (F_GET_SEALS refused it)"
                        .into(),
                });
            }
            Err(e) => return Err(DeviceError::io("F_GET_SEALS on the imported descriptor", e)),
        };
        let missing = REQUIRED_SEALS.difference(seals);
        if !missing.is_empty() {
            return Err(DeviceError::BadHandle {
                reason: format!(
                    "the memory file lacks the seals {missing:?}: its bytes could change or it \
                     could shrink under the reader"
                ),
            });
        }
        let stat = rustix::fs::fstat(fd)
            .map_err(|e| DeviceError::io("fstat of the imported descriptor", e))?;
        let size = u64::try_from(stat.st_size).unwrap_or(0);
        if size != expected_len {
            return Err(DeviceError::BadHandle {
                reason: format!("the memory file has {size} bytes, expected {expected_len}"),
            });
        }
        let len = usize::try_from(expected_len).map_err(|_| DeviceError::BadHandle {
            reason: format!("{expected_len} bytes do not fit in this process's address space"),
        })?;
        if len == 0 {
            return Ok(SealedMapping {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a null hint lets the kernel choose a fresh range, so no existing memory is
        // replaced; the file is `len` bytes long and sealed against shrinking (checked above), so
        // every page of the mapping stays backed.
        let addr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                fd,
                0,
            )
        };
        let addr = match addr {
            Ok(addr) => addr,
            Err(e @ (Errno::NOMEM | Errno::NFILE | Errno::MFILE)) => {
                return Err(DeviceError::AllocationFailed {
                    bytes: expected_len,
                    reason: format!("mmap of the imported memory file: {e}"),
                });
            }
            Err(e) => return Err(DeviceError::io("mmap of the imported memory file", e)),
        };
        let ptr = NonNull::new(addr.cast::<u8>()).ok_or_else(|| DeviceError::BadHandle {
            reason: "mmap returned a null address".into(),
        })?;
        Ok(SealedMapping { ptr, len })
    }

    /// The mapped bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr+len` is a live read-only mapping owned by `self` (unmapped only in
        // `drop`), backed by a file sealed against writes and shrinking (checked in `map`): the
        // bytes are initialised, never change and never fault while `&self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The mapping's length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for SealedMapping {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        // SAFETY: `ptr`/`len` are exactly the range `mmap` returned in `map`, unmapped only here,
        // and no slice borrowed from `self` can outlive this `&mut self`.
        if let Err(e) = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) } {
            tracing::warn!(len = self.len, error = %e, "munmap of a sealed mapping failed");
        }
    }
}

/// Registers an owned descriptor with the tokio reactor for readability.
pub(crate) fn register_readable(
    fd: std::os::fd::OwnedFd,
) -> std::io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    // SAFETY: the `AsyncFd` takes ownership of `fd`: nothing else can close or replace the
    // descriptor while it is registered, and it is deregistered before it is closed (on drop).
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
            .map_err(|e| e.into_parts().1)
    }
}

/// Whether every page of `len` bytes of the file `fd` at `offset` is in the page cache
/// (`mincore` on a mapping of the range that is never read: asking touches no byte and starts
/// no I/O).
pub(crate) fn resident(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Result<bool> {
    if len == 0 {
        return Ok(true);
    }
    let page = rustix::param::page_size() as u64;
    let start = offset - offset % page;
    let span = usize::try_from(offset - start)
        .ok()
        .and_then(|lead| lead.checked_add(len))
        .ok_or(DeviceError::Protocol {
            reason: format!("a residency query of {len} bytes at {offset} overflows"),
        })?;
    // SAFETY: a new read-only shared mapping, at an address the kernel picks, of `span` bytes of
    // the file from a page-aligned offset. Nothing ever reads through it (a read past the end of
    // a shrunk file would be a SIGBUS); it is only asked about, then unmapped below.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            span,
            ProtFlags::READ,
            MapFlags::SHARED,
            fd,
            start,
        )
    }
    .map_err(|e| DeviceError::io("mmap for a page-cache residency query", e))?;
    let mut pages = vec![0u8; span.div_ceil(page as usize)];
    // SAFETY: `ptr` starts the mapping of `span` bytes made above (page-aligned, as mmap returns
    // it); `pages` has one byte for each of its pages, as mincore writes.
    let rc = unsafe { libc::mincore(ptr, span, pages.as_mut_ptr()) };
    let asked = if rc == 0 {
        Ok(pages.iter().all(|p| p & 1 == 1))
    } else {
        Err(DeviceError::io(
            "mincore",
            Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO),
        ))
    };
    // SAFETY: unmaps exactly the mapping made above, which nothing refers to any more.
    unsafe { rustix::mm::munmap(ptr, span) }
        .map_err(|e| DeviceError::io("munmap after a residency query", e))?;
    asked
}

/// Sets SIGHUP's disposition to "ignore": its default action ends the process. For the first
/// line of a program's `main`, so that a hang-up sent while it starts is harmless; a handler
/// installed later (tokio's, which the server reloads its tenants by) replaces the disposition
/// and receives SIGHUP from then on. Children exec'd while it is ignored inherit that.
pub fn ignore_hangup() -> std::io::Result<()> {
    // SAFETY: `SIG_IGN` is no function of ours (no code runs in signal context), and `signal`
    // changes nothing but the process's disposition of SIGHUP, which no code of this process
    // relies on before its own handler is installed.
    let previous = unsafe { libc::signal(libc::SIGHUP, libc::SIG_IGN) };
    if previous == libc::SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
