//! The authentication layer: a tower layer over every gRPC service of the server.
//!
//! For each request it reads `authorization: Bearer <token>`, resolves the token against the
//! tenant table in force and puts the [`Caller`] in the request's extensions, where the
//! services find it ([`caller_of`]). It refuses, before any service runs:
//! - a missing, malformed or unknown token: UNAUTHENTICATED;
//! - a tenant bound to uids calling from another uid, or over TCP: PERMISSION_DENIED;
//! - a tenant past its in-flight quota: RESOURCE_EXHAUSTED.
//!
//! `grpc.health.v1.Health` stays open (probes carry no token). Without a tenants file every
//! request passes as [`Caller::Admin`]. Refusals are written to the audit log and counted;
//! the token itself is never logged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

use tonic::codegen::http;
use tonic::transport::server::UdsConnectInfo;
use tower::{Layer, Service};

use crate::audit;
use modelshare_core::error::CoreError;
use modelshare_core::metrics::Metrics;
use modelshare_core::tenants::caller::Caller;
use modelshare_core::tenants::quota::{Quota, Resource};
use modelshare_core::tenants::store::TenantStore;
use modelshare_core::tenants::token::MAX_TOKEN_BYTES;

/// Paths that need no token.
const OPEN_SERVICES: &[&str] = &["/grpc.health.v1.Health/"];
/// The one streaming call that lives as long as a worker: counted by the sessions quota, not
/// as a request in flight.
const SESSION_PATH: &str = "/modelshare.v1.WorkerService/Session";

/// The caller the auth layer admitted, or INTERNAL if the layer did not run (a wiring bug:
/// never fall back to admin).
pub fn caller_of<T>(request: &tonic::Request<T>) -> Result<Caller, CoreError> {
    request
        .extensions()
        .get::<Caller>()
        .cloned()
        .ok_or_else(|| CoreError::Internal("request reached a service without a caller".into()))
}

/// The layer.
#[derive(Debug, Clone)]
pub struct AuthLayer {
    store: Arc<TenantStore>,
    metrics: Arc<Metrics>,
}

