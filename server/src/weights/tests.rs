//! Tests of header, index, source and layout, on files written by the official
//! `safetensors` crate (valid cases) and by hand (malformed cases).

use std::fmt::Debug;
use std::path::Path;

use safetensors::Dtype;
use safetensors::tensor::TensorView;

use super::*;

const FILE: &str = "model.safetensors";

/// Serializes tensors (name, dtype, shape, data) with the official crate.
fn serialize(tensors: &[(&str, Dtype, Vec<usize>, Vec<u8>)], meta: &[(&str, &str)]) -> Vec<u8> {
    let views: Vec<(&str, TensorView<'_>)> = tensors
        .iter()
        .map(|(name, dtype, shape, data)| {
            (*name, TensorView::new(*dtype, shape.clone(), data).unwrap())
        })
        .collect();
    let meta = (!meta.is_empty()).then(|| {
        meta.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    });
    safetensors::serialize(views, &meta).unwrap()
}

/// A file of F32 tensors of shape [n], filled with a pattern that differs per tensor.
fn f32_file(tensors: &[(&str, usize)]) -> Vec<u8> {
    let owned: Vec<_> = tensors
        .iter()
        .enumerate()
        .map(|(i, (name, n))| {
            let data: Vec<u8> = (0..n * 4).map(|j| (i * 31 + j) as u8).collect();
            (*name, Dtype::F32, vec![*n], data)
        })
        .collect();
    serialize(&owned, &[])
}

/// A file with a hand-written header and `data_len` data bytes.
fn raw(header: &str, data_len: usize) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    out.extend(std::iter::repeat_n(0xAB, data_len));
    out
}

fn parse_with(bytes: &[u8], limits: &WeightLimits) -> Result<Header, WeightsError> {
    parse_header(FILE, &mut &bytes[..], bytes.len() as u64, limits)
}

fn parse(bytes: &[u8]) -> Result<Header, WeightsError> {
    parse_with(bytes, &WeightLimits::default())
}

