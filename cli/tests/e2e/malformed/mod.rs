//! Bad input through the real server: hand-crafted malformed weight files, paths that leave
//! the model root, bad model names, unknown models and a model over the size limit. Every
//! refusal must carry the right status code and a message naming the file and the reason,
//! must leave GetStats exactly where it was, and must leave the server able to load a good
//! model afterwards.

use std::path::Path;

use modelshare_proto::v1 as pb;
use safetensors::Dtype;
use tonic::Code;

use crate::common::{Server, count, load, stats, t, write_safetensors, write_sharded};

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

/// A header length pointing past the end of the file would be trusted and read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_length_past_the_file_is_refused() {
    let server = Server::start().await;
    let mut bytes = 1000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    put(&server, "past.safetensors", &bytes);
    assert_refused(
        &server,
        "past",
        "past.safetensors",
        Code::InvalidArgument,
        &["past.safetensors: byte 8: header length 1000 runs past the end of the 10-byte file"],
    )
    .await;
}

/// A header that is not JSON would be accepted or crash the parser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_not_json_is_refused() {
    let server = Server::start().await;
    put(&server, "nj.safetensors", &raw(r#"{"w": nope}"#, &[]));
    assert_refused(
        &server,
        "nj",
        "nj.safetensors",
        Code::InvalidArgument,
        &["nj.safetensors: byte ", "not valid JSON"],
    )
    .await;
}

/// A header that is JSON but not an object would be accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_not_an_object_is_refused() {
    let server = Server::start().await;
    put(&server, "arr.safetensors", &raw("[1, 2]", &[]));
    assert_refused(
        &server,
        "arr",
        "arr.safetensors",
        Code::InvalidArgument,
        &["arr.safetensors: byte 8: header does not begin with '{'"],
    )
    .await;
}

/// Two tensors sharing bytes would be loaded as if they were independent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_ranges_are_refused() {
    let server = Server::start().await;
    let h = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    put(&server, "ov.safetensors", &raw(h, &[7; 12]));
    let want = format!(
        "ov.safetensors: byte {}: tensors 'a' [0, 8] and 'b' [4, 12] overlap",
        8 + h.len() + 4
    );
    assert_refused(
        &server,
        "ov",
        "ov.safetensors",
        Code::InvalidArgument,
        &[&want],
    )
    .await;
}

/// Bytes no tensor names (a hole between tensors, trailing bytes after the last) would be
/// accepted, in a single file or in one shard of several: the format forbids both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holes_and_trailing_bytes_are_refused_with_offsets() {
    let server = Server::start().await;
    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}}"#;
    put(&server, "hole.safetensors", &raw(h, &[7; 12]));
    let start = 8 + h.len();
    let want = format!(
        "hole.safetensors: byte {}: bytes [{}, {}) of the file (data_offsets [4, 8]) belong to no \
         tensor: a hole before tensor 'b'",
        start + 4,
        start + 4,
        start + 8
    );
    assert_refused(
        &server,
        "hole",
        "hole.safetensors",
        Code::InvalidArgument,
        &[&want],
    )
    .await;

    let h = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
    put(&server, "tail.safetensors", &raw(h, &[7; 9]));
    let start = 8 + h.len();
    let want = format!(
        "tail.safetensors: byte {}: bytes [{}, {}) of the file, after the last tensor, belong to \
         no tensor (5 trailing bytes)",
        start + 4,
        start + 4,
        start + 9
    );
    assert_refused(
        &server,
        "tail",
        "tail.safetensors",
        Code::InvalidArgument,
        &[&want],
    )
    .await;

    // The second shard of a sharded model carries trailing bytes.
    let dir = server.root.join("shtail");
    write_sharded(
        &dir,
        &[
            vec![t("a", Dtype::F32, &[8], 1)],
            vec![t("b", Dtype::F32, &[8], 2)],
        ],
    );
    let shard = dir.join("model-00002-of-00002.safetensors");
    let mut bytes = std::fs::read(&shard).expect("shard");
    bytes.extend_from_slice(&[0; 3]);
    std::fs::write(&shard, bytes).expect("shard");
    assert_refused(
        &server,
        "shtail",
        "shtail",
        Code::InvalidArgument,
        &[
            "shtail/model-00002-of-00002.safetensors: byte ",
            "after the last tensor, belong to no tensor (3 trailing bytes)",
        ],
    )
    .await;
}

