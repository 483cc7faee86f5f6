//! `modelshare.v1.WorkerService`: sessions, attach and release.
//!
//! A session lives as long as its stream: it ends when the worker closes it, when the
//! connection breaks (the worker exited or was killed: the kernel closes its socket), after
//! `heartbeat_misses` heartbeat intervals without a message, or at shutdown. Ending a session
//! releases every lease it held.

use std::pin::Pin;

use modelshare_device::{ExportedHandle, PeerWatch};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::worker_service_server::WorkerService;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::{debug, info, warn};

use super::convert;
use crate::app::App;
use crate::audit;
use crate::error::ServerError;
use crate::registry::{ModelEvent, WorkerHello};
use crate::tenants::Caller;
use crate::tenants::auth::{caller_of, peer_uid};

/// The worker service.
#[derive(Debug, Clone)]
pub struct WorkerApi {
    app: App,
}

impl WorkerApi {
    /// The service over `app`.
    pub fn new(app: App) -> Self {
        Self { app }
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

fn event(kind: pb::session_event::Kind) -> Result<pb::SessionEvent, Status> {
    Ok(pb::SessionEvent { kind: Some(kind) })
}

/// Why a session ended (logged).
#[derive(Debug, Clone, Copy)]
enum EndReason {
    Closed,
    StreamError,
    HeartbeatTimeout,
    ProtocolViolation,
    Shutdown,
    Revoked,
    PeerExited,
}

impl EndReason {
    /// The metric label.
    fn label(self) -> &'static str {
        match self {
            EndReason::Closed => "closed",
            EndReason::StreamError => "stream_error",
            EndReason::HeartbeatTimeout => "heartbeat_timeout",
            EndReason::ProtocolViolation => "protocol_violation",
            EndReason::Shutdown => "shutdown",
            EndReason::Revoked => "revoked",
            EndReason::PeerExited => "peer_exited",
        }
    }
}

#[tonic::async_trait]
impl WorkerService for WorkerApi {
    type SessionStream = EventStream;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        // On the Unix socket the kernel tells who the peer is; watch that process.
        let peer_pid = request
            .extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .and_then(|info| info.peer_cred)
            .and_then(|cred| cred.pid())
            .and_then(|pid| u32::try_from(pid).ok());
        let peer = PeerWatch::open(peer_pid);
        let caller = caller_of(&request)?;
        self.app.require_ready()?;
        let mut inbound = request.into_inner();
        let deadline = self.app.config.heartbeat_interval * self.app.config.heartbeat_misses;
        let first = tokio::time::timeout(deadline, inbound.message())
            .await
            .map_err(|_| Status::deadline_exceeded("no hello within the heartbeat deadline"))??;
        let hello = match first.and_then(|m| m.kind) {
            Some(pb::session_request::Kind::Hello(h)) => WorkerHello::try_from(h)?,
            _ => {
                return Err(Status::invalid_argument(
                    "the first message of a session must be a hello",
                ));
            }
        };
        let registry = self.app.registry.clone();
        let mut events = registry.subscribe();
        let opened = match registry.open_session(&caller, hello.clone()) {
            Ok(o) => o,
            Err(e) => {
                audit::session(&caller, "session_open", "", false, &e.to_string());
                return Err(self.app.refuse(e));
            }
        };
        audit::session(&caller, "session_open", &opened.id, true, &hello.name);
        let (id, revocation) = (opened.id, opened.revocation);
        info!(
            session = %id,
            worker = %hello.name,
            pid = hello.pid,
            tenant = caller.tenant().unwrap_or(""),
            peer_pid = ?peer.pid(),
            pidfd = peer.is_watching(),
            "session opened"
        );

        let (tx, rx) = mpsc::channel(64);
        let welcome = pb::session_event::Kind::Welcome(pb::Welcome {
            session_id: id.clone(),
            heartbeat_interval_ms: u32::try_from(self.app.config.heartbeat_interval.as_millis())
                .unwrap_or(u32::MAX),
            device: Some(convert::device(&registry.device())),
        });
        let _ = tx.try_send(event(welcome));

