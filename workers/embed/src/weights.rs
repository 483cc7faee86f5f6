//! The encoder's tensors, found by their Hugging Face names and checked against the
//! configuration: [`EncoderWeights::find`] over any tensor handle (the SDK's `Tensor` in the
//! worker, plain values in tests), then [`EncoderWeights::try_map`] into what a backend
//! computes with (host slices, device pointers). Nothing is copied here.
//!
//! BERT names, under an optional prefix (`bert.`, ...):
//! `embeddings.{word,position,token_type}_embeddings.weight`, `embeddings.LayerNorm`,
//! `encoder.layer.{i}.attention.self.{query,key,value}`, `.attention.output.dense`,
//! `.attention.output.LayerNorm`, `.intermediate.dense`, `.output.dense`,
//! `.output.LayerNorm`; a LayerNorm's `weight`/`bias` may be the older `gamma`/`beta`.

use modelshare_kernels::WeightDtype;
use modelshare_kernels::bert::{Embeddings, Layer};
pub use modelshare_kernels::bert::{EncoderWeights, Linear, Norm};

use crate::spec::{EncoderConfig, SpecError};

/// A tensor as the lookup finds it.
#[derive(Clone, Debug)]
pub struct Found<T> {
    /// Element type (`None`: one no encoder weight can have, such as an integer type).
    pub dtype: Option<WeightDtype>,
    /// Dimensions, outermost first.
    pub shape: Vec<u64>,
    /// The handle.
    pub handle: T,
}

/// Finds and checks every tensor through `lookup` (by full name): shapes must match
/// `config`, dtypes must be one float type throughout.
pub fn find<T: Clone>(
    config: &EncoderConfig,
    lookup: &dyn Fn(&str) -> Option<Found<T>>,
) -> Result<EncoderWeights<T>, SpecError> {
    let prefix = config
            .family
            .tensor_prefixes()
            .iter()
            .find(|p| lookup(&format!("{p}embeddings.word_embeddings.weight")).is_some())
            .ok_or_else(|| {
                SpecError::new(
                    "model.safetensors",
                    "has no tensor embeddings.word_embeddings.weight (nor under bert. or model.): not a BERT checkpoint",
                )
            })?;
    let mut finder = Finder {
        lookup,
        prefix,
        dtype: None,
    };
    let (h, i) = (config.hidden as u64, config.intermediate as u64);
    let embeddings = Embeddings {
        word: finder.get(
            "embeddings.word_embeddings.weight",
            &[config.vocab as u64, h],
        )?,
        position: finder.get(
            "embeddings.position_embeddings.weight",
            &[config.max_positions as u64, h],
        )?,
        token_type: if config.type_vocab == 0 {
            None
        } else {
            Some(finder.get(
                "embeddings.token_type_embeddings.weight",
                &[config.type_vocab as u64, h],
            )?)
        },
        norm: finder.norm("embeddings.LayerNorm", h)?,
    };
    let mut layers = Vec::with_capacity(config.layers);
    for l in 0..config.layers {
        let p = format!("encoder.layer.{l}");
        layers.push(Layer {
            query: finder.linear(&format!("{p}.attention.self.query"), h, h)?,
            key: finder.linear(&format!("{p}.attention.self.key"), h, h)?,
            value: finder.linear(&format!("{p}.attention.self.value"), h, h)?,
            attn_out: finder.linear(&format!("{p}.attention.output.dense"), h, h)?,
            attn_norm: finder.norm(&format!("{p}.attention.output.LayerNorm"), h)?,
            up: finder.linear(&format!("{p}.intermediate.dense"), i, h)?,
            down: finder.linear(&format!("{p}.output.dense"), h, i)?,
            out_norm: finder.norm(&format!("{p}.output.LayerNorm"), h)?,
        });
    }
    Ok(EncoderWeights {
        dtype: finder.dtype.unwrap_or(WeightDtype::F32),
        embeddings,
        layers,
    })
}