/// A range past the end of the data section would read beyond the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn range_past_the_data_is_refused() {
    let server = Server::start().await;
    let h = r#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    put(&server, "short.safetensors", &raw(h, &[1; 8]));
    let want = format!(
        "short.safetensors: byte {}: tensor 'w' data_offsets [0, 16] run past the end of the file \
         (its data section holds 8 bytes)",
        8 + h.len()
    );
    assert_refused(
        &server,
        "short",
        "short.safetensors",
        Code::InvalidArgument,
        &[&want],
    )
    .await;
}

/// A range whose length disagrees with shape × dtype would give workers a wrong tensor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shape_and_length_mismatch_is_refused() {
    let server = Server::start().await;
    let h = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    put(&server, "shape.safetensors", &raw(h, &[1; 8]));
    assert_refused(
        &server,
        "shape",
        "shape.safetensors",
        Code::InvalidArgument,
        &[
            "shape.safetensors: byte ",
            "tensor 'w' data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12",
        ],
    )
    .await;
}

/// An unknown dtype would be loaded with a guessed element size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_dtype_is_refused() {
    let server = Server::start().await;
    let h = r#"{"w":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}}"#;
    put(&server, "dt.safetensors", &raw(h, &[1; 8]));
    assert_refused(
        &server,
        "dt",
        "dt.safetensors",
        Code::InvalidArgument,
        &[
            "dt.safetensors: byte ",
            "tensor 'w' has unknown dtype 'F33'",
        ],
    )
    .await;
}

/// A duplicate tensor name would silently keep one of the two entries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_tensor_names_are_refused() {
    let server = Server::start().await;
    let h = r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#;
    put(&server, "dup.safetensors", &raw(h, &[1; 8]));
    assert_refused(
        &server,
        "dup",
        "dup.safetensors",
        Code::InvalidArgument,
        &["dup.safetensors: byte ", "tensor 'w' appears twice"],
    )
    .await;
}

/// Reversed data_offsets would underflow a length computation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reversed_offsets_are_refused() {
    let server = Server::start().await;
    let h = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}}"#;
    put(&server, "rev.safetensors", &raw(h, &[1; 8]));
    assert_refused(
        &server,
        "rev",
        "rev.safetensors",
        Code::InvalidArgument,
        &[
            "rev.safetensors: byte ",
            "data_offsets [8, 0] begin after they end",
        ],
    )
    .await;
}

/// An empty file would be read past its end for the length prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_file_is_refused() {
    let server = Server::start().await;
    put(&server, "empty.safetensors", &[]);
    assert_refused(
        &server,
        "empty",
        "empty.safetensors",
        Code::InvalidArgument,
        &["empty.safetensors: byte 0: file is 0 bytes, too short for the 8-byte header length"],
    )
    .await;
}

/// An index naming a shard that is not there would load a partial model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_shard_is_refused() {
    let server = Server::start().await;
    let dir = server.root.join("sh");
    write_sharded(
        &dir,
        &[
            vec![t("a", Dtype::F32, &[8], 1)],
            vec![t("b", Dtype::F32, &[8], 2)],
        ],
    );
    std::fs::remove_file(dir.join("model-00002-of-00002.safetensors")).expect("rm shard");
    assert_refused(
        &server,
        "sh",
        "sh",
        Code::InvalidArgument,
        &[
            "sh/model.safetensors.index.json",
            "the index names shard 'model-00002-of-00002.safetensors', which does not exist",
        ],
    )
    .await;
}

/// An index naming a tensor its shard lacks would give workers a manifest with a hole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_tensor_absent_from_shard_is_refused() {
    let server = Server::start().await;
    let dir = server.root.join("ghost");
    write_sharded(
        &dir,
        &[
            vec![t("a", Dtype::F32, &[8], 1)],
            vec![t("b", Dtype::F32, &[8], 2)],
        ],
    );
    let index = serde_json::json!({"weight_map": {
        "a": "model-00001-of-00002.safetensors",
        "b": "model-00002-of-00002.safetensors",
        "phantom": "model-00001-of-00002.safetensors",
    }});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    assert_refused(
        &server,
        "ghost",
        "ghost",
        Code::InvalidArgument,
        &[
            "ghost/model.safetensors.index.json",
            "index names tensor 'phantom' in shard 'model-00001-of-00002.safetensors', \
             which does not contain it",
        ],
    )
    .await;
}

