//! One arena for versions that hold the same bytes: finding a version whose memory a load
//! may take instead of a copy of its own ([`Registry::arenas_to_share`]), and handing that
//! memory to the new version once its files compared equal to it ([`Registry::share_arena`]).
//!
//! A shared arena is one memory under two names: each version keeps its own owner, access,
//! leases and life, and each owner's quota counts the full size; the memory goes when the
//! last version holding it (and the last worker's mapping) does.

use std::collections::HashMap;
use std::sync::Arc;

use modelshare_device::ArenaHandle;

use super::Registry;
use super::holders::Holders;
use super::state::{State, VersionRecord};
use super::types::{LoadFor, VersionKey};
use crate::error::CoreError;
use crate::model::{Manifest, VersionState};
use crate::tenants::policy::{ShareIdentical, may_change_access, may_share_memory};
use crate::tenants::{Access, Caller};

/// The memory of a ready version that a load of the same layout may share, once its files
/// compare equal to these bytes.
#[derive(Debug, Clone)]
pub struct SharedArena {
    /// The version that holds it.
    pub holder: VersionKey,
    /// The device it is on (UUID).
    pub device: String,
    /// The arena.
    pub arena: ArenaHandle,
    /// The holder's manifest (its checksums are the new version's too when the bytes are
    /// equal).
    pub manifest: Arc<Manifest>,
}

impl Registry {
    /// The ready versions' arenas that a load of `manifest` (by `caller`, for `load_for`) may
    /// share under `rule`: the same tensors at the same offsets, on `device` where one is
    /// given, and allowed by [`may_share_memory`] between the new version's owner and the
    /// holder's; one per arena. None where the load would be refused anyway (its reservation
    /// then says why).
    pub fn arenas_to_share(
        &self,
        caller: &Caller,
        load_for: &LoadFor,
        manifest: &Manifest,
        rule: ShareIdentical,
        device: Option<&str>,
    ) -> Vec<SharedArena> {
        let mut found: Vec<SharedArena> = Vec::new();
        if rule == ShareIdentical::Off {
            return found;
        }
        let st = self.lock();
        let Ok((owner, _)) = st.resolve_owner(caller, load_for, &manifest.model) else {
            return found;
        };
        let access = st.access_after_load(load_for, &manifest.model);
        for (name, rec) in &st.models {
            for (number, v) in &rec.versions {
                if v.state != VersionState::Ready || !same_layout(&v.manifest, manifest) {
                    continue;
                }
                for (on, arena, copied) in v.arena_slots() {
                    let Some(arena) = arena.filter(|_| copied) else {
                        continue;
                    };
                    if device.is_some_and(|d| !d.eq_ignore_ascii_case(on)) {
                        continue;
                    }
                    if !may_share_memory(
                        rule,
                        (owner.as_deref(), &access),
                        (rec.owner.as_deref(), &rec.access),
                        arena.kind().immutable_to_workers(),
                    ) {
                        continue;
                    }
                    if found.iter().any(|f| f.arena.same_arena(arena)) {
                        continue;
                    }
                    found.push(SharedArena {
                        holder: VersionKey {
                            model: name.clone(),
                            generation: rec.generation,
                            version: *number,
                        },
                        device: on.to_owned(),
                        arena: arena.clone(),
                        manifest: v.manifest.clone(),
                    });
                }
            }
        }
        found
    }

