//! Real worker processes (`modelshare probe --hold`) sharing one model; crashes, forced
//! unloads and server restarts.

use std::time::{Duration, Instant};

use modelshare_proto::v1 as pb;
use safetensors::Dtype;

use crate::common::{self, Server, T, Worker, t};

/// A model of `mib` MiB of f32 in 8 tensors plus small ones of other dtypes.
fn model(root: &std::path::Path, name: &str, mib: usize) {
    let per = mib * (1 << 20) / 8 / 4;
    let mut ts: Vec<T> = (0..8)
        .map(|i| {
            t(
                &format!("layers.{i}.w"),
                Dtype::F32,
                &[per / 256, 256],
                100 + i as u64,
            )
        })
        .collect();
    ts.push(t("norm", Dtype::BF16, &[256], 7));
    ts.push(t("ids", Dtype::I64, &[64], 8));
    common::write_safetensors(&root.join(name).join("model.safetensors"), &ts);
}

/// The `smaps` entries of `pid` as (header line, Size in kB, Rss in kB).
fn smaps(pid: u32) -> Vec<(String, u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut out = Vec::new();
    for line in text.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            out.push((line.to_owned(), 0, 0));
        } else if let Some(e) = out.last_mut() {
            let kb = |l: &str| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            if line.starts_with("Size:") {
                e.1 = kb(line);
            } else if line.starts_with("Rss:") {
                e.2 = kb(line);
            }
        }
    }
    out
}

async fn stats(server: &Server) -> pb::GetStatsResponse {
    common::stats(&mut server.admin().await).await
}

/// Eight worker processes must see identical, verified bytes of ONE shared arena: the server
/// counts it once and every worker maps the same memfd read-only, with no private copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_workers_share_one_arena() {
    let server = Server::start_with(&["--model", "m=m"], |root| model(root, "m", 32)).await;
    let arena_bytes = stats(&server).await.arena_bytes;
    let workers: Vec<Worker> = (0..8)
        .map(|i| Worker::start(&server, "m", &format!("w{i}")))
        .collect();

    let inode = workers[0].report["mapping"]["inode"]
        .as_u64()
        .expect("inode");
    for w in &workers {
        let r = &w.report;
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["bytes"], workers[0].report["bytes"]);
        assert_eq!(r["mapping"]["perms"], "r--s", "{r}");
        assert_eq!(
            r["mapping"]["inode"].as_u64(),
            Some(inode),
            "a different memfd: {r}"
        );
        // Independently of what the worker says, look at its address space.
        let maps = smaps(w.pid());
        let shared: Vec<_> = maps
            .iter()
            .filter(|(h, _, _)| h.contains("memfd:modelshare:m@1"))
            .collect();
        assert_eq!(
            shared.len(),
            1,
            "worker {} maps the arena {} times",
            w.pid(),
            shared.len()
        );
        assert!(
            shared[0].0.contains(&inode.to_string()) && shared[0].0.contains(" r--s "),
            "{}",
            shared[0].0
        );
        assert_eq!(shared[0].1 * 1024, arena_bytes.div_ceil(4096) * 4096);
        let big_private: Vec<_> = maps
            .iter()
            .filter(|(h, size, rss)| {
                h.split_whitespace().count() == 5
                    && *size * 1024 >= arena_bytes
                    && *rss * 1024 >= arena_bytes / 2
            })
            .collect();
        assert!(
            big_private.is_empty(),
            "worker {} holds an anonymous copy: {big_private:?}",
            w.pid()
        );
    }
    let s = stats(&server).await;
    assert_eq!(
        (s.arenas, s.arena_bytes),
        (1, arena_bytes),
        "memory counted once"
    );
    assert_eq!((s.sessions, s.leases), (8, 8));
    let d = server
        .admin()
        .await
        .describe_model(pb::DescribeModelRequest {
            name: "m".into(),
            version: 0,
        })
        .await
        .expect("describe")
        .into_inner();
    assert_eq!(d.model.expect("model").versions[0].leases, 8);

    for w in &workers {
        w.signal("TERM");
    }
    common::eventually(Duration::from_secs(5), "all sessions gone", || async {
        let s = stats(&server).await;
        s.sessions == 0 && s.leases == 0
    })
    .await;
}

/// `kill -9` of a worker must end its session and leases within 1 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_is_noticed_within_a_second() {
    let server = Server::start_with(&["--model", "m=m"], |root| model(root, "m", 4)).await;
    let survivor = Worker::start(&server, "m", "survivor");
    let victim = Worker::start(&server, "m", "victim");
    assert_eq!(stats(&server).await.leases, 2);
    let killed_at = Instant::now();
    victim.signal("KILL");
    common::eventually(
        Duration::from_secs(1),
        "the killed worker's session gone within 1 s",
        || async {
            let s = stats(&server).await;
            s.sessions == 1 && s.leases == 1
        },
    )
    .await;
    let took = killed_at.elapsed();
    eprintln!("killed worker noticed after {took:?}");
    assert!(took < Duration::from_secs(1), "took {took:?}");
    let ps = server
        .admin()
        .await
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("ps")
        .into_inner();
    assert_eq!(ps.sessions.len(), 1);
    assert_eq!(ps.sessions[0].pid, survivor.pid());
    // The model is untouched and the next worker attaches and verifies.
    let next = Worker::start(&server, "m", "next");
    assert_eq!(next.report["verified"], true);
    assert!(
        server.log().contains("reason=PeerExited")
            || server.log().contains("reason=Closed")
            || server.log().contains("reason=StreamError")
    );
}

