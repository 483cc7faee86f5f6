//! Running the server: backend, listeners (TCP and/or Unix socket, plus the handle socket),
//! health and reflection, start-up models, and graceful shutdown.
//!
//! Health is NOT_SERVING until every start-up model is loaded; on shutdown it flips back to
//! NOT_SERVING, listeners stop accepting, in-flight requests get the grace period, sessions
//! end, and only then is device memory released.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use modelshare_proto::inference::grpc_inference_service_server::GrpcInferenceServiceServer;
use modelshare_proto::v1::admin_service_server::AdminServiceServer;
use modelshare_proto::v1::worker_service_server::WorkerServiceServer;
use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::server::Router;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tracing::{info, warn};

use crate::app::App;
use crate::auth::AuthLayer;
use crate::config::{ClientAuth, Config, TlsSettings};
use crate::connections::{Gate, PeerKey, StreamsLayer};
use crate::grpc_metrics::GrpcMetricsLayer;
use crate::handles;
use crate::http::{self, HttpState};
use crate::message_limits::MessageLimitLayer;
use crate::service::admin::AdminApi;
use crate::service::inference::InferenceApi;
use crate::service::worker::WorkerApi;
use modelshare_core::devices::Devices;
use modelshare_core::error::CoreError;
use modelshare_core::metrics::Metrics;
use modelshare_core::registry::LoadFor;
use modelshare_core::tenants::{Access, Caller, TenantStore};

/// The middleware stack of the gRPC server: the connection's stream count outermost, then
/// metrics (refusals are counted too), then authentication, then the bound on each method's
/// request messages.
type GrpcStack = tower::layer::util::Stack<
    MessageLimitLayer,
    tower::layer::util::Stack<
        AuthLayer,
        tower::layer::util::Stack<
            GrpcMetricsLayer,
            tower::layer::util::Stack<StreamsLayer, tower::layer::util::Identity>,
        >,
    >,
>;

/// Largest gRPC message accepted or sent (`message_limits` refuses larger requests first).
const MAX_MESSAGE_BYTES: usize = crate::message_limits::PAYLOAD_MESSAGE_BYTES as usize;
/// The largest admin request (`message_limits` refuses larger ones first).
const MAX_ADMIN_REQUEST_BYTES: usize = crate::message_limits::ADMIN_REQUEST_BYTES as usize;
/// Requests served at once on one connection.
const CONCURRENCY_PER_CONNECTION: usize = 256;

/// Why the server could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The chosen backend is not available.
    #[error("backend: {0}")]
    Backend(String),
    /// The model root is missing or not a directory.
    #[error("model root {path}: {reason}")]
    ModelRoot {
        /// The path given.
        path: String,
        /// Why it cannot serve as the root.
        reason: String,
    },
    /// A socket could not be bound.
    #[error("cannot listen on {what}: {source}")]
    Bind {
        /// The address or path.
        what: String,
        /// The cause.
        source: io::Error,
    },
    /// A start-up model failed to load.
    #[error("start-up model '{name}' ({path}): {source}")]
    StartupModel {
        /// Model name.
        name: String,
        /// Its path.
        path: String,
        /// The cause.
        source: CoreError,
    },
    /// The reflection service could not be built.
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    /// The metrics registry could not be built.
    #[error("metrics: {0}")]
    Metrics(String),
    /// The gRPC transport failed.
    #[error("grpc transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// The tenants file could not be read or is malformed.
    #[error(transparent)]
    Tenants(#[from] modelshare_core::tenants::file::TenantsFileError),
    /// A TLS file could not be read.
    #[error("TLS {what} {path}: {source}")]
    Tls {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: String,
        /// The cause.
        source: io::Error,
    },
}

/// The rustls configuration of the TCP listener.
fn tls_config(tls: &TlsSettings) -> Result<ServerTlsConfig, ServeError> {
    let read = |what: &'static str, path: &Path| {
        std::fs::read(path).map_err(|source| ServeError::Tls {
            what,
            path: path.display().to_string(),
            source,
        })
    };
    let identity = Identity::from_pem(read("certificate", &tls.cert)?, read("key", &tls.key)?);
    let mut config = ServerTlsConfig::new().identity(identity);
    if let Some(ca) = &tls.client_ca {
        config = config
            .client_ca_root(Certificate::from_pem(read("client CA", ca)?))
            .client_auth_optional(tls.client_auth == ClientAuth::Optional);
    }
    Ok(config)
}

