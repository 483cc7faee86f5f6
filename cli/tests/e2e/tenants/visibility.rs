//! What each tenant sees and may do: listings, describes, attaches, unloads, loads over
//! another's name, sharing, sessions, stats and version events.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use tonic::Code;

use super::{
    ADMIN, Authed, Open, TA, TB, TC, TenantsFile, abc_tenants, admin_as, attach, code, load_as,
    names, public, session_as, shared, start, worker_as,
};

/// An admin-service client of one tenant (or of the admin).
type Admin = AdminServiceClient<Authed>;
/// A worker-service client of one tenant.
type Worker = WorkerServiceClient<Authed>;

/// Three tenants: each sees its own models, those shared with it and public ones; the admin
/// sees all. Models a tenant may not see answer exactly like missing ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_tenants_see_and_attach_only_what_they_may() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&tenants, &[], &["m1", "m2", "m3", "m4", "m5"]).await;
    let (mut a, mut b, mut c, mut root) = (
        admin_as(&server, Some(TA)).await,
        admin_as(&server, Some(TB)).await,
        admin_as(&server, Some(TC)).await,
        admin_as(&server, Some(ADMIN)).await,
    );
    load_private_shared_and_public_models(&mut a, &mut b, &mut root).await;
    assert_each_lists_what_it_may_see(&mut a, &mut b, &mut c, &mut root).await;
    assert_hidden_describes_like_missing(&mut c).await;

    // Attach: shared with b only; public for all; private for the owner only.
    let (mut wa, mut wb, mut wc) = (
        worker_as(&server, Some(TA)).await,
        worker_as(&server, Some(TB)).await,
        worker_as(&server, Some(TC)).await,
    );
    let (sa, sb, sc) = (
        session_as(&mut wa, "wa").await.expect("a session"),
        session_as(&mut wb, "wb").await.expect("b session"),
        session_as(&mut wc, "wc").await.expect("c session"),
    );
    assert_attaches_follow_visibility([&mut wa, &mut wb, &mut wc], [&sa.id, &sb.id, &sc.id]).await;
    assert_others_may_not_unload_or_load_over(&mut b, &mut c, &mut root).await;
    assert_only_the_owner_shares(&mut a, &mut b, &mut c, &mut wc, &sc.id).await;
    assert_sharing_tells_no_more(&mut a, &mut c).await;
    assert_sessions_and_stats_per_tenant(&mut b, &mut root).await;

    // The owner unloads; a forced unload ends the holders of other tenants too.
    a.unload_model(pb::UnloadModelRequest {
        name: "a-shared".into(),
        force: true,
        ..Default::default()
    })
    .await
    .expect("owner unloads");
    drop((sa, sb, sc));
}

/// a loads a private, a shared (with b) and a public model; b one of its own; the admin one
/// for c (c owns it).
async fn load_private_shared_and_public_models(a: &mut Admin, b: &mut Admin, root: &mut Admin) {
    load_as(a, "a-private", "m1", "", None)
        .await
        .expect("a private");
    load_as(a, "a-shared", "m2", "", shared(&["b"]))
        .await
        .expect("a shared");
    load_as(a, "a-public", "m3", "", public())
        .await
        .expect("a public");
    load_as(b, "b-own", "m4", "", None).await.expect("b own");
    // The admin loads for c; c owns it.
    load_as(root, "c-own", "m5", "c", None)
        .await
        .expect("admin for c");
}

/// Each tenant lists its own, shared and public models; the admin lists all, with owners.
async fn assert_each_lists_what_it_may_see(
    a: &mut Admin,
    b: &mut Admin,
    c: &mut Admin,
    root: &mut Admin,
) {
    assert_eq!(names(a).await, ["a-private", "a-public", "a-shared"]);
    assert_eq!(names(b).await, ["a-public", "a-shared", "b-own"]);
    assert_eq!(names(c).await, ["a-public", "c-own"]);
    assert_eq!(
        names(root).await,
        ["a-private", "a-public", "a-shared", "b-own", "c-own"]
    );
    let listed = root
        .describe_model(pb::DescribeModelRequest {
            name: "a-shared".into(),
            version: 0,
        })
        .await
        .expect("admin describes")
        .into_inner()
        .model
        .expect("model");
    assert_eq!(listed.owner, "a");
    assert_eq!(listed.access.expect("access").shared_with, ["b"]);
}

