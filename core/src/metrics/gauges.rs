//! [`GaugeValues`]: what the gauges show, as plain data. Whoever owns the state gathers it at
//! each scrape (the HTTP layer, from the model registry) and hands it to
//! [`super::Metrics::refresh`], so metrics know nothing of the registry or of tenants.

/// The values of every gauge at one scrape.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GaugeValues {
    /// Versions per state label (`loading`, `ready`, ...), every state present, zero included.
    pub versions_by_state: Vec<(&'static str, u32)>,
    /// Arena bytes held, per model and device; models holding none are left out.
    pub arena_bytes: Vec<ArenaBytes>,
    /// Model names on record.
    pub models: u32,
    /// Open sessions and leases held, per tenant.
    pub tenants: Vec<TenantGauges>,
    /// Memory of each device arenas live on.
    pub devices: Vec<DeviceMemory>,
    /// Bytes of versions from before a restart that only workers may hold now (not yet
    /// adopted), per model and device.
    pub held_by_workers: Vec<ArenaBytes>,
}

/// Arena bytes one model holds on one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArenaBytes {
    /// Model name.
    pub model: String,
    /// The device's UUID (`host` on the host backend).
    pub device: String,
    /// Bytes held by its loading, ready and draining versions.
    pub bytes: u64,
}

/// Sessions and leases of one tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantGauges {
    /// Tenant name; empty for the admin, or when no tenants are configured.
    pub tenant: String,
    /// Open worker sessions.
    pub sessions: u32,
    /// Leases its sessions hold.
    pub leases: u32,
}

/// Memory of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMemory {
    /// The device's UUID (`host` on the host backend).
    pub device: String,
    /// Its memory (host: MemTotal).
    pub total_bytes: u64,
    /// In use as the device reports it (CUDA); arena bytes where it reports nothing (host).
    pub used_bytes: u64,
    /// How its arenas are shared with workers: `cuda-vmm`, `cuda-ipc` or `host`.
    pub handles: &'static str,
}
