//! Configuration of `modelshare serve`: a TOML file, `MODELSHARE_*` environment variables and
//! command-line flags, merged into one typed [`Config`]. Flags win over variables (clap's rule),
//! both win over the file, the file wins over the defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::Deserialize;

use crate::registry::RegistryLimits;
use crate::telemetry::LogFormat;
use crate::weights::WeightLimits;

/// Which backend allocates arenas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA when a driver and a device are found at run time, else host.
    #[default]
    Auto,
    /// Shared host memory (memfd).
    Host,
    /// CUDA device memory.
    Cuda,
}

/// A model loaded at start-up: `NAME=PATH` on the command line; in the file also its owner
/// and access.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartupModel {
    /// Model name.
    pub name: String,
    /// Path under the model root.
    pub path: String,
    /// Tenant that owns it (none: the admin).
    #[serde(default)]
    pub tenant: Option<String>,
    /// Tenants it is shared with.
    #[serde(default)]
    pub share_with: Vec<String>,
    /// Visible to every tenant.
    #[serde(default)]
    pub public: bool,
}

/// Whether the TLS listener asks for client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClientAuth {
    /// A client certificate signed by the client CA is required.
    #[default]
    Required,
    /// A client certificate is checked when given, but not required.
    Optional,
}

/// TLS of the TCP listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// Server certificate chain (PEM).
    pub cert: PathBuf,
    /// Server private key (PEM).
    pub key: PathBuf,
    /// CA that signs client certificates (PEM); none: no client certificates.
    pub client_ca: Option<PathBuf>,
    /// Whether a client certificate is required (with `client_ca`).
    pub client_auth: ClientAuth,
}

impl FromStr for StartupModel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (name, path) = s
            .split_once('=')
            .ok_or_else(|| format!("expected NAME=PATH, got '{s}'"))?;
        if name.is_empty() || path.is_empty() {
            return Err(format!("expected NAME=PATH, got '{s}'"));
        }
        Ok(Self {
            name: name.to_owned(),
            path: path.to_owned(),
            tenant: None,
            share_with: Vec::new(),
            public: false,
        })
    }
}

/// Flags (and variables) of `modelshare serve`. Every field is optional so that the file and
/// the defaults can fill what is not given.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file.
    #[arg(long, short = 'c', env = "MODELSHARE_CONFIG")]
    pub config: Option<PathBuf>,
    /// TCP address for gRPC (default 127.0.0.1:50051 when no Unix socket is given).
    #[arg(long, env = "MODELSHARE_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// Unix socket path for gRPC.
    #[arg(long, env = "MODELSHARE_UNIX_SOCKET")]
    pub unix_socket: Option<PathBuf>,
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
    /// Address for the metrics HTTP port (`/metrics`, `/healthz`, `/readyz`); off when unset.
    #[arg(long, env = "MODELSHARE_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
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
    /// CUDA device: an ordinal (0, 1, ...) or a UUID (GPU-...).
    #[arg(long, env = "MODELSHARE_DEVICE")]
    pub device: Option<String>,
    /// Threads one load reads and copies with (default: the cores, at most 8).
    #[arg(long, env = "MODELSHARE_LOAD_THREADS")]
    pub load_threads: Option<usize>,
    /// Largest arena one model version may have, in bytes.
    #[arg(long, env = "MODELSHARE_MAX_MODEL_BYTES")]
    pub max_model_bytes: Option<u64>,
    /// Most arena bytes held at once, in bytes.
    #[arg(long, env = "MODELSHARE_MAX_TOTAL_BYTES")]
    pub max_total_bytes: Option<u64>,
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

/// Parses an octal file mode such as `0660`.
fn parse_mode(s: &str) -> Result<u32, String> {
    let mode = u32::from_str_radix(s.trim_start_matches("0o"), 8)
        .map_err(|_| format!("'{s}' is not an octal mode such as 0660"))?;
    if mode > 0o777 {
        return Err(format!("'{s}' is more than 0777"));
    }
    Ok(mode)
}

/// The `[tls]` table of the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileTls {
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
    client_auth: Option<ClientAuth>,
}

/// The `[limits]` table of the file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileLimits {
    max_concurrent_loads: Option<usize>,
    max_model_bytes: Option<u64>,
    max_total_bytes: Option<u64>,
    max_sessions: Option<usize>,
    max_leases_per_session: Option<usize>,
    max_header_bytes: Option<u64>,
    max_tensors: Option<usize>,
    max_shards: Option<usize>,
}