/// A tensor held by two shards would be loaded twice, one copy silently winning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tensor_in_two_shards_is_refused() {
    let server = Server::start().await;
    let dir = server.root.join("twice");
    write_sharded(
        &dir,
        &[
            vec![t("a", Dtype::F32, &[8], 1)],
            vec![t("b", Dtype::F32, &[8], 2)],
        ],
    );
    // Shard 2 now holds "a" as well as "b".
    write_safetensors(
        &dir.join("model-00002-of-00002.safetensors"),
        &[t("a", Dtype::F32, &[8], 3), t("b", Dtype::F32, &[8], 2)],
    );
    assert_refused(
        &server,
        "twice",
        "twice",
        Code::InvalidArgument,
        &[
            "twice/model-00002-of-00002.safetensors",
            "tensor 'a' is also in shard 'model-00001-of-00002.safetensors'",
        ],
    )
    .await;
}

/// A `..` in the path would let a client read files outside the model root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dotdot_path_is_refused() {
    let server = Server::start().await;
    // A valid model really is there, so only the check can refuse it.
    write_good(&server.dir.path().join("outside"));
    assert_refused(
        &server,
        "up",
        "../outside/model.safetensors",
        Code::InvalidArgument,
        &["bad model path '../outside/model.safetensors': path has a '..' component"],
    )
    .await;
    assert_refused(
        &server,
        "up",
        "good/../../outside",
        Code::InvalidArgument,
        &["path has a '..' component"],
    )
    .await;
}

/// A symlink inside the root would let a client load a model from anywhere on the host.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlink_escaping_the_root_is_refused() {
    let server = Server::start().await;
    let outside = server.dir.path().join("outside");
    write_good(&outside);
    std::os::unix::fs::symlink(&outside, server.root.join("escape")).expect("symlink");
    assert_refused(
        &server,
        "esc",
        "escape",
        Code::InvalidArgument,
        &["bad model path 'escape': leaves the model root (through a symlink)"],
    )
    .await;
    assert_refused(
        &server,
        "esc",
        "escape/model.safetensors",
        Code::InvalidArgument,
        &["'escape/model.safetensors'", "leaves the model root"],
    )
    .await;
}

/// An absolute path would bypass the model root altogether.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_path_is_refused() {
    let server = Server::start().await;
    // Even an absolute path that points inside the root is refused.
    write_good(&server.root.join("good"));
    let abs = server.root.join("good/model.safetensors");
    let abs = abs.to_str().expect("utf-8 path");
    assert_refused(
        &server,
        "abs",
        abs,
        Code::InvalidArgument,
        &[
            abs,
            "path is absolute; it must be relative to the model root",
        ],
    )
    .await;
}

/// A header over the size limit would make the server allocate whatever a file declares.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_over_the_limit_is_refused() {
    let server = Server::start().await;
    // A sparse file long enough to hold the declared header, so that the limit (the default
    // 100_000_000), not the file's end, is what refuses it. Nothing of it is ever read.
    let path = server.root.join("huge.safetensors");
    let f = std::fs::File::create(&path).expect("create");
    std::io::Write::write_all(&mut &f, &200_000_000u64.to_le_bytes()).expect("prefix");
    f.set_len(8 + 200_000_000 + 16).expect("set_len");
    drop(f);
    assert_refused(
        &server,
        "huge",
        "huge.safetensors",
        Code::InvalidArgument,
        &["huge.safetensors: header length is 200000000, over the limit of 100000000"],
    )
    .await;
}

/// The same declared size in an 8-byte file: the file's end is checked first and named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declared_header_size_in_a_tiny_file_is_refused() {
    let server = Server::start().await;
    put(&server, "tiny.safetensors", &200_000_000u64.to_le_bytes());
    assert_refused(
        &server,
        "tiny",
        "tiny.safetensors",
        Code::InvalidArgument,
        &["tiny.safetensors: byte 8: header length 200000000 runs past the end of the 8-byte file"],
    )
    .await;
}

