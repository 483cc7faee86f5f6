//! Texts to token ids with the model's own `tokenizer.json` (the Hugging Face `tokenizers`
//! crate), as sentence-transformers does it: the tokenizer file's own padding and truncation
//! settings are replaced by the model spec's (no padding here: a batch is padded to its
//! longest sequence later; truncation to `max_seq_len` tokens, special tokens included,
//! longest-first from the right), texts lowercased first when the spec says so.
//!
//! A `tokenizer.json` of BERT's own shape is run by [`bert::FastBert`] instead, which gives the
//! same ids for a tenth of the CPU; the crate keeps the rest (other tokenizers, and the texts
//! that hold an added token such as `[SEP]`).

mod bert;
#[cfg(test)]
mod fast_tests;
mod vocab;

use rayon::prelude::*;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use self::bert::FastBert;
use crate::spec::{ModelSpec, SpecError, TOKENIZER_FILE};

/// The fewest texts one rayon task tokenizes (about 0.3 ms of a BERT tokenizer's work).
const PARALLEL_MIN: usize = 32;

/// A batch's texts of this many bytes or fewer are tokenized on the calling thread: about a
/// millisecond of the fast tokenizer's work, which spread over the rayon pool gains little
/// on a loaded worker (it tokenizes several batches at once on the blocking threads anyway)
/// and costs the pool's wake-ups and spinning, cores the server, the compute slots and the
/// clients of the machine need.
const SERIAL_MAX_BYTES: usize = 64 << 10;

/// One tokenized input: ids and token types, special tokens included.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sequence {
    /// Token ids.
    pub ids: Vec<u32>,
    /// Token type ids (all 0 for one sentence).
    pub type_ids: Vec<u32>,
}

impl Sequence {
    /// Tokens, special tokens included.
    pub fn len(&self) -> usize {
        self.ids.len()
    }
}

/// Why one input could not be tokenized.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeError {
    /// Longer than the model takes, and the request asked not to truncate.
    #[error(
        "the input has {tokens} tokens, more than the model's limit of {limit}; send a shorter input or allow truncation"
    )]
    TooLong {
        /// Its length in tokens.
        tokens: usize,
        /// The limit.
        limit: usize,
    },
    /// A token id past the vocabulary.
    #[error("token id {id} is outside the vocabulary of {vocab}")]
    BadTokenId {
        /// The id.
        id: i64,
        /// The vocabulary size.
        vocab: usize,
    },
    /// The tokenizer failed.
    #[error("cannot tokenize the input: {0}")]
    Tokenizer(String),
    /// An input that is neither text nor token ids.
    #[error("{0}")]
    BadInput(String),
}

/// The model's tokenizer, configured by the spec.
#[derive(Debug)]
pub struct TextEncoder {
    /// Truncates to `max_len`.
    truncating: Tokenizer,
    /// Does not truncate, for inputs that must not be.
    whole: Tokenizer,
    /// The same tokenizer without the crate, when it is BERT's.
    fast: Option<FastBert>,
    max_len: usize,
    lower_case: bool,
    vocab: usize,
    /// Token types the model has (at least 1: type 0 is always taken).
    types: usize,
}

