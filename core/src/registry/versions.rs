//! The version state machine: `Loading → Ready → Draining → Freed`, `Loading → Failed`.
//!
//! Every transition runs inside the registry's lock, on its [`State`]: reserving a load,
//! ending it (ready, failed, or cancelled by an unload), retiring a version a newer one
//! replaces, unloading, dropping leases, and revoking the sessions that hold a version that
//! must go now. A version's memory is freed only when it has ended *and* no lease remains;
//! freed arenas go to the graveyard, to be released after the lock is.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::state::{ModelRecord, State, VersionRecord, snapshot_version};
use super::types::{LoadFor, LoadProgress, ModelEvent, VersionSnapshot};
use crate::error::CoreError;
use crate::model::{Manifest, VersionState};
use crate::tenants::{Caller, Quota, Resource};

/// How many ended (freed or failed) versions of a model stay on record.
const ENDED_VERSIONS_KEPT: usize = 8;

/// What a load asks to reserve.
pub(super) struct LoadRequest<'a> {
    pub(super) caller: &'a Caller,
    pub(super) load_for: &'a LoadFor,
    pub(super) quota_of: &'a dyn Fn(&str) -> Quota,
    pub(super) model: &'a str,
    pub(super) source: &'a str,
    pub(super) device: &'a str,
    /// Devices of further replicas, copied from the first once it is ready.
    pub(super) replicas: &'a [String],
    pub(super) keep_previous: bool,
    /// The load's admission ([`super::Registry::authorize_load`]), not counted twice.
    pub(super) claim: &'a super::LoadClaim,
    /// It may take memory already on its device (see `sharing`): the device's cap is checked
    /// only if it copies after all ([`super::Registry::device_room_now`]).
    pub(super) shares: bool,
}

impl std::fmt::Debug for LoadRequest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoadRequest")
            .field("model", &self.model)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

