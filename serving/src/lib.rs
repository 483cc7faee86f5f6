//! The request path: requests from the front doors (KServe v2 / OIP over gRPC and REST, OpenAI
//! over REST) are queued, batched and handed to the workers that serve their model over
//! `WorkerService.Serve`; the workers' results come back to the callers.
//!
//! # Layout
//! - [`scheduler`]: [`Scheduler`], pure and synchronous (no I/O, no clock: every call that
//!   depends on time takes `now`): admission, per-tenant fair queues, batching, dispatch to
//!   workers by credit, deadlines, requeue-once, and the reassembly of results. Its parts:
//!   `ids` (a leaf), `request` (outstanding requests and their outcomes), `queue` (one model's
//!   queue, a sub-queue per tenant drained by deficit round robin), `batch` (workers, batches
//!   and when a batch closes).
//! - [`engine`]: [`Engine`], the handle the front doors and the Serve streams hold. It owns
//!   nothing but a channel to the driver: [`Engine::infer`] submits a request and waits for its
//!   answer (dropping the future cancels the request), [`Engine::open_worker`] registers a
//!   Serve stream.
//! - `types`: the values passed around (configuration, request and answer, a worker's offer,
//!   the snapshot), re-exported by [`engine`].
//! - `driver`: the one task that owns the [`Scheduler`], the items' payloads, the callers
//!   waiting and the workers' outbound streams, fed by the engine's channel and woken by its
//!   next deadline. No lock: every change to the request path's state is a message to it.
//! - [`error`]: [`InferError`], why a request got no answer, and its [`Kind`] ([`kind`]: the
//!   canonical error kinds, transport-free; each door maps a kind to its status once).
//!
//! No transport: nothing here names tonic, axum, http or hyper (`scripts/check-planes`).
//! Imports go one way: the server's doors and Serve streams → `engine` → `driver` → `types` →
//! `scheduler`.

mod batch;
mod driver;
pub mod engine;
#[cfg(test)]
mod engine_tests;
pub mod error;
mod ids;
pub mod kind;
mod queue;
mod rate;
mod request;
pub mod scheduler;
mod stats;
#[cfg(test)]
mod tests;
mod types;

pub use self::engine::{
    Engine, EngineConfig, GpuSharing, InferRequest, InferResponse, MAILBOX, Part, PartStream,
    STREAM_IDLE, STREAM_LONGEST, STREAM_WINDOW, StreamError, StreamLimits, WorkerStream,
};
pub use self::error::InferError;
pub use self::kind::Kind;
pub use self::scheduler::{
    Admission, Batch, BatchId, BatchItem, Completed, Dispatch, InFlightItem, ItemError, ItemId,
    Limits, NewRequest, Outcome, RequestId, Scheduler, Serves, Tenant, WorkerId, WorkerSpec,
};
pub use self::stats::{Tally, VersionStats};
