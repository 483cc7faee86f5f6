//! The CUDA backend (legacy IPC): one `cuMemAlloc` arena per version, shared with workers by
//! `CUipcMemHandle`, and an inter-process ready event that orders a worker's first use of the
//! arena after the load on the device, with no host round trip.
//!
//! # Layout
//! - [`sys`]: the `unsafe` driver calls, wrapped (the only `unsafe` of the backend).
//! - `context`: the driver, devices by ordinal or UUID, primary and gate contexts.
//! - [`event`]: the gated ready event (why it is recorded at allocation, in its own context).
//! - [`arena`]: the server side: allocation, export, and the writer that loads through pinned
//!   staging buffers with copies submitted to the device thread.
//! - [`checksum`]: the ms64 kernel, compiled when the backend opens.
//! - [`import`]: the worker side ([`CudaMapping`]): the device found by UUID, the handle opened
//!   once per process (reference-counted), the ready event.
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

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

pub use arena::{STAGING_BYTES, STAGING_SLOTS};
pub use context::{device_count, init_driver, ordinal_of, primary as context};
pub use import::CudaMapping;
pub(crate) use import::import;

use self::arena::{CudaArena, Staging, StagingPool};
use self::checksum::Ms64Kernel;
use crate::backend::{BackendKind, DeviceInfo};
use crate::error::{DeviceError, Result};
use crate::thread::{Arena, Backend, DeviceThread};

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
    /// `"GPU-…"`) and opens the backend on it, with staging buffers pinned for `load_threads`
    /// loading threads (64 MiB a thread), so that no load pays for pinning host memory
    /// (`cuMemHostAlloc` runs at a few GB/s).
    pub fn thread(selector: &str, load_threads: usize) -> Result<DeviceThread> {
        let selector = selector.to_owned();
        DeviceThread::start(&format!("cuda-{selector}"), move || {
            Ok(Box::new(CudaBackend::open(&selector, load_threads)?) as Box<dyn Backend>)
        })
    }

    /// Opens the backend on the calling thread (which becomes its device thread).
    fn open(selector: &str, load_threads: usize) -> Result<Self> {
        let ordinal = context::resolve(selector)?;
        let ctx = context::primary(ordinal)?;
        let ms64 = warm_checksum_kernel(&ctx);
        let started = std::time::Instant::now();
        let staging: Vec<Staging> = (0..load_threads * STAGING_SLOTS)
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
            backend: BackendKind::CudaIpc,
            uuid: context::uuid(ordinal)?,
            name: ctx.name().map_err(cuda("cuDeviceGetName"))?,
            total_bytes: ctx.total_mem().map_err(cuda("cuDeviceTotalMem"))? as u64,
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

impl Backend for CudaBackend {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn allocate(&mut self, len: u64, _label: &str) -> Result<Box<dyn Arena>> {
        Ok(Box::new(CudaArena::new(
            &self.ctx,
            &self.gate_ctx,
            len,
            self.staging.clone(),
            self.ms64.clone(),
            self.info.uuid.clone(),
        )?))
    }

    fn used_bytes(&mut self) -> Option<u64> {
        self.ctx.bind_to_thread().ok()?;
        let (free, total) = self.ctx.mem_get_info().ok()?;
        Some((total - free) as u64)
    }
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
        kernel.run(&stream, &mem, 0, 256)?;
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
