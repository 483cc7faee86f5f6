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

/// How many unredeemed tickets (each holding an open descriptor) may be outstanding: per
/// session, per tenant and in all. An attach past one of them is refused, not served by
/// dropping someone else's ticket, so one client cannot exhaust the server's descriptors.
///
/// A tenant's share is also bounded by what the others leave ([`TicketLimits::tenant_share`]):
/// it takes at most half of the places other tenants do not hold, so one tenant (or several)
/// cannot take every place however low `total` is (a quarter of a low open-file limit), and
/// whoever comes next finds room. There is no renewing a ticket: it expires `ticket_ttl_ms`
/// after its attach, and attaching again is another lease and another ticket, counted against
/// the share again, so attaching as fast as places free up does not keep others out either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketLimits {
    /// Per session.
    pub per_session: usize,
    /// Per tenant, over all its sessions (callers without a tenant are not counted here).
    pub per_tenant: usize,
    /// In all.
    pub total: usize,
}

impl TicketLimits {
    /// How many unredeemed tickets one tenant may hold while the other tenants (and callers
    /// without one) hold `others`: `per_tenant`, and at most half of the places the others
    /// leave, at least 1.
    pub fn tenant_share(&self, others: usize) -> usize {
        let left = self.total.saturating_sub(others);
        self.per_tenant.min((left / 2).max(1))
    }

    /// `total` lowered to `total` at most, and `per_tenant` scaled with it: half of it at most
    /// (at least 1), the share of a tenant when nobody else holds a ticket.
    pub fn lowered_to(self, total: usize) -> Self {
        let total = self.total.min(total);
        Self {
            per_tenant: self.per_tenant.min((total / 2).max(1)),
            total,
            ..self
        }
    }
}

impl Default for TicketLimits {
    fn default() -> Self {
        Self {
            per_session: 64,
            per_tenant: 1024,
            total: 65_536,
        }
    }
}

/// Why no ticket was issued.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IssueError {
    /// The lease ended meanwhile.
    #[error("the lease ended")]
    LeaseGone,
    /// A limit of [`TicketLimits`] is reached.
    #[error("{limit} unredeemed tickets {scope} outstanding")]
    Limit {
        /// Whose tickets: "of this session", "of tenant x", "in all".
        scope: String,
        /// The limit reached.
        limit: usize,
    },
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
    /// The device of the arena it maps (the first's or a replica's).
    pub(super) device: Option<String>,
    /// The session's tenant, whose tickets are counted together.
    tenant: Option<String>,
    ticket: Option<Ticket>,
}

impl LeaseRecord {
    pub(super) fn new(session: &str, tenant: Option<&str>, model: &str, version: u32) -> Self {
        Self {
            session: session.to_owned(),
            model: model.to_owned(),
            version,
            device: None,
            tenant: tenant.map(str::to_owned),
            ticket: None,
        }
    }
}

/// Every lease, by id, with an index of tickets to their leases and the count of outstanding
/// tickets per session and per tenant.
#[derive(Debug, Default)]
pub(super) struct Leases {
    by_id: HashMap<String, LeaseRecord>,
    tickets: HashMap<String, String>,
    per_session: HashMap<String, usize>,
    per_tenant: HashMap<String, usize>,
}

