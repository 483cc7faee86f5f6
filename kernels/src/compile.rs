//! Run-time compilation of the `cuda/*.cu` sources with NVRTC, cached in memory and on disk.
//!
//! A [`KernelCache`] maps (device ordinal, context, compute capability, hash of source and
//! options) to a loaded module and its functions. A miss looks on disk first
//! (`<dir>/<hash>-sm<major><minor>.ptx`, see [`default_disk_dir`]), then compiles with NVRTC
//! for the device's own architecture (`--gpu-architecture=compute_XY`, no fast math) and
//! writes the PTX back. A cache file carries its own ms64 and length on its first line: a
//! truncated, corrupt, unreadable or refused file is recompiled, never fatal, and a cache
//! directory that cannot be written is skipped.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{CompileError, CompileOptions, Ptx};

use crate::error::KernelError;
use crate::reference::ms64;
use crate::sys::nvrtc_available;

/// One `.cu` file of this crate, compiled as a unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSource {
    /// File name, for errors and NVRTC's log, e.g. `gemv.cu`.
    pub name: &'static str,
    /// The CUDA C source.
    pub code: &'static str,
}

/// `cuda/gemv.cu`: the gemv kernels, see [`crate::gemv`].
pub const GEMV_SOURCE: KernelSource = KernelSource {
    name: "gemv.cu",
    code: include_str!("../cuda/gemv.cu"),
};

/// `cuda/encoder.cu`: the encoder's element-wise and row-wise kernels, see [`crate::encoder`].
pub const ENCODER_SOURCE: KernelSource = KernelSource {
    name: "encoder.cu",
    code: include_str!("../cuda/encoder.cu"),
};

/// `device/cuda/checksum.cu` (defined with ms64 in `modelshare_device::checksum`): the ms64
/// kernel, see [`crate::checksum`].
pub const CHECKSUM_SOURCE: KernelSource = KernelSource {
    name: "checksum.cu",
    code: modelshare_device::checksum::CUDA_SOURCE,
};

/// The environment variable naming the on-disk cache directory (empty: no disk cache).
pub const CACHE_DIR_ENV: &str = "MODELSHARE_KERNEL_CACHE";

/// The first bytes of a cache file, before its checksum and length.
const FILE_MAGIC: &str = "// modelshare-kernels ptx v1";

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

/// The NVRTC options for a device of compute capability `major.minor`: its own virtual
/// architecture, C++17, and FMA contraction (NVRTC's default); no fast math, so division,
/// square roots and denormals stay IEEE.
pub fn compile_options(major: i32, minor: i32) -> Vec<String> {
    vec![
        format!("--gpu-architecture=compute_{major}{minor}"),
        "--std=c++17".to_owned(),
        "--fmad=true".to_owned(),
    ]
}

/// Compiles `source` with NVRTC and `options`, returning the PTX text.
///
/// Needs no device: only NVRTC. Its log comes back in [`KernelError::Nvrtc`].
pub fn compile_ptx(source: &KernelSource, options: &[String]) -> Result<String, KernelError> {
    nvrtc_available()?;
    let nvrtc_error = |log: String| KernelError::Nvrtc {
        kernel: source.name.to_owned(),
        log,
    };
    if source.code.contains('\0') {
        return Err(nvrtc_error("the source contains a NUL byte".into()));
    }
    let opts = CompileOptions {
        name: Some(source.name.to_owned()),
        options: options.to_vec(),
        ..Default::default()
    };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(source.code, opts).map_err(|e| match e {
        CompileError::CompileError { nvrtc, log, .. } => {
            nvrtc_error(format!("{nvrtc:?}: {}", log.to_string_lossy().trim_end()))
        }
        other => nvrtc_error(format!("{other:?}")),
    })?;
    let bytes = ptx
        .as_bytes()
        .ok_or_else(|| nvrtc_error("nvrtc returned no PTX image".into()))?;
    let text = bytes.split(|b| *b == 0).next().unwrap_or_default();
    String::from_utf8(text.to_vec()).map_err(|_| nvrtc_error("nvrtc returned non-UTF-8 PTX".into()))
}

/// FNV-1a (64-bit) over the source's name, code and the options, each NUL-terminated.
pub fn source_hash(source: &KernelSource, options: &[String]) -> u64 {
    let mut h = Fnv1a::new();
    h.write(source.name.as_bytes());
    h.write(&[0]);
    h.write(source.code.as_bytes());
    h.write(&[0]);
    for option in options {
        h.write(option.as_bytes());
        h.write(&[0]);
    }
    h.0
}

struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

/// `<hash>-sm<major><minor>.ptx`, the hash as 16 hex digits.
pub fn cache_file_name(hash: u64, major: i32, minor: i32) -> String {
    format!("{hash:016x}-sm{major}{minor}.ptx")
}

/// The disk cache directory: `$MODELSHARE_KERNEL_CACHE` (empty: none), else
/// `$XDG_CACHE_HOME/modelshare/kernels`, else `$HOME/.cache/modelshare/kernels`, else none.
pub fn default_disk_dir() -> Option<PathBuf> {
    disk_dir_from(|name| std::env::var_os(name))
}

fn disk_dir_from(var: impl Fn(&str) -> Option<OsString>) -> Option<PathBuf> {
    if let Some(dir) = var(CACHE_DIR_ENV) {
        return (!dir.is_empty()).then(|| PathBuf::from(dir));
    }
    // The XDG spec says a relative XDG_CACHE_HOME is invalid and to be ignored.
    if let Some(xdg) = var("XDG_CACHE_HOME").map(PathBuf::from)
        && xdg.is_absolute()
    {
        return Some(xdg.join("modelshare").join("kernels"));
    }
    var("HOME").filter(|home| !home.is_empty()).map(|home| {
        PathBuf::from(home)
            .join(".cache")
            .join("modelshare")
            .join("kernels")
    })
}

/// A cache file: the magic, the ms64 and length of the PTX on the first line, then the PTX.
fn encode_cache_file(ptx: &str) -> Vec<u8> {
    let header = format!(
        "{FILE_MAGIC} ms64={:016x} bytes={}\n",
        ms64(ptx.as_bytes()),
        ptx.len()
    );
    let mut out = Vec::with_capacity(header.len() + ptx.len());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(ptx.as_bytes());
    out
}

/// The PTX of a cache file, or `None` if the file is not one this crate wrote intact.
fn decode_cache_file(bytes: &[u8]) -> Option<String> {
    let newline = bytes.iter().position(|b| *b == b'\n')?;
    let header = std::str::from_utf8(&bytes[..newline]).ok()?;
    let body = &bytes[newline + 1..];
    let mut fields = header.strip_prefix(FILE_MAGIC)?.split_whitespace();
    let sum = u64::from_str_radix(fields.next()?.strip_prefix("ms64=")?, 16).ok()?;
    let len: usize = fields.next()?.strip_prefix("bytes=")?.parse().ok()?;
    if fields.next().is_some() || body.len() != len || ms64(body) != sum || body.contains(&0) {
        return None;
    }
    String::from_utf8(body.to_vec()).ok()
}

