//! Server side of the CUDA backend: one arena per version with its gated ready event, and the
//! writer that loads it. The arena is exported one of two ways, chosen per backend:
//! - **VMM** (`cuMemCreate`): a POSIX file descriptor of the allocation, exported once at
//!   allocation and `dup`ed for each attach (it travels by the handle socket), plus the ready
//!   event's IPC handle; workers map it read-only.
//! - **legacy IPC** (`cuMemAlloc`): the `CUipcMemHandle` and the event handle, bytes in the
//!   attach reply; workers' mappings are writable.
//!
//! # Loading
//! A loading thread gets a [`CudaWriter`] holding pinned staging buffers (each with an event).
//! It fills a buffer from the file (plain host memory: no driver call), then *submits* it: the
//! device thread enqueues `cuMemcpyHtoDAsync` on the writer's stream, records the buffer's
//! event, and watches the event; when the copy is done the buffer travels back to the loading
//! thread on a channel. So a file read overlaps up to [`STAGING_SLOTS`] copies per thread, and
//! every driver call happens on the device thread, none of them blocking it.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaStream};

use super::checksum::Ms64Kernel;
use super::event::ReadyEvent;
use super::sys;
use crate::backend::{ArenaReader, ArenaWriter, BackendKind, check_range};
use crate::error::{DeviceError, Result};
use crate::export::{Export, Handles};
use crate::thread::{Arena, ArenaHandle, DeviceCtx, Executor, OnDevice};

/// Bytes of one pinned staging buffer: 4 MiB of a chunk, and one page more so that a direct
/// read of a chunk starting at an unaligned file offset fits (see [`ArenaWriter`]).
///
/// Small on purpose: with two per thread, 16 threads stage in 128 MiB, which stays in the
/// CPU's last-level cache, so the device's DMA reads the staged bytes from the cache rather
/// than from DRAM. Measured on an H100 host (16 threads, warm 8 GiB; BENCHMARKS.md, "Loader
/// probe"): 16 MiB x 4 slots (1 GiB staged) 39-40 GB/s; 4 MiB x 2, 47.9-49.9 GB/s.
pub const STAGING_BYTES: usize = (4 << 20) + crate::backend::PAGE;
/// Staging buffers per writer (copies in flight per loading thread).
pub const STAGING_SLOTS: usize = 2;

/// A pinned staging buffer and the event that says its last copy is done.
#[derive(Debug)]
pub(crate) struct Staging {
    buf: sys::Pinned,
    done: sys::Event,
}

impl Staging {
    /// A new buffer of [`STAGING_BYTES`] for `ctx` (on the device thread).
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        Ok(Self {
            buf: sys::Pinned::new(ctx, STAGING_BYTES)?,
            done: sys::Event::plain(ctx)?,
        })
    }
}

/// Staging buffers not in use, shared by the arenas of one backend (device thread only).
pub(crate) type StagingPool = Arc<Mutex<Vec<Staging>>>;

fn cuda(op: &'static str) -> impl Fn(cudarc::driver::DriverError) -> DeviceError {
    move |e| DeviceError::Cuda { op, source: e }
}

/// One arena in device memory, with its gated ready event.
#[derive(Debug)]
pub(crate) struct CudaArena {
    ctx: Arc<CudaContext>,
    mem: Arc<sys::DeviceMemory>,
    len: u64,
    ready: ReadyEvent,
    sealed: Arc<AtomicBool>,
    staging: StagingPool,
    ms64: Option<Arc<Ms64Kernel>>,
    /// What every attach gets, taken once at allocation: the handles (legacy: memory and
    /// ready event; VMM: the ready event), without a descriptor.
    export: Export,
    /// The allocation's descriptor (VMM), `dup`ed for each attach.
    fd: Option<OwnedFd>,
}

impl CudaArena {
    /// A new arena of `len` bytes shared as `kind` (`CudaVmm` or `CudaIpc`).
    pub(crate) fn new(parts: ArenaParts<'_>, len: u64, kind: BackendKind) -> Result<Self> {
        if kind == BackendKind::CudaVmm {
            let mem = sys::DeviceMemory::alloc_vmm(parts.ctx, len)?;
            let fd = mem.export_fd()?;
            Self::assemble(parts, mem, Some(fd), false)
        } else {
            let mem = sys::DeviceMemory::alloc(parts.ctx, len)?;
            Self::assemble(parts, mem, None, false)
        }
    }

    /// A VMM arena a worker kept alive across a server restart, from its descriptor `fd` (an
    /// allocation of `alloc_len` bytes holding `len`): mapped read-write here, sealed, its
    /// ready event already complete. The caller checks the bytes.
    pub(crate) fn adopt(
        parts: ArenaParts<'_>,
        fd: OwnedFd,
        alloc_len: u64,
        len: u64,
    ) -> Result<Self> {
        use std::os::fd::AsFd;
        let mem = sys::DeviceMemory::import_vmm(parts.ctx, fd.as_fd(), alloc_len, len)?;
        Self::assemble(parts, mem, Some(fd), true)
    }

