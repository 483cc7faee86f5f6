//! Models, versions, sessions and leases under one lock.
//!
//! The registry is the only owner of arenas. It decides when an arena is freed: a version is
//! freed when it has been unloaded *and* no lease on it remains; until then it is `draining`.
//! The lock is a `std::sync::Mutex` held for short, non-blocking sections only (never across an
//! `.await`, never around a device call); allocation happens outside it against a reservation,
//! so quota checks stay atomic under concurrency.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use modelshare_device::{Arena, Backend, DeviceInfo};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

use crate::error::ServerError;
use crate::model::{Manifest, TensorMeta, VersionState};
use crate::tenants::{Access, Caller, Quota, Resource, owns};
use crate::weights::layout::{ALIGNMENT, Layout};
use crate::weights::source::ModelSource;

/// How many ended (freed or failed) versions of a model stay on record.
const ENDED_VERSIONS_KEPT: usize = 8;

/// Limits the registry enforces.
#[derive(Debug, Clone)]
pub struct RegistryLimits {
    /// Largest arena one version may have.
    pub max_model_bytes: Option<u64>,
    /// Most arena bytes held at once, over all versions.
    pub max_total_bytes: Option<u64>,
    /// Most open sessions.
    pub max_sessions: usize,
    /// Most leases one session may hold.
    pub max_leases_per_session: usize,
}

impl Default for RegistryLimits {
    fn default() -> Self {
        Self {
            max_model_bytes: None,
            max_total_bytes: None,
            max_sessions: 4096,
            max_leases_per_session: 1024,
        }
    }
}

/// Something that happened to a model, pushed to worker sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelEvent {
    /// A version became ready.
    VersionReady {
        /// Model name.
        model: String,
        /// Version number.
        version: u32,
    },
    /// A version started draining.
    VersionDraining {
        /// Model name.
        model: String,
        /// Version number.
        version: u32,
    },
}

/// Progress of one load, shared between the copying thread and the progress stream.
#[derive(Debug)]
pub struct LoadProgress {
    /// Bytes copied so far.
    pub done: AtomicU64,
    /// Payload bytes to copy.
    pub total: u64,
    /// Set by an unload of a loading version; the copy stops at its next chunk.
    pub cancel: AtomicBool,
}

/// A load that has been admitted and has its arena.
#[derive(Debug)]
pub struct LoadJob {
    /// Model name.
    pub model: String,
    /// Version number assigned.
    pub version: u32,
    /// The arena to fill.
    pub arena: Arc<dyn Arena>,
    /// Shared progress.
    pub progress: Arc<LoadProgress>,
    /// The manifest as planned (checksums still zero).
    pub manifest: Manifest,
}

/// A version, as reported to clients.
#[derive(Debug, Clone, PartialEq)]
pub struct VersionSnapshot {
    /// Version number.
    pub version: u32,
    /// State.
    pub state: VersionState,
    /// Arena size.
    pub arena_bytes: u64,
    /// Number of tensors.
    pub tensor_count: u32,
    /// Source path relative to the model root.
    pub source: String,
    /// Load start, Unix ms.
    pub created_unix_ms: i64,
    /// Load end, Unix ms (0 while loading).
    pub finished_unix_ms: i64,
    /// Failure reason.
    pub error: Option<String>,
    /// Leases held.
    pub leases: u32,
    /// Bytes copied.
    pub bytes_loaded: u64,
    /// Bytes to copy.
    pub bytes_total: u64,
}

/// A model, as reported to clients.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSnapshot {
    /// Model name.
    pub name: String,
    /// Highest ready version (0 when none).
    pub latest_ready: u32,
    /// Versions on record, oldest first.
    pub versions: Vec<VersionSnapshot>,
    /// Owning tenant (`None`: no tenant).
    pub owner: Option<String>,
    /// Who else may see it.
    pub access: Access,
}

/// Who a load is for, and the quotas that apply.
#[derive(Debug, Clone, Default)]
pub struct LoadFor {
    /// Owner named by the request (`None`: not named).
    pub requested_owner: Option<String>,
    /// Owner of a new model when the request names none: the caller's tenant.
    pub default_owner: Option<String>,
    /// Access to set (`None`: a new model is private, an existing one keeps its access).
    pub access: Option<Access>,
}

/// What one tenant uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Arena bytes of the models it owns (loading, ready, draining).
    pub device_bytes: u64,
    /// Models it owns that hold memory.
    pub models: u32,
    /// Its open sessions.
    pub sessions: u32,
    /// Leases its sessions hold.
    pub leases: u32,
    /// Its versions loading now.
    pub loads: u32,
}

