//! [`PendingLease`]: a lease just taken by an attach whose reply is not built yet. Every step
//! after the registry's (the export on the device thread, the ticket, the reply) can fail; the
//! guard gives the lease back on drop unless the attach is committed, so no failure path
//! releases by hand and none can forget to.

use std::sync::Arc;

use super::Registry;
use super::types::Attachment;
use crate::error::CoreError;
use crate::tenants::Caller;

/// A lease given back when dropped, unless [`commit`](Self::commit)ted.
#[derive(Debug)]
#[must_use = "dropping a pending lease gives it back"]
pub struct PendingLease {
    registry: Arc<Registry>,
    caller: Caller,
    session: String,
    lease: Option<String>,
}

impl PendingLease {
    /// The lease's id.
    pub fn id(&self) -> &str {
        self.lease.as_deref().unwrap_or_default()
    }

    /// Keeps the lease: the attach succeeded. Returns its id.
    pub fn commit(mut self) -> String {
        self.lease.take().unwrap_or_default()
    }
}

impl Drop for PendingLease {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            // The session may have ended meanwhile, taking the lease with it: nothing to give.
            let _ = self.registry.release(&self.caller, &self.session, &lease);
        }
    }
}

impl Registry {
    /// [`attach_on`](Self::attach_on), the lease held by a guard that gives it back unless
    /// the caller commits it.
    pub fn attach_pending(
        self: &Arc<Self>,
        caller: &Caller,
        session: &str,
        model: &str,
        version: u32,
        device: Option<&str>,
    ) -> Result<(Attachment, PendingLease), CoreError> {
        let attached = self.attach_on(caller, session, model, version, device)?;
        let pending = PendingLease {
            registry: self.clone(),
            caller: caller.clone(),
            session: session.to_owned(),
            lease: Some(attached.lease_id.clone()),
        };
        Ok((attached, pending))
    }
}
