//! The `unsafe` core of the CUDA backend: thin `Result`-returning wrappers over the driver
//! calls cudarc leaves raw (IPC memory and event handles, host-function gates, pinned memory,
//! copies on raw pointers). Everything above this module is safe code.

use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};

use cudarc::driver::sys::{self, CUdeviceptr, CUevent};
use cudarc::driver::{CudaContext, CudaStream, DriverError, result};

use crate::error::{DeviceError, Result};

mod common;
mod vmm;
use common::{bind, check, driver};
pub use vmm::{VmmImport, fd_handles_supported};

/// Size of a legacy IPC handle (memory or event).
pub const IPC_HANDLE_BYTES: usize = 64;

/// Whether the CUDA driver library (`libcuda.so`) can be loaded. Must be checked before any
/// other call here: cudarc panics when the library is missing.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library with dlopen; no symbol is called.
    unsafe { sys::is_culib_present() }
}

/// Whether NVRTC (`libnvrtc.so`) can be loaded; checked before compiling (cudarc panics when
/// the library is missing).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library with dlopen; no symbol is called.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// `cuInit`.
pub fn init() -> Result<()> {
    result::init().map_err(driver("cuInit"))
}

/// Number of devices.
pub fn device_count() -> Result<usize> {
    let n = result::device::get_count().map_err(driver("cuDeviceGetCount"))?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// The device's UUID in nvidia-smi's form: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
pub fn device_uuid(ordinal: usize) -> Result<String> {
    let ord = i32::try_from(ordinal).map_err(|_| DeviceError::NoSuchDevice {
        device: ordinal.to_string(),
        reason: "ordinal out of range".into(),
    })?;
    let dev = result::device::get(ord).map_err(driver("cuDeviceGet"))?;
    let uuid = result::device::get_uuid(dev).map_err(driver("cuDeviceGetUuid"))?;
    let b: Vec<u8> = uuid.bytes.iter().map(|c| *c as u8).collect();
    let hex = |r: std::ops::Range<usize>| -> String {
        b.get(r)
            .unwrap_or(&[])
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect()
    };
    Ok(format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    ))
}

/// A device allocation (`cuMemAlloc`, or `cuMemCreate` for VMM), freed on drop. Every access
/// is range-checked.
#[derive(Debug)]
pub struct DeviceMemory {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
    len: u64,
    /// The physical allocation, for VMM memory (see [`DeviceMemory::alloc_vmm`]).
    vmm: Option<vmm::VmmAlloc>,
}

