//! A worker's session with the server, kept alive across server restarts.
//!
//! A supervisor task owns the session stream: it sends the hello and the heartbeats, reads the
//! server's events, and when the stream breaks (the server restarted, the connection dropped, or
//! the server revoked the session) it reconnects with exponential backoff, opens a new session
//! and re-attaches every model the worker still holds. Each [`Model`] then points at its new
//! lease and mapping; tensors taken before stay valid (they keep the old mapping alive).
//!
//! Every connection, the first and each reconnection, is made with the session's
//! [`ConnectOptions`]: a token file is read again each time, so a worker whose token was
//! revoked (the server answers UNAUTHENTICATED) keeps reconnecting and picks up a rotated file.
//! The first connection is different: [`Session::open`] returns its refusal, and
//! [`crate::serve::serve_latest`] ends a worker on a refused token there.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tracing::{debug, warn};

use crate::WorkerError;
use crate::attaching::Attaching;
use crate::connect;
use crate::credentials::ConnectOptions;
use crate::link::{KeepOpen, Link, SessionCore};
use crate::model::{Model, ModelInner};

/// First delay before reconnecting; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest delay between reconnection attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Least time between two warnings about refused credentials while reconnecting.
const AUTH_WARN_EVERY: Duration = Duration::from_secs(5);

/// Something that happened to the session or to a model it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A new version of a model is ready.
    VersionReady {
        /// Model name.
        model: String,
        /// Version.
        version: u32,
    },
    /// A version this session holds is draining: release it soon.
    VersionDraining {
        /// Model name.
        model: String,
        /// Version.
        version: u32,
    },
    /// The server ended the session (a forced unload); the SDK reconnects.
    Revoked {
        /// The server's reason.
        reason: String,
    },
    /// The connection to the server was lost; the SDK is reconnecting.
    Disconnected,
    /// A new session is open after a disconnection.
    Reconnected {
        /// The new session id.
        session_id: String,
    },
    /// A held model was attached again after a reconnection.
    Reattached {
        /// Model name.
        model: String,
        /// The version now attached.
        version: u32,
    },
    /// A held model could not be attached again: it is gone from the server.
    ModelGone {
        /// Model name.
        model: String,
        /// Why the attach failed.
        reason: String,
    },
}

impl SessionEvent {
    /// The event's name in snake case (`version_ready`, `revoked`, ...), for machine output.
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEvent::VersionReady { .. } => "version_ready",
            SessionEvent::VersionDraining { .. } => "version_draining",
            SessionEvent::Revoked { .. } => "revoked",
            SessionEvent::Disconnected => "disconnected",
            SessionEvent::Reconnected { .. } => "reconnected",
            SessionEvent::Reattached { .. } => "reattached",
            SessionEvent::ModelGone { .. } => "model_gone",
        }
    }
}

/// What a person reads: `model m v2 is draining: release it`, ...
impl std::fmt::Display for SessionEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SessionEvent::VersionReady { model, version } => {
                write!(f, "model {model} v{version} is ready")
            }
            SessionEvent::VersionDraining { model, version } => {
                write!(f, "model {model} v{version} is draining: release it")
            }
            SessionEvent::Revoked { reason } => write!(f, "the server ended the session: {reason}"),
            SessionEvent::Disconnected => f.write_str("disconnected from the server; reconnecting"),
            SessionEvent::Reconnected { session_id } => {
                write!(f, "reconnected as session {session_id}")
            }
            SessionEvent::Reattached { model, version } => {
                write!(f, "model {model} v{version} attached again")
            }
            SessionEvent::ModelGone { model, reason } => {
                write!(f, "model {model} is gone: {reason}")
            }
        }
    }
}

/// Options of a new session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Worker name shown by `modelshare ps`.
    pub worker_name: String,
    /// Labels shown by `modelshare ps`.
    pub labels: HashMap<String, String>,
    /// Do not reconnect when the stream breaks (the session just ends).
    pub no_reconnect: bool,
    /// Token and TLS settings, used for the first connection and every reconnection (the
    /// default: no token; [`Session::open`] takes them from the environment).
    pub connect: ConnectOptions,
    /// The device this worker computes on, by UUID (`GPU-…`): attaches take the arena on it.
    /// `None`: on a server of several devices, the UUID of this process's CUDA device 0 (the
    /// first of its `CUDA_VISIBLE_DEVICES`), or `MODELSHARE_DEVICE_UUID` when set; on a server
    /// of one device, none is asked for.
    pub device_uuid: Option<String>,
}

/// What the supervisor shares with the [`Session`] handles: the connection settings, the
/// link and the session's life ([`SessionCore`], also shared with its models), the models to
/// re-attach after a reconnection, and the event channel.
#[derive(Debug)]
struct SessionInner {
    address: String,
    options: SessionOptions,
    core: Arc<SessionCore>,
    held: Mutex<Vec<Weak<ModelInner>>>,
    events: broadcast::Sender<SessionEvent>,
}

