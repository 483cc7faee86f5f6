//! The error type of the weights module, and helpers that turn parser errors into it.

use std::fmt::Write as _;

/// Everything that can go wrong while resolving and validating a model's weights.
///
/// Every message names the file (relative to the model root) and the reason, so it can
/// be returned to the client as is.
#[derive(Debug, thiserror::Error)]
pub enum WeightsError {
    /// The requested path is not acceptable (absolute, contains `..`, escapes the root
    /// through a symlink, not a file/dir of the expected kind). → gRPC `INVALID_ARGUMENT`
    #[error("bad model path {}: {reason}", quoted(.path))]
    BadPath { path: String, reason: String },

    /// The requested path does not exist under the root. → `NOT_FOUND`
    #[error("model path {} does not exist under the model root", quoted(.path))]
    NotFound { path: String },

    /// A weight or index file is malformed: names the file (relative to the root), the
    /// byte offset in that file, and the reason. → `INVALID_ARGUMENT`
    #[error("{file}: byte {offset}: {reason}")]
    Malformed {
        file: String,
        offset: u64,
        reason: String,
    },

    /// The model is over a configured limit (too many tensors/shards, metadata file too
    /// big...). → `INVALID_ARGUMENT`
    #[error("{file}: {what} is {actual}, over the limit of {limit}")]
    Limit {
        file: String,
        what: String,
        limit: u64,
        actual: u64,
    },

    /// I/O error reading a file. → `FAILED_PRECONDITION` (permissions), `DATA_LOSS` (cut
    /// short), else `INTERNAL`
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

impl WeightsError {
    pub(crate) fn malformed(file: &str, offset: u64, reason: impl Into<String>) -> Self {
        WeightsError::Malformed {
            file: file.to_owned(),
            offset,
            reason: reason.into(),
        }
    }

    pub(crate) fn limit(file: &str, what: impl Into<String>, limit: u64, actual: u64) -> Self {
        WeightsError::Limit {
            file: file.to_owned(),
            what: what.into(),
            limit,
            actual,
        }
    }

    pub(crate) fn bad_path(path: &str, reason: impl Into<String>) -> Self {
        WeightsError::BadPath {
            path: path.to_owned(),
            reason: reason.into(),
        }
    }

    pub fn io(file: &str, source: std::io::Error) -> Self {
        WeightsError::Io {
            file: file.to_owned(),
            source,
        }
    }
}

/// Longest piece of an untrusted string quoted in a message.
const QUOTE_MAX_BYTES: usize = 80;

/// Quotes an untrusted name for a message: `'name'`, control characters escaped and
/// long names cut short, so a hostile header cannot flood or garble the logs.
pub(crate) fn quoted(name: &str) -> String {
    let mut cut = name.len().min(QUOTE_MAX_BYTES);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    let mut out = String::with_capacity(cut + 8);
    out.push('\'');
    for c in name.get(..cut).unwrap_or_default().chars() {
        if c == '\'' {
            out.push_str("\\'");
        } else {
            let _ = write!(out, "{}", c.escape_debug());
        }
    }
    if cut < name.len() {
        out.push_str("...");
    }
    out.push('\'');
    out
}

/// Longest parser message kept in an error (serde quotes unexpected values whole).
const MESSAGE_MAX_BYTES: usize = 240;

/// `text` cut to at most `max` bytes on a character boundary, with "..." when cut.
fn cut_short(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}...", &text[..cut])
}

/// Converts a `serde_json` error on `text` (which starts at byte `base` of `file`) into
/// [`WeightsError::Malformed`] at the byte where parsing failed.
///
/// Errors raised by our own visitors carry the position serde_json had reached when they
/// were raised; syntax errors are prefixed to say the JSON itself is broken, and an
/// unexpected end of input is placed at the end of `text`.
pub(crate) fn json_error(
    file: &str,
    base: u64,
    text: &[u8],
    err: &serde_json::Error,
) -> WeightsError {
    let at = if err.classify() == serde_json::error::Category::Eof {
        u64::try_from(text.len()).unwrap_or(u64::MAX)
    } else {
        json_error_offset(text, err.line(), err.column())
    };
    let offset = base.saturating_add(at);
    let full = err.to_string();
    let suffix = format!(" at line {} column {}", err.line(), err.column());
    // serde echoes an unexpected value whole ("invalid type: string \"...\""): cut it short.
    let message = cut_short(
        full.strip_suffix(&suffix).unwrap_or(&full),
        MESSAGE_MAX_BYTES,
    );
    let reason = match err.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            format!("not valid JSON: {message}")
        }
        serde_json::error::Category::Data | serde_json::error::Category::Io => message,
    };
    WeightsError::malformed(file, offset, reason)
}

/// The byte offset in `text` of serde_json's 1-based `line` and `column` (which point just
/// past the offending byte); 0 when serde_json did not know the position.
fn json_error_offset(text: &[u8], line: usize, column: usize) -> u64 {
    if line == 0 {
        return 0;
    }
    let line_start = if line == 1 {
        0
    } else {
        text.iter()
            .enumerate()
            .filter(|&(_, &b)| b == b'\n')
            .nth(line - 2)
            .map_or(text.len(), |(i, _)| i.saturating_add(1))
    };
    let offset = line_start
        .saturating_add(column.saturating_sub(1))
        .min(text.len());
    u64::try_from(offset).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Untrusted names would reach logs unescaped or unbounded.
    #[test]
    fn quoted_escapes_and_truncates() {
        assert_eq!(quoted("w"), "'w'");
        assert_eq!(quoted("a\nb'c"), "'a\\nb\\'c'");
        let long = "é".repeat(100);
        let q = quoted(&long);
        assert!(q.ends_with("...'"));
        assert!(q.len() < 100);
    }

    /// JSON error offsets would point at the wrong byte.
    #[test]
    fn json_offsets_point_at_the_offending_byte() {
        for text in [
            &b"{\"a\": x}"[..],
            b"{\n  \"a\": x}",
            b"{\"a\":1,\n\n\"b\"\n:\n x }",
        ] {
            let err = serde_json::from_slice::<serde_json::Value>(text).unwrap_err();
            let at = json_error_offset(text, err.line(), err.column());
            assert_eq!(
                text[at as usize],
                b'x',
                "{err} in {:?}",
                String::from_utf8_lossy(text)
            );
        }
        let err = serde_json::from_slice::<serde_json::Value>(b"{\"a\": 1").unwrap_err();
        match json_error("m.safetensors", 8, b"{\"a\": 1", &err) {
            WeightsError::Malformed { offset, reason, .. } => {
                assert_eq!(offset, 8 + 7);
                assert_eq!(reason, "not valid JSON: EOF while parsing an object");
            }
            other => panic!("unexpected {other:?}"),
        }
    }
}
