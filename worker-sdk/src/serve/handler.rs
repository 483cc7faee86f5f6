//! [`Handler`]: what runs a batch (or, for a streaming worker, one item whose answer streams);
//! implemented for a type with an `async fn handle` and/or `async fn handle_stream`, or by
//! any `Fn(Batch) -> impl Future<Output = Vec<Outcome>>`.

use std::future::Future;

use super::failure::ItemFailure;
use super::item::{Batch, Item};
use super::output::Outcome;
use super::sink::PartSink;

/// Runs batches. `handle` may be called up to
/// [`ServeOptions::credits`](super::ServeOptions::credits) times at once, each
/// call on its own task.
///
/// A streaming worker ([`ServeOptions::streams`](super::ServeOptions::streams) > 0) gets every
/// item through [`Handler::handle_stream`] instead, up to `streams` at once, and never through
/// `handle`.
///
/// ```no_run
/// use modelshare_worker::serve::{Batch, Input, ItemFailure, Outcome, Output};
///
/// struct Lengths;
///
/// impl modelshare_worker::Handler for Lengths {
///     async fn handle(&self, batch: Batch) -> Vec<Outcome> {
///         batch
///             .items
///             .iter()
///             .map(|item| match &item.input {
///                 Input::Text(s) => Ok(Output::tensor_f32("length", [1], &[s.len() as f32])),
///                 Input::Tensors(_) => Err(ItemFailure::invalid_argument("text only")),
///             })
///             .collect()
///     }
/// }
/// ```
pub trait Handler: Send + Sync + 'static {
    /// Runs `batch`: one outcome per item, in the order of `batch.items`. An item with no
    /// outcome fails with INTERNAL; an item the server cancelled meanwhile is answered
    /// CANCELLED whatever its outcome.
    /// The default fails every item with UNIMPLEMENTED (a worker that only streams).
    fn handle(&self, batch: Batch) -> impl Future<Output = Vec<Outcome>> + Send {
        let failure = ItemFailure::unimplemented("this worker answers streamed items only");
        let outcomes = batch.items.iter().map(|_| Err(failure.clone())).collect();
        std::future::ready(outcomes)
    }

    /// Runs one item of a streaming worker: sends its parts through `sink` as they are ready
    /// (each waits for room in the item's window) and returns its final output, the last
    /// part. When the caller takes the answer whole ([`PartSink::is_streamed`] false) it sends
    /// no parts and returns the whole answer. Stop when the item is cancelled
    /// ([`Item::cancelled`], or a part fails with
    /// [`PartError::Cancelled`](super::PartError::Cancelled)); the slot frees when this
    /// returns.
    ///
    /// The default runs [`Handler::handle`] on a batch of the item alone and sends no parts.
    fn handle_stream(&self, item: Item, sink: PartSink) -> impl Future<Output = Outcome> + Send {
        async move { handle_alone(self, item, &sink).await }
    }
}

/// Runs `item` through `handler`'s [`Handler::handle`] as a batch of its own, with no parts:
/// the default [`Handler::handle_stream`], and what a streaming handler does with an item it
/// does not stream.
pub async fn handle_alone<H: Handler + ?Sized>(
    handler: &H,
    item: Item,
    sink: &PartSink,
) -> Outcome {
    let batch = Batch {
        id: sink.batch_id(),
        version: sink.version(),
        items: vec![item],
    };
    handler
        .handle(batch)
        .await
        .into_iter()
        .next()
        .unwrap_or_else(|| {
            Err(ItemFailure::internal(
                "the worker's handler returned no outcome for this item",
            ))
        })
}

impl<F, Fut> Handler for F
where
    F: Fn(Batch) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<Outcome>> + Send,
{
    fn handle(&self, batch: Batch) -> impl Future<Output = Vec<Outcome>> + Send {
        self(batch)
    }
}
