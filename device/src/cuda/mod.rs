//! The CUDA backend: one arena per version, shared with workers either through **VMM**
//! (`cuMemCreate`, a POSIX file descriptor passed over the handle socket, mapped read-only by
//! workers) or through **legacy IPC** (`cuMemAlloc` + `CUipcMemHandle`, mappings writable),
//! and an inter-process ready event that orders a worker's first use of the arena after the
//! load on the device, with no host round trip. [`HandleChoice`] picks the kind per backend.
//!
//! # Layout
//! - [`sys`]: the `unsafe` driver calls, wrapped (the only `unsafe` of the backend).
//! - `context`: the driver, devices by ordinal or UUID, primary and gate contexts.
//! - [`event`]: the gated ready event (why it is recorded at allocation, in its own context).
//! - [`arena`]: the server side: allocation, export, and the writer that loads through pinned
//!   staging buffers with copies submitted to the device thread.
//! - [`checksum`]: the ms64 kernel, compiled when the backend opens.
//! - [`import`]: the worker side of legacy IPC ([`CudaMapping`]): the device found by UUID, the
//!   handle opened once per process (reference-counted), the ready event.
//! - [`vmm`]: the worker side of VMM ([`VmmMapping`]): the descriptor imported and mapped
//!   read-only, the ready event.
//!
//! [`CudaBackend`] lives on its device thread ([`crate::DeviceThread`]): open it with
//! [`CudaBackend::thread`].

mod arena;
mod checksum;
mod context;
mod event;
mod import;
#[allow(unsafe_code)] // The CUDA backend's `unsafe` driver calls; see its docs.
pub(crate) mod sys;
mod vmm;

use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

pub use arena::{STAGING_BYTES, STAGING_SLOTS};
pub use context::{device_count, init_driver, ordinal_of, primary as context, uuid as device_uuid};
pub use import::CudaMapping;
pub(crate) use import::import;
pub use vmm::VmmMapping;
pub(crate) use vmm::{import as import_vmm, reserve as reserve_vmm};

use self::arena::{ArenaParts, CudaArena, Staging, StagingPool};
use self::checksum::Ms64Kernel;
use crate::backend::{BackendKind, DeviceInfo};
use crate::error::{DeviceError, Result};
use crate::thread::{Arena, Backend, DeviceThread};

/// Which handles a CUDA backend shares arenas with (`--cuda-handles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HandleChoice {
    /// VMM when the device supports POSIX file-descriptor handles, else legacy IPC.
    #[default]
    Auto,
    /// VMM file descriptors (read-only mappings); refused where the device lacks them.
    Vmm,
    /// Legacy IPC handles (writable mappings; bytes in the attach reply, so usable by workers
    /// that cannot receive descriptors).
    Legacy,
}

impl HandleChoice {
    /// The kind of handle this choice gives on a device that does (`vmm_ok`) or does not
    /// support VMM file descriptors; `Err` names why a forced `vmm` cannot be had.
    fn resolve(self, vmm_ok: bool) -> Result<BackendKind> {
        match (self, vmm_ok) {
            (HandleChoice::Legacy, _) | (HandleChoice::Auto, false) => Ok(BackendKind::CudaIpc),
            (HandleChoice::Vmm | HandleChoice::Auto, true) => Ok(BackendKind::CudaVmm),
            (HandleChoice::Vmm, false) => Err(DeviceError::Unsupported {
                what: "VMM handles (--cuda-handles vmm): the device does not support POSIX \
                       file-descriptor handles (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_\
                       DESCRIPTOR_SUPPORTED); use --cuda-handles legacy or auto"
                    .into(),
            }),
        }
    }
}

/// The CUDA backend on one device. Lives on its device thread.
#[derive(Debug)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    gate_ctx: Arc<CudaContext>,
    info: DeviceInfo,
    staging: StagingPool,
    ms64: Option<Arc<Ms64Kernel>>,
}

impl CudaBackend {
    /// Starts a device thread for the device named by `selector` (an ordinal, `"0"`, or a UUID,
    /// `"GPU-…"`) and opens the backend on it, with staging buffers pinned for two loads of
    /// `load_threads` loading threads (8 MiB a thread), so that no load pays for pinning host
    /// memory (`cuMemHostAlloc` runs at a few GB/s). On a machine with several NUMA nodes the
    /// device thread is bound to the GPU's node first, so the buffers are there too.
    /// `handles` says how arenas are shared with workers.
    pub fn thread(
        selector: &str,
        load_threads: usize,
        handles: HandleChoice,
    ) -> Result<DeviceThread> {
        let selector = selector.to_owned();
        DeviceThread::start(&format!("cuda-{selector}"), move || {
            Ok(Box::new(CudaBackend::open(&selector, load_threads, handles)?) as Box<dyn Backend>)
        })
    }

