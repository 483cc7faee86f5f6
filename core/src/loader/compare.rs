//! Whether a load's files hold the bytes an arena already holds, before the load takes that
//! arena instead of a copy of its own (`registry::sharing`).
//!
//! Threads take tensors largest first, as a copy does; each reads its tensors' byte ranges
//! from the (already open, already validated) shard files in chunks, hashes them with SHA-256
//! as they stream, and compares every chunk byte for byte with the arena's bytes at the
//! tensor's offset, read back from the device. The first difference stops every thread: the
//! load then copies as usual. Nothing is written anywhere; the arena's own checksums
//! (non-cryptographic, so a tenant could make files that collide with them) decide nothing.

use std::os::unix::fs::FileExt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use modelshare_device::{ArenaHandle, ArenaReader};
use sha2::{Digest, Sha256};

use super::{ChunkGate, check_cancel, largest_first, read_error, shard_of};
use crate::error::CoreError;
use crate::registry::Reservation;
use crate::weights::layout::{Layout, PlannedTensor};
use crate::weights::source::ModelSource;

/// The bytes a thread reads and compares at once.
const CHUNK: usize = 4 << 20;

/// Tensors [`sample_matches`] looks at, at most, and the bytes at each end of each.
const SAMPLED_TENSORS: usize = 64;
const SAMPLE_BYTES: u64 = 4096;

/// What [`compare`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Compared {
    /// Every byte is equal. The SHA-256 of the tensors' bytes in arena order (each tensor's
    /// SHA-256, hashed in that order), computed from the files as they streamed.
    Same {
        /// The digest.
        sha256: [u8; 32],
    },
    /// The tensor named holds other bytes.
    Differs {
        /// The first tensor found to differ.
        tensor: String,
    },
}

/// Compares `source`'s tensors, as `layout` places them, with `arena`'s bytes, on up to
/// `threads` threads passing `gate` for each chunk. A cancelled load (`job`) or a file that
/// cannot be read is an error; bytes that differ are not.
pub fn compare(
    job: &Reservation,
    arena: &ArenaHandle,
    source: &ModelSource,
    layout: &Layout,
    threads: usize,
    gate: &ChunkGate,
) -> Result<Compared, CoreError> {
    let order = largest_first(layout);
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let differs: Mutex<Option<String>> = Mutex::new(None);
    let digests: Mutex<Vec<[u8; 32]>> = Mutex::new(vec![[0; 32]; layout.tensors.len()]);
    let threads = threads.clamp(1, order.len().max(1));
    let _registered = gate.start();
    let one_thread = || -> Result<(), CoreError> {
        let mut reader = arena.reader().wait()?;
        let mut buf = vec![0u8; CHUNK.min(reader.capacity())];
        while !stop.load(Ordering::SeqCst) {
            let Some(&i) = order.get(next.fetch_add(1, Ordering::SeqCst)) else {
                break;
            };
            let planned = &layout.tensors[i];
            let read = Read {
                reader: reader.as_mut(),
                buf: &mut buf,
            };
            match compare_tensor(job, source, planned, read, gate, &stop)? {
                Some(digest) => {
                    digests.lock().unwrap_or_else(|e| e.into_inner())[i] = digest;
                }
                None => {
                    stop.store(true, Ordering::SeqCst);
                    let mut first = differs.lock().unwrap_or_else(|e| e.into_inner());
                    first.get_or_insert_with(|| planned.name.clone());
                }
            }
        }
        Ok(())
    };
    let results: Vec<Result<(), CoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let r = one_thread();
                    if r.is_err() {
                        stop.store(true, Ordering::SeqCst);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CoreError::Internal("a compare thread panicked".into()))
                })
            })
            .collect()
    });
    // A load unloaded meanwhile is cancelled, whatever the bytes.
    check_cancel(job)?;
    if let Some(tensor) = differs.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Ok(Compared::Differs { tensor });
    }
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    let mut whole = Sha256::new();
    for d in digests.into_inner().unwrap_or_else(|e| e.into_inner()) {
        whole.update(d);
    }
    Ok(Compared::Same {
        sha256: whole.finalize().into(),
    })
}

/// A thread's way to the bytes: its reader of the arena, and its buffer for the files'.
struct Read<'a> {
    reader: &'a mut dyn ArenaReader,
    buf: &'a mut [u8],
}

/// Whether a sample of `source`'s tensors, as `layout` places them, equals `arena`'s bytes:
/// the first and last 4 KiB of up to 64 tensors spread over the layout. Cheap (a few hundred
/// KiB), so that a load of the same layout and other bytes (another fine-tune of one
/// architecture) is not taken for a load of these bytes: it is placed and copied as any
/// other, without a comparison of every byte first. A read that fails says no.
pub fn sample_matches(arena: &ArenaHandle, source: &ModelSource, layout: &Layout) -> bool {
    let Ok(mut reader) = arena.reader().wait() else {
        return false;
    };
    let count = layout.tensors.len();
    let step = count.div_ceil(SAMPLED_TENSORS).max(1);
    let mut buf = vec![0u8; SAMPLE_BYTES as usize];
    layout.tensors.iter().step_by(step).all(|planned| {
        let Ok(shard) = shard_of(source, planned) else {
            return false;
        };
        let len = planned.byte_length.min(SAMPLE_BYTES);
        [0, planned.byte_length - len].iter().all(|&at| {
            let file_bytes = &mut buf[..len as usize];
            shard
                .file
                .read_exact_at(file_bytes, planned.file_offset + at)
                .is_ok()
                && reader
                    .read(planned.arena_offset + at, len as usize)
                    .is_ok_and(|held| held == &*file_bytes)
        })
    })
}

/// One tensor: its SHA-256 when every byte equals the arena's, `None` at the first
/// difference (or when another thread found one).
fn compare_tensor(
    job: &Reservation,
    source: &ModelSource,
    planned: &PlannedTensor,
    read: Read<'_>,
    gate: &ChunkGate,
    stop: &AtomicBool,
) -> Result<Option<[u8; 32]>, CoreError> {
    let Read { reader, buf } = read;
    let shard = shard_of(source, planned)?;
    let mut hasher = Sha256::new();
    let mut done = 0u64;
    while done < planned.byte_length {
        check_cancel(job)?;
        if stop.load(Ordering::SeqCst) {
            return Ok(None);
        }
        let _slot = gate.enter();
        let step = usize::try_from(planned.byte_length - done)
            .unwrap_or(buf.len())
            .min(buf.len());
        let at = planned.file_offset + done;
        let file_bytes = &mut buf[..step];
        shard
            .file
            .read_exact_at(file_bytes, at)
            .map_err(|e| read_error(shard, planned, at, e))?;
        hasher.update(&*file_bytes);
        let held = reader.read(planned.arena_offset + done, step)?;
        if held != &*file_bytes {
            return Ok(None);
        }
        done += step as u64;
        job.progress.done.fetch_add(step as u64, Ordering::Relaxed);
    }
    Ok(Some(hasher.finalize().into()))
}
