//! The host backend: arenas of shared host memory, one `memfd` each.
//!
//! Server side, a [`HostArena`] is a memfd created with `MFD_ALLOW_SEALING`, sized with
//! `ftruncate` and at once sealed against shrinking and growing. It is written with `pwrite`
//! (never through a writable mapping, which would make `F_SEAL_WRITE` impossible to add), then
//! [`seal`](crate::Arena::seal)ed with `F_SEAL_WRITE | F_SEAL_SEAL`, then exported as a `dup`
//! of its descriptor. Worker side, a [`HostMapping`] checks the received descriptor's seals
//! and size and maps it read-only. The kernel frees the memory once the arena, every exported
//! descriptor and every mapping are gone.
//!
//! # Layout
//!
//! - `backend`: [`HostBackend`], host memory as a device, and its device threads.
//! - `arena`: [`HostArena`], one memfd: created, written, sealed, exported, copied into.
//! - `memfd`: the file calls an arena is made of: `memfd_create` with a bounded name,
//!   `pwrite` of a whole buffer, a copy by `pread`/`pwrite`.
//! - `mapping`: the worker side, [`HostMapping`] and the import of a received handle.

mod arena;
mod backend;
mod mapping;
mod memfd;
#[cfg(test)]
mod tests;

pub use arena::HostArena;
pub use backend::HostBackend;
pub use mapping::HostMapping;
pub(crate) use mapping::import;
