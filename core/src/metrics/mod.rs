//! Prometheus metrics: one [`prometheus::Registry`] owned here (not the global default), and
//! its text exposition. [`crate::http`] serves it on `/metrics` of the metrics port.
//!
//! Counters and histograms are updated where things happen (the gRPC layer in [`grpc`], loads,
//! attaches, session ends); gauges (versions by state, arena bytes, sessions, leases, device
//! memory) are set at each scrape from the [`GaugeValues`] the caller gathers ([`gauges`]).
//! Label values are bounded: service and method names of this server only, status codes,
//! states, model names, tenant names, device UUIDs, reasons.
//!
//! The families are made and registered in `families`, one group at a time.
//!
//! A leaf: nothing here imports the registry, the tenants, the services or the app.

mod families;
pub mod gauges;

use prometheus::{
    Encoder, Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry,
    TextEncoder,
};

use families::{
    Distributions, Families, LoadFamilies, MemoryGauges, RequestFamilies, SessionDeviceGauges,
    StreamFamilies,
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
    /// Streamed answers: arrival to first part, by model.
    pub stream_first_part_seconds: HistogramVec,
    /// Streamed answers: time between two parts, by model.
    pub stream_part_interval_seconds: HistogramVec,
    /// Parts of streamed answers forwarded, by model and tenant.
    pub stream_parts: IntCounterVec,
    /// Tokens generated, by model and tenant.
    pub generated_tokens: IntCounterVec,
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

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Result<Self, prometheus::Error> {
        let registry = Registry::new();
        let families = Families(&registry);
        let distributions = Distributions::register(&families)?;
        let memory = MemoryGauges::register(&families)?;
        let requests = RequestFamilies::register(&families)?;
        let streams = StreamFamilies::register(&families)?;
        let loads = LoadFamilies::register(&families)?;
        let gauges = SessionDeviceGauges::register(&families)?;
        Ok(Self {
            auth_refusals: requests.auth_refusals,
            quota_denials: requests.quota_denials,
            grpc_requests: requests.grpc_requests,
            grpc_seconds: distributions.grpc_seconds,
            connections: requests.connections,
            connections_closed: requests.connections_closed,
            inference_requests: requests.inference_requests,
            inference_seconds: distributions.inference_seconds,
            inference_queue_seconds: distributions.inference_queue_seconds,
            inference_batch_items: distributions.inference_batch_items,
            inference_queue_items: requests.inference_queue_items,
            inference_outstanding: requests.inference_outstanding,
            cancel_overruns: requests.cancel_overruns,
            serving_workers: requests.serving_workers,
            stream_first_part_seconds: streams.first_part_seconds,
            stream_part_interval_seconds: streams.part_interval_seconds,
            stream_parts: streams.parts,
            generated_tokens: streams.generated_tokens,
            attaches: loads.attaches,
            attach_seconds: distributions.attach_seconds,
            loads: loads.loads,
            load_seconds: distributions.load_seconds,
            load_bytes: distributions.load_bytes,
            replica_copies: loads.replica_copies,
            replica_copy_seconds: distributions.replica_copy_seconds,
            sessions_ended: loads.sessions_ended,
            versions: memory.versions,
            arena_bytes: memory.arena_bytes,
            held_by_workers: memory.held_by_workers,
            models: gauges.models,
            sessions: gauges.sessions,
            leases: gauges.leases,
            device_total: gauges.device_total,
            device_used: gauges.device_used,
            device_info: gauges.device_info,
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
