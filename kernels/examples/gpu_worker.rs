//! A GPU worker on modelshare's CUDA backend, and the GPU check's workhorse.
//!
//! - `check`: attach (retrying while the version does not exist yet, so it can attach during a
//!   load), make a stream wait on the ready event *on the device*, enqueue GEMV over every 2-D
//!   weight before any host synchronisation, then compare each result with the CPU reference
//!   on the same bytes. `--hold` then keeps GEMVs in flight until the process is killed.
//! - `bench-gemv`: GEMV over every 2-D weight on the imported mapping vs the same weights
//!   copied into this process's own memory, and the device's copy bandwidth as the anchor.
//! - `attach-bench`: attach latency (RPC + handle open + event open) over N attaches; CUDA
//!   context creation measured separately. Reports the handle kind it got. `--pause-us U`
//!   waits U µs (spinning) after each release (as the Python bench does after each drop, whose release
//!   goes on in the background), so that no attach overlaps the previous one's release.
//! - `loop --secs S`: GEMV over every 2-D weight, pass after pass, for S seconds, whatever
//!   happens to the server: the first pass is checked against the CPU reference (first 4
//!   matrices), every later pass must equal the first bit for bit. Prints `{"event":"started"}`
//!   after the first pass; reports passes, bad passes, and whether the session re-attached
//!   (a server restart).
//! - `write-probe --how memcpy|kernel`: tries to write into the attached arena, by a host copy
//!   (cuMemcpyHtoD) or by a kernel (a GEMV whose output is the arena), and reports what the
//!   driver said. On VMM mappings both must fail (the kernel faults this process only); on
//!   legacy IPC they succeed.
//!
//! Every mode prints one JSON line last.
//!
//! ```sh
//! gpu_worker check --server unix:/tmp/ms/grpc.sock --model m8 [--version 1] [--hold]
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::driver::{CudaStream, DevicePtr};
use modelshare_kernels::{KernelCache, WeightDtype, gemv, reference};
use modelshare_proto::v1::DType;
use modelshare_worker::{Model, Session, Tensor};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    mode: String,
    server: String,
    model: String,
    version: u32,
    hold: bool,
    announce: bool,
    iters: usize,
    n: usize,
    retry_secs: u64,
    secs: u64,
    how: String,
    /// attach-bench: microseconds to sleep after each release, before the next timed attach.
    pause_us: u64,
}

fn args() -> Res<Args> {
    let mut it = std::env::args().skip(1);
    let mode = it
        .next()
        .ok_or("usage: gpu_worker check|bench-gemv|attach-bench --server S --model M")?;
    let mut a = Args {
        mode,
        server: String::new(),
        model: String::new(),
        version: 0,
        hold: false,
        announce: false,
        iters: 20,
        n: 1000,
        retry_secs: 60,
        secs: 30,
        how: "memcpy".into(),
        pause_us: 0,
    };
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--server" => a.server = val()?,
            "--model" => a.model = val()?,
            "--version" => a.version = val()?.parse()?,
            "--iters" => a.iters = val()?.parse()?,
            "--n" => a.n = val()?.parse()?,
            "--retry-secs" => a.retry_secs = val()?.parse()?,
            "--secs" => a.secs = val()?.parse()?,
            "--how" => a.how = val()?,
            "--pause-us" => a.pause_us = val()?.parse()?,
            "--hold" => a.hold = true,
            "--announce" => a.announce = true,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(a)
}

fn weight_dtype(t: &Tensor) -> Option<WeightDtype> {
    match t.dtype() {
        DType::DtypeF32 => Some(WeightDtype::F32),
        DType::DtypeF16 => Some(WeightDtype::F16),
        DType::DtypeBf16 => Some(WeightDtype::BF16),
        _ => None,
    }
}

