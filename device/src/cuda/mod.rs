//! The CUDA backend (legacy IPC): one `cuMemAlloc` arena per version, shared with workers by
//! `CUipcMemHandle`, and an inter-process **ready event** that orders a worker's first use of
//! the arena after the load on the device, with no host round trip.
//!
//! # The ready event
//! A worker may attach while a version is still loading. The arena's ready event is recorded
//! *when the arena is created*, on a gate stream, behind a host function that blocks until the
//! load is complete ([`sys::Gate`]). A worker's `cuStreamWaitEvent` therefore always refers to a
//! record that has been issued and that completes only after the last copy: its kernels wait on
//! the device. (Waiting on an event that was never recorded would not wait at all.) A failed
//! load opens the gate too ([`crate::Arena::abandon`]); the server then ends the sessions that
//! held the version.
//!
//! The gate streams and ready events live in a **separate (non-primary) context** of the same
//! device. A stream blocked on a gate must never be waited for by a context-wide
//! synchronisation of the working context, which several driver calls perform implicitly
//! (`cuMemFree`, lazy kernel loading): in one context, freeing another version's arena during
//! a load, or the first launch of a kernel, would wait for the gate, and the gate for the load.
//! For the same reason the checksum kernel is loaded once when the backend opens.
//!
//! # Layout
//! - `sys`: the `unsafe` driver calls, wrapped.
//! - [`CudaBackend`] / `CudaArena` / `CudaWriter`: the server side (allocation, pinned staging
//!   buffers and asynchronous copies, export).
//! - [`import`]: the worker side ([`CudaMapping`]): the device found by UUID, the handle opened
//!   once per process (reference-counted), the ready event.

pub mod import;
#[allow(unsafe_code)] // The CUDA backend's `unsafe` driver calls; see its docs.
pub(crate) mod sys;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream};
use modelshare_kernels::KernelCache;

pub use import::CudaMapping;

use crate::backend::{
    Arena, ArenaWriter, Backend, BackendKind, DeviceInfo, ExportedHandle, check_range,
};
use crate::error::{DeviceError, Result};

/// Bytes of one pinned staging buffer.
pub const STAGING_BYTES: usize = 16 << 20;
/// Staging buffers per writer (copies in flight per loading thread).
pub const STAGING_SLOTS: usize = 4;

/// Checks that the driver library is there, then initialises it.
pub fn init_driver() -> Result<()> {
    if !sys::driver_present() {
        return Err(DeviceError::LibraryMissing {
            library: "libcuda.so (the CUDA driver)".into(),
            hint: "install the NVIDIA driver, or add its directory (e.g. /usr/local/nvidia/lib64) to LD_LIBRARY_PATH".into(),
        });
    }
    sys::init()
}

/// How many CUDA devices this process sees. Fails (naming the library) if the driver is
/// missing. Creates no context, so it is cheap enough to decide `--backend auto`.
pub fn device_count() -> Result<usize> {
    init_driver()?;
    sys::device_count()
}

/// The ordinal of the device with `uuid` (`GPU-…`), as this process numbers devices (which
/// depends on its `CUDA_VISIBLE_DEVICES`).
pub fn ordinal_of(uuid: &str) -> Result<usize> {
    init_driver()?;
    for ordinal in 0..sys::device_count()? {
        if sys::device_uuid(ordinal)?.eq_ignore_ascii_case(uuid) {
            return Ok(ordinal);
        }
    }
    Err(DeviceError::NoSuchDevice {
        device: uuid.to_owned(),
        reason: "no visible device has this UUID (check CUDA_VISIBLE_DEVICES)".into(),
    })
}

/// The primary context of `ordinal`, shared by everything in this process.
pub fn context(ordinal: usize) -> Result<Arc<CudaContext>> {
    static CONTEXTS: Mutex<Vec<(usize, Arc<CudaContext>)>> = Mutex::new(Vec::new());
    let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, c)) = all.iter().find(|(o, _)| *o == ordinal) {
        return Ok(c.clone());
    }
    let ctx = CudaContext::new(ordinal).map_err(|e| DeviceError::NoSuchDevice {
        device: ordinal.to_string(),
        reason: format!("cannot create its context: {e}"),
    })?;
    all.push((ordinal, ctx.clone()));
    Ok(ctx)
}

fn cuda(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> DeviceError {
    move |e| DeviceError::Cuda { op, source: e }
}

/// The CUDA backend on one device.
#[derive(Debug)]
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    info: DeviceInfo,
    staging: Arc<Mutex<Vec<sys::Pinned>>>,
    kernels: Option<Arc<KernelCache>>,
    gate_ctx: Arc<CudaContext>,
}

