//! Printing command results as readable tables or as JSON (one document per command).
//!
//! # Layout
//! - here: the writing of a line, the format, and what every printer shares (sizes, names of
//!   states, dtypes and backends, tables, JSON).
//! - `models`: versions and models: `load`, `unload`, `ls`, `access`.
//! - `describe`: `describe`, a version's manifest and device.
//! - `stats`: `stats`, memory use, devices, serving queues.
//! - `sessions`: `ps`, the worker sessions.
//! - `tenants`: `token new`, `token hash`, `reload-tenants`, and usage against quota.

mod describe;
mod models;
mod sessions;
mod stats;
mod tenants;

use comfy_table::presets::UTF8_BORDERS_ONLY;
use comfy_table::{Cell, CellAlignment, Table};
use modelshare_proto::v1 as pb;
use serde_json::Value;

pub use self::describe::describe;
pub use self::models::{access, loaded, models, versions};
pub use self::sessions::sessions;
pub use self::stats::stats;
pub use self::tenants::{new_token, tenants_reloaded, token_hash};

/// Writes one line to stdout. When the reader has gone (`modelshare ls | head`), exits quietly
/// instead of panicking as `println!` would.
pub fn write_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    if let Err(e) = written {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("error: cannot write to stdout: {e}");
        std::process::exit(1);
    }
}

/// `println!` through [`write_line`].
macro_rules! say {
    ($($arg:tt)*) => { $crate::commands::output::write_line(format_args!($($arg)*)) };
}
pub(crate) use say;

/// How results are printed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Readable tables.
    Table,
    /// JSON on one line.
    Json,
}

/// `1536` → `1.5 KiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A version's state as shown: `ready`, `loading`, ...
fn state_name(v: i32) -> &'static str {
    match pb::VersionState::try_from(v) {
        Ok(pb::VersionState::Loading) => "loading",
        Ok(pb::VersionState::Ready) => "ready",
        Ok(pb::VersionState::Draining) => "draining",
        Ok(pb::VersionState::Freed) => "freed",
        Ok(pb::VersionState::Failed) => "failed",
        Ok(pb::VersionState::Unspecified) | Err(_) => "unknown",
    }
}

/// A tensor's dtype as shown: `F32`, `BF16`, ...
fn dtype_name(v: i32) -> String {
    pb::DType::try_from(v)
        .map(|d| d.as_str_name().trim_start_matches("DTYPE_").to_owned())
        .unwrap_or_else(|_| format!("unknown({v})"))
}

/// A device's backend as shown: `host`, `cuda-ipc`, `cuda-vmm`.
fn backend_name(v: i32) -> &'static str {
    match pb::BackendKind::try_from(v) {
        Ok(pb::BackendKind::Host) => "host",
        Ok(pb::BackendKind::CudaIpc) => "cuda-ipc",
        Ok(pb::BackendKind::CudaVmm) => "cuda-vmm",
        Ok(pb::BackendKind::Unspecified) | Err(_) => "unknown",
    }
}

/// A model's owner (or a session's tenant) as shown in tables: `-` for none.
fn owner_text(owner: &str) -> &str {
    if owner.is_empty() { "-" } else { owner }
}

/// An empty table with `header`.
pub(super) fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header(header.iter().copied());
    t
}

/// A cell aligned right (numbers, sizes).
fn right(s: impl ToString) -> Cell {
    Cell::new(s.to_string()).set_alignment(CellAlignment::Right)
}

/// Prints one JSON document on one line.
pub(super) fn print_json(v: &Value) {
    say!("{v}");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes in tables must read as people expect.
    #[test]
    fn bytes_are_human_readable() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(12 << 30), "12.0 GiB");
    }
}
