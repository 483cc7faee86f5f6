//! [`Handler`]: what runs a batch; implemented for a type with an `async fn handle`, or by
//! any `Fn(Batch) -> impl Future<Output = Vec<Outcome>>`.

use std::future::Future;

use super::item::Batch;
use super::output::Outcome;

/// Runs batches. `handle` may be called up to
/// [`ServeOptions::credits`](super::ServeOptions::credits) times at once, each
/// call on its own task.
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
    fn handle(&self, batch: Batch) -> impl Future<Output = Vec<Outcome>> + Send;
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
