//! [`Host`]: the state a model host shares (devices, registry, tenants, held memory, timer,
//! metrics), and the one path a load takes ([`load`], used both by `LoadModel` and by the
//! start-up models). The server wraps it with its doors' state; nothing here knows a transport.

mod copy;
pub mod load;
mod share;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use modelshare_device::BackendKind;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

pub use self::load::RunningLoad;
use crate::devices::Devices;
use crate::error::CoreError;
use crate::held::HeldStore;
use crate::loader;
use crate::metrics::Metrics;
use crate::registry::{Registry, RegistryLimits};
use crate::tenants::TenantStore;
use crate::timer::Timer;
use crate::weights::WeightLimits;

/// What the host is configured with (the server derives it from its configuration).
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// The root every model path is resolved under.
    pub model_root: PathBuf,
    /// Limits on weight files.
    pub weights: WeightLimits,
    /// Limits on the registry (bytes, versions, tickets).
    pub registry: RegistryLimits,
    /// The most arena bytes on one device.
    pub max_device_bytes: Option<u64>,
    /// Loading threads per load.
    pub load_threads: usize,
    /// Hash on the CPU too where the device checksums.
    pub load_cpu_hash: bool,
    /// Which loads of bytes a version already holds share its memory.
    pub share_identical: crate::tenants::policy::ShareIdentical,
    /// Loads running at once.
    pub max_concurrent_loads: usize,
    /// Where held-memory records are kept (`None`: memory is not kept across restarts).
    pub held_dir: Option<PathBuf>,
    /// How long kept memory waits to be offered back after a restart.
    pub adopt_wait: Duration,
}

/// The state a model host shares. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Host {
    /// The devices, each behind its device thread.
    pub devices: Arc<Devices>,
    /// Models, versions, sessions, leases and their tickets.
    pub registry: Arc<Registry>,
    /// Every expiry: tickets, heartbeats, drain deadlines.
    pub timer: Arc<Timer>,
    /// Cancelled when the host starts shutting down.
    pub shutdown: CancellationToken,
    /// Prometheus metrics.
    pub metrics: Arc<Metrics>,
    /// Set once every start-up model is loaded; worker calls are refused before.
    pub ready: Arc<AtomicBool>,
    /// Tenants, tokens and quotas in force.
    pub tenants: Arc<TenantStore>,
    /// Records of memory that can outlive the server, and their adoption after a restart.
    pub held: Arc<HeldStore>,
    /// What the host is configured with.
    pub config: Arc<HostConfig>,
    load_slots: Arc<Semaphore>,
    /// Chunks being loaded at once, over all loads.
    chunk_gate: Arc<loader::ChunkGate>,
}

impl Host {
    /// A host over `devices`, with an empty registry. Memory is kept across restarts only
    /// where the backend's memory can outlive the server (host, CUDA VMM) and `held_dir` is set.
    pub fn new(
        devices: Arc<Devices>,
        config: HostConfig,
        metrics: Arc<Metrics>,
        tenants: Arc<TenantStore>,
        shutdown: CancellationToken,
    ) -> Self {
        let adoptable = matches!(
            devices.primary().info().backend,
            BackendKind::Host | BackendKind::CudaVmm
        );
        let held_dir = config.held_dir.clone().filter(|_| adoptable);
        Self {
            held: Arc::new(HeldStore::open(held_dir, config.adopt_wait)),
            tenants,
            registry: Arc::new(Registry::new(config.registry.clone())),
            devices,
            timer: Arc::new(Timer::new()),
            load_slots: Arc::new(Semaphore::new(config.max_concurrent_loads)),
            chunk_gate: Arc::new(loader::ChunkGate::new(config.load_threads)),
            shutdown,
            ready: Arc::new(AtomicBool::new(false)),
            metrics,
            config: Arc::new(config),
        }
    }

    /// Refuses worker calls until the start-up models are loaded, so that a worker reconnecting
    /// to a restarting server does not find its models missing.
    pub fn require_ready(&self) -> Result<(), CoreError> {
        if self.ready.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(CoreError::Starting)
        }
    }

    /// Whether requests are taken: the start-up models are loaded and shutdown has not begun
    /// (OIP `ServerReady`, `/v2/health/ready`).
    pub fn takes_requests(&self) -> bool {
        self.require_ready().is_ok() && !self.shutdown.is_cancelled()
    }

    /// Counts a refusal in the metrics (quota refusals, by tenant and quota); the doors call it
    /// as they answer one.
    pub fn count_refusal(&self, e: &CoreError) {
        if let CoreError::QuotaExceeded { tenant, quota, .. } = e {
            self.metrics.quota_denied(tenant, quota);
        }
    }

    fn load_permit(&self) -> Result<OwnedSemaphorePermit, CoreError> {
        let limit = self.config.max_concurrent_loads as u64;
        self.load_slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| CoreError::LimitExceeded {
                what: "loads running at once".into(),
                limit,
                requested: limit + 1,
            })
    }
}

/// Where the held-memory records go: beside the handle socket (`<socket>.held/`).
pub fn records_dir(handle_socket: &std::path::Path) -> PathBuf {
    let mut name = handle_socket
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "modelshare-handles".into());
    name.push(".held");
    handle_socket.with_file_name(name)
}