    /// What a writer or reader copies with: the arena's memory on a stream of its own, and
    /// the backend's staging pool (both released on the device thread).
    fn copier(&self, this: &ArenaHandle) -> Result<Copier> {
        self.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let stream = self.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        let exec = this.executor();
        let target = CopyTarget {
            mem: self.mem.clone(),
            stream,
            sealed: self.sealed.clone(),
        };
        Ok((
            Arc::new(OnDevice::new(target, exec.clone())),
            Arc::new(OnDevice::new(self.staging.clone(), exec.clone())),
        ))
    }

    fn assemble(
        parts: ArenaParts<'_>,
        mem: sys::DeviceMemory,
        fd: Option<OwnedFd>,
        sealed: bool,
    ) -> Result<Self> {
        let len = mem.len();
        let mem = Arc::new(mem);
        let ready = ReadyEvent::gated(parts.gate_ctx)?;
        let event = ready.ipc_handle()?.to_vec();
        let handles = if fd.is_some() {
            Handles::CudaVmm { event }
        } else {
            Handles::CudaIpc {
                memory: mem.ipc_handle()?.to_vec(),
                event,
            }
        };
        if sealed {
            ready.open();
        }
        let export = Export {
            device_uuid: parts.device_uuid.to_owned(),
            handles,
            fd: None,
            alloc_len: mem.vmm_size().unwrap_or(0),
        };
        Ok(Self {
            ctx: parts.ctx.clone(),
            mem,
            len,
            ready,
            sealed: Arc::new(AtomicBool::new(sealed)),
            staging: parts.staging,
            ms64: parts.ms64,
            export,
            fd,
        })
    }
}

/// What every arena of one backend shares.
pub(crate) struct ArenaParts<'a> {
    pub(crate) ctx: &'a Arc<CudaContext>,
    pub(crate) gate_ctx: &'a Arc<CudaContext>,
    pub(crate) staging: StagingPool,
    pub(crate) ms64: Option<Arc<Ms64Kernel>>,
    pub(crate) device_uuid: &'a str,
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
            self.ready.open();
        }
        Ok(())
    }

    fn export(&self) -> Result<Export> {
        let mut export = self.export.without_fd().ok_or(DeviceError::Unsupported {
            what: "a CUDA export with a descriptor at allocation".into(),
        })?;
        if let Some(fd) = &self.fd {
            export.fd = Some(fd.try_clone().map_err(|e| DeviceError::Io {
                op: "dup of the arena's descriptor",
                source: e,
            })?);
        }
        Ok(export)
    }

    fn fixed_export(&self) -> Option<Export> {
        // A VMM export needs a descriptor of its own for each attach.
        if self.fd.is_some() {
            return None;
        }
        self.export.without_fd()
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_range("read", offset, buf.len(), self.len)?;
        self.mem.read(offset, buf)
    }

    fn writer(&self, this: &ArenaHandle) -> Result<Box<dyn ArenaWriter + Send>> {
        let (target, pool) = self.copier(this)?;
        let mut idle = Vec::with_capacity(STAGING_SLOTS);
        for _ in 0..STAGING_SLOTS {
            let pooled = self.staging.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match pooled.map_or_else(|| Staging::new(&self.ctx), Ok) {
                Ok(s) => idle.push(s),
                Err(e) => {
                    self.staging
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .extend(idle);
                    return Err(e);
                }
            }
        }
        let (back_tx, back_rx) = mpsc::channel();
        Ok(Box::new(CudaWriter {
            exec: this.executor().clone(),
            target,
            pool,
            idle,
            current: None,
            in_flight: 0,
            back_tx: Some(back_tx),
            back_rx,
        }))
    }

    fn reader(&self, this: &ArenaHandle) -> Result<Box<dyn ArenaReader + Send>> {
        let (target, pool) = self.copier(this)?;
        let pooled = self.staging.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let staging = pooled.map_or_else(|| Staging::new(&self.ctx), Ok)?;
        Ok(Box::new(CudaReader {
            exec: this.executor().clone(),
            target,
            pool,
            staging: Some(staging),
        }))
    }

    fn attach_while_loading(&self) -> bool {
        true
    }

    fn device_checksums(&self, ranges: &[(u64, u64)]) -> Result<Option<Vec<u64>>> {
        let Some(ms64) = &self.ms64 else {
            return Ok(None);
        };
        self.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let stream = self.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        ms64.run_many(&stream, &self.mem, ranges).map(Some)
    }

    fn abandon(&self) {
        self.ready.open();
    }

    fn ordinal(&self) -> Option<usize> {
        Some(self.ctx.ordinal())
    }

    fn peer_source(&self, to: Option<usize>) -> Result<crate::PeerSource> {
        if !self.sealed.load(Ordering::SeqCst) {
            return Err(DeviceError::NotSealed);
        }
        if let Some(to) = to
            && to != self.ctx.ordinal()
        {
            self.mem.grant_read(to)?;
        }
        Ok(crate::PeerSource::Cuda {
            ctx: self.ctx.clone(),
            ptr: self.mem.ptr(),
            len: self.len,
        })
    }

    /// Device to device over NVLink or PCIe (`cuMemcpyPeerAsync`), peer access enabled first
    /// where the two devices allow it; returns once the copy is done. The ready event stays
    /// closed until the caller seals the arena.
    fn copy_from(&self, source: &crate::PeerSource) -> Result<()> {
        let crate::PeerSource::Cuda { ctx, ptr, len } = source else {
            return Err(DeviceError::Unsupported {
                what: "a CUDA arena copied from host memory".into(),
            });
        };
        if self.sealed.load(Ordering::SeqCst) {
            return Err(DeviceError::Sealed);
        }
        let direct = if ctx.ordinal() == self.ctx.ordinal() {
            true
        } else {
            sys::enable_peer_access(&self.ctx, ctx)?
        };
        tracing::debug!(
            from = ctx.ordinal(),
            to = self.ctx.ordinal(),
            peer_to_peer = direct,
            bytes = len,
            "replica copy"
        );
        self.ctx.bind_to_thread().map_err(cuda("cuCtxSetCurrent"))?;
        let stream = self.ctx.new_stream().map_err(cuda("cuStreamCreate"))?;
        self.mem.copy_from_peer(ctx, *ptr, *len, &stream)
    }
}

