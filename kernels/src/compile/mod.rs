//! Run-time compilation of the `cuda/*.cu` sources with NVRTC, cached in memory and on disk.
//!
//! A [`KernelCache`] maps (device ordinal, context, compute capability, hash of source and
//! options) to a loaded module and its functions. A miss looks on disk first
//! (`<dir>/<hash>-sm<major><minor>.ptx`, see [`default_disk_dir`]), then compiles with NVRTC
//! for the device's own architecture (`--gpu-architecture=compute_XY`, no fast math) and
//! writes the PTX back. A cache file carries its own ms64 and length on its first line: a
//! truncated, corrupt, unreadable or refused file is recompiled, never fatal, and a cache
//! directory that cannot be written is skipped.
//!
//! # Layout
//! - here: the map; everything public is re-exported here.
//! - `source`: [`KernelSource`] and the crate's sources ([`GEMV_SOURCE`], [`ENCODER_SOURCE`],
//!   [`CHECKSUM_SOURCE`]).
//! - `cache`: [`KernelCache`] (with its [`CacheStats`] and [`DeviceInfo`]), the in-memory
//!   maps and the lookup order.
//! - `nvrtc`: [`compile_options`] and [`compile_ptx`].
//! - `hash`: [`source_hash`], what keys a module and names its cache file.
//! - `disk`: the disk cache's directory ([`default_disk_dir`], [`CACHE_DIR_ENV`]), file names
//!   ([`cache_file_name`]) and files.

mod cache;
mod disk;
mod hash;
mod nvrtc;
mod source;
#[cfg(test)]
mod tests;

pub use self::cache::{CacheStats, DeviceInfo, KernelCache};
pub use self::disk::{CACHE_DIR_ENV, cache_file_name, default_disk_dir};
pub use self::hash::source_hash;
pub use self::nvrtc::{compile_options, compile_ptx};
pub use self::source::{CHECKSUM_SOURCE, ENCODER_SOURCE, GEMV_SOURCE, KernelSource};
