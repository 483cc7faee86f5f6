//! [`HttpState`]: what every HTTP handler may read, cloned into each request.

use crate::app::App;

/// What the HTTP handlers read: the application (its metrics, registry, devices, readiness,
/// engine, tenants and configuration).
#[derive(Debug, Clone)]
pub struct HttpState {
    /// The whole application.
    pub app: App,
}
