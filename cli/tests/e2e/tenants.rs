//! Tenants: tokens, visibility, ownership, sharing, quotas, reload and peer uids, against the
//! real server over its real sockets. Clients here add the bearer header themselves (an
//! independent client of the wire contract); worker processes use the CLI's token options.

use std::path::{Path, PathBuf};
use std::time::Duration;

use modelshare_core::tenants::token::TokenHash;
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::admin_service_client::AdminServiceClient;
use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use safetensors::Dtype;
use tonic::Code;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use crate::common::{self, Server, t};

pub const ADMIN: &str = "ms_admin_token";
pub const TA: &str = "ms_token_of_a";
pub const TB: &str = "ms_token_of_b";
pub const TC: &str = "ms_token_of_c";

/// Adds `authorization: Bearer <token>` to every call (nothing without a token).
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Authed = InterceptedService<Channel, Bearer>;

pub fn bearer(token: Option<&str>) -> Bearer {
    Bearer(token.map(|t| format!("Bearer {t}").parse().expect("ascii token")))
}

pub async fn admin_as(server: &Server, token: Option<&str>) -> AdminServiceClient<Authed> {
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    AdminServiceClient::with_interceptor(ch, bearer(token))
}

pub async fn worker_as(server: &Server, token: Option<&str>) -> WorkerServiceClient<Authed> {
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("connect");
    WorkerServiceClient::with_interceptor(ch, bearer(token))
}

/// `sha256:` hash line for a TOML array.
pub fn h(token: &str) -> String {
    format!("\"{}\"", TokenHash::of(token))
}

/// A tenants file with admin, a, b and c; `extra` is appended (quotas, more tenants).
pub fn abc_tenants(extra_a: &str) -> String {
    format!(
        "[admin]\ntoken_hashes = [{}]\n\n[[tenants]]\nname = \"a\"\ntoken_hashes = [{}]\n{extra_a}\n\n[[tenants]]\nname = \"b\"\ntoken_hashes = [{}]\n\n[[tenants]]\nname = \"c\"\ntoken_hashes = [{}]\n",
        h(ADMIN),
        h(TA),
        h(TB),
        h(TC)
    )
}

/// A tenants file in its own directory (it outlives the server's).
pub struct TenantsFile {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TenantsFile {
    pub fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("tenants.toml");
        std::fs::write(&path, text).expect("write tenants");
        Self { _dir: dir, path }
    }

    /// Replaces the file atomically (as an operator's config management would).
    pub fn rewrite(&self, text: &str) {
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, text).expect("write");
        std::fs::rename(&tmp, &self.path).expect("rename");
    }
}

/// Writes small one-tensor models named `names` (16 KiB each) under the root.
pub fn models(root: &Path, names: &[&str]) {
    for (i, n) in names.iter().enumerate() {
        common::write_safetensors(
            &root.join(n).join("model.safetensors"),
            &[t("w", Dtype::F32, &[64, 64], i as u64 + 1)],
        );
    }
}

pub async fn start(tenants: &TenantsFile, extra: &[&str], names: &[&str]) -> Server {
    let mut args = vec!["--tenants-file", tenants.path.to_str().expect("utf-8")];
    args.extend_from_slice(extra);
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    Server::start_with(&args, move |root| {
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        models(root, &refs);
    })
    .await
}

/// Loads `name` from directory `path` as the token's caller, with an optional access and owner.
pub async fn load_as(
    admin: &mut AdminServiceClient<Authed>,
    name: &str,
    path: &str,
    tenant: &str,
    access: Option<pb::ModelAccess>,
) -> Result<pb::VersionInfo, tonic::Status> {
    let stream = admin
        .load_model(pb::LoadModelRequest {
            name: name.into(),
            path: path.into(),
            tenant: tenant.into(),
            access,
            ..Default::default()
        })
        .await?
        .into_inner();
    common::until_done(stream).await
}