/// The TOML file, as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    listen: Option<SocketAddr>,
    metrics_listen: Option<SocketAddr>,
    unix_socket: Option<PathBuf>,
    handle_socket: Option<PathBuf>,
    model_root: Option<PathBuf>,
    backend: Option<BackendChoice>,
    device: Option<String>,
    load_threads: Option<usize>,
    log_format: Option<LogFormat>,
    shutdown_grace_secs: Option<u64>,
    heartbeat_interval_ms: Option<u32>,
    heartbeat_misses: Option<u32>,
    ticket_ttl_ms: Option<u64>,
    tenants_file: Option<PathBuf>,
    unix_socket_mode: Option<String>,
    #[serde(default)]
    tls: FileTls,
    #[serde(default)]
    models: Vec<StartupModel>,
    #[serde(default)]
    limits: FileLimits,
}

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
    /// Metrics HTTP address.
    pub metrics_listen: Option<SocketAddr>,
    /// Handle socket for fd passing.
    pub handle_socket: PathBuf,
    /// Model repository root.
    pub model_root: PathBuf,
    /// Backend choice.
    pub backend: BackendChoice,
    /// CUDA device selector (ordinal or UUID).
    pub device: String,
    /// Threads per load.
    pub load_threads: usize,
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
    /// Loads allowed at once.
    pub max_concurrent_loads: usize,
    /// Registry limits.
    pub registry: RegistryLimits,
    /// Limits on weight files.
    pub weights: WeightLimits,
    /// Tenants file (none: authentication off).
    pub tenants_file: Option<PathBuf>,
    /// Mode of the Unix sockets (none: as the umask leaves it).
    pub unix_socket_mode: Option<u32>,
    /// TLS of the TCP listener.
    pub tls: Option<TlsSettings>,
}

impl Config {
    /// Builds the configuration from flags (and variables) and the file they name.
    pub fn from_args(args: ServeArgs) -> Result<Self, ConfigError> {
        let file = match &args.config {
            Some(path) => read_file(path)?,
            None => FileConfig::default(),
        };
        Self::merge(args, file)
    }

