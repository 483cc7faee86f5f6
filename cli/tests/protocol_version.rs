//! The protocol version of a session, end to end: the real `modelshare` binary answers each
//! hello's `protocol_version` in its welcome (`modelshare_proto::version::negotiate`). The
//! refusal of a worker older than the server's oldest version cannot be sent today (the oldest
//! is 1, and an absent field reads as 1); `negotiate`'s unit tests cover it with a hypothetical
//! minimum.

#[path = "e2e/common/mod.rs"]
mod common;

use common::Server;
use modelshare_proto::PROTOCOL_VERSION;
use modelshare_proto::v1 as pb;

/// The welcome's version for a hello saying `version`.
async fn welcome_version(server: &Server, version: u32) -> u32 {
    let hello = pb::Hello {
        worker_name: format!("speaks-{version}"),
        pid: std::process::id(),
        protocol_version: version,
        ..Default::default()
    };
    common::raw_session(&server.address, hello)
        .await
        .welcome
        .protocol_version
}

/// The server would answer a newer worker with the worker's version (which it does not speak),
/// refuse it, or answer a worker built before the field (0) with anything but version 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_welcome_answers_the_version_both_sides_speak() {
    let server = Server::start().await;
    assert_eq!(welcome_version(&server, 99).await, PROTOCOL_VERSION);
    assert_eq!(
        welcome_version(&server, PROTOCOL_VERSION + 1).await,
        PROTOCOL_VERSION
    );
    assert_eq!(
        welcome_version(&server, PROTOCOL_VERSION).await,
        PROTOCOL_VERSION
    );
    assert_eq!(welcome_version(&server, 0).await, 1);
}

/// The SDK would refuse the server's welcome (the two sides built from this contract would not
/// agree), so no worker could open a session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_takes_the_servers_welcome() {
    let server = Server::start().await;
    let options = modelshare_worker::SessionOptions {
        worker_name: "sdk".into(),
        ..Default::default()
    };
    let session = modelshare_worker::Session::open_with(&server.address, options)
        .await
        .expect("a session of this contract's version");
    assert!(!session.id().is_empty());
}
