//! Tenant quotas: [`Quota`], the [`Resource`]s it limits, and the check every limited call
//! makes.

use crate::error::CoreError;

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
    /// Inference requests queued or in flight at once, each for its whole life (the server's
    /// `max_tenant_requests` when unset).
    pub requests: Option<u32>,
    /// Loads of its models running at once (the server's `max_concurrent_loads` is shared).
    pub loads: Option<u32>,
    /// The most tokens one generation request may ask (`max_tokens`); a request naming none
    /// asks this many.
    pub max_tokens: Option<u32>,
    /// The most prompt tokens of one generation request (the worker, which tokenizes, refuses
    /// a longer prompt).
    pub prompt_tokens: Option<u32>,
    /// The most stop strings one generation request may send (the server's own limit, 4,
    /// applies to every caller).
    pub stop_strings: Option<u32>,
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
    ) -> Result<(), CoreError> {
        match self.limit(r) {
            Some(limit) if used.saturating_add(requested) > limit => {
                Err(CoreError::QuotaExceeded {
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
