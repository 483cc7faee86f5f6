//! [`HttpState`]: what every HTTP handler may read, cloned into each request.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::app::App;
use crate::devices::Devices;
use crate::metrics::Metrics;
use crate::registry::Registry;

/// What the HTTP handlers read.
#[derive(Debug, Clone)]
pub struct HttpState {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The model registry (for gauges).
    pub registry: Arc<Registry>,
    /// The devices (for their memory gauges).
    pub devices: Arc<Devices>,
    /// Set once the start-up models are loaded.
    pub ready: Arc<AtomicBool>,
    /// The whole application, for the inference routes (engine, tenants, configuration).
    pub app: App,
}
