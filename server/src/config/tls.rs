//! TLS of the TCP listener: the certificate and key (both or neither), and the client CA
//! that turns client certificates on.

use std::net::SocketAddr;

use super::args::ServeArgs;
use super::error::ConfigError;
use super::file::FileTls;
use super::settings::TlsSettings;

/// Merges the TLS flags over the file's `[tls]` table; TLS needs both a certificate and a key,
/// `client_auth` a client CA, and a TCP listener to serve on: gRPC's (`listen`) or the
/// inference port (`http_listen`, then HTTPS), both with the same settings.
pub(super) fn merge(
    args: &ServeArgs,
    file: &FileTls,
    listen: Option<SocketAddr>,
    http_listen: Option<SocketAddr>,
) -> Result<Option<TlsSettings>, ConfigError> {
    let tls = match (
        args.server_tls_cert.clone().or(file.cert.clone()),
        args.server_tls_key.clone().or(file.key.clone()),
    ) {
        (Some(cert), Some(key)) => {
            let client_ca = args.server_tls_client_ca.clone().or(file.client_ca.clone());
            let client_auth = args.server_tls_client_auth.or(file.client_auth);
            if client_auth.is_some() && client_ca.is_none() {
                return Err(ConfigError::Invalid(
                    "client_auth needs a client CA (server_tls_client_ca, or [tls] client_ca) to check client certificates against".into(),
                ));
            }
            Some(TlsSettings {
                cert,
                key,
                client_ca,
                client_auth: client_auth.unwrap_or_default(),
            })
        }
        (None, None) => None,
        _ => {
            return Err(ConfigError::Invalid(
                "TLS needs both a certificate and a key (server_tls_cert and server_tls_key, or [tls] cert and key)".into(),
            ));
        }
    };
    if tls.is_some() && listen.is_none() && http_listen.is_none() {
        return Err(ConfigError::Invalid(
            "TLS is for the TCP listeners, and none is configured (--listen, --http-listen)".into(),
        ));
    }
    Ok(tls)
}
