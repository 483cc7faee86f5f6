//! Reloading the tenants file (SIGHUP and the RPC): new calls change, sessions stay.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use tonic::Code;

use super::{
    ADMIN, TA, TB, TC, TenantsFile, abc_tenants, admin_as, h, list_code, load_as, session_ids,
    shared, start,
};
use crate::common::{self, Server};

const TB2: &str = "ms_rotated_token_of_b";
const TD: &str = "ms_token_of_d";

/// Reloading (SIGHUP, then the RPC) changes access for new calls, keeps healthy sessions
/// (a real worker process of a tenant whose token was rotated out keeps its session and lease),
/// and a broken file changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_changes_new_calls_and_keeps_sessions() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(
        &tenants,
        &["--heartbeat-interval-ms", "100", "--heartbeat-misses", "3"],
        &["m1"],
    )
    .await;
    let mut a = admin_as(&server, Some(TA)).await;
    load_as(&mut a, "shared", "m1", "", shared(&["b"]))
        .await
        .expect("load");
    let mut worker = common::Worker::try_start_as(
        &server.address,
        "shared",
        "b-worker",
        &[("MODELSHARE_TOKEN", TB)],
        None,
    )
    .expect("b's worker attaches");
    assert_eq!(worker.report["verified"], true);
    let before = session_ids(&server).await;
    assert_eq!(before.len(), 1);
    assert_eq!((before[0].1.as_str(), before[0].2), ("b", 1));

    let v2 = rotate_b_drop_c_and_cap_a_by_sighup(&server, &tenants).await;

    // Well past the heartbeat deadline (300 ms), b's session is the same one, lease held.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(worker.running(), "the worker process must keep running");
    assert_eq!(
        session_ids(&server).await,
        before,
        "the session must survive the reload"
    );

    add_d_by_the_reload_rpc(&server, &tenants, &v2).await;
    refuse_a_broken_file(&server, &tenants).await;
    assert!(worker.running());
    assert_eq!(session_ids(&server).await, before);
    assert!(server.log().contains("tenants not reloaded"));
}

/// Sends SIGHUP to the server.
fn sighup(server: &Server) {
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
}

/// Rotates b's token, drops c and caps a's leases; SIGHUP; checks new calls see it. Returns
/// the file written.
async fn rotate_b_drop_c_and_cap_a_by_sighup(server: &Server, tenants: &TenantsFile) -> String {
    // Rotate b's token, drop c, cap a's leases; SIGHUP.
    let v2 = abc_tenants("[tenants.quota]\nleases = 1")
        .replace(&h(TB), &h(TB2))
        .replace(
            &format!(
                "\n\n[[tenants]]\nname = \"c\"\ntoken_hashes = [{}]\n",
                h(TC)
            ),
            "\n",
        );
    assert!(!v2.contains(&h(TC)));
    tenants.rewrite(&v2);
    sighup(server);
    common::eventually(Duration::from_secs(5), "the SIGHUP reload", || async {
        list_code(server, TB2).await == Code::Ok
    })
    .await;
    assert_eq!(list_code(server, TB).await, Code::Unauthenticated);
    assert_eq!(list_code(server, TC).await, Code::Unauthenticated);
    let quota = admin_as(server, Some(TA))
        .await
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner()
        .tenants[0]
        .quota
        .expect("quota")
        .leases;
    assert_eq!(quota, 1);
    v2
}

/// The RPC: d (added to `v2`) does not exist until the admin reloads.
async fn add_d_by_the_reload_rpc(server: &Server, tenants: &TenantsFile, v2: &str) {
    let v3 = format!(
        "{v2}\n[[tenants]]\nname = \"d\"\ntoken_hashes = [{}]\n",
        h(TD)
    );
    tenants.rewrite(&v3);
    assert_eq!(list_code(server, TD).await, Code::Unauthenticated);
    let reply = admin_as(server, Some(ADMIN))
        .await
        .reload_tenants(pb::ReloadTenantsRequest {})
        .await
        .expect("reload")
        .into_inner();
    assert_eq!(reply.tenants, ["a", "b", "d"]);
    assert_eq!(reply.admin_tokens, 1);
    assert_eq!(list_code(server, TD).await, Code::Ok);
}

/// A broken file is refused with its place, by the RPC and by SIGHUP; the tenants in force
/// stay.
async fn refuse_a_broken_file(server: &Server, tenants: &TenantsFile) {
    tenants.rewrite("[[tenants]]\nname = \"d\"\ntoken_hashes = [\"ms_pasted_plaintext\"]\n");
    let err = admin_as(server, Some(ADMIN))
        .await
        .reload_tenants(pb::ReloadTenantsRequest {})
        .await
        .expect_err("broken file");
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("token_hashes[0]"),
        "{}",
        err.message()
    );
    assert!(!err.message().contains("pasted_plaintext"));
    sighup(server);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(list_code(server, TD).await, Code::Ok);
    assert_eq!(list_code(server, TB2).await, Code::Ok);
}
