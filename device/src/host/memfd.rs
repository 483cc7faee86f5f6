//! The file calls a host arena is made of: `memfd_create` under a bounded name, `pwrite` of a
//! whole buffer, and a copy between two memfds by `pread`/`pwrite`.

use std::os::fd::OwnedFd;

use rustix::fs::MemfdFlags;
use rustix::io::Errno;

use crate::error::{DeviceError, Result};

/// The longest memfd name Linux accepts (249 bytes, without the NUL).
pub(super) const MEMFD_NAME_MAX: usize = 249;

/// `modelshare:<label>`, cut to the kernel's limit at a character boundary, without NULs.
pub(super) fn memfd_name(label: &str) -> String {
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
pub(super) fn create_memfd(name: &str, len: u64) -> Result<OwnedFd> {
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

/// `pwrite` of all of `bytes` at `offset` of an arena of `len` bytes.
pub(super) fn pwrite_all(fd: &OwnedFd, offset: u64, bytes: &[u8], len: u64) -> Result<()> {
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
pub(super) fn copy_by_pread(
    src: &OwnedFd,
    dst: &OwnedFd,
    from: u64,
    len: u64,
    dst_len: u64,
) -> Result<()> {
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
