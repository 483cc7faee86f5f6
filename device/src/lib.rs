//! Arenas of shared memory, the one thread per device that makes every driver call, their
//! export to worker processes, the handle passing between, and the mappings workers hold.
//!
//! # Layout
//!
//! - [`thread`]: [`DeviceThread`], one per device: it owns the backend and runs every
//!   allocation, copy submission, event record, export, checksum, free and memory query, fed
//!   by a channel; callers `.await` (or [`wait`](Reply::wait) for) a [`Reply`]. The server
//!   holds arenas as [`ArenaHandle`]s; the last handle's drop frees the arena on the thread.
//! - [`backend`]: the vocabulary backends share: [`BackendKind`], [`DeviceInfo`], the
//!   [`ArenaWriter`] a loading thread streams bytes with, the [`Mapped`] trait of mappings.
//!   The traits a backend implements on its thread ([`Backend`] allocates [`Arena`]s,
//!   written, sealed, then exported) live in [`thread`].
//! - [`export`]: what crosses to a worker, backend-neutral: [`Export`] (server side: handle
//!   bytes for the attach reply, and/or a descriptor for the handle socket) and [`Import`]
//!   (worker side).
//! - [`mapping`]: [`Mapping`], a worker's view of an attached arena whatever its kind (base
//!   address, length, read-only or not; unmapped when the last clone goes).
//! - [`host`]: the host backend: a sealable memfd written with `pwrite`; mapped read-only by
//!   workers ([`HostMapping`]). Its free memory is [`host_memory`]'s: `MemAvailable` bounded
//!   by the room left under this process's cgroup memory limit (v1 or v2), read under a root
//!   tests can point at a fake `/proc` and cgroup tree.
//! - [`cuda`]: the CUDA backend (VMM descriptors or legacy IPC handles), one module per
//!   concern: contexts, arenas and their writer, the gated ready event, the ms64 kernel, the
//!   worker-side imports of each kind.
//! - [`checksum`]: ms64, the device-friendly checksum: definition (CPU) and CUDA C source.
//! - [`handoff`]: how a descriptor travels: the worker [`redeem`](handoff::redeem)s a one-time
//!   ticket on the server's Unix handle socket; the server answers with
//!   [`send_fd`](handoff::send_fd) (`SCM_RIGHTS`) or [`send_refusal`](handoff::send_refusal);
//!   and the other way, a worker [`offer`](handoff::offer)s a kept descriptor back to a
//!   restarted server, which [`adopt`](DeviceThread::adopt)s the arena.
//! - [`peer`]: [`PeerWatch`], a pidfd on a worker process, to notice its exit at once.
//! - [`error`]: [`DeviceError`], the crate's one error type.
//! - [`ignore_hangup`]: SIGHUP made harmless, first thing in the server's `main` (a wrapper
//!   over `signal`, as the crate holds the unsafe code).
//! - [`stream`]: [`ForeignStream`], another library's CUDA stream (a DLPack consumer's), made
//!   from a raw handle (an `unsafe` constructor) and made to wait on a ready event.
//! - `sys`, `cuda::sys` (private): the only `unsafe` code besides that constructor.
//!
//! Data flow of a load: `DeviceThread::allocate` → `ArenaHandle::writer` (one per loading
//! thread) → `ArenaWriter::buffer`/`submit`… → `finish` → `ArenaHandle::checksums` →
//! `ArenaHandle::seal`. Of an attach: `ArenaHandle::export` → (handle bytes in the reply; the
//! descriptor by `handoff`) ⇢ worker: `Mapping::import` → `Mapping::host_bytes` /
//! `Mapping::device_ptr`.
//!
//! Adding a handle kind means one module here (its arena's `export` and its `import`, as
//! `cuda::vmm` did for VMM), one arm in [`Mapping::import`], and one `oneof` arm in the
//! protocol.

#![deny(unsafe_code)]

pub mod backend;
pub mod checksum;
pub mod cuda;
pub mod error;
pub mod export;
pub mod handoff;
pub mod host;
pub mod host_memory;
pub mod mapping;
pub mod numa;
pub mod pagecache;
pub mod peer;
pub mod replica;
pub mod reservation;
#[allow(unsafe_code)] // An unsafe constructor of a raw stream handle; see its docs.
pub mod stream;
#[allow(unsafe_code)] // The one module allowed `unsafe`; see its docs.
mod sys;
pub mod thread;

pub use backend::{ArenaReader, ArenaWriter, BackendKind, DeviceInfo, Mapped, PAGE};
pub use error::{DeviceError, Result};
pub use export::{Export, Handles, Import};
pub use host::{HostArena, HostBackend, HostMapping};
pub use host_memory::HostMemory;
pub use mapping::Mapping;
pub use peer::PeerWatch;
pub use replica::PeerSource;
pub use reservation::Reservation;
pub use stream::ForeignStream;
pub use sys::ignore_hangup;
pub use thread::{Arena, ArenaHandle, Backend, DeviceCtx, DeviceThread, Reply};

#[cfg(test)]
mod test_util {
    //! Helpers shared by the unit tests.

    /// `len` pseudo-random bytes (xorshift64*, seeded), none of them predictable by position.
    pub(crate) fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            out.extend_from_slice(&state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
        }
        out.truncate(len);
        out
    }
}
