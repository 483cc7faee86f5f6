//! Health watches that never end, and the admin door while they are held.

use std::time::Duration;

use super::config;
use crate::tenants::{self as tn, TenantsFile, abc_tenants};

/// A connection with an open request was never idle: an unauthenticated Health/Watch never
/// ended, so a few of them filled the gRPC listener and the admin over TCP was refused. Now a
/// Watch ends after the idle period, its connection then closes as idle, and the admin over
/// TCP is answered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watches_end_and_their_connections_close_while_the_admin_answers_again() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let (_cfg, cfg) = config(
        "[limits]\nmax_connections = 4\nmax_connections_per_peer = 4\nconnection_idle_timeout_ms = 1500\n",
    );
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = tn::start(
        &tenants,
        &["--listen", &format!("127.0.0.1:{port}"), "--config", &cfg],
        &[],
    )
    .await;
    let tcp = format!("http://127.0.0.1:{port}");
    let mut watches = Vec::new();
    for _ in 0..4 {
        let ch = tonic::transport::Endpoint::from_shared(tcp.clone())
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        let mut health = tonic_health::pb::health_client::HealthClient::new(ch);
        let stream = health
            .watch(tonic_health::pb::HealthCheckRequest::default())
            .await
            .expect("watch")
            .into_inner();
        watches.push(stream);
    }
    // The listener is full of watches: an admin call over TCP is refused now.
    let full = admin_over_tcp(&tcp).await;
    assert!(full.is_err(), "the listener is full: {full:?}");
    // Each watch ends by itself (OK, no more messages).
    for w in &mut watches {
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(_)) = w.message().await {}
        })
        .await;
        assert!(ended.is_ok(), "a watch outlived its limit");
    }
    // Its connections close as idle, and the admin is answered.
    crate::common::eventually(
        Duration::from_secs(15),
        "the admin answers over TCP",
        || {
            let tcp = tcp.clone();
            async move { admin_over_tcp(&tcp).await.is_ok() }
        },
    )
    .await;
    drop(server);
}

async fn admin_over_tcp(tcp: &str) -> Result<(), String> {
    let ch = tonic::transport::Endpoint::from_shared(tcp.to_owned())
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(2))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let mut admin =
        modelshare_proto::v1::admin_service_client::AdminServiceClient::with_interceptor(
            ch,
            tn::bearer(Some(crate::tenants::ADMIN)),
        );
    admin
        .get_stats(modelshare_proto::v1::GetStatsRequest::default())
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}
