//! gRPC channels to a modelshare server.

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::WorkerError;

/// Connects to `address`: `unix:/path/to/socket` (or `unix:///path`) for a Unix socket,
/// else an `http://` or `https://` URL (`host:port` alone means `http://host:port`).
pub async fn channel(address: &str) -> Result<Channel, WorkerError> {
    let connect_err = |source| WorkerError::Connect {
        address: address.to_owned(),
        source,
    };
    if let Some(path) = address.strip_prefix("unix:") {
        let path = path.strip_prefix("//").unwrap_or(path).to_owned();
        if path.is_empty() {
            return Err(WorkerError::BadAddress {
                address: address.to_owned(),
                reason: "no socket path after 'unix:'".into(),
            });
        }
        // The URI is required by the API but unused: the connector opens the socket.
        return Endpoint::from_static("http://modelshare.local")
            .connect_with_connector(tower::service_fn(move |_: Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
            .map_err(connect_err);
    }
    let url = if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    };
    Endpoint::from_shared(url)
        .map_err(|e| WorkerError::BadAddress {
            address: address.to_owned(),
            reason: e.to_string(),
        })?
        .connect()
        .await
        .map_err(connect_err)
}
