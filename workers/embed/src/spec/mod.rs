//! What the worker runs, read from the model's own files (published with the version as
//! metadata): the encoder's architecture ([`config`]), the sentence-transformers pipeline
//! ([`sentence`]), and the resulting [`ModelSpec`]. Every refusal is a [`SpecError`] naming
//! the file and field.

pub mod config;
mod error;
pub mod sentence;

pub use config::EncoderConfig;
pub use error::SpecError;
pub use sentence::{Pooling, SentenceConfig, parse_pooling};

/// The Hugging Face tokenizer file, required.
pub const TOKENIZER_FILE: &str = "tokenizer.json";
/// The tokenizer's settings, read for `model_max_length`.
const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

/// Settings the operator gives for a model without sentence-transformers files, or to
/// override them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Pooling (default: the Pooling module's, else mean).
    pub pooling: Option<Pooling>,
    /// L2-normalize (default: whether a Normalize module follows, else no).
    pub normalize: Option<bool>,
    /// Longest sequence in tokens, special tokens included (default: sentence-transformers'
    /// `max_seq_length`, else the tokenizer's `model_max_length`, else the position table).
    pub max_seq_len: Option<usize>,
}

/// Everything the worker needs to know to embed with a model.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    /// The encoder.
    pub encoder: EncoderConfig,
    /// How token vectors become the sentence vector.
    pub pooling: Pooling,
    /// Whether the sentence vector is L2-normalized.
    pub normalize: bool,
    /// Longest sequence in tokens, special tokens included: longer inputs are truncated.
    pub max_seq_len: usize,
    /// Texts are lowercased before tokenizing (sentence-transformers' `do_lower_case`).
    pub lower_case: bool,
}

impl ModelSpec {
    /// Reads the spec from the model's files (`file` looks one up by name).
    pub fn read(
        file: &dyn Fn(&str) -> Option<Vec<u8>>,
        overrides: &Overrides,
    ) -> Result<Self, SpecError> {
        let config = file(config::FILE).ok_or_else(|| {
            SpecError::new(
                config::FILE,
                "is missing: the model must be loaded from a directory holding its config.json",
            )
        })?;
        let encoder = EncoderConfig::parse(&config)?;
        let sentence = SentenceConfig::read(file)?;
        let limit = encoder.max_tokens();
        let max_seq_len = match overrides.max_seq_len {
            Some(n) if n < 2 || n > limit => {
                return Err(SpecError::new(
                    "--max-seq-len",
                    format!("{n} is outside 2..={limit} (the model's position table)"),
                ));
            }
            Some(n) => n,
            None => sentence
                .as_ref()
                .and_then(|s| s.max_seq_length)
                .or_else(|| tokenizer_max_length(file))
                .unwrap_or(limit)
                .clamp(2, limit),
        };
        Ok(Self {
            pooling: overrides
                .pooling
                .or(sentence.as_ref().map(|s| s.pooling))
                .unwrap_or(Pooling::Mean),
            normalize: overrides
                .normalize
                .or(sentence.as_ref().map(|s| s.normalize))
                .unwrap_or(false),
            lower_case: sentence.as_ref().is_some_and(|s| s.lower_case),
            max_seq_len,
            encoder,
        })
    }
}

/// `model_max_length` of `tokenizer_config.json`, when it is a real limit (transformers
/// writes 1e30 for "none").
fn tokenizer_max_length(file: &dyn Fn(&str) -> Option<Vec<u8>>) -> Option<usize> {
    let bytes = file(TOKENIZER_CONFIG_FILE)?;
    let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    v.get("model_max_length")?
        .as_u64()
        .filter(|n| *n <= 1 << 20)
        .map(|n| n as usize)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    const CONFIG: &str = r#"{"hidden_size":8,"intermediate_size":16,"max_position_embeddings":64,
        "model_type":"bert","num_attention_heads":2,"num_hidden_layers":1,"vocab_size":50}"#;

    fn files(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<Vec<u8>> + use<> {
        let map: HashMap<String, Vec<u8>> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect();
        move |name| map.get(name).cloned()
    }

    /// The sequence limit, pooling and normalization would come from the wrong source.
    #[test]
    fn settings_come_from_st_files_then_tokenizer_then_positions() {
        let plain = ModelSpec::read(&files(&[("config.json", CONFIG)]), &Overrides::default())
            .expect("plain");
        assert_eq!(
            (plain.max_seq_len, plain.pooling, plain.normalize),
            (64, Pooling::Mean, false)
        );
        let tok = files(&[
            ("config.json", CONFIG),
            ("tokenizer_config.json", r#"{"model_max_length":32}"#),
        ]);
        assert_eq!(
            ModelSpec::read(&tok, &Overrides::default())
                .expect("tok")
                .max_seq_len,
            32
        );
        let huge = files(&[
            ("config.json", CONFIG),
            (
                "tokenizer_config.json",
                r#"{"model_max_length":1000000000000000019884624838656}"#,
            ),
        ]);
        assert_eq!(
            ModelSpec::read(&huge, &Overrides::default())
                .expect("huge")
                .max_seq_len,
            64
        );
        let st = files(&[
            ("config.json", CONFIG),
            ("tokenizer_config.json", r#"{"model_max_length":32}"#),
            (
                "modules.json",
                r#"[{"path":"","type":"sentence_transformers.models.Transformer"},{"path":"1_Pooling","type":"sentence_transformers.models.Pooling"},{"path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#,
            ),
            (
                "1_Pooling/config.json",
                r#"{"pooling_mode_cls_token":true}"#,
            ),
            (
                "sentence_bert_config.json",
                r#"{"max_seq_length":16,"do_lower_case":true}"#,
            ),
        ]);
        let s = ModelSpec::read(&st, &Overrides::default()).expect("st");
        assert_eq!(
            (s.max_seq_len, s.pooling, s.normalize, s.lower_case),
            (16, Pooling::Cls, true, true)
        );
        let o = Overrides {
            pooling: Some(Pooling::Max),
            normalize: Some(false),
            max_seq_len: Some(20),
        };
        let s = ModelSpec::read(&st, &o).expect("overridden");
        assert_eq!(
            (s.max_seq_len, s.pooling, s.normalize),
            (20, Pooling::Max, false)
        );
        let too_long = Overrides {
            max_seq_len: Some(65),
            ..Overrides::default()
        };
        let e = ModelSpec::read(&st, &too_long).expect_err("65 > 64");
        assert!(e.to_string().contains("--max-seq-len"), "{e}");
        let e = ModelSpec::read(&files(&[]), &Overrides::default()).expect_err("no config");
        assert_eq!(e.file, "config.json");
    }
}
