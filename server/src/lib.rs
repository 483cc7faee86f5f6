//! The modelshare daemon and the `modelshare` command-line tool.
//!
//! # Layout
//! - [`config`]: command-line flags, `MODELSHARE_*` variables and the TOML file, merged into one
//!   typed [`config::Config`].
//! - [`weights`]: safetensors reading and validation (untrusted input): path resolution under the
//!   model root, headers, shard indexes, arena layout.
//! - [`model`]: the domain types: model names, version states, manifests.
//! - [`registry`]: models, versions, sessions and leases, with one lock; decides when an arena
//!   is freed (unloaded *and* no lease left).
//! - [`app`]: the shared application state and the load orchestration used by the RPC and by
//!   start-up models.
//! - [`loader`]: copies validated weights into a fresh arena, computing per-tensor checksums.
//! - [`handles`]: one-time tickets and the Unix handle socket that passes arena fds.
//! - [`service`]: the gRPC services (admin, worker), thin over the registry; errors become
//!   `tonic::Status` in [`service::status`] only.
//! - [`metrics`]: Prometheus metrics, `/metrics`, `/healthz` and `/readyz` on their own port,
//!   and the tower layer that counts gRPC requests.
//! - [`tenants`]: tenants, tokens, quotas and the authentication layer; [`audit`]: the audit
//!   log.
//! - [`serve`]: listeners, health and reflection, start-up models, graceful shutdown.
//! - [`cli`]: the admin client commands (`load`, `unload`, `ls`, `describe`, `stats`, `ps`).
//! - [`demo`]: a small generated model, so the server can run with no model at hand.
//!
//! Data flow of a load: `LoadModel` → [`weights::source::resolve`] (validates every header
//! before anything is allocated) → [`weights::layout::plan`] → [`registry::Registry::begin_load`]
//! (allocates the arena) → [`loader::copy_into`] on a blocking thread → ready (or failed, freeing
//! the arena).
#![forbid(unsafe_code)]

pub mod app;
pub mod audit;
pub mod cli;
pub mod config;
pub mod demo;
pub mod error;
pub mod handles;
pub mod http;
pub mod loader;
pub mod metrics;
pub mod model;
pub mod names;
pub mod registry;
pub mod serve;
pub mod service;
pub mod telemetry;
pub mod tenants;
pub mod weights;
