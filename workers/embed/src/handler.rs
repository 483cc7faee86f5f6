//! The [`Embedder`] handler: a batch's items (texts, or token ids as an `input_ids` tensor)
//! are tokenized on a blocking thread, encoded on the compute thread, and answered each with
//! an `embedding` FP32 `[hidden]` tensor and its `prompt_tokens` count.
//!
//! Item parameters: `truncate` (bool, default true): false fails an input longer than the
//! model's limit instead of cutting it; `dimensions` (OpenAI's, an integer): accepted when it
//! is the model's own size (a BERT vector cut short means nothing), refused otherwise.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use modelshare_proto::v1 as pb;
use modelshare_worker::serve::{
    Batch, Input, InputTensor, Item, ItemFailure, Outcome, Output, OutputTensor,
};
use modelshare_worker::{Bytes, Handler, Model};

use crate::compute::{Encoded, Slots};
use crate::encoder::EncodeError;
use crate::tokenize::{Sequence, TextEncoder, TokenizeError};

/// The name of the output tensor.
pub const OUTPUT: &str = "embedding";
/// The name of the token-ids input tensor.
pub const INPUT_IDS: &str = "input_ids";

/// Embeds the items of a batch.
#[derive(Debug)]
pub struct Embedder {
    text: Arc<TextEncoder>,
    compute: Slots,
    /// Held so that the version's lease and mapping live as long as the handler.
    _model: Arc<Model>,
    /// With `--profile-stages`: where a batch's time in the handler went, logged when the
    /// handler goes.
    profile: Option<Profile>,
}

/// Batches handled and the microseconds of each step, summed: tokenization (on a blocking
/// thread), the compute (waiting for a slot, then its run), and the answers made.
#[derive(Debug, Default)]
struct Profile {
    batches: AtomicU64,
    tokenize: AtomicU64,
    compute: AtomicU64,
    answer: AtomicU64,
}

impl Profile {
    fn add(&self, step: &AtomicU64, since: Instant) -> Instant {
        let now = Instant::now();
        step.fetch_add((now - since).as_micros() as u64, Ordering::Relaxed);
        now
    }
}

impl Drop for Embedder {
    fn drop(&mut self) {
        if let Some(p) = &self.profile {
            let batches = p.batches.load(Ordering::Relaxed);
            let ms = |step: &AtomicU64| {
                step.load(Ordering::Relaxed) as f64 / 1e3 / batches.max(1) as f64
            };
            tracing::info!(
                batches,
                tokenize_ms = ms(&p.tokenize),
                compute_ms = ms(&p.compute),
                answer_ms = ms(&p.answer),
                "profile: a batch in the handler (means: tokenization on a blocking thread, \
                 the compute with its wait for a slot, the answers)"
            );
        }
    }
}

impl Embedder {
    /// A handler over a tokenizer and an compute serving `model`.
    /// With `profile`, it logs where a batch's time went when dropped.
    pub fn new(text: Arc<TextEncoder>, compute: Slots, model: Arc<Model>, profile: bool) -> Self {
        Self {
            text,
            compute,
            _model: model,
            profile: profile.then(Profile::default),
        }
    }
}

