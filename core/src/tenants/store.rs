//! The tenant table in force, swapped whole on reload, and per-tenant in-flight counters.
//!
//! A reload replaces the table for calls that arrive afterwards; calls already past
//! authentication, and open session streams, keep the identity they were admitted with. A
//! failed reload leaves the old table in force.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use super::file::{Holder, TenantTable};
use super::quota::Quota;
use super::token::TokenHash;
use crate::error::TenantsFileError;

/// The tenant table in force.
#[derive(Debug)]
pub struct TenantStore {
    file: Option<PathBuf>,
    table: RwLock<Arc<TenantTable>>,
    inflight: Mutex<HashMap<String, Arc<AtomicU32>>>,
}

impl TenantStore {
    /// Reads `file` (none: authentication off, every caller is the admin).
    pub fn open(file: Option<&Path>) -> Result<Self, TenantsFileError> {
        let table = match file {
            Some(f) => TenantTable::load(f)?,
            None => TenantTable::default(),
        };
        Ok(Self {
            file: file.map(Path::to_owned),
            table: RwLock::new(Arc::new(table)),
            inflight: Mutex::new(HashMap::new()),
        })
    }

    /// Whether tenants are configured (authentication is on).
    pub fn enabled(&self) -> bool {
        self.file.is_some()
    }

    /// The tenants file, if any.
    pub fn file(&self) -> Option<&Path> {
        self.file.as_deref()
    }

    /// The table in force.
    pub fn current(&self) -> Arc<TenantTable> {
        self.table.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Reads the file again and puts it in force. `Ok(None)` when no file is configured.
    pub fn reload(&self) -> Result<Option<Arc<TenantTable>>, TenantsFileError> {
        let Some(file) = &self.file else {
            return Ok(None);
        };
        let table = Arc::new(TenantTable::load(file)?);
        *self.table.write().unwrap_or_else(|e| e.into_inner()) = table.clone();
        Ok(Some(table))
    }

    /// Who `token` belongs to, under the table in force.
    pub fn authenticate(&self, token: &str) -> Option<Holder> {
        self.current().holder(&TokenHash::of(token)).cloned()
    }

    /// The quota of tenant `name` under the table in force.
    pub fn quota_of(&self, name: &str) -> Option<Quota> {
        self.current().tenants.get(name).map(|t| t.quota)
    }

    /// The in-flight counter of tenant `name` (kept across reloads).
    pub fn inflight_counter(&self, name: &str) -> Arc<AtomicU32> {
        let mut map = self.inflight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = map.get(name) {
            return c.clone();
        }
        map.entry(name.to_owned()).or_default().clone()
    }

    /// Requests of tenant `name` being served now.
    pub fn inflight(&self, name: &str) -> u32 {
        self.inflight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenants::caller::Caller;

    fn write(dir: &Path, text: &str) -> PathBuf {
        let p = dir.join("tenants.toml");
        std::fs::write(&p, text).expect("write");
        p
    }

    #[test]
    fn tokens_resolve_to_their_tenant_and_reload_replaces_them() {
        let dir = tempfile::tempdir().expect("tmp");
        let text = |a: &str| {
            format!(
                "[admin]\ntoken_hashes = [\"{}\"]\n[[tenants]]\nname = \"a\"\ntoken_hashes = [\"{}\"]\n[tenants.quota]\nleases = 3\n",
                TokenHash::of("root"),
                TokenHash::of(a)
            )
        };
        let path = write(dir.path(), &text("ta"));
        let store = TenantStore::open(Some(&path)).expect("open");
        assert!(store.enabled());
        assert_eq!(
            store.authenticate("root").expect("admin").caller,
            Caller::Admin
        );
        let a = store.authenticate("ta").expect("tenant");
        assert_eq!(a.caller.tenant(), Some("a"));
        assert_eq!(store.quota_of("a").expect("a").leases, Some(3));
        assert!(store.authenticate("nope").is_none());
        assert!(store.authenticate("").is_none());

        write(dir.path(), &text("ta2"));
        store.reload().expect("reload");
        assert!(store.authenticate("ta").is_none(), "the old token is gone");
        assert!(store.authenticate("ta2").is_some());

        // A broken file leaves the table in force.
        write(dir.path(), "[[tenants]]\nname = \"BAD\"");
        assert!(store.reload().is_err());
        assert!(store.authenticate("ta2").is_some());
    }

    #[test]
    fn without_a_file_there_is_nothing_to_reload() {
        let store = TenantStore::open(None).expect("open");
        assert!(!store.enabled());
        assert!(store.reload().expect("no-op").is_none());
        assert!(store.authenticate("anything").is_none());
    }
}
