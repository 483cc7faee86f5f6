//! A worker's session with the server.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_proto::v1::worker_service_client::WorkerServiceClient;
use tokio::sync::{Mutex, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::model::Model;
use crate::{WorkerError, connect};

/// Something the server told this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A new version of a model is ready.
    VersionReady {
        /// Model name.
        model: String,
        /// Version.
        version: u32,
    },
    /// A version this session holds is draining: release it soon.
    VersionDraining {
        /// Model name.
        model: String,
        /// Version.
        version: u32,
    },
    /// The session stream ended (server gone or session ended by the server).
    Ended,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) id: String,
    pub(crate) client: WorkerServiceClient<Channel>,
    heartbeat: tokio::task::JoinHandle<()>,
    reader: tokio::task::JoinHandle<()>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Stopping the heartbeat drops the request stream: the server ends the session and
        // releases every lease it still holds.
        self.heartbeat.abort();
        self.reader.abort();
    }
}

/// A worker's connection to a modelshare server. Heartbeats run in the background; dropping
/// the last clone (or the process exiting) ends the session and releases its leases.
#[derive(Debug, Clone)]
pub struct Session {
    pub(crate) shared: Arc<Shared>,
    events: Arc<Mutex<mpsc::Receiver<SessionEvent>>>,
    device: Option<pb::DeviceInfo>,
}

/// Options of a new session.
#[derive(Debug, Clone, Default)]
pub struct SessionOptions {
    /// Worker name shown by `modelshare ps`.
    pub worker_name: String,
    /// Labels shown by `modelshare ps`.
    pub labels: HashMap<String, String>,
}

impl Session {
    /// Connects to `address` (see [`connect::channel`]) and opens a session named `worker_name`.
    pub async fn open(address: &str, worker_name: &str) -> Result<Self, WorkerError> {
        let channel = connect::channel(address).await?;
        Self::open_on(
            channel,
            SessionOptions {
                worker_name: worker_name.to_owned(),
                ..SessionOptions::default()
            },
        )
        .await
    }

    /// Opens a session on an existing channel.
    pub async fn open_on(channel: Channel, options: SessionOptions) -> Result<Self, WorkerError> {
        let mut client = WorkerServiceClient::new(channel);
        let (tx, rx) = mpsc::channel::<pb::SessionRequest>(4);
        let hello = pb::SessionRequest {
            kind: Some(pb::session_request::Kind::Hello(pb::Hello {
                worker_name: options.worker_name,
                pid: std::process::id(),
                labels: options.labels,
            })),
        };
        tx.send(hello)
            .await
            .map_err(|_| WorkerError::SessionEnded)?;
        let mut inbound = client
            .session(ReceiverStream::new(rx))
            .await
            .map_err(|status| WorkerError::Rpc {
                call: "Session",
                status,
            })?
            .into_inner();
        let welcome = match inbound.next().await {
            Some(Ok(pb::SessionEvent {
                kind: Some(pb::session_event::Kind::Welcome(w)),
            })) => w,
            Some(Err(status)) => {
                return Err(WorkerError::Rpc {
                    call: "Session",
                    status,
                });
            }
            _ => {
                return Err(WorkerError::Protocol(
                    "the server's first session message was not a welcome".into(),
                ));
            }
        };
        let interval = Duration::from_millis(u64::from(welcome.heartbeat_interval_ms.max(10)));
        let heartbeat = tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let beat = pb::SessionRequest {
                    kind: Some(pb::session_request::Kind::Heartbeat(pb::Heartbeat {})),
                };
                if tx.send(beat).await.is_err() {
                    return;
                }
            }
        });
        let (ev_tx, ev_rx) = mpsc::channel(64);
        let reader = tokio::spawn(async move {
            while let Some(msg) = inbound.next().await {
                let ev = match msg.ok().and_then(|m| m.kind) {
                    Some(pb::session_event::Kind::VersionReady(v)) => SessionEvent::VersionReady {
                        model: v.model,
                        version: v.version,
                    },
                    Some(pb::session_event::Kind::VersionDraining(v)) => {
                        SessionEvent::VersionDraining {
                            model: v.model,
                            version: v.version,
                        }
                    }
                    Some(pb::session_event::Kind::Welcome(_)) | None => continue,
                };
                // A full queue drops events rather than stalling the stream.
                let _ = ev_tx.try_send(ev);
            }
            let _ = ev_tx.try_send(SessionEvent::Ended);
        });
        Ok(Self {
            shared: Arc::new(Shared {
                id: welcome.session_id,
                client,
                heartbeat,
                reader,
            }),
            events: Arc::new(Mutex::new(ev_rx)),
            device: welcome.device,
        })
    }

    /// The session id the server assigned.
    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// The device the server's arenas live on.
    pub fn device(&self) -> Option<&pb::DeviceInfo> {
        self.device.as_ref()
    }

    /// Attaches to the latest ready version of `model`.
    pub async fn attach(&self, model: &str) -> Result<Model, WorkerError> {
        self.attach_version(model, 0).await
    }

    /// Attaches to `version` of `model` (0: latest ready).
    pub async fn attach_version(&self, model: &str, version: u32) -> Result<Model, WorkerError> {
        Model::attach(self.shared.clone(), model, version).await
    }

    /// The next event from the server; `SessionEvent::Ended` once the stream is over.
    pub async fn next_event(&self) -> SessionEvent {
        self.events
            .lock()
            .await
            .recv()
            .await
            .unwrap_or(SessionEvent::Ended)
    }
}
