//! The summary: the timed table against the d2d copy, the counts, and the JSON line.

use std::fmt::Write as _;

use crate::gemv_check::GemvResult;
use crate::ms64_check::{Ms64Result, Ms64Run};

/// The timed table against the d2d copy, the counts, and the JSON line.
pub fn print_summary(
    device: &str,
    gemv_results: &[GemvResult],
    ms64: &Ms64Run,
    d2d_gbps: f64,
    disk_ok: bool,
) {
    let gpu_gbps = ms64.gpu_gbps;
    println!();
    println!("| gemv | rows x cols | layout | rel err | time (us) | GB/s | % of d2d |");
    println!("| --- | --- | --- | --- | --- | --- | --- |");
    for r in gemv_results.iter().filter(|r| r.gbps.is_some()) {
        let g = r.gbps.unwrap_or(0.0);
        println!(
            "| {} | {}x{} | {} | {:.1e} | {:.1} | {:.0} | {:.0}% |",
            r.dtype.name(),
            r.rows,
            r.cols,
            r.layout,
            r.rel_err,
            r.median_us.unwrap_or(0.0),
            g,
            100.0 * g / d2d_gbps
        );
    }
    println!("| d2d copy 1 GiB | | | | | {d2d_gbps:.0} | 100% |");
    println!(
        "| ms64 gpu 1 GiB | | | | | {gpu_gbps:.0} | {:.0}% |",
        100.0 * gpu_gbps / d2d_gbps
    );
    println!(
        "gemv: {}/{} ok; ms64: {}/{} ok; cache: {}",
        gemv_results.iter().filter(|r| r.ok).count(),
        gemv_results.len(),
        ms64.results.iter().filter(|r| r.gpu == r.cpu).count(),
        ms64.results.len(),
        if disk_ok { "ok" } else { "MISMATCH" }
    );
    println!(
        "{}",
        json_line(
            device,
            gemv_results,
            &ms64.results,
            d2d_gbps,
            ms64.cpu1_gbps,
            ms64.cpun_gbps
        )
    );
}

pub fn json_line(
    device: &str,
    gemv: &[GemvResult],
    ms64: &[Ms64Result],
    d2d_gbps: f64,
    cpu1_gbps: f64,
    cpun_gbps: f64,
) -> String {
    let num = |v: Option<f64>| v.map_or("null".to_owned(), |v| format!("{v:.3}"));
    let mut s = String::new();
    let _ = write!(
        s,
        "{{\"device\": \"{}\", \"gemv\": [",
        device.replace('"', "'")
    );
    for (i, r) in gemv.iter().enumerate() {
        let _ = write!(
            s,
            "{}{{\"dtype\": \"{}\", \"rows\": {}, \"cols\": {}, \"w_offset\": {}, \"x_offset\": {}, \
             \"layout\": \"{}\", \"rel_err\": {:e}, \"unwritten\": {}, \"ok\": {}, \"median_us\": {}, \"gbps\": {}}}",
            if i == 0 { "" } else { ", " },
            r.dtype.name(),
            r.rows,
            r.cols,
            r.w_offset,
            r.x_offset,
            r.layout,
            if r.rel_err.is_finite() {
                r.rel_err
            } else {
                -1.0
            },
            r.unwritten + r.guard_hit,
            r.ok,
            num(r.median_us),
            num(r.gbps)
        );
    }
    s.push_str("], \"ms64\": [");
    for (i, r) in ms64.iter().enumerate() {
        let _ = write!(
            s,
            "{}{{\"len\": {}, \"offset\": {}, \"gpu\": \"{:016x}\", \"cpu\": \"{:016x}\", \"ok\": {}, \"gbps\": {}}}",
            if i == 0 { "" } else { ", " },
            r.len,
            r.offset,
            r.gpu,
            r.cpu,
            r.gpu == r.cpu,
            num(r.gbps)
        );
    }
    let _ = write!(
        s,
        "], \"d2d_gbps\": {d2d_gbps:.1}, \"ms64_cpu_gbps_1thread\": {cpu1_gbps:.2}, \
         \"ms64_cpu_gbps_parallel\": {cpun_gbps:.2}}}"
    );
    s
}
