//! Replicas: a ready version's arena copied to further devices of the server, device to
//! device (CUDA: `cuMemcpyPeerAsync` over NVLink or PCIe), never read from the files again.
//!
//! One thread per target device: allocate the replica's arena there (its ready event closed),
//! hand it to the registry (workers on that device may attach from then on and wait on the
//! event), copy, check every tensor where the bytes now live (ms64 on the device, against
//! the manifest's), seal (the event completes). A replica whose copy fails is dropped and
//! logged, and the workers that attached to it while it was copied are ended; the version
//! stays ready on its other devices. The version is named by [`VersionKey`] throughout: if
//! its name is unloaded and loaded again meanwhile, the copy touches nothing of the new load.

use std::sync::Arc;
use std::time::Instant;

use modelshare_device::{ArenaHandle, DeviceThread};
use tracing::{info, warn};

use crate::devices::Devices;
use crate::error::CoreError;
use crate::metrics::Metrics;
use crate::registry::{Registry, ReplicaOnAttach, VersionKey};
use crate::tenants::{Caller, Quota};

/// What [`for_worker`] needs of the server.
pub struct Replicator<'a> {
    /// The registry, shared with the copy.
    pub registry: &'a Arc<Registry>,
    /// The metrics, shared with the copy.
    pub metrics: &'a Arc<Metrics>,
    /// The devices, whose memory the copy is admitted against ([`Devices::reserve`]).
    pub devices: &'a Arc<Devices>,
    /// A tenant's quota.
    pub quota_of: &'a (dyn Fn(&str) -> Quota + Sync),
}

impl std::fmt::Debug for Replicator<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator").finish_non_exhaustive()
    }
}

/// `replicate_on_attach`: a worker of `caller` on `target`, one of the server's devices,
/// attached to `model`@`version`, which has no arena there. Starts a copy there when the
/// version is ready and it fits (the device's `max_device_bytes` and free memory,
/// `max_total_bytes`, the owner's quota), in the background. `Ok(true)`: a copy is being made
/// (or the version is still loading, or a copy was already under way), so the worker should
/// retry; `Ok(false)`: none will be (the version is ending).
pub async fn for_worker(
    server: &Replicator<'_>,
    caller: &Caller,
    model: &str,
    version: u32,
    target: &DeviceThread,
) -> Result<bool, CoreError> {
    let (key, source) =
        match server
            .registry
            .add_replica(caller, model, version, target.uuid(), server.quota_of)?
        {
            ReplicaOnAttach::Copy { key, source } => (key, source),
            ReplicaOnAttach::Pending => return Ok(true),
            ReplicaOnAttach::Refused => return Ok(false),
        };
    // Reserved; refused now when the device has not the memory free (loads and copies in
    // progress counted), else that memory is reserved until the copy ends.
    let admitted = {
        let (devices, device, model, bytes) = (
            server.devices.clone(),
            target.clone(),
            model.to_owned(),
            source.len(),
        );
        tokio::task::spawn_blocking(move || devices.reserve(&device, &model, bytes))
            .await
            .unwrap_or_else(|e| Err(CoreError::Internal(format!("admission task failed: {e}"))))
    };
    let memory = match admitted {
        Ok(memory) => memory,
        Err(why) => {
            server
                .registry
                .drop_replica(&key, target.uuid(), &why.to_string());
            return Err(why);
        }
    };
    info!(
        model,
        version = key.version,
        device = target.uuid(),
        "copying a replica for a worker on this device"
    );
    let (registry, metrics, target) = (
        server.registry.clone(),
        server.metrics.clone(),
        target.clone(),
    );
    tokio::task::spawn_blocking(move || {
        copy_all(&registry, &metrics, &key, &source, &[target]);
        drop(memory);
    });
    Ok(true)
}

/// Copies `source`, the ready arena of the version `key`, to each of `targets` at once;
/// returns when every copy has ended (done or dropped).
pub fn copy_all(
    registry: &Registry,
    metrics: &Metrics,
    key: &VersionKey,
    source: &ArenaHandle,
    targets: &[DeviceThread],
) {
    let (model, version) = (key.model.as_str(), key.version);
    std::thread::scope(|scope| {
        for target in targets {
            scope.spawn(move || {
                let started = Instant::now();
                match copy_one(registry, key, source, target) {
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
                        registry.drop_replica(key, target.uuid(), &e.to_string());
                    }
                }
            });
        }
    });
}

/// One replica: allocated, registered, copied, checked and sealed; the copy's seconds.
fn copy_one(
    registry: &Registry,
    key: &VersionKey,
    source: &ArenaHandle,
    target: &DeviceThread,
) -> Result<f64, CoreError> {
    let label = format!("{}@{}", key.model, key.version);
    let arena = target.allocate(source.len(), &label).wait()?;
    if !registry.set_replica_arena(key, target.uuid(), arena.clone()) {
        arena.abandon();
        return Err(cancelled(key));
    }
    let result = fill(registry, key, source, &arena, target.uuid());
    if result.is_err() {
        // Workers already waiting on the replica's ready event are let go; the registry then
        // drops the replica and ends their sessions (see `Registry::drop_replica`).
        arena.abandon();
    }
    result
}

/// The version is no longer on record (unloaded, or its name loaded again since).
fn cancelled(key: &VersionKey) -> CoreError {
    CoreError::LoadCancelled {
        model: key.model.clone(),
        version: key.version,
    }
}

fn fill(
    registry: &Registry,
    key: &VersionKey,
    source: &ArenaHandle,
    arena: &ArenaHandle,
    device: &str,
) -> Result<f64, CoreError> {
    let to = arena.ordinal().wait()?;
    let copying = Instant::now();
    let peer = source.peer_source(to).wait()?;
    arena.copy_from(peer).wait()?;
    let copy_seconds = copying.elapsed().as_secs_f64();
    let manifest = registry
        .replica_manifest(key)
        .ok_or_else(|| cancelled(key))?;
    let ranges = manifest
        .tensors
        .iter()
        .map(|t| (t.offset, t.byte_length))
        .collect();
    if let Some(sums) = arena.checksums(ranges).wait()? {
        for (t, sum) in manifest.tensors.iter().zip(sums) {
            if t.ms64 != 0 && t.ms64 != sum {
                return Err(CoreError::Internal(format!(
                    "the replica's tensor '{}' differs from the source (ms64 {sum:#x}, \
                     expected {:#x})",
                    t.name, t.ms64
                )));
            }
        }
    }
    arena.seal().wait()?;
    if !registry.replica_ready(key, device) {
        return Err(cancelled(key));
    }
    Ok(copy_seconds)
}
