//! Leases, and the one-time ticket each may carry: one store, so ending a lease ends its
//! ticket (and closes the ticket's descriptor) in the same step.
//!
//! An attach on an fd-passing backend exports the arena (a new descriptor) and files it on the
//! lease under a random ticket, returned in the attach reply. The worker sends the ticket on
//! the Unix handle socket and gets the descriptor with `SCM_RIGHTS`. A ticket is good once, for
//! a short time (the timer closes it at expiry), and only while its lease is held; a ticket
//! issued to a worker on the Unix socket is good only for a peer of the same uid.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::time::Instant;

use super::graveyard::Graveyard;

/// Most tickets outstanding at once; past this, the one closest to expiry is dropped.
pub const MAX_TICKETS: usize = 65_536;

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

#[derive(Debug)]
struct Ticket {
    id: String,
    fd: OwnedFd,
    expires: Instant,
    /// Uid of the worker the ticket was issued to, when known.
    uid: Option<u32>,
}

/// One lease: a session's hold on a model version, and its outstanding ticket.
#[derive(Debug)]
pub(super) struct LeaseRecord {
    pub(super) session: String,
    pub(super) model: String,
    pub(super) version: u32,
    ticket: Option<Ticket>,
}

impl LeaseRecord {
    pub(super) fn new(session: &str, model: &str, version: u32) -> Self {
        Self {
            session: session.to_owned(),
            model: model.to_owned(),
            version,
            ticket: None,
        }
    }
}

/// Every lease, by id, with an index of tickets to their leases.
#[derive(Debug, Default)]
pub(super) struct Leases {
    by_id: HashMap<String, LeaseRecord>,
    tickets: HashMap<String, String>,
}

impl Leases {
    pub(super) fn insert(&mut self, id: String, lease: LeaseRecord) {
        self.by_id.insert(id, lease);
    }

    pub(super) fn get(&self, id: &str) -> Option<&LeaseRecord> {
        self.by_id.get(id)
    }

