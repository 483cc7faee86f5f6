//! Live worker sessions, reachable by id: the hub.
//!
//! A session's records (tenant, leases) are the registry's; its *live* side — the channel that
//! pushes to the worker, the token that ends it, when it was last heard from — is here, so
//! that anything in the server can reach a session: the event dispatcher pushes model events,
//! the timer ends silent sessions, and (next) the scheduler pushes work. The gRPC handler only
//! adapts the stream ([`run`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use modelshare_core::registry::ModelEvent;
use modelshare_core::tenants::Caller;

/// Pushes queued per session before the oldest are refused (a worker that stopped reading).
pub const PUSH_QUEUE: usize = 64;

/// What the server pushes to a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    /// A model event the session may hear of.
    Event(ModelEvent),
}

/// Why a session ended (a metric label and a log field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The worker closed the stream.
    Closed,
    /// The stream broke.
    StreamError,
    /// No message within the heartbeat deadline.
    HeartbeatTimeout,
    /// The worker broke the protocol.
    ProtocolViolation,
    /// The server is shutting down.
    Shutdown,
    /// The server ended it (a forced unload, a failed load).
    Revoked,
    /// The worker process exited.
    PeerExited,
}

impl EndReason {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            EndReason::Closed => "closed",
            EndReason::StreamError => "stream_error",
            EndReason::HeartbeatTimeout => "heartbeat_timeout",
            EndReason::ProtocolViolation => "protocol_violation",
            EndReason::Shutdown => "shutdown",
            EndReason::Revoked => "revoked",
            EndReason::PeerExited => "peer_exited",
        }
    }
}

/// The live side of one session.
#[derive(Debug)]
pub struct Live {
    id: String,
    caller: Caller,
    tx: mpsc::Sender<Push>,
    end: CancellationToken,
    ended_by: OnceLock<EndReason>,
    last_seen: Mutex<Instant>,
}

impl Live {
    /// A live session and the receiving end of its pushes.
    pub fn new(id: String, caller: Caller) -> (Arc<Self>, mpsc::Receiver<Push>) {
        let (tx, rx) = mpsc::channel(PUSH_QUEUE);
        let live = Arc::new(Self {
            id,
            caller,
            tx,
            end: CancellationToken::new(),
            ended_by: OnceLock::new(),
            last_seen: Mutex::new(Instant::now()),
        });
        (live, rx)
    }

    /// The session id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Who opened it.
    pub fn caller(&self) -> &Caller {
        &self.caller
    }

    /// Records that the worker was just heard from.
    pub fn touch(&self) {
        *self.last_seen.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }

    /// When the worker was last heard from.
    pub fn last_seen(&self) -> Instant {
        *self.last_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends the session for `reason` (the first reason given wins).
    pub fn end(&self, reason: EndReason) {
        let _ = self.ended_by.set(reason);
        self.end.cancel();
    }

    /// Resolves when the server ends the session; gives the reason.
    pub async fn ended(&self) -> EndReason {
        self.end.cancelled().await;
        self.ended_by.get().copied().unwrap_or(EndReason::Shutdown)
    }

    /// Queues `push` for the worker; false if the session's queue is full or it has ended.
    pub fn push(&self, push: Push) -> bool {
        self.tx.try_send(push).is_ok()
    }
}

/// Every live session, by id.
#[derive(Debug, Default)]
pub struct Hub {
    live: Mutex<HashMap<String, Arc<Live>>>,
}

impl Hub {
    /// An empty hub.
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Live>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a session.
    pub fn insert(&self, live: Arc<Live>) {
        self.map().insert(live.id.clone(), live);
    }

    /// Removes a session.
    pub fn remove(&self, id: &str) -> Option<Arc<Live>> {
        self.map().remove(id)
    }

    /// The session `id`, if live.
    pub fn get(&self, id: &str) -> Option<Arc<Live>> {
        self.map().get(id).cloned()
    }

    /// Every live session.
    pub fn all(&self) -> Vec<Arc<Live>> {
        self.map().values().cloned().collect()
    }

    /// How many sessions are live.
    pub fn len(&self) -> usize {
        self.map().len()
    }

    /// Whether no session is live.
    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}