/// Registry-wide figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    /// The backend's device.
    pub device: DeviceInfo,
    /// Arena bytes held (reserved ones included).
    pub arena_bytes: u64,
    /// Arenas held.
    pub arenas: u32,
    /// Model names on record.
    pub models: u32,
    /// Versions per state (every state present, zero included).
    pub versions_by_state: Vec<(VersionState, u32)>,
    /// Open sessions.
    pub sessions: u32,
    /// Leases held.
    pub leases: u32,
    /// Device-reported use, where known.
    pub device_used_bytes: Option<u64>,
}

/// What a worker said when it opened its session.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct WorkerHello {
    /// Worker name.
    pub name: String,
    /// Worker pid.
    pub pid: u32,
    /// Labels.
    pub labels: BTreeMap<String, String>,
}

/// A session, as reported to the admin.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSnapshot {
    /// Session id.
    pub id: String,
    /// The worker's hello.
    pub hello: WorkerHello,
    /// Opened at, Unix ms.
    pub opened_unix_ms: i64,
    /// Tenant the session belongs to (`None`: the admin's).
    pub tenant: Option<String>,
    /// Leases: (lease id, model, version), sorted by lease id.
    pub leases: Vec<(String, String, u32)>,
}

/// How the registry tells a session task that the server ended its session (a forced unload).
#[derive(Debug, Default)]
pub struct Revocation {
    token: CancellationToken,
    reason: OnceLock<String>,
}

impl Revocation {
    /// Resolves once the session has been revoked.
    pub async fn revoked(&self) {
        self.token.cancelled().await;
    }

    /// Why the session was revoked (set before the token is cancelled).
    pub fn reason(&self) -> &str {
        self.reason
            .get()
            .map(String::as_str)
            .unwrap_or("session revoked")
    }

    fn revoke(&self, reason: String) {
        let _ = self.reason.set(reason);
        self.token.cancel();
    }
}

/// A session just opened.
#[derive(Debug)]
pub struct OpenedSession {
    /// Session id.
    pub id: String,
    /// Fires when the server ends the session.
    pub revocation: Arc<Revocation>,
}

/// A lease just taken.
#[derive(Debug)]
pub struct Attachment {
    /// Lease id.
    pub lease_id: String,
    /// Manifest of the version.
    pub manifest: Arc<Manifest>,
    /// The arena, for exporting its handle.
    pub arena: Arc<dyn Arena>,
    /// Whether the version was still loading (attached ahead of its ready event).
    pub loading: bool,
}

#[derive(Debug)]
struct VersionRecord {
    state: VersionState,
    source: String,
    created_unix_ms: i64,
    finished_unix_ms: i64,
    error: Option<String>,
    arena_bytes: u64,
    manifest: Arc<Manifest>,
    arena: Option<Arc<dyn Arena>>,
    progress: Arc<LoadProgress>,
    leases: u32,
    keep_previous: bool,
}

#[derive(Debug, Default)]
struct ModelRecord {
    /// Distinguishes this record from an earlier one of the same name (a name can be unloaded
    /// and loaded again, by another tenant, with version numbers starting over).
    generation: u64,
    next_version: u32,
    versions: BTreeMap<u32, VersionRecord>,
    owner: Option<String>,
    access: Access,
}

impl ModelRecord {
    fn visible_to(&self, caller: &Caller) -> bool {
        self.access.visible_to(self.owner.as_deref(), caller)
    }

    fn holds_memory(&self) -> bool {
        self.versions.values().any(|v| v.state.holds_arena())
    }

    fn held_bytes(&self) -> u64 {
        self.versions
            .values()
            .filter(|v| v.state.holds_arena())
            .map(|v| v.arena_bytes)
            .sum()
    }
}

#[derive(Debug)]
struct SessionRecord {
    tenant: Option<String>,
    hello: WorkerHello,
    opened_unix_ms: i64,
    leases: Vec<String>,
    revocation: Arc<Revocation>,
}

#[derive(Debug)]
struct LeaseRecord {
    session: String,
    model: String,
    version: u32,
}

#[derive(Debug, Default)]
struct State {
    models: BTreeMap<String, ModelRecord>,
    sessions: BTreeMap<String, SessionRecord>,
    leases: HashMap<String, LeaseRecord>,
    /// Bytes of arenas held or reserved.
    arena_bytes: u64,
    /// Arenas held or reserved.
    arenas: u32,
    shutting_down: bool,
    /// Last model generation handed out.
    generations: u64,
    /// Arenas released while the lock was held, dropped right after it is released (freeing
    /// device memory can take milliseconds: not under the lock).
    graveyard: Vec<Arc<dyn Arena>>,
}

/// The registry's lock guard: drops released arenas after unlocking.
struct StateGuard<'a> {
    guard: Option<MutexGuard<'a, State>>,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        // Present until drop.
        self.guard
            .as_deref()
            .unwrap_or_else(|| unreachable!("guard taken before drop"))
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        self.guard
            .as_deref_mut()
            .unwrap_or_else(|| unreachable!("guard taken before drop"))
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        if let Some(mut guard) = self.guard.take() {
            let dead = std::mem::take(&mut guard.graveyard);
            drop(guard);
            drop(dead);
        }
    }
}

