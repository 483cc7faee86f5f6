//! Why a model cannot be served: always naming the file and field (or tensor) at fault.

/// A model this worker cannot run, or whose files it cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}: {what}")]
pub struct SpecError {
    /// The file at fault (`config.json`, `1_Pooling/config.json`, a tensor's name, ...).
    pub file: String,
    /// What is wrong, naming the field.
    pub what: String,
}

impl SpecError {
    /// An error about `file`.
    pub fn new(file: impl Into<String>, what: impl Into<String>) -> Self {
        Self {
            file: file.into(),
            what: what.into(),
        }
    }
}