    pub(super) fn len(&self) -> usize {
        self.by_id.len()
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &LeaseRecord> {
        self.by_id.values()
    }

    /// Removes a lease; its ticket's descriptor goes to the graveyard.
    pub(super) fn remove(&mut self, id: &str, grave: &mut Graveyard) -> Option<LeaseRecord> {
        let mut lease = self.by_id.remove(id)?;
        if let Some(t) = lease.ticket.take() {
            self.tickets.remove(&t.id);
            grave.fd(t.fd);
        }
        Some(lease)
    }

    /// Files `fd` on `lease` under a new ticket valid until `expires` (for `uid` only, when
    /// given). `None` if the lease is gone meanwhile (the descriptor is buried).
    pub(super) fn issue_ticket(
        &mut self,
        lease: &str,
        fd: OwnedFd,
        uid: Option<u32>,
        expires: Instant,
        grave: &mut Graveyard,
    ) -> Option<String> {
        if !self.by_id.contains_key(lease) {
            grave.fd(fd);
            return None;
        }
        if self.tickets.len() >= MAX_TICKETS {
            self.evict_soonest(grave);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let record = self.by_id.get_mut(lease)?;
        if let Some(old) = record.ticket.replace(Ticket {
            id: id.clone(),
            fd,
            expires,
            uid,
        }) {
            self.tickets.remove(&old.id);
            grave.fd(old.fd);
        }
        self.tickets.insert(id.clone(), lease.to_owned());
        Some(id)
    }

    fn evict_soonest(&mut self, grave: &mut Graveyard) {
        let soonest = self
            .by_id
            .iter()
            .filter_map(|(id, l)| l.ticket.as_ref().map(|t| (t.expires, id.clone())))
            .min();
        if let Some((_, lease)) = soonest
            && let Some(t) = self.by_id.get_mut(&lease).and_then(|l| l.ticket.take())
        {
            self.tickets.remove(&t.id);
            grave.fd(t.fd);
        }
    }

    /// Takes the descriptor filed under `ticket` if the ticket is live and the redeeming peer
    /// (`peer_uid`) is the uid it was issued to. A ticket is consumed by any attempt.
    pub(super) fn redeem(
        &mut self,
        ticket: &str,
        peer_uid: Option<u32>,
        now: Instant,
        grave: &mut Graveyard,
    ) -> Result<OwnedFd, TicketError> {
        let lease = self.tickets.remove(ticket).ok_or(TicketError::Unknown)?;
        let t = self
            .by_id
            .get_mut(&lease)
            .and_then(|l| l.ticket.take())
            .ok_or(TicketError::LeaseGone)?;
        if t.expires <= now {
            grave.fd(t.fd);
            return Err(TicketError::Expired);
        }
        if t.uid.is_some() && t.uid != peer_uid {
            grave.fd(t.fd);
            return Err(TicketError::WrongUid);
        }
        Ok(t.fd)
    }

    /// Closes `ticket` of `lease` if it is still outstanding and expired by `now` (the timer).
    pub(super) fn expire(
        &mut self,
        lease: &str,
        ticket: &str,
        now: Instant,
        grave: &mut Graveyard,
    ) {
        let Some(record) = self.by_id.get_mut(lease) else {
            return;
        };
        if record
            .ticket
            .as_ref()
            .is_some_and(|t| t.id == ticket && t.expires <= now)
            && let Some(t) = record.ticket.take()
        {
            self.tickets.remove(&t.id);
            grave.fd(t.fd);
        }
    }

    /// Tickets outstanding.
    pub(super) fn tickets(&self) -> usize {
        self.tickets.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn some_fd() -> OwnedFd {
        std::fs::File::open("/dev/null")
            .expect("open /dev/null")
            .into()
    }

    fn store() -> (Leases, Graveyard) {
        let mut l = Leases::default();
        l.insert("lease".into(), LeaseRecord::new("s", "m", 1));
        (l, Graveyard::default())
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// A ticket must work once only: a replay would hand a second fd to whoever sniffed it.
    #[test]
    fn a_ticket_is_redeemed_once() {
        let (mut t, mut g) = store();
        let id = t
            .issue_ticket("lease", some_fd(), None, soon(), &mut g)
            .unwrap();
        assert!(t.redeem(&id, None, Instant::now(), &mut g).is_ok());
        assert_eq!(
            t.redeem(&id, None, Instant::now(), &mut g).unwrap_err(),
            TicketError::Unknown
        );
    }

    /// Expired tickets and tickets of released leases must not yield an fd.
    #[test]
    fn expired_and_orphaned_tickets_are_refused() {
        let (mut t, mut g) = store();
        let id = t
            .issue_ticket("lease", some_fd(), None, Instant::now(), &mut g)
            .unwrap();
        assert_eq!(
            t.redeem(&id, None, Instant::now(), &mut g).unwrap_err(),
            TicketError::Expired
        );
        let id = t
            .issue_ticket("lease", some_fd(), None, soon(), &mut g)
            .unwrap();
        t.remove("lease", &mut g);
        assert_eq!(
            t.redeem(&id, None, Instant::now(), &mut g).unwrap_err(),
            TicketError::Unknown
        );
        assert_eq!(t.tickets(), 0, "ending a lease ends its ticket");
        assert!(
            t.issue_ticket("lease", some_fd(), None, soon(), &mut g)
                .is_none(),
            "no ticket for a lease that is gone"
        );
    }

    /// A ticket issued to a uid must not yield its fd to another uid, nor to a peer whose uid
    /// is unknown.
    #[test]
    fn a_ticket_is_bound_to_its_uid() {
        let (mut t, mut g) = store();
        let now = Instant::now;
        let id = t
            .issue_ticket("lease", some_fd(), Some(1000), soon(), &mut g)
            .unwrap();
        assert_eq!(
            t.redeem(&id, Some(1001), now(), &mut g).unwrap_err(),
            TicketError::WrongUid
        );
        assert_eq!(
            t.redeem(&id, Some(1000), now(), &mut g).unwrap_err(),
            TicketError::Unknown,
            "a refused attempt consumes the ticket"
        );
        let id = t
            .issue_ticket("lease", some_fd(), Some(1000), soon(), &mut g)
            .unwrap();
        assert_eq!(
            t.redeem(&id, None, now(), &mut g).unwrap_err(),
            TicketError::WrongUid
        );
        let id = t
            .issue_ticket("lease", some_fd(), Some(1000), soon(), &mut g)
            .unwrap();
        assert!(t.redeem(&id, Some(1000), now(), &mut g).is_ok());
    }

    /// The timer closes an expired ticket's descriptor, and only that ticket's.
    #[test]
    fn expiry_closes_only_the_expired_ticket() {
        let (mut t, mut g) = store();
        let id = t
            .issue_ticket("lease", some_fd(), None, soon(), &mut g)
            .unwrap();
        t.expire("lease", &id, Instant::now(), &mut g);
        assert_eq!(t.tickets(), 1, "not yet expired");
        t.expire("lease", &id, soon() + Duration::from_secs(1), &mut g);
        assert_eq!(t.tickets(), 0);
        assert_eq!(g.fds.len(), 1, "its descriptor is closed after the lock");
    }
}