/// Looks tensors up under one prefix, checking shapes and that the dtype is one throughout.
struct Finder<'a, T> {
    lookup: &'a dyn Fn(&str) -> Option<Found<T>>,
    prefix: &'a str,
    dtype: Option<WeightDtype>,
}

impl<T> Finder<'_, T> {
    fn get(&mut self, name: &str, shape: &[u64]) -> Result<T, SpecError> {
        let full = format!("{}{name}", self.prefix);
        let found = (self.lookup)(&full)
            .ok_or_else(|| SpecError::new(&full, "is missing from the weights"))?;
        self.check(&full, found, shape)
    }

    /// A LayerNorm's `weight`/`bias`, or the older `gamma`/`beta`.
    fn norm(&mut self, name: &str, hidden: u64) -> Result<Norm<T>, SpecError> {
        let old = (self.lookup)(&format!("{}{name}.weight", self.prefix)).is_none()
            && (self.lookup)(&format!("{}{name}.gamma", self.prefix)).is_some();
        let (g, b) = if old {
            ("gamma", "beta")
        } else {
            ("weight", "bias")
        };
        Ok(Norm {
            gamma: self.get(&format!("{name}.{g}"), &[hidden])?,
            beta: self.get(&format!("{name}.{b}"), &[hidden])?,
        })
    }

    fn linear(&mut self, name: &str, out: u64, inp: u64) -> Result<Linear<T>, SpecError> {
        Ok(Linear {
            weight: self.get(&format!("{name}.weight"), &[out, inp])?,
            bias: self.get(&format!("{name}.bias"), &[out])?,
        })
    }

    fn check(&mut self, full: &str, found: Found<T>, shape: &[u64]) -> Result<T, SpecError> {
        if found.shape != shape {
            return Err(SpecError::new(
                full,
                format!(
                    "has shape {:?}; config.json asks for {shape:?}",
                    found.shape
                ),
            ));
        }
        let dtype = found.dtype.ok_or_else(|| {
            SpecError::new(full, "is not a floating-point tensor (f32, f16 or bf16)")
        })?;
        match self.dtype {
            None => self.dtype = Some(dtype),
            Some(d) if d != dtype => {
                return Err(SpecError::new(
                    full,
                    format!(
                        "is {}, the tensors before it {}: mixed dtypes are not supported",
                        dtype.name(),
                        d.name()
                    ),
                ));
            }
            Some(_) => {}
        }
        Ok(found.handle)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::spec::EncoderConfig;

    const CONFIG: &str = r#"{"hidden_size":8,"intermediate_size":16,"max_position_embeddings":10,
        "model_type":"bert","num_attention_heads":2,"num_hidden_layers":2,"vocab_size":50}"#;

    /// Every tensor name of a BERT checkpoint with their shapes, under `prefix`.
    fn bert_tensors(prefix: &str) -> HashMap<String, Vec<u64>> {
        let mut t = HashMap::new();
        let mut add = |n: String, s: &[u64]| t.insert(format!("{prefix}{n}"), s.to_vec());
        add("embeddings.word_embeddings.weight".into(), &[50, 8]);
        add("embeddings.position_embeddings.weight".into(), &[10, 8]);
        add("embeddings.token_type_embeddings.weight".into(), &[2, 8]);
        add("embeddings.LayerNorm.weight".into(), &[8]);
        add("embeddings.LayerNorm.bias".into(), &[8]);
        for l in 0..2 {
            for (n, o, i) in [
                ("attention.self.query", 8, 8),
                ("attention.self.key", 8, 8),
                ("attention.self.value", 8, 8),
                ("attention.output.dense", 8, 8),
                ("intermediate.dense", 16, 8),
                ("output.dense", 8, 16),
            ] {
                add(format!("encoder.layer.{l}.{n}.weight"), &[o, i]);
                add(format!("encoder.layer.{l}.{n}.bias"), &[o]);
            }
            for n in ["attention.output.LayerNorm", "output.LayerNorm"] {
                add(format!("encoder.layer.{l}.{n}.weight"), &[8]);
                add(format!("encoder.layer.{l}.{n}.bias"), &[8]);
            }
        }
        t
    }

    fn find_in(
        t: &HashMap<String, Vec<u64>>,
        dtype: impl Fn(&str) -> Option<WeightDtype>,
    ) -> Result<EncoderWeights<String>, SpecError> {
        let config = EncoderConfig::parse(CONFIG.as_bytes()).expect("config");
        super::find(&config, &|name| {
            t.get(name).map(|s| Found {
                dtype: dtype(name),
                shape: s.clone(),
                handle: name.to_owned(),
            })
        })
    }

    /// A checkpoint's tensors would be found under the wrong names, or with a prefix missed.
    #[test]
    fn finds_every_tensor_with_or_without_a_prefix() {
        for prefix in ["", "bert."] {
            let w = find_in(&bert_tensors(prefix), |_| Some(WeightDtype::F16)).expect("finds");
            assert_eq!(w.dtype, WeightDtype::F16);
            assert_eq!(w.layers.len(), 2);
            assert_eq!(
                w.layers[1].down.weight,
                format!("{prefix}encoder.layer.1.output.dense.weight")
            );
            assert_eq!(
                w.embeddings.norm.beta,
                format!("{prefix}embeddings.LayerNorm.bias")
            );
            let mut seen = 0;
            let mapped = w
                .try_map(|n| -> Result<usize, ()> {
                    seen += 1;
                    Ok(n.len())
                })
                .expect("maps");
            assert_eq!(seen, bert_tensors(prefix).len());
            assert_eq!(mapped.layers[0].query.bias, w.layers[0].query.bias.len());
        }
        // Older LayerNorm names.
        let old: HashMap<_, _> = bert_tensors("")
            .into_iter()
            .map(|(k, v)| {
                (
                    k.replace("LayerNorm.weight", "LayerNorm.gamma")
                        .replace("LayerNorm.bias", "LayerNorm.beta"),
                    v,
                )
            })
            .collect();
        let w = find_in(&old, |_| Some(WeightDtype::F32)).expect("gamma/beta");
        assert_eq!(
            w.layers[0].out_norm.gamma,
            "encoder.layer.0.output.LayerNorm.gamma"
        );
    }

    /// A checkpoint that does not match its config, or mixes dtypes, would be run anyway.
    #[test]
    fn refuses_missing_misshapen_and_mixed_tensors_naming_them() {
        let mut t = bert_tensors("");
        t.remove("encoder.layer.1.intermediate.dense.bias");
        let e = find_in(&t, |_| Some(WeightDtype::F32)).expect_err("missing");
        assert_eq!(e.file, "encoder.layer.1.intermediate.dense.bias");
        let mut t = bert_tensors("");
        t.insert(
            "encoder.layer.0.attention.self.key.weight".into(),
            vec![8, 9],
        );
        let e = find_in(&t, |_| Some(WeightDtype::F32)).expect_err("shape");
        assert!(
            e.to_string()
                .contains("has shape [8, 9]; config.json asks for [8, 8]"),
            "{e}"
        );
        let e = find_in(&bert_tensors(""), |n| {
            Some(if n.contains("layer.1") {
                WeightDtype::BF16
            } else {
                WeightDtype::F16
            })
        })
        .expect_err("mixed");
        assert!(e.to_string().contains("mixed dtypes"), "{e}");
        let e = find_in(&bert_tensors(""), |_| None).expect_err("ints");
        assert!(e.to_string().contains("not a floating-point tensor"), "{e}");
        let e = find_in(&HashMap::new(), |_| None).expect_err("empty");
        assert!(e.to_string().contains("not a BERT checkpoint"), "{e}");
    }
}
