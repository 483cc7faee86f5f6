//! [`PartSink`]: how a streaming handler ([`Handler::handle_stream`](super::Handler)) sends an
//! item's answer in parts before its final output.
//!
//! Each part goes to the server as an `ItemPart`, numbered from 0. A part needs room in the
//! item's window: the server grants `ServeAccepted.initial_window` parts at first, and one
//! more (`Window`) each time the item's reader takes one; [`PartSink::send`] waits while the
//! window is closed, so a slow reader pauses its own item only. The item's final output (what
//! the handler returns) is its last part.

use std::sync::Arc;

use modelshare_proto::v1 as pb;
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use super::output::Output;

/// Why a part was not sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartError {
    /// The caller takes the item's answer whole (`Item.stream` false): the handler returns
    /// the whole answer as its final output instead (see [`PartSink::is_streamed`]).
    #[error("the caller takes this item's answer whole: return it as the final output")]
    NotStreamed,
    /// The server cancelled the item (its caller went away, or a limit passed): stop it.
    #[error("the server cancelled the item")]
    Cancelled,
    /// The worker's stream to the server ended: the item's answer goes nowhere.
    #[error("the serve stream ended")]
    StreamEnded,
}

/// Sends one item's parts (see the module's documentation).
#[derive(Debug)]
pub struct PartSink {
    tx: mpsc::Sender<pb::ServeRequest>,
    batch_id: u64,
    item_id: u64,
    version: u32,
    seq: u64,
    window: Arc<Semaphore>,
    cancel: CancellationToken,
    streamed: bool,
}

impl PartSink {
    /// A sink for item `item_id` of batch `batch_id`, whose window is `window`.
    pub(super) fn new(
        tx: mpsc::Sender<pb::ServeRequest>,
        batch_id: u64,
        item_id: u64,
        version: u32,
        window: Arc<Semaphore>,
        cancel: CancellationToken,
        streamed: bool,
    ) -> Self {
        Self {
            tx,
            batch_id,
            item_id,
            version,
            seq: 0,
            window,
            cancel,
            streamed,
        }
    }

    /// A sink whose parts arrive on the returned receiver (each as the `ItemPart` the server
    /// would get; at most 1,024 not yet received), with a window that never closes: for tests
    /// of a streaming handler. `streamed`: whether the item is streamed (see
    /// [`PartSink::is_streamed`]).
    pub fn collecting(streamed: bool) -> (Self, mpsc::Receiver<pb::ServeRequest>) {
        let (tx, rx) = mpsc::channel(1024);
        let sink = Self::new(
            tx,
            0,
            0,
            0,
            Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            CancellationToken::new(),
            streamed,
        );
        (sink, rx)
    }

    /// Whether the caller takes the item's answer as a stream. When false, send nothing and
    /// return the whole answer as the final output.
    pub fn is_streamed(&self) -> bool {
        self.streamed
    }

    /// The model version the item is for.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The batch the item came in.
    pub fn batch_id(&self) -> u64 {
        self.batch_id
    }

    /// Parts sent so far.
    pub fn sent(&self) -> u64 {
        self.seq
    }

    /// Sends the next part, once the item's window has room. Fails at once, sending
    /// nothing, when the item is not streamed, is cancelled, or the stream has ended.
    pub async fn send(&mut self, part: Output) -> Result<(), PartError> {
        if !self.streamed {
            return Err(PartError::NotStreamed);
        }
        if self.cancel.is_cancelled() {
            return Err(PartError::Cancelled);
        }
        let permit = tokio::select! {
            biased;
            () = self.cancel.cancelled() => return Err(PartError::Cancelled),
            permit = self.window.acquire() => permit,
        };
        // Closed when the item is answered or the stream ended.
        permit.map_err(|_| PartError::StreamEnded)?.forget();
        let message = pb::ServeRequest {
            kind: Some(pb::serve_request::Kind::Part(pb::ItemPart {
                batch_id: self.batch_id,
                item_id: self.item_id,
                seq: self.seq,
                output: Some(part.into_pb()),
            })),
        };
        tokio::select! {
            biased;
            () = self.cancel.cancelled() => return Err(PartError::Cancelled),
            sent = self.tx.send(message) => sent.map_err(|_| PartError::StreamEnded)?,
        }
        self.seq += 1;
        Ok(())
    }
}

/// Grants `parts` more to a window, never past what a semaphore holds.
pub(super) fn grant(window: &Semaphore, parts: u32) {
    let room = Semaphore::MAX_PERMITS.saturating_sub(window.available_permits());
    window.add_permits((parts as usize).min(room));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn parts_wait_for_the_window_and_are_numbered() {
        let (tx, mut rx) = mpsc::channel(8);
        let window = Arc::new(Semaphore::new(1));
        let cancel = CancellationToken::new();
        let mut sink = PartSink::new(tx, 7, 9, 1, window.clone(), cancel.clone(), true);
        sink.send(Output::new()).await.expect("first part");
        // The window is closed: the second part waits until one more is granted.
        let second = tokio::time::timeout(
            std::time::Duration::from_millis(50),
            sink.send(Output::new()),
        )
        .await;
        assert!(second.is_err(), "sent past the window");
        grant(&window, 1);
        sink.send(Output::new()).await.expect("second part");
        for seq in 0..2 {
            let Some(pb::ServeRequest {
                kind: Some(pb::serve_request::Kind::Part(p)),
            }) = rx.recv().await
            else {
                panic!("not a part");
            };
            assert_eq!((p.batch_id, p.item_id, p.seq), (7, 9, seq));
        }
        // A cancelled item's part fails at once, even with the window closed.
        cancel.cancel();
        assert_eq!(sink.send(Output::new()).await, Err(PartError::Cancelled));
    }

    #[tokio::test]
    async fn unstreamed_items_and_ended_streams_refuse_parts() {
        let (mut sink, _parts) = PartSink::collecting(false);
        assert_eq!(sink.send(Output::new()).await, Err(PartError::NotStreamed));
        let (tx, rx) = mpsc::channel(1);
        let window = Arc::new(Semaphore::new(4));
        let mut sink = PartSink::new(tx, 1, 1, 1, window.clone(), CancellationToken::new(), true);
        drop(rx);
        assert_eq!(sink.send(Output::new()).await, Err(PartError::StreamEnded));
        window.close();
        assert_eq!(sink.send(Output::new()).await, Err(PartError::StreamEnded));
        grant(&window, u32::MAX);
    }
}
