//! Whose requests a worker may receive: the request path's routing rule, which the tenants
//! policy decides ([`super::policy::worker_serves`]) and the scheduler applies.

/// Who a request is for: a tenant's name, or `None` for the admin (or a server without tenants).
pub type Tenant = Option<String>;

/// Whose requests a worker may receive; the tenants policy decides it when the worker offers
/// to serve ([`super::policy::worker_serves`]).
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
