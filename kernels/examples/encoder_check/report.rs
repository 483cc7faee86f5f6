//! What the check prints: a line per check, the BERT-large timing table, the count of checks
//! passed, and the JSON line.

use std::fmt::Write as _;

use crate::compare::Check;
use crate::timing::Timing;

/// One line per check.
pub fn print_checks(checks: &[Check]) {
    for c in checks {
        println!(
            "{:<22} {:<4} {:<34} worst {:>8.3}  rel {:.1e}  bad {}  unwritten {}  guard {}  {}",
            c.name,
            c.dtype.name(),
            c.shape,
            c.worst,
            c.rel_norm,
            c.bad,
            c.unwritten,
            if c.guard_ok { "ok" } else { "HIT" },
            if c.ok { "ok" } else { "MISMATCH" }
        );
    }
}

/// The BERT-large timing table, the count of checks passed and the JSON line.
pub fn print_summary(device: &str, checks: &[Check], timings: &[Timing]) {
    println!();
    println!("BERT-large layer, f16, batch 128, seq 64, hidden 1024, 16 heads, ffn 4096:");
    println!("| step | median (us) | TFLOP/s | GB/s |");
    println!("| --- | --- | --- | --- |");
    for t in timings {
        println!(
            "| {} | {:.1} | {} | {} |",
            t.name,
            t.us,
            t.tflops.map_or(String::new(), |v| format!("{v:.0}")),
            t.gbps.map_or(String::new(), |v| format!("{v:.0}"))
        );
    }
    println!(
        "checks: {}/{} ok",
        checks.iter().filter(|c| c.ok).count(),
        checks.len()
    );
    println!("{}", json_line(device, checks, timings));
}

pub fn json_line(device: &str, checks: &[Check], timings: &[Timing]) -> String {
    let num = |v: f64| {
        if v.is_finite() {
            format!("{v:.4e}")
        } else {
            "null".to_owned()
        }
    };
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\"device\": \"{}\", \"checks\": [",
        device.replace('"', "'")
    );
    for (i, c) in checks.iter().enumerate() {
        let _ = write!(
            s,
            "{}{{\"name\": \"{}\", \"dtype\": \"{}\", \"shape\": \"{}\", \"worst\": {}, \"rel_norm\": {}, \
             \"bad\": {}, \"unwritten\": {}, \"guard_ok\": {}, \"ok\": {}}}",
            if i == 0 { "" } else { ", " },
            c.name,
            c.dtype.name(),
            c.shape.replace('"', "'"),
            num(c.worst),
            num(c.rel_norm),
            c.bad,
            c.unwritten,
            c.guard_ok,
            c.ok
        );
    }
    s.push_str("], \"bert_large_f16\": [");
    for (i, t) in timings.iter().enumerate() {
        let opt = |v: Option<f64>| v.map_or("null".to_owned(), |v| format!("{v:.1}"));
        let _ = write!(
            s,
            "{}{{\"step\": \"{}\", \"median_us\": {:.1}, \"tflops\": {}, \"gbps\": {}}}",
            if i == 0 { "" } else { ", " },
            t.name,
            t.us,
            opt(t.tflops),
            opt(t.gbps)
        );
    }
    let ok = checks.iter().all(|c| c.ok);
    let _ = write!(s, "], \"ok\": {ok}}}");
    s
}