impl SessionInner {
    /// Remembers `model` (weakly) to re-attach it after a reconnection.
    fn hold(&self, model: &Arc<ModelInner>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|w| w.strong_count() > 0);
        held.push(Arc::downgrade(model));
    }

    fn emit(&self, ev: SessionEvent) {
        let _ = self.events.send(ev);
    }
}

/// A worker's connection to a modelshare server. Heartbeats run in the background and the
/// session survives server restarts (see the module docs); dropping the last clone ends it and
/// releases its leases on the server.
#[derive(Debug, Clone)]
pub struct Session {
    inner: Arc<SessionInner>,
    keep_open: KeepOpen,
    device: Option<pb::DeviceInfo>,
    devices: Vec<pb::DeviceInfo>,
}

impl Session {
    /// Connects to `address` (see [`connect::channel_with`]) with the token and TLS settings of
    /// the environment ([`ConnectOptions::from_env`]) and opens a session named `worker_name`.
    pub async fn open(address: &str, worker_name: &str) -> Result<Self, WorkerError> {
        Self::open_with(
            address,
            SessionOptions {
                worker_name: worker_name.to_owned(),
                connect: ConnectOptions::from_env()?,
                ..SessionOptions::default()
            },
        )
        .await
    }

    /// Opens a session with `options` (token and TLS settings: `options.connect` only).
    pub async fn open_with(address: &str, options: SessionOptions) -> Result<Self, WorkerError> {
        let (events, _) = broadcast::channel(256);
        let inner = Arc::new(SessionInner {
            address: address.to_owned(),
            options,
            core: Arc::default(),
            held: Mutex::new(Vec::new()),
            events,
        });
        let (link, welcome, stream) = handshake(&inner).await?;
        inner.core.set_link(Some(link));
        let device = welcome.device.clone();
        let devices = welcome.devices.clone();
        tokio::spawn(supervise(inner.clone(), welcome, stream));
        Ok(Self {
            keep_open: KeepOpen::new(inner.core.clone()),
            inner,
            device,
            devices,
        })
    }

    /// The current session id (it changes after a reconnection).
    pub fn id(&self) -> String {
        self.inner.core.link().map(|l| l.id).unwrap_or_default()
    }

    /// The server's first device (see [`Session::devices`]).
    pub fn device(&self) -> Option<&pb::DeviceInfo> {
        self.device.as_ref()
    }

    /// Every device of the server, in its order.
    pub fn devices(&self) -> &[pb::DeviceInfo] {
        &self.devices
    }

    /// The device this session's attaches ask for (see [`SessionOptions::device_uuid`]):
    /// `None` on a server of one device, where the arena is the one there is.
    pub fn attach_device(&self) -> Option<String> {
        self.inner.core.link().ok().and_then(|l| l.device_uuid)
    }

    /// Attaches to the latest ready version of `model` (while none is ready, on a CUDA server,
    /// the version still loading: [`Model::wait_ready`] orders reads after its load).
    pub async fn attach(&self, model: &str) -> Result<Model, WorkerError> {
        self.attach_version(model, 0).await
    }

    /// Attaches to `version` of `model` (0: latest, as [`Session::attach`]). While the server answers
    /// UNAVAILABLE (start-up models still loading, or the version's memory being allocated) the
    /// call retries with backoff for up to 5 s. After a reconnection the SDK asks again for the
    /// same thing: the same version, or the latest.
    pub async fn attach_version(&self, model: &str, version: u32) -> Result<Model, WorkerError> {
        let model = Model::attach(self.keep_open.clone(), model, version).await?;
        self.inner.hold(model.shared());
        Ok(model)
    }

    /// Attaches as [`Session::attach_version`] does, in two steps: returns once the server has
    /// granted the lease, with the manifest and (CUDA VMM) the address space the arena will be
    /// mapped at, while the handle is redeemed and mapped in the background;
    /// [`Attaching::finish`] waits for the [`Model`]. For a consumer that makes its own views of
    /// the arena meanwhile.
    pub async fn attach_early(&self, model: &str, version: u32) -> Result<Attaching, WorkerError> {
        let granted = Model::grant(self.keep_open.clone(), model, version).await?;
        let inner = self.inner.clone();
        Ok(Attaching::start(granted, move |m| inner.hold(m.shared())))
    }

    /// The core shared with the supervisor and the models (for `serve`).
    pub(crate) fn core(&self) -> &Arc<SessionCore> {
        &self.inner.core
    }

