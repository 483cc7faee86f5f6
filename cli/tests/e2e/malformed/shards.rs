//! Sharded models with a broken index or shards.

use safetensors::Dtype;
use tonic::Code;

use super::{assert_refused, put, write_good};
use crate::common::{Server, t, write_safetensors, write_sharded};

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