/// A drain deadline must end the sessions that still hold the model, freeing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_deadline_ends_the_holders() {
    let server = Server::start_with(&["--model", "m=m"], |root| model(root, "m", 4)).await;
    let mut holder = Worker::start(&server, "m", "holder");
    let mut admin = server.admin().await;
    let r = admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            version: 0,
            force: false,
            drain_timeout_ms: 300,
        })
        .await
        .expect("unload")
        .into_inner();
    assert_eq!(r.versions[0].state, pb::VersionState::Draining as i32);
    let ev = holder.next_event();
    assert_eq!(ev["event"], "version_draining", "{ev}");
    assert_eq!(ev["model"], "m", "{ev}");
    assert!(
        ev["text"].as_str().is_some_and(|t| t.contains("draining")),
        "{ev}"
    );
    // Before the deadline the holder keeps it.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(stats(&server).await.arenas, 1);
    let ev = holder.next_event();
    assert_eq!(ev["event"], "revoked", "{ev}");
    assert!(
        ev["reason"]
            .as_str()
            .is_some_and(|r| r.contains("drain deadline")),
        "{ev}"
    );
    common::eventually(
        Duration::from_secs(2),
        "model freed after the deadline",
        || async {
            let s = stats(&server).await;
            s.arenas == 0 && s.arena_bytes == 0
        },
    )
    .await;
}

/// A forced unload must end the holders at once; the SDK reports the model gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_unload_revokes_and_the_sdk_reports_the_model_gone() {
    let server = Server::start_with(&["--model", "m=m"], |root| model(root, "m", 1)).await;
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    let mut events = session.subscribe();
    let held = session.attach("m").await.expect("attach");
    let tensor = held.tensor("norm").expect("norm");
    let mut admin = server.admin().await;
    let r = admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            version: 0,
            force: true,
            drain_timeout_ms: 0,
        })
        .await
        .expect("unload")
        .into_inner();
    assert_eq!(r.versions[0].state, pb::VersionState::Freed as i32);
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|e| matches!(e, modelshare_worker::SessionEvent::ModelGone { .. }))
    {
        let ev = tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .expect("event in time")
            .expect("event");
        seen.push(ev);
    }
    assert!(seen.iter().any(|e| matches!(e, modelshare_worker::SessionEvent::Revoked { reason } if reason.contains("force-unloaded"))), "{seen:?}");
    assert!(
        seen.iter()
            .any(|e| matches!(e, modelshare_worker::SessionEvent::Reconnected { .. })),
        "{seen:?}"
    );
    // The bytes the worker mapped stay readable (its mapping keeps them alive).
    assert_eq!(tensor.bytes(), common::random_bytes(7, 512));
    let s = stats(&server).await;
    assert_eq!((s.arenas, s.leases), (0, 0));
}

/// After a server restart on the same socket the SDK must reconnect and re-attach by itself;
/// a model the new server does not have is reported gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sdk_survives_a_server_restart() {
    let mut server = Server::start_with(&["--model", "m=m"], |root| {
        model(root, "m", 1);
        model(root, "extra", 1);
    })
    .await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "extra", "extra")
        .await
        .expect("load extra");
    let session = modelshare_worker::Session::open(&server.address, "survivor")
        .await
        .expect("session");
    let mut events = session.subscribe();
    let m = session.attach("m").await.expect("attach m");
    let extra = session.attach("extra").await.expect("attach extra");
    let old_session = session.id();
    let before = m.tensor("layers.0.w").expect("w").bytes().to_vec();

    let status = server.stop_with("TERM");
    assert!(status.success());
    server.spawn();
    server.wait_ready().await;

    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(seen.iter().any(|e| matches!(e, modelshare_worker::SessionEvent::Reattached { model, .. } if model == "m"))
        && seen.iter().any(|e| matches!(e, modelshare_worker::SessionEvent::ModelGone { model, .. } if model == "extra")))
    {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = tokio::time::timeout(left, events.recv()).await.unwrap_or_else(|_| panic!("events so far: {seen:?}")).expect("event");
        seen.push(ev);
    }
    assert!(
        seen.iter()
            .any(|e| matches!(e, modelshare_worker::SessionEvent::Disconnected)),
        "{seen:?}"
    );
    assert_ne!(session.id(), old_session, "a new session after the restart");
    // The re-attached model reads the new server's arena, with the same bytes.
    assert_eq!(
        m.tensor("layers.0.w").expect("w").bytes(),
        before.as_slice()
    );
    assert!(m.verify().is_empty());
    let s = stats(&server).await;
    assert_eq!(
        (s.sessions, s.leases),
        (1, 1),
        "the new server sees the worker's lease on m"
    );
    drop(extra);
}