    /// Closes the session now, cleanly: the server releases everything it held and counts it
    /// closed. Returns once the server has acknowledged (or after about a second). Dropping
    /// every handle closes it too, but a process that exits right after may cut the
    /// connection before the goodbye is sent.
    pub async fn close(self) {
        let core = self.core().clone();
        core.closed().cancel();
        let _ = tokio::time::timeout(GOODBYE_WAIT * 2, core.ended().cancelled()).await;
    }

    /// A receiver of this session's events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<SessionEvent> {
        self.inner.events.subscribe()
    }
}

/// Connects (reading a token file again), says hello, and waits for the welcome.
/// This worker's device when the options name none: `MODELSHARE_DEVICE_UUID`, else the UUID of
/// CUDA device 0 as this process sees it (`None` without CUDA: the server then picks).
async fn own_device() -> Option<String> {
    if let Ok(uuid) = std::env::var("MODELSHARE_DEVICE_UUID")
        && !uuid.is_empty()
    {
        return Some(uuid);
    }
    // Driver calls block (the first one loads the library): off the runtime's threads.
    tokio::task::spawn_blocking(|| modelshare_device::cuda::device_uuid(0))
        .await
        .ok()
        .and_then(|r| r.ok())
}

async fn handshake(
    inner: &SessionInner,
) -> Result<(Link, pb::Welcome, HeartbeatStream), WorkerError> {
    let channel = connect::authed(&inner.address, &inner.options.connect).await?;
    let mut client = WorkerServiceClient::new(channel).max_decoding_message_size(256 << 20);
    // Memory still mapped from before a server restart goes back first: a restarting server
    // may be waiting for it before it takes sessions.
    let held = inner.held_models();
    if !held.is_empty() {
        crate::offer::offer_held(&mut client, &held).await;
    }
    let (tx, rx) = mpsc::channel::<pb::SessionRequest>(4);
    let hello = pb::SessionRequest {
        kind: Some(pb::session_request::Kind::Hello(pb::Hello {
            worker_name: inner.options.worker_name.clone(),
            pid: std::process::id(),
            labels: inner.options.labels.clone(),
            protocol_version: modelshare_proto::PROTOCOL_VERSION,
        })),
    };
    tx.send(hello)
        .await
        .map_err(|_| WorkerError::SessionEnded)?;
    let mut inbound = client
        .session(ReceiverStream::new(rx))
        .await
        .map_err(|status| WorkerError::Rpc {
            call: "Session",
            status,
        })?
        .into_inner();
    let welcome = match inbound.next().await {
        Some(Ok(pb::SessionEvent {
            kind: Some(pb::session_event::Kind::Welcome(w)),
        })) => w,
        Some(Err(status)) => {
            return Err(WorkerError::Rpc {
                call: "Session",
                status,
            });
        }
        _ => {
            return Err(WorkerError::Protocol(
                "the server's first session message was not a welcome".into(),
            ));
        }
    };
    modelshare_proto::version::accept_welcome(welcome.protocol_version)?;
    let device_uuid = match &inner.options.device_uuid {
        Some(uuid) => Some(uuid.clone()),
        None if welcome.devices.len() > 1 => own_device().await,
        None => None,
    };
    let link = Link {
        id: welcome.session_id.clone(),
        device_uuid,
        client,
        heartbeat: (welcome.heartbeat_interval_ms > 0)
            .then(|| Duration::from_millis(u64::from(welcome.heartbeat_interval_ms))),
    };
    Ok((link, welcome, HeartbeatStream { tx, inbound }))
}

/// Whether a failed reconnection was about credentials rather than the server being away.
fn refused_credentials(e: &WorkerError) -> bool {
    matches!(e, WorkerError::Credentials { .. })
        || matches!(
            e.code(),
            Some(tonic::Code::Unauthenticated | tonic::Code::PermissionDenied)
        )
}

/// Whether a failed reconnection was about the protocol version: the welcome's (this worker
/// refused it) or the hello's (the server refused it: FAILED_PRECONDITION on `Session`).
fn refused_version(e: &WorkerError) -> bool {
    matches!(e, WorkerError::ProtocolVersion(_))
        || matches!(
            e,
            WorkerError::Rpc { call: "Session", status }
                if status.code() == tonic::Code::FailedPrecondition
        )
}

/// The two halves of a live session stream.
struct HeartbeatStream {
    tx: mpsc::Sender<pb::SessionRequest>,
    inbound: tonic::Streaming<pb::SessionEvent>,
}

/// Runs the live stream until it ends; then reconnects and re-attaches, until closed. Marks
/// the session ended when it stops.
async fn supervise(inner: Arc<SessionInner>, welcome: pb::Welcome, stream: HeartbeatStream) {
    let _ended = inner.core.ended().clone().drop_guard();
    supervise_streams(&inner, welcome, stream).await;
}

