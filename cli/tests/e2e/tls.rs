//! TLS on the TCP listener, end to end, with certificates made by rcgen: the CLI, a worker
//! process (the SDK) and an independent tonic client; client certificates required and
//! optional; wrong CA, no client certificate and plaintext refused.

use std::path::Path;
use std::process::Command;

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair, KeyUsagePurpose};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::common::{BIN, Server, Worker};
use crate::tenants::{ADMIN, TA, TenantsFile, abc_tenants, bearer, public};

/// PEM files of a CA, a server certificate (localhost, 127.0.0.1) and a client certificate.
struct Pki {
    dir: tempfile::TempDir,
    paths: std::collections::HashMap<&'static str, String>,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let ca = |name: &str| {
            let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            p.distinguished_name.push(rcgen::DnType::CommonName, name);
            CertifiedIssuer::self_signed(p, KeyPair::generate().expect("key")).expect("ca")
        };
        let real = ca("modelshare test CA");
        let rogue = ca("some other CA");
        let leaf = |sans: &[&str], issuer: &CertifiedIssuer<'_, KeyPair>| {
            let key = KeyPair::generate().expect("key");
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let cert = CertificateParams::new(sans)
                .expect("params")
                .signed_by(&key, issuer)
                .expect("sign");
            (cert.pem(), key.serialize_pem())
        };
        let (server_cert, server_key) = leaf(&["localhost", "127.0.0.1"], &real);
        let (client_cert, client_key) = leaf(&["worker.test"], &real);
        let (rogue_cert, rogue_key) = leaf(&["worker.test"], &rogue);
        for (name, pem) in [
            ("ca.pem", real.pem()),
            ("rogue-ca.pem", rogue.pem()),
            ("server.pem", server_cert),
            ("server.key", server_key),
            ("client.pem", client_cert),
            ("client.key", client_key),
            ("rogue-client.pem", rogue_cert),
            ("rogue-client.key", rogue_key),
        ] {
            std::fs::write(dir.path().join(name), pem).expect("write pem");
        }
        let paths = [
            "ca.pem",
            "rogue-ca.pem",
            "server.pem",
            "server.key",
            "client.pem",
            "client.key",
            "rogue-client.pem",
            "rogue-client.key",
        ]
        .into_iter()
        .map(|n| (n, dir.path().join(n).display().to_string()))
        .collect();
        Self { dir, paths }
    }

    fn path(&self, name: &str) -> &str {
        &self.paths[name]
    }

    fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.dir.path().join(name)).expect("read pem")
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

async fn start(pki: &Pki, tenants: &TenantsFile, client_auth: &str) -> Server {
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--tenants-file",
        s(&tenants.path),
        "--server-tls-cert",
        pki.path("server.pem"),
        "--server-tls-key",
        pki.path("server.key"),
        "--server-tls-client-ca",
        pki.path("ca.pem"),
        "--server-tls-client-auth",
        client_auth,
    ];
    Server::start_with(&args, |root| crate::tenants::models(root, &["m1"])).await
}

/// An independent client: tonic with rustls, a CA, optionally a client identity.
async fn list(
    addr: &str,
    ca: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    token: &str,
) -> Result<Vec<String>, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    let ch = Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    let mut admin = AdminServiceClient::with_interceptor(ch, bearer(Some(token)));
    admin
        .list_models(pb::ListModelsRequest {})
        .await
        .map(|r| r.into_inner().models.into_iter().map(|m| m.name).collect())
        .map_err(|s| format!("{s:?}"))
}

