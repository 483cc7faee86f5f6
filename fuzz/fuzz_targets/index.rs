//! One `model.safetensors.index.json` through `parse_index`; see `checks.rs`.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::index(data));