    /// Hands `shared`'s arena to the loading version `model`@`version`, whose files compared
    /// equal to it (their SHA-256 `sha256`), if `rule` still allows it between the two models
    /// as they stand now (their access may have changed during the comparison) and the holder
    /// still holds it; false otherwise (the load then copies). The digest is recorded on the
    /// new version, and on the holder where both have one owner. The load is then finished as
    /// any other ([`Registry::finish_load`]).
    pub fn share_arena(
        &self,
        model: &str,
        version: u32,
        shared: &SharedArena,
        sha256: [u8; 32],
        rule: ShareIdentical,
    ) -> bool {
        let mut st = self.lock();
        let Some(rec) = st.models.get(model) else {
            return false;
        };
        let new = (rec.owner.clone(), rec.access.clone());
        let Some(holder) = st
            .models
            .get(&shared.holder.model)
            .filter(|m| m.generation == shared.holder.generation)
        else {
            return false;
        };
        let still_held = holder
            .versions
            .get(&shared.holder.version)
            .is_some_and(|v| {
                v.state.holds_arena()
                    && v.arena
                        .as_ref()
                        .is_some_and(|a| a.same_arena(&shared.arena))
            });
        let allowed = may_share_memory(
            rule,
            (new.0.as_deref(), &new.1),
            (holder.owner.as_deref(), &holder.access),
            shared.arena.kind().immutable_to_workers(),
        );
        if !still_held || !allowed {
            return false;
        }
        let same_owner = holder.owner == new.0;
        if same_owner && let Some(v) = st.version_of(&shared.holder) {
            v.content_sha256 = Some(sha256);
        }
        let Some(v) = st.version_mut(model, version) else {
            return false;
        };
        v.arena = Some(shared.arena.clone());
        v.content_sha256 = Some(sha256);
        v.comparing = false;
        true
    }
}

impl Registry {
    /// Refuses a loading version that was to share memory and copies after all when its
    /// device's arenas, its own bytes counted, are past `max_device_bytes` (the check its
    /// reservation skipped).
    pub fn device_room_now(&self, model: &str, version: u32) -> Result<(), CoreError> {
        let mut st = self.lock();
        let Some(v) = st.version_mut(model, version) else {
            return Ok(());
        };
        // It copies: its bytes count on its device from now on, itself included here.
        v.comparing = false;
        let device = v.device.clone();
        st.device_room(
            std::iter::once(device.as_str()),
            0,
            self.limits.max_device_bytes,
        )
    }
}

impl State {
    /// Who holds each arena that more than one version holding memory holds.
    pub(super) fn holders(&self) -> Holders {
        let mut all: HashMap<usize, Vec<(Option<String>, Access)>> = HashMap::new();
        for rec in self.models.values() {
            for v in rec.versions.values() {
                for a in v.held_arenas() {
                    all.entry(a.id())
                        .or_default()
                        .push((rec.owner.clone(), rec.access.clone()));
                }
            }
        }
        all.retain(|_, holders| holders.len() > 1);
        Holders::new(all)
    }

    /// The access a model has once `load_for` loads a version of it: the access it asks for,
    /// else the model's, else private.
    pub(super) fn access_after_load(&self, load_for: &LoadFor, model: &str) -> Access {
        load_for
            .access
            .clone()
            .or_else(|| self.models.get(model).map(|r| r.access.clone()))
            .unwrap_or_default()
    }

    /// Refuses `access` for `model` where one of its versions' memory is also held by a
    /// version of another model that callers would then attach differently (device memory,
    /// which a worker could write: see `tenants::policy`).
    pub(super) fn access_keeps_sharing(
        &self,
        model: &str,
        access: &Access,
    ) -> Result<(), CoreError> {
        let Some(rec) = self.models.get(model) else {
            return Ok(());
        };
        let mine: Vec<&ArenaHandle> = rec
            .versions
            .values()
            .flat_map(VersionRecord::held_arenas)
            .collect();
        for (_, other) in self
            .models
            .iter()
            .filter(|(name, _)| name.as_str() != model)
        {
            let shared = other
                .versions
                .values()
                .flat_map(VersionRecord::held_arenas)
                .find(|a| mine.iter().any(|m| m.same_arena(a)));
            if let Some(arena) = shared
                && !may_change_access(
                    arena.kind().immutable_to_workers(),
                    (rec.owner.as_deref(), access),
                    (other.owner.as_deref(), &other.access),
                )
            {
                return Err(CoreError::SharedMemory(model.to_owned()));
            }
        }
        Ok(())
    }
}

/// Whether `a` and `b` place the same tensors (name, dtype, shape) at the same offsets in
/// arenas of one size: what two loads of identical files have in common before a byte of
/// their data is read.
fn same_layout(a: &Manifest, b: &Manifest) -> bool {
    a.arena_bytes == b.arena_bytes
        && a.alignment == b.alignment
        && a.tensors.len() == b.tensors.len()
        && a.tensors.iter().zip(&b.tensors).all(|(x, y)| {
            x.name == y.name
                && x.dtype == y.dtype
                && x.shape == y.shape
                && x.offset == y.offset
                && x.byte_length == y.byte_length
        })
}
