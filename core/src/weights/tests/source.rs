//! Resolving models under the root: single files, directories, sharded models; paths and
//! symlinks that leave the root, missing files and shards, disagreements between index and
//! shards.

use std::os::unix::fs::symlink;

use super::*;

fn write(path: &Path, bytes: &[u8]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

fn resolve_default(root: &Path, rel: &str) -> Result<ModelSource, WeightsError> {
    resolve(root, rel, &WeightLimits::default())
}

/// A two-shard model in `root/m`: s1 holds a, b; s2 holds c.
fn sharded_model(root: &Path) {
    write(
        &root.join("m/s1.safetensors"),
        &f32_file(&[("a", 3), ("b", 70)]),
    );
    write(&root.join("m/s2.safetensors"), &f32_file(&[("c", 5)]));
    write(
        &root.join("m/model.safetensors.index.json"),
        br#"{"metadata":{"total_size":312},"weight_map":{"c":"s2.safetensors","a":"s1.safetensors","b":"s1.safetensors"}}"#,
    );
}

fn index_with(root: &Path, weight_map: &str) {
    let text = format!(r#"{{"weight_map":{weight_map}}}"#);
    write(
        &root.join("m/model.safetensors.index.json"),
        text.as_bytes(),
    );
}

/// A single-file model named directly would not resolve.
#[test]
fn resolves_a_single_file() {
    let root = tempfile::tempdir().unwrap();
    write(
        &root.path().join("org/x.safetensors"),
        &f32_file(&[("w", 4)]),
    );
    let src = resolve_default(root.path(), "./org//x.safetensors").unwrap();
    assert_eq!(src.source, "org/x.safetensors");
    assert_eq!(src.shards.len(), 1);
    assert_eq!(src.shards[0].display, "org/x.safetensors");
    assert_eq!(
        src.shards[0].file_len,
        src.shards[0].file.metadata().unwrap().len()
    );
    assert!(src.metadata_files.is_empty());
    write(&root.path().join("org/x.bin"), b"12345678");
    bad_path(
        resolve_default(root.path(), "org/x.bin"),
        "org/x.bin",
        "does not end in .safetensors",
    );
}

/// A directory model would not resolve, or its metadata files would be picked wrongly.
#[test]
fn resolves_a_directory_with_metadata_files() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("m");
    write(
        &dir.join("model.safetensors"),
        &serialize(
            &[("w", Dtype::U8, vec![2], vec![1, 2])],
            &[("format", "pt")],
        ),
    );
    write(&dir.join("config.json"), b"{\"a\":1}");
    write(&dir.join("tokenizer.model"), b"tok");
    write(&dir.join("chat_template.jinja"), b"{{x}}");
    write(&dir.join("vocab.txt"), b"a\nb");
    write(&dir.join("README.md"), b"no");
    write(&dir.join("sub/nested.json"), b"no");
    // sentence-transformers modules: files of the directories modules.json names come too.
    write(
        &dir.join("modules.json"),
        br#"[{"path":""},{"path":"1_Pooling"},{"path":"2_Normalize"},{"path":"../m"},{"path":"sub/x"}]"#,
    );
    write(
        &dir.join("1_Pooling/config.json"),
        b"{\"pooling_mode_mean_tokens\":true}",
    );
    write(&dir.join("1_Pooling/notes.md"), b"no");
    std::fs::create_dir(dir.join("dir.json")).unwrap();
    write(&root.path().join("shared/gen.json"), b"{}");
    symlink(
        root.path().join("shared/gen.json"),
        dir.join("generation_config.json"),
    )
    .unwrap();
    let src = resolve_default(root.path(), "m/").unwrap();
    assert_eq!(src.source, "m");
    assert_eq!(src.shards[0].display, "m/model.safetensors");
    assert_eq!(
        src.header_metadata.get("format").map(String::as_str),
        Some("pt")
    );
    let names: Vec<_> = src.metadata_files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "1_Pooling/config.json",
            "chat_template.jinja",
            "config.json",
            "generation_config.json",
            "modules.json",
            "tokenizer.model",
            "vocab.txt"
        ]
    );
    assert_eq!(src.metadata_files[2].1, b"{\"a\":1}");
}

/// A sharded model would not resolve, or shards would come in the wrong order.
#[test]
fn resolves_a_sharded_model() {
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    write(&root.path().join("m/config.json"), b"{}");
    let src = resolve_default(root.path(), "m").unwrap();
    let shards: Vec<_> = src.shards.iter().map(|s| s.display.as_str()).collect();
    assert_eq!(shards, ["m/s2.safetensors", "m/s1.safetensors"]);
    let names: Vec<_> = src.metadata_files.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["config.json"]);
}

