//! A session's life: opened from a hello, served until it ends, then released; and the one
//! dispatcher that turns registry events into pushes to the sessions that may hear of them.

use std::sync::Arc;

use modelshare_device::PeerWatch;
use modelshare_proto::v1 as pb;
use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;
use tonic::{Status, Streaming};
use tracing::{debug, info, warn};

use crate::app::App;
use crate::audit;
use crate::hub::{EndReason, Live, Push};
use modelshare_core::error::CoreError;
use modelshare_core::registry::{ModelEvent, WorkerHello};
use modelshare_core::tenants::Caller;
use modelshare_core::timer::Expiry;

/// What goes to the worker: session events, or the status that ends the stream.
pub type Outbound = mpsc::Receiver<Result<pb::SessionEvent, Status>>;

fn event(kind: pb::session_event::Kind) -> Result<pb::SessionEvent, Status> {
    Ok(pb::SessionEvent { kind: Some(kind) })
}

/// Opens a session for `caller` from its `hello` (the first message of `inbound`), registers
/// it in the hub and the timer, and serves it in the background. Returns the welcome first
/// (saying `protocol_version`, agreed from the hello's), then events, on the returned channel.
pub fn open(
    app: &App,
    caller: Caller,
    hello: WorkerHello,
    protocol_version: u32,
    peer: PeerWatch,
    inbound: Streaming<pb::SessionRequest>,
    device: pb::DeviceInfo,
) -> Result<Outbound, CoreError> {
    let mut hello = hello;
    hello.peer_pid = peer.pid();
    hello.peer_start = peer
        .pid()
        .and_then(modelshare_core::held::Holder::of)
        .map(|h| h.start);
    let opened = match app.host.registry.open_session(&caller, hello.clone()) {
        Ok(o) => o,
        Err(e) => {
            audit::session(&caller, "session_open", "", false, &e.to_string());
            return Err(e);
        }
    };
    audit::session(&caller, "session_open", &opened.id, true, &hello.name);
    info!(
        session = %opened.id,
        worker = %hello.name,
        pid = hello.pid,
        tenant = caller.tenant().unwrap_or(""),
        peer_pid = ?peer.pid(),
        pidfd = peer.is_watching(),
        "session opened"
    );
    let (live, pushes) = Live::new(opened.id.clone(), caller);
    app.hub.insert(live.clone());
    let deadline = app.config.heartbeat_interval * app.config.heartbeat_misses;
    app.host.timer.schedule(
        Instant::now() + deadline,
        Expiry::Heartbeat {
            session: opened.id.clone(),
        },
    );

    let (tx, rx) = mpsc::channel(64);
    let welcome = pb::session_event::Kind::Welcome(pb::Welcome {
        session_id: opened.id.clone(),
        heartbeat_interval_ms: u32::try_from(app.config.heartbeat_interval.as_millis())
            .unwrap_or(u32::MAX),
        devices: app
            .host
            .devices
            .infos()
            .iter()
            .map(crate::convert::device)
            .collect(),
        device: Some(device),
        protocol_version,
    });
    // The channel is empty and has room: this cannot fail.
    let _ = tx.try_send(event(welcome));
    let app = app.clone();
    tokio::spawn(async move {
        let reason = serve(&app, &live, pushes, inbound, &tx, &peer, &opened.revocation).await;
        let released = app.host.registry.end_session(live.id());
        app.hub.remove(live.id());
        app.host.metrics.session_ended(reason.label());
        audit::session(
            live.caller(),
            "session_end",
            live.id(),
            true,
            reason.label(),
        );
        info!(session = %live.id(), reason = ?reason, leases_released = released, "session ended");
    });
    Ok(rx)
}

