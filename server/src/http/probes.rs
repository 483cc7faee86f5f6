//! Probes: `/healthz` answers while the process runs; `/readyz` once the start-up models are
//! loaded (503 before). On the operators' port its body lists each model with a ready version
//! and whether a worker serves it; on the inference port it names no model ([`ready_plain`]):
//! a caller there may not see every tenant's models.

use axum::extract::State;
use axum::http::StatusCode;

use super::state::HttpState;
use modelshare_core::tenants::Caller;

/// `GET /healthz`.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `GET /readyz` on the inference port: ready or not, naming nothing.
pub async fn ready_plain(State(s): State<HttpState>) -> (StatusCode, &'static str) {
    if s.app.host.require_ready().is_err() {
        return (StatusCode::SERVICE_UNAVAILABLE, "loading start-up models\n");
    }
    (StatusCode::OK, "ready\n")
}

/// `GET /readyz` on the operators' port.
pub async fn readyz(State(s): State<HttpState>) -> (StatusCode, String) {
    if s.app.host.require_ready().is_err() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "loading start-up models\n".into(),
        );
    }
    let serving = s.app.engine.snapshot().await;
    let mut body = String::from("ready\n");
    for m in s.app.host.registry.list(&Caller::Admin) {
        if m.latest_ready == 0 {
            continue;
        }
        let workers = serving.model(&m.name).map_or(0, |x| x.workers);
        let line = if workers == 0 {
            format!("model {}: no serving worker\n", m.name)
        } else {
            format!("model {}: {workers} serving worker(s)\n", m.name)
        };
        body.push_str(&line);
    }
    (StatusCode::OK, body)
}
