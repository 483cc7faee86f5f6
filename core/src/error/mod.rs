//! The server's error type. Every failure a client can cause or see is one of these variants;
//! [`crate::service::status`] maps each to a gRPC status code, in one exhaustive `match`.
//!
//! It wraps the errors of the leaves below it ([`NameError`], [`WeightsError`],
//! [`TenantsFileError`], the device's) and imports nothing that could import it back.

use modelshare_device::DeviceError;

use crate::model::VersionState;
use crate::names::NameError;
pub mod tenants_file;

pub use self::tenants_file::TenantsFileError;
use crate::weights::error::WeightsError;

/// Errors of the server's domain core.
#[derive(Debug, thiserror::Error)]
pub enum CoreError {
    /// A request field is malformed.
    #[error("{field}: {reason}")]
    InvalidArgument {
        /// The request field.
        field: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A model name does not match the pattern (`name: model name '…' …`).
    #[error(transparent)]
    InvalidName(#[from] NameError),
    /// The weights could not be read or are malformed.
    #[error(transparent)]
    Weights(#[from] WeightsError),
    /// No model of that name.
    #[error("model '{0}' not found")]
    ModelNotFound(String),
    /// The model exists but not that version.
    #[error("version {version} of model '{model}' not found")]
    VersionNotFound {
        /// Model name.
        model: String,
        /// Requested version.
        version: u32,
    },
    /// "latest" was asked for, and no version is ready.
    #[error("model '{0}' has no ready version")]
    NoReadyVersion(String),
    /// The version is in a state that does not allow the call.
    #[error("version {version} of model '{model}' is {state}")]
    WrongState {
        /// Model name.
        model: String,
        /// Version number.
        version: u32,
        /// Its state.
        state: VersionState,
    },
    /// The model's memory is also another model's (loads of the same bytes), whose callers
    /// the change would make differ.
    #[error(
        "model '{0}' shares its memory with a model holding the same bytes that callers would then attach differently; unload it and load it again to change its access"
    )]
    SharedMemory(String),
    /// The version's arena is still being allocated; retry shortly.
    #[error("version {version} of model '{model}' is being allocated; retry shortly")]
    Allocating {
        /// Model name.
        model: String,
        /// Version number.
        version: u32,
    },
    /// A copy of the version is being made on the worker's device for it
    /// (`replicate_on_attach`); retry shortly.
    #[error(
        "version {version} of model '{model}' is being copied to device {device} for this \
         worker; retry shortly"
    )]
    Replicating {
        /// Model name.
        model: String,
        /// Version number.
        version: u32,
        /// The worker's device.
        device: String,
    },
    /// A load that cannot fit in the memory the device (or host) has free now.
    #[error(
        "model '{model}' needs {needed} bytes ({:.2} GiB) of {memory}; {available} bytes \
         ({:.2} GiB) are free now",
        gib(*needed),
        gib(*available)
    )]
    NoRoom {
        /// Model name.
        model: String,
        /// "device memory on GPU-…" or "host memory (MemAvailable) under …", and the bytes
        /// reserved by loads in progress where there are some.
        memory: String,
        /// Bytes the arena needs.
        needed: u64,
        /// Bytes free.
        available: u64,
    },
    /// The worker's device holds no arena of the version.
    #[error("{0}")]
    NotOnDevice(Box<NotOnDevice>),
    /// No device (or not the one named) has room for the load: its free memory or its
    /// `max_device_bytes`.
    #[error("no room on the devices: {0}")]
    NoDeviceRoom(String),
    /// The model is coming back from memory a worker kept across a restart; retry shortly.
    #[error(
        "model '{0}' is being brought back from memory its workers kept across the restart; retry shortly"
    )]
    Restoring(String),
    /// Unknown session id (never opened, or already ended).
    #[error("session '{0}' not found")]
    SessionNotFound(String),
    /// A Serve offer names a version its session holds no lease on (or, for version 0, no
    /// ready version of the model).
    #[error("session holds no lease on {} of model '{model}'", version.map_or_else(|| "a ready version".to_owned(), |v| format!("version {v}")))]
    NotLeased {
        /// Model name.
        model: String,
        /// The version offered (`None`: any ready one).
        version: Option<u32>,
    },
    /// Unknown lease id, or a lease of another session.
    #[error("lease '{0}' not found in this session")]
    LeaseNotFound(String),
    /// A configured limit would be exceeded.
    #[error("{what}: limit {limit}, requested {requested}")]
    LimitExceeded {
        /// What is limited.
        what: String,
        /// The limit.
        limit: u64,
        /// What the request needs (or current use + request).
        requested: u64,
    },
    /// The backend failed (allocation, copy, export).
    #[error("device: {0}")]
    Device(#[from] DeviceError),
    /// The load was cancelled by an unload while it ran.
    #[error("load of version {version} of '{model}' was cancelled by an unload")]
    LoadCancelled {
        /// Model name.
        model: String,
        /// Version number.
        version: u32,
    },
    /// The server is still loading its start-up models.
    /// A version's memory adopted from a worker, whose files changed since it was loaded.
    #[error(
        "the files of '{model}' changed since the memory of version {version} was loaded: that \
         memory is not brought back"
    )]
    FilesChanged {
        /// Model name.
        model: String,
        /// Version number.
        version: u32,
    },

    #[error("server is starting: start-up models are still loading")]
    Starting,
    /// The server is shutting down.
    #[error("server is shutting down")]
    ShuttingDown,
    /// No token, a malformed one, or one this server does not know.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// The caller is known but may not make this call.
    #[error("permission denied: {0}")]
    PermissionDenied(String),
    /// A load names a model that another tenant owns and the caller may not see.
    #[error("model name '{0}' is taken")]
    NameTaken(String),
    /// A tenant quota would be exceeded.
    #[error(
        "tenant '{tenant}': quota '{quota}' exceeded: limit {limit}, in use {used}, requested {requested}"
    )]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Which quota (`device_bytes`, `models`, `sessions`, `leases`, `inflight`).
        quota: &'static str,
        /// Its limit.
        limit: u64,
        /// Current use.
        used: u64,
        /// What the call asked for on top.
        requested: u64,
    },
    /// A request names a tenant the tenants file does not define.
    #[error("unknown tenant '{0}'")]
    UnknownTenant(String),
    /// `ReloadTenants` without a tenants file.
    #[error("no tenants file is configured (start the server with --tenants-file)")]
    NoTenantsFile,
    /// The tenants file could not be read or is malformed; the old tenants stay in force.
    #[error(transparent)]
    TenantsFile(#[from] TenantsFileError),
    /// A bug or an unexpected condition (a panicked task, a closed channel).
    #[error("internal error: {0}")]
    Internal(String),
}