async fn serve(
    app: &App,
    live: &Arc<Live>,
    mut pushes: mpsc::Receiver<Push>,
    mut inbound: Streaming<pb::SessionRequest>,
    tx: &mpsc::Sender<Result<pb::SessionEvent, Status>>,
    peer: &PeerWatch,
    revocation: &modelshare_core::registry::Revocation,
) -> EndReason {
    loop {
        tokio::select! {
            msg = inbound.message() => {
                live.touch();
                match msg {
                    Ok(None) => return EndReason::Closed,
                    Err(status) => {
                        debug!(session = %live.id(), %status, "session stream error");
                        return EndReason::StreamError;
                    }
                    Ok(Some(m)) => match m.kind {
                        Some(pb::session_request::Kind::Heartbeat(_)) => {}
                        Some(pb::session_request::Kind::Hello(_)) | None => {
                            let _ = tx.send(Err(Status::invalid_argument(
                                "a session takes one hello, then heartbeats",
                            ))).await;
                            return EndReason::ProtocolViolation;
                        }
                    },
                }
            }
            push = pushes.recv() => {
                let Some(Push::Event(ev)) = push else {
                    return EndReason::Shutdown;
                };
                if tx.send(event(session_event(ev))).await.is_err() {
                    return EndReason::Closed;
                }
            }
            () = tx.closed() => return EndReason::Closed,
            () = app.host.shutdown.cancelled() => return EndReason::Shutdown,
            () = peer.exited() => return EndReason::PeerExited,
            reason = live.ended() => return reason,
            () = revocation.revoked() => {
                let revoked = pb::session_event::Kind::SessionRevoked(pb::SessionRevoked {
                    reason: revocation.reason().to_owned(),
                });
                let _ = tx.send(event(revoked)).await;
                return EndReason::Revoked;
            }
        }
    }
}

fn session_event(ev: ModelEvent) -> pb::session_event::Kind {
    match ev {
        ModelEvent::VersionReady { model, version } => {
            pb::session_event::Kind::VersionReady(pb::VersionReady { model, version })
        }
        ModelEvent::VersionDraining { model, version } => {
            pb::session_event::Kind::VersionDraining(pb::VersionDraining { model, version })
        }
    }
}

/// Whether `live` should hear of `ev`: new ready versions of the models its tenant may see
/// (others' names must not leak), and draining only of versions it holds.
fn relevant(app: &App, live: &Live, ev: &ModelEvent) -> bool {
    match ev {
        ModelEvent::VersionReady { model, version } => {
            app.host.registry.visible(live.caller(), model)
                && app
                    .host
                    .registry
                    .ready_since_open(live.id(), model, *version)
        }
        ModelEvent::VersionDraining { model, version } => {
            app.host.registry.session_holds(live.id(), model, *version)
        }
    }
}

/// Pushes every registry event to the live sessions that may hear of it, until shutdown.
pub async fn dispatch_events(app: App) {
    let mut events = app.host.registry.subscribe();
    loop {
        let ev = tokio::select! {
            () = app.host.shutdown.cancelled() => return,
            ev = events.recv() => ev,
        };
        match ev {
            Ok(ev) => {
                for live in app.hub.all() {
                    if relevant(&app, &live, &ev) && !live.push(Push::Event(ev.clone())) {
                        warn!(session = %live.id(), "session fell behind on model events");
                    }
                }
            }
            Err(broadcast::error::RecvError::Lagged(n)) => {
                warn!(
                    missed = n,
                    "the event dispatcher fell behind on model events"
                );
            }
            Err(broadcast::error::RecvError::Closed) => return,
        }
    }
}

/// The timer's verdict on a session's heartbeat: ended if it stayed silent past `deadline`,
/// else looked at again when it would be.
pub fn heartbeat_due(app: &App, session: &str, deadline: std::time::Duration) -> Option<Instant> {
    let live = app.hub.get(session)?;
    let due = live.last_seen() + deadline;
    if due <= Instant::now() {
        live.end(EndReason::HeartbeatTimeout);
        None
    } else {
        Some(due)
    }
}