/// The supervisor's loop; returns when the session is closed, or when its stream broke and
/// reconnection is off.
async fn supervise_streams(
    inner: &Arc<SessionInner>,
    mut welcome: pb::Welcome,
    mut stream: HeartbeatStream,
) {
    loop {
        let revoked = tokio::select! {
            r = run_stream(inner, &welcome, &mut stream) => r,
            () = inner.core.closed().cancelled() => {
                inner.core.finish_releases(GOODBYE_WAIT).await;
                say_goodbye(stream).await;
                return;
            }
        };
        inner.core.set_link(None);
        match revoked {
            Some(reason) => inner.emit(SessionEvent::Revoked { reason }),
            None => inner.emit(SessionEvent::Disconnected),
        }
        if inner.options.no_reconnect {
            return;
        }
        let mut backoff = MIN_BACKOFF;
        let mut warned: Option<Instant> = None;
        let (link, w, s) = loop {
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = inner.core.closed().cancelled() => return,
            }
            match handshake(inner).await {
                Ok(ok) => break ok,
                Err(e) => {
                    // Refused credentials need an operator (a revoked token, a bad token file),
                    // and so does a server upgraded to a protocol version this worker does not
                    // speak: say so, but not at every attempt.
                    if (refused_credentials(&e) || refused_version(&e))
                        && warned.is_none_or(|at| at.elapsed() >= AUTH_WARN_EVERY)
                    {
                        warn!(error = %e, "reconnect refused (token or version); retrying");
                        warned = Some(Instant::now());
                    } else {
                        debug!(error = %e, "reconnect failed; retrying");
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        (welcome, stream) = (w, s);
        inner.core.set_link(Some(link.clone()));
        inner.emit(SessionEvent::Reconnected {
            session_id: link.id.clone(),
        });
        reattach_all(inner).await;
    }
}

/// How long a closing session waits for the server to end its side of the stream.
const GOODBYE_WAIT: Duration = Duration::from_secs(1);

/// Ends the session's stream cleanly: closes the worker's side (the server counts the session
/// `closed`, not `stream_error`) and waits, briefly, for the server to close its side.
async fn say_goodbye(stream: HeartbeatStream) {
    let HeartbeatStream { tx, mut inbound } = stream;
    drop(tx);
    let drained = async { while let Ok(Some(_)) = inbound.message().await {} };
    let _ = tokio::time::timeout(GOODBYE_WAIT, drained).await;
}

/// Heartbeats and event forwarding for one stream. Returns the revocation reason if the
/// server revoked the session, `None` if the stream just ended.
async fn run_stream(
    inner: &SessionInner,
    welcome: &pb::Welcome,
    stream: &mut HeartbeatStream,
) -> Option<String> {
    let interval = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms.max(10)));
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let beat = pb::SessionRequest {
                    kind: Some(pb::session_request::Kind::Heartbeat(pb::Heartbeat {})),
                };
                if stream.tx.send(beat).await.is_err() {
                    return None;
                }
            }
            msg = stream.inbound.next() => {
                let kind = match msg {
                    Some(Ok(m)) => m.kind,
                    Some(Err(status)) => {
                        debug!(%status, "session stream ended with an error");
                        return None;
                    }
                    None => return None,
                };
                match kind {
                    Some(pb::session_event::Kind::VersionReady(v)) => inner.emit(SessionEvent::VersionReady {
                        model: v.model,
                        version: v.version,
                    }),
                    Some(pb::session_event::Kind::VersionDraining(v)) => inner.emit(SessionEvent::VersionDraining {
                        model: v.model,
                        version: v.version,
                    }),
                    Some(pb::session_event::Kind::SessionRevoked(r)) => return Some(r.reason),
                    Some(pb::session_event::Kind::Welcome(_)) | None => {}
                }
            }
        }
    }
}

impl SessionInner {
    /// The models still held.
    fn held_models(&self) -> Vec<Arc<ModelInner>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|w| w.strong_count() > 0);
        held.iter().filter_map(Weak::upgrade).collect()
    }
}

/// Attaches every still-held model again on the new link.
async fn reattach_all(inner: &Arc<SessionInner>) {
    let held = inner.held_models();
    for model in held {
        let reattached = match inner.core.link() {
            Ok(link) => model.reattach(&link).await,
            Err(e) => Err(e),
        };
        match reattached {
            Ok(version) => inner.emit(SessionEvent::Reattached {
                model: model.name().to_owned(),
                version,
            }),
            Err(e) => {
                warn!(model = %model.name(), error = %e, "a held model could not be attached again");
                inner.emit(SessionEvent::ModelGone {
                    model: model.name().to_owned(),
                    reason: e.to_string(),
                });
            }
        }
    }
}
