//! The native module of the `modelshare` Python package, `modelshare._native`: the worker SDK
//! (`modelshare-worker`) bound with pyo3. One implementation of the protocol: every call goes
//! through the SDK; this crate only adapts it to Python.
//!
//! # Layout
//! - `runtime`: the tokio runtime the module owns (the SDK's sessions keep their heartbeats on
//!   it), `wait` (a future polled inside it on the calling thread with the GIL released,
//!   answering Ctrl-C; `wait_stoppable`: the first Ctrl-C stops it cleanly) and `OnRuntime` (SDK values dropped inside the runtime, so that a
//!   lease's release can be spawned from any thread).
//! - `errors`: the exception hierarchy (`modelshare.Error` and its subclasses) and the one
//!   mapping of `modelshare_worker::WorkerError` to it.
//! - `session`: `Session`, a worker's session (open, attach, close).
//! - `model`: `Model`, an attached version: manifest, metadata, tensors, checksums.
//! - `tensor`: `Tensor`, one tensor's view: `__array_interface__` for numpy (read-only, no
//!   copy), `__dlpack__` for torch and other DLPack consumers, a copy of its bytes.
//! - `serve`: `serve` (the SDK's serve loop on one attached model, with a Python handler, until
//!   drained or stopped) and `Stop`; `handler`: the SDK's `Handler` over a Python callable, run
//!   on threads of its own; `item`: `Item`, one request as the handler sees it; `outcome`: the
//!   handler's answers made into the SDK's outcomes, checked; `parts`: `Parts`, how a
//!   streaming handler's parts reach the serve loop.
//! - `arena`: `Arena`, a model's whole mapping as one DLPack `uint8` tensor (`Model.torch()`
//!   makes every tensor a view of it: one export, not one per tensor); `export`: the
//!   tensor's and the arena's DLPack export (`capsule`: device, the consumer's request checked,
//!   the ordering after a loading version, the capsule).
//! - `lease`: `Lease`, the SDK's `Model` behind an `Arc`: what the `Model`, `Tensor`s, numpy
//!   arrays and DLPack tensors of one attach share; the version is released when the last goes.
//! - `dlpack`: the DLPack structures and the capsule made of a tensor: the only `unsafe` of the
//!   crate (the capsule over a raw allocation, its destructor and the tensor's deleter), each
//!   block with `// SAFETY:`.
//!
//! Modules depend downwards only: `serve` → `handler` → `item`, `parts` → `outcome`; `serve` → `session`
//! → `model` → `tensor`, `arena` → `export` → `dlpack`; `model`, `tensor` and `arena` →
//! `lease`; everything → `runtime`, `errors`. The Python side (python/modelshare/) wraps these
//! classes, turns tensors into numpy arrays and torch tensors, and holds the
//! user-facing documentation.
//!
//! # Building
//! A member of the workspace, so that `cargo fmt --all` and `cargo clippy --workspace` cover it;
//! `cargo test` skips it (`test = false`: a test binary would need libpython at run time), and
//! python/tests test it through the wheel that maturin builds (`scripts/test`).
#![deny(unsafe_code)]

mod arena;
mod attaching;
#[allow(unsafe_code)]
mod dlpack;
mod errors;
mod export;
mod handler;
mod item;
mod lease;
mod model;
mod outcome;
mod parts;
mod runtime;
mod serve;
mod session;
mod tensor;
mod views;

use pyo3::prelude::*;

/// The SDK's log to standard error, as the Rust workers write it: `MODELSHARE_LOG` filters it
/// (`RUST_LOG` syntax: `info`, `modelshare_worker=debug`, ...), default `warn` (reconnections,
/// broken streams, refusals). Left alone if the process already has a subscriber.
fn log_to_stderr() {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_env("MODELSHARE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Native part of the modelshare package (the worker SDK bound with pyo3). Use the `modelshare`
/// package, which wraps it.
#[pymodule(name = "_native")]
mod native {
    use pyo3::prelude::*;

    #[pymodule_export]
    use crate::arena::Arena;
    #[pymodule_export]
    use crate::attaching::{Attaching, ReservedArena};
    #[pymodule_export]
    use crate::errors::{
        ChecksumError, ConnectError, CredentialsError, DeviceError, DtypeError, Error, NotFound,
        PermissionDenied, ProtocolError, SessionEnded, Timeout, Unauthenticated, Unavailable,
    };
    #[pymodule_export]
    use crate::item::Item;
    #[pymodule_export]
    use crate::model::Model;
    #[pymodule_export]
    use crate::serve::{Stop, serve};
    #[pymodule_export]
    use crate::session::Session;
    #[pymodule_export]
    use crate::tensor::Tensor;

    #[pymodule_init]
    fn init(m: &Bound<'_, PyModule>) -> PyResult<()> {
        crate::log_to_stderr();
        m.add("__version__", env!("CARGO_PKG_VERSION"))?;
        m.add("PROTOCOL_VERSION", modelshare_proto::PROTOCOL_VERSION)?;
        // Every exception has a `code`: the server's status code's name, else None.
        m.getattr("Error")?.setattr("code", m.py().None())?;
        Ok(())
    }
}
