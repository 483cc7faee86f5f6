//! A session, an attach and a re-attach against the fake server of `common` (the three
//! WorkerService calls, answered from one sealed host arena over a real handle socket), so that
//! the SDK's session, model and import paths are tested without the server crate.

mod common;

use std::time::Duration;

use common::{W, next_event, open, start};
use modelshare_worker::SessionEvent;

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