impl Handler for Embedder {
    async fn handle(&self, batch: Batch) -> Vec<Outcome> {
        let text = self.text.clone();
        let items = batch.items;
        let count = items.len();
        let cancels: Vec<_> = items.iter().map(Item::cancellation).collect();
        let hidden = self.compute.hidden();
        let mut at = Instant::now();
        let tokenized = tokio::task::spawn_blocking(move || tokenize(&text, &items, hidden)).await;
        if let Some(p) = &self.profile {
            p.batches.fetch_add(1, Ordering::Relaxed);
            at = p.add(&p.tokenize, at);
        }
        let Ok(tokenized) = tokenized else {
            return vec![Err(ItemFailure::internal("tokenization failed")); count];
        };
        // Each item's outcome so far (its failure, or a placeholder until its vector comes);
        // the good ones' sequences go to the compute.
        let mut outcomes: Vec<Outcome> = Vec::with_capacity(count);
        let (mut ok, mut seqs) = (Vec::new(), Vec::new());
        for (i, r) in tokenized.into_iter().enumerate() {
            match r {
                Ok(seq) => {
                    ok.push(i);
                    seqs.push(seq);
                    outcomes.push(Ok(Output::new()));
                }
                Err(e) => outcomes.push(Err(ItemFailure::invalid_argument(e.to_string()))),
            }
        }
        let lengths: Vec<usize> = seqs.iter().map(Sequence::len).collect();
        let cancels = ok.iter().map(|&i| cancels[i].clone()).collect();
        let encoded = if seqs.is_empty() {
            Ok(Encoded {
                vectors: Vec::new(),
                cancelled: Vec::new(),
            })
        } else {
            self.compute.encode(seqs, cancels).await
        };
        if let Some(p) = &self.profile {
            at = p.add(&p.compute, at);
        }
        match encoded {
            Ok(Encoded { vectors, cancelled }) => {
                // One buffer for the batch; each item's tensor a slice of it, not a copy.
                let row = hidden * std::mem::size_of::<f32>();
                let rows = Bytes::from_owner(F32Bytes(vectors));
                for (((n, i), tokens), cancelled) in
                    ok.into_iter().enumerate().zip(lengths).zip(cancelled)
                {
                    let Some(bytes) = rows.get(n * row..(n + 1) * row) else {
                        outcomes[i] = Err(ItemFailure::internal(
                            "the compute returned fewer vectors than sequences",
                        ));
                        continue;
                    };
                    outcomes[i] = if cancelled {
                        Err(ItemFailure::cancelled("the server cancelled the item"))
                    } else {
                        let data = rows.slice_ref(bytes);
                        Ok(Output::new()
                            .with_tensor(OutputTensor::new(
                                OUTPUT,
                                pb::DType::DtypeF32,
                                vec![hidden as i64],
                                data,
                            ))
                            .with_parameter("prompt_tokens", tokens as i64))
                    };
                }
            }
            Err(e) => {
                let failure = encode_failure(&e);
                for i in ok {
                    outcomes[i] = Err(failure.clone());
                }
            }
        }
        if let Some(p) = &self.profile {
            p.add(&p.answer, at);
        }
        outcomes
    }
}

/// A batch's vectors as the little-endian bytes of its items' FP32 tensors (the SDK runs on
/// little-endian hosts only).
struct F32Bytes(Vec<f32>);

impl AsRef<[u8]> for F32Bytes {
    fn as_ref(&self) -> &[u8] {
        bytemuck::cast_slice(&self.0)
    }
}

/// What the items of a batch the compute failed are answered: INTERNAL for the worker's own
/// failure (a panic included, its message named), UNAVAILABLE once the compute has stopped
/// (another worker may run them).
fn encode_failure(e: &EncodeError) -> ItemFailure {
    let message = format!("cannot compute the embeddings: {e}");
    match e {
        EncodeError::Kernel(_)
        | EncodeError::Device(_)
        | EncodeError::Weights(_)
        | EncodeError::Panicked(_) => ItemFailure::internal(message),
        EncodeError::Stopped(_) => ItemFailure::unavailable(message),
    }
}

/// Each item's sequence, or why it has none.
fn tokenize(
    text: &TextEncoder,
    items: &[Item],
    hidden: usize,
) -> Vec<Result<Sequence, TokenizeError>> {
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
        .map(|item| {
            // Drawn for every text item, whether or not its parameters are good.
            let encoded = matches!(item.input, Input::Text(_)).then(|| encoded.next());
            check_dimensions(item, hidden)?;
            match (&item.input, encoded.flatten()) {
                (Input::Text(_), Some(seq)) => seq,
                (Input::Text(_), None) => Err(TokenizeError::Tokenizer("not encoded".into())),
                (Input::Tensors(tensors), _) => token_ids(text, item, tensors),
            }
        })
        .collect()
}

/// The item's `truncate` parameter (default true).
fn truncate(item: &Item) -> bool {
    item.parameter("truncate")
        .and_then(|p| p.as_bool())
        .unwrap_or(true)
}

/// Refuses a `dimensions` other than the model's own.
fn check_dimensions(item: &Item, hidden: usize) -> Result<(), TokenizeError> {
    match item.parameter("dimensions") {
        Some(d) if d.as_i64() != Some(hidden as i64) => Err(TokenizeError::BadInput(format!(
            "this model's embeddings have {hidden} dimensions; 'dimensions' may only be {hidden}"
        ))),
        _ => Ok(()),
    }
}

