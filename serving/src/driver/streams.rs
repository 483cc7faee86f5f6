//! The driver's side of streamed items: a worker's parts forwarded to their caller, and the
//! caller's reading granted back to the worker as window.
//!
//! A streamed request has one item, and its caller a channel of the stream's window
//! (`EngineConfig::stream_window`) for its parts. A part goes into that channel at once; each
//! part the caller takes out comes back as `Took`, and the driver grants the worker one more
//! part (`Window`). So the worker never has more parts out than the channel holds: a part that
//! does not fit is the worker breaking the window, a protocol error. A slow caller closes its
//! own window only. A part is at most [`MAX_PART_BYTES`], so what a stream holds is bounded in
//! bytes too.

use std::time::Instant;

/// The most bytes of one part's output: a window of them is what a slow reader may hold at
/// the server (16 MiB a stream at the default window).
pub const MAX_PART_BYTES: usize = 1 << 20;

use tokio::sync::mpsc::error::TrySendError;

use super::*;

impl Driver {
    /// A part of a streamed item from worker `id`.
    pub(super) fn part(&mut self, id: WorkerId, part: pb::ItemPart) {
        let Some(conn) = self.conns.get(&id) else {
            return;
        };
        let Some(sent) = conn.batches.get(&BatchId(part.batch_id)) else {
            return self.protocol_error(id, format!("a part of unknown batch {}", part.batch_id));
        };
        let Some(&item) = sent.items.iter().find(|i| wire_id(**i) == part.item_id) else {
            return self.protocol_error(
                id,
                format!(
                    "a part of item {} not in batch {}",
                    part.item_id, part.batch_id
                ),
            );
        };
        // A part of an item that does not stream breaks the protocol before it counts as a
        // start (the item is then requeued, not interrupted).
        match self.waiters.get(&item.request).map(|w| w.parts.is_some()) {
            None => return, // answered or cancelled meanwhile: a late part is dropped
            Some(false) => {
                return self.protocol_error(
                    id,
                    format!("a part of item {}, which is not streamed", part.item_id),
                );
            }
            Some(true) => {}
        }
        if !self.sched.started(id, BatchId(part.batch_id), item) {
            return;
        }
        let Some(waiter) = self.waiters.get_mut(&item.request) else {
            return;
        };
        let Some(parts) = waiter.parts.as_ref() else {
            return;
        };
        waiter.streaming = Some((id, part.item_id));
        let output = part.output.unwrap_or_default();
        let size = prost::Message::encoded_len(&output);
        if size > MAX_PART_BYTES {
            return self.protocol_error(
                id,
                format!(
                    "a part of item {} of {size} bytes; a part is at most {MAX_PART_BYTES}",
                    part.item_id
                ),
            );
        }
        waiter.parts_sent = waiter.parts_sent.saturating_add(1);
        match parts.try_send(Part {
            seq: part.seq,
            output,
        }) {
            Ok(()) => {
                let now = Instant::now();
                let (family, since) = match waiter.last_part.replace(now) {
                    None => (&self.metrics.stream_first_part_seconds, waiter.arrival),
                    Some(prev) => (&self.metrics.stream_part_interval_seconds, prev),
                };
                family
                    .with_label_values(&[waiter.model.as_str()])
                    .observe(now.duration_since(since).as_secs_f64());
                self.metrics
                    .stream_parts
                    .with_label_values(&[waiter.model.as_str(), tenant_label(&waiter.tenant)])
                    .inc();
            }
            Err(TrySendError::Full(_)) => self.protocol_error(
                id,
                format!("more parts of item {} than its window", part.item_id),
            ),
            // The caller is gone: its guard cancels the request (and the worker's item).
            Err(TrySendError::Closed(_)) => {}
        }
    }

    /// The caller of `ticket` took a part: its worker may send one more.
    pub(super) fn took(&mut self, ticket: u64) {
        let Some(request) = self.tickets.get(&ticket) else {
            return;
        };
        let Some((worker, item_id)) = self.waiters.get(request).and_then(|w| w.streaming) else {
            return;
        };
        if let Some(conn) = self.conns.get(&worker) {
            let window = pb::serve_event::Kind::Window(pb::Window { item_id, parts: 1 });
            let _ = conn.events.send(Ok(pb::ServeEvent { kind: Some(window) }));
        }
    }
}