pub fn shared(with: &[&str]) -> Option<pb::ModelAccess> {
    Some(pb::ModelAccess {
        shared_with: with.iter().map(|s| s.to_string()).collect(),
        public: false,
    })
}

pub fn public() -> Option<pb::ModelAccess> {
    Some(pb::ModelAccess {
        shared_with: Vec::new(),
        public: true,
    })
}

/// An open session: the stream stays open while this lives.
pub struct Open {
    pub id: String,
    pub tx: tokio::sync::mpsc::Sender<pb::SessionRequest>,
    pub events: tonic::Streaming<pb::SessionEvent>,
}

pub async fn session_as(
    client: &mut WorkerServiceClient<Authed>,
    name: &str,
) -> Result<Open, tonic::Status> {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SessionRequest {
        kind: Some(pb::session_request::Kind::Hello(pb::Hello {
            worker_name: name.into(),
            pid: std::process::id(),
            ..Default::default()
        })),
    })
    .await
    .expect("hello");
    let mut events = client
        .session(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    match events.message().await?.and_then(|e| e.kind) {
        Some(pb::session_event::Kind::Welcome(w)) => Ok(Open {
            id: w.session_id,
            tx,
            events,
        }),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

pub async fn attach(
    client: &mut WorkerServiceClient<Authed>,
    session: &str,
    model: &str,
) -> Result<pb::AttachResponse, tonic::Status> {
    client
        .attach(pb::AttachRequest {
            device_uuid: String::new(),
            session_id: session.into(),
            model: model.into(),
            version: 0,
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn names(admin: &mut AdminServiceClient<Authed>) -> Vec<String> {
    admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("ListModels")
        .into_inner()
        .models
        .into_iter()
        .map(|m| m.name)
        .collect()
}

fn code<T: std::fmt::Debug>(r: Result<T, tonic::Status>) -> Code {
    match r {
        Ok(_) => Code::Ok,
        Err(s) => s.code(),
    }
}

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
    load_as(&mut a, "a-private", "m1", "", None)
        .await
        .expect("a private");
    load_as(&mut a, "a-shared", "m2", "", shared(&["b"]))
        .await
        .expect("a shared");
    load_as(&mut a, "a-public", "m3", "", public())
        .await
        .expect("a public");
    load_as(&mut b, "b-own", "m4", "", None)
        .await
        .expect("b own");
    // The admin loads for c; c owns it.
    load_as(&mut root, "c-own", "m5", "c", None)
        .await
        .expect("admin for c");

    assert_eq!(names(&mut a).await, ["a-private", "a-public", "a-shared"]);
    assert_eq!(names(&mut b).await, ["a-public", "a-shared", "b-own"]);
    assert_eq!(names(&mut c).await, ["a-public", "c-own"]);
    assert_eq!(
        names(&mut root).await,
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

    // Describe: c cannot tell a-shared from a name that does not exist.
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
    assert_eq!(code(attach(&mut wb, &sb.id, "a-shared").await), Code::Ok);
    assert_eq!(
        code(attach(&mut wc, &sc.id, "a-shared").await),
        Code::NotFound
    );
    assert_eq!(code(attach(&mut wa, &sa.id, "a-public").await), Code::Ok);
    assert_eq!(code(attach(&mut wb, &sb.id, "a-public").await), Code::Ok);
    assert_eq!(code(attach(&mut wc, &sc.id, "a-public").await), Code::Ok);
    assert_eq!(
        code(attach(&mut wb, &sb.id, "a-private").await),
        Code::NotFound
    );
    assert_eq!(code(attach(&mut wc, &sc.id, "b-own").await), Code::NotFound);
    assert_eq!(code(attach(&mut wa, &sa.id, "a-private").await), Code::Ok);
    // Another tenant's session id is not a session of mine.
    assert_eq!(
        code(attach(&mut wc, &sb.id, "a-public").await),
        Code::NotFound
    );

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
        code(load_as(&mut c, "a-private", "m1", "", None).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(load_as(&mut b, "a-shared", "m2", "", None).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(load_as(&mut b, "b-two", "m2", "a", None).await),
        Code::PermissionDenied
    );
    assert_eq!(
        code(load_as(&mut root, "x", "m2", "nobody", None).await),
        Code::InvalidArgument
    );

    // Sharing changes: only the owner may; then c can attach.
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
    assert_eq!(code(attach(&mut wc, &sc.id, "a-shared").await), Code::Ok);
    // A tenant it is shared with does not learn with whom else, nor where the weights are.
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

    // Sessions: each tenant sees its own; the admin all.
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
        Rpc::ListModels => match admin.list_models(pb::ListModelsRequest {}).await {
            Ok(r) => {
                let names: Vec<String> =
                    r.into_inner().models.into_iter().map(|m| m.name).collect();
                assert!(!names.contains(&"a-private".to_owned()), "{names:?}");
                Code::Ok
            }
            Err(s) => s.code(),
        },
        Rpc::DescribeModel => code(
            admin
                .describe_model(pb::DescribeModelRequest {
                    name: "a-private".into(),
                    version: 0,
                })
                .await,
        ),
        Rpc::GetStats => match admin.get_stats(pb::GetStatsRequest {}).await {
            Ok(r) => {
                let r = r.into_inner();
                assert!(r.tenants.iter().all(|u| u.name != "a"), "{:?}", r.tenants);
                Code::Ok
            }
            Err(s) => s.code(),
        },
        Rpc::ListSessions => match admin.list_sessions(pb::ListSessionsRequest {}).await {
            Ok(r) => {
                let r = r.into_inner();
                assert!(r.sessions.iter().all(|s| s.session_id != t.session));
                Code::Ok
            }
            Err(s) => s.code(),
        },
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
        Rpc::Reflection => {
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
        Rpc::Health => {
            let mut hc = tonic_health::pb::health_client::HealthClient::with_interceptor(ch, auth);
            code(
                hc.check(tonic_health::pb::HealthCheckRequest {
                    service: String::new(),
                })
                .await,
            )
        }
    }
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

const TB2: &str = "ms_rotated_token_of_b";
const TD: &str = "ms_token_of_d";

async fn list_code(server: &Server, token: &str) -> Code {
    code(
        admin_as(server, Some(token))
            .await
            .list_models(pb::ListModelsRequest {})
            .await,
    )
}

async fn session_ids(server: &Server) -> Vec<(String, String, usize)> {
    admin_as(server, Some(ADMIN))
        .await
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("sessions")
        .into_inner()
        .sessions
        .into_iter()
        .map(|s| (s.session_id, s.tenant, s.leases.len()))
        .collect()
}

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
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    common::eventually(Duration::from_secs(5), "the SIGHUP reload", || async {
        list_code(&server, TB2).await == Code::Ok
    })
    .await;
    assert_eq!(list_code(&server, TB).await, Code::Unauthenticated);
    assert_eq!(list_code(&server, TC).await, Code::Unauthenticated);
    let quota = admin_as(&server, Some(TA))
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

    // Well past the heartbeat deadline (300 ms), b's session is the same one, lease held.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(worker.running(), "the worker process must keep running");
    assert_eq!(
        session_ids(&server).await,
        before,
        "the session must survive the reload"
    );

    // The RPC: d does not exist until the admin reloads.
    let v3 = format!(
        "{v2}\n[[tenants]]\nname = \"d\"\ntoken_hashes = [{}]\n",
        h(TD)
    );
    tenants.rewrite(&v3);
    assert_eq!(list_code(&server, TD).await, Code::Unauthenticated);
    let reply = admin_as(&server, Some(ADMIN))
        .await
        .reload_tenants(pb::ReloadTenantsRequest {})
        .await
        .expect("reload")
        .into_inner();
    assert_eq!(reply.tenants, ["a", "b", "d"]);
    assert_eq!(reply.admin_tokens, 1);
    assert_eq!(list_code(&server, TD).await, Code::Ok);

    // A broken file is refused with its place; the tenants in force stay.
    tenants.rewrite("[[tenants]]\nname = \"d\"\ntoken_hashes = [\"ms_pasted_plaintext\"]\n");
    let err = admin_as(&server, Some(ADMIN))
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
    let hup = std::process::Command::new("kill")
        .args(["-HUP", &server.pid().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(list_code(&server, TD).await, Code::Ok);
    assert_eq!(list_code(&server, TB2).await, Code::Ok);
    assert!(worker.running());
    assert_eq!(session_ids(&server).await, before);
    assert!(server.log().contains("tenants not reloaded"));
}

fn effective_uid() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        })
        .and_then(|u| u.parse().ok())
        .expect("uid from /proc/self/status")
}

/// A tenant bound to a uid: a real worker process running as that uid attaches; the same
/// token from another uid (a second real uid, and root) or over TCP is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uid_bound_tenants_are_refused_from_other_uids() {
    if effective_uid() != 0 {
        eprintln!(
            "SKIPPED uid_bound_tenants_are_refused_from_other_uids: needs root to run workers as other uids"
        );
        return;
    }
    const BOUND: &str = "ms_token_of_bound";
    const FREE: &str = "ms_token_of_free";
    let (allowed, other) = (42_420, 42_421);
    let tenants = TenantsFile::new(&format!(
        "[admin]\ntoken_hashes = [{}]\n[[tenants]]\nname = \"bound\"\ntoken_hashes = [{}]\nuids = [{allowed}]\n[[tenants]]\nname = \"free\"\ntoken_hashes = [{}]\n",
        h(ADMIN),
        h(BOUND),
        h(FREE)
    ));
    let server = start(
        &tenants,
        &["--unix-socket-mode", "0666", "--listen", "127.0.0.1:0"],
        &["m1"],
    )
    .await;
    // Let other uids reach the sockets in the server's directory.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(server.dir.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
    }
    let mut root = admin_as(&server, Some(ADMIN)).await;
    load_as(&mut root, "m", "m1", "", public())
        .await
        .expect("load");

    let env_bound = [("MODELSHARE_TOKEN", BOUND)];
    let mut ok =
        common::Worker::try_start_as(&server.address, "m", "ok", &env_bound, Some(allowed))
            .expect("the bound uid attaches");
    assert_eq!(ok.report["verified"], true, "{}", ok.report);
    let sessions = session_ids(&server).await;
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].1, "bound");

    for uid in [Some(other), None] {
        let err = common::Worker::try_start_as(&server.address, "m", "intruder", &env_bound, uid)
            .err()
            .unwrap_or_else(|| panic!("uid {uid:?} must be refused"));
        assert!(err.contains("permission denied"), "{err}");
        let shown = uid.unwrap_or(0);
        assert!(err.contains(&format!("uid {shown}")), "{err}");
    }
    // The same second uid with a tenant that is not bound works: the refusal is the binding.
    let free = common::Worker::try_start_as(
        &server.address,
        "m",
        "free",
        &[("MODELSHARE_TOKEN", FREE)],
        Some(other),
    )
    .expect("an unbound tenant attaches from any uid");
    assert_eq!(free.report["verified"], true);

    // Over TCP the uid is unknown: a bound tenant is refused there.
    let tcp = server.tcp_address();
    let ch = tonic::transport::Endpoint::from_shared(format!("http://{tcp}"))
        .expect("url")
        .connect()
        .await
        .expect("tcp connect");
    let mut over_tcp = AdminServiceClient::with_interceptor(ch, bearer(Some(BOUND)));
    let err = over_tcp
        .list_models(pb::ListModelsRequest {})
        .await
        .expect_err("refused over tcp");
    assert_eq!(err.code(), Code::PermissionDenied);
    assert!(err.message().contains("Unix socket"), "{}", err.message());
    assert!(ok.running());
    drop((ok, free));
}

/// A tenant with a model directory loads only from under it: not by `..`, not by a path of
/// another tenant's directory, not through a symlink out of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_dir_confines_a_tenants_loads() {
    let tenants = TenantsFile::new(&abc_tenants("model_dir = \"team-a\""));
    let server = Server::start_with(
        &["--tenants-file", tenants.path.to_str().expect("utf-8")],
        |root| {
            models(&root.join("team-a"), &["mine"]);
            models(&root.join("team-b"), &["theirs"]);
            std::os::unix::fs::symlink(root.join("team-b/theirs"), root.join("team-a/sneaky"))
                .expect("symlink");
            std::os::unix::fs::symlink(root.join("team-a/mine"), root.join("a-link"))
                .expect("symlink");
            // a's secrets: a config and a broken weight file.
            std::fs::write(root.join("team-a/mine/config.json"), b"{\"secret\":1}")
                .expect("config");
            std::fs::create_dir_all(root.join("team-a/broken")).expect("dir");
            std::fs::write(
                root.join("team-a/broken/model.safetensors"),
                b"\x05\0\0\0\0\0\0\0{bad}",
            )
            .expect("broken");
            // b's model whose config.json is a link into a's directory.
            std::os::unix::fs::symlink(
                root.join("team-a/mine/config.json"),
                root.join("team-b/theirs/config.json"),
            )
            .expect("symlink");
            std::fs::write(root.join("team-b/theirs/tokenizer.json"), b"{}").expect("own file");
        },
    )
    .await;
    let mut a = admin_as(&server, Some(TA)).await;
    let v = load_as(&mut a, "mine", "mine", "", None)
        .await
        .expect("own dir");
    assert_eq!(v.source, "team-a/mine");
    for (path, want) in [
        ("../team-b/theirs", Code::InvalidArgument),
        ("team-b/theirs", Code::NotFound),
        ("sneaky", Code::InvalidArgument),
    ] {
        let got = load_as(&mut a, "x", path, "", None).await;
        assert_eq!(code(got), want, "{path}");
    }
    // b has no model dir: paths are relative to the root, but a's directory is out of bounds,
    // directly or through a link, and looks like a missing path.
    let mut b = admin_as(&server, Some(TB)).await;
    load_as(&mut b, "theirs", "team-b/theirs", "", None)
        .await
        .expect("b loads from the root");
    // Probing a's directory tells b nothing: an existing model, a file, a broken file and a
    // missing path all answer exactly as a missing path does.
    for path in [
        "team-a/mine",
        "a-link",
        "team-a/mine/model.safetensors",
        "team-a/broken",
        "team-a/broken/model.safetensors",
        "team-a/nothing-here",
    ] {
        let err = load_as(&mut b, "stolen", path, "", None)
            .await
            .expect_err("another tenant's directory");
        assert_eq!(err.code(), Code::NotFound, "{path}: {err:?}");
        let missing = format!("'{path}' does not exist");
        assert!(
            err.message().contains(&missing),
            "{path}: {}",
            err.message()
        );
    }
    // A metadata file linked into a's directory is not read: b's model loads without it.
    let mut admin = admin_as(&server, Some(ADMIN)).await;
    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "theirs".into(),
            version: 0,
        })
        .await
        .expect("describe")
        .into_inner();
    let files: Vec<String> = d
        .manifest
        .expect("manifest")
        .files
        .into_iter()
        .map(|f| f.name)
        .collect();
    assert_eq!(
        files,
        ["tokenizer.json"],
        "a's config.json was served to b's workers"
    );
    // The admin may load from anywhere.
    let mut root = admin_as(&server, Some(ADMIN)).await;
    load_as(&mut root, "admin-copy", "team-a/mine", "", None)
        .await
        .expect("admin");
}

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