/// Requested paths could leave the root or be ambiguous.
#[test]
fn rejects_bad_requested_paths() {
    let root = tempfile::tempdir().unwrap();
    write(
        &root.path().join("m/model.safetensors"),
        &f32_file(&[("w", 1)]),
    );
    for (rel, needle) in [
        ("../m", "'..'"),
        ("m/../m", "'..'"),
        ("/m", "absolute"),
        ("", "empty"),
        (".", "model root itself"),
        ("m\0", "NUL"),
    ] {
        bad_path(
            resolve_default(root.path(), rel),
            &rel.replace('\0', "\\0"),
            needle,
        );
    }
}

/// A missing model would not be reported as NOT_FOUND.
#[test]
fn reports_missing_paths() {
    let root = tempfile::tempdir().unwrap();
    write(&root.path().join("f.safetensors"), &f32_file(&[("w", 1)]));
    for rel in ["nope", "nope/model.safetensors", "f.safetensors/x"] {
        match resolve_default(root.path(), rel) {
            Err(e @ WeightsError::NotFound { .. }) => {
                assert!(
                    e.to_string().contains(&format!("'{rel}' does not exist")),
                    "{e}"
                );
            }
            other => panic!("{rel}: {other:?}"),
        }
    }
}

/// A directory holding no model would be accepted or misreported.
#[test]
fn rejects_directory_without_model() {
    let root = tempfile::tempdir().unwrap();
    write(&root.path().join("m/config.json"), b"{}");
    bad_path(
        resolve_default(root.path(), "m"),
        "m",
        "directory holds neither model.safetensors nor model.safetensors.index.json",
    );
    std::fs::create_dir_all(root.path().join("d/model.safetensors")).unwrap();
    bad_path(
        resolve_default(root.path(), "d"),
        "d/model.safetensors",
        "not a regular file",
    );
}

/// Symlinks could lead a load outside the model root.
#[test]
fn rejects_symlinks_leaving_the_root() {
    let outside = tempfile::tempdir().unwrap();
    write(
        &outside.path().join("model.safetensors"),
        &f32_file(&[("w", 1)]),
    );
    write(&outside.path().join("secret.json"), b"{}");
    let root = tempfile::tempdir().unwrap();
    symlink(outside.path(), root.path().join("evil_dir")).unwrap();
    bad_path(
        resolve_default(root.path(), "evil_dir"),
        "evil_dir",
        "leaves the model root",
    );
    symlink(
        outside.path().join("model.safetensors"),
        root.path().join("evil.safetensors"),
    )
    .unwrap();
    bad_path(
        resolve_default(root.path(), "evil.safetensors"),
        "evil.safetensors",
        "leaves the model root",
    );
    // Inside a model directory: the weight file, then a metadata file.
    let dir = root.path().join("m");
    std::fs::create_dir(&dir).unwrap();
    symlink(
        outside.path().join("model.safetensors"),
        dir.join("model.safetensors"),
    )
    .unwrap();
    bad_path(
        resolve_default(root.path(), "m"),
        "m/model.safetensors",
        "leaves the model root",
    );
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    write(&dir.join("model.safetensors"), &f32_file(&[("w", 1)]));
    symlink(outside.path().join("secret.json"), dir.join("config.json")).unwrap();
    bad_path(
        resolve_default(root.path(), "m"),
        "m/config.json",
        "leaves the model root",
    );
    // Symlinks that stay inside the root are fine (as in a Hugging Face cache).
    write(&root.path().join("blobs/abc"), &f32_file(&[("w", 1)]));
    std::fs::create_dir(root.path().join("snap")).unwrap();
    symlink(
        root.path().join("blobs/abc"),
        root.path().join("snap/model.safetensors"),
    )
    .unwrap();
    assert_eq!(
        resolve_default(root.path(), "snap").unwrap().shards.len(),
        1
    );
}

/// A shard symlinked outside the root would be loaded.
#[test]
fn rejects_shard_symlink_leaving_the_root() {
    let outside = tempfile::tempdir().unwrap();
    write(
        &outside.path().join("s2.safetensors"),
        &f32_file(&[("c", 5)]),
    );
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    std::fs::remove_file(root.path().join("m/s2.safetensors")).unwrap();
    symlink(
        outside.path().join("s2.safetensors"),
        root.path().join("m/s2.safetensors"),
    )
    .unwrap();
    bad_path(
        resolve_default(root.path(), "m"),
        "m/s2.safetensors",
        "leaves the model root",
    );
}

