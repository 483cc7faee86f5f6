//! `config.json`: the encoder's architecture and sizes, as Hugging Face transformers writes it.
//!
//! Taken: `model_type` `bert` (BERT, MiniLM, BGE, E5, ...: absolute positions, token types,
//! exact GELU, post-LayerNorm). Another encoder is a [`Family`] variant: what differs is
//! its position offset, its tensor prefix and its tokenizer, all read from here.

use serde_json::{Map, Value};

use super::SpecError;

/// The file name.
pub const FILE: &str = "config.json";

/// The encoders this worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// `model_type: bert`.
    Bert,
}

impl Family {
    /// Prefixes the tensors may carry, tried in order (`bert.` in checkpoints saved from a
    /// task model such as BertForMaskedLM).
    pub fn tensor_prefixes(self) -> &'static [&'static str] {
        match self {
            Family::Bert => &["", "bert.", "model."],
        }
    }
}

/// The architecture of a BERT-family encoder.
#[derive(Clone, Debug, PartialEq)]
pub struct EncoderConfig {
    /// The family (from `model_type`).
    pub family: Family,
    /// `vocab_size`.
    pub vocab: usize,
    /// `hidden_size`.
    pub hidden: usize,
    /// `num_hidden_layers`.
    pub layers: usize,
    /// `num_attention_heads` (dividing `hidden_size`).
    pub heads: usize,
    /// `intermediate_size`.
    pub intermediate: usize,
    /// `max_position_embeddings`.
    pub max_positions: usize,
    /// `type_vocab_size` (0: no token-type embeddings).
    pub type_vocab: usize,
    /// `layer_norm_eps`.
    pub eps: f32,
    /// The position of a sequence's first token in the position table (0 for BERT).
    pub position_offset: usize,
}

/// Sizes past this are refused as nonsense before anything is allocated for them.
const MAX_SIZE: u64 = 1 << 20;

impl EncoderConfig {
    /// Parses `config.json`; refuses, naming the field, what this worker cannot run.
    pub fn parse(bytes: &[u8]) -> Result<Self, SpecError> {
        let value: Value = serde_json::from_slice(bytes)
            .map_err(|e| SpecError::new(FILE, format!("not valid JSON: {e}")))?;
        let Value::Object(c) = value else {
            return Err(SpecError::new(FILE, "not a JSON object"));
        };
        let model_type = string(&c, "model_type")?.unwrap_or_default();
        let family = match model_type.as_str() {
            "bert" => Family::Bert,
            other => {
                return Err(SpecError::new(
                    FILE,
                    format!("model_type '{other}' is not supported (supported: bert)"),
                ));
            }
        };
        let act = string(&c, "hidden_act")?.unwrap_or_else(|| "gelu".into());
        if act != "gelu" {
            return Err(SpecError::new(
                FILE,
                format!(
                    "hidden_act '{act}' is not supported (supported: gelu, the exact erf form)"
                ),
            ));
        }
        let positions = string(&c, "position_embedding_type")?.unwrap_or_else(|| "absolute".into());
        if positions != "absolute" {
            return Err(SpecError::new(
                FILE,
                format!(
                    "position_embedding_type '{positions}' is not supported (supported: absolute)"
                ),
            ));
        }
        if c.get("is_decoder").and_then(Value::as_bool) == Some(true) {
            return Err(SpecError::new(
                FILE,
                "is_decoder is true: only encoders are served",
            ));
        }
        let hidden = size(&c, "hidden_size", None)?;
        let heads = size(&c, "num_attention_heads", None)?;
        if hidden % heads != 0 {
            return Err(SpecError::new(
                FILE,
                format!("hidden_size {hidden} is not a multiple of num_attention_heads {heads}"),
            ));
        }
        let eps = match c.get("layer_norm_eps") {
            None => 1e-12,
            Some(v) => v
                .as_f64()
                .filter(|e| e.is_finite() && *e > 0.0 && *e < 1.0)
                .ok_or_else(|| {
                    SpecError::new(
                        FILE,
                        format!("layer_norm_eps {v} is not a small positive number"),
                    )
                })? as f32,
        };
        Ok(Self {
            family,
            vocab: size(&c, "vocab_size", None)?,
            hidden,
            layers: size(&c, "num_hidden_layers", None)?,
            heads,
            intermediate: size(&c, "intermediate_size", None)?,
            max_positions: size(&c, "max_position_embeddings", None)?,
            type_vocab: size(&c, "type_vocab_size", Some(2)).or_else(|e| {
                // 0 is allowed: a model without token types.
                if c.get("type_vocab_size").and_then(Value::as_u64) == Some(0) {
                    Ok(0)
                } else {
                    Err(e)
                }
            })?,
            eps,
            position_offset: match family {
                Family::Bert => 0,
            },
        })
    }

