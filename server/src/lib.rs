//! The modelshare daemon and the `modelshare` command-line tool.
//!
//! # Layout
//! - [`config`]: command-line flags, `MODELSHARE_*` variables and the TOML file, merged into one
//!   typed [`config::Config`].
//! - [`weights`]: safetensors reading and validation (untrusted input): path resolution under the
//!   model root, headers, shard indexes, arena layout.
//! - [`names`]: model names and their validation (a leaf, with its own [`names::NameError`]).
//! - [`model`]: the domain types: version states, manifests (and the names, re-exported).
//! - [`error`]: [`error::ServerError`], which wraps the leaves' errors.
//! - [`registry`]: models, versions, sessions and leases, with one lock; decides when an arena
//!   is freed (unloaded *and* no lease left).
//! - [`app`]: the shared application state and the load orchestration used by the RPC and by
//!   start-up models.
//! - [`loader`]: copies validated weights into a fresh arena, computing per-tensor checksums.
//! - [`handles`]: one-time tickets and the Unix handle socket that passes arena fds.
//! - [`service`]: the gRPC services (admin, worker), thin over the registry; errors become
//!   `tonic::Status` in [`service::status`] only.
//! - [`http`]: the HTTP port (axum): `/metrics`, `/healthz`, `/readyz`, one router over one
//!   state; it reads the gauges' values from the registry for each scrape.
//! - [`metrics`]: Prometheus metrics and the tower layer that counts gRPC requests; a leaf that
//!   is handed the gauges' values ([`metrics::GaugeValues`]).
//! - [`tenants`]: tenants, tokens, quotas, the authentication layer, and the policy (who may
//!   see or do what: [`tenants::policy`]); [`audit`]: the audit log.
//! - [`serve`]: listeners, health and reflection, start-up models, graceful shutdown.
//! - [`cli`]: the admin client commands (`load`, `unload`, `ls`, `describe`, `stats`, `ps`).
//! - [`demo`]: a small generated model, so the server can run with no model at hand.
//! - [`telemetry`]: logging set-up.
//!
//! Data flow of a load: `LoadModel` → [`weights::source::resolve`] (validates every header
//! before anything is allocated) → [`weights::layout::plan`] → [`registry::Registry::begin_load`]
//! (allocates the arena) → [`loader::copy_into`] on a blocking thread → ready (or failed, freeing
//! the arena).
//!
//! Leaves ([`names`], [`weights::path`], [`metrics`], [`tenants::caller`],
//! [`tenants::error`]) are imported widely and import none of their importers back.
#![forbid(unsafe_code)]

pub mod app;
pub mod audit;
pub mod cli;
pub mod config;
pub mod demo;
pub mod devices;
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
pub mod sessions;
pub mod telemetry;
pub mod tenants;
pub mod timer;
pub mod weights;
