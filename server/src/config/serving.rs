//! The request path's settings: the `[serving]` table of the file and its flags.
//!
//! ```toml
//! [serving]
//! max_queue_items = 4096        # items queued per model
//! max_tenant_requests = 256     # inference requests a tenant may have outstanding (quota
//!                               # `requests` in the tenants file overrides it per tenant)
//! max_queue_delay_us = 1000     # how long a batch may wait to fill while its worker is busy
//! no_worker_wait_ms = 5000      # how long a request waits for a worker to serve its model
//! max_request_secs = 60         # the longest deadline a request may have (and the default)
//! max_request_bytes = 67108864  # the largest HTTP request body
//! max_body_bytes_in_flight = 268435456  # HTTP request bodies being received at once, over
//!                               # all connections (default 4 x max_request_bytes; one
//!                               # connection may hold at most 2 x max_request_bytes of them)
//! request_body_timeout_ms = 30000  # how long an HTTP request's body may take to arrive
//! cancel_grace_ms = 5000        # how long past a cancelled request's deadline its workers
//!                               # may take to answer it; it counts in its tenant's share
//!                               # until then, and a worker still holding it is ended
//! stream_idle_secs = 60         # a streamed answer (text generation): the longest wait for
//!                               # its next part once one came (the deadline bounds the first)
//! max_stream_secs = 3600        # the longest a streamed answer may last
//! gpu_sharing = "auto"          # the workers of one GPU: "auto" (measured: side by side or
//!                               # taking turns, whichever completes more), "side-by-side"
//!                               # (each its own credits) or "turns" (one worker's credits
//!                               # on the GPU at once)
//! [serving.queue_delay_us]      # per model
//! my-encoder = 0
//! ```

use std::collections::HashMap;
use std::time::Duration;

use modelshare_serving::GpuSharing;
use serde::Deserialize;

/// The `[serving]` table, as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileServing {
    pub(super) max_queue_items: Option<usize>,
    pub(super) max_tenant_requests: Option<usize>,
    pub(super) max_queue_delay_us: Option<u64>,
    pub(super) no_worker_wait_ms: Option<u64>,
    pub(super) max_request_secs: Option<u64>,
    pub(super) max_request_bytes: Option<usize>,
    pub(super) max_body_bytes_in_flight: Option<usize>,
    pub(super) request_body_timeout_ms: Option<u64>,
    pub(super) cancel_grace_ms: Option<u64>,
    pub(super) stream_idle_secs: Option<u64>,
    pub(super) max_stream_secs: Option<u64>,
    pub(super) gpu_sharing: Option<String>,
    #[serde(default)]
    pub(super) queue_delay_us: HashMap<String, u64>,
}

/// The flags that override it.
#[derive(Debug, Clone, Default)]
pub(super) struct ServingFlags {
    pub(super) max_queue_delay_us: Option<u64>,
    pub(super) no_worker_wait_ms: Option<u64>,
    pub(super) max_request_secs: Option<u64>,
}

/// The request path's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingSettings {
    /// Items queued per model.
    pub max_queue_items: usize,
    /// Inference requests a tenant may have outstanding, unless its quota says otherwise.
    pub max_tenant_requests: usize,
    /// How long a batch may wait to fill, unless the model has its own.
    pub max_queue_delay: Duration,
    /// Per-model queue delays.
    pub queue_delays: HashMap<String, Duration>,
    /// How long a request waits for a worker to serve its model.
    pub no_worker_wait: Duration,
    /// The longest (and the default) time a request may take.
    pub max_request_time: Duration,
    /// The largest HTTP request body, in bytes.
    pub max_request_bytes: usize,
    /// HTTP request-body bytes being received at once, over all connections.
    pub max_body_bytes_in_flight: usize,
    /// How long an HTTP request's body may take to arrive, from the request's start.
    pub request_body_timeout: Duration,
    /// How long past a cancelled request's deadline its workers may take to answer it.
    pub cancel_grace: Duration,
    /// A streamed answer's longest wait for its next part, once one came.
    pub stream_idle: Duration,
    /// The longest a streamed answer may last.
    pub max_stream_time: Duration,
    /// How the workers of one GPU share it.
    pub gpu_sharing: GpuSharing,
}

impl ServingSettings {
    /// HTTP request-body bytes one connection may be receiving at once (an HTTP/2
    /// connection carries many requests): two whole bodies.
    pub fn max_body_bytes_per_connection(&self) -> usize {
        self.max_request_bytes.saturating_mul(2)
    }
}

impl Default for ServingSettings {
    fn default() -> Self {
        Self {
            max_queue_items: 4096,
            max_tenant_requests: 256,
            max_queue_delay: Duration::from_millis(1),
            queue_delays: HashMap::new(),
            no_worker_wait: Duration::from_secs(5),
            max_request_time: Duration::from_secs(60),
            max_request_bytes: 64 << 20,
            max_body_bytes_in_flight: 256 << 20,
            request_body_timeout: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(5),
            stream_idle: modelshare_serving::STREAM_IDLE,
            max_stream_time: modelshare_serving::STREAM_LONGEST,
            gpu_sharing: GpuSharing::Auto,
        }
    }
}

