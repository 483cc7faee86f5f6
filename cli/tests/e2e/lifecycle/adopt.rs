//! A restarted server adopting the memory its workers kept (or not, when the files changed),
//! and the accounting of memory a revoked worker keeps.

use std::time::Duration;

use modelshare_proto::v1 as pb;

use super::write_small;
use crate::common::{self, Server};

/// Reads the held-memory record of `model`@`version` beside the server's handle socket.
fn held_record(server: &Server, model: &str, version: u32) -> Option<serde_json::Value> {
    let path = server
        .dir
        .path()
        .join("handles.sock.held")
        .join(format!("{model}@{version}.json"));
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

/// Waits until the record of m@1 names `pid` among its holders (the server keeps it current
/// within seconds of an attach).
async fn wait_until_recorded_holder(server: &Server, pid: u32) {
    common::eventually(
        Duration::from_secs(10),
        "the record names the worker",
        || {
            let held = held_record(server, "m", 1);
            async move {
                held.is_some_and(|r| {
                    r["holders"]
                        .as_array()
                        .is_some_and(|h| h.iter().any(|x| x["pid"] == pid))
                })
            }
        },
    )
    .await;
}

/// The inode of the memory file a probe maps (the same inode: the same memory).
fn mapped_inode(report: &serde_json::Value) -> u64 {
    report["mapping"]["inode"]
        .as_u64()
        .unwrap_or_else(|| panic!("no mapping inode in {report}"))
}

/// A worker keeps its mapping across a `kill -9` of the server; the restarted server adopts
/// that memory for its start-up model instead of loading a second copy, under the same version
/// number, and the worker's session re-attaches it. Fails if the restart reads the files
/// again (a new memory file), loses the version number, or leaves the memory counted as held by
/// workers only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_adopts_the_memory_a_worker_kept() {
    let mut server =
        Server::start_with(&["--model", "m=m"], |root| write_small(root, "m", 1)).await;
    let mut keeper = common::Worker::start(&server, "m", "keeper");
    let inode_before = mapped_inode(&keeper.report);
    wait_until_recorded_holder(&server, keeper.pid()).await;

    assert!(!server.stop_with("KILL").success());
    server.spawn();
    server.wait_ready().await;
    let log = server.log();
    assert!(log.contains("adopted the memory a worker kept"), "{log}");
    assert!(
        log.contains("model back from memory a worker kept"),
        "{log}"
    );

    let mut admin = server.admin().await;
    let stats = common::stats(&mut admin).await;
    assert_eq!(stats.arenas, 1);
    assert_eq!(stats.held_by_workers_bytes, 0);
    let list = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.models[0].latest_ready, 1);

    // The keeper's session came back and attached again; a new worker maps the same memory.
    let mut reattached = false;
    for _ in 0..4 {
        let ev = keeper.next_event();
        if ev["event"] == "reattached" {
            reattached = true;
            break;
        }
    }
    assert!(reattached, "the keeper's session did not re-attach");
    let fresh = common::Worker::start(&server, "m", "fresh");
    assert_eq!(fresh.report["verified"], true, "{}", fresh.report);
    assert_eq!(mapped_inode(&fresh.report), inode_before);
}

/// When the model's files changed while the server was down, the memory a worker kept is
/// the old bytes: the restarted server loads the new files and does not adopt it. Fails if the
/// server serves the stale memory, or keeps counting it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_of_changed_files_is_not_adopted() {
    let mut server =
        Server::start_with(&["--model", "m=m"], |root| write_small(root, "m", 1)).await;
    let keeper = common::Worker::start(&server, "m", "keeper");
    let inode_before = mapped_inode(&keeper.report);
    wait_until_recorded_holder(&server, keeper.pid()).await;

    assert!(!server.stop_with("KILL").success());
    // Same names and shapes, other bytes.
    write_small(&server.root, "m", 7);
    server.spawn();
    server.wait_ready().await;
    let mut admin = server.admin().await;
    common::eventually(
        Duration::from_secs(15),
        "the kept memory no longer counted",
        || {
            let mut admin = admin.clone();
            async move { common::stats(&mut admin).await.held_by_workers_bytes == 0 }
        },
    )
    .await;
    assert_eq!(common::stats(&mut admin).await.arenas, 1);
    let fresh = common::Worker::start(&server, "m", "fresh");
    assert_eq!(fresh.report["verified"], true, "{}", fresh.report);
    assert_ne!(mapped_inode(&fresh.report), inode_before);
    assert!(
        !server.log().contains("model back from memory"),
        "{}",
        server.log()
    );
}