        let app = self.app.clone();
        tokio::spawn(async move {
            let reason = loop {
                tokio::select! {
                    msg = tokio::time::timeout(deadline, inbound.message()) => match msg {
                        Err(_) => break EndReason::HeartbeatTimeout,
                        Ok(Ok(None)) => break EndReason::Closed,
                        Ok(Err(status)) => {
                            debug!(session = %id, %status, "session stream error");
                            break EndReason::StreamError;
                        }
                        Ok(Ok(Some(m))) => match m.kind {
                            Some(pb::session_request::Kind::Heartbeat(_)) => {}
                            Some(pb::session_request::Kind::Hello(_)) | None => {
                                let _ = tx.send(Err(Status::invalid_argument(
                                    "a session takes one hello, then heartbeats",
                                ))).await;
                                break EndReason::ProtocolViolation;
                            }
                        },
                    },
                    ev = events.recv() => match ev {
                        Ok(ev) => {
                            if let Some(kind) = relevant(&app, &caller, &id, ev)
                                && tx.send(event(kind)).await.is_err()
                            {
                                break EndReason::Closed;
                            }
                        }
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            warn!(session = %id, missed = n, "session fell behind on model events");
                        }
                        Err(broadcast::error::RecvError::Closed) => break EndReason::Shutdown,
                    },
                    () = tx.closed() => break EndReason::Closed,
                    () = app.shutdown.cancelled() => break EndReason::Shutdown,
                    () = peer.exited() => break EndReason::PeerExited,
                    () = revocation.revoked() => {
                        let revoked = pb::session_event::Kind::SessionRevoked(pb::SessionRevoked {
                            reason: revocation.reason().to_owned(),
                        });
                        let _ = tx.send(event(revoked)).await;
                        break EndReason::Revoked;
                    }
                }
            };
            let released = app.registry.end_session(&id);
            // Tickets of the session's leases (released now, or by a revocation) close their fds.
            app.tickets.purge(|leases| app.registry.gone_leases(leases));
            app.metrics.session_ended(reason.label());
            audit::session(&caller, "session_end", &id, true, reason.label());
            info!(session = %id, reason = ?reason, leases_released = released, "session ended");
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn attach(
        &self,
        request: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let started = std::time::Instant::now();
        let result = self.attach_inner(request).await;
        let m = &self.app.metrics;
        match &result {
            Ok(_) => {
                m.attaches.with_label_values(&["ok"]).inc();
                m.attach_seconds.observe(started.elapsed().as_secs_f64());
            }
            Err(_) => m.attaches.with_label_values(&["error"]).inc(),
        }
        result
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let caller = caller_of(&request)?;
        let req = request.into_inner();
        let result = self
            .app
            .registry
            .release(&caller, &req.session_id, &req.lease_id)
            .map_err(Status::from);
        let (model, version) = result.as_ref().map_or(("", 0), |(m, v)| (m.as_str(), *v));
        audit::record(&caller, "release", model, version, &result);
        result?;
        self.app.tickets.revoke_lease(&req.lease_id);
        Ok(Response::new(pb::ReleaseResponse {}))
    }
}

impl WorkerApi {
    async fn attach_inner(
        &self,
        request: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let caller = caller_of(&request)?;
        // A ticket is redeemable only by the uid that attached (when the kernel told us).
        let peer_uid = peer_uid(request.extensions());
        let req = request.into_inner();
        let result = self.attach_as(&caller, &req, peer_uid);
        audit::record(
            &caller,
            "attach",
            &req.model,
            result
                .as_ref()
                .ok()
                .and_then(|r| r.manifest.as_ref())
                .map_or(req.version, |m| m.version),
            &result,
        );
        result.map(Response::new)
    }

    fn attach_as(
        &self,
        caller: &Caller,
        req: &pb::AttachRequest,
        peer_uid: Option<u32>,
    ) -> Result<pb::AttachResponse, Status> {
        self.app.require_ready()?;
        let registry = &self.app.registry;
        let att = registry
            .attach(caller, &req.session_id, &req.model, req.version)
            .map_err(|e| self.app.refuse(e))?;
        let exported = att.arena.export();
        let handle = match exported {
            Ok(ExportedHandle::Fd(fd)) => {
                let ticket = self.app.tickets.issue(&att.lease_id, fd, peer_uid);
                pb::attach_response::Handle::Host(pb::HostArenaHandle {
                    ticket,
                    handle_socket: self.app.config.handle_socket.display().to_string(),
                    ticket_ttl_ms: u32::try_from(self.app.tickets.ttl().as_millis())
                        .unwrap_or(u32::MAX),
                })
            }
            Err(e) => {
                let _ = registry.release(caller, &req.session_id, &att.lease_id);
                return Err(ServerError::Device(e).into());
            }
            Ok(ExportedHandle::CudaIpc {
                mem,
                event,
                device_uuid,
            }) => pb::attach_response::Handle::CudaIpc(pb::CudaIpcArenaHandle {
                mem_handle: mem.to_vec(),
                event_handle: event.to_vec(),
                device_uuid,
            }),
            Ok(other) => {
                let _ = registry.release(caller, &req.session_id, &att.lease_id);
                return Err(ServerError::Internal(format!(
                    "the backend exported a handle this server cannot pass on: {other:?}"
                ))
                .into());
            }
        };
        debug!(session = %req.session_id, model = %req.model, version = att.manifest.version, lease = %att.lease_id, "attach");
        Ok(pb::AttachResponse {
            lease_id: att.lease_id,
            manifest: Some(convert::manifest(&att.manifest)),
            device: Some(convert::device(&registry.device())),
            handle: Some(handle),
            loading: att.loading,
        })
    }
}

/// The session event for `ev`, if this session should hear of it: new ready versions of the
/// models its tenant may see (others' names must not leak), and draining only of versions it
/// holds.
fn relevant(
    app: &App,
    caller: &Caller,
    session: &str,
    ev: ModelEvent,
) -> Option<pb::session_event::Kind> {
    match ev {
        ModelEvent::VersionReady { model, version } => {
            let visible = app.registry.visible(caller, &model);
            visible.then_some(pb::session_event::Kind::VersionReady(pb::VersionReady {
                model,
                version,
            }))
        }
        ModelEvent::VersionDraining { model, version } => app
            .registry
            .session_holds(session, &model, version)
            .then_some(pb::session_event::Kind::VersionDraining(
                pb::VersionDraining { model, version },
            )),
    }
}
