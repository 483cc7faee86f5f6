//! The fake WorkerService the SDK's integration tests run against: sessions, attach and
//! release answered from one sealed host arena over a real handle socket, and Serve streams
//! handed to the test as [`ServeCall`]s to drive by hand.
#![allow(dead_code)] // Each test binary uses part of it.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use modelshare_device::{Arena, HostArena, handoff};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use modelshare_worker::{Session, SessionOptions};
use tokio::net::UnixListener;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// The values of the one tensor, `w`.
pub const W: [f32; 4] = [1.5, -2.0, 0.25, 8.0];

/// What the fake server has seen and holds.
#[derive(Default)]
pub struct State {
    pub sessions: u32,
    pub attaches: u32,
    /// Event senders of the open session streams, by session id.
    pub live: HashMap<String, mpsc::Sender<Result<pb::SessionEvent, Status>>>,
    pub released: Vec<String>,
    /// The `protocol_version` of every hello, in order.
    pub hello_versions: Vec<u32>,
    /// The `protocol_version` the welcomes say (0 by default: a server built before the field).
    pub welcome_version: u32,
}

pub struct Fake {
    arena: HostArena,
    handle_socket: PathBuf,
    state: Mutex<State>,
    /// Session ids whose inbound stream ended (the worker closed the session).
    pub ended: broadcast::Sender<String>,
    /// Every Serve call, for the test to drive.
    serves: mpsc::UnboundedSender<ServeCall>,
    serve_calls: Mutex<Option<mpsc::UnboundedReceiver<ServeCall>>>,
}

impl Fake {
    /// The Serve calls the worker makes, in order (once: the receiver is taken).
    pub fn serve_calls(&self) -> ServeCalls {
        ServeCalls(
            self.serve_calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .expect("serve_calls is taken once"),
        )
    }

    pub fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn manifest(&self) -> pb::Manifest {
        let bytes: &[u8] = bytemuck::cast_slice(&W);
        pb::Manifest {
            model: "tiny".into(),
            version: 1,
            arena_bytes: bytes.len() as u64,
            tensors: vec![pb::TensorInfo {
                name: "w".into(),
                dtype: pb::DType::DtypeF32.into(),
                shape: vec![W.len() as u64],
                offset: 0,
                byte_length: bytes.len() as u64,
                xxh3: xxhash_rust::xxh3::xxh3_64(bytes),
                ms64: 0,
            }],
            ..Default::default()
        }
    }

    /// Ends session `id` as a forced unload does: a revocation, then the stream closes.
    pub async fn revoke(&self, id: &str) {
        let tx = self.state().live.remove(id).expect("a live session");
        let revoked = pb::SessionEvent {
            kind: Some(pb::session_event::Kind::SessionRevoked(
                pb::SessionRevoked {
                    reason: "test revocation".into(),
                },
            )),
        };
        tx.send(Ok(revoked)).await.expect("the worker listens");
    }
}

#[derive(Clone)]
struct Service(Arc<Fake>);

#[tonic::async_trait]
impl WorkerService for Service {
    type SessionStream = ReceiverStream<Result<pb::SessionEvent, Status>>;

