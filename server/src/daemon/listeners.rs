//! The listeners: the handle socket, the HTTP port, and gRPC over TCP and over a Unix socket,
//! each bound, gated (connections per listener and peer) and served as a task of the server;
//! the socket files they leave, removed when the server stops.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, UnixListener};
use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic_health::pb::health_server::HealthServer;
use tracing::info;

use super::error::ServeError;
use super::grpc::{router, tls_config};
use crate::app::App;
use crate::connections::{Gate, PeerKey};
use crate::handles;
use crate::health::BoundedHealth;
use crate::http::{self, HttpState};

/// The server's listener tasks; each ends with the error that stopped it.
pub(super) type Tasks = JoinSet<Result<(), ServeError>>;

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

/// The socket files a server bound, removed when it stops (by any path, errors included).
#[derive(Debug, Default)]
pub(super) struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for path in &self.0 {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Binds and serves every configured listener, in this order: the handle socket, the HTTP
/// port, gRPC over TCP, gRPC over the Unix socket. Returns where they listen.
pub(super) async fn start(
    app: &App,
    health: &HealthServer<BoundedHealth>,
    tasks: &mut Tasks,
    socket_files: &mut SocketFiles,
) -> Result<Bound, ServeError> {
    let config = &app.config;
    serve_handles(app, tasks, socket_files).await?;
    if let Some(addr) = config.http_listen {
        serve_http(app, addr, HttpPort::Inference, tasks).await?;
    }
    if let Some(addr) = config.metrics_listen {
        serve_http(app, addr, HttpPort::Operators, tasks).await?;
    }
    let mut bound = Bound {
        tcp: None,
        unix: None,
        handles: config.handle_socket.clone(),
    };
    if let Some(addr) = config.listen {
        bound.tcp = Some(serve_grpc_tcp(app, addr, health, tasks).await?);
    }
    if let Some(path) = &config.unix_socket {
        serve_grpc_unix(app, path, health, tasks, socket_files).await?;
        bound.unix = Some(path.clone());
    }
    info!(
        tcp = ?bound.tcp,
        tls = config.tls.is_some(),
        unix = ?bound.unix,
        handle_socket = %bound.handles.display(),
        model_root = %config.model_root.display(),
        "listening"
    );
    Ok(bound)
}

/// The handle socket, which passes arena fds to workers against one-time tickets.
async fn serve_handles(
    app: &App,
    tasks: &mut Tasks,
    socket_files: &mut SocketFiles,
) -> Result<(), ServeError> {
    let config = &app.config;
    let handle_listener = bind_unix(&config.handle_socket)
        .await
        .map_err(|e| e.for_handle_socket())?;
    socket_files.0.push(config.handle_socket.clone());
    set_socket_mode(&config.handle_socket, config.unix_socket_mode)?;
    let (app, stop) = (app.clone(), app.host.shutdown.clone());
    let gate = Gate::new("handles", config.connections, app.host.metrics.clone());
    tasks.spawn(async move {
        handles::serve(handle_listener, gate, app, stop).await;
        Ok(())
    });
    Ok(())
}

/// The two HTTP ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum HttpPort {
    /// The OIP and OpenAI doors, name-free probes (`--http-listen`).
    Inference,
    /// `/metrics` and the probes with model detail (`--metrics-listen`).
    Operators,
}

/// One HTTP port, with its own connection gate.
async fn serve_http(
    app: &App,
    addr: SocketAddr,
    port: HttpPort,
    tasks: &mut Tasks,
) -> Result<(), ServeError> {
    let what = match port {
        HttpPort::Inference => "http",
        HttpPort::Operators => "metrics",
    };
    let listener = http::bind(addr).await.map_err(|source| ServeError::Bind {
        what: format!("{what} {addr}"),
        source,
    })?;
    let local = listener.local_addr().ok();
    let state = HttpState::new(app.clone());
    // HTTPS on the inference port with the gRPC listener's TLS settings: tokens cross it.
    let tls = match (port, &app.config.tls) {
        (HttpPort::Inference, Some(tls)) => Some(http::tls::acceptor(tls)?),
        _ => None,
    };
    let routes = match port {
        HttpPort::Inference => {
            info!(http = ?local, https = app.config.tls.is_some(), "http listening (OIP and OpenAI routes, /healthz, /readyz)");
            http::router(state)
        }
        HttpPort::Operators => {
            info!(metrics = ?local, "metrics listening (/metrics, /healthz, /readyz with models)");
            http::operator_router(state)
        }
    };
    let stop = app.host.shutdown.clone();
    let gate = Gate::new(what, app.config.connections, app.host.metrics.clone());
    tasks.spawn(async move {
        http::serve(listener, gate, routes, tls, stop)
            .await
            .map_err(|source| ServeError::Bind {
                what: what.into(),
                source,
            })
    });
    Ok(())
}

/// gRPC over TCP (with TLS when configured); returns the address bound (the real port when
/// 0 was asked).
async fn serve_grpc_tcp(
    app: &App,
    addr: SocketAddr,
    health: &HealthServer<BoundedHealth>,
    tasks: &mut Tasks,
) -> Result<SocketAddr, ServeError> {
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
    // Requests and answers are small messages on long-lived connections: send each at once
    // (Nagle's algorithm with delayed ACKs costs up to 40 ms a message under load).
    let gate = Gate::new("grpc_tcp", app.config.connections, app.host.metrics.clone());
    let incoming = crate::accept::paced(TcpListenerStream::new(listener), "grpc tcp").filter_map(
        move |conn| match conn {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                let peer = PeerKey::of_tcp(&stream);
                gate.admit(stream, peer).map(Ok)
            }
            Err(e) => Some(Err(e)),
        },
    );
    let stop = app.host.shutdown.clone();
    let tls = app.config.tls.as_ref().map(tls_config).transpose()?;
    let r = router(app, health.clone(), tls)?;
    tasks.spawn(async move {
        r.serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
            .map_err(ServeError::from)
    });
    Ok(local)
}

/// gRPC over the Unix socket at `path`.
async fn serve_grpc_unix(
    app: &App,
    path: &Path,
    health: &HealthServer<BoundedHealth>,
    tasks: &mut Tasks,
    socket_files: &mut SocketFiles,
) -> Result<(), ServeError> {
    let listener = bind_unix(path).await?;
    socket_files.0.push(path.to_owned());
    set_socket_mode(path, app.config.unix_socket_mode)?;
    let gate = Gate::new(
        "grpc_unix",
        app.config.connections,
        app.host.metrics.clone(),
    );
    let incoming = crate::accept::paced(UnixListenerStream::new(listener), "grpc unix").filter_map(
        move |conn| match conn {
            Ok(stream) => {
                let peer = PeerKey::of_unix(&stream);
                gate.admit(stream, peer).map(Ok)
            }
            Err(e) => Some(Err(e)),
        },
    );
    let stop = app.host.shutdown.clone();
    let r = router(app, health.clone(), None)?;
    tasks.spawn(async move {
        r.serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
            .await
            .map_err(ServeError::from)
    });
    Ok(())
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
