//! Making and registering the metric families: [`Families`] registers each family as it is
//! made, and each group below makes one part of [`super::Metrics`]. [`super::Metrics::new`]
//! calls the groups in this order, which is the order the families are registered in:
//! [`Distributions`], [`MemoryGauges`], [`RequestFamilies`], [`StreamFamilies`],
//! [`LoadFamilies`], [`SessionDeviceGauges`].

use prometheus::core::Collector;
use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

type Result<T> = std::result::Result<T, prometheus::Error>;

fn latency_buckets() -> Vec<f64> {
    vec![
        0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        5.0, 10.0,
    ]
}

/// Makes metric families and registers each in one registry as it is made.
pub(super) struct Families<'a>(pub(super) &'a Registry);

impl Families<'_> {
    /// Registers `family` (a clone of it: families share their state) and gives it back.
    fn register<C: Collector + Clone + 'static>(&self, family: C) -> Result<C> {
        self.0.register(Box::new(family.clone()))?;
        Ok(family)
    }

    fn counter(&self, name: &str, help: &str) -> Result<IntCounter> {
        self.register(IntCounter::new(name, help)?)
    }

    fn counter_vec(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntCounterVec> {
        self.register(IntCounterVec::new(Opts::new(name, help), labels)?)
    }

    fn gauge(&self, name: &str, help: &str) -> Result<IntGauge> {
        self.register(IntGauge::new(name, help)?)
    }

    fn gauge_vec(&self, name: &str, help: &str, labels: &[&str]) -> Result<IntGaugeVec> {
        self.register(IntGaugeVec::new(Opts::new(name, help), labels)?)
    }

    fn histogram(&self, name: &str, help: &str, buckets: Vec<f64>) -> Result<Histogram> {
        self.register(Histogram::with_opts(
            HistogramOpts::new(name, help).buckets(buckets),
        )?)
    }

    fn histogram_vec(
        &self,
        name: &str,
        help: &str,
        buckets: Vec<f64>,
        labels: &[&str],
    ) -> Result<HistogramVec> {
        self.register(HistogramVec::new(
            HistogramOpts::new(name, help).buckets(buckets),
            labels,
        )?)
    }
}

/// Streamed answers: time to the first part and between parts (time to first token and
/// inter-token latency when a part is a token), parts forwarded, tokens generated.
pub(super) struct StreamFamilies {
    pub(super) first_part_seconds: HistogramVec,
    pub(super) part_interval_seconds: HistogramVec,
    pub(super) parts: IntCounterVec,
    pub(super) generated_tokens: IntCounterVec,
}

impl StreamFamilies {
    pub(super) fn register(f: &Families<'_>) -> Result<Self> {
        Ok(Self {
            first_part_seconds: f.histogram_vec(
                "modelshare_stream_first_part_seconds",
                "Streamed answers: time from the request's arrival to its first part (time to first token), by model.",
                latency_buckets(),
                &["model"],
            )?,
            part_interval_seconds: f.histogram_vec(
                "modelshare_stream_part_interval_seconds",
                "Streamed answers: time between two parts of one answer (inter-token latency), by model.",
                latency_buckets(),
                &["model"],
            )?,
            parts: f.counter_vec(
                "modelshare_stream_parts_total",
                "Parts of streamed answers forwarded to their callers, by model and tenant.",
                &["model", "tenant"],
            )?,
            generated_tokens: f.counter_vec(
                "modelshare_generated_tokens_total",
                "Tokens generated (the workers' completion_tokens) by model and tenant.",
                &["model", "tenant"],
            )?,
        })
    }
}

/// The histograms (request, attach, load, replica copy and inference durations, batch sizes),
/// and the count of bytes loaded beside the load duration.
pub(super) struct Distributions {
    pub(super) grpc_seconds: HistogramVec,
    pub(super) attach_seconds: Histogram,
    pub(super) load_seconds: Histogram,
    pub(super) load_bytes: IntCounter,
    pub(super) replica_copy_seconds: HistogramVec,
    pub(super) inference_seconds: HistogramVec,
    pub(super) inference_queue_seconds: HistogramVec,
    pub(super) inference_batch_items: HistogramVec,
}

