//! The worker side of the CUDA backend: mapping another process's arena.
//!
//! The device is found by UUID (the worker's `CUDA_VISIBLE_DEVICES` may number it otherwise).
//! A handle is opened once per process and arena (`cuIpcOpenMemHandle` again in the same
//! process would return the same mapping anyway) and closed when the last [`CudaMapping`] of it
//! goes; the ready event is opened per mapping.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{CudaContext, CudaStream};

use super::sys::{self, IPC_HANDLE_BYTES};
use crate::backend::{BackendKind, Mapped};
use crate::error::{DeviceError, Result};
use crate::export::{Handles, Import, key};

type Key = [u8; IPC_HANDLE_BYTES];

/// Open mappings of this process, by memory handle.
static OPEN: Mutex<Option<HashMap<Key, Weak<sys::IpcMemory>>>> = Mutex::new(None);

/// A worker's view of an arena in device memory.
#[derive(Debug, Clone)]
pub struct CudaMapping {
    ctx: Arc<CudaContext>,
    mem: Arc<sys::IpcMemory>,
    ready: Arc<sys::Event>,
    len: u64,
    device_uuid: String,
}

impl CudaMapping {
    /// Opens the arena of `len` bytes exported as `mem` (with its ready event `event`) on the
    /// device `device_uuid`.
    pub fn open(mem: &Key, event: &Key, device_uuid: &str, len: u64) -> Result<Self> {
        let ordinal = super::ordinal_of(device_uuid)?;
        let ctx = super::context::primary(ordinal)?;
        let mem = {
            let mut open = OPEN.lock().unwrap_or_else(|e| e.into_inner());
            let map = open.get_or_insert_with(HashMap::new);
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(mem).and_then(Weak::upgrade) {
                Some(m) => m,
                None => {
                    let m = Arc::new(sys::IpcMemory::open(&ctx, mem)?);
                    map.insert(*mem, Arc::downgrade(&m));
                    m
                }
            }
        };
        let ready = Arc::new(sys::Event::open_ipc(&ctx, event)?);
        Ok(Self {
            ctx,
            mem,
            ready,
            len,
            device_uuid: device_uuid.to_owned(),
        })
    }

    /// The arena's address in this process.
    pub fn device_ptr(&self) -> u64 {
        self.mem.ptr()
    }

    /// The arena's length.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the arena has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The context the arena is mapped in (the device's primary context).
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The device's UUID.
    pub fn device_uuid(&self) -> &str {
        &self.device_uuid
    }

    /// Makes `stream` wait, on the device, until the arena is fully loaded. Kernels enqueued
    /// on `stream` after this see every byte.
    pub fn wait_ready(&self, stream: &CudaStream) -> Result<()> {
        self.ready.wait_on(stream)
    }

    /// Whether the load has completed (a host-side check; prefer [`CudaMapping::wait_ready`]).
    pub fn is_ready(&self) -> Result<bool> {
        self.ready.is_done()
    }

    /// Copies `dst.len()` bytes at `offset` to the host, after waiting for the load.
    pub fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        self.ready.synchronize()?;
        self.mem.read(offset, dst, self.len)
    }
}

impl Mapped for CudaMapping {
    fn kind(&self) -> BackendKind {
        BackendKind::CudaIpc
    }
    fn len(&self) -> u64 {
        self.len
    }
    fn read_only(&self) -> bool {
        // Legacy IPC maps another process's allocation read-write: nothing stops a write.
        false
    }
    fn device_uuid(&self) -> &str {
        &self.device_uuid
    }
    fn host_bytes(&self) -> Option<&[u8]> {
        None
    }
    fn device_ptr(&self) -> Option<u64> {
        Some(self.mem.ptr())
    }
    fn context(&self) -> Option<&Arc<CudaContext>> {
        Some(&self.ctx)
    }
    fn wait_ready(&self, stream: &CudaStream) -> Result<()> {
        CudaMapping::wait_ready(self, stream)
    }
    fn wait_ready_foreign(&self, stream: crate::ForeignStream) -> Result<()> {
        self.ready.wait_on_foreign(stream)
    }
    fn is_ready(&self) -> Result<bool> {
        CudaMapping::is_ready(self)
    }
    fn read(&self, offset: u64, dst: &mut [u8]) -> Result<()> {
        CudaMapping::read(self, offset, dst)
    }
}

/// Opens a received legacy IPC handle: handles `[memory, ready event]`, 64 bytes each.
pub(crate) fn import(import: Import) -> Result<Arc<dyn Mapped>> {
    let Handles::CudaIpc { memory, event } = &import.handles else {
        return Err(DeviceError::BadHandle {
            reason: "not a CUDA IPC handle".into(),
        });
    };
    let mem: Key = key(memory, "the memory handle")?;
    let event: Key = key(event, "the event handle")?;
    Ok(Arc::new(CudaMapping::open(
        &mem,
        &event,
        &import.device_uuid,
        import.len,
    )?))
}