/// Asserts a `Malformed` error for `file` whose message contains `needle`; returns the offset.
#[track_caller]
fn malformed<T: Debug>(r: Result<T, WeightsError>, file: &str, needle: &str) -> u64 {
    match r {
        Err(e @ WeightsError::Malformed { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{file}: byte ")), "{msg}");
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
            let WeightsError::Malformed { offset, .. } = e else {
                unreachable!()
            };
            offset
        }
        other => panic!("expected Malformed {needle:?} in {file}, got {other:?}"),
    }
}

/// Asserts a `Limit` error for `file` whose message contains `needle`; returns (limit, actual).
#[track_caller]
fn limit<T: Debug>(r: Result<T, WeightsError>, file: &str, needle: &str) -> (u64, u64) {
    match r {
        Err(e @ WeightsError::Limit { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{file}: ")), "{msg}");
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
            let WeightsError::Limit { limit, actual, .. } = e else {
                unreachable!()
            };
            (limit, actual)
        }
        other => panic!("expected Limit {needle:?} in {file}, got {other:?}"),
    }
}

/// Asserts a `BadPath` error for `path` whose message contains `needle`.
#[track_caller]
fn bad_path<T: Debug>(r: Result<T, WeightsError>, path: &str, needle: &str) {
    match r {
        Err(e @ WeightsError::BadPath { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains(&format!("'{path}'")), "{msg}");
            assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
        }
        other => panic!("expected BadPath {needle:?} for {path}, got {other:?}"),
    }
}

mod header {
    use super::*;

    /// Valid files written by the official crate would be rejected or misread.
    #[test]
    fn reads_what_the_official_crate_writes() {
        let f32s: Vec<u8> = [1.0f32, -2.0, 3.5, 0.0, 1e-3, 7.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f16s: Vec<u8> = [1.0f32, 0.5, -3.0, 65504.0]
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect();
        let bf16s: Vec<u8> = [1.0f32, 2.0, -0.25, 1e30]
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect();
        let i64s: Vec<u8> = [i64::MIN, 0, i64::MAX]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let bytes = serialize(
            &[
                ("f32", Dtype::F32, vec![2, 3], f32s),
                ("f16", Dtype::F16, vec![4], f16s),
                ("bf16", Dtype::BF16, vec![2, 2], bf16s),
                ("i64", Dtype::I64, vec![3], i64s),
                ("u8", Dtype::U8, vec![5], vec![1, 2, 3, 4, 5]),
                ("scalar", Dtype::F32, vec![], 42.0f32.to_le_bytes().to_vec()),
                ("empty", Dtype::F32, vec![0, 4], vec![]),
            ],
            &[("format", "pt")],
        );
        let header = parse(&bytes).unwrap();
        let official = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(header.tensors.len(), 7);
        assert_eq!(header.data_start, 8 + header.header_len);
        assert_eq!(header.data_start + header.data_len, bytes.len() as u64);
        assert_eq!(
            header.metadata.get("format").map(String::as_str),
            Some("pt")
        );
        assert!(header.tensors.windows(2).all(|w| w[0].begin <= w[1].begin));
        for t in &header.tensors {
            let view = official.tensor(&t.name).unwrap();
            assert_eq!(
                t.dtype.as_str(),
                format!("{:?}", view.dtype()),
                "{}",
                t.name
            );
            let shape: Vec<u64> = view.shape().iter().map(|&d| d as u64).collect();
            assert_eq!(t.shape, shape, "{}", t.name);
            let start = (header.data_start + t.begin) as usize;
            let end = (header.data_start + t.end) as usize;
            assert_eq!(&bytes[start..end], view.data(), "{}", t.name);
        }
        let scalar = header.tensors.iter().find(|t| t.name == "scalar").unwrap();
        assert_eq!((scalar.shape.len(), scalar.byte_length()), (0, 4));
        let empty = header.tensors.iter().find(|t| t.name == "empty").unwrap();
        assert_eq!(empty.byte_length(), 0);
    }

    /// Every dtype name the format defines would not be accepted in a header.
    #[test]
    fn accepts_every_dtype() {
        for d in DType::ALL {
            let n = d.size_bytes() * 3;
            let h = format!(
                r#"{{"t":{{"dtype":"{}","shape":[3],"data_offsets":[0,{n}]}}}}"#,
                d
            );
            let header = parse(&raw(&h, n as usize)).unwrap();
            assert_eq!(header.tensors[0].dtype, d);
        }
    }

    /// A header with no tensors, or with holes and padding, would be refused though valid.
    #[test]
    fn accepts_holes_padding_and_empty_headers() {
        let header = parse(&raw("{}", 0)).unwrap();
        assert!(header.tensors.is_empty());
        let h = r#"{"b":{"dtype":"U8","shape":[2],"data_offsets":[10,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},"y":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}      "#;
        let header = parse(&raw(h, 20)).unwrap();
        let names: Vec<_> = header.tensors.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["a", "z", "y", "b"]);
        assert_eq!(header.data_len, 20);
    }

    /// An empty or tiny file would panic or be read past its end.
    #[test]
    fn rejects_files_shorter_than_the_prefix() {
        for len in [0, 7] {
            let at = malformed(parse(&vec![0; len]), FILE, &format!("file is {len} bytes"));
            assert_eq!(at, 0);
        }
    }

    /// A huge declared header length would be trusted (allocated or read).
    #[test]
    fn rejects_header_length_past_the_file() {
        let mut bytes = 4_000_000_000u64.to_le_bytes().to_vec();
        bytes.resize(1024, b' ');
        let err = parse(&bytes).unwrap_err();
        assert_eq!(
            err.to_string(),
            "model.safetensors: byte 8: header length 4000000000 runs past the end of the 1024-byte file"
        );
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.push(b'{');
        malformed(parse(&bytes), FILE, "runs past the end");
    }

    /// The configured header limit would not bound what is read into memory.
    #[test]
    fn rejects_header_over_the_limit() {
        let bytes = f32_file(&[("w", 4)]);
        let limits = WeightLimits {
            max_header_bytes: 16,
            ..WeightLimits::default()
        };
        let (max, actual) = limit(parse_with(&bytes, &limits), FILE, "header length");
        assert_eq!(max, 16);
        assert_eq!(actual, u64::from_le_bytes(bytes[..8].try_into().unwrap()));
    }

    /// A truncated file (shorter than its stated length) would panic or be misread.
    #[test]
    fn rejects_a_reader_shorter_than_the_stated_length() {
        let bytes = f32_file(&[("w", 4)]);
        let cut = &bytes[..20];
        let r = parse_header(
            FILE,
            &mut &cut[..],
            bytes.len() as u64,
            &WeightLimits::default(),
        );
        malformed(r, FILE, "file ended");
    }

    /// Broken JSON would be accepted, or its error would point at the wrong byte.
    #[test]
    fn rejects_invalid_json_at_the_failing_byte() {
        let h = "{\"a\":\n x}";
        let at = malformed(parse(&raw(h, 0)), FILE, "not valid JSON");
        assert_eq!(at, 8 + h.find('x').unwrap() as u64);
        malformed(parse(&raw("", 4)), FILE, "header is empty");
        malformed(parse(&raw("{}}", 0)), FILE, "trailing characters");
        malformed(parse(&raw("{} \0", 0)), FILE, "trailing characters");
    }

    /// A header with invalid UTF-8 would reach the JSON parser or be accepted.
    #[test]
    fn rejects_header_not_utf8() {
        let mut bytes = raw("{\"\u{e9}\":1}", 0);
        bytes[11] = 0xFF; // the second byte of 'é', at header offset 3
        let at = malformed(parse(&bytes), FILE, "not valid UTF-8");
        assert_eq!(at, 10);
    }

    /// A header that is JSON but not an object would be accepted.
    #[test]
    fn rejects_header_not_an_object() {
        for h in ["[1, 2]", "\"x\"", " {}"] {
            malformed(parse(&raw(h, 0)), FILE, "must be a JSON object");
        }
        let h = r#"{"w": [1, 2]}"#;
        malformed(parse(&raw(h, 0)), FILE, "for tensor 'w'");
    }

    /// Unknown dtypes would be accepted with a wrong element size.
    #[test]
    fn rejects_unknown_dtype() {
        let h = r#"{"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}"#;
        let at = malformed(parse(&raw(h, 1)), FILE, "tensor 'w' has unknown dtype 'F4'");
        assert!(at > 8 && at < 8 + h.len() as u64, "{at}");
        let h = r#"{"w":{"dtype":7,"shape":[2],"data_offsets":[0,1]}}"#;
        malformed(parse(&raw(h, 1)), FILE, "dtype of tensor 'w'");
    }

    /// Entries with extra, repeated or missing keys would be accepted.
    #[test]
    fn rejects_unknown_duplicate_and_missing_keys() {
        let h = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"foo":1}}"#;
        malformed(parse(&raw(h, 1)), FILE, "tensor 'w' has unknown key 'foo'");
        let h = r#"{"w":{"dtype":"U8","shape":[1],"dtype":"U8","data_offsets":[0,1]}}"#;
        malformed(parse(&raw(h, 1)), FILE, "tensor 'w' has key 'dtype' twice");
        let h = r#"{"w":{"dtype":"U8","data_offsets":[0,1]}}"#;
        malformed(parse(&raw(h, 1)), FILE, "tensor 'w' has no shape");
    }

    /// A range whose size disagrees with shape×dtype would be accepted.
    #[test]
    fn rejects_shape_length_mismatch() {
        let h = r#"{"w":{"dtype":"F32","shape":[5,6],"data_offsets":[0,100]}}"#;
        malformed(
            parse(&raw(h, 200)),
            FILE,
            "tensor 'w' data_offsets [0, 100] hold 100 bytes but shape [5, 6] of F32 needs 120",
        );
    }

    /// A shape whose product overflows would wrap and match a small range.
    #[test]
    fn rejects_shape_overflow() {
        let h =
            r#"{"w":{"dtype":"U8","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}}"#;
        malformed(parse(&raw(h, 0)), FILE, "element count overflows 64 bits");
        let h = r#"{"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}}"#;
        malformed(parse(&raw(h, 0)), FILE, "byte size overflows 64 bits");
        // A zero dimension makes the product 0 however large the others are.
        let h =
            r#"{"w":{"dtype":"U8","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]}}"#;
        assert_eq!(parse(&raw(h, 0)).unwrap().tensors[0].byte_length(), 0);
    }

    /// Negative, fractional or oversized numbers in shapes and offsets would be accepted.
    #[test]
    fn rejects_bad_numbers() {
        for (shape, offsets, needle) in [
            ("[-1]", "[0,0]", "shape entry -1"),
            ("[1.5]", "[0,0]", "shape entry 1.5"),
            ("[\"2\"]", "[0,0]", "shape entry of tensor 'w'"),
            ("[1]", "[0,1e3]", "data_offsets entry 1000"),
            ("[1]", "[0,18446744073709551616]", "data_offsets entry"),
            ("[1]", "[0]", "exactly two integers"),
            ("[1]", "[0,1,2]", "exactly two integers"),
            ("[1]", "5", "data_offsets of tensor 'w'"),
        ] {
            let h = format!(r#"{{"w":{{"dtype":"U8","shape":{shape},"data_offsets":{offsets}}}}}"#);
            malformed(parse(&raw(&h, 4)), FILE, needle);
        }
    }

    /// A range ending past the file would be read beyond the end.
    #[test]
    fn rejects_range_past_the_end() {
        let h = r#"{"w":{"dtype":"U8","shape":[8],"data_offsets":[4,12]}}"#;
        let bytes = raw(h, 10);
        let at = malformed(
            parse(&bytes),
            FILE,
            "tensor 'w' data_offsets [4, 12] run past the end",
        );
        assert_eq!(at, 8 + h.len() as u64 + 4);
    }

    /// Reversed offsets would underflow into a huge length.
    #[test]
    fn rejects_begin_after_end() {
        let h = r#"{"w":{"dtype":"U8","shape":[0],"data_offsets":[8,4]}}"#;
        malformed(
            parse(&raw(h, 10)),
            FILE,
            "data_offsets [8, 4] begin after they end",
        );
    }

    /// Two tensors sharing bytes would be accepted (writes through one corrupt the other).
    #[test]
    fn rejects_overlapping_ranges() {
        let h = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]},"c":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}"#;
        let at = malformed(
            parse(&raw(h, 10)),
            FILE,
            "tensors 'a' [0, 8] and 'b' [2, 4] overlap",
        );
        assert_eq!(at, 8 + h.len() as u64 + 2);
        // Overlap with a non-neighbour: 'c' starts inside 'a' though 'b' lies between.
        let h = r#"{"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"c":{"dtype":"U8","shape":[4],"data_offsets":[6,10]}}"#;
        malformed(
            parse(&raw(h, 10)),
            FILE,
            "tensors 'a' [0, 8] and 'c' [6, 10] overlap",
        );
    }

    /// A repeated tensor name would silently keep one entry (serde_json's default).
    #[test]
    fn rejects_duplicate_names() {
        let h = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(serde_json::from_str::<serde_json::Value>(h).is_ok());
        let at = malformed(parse(&raw(h, 2)), FILE, "tensor 'w' appears twice");
        assert!(at > 8 + h.find("},").unwrap() as u64, "{at}");
    }

    /// Empty or oversized names would be accepted.
    #[test]
    fn rejects_bad_names() {
        let h = r#"{"":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        malformed(parse(&raw(h, 1)), FILE, "empty name");
        let long = "n".repeat(2000);
        let h = format!(r#"{{"{long}":{{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}}}"#);
        let (max, actual) = limit(parse(&raw(&h, 1)), FILE, "length in bytes of tensor name");
        assert_eq!((max, actual), (1024, 2000));
    }

    /// A malformed `__metadata__` would be accepted or dropped silently.
    #[test]
    fn rejects_bad_metadata() {
        for (meta, needle) in [
            (r#""x""#, "object of string values for '__metadata__'"),
            (r#"{"a":1}"#, "'__metadata__' value of key 'a'"),
            (r#"{"a":"1","a":"2"}"#, "'__metadata__' has key 'a' twice"),
            (r#"null"#, "'__metadata__'"),
        ] {
            let h = format!(r#"{{"__metadata__":{meta}}}"#);
            malformed(parse(&raw(&h, 0)), FILE, needle);
        }
        let h = r#"{"__metadata__":{},"__metadata__":{}}"#;
        malformed(parse(&raw(h, 0)), FILE, "'__metadata__' appears twice");
    }

    /// The tensor-count and rank limits would not be enforced, or would report wrong counts.
    #[test]
    fn enforces_count_and_rank_limits() {
        let limits = WeightLimits {
            max_tensors: 2,
            max_rank: 3,
            ..WeightLimits::default()
        };
        let bytes = f32_file(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]);
        assert_eq!(
            limit(parse_with(&bytes, &limits), FILE, "tensor count"),
            (2, 4)
        );
        let h = r#"{"w":{"dtype":"U8","shape":[1,1,1,1,1],"data_offsets":[0,1]}}"#;
        assert_eq!(
            limit(parse_with(&raw(h, 1), &limits), FILE, "rank of tensor 'w'"),
            (3, 5)
        );
    }
}

mod index {
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
        let text =
            r#"{"weight_map":{"a":"1.safetensors","b":"2.safetensors","c":"3.safetensors"}}"#;
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
}

mod source {
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
                "chat_template.jinja",
                "config.json",
                "generation_config.json",
                "tokenizer.model",
                "vocab.txt"
            ]
        );
        assert_eq!(src.metadata_files[1].1, b"{\"a\":1}");
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
}

mod layout {
    use std::os::unix::fs::FileExt;

    use super::*;

    /// Planned offsets would be unaligned, overlap, or point at the wrong file bytes.
    #[test]
    fn plans_aligned_offsets_that_match_the_file() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("m");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(
            dir.join("s1.safetensors"),
            f32_file(&[("a", 3), ("b", 70), ("z", 0)]),
        )
        .unwrap();
        std::fs::write(dir.join("s2.safetensors"), f32_file(&[("c", 64)])).unwrap();
        std::fs::write(
            dir.join("model.safetensors.index.json"),
            br#"{"weight_map":{"a":"s1.safetensors","b":"s1.safetensors","z":"s1.safetensors","c":"s2.safetensors"}}"#,
        )
        .unwrap();
        let src = resolve(root.path(), "m", &WeightLimits::default()).unwrap();
        let layout = plan(&src).unwrap();
        let got: Vec<_> = layout
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.shard, t.arena_offset, t.byte_length))
            .collect();
        assert_eq!(
            got,
            [
                ("a", 0, 0, 12),
                ("b", 0, 256, 280),
                ("z", 0, 768, 0),
                ("c", 1, 768, 256)
            ]
        );
        assert_eq!(layout.arena_bytes, 1024);
        assert_eq!(layout.payload_bytes, 12 + 280 + 256);
        for t in &layout.tensors {
            assert_eq!(t.arena_offset % ALIGNMENT, 0);
            let shard = &src.shards[t.shard];
            let mut bytes = vec![0; t.byte_length as usize];
            shard.file.read_exact_at(&mut bytes, t.file_offset).unwrap();
            let official =
                std::fs::read(dir.join(shard.display.strip_prefix("m/").unwrap())).unwrap();
            let st = safetensors::SafeTensors::deserialize(&official).unwrap();
            assert_eq!(bytes, st.tensor(&t.name).unwrap().data(), "{}", t.name);
            assert_eq!(t.shape, [t.byte_length / 4]);
            assert_eq!(t.dtype, DType::F32);
        }
    }

    /// A model without tensors would get a non-empty arena.
    #[test]
    fn empty_model_has_empty_arena() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("e.safetensors"), raw("{}", 0)).unwrap();
        let layout =
            plan(&resolve(root.path(), "e.safetensors", &WeightLimits::default()).unwrap())
                .unwrap();
        assert_eq!(
            layout,
            Layout {
                tensors: vec![],
                arena_bytes: 0,
                payload_bytes: 0
            }
        );
    }

    /// Sizes near u64::MAX would wrap instead of failing.
    #[test]
    fn overflow_is_an_error_not_a_panic() {
        let file = tempfile::tempfile().unwrap();
        let big = |name: &str, begin: u64, end: u64| TensorEntry {
            name: name.into(),
            dtype: DType::U8,
            shape: vec![end - begin],
            begin,
            end,
        };
        let src = ModelSource {
            source: "huge.safetensors".into(),
            shards: vec![Shard {
                file,
                display: "huge.safetensors".into(),
                file_len: u64::MAX,
                header: Header {
                    header_len: 2,
                    data_start: 10,
                    data_len: u64::MAX - 10,
                    tensors: vec![
                        big("a", 0, u64::MAX / 2 + 1),
                        big("b", u64::MAX / 2 + 1, u64::MAX - 10),
                    ],
                    metadata: Default::default(),
                },
            }],
            header_metadata: Default::default(),
            metadata_files: vec![],
        };
        malformed(plan(&src), "huge.safetensors", "overflows 64 bits");
    }
}
