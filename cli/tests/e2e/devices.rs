//! Several devices in one server, with host memory standing in for them (`--host-devices`):
//! placement of loads, per-device stats and caps, and attaches by the worker's device.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use modelshare_worker::{Session, SessionOptions};
use safetensors::Dtype;

use crate::common::*;

/// Models `a`, `b` and `c` of one layout and different bytes (loads of the same bytes share
/// one arena), and `a-copy`, `a`'s bytes again.
fn two_models(root: &std::path::Path) {
    for (seed, name) in ["a", "b", "c"].iter().enumerate() {
        write_safetensors(
            &root.join(name).join("model.safetensors"),
            &[t("w", Dtype::F32, &[256, 256], seed as u64 + 1)],
        );
    }
    write_safetensors(
        &root.join("a-copy").join("model.safetensors"),
        &[t("w", Dtype::F32, &[256, 256], 1)],
    );
}

/// A server of two host devices of 300 000 bytes each (`--max-device-bytes`): room for one of
/// `two_models`' 256 KiB models per device.
async fn two_capped_devices() -> Server {
    Server::start_with(
        &["--host-devices", "2", "--max-device-bytes", "300000"],
        two_models,
    )
    .await
}

/// A worker session that says it computes on the device `uuid`.
async fn open_on(address: &str, uuid: &str) -> Result<Session, modelshare_worker::WorkerError> {
    Session::open_with(
        address,
        SessionOptions {
            worker_name: format!("on-{uuid}"),
            device_uuid: Some(uuid.to_owned()),
            ..SessionOptions::default()
        },
    )
    .await
}

async fn load_on(
    admin: &mut modelshare_proto::v1::admin_service_client::AdminServiceClient<
        tonic::transport::Channel,
    >,
    name: &str,
    path: &str,
    devices: &[&str],
    replicas: u32,
) -> Result<pb::VersionInfo, tonic::Status> {
    let stream = admin
        .load_model(pb::LoadModelRequest {
            name: name.into(),
            path: path.into(),
            devices: devices.iter().map(|d| d.to_string()).collect(),
            replicas,
            ..Default::default()
        })
        .await?
        .into_inner();
    until_done(stream).await
}

