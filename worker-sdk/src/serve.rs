//! Serving requests: a worker pulls batches of items over `WorkerService.Serve` and answers
//! them with a [`Handler`].
//!
//! [`Session::serve`] offers one attached [`Model`] (its current version) and runs the stream
//! by the rules of `worker.proto`: at most `credits` handler calls at once, exactly one result
//! per batch, heartbeats while idle, and a drain (by the server, or by the worker through
//! [`ServeOptions::stop`]) that answers what is held before closing. When the stream breaks
//! while the session lives (the server restarted), it offers again, with backoff, once the
//! session's supervisor has re-attached the model on its new connection.
//!
//! # Layout
//! - here: [`Session::serve`] (wait for a link on which the model is attached, offer, run the
//!   stream, offer again after a break), [`ServeOptions`], [`ServeEnd`].
//! - `failure`: [`ItemFailure`], why one item failed.
//! - `item`: the typed work ([`Batch`], [`Item`], [`Input`], [`InputTensor`],
//!   [`Parameter`]; [`Accepts`]), converted from the wire and checked.
//! - `output`: the answers ([`Output`], [`OutputTensor`], [`Outcome`]) and their wire form.
//! - `sink`: [`PartSink`], how a streaming handler sends an item's parts within its window.
//! - `handler`: the [`Handler`] trait.
//! - `stream`: one stream, from the offer to its end (credits, cancels, heartbeats, drain).
//! - [`supervise`]: a worker's whole life ([`serve_latest`]: session, attach, serve, attach
//!   the latest version again after a drain) and [`stop_on_signals`].
//!
//! Each depends only on those above it; this module uses them all and re-exports the
//! public types.

mod failure;
mod handler;
mod item;
mod output;
mod sink;
mod stream;
pub mod supervise;

use std::sync::Arc;
use std::time::Duration;

use modelshare_proto::v1 as pb;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

pub use failure::ItemFailure;
pub use handler::{Handler, handle_alone};
pub use item::{
    Accepts, Batch, Input, InputTensor, Item, Parameter, element_size, oip_datatype, tensor_spec,
};
pub use output::{Outcome, Output, OutputTensor};
pub use sink::{PartError, PartSink};
pub use supervise::{Target, run_process, serve_latest, stop_on_signals};

use crate::link::{Link, SessionCore};
use crate::{Model, Session, SessionEvent, WorkerError};

/// The limits of an offer, as the server enforces them (from the contract, `modelshare_proto`).
pub use modelshare_proto::limits::{MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_CREDITS};
/// The heartbeat interval when neither the options nor the session's welcome give one.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// First delay before offering again after a broken stream; doubles up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// Longest delay between two offers.
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// How often to look whether the model is attached on the session's new connection.
const REATTACH_POLL: Duration = Duration::from_millis(20);

/// How a worker serves a model.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// How many batches the worker takes at once (handler calls at once). At most
    /// [`MAX_CREDITS`]. Default 1.
    pub credits: u32,
    /// Most items in one batch. At most [`MAX_BATCH_ITEMS`]. Default 32.
    pub max_batch_items: u32,
    /// Most input bytes (text bytes plus tensor data bytes) in one batch, at most
    /// [`MAX_BATCH_BYTES`] (a batch travels in one message); 0: that most. Default 0.
    pub max_batch_bytes: u64,
    /// The input kinds taken. Default both.
    pub accepts: Accepts,
    /// A streaming worker: how many items it answers at once, each through
    /// [`Handler::handle_stream`] with its parts before the final output (`credits` and
    /// `max_batch_items` are then ignored: each item comes alone). At most [`MAX_CREDITS`].
    /// Default 0: a worker that answers batches through [`Handler::handle`].
    pub streams: u32,
    /// The model's inputs as this worker runs it, for the OIP's ModelMetadata (see
    /// [`tensor_spec`]).
    pub inputs: Vec<pb::TensorSpec>,
    /// The model's outputs, likewise.
    pub outputs: Vec<pb::TensorSpec>,
    /// How often to send a heartbeat when nothing else was sent. Default: the session's
    /// welcome interval, else 1 s.
    pub heartbeat_interval: Option<Duration>,
    /// Cancel to stop serving from the worker's side: no new batch is started, the batches
    /// held are answered, the stream is closed and [`Session::serve`] returns
    /// [`ServeEnd::Stopped`]. Batches the server sends meanwhile are left unanswered: the
    /// server requeues them when the stream closes.
    pub stop: CancellationToken,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self {
            credits: 1,
            max_batch_items: 32,
            max_batch_bytes: 0,
            accepts: Accepts::default(),
            streams: 0,
            inputs: Vec::new(),
            outputs: Vec::new(),
            heartbeat_interval: None,
            stop: CancellationToken::new(),
        }
    }
}