/// The registry of models, versions, sessions and leases.
#[derive(Debug)]
pub struct Registry {
    backend: Arc<dyn Backend>,
    limits: RegistryLimits,
    state: Mutex<State>,
    events: broadcast::Sender<ModelEvent>,
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

impl Registry {
    /// A registry whose arenas come from `backend`.
    pub fn new(backend: Arc<dyn Backend>, limits: RegistryLimits) -> Self {
        let (events, _) = broadcast::channel(256);
        Self {
            backend,
            limits,
            state: Mutex::new(State::default()),
            events,
        }
    }

    /// The backend's device.
    pub fn device(&self) -> DeviceInfo {
        self.backend.info()
    }

    /// Model events, for worker sessions.
    pub fn subscribe(&self) -> broadcast::Receiver<ModelEvent> {
        self.events.subscribe()
    }

    fn lock(&self) -> StateGuard<'_> {
        // A panic while holding the lock cannot leave the maps half-updated in a way later calls
        // would trip over (every section updates and then returns), so recover from poisoning.
        StateGuard {
            guard: Some(self.state.lock().unwrap_or_else(|e| e.into_inner())),
        }
    }

    /// Admits a load: checks ownership, limits and the owner's quotas (`quota_of`), assigns a
    /// version number, allocates the arena. With `keep_previous` false, older ready versions are
    /// retired once this one is ready.
    ///
    /// A new model belongs to `load_for`'s owner. A new version of an existing model keeps its
    /// owner: only the owner (or the admin) may load it, a caller that may not see the model is
    /// told the name is taken, and naming another owner is refused.
    #[allow(clippy::too_many_arguments)]
    pub fn begin_load(
        &self,
        caller: &Caller,
        load_for: &LoadFor,
        quota_of: &dyn Fn(&str) -> Quota,
        model: &str,
        source: &ModelSource,
        layout: &Layout,
        keep_previous: bool,
    ) -> Result<LoadJob, ServerError> {
        let bytes = layout.arena_bytes;
        if let Some(limit) = self.limits.max_model_bytes
            && bytes > limit
        {
            return Err(ServerError::LimitExceeded {
                what: format!("arena bytes of model '{model}'"),
                limit,
                requested: bytes,
            });
        }
        let manifest_base = Manifest {
            model: model.to_owned(),
            version: 0,
            arena_bytes: bytes,
            alignment: ALIGNMENT,
            tensors: layout
                .tensors
                .iter()
                .map(|t| TensorMeta {
                    name: t.name.clone(),
                    dtype: t.dtype,
                    shape: t.shape.clone(),
                    offset: t.arena_offset,
                    byte_length: t.byte_length,
                    xxh3: 0,
                    ms64: 0,
                })
                .collect(),
            header_metadata: source.header_metadata.clone(),
            files: source.metadata_files.clone(),
        };
        let progress = Arc::new(LoadProgress {
            done: AtomicU64::new(0),
            total: layout.payload_bytes,
            cancel: AtomicBool::new(false),
        });

        // Reserve the bytes and the version number under the lock, allocate outside it.
        let version = {
            let mut st = self.lock();
            if st.shutting_down {
                return Err(ServerError::ShuttingDown);
            }
            let (owner, new_model) = resolve_owner(&st, caller, load_for, model)?;
            if let Some(limit) = self.limits.max_total_bytes {
                let requested = st.arena_bytes.saturating_add(bytes);
                if requested > limit {
                    return Err(ServerError::LimitExceeded {
                        what: "arena bytes held by the server".into(),
                        limit,
                        requested,
                    });
                }
            }
            if let Some(tenant) = &owner {
                let quota = quota_of(tenant);
                let used = usage(&st, tenant);
                quota.check(tenant, Resource::DeviceBytes, used.device_bytes, bytes)?;
                quota.check(tenant, Resource::Loads, u64::from(used.loads), 1)?;
                if new_model {
                    quota.check(tenant, Resource::Models, u64::from(used.models), 1)?;
                }
            }
            st.arena_bytes += bytes;
            st.arenas += 1;
            if !st.models.contains_key(model) {
                st.generations += 1;
                let generation = st.generations;
                st.models.insert(
                    model.to_owned(),
                    ModelRecord {
                        generation,
                        ..ModelRecord::default()
                    },
                );
            }
            let Some(rec) = st.models.get_mut(model) else {
                return Err(ServerError::Internal("model record vanished".into()));
            };
            rec.owner = owner;
            if let Some(access) = &load_for.access {
                rec.access = access.clone();
            }
            rec.next_version += 1;
            let version = rec.next_version;
            let mut manifest = manifest_base.clone();
            manifest.version = version;
            rec.versions.insert(
                version,
                VersionRecord {
                    state: VersionState::Loading,
                    source: source.source.clone(),
                    created_unix_ms: now_unix_ms(),
                    finished_unix_ms: 0,
                    error: None,
                    arena_bytes: bytes,
                    manifest: Arc::new(manifest),
                    arena: None,
                    progress: progress.clone(),
                    leases: 0,
                    keep_previous,
                },
            );
            version
        };

        let label = format!("{model}@{version}");
        match self.backend.allocate(bytes, &label) {
            Ok(arena) => {
                let arena: Arc<dyn Arena> = Arc::from(arena);
                let mut st = self.lock();
                if let Some(v) = version_mut(&mut st, model, version) {
                    v.arena = Some(arena.clone());
                }
                let mut manifest = manifest_base;
                manifest.version = version;
                Ok(LoadJob {
                    model: model.to_owned(),
                    version,
                    arena,
                    progress,
                    manifest,
                })
            }
            Err(e) => {
                let err = ServerError::Device(e);
                self.end_load(model, version, Err(err.to_string()));
                Err(err)
            }
        }
    }

