//! The TOML configuration file, as written: every key optional, unknown keys refused.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

use super::settings::{BackendChoice, ClientAuth, CudaHandles, ShareIdentical, StartupModel};
use crate::telemetry::LogFormat;

/// The `[tls]` table of the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileTls {
    pub(super) cert: Option<PathBuf>,
    pub(super) key: Option<PathBuf>,
    pub(super) client_ca: Option<PathBuf>,
    pub(super) client_auth: Option<ClientAuth>,
}

/// The `[limits]` table of the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileLimits {
    pub(super) max_concurrent_loads: Option<usize>,
    pub(super) max_model_bytes: Option<u64>,
    pub(super) max_total_bytes: Option<u64>,
    pub(super) max_device_bytes: Option<u64>,
    pub(super) max_sessions: Option<usize>,
    pub(super) max_leases_per_session: Option<usize>,
    pub(super) max_tickets_per_session: Option<usize>,
    pub(super) max_tickets_per_tenant: Option<usize>,
    pub(super) max_tickets: Option<usize>,
    pub(super) max_connections: Option<usize>,
    pub(super) max_connections_per_peer: Option<usize>,
    pub(super) connection_handshake_timeout_ms: Option<u64>,
    pub(super) connection_idle_timeout_ms: Option<u64>,
    pub(super) max_header_bytes: Option<u64>,
    pub(super) max_tensors: Option<usize>,
    pub(super) max_shards: Option<usize>,
    pub(super) max_header_metadata_bytes: Option<u64>,
}

/// The TOML file, as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct FileConfig {
    pub(super) listen: Option<SocketAddr>,
    pub(super) http_listen: Option<SocketAddr>,
    /// The operators' port (`/metrics`, detailed `/readyz`).
    pub(super) metrics_listen: Option<SocketAddr>,
    pub(super) unix_socket: Option<PathBuf>,
    pub(super) handle_socket: Option<PathBuf>,
    pub(super) model_root: Option<PathBuf>,
    pub(super) backend: Option<BackendChoice>,
    pub(super) cuda_handles: Option<CudaHandles>,
    pub(super) devices: Option<super::settings::FileDevices>,
    /// The old name of `devices` (one device).
    pub(super) device: Option<String>,
    pub(super) host_devices: Option<usize>,
    pub(super) proc_root: Option<PathBuf>,
    pub(super) load_threads: Option<usize>,
    pub(super) load_cpu_hash: Option<bool>,
    pub(super) replicate_on_attach: Option<bool>,
    pub(super) share_identical: Option<ShareIdentical>,
    pub(super) log_format: Option<LogFormat>,
    pub(super) shutdown_grace_secs: Option<u64>,
    pub(super) heartbeat_interval_ms: Option<u32>,
    pub(super) heartbeat_misses: Option<u32>,
    pub(super) ticket_ttl_ms: Option<u64>,
    pub(super) adopt_wait_ms: Option<u64>,
    pub(super) tenants_file: Option<PathBuf>,
    pub(super) unauthenticated_tcp: Option<bool>,
    pub(super) unix_socket_mode: Option<String>,
    #[serde(default)]
    pub(super) tls: FileTls,
    #[serde(default)]
    pub(super) models: Vec<StartupModel>,
    #[serde(default)]
    pub(super) limits: FileLimits,
    #[serde(default)]
    pub(super) serving: super::serving::FileServing,
}
