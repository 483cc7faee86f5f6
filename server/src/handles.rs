//! One-time tickets and the Unix handle socket that passes arena file descriptors.
//!
//! An attach on an fd-passing backend exports the arena (a new fd), files it under a random
//! ticket and returns the ticket in the reply. The worker connects to the handle socket, sends
//! the ticket and receives the fd with `SCM_RIGHTS` (wire format: [`modelshare_device::handoff`]).
//! A ticket is good once, for a short time, and only while its lease is held.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use modelshare_device::handoff;
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::registry::Registry;

/// Most tickets outstanding at once; past this, the oldest are dropped.
const MAX_TICKETS: usize = 65_536;
/// How long a connection may take to send its ticket.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Ticket {
    fd: OwnedFd,
    lease: String,
    expires: Instant,
}

/// Outstanding tickets.
#[derive(Debug)]
pub struct Tickets {
    ttl: Duration,
    inner: Mutex<HashMap<String, Ticket>>,
}

/// Why a ticket was not redeemed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    /// Never issued, already used, or dropped.
    #[error("unknown or already used ticket")]
    Unknown,
    /// Issued, but its time ran out.
    #[error("ticket expired")]
    Expired,
    /// Its lease was released before it was redeemed.
    #[error("the ticket's lease was released")]
    LeaseGone,
}

impl Tickets {
    /// Tickets valid for `ttl`.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            inner: Mutex::new(HashMap::new()),
        }
    }

    /// How long a ticket stays valid.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Files `fd` (for `lease`) under a new ticket and returns the ticket.
    pub fn issue(&self, lease: &str, fd: OwnedFd) -> String {
        let ticket = uuid::Uuid::new_v4().simple().to_string();
        let now = Instant::now();
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, t| t.expires > now);
        if map.len() >= MAX_TICKETS
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, t)| t.expires)
                .map(|(k, _)| k.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            ticket.clone(),
            Ticket {
                fd,
                lease: lease.to_owned(),
                expires: now + self.ttl,
            },
        );
        ticket
    }

    /// Takes the fd filed under `ticket`, if the ticket is live and `lease_alive` says its lease
    /// is still held. A ticket is consumed by any attempt.
    pub fn redeem(
        &self,
        ticket: &str,
        lease_alive: impl FnOnce(&str) -> bool,
    ) -> Result<OwnedFd, TicketError> {
        let t = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(ticket)
            .ok_or(TicketError::Unknown)?;
        if t.expires <= Instant::now() {
            return Err(TicketError::Expired);
        }
        if !lease_alive(&t.lease) {
            return Err(TicketError::LeaseGone);
        }
        Ok(t.fd)
    }

    /// Drops the tickets of a released lease.
    pub fn revoke_lease(&self, lease: &str) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, t| t.lease != lease);
    }
}

/// Accepts handle-socket connections until `shutdown` is cancelled.
pub async fn serve(
    listener: UnixListener,
    tickets: Arc<Tickets>,
    registry: Arc<Registry>,
    shutdown: CancellationToken,
) {
    loop {
        let stream = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    warn!(error = %e, "handle socket: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let tickets = tickets.clone();
        let registry = registry.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, &tickets, &registry).await {
                debug!(error = %e, "handle socket: connection ended with an error");
            }
        });
    }
}

async fn answer(
    mut stream: UnixStream,
    tickets: &Tickets,
    registry: &Registry,
) -> Result<(), modelshare_device::DeviceError> {
    let ticket = match tokio::time::timeout(READ_TIMEOUT, handoff::read_ticket(&mut stream)).await {
        Ok(r) => r?,
        Err(_) => {
            return handoff::send_refusal(&mut stream, "timed out waiting for the ticket").await;
        }
    };
    match tickets.redeem(&ticket, |lease| registry.lease_alive(lease)) {
        Ok(fd) => {
            use std::os::fd::AsFd;
            handoff::send_fd(&stream, fd.as_fd()).await
        }
        Err(e) => handoff::send_refusal(&mut stream, &e.to_string()).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn some_fd() -> OwnedFd {
        std::fs::File::open("/dev/null")
            .expect("open /dev/null")
            .into()
    }

    /// A ticket must work once only: a replay would hand a second fd to whoever sniffed it.
    #[test]
    fn a_ticket_is_redeemed_once() {
        let t = Tickets::new(Duration::from_secs(10));
        let id = t.issue("lease", some_fd());
        assert!(t.redeem(&id, |_| true).is_ok());
        assert_eq!(t.redeem(&id, |_| true).unwrap_err(), TicketError::Unknown);
    }

    /// Expired tickets and tickets of released leases must not yield an fd.
    #[test]
    fn expired_and_orphaned_tickets_are_refused() {
        let t = Tickets::new(Duration::from_millis(0));
        let id = t.issue("lease", some_fd());
        assert_eq!(t.redeem(&id, |_| true).unwrap_err(), TicketError::Expired);
        let t = Tickets::new(Duration::from_secs(10));
        let id = t.issue("lease", some_fd());
        assert_eq!(
            t.redeem(&id, |_| false).unwrap_err(),
            TicketError::LeaseGone
        );
        let id = t.issue("lease", some_fd());
        t.revoke_lease("lease");
        assert_eq!(t.redeem(&id, |_| true).unwrap_err(), TicketError::Unknown);
    }
}