/// 2-D weights GEMV can run on: (tensor, dtype, rows, cols).
fn matrices(model: &Model) -> Vec<(Tensor, WeightDtype, usize, usize)> {
    model
        .tensors()
        .into_iter()
        .filter_map(|t| {
            let d = weight_dtype(&t)?;
            match t.shape() {
                [r, c] if *r > 0 && *c > 0 => Some((t.clone(), d, *r as usize, *c as usize)),
                _ => None,
            }
        })
        .collect()
}

fn random_f32(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            ((s.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f32 / (1u64 << 23) as f32) - 1.0
        })
        .collect()
}

fn reference_gemv(
    bytes: &[u8],
    dtype: WeightDtype,
    x: &[f32],
    rows: usize,
    cols: usize,
) -> Res<Vec<f32>> {
    Ok(match dtype {
        WeightDtype::F32 => reference::gemv_f32(
            bytemuck::try_cast_slice(bytes).map_err(|e| format!("{e}"))?,
            x,
            rows,
            cols,
        ),
        WeightDtype::F16 => reference::gemv_f16(
            bytemuck::try_cast_slice(bytes).map_err(|e| format!("{e}"))?,
            x,
            rows,
            cols,
        ),
        WeightDtype::BF16 => reference::gemv_bf16(
            bytemuck::try_cast_slice(bytes).map_err(|e| format!("{e}"))?,
            x,
            rows,
            cols,
        ),
    })
}

fn rel_err(y: &[f32], r: &[f32]) -> f64 {
    let mut num = 0f64;
    let mut den = 0f64;
    for (a, b) in y.iter().zip(r) {
        let (a, b) = (f64::from(*a), f64::from(*b));
        if a.is_nan() {
            return f64::INFINITY;
        }
        num += (a - b) * (a - b);
        den += b * b;
    }
    (num / den.max(1e-30)).sqrt()
}

/// Creates the device's context before the first attach, to time it apart.
fn warm_context(session: &Session) -> Res<f64> {
    // The device attaches go to: this worker's own (a server of several devices), else the
    // server's one device.
    let uuid = session
        .attach_device()
        .or_else(|| session.device().map(|d| d.uuid.clone()))
        .unwrap_or_default();
    let t = Instant::now();
    let ordinal = modelshare_device::cuda::ordinal_of(&uuid)?;
    modelshare_device::cuda::context(ordinal)?;
    Ok(t.elapsed().as_secs_f64() * 1e3)
}