/// The most bytes of an error message a client is sent: a message may echo a client's input
/// (a name, a path, a header), and a megabyte `grpc-message` is rejected by gRPC clients,
/// hiding the real status.
pub const MAX_MESSAGE_BYTES: usize = 2048;

/// `message`, cut at [`MAX_MESSAGE_BYTES`] (on a character boundary) with a note of how
/// much was cut.
pub fn bounded_message(message: String) -> String {
    if message.len() <= MAX_MESSAGE_BYTES {
        return message;
    }
    let mut end = MAX_MESSAGE_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… ({} more bytes cut)",
        &message[..end],
        message.len() - end
    )
}

/// Bytes in GiB, for messages.
fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client's megabyte input would come back whole in the error (or be cut inside a
    /// character).
    #[test]
    fn messages_are_bounded_on_character_boundaries() {
        assert_eq!(bounded_message("short".into()), "short");
        let long = format!("model 'é{}' is unknown", "x".repeat(1 << 20));
        let cut = bounded_message(long.clone());
        assert!(cut.len() < MAX_MESSAGE_BYTES + 40, "{}", cut.len());
        assert!(cut.starts_with("model 'é"));
        assert!(
            cut.ends_with(" more bytes cut)"),
            "{}",
            &cut[cut.len() - 40..]
        );
        let odd = "é".repeat(MAX_MESSAGE_BYTES);
        assert!(bounded_message(odd).is_char_boundary(0));
    }
}

/// A version asked for on a device that holds no arena of it ([`CoreError::NotOnDevice`]).
#[derive(Debug, thiserror::Error)]
#[error(
    "model '{model}' version {version} has no replica on device {wanted}{}; it is on {}",
    if *served { "" } else { " (a device this server does not serve)" },
    holders.join(", ")
)]
pub struct NotOnDevice {
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: u32,
    /// The device asked for.
    pub wanted: String,
    /// The devices that hold it.
    pub holders: Vec<String>,
    /// Whether `wanted` is one of the server's devices (else the worker runs on a GPU this
    /// server was not started for: `--devices`).
    pub served: bool,
}