impl AuthLayer {
    /// Authenticating against `store`, counting refusals into `metrics`.
    pub fn new(store: Arc<TenantStore>, metrics: Arc<Metrics>) -> Self {
        Self { store, metrics }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = Auth<S>;
    fn layer(&self, inner: S) -> Self::Service {
        Auth {
            inner,
            store: self.store.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// The service the layer wraps around the gRPC router.
#[derive(Debug, Clone)]
pub struct Auth<S> {
    inner: S,
    store: Arc<TenantStore>,
    metrics: Arc<Metrics>,
}

/// Decrements a tenant's in-flight count when the request's response head is out (or the
/// request is dropped).
/// A request of a tenant counted in flight, until dropped.
#[derive(Debug)]
pub struct InflightGuard(Arc<AtomicU32>);

impl Drop for InflightGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The token of an `authorization: Bearer <token>` header.
fn bearer(headers: &http::HeaderMap) -> Result<&str, &'static str> {
    let value = headers.get(http::header::AUTHORIZATION).ok_or("missing")?;
    let text = value.to_str().map_err(|_| "malformed")?;
    let (scheme, token) = text.split_once(' ').ok_or("malformed")?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err("malformed");
    }
    let token = token.trim();
    if token.is_empty() || token.len() > MAX_TOKEN_BYTES {
        return Err("malformed");
    }
    Ok(token)
}

/// The uid of the peer process, as the kernel reported it for a Unix-socket connection
/// (`SO_PEERCRED`); `None` over TCP.
pub fn peer_uid(extensions: &http::Extensions) -> Option<u32> {
    extensions
        .get::<UdsConnectInfo>()
        .and_then(|uds| uds.peer_cred)
        .map(|c| c.uid())
}

/// Where the request came from, for the audit log (formatted on refusals only).
fn peer_text(extensions: &http::Extensions) -> String {
    if let Some(uds) = extensions.get::<UdsConnectInfo>() {
        let cred = uds.peer_cred;
        return match (cred.map(|c| c.uid()), cred.and_then(|c| c.pid())) {
            (Some(u), Some(p)) => format!("unix uid={u} pid={p}"),
            (Some(u), None) => format!("unix uid={u}"),
            _ => "unix".into(),
        };
    }
    let tcp = extensions
        .get::<tonic::transport::server::TcpConnectInfo>()
        .and_then(|i| i.remote_addr())
        .or_else(|| {
            extensions
                .get::<tonic::transport::server::TlsConnectInfo<
                    tonic::transport::server::TcpConnectInfo,
                >>()
                .and_then(|i| i.get_ref().remote_addr())
        });
    tcp.map_or_else(|| "unknown".into(), |a| format!("tcp {a}"))
}

/// Admits or refuses one HTTP request of the inference routes, as the gRPC layer does its
/// calls: without a tenants file every caller is the admin; else the bearer token says who,
/// tenants bound to uids are refused (HTTP is TCP), and the request counts against the
/// tenant's `inflight` quota while the guard lives.
pub fn admit_http(
    store: &TenantStore,
    metrics: &Metrics,
    path: &str,
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
) -> Result<(Caller, Option<InflightGuard>), CoreError> {
    if !store.enabled() {
        return Ok((Caller::Admin, None));
    }
    admit(store, metrics, path, headers, extensions)
}

/// Admits or refuses one request; on admission, the caller and its in-flight guard.
fn admit(
    store: &TenantStore,
    metrics: &Metrics,
    path: &str,
    headers: &http::HeaderMap,
    extensions: &http::Extensions,
) -> Result<(Caller, Option<InflightGuard>), CoreError> {
    let refuse = |reason: &'static str, err: CoreError| {
        let from = peer_text(extensions);
        metrics.auth_refused(reason);
        audit::auth_refused(path, reason, &from);
        err
    };
    let token = bearer(headers).map_err(|why| {
        refuse(
            why,
            CoreError::Unauthenticated(format!(
                "{why} credentials: send 'authorization: Bearer <token>'"
            )),
        )
    })?;
    let Some(auth) = store.authenticate(token) else {
        return Err(refuse(
            "unknown_token",
            CoreError::Unauthenticated("the token is not valid on this server".into()),
        ));
    };
    if !auth.uids.is_empty() {
        let uid = peer_uid(extensions);
        let tenant = auth.caller.describe();
        match uid {
            Some(u) if auth.uids.contains(&u) => {}
            Some(u) => {
                return Err(refuse(
                    "uid",
                    CoreError::PermissionDenied(format!(
                        "{tenant} may not call from uid {u}: it is bound to uids {:?}",
                        auth.uids
                    )),
                ));
            }
            None => {
                return Err(refuse(
                    "uid",
                    CoreError::PermissionDenied(format!(
                        "{tenant} is bound to uids and may only call over the Unix socket"
                    )),
                ));
            }
        }
    }
    let guard = match &auth.caller {
        Caller::Tenant { name, quota } if path != SESSION_PATH => {
            match enter_inflight(store, metrics, name, quota) {
                Ok(g) => Some(g),
                Err(e) => {
                    audit::call_refused(&auth.caller, path, &e.to_string());
                    return Err(e);
                }
            }
        }
        _ => None,
    };
    Ok((auth.caller, guard))
}

/// Counts a request of tenant `name` in flight, refusing it past the quota.
fn enter_inflight(
    store: &TenantStore,
    metrics: &Metrics,
    name: &str,
    quota: &Quota,
) -> Result<InflightGuard, CoreError> {
    let counter = store.inflight_counter(name);
    let before = counter.fetch_add(1, Ordering::SeqCst);
    let guard = InflightGuard(counter);
    if let Err(e) = quota.check(name, Resource::Inflight, u64::from(before), 1) {
        drop(guard);
        metrics.quota_denied(name, Resource::Inflight.name());
        return Err(e);
    }
    Ok(guard)
}

impl<S, B, RB> Service<http::Request<B>> for Auth<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        if OPEN_SERVICES.iter().any(|p| path.starts_with(p)) {
            return Box::pin(self.inner.call(req));
        }
        if !self.store.enabled() {
            req.extensions_mut().insert(Caller::Admin);
            return Box::pin(self.inner.call(req));
        }
        match admit(
            &self.store,
            &self.metrics,
            path,
            req.headers(),
            req.extensions(),
        ) {
            Ok((caller, guard)) => {
                req.extensions_mut().insert(caller);
                let fut = self.inner.call(req);
                Box::pin(async move {
                    let out = fut.await;
                    drop(guard);
                    out
                })
            }
            Err(e) => {
                let response = crate::status::from_core(e).into_http::<RB>();
                Box::pin(std::future::ready(Ok(response)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::path::Path;

    use tokio::sync::Notify;

    use super::*;
    use modelshare_core::tenants::token::TokenHash;

    fn store(dir: &Path, inflight: u32) -> Arc<TenantStore> {
        let path = dir.join("tenants.toml");
        let text = format!(
            "[admin]\ntoken_hashes = [\"{}\"]\n[[tenants]]\nname = \"a\"\ntoken_hashes = [\"{}\"]\n[tenants.quota]\ninflight = {inflight}\n[[tenants]]\nname = \"bound\"\ntoken_hashes = [\"{}\"]\nuids = [4242]\n",
            TokenHash::of("root"),
            TokenHash::of("ta"),
            TokenHash::of("tb"),
        );
        std::fs::write(&path, text).expect("write");
        Arc::new(TenantStore::open(Some(&path)).expect("open"))
    }

    fn request(path: &str, token: Option<&str>) -> http::Request<()> {
        let mut b = http::Request::builder().uri(format!("http://x{path}"));
        if let Some(t) = token {
            b = b.header("authorization", format!("Bearer {t}"));
        }
        b.body(()).expect("request")
    }

    fn status_of(r: &http::Response<String>) -> Option<tonic::Code> {
        r.headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|s| s.parse::<i32>().ok())
            .map(tonic::Code::from)
    }

    /// What the inner service saw: the caller, or nothing when the layer refused.
    async fn call(
        svc: &mut Auth<
            impl Service<
                http::Request<()>,
                Response = http::Response<String>,
                Error = Infallible,
                Future = impl Future<Output = Result<http::Response<String>, Infallible>>
                         + Send
                         + 'static,
            >,
        >,
        req: http::Request<()>,
    ) -> http::Response<String> {
        svc.call(req).await.expect("infallible")
    }

    fn echo() -> impl Service<
        http::Request<()>,
        Response = http::Response<String>,
        Error = Infallible,
        Future = impl Future<Output = Result<http::Response<String>, Infallible>> + Send + 'static,
    > + Clone {
        tower::service_fn(|req: http::Request<()>| async move {
            let who = match req.extensions().get::<Caller>() {
                Some(Caller::Admin) => "admin".to_owned(),
                Some(Caller::Tenant { name, .. }) => name.to_string(),
                None => "none".to_owned(),
            };
            Ok::<_, Infallible>(http::Response::new(who))
        })
    }

    #[tokio::test]
    async fn tokens_become_callers_and_bad_ones_are_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let mut svc = AuthLayer::new(store(dir.path(), 0), metrics).layer(echo());
        let path = "/modelshare.v1.AdminService/ListModels";
        let r = call(&mut svc, request(path, Some("ta"))).await;
        assert_eq!(r.body(), "a");
        let r = call(&mut svc, request(path, Some("root"))).await;
        assert_eq!(r.body(), "admin");
        for token in [None, Some("wrong"), Some("")] {
            let r = call(&mut svc, request(path, token)).await;
            assert_eq!(
                status_of(&r),
                Some(tonic::Code::Unauthenticated),
                "{token:?}"
            );
            assert_eq!(r.body(), "", "the service must not run");
        }
        let mut basic = request(path, None);
        basic
            .headers_mut()
            .insert("authorization", "Basic dGE=".parse().expect("header"));
        assert_eq!(
            status_of(&call(&mut svc, basic).await),
            Some(tonic::Code::Unauthenticated)
        );
        // Health needs no token, and gets no caller.
        let r = call(&mut svc, request("/grpc.health.v1.Health/Check", None)).await;
        assert_eq!(r.body(), "none");
        // A tenant bound to uids is refused where the uid is unknown (not a Unix socket).
        let r = call(&mut svc, request(path, Some("tb"))).await;
        assert_eq!(status_of(&r), Some(tonic::Code::PermissionDenied));
    }

    #[tokio::test]
    async fn without_tenants_every_caller_is_admin() {
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let store = Arc::new(TenantStore::open(None).expect("open"));
        let mut svc = AuthLayer::new(store, metrics).layer(echo());
        let r = call(
            &mut svc,
            request("/modelshare.v1.AdminService/ListModels", None),
        )
        .await;
        assert_eq!(r.body(), "admin");
    }

    /// The in-flight quota: with 2 requests held inside the service, a third is refused; once
    /// they finish, the count is back to 0 and calls pass again.
    #[tokio::test]
    async fn inflight_quota_is_enforced_and_released() {
        let dir = tempfile::tempdir().expect("tmp");
        let store = store(dir.path(), 2);
        let metrics = Arc::new(Metrics::new().expect("metrics"));
        let gate = Arc::new(Notify::new());
        let entered = Arc::new(AtomicU32::new(0));
        let (g, e) = (gate.clone(), entered.clone());
        let slow = tower::service_fn(move |_req: http::Request<()>| {
            let (g, e) = (g.clone(), e.clone());
            async move {
                e.fetch_add(1, Ordering::SeqCst);
                g.notified().await;
                Ok::<_, Infallible>(http::Response::new("done".to_owned()))
            }
        });
        let svc = AuthLayer::new(store.clone(), metrics).layer(slow);
        let path = "/modelshare.v1.AdminService/GetStats";
        let mut held = Vec::new();
        for _ in 0..2 {
            let mut s = svc.clone();
            held.push(tokio::spawn(async move {
                s.call(request(path, Some("ta"))).await.expect("ok")
            }));
        }
        while entered.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        assert_eq!(store.inflight("a"), 2);
        let mut s = svc.clone();
        // A third request admitted would wait on the gate: fail instead of hanging.
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            s.call(request(path, Some("ta"))),
        )
        .await
        .expect("the third request must be refused at once, not admitted")
        .expect("ok");
        assert_eq!(status_of(&r), Some(tonic::Code::ResourceExhausted));
        let msg = r
            .headers()
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .replace("%20", " ");
        assert!(
            msg.contains("'inflight'") && msg.contains("limit 2, in use 2"),
            "{msg}"
        );
        // The session stream is not counted.
        let mut s = svc.clone();
        let session =
            tokio::spawn(
                async move { s.call(request(SESSION_PATH, Some("ta"))).await.expect("ok") },
            );
        while entered.load(Ordering::SeqCst) < 3 {
            tokio::task::yield_now().await;
        }
        assert_eq!(store.inflight("a"), 2);
        gate.notify_waiters();
        for h in held {
            assert_eq!(h.await.expect("join").body(), "done");
        }
        assert_eq!(session.await.expect("join").body(), "done");
        assert_eq!(store.inflight("a"), 0, "nothing leaks");
        let mut s = svc.clone();
        let e2 = entered.clone();
        let passing = tokio::spawn(async move { s.call(request(path, Some("ta"))).await });
        while e2.load(Ordering::SeqCst) < 4 {
            tokio::task::yield_now().await;
        }
        gate.notify_waiters();
        assert_eq!(passing.await.expect("join").expect("ok").body(), "done");
    }
}
