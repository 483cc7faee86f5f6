//! Plans a version's manifest, and copies validated weights into its arena.
//!
//! [`manifest`] builds the manifest from the validated source and its layout (the registry gets
//! it finished). [`copy_into`] runs on blocking threads: tensors are handed out largest first to
//! `threads` workers; each has its own [`modelshare_device::ArenaWriter`] (on CUDA: pinned
//! staging buffers whose copies the device thread submits, so file reads overlap device copies)
//! and reads its tensors' byte ranges from the (already open, already validated) shard files in
//! chunks. Where the backend checksums on the device (CUDA: ms64, after the copy), that is the
//! manifest's checksum and the bytes are not hashed on the CPU (XXH3 costs a core per ~1.9 GB/s,
//! the load's bottleneck; `load_cpu_hash` turns it back on); elsewhere (host memory, or CUDA
//! without NVRTC) each chunk is hashed with XXH3-64 on the way.
//! Progress goes to the shared [`LoadProgress`]; an unload sets its `cancel` flag, checked
//! between chunks; the first error stops the other threads. The arena is sealed at the end.

use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use modelshare_device::{ArenaHandle, ArenaWriter};
use xxhash_rust::xxh3::Xxh3;

use crate::error::ServerError;
use crate::model::{Manifest, TensorMeta};
use crate::registry::Reservation;
use crate::weights::error::WeightsError;
use crate::weights::layout::{ALIGNMENT, Layout, PlannedTensor};
use crate::weights::source::ModelSource;

/// Bytes read and written per step (one staging buffer on CUDA).
pub const CHUNK_BYTES: usize = 16 << 20;

/// Threads a load uses by default: the machine's cores, at most 32. Each thread reads from the
/// page cache and hashes on the CPU, so the speed scales with them (measured on an H100 host,
/// 8 GiB warm: 4 threads 11.6 GB/s, 8: 16.4, 12: 23.1, 16: 26.0; see BENCHMARKS.md).
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(32)
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

/// Fills `arena` (the arena of `job`) from `source` as `layout` plans it, with up to `threads`
/// threads, seals it, and returns the manifest with every tensor's checksum: ms64 where the
/// device computes it, XXH3 where it does not or `cpu_hash` asks for it too.
pub fn copy_into(
    job: &Reservation,
    arena: &ArenaHandle,
    source: &ModelSource,
    layout: &Layout,
    threads: usize,
    cpu_hash: bool,
) -> Result<Manifest, ServerError> {
    // An empty list answers whether the backend checksums on the device at all.
    let device_sums = arena.checksums(Vec::new()).wait()?.is_some();
    let cpu_hash = cpu_hash || !device_sums;
    let mut order: Vec<usize> = (0..layout.tensors.len()).collect();
    order.sort_by_key(|i| std::cmp::Reverse(layout.tensors[*i].byte_length));
    let next = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let threads = threads.clamp(1, order.len().max(1));

    let started = std::time::Instant::now();
    let results: Vec<Result<Vec<(usize, u64)>, ServerError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let shared = Shared {
                        order: &order,
                        next: &next,
                        failed: &failed,
                        cpu_hash,
                    };
                    let r = copy_some(job, arena, source, layout, &shared);
                    if r.is_err() {
                        failed.store(true, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(ServerError::Internal("a load thread panicked".into())))
            })
            .collect()
    });

    let mut manifest = job.manifest.clone();
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
            // A cancellation seen by one thread makes the others stop too; report the cause.
            Err(e)
                if first_error.is_none()
                    || matches!(first_error, Some(ServerError::LoadCancelled { .. })) =>
            {
                first_error = Some(e);
            }
            Err(_) => {}
        }
    }
    if let Some(e) = first_error {
        return Err(e);
    }
    check_cancel(job)?;
    let copied = started.elapsed();
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
    arena.seal().wait()?;
    tracing::info!(
        model = %job.model,
        version = job.version,
        threads,
        cpu_hash,
        copy_seconds = copied.as_secs_f64(),
        checksum_seconds = (started.elapsed() - copied).as_secs_f64(),
        "load phases"
    );
    Ok(manifest)
}

/// What the load threads share: the order of the tensors, the next one to take, whether one
/// failed, and whether to hash on the CPU.
struct Shared<'a> {
    order: &'a [usize],
    next: &'a AtomicUsize,
    failed: &'a AtomicBool,
    cpu_hash: bool,
}

/// One thread's share: takes tensors until none are left; their XXH3 when hashing (else 0).
fn copy_some(
    job: &Reservation,
    arena: &ArenaHandle,
    source: &ModelSource,
    layout: &Layout,
    shared: &Shared<'_>,
) -> Result<Vec<(usize, u64)>, ServerError> {
    let mut writer = arena.writer().wait()?;
    let mut sums = Vec::new();
    loop {
        if shared.failed.load(Ordering::SeqCst) {
            return Err(ServerError::Internal("another load thread failed".into()));
        }
        let Some(&i) = shared.order.get(shared.next.fetch_add(1, Ordering::SeqCst)) else {
            break;
        };
        let planned = &layout.tensors[i];
        let hasher = shared.cpu_hash.then(Xxh3::new);
        sums.push((
            i,
            copy_tensor(job, source, planned, writer.as_mut(), shared.failed, hasher)?,
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
    failed: &AtomicBool,
    mut hasher: Option<Xxh3>,
) -> Result<u64, ServerError> {
    let shard = source.shards.get(planned.shard).ok_or_else(|| {
        ServerError::Internal(format!(
            "tensor '{}' names shard {} of {}",
            planned.name,
            planned.shard,
            source.shards.len()
        ))
    })?;
    let mut done = 0u64;
    while done < planned.byte_length {
        check_cancel(job)?;
        if failed.load(Ordering::SeqCst) {
            return Err(ServerError::Internal("another load thread failed".into()));
        }
        let want = usize::try_from(planned.byte_length - done)
            .unwrap_or(CHUNK_BYTES)
            .min(CHUNK_BYTES);
        let chunk = writer.buffer(want)?;
        let step = chunk.len();
        let at = planned.file_offset + done;
        shard.file.read_exact_at(chunk, at).map_err(|e| {
            ServerError::Weights(WeightsError::Io {
                file: shard.display.clone(),
                source: std::io::Error::new(
                    e.kind(),
                    format!("reading tensor '{}' at byte {at}: {e}", planned.name),
                ),
            })
        })?;
        if let Some(h) = hasher.as_mut() {
            h.update(chunk);
        }
        writer.submit(planned.arena_offset + done, step)?;
        done += step as u64;
        job.progress.done.fetch_add(step as u64, Ordering::Relaxed);
    }
    Ok(hasher.map_or(0, |h| h.digest()))
}

fn check_cancel(job: &Reservation) -> Result<(), ServerError> {
    if job.progress.cancel.load(Ordering::SeqCst) {
        return Err(ServerError::LoadCancelled {
            model: job.model.clone(),
            version: job.version,
        });
    }
    Ok(())
}