    /// Records the end of a load: `Ok` carries the final manifest (with checksums), `Err` the
    /// reason it failed. A failed or cancelled load releases its arena here.
    pub fn finish_load(&self, job: &LoadJob, result: Result<Manifest, String>) {
        self.end_load(&job.model, job.version, result);
    }

    /// One version as it stands now.
    pub fn version_snapshot(&self, model: &str, version: u32) -> Option<VersionSnapshot> {
        let st = self.lock();
        let v = st.models.get(model)?.versions.get(&version)?;
        Some(snapshot_version(version, v))
    }

    fn end_load(&self, model: &str, version: u32, result: Result<Manifest, String>) {
        let mut st = self.lock();
        let Some(v) = version_mut(&mut st, model, version) else {
            return;
        };
        v.finished_unix_ms = now_unix_ms();
        let mut events = Vec::new();
        match (v.state, result) {
            (VersionState::Loading, Ok(manifest)) => {
                v.manifest = Arc::new(manifest);
                v.state = VersionState::Ready;
                let keep_previous = v.keep_previous;
                events.push(ModelEvent::VersionReady {
                    model: model.to_owned(),
                    version,
                });
                if !keep_previous {
                    let older: Vec<u32> = st
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
                        retire(&mut st, model, old, &mut events);
                    }
                }
            }
            (VersionState::Loading, Err(reason)) => {
                abandon_load(&mut st, model, version, &reason, VersionState::Failed);
            }
            // Unloaded while loading: free now unless leases hold it (then the last release does).
            (VersionState::Draining, Ok(manifest)) => {
                v.manifest = Arc::new(manifest);
                if v.leases == 0 {
                    free_version(&mut st, model, version, VersionState::Freed);
                }
            }
            (VersionState::Draining, Err(reason)) => {
                abandon_load(&mut st, model, version, &reason, VersionState::Freed);
            }
            (VersionState::Ready | VersionState::Freed | VersionState::Failed, _) => {}
        }
        drop(st);
        for e in events {
            let _ = self.events.send(e);
        }
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
        let rec = visible_model(&st, caller, model)?;
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
        let mut out = Vec::new();
        let mut events = Vec::new();
        for v in targets {
            let Some(rec) = version_mut(&mut st, model, v) else {
                continue;
            };
            match rec.state {
                VersionState::Loading => {
                    rec.progress.cancel.store(true, Ordering::SeqCst);
                    rec.state = VersionState::Draining;
                }
                VersionState::Ready => retire(&mut st, model, v, &mut events),
                VersionState::Draining | VersionState::Freed | VersionState::Failed => {}
            }
            if force {
                revoke_holders(
                    &mut st,
                    model,
                    v,
                    &format!("version {v} of '{model}' was force-unloaded"),
                );
            }
            if let Some(rec) = st.models.get(model).and_then(|m| m.versions.get(&v)) {
                out.push(snapshot_version(v, rec));
            }
        }
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
        for e in events {
            let _ = self.events.send(e);
        }
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
                ended += revoke_holders(
                    &mut st,
                    model,
                    *v,
                    &format!("version {v} of '{model}' was not released before its drain deadline"),
                );
            }
        }
        ended
    }

    /// Whether `caller` may load a version of `model` for `load_for` now (checked again, under
    /// the same lock as the reservation, by [`Registry::begin_load`]). Lets a load be refused
    /// before its files are read.
    pub fn authorize_load(
        &self,
        caller: &Caller,
        load_for: &LoadFor,
        model: &str,
    ) -> Result<(), ServerError> {
        resolve_owner(&self.lock(), caller, load_for, model).map(|_| ())
    }

    /// Whether `caller` may see `model`.
    pub fn visible(&self, caller: &Caller, model: &str) -> bool {
        visible_model(&self.lock(), caller, model).is_ok()
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
        let rec = visible_model(&st, caller, model)?;
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
        let rec = visible_model(&st, caller, model)?;
        let chosen = if version == 0 {
            latest_ready(rec).or_else(|| rec.versions.keys().next_back().copied())
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
    /// sessions and leases.
    pub fn stats(&self, caller: &Caller) -> Stats {
        let st = self.lock();
        let mut by_state: BTreeMap<VersionState, u32> =
            VersionState::ALL.iter().map(|s| (*s, 0)).collect();
        let visible: Vec<&ModelRecord> = st
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
                let used = usage(&st, name);
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
            device: self.backend.info(),
            arena_bytes,
            arenas,
            models: count(visible.len()),
            versions_by_state: by_state.into_iter().collect(),
            sessions,
            leases,
            device_used_bytes: self.backend.used_bytes(),
        }
    }

    /// What `tenant` uses now.
    pub fn usage(&self, tenant: &str) -> Usage {
        usage(&self.lock(), tenant)
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
            let used = usage(&st, name).sessions;
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

    /// Ends a session and releases every lease it held. Returns the number of leases released;
    /// ending an unknown session is a no-op.
    pub fn end_session(&self, session: &str) -> usize {
        let mut st = self.lock();
        let Some(rec) = st.sessions.remove(session) else {
            return 0;
        };
        let n = rec.leases.len();
        for lease in rec.leases {
            drop_lease(&mut st, &lease);
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
        let held = own_session(&st, caller, session)?.leases.len();
        if held >= self.limits.max_leases_per_session {
            return Err(ServerError::LimitExceeded {
                what: "leases held by one session".into(),
                limit: self.limits.max_leases_per_session as u64,
                requested: held as u64 + 1,
            });
        }
        let rec = visible_model(&st, caller, model)?;
        let version = if version == 0 {
            latest_ready(rec).ok_or_else(|| ServerError::NoReadyVersion(model.to_owned()))?
        } else {
            version
        };
        // Checked now (it reads the whole state), reported after the version's own refusals.
        let within_quota = match caller {
            Caller::Tenant { name, quota } => {
                let used = usage(&st, name).leases;
                quota.check(name, Resource::Leases, u64::from(used), 1)
            }
            Caller::Admin => Ok(()),
        };
        let v =
            version_mut(&mut st, model, version).ok_or_else(|| ServerError::VersionNotFound {
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
        let lease_id = uuid::Uuid::new_v4().simple().to_string();
        st.leases.insert(
            lease_id.clone(),
            LeaseRecord {
                session: session.to_owned(),
                model: model.to_owned(),
                version,
            },
        );
        if let Some(s) = st.sessions.get_mut(session) {
            s.leases.push(lease_id.clone());
        }
        Ok(Attachment {
            lease_id,
            manifest,
            arena,
            loading,
        })
    }

    /// Gives back a lease of `session`, which must be `caller`'s. Returns the model and
    /// version it held.
    pub fn release(
        &self,
        caller: &Caller,
        session: &str,
        lease: &str,
    ) -> Result<(String, u32), ServerError> {
        let mut st = self.lock();
        own_session(&st, caller, session)?;
        let held = st
            .leases
            .get(lease)
            .filter(|l| l.session == session)
            .map(|l| (l.model.clone(), l.version))
            .ok_or_else(|| ServerError::LeaseNotFound(lease.to_owned()))?;
        if let Some(s) = st.sessions.get_mut(session) {
            s.leases.retain(|l| l != lease);
        }
        drop_lease(&mut st, lease);
        Ok(held)
    }

    /// Those of `leases` no longer held (one lock for all of them).
    pub fn gone_leases(&self, leases: Vec<String>) -> std::collections::HashSet<String> {
        let st = self.lock();
        leases
            .into_iter()
            .filter(|l| !st.leases.contains_key(l))
            .collect()
    }

    /// Whether `lease` is still held (tickets are only redeemed for live leases).
    pub fn lease_alive(&self, lease: &str) -> bool {
        self.lock().leases.contains_key(lease)
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
        let mut st = self.lock();
        st.shutting_down = true;
        let sessions: Vec<String> = st.sessions.keys().cloned().collect();
        for s in sessions {
            if let Some(rec) = st.sessions.remove(&s) {
                for lease in rec.leases {
                    drop_lease(&mut st, &lease);
                }
            }
        }
        let targets: Vec<(String, u32)> = st
            .models
            .iter()
            .flat_map(|(m, r)| r.versions.keys().map(move |v| (m.clone(), *v)))
            .collect();
        for (m, v) in targets {
            if let Some(rec) = version_mut(&mut st, &m, v) {
                match rec.state {
                    VersionState::Loading => rec.progress.cancel.store(true, Ordering::SeqCst),
                    VersionState::Ready | VersionState::Draining => {
                        free_version(&mut st, &m, v, VersionState::Freed)
                    }
                    VersionState::Freed | VersionState::Failed => {}
                }
            }
        }
    }
}

/// Ends a load that failed or was cancelled: opens the arena's ready gate, ends the sessions
/// that attached during the load (they would compute on garbage), frees the arena.
fn abandon_load(st: &mut State, model: &str, version: u32, reason: &str, end: VersionState) {
    let Some(v) = version_mut(st, model, version) else {
        return;
    };
    if let Some(arena) = &v.arena {
        arena.abandon();
    }
    v.error = Some(reason.to_owned());
    revoke_holders(
        st,
        model,
        version,
        &format!("the load of version {version} of '{model}' did not complete: {reason}"),
    );
    free_version(st, model, version, end);
}

/// Takes a ready version out of service: freed at once without leases, else draining (and its
/// holders are told).
fn retire(st: &mut State, model: &str, version: u32, events: &mut Vec<ModelEvent>) {
    let Some(rec) = version_mut(st, model, version) else {
        return;
    };
    if rec.leases == 0 {
        free_version(st, model, version, VersionState::Freed);
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
fn revoke_holders(st: &mut State, model: &str, version: u32, reason: &str) -> usize {
    let mut holders: Vec<String> = st
        .leases
        .values()
        .filter(|l| l.model == model && l.version == version)
        .map(|l| l.session.clone())
        .collect();
    holders.sort();
    holders.dedup();
    for s in &holders {
        if let Some(rec) = st.sessions.remove(s) {
            for lease in &rec.leases {
                drop_lease(st, lease);
            }
            rec.revocation.revoke(reason.to_owned());
        }
    }
    holders.len()
}

/// The owner a load of `model` gets, and whether it makes a model hold memory anew; refuses a
/// caller that may not load it.
fn resolve_owner(
    st: &State,
    caller: &Caller,
    load_for: &LoadFor,
    model: &str,
) -> Result<(Option<String>, bool), ServerError> {
    Ok(match st.models.get(model) {
        Some(rec) => {
            if !rec.visible_to(caller) {
                return Err(ServerError::NameTaken(model.to_owned()));
            }
            if !owns(rec.owner.as_deref(), caller) {
                return Err(ServerError::PermissionDenied(format!(
                    "model '{model}' belongs to {}; only its owner may load versions of it",
                    owner_text(rec.owner.as_deref())
                )));
            }
            if let Some(requested) = &load_for.requested_owner
                && rec.owner.as_deref() != Some(requested.as_str())
            {
                return Err(ServerError::PermissionDenied(format!(
                    "model '{model}' belongs to {}; a new version keeps its owner",
                    owner_text(rec.owner.as_deref())
                )));
            }
            (rec.owner.clone(), !rec.holds_memory())
        }
        None => (
            load_for
                .requested_owner
                .clone()
                .or_else(|| load_for.default_owner.clone()),
            true,
        ),
    })
}

/// The model `caller` may see, else NOT_FOUND (as if it did not exist: names do not leak).
fn visible_model<'a>(
    st: &'a State,
    caller: &Caller,
    model: &str,
) -> Result<&'a ModelRecord, ServerError> {
    st.models
        .get(model)
        .filter(|rec| rec.visible_to(caller))
        .ok_or_else(|| ServerError::ModelNotFound(model.to_owned()))
}

/// `caller`'s session, else NOT_FOUND (another tenant's session is not shown to exist).
fn own_session<'a>(
    st: &'a State,
    caller: &Caller,
    session: &str,
) -> Result<&'a SessionRecord, ServerError> {
    st.sessions
        .get(session)
        .filter(|s| s.tenant.as_deref() == caller.tenant())
        .ok_or_else(|| ServerError::SessionNotFound(session.to_owned()))
}

/// How an owner is named in errors.
fn owner_text(owner: Option<&str>) -> String {
    owner.map_or_else(|| "the admin".to_owned(), |t| format!("tenant '{t}'"))
}

/// What `tenant` uses, computed from the records (so it cannot drift from them).
fn usage(st: &State, tenant: &str) -> Usage {
    let mut u = Usage::default();
    for rec in st
        .models
        .values()
        .filter(|r| r.owner.as_deref() == Some(tenant))
    {
        let bytes = rec.held_bytes();
        u.device_bytes += bytes;
        let loading = rec
            .versions
            .values()
            .filter(|v| v.state == VersionState::Loading)
            .count();
        u.loads += u32::try_from(loading).unwrap_or(u32::MAX);
        if rec.holds_memory() {
            u.models += 1;
        }
    }
    for s in st
        .sessions
        .values()
        .filter(|s| s.tenant.as_deref() == Some(tenant))
    {
        u.sessions += 1;
        u.leases += u32::try_from(s.leases.len()).unwrap_or(u32::MAX);
    }
    u
}

fn version_mut<'a>(st: &'a mut State, model: &str, version: u32) -> Option<&'a mut VersionRecord> {
    st.models.get_mut(model)?.versions.get_mut(&version)
}

