//! One body of a generating door (OpenAI completions or chat, KServe generate; the first byte
//! picks which) through its parser; see `request_checks.rs`.
#![no_main]

// Each target runs one of the checks.
#[allow(dead_code)]
#[path = "../request_checks.rs"]
mod request_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    request_checks::generate(data);
});