// SAFETY: a device pointer is a plain number valid in any thread that binds the context (every
// method does); the driver serialises access to the allocation.
unsafe impl Send for DeviceMemory {}
// SAFETY: as above; no method mutates `self`.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// Allocates `len` bytes (at least 256: an IPC handle needs a real allocation).
    pub fn alloc(ctx: &Arc<CudaContext>, len: u64) -> Result<Self> {
        let bytes = usize::try_from(len).map_err(|_| DeviceError::AllocationFailed {
            bytes: len,
            reason: "larger than the address space".into(),
        })?;
        bind(ctx)?;
        // SAFETY: allocates fresh memory in the bound context; no aliasing.
        let ptr = unsafe { result::malloc_sync(bytes.max(256)) }.map_err(|e| {
            if e.0 == sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY {
                DeviceError::AllocationFailed {
                    bytes: len,
                    reason: "out of device memory".into(),
                }
            } else {
                DeviceError::Cuda {
                    op: "cuMemAlloc",
                    source: e,
                }
            }
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: None,
        })
    }

    /// Allocates `len` bytes (rounded up to the granularity) with `cuMemCreate`, exportable as
    /// a file descriptor ([`DeviceMemory::export_fd`]), mapped read-write for this process.
    pub fn alloc_vmm(ctx: &Arc<CudaContext>, len: u64) -> Result<Self> {
        let (vmm, ptr) = vmm::VmmAlloc::create(ctx, len)?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: Some(vmm),
        })
    }

    /// Another process's VMM allocation of `size` bytes, imported from `fd` and mapped
    /// read-write for this process: a restarted server taking over an arena a worker kept
    /// alive. `len` is the arena's length inside it.
    pub fn import_vmm(
        ctx: &Arc<CudaContext>,
        fd: std::os::fd::BorrowedFd<'_>,
        size: u64,
        len: u64,
    ) -> Result<Self> {
        if len > size {
            return Err(DeviceError::BadHandle {
                reason: format!("the allocation ({size} bytes) is smaller than the arena ({len})"),
            });
        }
        let (vmm, ptr) = vmm::VmmAlloc::import(ctx, fd, size)?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
            len,
            vmm: Some(vmm),
        })
    }

    /// The allocation's size (`len` rounded up to the granularity), for VMM memory.
    pub fn vmm_size(&self) -> Option<u64> {
        self.vmm.as_ref().map(vmm::VmmAlloc::size)
    }

    /// A new file descriptor for the allocation (VMM memory only), to pass to a worker.
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        let vmm = self.vmm.as_ref().ok_or(DeviceError::Unsupported {
            what: "a descriptor for memory not allocated with cuMemCreate".into(),
        })?;
        bind(&self.ctx)?;
        vmm.export_fd()
    }

    /// The device address.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// The length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Synchronous copy of `src` to `offset`.
    pub fn write(&self, offset: u64, src: &[u8]) -> Result<()> {
        check("write", offset, src.len(), self.len)?;
        bind(&self.ctx)?;
        // SAFETY: the destination range lies inside this allocation (checked above).
        unsafe { result::memcpy_htod_sync(self.ptr + offset, src) }.map_err(driver("cuMemcpyHtoD"))
    }

    /// Asynchronous copy of the first `len` bytes of `src` to `offset` on `stream`. The caller
    /// must not touch `src` until work recorded after this on `stream` has completed (the
    /// writer keeps an event per buffer for that).
    pub fn write_async(
        &self,
        offset: u64,
        src: &Pinned,
        skip: usize,
        len: usize,
        stream: &CudaStream,
    ) -> Result<()> {
        check("write", offset, len, self.len)?;
        if skip.checked_add(len).is_none_or(|end| end > src.len) {
            return Err(DeviceError::OutOfRange {
                op: "stage",
                offset: skip as u64,
                len: len as u64,
                arena_len: src.len as u64,
            });
        }
        bind(&self.ctx)?;
        // SAFETY: both ranges are checked (`skip + len` within `src`); `src` is pinned memory
        // that outlives the copy (its owner waits for the copy's event before reusing or
        // freeing it).
        unsafe {
            sys::cuMemcpyHtoDAsync_v2(
                self.ptr + offset,
                src.ptr.add(skip).cast::<c_void>(),
                len,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(driver("cuMemcpyHtoDAsync"))
    }

    /// Synchronous copy from `offset` into `dst`.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        check("read", offset, dst.len(), self.len)?;
        bind(&self.ctx)?;
        // SAFETY: the source range lies inside this allocation (checked above).
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset) }.map_err(driver("cuMemcpyDtoH"))
    }

    /// The allocation's legacy IPC handle (memory from `cuMemAlloc` only).
    pub fn ipc_handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]> {
        bind(&self.ctx)?;
        let mut handle = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: `handle` is a valid out-parameter; `ptr` is this live allocation.
        unsafe { sys::cuIpcGetMemHandle(&mut handle, self.ptr) }
            .result()
            .map_err(driver("cuIpcGetMemHandle"))?;
        Ok(handle.reserved.map(|c| c as u8))
    }
}

impl DeviceMemory {
    /// Lets device `ordinal` read this allocation, for a replica copy from it. VMM memory is
    /// mapped for its own device only until granted; legacy memory needs nothing here (the
    /// reading context enables peer access, [`enable_peer_access`]).
    pub fn grant_read(&self, ordinal: usize) -> Result<()> {
        let Some(vmm) = &self.vmm else {
            return Ok(());
        };
        let size = usize::try_from(vmm.size()).map_err(|_| DeviceError::Protocol {
            reason: "an allocation larger than the address space".into(),
        })?;
        let id = i32::try_from(ordinal).map_err(|_| DeviceError::NoSuchDevice {
            device: ordinal.to_string(),
            reason: "ordinal out of range".into(),
        })?;
        bind(&self.ctx)?;
        vmm::grant(
            self.ptr,
            size,
            id,
            sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READ,
        )
    }