/// Sets the mode of a socket file, when one is configured.
fn set_socket_mode(path: &Path, mode: Option<u32>) -> Result<(), ServeError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(mode) = mode {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(
            |source| ServeError::Bind {
                what: format!("{} (setting mode {mode:o})", path.display()),
                source,
            },
        )?;
    }
    Ok(())
}

/// Binds a Unix socket at `path`, replacing a stale socket file left by a dead server but
/// refusing to take over one that a live server still answers on, and refusing to remove
/// anything that is not a socket (a mistyped path must not delete a file).
pub async fn bind_unix(path: &Path) -> Result<UnixListener, ServeError> {
    use std::os::unix::fs::FileTypeExt;
    let bind_err = |source| ServeError::Bind {
        what: path.display().to_string(),
        source,
    };
    if let Ok(meta) = std::fs::symlink_metadata(path)
        && !meta.file_type().is_socket()
    {
        return Err(bind_err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            "the path exists and is not a socket; not removing it",
        )));
    }
    if path.exists() {
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(bind_err(io::Error::new(
                io::ErrorKind::AddrInUse,
                "another process is listening on this socket",
            )));
        }
        std::fs::remove_file(path).map_err(bind_err)?;
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(bind_err)?;
    }
    UnixListener::bind(path).map_err(bind_err)
}

