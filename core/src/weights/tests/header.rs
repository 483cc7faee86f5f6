//! Headers: what the official crate writes is read back exactly; every malformed header is
//! refused with its file, byte offset and reason; limits hold.

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

/// A header with no tensors, with padding spaces, or with empty tensors would be refused
/// though valid.
#[test]
fn accepts_padding_and_empty_headers_and_tensors() {
    let header = parse(&raw("{}", 0)).unwrap();
    assert!(header.tensors.is_empty());
    let h = r#"{"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"z":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},"y":{"dtype":"U8","shape":[0],"data_offsets":[4,4]}}      "#;
    let header = parse(&raw(h, 6)).unwrap();
    let names: Vec<_> = header.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "z", "y", "b"]);
    assert_eq!(header.data_len, 6);
}

/// A file whose data section has bytes no tensor names (a hole between tensors, or trailing
/// bytes after the last) would be accepted: the format forbids both.
#[test]
fn rejects_holes_and_trailing_bytes_with_offsets() {
    let h = r#"{"b":{"dtype":"U8","shape":[2],"data_offsets":[10,12]},"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    let start = 8 + h.len() as u64;
    let at = malformed(
        parse(&raw(h, 12)),
        FILE,
        &format!(
            "bytes [{}, {}) of the file (data_offsets [4, 10]) belong to no tensor: a hole before tensor 'b'",
            start + 4,
            start + 10
        ),
    );
    assert_eq!(at, start + 4);
    let h = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    let start = 8 + h.len() as u64;
    let at = malformed(
        parse(&raw(h, 7)),
        FILE,
        &format!(
            "bytes [{}, {}) of the file, after the last tensor, belong to no tensor (3 trailing bytes)",
            start + 4,
            start + 7
        ),
    );
    assert_eq!(at, start + 4);
    // A hole at the very start, and data after an empty header.
    let h = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#;
    malformed(parse(&raw(h, 6)), FILE, "a hole before tensor 'a'");
    malformed(parse(&raw("{}", 5)), FILE, "(5 trailing bytes)");
    // An empty tensor away from the current position.
    let h = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"e":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}}"#;
    malformed(parse(&raw(h, 4)), FILE, "overlap");
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
    let h = r#"{"w":{"dtype":"U8","shape":[1099511627776,1099511627776],"data_offsets":[0,0]}}"#;
    malformed(parse(&raw(h, 0)), FILE, "element count overflows 64 bits");
    let h = r#"{"w":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}}"#;
    malformed(parse(&raw(h, 0)), FILE, "byte size overflows 64 bits");
    // A zero dimension makes the product 0 however large the others are.
    let h = r#"{"w":{"dtype":"U8","shape":[1099511627776,1099511627776,0],"data_offsets":[0,0]}}"#;
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
