//! The gRPC contract of modelshare.
//!
//! # Layout
//! - `modelshare/v1/common.proto`: dtypes, version states, manifests, device info.
//! - `modelshare/v1/admin.proto`: `v1::admin_service_client` / `v1::admin_service_server`,
//!   the operator API (load, unload, list, describe, stats, sessions).
//! - `modelshare/v1/worker.proto`: `v1::worker_service_client` / `v1::worker_service_server`,
//!   sessions, attach and release, and `Serve`: the stream over which a worker pulls batches of
//!   requests by credit and answers them.
//! - `modelshare/v1/serving.proto`: the messages of `Serve` (offer, batch, item, result, cancel,
//!   drain).
//! - `inference/grpc_predict_v2.proto`: `inference::grpc_inference_service_client` /
//!   `inference::grpc_inference_service_server`, the KServe v2 Open Inference Protocol
//!   (package `inference`), wire-compatible with the specification so that its clients work
//!   unchanged; `inference/model_repository.proto`: the messages of the three Triton extension
//!   RPCs the service also has (`ModelConfig`, `RepositoryIndex`, `ModelStatistics`), numbered
//!   as Triton numbers them.
//! - [`limits`]: the sizes and counts both sides enforce (message bounds, a Serve batch's
//!   bytes, items and credits).
//! - [`dtype`]: bytes per element of each [`v1::DType`], the one table.
//! - [`codes`]: the canonical status codes' names by number (`ItemResult.code`, gRPC, metrics).
//! - [`endpoint`]: where a server listens when nothing says otherwise (the per-user socket,
//!   the container socket, the TCP address of a server with tenants), for the server and the
//!   clients that look for it.
//! - [`version`]: the protocol version of a session ([`PROTOCOL_VERSION`]) and how the two
//!   sides agree on it.
//! - `codec` (with `client` or `server`): the codec of every generated service.
//!
//! The code is generated at build time into `OUT_DIR`; [`FILE_DESCRIPTOR_SET`] is the compiled
//! descriptor set, for gRPC server reflection.
//!
//! # Features
//! None by default: the messages build with prost alone, without tonic or any HTTP crate.
//! `client` adds the client stubs (the worker SDK and the CLI), `server` the server traits (the
//! server); either brings tonic and `codec`.
//!
//! # The contract's versions
//! Workers outlive server restarts and upgrades, so workers and servers of different builds
//! must keep talking. Two guards:
//! - The wire check. `wire-baseline.txt` lists every message, field (number, name, type,
//!   label, oneof), reserved number, enum value, service and method of both packages, one line
//!   each. `tests/wire_compat.rs` compares the descriptors with it and fails on a change a peer
//!   built from the baseline would misread (a field renumbered, retyped, relabelled, moved in or
//!   out of a oneof, or removed without reserving its number; a number reused; an enum value
//!   renumbered or removed; a removed message still used; a removed or reshaped method), and
//!   also on compatible changes not yet in the baseline, so that the baseline stays current.
//!   After a compatible change: `cargo run -p modelshare-proto --example wire_check --
//!   --update`, and commit the baseline with the change. The code is in `wire/` (not part of
//!   the library).
//! - The protocol version, for changes of meaning the wire cannot show: a worker says the
//!   newest it speaks in `Hello.protocol_version`, the server answers the session's in
//!   `Welcome.protocol_version`; see [`version`].
#![forbid(unsafe_code)]

#[cfg(any(feature = "client", feature = "server"))]
pub mod codec;
pub mod codes;
pub mod dtype;
pub mod endpoint;
pub mod limits;
pub mod version;

pub use version::{MIN_PROTOCOL_VERSION, PROTOCOL_VERSION};

/// Package `modelshare.v1`.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/modelshare.v1.rs"));
}

/// Package `inference`: the KServe v2 Open Inference Protocol.
#[allow(missing_docs, clippy::all, missing_debug_implementations)]
pub mod inference {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// The encoded `FileDescriptorSet` of every `.proto` file of the crate: packages
/// `modelshare.v1` and `inference`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/modelshare_descriptor.bin"));
