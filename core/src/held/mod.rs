//! Memory that can outlive the server, and its adoption by a restarted one.
//!
//! Arenas passed as descriptors (CUDA VMM, host memfds) live while any process maps them: a
//! worker keeps computing after the server is killed, and keeps the descriptor. So that the
//! restarted server does not load a second copy of such a version, the server:
//!
//! 1. **remembers** each ready version of those kinds in a [`record`] file beside the handle
//!    socket (removed when the version's memory is freed);
//! 2. after a restart, treats every record left as **pending**: memory that workers may still
//!    hold, counted as such in the stats and metrics, for up to `adopt_wait`;
//! 3. takes **offers**: a worker that still maps a pending version offers its descriptor
//!    (`OfferHeld`, then the handle socket); the server imports it and checks every tensor's
//!    checksum (`crate::adopt`), and the version is back;
//! 4. lets a **load** of the same files and layout (a start-up model, say) **claim** a
//!    pending record: the load waits, until the record's deadline, for an offer, and uses the
//!    adopted memory instead of reading the files.
//!
//! A pending record nobody offers by its deadline is dropped (and a claiming load reads the
//! files): whatever memory a worker may still map then is no longer counted.
//!
//! This module is the bookkeeping only (no device work, no registry); `crate::adopt` drives
//! an offer and `crate::app` the loads.

pub mod record;

use std::collections::{BTreeMap, BTreeSet, HashMap};

pub use self::record::Holder;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use modelshare_device::ArenaHandle;
use tokio::sync::Notify;
use tracing::{info, warn};

pub use self::record::{FileId, HeldRecord};
use crate::model::Manifest;

/// How long an offer's memory may take to be imported and checked before another worker's
/// offer of the same version is wanted instead.
const OFFER_CHECK_WINDOW: Duration = Duration::from_secs(60);

/// A version: model name and number.
pub type Key = (String, u32);

/// A record left by an earlier run: memory that workers may still hold.
#[derive(Debug)]
struct Pending {
    record: HeldRecord,
    deadline: Instant,
    /// A load waits for this record's memory.
    claimed: bool,
    /// The memory, once a worker's offer was adopted.
    arena: Option<ArenaHandle>,
    /// A load took the adopted memory and is registering the version: the record stays until
    /// it is done ([`HeldStore::restored`]), so that attaches meanwhile hear "retry".
    taken: bool,
    /// Until when an offer of it is under way (a ticket out, or memory being checked): no other
    /// worker's offer is wanted meanwhile.
    offering: Option<Instant>,
}

/// An offer ticket: which record, the allocation's size the worker stated, who may redeem it.
#[derive(Debug)]
struct Offer {
    key: Key,
    alloc_len: u64,
    peer_uid: Option<u32>,
    expires: Instant,
}

#[derive(Debug, Default)]
struct Inner {
    pending: BTreeMap<Key, Pending>,
    /// Records this run wrote (and removes when the version's memory goes), as written.
    own: BTreeMap<Key, HeldRecord>,
    offers: HashMap<String, Offer>,
}

/// What an offer redeemed on the handle socket hands to the adoption.
#[derive(Debug)]
pub struct Redeemed {
    /// The record offered for.
    pub record: HeldRecord,
    /// The allocation's size the worker stated.
    pub alloc_len: u64,
}

/// A version from before a restart whose memory only workers may hold now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingVersion {
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: u32,
    /// The device its memory is on.
    pub device: String,
    /// Its arena's bytes.
    pub bytes: u64,
}

/// The server's records of memory that can outlive it, and the offers and claims on them.
#[derive(Debug)]
pub struct HeldStore {
    dir: Option<PathBuf>,
    adopt_wait: Duration,
    inner: Mutex<Inner>,
    changed: Notify,
}

