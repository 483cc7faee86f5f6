//! The [`Embedder`] handler: a batch's items (texts, or token ids as an `input_ids` tensor)
//! are tokenized on a blocking thread, encoded on the compute thread, and answered each with
//! an `embedding` FP32 `[hidden]` tensor and its `prompt_tokens` count.
//!
//! Item parameters: `truncate` (bool, default true): false fails an input longer than the
//! model's limit instead of cutting it.

use std::sync::Arc;

use modelshare_proto::v1 as pb;
use modelshare_worker::serve::{Batch, Input, Item, ItemFailure, Outcome, Output, OutputTensor};
use modelshare_worker::{Handler, Model};

use crate::engine::Engine;
use crate::tokenize::{Sequence, TextEncoder, TokenizeError};

/// The name of the output tensor.
pub const OUTPUT: &str = "embedding";
/// The name of the token-ids input tensor.
pub const INPUT_IDS: &str = "input_ids";

/// Embeds the items of a batch.
#[derive(Debug)]
pub struct Embedder {
    text: Arc<TextEncoder>,
    engine: Engine,
    /// Held so that the version's lease and mapping live as long as the handler.
    _model: Arc<Model>,
}

impl Embedder {
    /// A handler over a tokenizer and an engine serving `model`.
    pub fn new(text: Arc<TextEncoder>, engine: Engine, model: Arc<Model>) -> Self {
        Self {
            text,
            engine,
            _model: model,
        }
    }
}

impl Handler for Embedder {
    async fn handle(&self, batch: Batch) -> Vec<Outcome> {
        let text = self.text.clone();
        let items = batch.items;
        let tokenized = tokio::task::spawn_blocking(move || tokenize(&text, &items)).await;
        let Ok(tokenized) = tokenized else {
            return vec![Err(ItemFailure::internal("tokenization failed"))];
        };
        let (ok, seqs): (Vec<usize>, Vec<Sequence>) = tokenized
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.as_ref().ok().map(|s| (i, s.clone())))
            .unzip();
        let hidden = self.engine.hidden();
        let lengths: Vec<usize> = seqs.iter().map(Sequence::len).collect();
        let vectors = if seqs.is_empty() {
            Ok(Vec::new())
        } else {
            self.engine.encode(seqs).await
        };
        let mut outcomes: Vec<Outcome> = tokenized
            .into_iter()
            .map(|r| {
                r.map(|_| Output::new())
                    .map_err(|e| ItemFailure::invalid_argument(e.to_string()))
            })
            .collect();
        match vectors {
            Ok(vectors) => {
                for ((i, row), tokens) in ok
                    .into_iter()
                    .zip(vectors.chunks_exact(hidden.max(1)))
                    .zip(lengths)
                {
                    outcomes[i] = Ok(Output::new()
                        .with_tensor(OutputTensor::f32(OUTPUT, vec![hidden as i64], row))
                        .with_parameter("prompt_tokens", tokens as i64));
                }
            }
            Err(e) => {
                let failure = ItemFailure::internal(format!("cannot compute the embeddings: {e}"));
                for i in ok {
                    outcomes[i] = Err(failure.clone());
                }
            }
        }
        outcomes
    }
}

/// Each item's sequence, or why it has none.
fn tokenize(text: &TextEncoder, items: &[Item]) -> Vec<Result<Sequence, TokenizeError>> {
    let truncate = |item: &Item| {
        item.parameter("truncate")
            .and_then(|p| p.as_bool())
            .unwrap_or(true)
    };
    let texts: Vec<(&str, bool)> = items
        .iter()
        .filter_map(|item| match &item.input {
            Input::Text(s) => Some((s.as_str(), truncate(item))),
            Input::Tensors(_) => None,
        })
        .collect();
    let mut encoded = text.encode(&texts).into_iter();
    items
        .iter()
        .map(|item| match &item.input {
            Input::Text(_) => encoded
                .next()
                .unwrap_or_else(|| Err(TokenizeError::Tokenizer("not encoded".into()))),
            Input::Tensors(tensors) => match tensors.as_slice() {
                [t] if t.name == INPUT_IDS
                    && matches!(t.dtype, pb::DType::DtypeI32 | pb::DType::DtypeI64)
                    && t.shape.len() == 1 =>
                {
                    let ids: Vec<i64> = match t.dtype {
                        pb::DType::DtypeI32 => t.to_vec::<i32>().map(|v| v.into_iter().map(i64::from).collect()),
                        _ => t.to_vec::<i64>(),
                    }
                    .map_err(|e| TokenizeError::BadInput(e.message))?;
                    if ids.is_empty() {
                        return Err(TokenizeError::BadInput("input_ids is empty".into()));
                    }
                    text.ids(&ids, truncate(item))
                }
                _ => Err(TokenizeError::BadInput(format!(
                    "the input must be text (OIP BYTES) or one INT32/INT64 tensor '{INPUT_IDS}' of shape [n]"
                ))),
            },
        })
        .collect()
}
