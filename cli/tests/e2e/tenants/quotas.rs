//! Quotas (leases, sessions, device bytes, models) under concurrency, and the file
//! descriptors a tenant's unredeemed tickets hold.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use tonic::Code;

use super::{
    Authed, TA, TB, TenantsFile, abc_tenants, admin_as, attach, load_as, names, session_as, start,
    worker_as,
};
use crate::common;

/// Many attaches racing one leases quota: exactly the quota succeeds, the rest are refused
/// naming the quota, its limit and the use; releasing gives everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_attaches_race_the_leases_quota() {
    let tenants = TenantsFile::new(&abc_tenants("[tenants.quota]\nleases = 5\nsessions = 3"));
    let server = start(&tenants, &["--metrics-listen", "127.0.0.1:0"], &["m1"]).await;
    let mut a = admin_as(&server, Some(TA)).await;
    load_as(&mut a, "m", "m1", "", None).await.expect("load");
    let mut wa = worker_as(&server, Some(TA)).await;
    let s = session_as(&mut wa, "racer").await.expect("session");

    let mut tasks = Vec::new();
    for _ in 0..40 {
        let mut w = worker_as(&server, Some(TA)).await;
        let id = s.id.clone();
        tasks.push(tokio::spawn(async move { attach(&mut w, &id, "m").await }));
    }
    let mut leases = Vec::new();
    let mut refused = 0;
    for t in tasks {
        match t.await.expect("join") {
            Ok(r) => leases.push(r.lease_id),
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                assert!(
                    s.message().contains("'leases'") && s.message().contains("limit 5, in use 5"),
                    "{}",
                    s.message()
                );
                refused += 1;
            }
        }
    }
    assert_eq!((leases.len(), refused), (5, 35));
    let stats = a
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats.tenants[0].leases, 5);

    // Sessions race their quota too (one is open already: 2 more fit).
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mut w = worker_as(&server, Some(TA)).await;
        tasks.push(tokio::spawn(async move {
            session_as(&mut w, &format!("s{i}")).await
        }));
    }
    let mut open = Vec::new();
    for t in tasks {
        match t.await.expect("join") {
            Ok(s) => open.push(s),
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted);
                assert!(s.message().contains("'sessions'") && s.message().contains("limit 3"));
            }
        }
    }
    assert_eq!(open.len(), 2);
    drop(open);

    // Release everything: nothing leaks, and the quota is free again.
    for lease in leases {
        wa.release(pb::ReleaseRequest {
            session_id: s.id.clone(),
            lease_id: lease,
        })
        .await
        .expect("release");
    }
    common::eventually(Duration::from_secs(5), "usage back to zero", || {
        let mut a = a.clone();
        async move {
            let st = a
                .get_stats(pb::GetStatsRequest {})
                .await
                .expect("stats")
                .into_inner();
            st.tenants[0].leases == 0 && st.tenants[0].sessions == 1 && st.leases == 0
        }
    })
    .await;
    attach(&mut wa, &s.id, "m")
        .await
        .expect("attach after release");

    // Refusals are counted by tenant and quota.
    let body = common::http_get(&server.metrics_address(), "/metrics").1;
    assert!(
        body.contains(r#"modelshare_quota_denials_total{quota="leases",tenant="a"} 35"#),
        "{body}"
    );
    assert!(body.contains(r#"modelshare_quota_denials_total{quota="sessions",tenant="a"} 18"#));
    assert!(body.contains(r#"modelshare_sessions{tenant="a"} 1"#));
    assert!(body.contains(r#"modelshare_leases{tenant="a"} 1"#));
    drop(s);
}

/// Device bytes and models quotas, with concurrent loads racing the bytes quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_quotas_hold_under_concurrency() {
    // Each model is 16384 bytes: 40000 fits two.
    let tenants = TenantsFile::new(&abc_tenants(
        "[tenants.quota]\ndevice_bytes = 40000\nmodels = 2",
    ));
    let names = ["m1", "m2", "m3", "m4", "m5", "m6"];
    let server = start(&tenants, &["--max-concurrent-loads", "16"], &names).await;
    let mut tasks = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let mut a = admin_as(&server, Some(TA)).await;
        let path = n.to_string();
        tasks.push(tokio::spawn(async move {
            load_as(&mut a, &format!("x{i}"), &path, "", None).await
        }));
    }
    let mut ok = 0;
    for t in tasks {
        match t.await.expect("join") {
            Ok(_) => ok += 1,
            Err(s) => {
                assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                let m = s.message();
                assert!(
                    (m.contains("'device_bytes'")
                        && m.contains("limit 40000, in use 32768, requested 16384"))
                        || (m.contains("'models'") && m.contains("limit 2, in use 2")),
                    "{m}"
                );
            }
        }
    }
    assert_eq!(ok, 2);
    let mut a = admin_as(&server, Some(TA)).await;
    let st = a
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(
        (st.tenants[0].device_bytes, st.tenants[0].models),
        (32768, 2)
    );
    // Other tenants are not charged, and b can still load.
    let mut b = admin_as(&server, Some(TB)).await;
    load_as(&mut b, "b1", "m1", "", None)
        .await
        .expect("b loads");
    // Unloading frees the quota.
    let first = names_of(&mut a).await.remove(0);
    a.unload_model(pb::UnloadModelRequest {
        name: first,
        ..Default::default()
    })
    .await
    .expect("unload");
    load_as(&mut a, "again", "m6", "", None)
        .await
        .expect("fits again");
}

async fn names_of(admin: &mut AdminServiceClient<Authed>) -> Vec<String> {
    names(admin).await
}

/// Tickets hold a file descriptor each until redeemed: a session that attaches and goes away
/// without redeeming must not leave them open (or a tenant could exhaust the server's fds
/// within its leases quota, over and over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unredeemed_tickets_close_with_their_session() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&tenants, &[], &["m1"]).await;
    let mut a = admin_as(&server, Some(TA)).await;
    load_as(&mut a, "m", "m1", "", None).await.expect("load");
    let mut w = worker_as(&server, Some(TA)).await;
    let s = session_as(&mut w, "leaky").await.expect("session");
    // Memfds only: the server closes other files meanwhile (the held-memory record of the
    // load is written after the version is ready), which would hide a ticket in a total count.
    let before = common::memfd_fds(server.pid());
    for _ in 0..20 {
        attach(&mut w, &s.id, "m").await.expect("attach");
    }
    let held = common::memfd_fds(server.pid());
    assert_eq!(
        held,
        before + 20,
        "each ticket holds a memfd: {before} → {held}"
    );
    drop(s);
    common::eventually(Duration::from_secs(5), "ticket fds closed", || async {
        common::memfd_fds(server.pid()) == before
    })
    .await;
}