/// Writes a cache file atomically: a temporary file in the same directory, then a rename.
fn write_cache_file(path: &Path, ptx: &str) -> std::io::Result<()> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = PathBuf::from(tmp);
    let result =
        std::fs::write(&tmp, encode_cache_file(ptx)).and_then(|()| std::fs::rename(&tmp, path));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hash is not FNV-1a (the published test vectors).
    #[test]
    fn fnv1a_matches_test_vectors() {
        let hash = |s: &str| {
            let mut h = Fnv1a::new();
            h.write(s.as_bytes());
            h.0
        };
        assert_eq!(hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(hash("foobar"), 0x8594_4171_f739_67e8);
    }

    /// A change of source or options would reuse a stale cached module.
    #[test]
    fn hash_covers_source_and_options() {
        let base = source_hash(&GEMV_SOURCE, &compile_options(9, 0));
        assert_ne!(base, source_hash(&GEMV_SOURCE, &compile_options(8, 0)));
        assert_ne!(base, source_hash(&CHECKSUM_SOURCE, &compile_options(9, 0)));
        let edited = KernelSource {
            name: GEMV_SOURCE.name,
            code: "extern \"C\" __global__ void k() {}",
        };
        assert_ne!(base, source_hash(&edited, &compile_options(9, 0)));
        assert_eq!(base, source_hash(&GEMV_SOURCE, &compile_options(9, 0)));
        assert_eq!(cache_file_name(0xab, 9, 0), "00000000000000ab-sm90.ptx");
    }

    /// The options lose the device's architecture or gain fast math.
    #[test]
    fn options_target_the_device_without_fast_math() {
        let opts = compile_options(9, 0);
        assert!(opts.contains(&"--gpu-architecture=compute_90".to_owned()));
        assert!(!opts.iter().any(|o| o.contains("fast")));
    }

    /// A cache file is not read back, or a damaged one is trusted.
    #[test]
    fn cache_files_round_trip_and_reject_damage() {
        let ptx = ".version 8.8\n.target sm_90\n.address_size 64\n// body\n";
        let file = encode_cache_file(ptx);
        assert_eq!(decode_cache_file(&file).as_deref(), Some(ptx));

        // Truncated.
        assert_eq!(decode_cache_file(&file[..file.len() - 1]), None);
        // One byte of the body changed.
        let mut flipped = file.clone();
        let last = flipped.len() - 2;
        flipped[last] ^= 0x20;
        assert_eq!(decode_cache_file(&flipped), None);
        // Extended.
        let mut longer = file.clone();
        longer.push(b'x');
        assert_eq!(decode_cache_file(&longer), None);
        // Not ours, empty, no header line, a NUL in the body.
        assert_eq!(decode_cache_file(ptx.as_bytes()), None);
        assert_eq!(decode_cache_file(b""), None);
        assert_eq!(decode_cache_file(b"\x00\xff"), None);
        let nul = encode_cache_file("a\0b");
        assert_eq!(decode_cache_file(&nul), None);
    }

    /// Writing a cache file leaves it unreadable, or leaves a temporary file behind.
    #[test]
    fn cache_file_write_is_atomic_and_readable() {
        let dir = std::env::temp_dir().join(format!("ms-kcache-test-{}", std::process::id()));
        let path = dir.join("nested").join(cache_file_name(1, 9, 0));
        write_cache_file(&path, "ptx text\n").expect("write");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(decode_cache_file(&bytes).as_deref(), Some("ptx text\n"));
        let names: Vec<_> = std::fs::read_dir(path.parent().expect("parent"))
            .expect("list")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        // A directory where the file should be: an error, not a panic.
        let blocked = dir.join("blocked");
        std::fs::create_dir_all(blocked.join(cache_file_name(2, 9, 0))).expect("mkdir");
        assert!(write_cache_file(&blocked.join(cache_file_name(2, 9, 0)), "x").is_err());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// The cache directory is not chosen as documented.
    #[test]
    fn disk_dir_resolution_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        const ALL: &[(&str, &str)] = &[
            (CACHE_DIR_ENV, "/explicit"),
            ("XDG_CACHE_HOME", "/xdg"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(disk_dir_from(env(ALL)), Some(PathBuf::from("/explicit")));
        assert_eq!(
            disk_dir_from(env(&[(CACHE_DIR_ENV, ""), ("HOME", "/h")])),
            None
        );
        assert_eq!(
            disk_dir_from(env(&[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/h")])),
            Some(PathBuf::from("/xdg/modelshare/kernels"))
        );
        assert_eq!(
            disk_dir_from(env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/modelshare/kernels"))
        );
        assert_eq!(disk_dir_from(env(&[])), None);
    }

    /// A kernel source no longer compiles under NVRTC (skipped where NVRTC is not installed).
    #[test]
    fn sources_compile_with_nvrtc_when_present() {
        if nvrtc_available().is_err() {
            eprintln!("skipped: NVRTC not found");
            return;
        }
        for source in [GEMV_SOURCE, CHECKSUM_SOURCE, ENCODER_SOURCE] {
            let ptx = compile_ptx(&source, &compile_options(9, 0))
                .unwrap_or_else(|e| panic!("{}: {e}", source.name));
            assert!(ptx.contains(".target sm_90"), "{}", source.name);
        }
        for name in [
            "ms_gemv_f32_warp",
            "ms_gemv_f16_warp",
            "ms_gemv_bf16_warp",
            "ms_gemv_f32_block",
            "ms_gemv_f16_block",
            "ms_gemv_bf16_block",
        ] {
            assert!(GEMV_SOURCE.code.contains(name), "{name}");
        }
        // Older architectures too (sm_75 is the oldest CUDA 13's NVRTC takes): the encoder
        // kernels use nothing newer.
        let ptx = compile_ptx(&ENCODER_SOURCE, &compile_options(7, 5)).expect("encoder.cu");
        for name in crate::encoder::kernel_names() {
            assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
        }
        let broken = KernelSource {
            name: "broken.cu",
            code: "extern \"C\" __global__ void k() { undeclared(); }",
        };
        match compile_ptx(&broken, &compile_options(9, 0)) {
            Err(KernelError::Nvrtc { kernel, log }) => {
                assert_eq!(kernel, "broken.cu");
                assert!(log.contains("undeclared"), "{log}");
            }
            other => panic!("expected an nvrtc error, got {other:?}"),
        }
    }
}