    /// Copies all of this allocation's `len` bytes from `src`, a device address of `src_ctx`
    /// holding at least as many (another device's arena), on `stream`, and waits for it.
    pub fn copy_from_peer(
        &self,
        src_ctx: &CudaContext,
        src: CUdeviceptr,
        len: u64,
        stream: &CudaStream,
    ) -> Result<()> {
        let n = usize::try_from(len).map_err(|_| DeviceError::Protocol {
            reason: "a copy larger than the address space".into(),
        })?;
        check("peer copy", 0, n, self.len)?;
        bind(&self.ctx)?;
        // SAFETY: the destination range `self.ptr..+n` lies in this live allocation (checked
        // above); the source is a live allocation of `src_ctx` of at least `n` bytes, which the
        // caller keeps alive (the server holds the source arena) until the stream is
        // synchronised below, before this returns.
        unsafe {
            sys::cuMemcpyPeerAsync(
                self.ptr,
                self.ctx.cu_ctx(),
                src,
                src_ctx.cu_ctx(),
                n,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(driver("cuMemcpyPeerAsync"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }
}

/// Lets `ctx` access `peer`'s memory directly (NVLink or PCIe peer-to-peer) where the devices
/// can; `false` where they cannot (copies are then staged by the driver). Enabling twice is
/// fine.
pub fn enable_peer_access(ctx: &CudaContext, peer: &CudaContext) -> Result<bool> {
    let mut can: std::ffi::c_int = 0;
    // SAFETY: `can` is a valid out-parameter; both devices come from live contexts.
    unsafe { sys::cuDeviceCanAccessPeer(&mut can, ctx.cu_device(), peer.cu_device()) }
        .result()
        .map_err(driver("cuDeviceCanAccessPeer"))?;
    if can == 0 {
        return Ok(false);
    }
    bind(ctx)?;
    // SAFETY: `peer` is a live context of another device; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) } {
        sys::cudaError_enum::CUDA_SUCCESS
        | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        e => Err(DeviceError::Cuda {
            op: "cuCtxEnablePeerAccess",
            source: DriverError(e),
        }),
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if let Err(e) = bind(&self.ctx) {
            tracing::warn!(error = %e, "cannot bind the context to free device memory; leaking it");
            return;
        }
        if let Some(vmm) = &self.vmm {
            vmm.free(self.ptr);
            return;
        }
        // SAFETY: the allocation is ours and nothing in this process uses it after drop.
        if let Err(e) = unsafe { result::free_sync(self.ptr) } {
            tracing::warn!(error = %e, "cuMemFree failed");
        }
    }
}

/// Another process's allocation, opened with `cuIpcOpenMemHandle`; closed on drop.
#[derive(Debug)]
pub struct IpcMemory {
    ctx: Arc<CudaContext>,
    ptr: CUdeviceptr,
}

// SAFETY: as for `DeviceMemory`: a device address, used with the context bound.
unsafe impl Send for IpcMemory {}
// SAFETY: as above; no method mutates `self`.
unsafe impl Sync for IpcMemory {}

impl IpcMemory {
    /// Opens `handle` in `ctx`.
    pub fn open(ctx: &Arc<CudaContext>, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self> {
        bind(ctx)?;
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ptr: CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-parameter; the driver validates the handle and fails on
        // one that names nothing.
        unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut ptr,
                h,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
            )
        }
        .result()
        .map_err(driver("cuIpcOpenMemHandle"))?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr,
        })
    }

    /// The address in this process.
    pub fn ptr(&self) -> CUdeviceptr {
        self.ptr
    }

    /// Synchronous copy from `offset` into `dst`; `total` is the arena's length.
    pub fn read(&self, offset: u64, dst: &mut [u8], total: u64) -> Result<()> {
        check("read", offset, dst.len(), total)?;
        bind(&self.ctx)?;
        // SAFETY: the range lies inside the opened allocation of `total` bytes.
        unsafe { result::memcpy_dtoh_sync(dst, self.ptr + offset) }.map_err(driver("cuMemcpyDtoH"))
    }
}

impl Drop for IpcMemory {
    fn drop(&mut self) {
        if bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: opened by `open`, closed once here; nothing uses it afterwards.
        if let Err(e) = unsafe { sys::cuIpcCloseMemHandle(self.ptr) }.result() {
            tracing::warn!(error = %e, "cuIpcCloseMemHandle failed");
        }
    }
}

