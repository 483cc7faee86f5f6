//! Bounded echoes of the input, the open-file limit, exhausted descriptors and hoarded
//! tickets.

use std::time::Duration;

use modelshare_proto::v1 as pb;

use super::write_small;
use crate::common::{self, Server};

/// A client's huge input would come back whole in the status message (a megabyte
/// `grpc-message`, which gRPC clients reject, hiding the real status), on gRPC and HTTP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_echo_at_most_a_bounded_part_of_the_input() {
    let server = Server::start().await;
    let mut admin = server.admin().await;
    let huge = "x".repeat(512 << 10);
    let err = common::load(&mut admin, &huge, "nowhere")
        .await
        .expect_err("bad name");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().len() < 4096, "{} bytes", err.message().len());
    assert!(
        err.message().contains("bytes cut"),
        "{}",
        &err.message()[..200]
    );
    let err = common::load(&mut admin, "m", &huge)
        .await
        .expect_err("bad path");
    assert!(err.message().len() < 4096, "{} bytes", err.message().len());
}

/// A host-backend server over `dir` (its model root and sockets) started under `prlimit
/// --nofile=<nofile>` (soft:hard), its log discarded.
fn serve_with_nofile(nofile: &str, dir: &std::path::Path, extra: &[&str]) -> common::KillOnDrop {
    std::process::Command::new("prlimit")
        .arg(format!("--nofile={nofile}"))
        .arg(common::BIN)
        .args(["serve", "--backend", "host", "--model-root"])
        .arg(dir)
        .arg("--unix-socket")
        .arg(dir.join("g.sock"))
        .arg("--handle-socket")
        .arg(dir.join("h.sock"))
        .args(extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .map(common::KillOnDrop)
        .expect("prlimit and the server")
}

/// The server would keep a low soft limit on open files that its hard limit allows raising.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_open_file_limit_is_raised_to_the_hard_limit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut server = serve_with_nofile("100:2048", dir.path(), &[]);
    let address = format!("unix:{}", dir.path().join("g.sock").display());
    let mut limits = String::new();
    for _ in 0..200 {
        if modelshare_worker::connect::channel(&address).await.is_ok() {
            limits =
                std::fs::read_to_string(format!("/proc/{}/limits", server.id())).expect("limits");
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = server.kill();
    let _ = server.wait();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap_or_else(|| panic!("no open-file line in {limits:?}"));
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers, ["2048", "2048"], "{line}");
}

/// The user and system CPU ticks a process has used (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    // Fields 14 and 15 of the line (utime, stime) are 11 and 12 after the command.
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// With its descriptors exhausted by idle clients, a listener would retry accept() in a loop
/// that takes whole cores (and keeps spinning after they leave); it must pause, and serve
/// again once descriptors are free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_descriptors_do_not_spin_the_listeners() {
    let dir = tempfile::tempdir().expect("tempdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut server = serve_with_nofile(
        "160:160",
        dir.path(),
        &[
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--unauthenticated-tcp",
        ],
    );
    let address = format!("http://127.0.0.1:{port}");
    let mut ready = false;
    for _ in 0..200 {
        if modelshare_worker::connect::channel(&address).await.is_ok() {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ready, "the server did not start");
    // Hold more connections than the server has descriptors.
    let mut idle = Vec::new();
    for _ in 0..220 {
        match tokio::net::TcpStream::connect(("127.0.0.1", port)).await {
            Ok(s) => idle.push(s),
            Err(_) => break,
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = cpu_ticks(server.id());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let used = cpu_ticks(server.id()) - before;
    // Spinning would be ~200 ticks (a whole core for 2 s); pacing costs a few.
    assert!(
        used < 60,
        "the server used {used} CPU ticks in 2 s with descriptors exhausted"
    );
    drop(idle);
    // Descriptors free again: the server answers.
    let mut answered = false;
    for _ in 0..50 {
        if let Ok(ch) = modelshare_worker::connect::channel(&address).await {
            let mut admin = pb::admin_service_client::AdminServiceClient::new(ch);
            if admin.list_models(pb::ListModelsRequest {}).await.is_ok() {
                answered = true;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        answered,
        "the server did not serve again once descriptors were free"
    );
}

/// Each unredeemed ticket holds a descriptor: one client attaching a thousand times without
/// redeeming must hit its session's limit (RESOURCE_EXHAUSTED), not exhaust the server's
/// descriptors, so that another session's attach and a load still work; and the timer must
/// close the hoarded descriptors when the tickets expire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hoarded_tickets_are_limited_and_expire() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_small(dir.path(), "m", 1);
    write_small(dir.path(), "n", 2);
    let cfg = dir.path().join("modelshare.toml");
    // Long enough for the thousand attaches below on a slow machine; checked after them.
    let ttl = Duration::from_secs(10);
    std::fs::write(&cfg, format!("ticket_ttl_ms = {}\n", ttl.as_millis())).expect("config");
    // 512 descriptors: a quarter (128) for tickets in all, 64 per session.
    let mut server = serve_with_nofile(
        "512:512",
        dir.path(),
        &["--config", cfg.to_str().expect("utf8")],
    );
    let address = format!("unix:{}", dir.path().join("g.sock").display());
    let mut channel = None;
    for _ in 0..200 {
        if let Ok(ch) = modelshare_worker::connect::channel(&address).await {
            channel = Some(ch);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut admin = pb::admin_service_client::AdminServiceClient::new(channel.expect("started"));
    common::load(&mut admin, "m", "m").await.expect("load m");
    let hoarder = common::raw_session(&address, pb::Hello::default()).await;
    // The session lives through the tickets' time (its heartbeats), so that what closes the
    // descriptors below is the tickets' expiry, not the session's end.
    let heartbeat = hoarder.heartbeats();
    let baseline = common::open_fds(server.id());
    let baseline_memfds = common::memfd_fds(server.id());
    let attach = |mut session: RawSessionClient, id: String| async move {
        session
            .attach(pb::AttachRequest {
                device_uuid: String::new(),
                session_id: id,
                model: "m".into(),
                version: 0,
            })
            .await
    };
    let (mut granted, mut refused) = (0, 0);
    let hoarding_since = std::time::Instant::now();
    for _ in 0..1000 {
        match attach(hoarder.worker.clone(), hoarder.welcome.session_id.clone()).await {
            Ok(_) => granted += 1,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                assert!(
                    status
                        .message()
                        .contains("unredeemed tickets of this session"),
                    "{}",
                    status.message()
                );
                refused += 1;
            }
        }
    }
    assert!(
        hoarding_since.elapsed() < ttl,
        "the attaches outlasted the tickets: the count below would not be the limit's"
    );
    assert_eq!((granted, refused), (64, 936));
    let hoarding = common::open_fds(server.id());
    assert!(hoarding < 400, "{baseline} → {hoarding} descriptors");
    let hoarding_memfds = common::memfd_fds(server.id());
    assert_eq!(
        hoarding_memfds,
        baseline_memfds + 64,
        "one arena copy per granted ticket"
    );
    // Someone else still attaches and loads.
    let other = common::raw_session(&address, pb::Hello::default()).await;
    attach(other.worker.clone(), other.welcome.session_id.clone())
        .await
        .expect("another session attaches");
    common::load(&mut admin, "n", "n")
        .await
        .expect("a load still opens its files");
    // The timer closes what was never redeemed.
    let pid = server.id();
    common::eventually(
        ttl + Duration::from_secs(10),
        "expired tickets closed",
        // Left: the arena of n (the other session's ticket expires with the hoarder's).
        || async move {
            common::memfd_fds(pid) <= baseline_memfds + 1 && common::open_fds(pid) <= baseline + 4
        },
    )
    .await;
    attach(hoarder.worker.clone(), hoarder.welcome.session_id.clone())
        .await
        .expect("the session's tickets expired: it may attach again");
    heartbeat.abort();
    let _ = server.kill();
    let _ = server.wait();
}

type RawSessionClient =
    modelshare_proto::v1::worker_service_client::WorkerServiceClient<tonic::transport::Channel>;
