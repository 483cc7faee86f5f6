//! The two HTTP ports (axum): the inference port (`--http-listen`: the REST front doors and
//! probes that name no model) and the operators' port (`--metrics-listen`: `/metrics`, probes
//! that list the models, which every tenant's caller must not read).
//!
//! - [`router`] and [`operator_router`]: every route of each port, built from one
//!   [`HttpState`] ([`state`]); a new face adds its routes there and what it reads to the state.
//! - [`probes`]: `/healthz` (the process is up) and `/readyz` (start-up models loaded; on the
//!   operators' port the body says which loaded models have a serving worker).
//! - [`metrics`]: `/metrics`, which gathers the gauges' values from the registry
//!   ([`metrics::gauge_values`]) and hands them to [`modelshare_core::metrics::Metrics::refresh`].
//! - [`oip`]: the KServe v2 / OIP REST routes (`/v2/...`); [`triton`]: Triton's extensions
//!   of them (model configuration, repository index, statistics); [`generate`]: the generate
//!   extension (`.../generate`, `.../generate_stream`); [`openai`]: `/v1/embeddings` and
//!   `/v1/models`; [`completions`]: `/v1/completions` and `/v1/chat/completions`;
//!   [`streamed`]: what the doors that generate share (opening a streamed answer, collecting
//!   it, server-sent events); [`door`]: what they share (admission by bearer token, deadlines, the error
//!   value both render in their own shape).
//!
//! Request bodies are read only after the caller is admitted, within `max_request_bytes` (413
//! past it), the connection's and the listener's budgets and `request_body_timeout` ([`body`]).
//!
//! Like the gRPC services, the handlers are thin: they read the shared state and convert.

pub mod body;
pub mod completions;
pub mod door;
mod embedding_json;
pub mod generate;
pub mod json;
pub mod metrics;
pub mod oip;
pub mod openai;
pub mod probes;
pub mod state;
pub mod streamed;
pub mod tls;
pub mod triton;

use std::net::SocketAddr;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::{get, post};
use tokio_util::sync::CancellationToken;

pub use state::HttpState;

use crate::request_id::RequestIdLayer;
use door::DoorError;

/// The operators' port (`--metrics-listen`): `/metrics`, `/healthz`, and `/readyz` with each
/// model's serving workers. Model names of every tenant appear here: it is not the inference
/// port, which anyone with a token (or without, on loopback) may reach.
pub fn operator_router(state: HttpState) -> Router {
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::readyz))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(RequestIdLayer)
        .with_state(state)
}

/// Every route of the inference port (`--http-listen`), over `state`: the doors, and probes
/// that name no model.
pub fn router(state: HttpState) -> Router {
    let limit = state.app.config.serving.max_request_bytes;
    Router::new()
        .route("/healthz", get(probes::healthz))
        .route("/readyz", get(probes::ready_plain))
        .route("/v2", get(oip::server_metadata))
        .route("/v2/health/live", get(oip::live))
        .route("/v2/health/ready", get(oip::ready))
        .route("/v2/models/stats", get(triton::all_statistics))
        // Each model route twice: `{name}`, and `{name}/{rest}` for an owner/name model.
        .merge(model_routes("/v2/models/{name}"))
        .merge(model_routes("/v2/models/{name}/{rest}"))
        .route("/v2/repository/index", post(triton::repository_index))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/completions", post(completions::generate::<false>))
        .route("/v1/chat/completions", post(completions::generate::<true>))
        .route("/v1/models", get(openai::models))
        .route("/v1/models/{id}", get(openai::model))
        .route("/v1/models/{id}/{rest}", get(openai::model))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        // An id on every call (the caller's x-request-id, or a new one), echoed on the answer.
        .layer(RequestIdLayer)
        .with_state(state)
}

/// The OIP routes of one model under `base` (its metadata, readiness, inference,
/// configuration and statistics), each also under `/versions/{version}`.
fn model_routes(base: &str) -> Router<HttpState> {
    let mut r = Router::new();
    for (suffix, handler) in [
        ("", get(oip::model_metadata)),
        ("/ready", get(oip::model_ready)),
        ("/infer", post(oip::infer)),
        ("/generate", post(generate::generate::<false>)),
        ("/generate_stream", post(generate::generate::<true>)),
        ("/config", get(triton::model_config)),
        ("/stats", get(triton::model_statistics)),
    ] {
        r = r
            .route(&format!("{base}{suffix}"), handler.clone())
            .route(&format!("{base}/versions/{{version}}{suffix}"), handler);
    }
    r
}

/// An error in the shape of the door `uri` is under: OpenAI's for `/v1`, else `{"error"}`.
fn door_error(uri: &Uri, e: DoorError) -> Response {
    if uri.path() == "/v1" || uri.path().starts_with("/v1/") {
        openai::no_route(e)
    } else {
        oip::error(e)
    }
}

/// A path no route has: 404 in the door's error shape (not an empty body).
async fn no_route(method: Method, uri: Uri) -> Response {
    let message = format!("no route {method} {}", uri.path().escape_debug());
    route_error(&uri, StatusCode::NOT_FOUND, message)
}

/// A route asked with a method it does not take: 405 in the door's error shape.
async fn wrong_method(method: Method, uri: Uri) -> Response {
    let message = format!("{method} is not allowed on {}", uri.path().escape_debug());
    route_error(&uri, StatusCode::METHOD_NOT_ALLOWED, message)
}

fn route_error(uri: &Uri, status: StatusCode, message: String) -> Response {
    let e = DoorError {
        status,
        message: modelshare_core::error::bounded_message(message),
        retry_after: None,
    };
    door_error(uri, e)
}

/// Serves [`router`] on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    gate: crate::connections::Gate,
    routes: Router,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    use crate::connections::{ConnInfo, GatedListener, StreamsLayer};
    // Connections within the gate's caps, closed when they take too long to send a request
    // or stay idle (see `connections`); each request counted open until its answer ends.
    let app = routes
        .layer(StreamsLayer)
        .into_make_service_with_connect_info::<ConnInfo<SocketAddr>>();
    let gated = GatedListener::new(listener, gate);
    match tls {
        Some(acceptor) => {
            axum::serve(tls::TlsListener::new(gated, acceptor), app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
        None => {
            axum::serve(gated, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await
        }
    }
}

/// Binds the HTTP port.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}
