//! Models of every dtype, sharded or named by file, arrive byte-exact in a worker's shared,
//! read-only mapping.

use std::time::Duration;

use modelshare_proto::v1 as pb;
use safetensors::Dtype;

use super::{all_dtypes, assert_worker_sees};
use crate::common::{self, Server, t};

/// A single-file model of every common dtype must arrive byte-exact in the worker's mapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_file_every_dtype_round_trips() {
    let server = Server::start().await;
    let dir = server.root.join("tiny");
    common::write_safetensors(&dir.join("model.safetensors"), &all_dtypes());
    std::fs::write(dir.join("config.json"), br#"{"hidden_size": 64}"#).expect("config");
    std::fs::write(dir.join("tokenizer.json"), br#"{"vocab": {}}"#).expect("tokenizer");
    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "tiny", "tiny")
        .await
        .expect("load");
    assert_eq!(v.version, 1);
    assert_eq!(v.state, pb::VersionState::Ready as i32);
    assert_eq!(v.tensor_count, 10);

    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "tiny".into(),
            version: 0,
        })
        .await
        .expect("describe")
        .into_inner();
    let m = d.manifest.expect("manifest");
    let wk = m
        .tensors
        .iter()
        .find(|t| t.name == "layers.0.wk")
        .expect("wk");
    assert_eq!(wk.dtype, pb::DType::DtypeBf16 as i32);
    assert_eq!(wk.shape, vec![31, 64]);
    assert_eq!(wk.byte_length, 31 * 64 * 2);
    assert_eq!(
        m.header_metadata.get("format").map(String::as_str),
        Some("pt")
    );
    let files: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(files, ["config.json", "tokenizer.json"]);

    assert_worker_sees(&server, "tiny", &[dir.join("model.safetensors")]).await;
    let session = modelshare_worker::Session::open(&server.address, "meta")
        .await
        .expect("session");
    let model = session.attach("tiny").await.expect("attach");
    assert_eq!(
        model.metadata("config.json").as_deref(),
        Some(&br#"{"hidden_size": 64}"#[..])
    );
}

/// A sharded model (index + 3 shards) must load as one arena holding every shard's tensors.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_model_round_trips() {
    let server = Server::start().await;
    let dir = server.root.join("sharded");
    let all = all_dtypes();
    let shards = vec![all[..3].to_vec(), all[3..7].to_vec(), all[7..].to_vec()];
    common::write_sharded(&dir, &shards);
    let mut admin = server.admin().await;
    let v = common::load(&mut admin, "sharded", "sharded")
        .await
        .expect("load");
    assert_eq!(v.tensor_count, 10);
    let stats = common::stats(&mut admin).await;
    assert_eq!(
        stats.arenas, 1,
        "one arena per version, however many shards"
    );
    assert_eq!(stats.arena_bytes, v.arena_bytes);
    let files: Vec<_> = (1..=3)
        .map(|i| dir.join(format!("model-{i:05}-of-00003.safetensors")))
        .collect();
    assert_worker_sees(&server, "sharded", &files).await;
}

/// A single `.safetensors` file may be named directly instead of its directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_path_loads_too() {
    let server = Server::start().await;
    let file = server.root.join("loose/weights.safetensors");
    common::write_safetensors(&file, &all_dtypes()[..3]);
    let mut admin = server.admin().await;
    common::load(&mut admin, "loose", "loose/weights.safetensors")
        .await
        .expect("load");
    assert_worker_sees(&server, "loose", &[file]).await;
}

/// The worker's view must be a shared, read-only mapping of the server's memfd, not a copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_mapping_is_shared_and_read_only() {
    let server = Server::start().await;
    common::write_safetensors(
        &server.root.join("shared/model.safetensors"),
        &[t("w", Dtype::F32, &[512, 1024], 3)],
    );
    let mut admin = server.admin().await;
    common::load(&mut admin, "shared", "shared")
        .await
        .expect("load");
    let session = modelshare_worker::Session::open(&server.address, "w")
        .await
        .expect("session");
    let model = session.attach("shared").await.expect("attach");
    let maps = std::fs::read_to_string("/proc/self/maps").expect("maps");
    let line = maps
        .lines()
        .find(|l| l.contains("memfd:modelshare:shared@1"))
        .unwrap_or_else(|| panic!("no memfd mapping of the model in /proc/self/maps:\n{maps}"));
    let perms = line.split_whitespace().nth(1).expect("perms");
    assert_eq!(
        perms, "r--s",
        "mapping must be read-only and shared: {line}"
    );
    drop(model);
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// The two-step attach (`Session::attach_early`, what the Python package uses to make its torch
/// views while mapping): the grant gives the manifest before the mapping (host memory: no
/// address reserved in advance), `finish` a model whose bytes are the one-step attach's; an
/// `Attaching` dropped unfinished still has its lease released; an unknown model fails at the
/// grant and holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_in_two_steps() {
    let server = Server::start().await;
    common::write_safetensors(
        &server.root.join("two/model.safetensors"),
        &[
            t("a", Dtype::F32, &[64, 32], 5),
            t("b", Dtype::BF16, &[7, 9], 6),
        ],
    );
    let mut admin = server.admin().await;
    common::load(&mut admin, "two", "two").await.expect("load");
    let session = modelshare_worker::Session::open(&server.address, "two-steps")
        .await
        .expect("session");

    let attaching = session.attach_early("two", 0).await.expect("grant");
    assert!(
        attaching.reservation().is_none(),
        "host memory reserves nothing"
    );
    assert!(!attaching.attached_while_loading());
    let names: Vec<&str> = attaching
        .manifest()
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let early = attaching.finish().await.expect("mapped");
    let plain = session.attach("two").await.expect("attach");
    for name in ["a", "b"] {
        let (x, y) = (
            early.tensor(name).expect("early"),
            plain.tensor(name).expect("plain"),
        );
        assert_eq!(x.bytes(), y.bytes(), "{name}");
    }
    assert!(early.verify().is_empty());

    assert_eq!(leases_of(&admin, "two-steps").await, 2);
    drop(session.attach_early("two", 0).await.expect("grant"));
    let error = session
        .attach_early("none", 0)
        .await
        .expect_err("no such model");
    assert_eq!(error.code(), Some(tonic::Code::NotFound), "{error}");
    common::eventually(
        Duration::from_secs(5),
        "the unfinished attach's lease released",
        || {
            let admin = admin.clone();
            async move { leases_of(&admin, "two-steps").await == 2 }
        },
    )
    .await;
    drop((early, plain));
    common::eventually(Duration::from_secs(5), "every lease released", || {
        let admin = admin.clone();
        async move { leases_of(&admin, "two-steps").await == 0 }
    })
    .await;
}

/// Leases held by the sessions of worker `name`, as `ListSessions` shows them.
async fn leases_of(
    admin: &modelshare_proto::v1::admin_service_client::AdminServiceClient<
        tonic::transport::Channel,
    >,
    name: &str,
) -> usize {
    let ps = admin
        .clone()
        .list_sessions(pb::ListSessionsRequest {})
        .await
        .expect("ps")
        .into_inner();
    ps.sessions
        .iter()
        .filter(|s| s.worker_name == name)
        .map(|s| s.leases.len())
        .sum()
}
