//! Bad input through the real server: hand-crafted malformed weight files, paths that leave
//! the model root, bad model names, unknown models and a model over the size limit. Every
//! refusal must carry the right status code and a message naming the file and the reason,
//! must leave GetStats exactly where it was, and must leave the server able to load a good
//! model afterwards.
//!
//! Here: the writers and assertions the tests share; the tests by subject in the submodules.

use std::path::Path;

use modelshare_proto::v1 as pb;
use safetensors::Dtype;
use tonic::Code;

use crate::common::{Server, count, load, stats, t, write_safetensors};

mod files;
mod paths;
mod requests;
mod shards;
mod sizes;

/// A safetensors file from raw parts: 8-byte little-endian header length, header, data.
fn raw(header: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// Writes `bytes` at `rel` under the server's model root.
fn put(server: &Server, rel: &str, bytes: &[u8]) {
    let path = server.root.join(rel);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::write(path, bytes).expect("write");
}

/// A valid two-tensor model at `dir/model.safetensors`.
fn write_good(dir: &Path) {
    write_safetensors(
        &dir.join("model.safetensors"),
        &[t("w", Dtype::F32, &[4, 4], 1), t("b", Dtype::BF16, &[4], 2)],
    );
}

/// The figures a refused load must leave untouched.
fn assert_at_baseline(before: &pb::GetStatsResponse, after: &pb::GetStatsResponse, what: &str) {
    assert_eq!(
        after.arena_bytes, before.arena_bytes,
        "{what}: arena_bytes moved"
    );
    assert_eq!(after.arenas, before.arenas, "{what}: arenas moved");
    assert_eq!(
        after.models, before.models,
        "{what}: a model record was left behind"
    );
    assert_eq!(
        count(after, pb::VersionState::Loading),
        0,
        "{what}: a version is counted as loading"
    );
    assert_eq!(
        count(after, pb::VersionState::Ready),
        count(before, pb::VersionState::Ready),
        "{what}: a version is counted as ready"
    );
}

/// Loads a valid model, checks it is ready, and unloads it again.
async fn assert_still_serves(server: &Server) {
    let good = server.root.join("good");
    if !good.join("model.safetensors").exists() {
        write_good(&good);
    }
    let mut admin = server.admin().await;
    let v = load(&mut admin, "good", "good")
        .await
        .unwrap_or_else(|e| panic!("a good load after a refused one failed: {e:?}"));
    assert_eq!(v.state, pb::VersionState::Ready as i32);
    assert_eq!(v.tensor_count, 2);
    admin
        .unload_model(pb::UnloadModelRequest {
            name: "good".into(),
            version: 0,
            ..Default::default()
        })
        .await
        .expect("unload good");
}

/// Asks for a load of `path` as `name`; asserts the refusal (code and every one of `needles`
/// in the message), the stats at their baseline, and that the server still serves.
async fn assert_refused(server: &Server, name: &str, path: &str, code: Code, needles: &[&str]) {
    let mut admin = server.admin().await;
    let before = stats(&mut admin).await;
    let err = match load(&mut admin, name, path).await {
        Ok(v) => panic!("load of {path:?} as {name:?} succeeded: {v:?}"),
        Err(e) => e,
    };
    assert_eq!(err.code(), code, "load of {path:?}: {err:?}");
    for needle in needles {
        assert!(
            err.message().contains(needle),
            "load of {path:?}: message {:?} lacks {needle:?}",
            err.message()
        );
    }
    let after = stats(&mut admin).await;
    assert_at_baseline(&before, &after, path);
    assert_still_serves(server).await;
    let last = stats(&mut admin).await;
    assert_at_baseline(&before, &last, "after the good load and unload");
}