/// Loads go to the least-used device, or the one named (by UUID or index); stats list every
/// device with what it holds; bad placements are refused with the devices named.
#[tokio::test]
async fn loads_are_placed_over_the_devices() {
    let server = Server::start_with(&["--host-devices", "3"], two_models).await;
    let mut admin = server.admin().await;

    let s = stats(&mut admin).await;
    let uuids: Vec<String> = s
        .devices
        .iter()
        .map(|d| d.device.clone().unwrap().uuid)
        .collect();
    assert_eq!(uuids, ["host", "host-1", "host-2"]);

    // Fresh server: the first device; then the next least-used ones.
    let a = load_on(&mut admin, "a", "a", &[], 0).await.unwrap();
    assert_eq!(a.devices, ["host"]);
    let b = load_on(&mut admin, "b", "b", &[], 0).await.unwrap();
    assert_eq!(b.devices, ["host-1"]);
    // Named by index: device 0 again, though it is not the least used.
    let c = load_on(&mut admin, "c", "c", &["0"], 0).await.unwrap();
    assert_eq!(c.devices, ["host"]);
    // By UUID, any case.
    let c2 = load_on(&mut admin, "c2", "c", &["HOST-2"], 0)
        .await
        .unwrap();
    assert_eq!(c2.devices, ["host-2"]);

    let s = stats(&mut admin).await;
    let arenas: Vec<u32> = s.devices.iter().map(|d| d.arenas).collect();
    assert_eq!(arenas, [2, 1, 1]);
    let bytes = a.arena_bytes;
    assert_eq!(s.devices[0].arena_bytes, 2 * bytes);
    assert_eq!(s.devices[1].arena_bytes, bytes);
    // Host memory reports no use of its own: each device's use is what its arenas hold.
    let used: Vec<u64> = s.devices.iter().map(|d| d.used_bytes).collect();
    assert_eq!(used, [2 * bytes, bytes, bytes]);

    // Refusals: no such device, the same one twice, more replicas than devices.
    let e = load_on(&mut admin, "x", "a", &["GPU-nope"], 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("0=host, 1=host-1, 2=host-2"), "{e:?}");
    let e = load_on(&mut admin, "x", "a", &["1", "host-1"], 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    let e = load_on(&mut admin, "x", "a", &[], 4).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    // Nothing was left behind by the refusals.
    let s = stats(&mut admin).await;
    assert_eq!(s.arenas, 4);
}

/// The same bytes under another name, on a server of several devices: with no device named
/// the load goes where those bytes are and shares them, even on a device at its
/// `--max-device-bytes` (it needs no room); named onto another device it is a copy there.
/// Fails if a load that shares is refused by the cap, or placed away from the memory.
#[tokio::test]
async fn the_same_bytes_go_where_they_are() {
    let server = two_capped_devices().await;
    let mut admin = server.admin().await;
    let a = load_on(&mut admin, "a", "a", &["1"], 0).await.unwrap();
    assert_eq!(a.devices, ["host-1"]);
    let twin = load_on(&mut admin, "twin", "a-copy", &[], 0).await.unwrap();
    assert_eq!(twin.devices, ["host-1"], "{twin:?}");
    assert!(twin.shares_memory, "{twin:?}");
    let elsewhere = load_on(&mut admin, "elsewhere", "a-copy", &["0"], 0)
        .await
        .unwrap();
    assert_eq!(elsewhere.devices, ["host"]);
    assert!(!elsewhere.shares_memory, "{elsewhere:?}");
    let s = stats(&mut admin).await;
    let arenas: Vec<u32> = s.devices.iter().map(|d| d.arenas).collect();
    assert_eq!(arenas, [1, 1], "one arena on each device: {s:?}");
    // A third of a's bytes named onto host-1 shares too; b there (other bytes) does not fit.
    let third = load_on(&mut admin, "third", "a", &["host-1"], 0)
        .await
        .unwrap();
    assert!(third.shares_memory, "{third:?}");
    let e = load_on(&mut admin, "b", "b", &["host-1"], 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
}

/// `--max-device-bytes` caps each device: placement skips a full one, and a load named onto
/// it is RESOURCE_EXHAUSTED.
#[tokio::test]
async fn a_full_device_is_skipped_or_refused() {
    let server = two_capped_devices().await;
    let mut admin = server.admin().await;
    let a = load_on(&mut admin, "a", "a", &["1"], 0).await.unwrap();
    assert_eq!(a.devices, ["host-1"]);
    // The least used is host (empty), and it fits.
    let b = load_on(&mut admin, "b", "b", &[], 0).await.unwrap();
    assert_eq!(b.devices, ["host"]);
    let e = load_on(&mut admin, "c", "c", &["host"], 0)
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("max_device_bytes"), "{e:?}");
    let e = load_on(&mut admin, "c", "c", &[], 0).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let s = stats(&mut admin).await;
    assert!(s.devices.iter().all(|d| d.max_arena_bytes == 300_000));
}

/// A worker attaches to the arena on its own device; on another device it gets
/// FAILED_PRECONDITION naming where the version is (and saying so when the server does not
/// serve the worker's device at all). The welcome lists every device.
#[tokio::test]
async fn workers_attach_on_their_device() {
    let server = Server::start_with(&["--host-devices", "2"], two_models).await;
    let mut admin = server.admin().await;
    load_on(&mut admin, "a", "a", &["host-1"], 0).await.unwrap();

    let here = open_on(&server.address, "host-1").await.expect("session");
    let model = here.attach("a").await.expect("attach on host-1");
    assert_eq!(model.manifest().tensors.len(), 1);

    let elsewhere = open_on(&server.address, "host").await.expect("session");
    let e = elsewhere.attach("a").await.unwrap_err().to_string();
    assert!(e.contains("not in a state required"), "{e}");
    assert!(
        e.contains("no replica on device host; it is on host-1"),
        "{e}"
    );
    // A GPU the server was not started for is named as such.
    let unserved = open_on(&server.address, "GPU-not-here")
        .await
        .expect("session");
    let e = unserved.attach("a").await.unwrap_err().to_string();
    assert!(
        e.contains("GPU-not-here (a device this server does not serve); it is on host-1"),
        "{e}"
    );

    // The welcome names both devices (raw client: what a worker in another language sees).
    let raw = raw_session(&server.address, pb::Hello::default()).await;
    let listed: Vec<String> = raw.welcome.devices.iter().map(|d| d.uuid.clone()).collect();
    assert_eq!(listed, ["host", "host-1"]);
    // No device asked for: the arena wherever it is.
    let mut worker = raw.worker.clone();
    let reply = worker
        .attach(pb::AttachRequest {
            session_id: raw.welcome.session_id.clone(),
            model: "a".into(),
            version: 0,
            device_uuid: String::new(),
        })
        .await
        .expect("attach without a device");
    assert_eq!(reply.into_inner().device.unwrap().uuid, "host-1");
    drop(model);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// The old single-device flags still work, and a bad `--devices` is refused at start.
#[test]
fn bad_device_flags_are_refused_at_start() {
    for (args, needle) in [
        (&["--host-devices", "0"][..], "host_devices must be 1 to 16"),
        (
            &["--host-devices", "17"][..],
            "host_devices must be 1 to 16",
        ),
        (&["--devices", "0,,1"][..], "devices: expected"),
        (&["--devices", "0,0"][..], "listed twice"),
        (
            &["--max-device-bytes", "0"][..],
            "max_device_bytes must be at least 1",
        ),
    ] {
        let out = std::process::Command::new(BIN)
            .arg("serve")
            .args(["--backend", "host", "--unix-socket", "/nonexistent/x.sock"])
            .args(args)
            .output()
            .expect("run modelshare");
        assert!(!out.status.success(), "{args:?} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// `replicas = 2`: loaded once from the file, copied to the second device; each device holds
/// exactly one copy; workers on either device read the file's bytes from their own device's
/// arena; an unload frees both; a start-up model takes `replicas` from the file.
#[tokio::test]
async fn replicas_are_copied_to_further_devices() {
    let tensors = vec![
        t("a", Dtype::F32, &[300, 70], 5),
        t("b", Dtype::F16, &[1 << 16], 6),
    ];
    let server = Server::start_with(
        &["--host-devices", "3", "--metrics-listen", "127.0.0.1:0"],
        |root| write_safetensors(&root.join("m").join("model.safetensors"), &tensors),
    )
    .await;
    let mut admin = server.admin().await;
    let v = load_on(&mut admin, "m", "m", &[], 2).await.unwrap();
    assert_eq!(v.devices, ["host", "host-1"], "{v:?}");
    assert!(v.devices_copying.is_empty());
    let s = stats(&mut admin).await;
    let arenas: Vec<u32> = s.devices.iter().map(|d| d.arenas).collect();
    assert_eq!(arenas, [1, 1, 0], "one copy per device");
    assert_eq!(s.arena_bytes, 2 * v.arena_bytes);
    assert!(server.log().contains("replica copied"), "{}", server.log());
    // Prometheus: the bytes on each device, and the copy counted for its target.
    let (_, body) = http_get(&server.metrics_address(), "/metrics");
    for device in ["host", "host-1"] {
        let series = format!("modelshare_arena_bytes{{device=\"{device}\",model=\"m\"}} ");
        assert!(
            body.lines()
                .any(|l| l.starts_with(&series) && l.ends_with(&v.arena_bytes.to_string())),
            "{series}: {body}"
        );
    }
    assert!(
        body.contains(r#"modelshare_replica_copies_total{device="host-1",result="ok"} 1"#),
        "{body}"
    );

    for device in ["host", "host-1"] {
        let session = Session::open_with(
            &server.address,
            SessionOptions {
                worker_name: format!("on-{device}"),
                device_uuid: Some(device.into()),
                ..SessionOptions::default()
            },
        )
        .await
        .expect("session");
        let model = session.attach("m").await.expect("attach");
        for want in &tensors {
            let got = model.tensor(&want.name).expect("tensor");
            assert_eq!(got.bytes(), &want.data[..], "{} on {device}", want.name);
        }
        let leases: Vec<u32> = stats(&mut admin)
            .await
            .devices
            .iter()
            .map(|d| d.leases)
            .collect();
        assert_eq!(
            leases[if device == "host" { 0 } else { 1 }],
            1,
            "{leases:?}"
        );
        model.release().await.expect("release");
        session.close().await;
    }
    // Not on the third device.
    let third = Session::open_with(
        &server.address,
        SessionOptions {
            worker_name: "on-host-2".into(),
            device_uuid: Some("host-2".into()),
            ..SessionOptions::default()
        },
    )
    .await
    .expect("session");
    let e = third.attach("m").await.unwrap_err().to_string();
    assert!(e.contains("it is on host, host-1"), "{e}");

    // Named devices: loaded on the first named, copied to the second.
    let w = load_on(&mut admin, "n", "m", &["host-2", "0"], 0)
        .await
        .unwrap();
    assert_eq!(w.devices, ["host-2", "host"]);

    admin
        .unload_model(pb::UnloadModelRequest {
            name: "m".into(),
            ..Default::default()
        })
        .await
        .expect("unload");
    let s = stats(&mut admin).await;
    assert_eq!(s.arenas, 2, "m's two arenas freed, n's two left");
    assert_eq!(s.devices[1].arenas, 0);
}

/// Replicas count against `max_total_bytes` all at once: a load whose copies do not all fit
/// is refused before anything is allocated.
#[tokio::test]
async fn replicas_are_admitted_together() {
    let server = Server::start_with(
        &["--host-devices", "2", "--max-total-bytes", "400000"],
        two_models,
    )
    .await;
    let mut admin = server.admin().await;
    // 256 KiB each: one fits, two do not.
    let e = load_on(&mut admin, "a", "a", &[], 2).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");
    let s = stats(&mut admin).await;
    assert_eq!(s.arenas, 0);
    assert_eq!(s.arena_bytes, 0);
    load_on(&mut admin, "a", "a", &[], 1).await.unwrap();
}

/// A start-up model with `replicas = 2`, its first arena kept by a worker across a `kill -9` of
/// the server: the restarted server adopts that memory on its device (not read from the files)
/// and copies the replica again. Fails if the restart loads a second copy, loses the replica,
/// or counts an arena twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_start_up_model_gets_its_replicas_back() {
    let mut server = Server::start_with(&["--host-devices", "2"], |root| {
        write_safetensors(
            &root.join("m").join("model.safetensors"),
            &[t("w", Dtype::F32, &[128, 64], 3)],
        );
        let config = root.parent().unwrap().join("ms.toml");
        std::fs::write(
            &config,
            "[[models]]\nname = \"m\"\npath = \"m\"\nreplicas = 2\n",
        )
        .unwrap();
    })
    .await;
    // `--config` after the fact: the harness passes extra flags at spawn; restart with it.
    let config = server.dir.path().join("ms.toml");
    server.stop_with("TERM");
    server.set_extra(&["--host-devices", "2", "--config", config.to_str().unwrap()]);
    server.spawn();
    server.wait_ready().await;
    let mut admin = server.admin().await;
    let before = stats(&mut admin).await;
    assert_eq!(before.arenas, 2, "the first arena and its replica");

    let keeper = Worker::start(&server, "m", "keeper");
    let pid = keeper.pid();
    let record = server.dir.path().join("handles.sock.held").join("m@1.json");
    eventually(
        Duration::from_secs(10),
        "the record names the keeper",
        || {
            let text = std::fs::read_to_string(&record).unwrap_or_default();
            async move {
                text.contains(&format!("\"pid\":{pid}"))
                    || text.contains(&format!("\"pid\": {pid}"))
            }
        },
    )
    .await;

    // Placed the other way round now: the memory kept is on `host`, which placement puts
    // second; the adopted arena stays the version's first, and `host-1` gets the replica.
    std::fs::write(
        &config,
        "[[models]]\nname = \"m\"\npath = \"m\"\ndevices = [\"host-1\", \"host\"]\n",
    )
    .unwrap();
    assert!(!server.stop_with("KILL").success());
    server.spawn();
    server.wait_ready().await;
    let log = server.log();
    assert!(
        log.contains("model back from memory a worker kept"),
        "{log}"
    );
    assert!(log.matches("replica copied").count() >= 2, "{log}");
    let mut admin = server.admin().await;
    let after = stats(&mut admin).await;
    assert_eq!(after.arenas, 2, "{after:?}");
    let arenas: Vec<u32> = after.devices.iter().map(|d| d.arenas).collect();
    assert_eq!(arenas, [1, 1]);
    assert_eq!(after.held_by_workers_bytes, 0);
    let list = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .expect("list")
        .into_inner();
    assert_eq!(list.models[0].versions[0].devices, ["host", "host-1"]);
    drop(keeper);
}

/// `--replicate-on-attach`: a worker on a device without the version gets a copy there (the
/// SDK retries while it is made) and reads the same bytes; the next worker there attaches to
/// that copy; the copy is held to the device's cap; a GPU the server does not serve is still
/// told where the version is.
#[tokio::test]
async fn a_worker_on_a_device_without_the_version_gets_a_copy_there() {
    // One model is 256 KiB: room for one per device.
    let server = Server::start_with(
        &[
            "--host-devices",
            "3",
            "--replicate-on-attach",
            "--max-device-bytes",
            "300000",
        ],
        two_models,
    )
    .await;
    let mut admin = server.admin().await;
    load_on(&mut admin, "a", "a", &["host-1"], 0).await.unwrap();
    load_on(&mut admin, "b", "b", &["host-2"], 0).await.unwrap();

    let first = open_on(&server.address, "host").await.expect("session");
    let model = first.attach("a").await.expect("a copy made for it");
    assert!(
        model.verify().is_empty(),
        "the copy's bytes: {:?}",
        model.verify()
    );
    let listed = admin
        .list_models(pb::ListModelsRequest {})
        .await
        .unwrap()
        .into_inner();
    let a = listed.models.iter().find(|m| m.name == "a").expect("a");
    assert_eq!(a.versions[0].devices, ["host-1", "host"]);
    // The next worker there takes the same copy.
    let second = open_on(&server.address, "host").await.expect("session");
    let again = second.attach("a").await.expect("attach the copy");
    assert!(again.verify().is_empty());
    let s = stats(&mut admin).await;
    let on_host = &s.devices[0];
    assert_eq!((on_host.arenas, on_host.leases), (1, 2), "{s:?}");
    assert_eq!(s.arenas, 3, "a twice, b once");

    // host-2 holds b: a copy of a would pass its cap.
    let full = open_on(&server.address, "host-2").await.expect("session");
    let e = full.attach("a").await.unwrap_err().to_string();
    assert!(e.contains("max_device_bytes 300000"), "{e}");
    // Not one of the server's devices: where the version is, as without the option.
    let unserved = open_on(&server.address, "GPU-not-here")
        .await
        .expect("session");
    let e = unserved.attach("a").await.unwrap_err().to_string();
    assert!(e.contains("does not serve); it is on host-1, host"), "{e}");
    assert_eq!(stats(&mut admin).await.arenas, 3, "nothing left reserved");
    drop((model, again));
    tokio::time::sleep(Duration::from_millis(10)).await;
}
