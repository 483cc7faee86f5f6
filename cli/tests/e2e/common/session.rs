//! Sessions opened with the raw generated client (no SDK).

use std::time::Duration;

use modelshare_proto::v1 as pb;
use tonic::transport::Channel;

/// A session opened with the raw generated client (no SDK): heartbeats are up to the test.
pub struct RawSession {
    /// The worker client on the same channel.
    pub worker: modelshare_proto::v1::worker_service_client::WorkerServiceClient<Channel>,
    /// Sends requests on the stream; dropping it closes the stream.
    pub tx: tokio::sync::mpsc::Sender<pb::SessionRequest>,
    /// The server's events.
    pub events: tonic::Streaming<pb::SessionEvent>,
    /// The welcome.
    pub welcome: pb::Welcome,
}

impl RawSession {
    /// Sends a heartbeat every 300 ms on the session stream (as the SDK does), until the
    /// stream closes or the task is aborted.
    pub fn heartbeats(&self) -> tokio::task::JoinHandle<()> {
        let beats = self.tx.clone();
        tokio::spawn(async move {
            loop {
                let beat = pb::SessionRequest {
                    kind: Some(pb::session_request::Kind::Heartbeat(
                        pb::Heartbeat::default(),
                    )),
                };
                if beats.send(beat).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    }
}

/// Opens a session with `hello` and waits for the welcome.
pub async fn raw_session(address: &str, hello: pb::Hello) -> RawSession {
    open_raw_session(address, hello, None).await
}

/// [`raw_session`] with a bearer token on the session call.
pub async fn raw_session_with_token(address: &str, hello: pb::Hello, token: &str) -> RawSession {
    open_raw_session(address, hello, Some(token)).await
}

async fn open_raw_session(address: &str, hello: pb::Hello, token: Option<&str>) -> RawSession {
    let ch = modelshare_worker::connect::channel(address)
        .await
        .expect("channel");
    let worker = modelshare_proto::v1::worker_service_client::WorkerServiceClient::new(ch);
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(pb::SessionRequest {
        kind: Some(pb::session_request::Kind::Hello(hello)),
    })
    .await
    .expect("hello");
    let mut request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    if let Some(token) = token {
        let value = format!("Bearer {token}").parse().expect("header");
        request.metadata_mut().insert("authorization", value);
    }
    let mut events = worker
        .clone()
        .session(request)
        .await
        .expect("session")
        .into_inner();
    let welcome = match events
        .message()
        .await
        .expect("welcome")
        .and_then(|e| e.kind)
    {
        Some(pb::session_event::Kind::Welcome(w)) => w,
        other => panic!("expected a welcome, got {other:?}"),
    };
    RawSession {
        worker,
        tx,
        events,
        welcome,
    }
}
