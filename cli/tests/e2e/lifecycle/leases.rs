//! Unload, leases and their draining, sessions that close or fall silent.

use std::time::Duration;

use modelshare_proto::v1 as pb;

use super::write_small;
use crate::common::{self, Server};

/// Unloading a model must free its arena: GetStats returns to zero and the model disappears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_frees_the_arena() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "m", "m").await.expect("load");
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.arena_bytes), (1, v.arena_bytes));
    assert!(v.arena_bytes >= 64 * 64 * 4 + 64 * 2);
    let r = admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            version: 0,
            ..Default::default()
        })
        .await
        .expect("unload")
        .into_inner();
    assert_eq!(r.versions.len(), 1);
    assert_eq!(r.versions[0].state, pb::VersionState::Freed as i32);
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.arena_bytes, s.models), (0, 0, 0));
    let list = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("list")
        .into_inner();
    assert!(list.models.is_empty());
}

/// An unload under a lease must drain: attaches refused, bytes kept until the last release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unload_while_attached_drains_until_release() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    let session = modelshare_worker::Session::open(&server.address, "holder")
        .await
        .expect("session");
    let model = session.attach("m").await.expect("attach");
    let before = model.tensor("w").expect("w").bytes().to_vec();
    let mut events = session.subscribe();

    let r = admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            version: 0,
            ..Default::default()
        })
        .await
        .expect("unload")
        .into_inner();
    assert_eq!(r.versions[0].state, pb::VersionState::Draining as i32);
    assert_eq!(
        events.recv().await.expect("event"),
        modelshare_worker::SessionEvent::VersionDraining {
            model: "m".into(),
            version: 1
        }
    );
    let s = common::stats(&mut admin).await;
    assert_eq!(s.arenas, 1, "a draining version keeps its memory");
    assert_eq!(common::count(&s, pb::VersionState::Draining), 1);
    let other = modelshare_worker::Session::open(&server.address, "late")
        .await
        .expect("session");
    let err = other
        .attach_version("m", 1)
        .await
        .expect_err("attach to draining");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    let err = other
        .attach("m")
        .await
        .expect_err("latest of a draining model");
    assert_eq!(err.code(), Some(tonic::Code::FailedPrecondition), "{err}");
    // The holder still reads the same bytes.
    assert_eq!(model.tensor("w").expect("w").bytes(), before.as_slice());

    model.release().await.expect("release");
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.arena_bytes, s.leases), (0, 0, 0));
}

/// Ending a session without releasing (the worker going away) must release its leases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_session_releases_its_leases() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    // A raw session: hello, then attach twice, then close the stream without releasing.
    let common::RawSession {
        mut worker,
        tx,
        events,
        welcome,
    } = common::raw_session(
        &server.address,
        pb::Hello {
            worker_name: "short".into(),
            pid: 4242,
            labels: [("role".to_string(), "test".to_string())].into(),
            ..Default::default()
        },
    )
    .await;
    for _ in 0..2 {
        worker
            .attach(pb::AttachRequest {
                device_uuid: String::new(),
                session_id: welcome.session_id.clone(),
                model: "m".into(),
                version: 0,
            })
            .await
            .expect("attach");
    }
    let s = common::stats(&mut admin).await;
    assert_eq!((s.sessions, s.leases), (1, 2));
    let ps = admin
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("ps")
        .into_inner();
    assert_eq!(ps.sessions.len(), 1);
    assert_eq!(ps.sessions[0].worker_name, "short");
    assert_eq!(ps.sessions[0].pid, 4242);
    assert_eq!(
        ps.sessions[0].labels.get("role").map(String::as_str),
        Some("test")
    );
    assert_eq!(ps.sessions[0].leases.len(), 2);
    drop(tx);
    drop(events);
    common::eventually(Duration::from_secs(3), "session and leases gone", || {
        let mut admin = admin.clone();
        async move {
            let s = common::stats(&mut admin).await;
            s.sessions == 0 && s.leases == 0
        }
    })
    .await;
    let s = common::stats(&mut admin).await;
    assert_eq!(s.arenas, 1, "the model itself stays loaded");
}

/// A session that stops heartbeating must be ended by the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_session_times_out() {
    let server = Server::start_with(
        &["--heartbeat-interval-ms", "50", "--heartbeat-misses", "2"],
        |_| {},
    )
    .await;
    let mut admin = server.admin().await;
    let raw = common::raw_session(&server.address, pb::Hello::default()).await;
    assert_eq!(common::stats(&mut admin).await.sessions, 1);
    // Keep the stream open but say nothing.
    common::eventually(Duration::from_secs(3), "silent session ended", || {
        let mut admin = admin.clone();
        async move { common::stats(&mut admin).await.sessions == 0 }
    })
    .await;
    drop(raw);
}

/// A lease can only be released by its own session, and only once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_checks_the_owner() {
    let server = Server::start().await;
    write_small(&server.root, "m", 1);
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    let ch = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("channel");
    let mut worker = modelshare_proto::v1::worker_service_client::WorkerServiceClient::new(ch);
    let owner = modelshare_worker::Session::open(&server.address, "owner")
        .await
        .expect("session");
    let model = owner.attach("m").await.expect("attach");
    let thief = modelshare_worker::Session::open(&server.address, "thief")
        .await
        .expect("session");
    let err = worker
        .release(pb::ReleaseRequest {
            session_id: thief.id(),
            lease_id: model.lease_id(),
        })
        .await
        .expect_err("release by another session");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = worker
        .attach(pb::AttachRequest {
            device_uuid: String::new(),
            session_id: "no-such-session".into(),
            model: "m".into(),
            version: 0,
        })
        .await
        .expect_err("attach without a session");
    assert_eq!(err.code(), tonic::Code::NotFound);
    let lease = model.lease_id().to_owned();
    model.release().await.expect("release");
    let err = worker
        .release(pb::ReleaseRequest {
            session_id: owner.id(),
            lease_id: lease,
        })
        .await
        .expect_err("double release");
    assert_eq!(err.code(), tonic::Code::NotFound);
}
