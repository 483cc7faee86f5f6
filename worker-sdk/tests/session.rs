//! A session, an attach and a re-attach against a small fake server (the three WorkerService
//! calls, answered from one sealed host arena over a real handle socket), so that the SDK's
//! session, model and import paths are tested without the server crate.

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use modelshare_device::{Arena, HostArena, handoff};
use modelshare_proto::v1 as pb;
use modelshare_proto::v1::worker_service_server::{WorkerService, WorkerServiceServer};
use modelshare_worker::{Session, SessionEvent, SessionOptions};
use tokio::net::UnixListener;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};

/// The values of the one tensor, `w`.
const W: [f32; 4] = [1.5, -2.0, 0.25, 8.0];

/// What the fake server has seen and holds.
#[derive(Default)]
struct State {
    sessions: u32,
    attaches: u32,
    /// Event senders of the open session streams, by session id.
    live: HashMap<String, mpsc::Sender<Result<pb::SessionEvent, Status>>>,
    released: Vec<String>,
}

struct Fake {
    arena: HostArena,
    handle_socket: PathBuf,
    state: Mutex<State>,
    /// Session ids whose inbound stream ended (the worker closed the session).
    ended: broadcast::Sender<String>,
}

impl Fake {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
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
    async fn revoke(&self, id: &str) {
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
                kind: Some(pb::session_request::Kind::Hello(_)),
            })) => {}
            _ => {
                return Err(Status::invalid_argument(
                    "the first message must be a hello",
                ));
            }
        }
        let (tx, rx) = mpsc::channel(8);
        let id = {
            let mut state = self.0.state();
            state.sessions += 1;
            let id = format!("s{}", state.sessions);
            state.live.insert(id.clone(), tx.clone());
            id
        };
        let welcome = pb::SessionEvent {
            kind: Some(pb::session_event::Kind::Welcome(pb::Welcome {
                session_id: id.clone(),
                heartbeat_interval_ms: 20,
                device: None,
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

    type ServeStream = ReceiverStream<Result<pb::ServeEvent, Status>>;

    /// The SDK does not serve yet; the fake needs the method only to implement the trait.
    async fn serve(
        &self,
        _request: Request<Streaming<pb::ServeRequest>>,
    ) -> Result<Response<Self::ServeStream>, Status> {
        Err(Status::unimplemented("serve"))
    }
}

/// Starts the fake server in `dir`: its state and the gRPC address.
async fn start(dir: &Path) -> (Arc<Fake>, String) {
    let bytes: &[u8] = bytemuck::cast_slice(&W);
    let arena = HostArena::new(bytes.len() as u64, "tiny@1").unwrap();
    arena.write_at(0, bytes).unwrap();
    arena.seal().unwrap();
    let handle_socket = dir.join("handles.sock");
    let (ended, _) = broadcast::channel(16);
    let fake = Arc::new(Fake {
        arena,
        handle_socket: handle_socket.clone(),
        state: Mutex::default(),
        ended,
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

async fn open(address: &str) -> Session {
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
async fn next_event<T: Clone>(rx: &mut broadcast::Receiver<T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("an event within 5 s")
        .expect("the channel is open")
}

/// An attached model's tensor no longer reads back the arena's bytes, typed and verified, or
/// the host mapping is no longer reported read-only.
#[tokio::test]
async fn attach_maps_the_arena_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let (_fake, address) = start(dir.path()).await;
    let session = open(&address).await;
    let model = session.attach("tiny").await.unwrap();

    assert_eq!((model.name(), model.version()), ("tiny", 1));
    assert!(model.read_only());
    assert!(model.view().host_bytes().is_some());
    assert_eq!(model.view().device_ptr(), None);
    let w = model.tensor("w").unwrap();
    assert_eq!(w.as_slice::<f32>().unwrap(), &W);
    assert_eq!(w.to_host().unwrap(), bytemuck::cast_slice::<f32, u8>(&W));
    assert!(!w.is_on_device());
    assert_eq!(w.device_ptr(), None);
    assert!(w.verify());
    assert!(model.verify().is_empty());
    assert!(model.tensor("nope").is_err());
}

/// After the server revokes the session, the SDK no longer reconnects and re-attaches a held
/// model (new session, new lease), or tensors taken before lose their mapping.
#[tokio::test]
async fn revoked_session_reconnects_and_reattaches() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, address) = start(dir.path()).await;
    let session = open(&address).await;
    let mut events = session.subscribe();
    let model = session.attach("tiny").await.unwrap();
    let before = model.tensor("w").unwrap();
    let (first_session, first_lease) = (session.id(), model.lease_id());

    fake.revoke(&first_session).await;
    assert_eq!(
        next_event(&mut events).await,
        SessionEvent::Revoked {
            reason: "test revocation".into()
        }
    );
    let SessionEvent::Reconnected { session_id } = next_event(&mut events).await else {
        panic!("expected a reconnection");
    };
    assert_ne!(session_id, first_session);
    assert_eq!(
        next_event(&mut events).await,
        SessionEvent::Reattached {
            model: "tiny".into(),
            version: 1
        }
    );
    assert_eq!(session.id(), session_id);
    assert_ne!(model.lease_id(), first_lease);
    assert_eq!(before.as_slice::<f32>().unwrap(), &W);
    assert_eq!(model.tensor("w").unwrap().as_slice::<f32>().unwrap(), &W);
}

/// A model no longer keeps its session open after the `Session` is dropped, or dropping the
/// last of them no longer ends the session (and releases the lease).
#[tokio::test]
async fn model_keeps_the_session_open_until_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, address) = start(dir.path()).await;
    let mut ended = fake.ended.subscribe();
    let session = open(&address).await;
    let id = session.id();
    let model = session.attach("tiny").await.unwrap();
    let lease = model.lease_id();

    drop(session);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        fake.state().live.contains_key(&id),
        "the model holds the session open"
    );
    assert_eq!(model.tensor("w").unwrap().as_slice::<f32>().unwrap(), &W);

    drop(model);
    assert_eq!(next_event(&mut ended).await, id);
    // The SDK releases the lease in the background on drop.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !fake.state().released.contains(&lease) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the lease was not released"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
