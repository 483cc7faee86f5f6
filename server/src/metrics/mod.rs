//! Prometheus metrics: one [`prometheus::Registry`] owned here (not the global default),
//! served as text on `/metrics` of the metrics port, with `/healthz` (process up) and `/readyz`
//! (start-up models loaded) beside it.
//!
//! Counters and histograms are updated where things happen (the gRPC layer in [`grpc`], loads,
//! attaches, session ends); gauges (versions by state, arena bytes, sessions, leases, device
//! memory) are refreshed from the registry at each scrape. Label values are bounded: service
//! and method names of this server only, status codes, states, model names, reasons.

pub mod grpc;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};
use tokio_util::sync::CancellationToken;

use crate::registry::Registry as ModelRegistry;

/// Every metric of the server.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// gRPC requests by service, method and status code.
    pub grpc_requests: IntCounterVec,
    /// gRPC request latency by service, method and code (to the response head; streams: to open).
    pub grpc_seconds: HistogramVec,
    /// Attaches by result (`ok`, `error`).
    pub attaches: IntCounterVec,
    /// Attach latency (successful attaches, server side).
    pub attach_seconds: Histogram,
    /// Loads by result (`ok`, `error`).
    pub loads: IntCounterVec,
    /// Load duration (copy, checksums, seal).
    pub load_seconds: Histogram,
    /// Bytes loaded into arenas.
    pub load_bytes: IntCounter,
    /// Sessions ended, by reason.
    pub sessions_ended: IntCounterVec,
    /// Requests refused by the authentication layer, by reason.
    auth_refusals: IntCounterVec,
    /// Calls refused for a tenant quota, by tenant and quota.
    quota_denials: IntCounterVec,
    versions: IntGaugeVec,
    arena_bytes: IntGaugeVec,
    models: IntGauge,
    sessions: IntGaugeVec,
    leases: IntGaugeVec,
    device_total: IntGauge,
    device_used: IntGauge,
}

