//! The registry's state behind its one lock: model, version and session records, the lease
//! store, and the queries every section shares (visibility, ownership, usage, snapshots).

use std::collections::BTreeMap;

use super::holders::Holders;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use modelshare_device::ArenaHandle;

use super::graveyard::{Buries, Graveyard};
use super::leases::Leases;
use super::types::{
    DeviceUse, LoadFor, LoadProgress, ModelSnapshot, Revocation, Usage, VersionKey,
    VersionSnapshot, WorkerHello,
};
use crate::error::CoreError;
use crate::model::{Manifest, VersionState};
use crate::tenants::policy::{may_see, may_use_session, owner_text, owns};
use crate::tenants::{Access, Caller};

#[derive(Debug)]
pub(super) struct VersionRecord {
    pub(super) state: VersionState,
    pub(super) source: String,
    pub(super) created_unix_ms: i64,
    pub(super) finished_unix_ms: i64,
    pub(super) error: Option<String>,
    pub(super) arena_bytes: u64,
    pub(super) manifest: Arc<Manifest>,
    pub(super) arena: Option<ArenaHandle>,
    pub(super) device: String,
    pub(super) progress: Arc<LoadProgress>,
    pub(super) leases: u32,
    pub(super) keep_previous: bool,
    /// When it became ready, in the registry's event order (0: not ready yet).
    pub(super) ready_seq: u64,
    /// Copies on further devices (placement's `replicas`), reserved with the load.
    pub(super) replicas: Vec<ReplicaRecord>,
    /// SHA-256 of its tensors' bytes, where they were hashed: by a load that compared its
    /// files with this memory to share it (see `sharing`).
    pub(super) content_sha256: Option<[u8; 32]>,
    /// A load comparing its files with memory it may share: its bytes are on no device yet,
    /// and may never be (cleared if it copies after all).
    pub(super) comparing: bool,
}

/// A copy of a version's arena on another device, made from the first once it is ready.
#[derive(Debug)]
pub(super) struct ReplicaRecord {
    /// The device (UUID).
    pub(super) device: String,
    /// Its arena, once allocated.
    pub(super) arena: Option<ArenaHandle>,
    /// Copied, checked and sealed.
    pub(super) ready: bool,
}

impl VersionRecord {
    /// Bytes its arenas take: the first and every replica's.
    pub(super) fn held_bytes(&self) -> u64 {
        self.arena_bytes
            .saturating_mul(1 + self.replicas.len() as u64)
    }

    /// Its arenas (reserved or held): the first and its replicas.
    pub(super) fn arena_count(&self) -> u32 {
        u32::try_from(1 + self.replicas.len()).unwrap_or(u32::MAX)
    }

    /// Its arenas, the first then the replicas, each with its device and whether it is copied
    /// (a replica's copy done; the first as the version's state says); `None` for one reserved
    /// and not yet allocated.
    pub(super) fn arena_slots(&self) -> impl Iterator<Item = (&str, Option<&ArenaHandle>, bool)> {
        std::iter::once((self.device.as_str(), self.arena.as_ref(), true)).chain(
            self.replicas
                .iter()
                .map(|r| (r.device.as_str(), r.arena.as_ref(), r.ready)),
        )
    }

    /// The arenas it holds now (none once freed or failed).
    pub(super) fn held_arenas(&self) -> impl Iterator<Item = &ArenaHandle> {
        self.arena_slots()
            .filter(|_| self.state.holds_arena())
            .filter_map(|(_, arena, _)| arena)
    }

