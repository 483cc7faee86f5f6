//! Worker SDK of modelshare: attach to model weights resident in a modelshare server and read
//! them as tensors, without copying them.
//!
//! # Layout
//! - [`client`]: [`Client`], a connection to the server that opens sessions.
//! - [`credentials`]: the bearer token ([`Token`], literal or a file read at every connection)
//!   and TLS settings ([`TlsOptions`]), gathered in [`ConnectOptions`] (also from
//!   `MODELSHARE_TOKEN`, `MODELSHARE_TOKEN_FILE`, `MODELSHARE_TLS_*`).
//! - [`discover`](mod@discover): the one rule that finds the server when no address is given
//!   ([`discover()`]: the flag, `MODELSHARE_SERVER`, this user's socket, the container socket,
//!   `127.0.0.1:50051`), shared by the CLI and the workers.
//! - [`connect`]: a gRPC channel to the server, over TCP (`http://host:port`), TLS
//!   (`https://host:port`) or a Unix socket (`unix:/path/to/socket`); [`connect::authed`] adds
//!   the token to every call.
//! - [`session`]: [`Session`], a worker's connection: hello, background heartbeats, model
//!   events; it reconnects and re-attaches after a server restart; ending it (drop, or the
//!   process dying) releases everything it held.
//! - [`model`]: [`Model`], a lease on one version: its manifest, metadata, tensors and the
//!   [`Mapping`] of its arena.
//! - [`tensor`]: [`Tensor`], a read-only view of one tensor inside the shared arena, as bytes or
//!   as a typed slice (`&[f32]`, `&[half::bf16]`, ...), or in device memory ([`DeviceView`]).
//! - [`serve`]: serving requests: [`Session::serve`] offers a [`Model`] over
//!   `WorkerService.Serve` and runs a [`Handler`] on the batches the server sends (typed
//!   [`serve::Batch`] in, one [`serve::Outcome`] per item out), by credit, with heartbeats,
//!   cancels and drains, offering again after a reconnection. Its `item` and `output`
//!   submodules convert between the wire and the typed batch; `stream` runs one stream.
//! - `link` (private): what a session shares with its models: the current connection (session
//!   id and client) and the session's life (it closes when the last session handle or model
//!   goes).
//! - `import` (private): the attach reply's arena handle made into a [`Mapping`]
//!   ([`Mapping::import`] on a blocking thread): the only code that knows handle kinds.
//! - [`error`]: the error type, [`WorkerError`].
//!
//! Modules depend downwards only: `serve` → `session` (and `model`, `tensor`'s [`Element`]);
//! `client` → `session` → `model` → {`tensor`, `link`, `import`}; `link` → `connect` →
//! `credentials`; everything → `error` → `discover` (a leaf). An attach goes
//! `Session::attach` → `Model::attach` (the Attach call on the current link, then `import`)
//! → `Model::tensor` → [`Tensor::bytes`] / [`Tensor::device_ptr`]. After a reconnection the
//! session's supervisor re-attaches every `Model` still alive; tensors taken before keep the
//! old mapping alive. A request goes `Session::serve` → `serve::stream` (offer, then one task
//! per batch) → [`Handler::handle`] → one `BatchResult` per batch.
//!
//! # Example
//! ```no_run
//! # async fn run() -> Result<(), modelshare_worker::WorkerError> {
//! let session = modelshare_worker::Session::open("unix:/run/modelshare/grpc.sock", "my-worker").await?;
//! let model = session.attach("tiny-llama").await?;
//! let wq = model.tensor("layers.0.attn.wq")?;
//! let values: &[half::f16] = wq.as_slice()?;
//! println!("{} {:?}: {} values, checksum ok: {}", wq.name(), wq.shape(), values.len(), wq.verify());
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod attaching;
pub mod client;
pub mod connect;
pub mod credentials;
pub mod discover;
pub mod error;
mod import;
mod link;
pub mod model;
mod offer;
pub mod serve;
pub mod session;
pub mod tensor;

pub use attaching::Attaching;
pub use client::Client;
pub use connect::AuthChannel;
pub use credentials::{
    BearerInterceptor, ConnectOptions, TlsOptions, Token, TokenArg, TokenSource,
};
pub use discover::{DiscoverError, ServerAddress, discover};
pub use error::{WorkerError, report};
pub use model::Model;
pub use modelshare_device::{Mapping, Reservation};
pub use prost::bytes::Bytes;
pub use serve::{Handler, ServeEnd, ServeOptions};
pub use session::{Session, SessionEvent, SessionOptions};
pub use tensor::{DeviceView, Element, Tensor};
pub use tokio_util::sync::CancellationToken;
