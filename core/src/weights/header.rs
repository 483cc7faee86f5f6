//! Parsing and validation of one safetensors file's header.
//!
//! A safetensors file is an 8-byte little-endian header length, a JSON header of that
//! many bytes, then the data section. The header is untrusted: the length is checked
//! against the file and the limits before anything is read, the JSON is parsed by
//! visitors that reject duplicate and unknown keys as they meet them (serde_json's own
//! `Map` would silently keep the last duplicate), and every tensor's range is checked
//! against its shape, the data section and its neighbours.
//!
//! This file reads the file and walks the top-level object; [`super::tensor`] parses each
//! tensor's entry and `super::json` holds what the visitors share.

use std::cell::Cell;
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::{ErrorKind, Read};

use serde::de::{self, DeserializeSeed, MapAccess, Visitor};

use super::WeightLimits;
use super::error::{WeightsError, json_error, quoted};
use super::json::{Ctx, StringSeed};
use super::tensor::TensorSeed;

// Moved to `super::tensor`; re-exported for callers of the old path.
pub use super::tensor::TensorEntry;

/// Size of the header-length prefix that opens every safetensors file.
pub const LENGTH_PREFIX_BYTES: u64 = 8;

/// The key of the optional string→string metadata object in a header.
const METADATA_KEY: &str = "__metadata__";

/// The validated header of one safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    /// Length of the JSON header in bytes.
    pub header_len: u64,
    /// Absolute offset of the data section: 8 + `header_len`.
    pub data_start: u64,
    /// Length of the data section: the file's length minus `data_start`.
    pub data_len: u64,
    /// The tensors, sorted by `begin`.
    pub tensors: Vec<TensorEntry>,
    /// The header's `__metadata__` object (empty if absent).
    pub metadata: BTreeMap<String, String>,
}

/// Parses and validates the header of one safetensors file of `file_len` bytes.
/// `display` is the file name used in errors.
///
/// Reads exactly the 8-byte prefix and the header from `reader` (which must be at the
/// start of the file), never the data section.
pub fn parse_header(
    display: &str,
    reader: &mut impl Read,
    file_len: u64,
    limits: &WeightLimits,
) -> Result<Header, WeightsError> {
    let (header_len, text) = read_header_text(display, reader, file_len, limits)?;
    let data_start = header_len
        .checked_add(LENGTH_PREFIX_BYTES)
        .ok_or_else(|| WeightsError::malformed(display, 0, "header length overflows"))?;
    let data_len = file_len
        .checked_sub(data_start)
        .ok_or_else(|| WeightsError::malformed(display, 0, "header runs past the file"))?;

    check_json_object(display, &text)?;
    let (mut tensors, metadata) = parse_entries(display, &text, limits)?;

    // Stable: ties keep file order.
    tensors.sort_by_key(|t| (t.begin, t.end));
    check_ranges(display, &tensors, data_start, data_len)?;

    Ok(Header {
        header_len,
        data_start,
        data_len,
        tensors,
        metadata,
    })
}

/// Reads the 8-byte length prefix and the header it announces, once the length is checked
/// against the file and the limits: the header's length and bytes.
fn read_header_text(
    display: &str,
    reader: &mut impl Read,
    file_len: u64,
    limits: &WeightLimits,
) -> Result<(u64, Vec<u8>), WeightsError> {
    let Some(room) = file_len.checked_sub(LENGTH_PREFIX_BYTES) else {
        return Err(WeightsError::malformed(
            display,
            0,
            format!(
                "file is {file_len} bytes, too short for the {LENGTH_PREFIX_BYTES}-byte header length"
            ),
        ));
    };
    let mut prefix = [0u8; 8];
    read_exact(display, reader, &mut prefix, 0)?;
    let header_len = u64::from_le_bytes(prefix);
    check_header_len(display, header_len, room, file_len, limits)?;
    let len = usize::try_from(header_len).map_err(|_| {
        WeightsError::limit(display, "header length", usize::MAX as u64, header_len)
    })?;
    // Bounded: header_len is at most max_header_bytes and at most the file's length.
    let mut text = vec![0u8; len];
    read_exact(display, reader, &mut text, LENGTH_PREFIX_BYTES)?;
    Ok((header_len, text))
}