impl TextEncoder {
    /// Builds the tokenizer from `tokenizer.json`'s bytes.
    pub fn new(json: &[u8], spec: &ModelSpec) -> Result<Self, SpecError> {
        let mut whole = Tokenizer::from_bytes(json)
            .map_err(|e| SpecError::new(TOKENIZER_FILE, format!("cannot be read: {e}")))?;
        whole.with_padding(None);
        whole
            .with_truncation(None)
            .map_err(|e| SpecError::new(TOKENIZER_FILE, format!("cannot be configured: {e}")))?;
        let mut truncating = whole.clone();
        truncating
            .with_truncation(Some(TruncationParams {
                max_length: spec.max_seq_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(|e| {
                SpecError::new(
                    TOKENIZER_FILE,
                    format!("cannot truncate to {} tokens: {e}", spec.max_seq_len),
                )
            })?;
        let vocab = spec.encoder.vocab;
        if let Some(&top) = truncating.get_vocab(true).values().max()
            && top as usize >= vocab
        {
            return Err(SpecError::new(
                TOKENIZER_FILE,
                format!("has token id {top}, past config.json's vocab_size {vocab}"),
            ));
        }
        let fast = serde_json::from_slice(json)
            .ok()
            .and_then(|v| FastBert::new(&v));
        Ok(Self {
            truncating,
            whole,
            fast,
            max_len: spec.max_seq_len,
            lower_case: spec.lower_case,
            vocab,
            types: spec.encoder.type_vocab.max(1),
        })
    }

    /// Tokenizes `texts`; an input whose `truncate` is false and that is too long fails alone.
    /// A batch of more than [`SERIAL_MAX_BYTES`] is spread over the rayon pool's threads
    /// ([`PARALLEL_MIN`] a task): a request waits for its whole batch, so a big batch's
    /// tokenization would be long on every request's path.
    pub fn encode(&self, texts: &[(&str, bool)]) -> Vec<Result<Sequence, TokenizeError>> {
        let parallel = texts.iter().map(|(t, _)| t.len()).sum::<usize>() > SERIAL_MAX_BYTES;
        let lowered: Vec<String>;
        let texts: Vec<(&str, bool)> = if self.lower_case {
            let lower = |(t, _): &(&str, bool)| t.to_lowercase();
            lowered = if parallel {
                texts
                    .par_iter()
                    .with_min_len(PARALLEL_MIN)
                    .map(lower)
                    .collect()
            } else {
                texts.iter().map(lower).collect()
            };
            lowered
                .iter()
                .zip(texts)
                .map(|(l, (_, tr))| (l.as_str(), *tr))
                .collect()
        } else {
            texts.to_vec()
        };
        let mut out: Vec<Option<Result<Sequence, TokenizeError>>> = vec![None; texts.len()];
        if let Some(fast) = &self.fast {
            let encode = |(slot, (text, truncate)): (&mut Option<_>, &(&str, bool))| {
                *slot = fast
                    .encode(text, truncate.then_some(self.max_len))
                    .map(|(ids, type_ids)| self.checked(Sequence { ids, type_ids }));
            };
            if parallel {
                out.par_iter_mut()
                    .zip(texts.par_iter())
                    .with_min_len(PARALLEL_MIN)
                    .for_each(encode);
            } else {
                out.iter_mut().zip(&texts).for_each(encode);
            }
        }
        for (tokenizer, truncate) in [(&self.truncating, true), (&self.whole, false)] {
            let (idx, inputs): (Vec<usize>, Vec<&str>) = texts
                .iter()
                .enumerate()
                .filter(|&(i, (_, tr))| *tr == truncate && out[i].is_none())
                .map(|(i, (t, _))| (i, *t))
                .unzip();
            if inputs.is_empty() {
                continue;
            }
            let encoded = match tokenizer.encode_batch_fast(inputs.clone(), true) {
                Ok(all) => all.into_iter().map(Ok).collect(),
                // One bad input fails the whole call: find it alone.
                Err(_) => inputs
                    .iter()
                    .map(|t| tokenizer.encode_fast(*t, true))
                    .collect::<Vec<_>>(),
            };
            for (i, e) in idx.into_iter().zip(encoded) {
                out[i] = Some(match e {
                    Err(e) => Err(TokenizeError::Tokenizer(e.to_string())),
                    Ok(e) => self.checked(Sequence {
                        ids: e.get_ids().to_vec(),
                        type_ids: e.get_type_ids().to_vec(),
                    }),
                });
            }
        }
        out.into_iter()
            .map(|o| o.unwrap_or_else(|| Err(TokenizeError::Tokenizer("not encoded".into()))))
            .collect()
    }

    /// A tokenized input, or why the model cannot take it: longer than its limit (only
    /// possible untruncated), no tokens at all, or a token type past its types.
    fn checked(&self, s: Sequence) -> Result<Sequence, TokenizeError> {
        if s.len() > self.max_len {
            return Err(TokenizeError::TooLong {
                tokens: s.len(),
                limit: self.max_len,
            });
        }
        // A tokenizer without a post-processor makes nothing of "".
        if s.ids.is_empty() {
            return Err(TokenizeError::BadInput(
                "the input makes no tokens with this model's tokenizer".into(),
            ));
        }
        if s.type_ids.iter().any(|&t| t as usize >= self.types) {
            return Err(TokenizeError::BadInput(format!(
                "the tokenizer gave a token type past the model's {} types",
                self.types
            )));
        }
        Ok(s)
    }

    /// Token ids given by the caller, taken as they are (special tokens included if the
    /// caller wants them), truncated to the limit unless `truncate` is false.
    pub fn ids(&self, ids: &[i64], truncate: bool) -> Result<Sequence, TokenizeError> {
        if let Some(&id) = ids
            .iter()
            .find(|&&id| id < 0 || id as u64 >= self.vocab as u64)
        {
            return Err(TokenizeError::BadTokenId {
                id,
                vocab: self.vocab,
            });
        }
        if ids.len() > self.max_len && !truncate {
            return Err(TokenizeError::TooLong {
                tokens: ids.len(),
                limit: self.max_len,
            });
        }
        let ids: Vec<u32> = ids.iter().take(self.max_len).map(|&id| id as u32).collect();
        Ok(Sequence {
            type_ids: vec![0; ids.len()],
            ids,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::spec::{EncoderConfig, Pooling};

    /// A BERT-style tokenizer.json: lowercasing normalizer, WordPiece over a tiny vocabulary,
    /// `[CLS] $A [SEP]`, and its own fixed padding and truncation (which must be ignored).
    const TOKENIZER: &str = r###"{
      "version": "1.0",
      "truncation": {"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0},
      "padding": {"strategy": {"Fixed": 12}, "direction": "Right", "pad_to_multiple_of": null,
                  "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"},
      "added_tokens": [],
      "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                     "strip_accents": null, "lowercase": true},
      "pre_tokenizer": {"type": "BertPreTokenizer"},
      "post_processor": {"type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                 {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
        "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]},
                           "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}},
      "decoder": null,
      "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                "max_input_chars_per_word": 100,
                "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5,
                          "日": 6, "本": 7, "##s": 8, "!": 9}}
    }"###;

    /// A tokenizer over the tiny vocabulary of [`TOKENIZER`] (`hello` 4, `world` 5, ...).
    pub(crate) fn encoder(max_seq_len: usize, lower_case: bool) -> TextEncoder {
        try_encoder(TOKENIZER, 12, max_seq_len, lower_case).expect("tokenizer")
    }

    fn try_encoder(
        json: &str,
        vocab: usize,
        max_seq_len: usize,
        lower_case: bool,
    ) -> Result<TextEncoder, SpecError> {
        let config = format!(
            r#"{{"hidden_size":8,"intermediate_size":16,"max_position_embeddings":64,
            "model_type":"bert","num_attention_heads":2,"num_hidden_layers":1,"vocab_size":{vocab}}}"#
        );
        let spec = ModelSpec {
            encoder: EncoderConfig::parse(config.as_bytes()).expect("config"),
            pooling: Pooling::Mean,
            normalize: false,
            max_seq_len,
            lower_case,
        };
        TextEncoder::new(json.as_bytes(), &spec)
    }

    /// A tokenizer whose ids pass the model's vocabulary would be accepted (the GPU refuses
    /// such ids per batch, the CPU would read a zero row); one that makes no tokens of an input
    /// would hand the encoder an empty sequence.
    #[test]
    fn refuses_ids_past_the_vocabulary_and_empty_sequences() {
        let e = try_encoder(TOKENIZER, 9, 8, false).expect_err("id 9 in a vocabulary of 9");
        assert!(
            e.to_string()
                .contains("token id 9, past config.json's vocab_size 9"),
            "{e}"
        );
        let (start, end) = (
            TOKENIZER.find(r#""post_processor""#).expect("has one"),
            TOKENIZER.find(r#""decoder""#).expect("has one"),
        );
        let bare = format!(
            r#"{}"post_processor": null, {}"#,
            &TOKENIZER[..start],
            &TOKENIZER[end..]
        );
        let t = try_encoder(&bare, 12, 8, false).expect("no post-processor");
        let out = t.encode(&[("", true), ("hello", true)]);
        assert!(
            matches!(out[0], Err(TokenizeError::BadInput(_))),
            "{:?}",
            out[0]
        );
        assert_eq!(out[1].as_ref().expect("hello").ids, [4]);
    }

    /// Tokenization would keep the file's fixed padding or its 3-token truncation, drop the
    /// special tokens, or fail on empty strings and other scripts.
    #[test]
    fn tokenizes_as_the_spec_says_not_as_the_file_does() {
        let t = encoder(6, false);
        let out = t.encode(&[("Hello WORLD!", true), ("", true), ("日本 worlds", true)]);
        let ids: Vec<Vec<u32>> = out.into_iter().map(|r| r.expect("ok").ids).collect();
        assert_eq!(ids[0], [2, 4, 5, 9, 3]);
        assert_eq!(ids[1], [2, 3]);
        assert_eq!(ids[2], [2, 6, 7, 5, 8, 3]);
        // Truncation to 6 tokens keeps [CLS] ... [SEP].
        let long = t.encode(&[("hello world hello world hello world", true)]);
        assert_eq!(long[0].as_ref().expect("ok").ids, [2, 4, 5, 4, 5, 3]);
    }

    /// A batch large enough to be spread over the pool's threads must give each text what it
    /// gives alone, in the batch's order, its failures alone (lowercased first or not).
    #[test]
    fn a_large_batch_is_tokenized_in_order_as_each_text_alone() {
        // A large batch over the rayon pool, each text alone on the calling thread.
        let words = [
            "hello",
            "WORLD",
            "日本",
            "worlds",
            "!",
            "",
            "hello world hello",
        ];
        for lower_case in [false, true] {
            let t = encoder(5, lower_case);
            assert!(t.fast.is_some(), "BERT's shape: FastBert runs it");
            let texts: Vec<(String, bool)> = (0..12_000)
                .map(|i| {
                    let text: Vec<&str> = (0..i % 5)
                        .map(|k| words[(i * 7 + k) % words.len()])
                        .collect();
                    (text.join(" "), i % 11 != 0)
                })
                .collect();
            let refs: Vec<(&str, bool)> = texts.iter().map(|(t, tr)| (t.as_str(), *tr)).collect();
            let bytes: usize = refs.iter().map(|(t, _)| t.len()).sum();
            assert!(
                bytes > SERIAL_MAX_BYTES,
                "{bytes} bytes: the batch is spread over the pool"
            );
            let batch = t.encode(&refs);
            assert_eq!(batch.len(), refs.len());
            let mut failures = 0;
            for (i, (got, one)) in batch.iter().zip(&refs).enumerate() {
                let alone = t.encode(std::slice::from_ref(one)).remove(0);
                assert_eq!(got, &alone, "text {i}: {one:?}");
                failures += usize::from(got.is_err());
            }
            assert!(failures > 0, "some untruncated texts are too long");
        }
    }

    /// An input the request asked not to truncate would be cut silently, or fail the batch.
    #[test]
    fn untruncated_inputs_fail_alone() {
        let t = encoder(4, false);
        let out = t.encode(&[
            ("hello world hello", false),
            ("hello", false),
            ("hello world hello", true),
        ]);
        assert_eq!(
            out[0],
            Err(TokenizeError::TooLong {
                tokens: 5,
                limit: 4
            })
        );
        assert_eq!(out[1].as_ref().expect("short").ids, [2, 4, 3]);
        assert_eq!(out[2].as_ref().expect("truncated").ids, [2, 4, 5, 3]);
        assert!(
            out[0]
                .as_ref()
                .unwrap_err()
                .to_string()
                .contains("limit of 4")
        );
    }

    /// Token ids from the caller would be taken past the vocabulary or the limit.
    #[test]
    fn token_ids_are_checked_and_truncated() {
        let t = encoder(4, false);
        assert_eq!(t.ids(&[2, 4, 3], true).expect("ok").ids, [2, 4, 3]);
        assert_eq!(
            t.ids(&[2, 4, 4, 4, 4, 3], true).expect("cut").ids,
            [2, 4, 4, 4]
        );
        assert!(matches!(
            t.ids(&[2, 4, 4, 4, 4], false),
            Err(TokenizeError::TooLong { .. })
        ));
        assert_eq!(
            t.ids(&[2, 12], true),
            Err(TokenizeError::BadTokenId { id: 12, vocab: 12 })
        );
        assert_eq!(
            t.ids(&[-1], true),
            Err(TokenizeError::BadTokenId { id: -1, vocab: 12 })
        );
    }
}
