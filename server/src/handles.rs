//! One-time tickets and the Unix handle socket that passes arena file descriptors.
//!
//! An attach on an fd-passing backend exports the arena (a new fd), files it under a random
//! ticket and returns the ticket in the reply. The worker connects to the handle socket, sends
//! the ticket and receives the fd with `SCM_RIGHTS` (wire format: [`modelshare_device::handoff`]).
//! A ticket is good once, for a short time, and only while its lease is held; a ticket issued to
//! a worker on the Unix socket is good only for a peer of the same uid (the kernel says who
//! connected, with `SO_PEERCRED`), so a leaked ticket is no use to another user.

use std::collections::{HashMap, HashSet};
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
    /// Uid of the worker the ticket was issued to, when known.
    uid: Option<u32>,
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
    /// Redeemed by a process of another uid than the one it was issued to.
    #[error("the ticket was issued to another uid")]
    WrongUid,
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

    /// Files `fd` (for `lease`) under a new ticket and returns the ticket. With `uid`, only a
    /// peer of that uid may redeem it.
    pub fn issue(&self, lease: &str, fd: OwnedFd, uid: Option<u32>) -> String {
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
                uid,
            },
        );
        ticket
    }

    /// Takes the fd filed under `ticket`, if the ticket is live, `lease_alive` says its lease
    /// is still held, and the redeeming peer (`peer_uid`) is the uid it was issued to. A ticket
    /// is consumed by any attempt.
    pub fn redeem(
        &self,
        ticket: &str,
        peer_uid: Option<u32>,
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
        if t.uid.is_some() && t.uid != peer_uid {
            return Err(TicketError::WrongUid);
        }
        if !lease_alive(&t.lease) {
            return Err(TicketError::LeaseGone);
        }
        Ok(t.fd)
    }

    /// Drops the tickets whose lease is gone (a session ended: its leases went with it), so that
    /// their file descriptors are closed now rather than at expiry. `gone` gets the leases of
    /// the outstanding tickets and returns those no longer held; it runs without this lock held.
    pub fn purge(&self, gone: impl FnOnce(Vec<String>) -> HashSet<String>) {
        let leases: Vec<String> = {
            let map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            map.values().map(|t| t.lease.clone()).collect()
        };
        if leases.is_empty() {
            return;
        }
        let gone = gone(leases);
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|_, t| !gone.contains(&t.lease));
    }

    /// Outstanding tickets.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).len()
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
    let peer_uid = stream.peer_cred().ok().map(|c| c.uid());
    match tickets.redeem(&ticket, peer_uid, |lease| registry.lease_alive(lease)) {
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
        let id = t.issue("lease", some_fd(), None);
        assert!(t.redeem(&id, None, |_| true).is_ok());
        assert_eq!(
            t.redeem(&id, None, |_| true).unwrap_err(),
            TicketError::Unknown
        );
    }

    /// Expired tickets and tickets of released leases must not yield an fd.
    #[test]
    fn expired_and_orphaned_tickets_are_refused() {
        let t = Tickets::new(Duration::from_millis(0));
        let id = t.issue("lease", some_fd(), None);
        assert_eq!(
            t.redeem(&id, None, |_| true).unwrap_err(),
            TicketError::Expired
        );
        let t = Tickets::new(Duration::from_secs(10));
        let id = t.issue("lease", some_fd(), None);
        assert_eq!(
            t.redeem(&id, None, |_| false).unwrap_err(),
            TicketError::LeaseGone
        );
        let id = t.issue("lease", some_fd(), None);
        t.revoke_lease("lease");
        assert_eq!(
            t.redeem(&id, None, |_| true).unwrap_err(),
            TicketError::Unknown
        );
    }

    /// A ticket issued to a uid must not yield its fd to another uid, nor to a peer whose uid
    /// is unknown.
    #[test]
    fn a_ticket_is_bound_to_its_uid() {
        let t = Tickets::new(Duration::from_secs(10));
        let id = t.issue("lease", some_fd(), Some(1000));
        assert_eq!(
            t.redeem(&id, Some(1001), |_| true).unwrap_err(),
            TicketError::WrongUid
        );
        assert_eq!(
            t.redeem(&id, Some(1000), |_| true).unwrap_err(),
            TicketError::Unknown,
            "a refused attempt consumes the ticket"
        );
        let id = t.issue("lease", some_fd(), Some(1000));
        assert_eq!(
            t.redeem(&id, None, |_| true).unwrap_err(),
            TicketError::WrongUid
        );
        let id = t.issue("lease", some_fd(), Some(1000));
        assert!(t.redeem(&id, Some(1000), |_| true).is_ok());
    }

    /// Tickets of leases that are gone must not keep their fds open until expiry.
    #[test]
    fn purge_drops_tickets_of_dead_leases() {
        let t = Tickets::new(Duration::from_secs(10));
        t.issue("live", some_fd(), None);
        t.issue("dead", some_fd(), None);
        t.issue("dead", some_fd(), None);
        t.purge(|leases| leases.into_iter().filter(|l| l != "live").collect());
        assert_eq!(t.len(), 1);
    }
}