fn latest_ready(rec: &ModelRecord) -> Option<u32> {
    rec.versions
        .iter()
        .rev()
        .find(|(_, v)| v.state == VersionState::Ready)
        .map(|(n, _)| *n)
}

/// Removes a lease; frees its version if it was draining, its load has ended and this was the
/// last lease.
fn drop_lease(st: &mut State, lease: &str) {
    let Some(l) = st.leases.remove(lease) else {
        return;
    };
    let Some(v) = version_mut(st, &l.model, l.version) else {
        return;
    };
    v.leases = v.leases.saturating_sub(1);
    let load_ended = v.finished_unix_ms != 0;
    if v.state == VersionState::Draining && v.leases == 0 && load_ended {
        free_version(st, &l.model, l.version, VersionState::Freed);
    }
}

/// Releases a version's arena and its accounting; the version ends in `end` (Freed or Failed).
fn free_version(st: &mut State, model: &str, version: u32, end: VersionState) {
    let Some(v) = version_mut(st, model, version) else {
        return;
    };
    let had_reservation = v.state.holds_arena();
    let arena = v.arena.take();
    v.state = end;
    let bytes = v.arena_bytes;
    st.graveyard.extend(arena);
    if had_reservation {
        st.arena_bytes = st.arena_bytes.saturating_sub(bytes);
        st.arenas = st.arenas.saturating_sub(1);
    }
    if let Some(rec) = st.models.get_mut(model) {
        prune_ended(rec);
    }
}