fn latency_buckets() -> Vec<f64> {
    vec![
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ]
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(c.clone()))?;
            Ok::<_, prometheus::Error>(c)
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        let grpc_seconds = HistogramVec::new(
            HistogramOpts::new(
                "modelshare_grpc_request_duration_seconds",
                "gRPC request latency to the response head, by service, method and status code.",
            )
            .buckets(latency_buckets()),
            &["service", "method", "code"],
        )?;
        registry.register(Box::new(grpc_seconds.clone()))?;
        let attach_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "modelshare_attach_duration_seconds",
                "Server-side latency of successful attaches (lease, export, ticket).",
            )
            .buckets(latency_buckets()),
        )?;
        registry.register(Box::new(attach_seconds.clone()))?;
        let load_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "modelshare_load_duration_seconds",
                "Duration of successful loads (copy, checksums, seal).",
            )
            .buckets(vec![
                0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
            ]),
        )?;
        registry.register(Box::new(load_seconds.clone()))?;
        let load_bytes = IntCounter::new(
            "modelshare_load_bytes_total",
            "Bytes copied into arenas by loads.",
        )?;
        registry.register(Box::new(load_bytes.clone()))?;
        let versions = IntGaugeVec::new(
            Opts::new("modelshare_model_versions", "Model versions by state."),
            &["state"],
        )?;
        registry.register(Box::new(versions.clone()))?;
        let arena_bytes = IntGaugeVec::new(
            Opts::new(
                "modelshare_arena_bytes",
                "Bytes held by arenas, by model and device.",
            ),
            &["model", "device"],
        )?;
        registry.register(Box::new(arena_bytes.clone()))?;
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok::<_, prometheus::Error>(g)
        };
        Ok(Self {
            auth_refusals: counter_vec(
                "modelshare_auth_refusals_total",
                "Requests refused by authentication, by reason (missing, malformed, unknown_token, uid).",
                &["reason"],
            )?,
            quota_denials: counter_vec(
                "modelshare_quota_denials_total",
                "Calls refused for a tenant quota, by tenant and quota.",
                &["tenant", "quota"],
            )?,
            grpc_requests: counter_vec(
                "modelshare_grpc_requests_total",
                "gRPC requests by service, method and status code.",
                &["service", "method", "code"],
            )?,
            grpc_seconds,
            attaches: counter_vec(
                "modelshare_attaches_total",
                "Attaches by result.",
                &["result"],
            )?,
            attach_seconds,
            loads: counter_vec("modelshare_loads_total", "Loads by result.", &["result"])?,
            load_seconds,
            load_bytes,
            sessions_ended: counter_vec(
                "modelshare_sessions_ended_total",
                "Worker sessions ended, by reason.",
                &["reason"],
            )?,
            versions,
            arena_bytes,
            models: gauge("modelshare_models", "Model names on record.")?,
            sessions: gauge_vec(
                "modelshare_sessions",
                "Open worker sessions, by tenant (empty: admin, or no tenants configured).",
                &["tenant"],
            )?,
            leases: gauge_vec(
                "modelshare_leases",
                "Leases held, by tenant (empty: admin, or no tenants configured).",
                &["tenant"],
            )?,
            device_total: gauge(
                "modelshare_device_memory_total_bytes",
                "Memory of the device arenas live on (host: MemTotal).",
            )?,
            device_used: gauge(
                "modelshare_device_memory_used_bytes",
                "Device memory in use as the device reports it (CUDA); arena bytes on the host backend.",
            )?,
            registry,
        })
    }

    /// Refreshes the gauges from the model registry and the device's figures.
    pub fn refresh(
        &self,
        models: &ModelRegistry,
        device: &modelshare_device::DeviceInfo,
        device_used: Option<u64>,
    ) {
        let stats = models.stats(&crate::tenants::Caller::Admin);
        for (state, n) in &stats.versions_by_state {
            self.versions
                .with_label_values(&[state.as_str()])
                .set(i64::from(*n));
        }
        self.arena_bytes.reset();
        for m in models.list(&crate::tenants::Caller::Admin) {
            let mut held: std::collections::BTreeMap<&str, u64> = std::collections::BTreeMap::new();
            for v in m.versions.iter().filter(|v| v.state.holds_arena()) {
                *held.entry(v.device.as_str()).or_default() += v.arena_bytes;
            }
            for (dev, bytes) in held.into_iter().filter(|(_, b)| *b > 0) {
                self.arena_bytes
                    .with_label_values(&[m.name.as_str(), dev])
                    .set(i64::try_from(bytes).unwrap_or(i64::MAX));
            }
        }
        self.models.set(i64::from(stats.models));
        self.sessions.reset();
        self.leases.reset();
        self.sessions.with_label_values(&[""]).set(0);
        self.leases.with_label_values(&[""]).set(0);
        for (tenant, sessions, leases) in models.sessions_by_tenant() {
            let tenant = tenant.as_deref().unwrap_or("");
            self.sessions
                .with_label_values(&[tenant])
                .set(i64::from(sessions));
            self.leases
                .with_label_values(&[tenant])
                .set(i64::from(leases));
        }
        self.device_total
            .set(i64::try_from(device.total_bytes).unwrap_or(i64::MAX));
        let used = device_used.unwrap_or(stats.arena_bytes);
        self.device_used
            .set(i64::try_from(used).unwrap_or(i64::MAX));
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::warn!(error = %e, "encoding metrics failed");
        }
        String::from_utf8(buf).unwrap_or_default()
    }

    /// Counts a request refused by authentication.
    pub fn auth_refused(&self, reason: &str) {
        self.auth_refusals.with_label_values(&[reason]).inc();
    }

    /// Counts a call refused for `tenant`'s `quota`.
    pub fn quota_denied(&self, tenant: &str, quota: &str) {
        self.quota_denials.with_label_values(&[tenant, quota]).inc();
    }

    /// Counts a session's end.
    pub fn session_ended(&self, reason: &str) {
        self.sessions_ended.with_label_values(&[reason]).inc();
    }
}

/// What the metrics endpoints read.
#[derive(Debug, Clone)]
pub struct MetricsState {
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The model registry (for gauges).
    pub registry: Arc<ModelRegistry>,
    /// The devices (for their memory gauges).
    pub devices: Arc<crate::devices::Devices>,
    /// Set once the start-up models are loaded.
    pub ready: Arc<std::sync::atomic::AtomicBool>,
}

async fn metrics(
    State(s): State<MetricsState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    let device = s.devices.primary();
    let used = s.devices.used_bytes(device.uuid()).await;
    s.metrics.refresh(&s.registry, device.info(), used);
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4; charset=utf-8")],
        s.metrics.encode(),
    )
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<MetricsState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "loading start-up models\n")
    }
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: MetricsState,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// Binds the metrics port.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}
