//! Unload, leases, draining, shutdown and restart, by subject in the submodules; here the
//! small model they load.

use safetensors::Dtype;

use crate::common::{self, t};

mod adopt;
mod leases;
mod limits;
mod options;
mod startup;

fn write_small(root: &std::path::Path, dir: &str, seed: u64) {
    common::write_safetensors(
        &root.join(dir).join("model.safetensors"),
        &[
            t("w", Dtype::F32, &[64, 64], seed),
            t("b", Dtype::F16, &[64], seed + 1),
        ],
    );
}
