//! Test harness: starting the real server, writing models, talking to it.
//!
//! By part: the server process ([`Server`], `server`), model files (`models`), admin calls
//! (`admin`), raw sessions (`session`), worker processes ([`Worker`], `worker`); here the
//! binary's path, polling and descriptor counts. What the tests use is re-exported here
//! (`crate::common::Server`, `common::load`, ...).
#![allow(dead_code)]

use std::process::Child;
use std::time::{Duration, Instant};

mod admin;
mod models;
mod server;
mod session;
mod worker;

// A test binary that takes only part of the harness (`protocol_version` uses the server and
// raw sessions) leaves some of these unused, as `dead_code` above allows for the items.
#[allow(unused_imports)]
pub use admin::{count, load, stats, unload, until_done};
#[allow(unused_imports)]
pub use models::{T, random_bytes, t, write_safetensors, write_sharded};
#[allow(unused_imports)]
pub use server::{Server, http_get};
#[allow(unused_imports)]
pub use session::{RawSession, raw_session, raw_session_with_token};
#[allow(unused_imports)]
pub use worker::Worker;

/// Path of the binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_modelshare");

/// Descriptors the process `pid` has open, all kinds together.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// Descriptors of `pid` that are memfds: the host backend's arenas and the copies of them that
/// unredeemed tickets hold. Counting only these keeps a ticket count exact while the server
/// opens and closes other files (a held-memory record written after a load, a log, a socket).
pub fn memfd_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |dir| {
        dir.filter_map(Result::ok)
            .filter_map(|entry| std::fs::read_link(entry.path()).ok())
            .filter(|target| target.to_string_lossy().starts_with("/memfd:"))
            .count()
    })
}

/// Polls `check` every 20 ms until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A child process killed (and reaped) when dropped, so that a failing test does not leave its
/// server running.
pub struct KillOnDrop(pub Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
