//! Model names: the pattern every model (and tenant) name must match, and [`NameError`].
//!
//! A leaf: it imports nothing from the crate, so the domain types ([`crate::model`]), the
//! tenants file and the error type can all use it.

/// Longest model name accepted.
pub const MAX_NAME_LEN: usize = 64;

/// Why a name was refused. Shown as `name: model name '<name>' <reason>`; it becomes
/// `INVALID_ARGUMENT` (through [`crate::error::CoreError::InvalidName`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: model name '{}' {reason}", Self::FIELD, name.escape_debug())]
pub struct NameError {
    /// The name refused.
    pub name: String,
    /// What is wrong with it.
    pub reason: NameProblem,
}

impl NameError {
    /// The request field a name error is about.
    pub const FIELD: &'static str = "name";
}

/// What is wrong with a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NameProblem {
    /// The name is empty.
    #[error("is empty")]
    Empty,
    /// The first character is not `a-z` or `0-9`.
    #[error("must start with a-z or 0-9")]
    BadStart,
    /// Longer than [`MAX_NAME_LEN`] bytes.
    #[error("is longer than {MAX_NAME_LEN} bytes")]
    TooLong,
    /// A character outside `a-z`, `0-9`, `.`, `_`, `-`.
    #[error("contains '{}': only a-z, 0-9, '.', '_' and '-' are allowed", .0.escape_debug())]
    BadChar(char),
}

/// Checks a model name against `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let invalid = |reason| NameError {
        name: name.to_owned(),
        reason,
    };
    let mut chars = name.chars();
    match chars.next() {
        None => return Err(invalid(NameProblem::Empty)),
        Some(c) if !(c.is_ascii_lowercase() || c.is_ascii_digit()) => {
            return Err(invalid(NameProblem::BadStart));
        }
        Some(_) => {}
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(NameProblem::TooLong));
    }
    if let Some(c) =
        chars.find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(*c)))
    {
        return Err(invalid(NameProblem::BadChar(c)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A regression here lets malformed names (path-like, upper case, too long) into the registry.
    #[test]
    fn names_follow_the_documented_pattern() {
        for ok in ["a", "llama-7b", "m.v2_final", "0abc", &"x".repeat(64)] {
            assert!(validate_name(ok).is_ok(), "{ok} should be accepted");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "A",
            "a/b",
            "a b",
            "../x",
            "é",
            &"x".repeat(65),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// The messages must read exactly as before the error had its own type: clients and the
    /// end-to-end tests match on them.
    #[test]
    fn messages_name_the_field_and_the_name() {
        let text = |n: &str| validate_name(n).expect_err("refused").to_string();
        assert_eq!(text(""), "name: model name '' is empty");
        assert_eq!(
            text("Bad/Name"),
            "name: model name 'Bad/Name' must start with a-z or 0-9"
        );
        assert_eq!(
            text("bad/name"),
            "name: model name 'bad/name' contains '/': only a-z, 0-9, '.', '_' and '-' are allowed"
        );
        assert_eq!(
            text(&"x".repeat(65)),
            format!(
                "name: model name '{}' is longer than 64 bytes",
                "x".repeat(65)
            )
        );
        assert_eq!(
            text("a\nb"),
            "name: model name 'a\\nb' contains '\\n': only a-z, 0-9, '.', '_' and '-' are allowed"
        );
    }
}