impl Distributions {
    pub(super) fn register(f: &Families<'_>) -> Result<Self> {
        Ok(Self {
            grpc_seconds: f.histogram_vec(
                "modelshare_grpc_request_duration_seconds",
                "gRPC request latency to the response head, by service, method and status code.",
                latency_buckets(),
                &["service", "method", "code"],
            )?,
            attach_seconds: f.histogram(
                "modelshare_attach_duration_seconds",
                "Server-side latency of successful attaches (lease, export, ticket).",
                latency_buckets(),
            )?,
            load_seconds: f.histogram(
                "modelshare_load_duration_seconds",
                "Duration of successful loads (copy, checksums, seal).",
                vec![
                    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
                ],
            )?,
            load_bytes: f.counter(
                "modelshare_load_bytes_total",
                "Bytes copied into arenas by loads.",
            )?,
            replica_copy_seconds: f.histogram_vec(
                "modelshare_replica_copy_duration_seconds",
                "Duration of replica copies from a version's first device, by target device.",
                vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                ],
                &["device"],
            )?,
            inference_seconds: f.histogram_vec(
                "modelshare_inference_request_duration_seconds",
                "Inference request latency, from arrival to answer, by model.",
                latency_buckets(),
                &["model"],
            )?,
            inference_queue_seconds: f.histogram_vec(
                "modelshare_inference_queue_duration_seconds",
                "Time items waited in the queue before a batch took them, by model.",
                latency_buckets(),
                &["model"],
            )?,
            inference_batch_items: f.histogram_vec(
                "modelshare_inference_batch_items",
                "Items per batch sent to workers, by model.",
                vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0],
                &["model"],
            )?,
        })
    }
}

/// The gauges of what memory holds: versions by state, arena bytes, bytes only workers hold.
pub(super) struct MemoryGauges {
    pub(super) versions: IntGaugeVec,
    pub(super) arena_bytes: IntGaugeVec,
    pub(super) held_by_workers: IntGaugeVec,
}

impl MemoryGauges {
    pub(super) fn register(f: &Families<'_>) -> Result<Self> {
        Ok(Self {
            versions: f.gauge_vec(
                "modelshare_model_versions",
                "Model versions by state.",
                &["state"],
            )?,
            arena_bytes: f.gauge_vec(
                "modelshare_arena_bytes",
                "Bytes held by arenas, by model and device.",
                &["model", "device"],
            )?,
            held_by_workers: f.gauge_vec(
                "modelshare_held_by_workers_bytes",
                "Bytes of versions from before a server restart that only workers may hold now \
                 (not yet adopted back), by model and device.",
                &["model", "device"],
            )?,
        })
    }
}

/// The request path's counters and gauges: refusals (authentication, quotas), gRPC requests,
/// connections, inference requests and queues, serve streams.
pub(super) struct RequestFamilies {
    pub(super) auth_refusals: IntCounterVec,
    pub(super) quota_denials: IntCounterVec,
    pub(super) grpc_requests: IntCounterVec,
    pub(super) connections: IntGaugeVec,
    pub(super) connections_closed: IntCounterVec,
    pub(super) inference_requests: IntCounterVec,
    pub(super) inference_queue_items: IntGaugeVec,
    pub(super) inference_outstanding: IntGaugeVec,
    pub(super) cancel_overruns: IntCounterVec,
    pub(super) serving_workers: IntGaugeVec,
}

