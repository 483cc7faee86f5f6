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
//! - [`devices`]: the server's devices keyed by UUID, each behind its device thread
//!   ([`modelshare_device::DeviceThread`]), which makes every driver call; nothing else does.
//! - [`registry`]: models, versions, sessions, leases and their tickets, with one lock (never
//!   held around device work); decides when an arena is freed (unloaded *and* no lease left).
//! - [`sessions`]: the hub of live worker sessions, reachable by id (pushes, ending), and the
//!   session loop the gRPC handler adapts.
//! - [`timer`]: one timer for every expiry; [`expiry`]: what each does (tickets, heartbeats,
//!   drain deadlines).
//! - [`app`]: the shared application state and the load orchestration used by the RPC and by
//!   start-up models.
//! - [`loader`]: plans the manifest, then copies validated weights into the arena through
//!   per-thread writers, computing per-tensor checksums.
//! - [`handles`]: the Unix handle socket that passes arena fds against one-time tickets.
//! - [`accept`]: listeners pause (and say so, rarely) after a failed accept instead of spinning.
//! - [`service`]: the gRPC services (admin, worker), thin over the registry; errors become
//!   `tonic::Status` in [`service::status`] only.
//! - [`http`]: the HTTP port (axum): `/metrics`, `/healthz`, `/readyz`, one router over one
//!   state; it reads the gauges' values from the registry for each scrape.
//! - [`metrics`]: Prometheus metrics and the tower layer that counts gRPC requests; a leaf that
//!   is handed the gauges' values ([`metrics::GaugeValues`]).
//! - [`tenants`]: tenants, tokens, quotas, the authentication layer, and the policy (who may
//!   see or do what: [`tenants::policy`]); [`audit`]: the audit log.
//! - [`serving`]: the request path: the scheduler (admission, per-tenant deficit-round-robin
//!   queues per model, batching, dispatch to worker credits, requeue of a lost worker's items,
//!   reassembly of results), the driver task that owns it, and [`serving::Engine`], the handle
//!   the front doors and the Serve streams hold.
//! - [`front`]: what the inference front doors share: admission of a caller's request
//!   (visibility, quota, deadline) and the OIP tensor conversions.
//! - [`bodies`]: the server-wide budget of request-body bytes being received, over every door.
//! - [`health`]: `grpc.health.v1.Health`, its `Watch` bounded in time and number.
//! - [`serve`]: listeners, health and reflection, start-up models, graceful shutdown.
//! - [`cli`]: the admin client commands (`load`, `unload`, `ls`, `describe`, `stats`, `ps`) and
//!   the inference ones (`embed`, `infer`, through the OIP gRPC front door).
//! - [`demo`]: a small generated model, so the server can run with no model at hand.
//! - [`telemetry`]: logging set-up.
//!
//! Data flow of a load: `LoadModel` → [`weights::source::resolve`] (validates every header
//! before anything is allocated) → [`weights::layout::plan`] → [`loader::manifest`] →
//! [`registry::Registry::reserve`] (quotas, version number) → the device thread allocates the
//! arena → [`registry::Registry::set_arena`] → [`loader::copy_into`] on blocking threads →
//! [`registry::Registry::finish_load`]: ready (or failed, freeing the arena on its thread).
//!
//! Of an attach: `Attach` → [`registry::Registry::attach`] (lease) → the device thread exports
//! the arena → a descriptor is filed on the lease under a ticket ([`registry::Registry::issue_ticket`],
//! expiry on the [`timer`]) → the reply carries handle bytes and/or the ticket → the worker
//! redeems the ticket on the [`handles`] socket.
//!
//! Leaves ([`names`], [`weights::path`], [`metrics`], [`tenants::caller`],
//! [`tenants::error`]) are imported widely and import none of their importers back.
#![forbid(unsafe_code)]

pub mod accept;
pub mod adopt;
pub mod app;
pub mod audit;
pub mod bodies;
pub mod cli;
pub mod config;
pub mod connections;
pub mod demo;
pub mod devices;
pub mod error;
pub mod expiry;
pub mod front;
pub mod handles;
pub mod health;
pub mod held;
pub mod http;
pub mod loader;
pub mod message_limits;
pub mod metrics;
pub mod model;
pub mod names;
pub mod placement;
pub mod registry;
pub mod replicate;
pub mod serve;
pub mod service;
pub mod serving;
pub mod sessions;
pub mod telemetry;
pub mod tenants;
pub mod timer;
pub mod weights;
