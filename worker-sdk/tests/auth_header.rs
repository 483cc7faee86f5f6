//! What the SDK puts on the wire: the `authorization` header and TLS, against a small tonic
//! server (the gRPC health service behind an interceptor that records the header).

use std::path::Path;
use std::sync::{Arc, Mutex};

use modelshare_worker::connect::{AuthChannel, authed};
use modelshare_worker::{ConnectOptions, TlsOptions, Token, WorkerError};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::service::InterceptorLayer;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// The `authorization` header of each request the server saw (`None`: no header).
type Seen = Arc<Mutex<Vec<Option<String>>>>;

fn recorder(seen: Seen) -> InterceptorLayer<impl tonic::service::Interceptor + Clone> {
    InterceptorLayer::new(move |req: tonic::Request<()>| {
        let header = req
            .metadata()
            .get("authorization")
            .map(|v| v.to_str().unwrap_or("<not ascii>").to_owned());
        seen.lock().unwrap_or_else(|e| e.into_inner()).push(header);
        Ok(req)
    })
}

/// Starts the server on a Unix socket in `dir`; its address.
async fn unix_server(dir: &Path, seen: Seen) -> String {
    let path = dir.join("grpc.sock");
    let listener = tokio::net::UnixListener::bind(&path).expect("bind");
    let (_reporter, health) = tonic_health::server::health_reporter();
    tokio::spawn(
        Server::builder()
            .layer(recorder(seen))
            .add_service(health)
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    format!("unix:{}", path.display())
}

async fn check(channel: AuthChannel) -> Result<(), tonic::Status> {
    HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
}

fn last(seen: &Seen) -> Option<String> {
    seen.lock()
        .unwrap_or_else(|e| e.into_inner())
        .last()
        .cloned()
        .expect("the server saw no request")
}

fn count(seen: &Seen) -> usize {
    seen.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// A token that is not sent, or sent in another form, would make every tenant call fail.
#[tokio::test]
async fn authed_sends_the_bearer_token() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = Seen::default();
    let address = unix_server(dir.path(), seen.clone()).await;
    let token = Token::new("ms_literal_token".into()).expect("token");
    let options = ConnectOptions::default().with_token(token);
    let channel = authed(&address, &options).await.expect("connect");
    check(channel.clone()).await.expect("check");
    assert_eq!(last(&seen).as_deref(), Some("Bearer ms_literal_token"));
    // Every call, not only the first.
    check(channel).await.expect("second check");
    assert_eq!(count(&seen), 2);
    assert_eq!(last(&seen).as_deref(), Some("Bearer ms_literal_token"));
}

/// Operators rotate tokens by rewriting the file: a new connection must send the new token.
#[tokio::test]
async fn a_rewritten_token_file_is_seen_on_the_next_connection() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = Seen::default();
    let address = unix_server(dir.path(), seen.clone()).await;
    let file = dir.path().join("token");
    std::fs::write(&file, "ms_before\n").expect("write");
    let options = ConnectOptions::default().with_token_file(file.clone());

    let before = authed(&address, &options).await.expect("connect");
    check(before.clone()).await.expect("check");
    assert_eq!(last(&seen).as_deref(), Some("Bearer ms_before"));

    std::fs::write(&file, "ms_after\n").expect("rewrite");
    check(authed(&address, &options).await.expect("reconnect"))
        .await
        .expect("check");
    assert_eq!(last(&seen).as_deref(), Some("Bearer ms_after"));
    // A connection made before keeps the token it was made with.
    check(before).await.expect("check");
    assert_eq!(last(&seen).as_deref(), Some("Bearer ms_before"));
}

/// A server without tenants must see no header at all (not an empty one).
#[tokio::test]
async fn no_token_sends_no_header() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seen = Seen::default();
    let address = unix_server(dir.path(), seen.clone()).await;
    check(
        authed(&address, &ConnectOptions::default())
            .await
            .expect("connect"),
    )
    .await
    .expect("check");
    assert_eq!(count(&seen), 1);
    assert_eq!(last(&seen), None);
}