/// A symlinked shard or metadata file leading outside the root would be read from anywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn symlinked_shard_or_metadata_file_escaping_the_root_is_refused() {
    let server = Server::start().await;
    let outside = server.dir.path().join("outside");
    write_good(&outside);
    std::fs::write(outside.join("secret.json"), "{}").expect("secret");

    let dir = server.root.join("shlink");
    write_sharded(&dir, &[vec![t("w", Dtype::F32, &[4, 4], 1)]]);
    let shard = dir.join("model-00001-of-00001.safetensors");
    std::fs::remove_file(&shard).expect("rm shard");
    std::os::unix::fs::symlink(outside.join("model.safetensors"), &shard).expect("symlink");
    assert_refused(
        &server,
        "shlink",
        "shlink",
        Code::InvalidArgument,
        &["'shlink/model-00001-of-00001.safetensors': leaves the model root"],
    )
    .await;

    write_good(&server.root.join("meta"));
    std::os::unix::fs::symlink(
        outside.join("secret.json"),
        server.root.join("meta/config.json"),
    )
    .expect("symlink");
    assert_refused(
        &server,
        "meta",
        "meta",
        Code::InvalidArgument,
        &["'meta/config.json': leaves the model root"],
    )
    .await;
}

/// An index whose shard name climbs out of the model directory would be followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_shard_with_dotdot_is_refused() {
    let server = Server::start().await;
    write_good(&server.root.join("good"));
    put(
        &server,
        "up/model.safetensors.index.json",
        br#"{"weight_map":{"w":"../good/model.safetensors"}}"#,
    );
    assert_refused(
        &server,
        "up",
        "up",
        Code::InvalidArgument,
        &[
            "up/model.safetensors.index.json: byte ",
            "shard '../good/model.safetensors', whose name is not acceptable: path has a '..' component",
        ],
    )
    .await;
}

/// An index that is not JSON would be accepted or crash the parser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_not_json_is_refused() {
    let server = Server::start().await;
    put(&server, "bi/model.safetensors.index.json", b"{nope");
    assert_refused(
        &server,
        "bi",
        "bi",
        Code::InvalidArgument,
        &["bi/model.safetensors.index.json: byte 1: not valid JSON"],
    )
    .await;
}

/// A header that is not UTF-8 would reach JSON parsing and the logs as garbage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_not_utf8_is_refused() {
    let server = Server::start().await;
    let mut bytes = raw(r#"{"w":1}"#, &[]);
    bytes[9] = 0xff;
    put(&server, "u8.safetensors", &bytes);
    assert_refused(
        &server,
        "u8",
        "u8.safetensors",
        Code::InvalidArgument,
        &["u8.safetensors: byte 9: header is not valid UTF-8"],
    )
    .await;
}

/// A FIFO named like a weight file would block the loader forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_is_refused() {
    let server = Server::start().await;
    let ok = std::process::Command::new("mkfifo")
        .arg(server.root.join("pipe.safetensors"))
        .status()
        .expect("mkfifo");
    assert!(ok.success());
    assert_refused(
        &server,
        "pipe",
        "pipe.safetensors",
        Code::InvalidArgument,
        &["'pipe.safetensors': is neither a regular file nor a directory"],
    )
    .await;
}

/// Empty paths and the root itself would be resolved to the root directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_or_root_path_is_refused() {
    let server = Server::start().await;
    // The root holding a model.safetensors must not make "." a valid model path.
    write_good(&server.root);
    assert_refused(&server, "r", "", Code::InvalidArgument, &["path is empty"]).await;
    for p in [".", "./"] {
        assert_refused(
            &server,
            "r",
            p,
            Code::InvalidArgument,
            &["path names the model root itself"],
        )
        .await;
    }
    assert_refused(
        &server,
        "r",
        "a\0b",
        Code::InvalidArgument,
        &["path contains a NUL byte"],
    )
    .await;
}

/// A path that does not exist would be reported as malformed (or as success).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonexistent_path_is_not_found() {
    let server = Server::start().await;
    assert_refused(
        &server,
        "gone",
        "no/such/model",
        Code::NotFound,
        &["model path 'no/such/model' does not exist under the model root"],
    )
    .await;
}