/// Where a writer's copies go: the arena's memory, on the writer's own stream.
#[derive(Debug)]
struct CopyTarget {
    mem: Arc<sys::DeviceMemory>,
    stream: Arc<CudaStream>,
    sealed: Arc<AtomicBool>,
}

/// A writer's or reader's copy target and the staging pool it returns buffers to.
type Copier = (Arc<OnDevice<CopyTarget>>, Arc<OnDevice<StagingPool>>);

/// A staging buffer coming back from the device thread, with how its copy went.
type Returned = (Staging, Result<()>);

/// Watches `staging`'s event (recorded after its copy) on the device thread, and sends the
/// buffer back on `back` once the copy is done, with the event's error if it failed.
fn send_back_when_done(ctx: &mut DeviceCtx, staging: Staging, back: mpsc::Sender<Returned>) {
    let mut pending = Some(staging);
    ctx.watch(Box::new(move || {
        let Some(s) = pending.as_ref() else {
            return true;
        };
        let result = match s.done.is_done() {
            Ok(false) => return false,
            Ok(true) => Ok(()),
            Err(e) => Err(e),
        };
        if let Some(s) = pending.take() {
            let _ = back.send((s, result));
        }
        true
    }));
}

/// Loads through pinned staging buffers: a read fills one buffer while earlier buffers are
/// being copied to the device (see the module docs).
#[derive(Debug)]
struct CudaWriter {
    exec: Executor,
    target: Arc<OnDevice<CopyTarget>>,
    pool: Arc<OnDevice<StagingPool>>,
    idle: Vec<Staging>,
    /// The buffer being filled, and the arena offset it was asked for.
    current: Option<(Staging, u64)>,
    in_flight: usize,
    /// Cloned into each submitted copy's watch; dropped when the writer stops submitting, so
    /// that waiting for what is in flight ends if the device thread is gone.
    back_tx: Option<mpsc::Sender<Returned>>,
    back_rx: mpsc::Receiver<Returned>,
}

impl CudaWriter {
    /// Waits for one buffer in flight to come back; its copy's error, if any, is returned
    /// after the buffer is idle again.
    fn reclaim_one(&mut self) -> Result<()> {
        let (staging, result) = self.back_rx.recv().map_err(|_| DeviceError::ThreadGone)?;
        self.in_flight -= 1;
        self.idle.push(staging);
        result
    }

    /// Takes back every buffer in flight (submitting nothing more); the first copy error, if
    /// any. Ends early if the device thread is gone: what it had in flight will not come back.
    fn drain(&mut self) -> Result<()> {
        self.back_tx = None;
        let mut first = Ok(());
        while self.in_flight > 0 {
            match self.back_rx.recv() {
                Ok((staging, result)) => {
                    self.in_flight -= 1;
                    self.idle.push(staging);
                    if first.is_ok() {
                        first = result;
                    }
                }
                Err(_) => {
                    self.in_flight = 0;
                    return Err(DeviceError::ThreadGone);
                }
            }
        }
        first
    }
}