impl HeldStore {
    /// The store over `dir` (created, mode 0700, if missing; `None`: records off), taking the
    /// records an earlier run left as pending for `adopt_wait`.
    pub fn open(dir: Option<PathBuf>, adopt_wait: Duration) -> Self {
        let dir = dir.and_then(|d| match create_private_dir(&d) {
            Ok(()) => Some(d),
            Err(e) => {
                warn!(dir = %d.display(), error = %e, "cannot keep held-memory records: a restarted server will load models again instead of adopting the memory workers hold");
                None
            }
        });
        let mut inner = Inner::default();
        let deadline = Instant::now() + adopt_wait;
        for record in dir.as_deref().map(record::read_all).unwrap_or_default() {
            if !record.held_by_a_live_process() {
                info!(
                    model = %record.model,
                    version = record.version,
                    "no process that held this version before the restart is alive: not waiting for its memory"
                );
                if let Some(d) = &dir {
                    let _ = std::fs::remove_file(
                        d.join(HeldRecord::file_name(&record.model, record.version)),
                    );
                }
                continue;
            }
            info!(
                model = %record.model,
                version = record.version,
                bytes = record.arena_bytes,
                wait_secs = adopt_wait.as_secs_f64(),
                "memory of a version from before the restart may still be held by workers; waiting for one to offer it"
            );
            inner.pending.insert(
                (record.model.clone(), record.version),
                Pending {
                    record,
                    deadline,
                    claimed: false,
                    arena: None,
                    taken: false,
                    offering: None,
                },
            );
        }
        HeldStore {
            dir,
            adopt_wait,
            inner: Mutex::new(inner),
            changed: Notify::new(),
        }
    }

    /// A store that keeps nothing (tests, and backends whose memory dies with the server).
    pub fn disabled() -> Self {
        Self::open(None, Duration::ZERO)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether records are kept.
    pub fn enabled(&self) -> bool {
        self.dir.is_some()
    }

    /// How long a pending record waits for an offer.
    pub fn adopt_wait(&self) -> Duration {
        self.adopt_wait
    }

    /// Remembers a ready version (written now; a blocking file write).
    pub fn remember(&self, record: &HeldRecord) {
        let Some(dir) = &self.dir else { return };
        let mut inner = self.lock();
        match record::write(dir, record) {
            Ok(_) => {
                inner
                    .own
                    .insert((record.model.clone(), record.version), record.clone());
            }
            Err(e) => {
                warn!(model = %record.model, version = record.version, error = %e, "cannot write the held-memory record")
            }
        }
    }

    /// Brings the records this run wrote in line with `live` (versions holding memory, with
    /// the pids of the workers holding leases on them): removes those of versions gone,
    /// rewrites those whose holders changed. Drops pending records past their deadline, or
    /// that no live process may hold any more. Blocking (file writes).
    pub fn sweep(&self, live: &BTreeMap<Key, BTreeSet<u32>>) {
        let mut inner = self.lock();
        let gone: Vec<Key> = inner
            .own
            .keys()
            .filter(|k| !live.contains_key(*k))
            .cloned()
            .collect();
        for key in gone {
            inner.own.remove(&key);
            if !inner.pending.contains_key(&key) {
                self.remove_file(&key);
            }
        }
        if let Some(dir) = &self.dir {
            for (key, rec) in inner.own.iter_mut() {
                let Some(pids) = live.get(key) else { continue };
                // The same processes as last written: nothing to read or write (a pid in the
                // registry is a live session's, so it names the same process).
                if rec.holders.iter().map(|h| h.pid).eq(pids.iter().copied()) {
                    continue;
                }
                let mut holders: Vec<Holder> = pids.iter().filter_map(|&p| Holder::of(p)).collect();
                holders.sort();
                if holders != rec.holders {
                    rec.holders = holders;
                    if let Err(e) = record::write(dir, rec) {
                        warn!(model = %key.0, version = key.1, error = %e, "cannot update the held-memory record");
                    }
                }
            }
        }
        let now = Instant::now();
        let expired: Vec<Key> = inner
            .pending
            .iter()
            .filter(|(_, p)| {
                (now >= p.deadline && !p.claimed)
                    || (p.arena.is_none() && !p.taken && !p.record.held_by_a_live_process())
            })
            .map(|(k, _)| k.clone())
            .collect();
        let woke = !expired.is_empty();
        for key in expired {
            if let Some(p) = inner.pending.remove(&key) {
                if p.arena.is_some() {
                    warn!(model = %key.0, version = key.1, "adopted memory that no load took; released");
                } else {
                    info!(model = %key.0, version = key.1, "no worker offered the memory of this version in time; it is no longer counted as held");
                }
                if !inner.own.contains_key(&key) {
                    self.remove_file(&key);
                }
            }
        }
        inner.offers.retain(|_, o| o.expires > now);
        drop(inner);
        if woke {
            // A load waiting on a record that went loads from the files now.
            self.changed.notify_waiters();
        }
    }

    fn remove_file(&self, key: &Key) {
        if let Some(dir) = &self.dir {
            let path = dir.join(HeldRecord::file_name(&key.0, key.1));
            if let Err(e) = std::fs::remove_file(&path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                warn!(path = %path.display(), error = %e, "cannot remove a held-memory record");
            }
        }
    }

    /// Bytes of pending versions not yet adopted: memory that only workers may hold now.
    pub fn held_by_workers_bytes(&self) -> u64 {
        self.pending().iter().map(|p| p.bytes).sum()
    }

    /// The pending versions not yet adopted, for the stats and metrics.
    pub fn pending(&self) -> Vec<PendingVersion> {
        self.lock()
            .pending
            .values()
            .filter(|p| p.arena.is_none() && !p.taken)
            .map(|p| PendingVersion {
                model: p.record.model.clone(),
                version: p.record.version,
                device: p.record.device_uuid.clone(),
                bytes: p.record.arena_bytes,
            })
            .collect()
    }

    /// The version number a load of `model` from `source` should take: that of a pending
    /// record of the same source, so that workers attached to it by number find it again.
    pub fn version_hint(&self, model: &str, source: &str) -> Option<u32> {
        self.lock()
            .pending
            .values()
            .filter(|p| p.record.model == model && p.record.source == source)
            .map(|p| p.record.version)
            .max()
    }

    /// The pending records of `model` (whatever their state).
    pub fn pending_of(&self, model: &str) -> Vec<HeldRecord> {
        self.lock()
            .pending
            .values()
            .filter(|p| p.record.model == model)
            .map(|p| p.record.clone())
            .collect()
    }

    /// The owner and access of a pending record (to check who may offer for it).
    pub fn pending_record(&self, model: &str, version: u32) -> Option<HeldRecord> {
        let inner = self.lock();
        if let Some(p) = inner.pending.get(&(model.to_owned(), version)) {
            return Some(p.record.clone());
        }
        // Model names are unique without regard to case: a worker may have attached (and so
        // offer back) another spelling than the one recorded.
        inner
            .pending
            .iter()
            .find(|((m, v), _)| *v == version && m.eq_ignore_ascii_case(model))
            .map(|(_, p)| p.record.clone())
    }

    /// Marks the pending record that is the same bytes as `manifest` from `files` as claimed,
    /// before the load registers its version: from then on an offer of that memory is waited
    /// for, not refused as a second copy (the load claims it with [`claim`](Self::claim)).
    pub fn mark_claimed(&self, manifest: &Manifest, files: &[FileId]) {
        let mut inner = self.lock();
        if let Some(p) = inner
            .pending
            .values_mut()
            .find(|p| p.record.model == manifest.model && p.record.matches(manifest, files))
        {
            p.claimed = true;
        }
    }

    /// For a load of `manifest` from files `files`: if a pending record is the same bytes,
    /// waits (until its deadline) for a worker's offer and returns the adopted memory with the
    /// record; `None`: load from the files.
    pub async fn claim(
        &self,
        manifest: &Manifest,
        files: &[FileId],
    ) -> Option<(ArenaHandle, HeldRecord)> {
        let key = {
            let mut inner = self.lock();
            let (key, p) = inner.pending.iter_mut().find(|(_, p)| {
                p.record.model == manifest.model && p.record.matches(manifest, files)
            })?;
            p.claimed = true;
            key.clone()
        };
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let deadline = {
                let mut inner = self.lock();
                let p = inner.pending.get_mut(&key)?;
                if let Some(arena) = p.arena.take() {
                    p.taken = true;
                    let record = p.record.clone();
                    // The load registers the version: from now on its record is this run's,
                    // rewritten when it is ready and removed with its memory.
                    inner.own.insert(key, record.clone());
                    return Some((arena, record));
                }
                if Instant::now() >= p.deadline {
                    inner.pending.remove(&key);
                    info!(model = %key.0, version = key.1, "no worker offered this version's memory in time; loading it from the files");
                    return None;
                }
                p.deadline
            };
            let _ = tokio::time::timeout_at(deadline.into(), changed).await;
        }
    }