pub(super) fn now_unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl State {
    /// Admits a load of `bytes` against ownership, `max_total_bytes`, each placed device's
    /// `max_device_bytes` and the owner's quotas; records a `Loading` version; returns its
    /// number and its model record's generation.
    pub(super) fn reserve(
        &mut self,
        req: &LoadRequest<'_>,
        manifest: &Manifest,
        progress: &Arc<LoadProgress>,
        limits: &super::RegistryLimits,
    ) -> Result<(u32, u64), CoreError> {
        // The first arena and every replica, admitted together.
        let copies = 1 + req.replicas.len() as u64;
        let bytes = manifest.arena_bytes.saturating_mul(copies);
        let model = req.model;
        if self.shutting_down {
            return Err(CoreError::ShuttingDown);
        }
        // The load's name was made canonical before it was admitted; a load of another
        // spelling that reserved in between holds the name now.
        if self
            .canonical(model)
            .is_some_and(|recorded| recorded != model)
        {
            return Err(CoreError::NameTaken(model.to_owned()));
        }
        let (owner, new_model) = self.resolve_owner(req.caller, req.load_for, model)?;
        // Placement chose under the cap from a snapshot; loads placed at the same time saw the
        // same one, so the cap is held here, under the lock.
        let devices = std::iter::once(req.device).chain(req.replicas.iter().map(String::as_str));
        if !req.shares {
            self.device_room(devices, manifest.arena_bytes, limits.max_device_bytes)?;
        }
        self.total_room(bytes, limits.max_total_bytes)?;
        if let Some(tenant) = &owner {
            let quota = (req.quota_of)(tenant);
            let used = self.usage(tenant);
            quota.check(tenant, Resource::DeviceBytes, used.device_bytes, bytes)?;
            // Other loads admitted and not yet reserved count too.
            let (loads, models) = self.claims.of(tenant, Some(req.claim));
            let loads = used.loads.saturating_add(loads);
            quota.check(tenant, Resource::Loads, u64::from(loads), 1)?;
            if new_model {
                let models = used.models.saturating_add(models);
                quota.check(tenant, Resource::Models, u64::from(models), 1)?;
            }
        }
        self.arena_bytes += bytes;
        self.arenas += u32::try_from(copies).unwrap_or(u32::MAX);
        if !self.models.contains_key(model) {
            self.generations += 1;
            let generation = self.generations;
            self.models.insert(
                model.to_owned(),
                ModelRecord {
                    generation,
                    ..ModelRecord::default()
                },
            );
        }
        let Some(rec) = self.models.get_mut(model) else {
            return Err(CoreError::Internal("model record vanished".into()));
        };
        rec.owner = owner;
        rec.unloaded = false;
        if let Some(access) = &req.load_for.access {
            rec.access = access.clone();
        }
        if let Some(v) = req.load_for.resume_version
            && v > rec.next_version
        {
            rec.next_version = v - 1;
        }
        rec.next_version += 1;
        let version = rec.next_version;
        let mut manifest = manifest.clone();
        manifest.version = version;
        rec.versions.insert(
            version,
            VersionRecord {
                state: VersionState::Loading,
                source: req.source.to_owned(),
                created_unix_ms: now_unix_ms(),
                finished_unix_ms: 0,
                error: None,
                arena_bytes: manifest.arena_bytes,
                manifest: Arc::new(manifest),
                arena: None,
                device: req.device.to_owned(),
                progress: progress.clone(),
                leases: 0,
                keep_previous: req.keep_previous,
                ready_seq: 0,
                replicas: req
                    .replicas
                    .iter()
                    .map(|d| super::state::ReplicaRecord {
                        device: d.clone(),
                        arena: None,
                        ready: false,
                    })
                    .collect(),
                content_sha256: None,
                comparing: req.shares,
            },
        );
        Ok((version, rec.generation))
    }

    /// Refuses an arena of `need` bytes more on any of `devices` past `max_device_bytes`.
    pub(super) fn device_room<'d>(
        &self,
        devices: impl Iterator<Item = &'d str>,
        need: u64,
        max_device_bytes: Option<u64>,
    ) -> Result<(), CoreError> {
        let Some(limit) = max_device_bytes else {
            return Ok(());
        };
        let on = self.device_use();
        for device in devices {
            let held = on.get(device).map_or(0, |u| u.arena_bytes);
            if held.saturating_add(need) > limit {
                return Err(CoreError::NoDeviceRoom(format!(
                    "{device}: {held} bytes held + {need} > max_device_bytes {limit}"
                )));
            }
        }
        Ok(())
    }

    /// Refuses `bytes` more of arenas past `max_total_bytes`.
    pub(super) fn total_room(
        &self,
        bytes: u64,
        max_total_bytes: Option<u64>,
    ) -> Result<(), CoreError> {
        let Some(limit) = max_total_bytes else {
            return Ok(());
        };
        // Memory revoked workers may still map is on the device as much as the server's.
        let requested = self
            .arena_bytes
            .saturating_add(self.orphan_bytes())
            .saturating_add(bytes);
        if requested > limit {
            return Err(CoreError::LimitExceeded {
                what: "arena bytes held by the server and by revoked workers".into(),
                limit,
                requested,
            });
        }
        Ok(())
    }

    /// Records the end of a load: `Ok` carries the final manifest, `Err` why it failed.
    pub(super) fn end_load(
        &mut self,
        model: &str,
        version: u32,
        result: Result<Manifest, String>,
        events: &mut Vec<ModelEvent>,
    ) {
        let Some(v) = self.version_mut(model, version) else {
            return;
        };
        v.finished_unix_ms = now_unix_ms();
        match (v.state, result) {
            (VersionState::Loading, Ok(manifest)) => {
                v.manifest = Arc::new(manifest);
                v.state = VersionState::Ready;
                self.event_seq += 1;
                let seq = self.event_seq;
                let Some(v) = self.version_mut(model, version) else {
                    return;
                };
                v.ready_seq = seq;
                let keep_previous = v.keep_previous;
                events.push(ModelEvent::VersionReady {
                    model: model.to_owned(),
                    version,
                });
                if !keep_previous {
                    let older: Vec<u32> = self
                        .models
                        .get(model)
                        .map(|m| {
                            m.versions
                                .iter()
                                .filter(|(n, r)| **n < version && r.state == VersionState::Ready)
                                .map(|(n, _)| *n)
                                .collect()
                        })
                        .unwrap_or_default();
                    for old in older {
                        self.retire(model, old, events);
                    }
                }
            }
            (VersionState::Loading, Err(reason)) => {
                self.abandon_load(model, version, &reason, VersionState::Failed);
            }
            // Unloaded while loading: free now unless leases hold it (then the last release does).
            (VersionState::Draining, Ok(manifest)) => {
                v.manifest = Arc::new(manifest);
                if v.leases == 0 {
                    self.free_version(model, version, VersionState::Freed);
                }
            }
            (VersionState::Draining, Err(reason)) => {
                self.abandon_load(model, version, &reason, VersionState::Freed);
            }
            (VersionState::Ready | VersionState::Freed | VersionState::Failed, _) => {}
        }
    }

    /// Unloads `targets` of `model`: versions without leases are freed at once, the others
    /// drain, a loading one is cancelled; with `force`, their holders' sessions are ended.
    pub(super) fn unload_versions(
        &mut self,
        model: &str,
        targets: &[u32],
        force: bool,
        events: &mut Vec<ModelEvent>,
    ) -> Vec<VersionSnapshot> {
        let mut out = Vec::new();
        for &v in targets {
            let Some(rec) = self.version_mut(model, v) else {
                continue;
            };
            match rec.state {
                VersionState::Loading => {
                    rec.progress.cancel.store(true, Ordering::SeqCst);
                    rec.state = VersionState::Draining;
                }
                VersionState::Ready => self.retire(model, v, events),
                VersionState::Draining | VersionState::Freed | VersionState::Failed => {}
            }
            if force {
                self.revoke_holders(
                    model,
                    v,
                    &format!("version {v} of '{model}' was force-unloaded"),
                );
            }
            let holders = self.holders();
            if let Some(m) = self.models.get(model)
                && let Some(rec) = m.versions.get(&v)
            {
                out.push(snapshot_version(v, rec, m.owner.as_deref(), &holders));
            }
        }
        out
    }

    /// Ends a load that failed or was cancelled: opens the arena's ready gate, ends the
    /// sessions that attached during the load (they would compute on garbage), frees the arena.
    fn abandon_load(&mut self, model: &str, version: u32, reason: &str, end: VersionState) {
        let Some(v) = self.version_mut(model, version) else {
            return;
        };
        if let Some(arena) = &v.arena {
            arena.abandon();
        }
        v.error = Some(reason.to_owned());
        self.revoke_holders(
            model,
            version,
            &format!("the load of version {version} of '{model}' did not complete: {reason}"),
        );
        self.free_version(model, version, end);
    }

    /// Takes a ready version out of service: freed at once without leases, else draining (and
    /// its holders are told).
    fn retire(&mut self, model: &str, version: u32, events: &mut Vec<ModelEvent>) {
        let Some(rec) = self.version_mut(model, version) else {
            return;
        };
        if rec.leases == 0 {
            self.free_version(model, version, VersionState::Freed);
        } else {
            rec.state = VersionState::Draining;
            events.push(ModelEvent::VersionDraining {
                model: model.to_owned(),
                version,
            });
        }
    }

    /// Ends every session holding a lease on `model`@`version`, releasing all their leases.
    /// Returns how many sessions were ended.
    pub(super) fn revoke_holders(&mut self, model: &str, version: u32, reason: &str) -> usize {
        self.revoke_holders_on(model, version, None, reason)
    }

    /// [`revoke_holders`](Self::revoke_holders) of the arena on `device` only (`None`: every
    /// arena of the version).
    pub(super) fn revoke_holders_on(
        &mut self,
        model: &str,
        version: u32,
        device: Option<&str>,
        reason: &str,
    ) -> usize {
        let mut holders: Vec<String> = self
            .leases
            .values()
            .filter(|l| l.model == model && l.version == version)
            .filter(|l| device.is_none() || l.device.as_deref() == device)
            .map(|l| l.session.clone())
            .collect();
        holders.sort();
        holders.dedup();
        self.note_orphan(model, version, device, &holders);
        for s in &holders {
            if let Some(rec) = self.sessions.remove(s) {
                for lease in &rec.leases {
                    self.drop_lease(lease);
                }
                rec.revocation.revoke(reason.to_owned());
            }
        }
        holders.len()
    }

    /// The memory of `model`@`version` (its arena on `device`; `None`: all of them) is about
    /// to be let go of while the sessions `holders`, being revoked, may still map it: counted
    /// as held by workers while their processes live (kinds whose mappings outlive the
    /// server's handle only).
    fn note_orphan(&mut self, model: &str, version: u32, device: Option<&str>, holders: &[String]) {
        let Some(v) = self
            .models
            .get(model)
            .and_then(|m| m.versions.get(&version))
        else {
            return;
        };
        let Some(arena) = v
            .arena
            .as_ref()
            .filter(|a| a.outlives_server())
            .map(|a| a.id())
        else {
            return;
        };
        let procs: Vec<crate::held::Holder> = holders
            .iter()
            .filter_map(|s| self.sessions.get(s))
            .filter_map(|s| {
                Some(crate::held::Holder {
                    pid: s.hello.peer_pid?,
                    start: s.hello.peer_start?,
                })
            })
            .collect();
        if procs.is_empty() {
            return;
        }
        // Each arena, the first and the replicas' (an upper bound: a worker maps one of them).
        let bytes = v.arena_bytes;
        let devices: Vec<String> = std::iter::once(v.device.clone())
            .chain(
                v.replicas
                    .iter()
                    .filter(|r| r.arena.is_some())
                    .map(|r| r.device.clone()),
            )
            .filter(|d| device.is_none_or(|only| only == d))
            .collect();
        for device in devices {
            self.orphan_ids += 1;
            self.orphans.push(super::types::Orphan {
                id: self.orphan_ids,
                model: model.to_owned(),
                version,
                bytes,
                device,
                holders: procs.clone(),
                arena,
            });
        }
    }

    /// Bytes of the orphans (see [`super::types::Orphan`]).
    /// The orphans whose memory only revoked workers hold: not those of an arena a live
    /// version still holds (a load of the same bytes shared it), counted with that version.
    pub(super) fn counted_orphans(&self) -> impl Iterator<Item = &super::types::Orphan> {
        let held: std::collections::HashSet<usize> = self
            .models
            .values()
            .flat_map(|m| m.versions.values())
            .flat_map(VersionRecord::held_arenas)
            .map(modelshare_device::ArenaHandle::id)
            .collect();
        self.orphans
            .iter()
            .filter(move |o| !held.contains(&o.arena))
    }

    pub(super) fn orphan_bytes(&self) -> u64 {
        self.counted_orphans().map(|o| o.bytes).sum()
    }

    /// Removes a lease (and its ticket); frees its version if it was draining, its load has
    /// ended and this was the last lease.
    pub(super) fn drop_lease(&mut self, lease: &str) {
        let Some(l) = self.leases.remove(lease, &mut self.graveyard) else {
            return;
        };
        let Some(v) = self.version_mut(&l.model, l.version) else {
            return;
        };
        v.leases = v.leases.saturating_sub(1);
        let load_ended = v.finished_unix_ms != 0;
        if v.state == VersionState::Draining && v.leases == 0 && load_ended {
            self.free_version(&l.model, l.version, VersionState::Freed);
        }
    }

    /// Releases a version's arena and its accounting; the version ends in `end` (Freed or
    /// Failed).
    pub(super) fn free_version(&mut self, model: &str, version: u32, end: VersionState) {
        let Some(v) = self.version_mut(model, version) else {
            return;
        };
        let had_reservation = v.state.holds_arena();
        let (bytes, count) = (v.held_bytes(), v.arena_count());
        let arenas: Vec<_> = v
            .arena
            .take()
            .into_iter()
            .chain(v.replicas.drain(..).filter_map(|r| r.arena))
            .collect();
        v.state = end;
        for arena in arenas {
            self.graveyard.arena(arena);
        }
        if had_reservation {
            self.arena_bytes = self.arena_bytes.saturating_sub(bytes);
            self.arenas = self.arenas.saturating_sub(count);
        }
        if let Some(rec) = self.models.get_mut(model) {
            prune_ended(&mut rec.versions);
            // An unloaded model whose last draining version just went: nothing of it is left.
            if rec.unloaded && !rec.holds_memory() {
                self.models.remove(model);
            }
        }
    }

    /// Refuses new loads and sessions; cancels loads; ends every session and frees every
    /// arena.
    pub(super) fn shut_down(&mut self) {
        self.shutting_down = true;
        let sessions: Vec<String> = self.sessions.keys().cloned().collect();
        for s in sessions {
            if let Some(rec) = self.sessions.remove(&s) {
                for lease in rec.leases {
                    self.drop_lease(&lease);
                }
            }
        }
        let targets: Vec<(String, u32)> = self
            .models
            .iter()
            .flat_map(|(m, r)| r.versions.keys().map(move |v| (m.clone(), *v)))
            .collect();
        for (m, v) in targets {
            if let Some(rec) = self.version_mut(&m, v) {
                match rec.state {
                    VersionState::Loading => rec.progress.cancel.store(true, Ordering::SeqCst),
                    VersionState::Ready | VersionState::Draining => {
                        self.free_version(&m, v, VersionState::Freed)
                    }
                    VersionState::Freed | VersionState::Failed => {}
                }
            }
        }
    }
}

fn prune_ended(versions: &mut BTreeMap<u32, VersionRecord>) {
    let ended: Vec<u32> = versions
        .iter()
        .filter(|(_, v)| !v.state.holds_arena())
        .map(|(n, _)| *n)
        .collect();
    if ended.len() > ENDED_VERSIONS_KEPT {
        for n in &ended[..ended.len() - ENDED_VERSIONS_KEPT] {
            versions.remove(n);
        }
    }
}
