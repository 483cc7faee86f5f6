//! [`KernelCache`]: modules and functions loaded per context, found in memory, else in the
//! disk cache, else compiled with NVRTC; and what it has learned of each device.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use super::disk::{cache_file_name, decode_cache_file, default_disk_dir, write_cache_file};
use super::hash::source_hash;
use super::nvrtc::{compile_options, compile_ptx};
use super::source::KernelSource;
use crate::error::KernelError;

/// What a device looks like to the launchers, read once per context.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The device's ordinal in this process.
    pub ordinal: usize,
    /// Compute capability, major.
    pub major: i32,
    /// Compute capability, minor.
    pub minor: i32,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
}

/// What identifies one compiled module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ModuleKey {
    ordinal: usize,
    /// The `CUcontext` as an address. A cached module holds an `Arc` of its context, so the
    /// address cannot be reused by another context while the entry exists.
    context: usize,
    major: i32,
    minor: i32,
    hash: u64,
}

/// Counts of how module requests were served, for tests and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules found already loaded in this process.
    pub memory_hits: u64,
    /// Modules loaded from a disk cache file.
    pub disk_hits: u64,
    /// Modules compiled with NVRTC.
    pub compiled: u64,
    /// Cache files that could not be read, were corrupt, or could not be written.
    pub disk_errors: u64,
}

#[derive(Default)]
struct State {
    devices: HashMap<usize, DeviceInfo>,
    modules: HashMap<ModuleKey, Arc<CudaModule>>,
    functions: HashMap<FunctionKey, CudaFunction>,
    /// Resident blocks per multiprocessor, by function and block size.
    occupancy: HashMap<(FunctionKey, u32), u32>,
}

/// What identifies a loaded function on the launch path, cheap to build: the context, the
/// source text's address and length (sources are `'static`), and the function's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct FunctionKey {
    context: usize,
    code: usize,
    code_len: usize,
    name: &'static str,
}

impl FunctionKey {
    fn new(ctx: &CudaContext, source: &KernelSource, name: &'static str) -> Self {
        Self {
            context: ctx.cu_ctx() as usize,
            code: source.code.as_ptr() as usize,
            code_len: source.code.len(),
            name,
        }
    }
}

/// Compiled kernels, loaded per context: see the module docs. Share one per process.
pub struct KernelCache {
    disk_dir: Option<PathBuf>,
    state: Mutex<State>,
    memory_hits: AtomicU64,
    disk_hits: AtomicU64,
    compiled: AtomicU64,
    disk_errors: AtomicU64,
}

