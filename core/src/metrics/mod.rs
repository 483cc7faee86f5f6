//! Prometheus metrics: one [`prometheus::Registry`] owned here (not the global default), and
//! its text exposition. [`crate::http`] serves it on `/metrics` of the metrics port.
//!
//! Counters and histograms are updated where things happen (the gRPC layer in [`grpc`], loads,
//! attaches, session ends); gauges (versions by state, arena bytes, sessions, leases, device
//! memory) are set at each scrape from the [`GaugeValues`] the caller gathers ([`gauges`]).
//! Label values are bounded: service and method names of this server only, status codes,
//! states, model names, tenant names, device UUIDs, reasons.
//!
//! A leaf: nothing here imports the registry, the tenants, the services or the app.

pub mod gauges;

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The `tenant` label of the admin (and of every caller when no tenants file is given), in
/// every family that has one.
pub const ADMIN_TENANT: &str = "admin";

pub use gauges::{ArenaBytes, DeviceMemory, GaugeValues, TenantGauges};

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
    /// Replica copies (device to device) by target device and result (`ok`, `error`).
    pub replica_copies: IntCounterVec,
    /// Replica copy duration (the copy alone), by target device.
    pub replica_copy_seconds: HistogramVec,
    /// Sessions ended, by reason.
    pub sessions_ended: IntCounterVec,
    /// Inference requests by model, tenant and gRPC status code name.
    pub inference_requests: IntCounterVec,
    /// Inference request latency, arrival to answer, by model.
    pub inference_seconds: HistogramVec,
    /// Time items waited in the queue before a batch took them, by model.
    pub inference_queue_seconds: HistogramVec,
    /// Items per batch sent to workers, by model.
    pub inference_batch_items: HistogramVec,
    /// Items queued, by model.
    pub inference_queue_items: IntGaugeVec,
    /// Inference requests outstanding (queued or in flight), by tenant.
    pub inference_outstanding: IntGaugeVec,
    /// Serve streams ended because their worker held cancelled items past the request's
    /// deadline plus the grace, by model.
    pub cancel_overruns: IntCounterVec,
    /// Serve streams, by model.
    pub serving_workers: IntGaugeVec,
    /// Open connections, by listener.
    pub connections: IntGaugeVec,
    /// Connections refused or closed by the server, by listener and reason.
    pub connections_closed: IntCounterVec,
    /// Requests refused by the authentication layer, by reason.
    auth_refusals: IntCounterVec,
    /// Calls refused for a tenant quota, by tenant and quota.
    quota_denials: IntCounterVec,
    versions: IntGaugeVec,
    arena_bytes: IntGaugeVec,
    held_by_workers: IntGaugeVec,
    models: IntGauge,
    sessions: IntGaugeVec,
    leases: IntGaugeVec,
    device_total: IntGaugeVec,
    device_info: IntGaugeVec,
    device_used: IntGaugeVec,
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
        let replica_copy_seconds = HistogramVec::new(
            HistogramOpts::new(
                "modelshare_replica_copy_duration_seconds",
                "Duration of replica copies from a version's first device, by target device.",
            )
            .buckets(vec![
                0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["device"],
        )?;
        registry.register(Box::new(replica_copy_seconds.clone()))?;
        let histogram_vec = |name: &str, help: &str, buckets: Vec<f64>| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(buckets), &["model"])?;
            registry.register(Box::new(h.clone()))?;
            Ok::<_, prometheus::Error>(h)
        };
        let inference_seconds = histogram_vec(
            "modelshare_inference_request_duration_seconds",
            "Inference request latency, from arrival to answer, by model.",
            latency_buckets(),
        )?;
        let inference_queue_seconds = histogram_vec(
            "modelshare_inference_queue_duration_seconds",
            "Time items waited in the queue before a batch took them, by model.",
            latency_buckets(),
        )?;
        let inference_batch_items = histogram_vec(
            "modelshare_inference_batch_items",
            "Items per batch sent to workers, by model.",
            vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
        )?;
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
        let held_by_workers = IntGaugeVec::new(
            Opts::new(
                "modelshare_held_by_workers_bytes",
                "Bytes of versions from before a server restart that only workers may hold now \
                 (not yet adopted back), by model and device.",
            ),
            &["model", "device"],
        )?;
        registry.register(Box::new(held_by_workers.clone()))?;
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
            connections: gauge_vec(
                "modelshare_connections",
                "Open connections, by listener (grpc_tcp, grpc_unix, http, handles).",
                &["listener"],
            )?,
            connections_closed: counter_vec(
                "modelshare_connections_closed_total",
                "Connections the server refused or closed, by listener and reason \
                 (listener_full, peer_full, handshake_timeout, idle_timeout).",
                &["listener", "reason"],
            )?,
            inference_requests: counter_vec(
                "modelshare_inference_requests_total",
                "Inference requests by model, tenant (admin: the admin) and gRPC status code.",
                &["model", "tenant", "code"],
            )?,
            inference_seconds,
            inference_queue_seconds,
            inference_batch_items,
            inference_queue_items: gauge_vec(
                "modelshare_inference_queue_items",
                "Items queued for a batch, by model.",
                &["model"],
            )?,
            inference_outstanding: gauge_vec(
                "modelshare_inference_requests_outstanding",
                "Inference requests queued or in flight, by tenant (admin: the admin).",
                &["tenant"],
            )?,
            cancel_overruns: counter_vec(
                "modelshare_inference_cancel_overruns_total",
                "Worker Serve streams ended because the worker neither answered nor acknowledged \
                 cancelled items within their deadline plus the grace, by model.",
                &["model"],
            )?,
            serving_workers: gauge_vec(
                "modelshare_serving_workers",
                "Worker Serve streams, by model.",
                &["model"],
            )?,
            attaches: counter_vec(
                "modelshare_attaches_total",
                "Attaches by result.",
                &["result"],
            )?,
            attach_seconds,
            loads: counter_vec("modelshare_loads_total", "Loads by result.", &["result"])?,
            load_seconds,
            load_bytes,
            replica_copies: counter_vec(
                "modelshare_replica_copies_total",
                "Replica copies to further devices, by target device and result.",
                &["device", "result"],
            )?,
            replica_copy_seconds,
            sessions_ended: counter_vec(
                "modelshare_sessions_ended_total",
                "Worker sessions ended, by reason.",
                &["reason"],
            )?,
            versions,
            arena_bytes,
            held_by_workers,
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
            device_total: gauge_vec(
                "modelshare_device_memory_total_bytes",
                "Memory of the device arenas live on (host: MemTotal), by device.",
                &["device"],
            )?,
            device_used: gauge_vec(
                "modelshare_device_memory_used_bytes",
                "Device memory in use as the device reports it (CUDA); arena bytes on the host backend. By device.",
                &["device"],
            )?,
            device_info: gauge_vec(
                "modelshare_device_info",
                "1 per device, labelled with how its arenas are shared with workers (handles: \
                 cuda-vmm, cuda-ipc or host).",
                &["device", "handles"],
            )?,
            registry,
        })
    }

    /// Sets every gauge to `values`. Series absent from `values` (a model that no longer holds
    /// memory, a tenant without sessions) are dropped, except the admin's sessions and leases,
    /// always shown (0 when none).
    pub fn refresh(&self, values: &GaugeValues) {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        for (state, n) in &values.versions_by_state {
            self.versions
                .with_label_values(&[*state])
                .set(i64::from(*n));
        }
        self.arena_bytes.reset();
        for a in &values.arena_bytes {
            self.arena_bytes
                .with_label_values(&[a.model.as_str(), a.device.as_str()])
                .set(clamp(a.bytes));
        }
        self.held_by_workers.reset();
        for a in &values.held_by_workers {
            self.held_by_workers
                .with_label_values(&[a.model.as_str(), a.device.as_str()])
                .set(clamp(a.bytes));
        }
        self.models.set(i64::from(values.models));
        self.sessions.reset();
        self.leases.reset();
        self.sessions.with_label_values(&[ADMIN_TENANT]).set(0);
        self.leases.with_label_values(&[ADMIN_TENANT]).set(0);
        for t in &values.tenants {
            self.sessions
                .with_label_values(&[t.tenant.as_str()])
                .set(i64::from(t.sessions));
            self.leases
                .with_label_values(&[t.tenant.as_str()])
                .set(i64::from(t.leases));
        }
        self.device_info.reset();
        for d in &values.devices {
            self.device_info
                .with_label_values(&[d.device.as_str(), d.handles])
                .set(1);
        }
        self.device_total.reset();
        self.device_used.reset();
        for d in &values.devices {
            self.device_total
                .with_label_values(&[d.device.as_str()])
                .set(clamp(d.total_bytes));
            self.device_used
                .with_label_values(&[d.device.as_str()])
                .set(clamp(d.used_bytes));
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn values(arena: &[(&str, &str, u64)], devices: &[(&str, u64, u64)]) -> GaugeValues {
        GaugeValues {
            versions_by_state: vec![("loading", 0), ("ready", 2)],
            arena_bytes: arena
                .iter()
                .map(|(model, device, bytes)| ArenaBytes {
                    model: (*model).to_owned(),
                    device: (*device).to_owned(),
                    bytes: *bytes,
                })
                .collect(),
            models: 2,
            tenants: vec![TenantGauges {
                tenant: "a".into(),
                sessions: 1,
                leases: 3,
            }],
            devices: devices
                .iter()
                .map(|(device, total, used)| DeviceMemory {
                    handles: "cuda-vmm",
                    device: (*device).to_owned(),
                    total_bytes: *total,
                    used_bytes: *used,
                })
                .collect(),
            held_by_workers: vec![ArenaBytes {
                model: "old".into(),
                device: "GPU-0".into(),
                bytes: 2048,
            }],
        }
    }

    /// A gauge would show a stale or wrong value, or a per-device gauge lack its device.
    #[test]
    fn refresh_sets_every_gauge_from_the_values() {
        let m = Metrics::new().expect("metrics");
        m.refresh(&values(
            &[("m", "GPU-1", 4096), ("n", "GPU-1", 8)],
            &[("GPU-1", 1000, 600)],
        ));
        let text = m.encode();
        for line in [
            r#"modelshare_model_versions{state="loading"} 0"#,
            r#"modelshare_model_versions{state="ready"} 2"#,
            r#"modelshare_arena_bytes{device="GPU-1",model="m"} 4096"#,
            r#"modelshare_arena_bytes{device="GPU-1",model="n"} 8"#,
            "modelshare_models 2",
            r#"modelshare_sessions{tenant="admin"} 0"#,
            r#"modelshare_sessions{tenant="a"} 1"#,
            r#"modelshare_leases{tenant="admin"} 0"#,
            r#"modelshare_leases{tenant="a"} 3"#,
            r#"modelshare_device_memory_total_bytes{device="GPU-1"} 1000"#,
            r#"modelshare_device_memory_used_bytes{device="GPU-1"} 600"#,
            r#"modelshare_held_by_workers_bytes{device="GPU-0",model="old"} 2048"#,
            r#"modelshare_device_info{device="GPU-1",handles="cuda-vmm"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing:\n{text}");
        }

        // A model that freed its memory and a device no longer reported disappear.
        m.refresh(&values(&[("m", "GPU-2", 1)], &[("GPU-2", 7, u64::MAX)]));
        let text = m.encode();
        assert!(!text.contains(r#"model="n""#), "{text}");
        assert!(!text.contains("GPU-1"), "{text}");
        let used: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix(r#"modelshare_device_memory_used_bytes{device="GPU-2"} "#))
            .and_then(|v| v.parse().ok())
            .expect("used bytes of GPU-2");
        assert!(
            used > 9.2e18,
            "values past i64 are clamped, not wrapped: {used}"
        );
    }
}
