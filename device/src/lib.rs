//! Arenas of shared memory, their export to worker processes, and the handle passing between.
//!
//! # Layout
//!
//! - [`backend`]: the interface every backend implements. A [`Backend`] allocates an
//!   [`Arena`]; the server writes the arena (from several threads at once), seals it, and
//!   exports an [`ExportedHandle`] for each worker that attaches.
//! - [`host`]: the host backend. [`HostBackend`] / [`HostArena`] (server side: a sealable
//!   memfd written with `pwrite`) and [`HostMapping`] (worker side: the received descriptor,
//!   checked and mapped read-only).
//! - [`handoff`]: how a descriptor travels. The worker [`redeem`](handoff::redeem)s a one-time
//!   ticket on the server's Unix handle socket; the server [`read_ticket`](handoff::read_ticket)s
//!   and answers with [`send_fd`](handoff::send_fd) (`SCM_RIGHTS`) or
//!   [`send_refusal`](handoff::send_refusal).
//! - [`cuda`]: the CUDA backend (legacy IPC): [`cuda::CudaBackend`] on the server,
//!   [`cuda::CudaMapping`] in a worker, and the gated ready event that orders a worker's first
//!   kernels after the load.
//! - [`peer`]: [`PeerWatch`], a pidfd on a worker process, to notice its exit at once.
//! - [`error`]: [`DeviceError`], the crate's one error type.
//! - `sys` (private): the only `unsafe` code, the read-only mapping of a sealed file.
//!
//! Data flow on the host backend: `HostBackend::allocate` → `Arena::write_at`… →
//! `Arena::seal` → `Arena::export` → `handoff::send_fd` ⇢ `handoff::redeem` →
//! `HostMapping::map` → `HostMapping::as_slice`.
//!
//! The CUDA backends (legacy IPC, VMM) will plug in behind the same traits.

#![deny(unsafe_code)]

pub mod backend;
pub mod cuda;
pub mod error;
pub mod handoff;
pub mod host;
pub mod peer;
#[allow(unsafe_code)] // The one module allowed `unsafe`; see its docs.
mod sys;

pub use backend::{Arena, ArenaWriter, Backend, BackendKind, DeviceInfo, ExportedHandle};
pub use error::{DeviceError, Result};
pub use host::{HostArena, HostBackend, HostMapping};
pub use peer::PeerWatch;

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
