//! Tenants: who a bearer token belongs to, what it may see and how much it may use.
//!
//! - [`token`]: token generation, hashing and constant-time checking.
//! - [`file`]: the tenants file (TOML): tenants, their token hashes, uids and quotas; the admin
//!   tokens. Parsed and validated into a [`TenantTable`].
//! - [`store`]: the table in force, swapped whole on reload (SIGHUP or `ReloadTenants`), and the
//!   per-tenant in-flight counters that outlive reloads.
//! - [`auth`]: the tower layer that turns `authorization: Bearer <token>` into a [`Caller`] in
//!   the request's extensions, checks Unix peer uids and counts requests in flight.
//!
//! Without a tenants file every caller is [`Caller::Admin`]: authentication is off, as it was
//! before tenants existed (the server logs a warning).

pub mod auth;
pub mod file;
pub mod store;
pub mod token;

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::error::ServerError;

pub use file::{TenantSpec, TenantTable};
pub use store::TenantStore;

/// Limits of one tenant; `None` is unlimited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Quota {
    /// Arena bytes of the models the tenant owns (loading, ready and draining versions).
    pub device_bytes: Option<u64>,
    /// Models the tenant owns that hold memory.
    pub models: Option<u32>,
    /// Open worker sessions.
    pub sessions: Option<u32>,
    /// Leases held by the tenant's sessions.
    pub leases: Option<u32>,
    /// Requests handled at once, each up to its response head (session streams not counted).
    pub inflight: Option<u32>,
    /// Loads of its models running at once (the server's `max_concurrent_loads` is shared).
    pub loads: Option<u32>,
}

/// What a quota limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// Arena bytes of owned models.
    DeviceBytes,
    /// Owned models holding memory.
    Models,
    /// Open sessions.
    Sessions,
    /// Leases held.
    Leases,
    /// Requests in flight.
    Inflight,
    /// Loads running.
    Loads,
}

impl Resource {
    /// The quota's name, as in the tenants file and in errors.
    pub fn name(self) -> &'static str {
        match self {
            Resource::DeviceBytes => "device_bytes",
            Resource::Models => "models",
            Resource::Sessions => "sessions",
            Resource::Leases => "leases",
            Resource::Inflight => "inflight",
            Resource::Loads => "loads",
        }
    }
}

impl Quota {
    /// The limit on `r` (`None`: unlimited).
    pub fn limit(&self, r: Resource) -> Option<u64> {
        match r {
            Resource::DeviceBytes => self.device_bytes,
            Resource::Models => self.models.map(u64::from),
            Resource::Sessions => self.sessions.map(u64::from),
            Resource::Leases => self.leases.map(u64::from),
            Resource::Inflight => self.inflight.map(u64::from),
            Resource::Loads => self.loads.map(u64::from),
        }
    }

    /// Refuses `requested` more of `r` for `tenant`, which uses `used`, when the sum would
    /// pass the limit.
    pub fn check(
        &self,
        tenant: &str,
        r: Resource,
        used: u64,
        requested: u64,
    ) -> Result<(), ServerError> {
        match self.limit(r) {
            Some(limit) if used.saturating_add(requested) > limit => {
                Err(ServerError::QuotaExceeded {
                    tenant: tenant.to_owned(),
                    quota: r.name(),
                    limit,
                    used,
                    requested,
                })
            }
            _ => Ok(()),
        }
    }
}

/// Who is calling: the admin, or a tenant (with its quota as it stood when the call arrived).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// An admin token, or any caller when no tenants are configured: sees and may do everything.
    Admin,
    /// A tenant's token.
    Tenant {
        /// Tenant name.
        name: Arc<str>,
        /// Its quota.
        quota: Quota,
    },
}

impl Caller {
    /// The tenant's name (`None` for the admin).
    pub fn tenant(&self) -> Option<&str> {
        match self {
            Caller::Admin => None,
            Caller::Tenant { name, .. } => Some(name),
        }
    }

    /// Whether this is the admin.
    pub fn is_admin(&self) -> bool {
        matches!(self, Caller::Admin)
    }

    /// How the caller is named in logs and errors: `admin` or `tenant 'x'`.
    pub fn describe(&self) -> String {
        match self {
            Caller::Admin => "admin".into(),
            Caller::Tenant { name, .. } => format!("tenant '{name}'"),
        }
    }
}

/// Who besides its owner may see and attach a model.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// Tenants it is shared with.
    pub shared_with: BTreeSet<String>,
    /// Visible to every tenant.
    pub public: bool,
}

impl Access {
    /// Whether `caller` may see a model with this access owned by `owner`.
    pub fn visible_to(&self, owner: Option<&str>, caller: &Caller) -> bool {
        match caller {
            Caller::Admin => true,
            Caller::Tenant { name, .. } => {
                self.public || owner == Some(&**name) || self.shared_with.contains(&**name)
            }
        }
    }
}

/// Whether `caller` owns a model owned by `owner` (the admin owns everything).
pub fn owns(owner: Option<&str>, caller: &Caller) -> bool {
    match caller {
        Caller::Admin => true,
        Caller::Tenant { name, .. } => owner == Some(&**name),
    }
}
