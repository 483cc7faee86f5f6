//! Plans a version's manifest, and copies validated weights into its arena.
//!
//! [`manifest`] builds the manifest from the validated source and its layout (the registry gets
//! it finished). [`copy_into`] runs on blocking threads: tensors are handed out largest first to
//! `threads` workers; each has its own [`modelshare_device::ArenaWriter`] (on CUDA: pinned
//! staging buffers whose copies the device thread submits, so file reads overlap device copies)
//! and reads its tensors' byte ranges from the (already open, already validated) shard files in
//! chunks of one writer buffer.
//!
//! # How a chunk is read
//! Into a staged writer's buffer (CUDA), a chunk that is all in the page cache is read through
//! it (`pread`: one copy, from memory); a chunk that is not, with direct I/O (`O_DIRECT`
//! straight from the disk into the pinned buffer, whole aligned pages, the wanted bytes from
//! `skip` on), so a cold load reads each byte from the disk once, with one large request per
//! thread in flight. Which it is comes from `mincore` per chunk (no I/O to ask), so a file half
//! in the cache is read half each way. Where direct I/O cannot be had (tmpfs before Linux 6.6,
//! no `/proc`), or for writers that do not stage (host memory), every chunk goes through the
//! page cache. The "load phases" log line says how many bytes went each way.
//!
//! # Checksums
//! Where the backend checksums on the device (CUDA: ms64, after the copy), that is the
//! manifest's checksum and the bytes are not hashed on the CPU (XXH3 costs a core per ~1.9 GB/s,
//! the load's bottleneck; `load_cpu_hash` turns it back on); elsewhere (host memory, or CUDA
//! without NVRTC) each chunk is hashed with XXH3-64 on the way.
//! Loads running at once take turns through one [`ChunkGate`] (its module says why).
//! Progress goes to the shared [`LoadProgress`]; an unload sets its `cancel` flag, checked
//! between chunks; the first error stops the other threads. The arena is sealed at the end.

mod compare;
mod gate;

pub use compare::{Compared, compare, sample_matches};
pub use gate::ChunkGate;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use modelshare_device::{ArenaHandle, ArenaWriter, PAGE, pagecache};
use xxhash_rust::xxh3::Xxh3;

use crate::error::CoreError;
use crate::model::{Manifest, TensorMeta};
use crate::registry::Reservation;
use crate::weights::error::WeightsError;
use crate::weights::layout::{ALIGNMENT, Layout, PlannedTensor};
use crate::weights::source::{ModelSource, Shard};

/// Threads a load uses by default: seven eighths of the machine's cores (the rest for the
/// device thread, the runtime and the kernel's side of the reads), at least 1, at most 32.
/// Measured on a 16-core H100 host, 8 GiB from the page cache (BENCHMARKS.md, "Loader"), in
/// the loader: 4 threads 19-21 GB/s, 8: 34-36, 12: 44-45, 14: 47-48, 16: 31-37 (all cores
/// copying starve the device thread).
pub fn default_threads() -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores - cores / 8).clamp(1, 32)
}

/// The manifest of `model` as `layout` places `source`'s tensors (version 0 and checksums 0:
/// the registry numbers it, the copy fills the checksums in).
pub fn manifest(model: &str, source: &ModelSource, layout: &Layout) -> Manifest {
    Manifest {
        model: model.to_owned(),
        version: 0,
        arena_bytes: layout.arena_bytes,
        alignment: ALIGNMENT,
        tensors: layout
            .tensors
            .iter()
            .map(|t| TensorMeta {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                offset: t.arena_offset,
                byte_length: t.byte_length,
                xxh3: 0,
                ms64: 0,
            })
            .collect(),
        header_metadata: source.header_metadata.clone(),
        files: source.metadata_files.clone(),
    }
}

/// What [`copy_into`] did: the manifest with every tensor's checksum, and how the bytes were
/// read.
#[derive(Debug)]
pub struct Copied {
    /// The manifest, checksums filled in.
    pub manifest: Manifest,
    /// Bytes read through the page cache.
    pub page_cache_bytes: u64,
    /// Bytes read with direct I/O.
    pub direct_bytes: u64,
}

