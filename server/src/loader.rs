//! Copies validated weights into a version's arena.
//!
//! Runs on a blocking thread: reads each tensor's byte range from its (already open, already
//! validated) shard file in chunks, writes them at the tensor's arena offset, and computes the
//! tensor's XXH3-64 on the way. Progress goes to the shared [`LoadProgress`]; an unload sets its
//! `cancel` flag, checked between chunks. The arena is sealed (made immutable) at the end.

use std::os::unix::fs::FileExt;
use std::sync::atomic::Ordering;

use xxhash_rust::xxh3::Xxh3;

use crate::error::ServerError;
use crate::model::Manifest;
use crate::registry::{LoadJob, LoadProgress};
use crate::weights::error::WeightsError;
use crate::weights::layout::Layout;
use crate::weights::source::ModelSource;

/// Bytes read and written per step.
const CHUNK_BYTES: usize = 8 << 20;

/// Fills `job`'s arena from `source` as `layout` plans it, seals it, and returns the manifest
/// with every tensor's checksum.
pub fn copy_into(
    job: &LoadJob,
    source: &ModelSource,
    layout: &Layout,
) -> Result<Manifest, ServerError> {
    let mut manifest = job.manifest.clone();
    let largest = layout
        .tensors
        .iter()
        .map(|t| t.byte_length)
        .max()
        .unwrap_or(0);
    let mut buf = vec![
        0u8;
        usize::try_from(largest)
            .unwrap_or(CHUNK_BYTES)
            .min(CHUNK_BYTES)
    ];
    for (planned, meta) in layout.tensors.iter().zip(manifest.tensors.iter_mut()) {
        let shard = source.shards.get(planned.shard).ok_or_else(|| {
            ServerError::Internal(format!(
                "tensor '{}' names shard {} of {}",
                planned.name,
                planned.shard,
                source.shards.len()
            ))
        })?;
        let mut hasher = Xxh3::new();
        let mut done = 0u64;
        while done < planned.byte_length {
            check_cancel(job, &job.progress)?;
            let step = (planned.byte_length - done).min(buf.len() as u64);
            // `step` <= buf.len(), so it fits in usize.
            let chunk = &mut buf[..step as usize];
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
            hasher.update(chunk);
            job.arena.write_at(planned.arena_offset + done, chunk)?;
            done += step;
            job.progress.done.fetch_add(step, Ordering::Relaxed);
        }
        meta.xxh3 = hasher.digest();
    }
    check_cancel(job, &job.progress)?;
    job.arena.seal()?;
    Ok(manifest)
}

fn check_cancel(job: &LoadJob, progress: &LoadProgress) -> Result<(), ServerError> {
    if progress.cancel.load(Ordering::SeqCst) {
        return Err(ServerError::LoadCancelled {
            model: job.model.clone(),
            version: job.version,
        });
    }
    Ok(())
}
