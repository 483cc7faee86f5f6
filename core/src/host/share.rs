//! A load that may take the memory of a version with the same layout: its files compared
//! with that memory on blocking threads ([`loader::compare`]), then the memory shared, or,
//! where a byte differs (or the two models may no longer share it), the load's own memory
//! reserved and the copy run as any other.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use modelshare_device::DeviceThread;
use tracing::{info, warn};

use super::copy::LoadCopy;
use crate::devices::{Devices, MemoryReservation};
use crate::error::CoreError;
use crate::loader::{self, Compared};
use crate::registry::{SharedArena, VersionSnapshot};
use crate::tenants::policy::ShareIdentical;

/// How a load that compared its files with shared memory goes on.
pub(super) enum Outcome {
    /// It ended: shared, or failed (the version says why).
    Done(Result<VersionSnapshot, CoreError>),
    /// It copies into memory of its own, reserved on `device`.
    Copy(Box<LoadCopy>, MemoryReservation),
}

/// Compares `copy`'s files with `shared`'s memory, and takes that memory where they hold
/// the same bytes and `rule` still lets the two models share it; else reserves memory for a
/// copy on `device` (refused, like any load, when the device has no room).
pub(super) async fn take(
    copy: LoadCopy,
    shared: SharedArena,
    rule: ShareIdentical,
    devices: &Arc<Devices>,
    device: &DeviceThread,
) -> Outcome {
    let (registry, metrics) = (copy.registry.clone(), copy.metrics.clone());
    let (model, version) = (copy.reservation.model.clone(), copy.reservation.version);
    let fail = |err: CoreError| {
        warn!(model = %model, version, error = %err, "load failed");
        metrics.loads.with_label_values(&["error"]).inc();
        registry.finish_load(&model, version, Err(err.to_string()));
        Outcome::Done(Err(err))
    };
    let compared = tokio::task::spawn_blocking(move || {
        let r = loader::compare(
            &copy.reservation,
            &shared.arena,
            &copy.src,
            &copy.plan,
            copy.threads,
            &copy.gate,
        );
        (copy, shared, r)
    })
    .await;
    let (copy, shared, compared) = match compared {
        Ok(done) => done,
        Err(e) => return fail(CoreError::Internal(format!("compare task failed: {e}"))),
    };
    let holder = format!("{}@{}", shared.holder.model, shared.holder.version);
    match compared {
        Ok(Compared::Same { sha256 }) => {
            if registry.share_arena(&model, version, &shared, sha256, rule) {
                return Outcome::Done(copy.shared(&shared, sha256));
            }
            info!(model = %model, version, holder = %holder,
                "the memory compared equal, but the two models may no longer share it (access changed, or it was let go): loading a copy");
        }
        Ok(Compared::Differs { tensor }) => {
            info!(model = %model, version, holder = %holder, tensor = %tensor,
                "the files differ from memory of the same layout: loading a copy");
        }
        Err(e) => return fail(e),
    }
    copy.reservation.progress.done.store(0, Ordering::Relaxed);
    if let Err(e) = registry.device_room_now(&model, version) {
        return fail(e);
    }
    let (devices, device) = (devices.clone(), device.clone());
    let bytes = copy.reservation.manifest.arena_bytes;
    let name = model.clone();
    let reserved =
        tokio::task::spawn_blocking(move || devices.reserve(&device, &name, bytes)).await;
    match reserved {
        Ok(Ok(memory)) => Outcome::Copy(Box::new(copy), memory),
        Ok(Err(e)) => fail(e),
        Err(e) => fail(CoreError::Internal(format!("admission task failed: {e}"))),
    }
}
