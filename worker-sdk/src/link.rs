//! What a session shares with its models: the current [`Link`] (session id and client), and
//! the session's life ([`KeepOpen`]).
//!
//! This module sits below both `session` (which sets the link on each (re)connection and runs
//! the supervisor) and `model` (which attaches and releases on the current link), so that
//! neither of those needs the other's internals to reach the server.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::WorkerError;
use crate::connect::AuthChannel;

/// The current connection: session id, client, and the heartbeat interval its welcome asked
/// for (`None` when the welcome said 0).
#[derive(Debug, Clone)]
pub(crate) struct Link {
    pub(crate) id: String,
    /// The device attaches ask for (see `SessionOptions::device_uuid`).
    pub(crate) device_uuid: Option<String>,
    pub(crate) client: WorkerServiceClient<AuthChannel>,
    pub(crate) heartbeat: Option<Duration>,
}

/// The shared core of a session: the link now in use (none while reconnecting or after the
/// end), the token cancelled when the session closes, the one cancelled when its
/// supervisor stops for good (closed, or a broken stream with reconnection turned off), and
/// the releases of dropped models still in flight.
#[derive(Debug, Default)]
pub(crate) struct SessionCore {
    link: Mutex<Option<Link>>,
    closed: CancellationToken,
    ended: CancellationToken,
    releases: TaskTracker,
}

impl SessionCore {
    /// The current link, or `SessionEnded` while reconnecting / after the end.
    pub(crate) fn link(&self) -> Result<Link, WorkerError> {
        self.link
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(WorkerError::SessionEnded)
    }

    /// Replaces the current link (`None`: the stream broke).
    pub(crate) fn set_link(&self, link: Option<Link>) {
        *self.link.lock().unwrap_or_else(|e| e.into_inner()) = link;
    }

    /// Cancelled when the last [`KeepOpen`] goes.
    pub(crate) fn closed(&self) -> &CancellationToken {
        &self.closed
    }

    /// Cancelled when the supervisor has stopped: no link will come any more.
    pub(crate) fn ended(&self) -> &CancellationToken {
        &self.ended
    }

    /// Runs the release of a dropped model's lease in the background, on the current runtime;
    /// the session's goodbye waits for it ([`Self::finish_releases`]).
    pub(crate) fn spawn_release(&self, release: impl Future<Output = ()> + Send + 'static) {
        self.releases.spawn(release);
    }

    /// Waits, at most `limit`, for the releases in flight, and takes no more: a session
    /// closing right after its models were dropped says goodbye after their releases, which
    /// the server would refuse once the session has ended.
    pub(crate) async fn finish_releases(&self, limit: Duration) {
        self.releases.close();
        let _ = tokio::time::timeout(limit, self.releases.wait()).await;
    }
}

/// A share in keeping a session open, held by every `Session` clone and every `Model` of it:
/// when the last share goes the session closes (its supervisor stops, its stream ends and
/// the server releases its leases).
#[derive(Debug, Clone)]
pub(crate) struct KeepOpen(Arc<CloseOnDrop>);

impl KeepOpen {
    pub(crate) fn new(core: Arc<SessionCore>) -> Self {
        Self(Arc::new(CloseOnDrop(core)))
    }

    /// The session's current link.
    pub(crate) fn link(&self) -> Result<Link, WorkerError> {
        self.0.0.link()
    }

    /// The core of the session this share keeps open.
    pub(crate) fn core(&self) -> &Arc<SessionCore> {
        &self.0.0
    }
}

/// Closes the session when dropped (the last [`KeepOpen`] clone's share).
#[derive(Debug)]
struct CloseOnDrop(Arc<SessionCore>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.closed.cancel();
    }
}