/// A CUDA event, destroyed on drop.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<CudaContext>,
    ev: CUevent,
}

// SAFETY: an event handle is usable from any thread that binds its context (every method does).
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronises event operations.
unsafe impl Sync for Event {}

impl Event {
    fn create(ctx: &Arc<CudaContext>, flags: u32) -> Result<Self> {
        bind(ctx)?;
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: `ev` is a valid out-parameter.
        unsafe { sys::cuEventCreate(&mut ev, flags) }
            .result()
            .map_err(driver("cuEventCreate"))?;
        Ok(Self {
            ctx: ctx.clone(),
            ev,
        })
    }

    /// A timing-disabled event, for ordering within this process.
    pub fn plain(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::create(ctx, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    /// An inter-process, timing-disabled event.
    pub fn interprocess(ctx: &Arc<CudaContext>) -> Result<Self> {
        Self::create(
            ctx,
            sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
                | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
        )
    }

    /// Opens another process's event handle.
    pub fn open_ipc(ctx: &Arc<CudaContext>, handle: &[u8; IPC_HANDLE_BYTES]) -> Result<Self> {
        bind(ctx)?;
        let h = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut ev: CUevent = std::ptr::null_mut();
        // SAFETY: `ev` is a valid out-parameter; the driver validates the handle.
        unsafe { sys::cuIpcOpenEventHandle(&mut ev, h) }
            .result()
            .map_err(driver("cuIpcOpenEventHandle"))?;
        Ok(Self {
            ctx: ctx.clone(),
            ev,
        })
    }

    /// Records the event on `stream`.
    pub fn record(&self, stream: &CudaStream) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: both handles are live (owned by `self` and `stream`).
        unsafe { result::event::record(self.ev, stream.cu_stream()) }
            .map_err(driver("cuEventRecord"))
    }

    /// Waits on the host for the last record.
    pub fn synchronize(&self) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: the event is live.
        unsafe { result::event::synchronize(self.ev) }.map_err(driver("cuEventSynchronize"))
    }

    /// Whether the last record has completed.
    pub fn is_done(&self) -> Result<bool> {
        bind(&self.ctx)?;
        // SAFETY: the event is live.
        match unsafe { result::event::query(self.ev) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(DeviceError::Cuda {
                op: "cuEventQuery",
                source: e,
            }),
        }
    }

    /// Makes `stream` wait, on the device, for the last record.
    pub fn wait_on(&self, stream: &CudaStream) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: both handles are live.
        unsafe { sys::cuStreamWaitEvent(stream.cu_stream(), self.ev, 0) }
            .result()
            .map_err(driver("cuStreamWaitEvent"))
    }

    /// The IPC handle (the event must be inter-process).
    pub fn ipc_handle(&self) -> Result<[u8; IPC_HANDLE_BYTES]> {
        bind(&self.ctx)?;
        let mut handle = sys::CUipcEventHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        // SAFETY: `handle` is a valid out-parameter; the event is live.
        unsafe { sys::cuIpcGetEventHandle(&mut handle, self.ev) }
            .result()
            .map_err(driver("cuIpcGetEventHandle"))?;
        Ok(handle.reserved.map(|c| c as u8))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: the event is ours and used by nothing after drop.
        if let Err(e) = unsafe { result::event::destroy(self.ev) } {
            tracing::warn!(error = %e, "cuEventDestroy failed");
        }
    }
}

/// A host-side latch a stream can be made to wait on (through a host function), opened once.
#[derive(Debug, Default)]
pub struct Gate {
    open: Mutex<bool>,
    cv: Condvar,
}

impl Gate {
    /// Opens the gate; the waiting stream proceeds. Idempotent.
    pub fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }

    fn wait(&self) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        while !*open {
            open = self.cv.wait(open).unwrap_or_else(|e| e.into_inner());
        }
    }
}

unsafe extern "C" fn gate_wait(user: *mut c_void) {
    // SAFETY: `user` is the pointer `enqueue_gate` made with `Arc::into_raw`, handed to us once.
    let gate = unsafe { Arc::from_raw(user.cast::<Gate>().cast_const()) };
    gate.wait();
}

