//! Tests of the kernel cache's parts that need no device: hashing, options, cache files,
//! the cache directory, and NVRTC where it is installed.

use std::ffi::OsString;
use std::path::PathBuf;

use super::disk::{decode_cache_file, disk_dir_from, encode_cache_file, write_cache_file};
use super::hash::Fnv1a;
use super::*;
use crate::error::KernelError;
use crate::sys::nvrtc_available;

/// The hash is not FNV-1a (the published test vectors).
#[test]
fn fnv1a_matches_test_vectors() {
    let hash = |s: &str| {
        let mut h = Fnv1a::new();
        h.write(s.as_bytes());
        h.0
    };
    assert_eq!(hash(""), 0xcbf2_9ce4_8422_2325);
    assert_eq!(hash("a"), 0xaf63_dc4c_8601_ec8c);
    assert_eq!(hash("foobar"), 0x8594_4171_f739_67e8);
}

/// A change of source or options would reuse a stale cached module.
#[test]
fn hash_covers_source_and_options() {
    let base = source_hash(&GEMV_SOURCE, &compile_options(9, 0));
    assert_ne!(base, source_hash(&GEMV_SOURCE, &compile_options(8, 0)));
    assert_ne!(base, source_hash(&CHECKSUM_SOURCE, &compile_options(9, 0)));
    let edited = KernelSource {
        name: GEMV_SOURCE.name,
        code: "extern \"C\" __global__ void k() {}",
    };
    assert_ne!(base, source_hash(&edited, &compile_options(9, 0)));
    assert_eq!(base, source_hash(&GEMV_SOURCE, &compile_options(9, 0)));
    assert_eq!(cache_file_name(0xab, 9, 0), "00000000000000ab-sm90.ptx");
}

/// The options lose the device's architecture or gain fast math.
#[test]
fn options_target_the_device_without_fast_math() {
    let opts = compile_options(9, 0);
    assert!(opts.contains(&"--gpu-architecture=compute_90".to_owned()));
    assert!(!opts.iter().any(|o| o.contains("fast")));
}

/// A cache file is not read back, or a damaged one is trusted.
#[test]
fn cache_files_round_trip_and_reject_damage() {
    let ptx = ".version 8.8\n.target sm_90\n.address_size 64\n// body\n";
    let file = encode_cache_file(ptx);
    assert_eq!(decode_cache_file(&file).as_deref(), Some(ptx));

    // Truncated.
    assert_eq!(decode_cache_file(&file[..file.len() - 1]), None);
    // One byte of the body changed.
    let mut flipped = file.clone();
    let last = flipped.len() - 2;
    flipped[last] ^= 0x20;
    assert_eq!(decode_cache_file(&flipped), None);
    // Extended.
    let mut longer = file.clone();
    longer.push(b'x');
    assert_eq!(decode_cache_file(&longer), None);
    // Not ours, empty, no header line, a NUL in the body.
    assert_eq!(decode_cache_file(ptx.as_bytes()), None);
    assert_eq!(decode_cache_file(b""), None);
    assert_eq!(decode_cache_file(b"\x00\xff"), None);
    let nul = encode_cache_file("a\0b");
    assert_eq!(decode_cache_file(&nul), None);
}

/// Writing a cache file leaves it unreadable, or leaves a temporary file behind.
#[test]
fn cache_file_write_is_atomic_and_readable() {
    let dir = std::env::temp_dir().join(format!("ms-kcache-test-{}", std::process::id()));
    let path = dir.join("nested").join(cache_file_name(1, 9, 0));
    write_cache_file(&path, "ptx text\n").expect("write");
    let bytes = std::fs::read(&path).expect("read");
    assert_eq!(decode_cache_file(&bytes).as_deref(), Some("ptx text\n"));
    let names: Vec<_> = std::fs::read_dir(path.parent().expect("parent"))
        .expect("list")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    // A directory where the file should be: an error, not a panic.
    let blocked = dir.join("blocked");
    std::fs::create_dir_all(blocked.join(cache_file_name(2, 9, 0))).expect("mkdir");
    assert!(write_cache_file(&blocked.join(cache_file_name(2, 9, 0)), "x").is_err());
    std::fs::remove_dir_all(&dir).expect("cleanup");
}

/// The cache directory is not chosen as documented.
#[test]
fn disk_dir_resolution_order() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| OsString::from(v))
        }
    };
    const ALL: &[(&str, &str)] = &[
        (CACHE_DIR_ENV, "/explicit"),
        ("XDG_CACHE_HOME", "/xdg"),
        ("HOME", "/home/u"),
    ];
    assert_eq!(disk_dir_from(env(ALL)), Some(PathBuf::from("/explicit")));
    assert_eq!(
        disk_dir_from(env(&[(CACHE_DIR_ENV, ""), ("HOME", "/h")])),
        None
    );
    assert_eq!(
        disk_dir_from(env(&[("XDG_CACHE_HOME", "/xdg"), ("HOME", "/h")])),
        Some(PathBuf::from("/xdg/modelshare/kernels"))
    );
    assert_eq!(
        disk_dir_from(env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")])),
        Some(PathBuf::from("/h/.cache/modelshare/kernels"))
    );
    assert_eq!(disk_dir_from(env(&[])), None);
}

/// A kernel source no longer compiles under NVRTC (skipped where NVRTC is not installed).
#[test]
fn sources_compile_with_nvrtc_when_present() {
    if nvrtc_available().is_err() {
        eprintln!("skipped: NVRTC not found");
        return;
    }
    for source in [GEMV_SOURCE, CHECKSUM_SOURCE, ENCODER_SOURCE] {
        let ptx = compile_ptx(&source, &compile_options(9, 0))
            .unwrap_or_else(|e| panic!("{}: {e}", source.name));
        assert!(ptx.contains(".target sm_90"), "{}", source.name);
    }
    for name in [
        "ms_gemv_f32_warp",
        "ms_gemv_f16_warp",
        "ms_gemv_bf16_warp",
        "ms_gemv_f32_block",
        "ms_gemv_f16_block",
        "ms_gemv_bf16_block",
    ] {
        assert!(GEMV_SOURCE.code.contains(name), "{name}");
    }
    // The fused attention (tensor cores) is built for sm_80 and newer only.
    let ptx = compile_ptx(&ENCODER_SOURCE, &compile_options(8, 0)).expect("encoder.cu");
    for name in crate::encoder::ATTENTION
        .iter()
        .chain(&crate::encoder::ATTENTION_PACKED)
    {
        assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
    }
    // Older architectures too (sm_75 is the oldest CUDA 13's NVRTC takes): the other encoder
    // kernels use nothing newer.
    let ptx = compile_ptx(&ENCODER_SOURCE, &compile_options(7, 5)).expect("encoder.cu");
    for name in crate::encoder::kernel_names() {
        assert!(ptx.contains(&format!(".entry {name}(")), "{name}");
    }
    assert!(!ptx.contains("mma.sync"), "no tensor-core code for sm_75");
    let broken = KernelSource {
        name: "broken.cu",
        code: "extern \"C\" __global__ void k() { undeclared(); }",
    };
    match compile_ptx(&broken, &compile_options(9, 0)) {
        Err(KernelError::Nvrtc { kernel, log }) => {
            assert_eq!(kernel, "broken.cu");
            assert!(log.contains("undeclared"), "{log}");
        }
        other => panic!("expected an nvrtc error, got {other:?}"),
    }
}
