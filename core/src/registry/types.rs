//! The registry's public data: what it is asked and what it answers. Plain values, no lock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, OnceLock};

use modelshare_device::ArenaHandle;
use tokio_util::sync::CancellationToken;

use crate::model::{Manifest, VersionState};
use crate::tenants::Access;

/// Limits the registry enforces.
#[derive(Debug, Clone)]
pub struct RegistryLimits {
    /// Largest arena one version may have.
    pub max_model_bytes: Option<u64>,
    /// Most arena bytes held at once, over all versions.
    pub max_total_bytes: Option<u64>,
    /// Most arena bytes held at once on one device (placement picks devices under it; the
    /// reservation checks it again under the lock, for loads placed at the same time).
    pub max_device_bytes: Option<u64>,
    /// Most open sessions.
    pub max_sessions: usize,
    /// Most leases one session may hold.
    pub max_leases_per_session: usize,
    /// Most unredeemed tickets (open descriptors) per session, per tenant and in all.
    pub tickets: super::TicketLimits,
}

impl Default for RegistryLimits {
    fn default() -> Self {
        Self {
            max_model_bytes: None,
            max_total_bytes: None,
            max_device_bytes: None,
            max_sessions: 4096,
            max_leases_per_session: 1024,
            tickets: super::TicketLimits::default(),
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

/// A load that has been admitted: its version number and bytes are reserved; its arena is
/// allocated next, outside the registry's lock ([`super::Registry::set_arena`]).
#[derive(Debug)]
pub struct Reservation {
    /// Model name.
    pub model: String,
    /// Version number assigned.
    pub version: u32,
    /// The model record's generation (see [`VersionKey`]).
    pub generation: u64,
    /// Shared progress.
    pub progress: Arc<LoadProgress>,
    /// The manifest as planned, with its version (checksums still zero).
    pub manifest: Manifest,
    /// The device the arena goes on (UUID).
    pub device: String,
}

impl Reservation {
    /// The version reserved, told apart from a later load's of the same name and number.
    pub fn key(&self) -> VersionKey {
        VersionKey {
            model: self.model.clone(),
            generation: self.generation,
            version: self.version,
        }
    }
}

/// One version of one model record. A name unloaded and loaded again starts its versions over
/// under a new generation, so the name and number alone may name a later load's version: work
/// that outlives a request (a replica's copy) names its version by key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionKey {
    /// Model name.
    pub model: String,
    /// The model record's generation.
    pub generation: u64,
    /// Version number.
    pub version: u32,
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
    /// The device its arena is on (UUID).
    pub device: String,
    /// Its replicas' devices, each with whether its copy is done.
    pub replicas: Vec<(String, bool)>,
    /// Its arena is also another version's (loads of the same bytes share one memory).
    pub shares_memory: bool,
    /// SHA-256 of its tensors' bytes in arena order, where computed (a load that compared
    /// its files with memory it then shared).
    pub content_sha256: Option<[u8; 32]>,
}

impl VersionSnapshot {
    /// Its content digest as reported: `sha256:<64 hex digits>`, where computed.
    pub fn content_sha256_text(&self) -> Option<String> {
        self.content_sha256
            .map(|d| format!("sha256:{}", hex::encode(d)))
    }
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
    /// The number a version brought back after a restart had (its memory adopted from a
    /// worker), taken if the model's numbering has not passed it.
    pub resume_version: Option<u32>,
    /// The load brings back a version whose memory was adopted: it takes that memory or
    /// fails; it never reads the files (which may have changed since).
    pub only_adopted: bool,
    /// Where it goes (several devices).
    pub placement: crate::placement::Wanted,
}

/// What one device holds of the registry's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceUse {
    /// Arena bytes (loading, ready, draining versions).
    pub arena_bytes: u64,
    /// Arenas.
    pub arenas: u32,
    /// Leases on them.
    pub leases: u32,
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

/// Registry-wide figures (the device's own figures come from its device thread).
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
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
    /// The pid the kernel reports for the session's Unix-socket peer, in the server's pid
    /// namespace (none over TCP).
    pub peer_pid: Option<u32>,
    /// That process's start time (see [`crate::held::Holder`]), read when the session opened.
    pub peer_start: Option<u64>,
}

/// Memory the server let go of while workers may still map it: a version force-unloaded (its
/// sessions revoked) on a kind whose mappings keep the memory alive. Counted as held by
/// workers, and against `max_total_bytes`, until none of the processes lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Orphan {
    /// Distinguishes orphans of the same version number.
    pub id: u64,
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: u32,
    /// The arena's bytes.
    pub bytes: u64,
    /// The device it is on.
    pub device: String,
    /// The worker processes that held leases on it when their sessions were revoked.
    pub holders: Vec<crate::held::Holder>,
    /// The arena ([`modelshare_device::ArenaHandle::id`]), while another version may still
    /// hold it (a load of the same bytes shared it): then the memory is that version's, not
    /// only the workers'.
    pub(crate) arena: usize,
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
    pub leases: Vec<(String, String, u32, String)>,
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

    pub(super) fn revoke(&self, reason: String) {
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
    pub arena: ArenaHandle,
    /// Whether the version was still loading (attached ahead of its ready event).
    pub loading: bool,
    /// The device the arena is on (UUID).
    pub device: String,
}
