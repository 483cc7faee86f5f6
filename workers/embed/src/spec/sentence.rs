//! The sentence-transformers files: which modules follow the transformer (`modules.json`),
//! its sequence limit and casing (`sentence_bert_config.json`), the pooling
//! (`<Pooling module>/config.json`) and whether a `Normalize` module ends the pipeline.
//!
//! Taken: a Transformer, then one Pooling, then an optional Normalize, as sentence-transformers
//! runs them. Any other module (Dense, a second Pooling, ...) is refused, naming it.

use serde_json::Value;

use super::SpecError;

/// `modules.json`, the sentence-transformers pipeline.
pub const MODULES_FILE: &str = "modules.json";
/// `sentence_bert_config.json`, the transformer module's settings.
pub const SBERT_FILE: &str = "sentence_bert_config.json";

const TRANSFORMER: &str = "sentence_transformers.models.Transformer";
const POOLING: &str = "sentence_transformers.models.Pooling";
const NORMALIZE: &str = "sentence_transformers.models.Normalize";

/// How token vectors become one sentence vector.
pub use modelshare_kernels::Pooling;

/// What the sentence-transformers files say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SentenceConfig {
    /// `max_seq_length` of `sentence_bert_config.json`.
    pub max_seq_length: Option<usize>,
    /// `do_lower_case` of `sentence_bert_config.json`: texts are lowercased before tokenizing.
    pub lower_case: bool,
    /// The Pooling module's mode.
    pub pooling: Pooling,
    /// Whether a Normalize module follows.
    pub normalize: bool,
}

impl SentenceConfig {
    /// Reads the files through `file` (a model's metadata by name). `Ok(None)`: the model
    /// has no `modules.json`, so is not a sentence-transformers model.
    pub fn read(file: &dyn Fn(&str) -> Option<Vec<u8>>) -> Result<Option<Self>, SpecError> {
        let Some(modules) = file(MODULES_FILE) else {
            return Ok(None);
        };
        let modules = json(MODULES_FILE, &modules)?;
        let Value::Array(modules) = modules else {
            return Err(SpecError::new(MODULES_FILE, "not a JSON list of modules"));
        };
        let mut seen_transformer = false;
        let mut pooling = None;
        let mut normalize = false;
        for (i, m) in modules.iter().enumerate() {
            let kind = m.get("type").and_then(Value::as_str).unwrap_or_default();
            let path = m.get("path").and_then(Value::as_str).unwrap_or_default();
            let out_of_order = |what: &str| {
                SpecError::new(
                    MODULES_FILE,
                    format!(
                        "module {i} ({kind}) {what}; supported: Transformer, Pooling, then optionally Normalize"
                    ),
                )
            };
            match kind {
                TRANSFORMER if !seen_transformer && i == 0 => seen_transformer = true,
                POOLING if seen_transformer && pooling.is_none() && !normalize => {
                    let name = if path.is_empty() {
                        "config.json".to_owned()
                    } else {
                        format!("{path}/config.json")
                    };
                    let bytes = file(&name).ok_or_else(|| {
                        SpecError::new(&name, "is missing (the Pooling module's configuration)")
                    })?;
                    pooling = Some(pooling_mode(&name, &bytes)?);
                }
                NORMALIZE if pooling.is_some() && !normalize => normalize = true,
                TRANSFORMER | POOLING | NORMALIZE => return Err(out_of_order("is out of place")),
                _ => return Err(out_of_order("is not supported")),
            }
        }
        let pooling =
            pooling.ok_or_else(|| SpecError::new(MODULES_FILE, "has no Pooling module"))?;
        let (max_seq_length, lower_case) = match file(SBERT_FILE) {
            None => (None, false),
            Some(bytes) => {
                let c = json(SBERT_FILE, &bytes)?;
                let max = match c.get("max_seq_length") {
                    None | Some(Value::Null) => None,
                    Some(v) => Some(v.as_u64().filter(|n| *n >= 2 && *n <= 1 << 20).ok_or_else(
                        || {
                            SpecError::new(
                                SBERT_FILE,
                                format!("max_seq_length is {v}, not a length"),
                            )
                        },
                    )? as usize),
                };
                let lower = c
                    .get("do_lower_case")
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                (max, lower)
            }
        };
        Ok(Some(Self {
            max_seq_length,
            lower_case,
            pooling,
            normalize,
        }))
    }
}

fn json(file: &str, bytes: &[u8]) -> Result<Value, SpecError> {
    serde_json::from_slice(bytes).map_err(|e| SpecError::new(file, format!("not valid JSON: {e}")))
}

/// The pooling mode of a Pooling module's `config.json`: the `pooling_mode_*_tokens`
/// switches (exactly one on), or a newer `pooling_mode` string.
pub fn pooling_mode(file: &str, bytes: &[u8]) -> Result<Pooling, SpecError> {
    let c = json(file, bytes)?;
    if let Some(mode) = c.get("pooling_mode").and_then(Value::as_str) {
        return parse_pooling(mode)
            .ok_or_else(|| SpecError::new(file, format!("pooling_mode '{mode}' is not supported (supported: mean, cls, max, mean_sqrt_len_tokens)")));
    }
    let switches = [
        ("pooling_mode_mean_tokens", Some(Pooling::Mean)),
        ("pooling_mode_cls_token", Some(Pooling::Cls)),
        ("pooling_mode_max_tokens", Some(Pooling::Max)),
        (
            "pooling_mode_mean_sqrt_len_tokens",
            Some(Pooling::MeanSqrtLen),
        ),
        ("pooling_mode_weightedmean_tokens", None),
        ("pooling_mode_lasttoken", None),
    ];
    let on: Vec<_> = switches
        .iter()
        .filter(|(k, _)| c.get(*k).and_then(Value::as_bool) == Some(true))
        .collect();
    match on.as_slice() {
        [(_, Some(mode))] => Ok(*mode),
        [(name, None)] => Err(SpecError::new(
            file,
            format!("{name} is not supported (supported: mean, cls, max, mean_sqrt_len tokens)"),
        )),
        [] => Err(SpecError::new(file, "no pooling_mode_* is true")),
        many => Err(SpecError::new(
            file,
            format!(
                "{} are all true: concatenated poolings are not supported",
                many.iter().map(|(k, _)| *k).collect::<Vec<_>>().join(", ")
            ),
        )),
    }
}

