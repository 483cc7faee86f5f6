//! Adopting memory a worker kept across a server restart: an offer redeemed on the handle
//! socket (see [`crate::held`] for the records and the rules).
//!
//! The descriptor is imported on its device's thread, then every tensor's checksum is checked
//! where the bytes live (ms64 on the device for CUDA; XXH3 over the bytes otherwise) against
//! the record the earlier run wrote. Only then is the memory used: handed to a load waiting
//! for it (a start-up model), or the version is brought back by a load of its own (its old
//! number, owner and access), which finds the memory instead of reading the files.
//!
//! What the check guards against is a wrong or stale arena (another version, memory changed
//! through a writable mapping), not a hostile worker: any process that holds a VMM descriptor
//! can map it writable itself and change the bytes at any time, restart or not.

use std::os::fd::OwnedFd;
use std::time::Duration;

use modelshare_device::ArenaHandle;
use tracing::{info, warn};
use xxhash_rust::xxh3::Xxh3;

use crate::held::{HeldRecord, Key};
use crate::host::Host;
use crate::registry::LoadFor;
use crate::tenants::Caller;

/// Bytes read per step when checking host memory.
const CHECK_CHUNK: usize = 16 << 20;

/// How long a restore waits for a free load slot.
const SLOT_WAIT: Duration = Duration::from_secs(10);
/// How long memory offered during start-up waits for a start-up load to claim it (the held
/// store keeps it at least this long once offered).
const STARTUP_WAIT: Duration = Duration::from_secs(60);

/// Redeems the offer `ticket` (presented by `peer_uid` with `fd`): imports, checks and adopts
/// the memory. `Err` is the refusal sent back to the worker.
pub async fn redeem(
    host: &Host,
    ticket: &str,
    fd: OwnedFd,
    peer_uid: Option<u32>,
) -> Result<(), String> {
    let redeemed = host.held.redeem_offer(ticket, peer_uid)?;
    let record = redeemed.record;
    let key: Key = (record.model.clone(), record.version);
    let outcome = adopt(host, &record, fd, redeemed.alloc_len).await;
    if outcome.is_err() {
        host.held.offer_failed(&key);
    }
    outcome
}

async fn adopt(
    host: &Host,
    record: &HeldRecord,
    fd: OwnedFd,
    alloc_len: u64,
) -> Result<(), String> {
    let device = host
        .devices
        .get(&record.device_uuid)
        .ok_or_else(|| format!("this server has no device {}", record.device_uuid))?;
    let started = std::time::Instant::now();
    let arena = device
        .adopt(fd, alloc_len, record.arena_bytes)
        .await
        .map_err(|e| format!("the memory cannot be taken over: {e}"))?;
    let imported = started.elapsed();
    check(&arena, record).await?;
    let checked = started.elapsed() - imported;
    let key: Key = (record.model.clone(), record.version);
    if loaded_from_files(host, &key) {
        host.held.forget(&key);
        return Err("the server loaded this version from its files already".into());
    }
    let claimed = host
        .held
        .adopted(&key, arena)
        .map_err(|_| "the server no longer waits for this memory".to_owned())?;
    info!(
        model = %record.model,
        version = record.version,
        bytes = record.arena_bytes,
        import_seconds = imported.as_secs_f64(),
        check_seconds = checked.as_secs_f64(),
        tensors = record.tensors.len(),
        "adopted the memory a worker kept across the restart"
    );
    if claimed || claimed_at_startup(host, &key).await {
        return Ok(());
    }
    let restored = restore(host, record).await;
    if restored.is_err() {
        host.held.forget(&key);
    }
    restored
}

