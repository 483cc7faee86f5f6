//! The devices this server holds, keyed by UUID, each behind its own device thread.
//!
//! One entry today (one GPU, or host memory); several GPUs (a later step) add entries, not a
//! new shape. Nothing here makes a driver call: every question goes to the device's thread.
//! The memory figure answers within [`MEMORY_QUERY_TIMEOUT`] even when the device thread is
//! busy (a long allocation, say): past it, the last figure read is reported.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use modelshare_device::cuda::CudaBackend;
use modelshare_device::{DeviceInfo, DeviceThread, HostBackend};
use tracing::info;

use crate::config::{BackendChoice, CudaHandles};

/// How long a stats or metrics call waits for a device's memory figure before reporting the
/// last one it read.
pub const MEMORY_QUERY_TIMEOUT: Duration = Duration::from_millis(200);

/// One device and the last memory figure read from it.
#[derive(Debug)]
struct Device {
    thread: DeviceThread,
    last_used: Mutex<Option<u64>>,
}

/// Every device of the server, by UUID.
#[derive(Debug)]
pub struct Devices {
    by_uuid: BTreeMap<String, Device>,
    /// Where loads go (the one device, for now).
    primary: String,
}

impl Devices {
    /// Opens the backend `choice` names; `selector` picks the CUDA device (ordinal or UUID),
    /// with staging buffers for `load_threads` loading threads, sharing arenas by `handles`.
    /// `auto` takes CUDA when a driver and a device are found at run time, else host memory.
    pub fn open(
        choice: BackendChoice,
        selector: &str,
        load_threads: usize,
        handles: CudaHandles,
    ) -> Result<Self, modelshare_device::DeviceError> {
        let cuda = || CudaBackend::thread(selector, load_threads, handles.into());
        let thread = match choice {
            BackendChoice::Host => HostBackend::thread()?,
            BackendChoice::Cuda => cuda()?,
            BackendChoice::Auto => match modelshare_device::cuda::device_count() {
                Ok(n) if n > 0 => cuda()?,
                Ok(_) => {
                    info!("backend auto: the CUDA driver sees no device; using host memory");
                    HostBackend::thread()?
                }
                Err(e) => {
                    info!(reason = %e, "backend auto: no CUDA; using host memory");
                    HostBackend::thread()?
                }
            },
        };
        Ok(Self::single(thread))
    }

    /// A server of one device.
    pub fn single(thread: DeviceThread) -> Self {
        let primary = thread.uuid().to_owned();
        let mut by_uuid = BTreeMap::new();
        by_uuid.insert(
            primary.clone(),
            Device {
                thread,
                last_used: Mutex::new(None),
            },
        );
        Self { by_uuid, primary }
    }

    /// The device loads go to.
    pub fn primary(&self) -> &DeviceThread {
        // `primary` is a key of `by_uuid` by construction.
        &self.by_uuid[&self.primary].thread
    }

    /// The device with `uuid`.
    pub fn get(&self, uuid: &str) -> Option<&DeviceThread> {
        self.by_uuid.get(uuid).map(|d| &d.thread)
    }

    /// Every device's description, by UUID.
    pub fn infos(&self) -> Vec<DeviceInfo> {
        self.by_uuid
            .values()
            .map(|d| d.thread.info().clone())
            .collect()
    }

    /// Device memory in use on `uuid` as the device reports it (`None`: unknown, e.g. host
    /// memory). Never waits more than [`MEMORY_QUERY_TIMEOUT`] for a busy device.
    pub async fn used_bytes(&self, uuid: &str) -> Option<u64> {
        let device = self.by_uuid.get(uuid)?;
        match tokio::time::timeout(MEMORY_QUERY_TIMEOUT, device.thread.used_bytes()).await {
            Ok(Ok(used)) => {
                *device.last_used.lock().unwrap_or_else(|e| e.into_inner()) = used;
                used
            }
            Ok(Err(e)) => {
                tracing::warn!(device = uuid, error = %e, "device memory query failed");
                *device.last_used.lock().unwrap_or_else(|e| e.into_inner())
            }
            Err(_) => {
                tracing::debug!(
                    device = uuid,
                    "device busy; reporting its last memory figure"
                );
                *device.last_used.lock().unwrap_or_else(|e| e.into_inner())
            }
        }
    }
}
