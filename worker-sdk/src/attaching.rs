//! [`Attaching`]: an attach the server has granted whose arena is still being mapped, in the
//! background ([`crate::Session::attach_early`]). Its manifest, and where the arena will lie,
//! are known before the mapping ends, so that a consumer making its own views of the arena
//! (the Python package's torch tensors) makes them while the handle is redeemed and imported.

use std::sync::Arc;

use modelshare_device::Reservation;
use modelshare_proto::v1 as pb;

use crate::WorkerError;
use crate::model::{Granted, Model};

/// A granted attach, mapping. [`Attaching::finish`] gives the [`Model`]; dropped before, the
/// mapping still ends and its lease is then released.
#[derive(Debug)]
pub struct Attaching {
    manifest: Arc<pb::Manifest>,
    reservation: Option<Reservation>,
    loading: bool,
    mapped: tokio::task::JoinHandle<Result<Model, WorkerError>>,
}

impl Attaching {
    /// Starts mapping `granted` on the runtime; `on_mapped` sees the model once it is.
    pub(crate) fn start(granted: Granted, on_mapped: impl FnOnce(&Model) + Send + 'static) -> Self {
        let manifest = granted.manifest().clone();
        let reservation = granted.reservation().cloned();
        let loading = granted.loading();
        let mapped = tokio::spawn(async move {
            let model = granted.map().await?;
            on_mapped(&model);
            Ok(model)
        });
        Self {
            manifest,
            reservation,
            loading,
            mapped,
        }
    }

    /// The version's manifest (every tensor inside the arena).
    pub fn manifest(&self) -> &Arc<pb::Manifest> {
        &self.manifest
    }

    /// The address space the arena is being mapped at (CUDA VMM): its device address is where
    /// the arena will start. `None` for other handle kinds, whose address is known only once
    /// mapped. A clone keeps the range reserved (never given to another mapping) while it lives,
    /// whether or not the mapping succeeds: views of it made early stay views of nothing else.
    pub fn reservation(&self) -> Option<&Reservation> {
        self.reservation.as_ref()
    }

    /// Whether the version was still loading when granted (its reads must wait for its ready
    /// event, as [`Model::wait_ready`] orders them).
    pub fn attached_while_loading(&self) -> bool {
        self.loading
    }

    /// Waits for the mapping: the attached model, or why the handle could not be redeemed or
    /// mapped (the lease is then released).
    pub async fn finish(self) -> Result<Model, WorkerError> {
        self.mapped
            .await
            .map_err(|e| WorkerError::Protocol(format!("the arena's mapping task failed: {e}")))?
    }
}
