//! Every RPC against bad tokens, malformed headers and another tenant's token.

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use tonic::Code;
use tonic::transport::Channel;

use super::{
    Authed, Bearer, TA, TC, TenantsFile, abc_tenants, admin_as, attach, bearer, code, load_as,
    public, session_as, start, worker_as,
};
use crate::common::Server;

/// Every RPC of the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rpc {
    LoadModel,
    UnloadModel,
    ListModels,
    DescribeModel,
    GetStats,
    ListSessions,
    SetModelAccess,
    ReloadTenants,
    Session,
    Attach,
    Release,
    Reflection,
    Health,
}

/// What tenant a holds, for the calls of others to aim at.
struct Target {
    session: String,
    lease: String,
}

/// The code `rpc` answers with the token `token` (or the raw header value `raw`), aimed at
/// tenant a's model `a-private` and at `t`; an answer that lists something of a's fails.
async fn call(
    server: &Server,
    rpc: Rpc,
    token: Option<&str>,
    raw: Option<&str>,
    t: &Target,
) -> Code {
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    // `raw` replaces the whole header value (a malformed one).
    let auth = match raw {
        Some(v) => Bearer(Some(v.parse().expect("ascii"))),
        None => bearer(token),
    };
    let mut admin = AdminServiceClient::with_interceptor(ch.clone(), auth.clone());
    let mut worker = WorkerServiceClient::with_interceptor(ch.clone(), auth.clone());
    match rpc {
        Rpc::LoadModel => code(load_as(&mut admin, "a-private", "m1", "", None).await),
        Rpc::UnloadModel => code(
            admin
                .unload_model(pb::UnloadModelRequest {
                    name: "a-private".into(),
                    force: true,
                    ..Default::default()
                })
                .await,
        ),
        Rpc::ListModels => list_models_hiding_a(&mut admin).await,
        Rpc::DescribeModel => code(
            admin
                .describe_model(pb::DescribeModelRequest {
                    name: "a-private".into(),
                    version: 0,
                })
                .await,
        ),
        Rpc::GetStats => stats_hiding_a(&mut admin).await,
        Rpc::ListSessions => list_sessions_hiding(&mut admin, t).await,
        Rpc::SetModelAccess => code(
            admin
                .set_model_access(pb::SetModelAccessRequest {
                    name: "a-private".into(),
                    access: public(),
                })
                .await,
        ),
        Rpc::ReloadTenants => code(admin.reload_tenants(pb::ReloadTenantsRequest {}).await),
        Rpc::Session => code(session_as(&mut worker, "intruder").await.map(|s| s.id)),
        Rpc::Attach => code(attach(&mut worker, &t.session, "a-private").await),
        Rpc::Release => code(
            worker
                .release(pb::ReleaseRequest {
                    session_id: t.session.clone(),
                    lease_id: t.lease.clone(),
                })
                .await,
        ),
        Rpc::Reflection => reflection(ch, auth).await,
        Rpc::Health => health(ch, auth).await,
    }
}

/// ListModels' code; a listing that names a's private model fails.
async fn list_models_hiding_a(admin: &mut AdminServiceClient<Authed>) -> Code {
    match admin.list_models(pb::ListModelsRequest {}).await {
        Ok(r) => {
            let names: Vec<String> = r.into_inner().models.into_iter().map(|m| m.name).collect();
            assert!(!names.contains(&"a-private".to_owned()), "{names:?}");
            Code::Ok
        }
        Err(s) => s.code(),
    }
}

/// GetStats' code; stats that show tenant a fail.
async fn stats_hiding_a(admin: &mut AdminServiceClient<Authed>) -> Code {
    match admin.get_stats(pb::GetStatsRequest {}).await {
        Ok(r) => {
            let r = r.into_inner();
            assert!(r.tenants.iter().all(|u| u.name != "a"), "{:?}", r.tenants);
            Code::Ok
        }
        Err(s) => s.code(),
    }
}

/// ListSessions' code; a listing that shows a's session `t.session` fails.
async fn list_sessions_hiding(admin: &mut AdminServiceClient<Authed>, t: &Target) -> Code {
    match admin.list_sessions(pb::ListSessionsRequest {}).await {
        Ok(r) => {
            let r = r.into_inner();
            assert!(r.sessions.iter().all(|s| s.session_id != t.session));
            Code::Ok
        }
        Err(s) => s.code(),
    }
}

