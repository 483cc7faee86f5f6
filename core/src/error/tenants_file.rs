//! [`TenantsFileError`]: why a tenants file was refused. A leaf, so that
//! [`crate::error::CoreError`] can wrap it without depending on the file parser.

/// Why a tenants file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TenantsFileError {
    /// The file could not be read.
    #[error("cannot read tenants file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The file is not valid for the schema.
    #[error("tenants file {path}: {reason}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong, and where.
        reason: String,
    },
}