    /// Elements per attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// The longest sequence the position table holds, special tokens included.
    pub fn max_tokens(&self) -> usize {
        self.max_positions.saturating_sub(self.position_offset)
    }
}

/// A string field, `None` when absent.
fn string(c: &Map<String, Value>, field: &str) -> Result<Option<String>, SpecError> {
    match c.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(SpecError::new(
            FILE,
            format!("{field} is {other}, not a string"),
        )),
    }
}

/// A positive size field, `default` when absent (required when `None`).
fn size(c: &Map<String, Value>, field: &str, default: Option<usize>) -> Result<usize, SpecError> {
    let Some(v) = c.get(field) else {
        return default.ok_or_else(|| SpecError::new(FILE, format!("{field} is missing")));
    };
    v.as_u64()
        .filter(|n| (1..=MAX_SIZE).contains(n))
        .map(|n| n as usize)
        .ok_or_else(|| {
            SpecError::new(
                FILE,
                format!("{field} is {v}, not a size in 1..={MAX_SIZE}"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINILM: &str = r#"{"architectures":["BertModel"],"hidden_act":"gelu","hidden_size":384,
        "intermediate_size":1536,"layer_norm_eps":1e-12,"max_position_embeddings":512,
        "model_type":"bert","num_attention_heads":12,"num_hidden_layers":6,"pad_token_id":0,
        "position_embedding_type":"absolute","type_vocab_size":2,"vocab_size":30522}"#;

    /// MiniLM's config would be misread.
    #[test]
    fn reads_a_bert_config() {
        let c = EncoderConfig::parse(MINILM.as_bytes()).expect("parses");
        assert_eq!(c.family, Family::Bert);
        assert_eq!((c.vocab, c.hidden, c.layers, c.heads), (30522, 384, 6, 12));
        assert_eq!(
            (c.intermediate, c.max_positions, c.type_vocab),
            (1536, 512, 2)
        );
        assert_eq!(c.head_dim(), 32);
        assert_eq!(c.max_tokens(), 512);
        assert!((c.eps - 1e-12).abs() < 1e-15);
    }

    /// A model this worker cannot run would be accepted, or refused without naming the field.
    #[test]
    fn refuses_what_it_cannot_run_naming_the_field() {
        for (edit, field) in [
            (r#""model_type":"bert""#, r#""model_type":"llama""#),
            (r#""hidden_act":"gelu""#, r#""hidden_act":"relu""#),
            (
                r#""position_embedding_type":"absolute""#,
                r#""position_embedding_type":"relative_key""#,
            ),
            (r#""hidden_size":384"#, r#""hidden_size":385"#),
            (r#""num_hidden_layers":6"#, r#""num_hidden_layers":-1"#),
            (r#""layer_norm_eps":1e-12"#, r#""layer_norm_eps":"x""#),
            (r#""pad_token_id":0,"#, r#""is_decoder":true,"#),
        ] {
            let bad = MINILM.replace(edit, field);
            assert_ne!(bad, MINILM, "{edit}");
            let e = EncoderConfig::parse(bad.as_bytes()).expect_err(field);
            assert_eq!(e.file, "config.json");
            let name = field.split('"').nth(1).expect("field name");
            assert!(e.to_string().contains(name), "{e} should name {name}");
        }
        let missing = MINILM.replace(r#""intermediate_size":1536,"#, "");
        let e = EncoderConfig::parse(missing.as_bytes()).expect_err("missing");
        assert!(
            e.to_string().contains("intermediate_size is missing"),
            "{e}"
        );
        assert!(EncoderConfig::parse(b"[1]").is_err());
        assert!(EncoderConfig::parse(b"{").is_err());
    }
}
