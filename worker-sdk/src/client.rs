//! [`Client`]: a connection to a modelshare server, from which sessions are opened.

use tonic::transport::Channel;

use crate::session::{Session, SessionOptions};
use crate::{WorkerError, connect};

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
    channel: Channel,
}

impl Client {
    /// Connects to `address`: `unix:/path/to/socket`, or `http://host:port` (`host:port` alone
    /// means `http://`).
    pub async fn connect(address: &str) -> Result<Self, WorkerError> {
        Ok(Self {
            address: address.to_owned(),
            channel: connect::channel(address).await?,
        })
    }

    /// The address connected to.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The gRPC channel, for calling the generated clients directly.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Opens a session. It keeps itself alive across server restarts by reconnecting to the
    /// same address.
    pub async fn session(&self, options: SessionOptions) -> Result<Session, WorkerError> {
        Session::open_with(&self.address, options).await
    }
}