impl ServingSettings {
    /// Merges flags over the file over the defaults, with range checks (`Err`: what is out of
    /// range).
    pub(super) fn merge(flags: ServingFlags, file: FileServing) -> Result<Self, String> {
        let d = Self::default();
        let invalid = |m: String| Err(m);
        let max_queue_items = file.max_queue_items.unwrap_or(d.max_queue_items);
        if !(1..=1 << 20).contains(&max_queue_items) {
            return invalid(format!(
                "serving.max_queue_items must be between 1 and {}, got {max_queue_items}",
                1 << 20
            ));
        }
        let max_tenant_requests = file.max_tenant_requests.unwrap_or(d.max_tenant_requests);
        if max_tenant_requests == 0 {
            return invalid("serving.max_tenant_requests must be at least 1".into());
        }
        const MAX_DELAY_US: u64 = 10_000_000;
        let delay_us = flags
            .max_queue_delay_us
            .or(file.max_queue_delay_us)
            .unwrap_or(1000);
        if delay_us > MAX_DELAY_US {
            return invalid(format!(
                "max_queue_delay_us must be at most {MAX_DELAY_US}, got {delay_us}"
            ));
        }
        let mut queue_delays = HashMap::new();
        for (model, us) in file.queue_delay_us {
            if us > MAX_DELAY_US {
                return invalid(format!(
                    "serving.queue_delay_us.{model} must be at most {MAX_DELAY_US}, got {us}"
                ));
            }
            queue_delays.insert(model, Duration::from_micros(us));
        }
        let wait_ms = flags
            .no_worker_wait_ms
            .or(file.no_worker_wait_ms)
            .unwrap_or(5000);
        let request_secs = flags
            .max_request_secs
            .or(file.max_request_secs)
            .unwrap_or(60);
        if !(1..=86_400).contains(&request_secs) {
            return invalid(format!(
                "max_request_secs must be between 1 and 86400, got {request_secs}"
            ));
        }
        let max_request_bytes = file.max_request_bytes.unwrap_or(d.max_request_bytes);
        if !(1024..=1 << 30).contains(&max_request_bytes) {
            return invalid(format!(
                "serving.max_request_bytes must be between 1024 and {}, got {max_request_bytes}",
                1 << 30
            ));
        }
        let max_body_bytes_in_flight = file
            .max_body_bytes_in_flight
            .unwrap_or(max_request_bytes.saturating_mul(4));
        if max_body_bytes_in_flight < max_request_bytes {
            return invalid(format!(
                "serving.max_body_bytes_in_flight ({max_body_bytes_in_flight}) must be at least max_request_bytes ({max_request_bytes})"
            ));
        }
        let body_ms = file.request_body_timeout_ms.unwrap_or(30_000);
        if !(1..=3_600_000).contains(&body_ms) {
            return invalid(format!(
                "serving.request_body_timeout_ms must be between 1 and 3600000, got {body_ms}"
            ));
        }
        let grace_ms = file.cancel_grace_ms.unwrap_or(5000);
        if grace_ms > 3_600_000 {
            return invalid(format!(
                "serving.cancel_grace_ms must be at most 3600000, got {grace_ms}"
            ));
        }
        let idle_secs = file.stream_idle_secs.unwrap_or(d.stream_idle.as_secs());
        let stream_secs = file.max_stream_secs.unwrap_or(d.max_stream_time.as_secs());
        if !(1..=86_400).contains(&idle_secs) || !(1..=86_400).contains(&stream_secs) {
            return invalid(format!(
                "serving.stream_idle_secs and serving.max_stream_secs must be between 1 and 86400, got {idle_secs} and {stream_secs}"
            ));
        }
        let gpu_sharing = match file.gpu_sharing.as_deref() {
            None | Some("auto") => GpuSharing::Auto,
            Some("side-by-side") => GpuSharing::SideBySide,
            Some("turns") => GpuSharing::Turns,
            Some(other) => {
                return invalid(format!(
                    "serving.gpu_sharing must be \"auto\", \"side-by-side\" or \"turns\", got {other:?}"
                ));
            }
        };
        Ok(Self {
            gpu_sharing,
            stream_idle: Duration::from_secs(idle_secs),
            max_stream_time: Duration::from_secs(stream_secs),
            cancel_grace: Duration::from_millis(grace_ms),
            max_body_bytes_in_flight,
            request_body_timeout: Duration::from_millis(body_ms),
            max_queue_items,
            max_tenant_requests,
            max_queue_delay: Duration::from_micros(delay_us),
            queue_delays,
            no_worker_wait: Duration::from_millis(wait_ms),
            max_request_time: Duration::from_secs(request_secs),
            max_request_bytes,
        })
    }
}