    fn merge(args: ServeArgs, file: FileConfig) -> Result<Self, ConfigError> {
        let unix_socket = args.unix_socket.or(file.unix_socket);
        let listen = args.listen.or(file.listen).or_else(|| {
            unix_socket
                .is_none()
                .then(|| SocketAddr::from(([127, 0, 0, 1], 50051)))
        });
        let handle_socket = args
            .handle_socket
            .or(file.handle_socket)
            .unwrap_or_else(|| default_handle_socket(unix_socket.as_deref()));
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
        let defaults = RegistryLimits::default();
        let weight_defaults = WeightLimits::default();
        Ok(Self {
            listen,
            metrics_listen: args.metrics_listen.or(file.metrics_listen),
            unix_socket,
            handle_socket,
            model_root,
            backend: args.backend.or(file.backend).unwrap_or_default(),
            device: args.device.or(file.device).unwrap_or_else(|| "0".into()),
            load_threads: match args.load_threads.or(file.load_threads) {
                Some(0) => {
                    return Err(ConfigError::Invalid(
                        "load_threads must be at least 1".into(),
                    ));
                }
                Some(n) => n,
                None => crate::loader::default_threads(),
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
            max_concurrent_loads,
            registry: RegistryLimits {
                max_model_bytes: args.max_model_bytes.or(limits.max_model_bytes),
                max_total_bytes: args.max_total_bytes.or(limits.max_total_bytes),
                max_sessions: limits.max_sessions.unwrap_or(defaults.max_sessions),
                max_leases_per_session: limits
                    .max_leases_per_session
                    .unwrap_or(defaults.max_leases_per_session),
            },
            tenants_file: args.tenants_file.or(file.tenants_file),
            unix_socket_mode,
            tls,
            weights: WeightLimits {
                max_header_bytes: limits
                    .max_header_bytes
                    .unwrap_or(weight_defaults.max_header_bytes),
                max_tensors: limits.max_tensors.unwrap_or(weight_defaults.max_tensors),
                max_shards: limits.max_shards.unwrap_or(weight_defaults.max_shards),
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
fn default_handle_socket(unix_socket: Option<&Path>) -> PathBuf {
    match unix_socket.and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.join("modelshare-handles.sock"),
        _ => std::env::temp_dir().join("modelshare-handles.sock"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(toml_text: &str) -> FileConfig {
        toml::from_str(toml_text).expect("valid toml")
    }

    /// Flags must win over the file, and the file over the defaults, field by field.
    #[test]
    fn flags_override_file_override_defaults() {
        let file = parse(
            r#"
            listen = "127.0.0.1:7000"
            model_root = "/models"
            heartbeat_misses = 5
            [[models]]
            name = "a"
            path = "a"
            [limits]
            max_model_bytes = 100
            "#,
        );
        let args = ServeArgs {
            listen: Some("127.0.0.1:8000".parse().expect("addr")),
            max_model_bytes: Some(7),
            ..ServeArgs::default()
        };
        let c = Config::merge(args, file).expect("config");
        assert_eq!(c.listen, Some("127.0.0.1:8000".parse().expect("addr")));
        assert_eq!(c.model_root, PathBuf::from("/models"));
        assert_eq!(c.heartbeat_misses, 5);
        assert_eq!(c.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(c.registry.max_model_bytes, Some(7));
        assert_eq!(c.models.len(), 1);
    }

    /// A typo in the file must be an error, not a silently ignored setting.
    #[test]
    fn unknown_keys_are_refused() {
        assert!(toml::from_str::<FileConfig>("listne = \"127.0.0.1:1\"").is_err());
        assert!(toml::from_str::<FileConfig>("[limits]\nmax_modle_bytes = 1").is_err());
    }

    /// Nonsense values must be refused at start-up.
    #[test]
    fn out_of_range_values_are_refused() {
        let args = ServeArgs {
            heartbeat_misses: Some(0),
            ..ServeArgs::default()
        };
        assert!(Config::merge(args, FileConfig::default()).is_err());
        let args = ServeArgs {
            heartbeat_interval_ms: Some(1),
            ..ServeArgs::default()
        };
        assert!(Config::merge(args, FileConfig::default()).is_err());
    }

    /// With only a Unix socket, no TCP port must be opened by default.
    #[test]
    fn unix_only_has_no_tcp_listener() {
        let args = ServeArgs {
            unix_socket: Some("/run/ms/grpc.sock".into()),
            ..ServeArgs::default()
        };
        let c = Config::merge(args, FileConfig::default()).expect("config");
        assert_eq!(c.listen, None);
        assert_eq!(
            c.handle_socket,
            PathBuf::from("/run/ms/modelshare-handles.sock")
        );
    }

    /// NAME=PATH parsing for --model.
    #[test]
    fn startup_model_syntax() {
        let m: StartupModel = "tiny=models/tiny".parse().expect("parse");
        assert_eq!(m.name, "tiny");
        assert_eq!(m.path, "models/tiny");
        assert!("tiny".parse::<StartupModel>().is_err());
        assert!("=x".parse::<StartupModel>().is_err());
    }

    /// TLS needs both files and a TCP listener; the file's `[tls]` table and the flags merge.
    #[test]
    fn tls_settings_are_checked() {
        let file = parse(
            r#"
            listen = "127.0.0.1:7000"
            tenants_file = "/etc/ms/tenants.toml"
            unix_socket_mode = "0660"
            [tls]
            cert = "/c.pem"
            key = "/k.pem"
            client_ca = "/ca.pem"
            "#,
        );
        let c = Config::merge(ServeArgs::default(), file).expect("config");
        let tls = c.tls.expect("tls");
        assert_eq!(tls.client_auth, ClientAuth::Required);
        assert_eq!(tls.client_ca, Some(PathBuf::from("/ca.pem")));
        assert_eq!(c.unix_socket_mode, Some(0o660));
        assert_eq!(c.tenants_file, Some(PathBuf::from("/etc/ms/tenants.toml")));

        let only_cert = ServeArgs {
            listen: Some("127.0.0.1:1".parse().expect("addr")),
            server_tls_cert: Some("/c.pem".into()),
            ..ServeArgs::default()
        };
        assert!(Config::merge(only_cert, FileConfig::default()).is_err());
        let no_tcp = ServeArgs {
            unix_socket: Some("/run/ms.sock".into()),
            server_tls_cert: Some("/c.pem".into()),
            server_tls_key: Some("/k.pem".into()),
            ..ServeArgs::default()
        };
        assert!(Config::merge(no_tcp, FileConfig::default()).is_err());
        let auth_without_ca = ServeArgs {
            listen: Some("127.0.0.1:1".parse().expect("addr")),
            server_tls_cert: Some("/c.pem".into()),
            server_tls_key: Some("/k.pem".into()),
            server_tls_client_auth: Some(ClientAuth::Required),
            ..ServeArgs::default()
        };
        let err = Config::merge(auth_without_ca, FileConfig::default()).expect_err("no CA");
        assert!(err.to_string().contains("client CA"), "{err}");
        assert!(parse_mode("0660").is_ok());
        assert!(parse_mode("0999").is_err());
        assert!(parse_mode("01777").is_err());
    }

    /// The configuration shipped in the Kubernetes manifest must be one the server accepts.
    #[test]
    fn the_kubernetes_config_parses() {
        let yaml = include_str!("../../deploy/k8s/server-daemonset.yaml");
        let body: String = yaml
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("modelshare.toml: |"))
            .skip(1)
            .take_while(|l| l.is_empty() || l.starts_with("    "))
            .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
            .collect();
        assert!(body.contains("tenants_file"), "{body}");
        let file: FileConfig = toml::from_str(&body).expect("valid config");
        let c = Config::merge(ServeArgs::default(), file).expect("config");
        assert!(c.tls.is_some() && c.tenants_file.is_some());
        assert_eq!(c.unix_socket_mode, Some(0o660));
    }
}
