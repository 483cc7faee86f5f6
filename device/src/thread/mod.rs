//! One thread per device that makes every driver call for it, and the traits a backend
//! implements there ([`Backend`], [`Arena`]).
//!
//! A [`DeviceThread`] owns its [`Backend`] (the CUDA context, staging buffers, kernels, or the
//! host backend's nothing-at-all) on a dedicated OS thread, fed by a channel. Everything that
//! touches the device — allocation, copy submission, event records and queries, exports,
//! checksums, frees and memory queries — is sent there as a job and answered on a one-shot
//! channel ([`Reply`]), which an async caller `.await`s and a blocking caller
//! [`wait`](Reply::wait)s for. No caller ever makes a driver call, holds a lock across one, or
//! blocks the async runtime on one.
//!
//! Objects that own device resources ([`Arena`]s, CUDA streams, pinned buffers) are wrapped in
//! [`OnDevice`]: they may be *referred to* from any thread, but are touched only by jobs on
//! their device thread, and when the last reference goes on another thread the value is sent
//! to the device thread to be dropped there (so `cuMemFree` runs on the device thread too).
//!
//! The thread also polls *watches*: non-blocking checks (an event query) registered by jobs,
//! run between jobs while any is pending, so that a loading thread learns that its staging
//! buffer's copy is done without making a driver call or blocking the device thread.
//!
//! # Layout
//!
//! The traits and types of the seam refer to one another in a circle (the context a job gets
//! owns the [`Backend`], which makes [`Arena`]s, whose writer is given the server's
//! [`ArenaHandle`], which sends jobs through the [`Executor`]), so they are declared together
//! here; what each one does lives in a file of its own:
//!
//! - `jobs`: how work reaches the thread: [`DeviceCtx`] (what a job gets, and its watches)
//!   and the [`Executor`] that queues jobs and calls.
//! - `on_device`: [`OnDevice`], a value the thread owns and drops.
//! - `handle`: [`ArenaHandle`]'s calls, each a job on the arena's device thread.
//! - `reply`: [`Reply`], the answer of a job.
//! - `device`: [`DeviceThread`]: starting the thread, opening its backend, the loop that runs
//!   jobs and polls watches, and the calls on the device as a whole.

use std::os::fd::OwnedFd;
use std::sync::{Arc, mpsc};
use std::thread::ThreadId;

use crate::backend::{ArenaReader, ArenaWriter, BufferedReader, BufferedWriter, DeviceInfo};
use crate::error::{DeviceError, Result};
use crate::export::Export;

mod device;
mod handle;
mod jobs;
mod on_device;
mod reply;
#[cfg(test)]
mod tests;

pub use device::DeviceThread;
pub use reply::Reply;

/// A device that allocates arenas. Lives on its device thread: every method runs there.
pub trait Backend: std::fmt::Debug {
    /// Describes the device.
    fn info(&self) -> DeviceInfo;

    /// Allocates a zero-filled arena of `len` bytes (`len` may be 0: the arena is still valid),
    /// writable until sealed. `label` names it (e.g. `"llama-7b@3"`) for debugging (the memfd's
    /// name on the host backend).
    fn allocate(&mut self, len: u64, label: &str) -> Result<Box<dyn Arena>>;

    /// Device memory in use as the device reports it; `None` where unknown (host).
    fn used_bytes(&mut self) -> Option<u64>;

    /// Memory a new arena could take now (CUDA: the device's free memory; host: the kernel's
    /// `MemAvailable`, bounded by the cgroup's limit: [`crate::host_memory`]); `None` where
    /// unknown.
    fn free_bytes(&mut self) -> Option<u64> {
        None
    }

    /// Takes over an arena that outlived the server that made it: `fd` is a descriptor of it
    /// that a worker kept (an allocation of `alloc_len` bytes holding an arena of `len`). The
    /// arena comes back sealed and ready to export; whether its bytes are the right ones is
    /// the caller's to check. Kinds that pass no descriptor cannot be adopted.
    fn adopt(&mut self, fd: OwnedFd, alloc_len: u64, len: u64) -> Result<Box<dyn Arena>> {
        let _ = (fd, alloc_len, len);
        Err(DeviceError::Unsupported {
            what: format!("adopting an arena on the {:?} backend", self.info().backend),
        })
    }
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

