//! Replays the seeds of the weight-file parsers' fuzzers (`fuzz/seeds/`), the corpus they grew
//! (`fuzz/corpus/`) and every input a fuzzer ever failed on (`fuzz/regressions/`) through the same checks the
//! fuzz targets run (`fuzz/checks.rs`). The fuzzers themselves need nightly and hours; this
//! keeps what they found from coming back. See `fuzz/README.md`.

#[path = "../../fuzz/checks.rs"]
mod checks;

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

#[test]
fn header_corpus_replays() {
    replay("header", checks::header);
}

#[test]
fn index_corpus_replays() {
    replay("index", checks::index);
}
