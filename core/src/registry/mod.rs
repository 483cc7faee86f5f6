//! Models, versions, sessions and leases under one lock.
//!
//! The registry is the only owner of arenas. It decides when an arena is freed: a version is
//! freed when it has been unloaded *and* no lease on it remains; until then it is `draining`.
//! The lock is a `std::sync::Mutex` held for short, non-blocking sections only: never across an
//! `.await`, never around device work. A load is *reserved* under the lock (quotas checked in
//! the same section as the change they guard), its arena allocated on the device thread
//! outside it, then handed in ([`Registry::set_arena`]).
//!
//! # Layout
//! - [`types`]: the public values the registry is asked and answers with.
//! - `state`: the records behind the lock and the queries sections share.
//! - `versions`: the version state machine (reserve, end, retire, unload, free, revoke).
//! - `holds`: the registry's calls about sessions, leases and tickets.
//! - `leases`: leases and their one-time tickets, in one store.
//! - `claims`: loads admitted and not yet reserved, counted against their owner's quotas.
//! - `graveyard`: what a section releases (arena handles, ticket descriptors), dropped after
//!   the lock is.

mod claims;
mod graveyard;
mod holders;
mod holds;
mod leases;
mod pending;
mod replicas;
mod sharing;
mod state;
#[cfg(test)]
mod tests;
pub mod types;
mod versions;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use modelshare_device::ArenaHandle;
use tokio::sync::broadcast;

pub use self::claims::LoadClaim;
use self::graveyard::Guard;
pub use self::leases::{TicketError, TicketLimits};
pub use self::pending::PendingLease;
pub use self::replicas::ReplicaOnAttach;
pub use self::sharing::SharedArena;
use self::state::{State, VersionRecord, snapshot_model, snapshot_version};
pub use self::types::*;
use self::versions::LoadRequest;
use crate::error::CoreError;
use crate::model::{Manifest, VersionState};
use crate::tenants::policy::{owner_text, owns};
use crate::tenants::{Access, Caller, Quota, Resource};

/// The registry of models, versions, sessions and leases.
#[derive(Debug)]
pub struct Registry {
    limits: RegistryLimits,
    state: Mutex<State>,
    events: broadcast::Sender<ModelEvent>,
}

impl Registry {
    /// An empty registry enforcing `limits`.
    pub fn new(limits: RegistryLimits) -> Self {
        let (events, _) = broadcast::channel(256);
        Self {
            limits,
            state: Mutex::new(State::default()),
            events,
        }
    }

    /// Model events, for worker sessions.
    pub fn subscribe(&self) -> broadcast::Receiver<ModelEvent> {
        self.events.subscribe()
    }

    /// The spelling a model `caller` may see is recorded and shown under, for a name given in
    /// any case (names are unique without regard to case); `name` itself when no model has it
    /// or `caller` may not see the one that has (so that an answer never spells, or betrays,
    /// another tenant's private model). Every name that comes from outside (a door, an admin
    /// call, an attach, a Serve offer, a load) goes through here before it reaches the
    /// registry or the request path.
    pub fn canonical(&self, caller: &Caller, name: &str) -> String {
        self.resolve(caller, name)
            .unwrap_or_else(|| name.to_owned())
    }

    /// The recorded spelling of the model `name` names (in any case), if `caller` may see it;
    /// `None` for a model that does not exist or is not the caller's to see. One look at the
    /// registry for the doors' "which model, and may this caller use it".
    pub fn resolve(&self, caller: &Caller, name: &str) -> Option<String> {
        let st = self.lock();
        st.canonical(name)
            .filter(|key| {
                st.models
                    .get(*key)
                    .is_some_and(|rec| rec.visible_to(caller))
            })
            .map(str::to_owned)
    }