/// How [`copy_into`] runs.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions<'a> {
    /// Threads (each with its own writer).
    pub threads: usize,
    /// Hash every byte on the CPU too (XXH3) where the device checksums.
    pub cpu_hash: bool,
    /// The server's chunk gate.
    pub gate: &'a ChunkGate,
    /// CPUs to bind the threads to: the device's NUMA node's, where the machine has several.
    pub cpus: Option<&'a [usize]>,
}

/// Fills `arena` (the arena of `job`) from `source` as `layout` plans it, with up to `threads`
/// threads, seals it, and returns the manifest with every tensor's checksum: ms64 where the
/// device computes it, XXH3 where it does not or `cpu_hash` asks for it too.
pub fn copy_into(
    job: &Reservation,
    arena: &ArenaHandle,
    source: &ModelSource,
    layout: &Layout,
    opts: &CopyOptions<'_>,
) -> Result<Copied, CoreError> {
    let CopyOptions {
        threads,
        cpu_hash,
        gate,
        cpus,
    } = *opts;
    // An empty list answers whether the backend checksums on the device at all.
    let device_sums = arena.checksums(Vec::new()).wait()?.is_some();
    let cpu_hash = cpu_hash || !device_sums;
    let order = largest_first(layout);
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let threads = threads.clamp(1, order.len().max(1));
    let direct: Vec<OnceLock<Option<File>>> =
        source.shards.iter().map(|_| OnceLock::new()).collect();
    let bytes = PathBytes::default();

    let running = AtomicUsize::new(threads);
    let _registered = gate.start();
    let started = std::time::Instant::now();
    let shared = Shared {
        order: &order,
        next: &next,
        failed: &failed,
        cpu_hash,
        direct: &direct,
        bytes: &bytes,
        gate,
        running: &running,
    };
    let results = run_threads(job, arena, source, layout, &shared, threads, cpus);

    let mut manifest = job.manifest.clone();
    record_cpu_sums(&mut manifest, results)?;
    check_cancel(job)?;
    let copied = started.elapsed();
    record_device_sums(arena, &mut manifest)?;
    arena.seal().wait()?;
    let (cached, direct_bytes) = (
        bytes.page_cache.load(Ordering::Relaxed),
        bytes.direct.load(Ordering::Relaxed),
    );
    log_phases(
        job,
        threads,
        cpu_hash,
        (cached, direct_bytes),
        copied,
        started,
    );
    Ok(Copied {
        manifest,
        page_cache_bytes: cached,
        direct_bytes,
    })
}

/// The indices of `layout`'s tensors, largest first (the order threads take them in).
fn largest_first(layout: &Layout) -> Vec<usize> {
    let mut order: Vec<usize> = (0..layout.tensors.len()).collect();
    order.sort_by_key(|i| std::cmp::Reverse(layout.tensors[*i].byte_length));
    order
}

/// Runs `threads` load threads (each bound to `cpus` where given) that take tensors from
/// `shared` until none are left; each thread's checksums, or its error, in thread order. A
/// thread that fails tells the others to stop.
fn run_threads(
    job: &Reservation,
    arena: &ArenaHandle,
    source: &ModelSource,
    layout: &Layout,
    shared: &Shared<'_>,
    threads: usize,
    cpus: Option<&[usize]>,
) -> Vec<Result<Vec<(usize, u64)>, CoreError>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    if let Some(cpus) = cpus {
                        // Best effort: an unbound thread loads as well, only farther away.
                        let _ = modelshare_device::numa::pin_current_thread(cpus);
                    }
                    let r = copy_some(job, arena, source, layout, shared);
                    if r.is_err() {
                        shared.failed.store(true, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(CoreError::Internal("a load thread panicked".into())))
            })
            .collect()
    })
}

