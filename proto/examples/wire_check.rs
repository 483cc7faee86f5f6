//! Compares the contract the crate was built from with the committed baseline,
//! `proto/wire-baseline.txt`, and says what changed; with `--update`, rewrites the baseline.
//!
//! ```text
//! cargo run -p modelshare-proto --example wire_check               # report
//! cargo run -p modelshare-proto --example wire_check -- --update   # accept compatible changes
//! cargo run -p modelshare-proto --example wire_check -- --update --allow-breaking
//! ```
//!
//! Exit status: 0 when the baseline is current (or was updated), 1 on a wire-incompatible
//! change (`--update` then writes nothing unless `--allow-breaking`: a deliberate break, which
//! also needs a new protocol version), 2 when compatible changes are not yet in the baseline,
//! 3 on a baseline that does not read or cannot be written.

#[path = "../wire/mod.rs"]
mod wire;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let update = args.iter().any(|a| a == "--update");
    let allow_breaking = args.iter().any(|a| a == "--allow-breaking");
    if let Some(unknown) = args
        .iter()
        .find(|a| !matches!(a.as_str(), "--update" | "--allow-breaking"))
    {
        eprintln!("unknown argument '{unknown}' (expected --update, --allow-breaking)");
        return ExitCode::from(3);
    }

    let path = wire::baseline_path();
    let current = wire::current();
    let text = wire::baseline_text(&current);
    let report = match std::fs::read_to_string(&path) {
        Ok(old) => match wire::Contract::parse(&old) {
            Ok(_) if old == text => {
                println!("{}: current", path.display());
                return ExitCode::SUCCESS;
            }
            Ok(baseline) => wire::compare(&baseline, &current),
            Err(e) => {
                eprintln!("{}: {e}", path.display());
                return ExitCode::from(3);
            }
        },
        // No baseline yet: everything is an addition.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            wire::compare(&wire::Contract::default(), &current)
        }
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(3);
        }
    };
    print!("{}", report.describe());
    if report.is_breaking() && !(update && allow_breaking) {
        eprintln!(
            "the change is wire-incompatible: workers built from the baseline would misread it \
             (reserve removed numbers, add new fields under new numbers){}",
            if update {
                "; the baseline was not updated (--allow-breaking for a deliberate break)"
            } else {
                ""
            }
        );
        return ExitCode::from(1);
    }
    if !update {
        eprintln!(
            "the baseline is not current{}; run: {}",
            if report.is_unchanged() {
                " (its text differs from what --update writes)"
            } else {
                ""
            },
            wire::UPDATE_COMMAND
        );
        return ExitCode::from(2);
    }
    if let Err(e) = std::fs::write(&path, text) {
        eprintln!("{}: {e}", path.display());
        return ExitCode::from(3);
    }
    println!("{}: updated", path.display());
    ExitCode::SUCCESS
}