/// A file that is not a .safetensors file (config.json...) would be parsed as weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_safetensors_file_is_refused() {
    let server = Server::start().await;
    put(&server, "cfg/config.json", b"{}");
    assert_refused(
        &server,
        "cfg",
        "cfg/config.json",
        Code::InvalidArgument,
        &["'cfg/config.json'", "does not end in .safetensors"],
    )
    .await;
    assert_refused(
        &server,
        "cfg",
        "cfg",
        Code::InvalidArgument,
        &["'cfg'", "directory holds neither model.safetensors nor"],
    )
    .await;
}

/// A model name outside [a-z0-9][a-z0-9._-]* would be accepted (and reach metrics labels).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_model_name_is_refused() {
    let server = Server::start().await;
    write_good(&server.root.join("good"));
    assert_refused(
        &server,
        "Bad/Name",
        "good",
        Code::InvalidArgument,
        &["model name 'Bad/Name' must start with a-z or 0-9"],
    )
    .await;
    assert_refused(
        &server,
        "bad/name",
        "good",
        Code::InvalidArgument,
        &["model name 'bad/name' contains '/'"],
    )
    .await;
    assert_refused(&server, "", "good", Code::InvalidArgument, &["is empty"]).await;
}

/// Unknown models and versions would be answered with something other than NOT_FOUND.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_model_or_version_is_not_found() {
    let server = Server::start().await;
    let mut admin = server.admin().await;

    let err = admin
        .describe_model(pb::DescribeModelRequest {
            name: "nope".into(),
            version: 0,
        })
        .await
        .expect_err("describe of an unknown model");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("model 'nope' not found"), "{err:?}");

    let err = admin
        .unload_model(pb::UnloadModelRequest {
            name: "nope".into(),
            version: 0,
            ..Default::default()
        })
        .await
        .expect_err("unload of an unknown model");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("model 'nope' not found"), "{err:?}");

    write_good(&server.root.join("known"));
    let v = load(&mut admin, "known", "known")
        .await
        .expect("load known");
    let before = stats(&mut admin).await;

    let err = admin
        .unload_model(pb::UnloadModelRequest {
            name: "known".into(),
            version: v.version + 6,
            ..Default::default()
        })
        .await
        .expect_err("unload of an unknown version");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let want = format!("version {} of model 'known' not found", v.version + 6);
    assert!(err.message().contains(&want), "{err:?}");

    let err = admin
        .describe_model(pb::DescribeModelRequest {
            name: "known".into(),
            version: v.version + 6,
        })
        .await
        .expect_err("describe of an unknown version");
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains(&want), "{err:?}");

    // The known version was not touched by the refused unload.
    let after = stats(&mut admin).await;
    assert_eq!(after.arena_bytes, before.arena_bytes);
    assert_eq!(count(&after, pb::VersionState::Ready), 1);
    let d = admin
        .describe_model(pb::DescribeModelRequest {
            name: "known".into(),
            version: 0,
        })
        .await
        .expect("describe known")
        .into_inner();
    let m = d.model.expect("model");
    assert_eq!(m.latest_ready, v.version);
}

/// A model over --max-model-bytes would be allocated anyway (or leak its reservation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_over_max_model_bytes_is_resource_exhausted() {
    let server = Server::start_with(&["--max-model-bytes", "1024"], |root| {
        write_safetensors(
            &root.join("big/model.safetensors"),
            &[t("w", Dtype::F32, &[1024], 9)],
        );
    })
    .await;
    // The good model's arena (two tensors, 256-byte aligned) fits in 1024 bytes.
    assert_refused(
        &server,
        "big",
        "big",
        Code::ResourceExhausted,
        &["arena bytes of model 'big'", "limit 1024", "4096"],
    )
    .await;
}

/// Loads past --max-total-bytes would be allocated anyway (or leak their reservation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_over_max_total_bytes_is_resource_exhausted() {
    let server = Server::start_with(&["--max-total-bytes", "1024"], |root| {
        // Two 800-byte tensors at offsets 0 and 1024: a 2048-byte arena.
        write_safetensors(
            &root.join("wide/model.safetensors"),
            &[t("a", Dtype::F32, &[200], 1), t("b", Dtype::F32, &[200], 2)],
        );
    })
    .await;
    assert_refused(
        &server,
        "wide",
        "wide",
        Code::ResourceExhausted,
        &[
            "arena bytes held by the server",
            "limit 1024",
            "requested 2048",
        ],
    )
    .await;
}

