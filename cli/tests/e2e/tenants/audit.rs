//! The audit log of tenants' actions and refusals.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use tonic::Code;

use super::{
    TA, TB, TC, TenantsFile, abc_tenants, admin_as, attach, code, list_code, load_as, session_as,
    shared, start, worker_as,
};
use crate::common;

/// The audit log: one JSON event per load, set_access, attach, release, unload and refusal,
/// on its own target, naming the caller and never a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_log_records_actions_and_refusals() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&tenants, &["--log-format", "json"], &["m1"]).await;
    let mut a = admin_as(&server, Some(TA)).await;
    load_as(&mut a, "m", "m1", "", None).await.expect("load");
    a.set_model_access(pb::SetModelAccessRequest {
        name: "m".into(),
        access: shared(&["b"]),
    })
    .await
    .expect("share");
    let mut wb = worker_as(&server, Some(TB)).await;
    let sb = session_as(&mut wb, "wb").await.expect("session");
    let lease = attach(&mut wb, &sb.id, "m").await.expect("attach").lease_id;
    wb.release(pb::ReleaseRequest {
        session_id: sb.id.clone(),
        lease_id: lease,
    })
    .await
    .expect("release");
    let mut wc = worker_as(&server, Some(TC)).await;
    let sc = session_as(&mut wc, "wc").await.expect("session");
    assert_eq!(code(attach(&mut wc, &sc.id, "m").await), Code::NotFound);
    assert_eq!(list_code(&server, "ms_bogus").await, Code::Unauthenticated);
    a.unload_model(pb::UnloadModelRequest {
        name: "m".into(),
        ..Default::default()
    })
    .await
    .expect("unload");
    drop((sb, sc));
    common::eventually(Duration::from_secs(5), "session ends audited", || async {
        server.log().matches("\"session_end\"").count() >= 2
    })
    .await;

    let events: Vec<serde_json::Value> = server
        .log()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["target"] == "modelshare::audit")
        .map(|v| v["fields"].clone())
        .collect();
    let find = |action: &str, caller: &str, outcome: &str| {
        events.iter().find(|f| {
            f["action"] == action
                && (caller.is_empty() || f["caller"] == caller)
                && f["outcome"] == outcome
        })
    };
    let load = find("load", "a", "ok").expect("load audited");
    assert_eq!(
        (load["model"].as_str(), load["version"].as_u64()),
        (Some("m"), Some(1))
    );
    assert!(find("set_access", "a", "ok").is_some());
    let att = find("attach", "b", "ok").expect("attach audited");
    assert_eq!(att["model"], "m");
    let rel = find("release", "b", "ok").expect("release audited");
    assert_eq!(
        (rel["model"].as_str(), rel["version"].as_u64()),
        (Some("m"), Some(1))
    );
    let denied = find("attach", "c", "refused").expect("denied attach audited");
    assert_eq!(denied["code"], "NotFound");
    let auth = find("authenticate", "", "refused").expect("auth refusal audited");
    assert_eq!(auth["reason"], "unknown_token");
    assert!(
        auth["peer"].as_str().is_some_and(|p| p.starts_with("unix")),
        "{auth}"
    );
    assert!(find("unload", "a", "ok").is_some());
    assert!(find("session_open", "b", "ok").is_some());
    let ended = find("session_end", "c", "ok").expect("session end audited");
    assert_eq!(ended["detail"], "closed");
    let log = server.log();
    for token in [TA, TB, TC, "ms_bogus"] {
        assert!(!log.contains(token), "token {token} in the log");
    }
}
