//! The modelshare daemon: the doors (gRPC services, the HTTP port) and what keeps them
//! standing (listeners, connection and message limits, authentication, health, reflection,
//! metrics exposition, shutdown), over the model host ([`modelshare_core`]) and the request
//! path ([`modelshare_serving`]). Each transport maps errors in one place: gRPC in
//! [`service::status`], HTTP in [`http::door`].
//!
//! # Layout
//! - [`config`]: command-line flags, `MODELSHARE_*` variables and the TOML file, merged into one
//!   typed [`config::Config`].
//! - [`app`]: [`app::App`], what every door shares: the [`modelshare_core::host::Host`], the
//!   request path's [`modelshare_serving::Engine`], the live sessions, the CPU pool and the
//!   body budget.
//! - [`daemon`]: the daemon's life: listeners, health and reflection, start-up models,
//!   graceful shutdown.
//! - [`service`]: the gRPC services (admin, worker and its Serve stream, OIP inference), thin
//!   over the host and the request path.
//! - [`sessions`]: the hub of live worker sessions, reachable by id (pushes, ending), and the
//!   session loop the gRPC handler adapts; [`expiry`]: what each timer expiry does (tickets,
//!   heartbeats, drain deadlines).
//! - [`http`]: the HTTP port (axum): `/metrics`, `/healthz`, `/readyz`, the OIP REST routes and
//!   the OpenAI routes.
//! - [`front`]: what the inference doors share: admission of a caller's request (visibility,
//!   quota, deadline), the OIP tensor conversions, the CPU pool.
//! - [`handles`]: the Unix handle socket that passes arena fds against one-time tickets.
//! - [`auth`]: the tower layer that turns `authorization: Bearer <token>` into a caller in the
//!   request's extensions, checks Unix peer uids and counts requests in flight; [`audit`]: the
//!   audit log.
//! - [`accept`], [`connections`], [`message_limits`], [`bodies`]: what bounds a client:
//!   failed accepts, connections per listener and peer, gRPC message sizes and times, the
//!   request-body bytes in flight.
//! - [`health`]: `grpc.health.v1.Health`, its `Watch` bounded in time and number.
//! - [`grpc_metrics`]: the tower layer that counts gRPC requests.
//! - [`telemetry`]: logging set-up.
#![forbid(unsafe_code)]

pub mod accept;
pub mod app;
pub mod audit;
pub mod auth;
pub mod bodies;
pub mod config;
pub mod connections;
pub mod convert;
pub mod cpu;
pub mod daemon;
pub mod expiry;
pub mod front;
pub mod grpc_metrics;
pub mod handles;
pub mod health;
pub mod http;
pub mod hub;
pub mod message_limits;
pub mod request_id;
pub mod service;
pub mod sessions;
pub mod status;
pub mod telemetry;
