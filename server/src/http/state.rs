//! [`HttpState`]: what every HTTP handler may read, cloned into each request.

use super::body::{BodyBudget, BodyLimits};
use crate::app::App;

/// What the HTTP handlers read: the application (its metrics, registry, devices, readiness,
/// engine, tenants and configuration) and the listener's budget of request bodies.
#[derive(Debug, Clone)]
pub struct HttpState {
    /// The whole application.
    pub app: App,
    /// Request-body bytes being received at once over the listener's connections.
    pub bodies: BodyBudget,
}

impl HttpState {
    /// The state of a listener of `app`, its body budget from the configuration.
    pub fn new(app: App) -> Self {
        let bodies = BodyBudget::new(app.config.serving.max_body_bytes_in_flight);
        Self { app, bodies }
    }

    /// What one request body may use.
    pub fn body_limits(&self) -> BodyLimits {
        let s = &self.app.config.serving;
        BodyLimits {
            max_bytes: s.max_request_bytes,
            per_connection: s.max_body_bytes_per_connection(),
            timeout: s.request_body_timeout,
        }
    }
}
