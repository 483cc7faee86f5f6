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
//! - `listeners`: the gRPC TCP address and Unix socket (and [`default_unix_socket`]), the
//!   HTTP port, the handle socket, the sockets' mode, and the tenants file their defaults
//!   hang on.
//! - `tls`: TLS of the TCP listener.
//! - `timing`: heartbeats, tickets, adoption wait, shutdown grace.
//! - `limits`: the `[limits]` table: loads at once, registry, connections, weight files.
//! - `devices`: the backend, the devices served and how weights are loaded onto them.
//! - `serving`: the request path's `[serving]` table.
//! - `error`: [`ConfigError`].
//! - here: [`Config`], and the merge of the two in the order of its checks.

mod args;
mod devices;
mod error;
mod file;
mod limits;
mod listeners;
mod serving;
mod settings;
#[cfg(test)]
mod tests;
mod timing;
mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use self::devices::DeviceSettings;
use self::file::FileConfig;
use self::listeners::Listeners;
use self::timing::Timing;
// The tests reach these through `super::*`.
#[cfg(test)]
use self::{listeners::current_uid, settings::parse_mode};
use crate::telemetry::LogFormat;
use modelshare_core::registry::RegistryLimits;
use modelshare_core::weights::WeightLimits;

pub use self::args::ServeArgs;
pub use self::devices::MAX_HOST_DEVICES;
pub use self::error::ConfigError;
pub use self::listeners::default_unix_socket;
pub use self::serving::ServingSettings;
pub use self::settings::{
    BackendChoice, ClientAuth, CudaHandles, DeviceSelection, StartupModel, TlsSettings,
};

/// The whole configuration of a server, passed around as one value.
#[derive(Debug, Clone)]
pub struct Config {
    /// TCP address for gRPC.
    pub listen: Option<SocketAddr>,
    /// Unix socket for gRPC.
    pub unix_socket: Option<PathBuf>,
    /// HTTP address of the inference doors: the OIP and OpenAI REST routes, name-free probes.
    pub http_listen: Option<SocketAddr>,
    /// HTTP address of the operators' endpoints: `/metrics`, probes with model detail.
    pub metrics_listen: Option<SocketAddr>,
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
    /// Which loads of bytes already held share that memory (`share_identical`).
    pub share_identical: settings::ShareIdentical,
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
    /// The model host's settings.
    pub fn host_config(&self) -> modelshare_core::host::HostConfig {
        modelshare_core::host::HostConfig {
            model_root: self.model_root.clone(),
            weights: self.weights.clone(),
            registry: self.registry.clone(),
            max_device_bytes: self.max_device_bytes,
            load_threads: self.load_threads,
            load_cpu_hash: self.load_cpu_hash,
            share_identical: self.share_identical,
            max_concurrent_loads: self.max_concurrent_loads,
            held_dir: (!self.adopt_wait.is_zero())
                .then(|| modelshare_core::host::records_dir(&self.handle_socket)),
            adopt_wait: self.adopt_wait,
        }
    }

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

    /// Merges the flags (and variables) over the file over the defaults. The checks run in a
    /// fixed order (listeners, heartbeats, loads, socket mode, TLS, connections, serving,
    /// devices), so that of two bad values the same one is named.
    fn merge(args: ServeArgs, file: FileConfig) -> Result<Self, ConfigError> {
        let listeners = Listeners::merge(&args, &file)?;
        let timing = Timing::merge(&args, &file)?;
        let max_concurrent_loads = limits::max_concurrent_loads(&args, &file.limits)?;
        let unix_socket_mode = listeners.socket_mode(&args, &file)?;
        let tls = tls::merge(&args, &file.tls, listeners.listen, listeners.http_listen)?;
        limits::check_connections(&file.limits)?;
        let serving = ServingSettings::merge(
            serving::ServingFlags {
                max_queue_delay_us: args.max_queue_delay_us,
                no_worker_wait_ms: args.no_worker_wait_ms,
                max_request_secs: args.max_request_secs,
            },
            file.serving.clone(),
        )
        .map_err(ConfigError::Invalid)?;
        let devices = DeviceSettings::merge(&args, &file)?;
        let registry = limits::registry(&args, &file.limits, devices.max_device_bytes);
        Ok(Self {
            listen: listeners.listen,
            http_listen: listeners.http_listen,
            metrics_listen: listeners.metrics_listen,
            unix_socket: listeners.unix_socket,
            handle_socket: listeners.handle_socket,
            model_root: args
                .model_root
                .clone()
                .or(file.model_root.clone())
                .unwrap_or_else(|| PathBuf::from(".")),
            backend: devices.backend,
            cuda_handles: devices.cuda_handles,
            devices: devices.devices,
            max_device_bytes: devices.max_device_bytes,
            host_devices: devices.host_devices,
            proc_root: devices.proc_root,
            load_cpu_hash: devices.load_cpu_hash,
            replicate_on_attach: devices.replicate_on_attach,
            share_identical: devices.share_identical,
            load_threads: devices.load_threads,
            models: if args.models.is_empty() {
                file.models
            } else {
                args.models
            },
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            shutdown_grace: timing.shutdown_grace,
            heartbeat_interval: timing.heartbeat_interval,
            heartbeat_misses: timing.heartbeat_misses,
            ticket_ttl: timing.ticket_ttl,
            adopt_wait: timing.adopt_wait,
            max_concurrent_loads,
            registry,
            connections: limits::connections(&file.limits),
            tenants_file: listeners.tenants_file,
            unix_socket_mode,
            tls,
            serving,
            weights: limits::weights(&file.limits),
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