/// Memory offered before the start-up models are loaded may be one of theirs: a start-up load
/// that has not begun yet would claim it, and bringing the version back here instead would
/// make that load read the files into a second arena. So the memory waits for a claim until
/// the host is ready (every start-up model loaded or failed), at most [`STARTUP_WAIT`];
/// `true`: a load claimed it.
async fn claimed_at_startup(host: &Host, key: &Key) -> bool {
    let until = tokio::time::Instant::now() + STARTUP_WAIT;
    while !host.ready.load(std::sync::atomic::Ordering::SeqCst)
        && tokio::time::Instant::now() < until
    {
        if host.held.claimed_by_load(key) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    host.held.claimed_by_load(key)
}

/// Whether the version `key` holds memory of its own already (a load from the files that is
/// neither waiting for this memory nor bringing it back): the offered memory would be a second
/// copy.
pub fn loaded_from_files(host: &Host, key: &Key) -> bool {
    !host.held.is_spoken_for(key)
        && host
            .registry
            .version_snapshot(&key.0, key.1)
            .is_some_and(|v| v.state.holds_arena())
}

/// Checks every tensor of `arena` against `record`'s checksums.
async fn check(arena: &ArenaHandle, record: &HeldRecord) -> Result<(), String> {
    let ranges: Vec<(u64, u64)> = record
        .tensors
        .iter()
        .map(|t| (t.offset, t.byte_length))
        .collect();
    let device_sums = arena
        .checksums(ranges)
        .await
        .map_err(|e| format!("checking the memory failed: {e}"))?;
    match device_sums {
        Some(sums) if record.tensors.iter().all(|t| t.ms64 != 0) => {
            for (t, got) in record.tensors.iter().zip(sums) {
                if got != t.ms64 {
                    return Err(format!(
                        "tensor '{}' differs from the version's (ms64 {got:#018x}, expected {:#018x})",
                        t.name, t.ms64
                    ));
                }
            }
            Ok(())
        }
        _ => {
            for t in &record.tensors {
                let got = xxh3_of(arena, t.offset, t.byte_length).await?;
                if got != t.xxh3 {
                    return Err(format!(
                        "tensor '{}' differs from the version's (xxh3 {got:#018x}, expected {:#018x})",
                        t.name, t.xxh3
                    ));
                }
            }
            Ok(())
        }
    }
}

async fn xxh3_of(arena: &ArenaHandle, offset: u64, len: u64) -> Result<u64, String> {
    let mut hasher = Xxh3::new();
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(CHECK_CHUNK as u64) as usize;
        let bytes = arena
            .read_at(offset + done, n)
            .await
            .map_err(|e| format!("reading the memory failed: {e}"))?;
        hasher.update(&bytes);
        done += n as u64;
    }
    Ok(hasher.digest())
}

/// Brings the version back with a load of its source that claims the adopted memory.
async fn restore(host: &Host, record: &HeldRecord) -> Result<(), String> {
    let caller = match &record.owner {
        None => Caller::Admin,
        Some(t) => Caller::Tenant {
            name: t.as_str().into(),
            quota: host
                .tenants
                .quota_of(t)
                .ok_or_else(|| format!("its owner, tenant '{t}', is no longer configured"))?,
        },
    };
    let load_for = LoadFor {
        requested_owner: record.owner.clone(),
        default_owner: None,
        access: Some(record.access()),
        resume_version: Some(record.version),
        only_adopted: true,
        // Where the memory is: the arena was adopted on that device.
        placement: crate::placement::Wanted {
            devices: vec![record.device_uuid.clone()],
            replicas: 0,
        },
    };
    let started = tokio::time::Instant::now();
    loop {
        match host
            .start_load(
                &caller,
                load_for.clone(),
                &record.model,
                &record.source,
                true,
            )
            .await
        {
            Ok(running) => {
                return match running.done.await {
                    Ok(Ok(_)) => Ok(()),
                    Ok(Err(e)) => Err(format!("bringing the version back failed: {e}")),
                    Err(_) => Err("bringing the version back was abandoned".into()),
                };
            }
            Err(crate::error::CoreError::LimitExceeded { what, .. })
                if what.contains("loads running at once") && started.elapsed() < SLOT_WAIT =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => {
                warn!(model = %record.model, version = record.version, error = %e, "adopted memory, but the version cannot be brought back");
                return Err(format!("the version cannot be brought back: {e}"));
            }
        }
    }
}