impl fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KernelCache")
            .field("disk_dir", &self.disk_dir)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl Default for KernelCache {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelCache {
    /// A cache whose disk directory is [`default_disk_dir`].
    pub fn new() -> Self {
        Self::with_disk_dir(default_disk_dir())
    }

    /// A cache that keeps modules in memory only.
    pub fn in_memory() -> Self {
        Self::with_disk_dir(None)
    }

    /// A cache that keeps PTX in `dir` (created when first written), or nowhere for `None`.
    pub fn with_disk_dir(dir: Option<PathBuf>) -> Self {
        Self {
            disk_dir: dir,
            state: Mutex::default(),
            memory_hits: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            compiled: AtomicU64::new(0),
            disk_errors: AtomicU64::new(0),
        }
    }

    /// The disk directory, if any.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk_dir.as_deref()
    }

    /// How requests have been served so far.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            compiled: self.compiled.load(Ordering::Relaxed),
            disk_errors: self.disk_errors.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The maps stay consistent whatever a panicking holder was doing: each update is a
        // single insert.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ordinal, compute capability and multiprocessor count of `ctx`'s device.
    pub fn device_info(&self, ctx: &Arc<CudaContext>) -> Result<DeviceInfo, KernelError> {
        let context = ctx.cu_ctx() as usize;
        if let Some(info) = self.lock().devices.get(&context) {
            return Ok(*info);
        }
        let (major, minor) = ctx.compute_capability()?;
        let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
        let info = DeviceInfo {
            ordinal: ctx.ordinal(),
            major,
            minor,
            multiprocessors: u32::try_from(sms).unwrap_or(1).max(1),
        };
        self.lock().devices.insert(context, info);
        Ok(info)
    }

    /// The function `name` of `source`, compiled for and loaded into `ctx`.
    pub fn function(
        &self,
        ctx: &Arc<CudaContext>,
        source: &KernelSource,
        name: &'static str,
    ) -> Result<CudaFunction, KernelError> {
        let fkey = FunctionKey::new(ctx, source, name);
        if let Some(f) = self.lock().functions.get(&fkey) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(f.clone());
        }
        let info = self.device_info(ctx)?;
        let options = compile_options(info.major, info.minor);
        let key = ModuleKey {
            ordinal: info.ordinal,
            context: fkey.context,
            major: info.major,
            minor: info.minor,
            hash: source_hash(source, &options),
        };
        let module = self.module(ctx, source, &options, key)?;
        let f = module.load_function(name)?;
        Ok(self.lock().functions.entry(fkey).or_insert(f).clone())
    }

    /// The function `name` of `source` and how many of its blocks of `block_threads` threads
    /// (no dynamic shared memory) fit on one multiprocessor at once, as the driver computes
    /// it from the compiled kernel's registers and shared memory. At least 1.
    pub fn function_and_occupancy(
        &self,
        ctx: &Arc<CudaContext>,
        source: &KernelSource,
        name: &'static str,
        block_threads: u32,
    ) -> Result<(CudaFunction, u32), KernelError> {
        let f = self.function(ctx, source, name)?;
        let key = (FunctionKey::new(ctx, source, name), block_threads);
        if let Some(n) = self.lock().occupancy.get(&key) {
            return Ok((f, *n));
        }
        let n = f
            .occupancy_max_active_blocks_per_multiprocessor(block_threads, 0, None)?
            .max(1);
        self.lock().occupancy.insert(key, n);
        Ok((f, n))
    }

    fn module(
        &self,
        ctx: &Arc<CudaContext>,
        source: &KernelSource,
        options: &[String],
        key: ModuleKey,
    ) -> Result<Arc<CudaModule>, KernelError> {
        if let Some(m) = self.lock().modules.get(&key) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(m.clone());
        }
        // Load or compile outside the lock: two threads may both compile; the first to
        // insert wins and the other's module is dropped.
        let path = self
            .disk_dir
            .as_ref()
            .map(|dir| dir.join(cache_file_name(key.hash, key.major, key.minor)));
        let mut loaded = None;
        if let Some(path) = &path {
            match std::fs::read(path) {
                Ok(bytes) => match decode_cache_file(&bytes) {
                    Some(ptx) => match ctx.load_module(Ptx::from_src(ptx)) {
                        Ok(m) => {
                            self.disk_hits.fetch_add(1, Ordering::Relaxed);
                            loaded = Some(m);
                        }
                        // A file the driver refuses (a newer PTX version, say): recompile.
                        Err(_) => self.note_disk_error(),
                    },
                    None => self.note_disk_error(),
                },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => self.note_disk_error(),
            }
        }
        let module = match loaded {
            Some(m) => m,
            None => {
                let ptx = compile_ptx(source, options)?;
                self.compiled.fetch_add(1, Ordering::Relaxed);
                let module = ctx.load_module(Ptx::from_src(ptx.clone()))?;
                if let Some(path) = &path
                    && write_cache_file(path, &ptx).is_err()
                {
                    self.note_disk_error();
                }
                module
            }
        };
        Ok(self.lock().modules.entry(key).or_insert(module).clone())
    }

    fn note_disk_error(&self) {
        self.disk_errors.fetch_add(1, Ordering::Relaxed);
    }
}
