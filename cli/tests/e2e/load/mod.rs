//! Loading real safetensors models and reading them back the way a worker does.
//!
//! Here: the check of what a worker sees and the tensors of every dtype; the tests by subject
//! in the submodules.

use safetensors::{Dtype, SafeTensors};

use crate::common::{Server, T, t};

mod memory;
mod round_trip;
mod sharing;
mod versions;

/// Every tensor of `files` (parsed by the official crate) must equal the bytes a worker sees
/// through its read-only mapping, and match the manifest's checksum.
async fn assert_worker_sees(server: &Server, model: &str, files: &[std::path::PathBuf]) {
    let session = modelshare_worker::Session::open(&server.address, "verifier")
        .await
        .expect("session");
    let attached = session.attach(model).await.expect("attach");
    let mut seen = 0;
    for f in files {
        let bytes = std::fs::read(f).expect("read file");
        let st = SafeTensors::deserialize(&bytes).expect("official parser");
        for (name, view) in st.tensors() {
            let tensor = attached.tensor(&name).expect("tensor in manifest");
            assert_eq!(tensor.bytes(), view.data(), "bytes of '{name}' differ");
            let shape: Vec<u64> = view.shape().iter().map(|d| *d as u64).collect();
            assert_eq!(tensor.shape(), shape.as_slice(), "shape of '{name}'");
            assert!(tensor.verify(), "checksum of '{name}' does not match");
            assert_eq!(tensor.offset() % 256, 0, "offset of '{name}' not aligned");
            seen += 1;
        }
    }
    assert_eq!(
        seen,
        attached.manifest().tensors.len(),
        "manifest has extra tensors"
    );
    attached.release().await.expect("release");
}

fn all_dtypes() -> Vec<T> {
    vec![
        t("embed.weight", Dtype::F32, &[97, 33], 1),
        t("layers.0.wq", Dtype::F16, &[64, 65], 2),
        t("layers.0.wk", Dtype::BF16, &[31, 64], 3),
        t("position_ids", Dtype::I64, &[1, 77], 4),
        t("tokens", Dtype::U8, &[1001], 5),
        t("mask", Dtype::BOOL, &[3, 5], 6),
        t("counts", Dtype::I32, &[7], 7),
        t("double", Dtype::F64, &[2, 2], 8),
        t("scalar", Dtype::F32, &[], 9),
        t("empty", Dtype::F32, &[0, 4], 10),
    ]
}
