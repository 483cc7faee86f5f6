//! What must hold for any input to the weight-file parsers, shared by the fuzz targets
//! (`fuzz_targets/`) and by the replay of the kept corpus in CI
//! (`server/tests/fuzz_corpus.rs`). A panic here is a finding.
//!
//! - `header`: `parse_header` never panics; its errors stay short; what it accepts tiles the
//!   data section exactly with ranges that match each tensor's shape and dtype, within the
//!   limits; and the format's reference implementation (the `safetensors` crate) accepts the
//!   same file with the same tensors, unless the file uses a dtype that crate does not know.
//! - `index`: `parse_index` never panics; what it accepts is valid JSON whose `weight_map` is
//!   the same map, with every shard a normalized relative path, within the limits.

use std::collections::{BTreeMap, HashSet};

use modelshare_core::weights::{WeightLimits, parse_header, parse_index, path::normalize_relative};

/// Longest error message accepted: a hostile file must not turn into a huge message.
const MAX_ERROR_BYTES: usize = 8 << 10;

/// Small limits, so that the fuzzer reaches them.
pub fn limits() -> WeightLimits {
    WeightLimits {
        max_header_bytes: 1 << 20,
        max_tensors: 512,
        max_shards: 64,
        max_name_bytes: 128,
        max_rank: 8,
        ..WeightLimits::default()
    }
}

/// Dtypes the reference crate (safetensors 0.4) knows.
const REFERENCE_DTYPES: [&str; 15] = [
    "BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
    "F64", "I64", "U64",
];

/// Tensors by name: dtype, shape and data offsets, as each parser read them.
type Tensors = BTreeMap<String, (String, Vec<u64>, (u64, u64))>;

/// Checks one whole safetensors file.
pub fn header(data: &[u8]) {
    let limits = limits();
    let len = data.len() as u64;
    let header = match parse_header("fuzz.safetensors", &mut &data[..], len, &limits) {
        Ok(h) => h,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.len() <= MAX_ERROR_BYTES, "error of {} bytes", msg.len());
            return;
        }
    };
    assert_eq!(header.data_start, 8 + header.header_len);
    assert_eq!(header.data_start + header.data_len, len);
    assert!(header.tensors.len() <= limits.max_tensors);
    let mut pos = 0u64;
    let mut names = HashSet::new();
    for t in &header.tensors {
        assert!(names.insert(t.name.as_str()), "duplicate {:?}", t.name);
        assert!(t.name.len() <= limits.max_name_bytes);
        assert!(t.shape.len() <= limits.max_rank);
        assert_eq!(t.begin, pos, "hole or overlap at {:?}", t.name);
        assert!(t.end >= t.begin);
        let elements = t
            .shape
            .iter()
            .try_fold(1u64, |n, &d| n.checked_mul(d))
            .expect("accepted a shape whose element count overflows");
        let bytes = elements
            .checked_mul(t.dtype.size_bytes())
            .expect("accepted a byte length that overflows");
        assert_eq!(t.byte_length(), bytes, "range of {:?} ≠ its shape", t.name);
        pos = t.end;
    }
    assert_eq!(pos, header.data_len, "trailing bytes accepted");

    if header
        .tensors
        .iter()
        .any(|t| !REFERENCE_DTYPES.contains(&t.dtype.as_str()))
    {
        return;
    }
    let (_, reference) = safetensors::SafeTensors::read_metadata(data)
        .unwrap_or_else(|e| panic!("accepted a file the reference refuses: {e:?}"));
    let theirs: Tensors = reference
        .tensors()
        .into_iter()
        .map(|(name, info)| {
            let shape = info.shape.iter().map(|&d| d as u64).collect();
            let (b, e) = info.data_offsets;
            (
                name,
                (format!("{:?}", info.dtype), shape, (b as u64, e as u64)),
            )
        })
        .collect();
    let ours: Tensors = header
        .tensors
        .iter()
        .map(|t| {
            let dtype = t.dtype.as_str().to_owned();
            (t.name.clone(), (dtype, t.shape.clone(), (t.begin, t.end)))
        })
        .collect();
    assert_eq!(ours, theirs, "the reference reads other tensors");
}

/// Checks one index file's contents.
pub fn index(data: &[u8]) {
    let limits = limits();
    let index = match parse_index("model.safetensors.index.json", data, &limits) {
        Ok(i) => i,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.len() <= MAX_ERROR_BYTES, "error of {} bytes", msg.len());
            return;
        }
    };
    assert!(index.shards.len() <= limits.max_shards);
    std::str::from_utf8(data).expect("accepted an index that is not UTF-8");
    let value: serde_json::Value = match serde_json::from_slice(data) {
        Ok(v) => v,
        // JSON's grammar allows numbers past f64 and unpaired surrogate escapes (Python reads
        // 8e755 as inf and keeps "\ud800"); serde_json's Value refuses both (a surrogate not
        // followed by its pair reads as "unexpected end of hex escape"). The parser refuses them
        // where it reads (names, paths), so they can only sit in a part it skips: nothing to
        // compare.
        Err(e)
            if e.to_string().starts_with("number out of range")
                || e.to_string().contains("surrogate")
                || e.to_string().contains("hex escape") =>
        {
            return;
        }
        Err(e) => panic!("accepted an index that is not JSON: {e}"),
    };
    let map = value
        .get("weight_map")
        .and_then(|m| m.as_object())
        .expect("accepted an index without a weight_map object");
    assert_eq!(
        map.len(),
        index.weight_map.len(),
        "duplicate tensor accepted"
    );
    let mut seen = Vec::new();
    for (name, shard) in &index.weight_map {
        assert!(name.len() <= limits.max_name_bytes);
        let raw = map[name].as_str().expect("a shard that is not a string");
        assert_eq!(normalize_relative(raw).as_deref(), Ok(shard.as_str()));
        if !seen.contains(shard) {
            seen.push(shard.clone());
        }
    }
    assert_eq!(seen, index.shards, "shards not the distinct files in order");
}
