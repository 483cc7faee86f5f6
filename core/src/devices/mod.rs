//! The devices this server holds, keyed by UUID, each behind its own device thread.
//!
//! One entry per GPU the server serves (`--devices`), or host memory (standing in for
//! `--host-devices` devices). Nothing here makes a driver call: every question goes to the device's thread.
//! The memory figure answers within [`MEMORY_QUERY_TIMEOUT`] even when the device thread is
//! busy (a long allocation, say): past it, the last figure read is reported.
//!
//! # Memory admission
//!
//! An arena is admitted against its device's free memory by [`Devices::reserve`], which
//! counts what loads already admitted will still take: a host arena's pages are only used as
//! the copy writes them, and a GPU's memory goes at allocation, so the free figure alone let
//! two concurrent loads in where one fit. Under one lock (admissions are serialised) it reads
//! the free memory, subtracts the bytes reserved and not given back on the same memory (the
//! host's stand-in devices share one pool: they are the same memory), and refuses
//! ([`admit`], [`CoreError::NoRoom`]) or adds the arena's bytes. The [`MemoryReservation`]
//! gives them back when it drops: when the load has ended (done or failed), or, where
//! allocation takes the memory at once (CUDA), once the arena is allocated.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use modelshare_device::cuda::CudaBackend;
use modelshare_device::{BackendKind, DeviceInfo, DeviceThread, HostBackend, HostMemory};
use tracing::info;

pub mod settings;

use self::settings::{BackendChoice, CudaHandles, DeviceSelection};
use crate::error::CoreError;

/// How long a stats or metrics call waits for a device's memory figure before reporting the
/// last one it read.
pub const MEMORY_QUERY_TIMEOUT: Duration = Duration::from_millis(200);

/// One device, the last memory figure read from it, and the bytes reserved on its memory.
#[derive(Debug)]
struct Device {
    thread: DeviceThread,
    last_used: Mutex<Option<u64>>,
    /// Bytes admitted on this device's memory and not given back (shared by the host's
    /// stand-in devices).
    reserved: Arc<AtomicU64>,
}

impl Device {
    fn new(thread: DeviceThread, reserved: Arc<AtomicU64>) -> Self {
        Self {
            thread,
            last_used: Mutex::new(None),
            reserved,
        }
    }
}

/// Every device of the server, by UUID, in the order they were opened.
#[derive(Debug)]
pub struct Devices {
    by_uuid: BTreeMap<String, Device>,
    /// UUIDs in the order opened (CUDA: as listed, or by ordinal for `all`).
    order: Vec<String>,
    /// Held while an admission reads free memory and reserves (see the module docs).
    admitting: Mutex<()>,
}

/// Bytes of an admitted arena counted against its device's free memory until this drops.
#[derive(Debug)]
pub struct MemoryReservation {
    reserved: Arc<AtomicU64>,
    bytes: u64,
}

