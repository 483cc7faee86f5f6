//! One protobuf `ModelInferRequest` through `front::oip::grpc_inputs` and `to_items`, as the
//! gRPC `ModelInfer` reads it; see `request_checks.rs`.
#![no_main]

// Each target runs one of the checks.
#[allow(dead_code)]
#[path = "../request_checks.rs"]
mod request_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    request_checks::oip_grpc(data);
});