/// A shard name with `..` in the index would be followed.
#[test]
fn rejects_index_shard_with_dotdot() {
    let root = tempfile::tempdir().unwrap();
    write(&root.path().join("x.safetensors"), &f32_file(&[("a", 1)]));
    index_with(root.path(), r#"{"a":"../x.safetensors"}"#);
    malformed(
        resolve_default(root.path(), "m"),
        "m/model.safetensors.index.json",
        "'..'",
    );
}

/// A missing shard would surface as a confusing NOT_FOUND for the model.
#[test]
fn rejects_missing_shard() {
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    std::fs::remove_file(root.path().join("m/s1.safetensors")).unwrap();
    let at = malformed(
        resolve_default(root.path(), "m"),
        "m/model.safetensors.index.json",
        "the index names shard 's1.safetensors', which does not exist",
    );
    assert_eq!(at, 0);
}

/// An index listing a tensor its shard lacks would leave a hole in the manifest.
#[test]
fn rejects_index_tensor_missing_from_shard() {
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    index_with(
        root.path(),
        r#"{"a":"s1.safetensors","b":"s1.safetensors","c":"s2.safetensors","x":"s2.safetensors"}"#,
    );
    malformed(
        resolve_default(root.path(), "m"),
        "m/model.safetensors.index.json",
        "index names tensor 'x' in shard 's2.safetensors', which does not contain it",
    );
    index_with(
        root.path(),
        r#"{"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"}"#,
    );
    malformed(
        resolve_default(root.path(), "m"),
        "m/model.safetensors.index.json",
        "tensor 'b' in shard 's2.safetensors', which does not contain it (it is in shard 's1.safetensors')",
    );
}

/// A shard tensor absent from the index would be loaded without being listed.
#[test]
fn rejects_shard_tensor_missing_from_index() {
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    index_with(
        root.path(),
        r#"{"a":"s1.safetensors","c":"s2.safetensors"}"#,
    );
    malformed(
        resolve_default(root.path(), "m"),
        "m/model.safetensors.index.json",
        "shard 's1.safetensors' holds tensor 'b', which the index does not list",
    );
}

/// A tensor stored in two shards would be ambiguous.
#[test]
fn rejects_tensor_in_two_shards() {
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    write(
        &root.path().join("m/s2.safetensors"),
        &f32_file(&[("c", 5), ("a", 3)]),
    );
    malformed(
        resolve_default(root.path(), "m"),
        "m/s1.safetensors",
        "tensor 'a' is also in shard 's2.safetensors'",
    );
}

/// A malformed shard would be accepted, or its error would not name the shard.
#[test]
fn names_the_malformed_shard() {
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    write(&root.path().join("m/s1.safetensors"), b"1234");
    malformed(
        resolve_default(root.path(), "m"),
        "m/s1.safetensors",
        "file is 4 bytes",
    );
}

/// Metadata files over the per-file or total limit would be read into memory.
#[test]
fn enforces_metadata_file_limits() {
    let root = tempfile::tempdir().unwrap();
    write(
        &root.path().join("m/model.safetensors"),
        &f32_file(&[("w", 1)]),
    );
    write(&root.path().join("m/a.json"), &[b' '; 60]);
    write(&root.path().join("m/b.txt"), &[b' '; 50]);
    let limits = WeightLimits {
        max_metadata_file_bytes: 55,
        ..WeightLimits::default()
    };
    let r = resolve(root.path(), "m", &limits);
    assert_eq!(limit(r, "m/a.json", "metadata file size"), (55, 60));
    let limits = WeightLimits {
        max_metadata_file_bytes: 100,
        max_metadata_total_bytes: 100,
        ..WeightLimits::default()
    };
    let r = resolve(root.path(), "m", &limits);
    assert_eq!(limit(r, "m", "total size of metadata files"), (100, 110));
}

/// The total tensor count of a sharded model would escape the limit.
#[test]
fn enforces_total_tensor_limit() {
    let root = tempfile::tempdir().unwrap();
    sharded_model(root.path());
    let limits = WeightLimits {
        max_tensors: 2,
        ..WeightLimits::default()
    };
    let r = resolve(root.path(), "m", &limits);
    assert_eq!(
        limit(r, "m/model.safetensors.index.json", "tensor count"),
        (2, 3)
    );
}
