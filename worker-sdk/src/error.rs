//! Errors of the worker SDK.

/// What can go wrong for a worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The server address is not understood.
    #[error("bad server address '{address}': {reason}")]
    BadAddress {
        /// The address given.
        address: String,
        /// Why it was refused.
        reason: String,
    },
    /// The connection could not be made.
    #[error("cannot connect to {address}: {source}")]
    Connect {
        /// The address.
        address: String,
        /// The cause.
        source: tonic::transport::Error,
    },
    /// A token or TLS setting is unusable (a token is never quoted; a file is named, never
    /// its contents).
    #[error("{what}: {reason}")]
    Credentials {
        /// What was wrong: `token`, `token file '/path'`, `TLS CA file '/path'`, ...
        what: String,
        /// Why.
        reason: String,
    },
    /// The server answered with an error.
    #[error("{call}: {status}")]
    Rpc {
        /// The call.
        call: &'static str,
        /// The server's status.
        status: tonic::Status,
    },
    /// The server broke the protocol (a missing field, an unknown handle kind).
    #[error("protocol: {0}")]
    Protocol(String),
    /// Mapping the arena failed.
    #[error("arena of '{model}' version {version}: {source}")]
    Device {
        /// Model name.
        model: String,
        /// Version.
        version: u32,
        /// The cause.
        source: modelshare_device::DeviceError,
    },
    /// The model has no tensor of that name.
    #[error("model '{model}' has no tensor '{tensor}'")]
    NoSuchTensor {
        /// Model name.
        model: String,
        /// Tensor asked for.
        tensor: String,
    },
    /// A typed view was asked for with the wrong element type.
    #[error("tensor '{tensor}' is {actual}, not {requested}")]
    WrongDtype {
        /// Tensor name.
        tensor: String,
        /// Its dtype.
        actual: String,
        /// The dtype of the type asked for.
        requested: String,
    },
    /// The session has ended (or is reconnecting).
    #[error("the session has ended")]
    SessionEnded,
    /// Serve options the server would refuse.
    #[error("serve options: {0}")]
    BadServeOptions(String),
    /// A model attached by another session was given to serve.
    #[error("model '{model}' was attached by another session")]
    WrongSession {
        /// Model name.
        model: String,
    },
    /// A model being served could not be attached again after a reconnection.
    #[error("model '{model}' is gone: {reason}")]
    ModelGone {
        /// Model name.
        model: String,
        /// Why the attach failed.
        reason: String,
    },
    /// The worker cannot serve this model version (its setup refused it: an unsupported
    /// architecture, a missing file, a tensor of the wrong shape).
    #[error("cannot serve model '{model}' version {version}: {reason}")]
    Unservable {
        /// Model name.
        model: String,
        /// Version.
        version: u32,
        /// Why, naming the file, field or tensor.
        reason: String,
    },
}

impl WorkerError {
    /// The gRPC status code, when the server answered with an error.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            WorkerError::Rpc { status, .. } => Some(status.code()),
            _ => None,
        }
    }

    /// Whether trying again cannot help: a bad address or credentials, options, a protocol
    /// or a model the worker refuses, or a refusal of the server that retrying cannot fix
    /// (INVALID_ARGUMENT, PERMISSION_DENIED, UNIMPLEMENTED).
    pub fn is_fatal(&self) -> bool {
        match self {
            WorkerError::BadAddress { .. }
            | WorkerError::Credentials { .. }
            | WorkerError::BadServeOptions(_)
            | WorkerError::WrongSession { .. }
            | WorkerError::Protocol(_)
            | WorkerError::Unservable { .. } => true,
            WorkerError::Rpc { status, .. } => matches!(
                status.code(),
                tonic::Code::InvalidArgument
                    | tonic::Code::PermissionDenied
                    | tonic::Code::Unimplemented
            ),
            WorkerError::Connect { .. }
            | WorkerError::Device { .. }
            | WorkerError::NoSuchTensor { .. }
            | WorkerError::WrongDtype { .. }
            | WorkerError::SessionEnded
            | WorkerError::ModelGone { .. } => false,
        }
    }
}
