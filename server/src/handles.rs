//! The Unix handle socket that passes arena file descriptors against one-time tickets.
//!
//! An attach on an fd-passing backend files the arena's descriptor on its lease under a ticket
//! (see [`modelshare_core::registry`]'s lease store). The worker connects here, sends the ticket and gets
//! the descriptor back with `SCM_RIGHTS` (wire format: [`modelshare_device::handoff`]). The
//! kernel says who connected (`SO_PEERCRED`), so a ticket issued to one uid is refused to
//! another.
//!
//! The same socket takes **offers** the other way: a worker presenting an offer ticket (from
//! `OfferHeld`) with a descriptor attached hands memory it kept across a restart to the server
//! ([`modelshare_core::adopt`]); it is answered `OK` once the memory is checked and adopted.
//!
//! Hostile clients: connections pass a [`Gate`] like every listener's (the same
//! `max_connections`, `max_connections_per_peer` by uid, and handshake time, from
//! [`crate::connections`]); one past a cap is closed at once. The ticket must arrive within
//! the handshake time (at most [`READ_TIMEOUT`]), and a line carrying a descriptor it has no
//! place for is refused as soon as that descriptor arrives, the descriptor closed
//! ([`modelshare_device::handoff`]), so a connection holds at most its socket and one offered
//! descriptor.

use std::time::Duration;

use modelshare_device::handoff;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::app::App;
use crate::connections::{Gate, PeerKey, Permit};
use modelshare_core::held::HeldStore;

/// The longest a connection may take to send its ticket (less when the listener's handshake
/// time is shorter).
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Accepts handle-socket connections through `gate` until `shutdown` is cancelled.
pub async fn serve(listener: UnixListener, gate: Gate, app: App, shutdown: CancellationToken) {
    let warned = std::sync::Mutex::new(None);
    let read_timeout = gate.limits().handshake.min(READ_TIMEOUT);
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    crate::accept::pause("handle socket", &e, &warned).await;
                    continue;
                }
            },
        };
        // Past a cap the stream drops here: closed before anything is read from it.
        let Some(permit) = gate.permit(PeerKey::of_unix(&stream)) else {
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, permit, read_timeout, &app).await {
                debug!(error = %e, "handle socket: connection ended with an error");
            }
        });
    }
}

/// One exchange; `_permit` keeps the connection's place in the gate until it ends.
async fn answer(
    mut stream: UnixStream,
    _permit: Permit,
    read_timeout: Duration,
    app: &App,
) -> Result<(), modelshare_device::DeviceError> {
    let read = tokio::time::timeout(read_timeout, handoff::read_ticket_and_fd(&mut stream)).await;
    let (ticket, offered) = match read {
        Ok(r) => r?,
        Err(_) => {
            return handoff::send_refusal(&mut stream, "timed out waiting for the ticket").await;
        }
    };
    let peer_uid = stream.peer_cred().ok().map(|c| c.uid());
    if HeldStore::is_offer(&ticket) {
        let Some(fd) = offered else {
            return handoff::send_refusal(&mut stream, "an offer ticket comes with its descriptor")
                .await;
        };
        return match modelshare_core::adopt::redeem(&app.host, &ticket, fd, peer_uid).await {
            Ok(()) => handoff::send_ok(&mut stream).await,
            Err(reason) => {
                tracing::info!(%reason, "offered memory refused");
                handoff::send_refusal(&mut stream, &reason).await
            }
        };
    }
    // A descriptor sent with an attach ticket is not wanted: closed here.
    drop(offered);
    match app.host.registry.redeem_ticket(&ticket, peer_uid) {
        Ok(fd) => {
            use std::os::fd::AsFd;
            handoff::send_fd(&stream, fd.as_fd()).await
        }
        Err(e) => {
            crate::audit::ticket_refused(&e.to_string(), peer_uid);
            handoff::send_refusal(&mut stream, &e.to_string()).await
        }
    }
}
