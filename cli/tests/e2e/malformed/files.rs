//! Malformed weight files: headers, ranges, shapes, dtypes, names, encodings.

use safetensors::Dtype;
use tonic::Code;

use super::{assert_refused, put, raw};
use crate::common::{Server, t, write_sharded};

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