/// The code of a reflection ListServices call (its first answer's).
async fn reflection(ch: Channel, auth: Bearer) -> Code {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    let mut r = ServerReflectionClient::with_interceptor(ch, auth);
    let req = tonic_reflection::pb::v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    match r
        .server_reflection_info(tokio_stream::iter(vec![req]))
        .await
    {
        Ok(s) => code(s.into_inner().message().await),
        Err(s) => s.code(),
    }
}

/// The code of a health check of the whole server.
async fn health(ch: Channel, auth: Bearer) -> Code {
    let mut hc = tonic_health::pb::health_client::HealthClient::with_interceptor(ch, auth);
    code(
        hc.check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await,
    )
}

/// Every RPC with no token, a wrong token, a malformed header and another tenant's token
/// (tenant c aiming at tenant a's model, session and lease). Nothing of a's may change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_bad_tokens_and_other_tenants() {
    use Code::*;
    let tenants = TenantsFile::new(&abc_tenants(""));
    let server = start(&tenants, &[], &["m1"]).await;
    let mut a = admin_as(&server, Some(TA)).await;
    load_as(&mut a, "a-private", "m1", "", None)
        .await
        .expect("load");
    let mut wa = worker_as(&server, Some(TA)).await;
    let sa = session_as(&mut wa, "holder").await.expect("session");
    let lease = attach(&mut wa, &sa.id, "a-private")
        .await
        .expect("attach")
        .lease_id;
    let target = Target {
        session: sa.id.clone(),
        lease: lease.clone(),
    };
    let u = Unauthenticated;
    // (rpc, no token, wrong token, malformed header, tenant c)
    let table = [
        (Rpc::LoadModel, u, u, u, AlreadyExists),
        (Rpc::UnloadModel, u, u, u, NotFound),
        (Rpc::ListModels, u, u, u, Ok),
        (Rpc::DescribeModel, u, u, u, NotFound),
        (Rpc::GetStats, u, u, u, Ok),
        (Rpc::ListSessions, u, u, u, Ok),
        (Rpc::SetModelAccess, u, u, u, NotFound),
        (Rpc::ReloadTenants, u, u, u, PermissionDenied),
        (Rpc::Session, u, u, u, Ok),
        (Rpc::Attach, u, u, u, NotFound),
        (Rpc::Release, u, u, u, NotFound),
        (Rpc::Reflection, u, u, u, Ok),
        (Rpc::Health, Ok, Ok, Ok, Ok),
    ];
    let mut failures = Vec::new();
    for (rpc, none, wrong, malformed, other) in table {
        let got = [
            call(&server, rpc, None, None, &target).await,
            call(&server, rpc, Some("ms_not_a_token"), None, &target).await,
            call(&server, rpc, None, Some(&format!("Basic {TA}")), &target).await,
            call(&server, rpc, Some(TC), None, &target).await,
        ];
        if got != [none, wrong, malformed, other] {
            failures.push(format!(
                "{rpc:?}: got {got:?}, want {:?}",
                [none, wrong, malformed, other]
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Tenant a's model, session and lease are untouched.
    let d = a
        .describe_model(pb::DescribeModelRequest {
            name: "a-private".into(),
            version: 0,
        })
        .await
        .expect("still there")
        .into_inner();
    assert_eq!(
        d.model.expect("model").access.expect("access"),
        pb::ModelAccess::default()
    );
    let mine = a
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("ls")
        .into_inner();
    assert_eq!(mine.sessions.len(), 1);
    assert_eq!(mine.sessions[0].leases[0].lease_id, lease);
    // The refusals are in the audit log, without any token.
    let log = server.log();
    assert!(log.contains("modelshare::audit"), "no audit events:\n{log}");
    assert!(log.contains("action=\"authenticate\"") || log.contains("action=authenticate"));
    for token in [TA, TC, "ms_not_a_token"] {
        assert!(!log.contains(token), "token {token} in the log");
    }
    drop(sa);
}
