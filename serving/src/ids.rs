//! The ids the scheduler hands out and is handed: requests, items, workers, batches, tenants.
//! A leaf: the other files of the scheduler import it, and it imports none of them.

pub use modelshare_core::tenants::serves::{Serves, Tenant};

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
