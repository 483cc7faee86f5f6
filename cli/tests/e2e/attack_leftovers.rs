//! What was left of the earlier round of attacks on the doors: a SIGHUP in the process's first
//! moments, and oversized admin requests. Each test asserts what the server does (answers,
//! stays up, exits as told), not timings.

use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use tonic::Code;

use crate::common::{Server, stats};

/// SIGHUP (bit 0) in `SigIgn` or `SigCgt`, and `Threads`, from `/proc/<pid>/status`.
fn hup_and_threads(pid: u32) -> Option<(bool, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.trim().to_owned())
    };
    let mask = |name: &str| field(name).and_then(|v| u64::from_str_radix(&v, 16).ok());
    let hup = (mask("SigIgn:")? | mask("SigCgt:")?) & 1 != 0;
    let threads = field("Threads:")?.parse().ok()?;
    Some((hup, threads))
}

/// A SIGHUP sent the moment the process shows it runs its own code (its async runtime's
/// threads, or SIGHUP no longer at its default action, whichever is seen first) must not end
/// it, in any of 20 starts: the server then starts, serves, and exits cleanly on SIGTERM. Fails
/// if SIGHUP keeps its default (fatal) action until the runtime is built and its handler
/// installed (the runtime's threads come first: 16-20 of 20 tries died).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_as_soon_as_the_server_runs_is_not_fatal() {
    for attempt in 0..20 {
        let mut server = Server::spawn_with(&[], |_| {});
        let pid = server.pid();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some((hup, threads)) = hup_and_threads(pid)
                && (hup || threads > 1)
            {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "attempt {attempt}: the process never started its runtime nor took SIGHUP over"
            );
            std::hint::spin_loop();
        }
        let target =
            rustix::process::Pid::from_raw(i32::try_from(pid).expect("pid")).expect("a pid");
        rustix::process::kill_process(target, rustix::process::Signal::HUP).expect("SIGHUP");
        // Panics naming the signal if the SIGHUP ended it.
        server.wait_ready().await;
        let mut admin = server.admin().await;
        assert_eq!(stats(&mut admin).await.arenas, 0, "attempt {attempt}");
        let status = server.stop_with("TERM");
        assert!(status.success(), "attempt {attempt}: {status}");
    }
}

/// Every oversized request is RESOURCE_EXHAUSTED, on the admin service as on the worker
/// service (and as the README says): a 2 MiB LoadModel name and a SetModelAccess of 2.5 MiB of
/// tenant names are refused from their length prefix against the admin service's 1 MiB bound.
/// Fails if tonic's own decoding limit answers first (OUT_OF_RANGE). A small request is served
/// as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_admin_requests_are_resource_exhausted() {
    let server = Server::start().await;
    let mut admin = server.admin().await.max_encoding_message_size(64 << 20);
    let name = "x".repeat(2 << 20);
    let refused = admin
        .load_model(pb::LoadModelRequest {
            name,
            path: "m".into(),
            ..Default::default()
        })
        .await
        .expect_err("a 2 MiB LoadModel");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("exceeds this method's limit of 1048576 bytes"),
        "{}",
        refused.message()
    );

    let shared_with: Vec<String> = (0..40_000).map(|i| format!("{i:0>64}")).collect();
    let refused = admin
        .set_model_access(pb::SetModelAccessRequest {
            name: "m".into(),
            access: Some(pb::ModelAccess {
                shared_with,
                public: false,
            }),
        })
        .await
        .expect_err("a 2.5 MiB SetModelAccess");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");

    assert_eq!(
        stats(&mut admin).await.arenas,
        0,
        "a small request is served as before"
    );
}