    /// An offer for `model`@`version` on `device_uuid`: a one-time ticket, valid for `ttl`
    /// and for `peer_uid` only; `Err` says why the server does not want it.
    pub fn offer(
        &self,
        model: &str,
        version: u32,
        device_uuid: &str,
        alloc_len: u64,
        peer_uid: Option<u32>,
        ttl: Duration,
    ) -> Result<String, String> {
        let mut inner = self.lock();
        let key = (model.to_owned(), version);
        let now = Instant::now();
        inner.offers.retain(|_, o| o.expires > now);
        let p = inner.pending.get_mut(&key).ok_or_else(|| {
            format!(
                "the server holds no record of version {version} of '{model}' from before a restart"
            )
        })?;
        if p.arena.is_some() || p.taken {
            return Err("already adopted from another worker".into());
        }
        if now >= p.deadline {
            return Err("offered too late: the server no longer waits for this memory".into());
        }
        if p.record.device_uuid != device_uuid {
            return Err(format!(
                "the version was on device {}, not {device_uuid}",
                p.record.device_uuid
            ));
        }
        if alloc_len < p.record.arena_bytes {
            return Err(format!(
                "the allocation ({alloc_len} bytes) is smaller than the version's arena ({} bytes)",
                p.record.arena_bytes
            ));
        }
        if p.offering.is_some_and(|until| until > now) {
            return Err("another worker's offer of this memory is under way".into());
        }
        let ticket = format!("o-{}", uuid::Uuid::new_v4().simple());
        p.offering = Some(now + ttl);
        inner.offers.insert(
            ticket.clone(),
            Offer {
                key,
                alloc_len,
                peer_uid,
                expires: now + ttl,
            },
        );
        Ok(ticket)
    }

