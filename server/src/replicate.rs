//! Replicas: a ready version's arena copied to further devices of the server, device to
//! device (CUDA: `cuMemcpyPeerAsync` over NVLink or PCIe), never read from the files again.
//!
//! One thread per target device: allocate the replica's arena there (its ready event closed),
//! hand it to the registry (workers on that device may attach from then on and wait on the
//! event), copy, check every tensor where the bytes now live (ms64 on the device, against
//! the manifest's), seal (the event completes). A replica whose copy fails is dropped and
//! logged; the version stays ready on its other devices.

use std::time::Instant;

use modelshare_device::{ArenaHandle, DeviceThread};
use tracing::{info, warn};

use crate::error::ServerError;
use crate::metrics::Metrics;
use crate::registry::Registry;
use crate::tenants::Caller;

/// Copies `source`, the ready arena of `model`@`version`, to each of `targets` at once;
/// returns when every copy has ended (done or dropped).
pub fn copy_all(
    registry: &Registry,
    metrics: &Metrics,
    model: &str,
    version: u32,
    source: &ArenaHandle,
    targets: &[DeviceThread],
) {
    std::thread::scope(|scope| {
        for target in targets {
            scope.spawn(move || {
                let started = Instant::now();
                match copy_one(registry, model, version, source, target) {
                    Ok(copy_seconds) => {
                        let bytes = source.len();
                        metrics
                            .replica_copies
                            .with_label_values(&[target.uuid(), "ok"])
                            .inc();
                        metrics
                            .replica_copy_seconds
                            .with_label_values(&[target.uuid()])
                            .observe(copy_seconds);
                        info!(
                            model,
                            version,
                            device = target.uuid(),
                            bytes,
                            copy_seconds,
                            gb_per_s = bytes as f64 / copy_seconds.max(1e-9) / 1e9,
                            seconds = started.elapsed().as_secs_f64(),
                            "replica copied"
                        );
                    }
                    Err(e) => {
                        metrics
                            .replica_copies
                            .with_label_values(&[target.uuid(), "error"])
                            .inc();
                        warn!(model, version, device = target.uuid(), error = %e, "replica dropped");
                        registry.drop_replica(model, version, target.uuid());
                    }
                }
            });
        }
    });
}

/// One replica: allocated, registered, copied, checked and sealed; the copy's seconds.
fn copy_one(
    registry: &Registry,
    model: &str,
    version: u32,
    source: &ArenaHandle,
    target: &DeviceThread,
) -> Result<f64, ServerError> {
    let label = format!("{model}@{version}");
    let arena = target.allocate(source.len(), &label).wait()?;
    if !registry.set_replica_arena(model, version, target.uuid(), arena.clone()) {
        arena.abandon();
        return Err(ServerError::LoadCancelled {
            model: model.to_owned(),
            version,
        });
    }
    let result = fill(registry, model, version, source, &arena, target.uuid());
    if result.is_err() {
        // Workers already waiting on the replica's ready event are let go; the registry drops
        // the replica (and the sessions' leases on it stay until released).
        arena.abandon();
    }
    result
}

fn fill(
    registry: &Registry,
    model: &str,
    version: u32,
    source: &ArenaHandle,
    arena: &ArenaHandle,
    device: &str,
) -> Result<f64, ServerError> {
    let to = arena.ordinal().wait()?;
    let copying = Instant::now();
    let peer = source.peer_source(to).wait()?;
    arena.copy_from(peer).wait()?;
    let copy_seconds = copying.elapsed().as_secs_f64();
    let (_, manifest) = registry.describe(&Caller::Admin, model, version)?;
    let manifest = manifest.ok_or_else(|| ServerError::LoadCancelled {
        model: model.to_owned(),
        version,
    })?;
    let ranges = manifest
        .tensors
        .iter()
        .map(|t| (t.offset, t.byte_length))
        .collect();
    if let Some(sums) = arena.checksums(ranges).wait()? {
        for (t, sum) in manifest.tensors.iter().zip(sums) {
            if t.ms64 != 0 && t.ms64 != sum {
                return Err(ServerError::Internal(format!(
                    "the replica's tensor '{}' differs from the source (ms64 {sum:#x}, \
                     expected {:#x})",
                    t.name, t.ms64
                )));
            }
        }
    }
    arena.seal().wait()?;
    registry.replica_ready(model, version, device);
    Ok(copy_seconds)
}
