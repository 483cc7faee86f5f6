//! Loads of the same bytes under different names share one arena: found by layout, compared
//! byte for byte with the files (hashed with SHA-256 on the way), refused where one byte
//! differs; the memory outlives either name alone; the load needs no room of its own.

use std::path::Path;
use std::time::Duration;

use modelshare_proto::v1 as pb;
use safetensors::{Dtype, SafeTensors};
use sha2::{Digest, Sha256};

use super::assert_worker_sees;
use crate::common::{self, Server, T, memfd_fds, t};

/// Three tensors of a few hundred KiB, some larger than nothing (several chunks are not
/// needed: the comparison's chunking is the loader's own).
fn tensors() -> Vec<T> {
    vec![
        t("embed.weight", Dtype::F32, &[300, 256], 11),
        t("layers.0.w", Dtype::F16, &[256, 256], 12),
        t("layers.0.b", Dtype::BF16, &[256], 13),
    ]
}

/// The digest the server reports: each tensor's SHA-256, in the manifest's (arena) order,
/// hashed together.
fn content_sha256(file: &Path, order: &[String]) -> String {
    let bytes = std::fs::read(file).expect("read");
    let st = SafeTensors::deserialize(&bytes).expect("parse");
    let mut whole = Sha256::new();
    for name in order {
        let view = st.tensor(name).expect("tensor");
        whole.update(Sha256::digest(view.data()));
    }
    let hex: String = whole
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

async fn describe(server: &Server, name: &str) -> pb::DescribeModelResponse {
    server
        .admin()
        .await
        .describe_model(pb::DescribeModelRequest {
            name: name.into(),
            ..Default::default()
        })
        .await
        .expect("describe")
        .into_inner()
}

/// `alpha` and `beta` from two files of the same bytes: `beta` takes `alpha`'s arena (no new
/// memfd in the server), both report sharing and the same SHA-256 (that of the files), a
/// worker reads `beta`'s bytes right, and still does after `alpha` is unloaded; the memory
/// goes with the last name. `gamma`, of the same layout with one byte changed, gets a copy of
/// its own, found by the comparison of every byte; `delta`, whose first byte differs, is told
/// apart by the sample at admission. Fails on a server that copies every load (a memfd per
/// load) or shares on layout or checksums alone (gamma would read alpha's bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_files_under_two_names_share_one_arena() {
    let server = Server::start_with(&[], |root| {
        common::write_safetensors(&root.join("orig/model.safetensors"), &tensors());
        common::write_safetensors(&root.join("copy/model.safetensors"), &tensors());
        // One byte in the middle of the largest tensor: past the sample a load takes at
        // admission (each end of each tensor), found by the comparison of every byte.
        let mut other = tensors();
        let middle = other[0].data.len() / 2;
        other[0].data[middle] ^= 1;
        common::write_safetensors(&root.join("other/model.safetensors"), &other);
        // Its first byte: the sample sees it, and the load is placed and copied at once.
        let mut first = tensors();
        first[0].data[0] ^= 1;
        common::write_safetensors(&root.join("first/model.safetensors"), &first);
    })
    .await;
    let pid = server.pid();
    let mut admin = server.admin().await;
    let alpha = common::load(&mut admin, "alpha", "orig")
        .await
        .expect("alpha");
    assert!(!alpha.shares_memory, "the first load shares nothing");
    let arenas = memfd_fds(pid);

    let beta = common::load(&mut admin, "beta", "copy")
        .await
        .expect("beta");
    assert_eq!(beta.state, pb::VersionState::Ready as i32);
    assert!(
        beta.shares_memory,
        "beta must take alpha's memory: {beta:?}"
    );
    assert_eq!(
        memfd_fds(pid),
        arenas,
        "a second arena was made for the same bytes"
    );
    let order: Vec<String> = describe(&server, "beta")
        .await
        .manifest
        .expect("manifest")
        .tensors
        .iter()
        .map(|t| t.name.clone())
        .collect();
    // A record of its own, so that a restarted server adopts it from its workers' memory
    // whatever becomes of alpha.
    let record = server
        .dir
        .path()
        .join("handles.sock.held")
        .join("beta@1.json");
    common::eventually(Duration::from_secs(5), "beta's held-memory record", || {
        let exists = record.exists();
        async move { exists }
    })
    .await;
    let digest = content_sha256(&server.root.join("copy/model.safetensors"), &order);
    assert_eq!(beta.content_sha256, digest);
    let alpha_now = describe(&server, "alpha").await.model.expect("model");
    assert!(alpha_now.versions[0].shares_memory);
    assert_eq!(alpha_now.versions[0].content_sha256, digest);
    let stats = common::stats(&mut admin).await;
    let host = stats
        .devices
        .iter()
        .find(|d| d.device.as_ref().is_some_and(|i| i.uuid == "host"))
        .expect("host device");
    assert_eq!(
        (host.arenas, host.arena_bytes),
        (1, alpha.arena_bytes),
        "a shared arena counts once on its device: {host:?}"
    );
    assert_worker_sees(
        &server,
        "beta",
        &[server.root.join("copy/model.safetensors")],
    )
    .await;

    // One byte differs: a copy of its own, with its own bytes.
    let gamma = common::load(&mut admin, "gamma", "other")
        .await
        .expect("gamma");
    assert!(!gamma.shares_memory, "gamma differs by a byte: {gamma:?}");
    assert_eq!(memfd_fds(pid), arenas + 1);
    assert_worker_sees(
        &server,
        "gamma",
        &[server.root.join("other/model.safetensors")],
    )
    .await;
    let delta = common::load(&mut admin, "delta", "first")
        .await
        .expect("delta");
    assert!(!delta.shares_memory, "{delta:?}");
    assert_eq!(memfd_fds(pid), arenas + 2);
    assert_worker_sees(
        &server,
        "delta",
        &[server.root.join("first/model.safetensors")],
    )
    .await;
    common::unload(&mut admin, "delta", false).await;
    common::eventually(Duration::from_secs(5), "delta's memory freed", || async {
        memfd_fds(pid) == arenas + 1
    })
    .await;

    // The memory outlives the name first loaded into it, and goes with the last.
    common::unload(&mut admin, "alpha", false).await;
    assert_eq!(memfd_fds(pid), arenas + 1, "beta's memory went with alpha");
    assert!(!describe(&server, "beta").await.model.expect("m").versions[0].shares_memory);
    assert_worker_sees(
        &server,
        "beta",
        &[server.root.join("copy/model.safetensors")],
    )
    .await;
    common::unload(&mut admin, "beta", false).await;
    common::eventually(Duration::from_secs(5), "beta's memory freed", || async {
        memfd_fds(pid) == arenas
    })
    .await;
}

/// With `--share-identical off` every load has its own copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_identical_off_copies_every_load() {
    let server = Server::start_with(&["--share-identical", "off"], |root| {
        common::write_safetensors(&root.join("orig/model.safetensors"), &tensors());
        common::write_safetensors(&root.join("copy/model.safetensors"), &tensors());
    })
    .await;
    let mut admin = server.admin().await;
    common::load(&mut admin, "alpha", "orig")
        .await
        .expect("alpha");
    let arenas = memfd_fds(server.pid());
    let beta = common::load(&mut admin, "beta", "copy")
        .await
        .expect("beta");
    assert!(!beta.shares_memory);
    assert_eq!(memfd_fds(server.pid()), arenas + 1);
}