/// A restart after a `kill -9` with no worker holding anything does not wait for offers: the
/// start-up model is loaded from its files at once. Fails if every restart waits out
/// `--adopt-wait-ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_without_holders_does_not_wait() {
    let mut server = Server::start_with(&["--model", "m=m", "--adopt-wait-ms", "60000"], |root| {
        write_small(root, "m", 1)
    })
    .await;
    {
        let probe = common::Worker::start(&server, "m", "short-lived");
        wait_until_recorded_holder(&server, probe.pid()).await;
        // Dropped: the probe is killed.
    }
    assert!(!server.stop_with("KILL").success());
    let started = std::time::Instant::now();
    server.spawn();
    server.wait_ready().await;
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "waited {:?}",
        started.elapsed()
    );
    assert!(
        server.log().contains("no process that held this version"),
        "{}",
        server.log()
    );
}

/// Two workers hold a model an admin loaded (no start-up model); after a `kill -9` and a
/// restart, one worker's offer brings the version back and both sessions re-attach it. Fails if
/// a worker whose offer was not the one taken is told the model does not exist (NOT_FOUND
/// while it is being brought back, instead of UNAVAILABLE: retry) and gives it up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_worker_reattaches_a_model_brought_back_from_memory() {
    let mut server = Server::start_with(&[], |root| write_small(root, "m", 3)).await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load");
    let mut a = common::Worker::start(&server, "m", "a");
    let mut b = common::Worker::start(&server, "m", "b");
    wait_until_recorded_holder(&server, a.pid()).await;
    wait_until_recorded_holder(&server, b.pid()).await;
    assert!(!server.stop_with("KILL").success());
    server.spawn();
    server.wait_ready().await;
    for w in [&mut a, &mut b] {
        let mut seen = Vec::new();
        loop {
            let ev = w.next_event();
            seen.push(ev["event"].as_str().unwrap_or("").to_owned());
            assert_ne!(ev["event"], "model_gone", "{seen:?} {ev}\n{}", server.log());
            if ev["event"] == "reattached" {
                break;
            }
            assert!(seen.len() < 6, "{seen:?}");
        }
    }
    let mut admin = server.admin().await;
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.leases, s.held_by_workers_bytes), (1, 2, 0));
}

/// A force-unloaded version that a live worker may still map (host memory outlives the
/// server's handle) is counted as held by workers and against `--max-total-bytes` until that
/// worker exits. Fails if the memory vanishes from the accounting at the unload (and a second
/// model is admitted past the limit), or stays counted after the worker is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_a_revoked_worker_keeps_is_counted_until_it_exits() {
    // Each small model's arena is 16,640 bytes: room for one, not two.
    let mut server = Server::start_with(
        &[
            "--max-total-bytes",
            "20000",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
        |root| {
            write_small(root, "m", 1);
            write_small(root, "n", 2);
        },
    )
    .await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load m");
    let keeper = common::Worker::start(&server, "m", "keeper");
    common::unload(&mut admin, "m", true).await;
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.held_by_workers_bytes), (0, 16640));
    let refused = common::load(&mut admin, "n", "n")
        .await
        .expect_err("past the limit");
    assert!(
        refused.message().contains("revoked workers"),
        "{}",
        refused.message()
    );
    let (_, metrics) = common::http_get(&server.metrics_address(), "/metrics");
    assert!(
        metrics.contains(r#"modelshare_held_by_workers_bytes{device="host",model="m"} 16640"#),
        "{metrics}"
    );

    drop(keeper);
    common::eventually(
        Duration::from_secs(10),
        "the exited worker's memory no longer counted",
        || {
            let mut admin = admin.clone();
            async move { common::stats(&mut admin).await.held_by_workers_bytes == 0 }
        },
    )
    .await;
    common::load(&mut admin, "n", "n")
        .await
        .expect("admitted once the worker is gone");
    server.stop_with("TERM");
}

/// Memory a revoked worker keeps that another version still holds (a load of the same bytes
/// shares it) is not counted again as the worker's: the force-unload of `m`, whose memory
/// `twin` holds too, leaves one arena and nothing held by workers; once `twin` goes, the
/// worker's memory counts. Fails if the memory is counted twice (and a load past
/// `max_total_bytes` refused for memory that exists once), or not at all once only the
/// worker holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_still_shared_is_not_counted_as_a_revoked_workers() {
    let server = Server::start_with(&[], |root| {
        write_small(root, "m", 1);
        write_small(root, "m-copy", 1);
    })
    .await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "m").await.expect("load m");
    let twin = common::load(&mut admin, "twin", "m-copy")
        .await
        .expect("load twin");
    assert!(twin.shares_memory, "{twin:?}");
    let keeper = common::Worker::start(&server, "m", "keeper");
    common::unload(&mut admin, "m", true).await;
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.held_by_workers_bytes), (1, 0), "{s:?}");
    // Once twin goes too, the memory is the revoked worker's alone: counted as such.
    common::unload(&mut admin, "twin", false).await;
    let s = common::stats(&mut admin).await;
    assert_eq!((s.arenas, s.held_by_workers_bytes), (0, 16640), "{s:?}");
    drop(keeper);
}
