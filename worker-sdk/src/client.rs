//! [`Client`]: a connection to a modelshare server, from which sessions are opened.

use crate::WorkerError;
use crate::connect::{self, AuthChannel};
use crate::credentials::ConnectOptions;
use crate::session::{Session, SessionOptions};

/// A connection to a modelshare server (TCP or Unix socket).
///
/// ```no_run
/// # async fn run() -> Result<(), modelshare_worker::WorkerError> {
/// use modelshare_worker::{Client, SessionOptions};
/// let client = Client::connect("unix:/run/modelshare/grpc.sock").await?;
/// let session = client
///     .session(SessionOptions { worker_name: "embedder-3".into(), ..Default::default() })
///     .await?;
/// let model = session.attach("minilm").await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Client {
    address: String,
    options: ConnectOptions,
    channel: AuthChannel,
}

impl Client {
    /// Connects to `address`: `unix:/path/to/socket`, `http://host:port` (`host:port` alone
    /// means `http://`) or `https://host:port`, with the token and TLS settings of the
    /// environment ([`ConnectOptions::from_env`]).
    pub async fn connect(address: &str) -> Result<Self, WorkerError> {
        Self::connect_with(address, ConnectOptions::from_env()?).await
    }

    /// Connects to `address` with `options`.
    pub async fn connect_with(address: &str, options: ConnectOptions) -> Result<Self, WorkerError> {
        Ok(Self {
            address: address.to_owned(),
            channel: connect::authed(address, &options).await?,
            options,
        })
    }

    /// The address connected to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The gRPC channel, for calling the generated clients directly; every call carries the
    /// token.
    pub fn channel(&self) -> AuthChannel {
        self.channel.clone()
    }

    /// Opens a session with this client's token and TLS settings (they replace
    /// `options.connect`). It keeps itself alive across server restarts by reconnecting to the
    /// same address.
    pub async fn session(&self, mut options: SessionOptions) -> Result<Session, WorkerError> {
        options.connect = self.options.clone();
        Session::open_with(&self.address, options).await
    }
}
