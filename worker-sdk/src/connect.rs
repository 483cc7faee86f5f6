//! gRPC channels to a modelshare server, with the bearer token and TLS settings of
//! [`ConnectOptions`].
//!
//! Addresses: `unix:/path/to/socket` (or `unix:///path`) for a Unix socket; `http://host:port`
//! (`host:port` alone means the same) for plain TCP; `https://host:port` for TLS. Only `https://`
//! addresses use TLS: TLS settings given with any other address are an error naming it.

use hyper_util::rt::TokioIo;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};

use crate::WorkerError;
use crate::credentials::{BearerInterceptor, ConnectOptions, TlsOptions};

/// A channel whose every call carries the bearer token (when one is configured); what
/// [`authed`] returns, for the generated clients: `AdminServiceClient::new(authed(..).await?)`.
pub type AuthChannel = InterceptedService<Channel, BearerInterceptor>;

/// Connects to `address` with no token (an `https://` address trusts the web PKI roots).
/// Health checks and servers without tenants need no more.
pub async fn channel(address: &str) -> Result<Channel, WorkerError> {
    channel_with(address, &ConnectOptions::default()).await
}

/// Connects to `address` with the TLS settings of `options` (its token is not attached: see
/// [`authed`]).
pub async fn channel_with(address: &str, options: &ConnectOptions) -> Result<Channel, WorkerError> {
    let connect_err = |source| WorkerError::Connect {
        address: address.to_owned(),
        source,
    };
    let no_tls_here = || WorkerError::BadAddress {
        address: address.to_owned(),
        reason: "TLS settings were given, but only https:// addresses use TLS".into(),
    };
    if let Some(path) = address.strip_prefix("unix:") {
        let path = path.strip_prefix("//").unwrap_or(path).to_owned();
        if path.is_empty() {
            return Err(WorkerError::BadAddress {
                address: address.to_owned(),
                reason: "no socket path after 'unix:'".into(),
            });
        }
        if options.tls.is_some() {
            return Err(no_tls_here());
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
    let endpoint = Endpoint::from_shared(url).map_err(|e| WorkerError::BadAddress {
        address: address.to_owned(),
        reason: e.to_string(),
    })?;
    let endpoint = if endpoint.uri().scheme_str() == Some("https") {
        endpoint
            .tls_config(client_tls(options.tls.as_ref()))
            .map_err(|e| WorkerError::Credentials {
                what: format!("TLS settings for {address}"),
                reason: error_chain(&e),
            })?
    } else if options.tls.is_some() {
        return Err(no_tls_here());
    } else {
        endpoint
    };
    endpoint.connect().await.map_err(connect_err)
}

/// Connects to `address` with `options`: TLS as configured, and every call carrying
/// `authorization: Bearer <token>` when a token is configured. A token file is read here, so
/// each connection sees the file as it is now.
pub async fn authed(address: &str, options: &ConnectOptions) -> Result<AuthChannel, WorkerError> {
    // The token first: a bad token file fails without a connection attempt.
    let interceptor = options.interceptor()?;
    let channel = channel_with(address, options).await?;
    Ok(InterceptedService::new(channel, interceptor))
}

/// rustls settings: the given CA (else the web PKI roots), client identity and domain.
fn client_tls(tls: Option<&TlsOptions>) -> ClientTlsConfig {
    let mut config = ClientTlsConfig::new();
    config = match tls.and_then(|t| t.ca_pem.as_ref()) {
        Some(ca) => config.ca_certificate(Certificate::from_pem(ca)),
        None => config.with_webpki_roots(),
    };
    if let Some((cert, key)) = tls.and_then(|t| t.identity.as_ref()) {
        config = config.identity(Identity::from_pem(cert, key));
    }
    if let Some(domain) = tls.and_then(|t| t.domain.as_ref()) {
        config = config.domain_name(domain.clone());
    }
    config
}

/// `error: cause: cause`, since transport errors say little at the top.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls_options() -> ConnectOptions {
        ConnectOptions::default().with_tls(TlsOptions {
            domain: Some("ms.internal".into()),
            ..TlsOptions::default()
        })
    }

    /// TLS settings with an address that never uses TLS would silently send in clear text.
    #[tokio::test]
    async fn tls_with_plain_addresses_is_refused() {
        for address in [
            "unix:/tmp/nowhere.sock",
            "http://127.0.0.1:1",
            "127.0.0.1:1",
        ] {
            let err = channel_with(address, &tls_options())
                .await
                .expect_err(address);
            assert!(
                matches!(&err, WorkerError::BadAddress { address: a, .. } if a == address),
                "{err:?}"
            );
            assert!(err.to_string().contains(address), "{err}");
        }
    }

    /// A malformed client identity must fail with the address named, not as "transport error".
    #[tokio::test]
    async fn bad_identity_is_reported() {
        let options = ConnectOptions::default().with_tls(TlsOptions {
            identity: Some((b"not pem".to_vec(), b"not pem".to_vec())),
            ..TlsOptions::default()
        });
        let err = channel_with("https://127.0.0.1:1", &options)
            .await
            .expect_err("bad identity accepted");
        assert!(
            matches!(&err, WorkerError::Credentials { what, .. } if what.contains("https://127.0.0.1:1")),
            "{err:?}"
        );
    }

    /// A bad token file must fail before any connection is tried (and name the file).
    #[tokio::test]
    async fn authed_reads_the_token_first() {
        let options = ConnectOptions::default().with_token_file("/nonexistent/token".into());
        let err = authed("unix:/nonexistent/sock", &options)
            .await
            .expect_err("missing file accepted");
        assert!(
            matches!(&err, WorkerError::Credentials { what, .. } if what.contains("/nonexistent/token")),
            "{err:?}"
        );
    }
}
