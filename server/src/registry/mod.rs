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
//! - `leases`: leases and their one-time tickets, in one store.
//! - `graveyard`: what a section releases (arena handles, ticket descriptors), dropped after
//!   the lock is.

mod graveyard;
mod leases;
mod state;
#[cfg(test)]
mod tests;
pub mod types;
mod versions;

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use modelshare_device::ArenaHandle;
use tokio::sync::broadcast;

use self::graveyard::Guard;
pub use self::leases::TicketError;
use self::state::{SessionRecord, State, owner_text, snapshot_model, snapshot_version};
pub use self::types::*;
use self::versions::{LoadRequest, now_unix_ms};
use crate::error::ServerError;
use crate::model::{Manifest, VersionState};
use crate::tenants::{Access, Caller, Quota, Resource, owns};

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
        device: &str,
        keep_previous: bool,
    ) -> Result<Reservation, ServerError> {
        let bytes = manifest.arena_bytes;
        let model = manifest.model.clone();
        if let Some(limit) = self.limits.max_model_bytes
            && bytes > limit
        {
            return Err(ServerError::LimitExceeded {
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
            keep_previous,
        };
        let version =
            self.lock()
                .reserve(&req, &manifest, &progress, self.limits.max_total_bytes)?;
        let mut manifest = manifest;
        manifest.version = version;
        Ok(Reservation {
            model,
            version,
            progress,
            manifest,
            device: device.to_owned(),
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

    /// One version as it stands now.
    pub fn version_snapshot(&self, model: &str, version: u32) -> Option<VersionSnapshot> {
        let st = self.lock();
        let v = st.models.get(model)?.versions.get(&version)?;
        Some(snapshot_version(version, v))
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
    ) -> Result<(Vec<VersionSnapshot>, u64), ServerError> {
        let mut st = self.lock();
        let rec = st.visible_model(caller, model)?;
        if !owns(rec.owner.as_deref(), caller) {
            return Err(ServerError::PermissionDenied(format!(
                "model '{model}' belongs to {}; only its owner may unload it",
                owner_text(rec.owner.as_deref())
            )));
        }
        let generation = rec.generation;
        let targets: Vec<u32> = match version {
            Some(v) if rec.versions.contains_key(&v) => vec![v],
            Some(v) => {
                return Err(ServerError::VersionNotFound {
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

    /// Whether `caller` may load a version of `model` for `load_for` now (checked again, under
    /// the same lock as the reservation, by [`Registry::reserve`]). Lets a load be refused
    /// before its files are read.
    pub fn authorize_load(
        &self,
        caller: &Caller,
        load_for: &LoadFor,
        model: &str,
    ) -> Result<(), ServerError> {
        self.lock()
            .resolve_owner(caller, load_for, model)
            .map(|_| ())
    }

    /// Whether `caller` may see `model`.
    pub fn visible(&self, caller: &Caller, model: &str) -> bool {
        self.lock().visible_model(caller, model).is_ok()
    }

    /// Every model on record that `caller` may see.
    pub fn list(&self, caller: &Caller) -> Vec<ModelSnapshot> {
        let st = self.lock();
        st.models
            .iter()
            .filter(|(_, rec)| rec.visible_to(caller))
            .map(|(name, rec)| snapshot_model(name, rec))
            .collect()
    }

    /// Replaces who besides the owner may see `model`. Only the owner (or the admin) may.
    pub fn set_access(
        &self,
        caller: &Caller,
        model: &str,
        access: Access,
    ) -> Result<ModelSnapshot, ServerError> {
        let mut st = self.lock();
        let rec = st.visible_model(caller, model)?;
        if !owns(rec.owner.as_deref(), caller) {
            return Err(ServerError::PermissionDenied(format!(
                "model '{model}' belongs to {}; only its owner may change its access",
                owner_text(rec.owner.as_deref())
            )));
        }
        let rec = st
            .models
            .get_mut(model)
            .ok_or_else(|| ServerError::ModelNotFound(model.to_owned()))?;
        rec.access = access;
        Ok(snapshot_model(model, rec))
    }

    /// One model, with the manifest of `version` (0: latest ready, else the newest).
    pub fn describe(
        &self,
        caller: &Caller,
        model: &str,
        version: u32,
    ) -> Result<(ModelSnapshot, Option<Arc<Manifest>>), ServerError> {
        let st = self.lock();
        let rec = st.visible_model(caller, model)?;
        let chosen = if version == 0 {
            rec.latest_ready()
                .or_else(|| rec.versions.keys().next_back().copied())
        } else if rec.versions.contains_key(&version) {
            Some(version)
        } else {
            return Err(ServerError::VersionNotFound {
                model: model.to_owned(),
                version,
            });
        };
        let manifest = chosen
            .and_then(|v| rec.versions.get(&v))
            .filter(|r| r.state != VersionState::Failed)
            .map(|r| r.manifest.clone());
        Ok((snapshot_model(model, rec), manifest))
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
                let arenas = visible
                    .iter()
                    .flat_map(|r| r.versions.values())
                    .filter(|v| v.state.holds_arena())
                    .count();
                (
                    visible.iter().map(|r| r.held_bytes()).sum(),
                    count(arenas),
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

    /// Opens a session for `caller`, within its sessions quota.
    pub fn open_session(
        &self,
        caller: &Caller,
        hello: WorkerHello,
    ) -> Result<OpenedSession, ServerError> {
        let mut st = self.lock();
        if st.shutting_down {
            return Err(ServerError::ShuttingDown);
        }
        if let Caller::Tenant { name, quota } = caller {
            let used = st.usage(name).sessions;
            quota.check(name, Resource::Sessions, u64::from(used), 1)?;
        }
        if st.sessions.len() >= self.limits.max_sessions {
            return Err(ServerError::LimitExceeded {
                what: "open sessions".into(),
                limit: self.limits.max_sessions as u64,
                requested: st.sessions.len() as u64 + 1,
            });
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let revocation = Arc::new(Revocation::default());
        st.sessions.insert(
            id.clone(),
            SessionRecord {
                tenant: caller.tenant().map(str::to_owned),
                hello,
                opened_unix_ms: now_unix_ms(),
                leases: Vec::new(),
                revocation: revocation.clone(),
            },
        );
        Ok(OpenedSession { id, revocation })
    }

    /// Ends a session and releases every lease it held (and their tickets). Returns the
    /// number of leases released; ending an unknown session is a no-op.
    pub fn end_session(&self, session: &str) -> usize {
        let mut st = self.lock();
        let Some(rec) = st.sessions.remove(session) else {
            return 0;
        };
        let n = rec.leases.len();
        for lease in rec.leases {
            st.drop_lease(&lease);
        }
        n
    }

    /// Whether `session` holds a lease on `model`@`version`.
    pub fn session_holds(&self, session: &str, model: &str, version: u32) -> bool {
        let st = self.lock();
        st.sessions.get(session).is_some_and(|s| {
            s.leases.iter().any(|l| {
                st.leases
                    .get(l)
                    .is_some_and(|r| r.model == model && r.version == version)
            })
        })
    }

    /// Takes a lease on `model`@`version` (0: latest ready) for `session`, which must be
    /// `caller`'s; the model must be one `caller` may see, within its leases quota.
    pub fn attach(
        &self,
        caller: &Caller,
        session: &str,
        model: &str,
        version: u32,
    ) -> Result<Attachment, ServerError> {
        let mut st = self.lock();
        let held = st.own_session(caller, session)?.leases.len();
        if held >= self.limits.max_leases_per_session {
            return Err(ServerError::LimitExceeded {
                what: "leases held by one session".into(),
                limit: self.limits.max_leases_per_session as u64,
                requested: held as u64 + 1,
            });
        }
        let rec = st.visible_model(caller, model)?;
        let version = if version == 0 {
            rec.latest_ready()
                .ok_or_else(|| ServerError::NoReadyVersion(model.to_owned()))?
        } else {
            version
        };
        // Checked now (it reads the whole state), reported after the version's own refusals.
        let within_quota = match caller {
            Caller::Tenant { name, quota } => {
                let used = st.usage(name).leases;
                quota.check(name, Resource::Leases, u64::from(used), 1)
            }
            Caller::Admin => Ok(()),
        };
        let v = st
            .version_mut(model, version)
            .ok_or_else(|| ServerError::VersionNotFound {
                model: model.to_owned(),
                version,
            })?;
        let arena = match (v.state, &v.arena) {
            (VersionState::Ready, Some(arena)) => arena.clone(),
            (VersionState::Loading, Some(arena)) if arena.attach_while_loading() => arena.clone(),
            // The arena is being allocated (outside the lock): a moment from now it can be.
            (VersionState::Loading, None) => {
                return Err(ServerError::Allocating {
                    model: model.to_owned(),
                    version,
                });
            }
            (state, _) => {
                return Err(ServerError::WrongState {
                    model: model.to_owned(),
                    version,
                    state,
                });
            }
        };
        within_quota?;
        v.leases += 1;
        let manifest = v.manifest.clone();
        let loading = v.state == VersionState::Loading;
        let device = v.device.clone();
        let lease_id = uuid::Uuid::new_v4().simple().to_string();
        st.leases.insert(
            lease_id.clone(),
            leases::LeaseRecord::new(session, model, version),
        );
        if let Some(s) = st.sessions.get_mut(session) {
            s.leases.push(lease_id.clone());
        }
        Ok(Attachment {
            lease_id,
            manifest,
            arena,
            loading,
            device,
        })
    }

    /// Gives back a lease of `session`, which must be `caller`'s (its ticket goes with it).
    /// Returns the model and version it held.
    pub fn release(
        &self,
        caller: &Caller,
        session: &str,
        lease: &str,
    ) -> Result<(String, u32), ServerError> {
        let mut st = self.lock();
        st.own_session(caller, session)?;
        let held = st
            .leases
            .get(lease)
            .filter(|l| l.session == session)
            .map(|l| (l.model.clone(), l.version))
            .ok_or_else(|| ServerError::LeaseNotFound(lease.to_owned()))?;
        if let Some(s) = st.sessions.get_mut(session) {
            s.leases.retain(|l| l != lease);
        }
        st.drop_lease(lease);
        Ok(held)
    }

    /// Files `fd` on `lease` under a new one-time ticket valid until `expires`, redeemable
    /// only by `uid` when given. `None` if the lease is gone meanwhile (the fd is closed).
    pub fn issue_ticket(
        &self,
        lease: &str,
        fd: OwnedFd,
        uid: Option<u32>,
        expires: Instant,
    ) -> Option<String> {
        let mut st = self.lock();
        let st = &mut *st;
        st.leases
            .issue_ticket(lease, fd, uid, expires, &mut st.graveyard)
    }

    /// Takes the descriptor filed under `ticket` (see [`TicketError`] for the refusals). A
    /// ticket is consumed by any attempt.
    pub fn redeem_ticket(
        &self,
        ticket: &str,
        peer_uid: Option<u32>,
    ) -> Result<OwnedFd, TicketError> {
        let mut st = self.lock();
        let st = &mut *st;
        st.leases
            .redeem(ticket, peer_uid, Instant::now(), &mut st.graveyard)
    }

    /// Closes `ticket` of `lease` if it is still outstanding and has expired (the timer).
    pub fn expire_ticket(&self, lease: &str, ticket: &str) {
        let mut st = self.lock();
        let st = &mut *st;
        st.leases
            .expire(lease, ticket, Instant::now(), &mut st.graveyard);
    }

    /// Tickets outstanding.
    pub fn tickets(&self) -> usize {
        self.lock().leases.tickets()
    }

    /// Open sessions `caller` may see (a tenant: its own), oldest first.
    pub fn sessions(&self, caller: &Caller) -> Vec<SessionSnapshot> {
        let st = self.lock();
        let mut out: Vec<SessionSnapshot> = st
            .sessions
            .iter()
            .filter(|(_, s)| caller.is_admin() || s.tenant.as_deref() == caller.tenant())
            .map(|(id, s)| {
                let mut leases: Vec<(String, String, u32)> = s
                    .leases
                    .iter()
                    .filter_map(|l| {
                        st.leases
                            .get(l)
                            .map(|r| (l.clone(), r.model.clone(), r.version))
                    })
                    .collect();
                leases.sort();
                SessionSnapshot {
                    id: id.clone(),
                    hello: s.hello.clone(),
                    opened_unix_ms: s.opened_unix_ms,
                    tenant: s.tenant.clone(),
                    leases,
                }
            })
            .collect();
        out.sort_by(|a, b| (a.opened_unix_ms, &a.id).cmp(&(b.opened_unix_ms, &b.id)));
        out
    }

    /// Refuses new loads and sessions; cancels loads; ends every session and frees every arena.
    /// Called once the gRPC server has stopped.
    pub fn shutdown(&self) {
        self.lock().shut_down();
    }
}