/// Enqueues on `stream` a host function that blocks until `gate` is opened: work queued after
/// it (an event record) completes only then. The gate must be opened eventually, or the stream
/// never drains (the arena opens it on seal, abandon and drop).
pub fn enqueue_gate(stream: &CudaStream, gate: &Arc<Gate>) -> Result<()> {
    let raw = Arc::into_raw(gate.clone()).cast_mut().cast::<c_void>();
    // SAFETY: the stream is live; the callback takes back the `Arc` it is given exactly once.
    let r = unsafe { result::stream::launch_host_function(stream.cu_stream(), gate_wait, raw) };
    if r.is_err() {
        // SAFETY: the driver refused the call, so the callback will never run: reclaim the Arc.
        drop(unsafe { Arc::from_raw(raw.cast::<Gate>().cast_const()) });
    }
    r.map_err(driver("cuLaunchHostFunc"))
}

/// Page-locked host memory, for asynchronous copies.
#[derive(Debug)]
pub struct Pinned {
    ctx: Arc<CudaContext>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through `&`/`&mut self`.
unsafe impl Send for Pinned {}

impl Pinned {
    /// Allocates `len` bytes of pinned memory for `ctx`.
    pub fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self> {
        bind(ctx)?;
        // SAFETY: fresh allocation; flags 0 = plain page-locked memory.
        let ptr = unsafe { result::malloc_host(len.max(1), 0) }.map_err(|e| {
            DeviceError::AllocationFailed {
                bytes: len as u64,
                reason: format!("pinned host memory: {e}"),
            }
        })?;
        Ok(Self {
            ctx: ctx.clone(),
            ptr: ptr.cast::<u8>(),
            len,
        })
    }

    /// The buffer.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes owned by `self`, borrowed mutably.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if bind(&self.ctx).is_err() {
            return;
        }
        // SAFETY: `ptr` came from `malloc_host` and is freed once, here.
        if let Err(e) = unsafe { result::free_host(self.ptr.cast::<c_void>()) } {
            tracing::warn!(error = %e, "cuMemFreeHost failed");
        }
    }
}

/// Launches `ms64_sum` once per range of `mem` (`(offset, len, blocks)`), each summing into its
/// own word of one device buffer, all on `stream`, then waits once and returns the words (one
/// synchronization for a whole manifest, not one per tensor).
pub fn launch_ms64_many(
    stream: &Arc<CudaStream>,
    func: &cudarc::driver::CudaFunction,
    mem: &DeviceMemory,
    ranges: &[(u64, u64, u32)],
) -> Result<Vec<u64>> {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let kernel = |e: DriverError| DeviceError::Kernel(format!("ms64: {e}"));
    if ranges.is_empty() {
        return Ok(Vec::new());
    }
    let mut sums = stream.alloc_zeros::<u64>(ranges.len()).map_err(kernel)?;
    for (i, &(offset, len, blocks)) in ranges.iter().enumerate() {
        let n = usize::try_from(len).map_err(|_| DeviceError::OutOfRange {
            op: "checksum",
            offset,
            len,
            arena_len: mem.len,
        })?;
        check("checksum", offset, n, mem.len)?;
        if len == 0 {
            continue;
        }
        let ptr = mem.ptr + offset;
        let cfg = LaunchConfig {
            grid_dim: (blocks.max(1), 1, 1),
            block_dim: (crate::checksum::BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut sum = sums.slice_mut(i..i + 1);
        let mut launch = stream.launch_builder(func);
        launch.arg(&ptr).arg(&len).arg(&mut sum);
        // SAFETY: the arguments match `ms64_sum(const unsigned char*, unsigned long long,
        // unsigned long long*)`; `sum` is one live element of an allocation on this stream, and
        // the range `[ptr, ptr + len)` lies inside the live allocation `mem` (checked above).
        unsafe { launch.launch(cfg) }.map_err(kernel)?;
    }
    let host = stream.clone_dtoh(&sums).map_err(kernel)?;
    stream.synchronize().map_err(kernel)?;
    if host.len() != ranges.len() {
        return Err(DeviceError::Kernel(
            "ms64: the device returned a short sum buffer".into(),
        ));
    }
    Ok(host)
}
