//! The backend interface, as the device thread sees it: a [`Backend`] allocates [`Arena`]s; an
//! arena is written (through [`ArenaWriter`]s), sealed, then exported as an
//! [`Export`](crate::Export) for a worker process.
//!
//! Every method of these traits runs on the backend's device thread
//! ([`crate::DeviceThread`]); the server reaches them only through the thread's handles. The
//! one exception is an [`ArenaWriter`], made on the device thread and used by a loading
//! thread: a writer that needs the device submits its work back to the device thread.

use crate::error::{DeviceError, Result};
use crate::export::Export;
use crate::thread::ArenaHandle;

/// Which kind of memory a backend hands out, and so which handle a worker gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// Shared host memory (`memfd`), passed as a file descriptor.
    Host,
    /// CUDA legacy IPC (`cuMemAlloc` + `CUipcMemHandle`): bytes in the attach reply. Mappings
    /// of this kind are writable by the worker.
    CudaIpc,
}

/// What a backend says about its device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The backend.
    pub backend: BackendKind,
    /// The device's UUID as it goes on the wire (`"host"` for host memory).
    pub uuid: String,
    /// A human-readable name.
    pub name: String,
    /// The device's total memory in bytes (0 where unknown).
    pub total_bytes: u64,
}

/// A device that allocates arenas. Lives on its device thread.
pub trait Backend: std::fmt::Debug {
    /// Describes the device.
    fn info(&self) -> DeviceInfo;

    /// Allocates a zero-filled arena of `len` bytes (`len` may be 0: the arena is still valid),
    /// writable until sealed. `label` names it (e.g. `"llama-7b@3"`) for debugging (the memfd's
    /// name on the host backend).
    fn allocate(&mut self, len: u64, label: &str) -> Result<Box<dyn Arena>>;

    /// Device memory in use as the device reports it; `None` where unknown (host).
    fn used_bytes(&mut self) -> Option<u64>;
}

/// One allocation: written, then sealed, then exported to workers. Its methods run on its
/// device thread; it is dropped there too.
pub trait Arena: Send + Sync + std::fmt::Debug {
    /// The arena's length in bytes.
    fn len(&self) -> u64;

    /// Whether the arena has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `bytes` into the arena at `offset`. Fails if the range runs past the end or the
    /// arena is sealed.
    fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<()>;

    /// Ends writing: the contents become immutable (host: adds `F_SEAL_WRITE`). Idempotent.
    fn seal(&self) -> Result<()>;

    /// A handle to hand to a worker process. The host backend exports only sealed arenas.
    fn export(&self) -> Result<Export>;

    /// Reads back `buf.len()` bytes at `offset` (server-side checks and tests).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// A writer for one loading thread (`this` is the server's handle to this arena). It may
    /// stage bytes and queue copies asynchronously (CUDA: pinned buffers and a copy stream,
    /// copies submitted to the device thread). The default sends every chunk to the device
    /// thread's [`Arena::write_at`].
    fn writer(&self, this: &ArenaHandle) -> Result<Box<dyn ArenaWriter + Send>> {
        Ok(Box::new(ThreadWriter {
            arena: this.clone(),
            buf: Vec::new(),
        }))
    }

    /// Whether a worker may attach before the arena is sealed: true where the backend orders a
    /// worker's first use after the load on the device itself (a ready event).
    fn attach_while_loading(&self) -> bool {
        false
    }

    /// Checksums of byte ranges `(offset, len)` computed where the bytes live, if the backend
    /// computes any (CUDA: ms64 on the device). Called after every writer has finished.
    fn device_checksums(&self, _ranges: &[(u64, u64)]) -> Result<Option<Vec<u64>>> {
        Ok(None)
    }

    /// The load failed or was cancelled: release anything waiting for the arena to be ready.
    /// Idempotent; the contents are undefined afterwards.
    fn abandon(&self) {}
}

/// Streams bytes into an arena during a load, from a loading thread.
pub trait ArenaWriter {
    /// A buffer of at most `max` bytes (possibly fewer; never empty when `max > 0`). Fill a
    /// prefix of it, then [`ArenaWriter::submit`] that prefix.
    fn buffer(&mut self, max: usize) -> Result<&mut [u8]>;

    /// Queues the first `len` bytes of the last buffer for the arena at `offset`.
    fn submit(&mut self, offset: u64, len: usize) -> Result<()>;

    /// Waits until everything submitted is in the arena.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// The default writer: a plain buffer, each chunk written by the device thread.
struct ThreadWriter {
    arena: ArenaHandle,
    buf: Vec<u8>,
}

impl ArenaWriter for ThreadWriter {
    fn buffer(&mut self, max: usize) -> Result<&mut [u8]> {
        if self.buf.len() < max {
            self.buf.resize(max, 0);
        }
        Ok(&mut self.buf[..max])
    }

    fn submit(&mut self, offset: u64, len: usize) -> Result<()> {
        let bytes = self.buf.get(..len).ok_or(DeviceError::OutOfRange {
            op: "submit",
            offset,
            len: len as u64,
            arena_len: self.buf.len() as u64,
        })?;
        self.arena.write_at(offset, bytes.to_vec()).wait()
    }

    fn finish(self: Box<Self>) -> Result<()> {
        Ok(())
    }
}

/// Checks that `len` bytes at `offset` lie within an arena of `arena_len` bytes.
pub(crate) fn check_range(op: &'static str, offset: u64, len: usize, arena_len: u64) -> Result<()> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= arena_len => Ok(()),
        _ => Err(crate::DeviceError::OutOfRange {
            op,
            offset,
            len,
            arena_len,
        }),
    }
}
