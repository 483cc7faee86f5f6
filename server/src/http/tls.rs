//! HTTPS on the inference port, with the TLS settings of the gRPC listener (the same
//! certificate and key, and client certificates checked against the same CA): bearer tokens
//! cross `/v1` and `/v2` encrypted.
//!
//! [`TlsListener`] wraps the port's [`GatedListener`]: a connection the gate admits does its TLS
//! handshake on a task of its own (a slow client holds up no other), within the connection's
//! handshake timeout (its [`Tracked`] stream reads as closed past it), and is handed to the
//! server once the handshake is done.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpStream;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;

use crate::config::{ClientAuth, TlsSettings};
use crate::connections::{ConnInfo, GatedListener, Tracked};

/// Why the HTTPS settings cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("https: {what} ({path}): {reason}")]
pub struct TlsError {
    what: &'static str,
    path: String,
    reason: String,
}

/// The acceptor of `tls`'s certificate and key, asking for client certificates signed by its
/// client CA when it has one (required, or optional as `client_auth` says).
pub fn acceptor(tls: &TlsSettings) -> Result<TlsAcceptor, TlsError> {
    let fail = |what, path: &Path, reason: String| TlsError {
        what,
        path: path.display().to_string(),
        reason,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&tls.cert)
        .and_then(Iterator::collect)
        .map_err(|e| fail("certificate", &tls.cert, e.to_string()))?;
    let key =
        PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| fail("key", &tls.key, e.to_string()))?;
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| fail("protocol versions", &tls.cert, e.to_string()))?;
    let builder = match &tls.client_ca {
        Some(ca) => {
            let mut roots = RootCertStore::empty();
            let cas = CertificateDer::pem_file_iter(ca)
                .and_then(Iterator::collect::<Result<Vec<_>, _>>)
                .map_err(|e| fail("client CA", ca, e.to_string()))?;
            for c in cas {
                roots
                    .add(c)
                    .map_err(|e| fail("client CA", ca, e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match tls.client_auth {
                ClientAuth::Optional => verifier.allow_unauthenticated(),
                ClientAuth::Required => verifier,
            };
            let verifier = verifier
                .build()
                .map_err(|e| fail("client CA", ca, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| fail("certificate and key", &tls.cert, e.to_string()))?;
    // The port speaks HTTP/1.1 (axum's http1).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A connection handed to the server once its handshake is done.
type Handshaken = Option<(TlsStream<Tracked<TcpStream>>, SocketAddr)>;

/// The inference port's listener with TLS.
pub struct TlsListener {
    inner: GatedListener,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Handshaken>,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("inner", &self.inner)
            .field("handshakes", &self.handshakes.len())
            .finish_non_exhaustive()
    }
}

impl TlsListener {
    /// Over the port's gated listener.
    pub fn new(inner: GatedListener, acceptor: TlsAcceptor) -> Self {
        Self {
            inner,
            acceptor,
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Tracked<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                // Cancel-safe: an accepted connection is admitted (or refused) at once.
                (io, addr) = self.inner.accept() => {
                    let acceptor = self.acceptor.clone();
                    self.handshakes.spawn(async move {
                        // A failed handshake (not TLS, a bad client certificate, past the
                        // handshake timeout) drops the connection; the client sees it closed.
                        acceptor.accept(io).await.ok().map(|tls| (tls, addr))
                    });
                }
                Some(done) = self.handshakes.join_next(), if !self.handshakes.is_empty() => {
                    if let Ok(Some(ready)) = done {
                        return ready;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

impl<'a> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, TlsListener>>
    for ConnInfo<SocketAddr>
{
    fn connect_info(stream: axum::serve::IncomingStream<'a, TlsListener>) -> Self {
        stream.io().get_ref().0.info(*stream.remote_addr())
    }
}
