//! The flags of `modelshare serve`, each with its `MODELSHARE_*` variable (clap derive).

use std::net::SocketAddr;
use std::path::PathBuf;

use super::settings::{
    BackendChoice, ClientAuth, CudaHandles, ShareIdentical, StartupModel, parse_mode,
};
use crate::telemetry::LogFormat;

/// Flags (and variables) of `modelshare serve`. Every field is optional so that the file and
/// the defaults can fill what is not given.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short = 'c', env = "MODELSHARE_CONFIG")]
    pub config: Option<PathBuf>,
    /// TCP address for gRPC. Without a tenants file it needs --unauthenticated-tcp (anyone who
    /// reaches the port is the admin). Default: 127.0.0.1:50051 with a tenants file and no Unix
    /// socket; none without a tenants file (the Unix socket below serves).
    #[arg(long, env = "MODELSHARE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Unix socket path for gRPC. Default, when no tenants file and no --listen is given:
    /// /tmp/modelshare-<uid>.sock, mode 0600 (only this user and root can call).
    #[arg(long, env = "MODELSHARE_UNIX_SOCKET")]
    pub unix_socket: Option<PathBuf>,
    /// Serve gRPC over TCP without a tenants file, where every caller who reaches the port is
    /// the admin (a container publishing the port on its host's loopback, a test).
    /// `--unauthenticated-tcp` alone is true; `=false` (or the variable `false`) turns a file's
    /// `true` off.
    #[arg(long, env = "MODELSHARE_UNAUTHENTICATED_TCP", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub unauthenticated_tcp: Option<bool>,
    /// Unix socket that passes arena file descriptors to workers.
    #[arg(long, env = "MODELSHARE_HANDLE_SOCKET")]
    pub handle_socket: Option<PathBuf>,
    /// Directory under which every model path is resolved.
    #[arg(long, env = "MODELSHARE_MODEL_ROOT")]
    pub model_root: Option<PathBuf>,
    /// Backend for arenas.
    #[arg(long, value_enum, env = "MODELSHARE_BACKEND")]
    pub backend: Option<BackendChoice>,
    /// Model to load at start-up, as NAME=PATH (repeatable; comma-separated in the variable).
    #[arg(
        long = "model",
        value_name = "NAME=PATH",
        env = "MODELSHARE_MODELS",
        value_delimiter = ','
    )]
    pub models: Vec<StartupModel>,
    /// Log format.
    #[arg(long, value_enum, env = "MODELSHARE_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Address of the inference port (HTTP): the OIP REST routes (`/v2/...`), the OpenAI routes
    /// (`/v1/embeddings`, `/v1/models`) and the name-free probes `/healthz`, `/readyz`; off
    /// when unset. Beyond loopback only with a tenants file or --unauthenticated-tcp.
    #[arg(long, env = "MODELSHARE_HTTP_LISTEN")]
    pub http_listen: Option<SocketAddr>,
    /// Address of the operators' port (HTTP): `/metrics` for Prometheus, `/healthz`, and
    /// `/readyz` with each model's serving workers; off when unset (e.g. 127.0.0.1:9401, or the
    /// pod's address for Prometheus to scrape). No token is asked there: keep it where only
    /// operators and Prometheus reach.
    #[arg(long, env = "MODELSHARE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// How long a batch may wait to fill while its worker computes another, in microseconds
    /// (per model in the file's `[serving.queue_delay_us]`); default 1000. An idle worker takes
    /// what is queued at once.
    #[arg(long, env = "MODELSHARE_MAX_QUEUE_DELAY_US")]
    pub max_queue_delay_us: Option<u64>,
    /// How long a request waits for a worker to serve its model, in milliseconds; default 5000.
    #[arg(long, env = "MODELSHARE_NO_WORKER_WAIT_MS")]
    pub no_worker_wait_ms: Option<u64>,
    /// The longest time an inference request may take (and the default when the client gives
    /// no timeout), in seconds; default 60.
    #[arg(long, env = "MODELSHARE_MAX_REQUEST_SECS")]
    pub max_request_secs: Option<u64>,
    /// Seconds to let requests finish after SIGTERM before closing them.
    #[arg(long, env = "MODELSHARE_SHUTDOWN_GRACE_SECS")]
    pub shutdown_grace_secs: Option<u64>,
    /// How often workers must heartbeat, in milliseconds.
    #[arg(long, env = "MODELSHARE_HEARTBEAT_INTERVAL_MS")]
    pub heartbeat_interval_ms: Option<u32>,
    /// Missed heartbeats after which a session is ended.
    #[arg(long, env = "MODELSHARE_HEARTBEAT_MISSES")]
    pub heartbeat_misses: Option<u32>,
    /// Loads allowed to run at once.
    #[arg(long, env = "MODELSHARE_MAX_CONCURRENT_LOADS")]
    pub max_concurrent_loads: Option<usize>,
    /// How CUDA arenas are shared with workers: `vmm` (file descriptors over the handle
    /// socket; workers' mappings are read-only), `legacy` (CUDA IPC handles; workers'
    /// mappings are writable), or `auto` (vmm where the device supports it).
    #[arg(long, value_enum, env = "MODELSHARE_CUDA_HANDLES")]
    pub cuda_handles: Option<CudaHandles>,
    /// After a restart, how long to wait for workers to offer the memory of the versions the
    /// server had (VMM and host arenas outlive it) before loading those from their files, in
    /// milliseconds; default 10000, 0 turns adoption off.
    #[arg(long, env = "MODELSHARE_ADOPT_WAIT_MS")]
    pub adopt_wait_ms: Option<u64>,
    /// The devices this server serves: `all` (default), or a comma-separated list of CUDA
    /// ordinals and UUIDs (`0,1`, `GPU-…`). One device thread, staging buffers and memory
    /// limit each. (`--device` is the old name.)
    #[arg(long, alias = "device", env = "MODELSHARE_DEVICES")]
    pub devices: Option<String>,
    /// Host memory standing in for this many devices (`host`, `host-1`, …) with the host
    /// backend: placement and replicas run without a GPU (tests, demos). Default 1.
    #[arg(long, env = "MODELSHARE_HOST_DEVICES")]
    pub host_devices: Option<usize>,
    /// Where host memory figures are read: `<root>/proc/meminfo`, `<root>/proc/self/cgroup` and
    /// the cgroup tree under `<root>/sys/fs/cgroup` (v1 or v2). Default `/`; another root is
    /// for tests (a fake tree) or for a host's `/proc` and `/sys` mounted elsewhere.
    #[arg(long, env = "MODELSHARE_PROC_ROOT")]
    pub proc_root: Option<PathBuf>,
    /// Threads one load reads and copies with (default: seven eighths of the cores, at least 1
    /// and at most 32).
    #[arg(long, env = "MODELSHARE_LOAD_THREADS")]
    pub load_threads: Option<usize>,
    /// Also hash every byte on the CPU (XXH3) while loading to a GPU, which checksums on the
    /// device anyway (ms64): about 1.9 GB/s per load thread of CPU. Always on for host memory.
    #[arg(long, env = "MODELSHARE_LOAD_CPU_HASH", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub load_cpu_hash: Option<bool>,
    /// On a server of several devices, a worker that attaches from a device holding no copy of
    /// the version starts one there: copied device to device from the version's first arena
    /// (counted against `max_device_bytes`, `max_total_bytes` and the model owner's quota), the
    /// worker told to retry (UNAVAILABLE) meanwhile. Without it, the worker is told which
    /// devices hold the version (FAILED_PRECONDITION).
    #[arg(long, env = "MODELSHARE_REPLICATE_ON_ATTACH", num_args = 0..=1, require_equals = true, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub replicate_on_attach: Option<bool>,
    /// Which loads of bytes the server already holds take that memory instead of a copy
    /// (after comparing every byte with the files, hashed with SHA-256 on the way): `visible`
    /// (host memory: within one owner, and from a public model or one shared with the
    /// loading tenant), `any` (host memory: between any tenants, a load's duration may then
    /// tell a tenant that another holds those bytes), or `off`. GPU memory, which a hostile
    /// worker could write, is shared only between models every caller attaches alike (one
    /// owner and one access, or both public). Each owner's quota counts the full size.
    #[arg(long, value_enum, env = "MODELSHARE_SHARE_IDENTICAL")]
    pub share_identical: Option<ShareIdentical>,
    /// Largest arena one model version may have, in bytes.
    #[arg(long, env = "MODELSHARE_MAX_MODEL_BYTES")]
    pub max_model_bytes: Option<u64>,
    /// Most arena bytes held at once, in bytes.
    #[arg(long, env = "MODELSHARE_MAX_TOTAL_BYTES")]
    pub max_total_bytes: Option<u64>,
    /// Most arena bytes on any one device (each GPU's own cap; placement skips a full one).
    #[arg(long, env = "MODELSHARE_MAX_DEVICE_BYTES")]
    pub max_device_bytes: Option<u64>,
    /// Tenants file (TOML): tenants, token hashes, uids, quotas, admin tokens. Without it,
    /// authentication is off. Read again on SIGHUP.
    #[arg(long, env = "MODELSHARE_TENANTS_FILE")]
    pub tenants_file: Option<PathBuf>,
    /// Permissions of the gRPC and handle Unix sockets, in octal (e.g. 0660), so that workers
    /// of other uids can connect.
    #[arg(long, env = "MODELSHARE_UNIX_SOCKET_MODE", value_parser = parse_mode)]
    pub unix_socket_mode: Option<u32>,
    /// TLS certificate chain (PEM) of the TCP listener; with --server-tls-key turns TLS on.
    #[arg(long, env = "MODELSHARE_SERVER_TLS_CERT")]
    pub server_tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of the TCP listener.
    #[arg(long, env = "MODELSHARE_SERVER_TLS_KEY")]
    pub server_tls_key: Option<PathBuf>,
    /// CA (PEM) that signs client certificates; turns client certificates on.
    #[arg(long, env = "MODELSHARE_SERVER_TLS_CLIENT_CA")]
    pub server_tls_client_ca: Option<PathBuf>,
    /// Whether client certificates are required or optional (with a client CA).
    #[arg(long, value_enum, env = "MODELSHARE_SERVER_TLS_CLIENT_AUTH")]
    pub server_tls_client_auth: Option<ClientAuth>,
}