/// Writes the threads' XXH3 sums into `manifest`'s tensors, or returns the error that says
/// most about why the load failed.
fn record_cpu_sums(
    manifest: &mut Manifest,
    results: Vec<Result<Vec<(usize, u64)>, CoreError>>,
) -> Result<(), CoreError> {
    let mut first_error = None;
    for r in results {
        match r {
            Ok(sums) => {
                for (i, sum) in sums {
                    if let Some(t) = manifest.tensors.get_mut(i) {
                        t.xxh3 = sum;
                    }
                }
            }
            // One thread's failure (or a cancellation it saw) stops the others, which then
            // report that they stopped: the cause is reported, a failure before a cancellation.
            Err(e) if first_error.as_ref().is_none_or(|f| rank(&e) > rank(f)) => {
                first_error = Some(e);
            }
            Err(_) => {}
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    Ok(())
}

/// Writes the device's ms64 of every tensor into `manifest`, where the backend computes them.
fn record_device_sums(arena: &ArenaHandle, manifest: &mut Manifest) -> Result<(), CoreError> {
    let ranges: Vec<(u64, u64)> = manifest
        .tensors
        .iter()
        .map(|t| (t.offset, t.byte_length))
        .collect();
    if let Some(sums) = arena.checksums(ranges).wait()? {
        for (t, sum) in manifest.tensors.iter_mut().zip(sums) {
            t.ms64 = sum;
        }
    }
    Ok(())
}

/// The "load phases" line: threads, hashing, how the bytes were read (`(page cache, direct)`),
/// the copy's time and the checksums' and seal's after it.
fn log_phases(
    job: &Reservation,
    threads: usize,
    cpu_hash: bool,
    (cached, direct_bytes): (u64, u64),
    copied: std::time::Duration,
    started: std::time::Instant,
) {
    tracing::info!(
        model = %job.model,
        version = job.version,
        threads,
        cpu_hash,
        read_path = match (cached, direct_bytes) {
            (_, 0) => "page cache",
            (0, _) => "direct I/O",
            _ => "page cache and direct I/O",
        },
        page_cache_bytes = cached,
        direct_bytes,
        copy_seconds = copied.as_secs_f64(),
        checksum_seconds = (started.elapsed() - copied).as_secs_f64(),
        "load phases"
    );
}

/// What a load thread reports when it stopped because another failed.
const STOPPED: &str = "another load thread failed";

/// How much an error of a load thread says about why the load failed: a thread that only
/// stopped because another failed says least, a cancellation more, a failure most.
fn rank(e: &CoreError) -> u8 {
    match e {
        CoreError::Internal(m) if m == STOPPED => 0,
        CoreError::LoadCancelled { .. } => 1,
        _ => 2,
    }
}

/// What the load threads share: the order of the tensors, the next one to take, whether one
/// failed, whether to hash on the CPU, each shard's direct-I/O descriptor (opened by the first
/// thread that needs it; `None` where direct I/O cannot be had), the bytes read each way, and
/// the server's [`ChunkGate`], entered for each chunk.
struct Shared<'a> {
    order: &'a [usize],
    next: &'a AtomicUsize,
    failed: &'a AtomicBool,
    cpu_hash: bool,
    direct: &'a [OnceLock<Option<File>>],
    bytes: &'a PathBytes,
    gate: &'a ChunkGate,
    /// This load's threads still taking tensors.
    running: &'a AtomicUsize,
}

/// Bytes read through the page cache and with direct I/O.
#[derive(Debug, Default)]
struct PathBytes {
    page_cache: AtomicU64,
    direct: AtomicU64,
}

impl Shared<'_> {
    /// Shard `i`'s direct-I/O descriptor, opened on first use.
    fn direct_file(&self, i: usize, source: &ModelSource) -> Option<&File> {
        let (slot, shard) = (self.direct.get(i)?, source.shards.get(i)?);
        slot.get_or_init(|| match pagecache::open_direct(&shard.file) {
            Ok(f) => Some(f),
            Err(e) => {
                tracing::info!(file = %shard.display, error = %e,
                    "no direct I/O for this file: every chunk is read through the page cache");
                None
            }
        })
        .as_ref()
    }
}