/// A `__metadata__` over the limit (1 MiB by default; `[limits] max_header_metadata_bytes`) is
/// refused at load, naming the limit: it would travel in every attach reply. Fails if a model
/// with 2 MiB of metadata loads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn header_metadata_over_the_limit_is_refused() {
    let server = Server::start().await;
    let big = "x".repeat(2 << 20);
    let header = format!(
        r#"{{"__metadata__":{{"notes":"{big}"}},"w":{{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}}}"#
    );
    put(&server, "meta.safetensors", &raw(&header, &[0u8; 16]));
    assert_refused(
        &server,
        "meta",
        "meta.safetensors",
        Code::InvalidArgument,
        &[
            "meta.safetensors: the size of __metadata__",
            "over the limit of 1048576",
        ],
    )
    .await;
}

/// The peak resident memory of process `pid`, in bytes (`VmHWM`).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmHWM")
        * 1024
}

/// An `Attach` needs kilobytes: requests of 32 MiB each (sent four at a time) are refused with
/// RESOURCE_EXHAUSTED from their length prefix, before the server buffers them, so its memory
/// does not grow by what hostile clients send. A normal attach still works afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_requests_are_refused_before_they_are_buffered() {
    let server = Server::start().await;
    let channel = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("channel");
    let worker = modelshare_proto::v1::worker_service_client::WorkerServiceClient::new(channel)
        .max_encoding_message_size(64 << 20);
    let before = peak_rss(server.pid());
    let huge = "x".repeat(32 << 20);
    let calls = (0..4).map(|_| {
        let mut w = worker.clone();
        let model = huge.clone();
        async move {
            w.attach(pb::AttachRequest {
                device_uuid: String::new(),
                session_id: "s".into(),
                model,
                version: 0,
            })
            .await
        }
    });
    for result in futures_join(calls).await {
        let status = result.expect_err("a 32 MiB attach");
        assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
        assert!(
            status
                .message()
                .contains("exceeds this method's limit of 65536 bytes"),
            "{}",
            status.message()
        );
    }
    let grew = peak_rss(server.pid()).saturating_sub(before);
    assert!(
        grew < 48 << 20,
        "the server's peak memory grew by {} MiB",
        grew >> 20
    );
    let err = worker
        .clone()
        .attach(pb::AttachRequest {
            device_uuid: String::new(),
            session_id: "no-such-session".into(),
            model: "m".into(),
            version: 0,
        })
        .await
        .expect_err("no session");
    assert_eq!(
        err.code(),
        Code::NotFound,
        "a small request is read as before: {err:?}"
    );
}

/// Runs the futures at once and collects their outputs in order.
async fn futures_join<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("task"));
    }
    out
}

/// `AttachRequest` as the wire sees it, with `session_id` (a string, field 1) sent as raw
/// bytes, so that a test can send a string that is not UTF-8.
#[derive(Clone, PartialEq, prost::Message)]
struct RawAttachRequest {
    #[prost(bytes = "vec", tag = "1")]
    session_id: Vec<u8>,
    #[prost(string, tag = "2")]
    model: String,
}

/// A request whose string field is not UTF-8 does not decode: that is the client's error,
/// INVALID_ARGUMENT, not INTERNAL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_that_is_not_utf8_is_an_invalid_argument() {
    let server = Server::start().await;
    let channel = modelshare_worker::connect::channel(&server.address)
        .await
        .expect("channel");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let codec =
        modelshare_proto::codec::StrictCodec::<RawAttachRequest, pb::AttachResponse>::default();
    let path =
        tonic::codegen::http::uri::PathAndQuery::from_static("/modelshare.v1.WorkerService/Attach");
    let request = RawAttachRequest {
        session_id: vec![b's', 0xff, 0xfe],
        model: "m".into(),
    };
    let status = grpc
        .unary(tonic::Request::new(request), path, codec)
        .await
        .expect_err("not UTF-8");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("UTF-8"), "{}", status.message());
}
