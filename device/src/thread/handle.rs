//! [`ArenaHandle`]'s calls: what the server does with an arena (export, seal, abandon,
//! checksums, reads and writes, writers, replica copies), each run as a job on the arena's
//! device thread, but for an export that never changes.

use std::sync::Arc;

use super::{Arena, ArenaHandle, Executor, OnDevice, Reply};
use crate::backend::{ArenaReader, ArenaWriter, BackendKind};
use crate::error::Result;
use crate::export::Export;

impl ArenaHandle {
    pub(super) fn new(arena: Box<dyn Arena>, exec: Executor, len: u64, kind: BackendKind) -> Self {
        let attach_while_loading = arena.attach_while_loading();
        let fixed = arena.fixed_export().map(Arc::new);
        ArenaHandle {
            inner: Arc::new(OnDevice::new(arena, exec.clone())),
            exec,
            len,
            attach_while_loading,
            fixed,
            kind,
        }
    }

    /// Whether `other` is a handle to this same arena (one memory, however many versions
    /// name it).
    pub fn same_arena(&self, other: &ArenaHandle) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// A number that tells this arena from every other alive at the same time (equal for
    /// handles of [`same_arena`](Self::same_arena)).
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.inner) as *const () as usize
    }

    /// The kind of memory, and so of the workers' mappings ([`BackendKind::immutable_to_workers`]).
    pub fn kind(&self) -> BackendKind {
        self.kind
    }

    /// Whether workers' mappings keep the memory alive after the server lets it go (host
    /// memfds, CUDA VMM; not legacy IPC).
    pub fn outlives_server(&self) -> bool {
        self.kind.outlives_server()
    }

    /// The arena's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether a worker may attach before the arena is sealed: true where the backend orders a
    /// worker's first use after the load on the device itself (a ready event).
    pub fn attach_while_loading(&self) -> bool {
        self.attach_while_loading
    }

    fn with<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn Arena) -> Result<T> + Send + 'static,
    ) -> Reply<T> {
        let inner = self.inner.clone();
        self.exec.call(move |_| f(inner.get()?.as_ref()))
    }

    /// A handle to hand to a worker process (the host backend exports only sealed arenas).
    /// An export that never changes comes back at once, without a round trip.
    pub fn export(&self) -> Reply<Export> {
        if let Some(fixed) = &self.fixed
            && let Some(export) = fixed.without_fd()
        {
            return Reply::ready(Ok(export));
        }
        self.with(|a| a.export())
    }

    /// Ends writing: the contents become immutable. Idempotent.
    pub fn seal(&self) -> Reply<()> {
        self.with(|a| a.seal())
    }

    /// The load failed or was cancelled: release anything waiting for the arena to be ready.
    /// Queued without waiting (safe to call under a lock).
    pub fn abandon(&self) {
        let inner = self.inner.clone();
        self.exec.post(move |_| {
            if let Ok(a) = inner.get() {
                a.abandon();
            }
        });
    }

    /// Checksums of `(offset, len)` ranges computed where the bytes live, if the backend
    /// computes any (CUDA: ms64 on the device). Call after every writer has finished.
    pub fn checksums(&self, ranges: Vec<(u64, u64)>) -> Reply<Option<Vec<u64>>> {
        self.with(move |a| a.device_checksums(&ranges))
    }

    /// Copies `bytes` into the arena at `offset`.
    pub fn write_at(&self, offset: u64, bytes: Vec<u8>) -> Reply<()> {
        self.with(move |a| a.write_at(offset, &bytes))
    }

    /// Reads back `len` bytes at `offset` (server-side checks and tests).
    pub fn read_at(&self, offset: u64, len: usize) -> Reply<Vec<u8>> {
        self.with(move |a| {
            let mut buf = vec![0u8; len];
            a.read_at(offset, &mut buf)?;
            Ok(buf)
        })
    }

    /// A writer for one loading thread (see [`ArenaWriter`]). Each is finished before
    /// [`ArenaHandle::seal`].
    pub fn writer(&self) -> Reply<Box<dyn ArenaWriter + Send>> {
        let me = self.clone();
        self.exec.call(move |_| me.inner.get()?.writer(&me))
    }

    /// A reader for one thread comparing bytes with the arena's (see [`ArenaReader`]).
    pub fn reader(&self) -> Reply<Box<dyn ArenaReader + Send>> {
        let me = self.clone();
        self.exec.call(move |_| me.inner.get()?.reader(&me))
    }

    /// The device ordinal the arena is on (CUDA), from its device thread.
    pub fn ordinal(&self) -> Reply<Option<usize>> {
        self.with(|a| Ok(a.ordinal()))
    }

    /// The arena (sealed) as the source of a replica copy to device ordinal `to` (see
    /// [`Arena::peer_source`]). Keep this handle until the copy is done.
    pub fn peer_source(&self, to: Option<usize>) -> Reply<crate::PeerSource> {
        self.with(move |a| a.peer_source(to))
    }

    /// Fills the arena with all of `source` on its device thread (see [`Arena::copy_from`]).
    pub fn copy_from(&self, source: crate::PeerSource) -> Reply<()> {
        self.with(move |a| {
            if source.len() != a.len() {
                return Err(crate::DeviceError::Protocol {
                    reason: format!(
                        "a replica copy of {} bytes into an arena of {}",
                        source.len(),
                        a.len()
                    ),
                });
            }
            a.copy_from(&source)
        })
    }

    /// The executor of the arena's device thread (for writers that submit copies).
    pub(crate) fn executor(&self) -> &Executor {
        &self.exec
    }
}