    /// The export, if it is the same for every attach and carries no descriptor (CUDA IPC:
    /// the memory and event handles, fixed at allocation). The server then answers attaches
    /// without a round trip to the device thread.
    fn fixed_export(&self) -> Option<Export> {
        None
    }

    /// Reads back `buf.len()` bytes at `offset` (server-side checks and tests).
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;

    /// A writer for one loading thread (`this` is the server's handle to this arena). It may
    /// stage bytes and queue copies asynchronously (CUDA: pinned buffers and a copy stream,
    /// copies submitted to the device thread). The default sends every chunk to the device
    /// thread's [`Arena::write_at`].
    fn writer(&self, this: &ArenaHandle) -> Result<Box<dyn ArenaWriter + Send>> {
        let arena = this.clone();
        Ok(Box::new(BufferedWriter::new(
            move |offset, bytes: &[u8]| arena.write_at(offset, bytes.to_vec()).wait(),
        )))
    }

    /// A reader for one thread comparing bytes with the arena's (`this` is the server's
    /// handle to this arena). The default asks the device thread's [`Arena::read_at`] for
    /// every chunk.
    fn reader(&self, this: &ArenaHandle) -> Result<Box<dyn ArenaReader + Send>> {
        let arena = this.clone();
        Ok(Box::new(BufferedReader::new(
            move |offset, buf: &mut [u8]| {
                let bytes = arena.read_at(offset, buf.len()).wait()?;
                buf.copy_from_slice(&bytes);
                Ok(())
            },
        )))
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

    /// The device ordinal this arena is on, as this process numbers devices (CUDA only).
    fn ordinal(&self) -> Option<usize> {
        None
    }

    /// This sealed arena as the source of a replica copy to the device `to` (an ordinal, for
    /// CUDA: granted read access here first; see [`crate::replica`]).
    fn peer_source(&self, _to: Option<usize>) -> Result<crate::PeerSource> {
        Err(crate::DeviceError::Unsupported {
            what: "replica copies from this kind of arena".into(),
        })
    }

    /// Fills this (unsealed) arena with all of `source`, on this device; returns once the
    /// bytes are here. The arena is sealed by the caller, after checking them.
    fn copy_from(&self, _source: &crate::PeerSource) -> Result<()> {
        Err(crate::DeviceError::Unsupported {
            what: "replica copies into this kind of arena".into(),
        })
    }
}

/// What a job gets on the device thread.
pub struct DeviceCtx {
    backend: Box<dyn Backend>,
    watches: Vec<Box<dyn FnMut() -> bool>>,
}

type Job = Box<dyn FnOnce(&mut DeviceCtx) + Send>;

enum Msg {
    Run(Job),
    Stop,
}

/// Sends jobs to one device thread. Cheap to clone.
#[derive(Clone)]
pub struct Executor {
    tx: mpsc::Sender<Msg>,
    thread: ThreadId,
}

/// A value owned by a device thread: readable only by jobs on that thread, and dropped there
/// wherever its owner lets go of it.
pub struct OnDevice<T: Send + 'static> {
    value: Option<T>,
    exec: Executor,
}

/// The server's handle to one arena. Clones refer to the same arena; the arena is freed (on
/// its device thread) when the last handle, and the last writer, are gone.
#[derive(Debug, Clone)]
pub struct ArenaHandle {
    inner: Arc<OnDevice<Box<dyn Arena>>>,
    exec: Executor,
    len: u64,
    attach_while_loading: bool,
    /// The arena's export when it never changes (see [`Arena::fixed_export`]).
    fixed: Option<Arc<Export>>,
    /// The kind of memory (whether workers' mappings are read-only, whether they keep the
    /// memory alive after the server lets it go).
    kind: crate::BackendKind,
}
