//! [`CliError`]: why a client command failed, and `rpc`, which names the call a status came from.

/// Why a client command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// No connection.
    #[error(transparent)]
    Connect(#[from] modelshare_worker::WorkerError),
    /// The server refused the call.
    #[error("{}: {} ({:?})", .call, .status.message(), .status.code())]
    Rpc {
        /// The call.
        call: &'static str,
        /// The status.
        status: tonic::Status,
    },
    /// The load stream ended without its final message.
    #[error("the server ended the load without a result")]
    Truncated,
    /// The command line asks for something that cannot be sent.
    #[error("{0}")]
    Usage(String),
}

/// Makes a status into a [`CliError::Rpc`] naming `call`.
pub(super) fn rpc(call: &'static str) -> impl FnOnce(tonic::Status) -> CliError {
    move |status| CliError::Rpc { call, status }
}