fn router(
    app: &App,
    health: HealthServer<impl Health>,
    tls: Option<ServerTlsConfig>,
) -> Result<Router<GrpcStack>, ServeError> {
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(modelshare_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    // `v1alpha` beside `v1`: Python's grpcio-reflection client and older grpcurl ask for it.
    let reflection_v1alpha = reflection().build_v1alpha()?;
    let reflection = reflection().build_v1()?;
    let admin = AdminServiceServer::new(AdminApi::new(app.clone()))
        .max_decoding_message_size(MAX_ADMIN_REQUEST_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let worker = WorkerServiceServer::new(WorkerApi::new(app.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let inference = GrpcInferenceServiceServer::new(InferenceApi::new(app.clone()))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let mut builder = Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    Ok(builder
        // Keep the connection open while a stream is (see `connections`: idle ones are closed).
        .layer(StreamsLayer)
        // Count and time every request by service, method and status code.
        .layer(GrpcMetricsLayer::new(app.host.metrics.clone()))
        // Bearer token → caller; uid binding; in-flight quota.
        .layer(AuthLayer::new(
            app.host.tenants.clone(),
            app.host.metrics.clone(),
        ))
        // Every request message bounded by its method, refused as RESOURCE_EXHAUSTED from its
        // length prefix before it is buffered (see `message_limits`): kilobytes for the methods
        // that carry no payload, 1 MiB for the admin service, 128 MiB for payloads.
        .layer(MessageLimitLayer::new(
            app.config.serving.request_body_timeout,
            app.bodies.clone(),
        ))
        // Bound the work one connection can put on the server, instead of queueing without end.
        .concurrency_limit_per_connection(CONCURRENCY_PER_CONNECTION)
        // Detect dead peers on idle connections (a worker host that vanished).
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(5)))
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(admin)
        .add_service(worker)
        .add_service(inference))
}

/// Where the server listens, once bound.
#[derive(Debug, Clone)]
pub struct Bound {
    /// TCP address (with the real port when 0 was asked).
    pub tcp: Option<SocketAddr>,
    /// gRPC Unix socket.
    pub unix: Option<PathBuf>,
    /// Handle socket.
    pub handles: PathBuf,
}

/// Runs the server until `shutdown` resolves, then shuts down gracefully.
pub async fn run(config: Config, shutdown: impl Future<Output = ()>) -> Result<(), ServeError> {
    run_notify(config, shutdown, None).await
}

/// Refuses a model root that does not exist or is not a directory (every load would fail).
fn check_model_root(root: &std::path::Path) -> Result<(), ServeError> {
    let reason = match std::fs::metadata(root) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => "is not a directory".to_owned(),
        Err(e) => e.to_string(),
    };
    Err(ServeError::ModelRoot {
        path: root.display().to_string(),
        reason,
    })
}

/// [`run`], sending where it listens on `ready` once every start-up model is loaded.
pub async fn run_notify(
    config: Config,
    shutdown: impl Future<Output = ()>,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> Result<(), ServeError> {
    // SIGHUP's default action ends the process: take it over before anything slow (opening a
    // GPU takes seconds), so that a reload sent while starting is not fatal.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let mut config = config;
    check_model_root(&config.model_root)?;
    if let Some((before, after)) = crate::accept::raise_fd_limit() {
        info!(
            before,
            after, "raised the open-file limit (soft) to the hard limit"
        );
    }
    if let Some(nofile) = crate::accept::fd_limit() {
        let config = &mut config;
        if fit_to_fd_limit(&mut config.registry, &mut config.connections, nofile) {
            warn!(
                open_file_limit = nofile,
                max_sessions = config.registry.max_sessions,
                max_tickets = config.registry.tickets.total,
                max_tickets_per_tenant = config.registry.tickets.per_tenant,
                max_connections = config.connections.max_per_listener,
                "sessions, unredeemed tickets and connections per listener lowered to a quarter \
                 of the open-file limit each (a tenant's tickets to half of those)"
            );
        }
    }
    let config = Arc::new(config);
    let devices =
        Devices::open(&config.device_config()).map_err(|e| ServeError::Backend(e.to_string()))?;
    for device in devices.infos() {
        info!(backend = ?device.backend, device = %device.name, uuid = %device.uuid, "device ready");
    }
    let devices = Arc::new(devices);
    let metrics = Arc::new(Metrics::new().map_err(|e| ServeError::Metrics(e.to_string()))?);
    let tenants = Arc::new(TenantStore::open(config.tenants_file.as_deref())?);
    if tenants.enabled() {
        let table = tenants.current();
        info!(
            tenants = table.tenants.len(),
            admin_tokens = table.admin_hashes.len(),
            "tenants loaded; every call needs a bearer token"
        );
        if config.listen.is_some() && config.tls.is_none() {
            warn!(
                "tenants are configured but the TCP listener has no TLS: tokens travel in clear text"
            );
        }
    } else if let Some(addr) = config.listen {
        warn!(
            tcp = %addr,
            "no tenants file and --unauthenticated-tcp: every caller who reaches the TCP port is the admin"
        );
    } else {
        info!(
            unix = ?config.unix_socket,
            mode = ?config.unix_socket_mode.map(|m| format!("{m:o}")),
            "no tenants file: serving on the Unix socket only; whoever may connect to it is the admin"
        );
    }
    let app = App::new(devices, config.clone(), metrics.clone(), tenants);
    let registry = app.host.registry.clone();
    spawn_reload_on_sighup(&app, hup);
    // One timer for every expiry, one dispatcher of model events to the live sessions.
    {
        let app2 = app.clone();
        tokio::spawn(async move {
            let timer = app2.host.timer.clone();
            timer
                .run(app2.host.shutdown.clone(), |e| {
                    crate::expiry::handle(&app2, e)
                })
                .await;
        });
        tokio::spawn(crate::sessions::dispatch_events(app.clone()));
        tokio::spawn(sweep_held_records(app.clone()));
    }

    let (reporter, _) = tonic_health::server::health_reporter();
    // `Watch` ends after the listeners' idle period, so an open one cannot keep a connection
    // from ever going idle.
    let health = HealthServer::new(crate::health::BoundedHealth::new(
        reporter.clone(),
        config.connections.idle,
    ));
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;

    let mut tasks = JoinSet::new();
    // Every socket file this server binds goes when it stops, failed start included.
    let mut socket_files = SocketFiles::default();
    let handle_listener = bind_unix(&config.handle_socket).await?;
    socket_files.0.push(config.handle_socket.clone());
    set_socket_mode(&config.handle_socket, config.unix_socket_mode)?;
    {
        let (app, stop) = (app.clone(), app.host.shutdown.clone());
        let gate = Gate::new("handles", config.connections, metrics.clone());
        tasks.spawn(async move {
            handles::serve(handle_listener, gate, app, stop).await;
            Ok(())
        });
    }

    if let Some(addr) = config.http_listen {
        let listener = http::bind(addr).await.map_err(|source| ServeError::Bind {
            what: format!("http {addr}"),
            source,
        })?;
        let local = listener.local_addr().ok();
        info!(http = ?local, "http listening (metrics, probes, OIP and OpenAI routes)");
        let state = HttpState::new(app.clone());
        let stop = app.host.shutdown.clone();
        let gate = Gate::new("http", config.connections, metrics.clone());
        tasks.spawn(async move {
            http::serve(listener, gate, state, stop)
                .await
                .map_err(|source| ServeError::Bind {
                    what: "http".into(),
                    source,
                })
        });
    }

    let mut bound = Bound {
        tcp: None,
        unix: None,
        handles: config.handle_socket.clone(),
    };
    if let Some(addr) = config.listen {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError::Bind {
                what: addr.to_string(),
                source,
            })?;
        let local = listener.local_addr().map_err(|source| ServeError::Bind {
            what: addr.to_string(),
            source,
        })?;
        bound.tcp = Some(local);
        // Requests and answers are small messages on long-lived connections: send each at once
        // (Nagle's algorithm with delayed ACKs costs up to 40 ms a message under load).
        let gate = Gate::new("grpc_tcp", config.connections, metrics.clone());
        let incoming = crate::accept::paced(TcpListenerStream::new(listener), "grpc tcp")
            .filter_map(move |conn| match conn {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    let peer = PeerKey::of_tcp(&stream);
                    gate.admit(stream, peer).map(Ok)
                }
                Err(e) => Some(Err(e)),
            });
        let stop = app.host.shutdown.clone();
        let tls = config.tls.as_ref().map(tls_config).transpose()?;
        let r = router(&app, health.clone(), tls)?;
        tasks.spawn(async move {
            r.serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await
                .map_err(ServeError::from)
        });
    }
    if let Some(path) = &config.unix_socket {
        let listener = bind_unix(path).await?;
        socket_files.0.push(path.clone());
        set_socket_mode(path, config.unix_socket_mode)?;
        bound.unix = Some(path.clone());
        let gate = Gate::new("grpc_unix", config.connections, metrics.clone());
        let incoming = crate::accept::paced(UnixListenerStream::new(listener), "grpc unix")
            .filter_map(move |conn| match conn {
                Ok(stream) => {
                    let peer = PeerKey::of_unix(&stream);
                    gate.admit(stream, peer).map(Ok)
                }
                Err(e) => Some(Err(e)),
            });
        let stop = app.host.shutdown.clone();
        let r = router(&app, health.clone(), None)?;
        tasks.spawn(async move {
            r.serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
                .await
                .map_err(ServeError::from)
        });
    }
    info!(
        tcp = ?bound.tcp,
        tls = config.tls.is_some(),
        unix = ?bound.unix,
        handle_socket = %bound.handles.display(),
        model_root = %config.model_root.display(),
        "listening"
    );

    tokio::pin!(shutdown);
    let started = tokio::select! {
        r = load_startup_models(&app) => r.map(|()| true),
        r = first_failure(&mut tasks) => r.map(|()| false),
        () = &mut shutdown => Ok(false),
    };
    let result = match started {
        Ok(true) => {
            reporter
                .set_service_status("", ServingStatus::Serving)
                .await;
            reporter.set_serving::<AdminServiceServer<AdminApi>>().await;
            reporter
                .set_serving::<WorkerServiceServer<WorkerApi>>()
                .await;
            reporter
                .set_serving::<GrpcInferenceServiceServer<InferenceApi>>()
                .await;
            app.host
                .ready
                .store(true, std::sync::atomic::Ordering::SeqCst);
            info!(models = config.models.len(), "ready");
            if let Some(tx) = ready {
                let _ = tx.send(bound.clone());
            }
            tokio::select! {
                () = &mut shutdown => { info!("shutdown requested"); Ok(()) }
                r = first_failure(&mut tasks) => r,
            }
        }
        Ok(false) => Ok(()),
        Err(e) => Err(e),
    };

    // Graceful shutdown.
    reporter
        .set_service_status("", ServingStatus::NotServing)
        .await;
    app.host.shutdown.cancel();
    let grace = config.shutdown_grace;
    let drained =
        tokio::time::timeout(grace, async { while tasks.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        warn!(
            grace_secs = grace.as_secs(),
            "requests still running after the grace period; closing them"
        );
        tasks.abort_all();
    }
    registry.shutdown();
    drop(socket_files);
    info!("stopped");
    result
}

/// The socket files a server bound, removed when it stops (by any path, errors included).
#[derive(Debug, Default)]
struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

async fn load_startup_models(app: &App) -> Result<(), ServeError> {
    for m in &app.config.models {
        let fail = |source| ServeError::StartupModel {
            name: m.name.clone(),
            path: m.path.clone(),
            source,
        };
        let table = app.host.tenants.current();
        for t in m.tenant.iter().chain(&m.share_with) {
            if !table.tenants.contains_key(t) {
                return Err(fail(CoreError::UnknownTenant(t.clone())));
            }
        }
        let load_for = LoadFor {
            requested_owner: m.tenant.clone(),
            default_owner: None,
            access: Some(Access {
                shared_with: m.share_with.iter().cloned().collect(),
                public: m.public,
            }),
            resume_version: None,
            only_adopted: false,
            placement: modelshare_core::placement::Wanted {
                devices: m.devices.clone(),
                replicas: m.replicas,
            },
        };
        let load = app
            .host
            .start_load(&Caller::Admin, load_for, &m.name, &m.path, false)
            .await
            .map_err(fail)?;
        match load.done.await {
            Ok(Ok(v)) => {
                info!(model = %m.name, version = v.version, bytes = v.arena_bytes, tensors = v.tensor_count, "start-up model ready")
            }
            Ok(Err(e)) => return Err(fail(e)),
            Err(_) => return Err(fail(CoreError::Internal("load task vanished".into()))),
        }
    }
    Ok(())
}

/// Reads the tenants file again on each SIGHUP, for as long as the server runs.
fn spawn_reload_on_sighup(app: &App, hup: std::io::Result<tokio::signal::unix::Signal>) {
    let mut hup = match hup {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot install the SIGHUP handler; reload with the ReloadTenants call");
            return;
        }
    };
    let app = app.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                got = hup.recv() => {
                    if got.is_none() {
                        return;
                    }
                    if app.host.tenants.enabled() {
                        let _ = app.reload_tenants("sighup");
                    } else {
                        info!("SIGHUP: no tenants file is configured; nothing to reload");
                    }
                }
                () = app.host.shutdown.cancelled() => return,
            }
        }
    });
}