/// Checks a header length read from the prefix: within the `room` the file has after the
/// prefix, within the limit, not 0.
fn check_header_len(
    display: &str,
    header_len: u64,
    room: u64,
    file_len: u64,
    limits: &WeightLimits,
) -> Result<(), WeightsError> {
    if header_len > room {
        return Err(WeightsError::malformed(
            display,
            LENGTH_PREFIX_BYTES,
            format!("header length {header_len} runs past the end of the {file_len}-byte file"),
        ));
    }
    if header_len > limits.max_header_bytes {
        return Err(WeightsError::limit(
            display,
            "header length",
            limits.max_header_bytes,
            header_len,
        ));
    }
    if header_len == 0 {
        return Err(WeightsError::malformed(
            display,
            LENGTH_PREFIX_BYTES,
            "header is empty; it must be a JSON object",
        ));
    }
    Ok(())
}

/// Checks that the header's bytes are UTF-8 and open a JSON object.
fn check_json_object(display: &str, text: &[u8]) -> Result<(), WeightsError> {
    if let Err(e) = std::str::from_utf8(text) {
        let at = u64::try_from(e.valid_up_to()).unwrap_or(u64::MAX);
        return Err(WeightsError::malformed(
            display,
            LENGTH_PREFIX_BYTES.saturating_add(at),
            "header is not valid UTF-8",
        ));
    }
    if text.first() != Some(&b'{') {
        return Err(WeightsError::malformed(
            display,
            LENGTH_PREFIX_BYTES,
            "header does not begin with '{'; it must be a JSON object",
        ));
    }
    Ok(())
}

/// Parses the header's JSON object: its tensors, in file order, and its `__metadata__`. A
/// limit reached while parsing is the error, else the JSON error with its position.
fn parse_entries(
    display: &str,
    text: &[u8],
    limits: &WeightLimits,
) -> Result<(Vec<TensorEntry>, BTreeMap<String, String>), WeightsError> {
    let ctx = Ctx {
        display,
        limits,
        limit_hit: Cell::new(None),
    };
    let mut de = serde_json::Deserializer::from_slice(text);
    let parsed = HeaderSeed { ctx: &ctx }
        .deserialize(&mut de)
        .and_then(|raw| de.end().map(|()| raw));
    match parsed {
        Ok(raw) => Ok(raw),
        Err(e) => Err(ctx
            .limit_hit
            .take()
            .unwrap_or_else(|| json_error(display, LENGTH_PREFIX_BYTES, text, &e))),
    }
}

/// Reads exactly `buf.len()` bytes that sit at `offset` in the file.
fn read_exact(
    display: &str,
    reader: &mut impl Read,
    buf: &mut [u8],
    offset: u64,
) -> Result<(), WeightsError> {
    reader.read_exact(buf).map_err(|e| {
        if e.kind() == ErrorKind::UnexpectedEof {
            WeightsError::malformed(
                display,
                offset,
                "file ended before its stated length (was it truncated while being read?)",
            )
        } else {
            WeightsError::io(display, e)
        }
    })
}

