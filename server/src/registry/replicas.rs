//! A version's replicas on further devices: reserved with the load (see
//! [`Registry::reserve`]), then each given its arena, marked ready once copied, or dropped when
//! its copy fails. A version freed meanwhile has no replicas left: the copy's arena is then
//! refused, and the copier lets it go.

use modelshare_device::ArenaHandle;

use super::Registry;

impl Registry {
    /// Hands in the arena allocated for the replica of `model`@`version` on `device`. `false`
    /// when that replica is no longer on record (the version ended, or the replica was
    /// dropped): the caller drops the arena.
    pub fn set_replica_arena(
        &self,
        model: &str,
        version: u32,
        device: &str,
        arena: ArenaHandle,
    ) -> bool {
        let mut st = self.lock();
        let Some(v) = st.version_mut(model, version) else {
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

    /// The version's first arena was adopted on `device` (memory a worker kept): that device
    /// becomes its first, and the replicas go to the other devices placed (as many as were
    /// reserved). Returns the replicas' devices, to copy to.
    pub fn adopted_on(&self, model: &str, version: u32, device: &str) -> Vec<String> {
        let mut st = self.lock();
        let Some(v) = st.version_mut(model, version) else {
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

    /// The replica on `device` is copied, checked and sealed.
    pub fn replica_ready(&self, model: &str, version: u32, device: &str) {
        let mut st = self.lock();
        if let Some(r) = st
            .version_mut(model, version)
            .and_then(|v| v.replicas.iter_mut().find(|r| r.device == device))
        {
            r.ready = true;
        }
    }

    /// Gives up the replica on `device` (its copy failed): its arena and its bytes go. Workers
    /// holding a lease on it keep their mapping (or, legacy handles, lose it with the arena).
    pub fn drop_replica(&self, model: &str, version: u32, device: &str) {
        let mut st = self.lock();
        let Some(v) = st.version_mut(model, version) else {
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