/// Describe: c cannot tell a-shared from a name that does not exist.
async fn assert_hidden_describes_like_missing(c: &mut Admin) {
    let hidden = c
        .describe_model(pb::DescribeModelRequest {
            name: "a-shared".into(),
            version: 0,
        })
        .await
        .expect_err("hidden");
    let missing = c
        .describe_model(pb::DescribeModelRequest {
            name: "no-such".into(),
            version: 0,
        })
        .await
        .expect_err("missing");
    assert_eq!(hidden.code(), Code::NotFound);
    assert_eq!(
        hidden.message().replace("a-shared", "X"),
        missing.message().replace("no-such", "X")
    );
}

/// Attach: shared with b only; public for all; private for the owner only; another tenant's
/// session is none of mine. `workers` and `sessions` are a's, b's and c's.
async fn assert_attaches_follow_visibility(workers: [&mut Worker; 3], sessions: [&str; 3]) {
    let [wa, wb, wc] = workers;
    let [sa, sb, sc] = sessions;
    assert_eq!(code(attach(wb, sb, "a-shared").await), Code::Ok);
    assert_eq!(code(attach(wc, sc, "a-shared").await), Code::NotFound);
    assert_eq!(code(attach(wa, sa, "a-public").await), Code::Ok);
    assert_eq!(code(attach(wb, sb, "a-public").await), Code::Ok);
    assert_eq!(code(attach(wc, sc, "a-public").await), Code::Ok);
    assert_eq!(code(attach(wb, sb, "a-private").await), Code::NotFound);
    assert_eq!(code(attach(wc, sc, "b-own").await), Code::NotFound);
    assert_eq!(code(attach(wa, sa, "a-private").await), Code::Ok);
    // Another tenant's session id is not a session of mine.
    assert_eq!(code(attach(wc, sb, "a-public").await), Code::NotFound);
}