/// A pooling named as on the command line or in a newer Pooling config.
pub fn parse_pooling(name: &str) -> Option<Pooling> {
    match name {
        "mean" | "mean_tokens" => Some(Pooling::Mean),
        "cls" | "cls_token" => Some(Pooling::Cls),
        "max" | "max_tokens" => Some(Pooling::Max),
        "mean_sqrt_len" | "mean_sqrt_len_tokens" => Some(Pooling::MeanSqrtLen),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn files(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<Vec<u8>> + use<> {
        let map: HashMap<String, Vec<u8>> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect();
        move |name| map.get(name).cloned()
    }

    const MODULES: &str = r#"[{"idx":0,"name":"0","path":"","type":"sentence_transformers.models.Transformer"},
        {"idx":1,"name":"1","path":"1_Pooling","type":"sentence_transformers.models.Pooling"},
        {"idx":2,"name":"2","path":"2_Normalize","type":"sentence_transformers.models.Normalize"}]"#;
    const POOL_MEAN: &str = r#"{"word_embedding_dimension":384,"pooling_mode_cls_token":false,
        "pooling_mode_mean_tokens":true,"pooling_mode_max_tokens":false,"pooling_mode_mean_sqrt_len_tokens":false}"#;

    /// all-MiniLM-L6-v2's files would be misread.
    #[test]
    fn reads_minilm_files() {
        let f = files(&[
            ("modules.json", MODULES),
            ("1_Pooling/config.json", POOL_MEAN),
            (
                "sentence_bert_config.json",
                r#"{"max_seq_length":256,"do_lower_case":false}"#,
            ),
        ]);
        let c = SentenceConfig::read(&f).expect("reads").expect("is ST");
        assert_eq!(
            c,
            SentenceConfig {
                max_seq_length: Some(256),
                lower_case: false,
                pooling: Pooling::Mean,
                normalize: true
            }
        );
        assert_eq!(SentenceConfig::read(&files(&[])).expect("no files"), None);
    }

    /// Poolings other than mean would be misread, or unsupported ones accepted.
    #[test]
    fn reads_and_refuses_pooling_modes() {
        let cls = r#"{"pooling_mode_cls_token":true,"pooling_mode_mean_tokens":false}"#;
        assert_eq!(pooling_mode("p", cls.as_bytes()), Ok(Pooling::Cls));
        assert_eq!(
            pooling_mode("p", br#"{"pooling_mode":"max"}"#),
            Ok(Pooling::Max)
        );
        assert_eq!(
            pooling_mode("p", br#"{"pooling_mode_mean_sqrt_len_tokens":true}"#),
            Ok(Pooling::MeanSqrtLen)
        );
        for (bad, says) in [
            (
                r#"{"pooling_mode_weightedmean_tokens":true}"#,
                "pooling_mode_weightedmean_tokens",
            ),
            (
                r#"{"pooling_mode_lasttoken":true}"#,
                "pooling_mode_lasttoken",
            ),
            (
                r#"{"pooling_mode_cls_token":true,"pooling_mode_mean_tokens":true}"#,
                "concatenated",
            ),
            (r#"{}"#, "no pooling_mode_"),
            (r#"{"pooling_mode":"weird"}"#, "pooling_mode 'weird'"),
        ] {
            let e = pooling_mode("1_Pooling/config.json", bad.as_bytes()).expect_err(bad);
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    /// A pipeline with modules this worker does not run would be served wrongly.
    #[test]
    fn refuses_unsupported_pipelines() {
        let dense = MODULES.replace("models.Normalize", "models.Dense");
        let no_pool = r#"[{"path":"","type":"sentence_transformers.models.Transformer"}]"#;
        let twice = MODULES.replace("models.Normalize", "models.Pooling");
        for (modules, says) in [
            (
                dense.as_str(),
                "sentence_transformers.models.Dense) is not supported",
            ),
            (no_pool, "has no Pooling module"),
            (twice.as_str(), "is out of place"),
            ("{}", "not a JSON list"),
        ] {
            let f = files(&[
                ("modules.json", modules),
                ("1_Pooling/config.json", POOL_MEAN),
                ("2_Normalize/config.json", POOL_MEAN),
            ]);
            let e = SentenceConfig::read(&f).expect_err(says);
            assert!(e.to_string().contains(says), "{e}");
        }
        let f = files(&[("modules.json", MODULES)]);
        let e = SentenceConfig::read(&f).expect_err("missing pooling config");
        assert_eq!(e.file, "1_Pooling/config.json");
        let f = files(&[
            ("modules.json", MODULES),
            ("1_Pooling/config.json", POOL_MEAN),
            ("sentence_bert_config.json", r#"{"max_seq_length":"long"}"#),
        ]);
        let e = SentenceConfig::read(&f).expect_err("bad max");
        assert!(e.to_string().contains("max_seq_length"), "{e}");
    }
}
