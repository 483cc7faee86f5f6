//! Loads admitted and not yet reserved. A load is admitted ([`super::Registry::authorize_load`])
//! before it takes one of the server's load slots and reads its files, and reserved
//! ([`super::Registry::reserve`]) once they are validated; in between it has no version record,
//! so the usage computed from the records does not see it. Its [`LoadClaim`] counts it against
//! its owner's `loads` (and, for a new model, `models`) quota over that stretch: a tenant at its
//! quota is refused before it takes a slot, however many loads it sends at once.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

/// One tenant's loads admitted and not yet reserved.
#[derive(Debug, Default)]
pub(super) struct Pending {
    loads: AtomicU32,
    /// Those of them that would make a model hold memory anew.
    new_models: AtomicU32,
}

/// Every tenant's [`Pending`] loads (taken under the registry's lock; a claim gives its place
/// back wherever it is dropped, which only ever lowers a count).
#[derive(Debug, Default)]
pub(super) struct Claims {
    by_tenant: HashMap<String, Arc<Pending>>,
}

impl Claims {
    /// Loads and new models `tenant` has admitted and not reserved, not counting `except`.
    pub(super) fn of(&self, tenant: &str, except: Option<&LoadClaim>) -> (u32, u32) {
        let Some(pending) = self.by_tenant.get(tenant) else {
            return (0, 0);
        };
        let mut loads = pending.loads.load(Ordering::Acquire);
        let mut new_models = pending.new_models.load(Ordering::Acquire);
        if let Some(claim) = except
            && claim
                .pending
                .as_ref()
                .is_some_and(|p| Arc::ptr_eq(p, pending))
        {
            loads = loads.saturating_sub(1);
            new_models = new_models.saturating_sub(u32::from(claim.new_model));
        }
        (loads, new_models)
    }

    /// Counts one more load of `tenant` (of a new model, or not) until the claim is dropped.
    pub(super) fn take(&mut self, tenant: &str, new_model: bool) -> LoadClaim {
        let pending = self.by_tenant.entry(tenant.to_owned()).or_default().clone();
        pending.loads.fetch_add(1, Ordering::AcqRel);
        if new_model {
            pending.new_models.fetch_add(1, Ordering::AcqRel);
        }
        LoadClaim {
            pending: Some(pending),
            new_model,
        }
    }
}

/// A load admitted and not yet reserved, counted against its owner's quotas until it is
/// dropped: by [`super::Registry::reserve`] (in the same section that records its version,
/// which counts from then on), or wherever the load is refused before. The default claim counts
/// nothing (a load with no owner: the admin's).
#[derive(Debug, Default)]
pub struct LoadClaim {
    pending: Option<Arc<Pending>>,
    new_model: bool,
}

impl Drop for LoadClaim {
    fn drop(&mut self) {
        if let Some(pending) = self.pending.take() {
            pending.loads.fetch_sub(1, Ordering::AcqRel);
            if self.new_model {
                pending.new_models.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }
}