async fn attach_retrying(session: &Session, a: &Args) -> Res<Model> {
    let deadline = Instant::now() + Duration::from_secs(a.retry_secs);
    loop {
        match session.attach_version(&a.model, a.version).await {
            Ok(m) => return Ok(m),
            // The version does not exist yet (the load has not started): ask again. (While its
            // arena is being allocated the SDK itself retries.)
            Err(e) if Instant::now() < deadline && e.code() == Some(tonic::Code::NotFound) => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

struct Buffers {
    x: cudarc::driver::CudaSlice<f32>,
    y: cudarc::driver::CudaSlice<f32>,
    xs: Vec<f32>,
}

/// Enqueues y = W·x for every matrix on `stream` (no host synchronisation).
fn enqueue_all(
    cache: &KernelCache,
    stream: &Arc<CudaStream>,
    mats: &[(Tensor, WeightDtype, usize, usize)],
    bufs: &[Buffers],
    base: Option<u64>,
    arena_base: u64,
) -> Res<()> {
    for ((t, d, r, c), b) in mats.iter().zip(bufs) {
        let w = match base {
            Some(private) => private + t.offset(),
            None => t.device_ptr().ok_or("tensor not on the device")?,
        };
        let _ = arena_base;
        let (x, _gx) = b.x.device_ptr(stream);
        let (y, _gy) = b.y.device_ptr(stream);
        // SAFETY: w points at rows*cols elements of the arena (the manifest's byte length),
        // x and y are this process's buffers of cols and rows f32; nothing else writes them.
        unsafe { gemv::gemv(cache, stream, *d, w, x, y, *r, *c)? };
    }
    Ok(())
}

fn buffers(
    stream: &Arc<CudaStream>,
    mats: &[(Tensor, WeightDtype, usize, usize)],
) -> Res<Vec<Buffers>> {
    mats.iter()
        .enumerate()
        .map(|(i, (_, _, r, c))| {
            let xs = random_f32(1000 + i as u64, *c);
            Ok(Buffers {
                x: stream.clone_htod(&xs)?,
                y: stream.clone_htod(&vec![f32::NAN; *r])?,
                xs,
            })
        })
        .collect()
}

async fn check(a: &Args) -> Res<serde_json::Value> {
    let t0 = Instant::now();
    let session = Session::open(&a.server, "gpu-worker").await?;
    let context_ms = warm_context(&session)?;
    if a.announce {
        // Tells the GPU check that this worker is ready to attach (it then starts the load).
        println!(
            "{}",
            serde_json::json!({"event": "context-ready", "pid": std::process::id()})
        );
    }
    let t_attach = Instant::now();
    let model = attach_retrying(&session, a).await?;
    let attach_ms = t_attach.elapsed().as_secs_f64() * 1e3;
    let view = model.view();
    let ctx = view.context().ok_or("not a CUDA model")?;
    let arena_base = view.device_ptr().ok_or("not a CUDA model")?;
    let ready_at_attach = view.is_ready()?;
    let stream = ctx.new_stream()?;
    model.wait_ready(&stream)?;
    let mats = matrices(&model);
    let cache = KernelCache::new();
    let bufs = buffers(&stream, &mats)?;
    enqueue_all(&cache, &stream, &mats, &bufs, None, arena_base)?;
    stream.synchronize()?;
    let first_results_ms = t_attach.elapsed().as_secs_f64() * 1e3;
    // The device-side check: ms64 of every tensor, computed on the device, against the manifest.
    let mut ms64_checked = 0;
    let mut failures = Vec::new();
    if !model.attached_while_loading() {
        for t in model.tensors() {
            let (Some(ptr), len) = (t.device_ptr(), t.byte_length() as usize) else {
                continue;
            };
            // SAFETY: the tensor's bytes lie inside the imported arena, which nothing writes.
            let sum = unsafe { modelshare_kernels::checksum::ms64(&cache, &stream, ptr, len)? };
            if sum != t.expected_ms64() {
                failures.push(format!(
                    "{}: device ms64 {sum:016x} != manifest {:016x}",
                    t.name(),
                    t.expected_ms64()
                ));
            }
            ms64_checked += 1;
        }
    }
    let mut worst = 0f64;
    for ((t, d, r, c), b) in mats.iter().zip(&bufs) {
        let y = stream.clone_dtoh(&b.y)?;
        let w = host_weights(t, *d, &stream)?;
        let reference = reference_gemv(&w, *d, &b.xs, *r, *c)?;
        let err = rel_err(&y, &reference);
        // The reference reads the same rounded weights and accumulates in f64: the only error
        // is f32 accumulation order (kernel_check measured under 3e-7).
        let tol = 1e-5;
        if err.is_nan() || err > tol {
            failures.push(format!("{}: rel err {err:.2e}", t.name()));
        }
        worst = worst.max(err);
    }
    let report = serde_json::json!({
        "mode": "check", "pid": std::process::id(), "model": model.name(), "version": model.version(),
        "device": view.device_uuid(),
        "attached_while_loading": model.attached_while_loading(), "ready_at_attach": ready_at_attach,
        "matrices": mats.len(), "ms64_checked": ms64_checked, "max_rel_err": worst, "ok": failures.is_empty() && !mats.is_empty(),
        "failures": failures, "context_ms": context_ms, "attach_ms": attach_ms,
        "first_results_ms": first_results_ms, "total_ms": t0.elapsed().as_secs_f64() * 1e3,
    });
    println!("{report}");
    if a.hold {
        // Keep kernels in flight until killed.
        loop {
            enqueue_all(&cache, &stream, &mats, &bufs, None, 0)?;
            stream.synchronize()?;
        }
    }
    Ok(report)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or(f64::NAN)
}

/// Opens a session as `name`, attaches (retrying), and makes a stream wait for the load: the
/// model, its context's stream, and the arena's base address.
async fn attached_on_device(a: &Args, name: &str) -> Res<(Session, Model, Arc<CudaStream>, u64)> {
    let session = Session::open(&a.server, name).await?;
    let model = attach_retrying(&session, a).await?;
    let view = model.view();
    let ctx = view.context().ok_or("not a CUDA model")?.clone();
    let base = view.device_ptr().ok_or("not a CUDA model")?;
    let stream = ctx.new_stream()?;
    model.wait_ready(&stream)?;
    stream.synchronize()?;
    Ok((session, model, stream, base))
}

/// A weight's bytes on the host, as the CPU reference reads them (bf16
/// through the SDK's typed device view, the others through `to_host`).
fn host_weights(t: &Tensor, d: WeightDtype, stream: &Arc<CudaStream>) -> Res<Vec<u8>> {
    Ok(if matches!(d, WeightDtype::BF16) {
        let view = t.device_view::<half::bf16>(stream)?;
        let host: Vec<half::bf16> = stream.clone_dtoh(&view)?;
        bytemuck::cast_slice(&host).to_vec()
    } else {
        t.to_host()?
    })
}

async fn bench_gemv(a: &Args) -> Res<serde_json::Value> {
    let (_session, model, stream, arena_base) = attached_on_device(a, "gpu-bench").await?;
    let ctx = stream.context().clone();
    let mats = matrices(&model);
    let weight_bytes: u64 = mats.iter().map(|(t, ..)| t.byte_length()).sum();
    let cache = KernelCache::new();
    let bufs = buffers(&stream, &mats)?;
    // The same weights in this process's own memory.
    let len = model.manifest().arena_bytes as usize;
    let private = stream.alloc_zeros::<u8>(len)?;
    let (pptr, _g) = private.device_ptr(&stream);
    // SAFETY: both ranges are `len` bytes of live device memory on this context.
    unsafe {
        cudarc::driver::result::memcpy_dtod_async(pptr, arena_base, len, stream.cu_stream())?
    };
    stream.synchronize()?;
    let start = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    let end = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
    let time = |private: Option<u64>| -> Res<f64> {
        start.record(&stream)?;
        enqueue_all(&cache, &stream, &mats, &bufs, private, 0)?;
        end.record(&stream)?;
        end.synchronize()?;
        Ok(f64::from(start.elapsed_ms(&end)?))
    };
    for _ in 0..3 {
        time(None)?;
        time(Some(pptr))?;
    }
    let (mut imported, mut own) = (Vec::new(), Vec::new());
    for _ in 0..a.iters {
        imported.push(time(None)?);
        own.push(time(Some(pptr))?);
    }
    let (ti, to) = (median(imported), median(own));
    // The anchor: device-to-device copy bandwidth, bytes read + written.
    let copy = 1usize << 30;
    let (s1, d1) = (
        stream.alloc_zeros::<u8>(copy)?,
        stream.alloc_zeros::<u8>(copy)?,
    );
    let (sp, _a) = s1.device_ptr(&stream);
    let (dp, _b) = d1.device_ptr(&stream);
    let mut copies = Vec::new();
    for i in 0..13 {
        start.record(&stream)?;
        // SAFETY: two live 1 GiB buffers of this context.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dp, sp, copy, stream.cu_stream())? };
        end.record(&stream)?;
        end.synchronize()?;
        if i >= 3 {
            copies.push(f64::from(start.elapsed_ms(&end)?));
        }
    }
    let d2d_gbps = 2.0 * copy as f64 / (median(copies) * 1e-3) / 1e9;
    let gbps = |ms: f64| weight_bytes as f64 / (ms * 1e-3) / 1e9;
    let report = serde_json::json!({
        "mode": "bench-gemv", "matrices": mats.len(), "weight_bytes": weight_bytes,
        "imported_ms": ti, "private_ms": to, "imported_gbps": gbps(ti), "private_gbps": gbps(to),
        "ratio_imported_over_private": to / ti, "d2d_copy_gbps": d2d_gbps,
    });
    println!("{report}");
    Ok(report)
}

async fn attach_bench(a: &Args) -> Res<serde_json::Value> {
    let session = Session::open(&a.server, "attach-bench").await?;
    let context_ms = warm_context(&session)?;
    let t = Instant::now();
    let first = attach_retrying(&session, a).await?;
    let first_ms = t.elapsed().as_secs_f64() * 1e3;
    let tensors = first.manifest().tensors.len();
    let first_kind = first.view().kind();
    first.release().await?;
    let mut times = Vec::with_capacity(a.n);
    for _ in 0..a.n {
        let t = Instant::now();
        let m = session.attach_version(&a.model, a.version).await?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
        m.release().await?;
        // Spinning: a sleeping CPU would slow the next attach.
        let until = Instant::now() + Duration::from_micros(a.pause_us);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
    let mean = times.iter().sum::<f64>() / times.len().max(1) as f64;
    let report = serde_json::json!({
        "mode": "attach-bench", "kind": format!("{:?}", first_kind), "n": a.n, "tensors": tensors,
        "context_ms": context_ms,
        "first_attach_ms": first_ms, "p50_ms": percentile(&mut times, 0.5),
        "p99_ms": percentile(&mut times, 0.99), "mean_ms": mean,
    });
    println!("{report}");
    Ok(report)
}

/// The driver's name for an error, or "ok".
fn outcome<T>(r: &Result<T, cudarc::driver::DriverError>) -> String {
    match r {
        Ok(_) => "ok".into(),
        Err(e) => e
            .error_name()
            .map_or_else(|_| format!("{e:?}"), |n| n.to_string_lossy().into_owned()),
    }
}

async fn gemv_loop(a: &Args) -> Res<serde_json::Value> {
    let (_session, model, stream, _) = attached_on_device(a, "gemv-loop").await?;
    let lease_at_start = model.lease_id();
    let view = model.view();
    let mats = matrices(&model);
    let cache = KernelCache::new();
    let bufs = buffers(&stream, &mats)?;
    enqueue_all(&cache, &stream, &mats, &bufs, None, 0)?;
    stream.synchronize()?;
    let first: Vec<Vec<f32>> = bufs
        .iter()
        .map(|b| stream.clone_dtoh(&b.y))
        .collect::<Result<_, _>>()?;
    let mut first_ok = !mats.is_empty();
    for (((t, d, r, c), b), y) in mats.iter().zip(&bufs).zip(&first).take(4) {
        let w = host_weights(t, *d, &stream)?;
        let err = rel_err(y, &reference_gemv(&w, *d, &b.xs, *r, *c)?);
        first_ok &= !err.is_nan() && err <= 1e-5;
    }
    println!(
        "{}",
        serde_json::json!({"event": "started", "pid": std::process::id(), "first_ok": first_ok})
    );
    let started = Instant::now();
    let (mut passes, mut bad, mut errors) = (0u64, 0u64, Vec::<String>::new());
    while started.elapsed() < Duration::from_secs(a.secs) {
        let pass = (|| -> Res<bool> {
            enqueue_all(&cache, &stream, &mats, &bufs, None, 0)?;
            stream.synchronize()?;
            for (b, y0) in bufs.iter().zip(&first) {
                let y = stream.clone_dtoh(&b.y)?;
                if y.iter().zip(y0).any(|(p, q)| p.to_bits() != q.to_bits()) {
                    return Ok(false);
                }
            }
            Ok(true)
        })();
        passes += 1;
        match pass {
            Ok(true) => {}
            Ok(false) => bad += 1,
            Err(e) => {
                bad += 1;
                if errors.len() < 4 {
                    errors.push(e.to_string());
                }
            }
        }
    }
    // A restarted server's session: give the SDK a moment to re-attach if it is about to.
    let deadline = Instant::now() + Duration::from_secs(10);
    while model.lease_id() == lease_at_start && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let report = serde_json::json!({
        "mode": "loop", "pid": std::process::id(), "first_ok": first_ok, "passes": passes,
        "bad": bad, "errors": errors, "seconds": started.elapsed().as_secs_f64(),
        "reattached": model.lease_id() != lease_at_start, "version": model.version(),
        "kind": format!("{:?}", view.kind()), "ok": first_ok && bad == 0 && passes > 0,
    });
    println!("{report}");
    Ok(report)
}

async fn write_probe(a: &Args) -> Res<serde_json::Value> {
    let (_session, model, stream, base) = attached_on_device(a, "write-probe").await?;
    let view = model.view();
    stream.context().bind_to_thread()?;
    let result = match a.how.as_str() {
        "memcpy" => {
            let junk = [0x5au8; 64];
            // SAFETY: the destination is the first 64 bytes of the attached arena (at least
            // that long: it holds the model's tensors). Writing there is what this probe tests;
            // on a read-only mapping the driver refuses the copy.
            let r = unsafe { cudarc::driver::result::memcpy_htod_sync(base, &junk) };
            outcome(&r)
        }
        "kernel" => {
            // A GEMV whose output is the arena's first bytes, reading another matrix: the
            // launcher refuses an output that overlaps its own input, not one in the arena.
            let mats = matrices(&model);
            let (t, d, rows, cols) = mats
                .into_iter()
                .find(|(t, _, rows, _)| t.offset() >= (*rows as u64) * 4)
                .ok_or("no 2-D weight past the arena's first bytes")?;
            let x = stream.clone_htod(&random_f32(5, cols))?;
            let (xp, _gx) = x.device_ptr(&stream);
            let w = t.device_ptr().ok_or("tensor not on the device")?;
            let cache = KernelCache::new();
            // SAFETY: w is the tensor's rows*cols elements in the arena; y is the arena's base,
            // rows*4 bytes that lie in the arena before w (checked above). The store into the
            // arena is what this probe tests: on a read-only mapping it faults, and only this
            // process's context is lost.
            let launched = unsafe { gemv::gemv(&cache, &stream, d, w, xp, base, rows, cols) };
            match launched {
                Err(e) => format!("launch: {e}"),
                Ok(()) => outcome(&stream.synchronize()),
            }
        }
        other => return Err(format!("--how {other}: memcpy or kernel").into()),
    };
    let report = serde_json::json!({
        "mode": "write-probe", "how": a.how, "kind": format!("{:?}", view.kind()),
        "read_only": view.read_only(), "result": result, "pid": std::process::id(),
    });
    println!("{report}");
    Ok(report)
}

#[tokio::main]
async fn main() {
    // The SDK's log on standard error, as `MODELSHARE_LOG` filters it (nothing when unset).
    if let Ok(filter) = tracing_subscriber::EnvFilter::try_from_env("MODELSHARE_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let result = async {
        let a = args()?;
        match a.mode.as_str() {
            "check" => check(&a).await.map(|_| ()),
            "bench-gemv" => bench_gemv(&a).await.map(|_| ()),
            "attach-bench" => attach_bench(&a).await.map(|_| ()),
            "loop" => gemv_loop(&a).await.map(|_| ()),
            "write-probe" => write_probe(&a).await.map(|_| ()),
            other => Err(format!("unknown mode {other}").into()),
        }
    }
    .await;
    if let Err(e) = result {
        println!(
            "{}",
            serde_json::json!({"ok": false, "error": e.to_string()})
        );
        std::process::exit(1);
    }
}