/// Client certificates required: the right CA and certificate work (tonic client, CLI, SDK
/// worker process); no certificate, a certificate of another CA, a client trusting another CA
/// and plaintext are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_required_client_certificates() {
    let pki = Pki::new();
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&pki, &tenants, "required").await;
    let addr = server.tcp_address();
    let mut root = crate::tenants::admin_as(&server, Some(ADMIN)).await;
    crate::tenants::load_as(&mut root, "m", "m1", "a", public())
        .await
        .expect("load over the unix socket");

    let me = Some((pki.read("client.pem"), pki.read("client.key")));
    assert_eq!(
        list(&addr, pki.read("ca.pem"), me.clone(), TA)
            .await
            .expect("mTLS"),
        ["m"]
    );
    // The token is still required inside TLS.
    let err = list(&addr, pki.read("ca.pem"), me.clone(), "ms_wrong")
        .await
        .expect_err("token");
    assert!(err.contains("Unauthenticated"), "{err}");
    // No client certificate: the handshake (or the first call) fails.
    assert!(list(&addr, pki.read("ca.pem"), None, TA).await.is_err());
    // A client certificate from another CA.
    let rogue = Some((pki.read("rogue-client.pem"), pki.read("rogue-client.key")));
    assert!(list(&addr, pki.read("ca.pem"), rogue, TA).await.is_err());
    // A client that trusts another CA refuses the server.
    assert!(
        list(&addr, pki.read("rogue-ca.pem"), me.clone(), TA)
            .await
            .is_err()
    );
    // Plaintext gRPC to the TLS port.
    let plain = async {
        let ch = Endpoint::from_shared(format!("http://{addr}"))
            .expect("url")
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        AdminServiceClient::with_interceptor(ch, bearer(Some(TA)))
            .list_models(pb::ListModelsRequest {})
            .await
            .map_err(|e| e.to_string())
    };
    assert!(
        plain.await.is_err(),
        "plaintext must not be served on the TLS port"
    );

    // The CLI, with its TLS and token flags.
    let url = format!("https://{addr}");
    let tls_flags = [
        "--tls-ca",
        pki.path("ca.pem"),
        "--tls-cert",
        pki.path("client.pem"),
        "--tls-key",
        pki.path("client.key"),
        "--tls-domain",
        "localhost",
    ];
    let out = Command::new(BIN)
        .args(["--server", &url, "--output", "json"])
        .args(tls_flags)
        .args(["ls"])
        .env("MODELSHARE_TOKEN", TA)
        .output()
        .expect("run cli");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(listed.to_string().contains("\"m\""), "{listed}");
    let out = Command::new(BIN)
        .args(["--server", &url, "ls", "--token", TA])
        .output()
        .expect("run cli");
    assert!(
        !out.status.success(),
        "no CA given: the server's certificate is not trusted"
    );

    // A worker process (the SDK) attaches over TLS and verifies every tensor.
    let env = [
        ("MODELSHARE_TOKEN", TA),
        ("MODELSHARE_TLS_CA", pki.path("ca.pem")),
        ("MODELSHARE_TLS_CERT", pki.path("client.pem")),
        ("MODELSHARE_TLS_KEY", pki.path("client.key")),
        ("MODELSHARE_TLS_DOMAIN", "localhost"),
    ];
    let w = Worker::try_start_as(&url, "m", "tls-worker", &env, None).expect("worker over TLS");
    assert_eq!(w.report["verified"], true, "{}", w.report);
    drop(w);
}

/// Client certificates optional: a client without one is served; one from another CA is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_optional_client_certificates() {
    let pki = Pki::new();
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&pki, &tenants, "optional").await;
    let addr = server.tcp_address();
    assert!(list(&addr, pki.read("ca.pem"), None, TA).await.is_ok());
    let me = Some((pki.read("client.pem"), pki.read("client.key")));
    assert!(list(&addr, pki.read("ca.pem"), me, TA).await.is_ok());
    let rogue = Some((pki.read("rogue-client.pem"), pki.read("rogue-client.key")));
    assert!(list(&addr, pki.read("ca.pem"), rogue, TA).await.is_err());
}

/// One HTTPS request to the inference port, trusting `ca` (PEM): the status and the body; or
/// why the connection or the handshake failed.
async fn https(addr: &str, ca: &[u8], path: &str, token: &str) -> Result<(u16, String), String> {
    use rustls_pki_types::pem::PemObject;
    use std::sync::Arc;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

    let mut roots = RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca) {
        roots
            .add(c.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = rustls_pki_types::ServerName::try_from("localhost").map_err(|e| e.to_string())?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no HTTP answer: {text:?}"))?;
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    Ok((status, body))
}

/// The inference port would carry bearer tokens in clear text with TLS configured, or answer
/// plaintext, or a client trusting another CA.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inference_port_serves_https_with_the_same_tls_settings() {
    let pki = Pki::new();
    let tenants = TenantsFile::new(&abc_tenants(""));
    let args = [
        "--http-listen",
        "127.0.0.1:0",
        "--tenants-file",
        s(&tenants.path),
        "--server-tls-cert",
        pki.path("server.pem"),
        "--server-tls-key",
        pki.path("server.key"),
    ];
    let server = Server::start_with(&args, |root| crate::tenants::models(root, &["m1"])).await;
    let addr = server.http_address();
    let (status, body) = https(&addr, &pki.read("ca.pem"), "/v1/models", TA)
        .await
        .expect("HTTPS with the server's CA");
    assert_eq!(status, 200, "{body}");
    let (status, _) = https(&addr, &pki.read("ca.pem"), "/v2/health/live", TA)
        .await
        .expect("HTTPS");
    assert_eq!(status, 200);
    // A client that trusts another CA does not get through the handshake.
    let e = https(&addr, &pki.read("rogue-ca.pem"), "/v1/models", TA)
        .await
        .expect_err("another CA");
    assert!(e.contains("handshake"), "{e}");
    // Plaintext HTTP on the port is no HTTP answer (the handshake fails; the connection closes).
    let plain = plain_status(&addr, "/v2/health/live").await;
    assert!(plain.is_none(), "plaintext was answered: {plain:?}");
}

/// A plaintext HTTP request's status line, if one comes back within 5 s.
async fn plain_status(addr: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    tcp.write_all(request.as_bytes()).await.ok()?;
    let mut raw = Vec::new();
    let read =
        tokio::time::timeout(std::time::Duration::from_secs(5), tcp.read_to_end(&mut raw)).await;
    let text = String::from_utf8_lossy(&raw).into_owned();
    (read.is_ok() && text.starts_with("HTTP/"))
        .then(|| text.lines().next().unwrap_or("").to_owned())
}
