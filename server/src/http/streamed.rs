//! What the HTTP doors that generate text share (OpenAI's completions, KServe's generate): a
//! streamed answer's opening, the whole answer collected from its parts, and the server-sent
//! events of a streamed one, each door saying how its events look ([`Events`]).
//!
//! - The first part (or the answer) is awaited before the response starts, so that an error
//!   before it is a plain error with its status ([`open`]).
//! - A streamed answer's events are made by a task as the connection takes them (a channel of
//!   one event): the reader's pace is the worker's, through the stream's window. A connection
//!   gone drops the stream, which cancels the item at its worker, also while the worker is slow;
//!   so does a reader that takes no event for the stream idle limit.
//! - The answer's end is read through [`Tokens::finish`], which counts its tokens.

use std::convert::Infallible;
use std::time::Duration;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use modelshare_serving::{InferError, InferResponse, Part, PartStream};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::front::generation::{Finish, Tokens, part_text};

/// Most bytes of text collected for an answer that is not streamed.
pub const MAX_COLLECTED: usize = 64 << 20;

/// How a streamed answer began: with its first part, or with its whole answer (a worker that
/// sent no part, or failed before one).
#[derive(Debug)]
pub enum Opening {
    /// The first part, and the rest to come.
    Part(Part, PartStream),
    /// The whole answer.
    Answer(InferResponse),
}

/// Waits for the first part, or the answer: the error of a request that failed before its
/// first part.
pub async fn open(mut parts: PartStream) -> Result<Opening, InferError> {
    Ok(match parts.next().await? {
        Some(first) => Opening::Part(first, parts),
        None => Opening::Answer(parts.finish().await?),
    })
}

impl Opening {
    /// Every part's text and the end, for an answer that is not streamed, and the version
    /// that computed it.
    pub async fn collect(self, tokens: &Tokens) -> Result<(String, Finish, u32), InferError> {
        let mut text = String::new();
        let answer = match self {
            Opening::Answer(r) => r,
            Opening::Part(first, mut parts) => {
                let mut next = Some(first);
                while let Some(part) = next {
                    text.push_str(part_text(&part.output));
                    if text.len() > MAX_COLLECTED {
                        return Err(InferError::InvalidInput(format!(
                            "the answer is longer than {MAX_COLLECTED} bytes; ask for fewer tokens or stream it"
                        )));
                    }
                    next = parts.next().await?;
                }
                parts.finish().await?
            }
        };
        let finish = tokens.finish(&answer)?;
        text.push_str(&finish.text);
        Ok((text, finish, answer.version()))
    }
}

/// How one door's events look.
pub trait Events: Send + Sync + 'static {
    /// The event of a part's new text; `first`: the stream's first event.
    fn part(&self, text: &str, first: bool) -> Value;
    /// The events after the last part: `text` left (`None`: nothing left, and not the first
    /// event), the end, the version that computed it.
    fn last(&self, text: Option<&str>, first: bool, finish: &Finish, version: u32) -> Vec<Value>;
    /// The event of an error after the stream started.
    fn error(&self, e: &InferError) -> Value;
    /// The stream's last data line, if the door has one (OpenAI's `[DONE]`).
    fn done(&self) -> Option<&'static str>;
    /// Where the answer's tokens are counted.
    fn tokens(&self) -> &Tokens;
}

/// The streamed answer as server-sent events. `guard` lives as long as the stream (the
/// caller's in-flight count). A reader that takes no event for `idle` (the server's
/// `stream_idle_secs`) is given up: the item is cancelled and its worker's slot freed.
pub fn sse<E: Events, G: Send + 'static>(
    events: E,
    opening: Opening,
    guard: G,
    idle: Duration,
) -> Response {
    let (tx, rx) = mpsc::channel::<Result<Event, Infallible>>(1);
    tokio::spawn(async move {
        let _guard = guard;
        forward(&events, opening, &tx, idle).await;
    });
    Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn forward<E: Events>(
    events: &E,
    opening: Opening,
    tx: &mpsc::Sender<Result<Event, Infallible>>,
    idle: Duration,
) {
    // False when the connection is gone, or its reader took nothing for `idle`.
    let send = |value: Value| {
        let event = Event::default().data(value.to_string());
        async move {
            matches!(
                tokio::time::timeout(idle, tx.send(Ok(event))).await,
                Ok(Ok(()))
            )
        }
    };
    let mut opened = false;
    let answer = match opening {
        Opening::Answer(r) => Ok(r),
        Opening::Part(first, mut parts) => {
            let mut next = Some(first);
            while let Some(part) = next {
                if !send(events.part(part_text(&part.output), !opened)).await {
                    return;
                }
                opened = true;
                next = tokio::select! {
                    r = parts.next() => match r {
                        Ok(n) => n,
                        Err(e) => {
                            send(events.error(&e)).await;
                            return;
                        }
                    },
                    () = tx.closed() => return,
                };
            }
            tokio::select! {
                r = parts.finish() => r,
                () = tx.closed() => return,
            }
        }
    };
    let (finish, version) =
        match answer.and_then(|r| Ok((events.tokens().finish(&r)?, r.version()))) {
            Ok(f) => f,
            Err(e) => {
                send(events.error(&e)).await;
                return;
            }
        };
    let text = (!finish.text.is_empty() || !opened).then_some(finish.text.as_str());
    for event in events.last(text, !opened, &finish, version) {
        if !send(event).await {
            return;
        }
    }
    if let Some(done) = events.done() {
        let _ = tokio::time::timeout(idle, tx.send(Ok(Event::default().data(done)))).await;
    }
}
