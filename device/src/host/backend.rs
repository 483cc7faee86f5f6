//! [`HostBackend`]: shared host memory as a device, alone (`"host"`) or standing in for one of
//! several, and the device threads that serve it.

use std::os::fd::OwnedFd;

use super::arena::HostArena;
use crate::backend::{BackendKind, DeviceInfo};
use crate::error::Result;
use crate::host_memory::HostMemory;
use crate::thread::{Arena, Backend, DeviceThread};

/// Shared host memory as a backend. Cheap to create; holds nothing but its description.
#[derive(Debug, Clone)]
pub struct HostBackend {
    info: DeviceInfo,
    memory: HostMemory,
}

impl HostBackend {
    /// A host backend; its total is `MemTotal` from `/proc/meminfo`, bounded by this process's
    /// cgroup memory limit (0 where unreadable), and its free memory `MemAvailable` bounded by
    /// the cgroup's room (see [`crate::host_memory`]).
    pub fn new() -> Self {
        Self::reading(HostMemory::default())
    }

    /// A host backend whose memory figures are read from `memory` (a fake `/proc` and cgroup
    /// tree in tests).
    pub fn reading(memory: HostMemory) -> Self {
        HostBackend {
            info: DeviceInfo {
                backend: BackendKind::Host,
                uuid: "host".into(),
                name: "host memory".into(),
                total_bytes: memory.total().unwrap_or(0),
                numa_node: None,
            },
            memory,
        }
    }
}

impl HostBackend {
    /// Host memory standing in for one of several devices, under its own `uuid` (placement
    /// and replicas run without a GPU). `"host"` is [`HostBackend::new`]'s.
    pub fn named(uuid: &str) -> Self {
        Self::named_reading(uuid, HostMemory::default())
    }

    /// [`HostBackend::named`], its memory figures read from `memory`.
    pub fn named_reading(uuid: &str, memory: HostMemory) -> Self {
        let mut backend = HostBackend::reading(memory);
        if uuid != backend.info.uuid {
            backend.info.name = format!("host memory ({uuid})");
            backend.info.uuid = uuid.to_owned();
        }
        backend
    }

    /// A device thread serving host memory (the same seam as a GPU's, so that everything
    /// above it is tested without one).
    pub fn thread() -> Result<DeviceThread> {
        Self::thread_named("host")
    }

    /// A device thread serving host memory as the device `uuid` (see [`HostBackend::named`]).
    pub fn thread_named(uuid: &str) -> Result<DeviceThread> {
        Self::thread_reading(uuid, HostMemory::default())
    }

    /// [`HostBackend::thread_named`], its memory figures read from `memory`.
    pub fn thread_reading(uuid: &str, memory: HostMemory) -> Result<DeviceThread> {
        let uuid = uuid.to_owned();
        DeviceThread::start(&format!("{uuid}-mem"), move || {
            Ok(Box::new(HostBackend::named_reading(&uuid, memory)) as Box<dyn Backend>)
        })
    }
}

impl Default for HostBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl Backend for HostBackend {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn allocate(&mut self, len: u64, label: &str) -> Result<Box<dyn Arena>> {
        Ok(Box::new(
            HostArena::new(len, label)?.on_device(&self.info.uuid),
        ))
    }

    fn used_bytes(&mut self) -> Option<u64> {
        None
    }

    fn free_bytes(&mut self) -> Option<u64> {
        self.memory.available()
    }

    fn adopt(&mut self, fd: OwnedFd, _alloc_len: u64, len: u64) -> Result<Box<dyn Arena>> {
        Ok(Box::new(
            HostArena::adopt(fd, len)?.on_device(&self.info.uuid),
        ))
    }
}
