//! Arena layout: aligned offsets that match the file, the empty model, overflow.

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
        let official = std::fs::read(dir.join(shard.display.strip_prefix("m/").unwrap())).unwrap();
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
        plan(&resolve(root.path(), "e.safetensors", &WeightLimits::default()).unwrap()).unwrap();
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