/// Adds `delta` (±1) to `key`'s count, dropping counts that reach zero.
fn count(map: &mut HashMap<String, usize>, key: &str, up: bool) {
    if up {
        *map.entry(key.to_owned()).or_default() += 1;
    } else if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
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
        if let Some(t) = self.take_ticket(id) {
            grave.fd(t.fd);
        }
        self.by_id.remove(id)
    }

    /// Takes `lease`'s outstanding ticket out of the indexes and counts.
    fn take_ticket(&mut self, lease: &str) -> Option<Ticket> {
        let record = self.by_id.get_mut(lease)?;
        let t = record.ticket.take()?;
        self.tickets.remove(&t.id);
        count(&mut self.per_session, &record.session, false);
        if let Some(tenant) = &record.tenant {
            count(&mut self.per_tenant, tenant, false);
        }
        Some(t)
    }

    /// Refuses one more ticket for `record` past a limit (`replacing`: it gives one back).
    fn check_limits(
        &self,
        record: &LeaseRecord,
        replacing: bool,
        limits: &TicketLimits,
    ) -> Result<(), IssueError> {
        let back = usize::from(replacing);
        let over = |n: usize, limit: usize| n.saturating_sub(back) >= limit;
        let session = self.per_session.get(&record.session).copied().unwrap_or(0);
        if over(session, limits.per_session) {
            return Err(IssueError::Limit {
                scope: "of this session".into(),
                limit: limits.per_session,
            });
        }
        if let Some(tenant) = &record.tenant {
            let n = self.per_tenant.get(tenant).copied().unwrap_or(0);
            let others = self.tickets.len().saturating_sub(n);
            let share = limits.tenant_share(others);
            if over(n, share) {
                return Err(IssueError::Limit {
                    scope: format!("of tenant {tenant}"),
                    limit: share,
                });
            }
        }
        if over(self.tickets.len(), limits.total) {
            return Err(IssueError::Limit {
                scope: "in all".into(),
                limit: limits.total,
            });
        }
        Ok(())
    }

    /// Files `fd` on `lease` under a new ticket valid until `expires` (for `uid` only, when
    /// given), replacing the lease's earlier one. Refused when the lease is gone meanwhile or
    /// a limit is reached; the descriptor is then buried.
    pub(super) fn issue_ticket(
        &mut self,
        lease: &str,
        fd: OwnedFd,
        uid: Option<u32>,
        expires: Instant,
        limits: &TicketLimits,
        grave: &mut Graveyard,
    ) -> Result<String, IssueError> {
        let Some(record) = self.by_id.get(lease) else {
            grave.fd(fd);
            return Err(IssueError::LeaseGone);
        };
        if let Err(e) = self.check_limits(record, record.ticket.is_some(), limits) {
            grave.fd(fd);
            return Err(e);
        }
        if let Some(old) = self.take_ticket(lease) {
            grave.fd(old.fd);
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let record = self.by_id.get_mut(lease).ok_or(IssueError::LeaseGone)?;
        record.ticket = Some(Ticket {
            id: id.clone(),
            fd,
            expires,
            uid,
        });
        count(&mut self.per_session, &record.session, true);
        if let Some(tenant) = &record.tenant {
            count(&mut self.per_tenant, tenant, true);
        }
        self.tickets.insert(id.clone(), lease.to_owned());
        Ok(id)
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
        let lease = self
            .tickets
            .get(ticket)
            .cloned()
            .ok_or(TicketError::Unknown)?;
        let Some(t) = self.take_ticket(&lease) else {
            self.tickets.remove(ticket);
            return Err(TicketError::LeaseGone);
        };
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
        let due = self
            .by_id
            .get(lease)
            .and_then(|r| r.ticket.as_ref())
            .is_some_and(|t| t.id == ticket && t.expires <= now);
        if due && let Some(t) = self.take_ticket(lease) {
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
        l.insert("lease".into(), LeaseRecord::new("s", Some("t"), "m", 1));
        (l, Graveyard::default())
    }

    const LIMITS: TicketLimits = TicketLimits {
        per_session: 2,
        per_tenant: 3,
        total: 4,
    };

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    /// A ticket must work once only: a replay would hand a second fd to whoever sniffed it.
    #[test]
    fn a_ticket_is_redeemed_once() {
        let (mut t, mut g) = store();
        let id = t
            .issue_ticket("lease", some_fd(), None, soon(), &LIMITS, &mut g)
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
            .issue_ticket("lease", some_fd(), None, Instant::now(), &LIMITS, &mut g)
            .unwrap();
        assert_eq!(
            t.redeem(&id, None, Instant::now(), &mut g).unwrap_err(),
            TicketError::Expired
        );
        let id = t
            .issue_ticket("lease", some_fd(), None, soon(), &LIMITS, &mut g)
            .unwrap();
        t.remove("lease", &mut g);
        assert_eq!(
            t.redeem(&id, None, Instant::now(), &mut g).unwrap_err(),
            TicketError::Unknown
        );
        assert_eq!(t.tickets(), 0, "ending a lease ends its ticket");
        assert!(
            t.issue_ticket("lease", some_fd(), None, soon(), &LIMITS, &mut g)
                == Err(IssueError::LeaseGone),
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
            .issue_ticket("lease", some_fd(), Some(1000), soon(), &LIMITS, &mut g)
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
            .issue_ticket("lease", some_fd(), Some(1000), soon(), &LIMITS, &mut g)
            .unwrap();
        assert_eq!(
            t.redeem(&id, None, now(), &mut g).unwrap_err(),
            TicketError::WrongUid
        );
        let id = t
            .issue_ticket("lease", some_fd(), Some(1000), soon(), &LIMITS, &mut g)
            .unwrap();
        assert!(t.redeem(&id, Some(1000), now(), &mut g).is_ok());
    }

    /// The timer closes an expired ticket's descriptor, and only that ticket's.
    #[test]
    fn expiry_closes_only_the_expired_ticket() {
        let (mut t, mut g) = store();
        let id = t
            .issue_ticket("lease", some_fd(), None, soon(), &LIMITS, &mut g)
            .unwrap();
        t.expire("lease", &id, Instant::now(), &mut g);
        assert_eq!(t.tickets(), 1, "not yet expired");
        t.expire("lease", &id, soon() + Duration::from_secs(1), &mut g);
        assert_eq!(t.tickets(), 0);
        assert_eq!(g.fds.len(), 1, "its descriptor is closed after the lock");
    }

    /// One tenant cannot take every unredeemed-ticket place when the total is low (a quarter
    /// of a low open-file limit) and its own cap is not: it takes at most half of what the
    /// other tenants do not hold, so whoever comes next finds room, however often the first
    /// attaches again as its tickets are redeemed or expire.
    #[test]
    fn one_tenant_leaves_room_for_the_others() {
        let limits = TicketLimits {
            per_session: 64,
            per_tenant: 1024,
            total: 8,
        };
        let mut t = Leases::default();
        let mut g = Graveyard::default();
        for (tenant, n) in [("a", 8), ("b", 8), ("c", 2)] {
            for i in 0..n {
                let lease = format!("{tenant}{i}");
                t.insert(lease, LeaseRecord::new(tenant, Some(tenant), "m", 1));
            }
        }
        let issue = |t: &mut Leases, g: &mut Graveyard, lease: &str| {
            t.issue_ticket(lease, some_fd(), None, soon(), &limits, g)
        };
        let mut a = Vec::new();
        for i in 0..8 {
            match issue(&mut t, &mut g, &format!("a{i}")) {
                Ok(ticket) => a.push(ticket),
                Err(e) => {
                    assert!(e.to_string().contains("of tenant a"), "{e}");
                    break;
                }
            }
        }
        assert_eq!(a.len(), 4, "a takes half of the 8 places");
        // a redeems one and attaches again: back to its share, not past it.
        t.redeem(&a[0], None, Instant::now(), &mut g)
            .expect("redeemed");
        issue(&mut t, &mut g, "a4").expect("a's place again");
        issue(&mut t, &mut g, "a5").expect_err("still half at most");
        // b gets half of what a does not hold, and c still finds room after both.
        issue(&mut t, &mut g, "b0").expect("b's first");
        issue(&mut t, &mut g, "b1").expect("b's second");
        issue(&mut t, &mut g, "b2").expect_err("b past half of the 4 a leaves");
        issue(&mut t, &mut g, "c0").expect("c finds room");
        assert_eq!(t.tickets(), 7);
    }

    /// Unredeemed tickets are limited per session, per tenant and in all; a refused ticket's
    /// descriptor is closed, a replaced one does not count twice, and a redeemed or expired
    /// one frees its place. A tenant's share is what `per_tenant` allows while nobody else
    /// holds a ticket, and shrinks to half of what the others leave as they take more.
    #[test]
    fn unredeemed_tickets_are_limited() {
        let limits = TicketLimits {
            per_session: 2,
            per_tenant: 3,
            total: 6,
        };
        let mut t = Leases::default();
        let mut g = Graveyard::default();
        for (id, session, tenant) in [
            ("a1", "sa", Some("t")),
            ("a2", "sa", Some("t")),
            ("a3", "sa", Some("t")),
            ("b1", "sb", Some("t")),
            ("b2", "sb", Some("t")),
            ("c1", "sc", None),
            ("c2", "sc", None),
            ("d1", "sd", None),
            ("d2", "sd", None),
        ] {
            t.insert(id.into(), LeaseRecord::new(session, tenant, "m", 1));
        }
        let issue = |t: &mut Leases, g: &mut Graveyard, lease: &str| {
            t.issue_ticket(lease, some_fd(), None, soon(), &limits, g)
        };
        let first = issue(&mut t, &mut g, "a1").expect("first");
        issue(&mut t, &mut g, "a1").expect("a replacement does not count twice");
        assert_eq!(t.tickets(), 1);
        issue(&mut t, &mut g, "a2").expect("second of the session");
        let err = issue(&mut t, &mut g, "a3").unwrap_err();
        assert!(
            matches!(&err, IssueError::Limit { scope, limit: 2 } if scope == "of this session"),
            "{err:?}"
        );
        issue(&mut t, &mut g, "b1").expect("the tenant's third");
        let err = issue(&mut t, &mut g, "b2").unwrap_err();
        assert!(
            matches!(&err, IssueError::Limit { limit: 3, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("of tenant t"), "{err}");
        for lease in ["c1", "c2", "d1"] {
            issue(&mut t, &mut g, lease).expect("callers without a tenant: up to 6 in all");
        }
        let err = issue(&mut t, &mut g, "d2").unwrap_err();
        assert!(err.to_string().contains("in all"), "{err}");
        assert_eq!(t.tickets(), 6);
        assert_eq!(
            g.fds.len(),
            4,
            "replaced and refused descriptors are closed"
        );
        // The replaced ticket is gone; redeeming the live one frees a place.
        assert_eq!(
            t.redeem(&first, None, Instant::now(), &mut g).unwrap_err(),
            TicketError::Unknown
        );
        let live = t.by_id["a1"]
            .ticket
            .as_ref()
            .map(|k| k.id.clone())
            .expect("a1's ticket");
        t.redeem(&live, None, Instant::now(), &mut g)
            .expect("redeemed");
        // The session has room again, but the others hold 3 of 6: t's share is 1 now.
        let err = issue(&mut t, &mut g, "a3").unwrap_err();
        assert!(
            matches!(&err, IssueError::Limit { limit: 1, .. }),
            "{err:?}"
        );
        for lease in ["c1", "c2", "d1"] {
            t.remove(lease, &mut g);
        }
        issue(&mut t, &mut g, "a3").expect("removing leases frees their tickets' places");
        assert_eq!(t.per_session.get("sa"), Some(&2));
        assert_eq!(t.per_tenant.get("t"), Some(&3));
    }
}
