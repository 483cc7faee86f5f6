//! What a modelshare model host is, with no transport: no gRPC, no HTTP (Cargo checks it:
//! `scripts/check-planes`).
//!
//! # Layout
//! - [`names`]: model names and their validation (a leaf).
//! - [`weights`]: safetensors reading and validation (untrusted input): path resolution under the
//!   model root, headers, shard indexes, the arena layout.
//! - [`model`]: the domain values: version states, manifests.
//! - [`error`]: [`error::CoreError`], every refusal and failure of the host, wrapping the
//!   leaves' errors; the doors map it to their transports.
//! - [`devices`]: the host's devices keyed by UUID, each behind its device thread
//!   ([`modelshare_device::DeviceThread`], which makes every driver call), and the admission of
//!   an arena against a device's free memory.
//! - [`placement`]: where a load goes (pure, over a snapshot of the devices).
//! - [`registry`]: models, versions, sessions, leases and their tickets under one lock (never
//!   held around device work); decides when an arena is freed (unloaded *and* no lease left).
//! - [`loader`]: the manifest of a validated source, and the copy into an arena through
//!   per-thread writers, with per-tensor checksums.
//! - [`host`]: [`host::Host`], the state a model host shares (devices, registry, tenants, held
//!   memory, timer, metrics) and the one path a load takes.
//! - [`replicate`]: a version's copies on further devices.
//! - [`held`]: records of memory that can outlive the server; [`adopt`]: checking and adopting
//!   an offered arena after a restart.
//! - [`tenants`]: tenants, tokens, quotas and the policy (who may see or do what).
//! - [`timer`]: one timer for every expiry.
//! - [`metrics`]: the Prometheus families of the whole server (a leaf handed its gauges'
//!   values); the doors count their own requests into it and expose it.
//!
//! Leaves ([`names`], [`weights::path`], [`metrics`], [`tenants::caller`], [`error::tenants_file`])
//! are imported widely and import none of their importers back.
#![forbid(unsafe_code)]

pub mod adopt;
pub mod devices;
pub mod error;
pub mod held;
pub mod host;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod names;
pub mod placement;
pub mod registry;
pub mod replicate;
pub mod tenants;
pub mod timer;
pub mod weights;
