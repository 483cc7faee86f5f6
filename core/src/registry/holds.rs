//! The registry's calls about sessions and what they hold: opening and ending sessions,
//! leases (attach, release) and the one-time tickets filed on them.

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use modelshare_device::ArenaHandle;

use super::Registry;
use super::leases::{self, IssueError, TicketError};
use super::state::{SessionRecord, State};
use super::types::{Attachment, OpenedSession, Revocation, SessionSnapshot, WorkerHello};
use super::versions::now_unix_ms;
use crate::error::CoreError;
use crate::model::VersionState;
use crate::tenants::policy::may_see_tenant;
use crate::tenants::{Caller, Resource};

impl Registry {
    /// Opens a session for `caller`, within its sessions quota.
    pub fn open_session(
        &self,
        caller: &Caller,
        hello: WorkerHello,
    ) -> Result<OpenedSession, CoreError> {
        let mut st = self.lock();
        if st.shutting_down {
            return Err(CoreError::ShuttingDown);
        }
        if let Caller::Tenant { name, quota } = caller {
            let used = st.usage(name).sessions;
            quota.check(name, Resource::Sessions, u64::from(used), 1)?;
        }
        if st.sessions.len() >= self.limits.max_sessions {
            return Err(CoreError::LimitExceeded {
                what: "open sessions".into(),
                limit: self.limits.max_sessions as u64,
                requested: st.sessions.len() as u64 + 1,
            });
        }
        let id = uuid::Uuid::new_v4().simple().to_string();
        let revocation = Arc::new(Revocation::default());
        let opened_seq = st.event_seq;
        st.sessions.insert(
            id.clone(),
            SessionRecord {
                tenant: caller.tenant().map(str::to_owned),
                hello,
                opened_unix_ms: now_unix_ms(),
                opened_seq,
                leases: Vec::new(),
                revocation: revocation.clone(),
            },
        );
        Ok(OpenedSession { id, revocation })
    }

    /// Ends a session and releases every lease it held (and their tickets). Returns the
    /// number of leases released; ending an unknown session is a no-op.
    pub fn end_session(&self, session: &str) -> usize {
        let mut st = self.lock();
        let Some(rec) = st.sessions.remove(session) else {
            return 0;
        };
        let n = rec.leases.len();
        for lease in rec.leases {
            st.drop_lease(&lease);
        }
        n
    }

    /// Whether `session` holds a lease on `model`@`version`.
    pub fn session_holds(&self, session: &str, model: &str, version: u32) -> bool {
        let st = self.lock();
        st.sessions.get(session).is_some_and(|s| {
            s.leases.iter().any(|l| {
                st.leases
                    .get(l)
                    .is_some_and(|r| r.model == model && r.version == version)
            })
        })
    }

    /// What a Serve offer of `session` (which must be `caller`'s) for `model`@`version` serves:
    /// the version (0: the newest ready version the session holds a lease on), the model's
    /// owner, and the device the session's lease maps (the worker's GPU; `None` where the lease
    /// names none). The session must hold a lease on that version, and it must be ready.
    pub fn serve_target(
        &self,
        caller: &Caller,
        session: &str,
        model: &str,
        version: u32,
    ) -> Result<(u32, Option<String>, Option<String>), CoreError> {
        let st = self.lock();
        let rec = st.own_session(caller, session)?;
        let model_rec = st.visible_model(caller, model)?;
        let held: Vec<u32> = rec
            .leases
            .iter()
            .filter_map(|l| st.leases.get(l))
            .filter(|l| l.model == model)
            .map(|l| l.version)
            .collect();
        let chosen = if version == 0 {
            held.iter()
                .copied()
                .filter(|v| {
                    model_rec
                        .versions
                        .get(v)
                        .is_some_and(|r| r.state == VersionState::Ready)
                })
                .max()
                .ok_or_else(|| CoreError::NotLeased {
                    model: model.to_owned(),
                    version: None,
                })?
        } else if held.contains(&version) {
            version
        } else {
            return Err(CoreError::NotLeased {
                model: model.to_owned(),
                version: Some(version),
            });
        };
        let state = model_rec
            .versions
            .get(&chosen)
            .map_or(VersionState::Freed, |r| r.state);
        if state != VersionState::Ready {
            return Err(CoreError::WrongState {
                model: model.to_owned(),
                version: chosen,
                state,
            });
        }
        let device = rec
            .leases
            .iter()
            .filter_map(|l| st.leases.get(l))
            .find(|l| l.model == model && l.version == chosen)
            .and_then(|l| l.device.clone());
        Ok((chosen, model_rec.owner.clone(), device))
    }

