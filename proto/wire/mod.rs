//! The wire check: the contract now ([`modelshare_proto::FILE_DESCRIPTOR_SET`]) against the
//! committed baseline, `proto/wire-baseline.txt`.
//!
//! Workers outlive server restarts and upgrades, so a change of the `.proto` files that a peer
//! built from the baseline would misread must not land. Shared by `examples/wire_check.rs` (the
//! command that reports and updates the baseline) and `tests/wire_compat.rs` (the test that
//! fails CI); not part of the library, so that no crate of the contract's users builds it.
//!
//! # Layout
//! - `contract`: [`Contract`], the facts of the descriptors (fields, enum values, methods,
//!   reserved numbers), and the baseline's text.
//! - `compare`: [`compare`] and its `Report`: the breaking and the compatible changes.

pub mod compare;
pub mod contract;

use std::path::PathBuf;

use prost::Message as _;
use prost_types::FileDescriptorSet;

pub use compare::compare;
pub use contract::Contract;

/// The command that rewrites the baseline from the contract now.
pub const UPDATE_COMMAND: &str = "cargo run -p modelshare-proto --example wire_check -- --update";

/// The header of the baseline's text.
pub const HEADER: &str = "\
The wire contract of modelshare (packages modelshare.v1 and inference), one fact a line,
written from modelshare_proto::FILE_DESCRIPTOR_SET: do not edit by hand. After a compatible
change of a .proto file, run
  cargo run -p modelshare-proto --example wire_check -- --update
and commit this file with the change: proto/tests/wire_compat.rs fails until then, and on any
change a peer built from this file would misread. See \"The contract's versions\" in
proto/src/lib.rs and docs/ARCHITECTURE.md.";

/// Where the baseline lives.
pub fn baseline_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("wire-baseline.txt")
}

/// The descriptors the crate was built from.
pub fn descriptors() -> FileDescriptorSet {
    FileDescriptorSet::decode(modelshare_proto::FILE_DESCRIPTOR_SET)
        .expect("the crate's own descriptor set decodes")
}

/// The contract the crate was built from.
pub fn current() -> Contract {
    Contract::from_descriptors(&descriptors())
}

/// The baseline's text for `contract`.
pub fn baseline_text(contract: &Contract) -> String {
    contract.render(HEADER)
}