    /// Whether `ticket` is an offer ticket (not an attach ticket).
    pub fn is_offer(ticket: &str) -> bool {
        ticket.starts_with("o-")
    }

    /// Redeems an offer ticket presented on the handle socket by `peer_uid`.
    pub fn redeem_offer(&self, ticket: &str, peer_uid: Option<u32>) -> Result<Redeemed, String> {
        let mut inner = self.lock();
        let offer = inner
            .offers
            .remove(ticket)
            .ok_or("offer ticket unknown, used or expired")?;
        let refusal = if offer.expires <= Instant::now() {
            Some("offer ticket expired")
        } else if offer.peer_uid.is_some() && peer_uid != offer.peer_uid {
            Some("offer ticket issued to another user")
        } else {
            None
        };
        if let Some(reason) = refusal {
            // The ticket is spent: another worker may offer now.
            if let Some(p) = inner.pending.get_mut(&offer.key) {
                p.offering = None;
            }
            return Err(reason.into());
        }
        let p = inner
            .pending
            .get_mut(&offer.key)
            .ok_or("the server no longer waits for this memory")?;
        // Checking the memory takes a moment; other offers wait for its outcome.
        p.offering = Some(Instant::now() + OFFER_CHECK_WINDOW);
        Ok(Redeemed {
            record: p.record.clone(),
            alloc_len: offer.alloc_len,
        })
    }

    /// An offer's memory checked and adopted. Returns whether a load was waiting for it (else
    /// the caller brings the version back with a load that will claim it); `Err` if the record
    /// is gone meanwhile (the arena is then dropped by the caller).
    pub fn adopted(&self, key: &Key, arena: ArenaHandle) -> Result<bool, ArenaHandle> {
        let mut inner = self.lock();
        let Some(p) = inner.pending.get_mut(key) else {
            return Err(arena);
        };
        if p.arena.is_some() {
            return Err(arena);
        }
        // A claim will take it: extend the deadline so that the claiming load (maybe not yet
        // started) finds it.
        p.deadline = p.deadline.max(Instant::now() + Duration::from_secs(60));
        p.offering = None;
        p.arena = Some(arena);
        let claimed = p.claimed;
        drop(inner);
        self.changed.notify_waiters();
        Ok(claimed)
    }

    /// The load that took the adopted memory of `key` has registered the version: the pending
    /// record is done with.
    pub fn restored(&self, key: &Key) {
        self.lock().pending.remove(key);
    }

    /// Whether a load claimed the memory of `key` (it waits for it, took it, or brought the
    /// version back already).
    pub fn claimed_by_load(&self, key: &Key) -> bool {
        self.lock()
            .pending
            .get(key)
            .is_none_or(|p| p.claimed || p.taken)
    }

    /// Whether the memory of `key` is on its way back: a load waits for it, or it was adopted
    /// (and a load is bringing the version back).
    pub fn is_spoken_for(&self, key: &Key) -> bool {
        self.lock()
            .pending
            .get(key)
            .is_some_and(|p| p.claimed || p.arena.is_some() || p.taken)
    }

    /// Drops an adopted arena that could not be used (the version could not be brought back).
    pub fn forget(&self, key: &Key) {
        let dropped = self.lock().pending.remove(key);
        drop(dropped);
    }

    /// An offer failed (bad memory, or the import failed): other workers may offer again.
    pub fn offer_failed(&self, key: &Key) {
        if let Some(p) = self.lock().pending.get_mut(key) {
            p.offering = None;
        }
    }

    /// The records directory.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_deref()
    }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = std::fs::symlink_metadata(dir)?;
            if !meta.is_dir() {
                return Err(std::io::Error::other("exists and is not a directory"));
            }
            if meta.permissions().mode() & 0o077 != 0 {
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