/// The sequence of a tensor item: one INT32/INT64 `input_ids` of shape `[n]`.
fn token_ids(
    text: &TextEncoder,
    item: &Item,
    tensors: &[InputTensor],
) -> Result<Sequence, TokenizeError> {
    let [t] = tensors else {
        return Err(bad_tensors());
    };
    if t.name != INPUT_IDS || t.shape.len() != 1 {
        return Err(bad_tensors());
    }
    let ids: Vec<i64> = match t.dtype {
        pb::DType::DtypeI32 => t
            .to_vec::<i32>()
            .map(|v| v.into_iter().map(i64::from).collect()),
        pb::DType::DtypeI64 => t.to_vec::<i64>(),
        _ => return Err(bad_tensors()),
    }
    .map_err(|e| TokenizeError::BadInput(e.message))?;
    if ids.is_empty() {
        return Err(TokenizeError::BadInput("input_ids is empty".into()));
    }
    text.ids(&ids, truncate(item))
}

fn bad_tensors() -> TokenizeError {
    TokenizeError::BadInput(format!(
        "the input must be text (OIP BYTES) or one INT32/INT64 tensor '{INPUT_IDS}' of shape [n]"
    ))
}

#[cfg(test)]
mod tests {
    use modelshare_worker::Bytes;

    use super::*;
    use crate::tokenize::tests::encoder;

    fn ids_tensor(name: &str, dtype: pb::DType, ids: &[i64]) -> InputTensor {
        let data: Vec<u8> = match dtype {
            pb::DType::DtypeI32 => ids.iter().flat_map(|&i| (i as i32).to_le_bytes()).collect(),
            _ => ids.iter().flat_map(|&i| i.to_le_bytes()).collect(),
        };
        InputTensor::new(name, dtype, vec![ids.len() as i64], Bytes::from(data))
    }

    /// A panicking batch's items would not name the panic, or items refused once the compute
    /// stopped would not be marked for another worker (UNAVAILABLE).
    #[test]
    fn engine_failures_become_item_failures() {
        assert_eq!(
            encode_failure(&EncodeError::Panicked("index out of bounds".into())),
            ItemFailure::internal(
                "cannot compute the embeddings: the encoder panicked: index out of bounds"
            )
        );
        assert_eq!(
            encode_failure(&EncodeError::Stopped("the encoder panicked: x".into())),
            ItemFailure::unavailable(
                "cannot compute the embeddings: the encoder has stopped: the encoder panicked: x"
            )
        );
    }

    /// Items would get another item's sequence, or bad inputs and parameters would pass.
    #[test]
    fn items_become_sequences_or_say_why_not() {
        let t = encoder(6, false);
        let text = |s: &str| Item::new(0, Input::Text(s.into()));
        let tensors = |v: Vec<InputTensor>| Item::new(0, Input::Tensors(v));
        let items = vec![
            text("hello"),
            tensors(vec![ids_tensor(INPUT_IDS, pb::DType::DtypeI32, &[2, 5, 3])]),
            text("world").with_parameter("dimensions", 8i64),
            text("world").with_parameter("dimensions", 4i64),
            text("hello world hello world hello world").with_parameter("truncate", false),
            tensors(vec![ids_tensor("other", pb::DType::DtypeI64, &[2, 3])]),
            tensors(vec![ids_tensor(INPUT_IDS, pb::DType::DtypeI64, &[])]),
            tensors(vec![ids_tensor(INPUT_IDS, pb::DType::DtypeI64, &[2, 99])]),
            text("world"),
        ];
        let out = tokenize(&t, &items, 8);
        let ids = |i: usize| out[i].as_ref().map(|s| s.ids.clone());
        assert_eq!(ids(0), Ok(vec![2, 4, 3]));
        assert_eq!(ids(1), Ok(vec![2, 5, 3]));
        assert_eq!(ids(2), Ok(vec![2, 5, 3]));
        let err = |i: usize| out[i].as_ref().expect_err("fails").to_string();
        assert!(err(3).contains("'dimensions' may only be 8"), "{}", err(3));
        assert!(err(4).contains("limit of 6"), "{}", err(4));
        assert!(err(5).contains("input_ids"), "{}", err(5));
        assert!(err(6).contains("empty"), "{}", err(6));
        assert!(err(7).contains("outside the vocabulary"), "{}", err(7));
        // The text after the failed ones still gets its own sequence.
        assert_eq!(ids(8), Ok(vec![2, 5, 3]));
    }
}
