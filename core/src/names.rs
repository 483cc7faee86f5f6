//! Model and tenant names: the patterns they must match, and [`NameError`].
//!
//! A model name is what people call a model: `all-MiniLM-L6-v2`, or a Hugging Face id
//! `sentence-transformers/all-MiniLM-L6-v2`. Each of its one or two `/`-separated segments
//! matches `[A-Za-z0-9][A-Za-z0-9._-]*` and is not a route word of the doors (`ready`,
//! `infer`, `versions`, `config`, `stats`, ...: `/v2/models/{org}/{name}/infer` must read one
//! way only). Names are unique and looked up without regard to ASCII case
//! (`Registry::canonical`, `Registry::resolve`); the spelling given
//! at the first load is the one shown. Tenant names keep the strict lower-case pattern
//! ([`validate_tenant_name`]): they are labels and directory names.
//!
//! A leaf: it imports nothing from the crate, so the domain types ([`crate::model`]), the
//! tenants file and the error type can all use it.

/// Longest model name accepted, in bytes (a Hugging Face id: an owner of up to 39 characters,
/// a repository of up to 96, and the `/`, fits with room).
pub const MAX_NAME_LEN: usize = 160;

/// Longest tenant name accepted.
pub const MAX_TENANT_NAME_LEN: usize = 64;

/// Words of the doors' routes that no segment of a model name may be (compared without case).
pub const ROUTE_WORDS: &[&str] = &[
    "ready",
    "infer",
    "versions",
    "config",
    "stats",
    "generate",
    "generate_stream",
    "index",
    "load",
    "unload",
];

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
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameProblem {
    /// The name is empty.
    #[error("is empty")]
    Empty,
    /// A segment does not start with a letter or a digit.
    #[error("must start with a letter or a digit (after a '/' too)")]
    BadStart,
    /// Longer than the limit (bytes).
    #[error("is longer than {0} bytes")]
    TooLong(usize),
    /// A character outside the pattern.
    #[error(
        "contains '{}': only letters, digits, '.', '_', '-' and one '/' are allowed",
        .0.escape_debug()
    )]
    BadChar(char),
    /// More than one `/`.
    #[error("has more than one '/' (at most owner/name)")]
    TooManySegments,
    /// A segment is a word of the doors' routes.
    #[error("has a segment '{0}', a word of the inference routes (not allowed: {words})", words = ROUTE_WORDS.join(", "))]
    RouteWord(String),
    /// A tenant name outside `[a-z0-9][a-z0-9._-]*`.
    #[error("must match [a-z0-9][a-z0-9._-]* (tenant names are lower case)")]
    NotLowerCase,
}

/// Checks a model name: one or two `/`-separated segments of `[A-Za-z0-9][A-Za-z0-9._-]*`,
/// none of them a route word, at most [`MAX_NAME_LEN`] bytes.
pub fn validate_name(name: &str) -> Result<(), NameError> {
    let invalid = |reason| NameError {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid(NameProblem::Empty));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid(NameProblem::TooLong(MAX_NAME_LEN)));
    }
    let segments: Vec<&str> = name.split('/').collect();
    if segments.len() > 2 {
        return Err(invalid(NameProblem::TooManySegments));
    }
    for segment in segments {
        match segment.chars().next() {
            Some(c) if c.is_ascii_alphanumeric() => {}
            _ => return Err(invalid(NameProblem::BadStart)),
        }
        if let Some(c) = segment
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || "._-".contains(*c)))
        {
            return Err(invalid(NameProblem::BadChar(c)));
        }
        if ROUTE_WORDS.iter().any(|w| w.eq_ignore_ascii_case(segment)) {
            return Err(invalid(NameProblem::RouteWord(segment.to_owned())));
        }
    }
    Ok(())
}

/// Checks a tenant name against `[a-z0-9][a-z0-9._-]{0,63}`.
pub fn validate_tenant_name(name: &str) -> Result<(), NameError> {
    let invalid = |reason| NameError {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid(NameProblem::Empty));
    }
    if name.len() > MAX_TENANT_NAME_LEN {
        return Err(invalid(NameProblem::TooLong(MAX_TENANT_NAME_LEN)));
    }
    let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let mut chars = name.chars();
    let first_ok = chars.next().is_some_and(lower);
    if !first_ok || !chars.all(|c| lower(c) || "._-".contains(c)) {
        return Err(invalid(NameProblem::NotLowerCase));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A regression here refuses the names people use (upper case, Hugging Face ids) or lets
    /// malformed ones (paths, route words, too long) into the registry.
    #[test]
    fn names_follow_the_documented_pattern() {
        let long_ok = format!("{}/{}", "o".repeat(39), "x".repeat(96));
        for ok in [
            "a",
            "llama-7b",
            "m.v2_final",
            "0abc",
            "all-MiniLM-L6-v2",
            "sentence-transformers/all-MiniLM-L6-v2",
            "BAAI/bge-small-en-v1.5",
            &long_ok,
        ] {
            assert!(validate_name(ok).is_ok(), "{ok} should be accepted");
        }
        for bad in [
            "",
            "-a",
            ".a",
            "a//b",
            "a/b/c",
            "/a",
            "a/",
            "a b",
            "../x",
            "a/..",
            "é",
            "enc/infer",
            "org/Versions",
            "stats",
            &"x".repeat(161),
        ] {
            assert!(validate_name(bad).is_err(), "{bad:?} should be refused");
        }
    }

    /// Tenant names keep the strict lower-case pattern.
    #[test]
    fn tenant_names_stay_lower_case() {
        for ok in ["a", "search", "team-1.x_y"] {
            assert!(validate_tenant_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", "A", "a/b", "-a", &"x".repeat(65)] {
            assert!(validate_tenant_name(bad).is_err(), "{bad:?}");
        }
    }

    /// The messages name the field, the name and what is wrong: clients and the end-to-end
    /// tests match on them.
    #[test]
    fn messages_name_the_field_and_the_name() {
        let text = |n: &str| validate_name(n).expect_err("refused").to_string();
        assert_eq!(text(""), "name: model name '' is empty");
        assert_eq!(
            text("Bad/-Name"),
            "name: model name 'Bad/-Name' must start with a letter or a digit (after a '/' too)"
        );
        assert_eq!(
            text("a/b/c"),
            "name: model name 'a/b/c' has more than one '/' (at most owner/name)"
        );
        assert_eq!(
            text(&"x".repeat(161)),
            format!(
                "name: model name '{}' is longer than 160 bytes",
                "x".repeat(161)
            )
        );
        assert_eq!(
            text("a\nb"),
            "name: model name 'a\\nb' contains '\\n': only letters, digits, '.', '_', '-' and one '/' are allowed"
        );
        assert!(text("org/infer").contains("a word of the inference routes"));
    }
}
