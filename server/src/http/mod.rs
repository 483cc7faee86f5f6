//! The HTTP listener (axum), on its own port (`--metrics-listen`): `/metrics`, `/healthz` and
//! `/readyz` today; the REST faces (OpenAI, OIP) are to join them.
//!
//! - [`router`]: every route, built from one [`HttpState`] ([`state`]); a new face adds its
//!   routes there and what it reads to the state.
//! - [`probes`]: `/healthz` (the process is up) and `/readyz` (start-up models loaded).
//! - [`metrics`]: `/metrics`, which gathers the gauges' values from the registry
//!   ([`metrics::gauge_values`]) and hands them to [`crate::metrics::Metrics::refresh`].
//!
//! Like the gRPC services, the handlers are thin: they read the shared state and convert.

pub mod metrics;
pub mod probes;
pub mod state;

use std::net::SocketAddr;

use axum::Router;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

pub use state::HttpState;

/// Every route of the HTTP port, over `state`.
pub fn router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .with_state(state)
}

/// Serves [`router`] on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: HttpState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Binds the HTTP port.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}
