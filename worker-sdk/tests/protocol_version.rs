//! The protocol version of a session, against the fake server of `common`: the SDK says its
//! version in the hello, takes a welcome from a server built before the field (0: version 1),
//! and refuses a welcome of a version it does not speak.

mod common;

use common::{open, start};
use modelshare_proto::version::VersionError;
use modelshare_worker::{Session, SessionOptions, WorkerError};

/// The SDK would not tell the server which version it speaks (so a newer server would take it
/// for a worker built before the field), or would refuse a server built before the field.
#[tokio::test]
async fn the_hello_says_the_sdks_version_and_an_old_server_is_taken() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, address) = start(dir.path()).await;
    assert_eq!(fake.state().welcome_version, 0);
    let session = open(&address).await;
    assert_eq!(
        fake.state().hello_versions,
        [modelshare_proto::PROTOCOL_VERSION]
    );
    assert!(session.attach("tiny").await.is_ok());
}

/// A welcome of a version the worker does not speak (newer than its hello said: a faulty
/// server) would be taken, and the worker would go on misreading the session.
#[tokio::test]
async fn a_welcome_of_an_unknown_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, address) = start(dir.path()).await;
    let newer = modelshare_proto::PROTOCOL_VERSION + 1;
    fake.state().welcome_version = newer;
    let options = SessionOptions {
        worker_name: "test".into(),
        ..Default::default()
    };
    let e = Session::open_with(&address, options).await.unwrap_err();
    assert!(
        matches!(
            &e,
            WorkerError::ProtocolVersion(VersionError::ServerTooNew { server, .. }) if *server == newer
        ),
        "{e}"
    );
    assert!(e.is_fatal());
    assert!(e.to_string().contains("protocol version"), "{e}");
}