fn prune_ended(rec: &mut ModelRecord) {
    let ended: Vec<u32> = rec
        .versions
        .iter()
        .filter(|(_, v)| !v.state.holds_arena())
        .map(|(n, _)| *n)
        .collect();
    if ended.len() > ENDED_VERSIONS_KEPT {
        for n in &ended[..ended.len() - ENDED_VERSIONS_KEPT] {
            rec.versions.remove(n);
        }
    }
}

fn snapshot_version(version: u32, v: &VersionRecord) -> VersionSnapshot {
    VersionSnapshot {
        version,
        state: v.state,
        arena_bytes: v.arena_bytes,
        tensor_count: u32::try_from(v.manifest.tensors.len()).unwrap_or(u32::MAX),
        source: v.source.clone(),
        created_unix_ms: v.created_unix_ms,
        finished_unix_ms: v.finished_unix_ms,
        error: v.error.clone(),
        leases: v.leases,
        bytes_loaded: v.progress.done.load(Ordering::Relaxed),
        bytes_total: v.progress.total,
    }
}

fn snapshot_model(name: &str, rec: &ModelRecord) -> ModelSnapshot {
    ModelSnapshot {
        owner: rec.owner.clone(),
        access: rec.access.clone(),
        name: name.to_owned(),
        latest_ready: latest_ready(rec).unwrap_or(0),
        versions: rec
            .versions
            .iter()
            .map(|(n, v)| snapshot_version(*n, v))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{OnceLock, Weak};

    use modelshare_device::{BackendKind, ExportedHandle};

    use super::*;
    use crate::weights::layout::Layout;
    use crate::weights::source::ModelSource;

    /// Shared between the test, the backend and its arenas.
    #[derive(Debug, Default)]
    struct Probe {
        registry: OnceLock<Weak<Registry>>,
        /// Whether the registry's lock was free when an arena was dropped.
        unlocked_at_drop: Mutex<Vec<bool>>,
    }

    #[derive(Debug)]
    struct ProbeArena(Arc<Probe>);

    impl Arena for ProbeArena {
        fn len(&self) -> u64 {
            0
        }
        fn write_at(&self, _: u64, _: &[u8]) -> modelshare_device::Result<()> {
            Ok(())
        }
        fn seal(&self) -> modelshare_device::Result<()> {
            Ok(())
        }
        fn export(&self) -> modelshare_device::Result<ExportedHandle> {
            Err(modelshare_device::DeviceError::Unsupported {
                what: "export".into(),
            })
        }
        fn read_at(&self, _: u64, _: &mut [u8]) -> modelshare_device::Result<()> {
            Ok(())
        }
    }

    impl Drop for ProbeArena {
        fn drop(&mut self) {
            if let Some(r) = self.0.registry.get().and_then(Weak::upgrade) {
                let free = r.state.try_lock().is_ok();
                self.0.unlocked_at_drop.lock().expect("probe").push(free);
            }
        }
    }

    #[derive(Debug)]
    struct ProbeBackend(Arc<Probe>);

    impl Backend for ProbeBackend {
        fn info(&self) -> DeviceInfo {
            DeviceInfo {
                backend: BackendKind::Host,
                uuid: "probe".into(),
                name: "probe".into(),
                total_bytes: 0,
            }
        }
        fn allocate(&self, _: u64, _: &str) -> modelshare_device::Result<Box<dyn Arena>> {
            Ok(Box::new(ProbeArena(self.0.clone())))
        }
        fn used_bytes(&self) -> Option<u64> {
            None
        }
    }

    /// A model of no tensors (the registry does not look inside).
    fn empty_model() -> (ModelSource, Layout) {
        let source = ModelSource {
            source: "m".into(),
            shards: Vec::new(),
            header_metadata: BTreeMap::new(),
            metadata_files: Vec::new(),
        };
        let layout = Layout {
            tensors: Vec::new(),
            arena_bytes: 0,
            payload_bytes: 0,
        };
        (source, layout)
    }

    /// Freeing device memory can take milliseconds: arenas must be dropped after the registry's
    /// lock is released, or every other call would wait on it.
    #[test]
    fn arenas_are_dropped_outside_the_lock() {
        let probe = Arc::new(Probe::default());
        let registry = Arc::new(Registry::new(
            Arc::new(ProbeBackend(probe.clone())),
            RegistryLimits::default(),
        ));
        probe
            .registry
            .set(Arc::downgrade(&registry))
            .expect("set once");
        let (source, layout) = empty_model();
        let job = registry
            .begin_load(
                &Caller::Admin,
                &LoadFor::default(),
                &|_| Quota::default(),
                "m",
                &source,
                &layout,
                false,
            )
            .expect("begin");
        registry.finish_load(&job, Ok(job.manifest.clone()));
        drop(job);
        assert_eq!(registry.stats(&Caller::Admin).arenas, 1);
        registry
            .unload(&Caller::Admin, "m", None, false)
            .expect("unload");
        assert_eq!(registry.stats(&Caller::Admin).arenas, 0);
        assert_eq!(*probe.unlocked_at_drop.lock().expect("probe"), vec![true]);
    }

    fn loaded(registry: &Registry, model: &str) {
        let (source, layout) = empty_model();
        let job = registry
            .begin_load(
                &Caller::Admin,
                &LoadFor::default(),
                &|_| Quota::default(),
                model,
                &source,
                &layout,
                false,
            )
            .expect("begin");
        registry.finish_load(&job, Ok(job.manifest.clone()));
    }

    /// A drain deadline set for one incarnation of a name must not end the sessions of the
    /// next one (the name unloaded, then loaded again — maybe by another tenant — from v1).
    #[test]
    fn a_drain_deadline_does_not_outlive_its_model() {
        let probe = Arc::new(Probe::default());
        let registry = Registry::new(Arc::new(ProbeBackend(probe)), RegistryLimits::default());
        let admin = Caller::Admin;
        loaded(&registry, "m");
        let s1 = registry
            .open_session(&admin, WorkerHello::default())
            .expect("s1");
        registry.attach(&admin, &s1.id, "m", 0).expect("attach");
        let (_, old_generation) = registry.unload(&admin, "m", None, false).expect("drain");
        registry.end_session(&s1.id);
        registry
            .unload(&admin, "m", None, false)
            .expect("drop the record");
        assert!(registry.list(&admin).is_empty());

        loaded(&registry, "m");
        let s2 = registry
            .open_session(&admin, WorkerHello::default())
            .expect("s2");
        registry
            .attach(&admin, &s2.id, "m", 1)
            .expect("attach new v1");
        let (_, new_generation) = registry.unload(&admin, "m", None, false).expect("drain");
        assert_ne!(old_generation, new_generation);
        assert_eq!(registry.force_drained("m", old_generation, &[1]), 0);
        assert_eq!(
            registry.sessions(&admin).len(),
            1,
            "the new holder keeps its session"
        );
        assert_eq!(registry.force_drained("m", new_generation, &[1]), 1);
    }

    /// The loads quota counts the tenant's versions still loading.
    #[test]
    fn the_loads_quota_counts_running_loads() {
        let registry = Registry::new(
            Arc::new(ProbeBackend(Arc::new(Probe::default()))),
            RegistryLimits::default(),
        );
        let quota = Quota {
            loads: Some(1),
            ..Quota::default()
        };
        let tenant = Caller::Tenant {
            name: Arc::from("t"),
            quota,
        };
        let load_for = LoadFor {
            default_owner: Some("t".into()),
            ..LoadFor::default()
        };
        let (source, layout) = empty_model();
        let begin = |name: &str| {
            registry.begin_load(
                &tenant,
                &load_for,
                &|_| quota,
                name,
                &source,
                &layout,
                false,
            )
        };
        let first = begin("a").expect("first load");
        match begin("b") {
            Err(ServerError::QuotaExceeded {
                quota: "loads",
                limit: 1,
                used: 1,
                ..
            }) => {}
            other => panic!("expected the loads quota, got {other:?}"),
        }
        assert_eq!(registry.usage("t").loads, 1);
        registry.finish_load(&first, Ok(first.manifest.clone()));
        assert_eq!(registry.usage("t").loads, 0);
        begin("b").expect("a slot is free again");
    }
}