    async fn session(
        &self,
        request: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        let mut inbound = request.into_inner();
        match inbound.next().await {
            Some(Ok(pb::SessionRequest {
                kind: Some(pb::session_request::Kind::Hello(hello)),
            })) => self.0.state().hello_versions.push(hello.protocol_version),
            _ => {
                return Err(Status::invalid_argument(
                    "the first message must be a hello",
                ));
            }
        }
        let (tx, rx) = mpsc::channel(8);
        let (id, protocol_version) = {
            let mut state = self.0.state();
            state.sessions += 1;
            let id = format!("s{}", state.sessions);
            state.live.insert(id.clone(), tx.clone());
            (id, state.welcome_version)
        };
        let welcome = pb::SessionEvent {
            kind: Some(pb::session_event::Kind::Welcome(pb::Welcome {
                session_id: id.clone(),
                heartbeat_interval_ms: 20,
                device: None,
                devices: Vec::new(),
                protocol_version,
            })),
        };
        tx.send(Ok(welcome)).await.expect("the receiver is here");
        let fake = self.0.clone();
        tokio::spawn(async move {
            while let Some(Ok(_heartbeat)) = inbound.next().await {}
            fake.state().live.remove(&id);
            let _ = fake.ended.send(id);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn attach(
        &self,
        request: Request<pb::AttachRequest>,
    ) -> Result<Response<pb::AttachResponse>, Status> {
        let req = request.into_inner();
        let attaches = {
            let mut state = self.0.state();
            if !state.live.contains_key(&req.session_id) {
                return Err(Status::not_found("no such session"));
            }
            if req.model != "tiny" {
                return Err(Status::not_found("no such model"));
            }
            state.attaches += 1;
            state.attaches
        };
        Ok(Response::new(pb::AttachResponse {
            lease_id: format!("l{attaches}"),
            manifest: Some(self.0.manifest()),
            device: None,
            handle: Some(pb::attach_response::Handle::Host(pb::HostArenaHandle {
                ticket: format!("t{attaches}"),
                handle_socket: self.0.handle_socket.display().to_string(),
                ticket_ttl_ms: 5000,
            })),
            loading: false,
        }))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        self.0.state().released.push(request.into_inner().lease_id);
        Ok(Response::new(pb::ReleaseResponse {}))
    }

    /// Wants nothing: this fake server never restarts with memory to adopt.
    async fn offer_held(
        &self,
        _request: Request<pb::OfferHeldRequest>,
    ) -> Result<Response<pb::OfferHeldResponse>, Status> {
        Ok(Response::new(pb::OfferHeldResponse {
            wanted: false,
            reason: "a fake server".into(),
            ..Default::default()
        }))
    }

    type ServeStream = ReceiverStream<Result<pb::ServeEvent, Status>>;

    /// Hands the call to the test (see [`Fake::serve_calls`]), which reads the offer and
    /// answers.
    async fn serve(
        &self,
        request: Request<Streaming<pb::ServeRequest>>,
    ) -> Result<Response<Self::ServeStream>, Status> {
        let (tx, rx) = mpsc::channel(64);
        let call = ServeCall {
            inbound: request.into_inner(),
            tx,
        };
        self.0
            .serves
            .send(call)
            .map_err(|_| Status::unavailable("the test is gone"))?;
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Starts the fake server in `dir`: its state and the gRPC address.
pub async fn start(dir: &Path) -> (Arc<Fake>, String) {
    let bytes: &[u8] = bytemuck::cast_slice(&W);
    let arena = HostArena::new(bytes.len() as u64, "tiny@1").unwrap();
    arena.write_at(0, bytes).unwrap();
    arena.seal().unwrap();
    let handle_socket = dir.join("handles.sock");
    let (ended, _) = broadcast::channel(16);
    let (serves, serve_calls) = mpsc::unbounded_channel();
    let fake = Arc::new(Fake {
        arena,
        handle_socket: handle_socket.clone(),
        state: Mutex::default(),
        ended,
        serves,
        serve_calls: Mutex::new(Some(serve_calls)),
    });

    // The handle socket: every ticket is good for a dup of the arena's descriptor.
    let handles = UnixListener::bind(&handle_socket).unwrap();
    let f = fake.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = handles.accept().await {
            let export = f.arena.export().unwrap();
            tokio::spawn(async move {
                handoff::read_ticket(&mut stream).await.unwrap();
                let fd = export.fd.expect("a host export carries a descriptor");
                handoff::send_fd(&stream, fd.as_fd()).await.unwrap();
            });
        }
    });

    let grpc = dir.join("grpc.sock");
    let listener = UnixListener::bind(&grpc).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WorkerServiceServer::new(Service(fake.clone())))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    (fake, format!("unix:{}", grpc.display()))
}

pub async fn open(address: &str) -> Session {
    Session::open_with(
        address,
        SessionOptions {
            worker_name: "test".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// The next event, within a few seconds.
pub async fn next_event<T: Clone>(rx: &mut broadcast::Receiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("an event within 5 s")
        .expect("the channel is open")
}

/// The Serve calls a worker makes.
pub struct ServeCalls(mpsc::UnboundedReceiver<ServeCall>);

impl ServeCalls {
    /// The next call, within 5 s.
    pub async fn next(&mut self) -> ServeCall {
        tokio::time::timeout(Duration::from_secs(5), self.0.recv())
            .await
            .expect("a Serve call within 5 s")
            .expect("the server is up")
    }

    /// The next call and its offer, accepted (serve id "serve-1", the offered version).
    pub async fn accept(&mut self) -> (ServeCall, pb::ServeOffer) {
        let mut call = self.next().await;
        let Some(pb::serve_request::Kind::Offer(offer)) = call.recv().await else {
            panic!("the first message was not an offer");
        };
        call.send(pb::serve_event::Kind::Accepted(pb::ServeAccepted {
            serve_id: "serve-1".into(),
            version: offer.version,
            initial_window: 0,
        }))
        .await;
        (call, offer)
    }
}

/// One Serve call, seen from the server: the worker's messages, and a sender of events.
pub struct ServeCall {
    pub inbound: Streaming<pb::ServeRequest>,
    pub tx: mpsc::Sender<Result<pb::ServeEvent, Status>>,
}

impl ServeCall {
    /// The worker's next message within 5 s; `None` once it closed its side.
    pub async fn recv(&mut self) -> Option<pb::serve_request::Kind> {
        match tokio::time::timeout(Duration::from_secs(5), self.inbound.next())
            .await
            .expect("a message from the worker within 5 s")
        {
            Some(Ok(m)) => Some(m.kind.expect("a message with a kind")),
            Some(Err(status)) => panic!("the worker's stream failed: {status}"),
            None => None,
        }
    }

    /// The worker's next message that is not a heartbeat.
    pub async fn recv_no_beat(&mut self) -> Option<pb::serve_request::Kind> {
        loop {
            match self.recv().await {
                Some(pb::serve_request::Kind::Heartbeat(_)) => {}
                other => return other,
            }
        }
    }

    /// The next batch result (heartbeats skipped).
    pub async fn result(&mut self) -> pb::BatchResult {
        match self.recv_no_beat().await {
            Some(pb::serve_request::Kind::Result(r)) => r,
            other => panic!("expected a batch result, got {other:?}"),
        }
    }

    /// Sends an event to the worker.
    pub async fn send(&self, kind: pb::serve_event::Kind) {
        self.tx
            .send(Ok(pb::ServeEvent { kind: Some(kind) }))
            .await
            .expect("the worker listens");
    }

    /// Ends the stream with `status`.
    pub async fn fail(&self, status: Status) {
        let _ = self.tx.send(Err(status)).await;
    }
}