/// PEM of a CA, a server certificate for `ms.test` and a client certificate, all signed by it.
struct Pki {
    ca: String,
    server: (String, String),
    client: (String, String),
}

fn pki() -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca =
        CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("key")).expect("ca");
    let leaf = |name: &str| {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_owned()])
            .expect("params")
            .signed_by(&key, &ca)
            .expect("sign");
        (cert.pem(), key.serialize_pem())
    };
    Pki {
        ca: ca.pem(),
        server: leaf("ms.test"),
        client: leaf("worker.test"),
    }
}

/// Starts the server with TLS on 127.0.0.1, requiring a client certificate; its port.
async fn tls_server(pki: &Pki, seen: Seen) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let tls = ServerTlsConfig::new()
        .identity(Identity::from_pem(&pki.server.0, &pki.server.1))
        .client_ca_root(Certificate::from_pem(&pki.ca));
    let (_reporter, health) = tonic_health::server::health_reporter();
    let server = Server::builder()
        .tls_config(tls)
        .expect("server tls")
        .layer(recorder(seen))
        .add_service(health)
        .serve_with_incoming(TcpListenerStream::new(listener));
    tokio::spawn(server);
    port
}

async fn tls_call(address: &str, options: &ConnectOptions) -> Result<(), String> {
    let channel = authed(address, options)
        .await
        .map_err(|e| format!("{e:?}"))?;
    check(channel).await.map_err(|s| s.to_string())
}

/// TLS settings that are not applied (CA, client identity, domain) would either fail against a
/// real deployment or, worse, trust what they should not.
#[tokio::test]
async fn https_uses_the_ca_identity_and_domain() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = pki();
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path
    };
    let (ca, cert, key) = (
        write("ca.pem", &pki.ca),
        write("client.pem", &pki.client.0),
        write("client.key", &pki.client.1),
    );
    let seen = Seen::default();
    let port = tls_server(&pki, seen.clone()).await;
    let address = format!("https://127.0.0.1:{port}");
    let token = Token::new("ms_over_tls".into()).expect("token");
    let with = |tls: TlsOptions| {
        ConnectOptions::default()
            .with_token(token.clone())
            .with_tls(tls)
    };

    let full = TlsOptions::from_files(Some(&ca), Some(&cert), Some(&key), Some("ms.test".into()))
        .expect("tls files");
    tls_call(&address, &with(full.clone()))
        .await
        .expect("mutual TLS");
    assert_eq!(last(&seen).as_deref(), Some("Bearer ms_over_tls"));
    let calls = count(&seen);

    // Each of these must fail, and reach no handler.
    let wrong_domain = TlsOptions {
        domain: Some("other.test".into()),
        ..full.clone()
    };
    let no_ca = TlsOptions {
        ca_pem: None,
        ..full.clone()
    };
    let no_identity = TlsOptions {
        identity: None,
        ..full.clone()
    };
    for (what, tls) in [
        ("a certificate for another name", wrong_domain),
        ("the web PKI roots only", no_ca),
        ("no client certificate", no_identity),
    ] {
        let result = tls_call(&address, &with(tls)).await;
        assert!(result.is_err(), "succeeded with {what}");
    }
    // Plain https:// with no settings trusts the web PKI roots: not this CA.
    assert!(
        tls_call(&address, &ConnectOptions::default())
            .await
            .is_err()
    );
    assert_eq!(count(&seen), calls, "a refused call reached the handler");

    // And TLS settings with a Unix socket address are refused, naming it.
    let err = authed("unix:/tmp/x.sock", &with(full))
        .await
        .expect_err("TLS over a Unix socket accepted");
    assert!(
        matches!(&err, WorkerError::BadAddress { address, .. } if address == "unix:/tmp/x.sock"),
        "{err:?}"
    );
}