    /// Takes a lease on `model`@`version` (0: latest ready) for `session`, which must be
    /// `caller`'s; the model must be one `caller` may see, within its leases quota.
    pub fn attach(
        &self,
        caller: &Caller,
        session: &str,
        model: &str,
        version: u32,
    ) -> Result<Attachment, CoreError> {
        self.attach_on(caller, session, model, version, None)
    }

    /// [`attach`](Self::attach) to the arena on `device` (a UUID, any case; `None`: wherever
    /// the version is): [`CoreError::NotOnDevice`], naming where it is, when not there.
    pub fn attach_on(
        &self,
        caller: &Caller,
        session: &str,
        model: &str,
        version: u32,
        device: Option<&str>,
    ) -> Result<Attachment, CoreError> {
        let mut st = self.lock();
        let tenant = session_with_room(&st, caller, session, self.limits.max_leases_per_session)?;
        let version = attach_version(&st, caller, model, version)?;
        // Checked now (it reads the whole state), reported after the version's own refusals.
        let within_quota = lease_quota(&st, caller);
        let v = st
            .version_mut(model, version)
            .ok_or_else(|| CoreError::VersionNotFound {
                model: model.to_owned(),
                version,
            })?;
        let (arena, copying, on) = v.arena_on(device).map_err(|holders| {
            CoreError::NotOnDevice(Box::new(crate::error::NotOnDevice {
                model: model.to_owned(),
                version,
                wanted: device.unwrap_or_default().to_owned(),
                holders,
                served: true,
            }))
        })?;
        let on = on.to_owned();
        let (state, arena) = attachable_arena(v.state, arena, copying, model, version)?;
        within_quota?;
        v.leases += 1;
        let manifest = v.manifest.clone();
        let loading = state == VersionState::Loading;
        let device = on;
        let lease_id = record_lease(&mut st, session, tenant.as_deref(), model, version, &device);
        Ok(Attachment {
            lease_id,
            manifest,
            arena,
            loading,
            device,
        })
    }

    /// Gives back a lease of `session`, which must be `caller`'s (its ticket goes with it).
    /// Returns the model and version it held.
    pub fn release(
        &self,
        caller: &Caller,
        session: &str,
        lease: &str,
    ) -> Result<(String, u32), CoreError> {
        let mut st = self.lock();
        st.own_session(caller, session)?;
        let held = st
            .leases
            .get(lease)
            .filter(|l| l.session == session)
            .map(|l| (l.model.clone(), l.version))
            .ok_or_else(|| CoreError::LeaseNotFound(lease.to_owned()))?;
        if let Some(s) = st.sessions.get_mut(session) {
            s.leases.retain(|l| l != lease);
        }
        st.drop_lease(lease);
        Ok(held)
    }

    /// Files `fd` on `lease` under a new one-time ticket valid until `expires`, redeemable
    /// only by `uid` when given. Refused when the lease is gone meanwhile or the session, its
    /// tenant or the server has [`TicketLimits`] unredeemed tickets out (the fd is closed).
    pub fn issue_ticket(
        &self,
        lease: &str,
        fd: OwnedFd,
        uid: Option<u32>,
        expires: Instant,
    ) -> Result<String, CoreError> {
        let mut st = self.lock();
        let st = &mut *st;
        st.leases
            .issue_ticket(lease, fd, uid, expires, &self.limits.tickets, &mut st.graveyard)
            .map_err(|e| match e {
                IssueError::LeaseGone => CoreError::LeaseNotFound(lease.to_owned()),
                IssueError::Limit { scope, limit } => CoreError::LimitExceeded {
                    what: format!("unredeemed tickets {scope} (redeem them on the handle socket or let them expire)"),
                    limit: limit as u64,
                    requested: limit as u64 + 1,
                },
            })
    }

    /// Takes the descriptor filed under `ticket` (see [`TicketError`] for the refusals). A
    /// ticket is consumed by any attempt.
    pub fn redeem_ticket(
        &self,
        ticket: &str,
        peer_uid: Option<u32>,
    ) -> Result<OwnedFd, TicketError> {
        let mut st = self.lock();
        let st = &mut *st;
        st.leases
            .redeem(ticket, peer_uid, Instant::now(), &mut st.graveyard)
    }

    /// Closes `ticket` of `lease` if it is still outstanding and has expired (the timer).
    pub fn expire_ticket(&self, lease: &str, ticket: &str) {
        let mut st = self.lock();
        let st = &mut *st;
        st.leases
            .expire(lease, ticket, Instant::now(), &mut st.graveyard);
    }

    /// Tickets outstanding.
    pub fn tickets(&self) -> usize {
        self.lock().leases.tickets()
    }

