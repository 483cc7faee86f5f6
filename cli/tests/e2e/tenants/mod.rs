//! Tenants: tokens, visibility, ownership, sharing, quotas, reload and peer uids, against the
//! real server over its real sockets. Clients here add the bearer header themselves (an
//! independent client of the wire contract); worker processes use the CLI's token options.
//!
//! Here: the shared helpers (tokens, clients, the tenants file, loads, sessions, attaches);
//! the tests by subject in the submodules.

use std::path::{Path, PathBuf};

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

mod audit;
mod confinement;
mod memory;
mod quotas;
mod refusals;
mod reload;
mod visibility;

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
