//! The error type of the check.

use std::error::Error;

/// Why the check could not run (`main` prints it and exits 2).
pub type Res<T> = Result<T, Box<dyn Error>>;
