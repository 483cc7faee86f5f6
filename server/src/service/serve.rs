//! `WorkerService.Serve`: a worker's stream of batches. The handler checks the offer (its
//! session, a lease on the version, the limits), registers the stream with the
//! [`modelshare_serving::Engine`], and runs a reader task that passes results on and watches the
//! stream's life: it ends the worker's service when the stream closes or breaks, when the
//! worker is silent past the heartbeat deadline, when its session ends, and tells it to drain
//! when its version starts draining.

use crate::status::OrStatus;
use std::pin::Pin;

use modelshare_proto::v1 as pb;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tokio_stream::{Stream, StreamExt};
use tonic::{Status, Streaming};
use tracing::debug;

use crate::app::App;
use modelshare_core::registry::ModelEvent;
use modelshare_core::tenants::Caller;
use modelshare_core::tenants::policy::worker_serves;
use modelshare_serving::engine::{StreamEnd, WorkerOffer};
use modelshare_serving::{WorkerId, WorkerSpec};

/// The server's side of a Serve stream.
pub type ServeStream = Pin<Box<dyn Stream<Item = Result<pb::ServeEvent, Status>> + Send>>;

/// The largest `max_batch_bytes` a worker may declare: what fits in one message.
const MAX_BATCH_BYTES: u64 = modelshare_proto::limits::MAX_BATCH_BYTES;
/// The most credits a worker may declare.
const MAX_CREDITS: u32 = modelshare_proto::limits::MAX_CREDITS;
/// The most items per batch a worker may declare.
const MAX_BATCH_ITEMS: u32 = modelshare_proto::limits::MAX_BATCH_ITEMS;

/// Opens a Serve stream for `caller`, whose first message must be an offer.
pub async fn open(
    app: &App,
    caller: Caller,
    mut inbound: Streaming<pb::ServeRequest>,
) -> Result<ServeStream, Status> {
    app.host.require_ready().or_status()?;
    if app.host.shutdown.is_cancelled() {
        return Err(Status::unavailable("the server is shutting down"));
    }
    let silence = app.config.heartbeat_interval * app.config.heartbeat_misses;
    let first = tokio::time::timeout(silence, inbound.message())
        .await
        .map_err(|_| Status::deadline_exceeded("no offer within the heartbeat deadline"))??;
    let mut offer = match first.and_then(|m| m.kind) {
        Some(pb::serve_request::Kind::Offer(offer)) => offer,
        _ => {
            return Err(Status::invalid_argument(
                "the first message of a Serve stream must be an offer",
            ));
        }
    };
    let (accepts_text, accepts_tensors) = check_offer(&offer)?;
    // The request path knows a model by the spelling it was loaded under.
    offer.model = app.host.registry.canonical(&caller, &offer.model);
    let live = app
        .hub
        .get(&offer.session_id)
        .filter(|l| modelshare_core::tenants::policy::may_use_session(l.caller().tenant(), &caller))
        .ok_or_else(|| Status::not_found(format!("session '{}' not found", offer.session_id)))?;
    let (version, owner, device) = app
        .host
        .registry
        .serve_target(&caller, &offer.session_id, &offer.model, offer.version)
        .map_err(|e| app.refuse(e))?;
    let serve_id = uuid::Uuid::new_v4().to_string();
    let streams = offer.streams;
    let spec = WorkerSpec {
        model: offer.model.clone(),
        version,
        credits: if streams > 0 { streams } else { offer.credits },
        max_items: if streams > 0 {
            1
        } else {
            offer.max_batch_items as usize
        },
        max_bytes: if offer.max_batch_bytes == 0 {
            MAX_BATCH_BYTES
        } else {
            offer.max_batch_bytes
        },
        serves: worker_serves(owner.as_deref(), &caller),
    };
    let stream = app
        .engine
        .open_worker(WorkerOffer {
            spec,
            serve_id: serve_id.clone(),
            session_id: offer.session_id.clone(),
            tenant: caller.tenant().map(str::to_owned),
            accepts_text,
            accepts_tensors,
            inputs: offer.inputs,
            outputs: offer.outputs,
            device,
        })
        .map_err(crate::status::from_infer)?;
    let id = stream.id;
    let accepted = pb::ServeEvent {
        kind: Some(pb::serve_event::Kind::Accepted(pb::ServeAccepted {
            serve_id: serve_id.clone(),
            version,
            initial_window: if streams > 0 {
                modelshare_serving::STREAM_WINDOW
            } else {
                0
            },
        })),
    };
    let app2 = app.clone();
    let model = offer.model;
    tokio::spawn(async move {
        let served = Served {
            model: &model,
            version,
            streaming: streams > 0,
        };
        let end = read(&app2, id, served, inbound, live, silence).await;
        debug!(serve = %serve_id, ?end, "serve stream ended");
        app2.engine.worker_ended(id, end).await;
    });
    let events =
        UnboundedReceiverStream::new(stream.events).map(|e| e.map_err(crate::status::from_stream));
    Ok(Box::pin(tokio_stream::once(Ok(accepted)).chain(events)))
}

