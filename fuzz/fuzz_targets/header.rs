//! One safetensors file, whole, through `parse_header`; see `checks.rs` for what must hold.
#![no_main]

#[path = "../checks.rs"]
mod checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| checks::header(data));
