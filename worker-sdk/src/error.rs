//! Errors of the worker SDK, and [`report`], the one-line form of any error and its causes.

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
    /// No server address was given and no server was found where one listens by default
    /// (the places and why each was passed over: see [`crate::discover`](mod@crate::discover)).
    #[error(transparent)]
    Discover(#[from] crate::discover::DiscoverError),
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
    /// The server refused the worker in a way asking again will not change: its token
    /// (UNAUTHENTICATED), what its tenant may do (PERMISSION_DENIED), or the model it asked
    /// for (NOT_FOUND: unknown, or not visible to its tenant); `hint` says what to change.
    /// [`crate::serve::serve_latest`] ends with this, the worker's configuration being wrong.
    #[error("{call} refused: {} ({}); {hint}", .status.message(), code_name(.status.code()))]
    Refused {
        /// The call.
        call: &'static str,
        /// The server's status.
        status: tonic::Status,
        /// What to change.
        hint: String,
    },
    /// The server broke the protocol (a missing field, an unknown handle kind).
    #[error("protocol: {0}")]
    Protocol(String),
    /// The server's welcome said a protocol version this worker does not speak.
    #[error("session: {0}")]
    ProtocolVersion(#[from] modelshare_proto::version::VersionError),
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

    /// Whether trying again cannot help: a bad address or credentials, no server found, options,
    /// a protocol (or protocol version) or a model the worker refuses, or a refusal of the
    /// server that retrying cannot fix (INVALID_ARGUMENT, PERMISSION_DENIED, UNIMPLEMENTED, and
    /// [`WorkerError::Refused`]). UNAUTHENTICATED and NOT_FOUND are not fatal here: in the
    /// middle of a worker's life they are what a token rotation or a model loaded again looks
    /// like for a moment; [`crate::serve::serve_latest`] makes them fatal at its start.
    pub fn is_fatal(&self) -> bool {
        match self {
            WorkerError::BadAddress { .. }
            | WorkerError::Discover(_)
            | WorkerError::Refused { .. }
            | WorkerError::Credentials { .. }
            | WorkerError::BadServeOptions(_)
            | WorkerError::WrongSession { .. }
            | WorkerError::Protocol(_)
            | WorkerError::ProtocolVersion(_)
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

/// The canonical name of a status code, as the `.proto` comments and the server's logs write it.
fn code_name(code: tonic::Code) -> &'static str {
    modelshare_proto::codes::name(code as i32)
}

/// The error and its causes in one line, `outer: cause: cause`, each cause once: a cause whose
/// text the line already holds is skipped (wrappers that repeat their source's text, such as
/// tonic's transport errors, would otherwise print `transport error: transport error: tcp
/// connect error: tcp connect error: ...`).
pub fn report(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !text.is_empty() && !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Chain(&'static str, Option<Box<Chain>>);

    impl std::fmt::Display for Chain {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }

    impl std::error::Error for Chain {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            self.1.as_deref().map(|c| c as _)
        }
    }

    fn chain(texts: &[&'static str]) -> Chain {
        let mut c: Option<Box<Chain>> = None;
        for t in texts.iter().rev() {
            c = Some(Box::new(Chain(t, c)));
        }
        *c.expect("one")
    }

    /// Causes that repeat their wrapper's text would be printed twice (or not at all).
    #[test]
    fn reports_each_cause_once() {
        let e = chain(&[
            "cannot connect to http://127.0.0.1:1: transport error",
            "transport error",
            "tcp connect error",
            "tcp connect error",
            "Connection refused (os error 111)",
        ]);
        assert_eq!(
            report(&e),
            "cannot connect to http://127.0.0.1:1: transport error: tcp connect error: \
             Connection refused (os error 111)"
        );
        assert_eq!(report(&chain(&["a", "", "b"])), "a: b");
        let top = WorkerError::SessionEnded;
        assert_eq!(report(&top), "the session has ended");
    }
}
