//! A version's replicas on further devices: reserved with the load (see
//! [`Registry::reserve`]), then each given its arena, marked ready once copied, or dropped when
//! its copy fails. A version freed meanwhile has no replicas left: the copy's arena is then
//! refused, and the copier lets it go.
//!
//! A copy outlives the request that started it, so every call names its version by
//! [`VersionKey`]: a name unloaded and loaded again while a copy ran is another record, which
//! the old copy neither fills nor marks ready nor drops from.

use std::sync::Arc;

use modelshare_device::ArenaHandle;

use super::{Registry, VersionKey};
use crate::error::CoreError;
use crate::model::{Manifest, VersionState};
use crate::tenants::{Caller, Quota, Resource};

/// What a worker's attach from a device without the version gets (`replicate_on_attach`):
/// see [`Registry::add_replica`].
#[derive(Debug)]
pub enum ReplicaOnAttach {
    /// A replica is reserved there: copy `source`, the version's first arena, to it, as for
    /// any replica (`replicate::copy_all`), and tell the worker to retry.
    Copy {
        /// The version.
        key: VersionKey,
        /// Its first arena.
        source: ArenaHandle,
    },
    /// The device holds the version already, a copy there is under way, or the version is
    /// still loading (a copy follows once it is ready): the worker retries.
    Pending,
    /// The version is ending (draining, freed, failed): no copy is made.
    Refused,
}

impl Registry {
    /// Hands in the arena allocated for the replica of `key` on `device`. `false` when that
    /// replica is no longer on record (the version ended, or the replica was dropped): the
    /// caller drops the arena.
    pub fn set_replica_arena(&self, key: &VersionKey, device: &str, arena: ArenaHandle) -> bool {
        let mut st = self.lock();
        let Some(v) = st.version_of(key) else {
            return false;
        };
        if !v.state.holds_arena() {
            return false;
        }
        match v.replicas.iter_mut().find(|r| r.device == device) {
            Some(r) => {
                r.arena = Some(arena);
                true
            }
            None => false,
        }
    }

    /// Reserves a further replica of `model`@`version` (0: the latest ready) on `device` for a
    /// worker of `caller` that attached from there, holding none (`replicate_on_attach`): a
    /// ready version `caller` may see, within the device's `max_device_bytes`,
    /// `max_total_bytes` and the model owner's `device_bytes` quota (a replica is the owner's
    /// memory, whoever's worker asked for it).
    pub fn add_replica(
        &self,
        caller: &Caller,
        model: &str,
        version: u32,
        device: &str,
        quota_of: &dyn Fn(&str) -> Quota,
    ) -> Result<ReplicaOnAttach, CoreError> {
        let mut st = self.lock();
        let rec = st.visible_model(caller, model)?;
        let (generation, owner) = (rec.generation, rec.owner.clone());
        let version = match version {
            0 => match rec.latest_ready() {
                Some(v) => v,
                None => return Ok(ReplicaOnAttach::Pending),
            },
            v => v,
        };
        let key = VersionKey {
            model: model.to_owned(),
            generation,
            version,
        };
        let v = st
            .version_of(&key)
            .ok_or_else(|| CoreError::VersionNotFound {
                model: model.to_owned(),
                version,
            })?;
        let there = v.arena_on(Some(device)).is_ok();
        match v.state {
            _ if there => return Ok(ReplicaOnAttach::Pending),
            VersionState::Loading => return Ok(ReplicaOnAttach::Pending),
            VersionState::Ready => {}
            VersionState::Draining | VersionState::Freed | VersionState::Failed => {
                return Ok(ReplicaOnAttach::Refused);
            }
        }
        let (bytes, source) = (v.arena_bytes, v.arena.clone());
        let Some(source) = source else {
            return Ok(ReplicaOnAttach::Pending);
        };
        st.device_room(std::iter::once(device), bytes, self.limits.max_device_bytes)?;
        st.total_room(bytes, self.limits.max_total_bytes)?;
        if let Some(owner) = &owner {
            let used = st.usage(owner).device_bytes;
            quota_of(owner).check(owner, Resource::DeviceBytes, used, bytes)?;
        }
        let Some(v) = st.version_of(&key) else {
            return Err(CoreError::Internal("version record vanished".into()));
        };
        v.replicas.push(super::state::ReplicaRecord {
            device: device.to_owned(),
            arena: None,
            ready: false,
        });
        st.arena_bytes = st.arena_bytes.saturating_add(bytes);
        st.arenas = st.arenas.saturating_add(1);
        Ok(ReplicaOnAttach::Copy { key, source })
    }

    /// The manifest a replica of `key` is checked against: the ready version's, with the
    /// checksums its load computed. `None` when the version is gone or not ready.
    pub fn replica_manifest(&self, key: &VersionKey) -> Option<Arc<Manifest>> {
        let mut st = self.lock();
        let v = st.version_of(key)?;
        v.state.holds_arena().then(|| v.manifest.clone())
    }

    /// The version's first arena was adopted on `device` (memory a worker kept): that device
    /// becomes its first, and the replicas go to the other devices placed (as many as were
    /// reserved). Returns the replicas' devices, to copy to.
    pub fn adopted_on(&self, key: &VersionKey, device: &str) -> Vec<String> {
        let mut st = self.lock();
        let Some(v) = st.version_of(key) else {
            return Vec::new();
        };
        let first = std::mem::replace(&mut v.device, device.to_owned());
        let mut targets: Vec<String> = std::iter::once(first)
            .chain(v.replicas.iter().map(|r| r.device.clone()))
            .filter(|d| d != device)
            .collect();
        targets.truncate(v.replicas.len());
        v.replicas = targets
            .iter()
            .map(|d| super::state::ReplicaRecord {
                device: d.clone(),
                arena: None,
                ready: false,
            })
            .collect();
        targets
    }

    /// The replica of `key` on `device` is copied, checked and sealed. `false` when it is no
    /// longer on record (the version ended, or was replaced by a later load of the name).
    pub fn replica_ready(&self, key: &VersionKey, device: &str) -> bool {
        let mut st = self.lock();
        let Some(r) = st
            .version_of(key)
            .and_then(|v| v.replicas.iter_mut().find(|r| r.device == device))
        else {
            return false;
        };
        r.ready = true;
        true
    }

    /// Gives up the replica of `key` on `device` (its copy failed, `reason`): the sessions
    /// that attached to it while it was copied are ended (their workers would compute on what
    /// the failed copy left; on reconnecting they are told which devices hold the version),
    /// then its arena and its bytes go. The version stays on its other devices.
    pub fn drop_replica(&self, key: &VersionKey, device: &str, reason: &str) {
        let mut st = self.lock();
        let VersionKey { model, version, .. } = key;
        let holds = |v: &super::state::VersionRecord| v.replicas.iter().any(|r| r.device == device);
        if !st.version_of(key).is_some_and(|v| holds(v)) {
            return;
        }
        st.revoke_holders_on(
            model,
            *version,
            Some(device),
            &format!(
                "the copy of version {version} of '{model}' to device {device} failed: {reason}"
            ),
        );
        // Ending those sessions may have freed the version (draining, its last lease gone),
        // replicas and all.
        let Some(v) = st.version_of(key) else {
            return;
        };
        let Some(i) = v.replicas.iter().position(|r| r.device == device) else {
            return;
        };
        let bytes = v.arena_bytes;
        let replica = v.replicas.remove(i);
        if let Some(arena) = replica.arena {
            st.graveyard.arena(arena);
        }
        st.arena_bytes = st.arena_bytes.saturating_sub(bytes);
        st.arenas = st.arenas.saturating_sub(1);
    }
}