/// Checks that the ranges tile the data section exactly, as the format requires (and its
/// reference implementation checks): sorted by `begin`, each starts where the previous one
/// ended (no hole, no overlap; an empty tensor sits at the current position), none runs past
/// the section, and the last one ends at its end (no trailing bytes). A hole or trailing bytes
/// would let the file carry data no tensor names (one file, two formats). `tensors` must be
/// sorted by `(begin, end)`; errors name the byte offsets in the file.
fn check_ranges(
    display: &str,
    tensors: &[TensorEntry],
    data_start: u64,
    data_len: u64,
) -> Result<(), WeightsError> {
    let mut pos: u64 = 0;
    let mut previous: Option<&TensorEntry> = None;
    for t in tensors {
        let at = data_start.saturating_add(t.begin);
        if t.end > data_len {
            return Err(WeightsError::malformed(
                display,
                at,
                format!(
                    "tensor {} data_offsets [{}, {}] run past the end of the file \
                     (its data section holds {} bytes)",
                    quoted(&t.name),
                    t.begin,
                    t.end,
                    data_len
                ),
            ));
        }
        if t.begin > pos {
            return Err(WeightsError::malformed(
                display,
                data_start.saturating_add(pos),
                format!(
                    "bytes [{}, {}) of the file (data_offsets [{pos}, {}]) belong to no tensor: \
                     a hole before tensor {}",
                    data_start.saturating_add(pos),
                    at,
                    t.begin,
                    quoted(&t.name)
                ),
            ));
        }
        if t.begin < pos {
            let f = previous.map_or("?", |f| f.name.as_str());
            let (fb, fe) = previous.map_or((0, 0), |f| (f.begin, f.end));
            return Err(WeightsError::malformed(
                display,
                at,
                format!(
                    "tensors {} [{fb}, {fe}] and {} [{}, {}] overlap",
                    quoted(f),
                    quoted(&t.name),
                    t.begin,
                    t.end
                ),
            ));
        }
        pos = t.end;
        previous = Some(t);
    }
    if pos != data_len {
        return Err(WeightsError::malformed(
            display,
            data_start.saturating_add(pos),
            format!(
                "bytes [{}, {}) of the file, after the last tensor, belong to no tensor \
                 ({} trailing bytes)",
                data_start.saturating_add(pos),
                data_start.saturating_add(data_len),
                data_len - pos
            ),
        ));
    }
    Ok(())
}

type RawHeader = (Vec<TensorEntry>, BTreeMap<String, String>);

/// The whole header object.
struct HeaderSeed<'a> {
    ctx: &'a Ctx<'a>,
}

impl<'de> DeserializeSeed<'de> for HeaderSeed<'_> {
    type Value = RawHeader;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<RawHeader, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for HeaderSeed<'_> {
    type Value = RawHeader;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object mapping tensor names to their entries")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RawHeader, A::Error> {
        let limits = self.ctx.limits;
        let mut tensors = Vec::new();
        let mut names = HashSet::new();
        let mut metadata = None;
        let mut count: usize = 0;
        while let Some(name) = map.next_key::<String>()? {
            if name == METADATA_KEY {
                if metadata.is_some() {
                    return Err(de::Error::custom("'__metadata__' appears twice"));
                }
                metadata = Some(map.next_value_seed(MetadataSeed)?);
                continue;
            }
            if name.is_empty() {
                return Err(de::Error::custom("a tensor has an empty name"));
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
                    "tensor {} appears twice",
                    quoted(&name)
                )));
            }
            let entry = map.next_value_seed(TensorSeed {
                ctx: self.ctx,
                name,
            })?;
            count = count.saturating_add(1);
            // Past the limit, keep parsing (to report the real count) but stop storing.
            if count <= limits.max_tensors {
                names.insert(entry.name.clone());
                tensors.push(entry);
            }
        }
        if count > limits.max_tensors {
            return Err(self
                .ctx
                .over_limit("tensor count".to_owned(), limits.max_tensors, count));
        }
        Ok((tensors, metadata.unwrap_or_default()))
    }
}

/// The `__metadata__` object: string keys to string values.
struct MetadataSeed;

impl<'de> DeserializeSeed<'de> for MetadataSeed {
    type Value = BTreeMap<String, String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object of string values for '__metadata__'")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut out = BTreeMap::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!(
                    "'__metadata__' has key {} twice",
                    quoted(&key)
                )));
            }
            let value = map.next_value_seed(StringSeed {
                what: "'__metadata__' value of key",
                name: &key,
            })?;
            out.insert(key, value);
        }
        Ok(out)
    }
}