/// Checks an offer's limits and input kinds; returns whether it takes text and tensors.
fn check_offer(offer: &pb::ServeOffer) -> Result<(bool, bool), Status> {
    let bad = |m: String| Err(Status::invalid_argument(m));
    if offer.model.is_empty() {
        return bad("the offer names no model".into());
    }
    if offer.streams > MAX_CREDITS {
        return bad(format!(
            "streams must be at most {MAX_CREDITS}, got {}",
            offer.streams
        ));
    }
    // A streaming worker's credits and batch size are ignored (one item a batch, `streams`
    // batches out).
    let streaming = offer.streams > 0;
    if !streaming && !(1..=MAX_CREDITS).contains(&offer.credits) {
        return bad(format!(
            "credits must be between 1 and {MAX_CREDITS}, got {}",
            offer.credits
        ));
    }
    if !streaming && !(1..=MAX_BATCH_ITEMS).contains(&offer.max_batch_items) {
        return bad(format!(
            "max_batch_items must be between 1 and {MAX_BATCH_ITEMS}, got {}",
            offer.max_batch_items
        ));
    }
    if offer.max_batch_bytes > MAX_BATCH_BYTES {
        return bad(format!(
            "max_batch_bytes must be at most {MAX_BATCH_BYTES} (a batch travels in one message), got {}",
            offer.max_batch_bytes
        ));
    }
    if offer.accepts.is_empty() {
        return bad("accepts must name at least one input kind: text, tensor".into());
    }
    let (mut text, mut tensors) = (false, false);
    for kind in &offer.accepts {
        match kind.as_str() {
            "text" => text = true,
            "tensor" => tensors = true,
            other => {
                return bad(format!(
                    "accepts names an unknown input kind '{}' (known: text, tensor)",
                    other.escape_debug()
                ));
            }
        }
    }
    Ok((text, tensors))
}

/// What a Serve stream serves, as its offer was taken.
struct Served<'a> {
    model: &'a str,
    version: u32,
    /// A streaming worker (its parts are forwarded).
    streaming: bool,
}

/// Reads a worker's messages until the stream ends; says how it ended.
async fn read(
    app: &App,
    id: WorkerId,
    served: Served<'_>,
    mut inbound: Streaming<pb::ServeRequest>,
    live: std::sync::Arc<crate::hub::Live>,
    silence: std::time::Duration,
) -> StreamEnd {
    let Served {
        model,
        version,
        streaming,
    } = served;
    let mut events = app.host.registry.subscribe();
    let mut draining = false;
    loop {
        tokio::select! {
            message = tokio::time::timeout(silence, inbound.message()) => {
                match message {
                    Err(_) => return StreamEnd::Lost,
                    Ok(Err(_)) => return StreamEnd::Lost,
                    Ok(Ok(None)) => return StreamEnd::Closed,
                    Ok(Ok(Some(m))) => match m.kind {
                        Some(pb::serve_request::Kind::Result(result)) => {
                            app.engine.worker_result(id, result).await;
                        }
                        Some(pb::serve_request::Kind::Heartbeat(_)) | None => {}
                        Some(pb::serve_request::Kind::Part(part)) if streaming => {
                            app.engine.worker_part(id, part).await;
                        }
                        Some(pb::serve_request::Kind::Part(_)) => {
                            app.engine
                                .worker_protocol_error(
                                    id,
                                    "a part from a worker that offered no streams".into(),
                                )
                                .await;
                            return StreamEnd::Lost;
                        }
                        Some(pb::serve_request::Kind::Offer(_)) => {
                            app.engine
                                .worker_protocol_error(
                                    id,
                                    "an offer may only be the first message of a Serve stream"
                                        .into(),
                                )
                                .await;
                            return StreamEnd::Lost;
                        }
                    },
                }
            }
            _ = live.ended() => return StreamEnd::Lost,
            event = events.recv(), if !draining => {
                match event {
                    Ok(ModelEvent::VersionDraining { model: m, version: v })
                        if m == model && v == version =>
                    {
                        draining = true;
                        app.engine.drain_worker(
                            id,
                            format!("version {version} of '{model}' is draining"),
                        );
                    }
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => draining = true,
                }
            }
        }
    }
}