/// Unload: not visible → NOT_FOUND; visible but not owned → PERMISSION_DENIED. Loading over
/// someone else's name: hidden → ALREADY_EXISTS, visible → PERMISSION_DENIED; a tenant may
/// not load for another, nor the admin for a tenant that does not exist.
async fn assert_others_may_not_unload_or_load_over(b: &mut Admin, c: &mut Admin, root: &mut Admin) {
    // Unload: not visible → NOT_FOUND; visible but not owned → PERMISSION_DENIED.
    let unload = |name: &str| pb::UnloadModelRequest {
        name: name.into(),
        ..Default::default()
    };
    assert_eq!(
        code(c.unload_model(unload("a-private")).await),
        Code::NotFound
    );
    assert_eq!(
        code(b.unload_model(unload("a-shared")).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(c.unload_model(unload("a-public")).await),
        Code::PermissionDenied
    );
    // Loading over someone else's name: hidden → ALREADY_EXISTS, visible → PERMISSION_DENIED;
    // a tenant may not load for another.
    assert_eq!(
        code(load_as(c, "a-private", "m1", "", None).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(load_as(b, "a-shared", "m2", "", None).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(load_as(b, "b-two", "m2", "a", None).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(load_as(root, "x", "m2", "nobody", None).await),
        Code::InvalidArgument
    );
}

/// Sharing changes: only the owner may; then c (worker `wc`, session `sc`) can attach.
async fn assert_only_the_owner_shares(
    a: &mut Admin,
    b: &mut Admin,
    c: &mut Admin,
    wc: &mut Worker,
    sc: &str,
) {
    let share_c = pb::SetModelAccessRequest {
        name: "a-shared".into(),
        access: shared(&["b", "c"]),
    };
    assert_eq!(
        code(b.set_model_access(share_c.clone()).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(c.set_model_access(share_c.clone()).await),
        Code::NotFound
    );
    a.set_model_access(share_c).await.expect("owner shares");
    assert_eq!(code(attach(wc, sc, "a-shared").await), Code::Ok);
}

/// A tenant it is shared with does not learn with whom else, nor where the weights are; the
/// owner does.
async fn assert_sharing_tells_no_more(a: &mut Admin, c: &mut Admin) {
    let describe = |name: &str| pb::DescribeModelRequest {
        name: name.into(),
        version: 0,
    };
    let seen_by_c = c
        .describe_model(describe("a-shared"))
        .await
        .expect("c")
        .into_inner();
    let m = seen_by_c.model.expect("model");
    assert_eq!(m.access.expect("access").shared_with, ["c"]);
    assert_eq!(m.versions[0].source, "");
    let seen_by_a = a
        .describe_model(describe("a-shared"))
        .await
        .expect("a")
        .into_inner();
    let m = seen_by_a.model.expect("model");
    assert_eq!(m.access.expect("access").shared_with, ["b", "c"]);
    assert_eq!(m.versions[0].source, "m2");
}

/// Sessions: each tenant sees its own; the admin all. Stats: a tenant sees its own usage only.
async fn assert_sessions_and_stats_per_tenant(b: &mut Admin, root: &mut Admin) {
    let sessions = |s: pb::ListSessionsResponse| -> Vec<(String, String)> {
        s.sessions
            .into_iter()
            .map(|s| (s.worker_name, s.tenant))
            .collect()
    };
    let mine = sessions(
        b.list_sessions(pb::ListSessionsRequest {})
            .await
            .expect("b")
            .into_inner(),
    );
    assert_eq!(mine, [("wb".to_owned(), "b".to_owned())]);
    let all = root
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("admin")
        .into_inner();
    assert_eq!(all.sessions.len(), 3);

    // Stats: a tenant sees its own usage only.
    let stats_b = b
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats_b.tenants.len(), 1);
    assert_eq!(stats_b.tenants[0].name, "b");
    assert_eq!(stats_b.tenants[0].models, 1);
    assert_eq!(stats_b.tenants[0].leases, 2);
    assert_eq!(stats_b.models, 3, "b sees three models");
    let stats_all = root
        .get_stats(pb::GetStatsRequest {})
        .await
        .expect("stats")
        .into_inner();
    assert_eq!(stats_all.tenants.len(), 3);
    assert_eq!(stats_all.models, 5);
}

/// The model of the next VersionReady event of `s` (5 s at most).
async fn next_ready(s: &mut Open) -> String {
    match tokio::time::timeout(Duration::from_secs(5), s.events.message()).await {
        Ok(Ok(Some(pb::SessionEvent {
            kind: Some(pb::session_event::Kind::VersionReady(v)),
        }))) => v.model,
        other => panic!("expected VersionReady, got {other:?}"),
    }
}

/// New versions are announced only to sessions whose tenant may see the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn version_events_do_not_leak_names() {
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&tenants, &[], &["m1", "m2"]).await;
    let mut a = admin_as(&server, Some(TA)).await;
    let (mut wa, mut wc) = (
        worker_as(&server, Some(TA)).await,
        worker_as(&server, Some(TC)).await,
    );
    let mut sa = session_as(&mut wa, "wa").await.expect("a");
    let mut sc = session_as(&mut wc, "wc").await.expect("c");
    load_as(&mut a, "secret", "m1", "", None)
        .await
        .expect("load");
    load_as(&mut a, "open", "m2", "", public())
        .await
        .expect("load");
    assert_eq!(next_ready(&mut sa).await, "secret");
    assert_eq!(next_ready(&mut sa).await, "open");
    // c's first event is the public model's: the secret one was never sent.
    assert_eq!(next_ready(&mut sc).await, "open");
    drop((sa.tx, sc.tx));
}