impl CudaBackend {
    /// Opens the device named by `selector`: an ordinal (`"0"`), or a UUID (`"GPU-…"`), with
    /// staging buffers pinned for `load_threads` loading threads, so that no load pays for
    /// pinning host memory (`cuMemHostAlloc` runs at a few GB/s): 64 MiB a thread.
    pub fn open(selector: &str, load_threads: usize) -> Result<Self> {
        init_driver()?;
        let ordinal = if selector.to_ascii_uppercase().starts_with("GPU-") {
            ordinal_of(selector)?
        } else {
            let n: usize = selector.parse().map_err(|_| DeviceError::NoSuchDevice {
                device: selector.to_owned(),
                reason: "expected an ordinal (0, 1, ...) or a UUID (GPU-...)".into(),
            })?;
            let count = sys::device_count()?;
            if n >= count {
                return Err(DeviceError::NoSuchDevice {
                    device: selector.to_owned(),
                    reason: format!("{count} device(s) visible"),
                });
            }
            n
        };
        let ctx = context(ordinal)?;
        let kernels = warm_checksum_kernel(&ctx);
        let started = std::time::Instant::now();
        let staging: Vec<sys::Pinned> = (0..load_threads * STAGING_SLOTS)
            .map(|_| sys::Pinned::new(&ctx, STAGING_BYTES))
            .collect::<Result<_>>()?;
        tracing::info!(
            buffers = staging.len(),
            mib = (staging.len() * STAGING_BYTES) >> 20,
            seconds = started.elapsed().as_secs_f64(),
            "pinned the staging buffers"
        );
        let gate_ctx = CudaContext::new_non_primary(ordinal, 0).map_err(cuda("cuCtxCreate"))?;
        let info = DeviceInfo {
            backend: BackendKind::CudaIpc,
            uuid: sys::device_uuid(ordinal)?,
            name: ctx.name().map_err(cuda("cuDeviceGetName"))?,
            total_bytes: ctx.total_mem().map_err(cuda("cuDeviceTotalMem"))? as u64,
        };
        Ok(Self {
            ctx,
            info,
            staging: Arc::new(Mutex::new(staging)),
            kernels,
            gate_ctx,
        })
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Backend for CudaBackend {
    fn info(&self) -> DeviceInfo {
        self.info.clone()
    }

    fn allocate(&self, len: u64, _label: &str) -> Result<Box<dyn Arena>> {
        Ok(Box::new(CudaArena::new(
            self.ctx.clone(),
            len,
            self.staging.clone(),
            self.kernels.clone(),
            self.gate_ctx.clone(),
            self.info.uuid.clone(),
        )?))
    }

    fn used_bytes(&self) -> Option<u64> {
        self.ctx.bind_to_thread().ok()?;
        let (free, total) = self.ctx.mem_get_info().ok()?;
        Some((total - free) as u64)
    }
}

/// Compiles and runs the checksum kernel once, so that it is loaded before any gate exists (see
/// the module docs). Without NVRTC the backend works and reports no device checksums.
fn warm_checksum_kernel(ctx: &Arc<CudaContext>) -> Option<Arc<KernelCache>> {
    let warm = || -> Result<Arc<KernelCache>> {
        let kernels = Arc::new(KernelCache::new());
        let mem = sys::DeviceMemory::alloc(ctx, 256)?;
        let stream = ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        sys::ms64(&kernels, &stream, &mem, 0, 256)?;
        Ok(kernels)
    };
    match warm() {
        Ok(k) => Some(k),
        Err(e) => {
            tracing::warn!(error = %e, "device checksums (ms64) disabled: the checksum kernel cannot run");
            None
        }
    }
}

/// One arena in device memory, with its gated ready event.
#[derive(Debug)]
pub struct CudaArena {
    ctx: Arc<CudaContext>,
    mem: sys::DeviceMemory,
    len: u64,
    ready: sys::Event,
    gate: Arc<sys::Gate>,
    gate_stream: Arc<CudaStream>,
    sealed: AtomicBool,
    staging: Arc<Mutex<Vec<sys::Pinned>>>,
    kernels: Option<Arc<KernelCache>>,
    gate_ctx: Arc<CudaContext>,
    device_uuid: String,
}

impl CudaArena {
    fn new(
        ctx: Arc<CudaContext>,
        len: u64,
        staging: Arc<Mutex<Vec<sys::Pinned>>>,
        kernels: Option<Arc<KernelCache>>,
        gate_ctx: Arc<CudaContext>,
        device_uuid: String,
    ) -> Result<Self> {
        let mem = sys::DeviceMemory::alloc(&ctx, len)?;
        let ready = sys::Event::interprocess(&gate_ctx)?;
        let gate = Arc::new(sys::Gate::default());
        gate_ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let gate_stream = gate_ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        sys::enqueue_gate(&gate_stream, &gate)?;
        if let Err(e) = ready.record(&gate_stream) {
            gate.open();
            return Err(e);
        }
        Ok(Self {
            ctx,
            mem,
            len,
            ready,
            gate,
            gate_stream,
            sealed: AtomicBool::new(false),
            staging,
            kernels,
            gate_ctx,
            device_uuid,
        })
    }
}

impl CudaArena {
    /// The arena's device address in the server process (kernels the server runs on it).
    pub fn device_ptr(&self) -> u64 {
        self.mem.ptr()
    }

    /// The arena's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

impl Arena for CudaArena {
    fn len(&self) -> u64 {
        self.len
    }

    fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        check_range("write", offset, bytes.len(), self.len)?;
        if self.sealed.load(Ordering::SeqCst) {
            return Err(DeviceError::Sealed);
        }
        self.mem.write(offset, bytes)
    }

    fn seal(&self) -> Result<()> {
        if !self.sealed.swap(true, Ordering::SeqCst) {
            self.gate.open();
        }
        Ok(())
    }

    fn export(&self) -> Result<ExportedHandle> {
        Ok(ExportedHandle::CudaIpc {
            mem: self.mem.ipc_handle()?,
            event: self.ready.ipc_handle()?,
            device_uuid: self.device_uuid.clone(),
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range("read", offset, buf.len(), self.len)?;
        self.mem.read(offset, buf)
    }

    fn writer(&self) -> Result<Box<dyn ArenaWriter + '_>> {
        self.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let stream = self.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        Ok(Box::new(CudaWriter {
            arena: self,
            stream,
            slots: Vec::new(),
            next: 0,
            current: None,
        }))
    }

    fn attach_while_loading(&self) -> bool {
        true
    }

    fn device_checksums(&self, ranges: &[(u64, u64)]) -> Result<Option<Vec<u64>>> {
        let Some(kernels) = &self.kernels else {
            return Ok(None);
        };
        self.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let stream = self.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let mut out = Vec::with_capacity(ranges.len());
        for &(offset, len) in ranges {
            let n = usize::try_from(len).map_err(|_| DeviceError::OutOfRange {
                op: "checksum",
                offset,
                len,
                arena_len: self.len,
            })?;
            check_range("checksum", offset, n, self.len)?;
            out.push(sys::ms64(kernels, &stream, &self.mem, offset, n)?);
        }
        Ok(Some(out))
    }

    fn abandon(&self) {
        self.gate.open();
    }
}

impl Drop for CudaArena {
    fn drop(&mut self) {
        // Never leave the gate stream blocked: open the gate, let the stream drain, then the
        // event and the memory go (fields drop after this).
        self.gate.open();
        if self.gate_ctx.bind_to_thread().is_ok()
            && let Err(e) = self.gate_stream.synchronize()
        {
            tracing::warn!(error = %e, "gate stream did not drain");
        }
    }
}

/// A staging buffer and the event that says its last copy is done.
#[derive(Debug)]
struct Slot {
    buf: sys::Pinned,
    done: sys::Event,
    in_flight: bool,
}

/// Loads through pinned staging buffers: a read fills one buffer while earlier buffers are
/// being copied to the device on this writer's stream.
#[derive(Debug)]
struct CudaWriter<'a> {
    arena: &'a CudaArena,
    stream: Arc<CudaStream>,
    slots: Vec<Slot>,
    next: usize,
    current: Option<usize>,
}

impl CudaWriter<'_> {
    fn slot(&mut self) -> Result<usize> {
        if self.slots.len() < STAGING_SLOTS {
            let pooled = self
                .arena
                .staging
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop();
            let buf = match pooled {
                Some(b) => b,
                None => sys::Pinned::new(&self.arena.ctx, STAGING_BYTES)?,
            };
            let done = match sys::Event::plain(&self.arena.ctx) {
                Ok(ev) => ev,
                Err(e) => {
                    self.arena
                        .staging
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(buf);
                    return Err(e);
                }
            };
            self.slots.push(Slot {
                buf,
                done,
                in_flight: false,
            });
            return Ok(self.slots.len() - 1);
        }
        let i = self.next % STAGING_SLOTS;
        self.next += 1;
        let slot = &mut self.slots[i];
        if slot.in_flight {
            slot.done.synchronize()?;
            slot.in_flight = false;
        }
        Ok(i)
    }
}

impl ArenaWriter for CudaWriter<'_> {
    fn buffer(&mut self, max: usize) -> Result<&mut [u8]> {
        let i = self.slot()?;
        self.current = Some(i);
        let buf = self.slots[i].buf.as_mut_slice();
        let n = max.min(buf.len());
        Ok(&mut buf[..n])
    }

    fn submit(&mut self, offset: u64, len: usize) -> Result<()> {
        let i = self.current.take().ok_or(DeviceError::Protocol {
            reason: "submit without a buffer".into(),
        })?;
        if self.arena.sealed.load(Ordering::SeqCst) {
            return Err(DeviceError::Sealed);
        }
        let slot = &mut self.slots[i];
        self.arena
            .mem
            .write_async(offset, &slot.buf, len, &self.stream)?;
        slot.done.record(&self.stream)?;
        slot.in_flight = true;
        Ok(())
    }

    fn finish(self: Box<Self>) -> Result<()> {
        // The buffers go back to the pool when `self` drops.
        self.stream
            .synchronize()
            .map_err(cuda("cuStreamSynchronize"))
    }
}

impl Drop for CudaWriter<'_> {
    fn drop(&mut self) {
        if self.arena.ctx.bind_to_thread().is_ok() {
            let _ = self.stream.synchronize();
        }
        let mut pool = self.arena.staging.lock().unwrap_or_else(|e| e.into_inner());
        for slot in self.slots.drain(..) {
            pool.push(slot.buf);
        }
    }
}