/// Waits for the first listener task to end; an end before shutdown is an error.
async fn first_failure(tasks: &mut JoinSet<Result<(), ServeError>>) -> Result<(), ServeError> {
    match tasks.join_next().await {
        Some(Ok(Err(e))) => Err(e),
        Some(Ok(Ok(()))) | None => Err(ServeError::Backend(
            "a listener stopped unexpectedly".into(),
        )),
        Some(Err(join)) => Err(ServeError::Backend(format!(
            "a listener task failed: {join}"
        ))),
    }
}

/// How often the held-memory records are brought in line with the registry.
const HELD_SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Removes the records of versions whose memory is gone and drops pending records past their
/// deadline (see [`modelshare_core::held`]), until shutdown.
async fn sweep_held_records(app: App) {
    let mut tick = tokio::time::interval(HELD_SWEEP_EVERY);
    loop {
        tokio::select! {
            () = app.host.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let live = app.host.registry.live_versions();
        let (held, registry) = (app.host.held.clone(), app.host.registry.clone());
        let _ = tokio::task::spawn_blocking(move || {
            held.sweep(&live);
            // Memory revoked workers held: no longer counted once none of them lives.
            let gone: Vec<u64> = registry
                .orphans()
                .into_iter()
                .filter(|o| !o.holders.iter().any(modelshare_core::held::Holder::alive))
                .map(|o| o.id)
                .collect();
            if !gone.is_empty() {
                registry.forget_orphans(&gone);
            }
        })
        .await;
    }
}

/// Lowers the most sessions (each holds a pidfd of its worker), the most unredeemed tickets
/// (each holds a descriptor of an arena; a tenant's scaled with them, to half at most) and the
/// most connections of each listener so that each takes at most a quarter of `nofile`; the
/// rest stays for arenas, model files and the log. Returns whether it changed any.
pub fn fit_to_fd_limit(
    limits: &mut modelshare_core::registry::RegistryLimits,
    connections: &mut crate::connections::ConnLimits,
    nofile: u64,
) -> bool {
    let share = usize::try_from(nofile / 4).unwrap_or(usize::MAX).max(1);
    let before = (
        limits.max_sessions,
        limits.tickets,
        connections.max_per_listener,
    );
    limits.max_sessions = limits.max_sessions.min(share);
    // A tenant's unredeemed tickets are scaled with the total (half of it at most), so one
    // tenant cannot take them all.
    limits.tickets = limits.tickets.lowered_to(share);
    connections.max_per_listener = connections.max_per_listener.min(share);
    connections.max_per_peer = connections.max_per_peer.min(connections.max_per_listener);
    before
        != (
            limits.max_sessions,
            limits.tickets,
            connections.max_per_listener,
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use modelshare_core::registry::RegistryLimits;

    #[test]
    fn sessions_tickets_and_connections_fit_a_low_descriptor_limit() {
        let mut limits = RegistryLimits::default();
        let mut conns = crate::connections::ConnLimits::default();
        assert!(
            !fit_to_fd_limit(&mut limits, &mut conns, 1 << 20),
            "room for the defaults"
        );
        assert!(
            fit_to_fd_limit(&mut limits, &mut conns, 1024),
            "the defaults exceed a quarter of 1024 each"
        );
        assert_eq!((limits.max_sessions, limits.tickets.total), (256, 256));
        assert_eq!(
            limits.tickets.per_tenant, 128,
            "a tenant's ticket cap is scaled with the total: half of it"
        );
        assert_eq!((conns.max_per_listener, conns.max_per_peer), (256, 256));
    }
}