impl ServeOptions {
    /// Refuses what the server would refuse.
    fn check(&self) -> Result<(), WorkerError> {
        let bad = |reason: &str| Err(WorkerError::BadServeOptions(reason.to_owned()));
        let over = |what: &str, value: u64, most: u64| {
            Err(WorkerError::BadServeOptions(format!(
                "{what} {value} is over the server's limit, {most}"
            )))
        };
        if self.credits == 0 {
            return bad("credits must be at least 1");
        }
        if self.max_batch_items == 0 {
            return bad("max_batch_items must be at least 1");
        }
        if self.credits > MAX_CREDITS {
            return over("credits", self.credits.into(), MAX_CREDITS.into());
        }
        if self.max_batch_items > MAX_BATCH_ITEMS {
            let items = self.max_batch_items.into();
            return over("max_batch_items", items, MAX_BATCH_ITEMS.into());
        }
        if self.streams > MAX_CREDITS {
            return over("streams", self.streams.into(), MAX_CREDITS.into());
        }
        if self.max_batch_bytes > MAX_BATCH_BYTES {
            let bytes = self.max_batch_bytes;
            return over(
                "max_batch_bytes (a batch travels in one message)",
                bytes,
                MAX_BATCH_BYTES,
            );
        }
        if !self.accepts.text && !self.accepts.tensor {
            return bad("accepts must take text, tensors or both");
        }
        if self.heartbeat_interval == Some(Duration::ZERO) {
            return bad("heartbeat_interval must not be 0");
        }
        Ok(())
    }

    /// The offer of `model` on the session `session_id`.
    fn offer(&self, session_id: &str, model: &Model) -> pb::ServeOffer {
        pb::ServeOffer {
            session_id: session_id.to_owned(),
            model: model.name().to_owned(),
            version: model.version(),
            credits: self.credits,
            max_batch_items: self.max_batch_items,
            max_batch_bytes: self.max_batch_bytes,
            accepts: self.accepts.names(),
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            streams: self.streams,
        }
    }

    fn limits(&self) -> stream::Limits {
        let streaming = self.streams > 0;
        let (credits, max_items) = if streaming {
            (self.streams, 1)
        } else {
            (self.credits, self.max_batch_items)
        };
        stream::Limits {
            credits: usize::try_from(credits).unwrap_or(usize::MAX),
            max_items: usize::try_from(max_items).unwrap_or(usize::MAX),
            streaming,
            max_bytes: self.max_batch_bytes,
            accepts: self.accepts,
        }
    }
}

/// How serving ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServeEnd {
    /// The server drained the stream (the version is draining, or the server is shutting
    /// down); every batch held was answered.
    Drained {
        /// The server's reason.
        reason: String,
    },
    /// [`ServeOptions::stop`] was cancelled; every batch held was answered.
    Stopped,
}

