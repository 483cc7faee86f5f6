//! [`HttpState`]: what every HTTP handler may read, cloned into each request.

use std::sync::Arc;

use tokio::sync::Semaphore;

use super::body::{BodyLimits, MAX_DRAINS};
use crate::app::App;

/// What the HTTP handlers read: the application (its metrics, registry, devices, readiness,
/// engine, tenants, configuration and the server's budget of request bodies).
#[derive(Debug, Clone)]
pub struct HttpState {
    /// The whole application.
    pub app: App,
    /// Unread bodies of answered requests being discarded now (see [`super::body::drain`]).
    pub drains: Arc<Semaphore>,
}

impl HttpState {
    /// The state of a listener of `app`.
    pub fn new(app: App) -> Self {
        Self {
            app,
            drains: Arc::new(Semaphore::new(MAX_DRAINS)),
        }
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
