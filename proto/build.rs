//! Compiles `modelshare/v1/*.proto` and `inference/*.proto` with protox (a pure-Rust protobuf compiler, so no `protoc`
//! is needed) and generates the tonic code into `OUT_DIR`, with the file descriptor set that
//! the server's reflection service serves.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "modelshare/v1/common.proto",
    "modelshare/v1/admin.proto",
    "modelshare/v1/serving.proto",
    "modelshare/v1/worker.proto",
    "inference/model_repository.proto",
    "inference/grpc_predict_v2.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }
    let fds = protox::compile(PROTOS, ["."])?;
    std::fs::write(
        out_dir.join("modelshare_descriptor.bin"),
        prost::Message::encode_to_vec(&fds),
    )?;
    tonic_prost_build::configure()
        // Payloads as `Bytes`, so that the server can keep an item's input for a requeue and
        // slice a request's raw contents into items without copying.
        .bytes(".modelshare.v1.TensorInput.data")
        .bytes(".modelshare.v1.TensorOutput.data")
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        // Decode errors are the sender's: INVALID_ARGUMENT (see src/codec.rs).
        .codec_path("crate::codec::StrictCodec")
        .build_client(cfg!(feature = "client"))
        .build_server(cfg!(feature = "server"))
        .compile_fds(fds)?;
    Ok(())
}