impl RequestFamilies {
    pub(super) fn register(f: &Families<'_>) -> Result<Self> {
        Ok(Self {
            auth_refusals: f.counter_vec(
                "modelshare_auth_refusals_total",
                "Requests refused by authentication, by reason (missing, malformed, unknown_token, uid).",
                &["reason"],
            )?,
            quota_denials: f.counter_vec(
                "modelshare_quota_denials_total",
                "Calls refused for a tenant quota, by tenant and quota.",
                &["tenant", "quota"],
            )?,
            grpc_requests: f.counter_vec(
                "modelshare_grpc_requests_total",
                "gRPC requests by service, method and status code.",
                &["service", "method", "code"],
            )?,
            connections: f.gauge_vec(
                "modelshare_connections",
                "Open connections, by listener (grpc_tcp, grpc_unix, http, handles).",
                &["listener"],
            )?,
            connections_closed: f.counter_vec(
                "modelshare_connections_closed_total",
                "Connections the server refused or closed, by listener and reason \
                 (listener_full, peer_full, handshake_timeout, idle_timeout).",
                &["listener", "reason"],
            )?,
            inference_requests: f.counter_vec(
                "modelshare_inference_requests_total",
                "Inference requests by model, tenant (admin: the admin) and gRPC status code.",
                &["model", "tenant", "code"],
            )?,
            inference_queue_items: f.gauge_vec(
                "modelshare_inference_queue_items",
                "Items queued for a batch, by model.",
                &["model"],
            )?,
            inference_outstanding: f.gauge_vec(
                "modelshare_inference_requests_outstanding",
                "Inference requests queued or in flight, by tenant (admin: the admin).",
                &["tenant"],
            )?,
            cancel_overruns: f.counter_vec(
                "modelshare_inference_cancel_overruns_total",
                "Worker Serve streams ended because the worker neither answered nor acknowledged \
                 cancelled items within their deadline plus the grace, by model.",
                &["model"],
            )?,
            serving_workers: f.gauge_vec(
                "modelshare_serving_workers",
                "Worker Serve streams, by model.",
                &["model"],
            )?,
        })
    }
}

/// The counters of loads, attaches, replica copies and session ends, by result or reason.
pub(super) struct LoadFamilies {
    pub(super) attaches: IntCounterVec,
    pub(super) loads: IntCounterVec,
    pub(super) replica_copies: IntCounterVec,
    pub(super) sessions_ended: IntCounterVec,
}

impl LoadFamilies {
    pub(super) fn register(f: &Families<'_>) -> Result<Self> {
        Ok(Self {
            attaches: f.counter_vec(
                "modelshare_attaches_total",
                "Attaches by result.",
                &["result"],
            )?,
            loads: f.counter_vec(
                "modelshare_loads_total",
                "Loads by result: ok, error, adopted (memory a worker kept across a restart), shared (memory of a version holding the same bytes).",
                &["result"],
            )?,
            replica_copies: f.counter_vec(
                "modelshare_replica_copies_total",
                "Replica copies to further devices, by target device and result.",
                &["device", "result"],
            )?,
            sessions_ended: f.counter_vec(
                "modelshare_sessions_ended_total",
                "Worker sessions ended, by reason.",
                &["reason"],
            )?,
        })
    }
}

/// The gauges of models, sessions and leases by tenant, and devices (memory, handle kind).
pub(super) struct SessionDeviceGauges {
    pub(super) models: IntGauge,
    pub(super) sessions: IntGaugeVec,
    pub(super) leases: IntGaugeVec,
    pub(super) device_total: IntGaugeVec,
    pub(super) device_used: IntGaugeVec,
    pub(super) device_info: IntGaugeVec,
}

impl SessionDeviceGauges {
    pub(super) fn register(f: &Families<'_>) -> Result<Self> {
        Ok(Self {
            models: f.gauge("modelshare_models", "Model names on record.")?,
            sessions: f.gauge_vec(
                "modelshare_sessions",
                "Open worker sessions, by tenant (empty: admin, or no tenants configured).",
                &["tenant"],
            )?,
            leases: f.gauge_vec(
                "modelshare_leases",
                "Leases held, by tenant (empty: admin, or no tenants configured).",
                &["tenant"],
            )?,
            device_total: f.gauge_vec(
                "modelshare_device_memory_total_bytes",
                "Memory of the device arenas live on (host: MemTotal), by device.",
                &["device"],
            )?,
            device_used: f.gauge_vec(
                "modelshare_device_memory_used_bytes",
                "Device memory in use as the device reports it (CUDA); arena bytes on the host backend. By device.",
                &["device"],
            )?,
            device_info: f.gauge_vec(
                "modelshare_device_info",
                "1 per device, labelled with how its arenas are shared with workers (handles: \
                 cuda-vmm, cuda-ipc or host).",
                &["device", "handles"],
            )?,
        })
    }
}
