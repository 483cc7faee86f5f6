//! Concurrent loads, new versions retiring old ones, keep_previous, the progress stream.

use modelshare_proto::v1 as pb;
use safetensors::Dtype;

use super::assert_worker_sees;
use crate::common::{self, Server, T, t};

/// Loads of different models must run at once, and both come out intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_loads_of_different_models() {
    let server = Server::start().await;
    for (i, name) in ["alpha", "beta", "gamma"].iter().enumerate() {
        let tensors: Vec<T> = (0..8)
            .map(|k| {
                t(
                    &format!("w{k}"),
                    Dtype::F32,
                    &[256, 1024],
                    (i * 100 + k) as u64,
                )
            })
            .collect();
        common::write_safetensors(&server.root.join(name).join("model.safetensors"), &tensors);
    }
    let mut handles = Vec::new();
    for name in ["alpha", "beta", "gamma"] {
        let mut admin = server.admin().await;
        handles.push(tokio::spawn(async move {
            common::load(&mut admin, name, name).await
        }));
    }
    for h in handles {
        let v = h.await.expect("join").expect("load");
        assert_eq!(v.state, pb::VersionState::Ready as i32);
    }
    let mut admin = server.admin().await;
    let stats = common::stats(&mut admin).await;
    assert_eq!(stats.arenas, 3);
    assert_eq!(stats.models, 3);
    for name in ["alpha", "beta", "gamma"] {
        assert_worker_sees(
            &server,
            name,
            &[server.root.join(name).join("model.safetensors")],
        )
        .await;
    }
}

/// Loading a name again makes a new latest version; a worker on v1 keeps working while v2
/// loads, and v1 is freed when its last lease goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_version_retires_the_old_one_after_its_last_lease() {
    let server = Server::start().await;
    common::write_safetensors(
        &server.root.join("v1/model.safetensors"),
        &[t("w", Dtype::F32, &[8], 1)],
    );
    let big: Vec<T> = (0..8)
        .map(|k| {
            t(
                &format!("w{}", if k == 0 { String::new() } else { k.to_string() }),
                Dtype::F32,
                &[if k == 0 { 8 } else { 1 << 20 }],
                2 + k,
            )
        })
        .collect();
    common::write_safetensors(&server.root.join("v2/model.safetensors"), &big);
    let mut admin = server.admin().await;
    assert_eq!(
        common::load(&mut admin, "m", "v1")
            .await
            .expect("v1")
            .version,
        1
    );
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    let mut events = session.subscribe();
    let v1 = session.attach("m").await.expect("attach v1");
    let w1 = v1.tensor("w").expect("w");

    // v2 loads while the worker reads v1.
    let mut loader = admin.clone();
    let load = tokio::spawn(async move { common::load(&mut loader, "m", "v2").await });
    for _ in 0..50 {
        assert_eq!(w1.bytes(), common::random_bytes(1, 32));
    }
    assert_eq!(load.await.expect("join").expect("v2").version, 2);
    assert_eq!(
        events.recv().await.expect("event"),
        modelshare_worker::SessionEvent::VersionReady {
            model: "m".into(),
            version: 2
        }
    );
    assert_eq!(
        events.recv().await.expect("event"),
        modelshare_worker::SessionEvent::VersionDraining {
            model: "m".into(),
            version: 1
        }
    );
    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "m".into(),
            version: 0,
        })
        .await
        .expect("describe")
        .into_inner();
    let states: Vec<(u32, i32)> = d
        .model
        .expect("model")
        .versions
        .iter()
        .map(|v| (v.version, v.state))
        .collect();
    assert_eq!(
        states,
        [
            (1, pb::VersionState::Draining as i32),
            (2, pb::VersionState::Ready as i32)
        ]
    );
    // The worker on v1 still reads v1; a new attach gets v2.
    assert_eq!(w1.bytes(), common::random_bytes(1, 32));
    let latest = session.attach("m").await.expect("latest");
    assert_eq!(latest.version(), 2);
    assert_eq!(
        latest.tensor("w").expect("w").bytes(),
        common::random_bytes(2, 32)
    );
    // The last lease on v1 goes: v1 is freed.
    drop(w1);
    v1.release().await.expect("release");
    let s = common::stats(&mut admin).await;
    assert_eq!(s.arenas, 1, "only v2 is held");
    assert_eq!(s.arena_bytes, latest.manifest().arena_bytes);
}

/// With keep_previous, an older version stays ready and attachable.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_previous_keeps_the_old_version() {
    let server = Server::start().await;
    common::write_safetensors(
        &server.root.join("v1/model.safetensors"),
        &[t("w", Dtype::F32, &[8], 1)],
    );
    common::write_safetensors(
        &server.root.join("v2/model.safetensors"),
        &[t("w", Dtype::F32, &[8], 2)],
    );
    let mut admin = server.admin().await;
    common::load(&mut admin, "m", "v1").await.expect("v1");
    let mut stream = admin
        .load_model(pb::LoadModelRequest {
            name: "m".into(),
            path: "v2".into(),
            keep_previous: true,
            ..Default::default()
        })
        .await
        .expect("load")
        .into_inner();
    while stream.message().await.expect("stream").is_some() {}
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    assert_eq!(session.attach("m").await.expect("latest").version(), 2);
    let old = session.attach_version("m", 1).await.expect("v1");
    let tensor = old.tensor("w").expect("w");
    let w: &[f32] = tensor.as_slice::<f32>().expect("f32");
    assert_eq!(bytemuck_bytes(w), common::random_bytes(1, 32));
    assert!(
        old.tensor("w").expect("w").as_slice::<half::f16>().is_err(),
        "wrong dtype accepted"
    );
}

fn bytemuck_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The progress stream must report bytes monotonically and end with the ready version.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_progress_is_streamed() {
    let server = Server::start().await;
    let tensors: Vec<T> = (0..16)
        .map(|k| t(&format!("w{k}"), Dtype::F32, &[1024, 1024], k))
        .collect();
    common::write_safetensors(&server.root.join("big/model.safetensors"), &tensors);
    let mut admin = server.admin().await;
    let mut stream = admin
        .load_model(pb::LoadModelRequest {
            name: "big".into(),
            path: "big".into(),
            ..Default::default()
        })
        .await
        .expect("load")
        .into_inner();
    let mut total = 0;
    let mut last = 0;
    let mut done = None;
    while let Some(msg) = stream.message().await.expect("stream") {
        match msg.event.expect("event") {
            pb::load_model_progress::Event::Started(s) => total = s.bytes_total,
            pb::load_model_progress::Event::Progress(p) => {
                assert!(p.bytes_done >= last, "progress went backwards");
                assert_eq!(p.bytes_total, total);
                last = p.bytes_done;
            }
            pb::load_model_progress::Event::Done(v) => done = Some(v),
        }
    }
    assert_eq!(total, 16 << 22);
    let v = done.expect("done");
    assert_eq!(v.bytes_loaded, total);
}