impl MemoryReservation {
    /// Bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for MemoryReservation {
    fn drop(&mut self) {
        self.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// What [`Devices::open`] opens.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// Which backend allocates arenas.
    pub backend: BackendChoice,
    /// Which CUDA devices.
    pub devices: DeviceSelection,
    /// How CUDA arenas are shared with workers.
    pub cuda_handles: CudaHandles,
    /// Host memory stand-ins (host backend).
    pub host_devices: usize,
    /// Where `/proc` and `/sys` are read (host memory figures).
    pub proc_root: std::path::PathBuf,
    /// Loading threads, each with its own staging buffers on every device.
    pub load_threads: usize,
}

impl Devices {
    /// Opens the backend `config.backend` names on the devices `config.devices` picks (CUDA:
    /// `all`, or ordinals and UUIDs; host memory: `host_devices` stand-ins, their memory
    /// figures read under `proc_root`), each on its own device thread with staging buffers for
    /// `load_threads` loading threads, sharing arenas by `cuda_handles`. `auto` takes CUDA when
    /// a driver and a device are found at run time, else host memory.
    pub fn open(config: &DeviceConfig) -> Result<Self, modelshare_device::DeviceError> {
        let (choice, selection) = (config.backend, &config.devices);
        let (load_threads, handles) = (config.load_threads, config.cuda_handles);
        let host = || Self::host(config.host_devices, HostMemory::at(&config.proc_root));
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

    /// Host memory standing in for `n` devices: `host`, `host-1`, … (one: `host`), its
    /// figures read from `memory`.
    pub fn host(n: usize, memory: HostMemory) -> Result<Self, modelshare_device::DeviceError> {
        let threads = (0..n.max(1))
            .map(|i| match i {
                0 => HostBackend::thread_reading("host", memory.clone()),
                i => HostBackend::thread_reading(&format!("host-{i}"), memory.clone()),
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(threads)
    }

    /// A server of one device.
    pub fn single(thread: DeviceThread) -> Self {
        let uuid = thread.uuid().to_owned();
        let mut by_uuid = BTreeMap::new();
        by_uuid.insert(uuid.clone(), Device::new(thread, Arc::default()));
        Self {
            by_uuid,
            order: vec![uuid],
            admitting: Mutex::new(()),
        }
    }

    /// A server of these devices, in this order; the same device twice (`0` and its UUID,
    /// say) is refused.
    pub fn of(threads: Vec<DeviceThread>) -> Result<Self, modelshare_device::DeviceError> {
        let mut by_uuid = BTreeMap::new();
        let mut order = Vec::with_capacity(threads.len());
        // Host stand-ins are one memory: one count of what is reserved on it.
        let host_pool: Arc<AtomicU64> = Arc::default();
        for thread in threads {
            let uuid = thread.uuid().to_owned();
            if by_uuid.contains_key(&uuid) {
                return Err(modelshare_device::DeviceError::Unsupported {
                    what: format!("device {uuid} is selected twice (by ordinal and by UUID?)"),
                });
            }
            let pool = match thread.info().backend {
                BackendKind::Host => host_pool.clone(),
                BackendKind::CudaVmm | BackendKind::CudaIpc => Arc::default(),
            };
            order.push(uuid.clone());
            by_uuid.insert(uuid, Device::new(thread, pool));
        }
        if order.is_empty() {
            return Err(modelshare_device::DeviceError::Unsupported {
                what: "no device selected".into(),
            });
        }
        Ok(Self {
            by_uuid,
            order,
            admitting: Mutex::new(()),
        })
    }

    /// Admits an arena of `needed` bytes for `model` on `device` against its free memory less
    /// what loads admitted before it still hold reserved there, and reserves them (see the
    /// module docs); [`CoreError::NoRoom`] when they do not fit. Blocking: asks the device
    /// thread for its free memory, under the admission lock.
    pub fn reserve(
        &self,
        device: &DeviceThread,
        model: &str,
        needed: u64,
    ) -> Result<MemoryReservation, CoreError> {
        let reserved = self
            .by_uuid
            .get(device.uuid())
            .map(|d| d.reserved.clone())
            .ok_or_else(|| CoreError::Internal(format!("no device {}", device.uuid())))?;
        let _admitting = self.admitting.lock().unwrap_or_else(|p| p.into_inner());
        // Read before the free figure: a load that ends meanwhile has its bytes counted in one
        // or the other (both, at worst: a refusal that a retry turns into an admission), never
        // in neither. Nothing is added meanwhile: admissions hold the lock.
        let before = reserved.load(Ordering::Acquire);
        let free = device.free_bytes().wait().ok().flatten();
        admit(device, model, needed, free, before)?;
        reserved.fetch_add(needed, Ordering::AcqRel);
        Ok(MemoryReservation {
            reserved,
            bytes: needed,
        })
    }

    /// Bytes reserved on `uuid`'s memory by loads admitted and not ended (see the module docs).
    pub fn reserved_bytes(&self, uuid: &str) -> u64 {
        self.by_uuid
            .get(uuid)
            .map_or(0, |d| d.reserved.load(Ordering::Acquire))
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
/// wrong) less `reserved` bytes that loads admitted before will still take, saying how much
/// is free (and reserved, where some is).
pub fn admit(
    device: &DeviceThread,
    model: &str,
    needed: u64,
    free: Option<u64>,
    reserved: u64,
) -> Result<(), CoreError> {
    let Some(free) = free else {
        return Ok(());
    };
    let available = free.saturating_sub(reserved);
    if needed <= available {
        return Ok(());
    }
    let mut memory = match device.info().backend {
        BackendKind::Host => {
            "host memory (MemAvailable) under this process's cgroup memory limit".to_owned()
        }
        BackendKind::CudaVmm | BackendKind::CudaIpc => {
            format!("device memory on {}", device.uuid())
        }
    };
    if reserved > 0 {
        memory.push_str(&format!(
            ", less {reserved} bytes reserved by loads in progress"
        ));
    }
    Err(CoreError::NoRoom {
        model: model.to_owned(),
        memory,
        needed,
        available,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    /// A fake root: 10 GiB `MemAvailable`, and a v2 cgroup limited to `limit_mib`.
    fn fake_root(limit_mib: u64) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path();
        std::fs::create_dir_all(p.join("proc/self")).expect("mkdir");
        std::fs::create_dir_all(p.join("sys/fs/cgroup/app")).expect("mkdir");
        std::fs::write(
            p.join("proc/meminfo"),
            "MemTotal: 20971520 kB\nMemAvailable: 10485760 kB\n",
        )
        .expect("meminfo");
        std::fs::write(p.join("proc/self/cgroup"), "0::/app\n").expect("cgroup");
        std::fs::write(
            p.join("sys/fs/cgroup/app/memory.max"),
            (limit_mib * MIB).to_string(),
        )
        .expect("max");
        std::fs::write(p.join("sys/fs/cgroup/app/memory.current"), "0").expect("current");
        dir
    }

    /// Two 64 MiB arenas against a 100 MiB cgroup: the first reserves, the second is refused
    /// (NoRoom naming the reservation), and admitted once the first's reservation is given
    /// back. Host stand-ins share one count: the second is refused on another stand-in too.
    #[test]
    fn reservations_count_against_free_memory_until_they_drop() {
        let root = fake_root(100);
        let devices = Devices::host(2, HostMemory::at(root.path())).expect("host devices");
        let (a, b) = (
            devices.get("host").expect("host").clone(),
            devices.get("host-1").expect("host-1").clone(),
        );
        let first = devices.reserve(&a, "one", 64 * MIB).expect("room for one");
        assert_eq!(devices.reserved_bytes("host-1"), 64 * MIB);
        for device in [&a, &b] {
            match devices.reserve(device, "two", 64 * MIB) {
                Err(CoreError::NoRoom {
                    memory, available, ..
                }) => {
                    assert_eq!(available, 36 * MIB);
                    assert!(memory.contains("reserved by loads in progress"), "{memory}");
                }
                other => panic!("expected NoRoom, got {other:?}"),
            }
        }
        drop(first);
        assert_eq!(devices.reserved_bytes("host"), 0);
        let second = devices
            .reserve(&b, "two", 64 * MIB)
            .expect("room once given back");
        assert_eq!(second.bytes(), 64 * MIB);
    }

    /// Concurrent admissions: of eight threads each asking 64 MiB of a 100 MiB cgroup, one is
    /// admitted.
    #[test]
    fn concurrent_reservations_admit_exactly_what_fits() {
        let root = fake_root(100);
        let devices = Devices::host(1, HostMemory::at(root.path())).expect("host device");
        let device = devices.primary().clone();
        let admitted: Vec<MemoryReservation> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|i| {
                    let (devices, device) = (&devices, &device);
                    s.spawn(move || devices.reserve(device, &format!("m{i}"), 64 * MIB).ok())
                })
                .collect();
            handles
                .into_iter()
                .filter_map(|h| h.join().expect("thread"))
                .collect()
        });
        assert_eq!(admitted.len(), 1);
    }
}
