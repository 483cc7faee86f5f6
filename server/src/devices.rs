//! The devices this server holds, keyed by UUID, each behind its own device thread.
//!
//! One entry per GPU the server serves (`--devices`), or host memory (standing in for
//! `--host-devices` devices). Nothing here makes a driver call: every question goes to the device's thread.
//! The memory figure answers within [`MEMORY_QUERY_TIMEOUT`] even when the device thread is
//! busy (a long allocation, say): past it, the last figure read is reported.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use modelshare_device::cuda::CudaBackend;
use modelshare_device::{DeviceInfo, DeviceThread, HostBackend};
use tracing::info;

use crate::config::{BackendChoice, CudaHandles, DeviceSelection};
use crate::error::ServerError;

/// How long a stats or metrics call waits for a device's memory figure before reporting the
/// last one it read.
pub const MEMORY_QUERY_TIMEOUT: Duration = Duration::from_millis(200);

/// One device and the last memory figure read from it.
#[derive(Debug)]
struct Device {
    thread: DeviceThread,
    last_used: Mutex<Option<u64>>,
}

impl Device {
    fn new(thread: DeviceThread) -> Self {
        Self {
            thread,
            last_used: Mutex::new(None),
        }
    }
}

/// Every device of the server, by UUID, in the order they were opened.
#[derive(Debug)]
pub struct Devices {
    by_uuid: BTreeMap<String, Device>,
    /// UUIDs in the order opened (CUDA: as listed, or by ordinal for `all`).
    order: Vec<String>,
}

impl Devices {
    /// Opens the backend `choice` names on the devices `selection` picks (CUDA: `all`, or
    /// ordinals and UUIDs; host memory: `host_devices` stand-ins), each on its own device
    /// thread with staging buffers for `load_threads` loading threads, sharing arenas by
    /// `handles`. `auto` takes CUDA when a driver and a device are found at run time, else
    /// host memory.
    pub fn open(
        choice: BackendChoice,
        selection: &DeviceSelection,
        host_devices: usize,
        load_threads: usize,
        handles: CudaHandles,
    ) -> Result<Self, modelshare_device::DeviceError> {
        let host = || Self::host(host_devices);
        let cuda = || -> Result<Self, modelshare_device::DeviceError> {
            let selectors = match selection {
                DeviceSelection::All => (0..modelshare_device::cuda::device_count()?)
                    .map(|n| n.to_string())
                    .collect(),
                DeviceSelection::Listed(items) => items.clone(),
            };
            let mut threads = Vec::with_capacity(selectors.len());
            for selector in &selectors {
                threads.push(CudaBackend::thread(selector, load_threads, handles.into())?);
            }
            Self::of(threads)
        };
        match choice {
            BackendChoice::Host => host(),
            BackendChoice::Cuda => cuda(),
            BackendChoice::Auto => match modelshare_device::cuda::device_count() {
                Ok(n) if n > 0 => cuda(),
                Ok(_) => {
                    info!("backend auto: the CUDA driver sees no device; using host memory");
                    host()
                }
                Err(e) => {
                    info!(reason = %e, "backend auto: no CUDA; using host memory");
                    host()
                }
            },
        }
    }

    /// Host memory standing in for `n` devices: `host`, `host-1`, … (one: `host`).
    pub fn host(n: usize) -> Result<Self, modelshare_device::DeviceError> {
        let threads = (0..n.max(1))
            .map(|i| match i {
                0 => HostBackend::thread(),
                i => HostBackend::thread_named(&format!("host-{i}")),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(threads)
    }

    /// A server of one device.
    pub fn single(thread: DeviceThread) -> Self {
        let uuid = thread.uuid().to_owned();
        let mut by_uuid = BTreeMap::new();
        by_uuid.insert(uuid.clone(), Device::new(thread));
        Self {
            by_uuid,
            order: vec![uuid],
        }
    }

    /// A server of these devices, in this order; the same device twice (`0` and its UUID,
    /// say) is refused.
    pub fn of(threads: Vec<DeviceThread>) -> Result<Self, modelshare_device::DeviceError> {
        let mut by_uuid = BTreeMap::new();
        let mut order = Vec::with_capacity(threads.len());
        for thread in threads {
            let uuid = thread.uuid().to_owned();
            if by_uuid.contains_key(&uuid) {
                return Err(modelshare_device::DeviceError::Unsupported {
                    what: format!("device {uuid} is selected twice (by ordinal and by UUID?)"),
                });
            }
            order.push(uuid.clone());
            by_uuid.insert(uuid, Device::new(thread));
        }
        if order.is_empty() {
            return Err(modelshare_device::DeviceError::Unsupported {
                what: "no device selected".into(),
            });
        }
        Ok(Self { by_uuid, order })
    }

    /// The first device (the one a single-device server has).
    pub fn primary(&self) -> &DeviceThread {
        // `order` is never empty and names keys of `by_uuid`, by construction.
        &self.by_uuid[&self.order[0]].thread
    }

    /// Every device thread, in order.
    pub fn threads(&self) -> impl Iterator<Item = &DeviceThread> {
        self.order.iter().map(|u| &self.by_uuid[u].thread)
    }

    /// How many devices.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Never true (a server has at least one device); for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The device an ordinal (its place in the server's list) or UUID names.
    pub fn find(&self, name: &str) -> Option<&DeviceThread> {
        self.with_uuid(name).or_else(|| {
            let i: usize = name.parse().ok()?;
            self.order.get(i).map(|u| &self.by_uuid[u].thread)
        })
    }

    /// The device whose UUID is `uuid`, in any case (a worker's device, say).
    pub fn with_uuid(&self, uuid: &str) -> Option<&DeviceThread> {
        self.get(uuid).or_else(|| {
            self.order
                .iter()
                .find(|u| u.eq_ignore_ascii_case(uuid))
                .map(|u| &self.by_uuid[u].thread)
        })
    }

    /// The device with `uuid`.
    pub fn get(&self, uuid: &str) -> Option<&DeviceThread> {
        self.by_uuid.get(uuid).map(|d| &d.thread)
    }

    /// Every device's description, by UUID.
    pub fn infos(&self) -> Vec<DeviceInfo> {
        self.threads().map(|t| t.info().clone()).collect()
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

/// Refuses an arena of `needed` bytes for `model` that `device` has no room for, given the
/// memory it has free (`None`: unknown, which admits it; the allocation then says what went
/// wrong), saying how much is free.
pub fn admit(
    device: &DeviceThread,
    model: &str,
    needed: u64,
    available: Option<u64>,
) -> Result<(), ServerError> {
    let Some(available) = available else {
        return Ok(());
    };
    if needed <= available {
        return Ok(());
    }
    let memory = match device.info().backend {
        modelshare_device::BackendKind::Host => "host memory (MemAvailable)".to_owned(),
        _ => format!("device memory on {}", device.uuid()),
    };
    Err(ServerError::NoRoom {
        model: model.to_owned(),
        memory,
        needed,
        available,
    })
}
