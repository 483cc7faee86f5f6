//! Load paths that leave the model root, or name no model file.

use safetensors::Dtype;
use tonic::Code;

use super::{assert_refused, write_good};
use crate::common::{Server, t, write_sharded};

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
