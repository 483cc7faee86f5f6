//! What the JSON visitors of headers and indexes share: the parse context that carries a
//! limit error out of serde, and a string that says what it is when it is not one.

use std::cell::Cell;
use std::fmt;

use serde::de::{self, DeserializeSeed, Visitor};

use super::WeightLimits;
use super::error::{WeightsError, quoted};

/// What the visitors need to know; `limit_hit` carries a [`WeightsError::Limit`] out of
/// serde, which only lets them return a message.
pub(super) struct Ctx<'a> {
    pub(super) display: &'a str,
    pub(super) limits: &'a WeightLimits,
    pub(super) limit_hit: Cell<Option<WeightsError>>,
}

impl Ctx<'_> {
    /// Records a limit error and returns the serde error that stops the parse.
    pub(super) fn over_limit<E: de::Error>(&self, what: String, limit: usize, actual: usize) -> E {
        let as_u64 = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        self.limit_hit.set(Some(WeightsError::limit(
            self.display,
            what.clone(),
            as_u64(limit),
            as_u64(actual),
        )));
        E::custom(format!("{what} is over the limit"))
    }
}

/// A string, with context for the error if it is anything else.
pub(super) struct StringSeed<'a> {
    pub(super) what: &'static str,
    pub(super) name: &'a str,
}

impl<'de> DeserializeSeed<'de> for StringSeed<'_> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for StringSeed<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a string ({} {})", self.what, quoted(self.name))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }
}
