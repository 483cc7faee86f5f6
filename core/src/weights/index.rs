//! Parsing of `model.safetensors.index.json`, the map from tensor names to shard files.

use std::cell::Cell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};

use super::WeightLimits;
use super::error::{WeightsError, json_error, quoted};
use super::json::{Ctx, StringSeed};
use super::path::normalize_relative;

/// The name of the index file of a sharded model.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// A parsed index: `{"metadata": {...any JSON...}, "weight_map": {tensor: shard}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    /// (tensor name, shard file name), in file order. Shard names are normalized
    /// relative paths (`./a.safetensors` becomes `a.safetensors`).
    pub weight_map: Vec<(String, String)>,
    /// The distinct shard file names, in first-seen order.
    pub shards: Vec<String>,
}

/// Parses and validates an index file's contents. `display` is the file name used in
/// errors. Other top-level keys than `metadata` and `weight_map` are ignored.
pub fn parse_index(
    display: &str,
    bytes: &[u8],
    limits: &WeightLimits,
) -> Result<Index, WeightsError> {
    let size = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if size > limits.max_header_bytes {
        return Err(WeightsError::limit(
            display,
            "index file size",
            limits.max_header_bytes,
            size,
        ));
    }
    // JSON is UTF-8; the parts skipped below (other keys, `metadata`) are not checked by the
    // parser, so check the whole text first (found by fuzzing).
    if let Err(e) = std::str::from_utf8(bytes) {
        let at = u64::try_from(e.valid_up_to()).unwrap_or(u64::MAX);
        return Err(WeightsError::malformed(
            display,
            at,
            "index file is not valid UTF-8",
        ));
    }
    let ctx = Ctx {
        display,
        limits,
        limit_hit: Cell::new(None),
    };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let parsed = IndexSeed { ctx: &ctx }
        .deserialize(&mut de)
        .and_then(|index| de.end().map(|()| index));
    parsed.map_err(|e| {
        ctx.limit_hit
            .take()
            .unwrap_or_else(|| json_error(display, 0, bytes, &e))
    })
}

/// The top-level object.
struct IndexSeed<'a> {
    ctx: &'a Ctx<'a>,
}

impl<'de> DeserializeSeed<'de> for IndexSeed<'_> {
    type Value = Index;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Index, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for IndexSeed<'_> {
    type Value = Index;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object with a weight_map")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Index, A::Error> {
        let mut index = None;
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!(
                    "the index has key {} twice",
                    quoted(&key)
                )));
            }
            if key == "weight_map" {
                index = Some(map.next_value_seed(WeightMapSeed { ctx: self.ctx })?);
            } else {
                // `metadata` (any JSON) and keys we do not know.
                map.next_value::<IgnoredAny>()?;
            }
        }
        index.ok_or_else(|| de::Error::custom("the index has no weight_map"))
    }
}

/// The `weight_map` object.
struct WeightMapSeed<'a> {
    ctx: &'a Ctx<'a>,
}

impl<'de> DeserializeSeed<'de> for WeightMapSeed<'_> {
    type Value = Index;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Index, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for WeightMapSeed<'_> {
    type Value = Index;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object mapping tensor names to shard file names (weight_map)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Index, A::Error> {
        let limits = self.ctx.limits;
        let mut weight_map = Vec::new();
        let mut names = HashSet::new();
        let mut shards = Vec::new();
        let mut shard_set = HashSet::new();
        let mut count: usize = 0;
        while let Some(name) = map.next_key::<String>()? {
            if name.is_empty() {
                return Err(de::Error::custom("weight_map has an empty tensor name"));
            }
            if name.len() > limits.max_name_bytes {
                return Err(self.ctx.over_limit(
                    format!("length in bytes of tensor name {}", quoted(&name)),
                    limits.max_name_bytes,
                    name.len(),
                ));
            }
            if names.contains(&name) {
                return Err(de::Error::custom(format!(
                    "weight_map names tensor {} twice",
                    quoted(&name)
                )));
            }
            let shard = map.next_value_seed(StringSeed {
                what: "shard of tensor",
                name: &name,
            })?;
            let shard = match normalize_relative(&shard) {
                Ok(s) if s.ends_with(".safetensors") => s,
                Ok(_) => {
                    return Err(de::Error::custom(format!(
                        "weight_map puts tensor {} in shard {}, whose name does not end in .safetensors",
                        quoted(&name),
                        quoted(&shard)
                    )));
                }
                Err(reason) => {
                    return Err(de::Error::custom(format!(
                        "weight_map puts tensor {} in shard {}, whose name is not acceptable: {reason}",
                        quoted(&name),
                        quoted(&shard)
                    )));
                }
            };
            count = count.saturating_add(1);
            // Past the limit, keep parsing (to report the real count) but stop storing.
            if count <= limits.max_tensors {
                if !shard_set.contains(&shard) {
                    shard_set.insert(shard.clone());
                    shards.push(shard.clone());
                }
                names.insert(name.clone());
                weight_map.push((name, shard));
            }
        }
        if count > limits.max_tensors {
            return Err(self
                .ctx
                .over_limit("tensor count".to_owned(), limits.max_tensors, count));
        }
        if shards.len() > limits.max_shards {
            return Err(self.ctx.over_limit(
                "shard count".to_owned(),
                limits.max_shards,
                shards.len(),
            ));
        }
        if weight_map.is_empty() {
            return Err(de::Error::custom("weight_map is empty"));
        }
        Ok(Index { weight_map, shards })
    }
}