    /// Opens the backend on the calling thread (which becomes its device thread).
    fn open(selector: &str, load_threads: usize, handles: HandleChoice) -> Result<Self> {
        let ordinal = context::resolve(selector)?;
        let ctx = context::primary(ordinal)?;
        let vmm_ok = sys::fd_handles_supported(&ctx)?;
        let kind = handles.resolve(vmm_ok)?;
        tracing::info!(
            handles = match kind {
                BackendKind::CudaVmm => "vmm",
                _ => "legacy",
            },
            asked = ?handles,
            vmm_supported = vmm_ok,
            "CUDA arena handles: {}",
            match kind {
                BackendKind::CudaVmm =>
                    "VMM file descriptors over the handle socket; workers map arenas read-only",
                _ => "legacy IPC; workers' mappings of arenas are WRITABLE",
            }
        );
        let ms64 = warm_checksum_kernel(&ctx);
        let numa_node = place_on_numa_node(&ctx);
        let started = std::time::Instant::now();
        // For two loads at once (they take turns through the server's chunk gate, each with
        // its own threads and buffers).
        let staging: Vec<Staging> = (0..load_threads * STAGING_SLOTS * 2)
            .map(|_| Staging::new(&ctx))
            .collect::<Result<_>>()?;
        tracing::info!(
            buffers = staging.len(),
            mib = (staging.len() * STAGING_BYTES) >> 20,
            seconds = started.elapsed().as_secs_f64(),
            "pinned the staging buffers"
        );
        let gate_ctx = context::separate(ordinal)?;
        let cuda = |op| move |e| DeviceError::Cuda { op, source: e };
        let info = DeviceInfo {
            backend: kind,
            uuid: context::uuid(ordinal)?,
            name: ctx.name().map_err(cuda("cuDeviceGetName"))?,
            total_bytes: ctx.total_mem().map_err(cuda("cuDeviceTotalMem"))? as u64,
            numa_node,
        };
        Ok(Self {
            ctx,
            gate_ctx,
            info,
            staging: Arc::new(Mutex::new(staging)),
            ms64,
        })
    }
}

impl CudaBackend {
    fn parts(&self) -> ArenaParts<'_> {
        ArenaParts {
            ctx: &self.ctx,
            gate_ctx: &self.gate_ctx,
            staging: self.staging.clone(),
            ms64: self.ms64.clone(),
            device_uuid: &self.info.uuid,
        }
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn allocate(&mut self, len: u64, _label: &str) -> Result<Box<dyn Arena>> {
        Ok(Box::new(CudaArena::new(
            self.parts(),
            len,
            self.info.backend,
        )?))
    }

    fn adopt(&mut self, fd: OwnedFd, alloc_len: u64, len: u64) -> Result<Box<dyn Arena>> {
        if self.info.backend != BackendKind::CudaVmm {
            return Err(DeviceError::Unsupported {
                what: "adopting an arena on a server sharing legacy IPC handles".into(),
            });
        }
        Ok(Box::new(CudaArena::adopt(
            self.parts(),
            fd,
            alloc_len,
            len,
        )?))
    }

    fn used_bytes(&mut self) -> Option<u64> {
        self.ctx.bind_to_thread().ok()?;
        let (free, total) = self.ctx.mem_get_info().ok()?;
        Some((total - free) as u64)
    }

    fn free_bytes(&mut self) -> Option<u64> {
        self.ctx.bind_to_thread().ok()?;
        let (free, _) = self.ctx.mem_get_info().ok()?;
        Some(free as u64)
    }
}

/// The GPU's NUMA node where the machine has several: the calling (device) thread is bound to
/// its CPUs, so that memory it pins from now on (the staging buffers) is allocated there.
fn place_on_numa_node(ctx: &Arc<CudaContext>) -> Option<u32> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    let attr = |a| ctx.attribute(a).ok();
    let (domain, bus, dev) = (
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID)?,
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID)?,
        attr(A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID)?,
    );
    let bus_id = format!("{domain:04x}:{bus:02x}:{dev:02x}.0");
    let Some(node) = crate::numa::node_of_pci(&bus_id) else {
        tracing::info!(pci = %bus_id, "NUMA: one node, or the GPU's is not known: no placement");
        return None;
    };
    let cpus = crate::numa::cpus_of(node)?;
    match crate::numa::pin_current_thread(&cpus) {
        Ok(()) => tracing::info!(pci = %bus_id, node, cpus = cpus.len(),
            "NUMA: the device thread and its staging buffers are on the GPU's node"),
        Err(e) => tracing::warn!(pci = %bus_id, node, error = %e,
            "NUMA: could not bind the device thread to the GPU's node"),
    }
    Some(node)
}

/// Compiles the checksum kernel and runs it once, so that it is loaded before any gate exists
/// (see [`event`]). Without NVRTC the backend works and reports no device checksums.
fn warm_checksum_kernel(ctx: &Arc<CudaContext>) -> Option<Arc<Ms64Kernel>> {
    let warm = || -> Result<Arc<Ms64Kernel>> {
        let kernel = Ms64Kernel::load(ctx)?;
        let mem = sys::DeviceMemory::alloc(ctx, 256)?;
        let stream = ctx.new_stream().map_err(|e| DeviceError::Cuda {
            op: "cuStreamCreate",
            source: e,
        })?;
        kernel.run_many(&stream, &mem, &[(0, 256)])?;
        Ok(Arc::new(kernel))
    };
    match warm() {
        Ok(k) => Some(k),
        Err(e) => {
            tracing::warn!(error = %e, "device checksums (ms64) disabled: the checksum kernel cannot run");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` no longer takes VMM where the device supports it (or legacy where it does not),
    /// or a forced `vmm` on a device without it no longer fails with a message naming the flag.
    #[test]
    fn handle_choice_resolves_against_device_support() {
        assert_eq!(
            HandleChoice::Auto.resolve(true).unwrap(),
            BackendKind::CudaVmm
        );
        assert_eq!(
            HandleChoice::Auto.resolve(false).unwrap(),
            BackendKind::CudaIpc
        );
        assert_eq!(
            HandleChoice::Legacy.resolve(true).unwrap(),
            BackendKind::CudaIpc
        );
        assert_eq!(
            HandleChoice::Vmm.resolve(true).unwrap(),
            BackendKind::CudaVmm
        );
        let err = HandleChoice::Vmm.resolve(false).unwrap_err().to_string();
        assert!(err.contains("--cuda-handles"), "{err}");
    }
}
