//! [`ServeError`]: why the server could not start or stopped with an error.

use std::io;

use modelshare_core::error::CoreError;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The handle socket is another server's (or cannot be made): say how to give this one
    /// its own.
    #[error(
        "cannot listen on the handle socket {what}: {source}; give this server its own with \
         --handle-socket (handle_socket in the file)"
    )]
    HandleSocket {
        /// Its path.
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// The chosen backend is not available.
    #[error("backend: {0}")]
    Backend(String),
    /// The model root is missing or not a directory.
    #[error("model root {path}: {reason}")]
    ModelRoot {
        /// The path given.
        path: String,
        /// Why it cannot serve as the root.
        reason: String,
    },
    /// A socket could not be bound.
    #[error("cannot listen on {what}: {source}")]
    Bind {
        /// The address or path.
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// A start-up model failed to load.
    #[error("start-up model '{name}' ({path}): {source}")]
    StartupModel {
        /// Model name.
        name: String,
        /// Its path.
        path: String,
        /// The cause.
        source: CoreError,
    },
    /// The reflection service could not be built.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The metrics registry could not be built.
    #[error("metrics: {0}")]
    Metrics(String),
    /// The gRPC transport failed.
    #[error("grpc transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The tenants file could not be read or is malformed.
    #[error(transparent)]
    Tenants(#[from] modelshare_core::tenants::file::TenantsFileError),
    /// The HTTPS settings of the inference port could not be used.
    #[error(transparent)]
    Https(#[from] crate::http::tls::TlsError),
    /// A TLS file could not be read.
    #[error("TLS {what} {path}: {source}")]
    Tls {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: String,
        /// The cause.
        source: io::Error,
    },
}

impl ServeError {
    /// A bind failure of the handle socket, told as such.
    pub(super) fn for_handle_socket(self) -> Self {
        match self {
            ServeError::Bind { what, source } => ServeError::HandleSocket { what, source },
            other => other,
        }
    }
}
