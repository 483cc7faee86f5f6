//! Probes: `/healthz` answers while the process runs; `/readyz` once the start-up models are
//! loaded (503 before).

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::StatusCode;

use super::state::HttpState;

/// `GET /healthz`.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz`.
pub async fn readyz(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading start-up models\n")
    }
}
