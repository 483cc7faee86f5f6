//! Replays the seeds of the fuzzers of the weight-file parsers and of the inference doors'
//! request parsers (`fuzz/seeds/`), the corpus they grew (`fuzz/corpus/`) and every input a
//! fuzzer ever failed on (`fuzz/regressions/`) through the same checks the fuzz targets run
//! (`fuzz/checks.rs`, `fuzz/request_checks.rs`). The fuzzers themselves need nightly and hours;
//! this keeps what they found from coming back. See `fuzz/README.md`.

#[path = "../../fuzz/checks.rs"]
mod checks;
#[path = "../../fuzz/request_checks.rs"]
mod request_checks;

use std::path::{Path, PathBuf};

fn inputs(kind: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files = Vec::new();
    for dir in ["seeds", "corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(kind)) else {
            continue;
        };
        files.extend(entries.map(|e| e.expect("reading the corpus").path()));
    }
    files.sort();
    files
}

fn replay(kind: &str, check: fn(&[u8])) {
    let files = inputs(kind);
    assert!(
        files.len() >= 10,
        "the {kind} corpus is missing ({} files)",
        files.len()
    );
    for path in &files {
        let data = std::fs::read(path).expect("reading a corpus file");
        let caught = std::panic::catch_unwind(|| check(&data));
        assert!(caught.is_ok(), "{} fails the {kind} checks", path.display());
    }
}

/// The safetensors header parser still holds on every kept input.
#[test]
fn header_corpus_replays() {
    replay("header", checks::header);
}

/// The shard index parser still holds on every kept input.
#[test]
fn index_corpus_replays() {
    replay("index", checks::index);
}

/// The generating doors' body parsers (OpenAI completions and chat, KServe generate) still
/// hold on every kept input.
#[test]
fn generate_corpus_replays() {
    replay("generate", |data| {
        request_checks::generate(data);
    });
}

/// The OpenAI door's `/v1/embeddings` body parser still holds on every kept input.
#[test]
fn openai_corpus_replays() {
    replay("openai", |data| {
        request_checks::openai(data);
    });
}

/// The KServe v2 REST door's parser (JSON and the binary extension) and its split into items
/// still hold on every kept input.
#[test]
fn kserve_corpus_replays() {
    replay("kserve", |data| {
        request_checks::kserve(data);
    });
}

/// The OIP gRPC door's `ModelInferRequest` reading and its split into items still hold on every
/// kept input.
#[test]
fn oip_grpc_corpus_replays() {
    replay("oip_grpc", |data| {
        request_checks::oip_grpc(data);
    });
}

/// The request checks are not vacuous: the well-formed seeds of each door pass its parser and
/// the split into items, so their checks of what is accepted run.
#[test]
fn well_formed_request_seeds_are_accepted() {
    let seeds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds");
    type Check = fn(&[u8]) -> bool;
    let cases: [(&str, Check, &[&str]); 3] = [
        (
            "openai",
            request_checks::openai,
            &[
                "string",
                "strings",
                "tokens",
                "token_lists",
                "dimensions",
                "nulls",
                "extra_keys",
                "most",
                "escapes",
            ],
        ),
        (
            "kserve",
            request_checks::kserve,
            &[
                "fp32_nested",
                "every_datatype",
                "texts",
                "texts_n1",
                "bytes_pairs",
                "binary_one",
                "binary_two",
                "binary_bytes",
                "binary_and_json",
                "zero_rows_of_zero",
                "no_header",
            ],
        ),
        (
            "oip_grpc",
            request_checks::oip_grpc,
            &[
                "raw_fp32",
                "raw_two",
                "typed_every",
                "texts",
                "texts_raw_n1",
                "bytes_pairs_raw",
                "zero_rows_of_zero",
                "input_params",
            ],
        ),
    ];
    for (kind, check, names) in cases {
        for name in names {
            let data = std::fs::read(seeds.join(kind).join(name)).expect("reading a seed");
            assert!(check(&data), "{kind}/{name} is refused");
        }
    }
}
