//! One tensor of a safetensors header: [`TensorEntry`], and the visitors that read and check its
//! `dtype`, `shape` and `data_offsets` (sizes, overflow, rank limit) as serde meets them.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::dtype::DType;
use super::error::quoted;
use super::json::{Ctx, StringSeed};

/// One tensor declared by a header, after validation.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorEntry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Start of the tensor's bytes, relative to the data section.
    pub begin: u64,
    /// End (exclusive) of the tensor's bytes, relative to the data section.
    pub end: u64,
}

impl TensorEntry {
    /// Number of bytes the tensor occupies.
    pub fn byte_length(&self) -> u64 {
        self.end.saturating_sub(self.begin)
    }
}

/// One tensor's entry: exactly `dtype`, `shape` and `data_offsets`.
pub(super) struct TensorSeed<'a> {
    pub(super) ctx: &'a Ctx<'a>,
    pub(super) name: String,
}

impl<'de> DeserializeSeed<'de> for TensorSeed<'_> {
    type Value = TensorEntry;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<TensorEntry, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for TensorSeed<'_> {
    type Value = TensorEntry;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "an object with dtype, shape and data_offsets for tensor {}",
            quoted(&self.name)
        )
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<TensorEntry, A::Error> {
        let name = self.name;
        let q = quoted(&name);
        let mut dtype = None;
        let mut shape = None;
        let mut offsets = None;
        while let Some(key) = map.next_key::<String>()? {
            let twice = || de::Error::custom(format!("tensor {q} has key {} twice", quoted(&key)));
            match key.as_str() {
                "dtype" => {
                    if dtype.is_some() {
                        return Err(twice());
                    }
                    let s = map.next_value_seed(StringSeed {
                        what: "dtype of tensor",
                        name: &name,
                    })?;
                    let d = DType::parse(&s).ok_or_else(|| {
                        de::Error::custom(format!("tensor {q} has unknown dtype {}", quoted(&s)))
                    })?;
                    dtype = Some(d);
                }
                "shape" => {
                    if shape.is_some() {
                        return Err(twice());
                    }
                    shape = Some(map.next_value_seed(ShapeSeed {
                        ctx: self.ctx,
                        name: &name,
                    })?);
                }
                "data_offsets" => {
                    if offsets.is_some() {
                        return Err(twice());
                    }
                    offsets = Some(map.next_value_seed(OffsetsSeed { name: &name })?);
                }
                _ => {
                    return Err(de::Error::custom(format!(
                        "tensor {q} has unknown key {} (allowed: dtype, shape, data_offsets)",
                        quoted(&key)
                    )));
                }
            }
        }
        let missing = |what: &str| de::Error::custom(format!("tensor {q} has no {what}"));
        let dtype = dtype.ok_or_else(|| missing("dtype"))?;
        let shape: Vec<u64> = shape.ok_or_else(|| missing("shape"))?;
        let (begin, end) = offsets.ok_or_else(|| missing("data_offsets"))?;

        let elements = if shape.contains(&0) {
            0
        } else {
            shape
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| {
                    de::Error::custom(format!(
                        "tensor {q} has shape {shape:?}, whose element count overflows 64 bits"
                    ))
                })?
        };
        let needed = elements.checked_mul(dtype.size_bytes()).ok_or_else(|| {
            de::Error::custom(format!(
                "tensor {q} has shape {shape:?} of {dtype}, whose byte size overflows 64 bits"
            ))
        })?;
        // begin <= end was checked by OffsetsSeed.
        let held = end.saturating_sub(begin);
        if held != needed {
            return Err(de::Error::custom(format!(
                "tensor {q} data_offsets [{begin}, {end}] hold {held} bytes \
                 but shape {shape:?} of {dtype} needs {needed}"
            )));
        }
        Ok(TensorEntry {
            name,
            dtype,
            shape,
            begin,
            end,
        })
    }
}

/// A tensor's shape: at most `max_rank` non-negative integers.
struct ShapeSeed<'a> {
    ctx: &'a Ctx<'a>,
    name: &'a str,
}

impl<'de> DeserializeSeed<'de> for ShapeSeed<'_> {
    type Value = Vec<u64>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<u64>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ShapeSeed<'_> {
    type Value = Vec<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a list of non-negative integers (shape of tensor {})",
            quoted(self.name)
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
        let max_rank = self.ctx.limits.max_rank;
        let mut dims = Vec::new();
        while let Some(d) = seq.next_element_seed(UintSeed {
            what: "shape entry",
            name: self.name,
        })? {
            if dims.len() >= max_rank {
                // Count the rest without storing it, to report the real rank.
                let mut rank = dims.len().saturating_add(1);
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    rank = rank.saturating_add(1);
                }
                return Err(self.ctx.over_limit(
                    format!("rank of tensor {}", quoted(self.name)),
                    max_rank,
                    rank,
                ));
            }
            dims.push(d);
        }
        Ok(dims)
    }
}

/// A tensor's `data_offsets`: exactly two non-negative integers, begin <= end.
struct OffsetsSeed<'a> {
    name: &'a str,
}

impl<'de> DeserializeSeed<'de> for OffsetsSeed<'_> {
    type Value = (u64, u64);

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<(u64, u64), D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for OffsetsSeed<'_> {
    type Value = (u64, u64);

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a list of two non-negative integers (data_offsets of tensor {})",
            quoted(self.name)
        )
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(u64, u64), A::Error> {
        let q = quoted(self.name);
        let element = || UintSeed {
            what: "data_offsets entry",
            name: self.name,
        };
        let not_two = || {
            de::Error::custom(format!(
                "tensor {q} data_offsets must hold exactly two integers [begin, end]"
            ))
        };
        let begin = seq.next_element_seed(element())?.ok_or_else(not_two)?;
        let end = seq.next_element_seed(element())?.ok_or_else(not_two)?;
        if seq.next_element::<IgnoredAny>()?.is_some() {
            return Err(not_two());
        }
        if begin > end {
            return Err(de::Error::custom(format!(
                "tensor {q} data_offsets [{begin}, {end}] begin after they end"
            )));
        }
        Ok((begin, end))
    }
}

/// A non-negative integer that fits in a u64.
struct UintSeed<'a> {
    what: &'static str,
    name: &'a str,
}

impl UintSeed<'_> {
    fn bad<E: de::Error>(&self, v: impl fmt::Display) -> E {
        E::custom(format!(
            "tensor {} has {} {v}, which is not a non-negative 64-bit integer",
            quoted(self.name),
            self.what
        ))
    }
}

impl<'de> DeserializeSeed<'de> for UintSeed<'_> {
    type Value = u64;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        d.deserialize_u64(self)
    }
}

impl<'de> Visitor<'de> for UintSeed<'_> {
    type Value = u64;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a non-negative integer ({} of tensor {})",
            self.what,
            quoted(self.name)
        )
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
        Ok(v)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
        u64::try_from(v).map_err(|_| self.bad(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
        Err(self.bad(v))
    }
}
