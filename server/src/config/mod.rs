//! Configuration of `modelshare serve`: a TOML file, `MODELSHARE_*` environment variables and
//! command-line flags, merged into one typed [`Config`]. Flags win over variables (clap's rule),
//! both win over the file, the file wins over the defaults.
//!
//! # Layout
//!
//! - `args`: [`ServeArgs`], the clap flags, each with its `MODELSHARE_*` variable.
//! - `file`: the TOML file as written (unknown keys refused).
//! - `settings`: the values both give ([`BackendChoice`], [`StartupModel`], [`ClientAuth`],
//!   [`TlsSettings`]) and their parsing.
//! - here: [`Config`] and the merge of the two, with the defaults and range checks.

mod args;
mod file;
mod serving;
mod settings;
#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use self::file::FileConfig;
use self::settings::parse_mode;
use crate::telemetry::LogFormat;
use modelshare_core::registry::RegistryLimits;
use modelshare_core::weights::WeightLimits;

pub use self::args::ServeArgs;
pub use self::serving::ServingSettings;
pub use self::settings::{
    BackendChoice, ClientAuth, CudaHandles, DeviceSelection, StartupModel, TlsSettings,
};

/// The most devices host memory may stand in for (`host_devices`).
pub const MAX_HOST_DEVICES: usize = 16;

/// Why the configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("config file {path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("{0}")]
    Invalid(String),
}

/// The whole configuration of a server, passed around as one value.
#[derive(Debug, Clone)]
pub struct Config {
    /// TCP address for gRPC.
    pub listen: Option<SocketAddr>,
    /// Unix socket for gRPC.
    pub unix_socket: Option<PathBuf>,
    /// HTTP address: metrics, probes, and the OIP and OpenAI REST routes.
    pub http_listen: Option<SocketAddr>,
    /// Handle socket for fd passing.
    pub handle_socket: PathBuf,
    /// Model repository root.
    pub model_root: PathBuf,
    /// Backend choice.
    pub backend: BackendChoice,
    /// How CUDA arenas are shared with workers.
    pub cuda_handles: CudaHandles,
    /// Most arena bytes on one device.
    pub max_device_bytes: Option<u64>,
    /// The devices served.
    pub devices: DeviceSelection,
    /// Host memory standing in for this many devices (host backend).
    pub host_devices: usize,
    /// The root host memory figures are read under (`/`; see
    /// [`modelshare_device::host_memory`]).
    pub proc_root: PathBuf,
    /// Threads per load.
    pub load_threads: usize,
    /// Hash every loaded byte on the CPU (XXH3) even where the device checksums (ms64).
    pub load_cpu_hash: bool,
    /// A worker attaching from a device without a copy of the version starts one there.
    pub replicate_on_attach: bool,
    /// Start-up models.
    pub models: Vec<StartupModel>,
    /// Log format.
    pub log_format: LogFormat,
    /// Grace period for in-flight requests at shutdown.
    pub shutdown_grace: Duration,
    /// Heartbeat interval announced to workers.
    pub heartbeat_interval: Duration,
    /// Missed heartbeats that end a session.
    pub heartbeat_misses: u32,
    /// How long an fd-passing ticket stays valid.
    pub ticket_ttl: Duration,
    /// How long, after a restart, the server waits for workers to offer the memory of the
    /// versions it had (VMM and host arenas outlive it) before loading them from the files.
    pub adopt_wait: Duration,
    /// Loads allowed at once.
    pub max_concurrent_loads: usize,
    /// Registry limits.
    pub registry: RegistryLimits,
    /// Caps and timeouts of each listener's connections.
    pub connections: crate::connections::ConnLimits,
    /// Limits on weight files.
    pub weights: WeightLimits,
    /// Tenants file (none: authentication off).
    pub tenants_file: Option<PathBuf>,
    /// Mode of the Unix sockets (none: as the umask leaves it).
    pub unix_socket_mode: Option<u32>,
    /// TLS of the TCP listener.
    pub tls: Option<TlsSettings>,
    /// The request path.
    pub serving: ServingSettings,
}