/// One thread's share: takes tensors until none are left; their XXH3 when hashing (else 0).
fn copy_some(
    job: &Reservation,
    arena: &ArenaHandle,
    source: &ModelSource,
    layout: &Layout,
    shared: &Shared<'_>,
) -> Result<Vec<(usize, u64)>, CoreError> {
    let mut writer = arena.writer().wait()?;
    let mut sums = Vec::new();
    loop {
        if shared.failed.load(Ordering::SeqCst) {
            return Err(CoreError::Internal(STOPPED.into()));
        }
        // More threads than this load's share while other loads run: this one stops (the
        // others take the remaining tensors). One at a time, never the last.
        let n = shared.running.load(Ordering::SeqCst);
        if shared.gate.over_share(n)
            && shared
                .running
                .compare_exchange(n, n - 1, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
        {
            break;
        }
        let Some(&i) = shared.order.get(shared.next.fetch_add(1, Ordering::SeqCst)) else {
            break;
        };
        let planned = &layout.tensors[i];
        let hasher = shared.cpu_hash.then(Xxh3::new);
        sums.push((
            i,
            copy_tensor(job, source, planned, writer.as_mut(), shared, hasher)?,
        ));
    }
    writer.finish()?;
    Ok(sums)
}

fn copy_tensor(
    job: &Reservation,
    source: &ModelSource,
    planned: &PlannedTensor,
    writer: &mut dyn ArenaWriter,
    shared: &Shared<'_>,
    mut hasher: Option<Xxh3>,
) -> Result<u64, CoreError> {
    let shard = shard_of(source, planned)?;
    let staged = writer.staged();
    let direct = if staged {
        shared.direct_file(planned.shard, source)
    } else {
        None
    };
    let io_error = |at: u64, e: std::io::Error| read_error(shard, planned, at, e);
    let mut done = 0u64;
    while done < planned.byte_length {
        check_cancel(job)?;
        if shared.failed.load(Ordering::SeqCst) {
            return Err(CoreError::Internal(STOPPED.into()));
        }
        let _slot = shared.gate.enter();
        let buf = writer.buffer(planned.arena_offset + done)?;
        // A staged buffer keeps a page spare for a direct read's unaligned start.
        let room = if staged {
            buf.len().saturating_sub(PAGE)
        } else {
            buf.len()
        };
        if room == 0 {
            return Err(CoreError::Internal(format!(
                "a writer's buffer of {} bytes has no room for a chunk",
                buf.len()
            )));
        }
        let step = usize::try_from(planned.byte_length - done)
            .unwrap_or(room)
            .min(room);
        let at = planned.file_offset + done;
        let cold = direct.filter(|_| !pagecache::resident(&shard.file, at, step).unwrap_or(true));
        let skip = match cold {
            Some(file) => {
                let skip =
                    pagecache::read_direct(file, buf, at, step).map_err(|e| io_error(at, e))?;
                shared
                    .bytes
                    .direct
                    .fetch_add(step as u64, Ordering::Relaxed);
                skip
            }
            None => {
                shard
                    .file
                    .read_exact_at(&mut buf[..step], at)
                    .map_err(|e| io_error(at, e))?;
                shared
                    .bytes
                    .page_cache
                    .fetch_add(step as u64, Ordering::Relaxed);
                0
            }
        };
        if let Some(h) = hasher.as_mut() {
            h.update(&buf[skip..skip + step]);
        }
        writer.submit(skip, step)?;
        done += step as u64;
        job.progress.done.fetch_add(step as u64, Ordering::Relaxed);
    }
    Ok(hasher.map_or(0, |h| h.digest()))
}

/// The shard file `planned` is in.
fn shard_of<'a>(source: &'a ModelSource, planned: &PlannedTensor) -> Result<&'a Shard, CoreError> {
    source.shards.get(planned.shard).ok_or_else(|| {
        CoreError::Internal(format!(
            "tensor '{}' names shard {} of {}",
            planned.name,
            planned.shard,
            source.shards.len()
        ))
    })
}

/// A failed read of `planned` at file offset `at`, naming the file and the tensor.
fn read_error(shard: &Shard, planned: &PlannedTensor, at: u64, e: std::io::Error) -> CoreError {
    CoreError::Weights(WeightsError::Io {
        file: shard.display.clone(),
        source: std::io::Error::new(
            e.kind(),
            format!("reading tensor '{}' at byte {at}: {e}", planned.name),
        ),
    })
}

fn check_cancel(job: &Reservation) -> Result<(), CoreError> {
    if job.progress.cancel.load(Ordering::SeqCst) {
        return Err(CoreError::LoadCancelled {
            model: job.model.clone(),
            version: job.version,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests;
