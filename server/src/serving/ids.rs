//! The ids the scheduler hands out and is handed: requests, items, workers, batches, tenants.
//! A leaf: the other files of the scheduler import it, and it imports none of them.

/// Who a request is for: a tenant's name, or `None` for the admin (or a server without tenants).
pub type Tenant = Option<String>;

/// A request's id, assigned by [`super::Scheduler::submit`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RequestId(pub u64);

/// One item of a request: the request and the item's place in it (from 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ItemId {
    /// The request the item belongs to.
    pub request: RequestId,
    /// Its place in the request, from 0.
    pub index: usize,
}

/// A worker stream's id, chosen by the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u64);

/// A batch's id, assigned by [`super::Scheduler::next_batch`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BatchId(pub u64);

/// Whose requests a worker may receive; the tenants policy decides it when the worker offers
/// to serve (`crate::tenants::policy::worker_serves`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Serves {
    /// Every tenant's (the model owner's workers, and the admin's).
    Everyone,
    /// One tenant's only (a worker of a tenant the model is shared with serves itself).
    Only(Tenant),
}

impl Serves {
    /// Whether a request of `tenant` may go to such a worker.
    pub fn admits(&self, tenant: &Tenant) -> bool {
        match self {
            Self::Everyone => true,
            Self::Only(only) => only == tenant,
        }
    }
}
