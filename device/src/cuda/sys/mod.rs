//! The `unsafe` core of the CUDA backend: thin `Result`-returning wrappers over the driver
//! calls cudarc leaves raw (IPC memory and event handles, host-function gates, pinned memory,
//! copies on raw pointers). Everything above this module is safe code.
//!
//! # Layout
//!
//! - `devices`: whether the driver and NVRTC libraries load, `cuInit`, the devices and their
//!   UUIDs.
//! - `memory`: [`DeviceMemory`], a device allocation (legacy or VMM): made, imported,
//!   written, read, its IPC handle or descriptor, freed.
//! - `peer`: replica copies between devices: read access granted to another device, the peer
//!   copy, peer access between contexts.
//! - `ipc`: [`IpcMemory`], another process's legacy allocation, and the handles' size.
//! - `event`: [`Event`], a CUDA event (plain or inter-process).
//! - `gate`: [`Gate`], a host-side latch a stream waits on through a host function.
//! - `pinned`: [`Pinned`], page-locked host memory for asynchronous copies.
//! - `ms64`: the ms64 checksum kernel launched over many ranges.
//! - `vmm`: the VMM calls (`cuMemCreate`, descriptors, read-only imports).
//! - `common`: the helpers they share (error mapping, binding a context, range checks).

mod common;
mod devices;
mod event;
mod gate;
mod ipc;
mod memory;
mod ms64;
mod peer;
mod pinned;
mod vmm;

pub use devices::{device_count, device_uuid, driver_present, init, nvrtc_present};
pub use event::Event;
pub use gate::{Gate, enqueue_gate};
pub use ipc::{IPC_HANDLE_BYTES, IpcMemory};
pub use memory::DeviceMemory;
pub use ms64::launch_ms64_many;
pub use peer::enable_peer_access;
pub use pinned::Pinned;
pub use vmm::{AddressRange, VmmImport, fd_handles_supported};
