//! Shard indexes: the weight map in order; duplicate tensors, bad shard names, a missing map
//! and limits refused.

use super::*;

const INDEX: &str = "m/model.safetensors.index.json";

fn idx(s: &str) -> Result<Index, WeightsError> {
    parse_index(INDEX, s.as_bytes(), &WeightLimits::default())
}

/// A valid index would be refused, or its shards listed wrongly.
#[test]
fn parses_weight_map_in_order() {
    let index = idx(r#"{"metadata":{"total_size":12,"x":[1,{"y":null}]},"weight_map":{"b":"./s2.safetensors","a":"s1.safetensors","c":"s2.safetensors"},"other":1}"#).unwrap();
    assert_eq!(
        index.weight_map,
        [
            ("b".into(), "s2.safetensors".into()),
            ("a".into(), "s1.safetensors".into()),
            ("c".into(), "s2.safetensors".into())
        ]
    );
    assert_eq!(index.shards, ["s2.safetensors", "s1.safetensors"]);
}

/// An index naming a tensor twice would silently keep one shard for it.
#[test]
fn rejects_duplicate_tensors() {
    let r = idx(r#"{"weight_map":{"a":"s.safetensors","a":"t.safetensors"}}"#);
    malformed(r, INDEX, "weight_map names tensor 'a' twice");
    let r = idx(r#"{"weight_map":{"a":"s.safetensors"},"weight_map":{"b":"s.safetensors"}}"#);
    malformed(r, INDEX, "key 'weight_map' twice");
}

/// Shard names could reach outside the model directory.
#[test]
fn rejects_bad_shard_names() {
    for (shard, needle) in [
        ("../x.safetensors", "'..'"),
        ("a/../../x.safetensors", "'..'"),
        ("/etc/x.safetensors", "absolute"),
        ("", "empty"),
        ("x.bin", "does not end in .safetensors"),
    ] {
        let r = idx(&format!(r#"{{"weight_map":{{"a":"{shard}"}}}}"#));
        malformed(r, INDEX, needle);
    }
}

/// Indexes without a usable weight_map would be accepted.
#[test]
fn rejects_missing_or_empty_weight_map() {
    malformed(idx(r#"{"metadata":{}}"#), INDEX, "no weight_map");
    malformed(idx(r#"{"weight_map":{}}"#), INDEX, "weight_map is empty");
    malformed(
        idx(r#"{"weight_map":{"a":1}}"#),
        INDEX,
        "shard of tensor 'a'",
    );
    malformed(idx(r#"[]"#), INDEX, "weight_map");
    let at = malformed(
        idx("{\"weight_map\":{\"a\" \"s\"}}"),
        INDEX,
        "not valid JSON",
    );
    assert_eq!(at, 19);
}

/// Index size and shard count limits would not be enforced.
#[test]
fn enforces_limits() {
    let text = r#"{"weight_map":{"a":"1.safetensors","b":"2.safetensors","c":"3.safetensors"}}"#;
    let limits = WeightLimits {
        max_shards: 2,
        ..WeightLimits::default()
    };
    let r = parse_index(INDEX, text.as_bytes(), &limits);
    assert_eq!(limit(r, INDEX, "shard count"), (2, 3));
    let limits = WeightLimits {
        max_header_bytes: 10,
        ..WeightLimits::default()
    };
    let r = parse_index(INDEX, text.as_bytes(), &limits);
    assert_eq!(limit(r, INDEX, "index file size").0, 10);
    let limits = WeightLimits {
        max_tensors: 1,
        ..WeightLimits::default()
    };
    let r = parse_index(INDEX, text.as_bytes(), &limits);
    assert_eq!(limit(r, INDEX, "tensor count"), (1, 3));
}
