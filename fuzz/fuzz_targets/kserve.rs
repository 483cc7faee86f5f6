//! One KServe v2 REST request (4 bytes of `Inference-Header-Content-Length`, then the body)
//! through `http::oip::parse_inputs` and `front::oip::to_items`; see `request_checks.rs`.
#![no_main]

// Each target runs one of the checks.
#[allow(dead_code)]
#[path = "../request_checks.rs"]
mod request_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    request_checks::kserve(data);
});