impl Config {
    /// What opens the devices.
    pub fn device_config(&self) -> modelshare_core::devices::DeviceConfig {
        modelshare_core::devices::DeviceConfig {
            backend: self.backend,
            devices: self.devices.clone(),
            cuda_handles: self.cuda_handles,
            host_devices: self.host_devices,
            proc_root: self.proc_root.clone(),
            load_threads: self.load_threads,
        }
    }

    /// Builds the configuration from flags (and variables) and the file they name.
    pub fn from_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Self::merge(args, file)
    }

    fn merge(args: ServeArgs, file: FileConfig) -> Result<Self, ConfigError> {
        let tenants_file = args.tenants_file.clone().or(file.tenants_file.clone());
        let unauthenticated_tcp =
            args.unauthenticated_tcp || file.unauthenticated_tcp.unwrap_or(false);
        let listen_given = args.listen.or(file.listen);
        let unix_given = args.unix_socket.or(file.unix_socket);
        // Without tenants, gRPC defaults to a Unix socket only this user can reach; with
        // tenants (tokens), to TCP on loopback.
        let default_unix = listen_given.is_none() && unix_given.is_none() && tenants_file.is_none();
        let unix_socket = if default_unix {
            Some(default_unix_socket())
        } else {
            unix_given
        };
        let listen = listen_given.or_else(|| {
            unix_socket
                .is_none()
                .then(|| SocketAddr::from(([127, 0, 0, 1], 50051)))
        });
        if let Some(addr) = listen
            && tenants_file.is_none()
            && !unauthenticated_tcp
        {
            return Err(ConfigError::Invalid(format!(
                "gRPC over TCP ({addr}) without a tenants file would make anyone who reaches the \
                 port the admin: give --tenants-file, serve on --unix-socket only, or pass \
                 --unauthenticated-tcp (unauthenticated_tcp = true) to accept that"
            )));
        }
        let handle_socket = args
            .handle_socket
            .or(file.handle_socket)
            .unwrap_or_else(|| {
                if default_unix {
                    std::env::temp_dir().join(format!("modelshare-{}-handles.sock", current_uid()))
                } else {
                    default_handle_socket(unix_socket.as_deref())
                }
            });
        let model_root = args
            .model_root
            .or(file.model_root)
            .unwrap_or_else(|| PathBuf::from("."));
        let models = if args.models.is_empty() {
            file.models
        } else {
            args.models
        };
        let heartbeat_interval_ms = args
            .heartbeat_interval_ms
            .or(file.heartbeat_interval_ms)
            .unwrap_or(1000);
        if !(10..=600_000).contains(&heartbeat_interval_ms) {
            return Err(ConfigError::Invalid(format!(
                "heartbeat_interval_ms must be between 10 and 600000, got {heartbeat_interval_ms}"
            )));
        }
        let heartbeat_misses = args.heartbeat_misses.or(file.heartbeat_misses).unwrap_or(3);
        if heartbeat_misses == 0 {
            return Err(ConfigError::Invalid(
                "heartbeat_misses must be at least 1".into(),
            ));
        }
        let limits = file.limits;
        let max_concurrent_loads = args
            .max_concurrent_loads
            .or(limits.max_concurrent_loads)
            .unwrap_or(4);
        if max_concurrent_loads == 0 {
            return Err(ConfigError::Invalid(
                "max_concurrent_loads must be at least 1".into(),
            ));
        }
        let unix_socket_mode = match args.unix_socket_mode {
            Some(m) => Some(m),
            None => file
                .unix_socket_mode
                .as_deref()
                .map(parse_mode)
                .transpose()
                .map_err(|e| ConfigError::Invalid(format!("unix_socket_mode: {e}")))?,
        };
        // The default socket of a server without tenants: this user (and root) only.
        let unix_socket_mode = unix_socket_mode.or(default_unix.then_some(0o600));
        let tls = match (
            args.server_tls_cert.or(file.tls.cert),
            args.server_tls_key.or(file.tls.key),
        ) {
            (Some(cert), Some(key)) => {
                let client_ca = args.server_tls_client_ca.or(file.tls.client_ca);
                let client_auth = args.server_tls_client_auth.or(file.tls.client_auth);
                if client_auth.is_some() && client_ca.is_none() {
                    return Err(ConfigError::Invalid(
                        "client_auth needs a client CA (server_tls_client_ca, or [tls] client_ca) to check client certificates against".into(),
                    ));
                }
                Some(TlsSettings {
                    cert,
                    key,
                    client_ca,
                    client_auth: client_auth.unwrap_or_default(),
                })
            }
            (None, None) => None,
            _ => {
                return Err(ConfigError::Invalid(
                    "TLS needs both a certificate and a key (server_tls_cert and server_tls_key, or [tls] cert and key)".into(),
                ));
            }
        };
        if tls.is_some() && listen.is_none() {
            return Err(ConfigError::Invalid(
                "TLS is for the TCP listener, and none is configured (--listen)".into(),
            ));
        }
        for (key, value) in [
            ("max_connections", limits.max_connections.map(|v| v as u64)),
            (
                "max_connections_per_peer",
                limits.max_connections_per_peer.map(|v| v as u64),
            ),
            (
                "connection_handshake_timeout_ms",
                limits.connection_handshake_timeout_ms,
            ),
            (
                "connection_idle_timeout_ms",
                limits.connection_idle_timeout_ms,
            ),
        ] {
            if value == Some(0) {
                return Err(ConfigError::Invalid(format!(
                    "[limits] {key} must be at least 1"
                )));
            }
        }
        let serving = ServingSettings::merge(
            serving::ServingFlags {
                max_queue_delay_us: args.max_queue_delay_us,
                no_worker_wait_ms: args.no_worker_wait_ms,
                max_request_secs: args.max_request_secs,
            },
            file.serving,
        )
        .map_err(ConfigError::Invalid)?;
        let defaults = RegistryLimits::default();
        let weight_defaults = WeightLimits::default();
        let max_device_bytes = match args.max_device_bytes.or(limits.max_device_bytes) {
            Some(0) => {
                return Err(ConfigError::Invalid(
                    "max_device_bytes must be at least 1".into(),
                ));
            }
            other => other,
        };
        Ok(Self {
            listen,
            http_listen: args
                .http_listen
                .or(args.metrics_listen)
                .or(file.http_listen)
                .or(file.metrics_listen),
            unix_socket,
            handle_socket,
            model_root,
            backend: args.backend.or(file.backend).unwrap_or_default(),
            cuda_handles: args.cuda_handles.or(file.cuda_handles).unwrap_or_default(),
            devices: match (args.devices, file.devices, file.device) {
                (Some(flag), _, _) => flag.parse().map_err(ConfigError::Invalid)?,
                (None, Some(_), Some(_)) => {
                    return Err(ConfigError::Invalid(
                        "give `devices` or its old name `device`, not both".into(),
                    ));
                }
                (None, Some(listed), None) => listed.selection().map_err(ConfigError::Invalid)?,
                (None, None, Some(one)) => one.parse().map_err(ConfigError::Invalid)?,
                (None, None, None) => DeviceSelection::All,
            },
            max_device_bytes,
            host_devices: match args.host_devices.or(file.host_devices) {
                Some(n @ 1..=MAX_HOST_DEVICES) => n,
                Some(n) => {
                    return Err(ConfigError::Invalid(format!(
                        "host_devices must be 1 to {MAX_HOST_DEVICES}, got {n}"
                    )));
                }
                None => 1,
            },
            proc_root: args
                .proc_root
                .or(file.proc_root)
                .unwrap_or_else(|| PathBuf::from("/")),
            load_cpu_hash: args.load_cpu_hash || file.load_cpu_hash.unwrap_or(false),
            replicate_on_attach: args.replicate_on_attach
                || file.replicate_on_attach.unwrap_or(false),
            load_threads: match args.load_threads.or(file.load_threads) {
                Some(0) => {
                    return Err(ConfigError::Invalid(
                        "load_threads must be at least 1".into(),
                    ));
                }
                Some(n) => n,
                None => modelshare_core::loader::default_threads(),
            },
            models,
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            shutdown_grace: Duration::from_secs(
                args.shutdown_grace_secs
                    .or(file.shutdown_grace_secs)
                    .unwrap_or(10),
            ),
            heartbeat_interval: Duration::from_millis(u64::from(heartbeat_interval_ms)),
            heartbeat_misses,
            ticket_ttl: Duration::from_millis(file.ticket_ttl_ms.unwrap_or(30_000)),
            adopt_wait: Duration::from_millis(
                args.adopt_wait_ms.or(file.adopt_wait_ms).unwrap_or(10_000),
            ),
            max_concurrent_loads,
            registry: RegistryLimits {
                max_model_bytes: args.max_model_bytes.or(limits.max_model_bytes),
                max_total_bytes: args.max_total_bytes.or(limits.max_total_bytes),
                max_device_bytes,
                max_sessions: limits.max_sessions.unwrap_or(defaults.max_sessions),
                max_leases_per_session: limits
                    .max_leases_per_session
                    .unwrap_or(defaults.max_leases_per_session),
                tickets: modelshare_core::registry::TicketLimits {
                    per_session: limits
                        .max_tickets_per_session
                        .unwrap_or(defaults.tickets.per_session),
                    per_tenant: limits
                        .max_tickets_per_tenant
                        .unwrap_or(defaults.tickets.per_tenant),
                    total: limits.max_tickets.unwrap_or(defaults.tickets.total),
                },
            },
            connections: {
                let d = crate::connections::ConnLimits::default();
                let ms =
                    |v: Option<u64>, default: Duration| v.map_or(default, Duration::from_millis);
                crate::connections::ConnLimits {
                    max_per_listener: limits.max_connections.unwrap_or(d.max_per_listener),
                    max_per_peer: limits.max_connections_per_peer.unwrap_or(d.max_per_peer),
                    handshake: ms(limits.connection_handshake_timeout_ms, d.handshake),
                    idle: ms(limits.connection_idle_timeout_ms, d.idle),
                }
            },
            tenants_file,
            unix_socket_mode,
            tls,
            serving,
            weights: WeightLimits {
                max_header_bytes: limits
                    .max_header_bytes
                    .unwrap_or(weight_defaults.max_header_bytes),
                max_tensors: limits.max_tensors.unwrap_or(weight_defaults.max_tensors),
                max_shards: limits.max_shards.unwrap_or(weight_defaults.max_shards),
                max_header_metadata_bytes: limits
                    .max_header_metadata_bytes
                    .unwrap_or(weight_defaults.max_header_metadata_bytes),
                ..weight_defaults
            },
        })
    }
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    toml::from_str(&text).map_err(|source| ConfigError::Parse {
        path: path.to_owned(),
        source,
    })
}

/// Beside the gRPC Unix socket when there is one, else in the temporary directory.
/// The uid this process runs as.
fn current_uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// The gRPC Unix socket a server without tenants and without listeners serves on, and where
/// the command-line client looks first: `/tmp/modelshare-<uid>.sock`.
pub fn default_unix_socket() -> PathBuf {
    std::env::temp_dir().join(format!("modelshare-{}.sock", current_uid()))
}

fn default_handle_socket(unix_socket: Option<&Path>) -> PathBuf {
    match unix_socket.and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("modelshare-handles.sock"),
        _ => std::env::temp_dir().join(format!("modelshare-{}-handles.sock", current_uid())),
    }
}