    /// The arena a worker on `device` attaches to (`None`: the first), and that device; the
    /// devices that hold the version when `device` holds none.
    pub(super) fn arena_on(
        &self,
        device: Option<&str>,
    ) -> Result<(Option<&ArenaHandle>, bool, &str), Vec<String>> {
        let Some(wanted) = device else {
            return Ok((self.arena.as_ref(), false, &self.device));
        };
        if self.device.eq_ignore_ascii_case(wanted) {
            return Ok((self.arena.as_ref(), false, &self.device));
        }
        match self
            .replicas
            .iter()
            .find(|r| r.device.eq_ignore_ascii_case(wanted))
        {
            Some(r) => Ok((r.arena.as_ref(), !r.ready, &r.device)),
            None => Err(std::iter::once(self.device.clone())
                .chain(self.replicas.iter().map(|r| r.device.clone()))
                .collect()),
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct ModelRecord {
    /// Distinguishes this record from an earlier one of the same name (a name can be unloaded
    /// and loaded again, by another tenant, with version numbers starting over).
    pub(super) generation: u64,
    pub(super) next_version: u32,
    pub(super) versions: BTreeMap<u32, VersionRecord>,
    pub(super) owner: Option<String>,
    pub(super) access: Access,
    /// Every version was unloaded while some still drained: the record goes when the last of
    /// them is freed (the name is then free again). A new load of the name clears it.
    pub(super) unloaded: bool,
}

impl ModelRecord {
    pub(super) fn visible_to(&self, caller: &Caller) -> bool {
        may_see(self.owner.as_deref(), &self.access, caller)
    }

    pub(super) fn holds_memory(&self) -> bool {
        self.versions.values().any(|v| v.state.holds_arena())
    }

    pub(super) fn held_bytes(&self) -> u64 {
        self.versions
            .values()
            .filter(|v| v.state.holds_arena())
            .map(VersionRecord::held_bytes)
            .sum()
    }

    pub(super) fn latest_ready(&self) -> Option<u32> {
        self.versions
            .iter()
            .rev()
            .find(|(_, v)| v.state == VersionState::Ready)
            .map(|(n, _)| *n)
    }

    /// The version an attach of "latest" (version 0) takes: the latest ready one; while none
    /// is ready, the latest loading one whose arena may be attached before it is (a device
    /// backend, whose ready event orders the worker's reads after the load).
    pub(super) fn latest_attachable(&self) -> Option<u32> {
        self.latest_ready().or_else(|| {
            self.versions
                .iter()
                .rev()
                .find(|(_, v)| {
                    v.state == VersionState::Loading
                        && v.arena.as_ref().is_some_and(|a| a.attach_while_loading())
                })
                .map(|(n, _)| *n)
        })
    }
}

#[derive(Debug)]
pub(super) struct SessionRecord {
    pub(super) tenant: Option<String>,
    pub(super) hello: WorkerHello,
    pub(super) opened_unix_ms: i64,
    /// The registry's event order when the session opened: it hears of later events only.
    pub(super) opened_seq: u64,
    pub(super) leases: Vec<String>,
    pub(super) revocation: Arc<Revocation>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) models: BTreeMap<String, ModelRecord>,
    pub(super) sessions: BTreeMap<String, SessionRecord>,
    pub(super) leases: Leases,
    /// Loads admitted and not yet reserved, by owner.
    pub(super) claims: super::claims::Claims,
    /// Bytes of arenas held or reserved.
    pub(super) arena_bytes: u64,
    /// Arenas held or reserved.
    pub(super) arenas: u32,
    pub(super) shutting_down: bool,
    /// Memory let go of while revoked workers may still map it.
    pub(super) orphans: Vec<super::types::Orphan>,
    /// Last orphan id handed out.
    pub(super) orphan_ids: u64,
    /// Orders version readiness against session openings.
    pub(super) event_seq: u64,
    /// Last model generation handed out.
    pub(super) generations: u64,
    /// What sections release, dropped right after the lock is.
    pub(super) graveyard: Graveyard,
}

impl Buries for State {
    fn graveyard(&mut self) -> &mut Graveyard {
        &mut self.graveyard
    }
}

impl State {
    /// The spelling under which the model `name` names is recorded: names are unique without
    /// regard to case (`All-MiniLM-L6-v2` is `all-minilm-l6-v2`), and shown as first loaded.
    pub(super) fn canonical(&self, name: &str) -> Option<&str> {
        if let Some((key, _)) = self.models.get_key_value(name) {
            return Some(key);
        }
        self.models
            .keys()
            .find(|k| k.eq_ignore_ascii_case(name))
            .map(String::as_str)
    }

    pub(super) fn version_mut(&mut self, model: &str, version: u32) -> Option<&mut VersionRecord> {
        self.models.get_mut(model)?.versions.get_mut(&version)
    }

    /// The version `key` names, if its model record is still that generation.
    pub(super) fn version_of(&mut self, key: &VersionKey) -> Option<&mut VersionRecord> {
        self.models
            .get_mut(&key.model)
            .filter(|m| m.generation == key.generation)?
            .versions
            .get_mut(&key.version)
    }

    /// Arena bytes, arenas and leases on each device that holds any (every model, whoever
    /// owns it).
    /// An arena several versions share counts once.
    pub(super) fn device_use(&self) -> BTreeMap<String, DeviceUse> {
        let mut out: BTreeMap<String, DeviceUse> = BTreeMap::new();
        let mut counted = std::collections::HashSet::new();
        for v in self.models.values().flat_map(|m| m.versions.values()) {
            // A load comparing its files with memory it may share needs no room on it.
            if v.state.holds_arena() && !(v.comparing && v.arena.is_none()) {
                for (device, arena, _) in v.arena_slots() {
                    // Reserved and not yet allocated counts; memory counted already does not.
                    if arena.is_some_and(|a| !counted.insert(a.id())) {
                        continue;
                    }
                    let u = out.entry(device.to_owned()).or_default();
                    u.arena_bytes += v.arena_bytes;
                    u.arenas += 1;
                }
            }
        }
        for l in self.leases.values() {
            if let Some(device) = &l.device {
                out.entry(device.clone()).or_default().leases += 1;
            }
        }
        out
    }

    /// The model `caller` may see, else NOT_FOUND (as if it did not exist: names do not leak).
    pub(super) fn visible_model(
        &self,
        caller: &Caller,
        model: &str,
    ) -> Result<&ModelRecord, CoreError> {
        self.models
            .get(model)
            .filter(|rec| rec.visible_to(caller))
            .ok_or_else(|| CoreError::ModelNotFound(model.to_owned()))
    }

    /// `caller`'s session, else NOT_FOUND (another tenant's session is not shown to exist).
    pub(super) fn own_session(
        &self,
        caller: &Caller,
        session: &str,
    ) -> Result<&SessionRecord, CoreError> {
        self.sessions
            .get(session)
            .filter(|s| may_use_session(s.tenant.as_deref(), caller))
            .ok_or_else(|| CoreError::SessionNotFound(session.to_owned()))
    }

    /// What `tenant` uses, computed from the records (so it cannot drift from them).
    pub(super) fn usage(&self, tenant: &str) -> Usage {
        let mut u = Usage::default();
        for rec in self
            .models
            .values()
            .filter(|r| r.owner.as_deref() == Some(tenant))
        {
            u.device_bytes += rec.held_bytes();
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
        for s in self
            .sessions
            .values()
            .filter(|s| s.tenant.as_deref() == Some(tenant))
        {
            u.sessions += 1;
            u.leases += u32::try_from(s.leases.len()).unwrap_or(u32::MAX);
        }
        u
    }

    /// The owner a load of `model` gets, and whether it makes a model hold memory anew;
    /// refuses a caller that may not load it.
    pub(super) fn resolve_owner(
        &self,
        caller: &Caller,
        load_for: &LoadFor,
        model: &str,
    ) -> Result<(Option<String>, bool), CoreError> {
        Ok(match self.models.get(model) {
            Some(rec) => {
                if !rec.visible_to(caller) {
                    return Err(CoreError::NameTaken(model.to_owned()));
                }
                if !owns(rec.owner.as_deref(), caller) {
                    return Err(CoreError::PermissionDenied(format!(
                        "model '{model}' belongs to {}; only its owner may load versions of it",
                        owner_text(rec.owner.as_deref())
                    )));
                }
                if let Some(requested) = &load_for.requested_owner
                    && rec.owner.as_deref() != Some(requested.as_str())
                {
                    return Err(CoreError::PermissionDenied(format!(
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
}

/// `version` (of a model owned by `owner`) as reported; `holders` says who holds the arenas
/// several versions hold ([`State::holders`]).
pub(super) fn snapshot_version(
    version: u32,
    v: &VersionRecord,
    owner: Option<&str>,
    holders: &Holders,
) -> VersionSnapshot {
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
        device: v.device.clone(),
        replicas: v
            .replicas
            .iter()
            .map(|r| (r.device.clone(), r.ready))
            .collect(),
        shares_memory: v.state.holds_arena()
            && v.arena
                .as_ref()
                .is_some_and(|a| holders.shared_for(a, owner)),
        content_sha256: v.content_sha256,
    }
}

pub(super) fn snapshot_model(name: &str, rec: &ModelRecord, holders: &Holders) -> ModelSnapshot {
    ModelSnapshot {
        owner: rec.owner.clone(),
        access: rec.access.clone(),
        name: name.to_owned(),
        latest_ready: rec.latest_ready().unwrap_or(0),
        versions: rec
            .versions
            .iter()
            .map(|(n, v)| snapshot_version(*n, v, rec.owner.as_deref(), holders))
            .collect(),
    }
}