    /// Open sessions `caller` may see (a tenant: its own), oldest first.
    pub fn sessions(&self, caller: &Caller) -> Vec<SessionSnapshot> {
        let st = self.lock();
        let mut out: Vec<SessionSnapshot> = st
            .sessions
            .iter()
            .filter(|(_, s)| may_see_tenant(s.tenant.as_deref(), caller))
            .map(|(id, s)| {
                let mut leases: Vec<(String, String, u32, String)> = s
                    .leases
                    .iter()
                    .filter_map(|l| {
                        st.leases.get(l).map(|r| {
                            let device = r.device.clone().unwrap_or_default();
                            (l.clone(), r.model.clone(), r.version, device)
                        })
                    })
                    .collect();
                leases.sort();
                SessionSnapshot {
                    id: id.clone(),
                    hello: s.hello.clone(),
                    opened_unix_ms: s.opened_unix_ms,
                    tenant: s.tenant.clone(),
                    leases,
                }
            })
            .collect();
        out.sort_by(|a, b| (a.opened_unix_ms, &a.id).cmp(&(b.opened_unix_ms, &b.id)));
        out
    }
}

/// The tenant of `caller`'s `session`, which must hold fewer than `max_leases` leases.
fn session_with_room(
    st: &State,
    caller: &Caller,
    session: &str,
    max_leases: usize,
) -> Result<Option<String>, CoreError> {
    let own = st.own_session(caller, session)?;
    let (held, tenant) = (own.leases.len(), own.tenant.clone());
    if held >= max_leases {
        return Err(CoreError::LimitExceeded {
            what: "leases held by one session".into(),
            limit: max_leases as u64,
            requested: held as u64 + 1,
        });
    }
    Ok(tenant)
}

/// The version of `model` (one `caller` may see) an attach asks for: `version`, or for 0 the
/// latest attachable one.
fn attach_version(
    st: &State,
    caller: &Caller,
    model: &str,
    version: u32,
) -> Result<u32, CoreError> {
    let rec = st.visible_model(caller, model)?;
    Ok(if version == 0 {
        rec.latest_attachable()
            .ok_or_else(|| CoreError::NoReadyVersion(model.to_owned()))?
    } else {
        version
    })
}

/// Whether `caller` may hold one lease more.
fn lease_quota(st: &State, caller: &Caller) -> Result<(), CoreError> {
    match caller {
        Caller::Tenant { name, quota } => {
            let used = st.usage(name).leases;
            quota.check(name, Resource::Leases, u64::from(used), 1)
        }
        Caller::Admin => Ok(()),
    }
}

/// The state an attach sees and the arena it attaches to, or why it cannot attach to
/// `model`@`version` now.
fn attachable_arena(
    state: VersionState,
    arena: Option<&ArenaHandle>,
    copying: bool,
    model: &str,
    version: u32,
) -> Result<(VersionState, ArenaHandle), CoreError> {
    // A replica still being copied is attachable where the version's first arena would be
    // while loading (its ready event orders a worker's reads after the copy).
    let state = match state {
        VersionState::Ready if copying => VersionState::Loading,
        s => s,
    };
    let arena = match (state, arena) {
        // A replica being copied where a worker cannot attach before it is done (host
        // memory): a moment from now it can be.
        (VersionState::Loading, Some(arena)) if copying && !arena.attach_while_loading() => {
            return Err(CoreError::Allocating {
                model: model.to_owned(),
                version,
            });
        }
        (VersionState::Ready, Some(arena)) => arena.clone(),
        (VersionState::Loading, Some(arena)) if arena.attach_while_loading() => arena.clone(),
        // The arena is being allocated (outside the lock): a moment from now it can be.
        (VersionState::Loading, None) => {
            return Err(CoreError::Allocating {
                model: model.to_owned(),
                version,
            });
        }
        (state, _) => {
            return Err(CoreError::WrongState {
                model: model.to_owned(),
                version,
                state,
            });
        }
    };
    Ok((state, arena))
}

/// Records a new lease of `session` on `model`@`version` on `device`; its id.
fn record_lease(
    st: &mut State,
    session: &str,
    tenant: Option<&str>,
    model: &str,
    version: u32,
    device: &str,
) -> String {
    let lease_id = uuid::Uuid::new_v4().simple().to_string();
    let mut lease = leases::LeaseRecord::new(session, tenant, model, version);
    lease.device = Some(device.to_owned());
    st.leases.insert(lease_id.clone(), lease);
    if let Some(s) = st.sessions.get_mut(session) {
        s.leases.push(lease_id.clone());
    }
    lease_id
}