impl ArenaWriter for CudaWriter {
    fn staged(&self) -> bool {
        true
    }

    fn buffer(&mut self, offset: u64) -> Result<&mut [u8]> {
        if self.current.is_none() {
            while self.idle.is_empty() {
                if self.in_flight == 0 {
                    return Err(DeviceError::Protocol {
                        reason: "a writer lost its staging buffers".into(),
                    });
                }
                self.reclaim_one()?;
            }
            self.current = self.idle.pop().map(|s| (s, offset));
        }
        let (staging, at) = self.current.as_mut().ok_or(DeviceError::Protocol {
            reason: "no staging buffer".into(),
        })?;
        *at = offset;
        Ok(staging.buf.as_mut_slice())
    }

    fn submit(&mut self, skip: usize, len: usize) -> Result<()> {
        let back = self.back_tx.clone().ok_or(DeviceError::Protocol {
            reason: "submit after finish".into(),
        })?;
        let (staging, offset) = self.current.take().ok_or(DeviceError::Protocol {
            reason: "submit without a buffer".into(),
        })?;
        let target = self.target.clone();
        self.in_flight += 1;
        let queued = self.exec.call(move |ctx: &mut DeviceCtx| {
            let enqueue = |staging: &Staging| -> Result<()> {
                let t = target.get()?;
                if t.sealed.load(Ordering::SeqCst) {
                    return Err(DeviceError::Sealed);
                }
                t.mem
                    .write_async(offset, &staging.buf, skip, len, &t.stream)?;
                staging.done.record(&t.stream)
            };
            match enqueue(&staging) {
                Ok(()) => {
                    send_back_when_done(ctx, staging, back);
                    Ok(())
                }
                Err(e) => {
                    let _ = back.send((staging, Ok(())));
                    Err(e)
                }
            }
        });
        queued.wait()
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.drain()
    }
}

/// Reads an arena back through a pinned buffer of its own: each read's copy is submitted to
/// the device thread, which enqueues it on the reader's stream and watches its event (never
/// blocking on it); the buffer comes back when the copy is done.
#[derive(Debug)]
struct CudaReader {
    exec: Executor,
    target: Arc<OnDevice<CopyTarget>>,
    pool: Arc<OnDevice<StagingPool>>,
    /// The buffer, while it is here (not with a copy in flight).
    staging: Option<Staging>,
}

impl ArenaReader for CudaReader {
    fn capacity(&self) -> usize {
        STAGING_BYTES
    }

    fn read(&mut self, offset: u64, len: usize) -> Result<&[u8]> {
        let staging = self.staging.take().ok_or(DeviceError::Protocol {
            reason: "a reader lost its buffer".into(),
        })?;
        let target = self.target.clone();
        let (back, returned) = mpsc::channel::<Returned>();
        let queued = self.exec.call(move |ctx: &mut DeviceCtx| {
            let mut staging = staging;
            let enqueue = |staging: &mut Staging| -> Result<()> {
                let t = target.get()?;
                t.mem.read_async(offset, &mut staging.buf, len, &t.stream)?;
                staging.done.record(&t.stream)
            };
            match enqueue(&mut staging) {
                Ok(()) => {
                    send_back_when_done(ctx, staging, back);
                    Ok(())
                }
                Err(e) => {
                    let _ = back.send((staging, Err(e)));
                    Ok(())
                }
            }
        });
        queued.wait()?;
        let (staging, result) = returned.recv().map_err(|_| DeviceError::ThreadGone)?;
        let staging = self.staging.insert(staging);
        result?;
        Ok(&staging.buf.as_mut_slice()[..len])
    }
}

impl Drop for CudaReader {
    fn drop(&mut self) {
        let Some(staging) = self.staging.take() else {
            return;
        };
        // Back to the backend's pool, on the device thread.
        let pool = self.pool.clone();
        self.exec.hand_over(vec![staging], move |_, bufs| {
            if let Ok(pool) = pool.get() {
                pool.lock().unwrap_or_else(|e| e.into_inner()).extend(bufs);
            }
        });
    }
}

impl Drop for CudaWriter {
    fn drop(&mut self) {
        // Every buffer comes back, even after a failed copy, so that all return to the pool.
        let _ = self.drain();
        let mut bufs: Vec<Staging> = std::mem::take(&mut self.idle);
        bufs.extend(self.current.take().map(|(s, _)| s));
        if bufs.is_empty() {
            return;
        }
        // Back to the backend's pool, on the device thread (freeing pinned memory is a driver
        // call there).
        let pool = self.pool.clone();
        self.exec.hand_over(bufs, move |_, bufs| {
            if let Ok(pool) = pool.get() {
                pool.lock().unwrap_or_else(|e| e.into_inner()).extend(bufs);
            }
        });
    }
}