impl Session {
    /// Serves `model` (its current version) with `handler` until the server drains the
    /// stream or `options.stop` is cancelled.
    ///
    /// A broken stream (the server restarted, the connection dropped) is offered again with
    /// backoff once the session has reconnected and re-attached the model. Errors: options
    /// the server would refuse; a model of another session; a refusal retrying cannot fix
    /// (INVALID_ARGUMENT, PERMISSION_DENIED, UNIMPLEMENTED, NOT_FOUND on a live session,
    /// UNAUTHENTICATED once the session has ended); the model gone after a reconnection; the
    /// session ended. Every other refusal or break (UNAVAILABLE, FAILED_PRECONDITION,
    /// RESOURCE_EXHAUSTED, a lost connection, ...) is retried with backoff, up to 2 s apart.
    pub async fn serve<H: Handler>(
        &self,
        model: &Model,
        options: ServeOptions,
        handler: H,
    ) -> Result<ServeEnd, WorkerError> {
        options.check()?;
        let core = self.core().clone();
        if !model.belongs_to(&core) {
            return Err(WorkerError::WrongSession {
                model: model.name().to_owned(),
            });
        }
        let mut events = self.subscribe();
        let handler = Arc::new(handler);
        let stop = &options.stop;
        let mut backoff = MIN_BACKOFF;
        let mut refused: Option<tonic::Status> = None;
        loop {
            let link = match ready_link(&core, model, stop, &mut events).await {
                Ready::Link(link) => *link,
                Ready::Stopped => return Ok(ServeEnd::Stopped),
                Ready::Ended => {
                    return Err(refused.map_or(WorkerError::SessionEnded, rpc_error));
                }
                Ready::Gone(reason) => {
                    return Err(WorkerError::ModelGone {
                        model: model.name().to_owned(),
                        reason,
                    });
                }
            };
            let heartbeat = options
                .heartbeat_interval
                .or(link.heartbeat)
                .unwrap_or(DEFAULT_HEARTBEAT);
            let offer = options.offer(&link.id, model);
            let end = stream::run(
                link.clone(),
                offer,
                options.limits(),
                heartbeat,
                handler.clone(),
                stop,
            )
            .await?;
            let (accepted, status) = match end {
                stream::StreamEnd::Drained(reason) => return Ok(ServeEnd::Drained { reason }),
                stream::StreamEnd::Stopped => return Ok(ServeEnd::Stopped),
                stream::StreamEnd::Broken { accepted, status } => (accepted, status),
            };
            if accepted {
                backoff = MIN_BACKOFF;
            }
            if let Some(status) = &status {
                // A server without Serve (UNIMPLEMENTED) will not grow one by being asked again.
                if matches!(
                    status.code(),
                    tonic::Code::InvalidArgument
                        | tonic::Code::PermissionDenied
                        | tonic::Code::Unimplemented
                ) {
                    return Err(rpc_error(status.clone()));
                }
                if accepted {
                    warn!(%status, "the serve stream broke; offering again");
                } else {
                    debug!(%status, "offer refused; retrying");
                }
            } else {
                debug!(accepted, "the serve stream ended; offering again");
            }
            tokio::select! {
                () = tokio::time::sleep(backoff) => {}
                () = stop.cancelled() => return Ok(ServeEnd::Stopped),
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match status {
                // On the session still current, NOT_FOUND is about the model or the lease:
                // offering again cannot help. After a reconnection it was the old session's.
                Some(status)
                    if status.code() == tonic::Code::NotFound
                        && core.link().is_ok_and(|l| l.id == link.id) =>
                {
                    return Err(rpc_error(status));
                }
                Some(status) if status.code() == tonic::Code::Unauthenticated => {
                    refused = Some(status);
                }
                _ => {}
            }
        }
    }
}

fn rpc_error(status: tonic::Status) -> WorkerError {
    WorkerError::Rpc {
        call: "Serve",
        status,
    }
}

/// What waiting for a link to offer on gave.
enum Ready {
    /// The session's current link, on which the model holds its lease.
    Link(Box<Link>),
    /// The worker stopped serving.
    Stopped,
    /// The session ended: no link will come.
    Ended,
    /// The model could not be re-attached after a reconnection (the reason).
    Gone(String),
}

/// Waits until the session has a link and the model is attached on it (after a
/// reconnection, the supervisor re-attaches it).
async fn ready_link(
    core: &SessionCore,
    model: &Model,
    stop: &CancellationToken,
    events: &mut broadcast::Receiver<SessionEvent>,
) -> Ready {
    let mut listening = true;
    loop {
        if stop.is_cancelled() {
            return Ready::Stopped;
        }
        if let Ok(link) = core.link()
            && model.lease_session() == link.id
        {
            return Ready::Link(Box::new(link));
        }
        if core.ended().is_cancelled() {
            return Ready::Ended;
        }
        tokio::select! {
            () = tokio::time::sleep(REATTACH_POLL) => {}
            () = stop.cancelled() => return Ready::Stopped,
            () = core.ended().cancelled() => {}
            event = events.recv(), if listening => match event {
                Ok(SessionEvent::ModelGone { model: name, reason }) if name == model.name() => {
                    return Ready::Gone(reason);
                }
                Err(broadcast::error::RecvError::Closed) => listening = false,
                _ => {}
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Options the server refuses would be sent (the stream then fails at the offer, after
    /// the worker has started), or options it takes would be refused here: the limits are the
    /// contract's, the same figures the server checks.
    #[test]
    fn options_are_checked_against_the_servers_limits() {
        let at_limits = ServeOptions {
            credits: MAX_CREDITS,
            max_batch_items: MAX_BATCH_ITEMS,
            max_batch_bytes: MAX_BATCH_BYTES,
            ..ServeOptions::default()
        };
        assert!(at_limits.check().is_ok());
        let over = [
            ServeOptions {
                credits: MAX_CREDITS + 1,
                ..at_limits.clone()
            },
            ServeOptions {
                max_batch_items: MAX_BATCH_ITEMS + 1,
                ..at_limits.clone()
            },
            // The message bound (128 MiB) less the batch's envelope: 120 MiB.
            ServeOptions {
                max_batch_bytes: MAX_BATCH_BYTES + 1,
                ..at_limits.clone()
            },
        ];
        for options in over {
            let e = options.check().unwrap_err();
            assert!(e.to_string().contains("over the server's limit"), "{e}");
        }
    }
}