    fn lock(&self) -> Guard<'_, State> {
        // A panic while holding the lock cannot leave the maps half-updated in a way later calls
        // would trip over (every section updates and then returns), so recover from poisoning.
        Guard::new(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn send(&self, events: Vec<ModelEvent>) {
        for e in events {
            let _ = self.events.send(e);
        }
    }

    /// Admits a load of `manifest` (planned, finished but for its checksums and version) onto
    /// `device`: checks ownership, limits and the owner's quotas (`quota_of`), assigns a
    /// version number and reserves the bytes. The arena is allocated next, outside the lock,
    /// and handed in with [`Registry::set_arena`]. With `keep_previous` false, older ready
    /// versions are retired once this one is ready.
    ///
    /// A new model belongs to `load_for`'s owner. A new version of an existing model keeps its
    /// owner: only the owner (or the admin) may load it, a caller that may not see the model is
    /// told the name is taken, and naming another owner is refused.
    #[allow(clippy::too_many_arguments)]
    pub fn reserve(
        &self,
        caller: &Caller,
        load_for: &LoadFor,
        quota_of: &dyn Fn(&str) -> Quota,
        manifest: Manifest,
        source: &str,
        payload_bytes: u64,
        devices: &[String],
        keep_previous: bool,
        claim: LoadClaim,
        shares: bool,
    ) -> Result<Reservation, CoreError> {
        let Some((device, replicas)) = devices.split_first() else {
            return Err(CoreError::Internal("a load placed on no device".into()));
        };
        let bytes = manifest.arena_bytes;
        let model = manifest.model.clone();
        if let Some(limit) = self.limits.max_model_bytes
            && bytes > limit
        {
            return Err(CoreError::LimitExceeded {
                what: format!("arena bytes of model '{model}'"),
                limit,
                requested: bytes,
            });
        }
        let progress = Arc::new(LoadProgress {
            done: AtomicU64::new(0),
            total: payload_bytes,
            cancel: AtomicBool::new(false),
        });
        let req = LoadRequest {
            caller,
            load_for,
            quota_of,
            model: &model,
            source,
            device,
            replicas,
            keep_previous,
            claim: &claim,
            shares,
        };
        let (version, generation) = {
            let mut st = self.lock();
            let reserved = st.reserve(&req, &manifest, &progress, &self.limits);
            // Its version counts from now on (or it was refused): the claim goes in the same
            // section.
            drop(claim);
            reserved?
        };
        let mut manifest = manifest;
        manifest.version = version;
        Ok(Reservation {
            model,
            version,
            generation,
            progress,
            manifest,
            device: device.clone(),
        })
    }

    /// Hands in the arena allocated for a reservation. A version unloaded meanwhile keeps it
    /// until its load ends ([`Registry::finish_load`] frees it).
    pub fn set_arena(&self, model: &str, version: u32, arena: ArenaHandle) {
        let mut st = self.lock();
        if let Some(v) = st.version_mut(model, version) {
            v.arena = Some(arena);
        }
    }

    /// Records the end of a load: `Ok` carries the final manifest (with checksums), `Err` the
    /// reason it failed. A failed or cancelled load releases its arena here.
    pub fn finish_load(&self, model: &str, version: u32, result: Result<Manifest, String>) {
        let mut events = Vec::new();
        self.lock().end_load(model, version, result, &mut events);
        self.send(events);
    }

    /// Every version that holds memory (loading, ready, draining), by model and number, with
    /// the pids of the worker processes holding leases on it.
    pub fn live_versions(
        &self,
    ) -> std::collections::BTreeMap<(String, u32), std::collections::BTreeSet<u32>> {
        let st = self.lock();
        let mut live: std::collections::BTreeMap<_, std::collections::BTreeSet<u32>> = st
            .models
            .iter()
            .flat_map(|(name, rec)| {
                rec.versions
                    .iter()
                    .filter(|(_, v)| v.state.holds_arena())
                    .map(move |(n, _)| ((name.clone(), *n), Default::default()))
            })
            .collect();
        for lease in st.leases.values() {
            if let (Some(pids), Some(s)) = (
                live.get_mut(&(lease.model.clone(), lease.version)),
                st.sessions.get(&lease.session),
            ) {
                pids.insert(s.hello.peer_pid.unwrap_or(s.hello.pid));
            }
        }
        live
    }

    /// Whether version `version` of `model` became ready after `session` opened: a session
    /// hears only of versions that became ready while it was open (not of one whose event was
    /// still on its way when it opened).
    pub fn ready_since_open(&self, session: &str, model: &str, version: u32) -> bool {
        let st = self.lock();
        let Some(opened) = st.sessions.get(session).map(|s| s.opened_seq) else {
            return false;
        };
        st.models
            .get(model)
            .and_then(|m| m.versions.get(&version))
            .is_some_and(|v| v.ready_seq > opened)
    }

    /// Memory let go of while revoked workers may still map it, and that no live version
    /// holds (one that shares it counts it).
    pub fn orphans(&self) -> Vec<Orphan> {
        self.lock().counted_orphans().cloned().collect()
    }

    /// Forgets the orphans with these ids (none of their processes lives any more).
    pub fn forget_orphans(&self, ids: &[u64]) {
        self.lock().orphans.retain(|o| !ids.contains(&o.id));
    }

    /// The owner and access of `model`.
    pub fn ownership(&self, model: &str) -> Option<(Option<String>, crate::tenants::Access)> {
        let st = self.lock();
        st.models
            .get(model)
            .map(|rec| (rec.owner.clone(), rec.access.clone()))
    }

    /// One version as it stands now.
    pub fn version_snapshot(&self, model: &str, version: u32) -> Option<VersionSnapshot> {
        let st = self.lock();
        let rec = st.models.get(model)?;
        let v = rec.versions.get(&version)?;
        Some(snapshot_version(
            version,
            v,
            rec.owner.as_deref(),
            &st.holders(),
        ))
    }

    /// Unloads one version (or all, with `None`). Versions without leases are freed at once,
    /// the others drain; a loading version is cancelled. Ended versions are dropped from the
    /// record. Returns the affected versions in their new states.
    ///
    /// With `force`, the sessions still holding a lease on a targeted version are ended now
    /// (their leases go with them), so the versions are freed at once.
    ///
    /// Also returns the model's generation, for [`Registry::force_drained`].
    pub fn unload(
        &self,
        caller: &Caller,
        model: &str,
        version: Option<u32>,
        force: bool,
    ) -> Result<(Vec<VersionSnapshot>, u64), CoreError> {
        let mut st = self.lock();
        let rec = st.visible_model(caller, model)?;
        if !owns(rec.owner.as_deref(), caller) {
            return Err(CoreError::PermissionDenied(format!(
                "model '{model}' belongs to {}; only its owner may unload it",
                owner_text(rec.owner.as_deref())
            )));
        }
        let generation = rec.generation;
        let targets: Vec<u32> = match version {
            Some(v) if rec.versions.contains_key(&v) => vec![v],
            Some(v) => {
                return Err(CoreError::VersionNotFound {
                    model: model.to_owned(),
                    version: v,
                });
            }
            None => rec.versions.keys().copied().collect(),
        };
        let mut events = Vec::new();
        let out = st.unload_versions(model, &targets, force, &mut events);
        // Drop the records of ended versions that were asked for; drop the model when nothing
        // of it remains.
        if let Some(rec) = st.models.get_mut(model) {
            rec.versions.retain(|v, r| {
                let asked = version.is_none_or(|x| x == *v);
                !(asked && matches!(r.state, VersionState::Freed | VersionState::Failed))
            });
            if rec.versions.is_empty() && version.is_none() {
                st.models.remove(model);
            } else if version.is_none() {
                // Draining versions remain: the record goes with the last of them.
                rec.unloaded = true;
            }
        }
        drop(st);
        self.send(events);
        Ok((out, generation))
    }

    /// Ends the sessions still holding `versions` of `model` if those versions are still
    /// draining and the model is still the one unloaded (`generation`): the end of an unload's
    /// drain deadline. Returns the sessions ended.
    pub fn force_drained(&self, model: &str, generation: u64, versions: &[u32]) -> usize {
        let mut st = self.lock();
        let mut ended = 0;
        for v in versions {
            let draining = st
                .models
                .get(model)
                .filter(|m| m.generation == generation)
                .and_then(|m| m.versions.get(v))
                .is_some_and(|r| r.state == VersionState::Draining);
            if draining {
                ended += st.revoke_holders(
                    model,
                    *v,
                    &format!("version {v} of '{model}' was not released before its drain deadline"),
                );
            }
        }
        ended
    }

    /// Admits a load of `model` by `caller` for `load_for` (checked again, under the same lock
    /// as the reservation, by [`Registry::reserve`]). Lets a load be refused before its files
    /// are read.
    ///
    /// The owner's `loads` and `models` quotas are checked here too, before the load takes one
    /// of the server's load slots, counting the loads admitted and not yet reserved: a tenant
    /// at its limit must not hold slots that others' loads need while its files are read, only
    /// to be refused afterwards. The claim returned counts this load so until it is handed to
    /// [`Registry::reserve`] or dropped.
    pub fn authorize_load(
        &self,
        caller: &Caller,
        load_for: &LoadFor,
        quota_of: &dyn Fn(&str) -> Quota,
        model: &str,
    ) -> Result<LoadClaim, CoreError> {
        let mut st = self.lock();
        let (owner, new_model) = st.resolve_owner(caller, load_for, model)?;
        let Some(tenant) = owner else {
            return Ok(LoadClaim::default());
        };
        let quota = quota_of(&tenant);
        let used = st.usage(&tenant);
        let (loads, models) = st.claims.of(&tenant, None);
        let loads = used.loads.saturating_add(loads);
        quota.check(&tenant, Resource::Loads, u64::from(loads), 1)?;
        if new_model {
            let models = used.models.saturating_add(models);
            quota.check(&tenant, Resource::Models, u64::from(models), 1)?;
        }
        Ok(st.claims.take(&tenant, new_model))
    }

    /// Whether `caller` could attach `version` of `model` now (0: the latest).
    pub fn attachable_now(&self, caller: &Caller, model: &str, version: u32) -> bool {
        let st = self.lock();
        let Ok(rec) = st.visible_model(caller, model) else {
            return false;
        };
        let version = if version == 0 {
            match rec.latest_attachable() {
                Some(v) => v,
                None => return false,
            }
        } else {
            version
        };
        rec.versions.get(&version).is_some_and(|v| {
            v.state == crate::model::VersionState::Ready
                || (v.state == crate::model::VersionState::Loading
                    && v.arena.as_ref().is_some_and(|a| a.attach_while_loading()))
        })
    }

    /// Whether `caller` may see `model`.
    pub fn visible(&self, caller: &Caller, model: &str) -> bool {
        self.lock().visible_model(caller, model).is_ok()
    }

    /// Every model on record that `caller` may see.
    pub fn list(&self, caller: &Caller) -> Vec<ModelSnapshot> {
        let st = self.lock();
        let holders = st.holders();
        st.models
            .iter()
            .filter(|(_, rec)| rec.visible_to(caller))
            .map(|(name, rec)| snapshot_model(name, rec, &holders))
            .collect()
    }

    /// Replaces who besides the owner may see `model`. Only the owner (or the admin) may.
    pub fn set_access(
        &self,
        caller: &Caller,
        model: &str,
        access: Access,
    ) -> Result<ModelSnapshot, CoreError> {
        let mut st = self.lock();
        let rec = st.visible_model(caller, model)?;
        if !owns(rec.owner.as_deref(), caller) {
            return Err(CoreError::PermissionDenied(format!(
                "model '{model}' belongs to {}; only its owner may change its access",
                owner_text(rec.owner.as_deref())
            )));
        }
        st.access_keeps_sharing(model, &access)?;
        let rec = st
            .models
            .get_mut(model)
            .ok_or_else(|| CoreError::ModelNotFound(model.to_owned()))?;
        rec.access = access;
        let rec = st.visible_model(caller, model)?;
        Ok(snapshot_model(model, rec, &st.holders()))
    }

    /// One model, with the manifest of `version` (0: latest ready, else the newest).
    pub fn describe(
        &self,
        caller: &Caller,
        model: &str,
        version: u32,
    ) -> Result<(ModelSnapshot, Option<Arc<Manifest>>), CoreError> {
        let st = self.lock();
        let rec = st.visible_model(caller, model)?;
        let chosen = if version == 0 {
            rec.latest_ready()
                .or_else(|| rec.versions.keys().next_back().copied())
        } else if rec.versions.contains_key(&version) {
            Some(version)
        } else {
            return Err(CoreError::VersionNotFound {
                model: model.to_owned(),
                version,
            });
        };
        let manifest = chosen
            .and_then(|v| rec.versions.get(&v))
            .filter(|r| r.state != VersionState::Failed)
            .map(|r| r.manifest.clone());
        Ok((snapshot_model(model, rec, &st.holders()), manifest))
    }

    /// Registry-wide figures; a tenant's figures cover the models it may see and its own
    /// sessions and leases. Makes no device call.
    pub fn stats(&self, caller: &Caller) -> Stats {
        let st = self.lock();
        let mut by_state: BTreeMap<VersionState, u32> =
            VersionState::ALL.iter().map(|s| (*s, 0)).collect();
        let visible: Vec<_> = st
            .models
            .values()
            .filter(|rec| rec.visible_to(caller))
            .collect();
        for rec in &visible {
            for v in rec.versions.values() {
                *by_state.entry(v.state).or_default() += 1;
            }
        }
        let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        let (arena_bytes, arenas, sessions, leases) = match caller {
            Caller::Admin => (
                st.arena_bytes,
                st.arenas,
                count(st.sessions.len()),
                count(st.leases.len()),
            ),
            Caller::Tenant { name, .. } => {
                let used = st.usage(name);
                // Each version's first arena and its replicas', as its bytes count them.
                let arenas: u32 = visible
                    .iter()
                    .flat_map(|r| r.versions.values())
                    .filter(|v| v.state.holds_arena())
                    .map(VersionRecord::arena_count)
                    .sum();
                (
                    visible.iter().map(|r| r.held_bytes()).sum(),
                    arenas,
                    used.sessions,
                    used.leases,
                )
            }
        };
        Stats {
            arena_bytes,
            arenas,
            models: count(visible.len()),
            versions_by_state: by_state.into_iter().collect(),
            sessions,
            leases,
        }
    }

    /// Arena bytes, arenas and leases on each device that holds any (every model, whoever
    /// owns it). Makes no device call.
    pub fn by_device(&self) -> BTreeMap<String, DeviceUse> {
        self.lock().device_use()
    }

    /// Arena bytes on each device that holds any.
    pub fn bytes_by_device(&self) -> BTreeMap<String, u64> {
        self.by_device()
            .into_iter()
            .map(|(d, u)| (d, u.arena_bytes))
            .collect()
    }

    /// What `tenant` uses now.
    pub fn usage(&self, tenant: &str) -> Usage {
        self.lock().usage(tenant)
    }

    /// Open sessions and leases held, per tenant (`None`: the admin's), sorted.
    pub fn sessions_by_tenant(&self) -> Vec<(Option<String>, u32, u32)> {
        let st = self.lock();
        let mut by: BTreeMap<Option<String>, (u32, u32)> = BTreeMap::new();
        for s in st.sessions.values() {
            let e = by.entry(s.tenant.clone()).or_default();
            e.0 += 1;
            e.1 += u32::try_from(s.leases.len()).unwrap_or(u32::MAX);
        }
        by.into_iter().map(|(t, (s, l))| (t, s, l)).collect()
    }

    /// Refuses new loads and sessions; cancels loads; ends every session and frees every arena.
    /// Called once the gRPC server has stopped.
    pub fn shutdown(&self) {
        self.lock().shut_down();
    }
}
