//! GPU self-test of the encoder kernels and the cuBLAS products, run on a machine with a GPU:
//!
//! ```text
//! cargo run --release -p modelshare-kernels --example encoder_check
//! ```
//!
//! On device 0, for f32, f16 and bf16, on fixed-seed random inputs (rounded to the dtype
//! first, so the CPU reference sees exactly what the GPU reads): every kernel of
//! [`modelshare_kernels::encoder`] and both [`Blas`] calls against the CPU references, over
//! shapes with odd hidden sizes (100), BERT sizes (384, 1024), padded sequences, a length-0
//! sequence, batch 1, unaligned pointers (the scalar kernels) and wide rows (4096, 8192).
//! Outputs are poisoned with NaN beforehand and followed by a guard region that must stay
//! untouched. Then one whole encoder layer (QKV linears, split_heads, Q·Kᵀ, masked softmax,
//! P·V, merge_heads, output linear, residual LayerNorm in place, FFN with bias_gelu,
//! residual LayerNorm, mean pooling + normalize) against a CPU composite that rounds its
//! intermediates to the dtype where the GPU stores them. Last, the timing of a
//! BERT-large-shaped layer in f16 (batch 128, seq 64, hidden 1024, 16 heads, ffn 4096):
//! each piece and the whole layer, CUDA events, median of 20.
//!
//! Prints a table, then one JSON line. Exits 1 on any mismatch, 2 if it could not run.
//!
//! Tolerances, per element `|gpu − cpu| ≤ rel·|cpu| + abs`: the kernels compute in f32 and
//! round once, so for f16 and bf16 outputs rel = abs = one unit in the last place at 1.0
//! (2⁻¹⁰, 2⁻⁷: twice the rounding error), and 1e-5 for f32 (summation order). Matrix
//! products use `abs` times the RMS of the reference (their outputs have no unit scale).
//! Pooling writes f32: 2e-5. The composite layer compares ‖gpu − cpu‖ / ‖cpu‖ of the
//! pooled output and of the layer's output.

use std::error::Error;
use std::fmt::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr};
use half::{bf16, f16};
use modelshare_kernels::encoder::{self, EmbedArgs, HeadsArgs, ResidualNormArgs};
use modelshare_kernels::reference::{self, splitmix64};
use modelshare_kernels::{BatchedMatmul, Blas, KernelCache, Pooling, WeightDtype, sys};

type Res<T> = Result<T, Box<dyn Error>>;

/// Bytes after each output that must keep this pattern.
const GUARD_BYTES: usize = 256;
const GUARD: u8 = 0xa5;
const TIMED_RUNS: usize = 20;
const EPS: f32 = 1e-12;
const DTYPES: [WeightDtype; 3] = [WeightDtype::F32, WeightDtype::F16, WeightDtype::BF16];

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("encoder_check: FAILED (see the table above)");
            ExitCode::from(1)
        }
        Err(e) => {
            eprintln!("encoder_check: could not run: {e}");
            ExitCode::from(2)
        }
    }
}

/// One shape the checks run over.
#[derive(Clone, Debug)]
struct Shape {
    batch: usize,
    seq: usize,
    hidden: usize,
    heads: usize,
    lengths: Vec<i32>,
    /// Elements every buffer starts past its (256-byte aligned) allocation: 1 forces the
    /// scalar kernels.
    offset: usize,
    type_ids: bool,
    position_offset: usize,
}

impl Shape {
    fn tokens(&self) -> usize {
        self.batch * self.seq
    }
    fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }
    fn label(&self) -> String {
        format!(
            "b{} s{} h{} nh{} len{:?}{}",
            self.batch,
            self.seq,
            self.hidden,
            self.heads,
            self.lengths,
            if self.offset > 0 { " +1" } else { "" }
        )
    }
}

fn shapes() -> Vec<Shape> {
    vec![
        Shape {
            batch: 3,
            seq: 7,
            hidden: 100,
            heads: 4,
            lengths: vec![7, 3, 0],
            offset: 0,
            type_ids: true,
            position_offset: 2,
        },
        Shape {
            batch: 2,
            seq: 16,
            hidden: 384,
            heads: 6,
            lengths: vec![16, 9],
            offset: 0,
            type_ids: false,
            position_offset: 0,
        },
        Shape {
            batch: 1,
            seq: 5,
            hidden: 384,
            heads: 12,
            lengths: vec![5],
            offset: 1,
            type_ids: true,
            position_offset: 0,
        },
        Shape {
            batch: 2,
            seq: 40,
            hidden: 1024,
            heads: 16,
            lengths: vec![40, 17],
            offset: 0,
            type_ids: true,
            position_offset: 0,
        },
    ]
}

/// The outcome of one comparison.
struct Check {
    name: String,
    dtype: WeightDtype,
    shape: String,
    /// Largest |gpu − cpu| over its tolerance (≤ 1 passes).
    worst: f64,
    rel_norm: f64,
    bad: usize,
    unwritten: usize,
    guard_ok: bool,
    ok: bool,
}

/// Per-element tolerance `rel·|want| + abs`.
#[derive(Clone, Copy)]
struct Tol {
    rel: f64,
    abs: f64,
}

fn unit_tol(dtype: WeightDtype) -> Tol {
    let u = match dtype {
        WeightDtype::F32 => 1e-5,
        WeightDtype::F16 => 1.0 / 1024.0,
        WeightDtype::BF16 => 1.0 / 128.0,
    };
    Tol { rel: u, abs: u }
}

/// For matrix products: `abs` scaled by the RMS of the reference.
fn matmul_tol(dtype: WeightDtype, want: &[f32]) -> Tol {
    let t = unit_tol(dtype);
    Tol {
        rel: t.rel,
        abs: t.abs * rms(want).max(1e-30),
    }
}

const POOL_TOL: Tol = Tol {
    rel: 2e-5,
    abs: 2e-5,
};

fn rms(v: &[f32]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    (v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>() / v.len() as f64).sqrt()
}

fn compare(
    name: &str,
    dtype: WeightDtype,
    shape: &str,
    got: &Out,
    want: &[f32],
    tol: Tol,
) -> Check {
    let mut worst = 0.0f64;
    let mut bad = 0;
    let mut unwritten = 0;
    let (mut diff2, mut norm2) = (0.0f64, 0.0f64);
    for (g, w) in got.values.iter().zip(want) {
        let (g, w) = (f64::from(*g), f64::from(*w));
        if g.is_nan() {
            unwritten += 1;
            continue;
        }
        let d = (g - w).abs();
        let e = if d == 0.0 {
            0.0
        } else {
            d / (tol.rel * w.abs() + tol.abs)
        };
        if e.is_nan() || e > 1.0 {
            bad += 1;
        }
        worst = worst.max(if e.is_nan() { f64::INFINITY } else { e });
        diff2 += (g - w).powi(2);
        norm2 += w * w;
    }
    let rel_norm = if norm2 > 0.0 {
        (diff2 / norm2).sqrt()
    } else {
        diff2.sqrt()
    };
    let len_ok = got.values.len() == want.len();
    Check {
        name: name.to_owned(),
        dtype,
        shape: shape.to_owned(),
        worst,
        rel_norm,
        bad,
        unwritten,
        guard_ok: got.guard_ok,
        ok: len_ok && bad == 0 && unwritten == 0 && got.guard_ok,
    }
}

/// A norm-relative comparison (the composite layer).
fn compare_norm(
    name: &str,
    dtype: WeightDtype,
    shape: &str,
    got: &Out,
    want: &[f32],
    limit: f64,
) -> Check {
    let mut c = compare(name, dtype, shape, got, want, Tol { rel: 0.0, abs: 1.0 });
    c.bad = 0;
    c.worst = c.rel_norm / limit;
    c.ok = got.values.len() == want.len() && c.rel_norm <= limit && c.unwritten == 0 && c.guard_ok;
    c
}

// --- host <-> device ---------------------------------------------------------

fn round(dtype: WeightDtype, v: f32) -> f32 {
    match dtype {
        WeightDtype::F32 => v,
        WeightDtype::F16 => f16::from_f32(v).to_f32(),
        WeightDtype::BF16 => bf16::from_f32(v).to_f32(),
    }
}

fn round_all(dtype: WeightDtype, v: &mut [f32]) {
    for x in v {
        *x = round(dtype, *x);
    }
}

fn to_bytes(dtype: WeightDtype, v: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * dtype.size_bytes());
    for x in v {
        match dtype {
            WeightDtype::F32 => out.extend_from_slice(&x.to_le_bytes()),
            WeightDtype::F16 => out.extend_from_slice(&f16::from_f32(*x).to_le_bytes()),
            WeightDtype::BF16 => out.extend_from_slice(&bf16::from_f32(*x).to_le_bytes()),
        }
    }
    out
}

fn from_bytes(dtype: WeightDtype, b: &[u8]) -> Vec<f32> {
    match dtype {
        WeightDtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        WeightDtype::F16 => b
            .chunks_exact(2)
            .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        WeightDtype::BF16 => b
            .chunks_exact(2)
            .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
    }
}

/// A device buffer: `offset` bytes of padding, the data, then the guard.
struct Buf {
    mem: CudaSlice<u8>,
    offset: usize,
    bytes: usize,
    dtype: WeightDtype,
}

/// What came back from an output buffer.
struct Out {
    values: Vec<f32>,
    guard_ok: bool,
}

impl Buf {
    fn with_bytes(
        stream: &Arc<CudaStream>,
        dtype: WeightDtype,
        data: &[u8],
        offset_elems: usize,
    ) -> Res<Self> {
        let offset = offset_elems * dtype.size_bytes();
        let mut host = vec![0u8; offset];
        host.extend_from_slice(data);
        host.extend(std::iter::repeat_n(GUARD, GUARD_BYTES));
        let mut mem = stream.alloc_zeros::<u8>(host.len())?;
        stream.memcpy_htod(&host, &mut mem)?;
        Ok(Self {
            mem,
            offset,
            bytes: data.len(),
            dtype,
        })
    }

    /// `values` (already representable in `dtype`) on the device.
    fn input(
        stream: &Arc<CudaStream>,
        dtype: WeightDtype,
        values: &[f32],
        offset: usize,
    ) -> Res<Self> {
        Self::with_bytes(stream, dtype, &to_bytes(dtype, values), offset)
    }

    fn ints(stream: &Arc<CudaStream>, values: &[i32]) -> Res<Self> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        // i32 travels as "f32-sized" elements; only its size matters here.
        Self::with_bytes(stream, WeightDtype::F32, &bytes, 0)
    }

    /// `n` elements of NaN.
    fn output(stream: &Arc<CudaStream>, dtype: WeightDtype, n: usize, offset: usize) -> Res<Self> {
        Self::input(stream, dtype, &vec![f32::NAN; n], offset)
    }

    fn ptr(&self, stream: &Arc<CudaStream>) -> u64 {
        self.mem.device_ptr(stream).0 + self.offset as u64
    }

    fn read(&self, stream: &Arc<CudaStream>) -> Res<Out> {
        let host = stream.clone_dtoh(&self.mem)?;
        let data = &host[self.offset..self.offset + self.bytes];
        let guard_ok = host[self.offset + self.bytes..].iter().all(|b| *b == GUARD);
        Ok(Out {
            values: from_bytes(self.dtype, data),
            guard_ok,
        })
    }
}

/// Deterministic inputs: uniform in `[-scale, scale)`, rounded to `dtype`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = splitmix64(self.0);
        self.0
    }
    fn unit(&mut self) -> f32 {
        ((self.next() >> 40) as f32) * (1.0 / (1u64 << 23) as f32) - 1.0
    }
    fn values(&mut self, dtype: WeightDtype, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| round(dtype, self.unit() * scale)).collect()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// --- the checks ---------------------------------------------------------------

struct Env {
    cache: KernelCache,
    stream: Arc<CudaStream>,
    blas: Blas,
}

fn run() -> Res<bool> {
    sys::driver_available()?;
    sys::nvrtc_available()?;
    sys::cublas_available()?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let device = ctx.name()?;
    let (major, minor) = ctx.compute_capability()?;
    println!("device 0: {device}, sm_{major}{minor}");
    let env = Env {
        cache: KernelCache::in_memory(),
        blas: Blas::new(stream.clone())?,
        stream,
    };

    let mut checks = Vec::new();
    let mut rng = Rng(0x5eed_0001);
    for dtype in DTYPES {
        for shape in shapes() {
            check_pieces(&env, dtype, &shape, &mut rng, &mut checks)?;
            check_layer(&env, dtype, &shape, &mut rng, &mut checks)?;
        }
        for cols in [777, 4096, 8192] {
            check_wide_norm(&env, dtype, cols, &mut rng, &mut checks)?;
        }
        check_odd_linear(&env, dtype, &mut rng, &mut checks)?;
    }
    for c in &checks {
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
    let all_ok = checks.iter().all(|c| c.ok);

    let timings = time_bert_large(&env)?;
    println!();
    println!("BERT-large layer, f16, batch 128, seq 64, hidden 1024, 16 heads, ffn 4096:");
    println!("| step | median (us) | TFLOP/s | GB/s |");
    println!("| --- | --- | --- | --- |");
    for t in &timings {
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
    println!("{}", json_line(&device, &checks, &timings));
    Ok(all_ok)
}

/// What each piece check of one shape takes: the environment, the dtype, the shape and its
/// label.
struct Pieces<'a> {
    env: &'a Env,
    dtype: WeightDtype,
    s: &'a Shape,
    label: String,
}

/// The LayerNorm parameters of the embeddings check, on the host and on the device, which the
/// residual LayerNorm check takes again.
struct Norm {
    gamma: Vec<f32>,
    beta: Vec<f32>,
    d_gamma: Buf,
    d_beta: Buf,
}

/// Every kernel and both products, one at a time, on `shape`.
fn check_pieces(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let cx = Pieces {
        env,
        dtype,
        s,
        label: s.label(),
    };
    let norm = check_embed_layer_norm(&cx, rng, checks)?;
    check_bias_gelu(&cx, rng, checks)?;
    check_residual_layer_norm(&cx, &norm, rng, checks)?;
    let scale = check_heads(&cx, rng, checks)?;
    let d_len = check_masked_softmax(&cx, rng, checks)?;
    check_pooling(&cx, &d_len, rng, checks)?;
    check_blas_linear(&cx, rng, checks)?;
    check_blas_attention(&cx, scale, rng, checks)?;
    Ok(())
}

/// Embeddings + LayerNorm, with ids out of range at both ends; gives back the norm
/// parameters (γ, β) for the residual LayerNorm.
fn check_embed_layer_norm(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<Norm> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let (vocab, type_vocab) = (50usize, 2usize);
    let positions = s.seq + s.position_offset;
    let ids: Vec<i32> = (0..t)
        .map(|i| match i % 9 {
            4 => -1,
            7 => vocab as i32 + 3,
            _ => rng.below(vocab as u64) as i32,
        })
        .collect();
    let type_ids: Vec<i32> = (0..t)
        .map(|i| if i % 5 == 3 { 9 } else { rng.below(2) as i32 })
        .collect();
    let word = rng.values(dtype, vocab * h, 1.0);
    let position = rng.values(dtype, positions * h, 1.0);
    let token_type = rng.values(dtype, type_vocab * h, 1.0);
    let gamma = rng
        .values(dtype, h, 1.0)
        .iter()
        .map(|g| round(dtype, 1.0 + 0.5 * g))
        .collect::<Vec<_>>();
    let beta = rng.values(dtype, h, 0.5);
    let mut want = vec![0.0; t * h];
    reference::embed_layer_norm(
        &mut want,
        &ids,
        s.type_ids.then_some(&type_ids[..]),
        &word,
        &position,
        &token_type,
        &gamma,
        &beta,
        s.seq,
        s.position_offset,
        EPS,
    );
    let d_ids = Buf::ints(st, &ids)?;
    let d_types = Buf::ints(st, &type_ids)?;
    let d_word = Buf::input(st, dtype, &word, off)?;
    let d_pos = Buf::input(st, dtype, &position, off)?;
    let d_tt = Buf::input(st, dtype, &token_type, off)?;
    let d_gamma = Buf::input(st, dtype, &gamma, off)?;
    let d_beta = Buf::input(st, dtype, &beta, off)?;
    let d_out = Buf::output(st, dtype, t * h, off)?;
    let args = EmbedArgs {
        out: d_out.ptr(st),
        ids: d_ids.ptr(st),
        type_ids: if s.type_ids { d_types.ptr(st) } else { 0 },
        word: d_word.ptr(st),
        position: d_pos.ptr(st),
        token_type: d_tt.ptr(st),
        gamma: d_gamma.ptr(st),
        beta: d_beta.ptr(st),
        tokens: t,
        seq_len: s.seq,
        hidden: h,
        vocab,
        positions,
        type_vocab,
        position_offset: s.position_offset,
        eps: EPS,
    };
    // SAFETY: every buffer above holds the elements EmbedArgs says, on this stream.
    unsafe { encoder::embed_layer_norm(cache, st, dtype, &args) }?;
    checks.push(compare(
        "embed_layer_norm",
        dtype,
        label,
        &d_out.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(Norm {
        gamma,
        beta,
        d_gamma,
        d_beta,
    })
}

/// Bias + GELU, in place on [tokens, 4·hidden].
fn check_bias_gelu(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let ffn = 4 * h;
    let x = rng.values(dtype, t * ffn, 3.0);
    let bias = rng.values(dtype, ffn, 1.0);
    let mut want = x.clone();
    reference::bias_gelu(&mut want, &bias);
    let d_x = Buf::input(st, dtype, &x, off)?;
    let d_bias = Buf::input(st, dtype, &bias, off)?;
    // SAFETY: d_x holds t·ffn elements and d_bias ffn, on this stream.
    unsafe { encoder::bias_gelu(cache, st, dtype, d_x.ptr(st), d_bias.ptr(st), t, ffn) }?;
    checks.push(compare(
        "bias_gelu",
        dtype,
        label,
        &d_x.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(())
}

/// Bias + residual + LayerNorm: into a new buffer, then in place over the residual, with
/// `norm`'s γ and β.
fn check_residual_layer_norm(
    cx: &Pieces<'_>,
    norm: &Norm,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let x = rng.values(dtype, t * h, 2.0);
    let residual = rng.values(dtype, t * h, 2.0);
    let bias = rng.values(dtype, h, 1.0);
    let mut want = vec![0.0; t * h];
    reference::bias_residual_layer_norm(
        &mut want,
        &x,
        &bias,
        &residual,
        &norm.gamma,
        &norm.beta,
        EPS,
    );
    let d_x = Buf::input(st, dtype, &x, off)?;
    let d_res = Buf::input(st, dtype, &residual, off)?;
    let d_bias = Buf::input(st, dtype, &bias, off)?;
    let d_out = Buf::output(st, dtype, t * h, off)?;
    let mut args = ResidualNormArgs {
        out: d_out.ptr(st),
        x: d_x.ptr(st),
        bias: d_bias.ptr(st),
        residual: d_res.ptr(st),
        gamma: norm.d_gamma.ptr(st),
        beta: norm.d_beta.ptr(st),
        rows: t,
        cols: h,
        eps: EPS,
    };
    // SAFETY: all buffers hold the [t, h] or [h] elements the arguments say.
    unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &args) }?;
    checks.push(compare(
        "residual_layer_norm",
        dtype,
        label,
        &d_out.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    args.out = args.residual;
    // SAFETY: as above; out is the residual buffer itself, which the launcher allows.
    unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &args) }?;
    checks.push(compare(
        "residual_ln_in_place",
        dtype,
        label,
        &d_res.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(())
}

/// Split heads (with bias and the q scale), then merge back; gives back the q scale.
fn check_heads(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<f32> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let nh = s.heads;
    let hd = s.head_dim();
    let scale = 1.0 / (hd as f32).sqrt();
    let qkv: Vec<Vec<f32>> = (0..3).map(|_| rng.values(dtype, t * h, 2.0)).collect();
    let biases: Vec<Vec<f32>> = (0..3).map(|_| rng.values(dtype, h, 1.0)).collect();
    let d_in: Vec<Buf> = qkv
        .iter()
        .map(|v| Buf::input(st, dtype, v, off))
        .collect::<Res<_>>()?;
    let d_b: Vec<Buf> = biases
        .iter()
        .map(|v| Buf::input(st, dtype, v, off))
        .collect::<Res<_>>()?;
    let d_split: Vec<Buf> = (0..3)
        .map(|_| Buf::output(st, dtype, t * h, off))
        .collect::<Res<_>>()?;
    let heads = HeadsArgs {
        q: d_in[0].ptr(st),
        k: d_in[1].ptr(st),
        v: d_in[2].ptr(st),
        q_bias: d_b[0].ptr(st),
        k_bias: d_b[1].ptr(st),
        v_bias: d_b[2].ptr(st),
        q_out: d_split[0].ptr(st),
        k_out: d_split[1].ptr(st),
        v_out: d_split[2].ptr(st),
        batch: s.batch,
        seq: s.seq,
        heads: nh,
        head_dim: hd,
        q_scale: scale,
    };
    // SAFETY: nine buffers of [t, h] or [h] elements on this stream.
    unsafe { encoder::split_heads(cache, st, dtype, &heads) }?;
    for (i, name) in ["split_heads q", "split_heads k", "split_heads v"]
        .iter()
        .enumerate()
    {
        let mut want = vec![0.0; t * h];
        let sc = if i == 0 { scale } else { 1.0 };
        reference::split_heads(&qkv[i], &biases[i], &mut want, s.batch, s.seq, nh, hd, sc);
        checks.push(compare(
            name,
            dtype,
            label,
            &d_split[i].read(st)?,
            &want,
            unit_tol(dtype),
        ));
    }
    let ctx = rng.values(dtype, t * h, 2.0);
    let mut want = vec![0.0; t * h];
    reference::merge_heads(&ctx, &mut want, s.batch, s.seq, nh, hd);
    let d_ctx = Buf::input(st, dtype, &ctx, off)?;
    let d_merged = Buf::output(st, dtype, t * h, off)?;
    // SAFETY: both buffers hold t·h elements.
    unsafe {
        encoder::merge_heads(
            cache,
            st,
            dtype,
            d_ctx.ptr(st),
            d_merged.ptr(st),
            s.batch,
            nh,
            s.seq,
            hd,
        )
    }?;
    checks.push(compare(
        "merge_heads",
        dtype,
        label,
        &d_merged.read(st)?,
        &want,
        Tol { rel: 0.0, abs: 0.0 },
    ));
    Ok(scale)
}

/// Masked softmax on [batch·heads, seq, seq]; gives back the lengths on the device.
fn check_masked_softmax(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<Buf> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let off = s.offset;
    let nh = s.heads;
    let n_scores = s.batch * nh * s.seq * s.seq;
    let scores = rng.values(dtype, n_scores, 6.0);
    let mut want = scores.clone();
    reference::masked_softmax(&mut want, &s.lengths, s.batch, nh, s.seq);
    let d_scores = Buf::input(st, dtype, &scores, off)?;
    let d_len = Buf::ints(st, &s.lengths)?;
    // SAFETY: d_scores holds batch·heads·seq² elements, d_len batch i32.
    unsafe {
        encoder::masked_softmax(
            cache,
            st,
            dtype,
            d_scores.ptr(st),
            d_len.ptr(st),
            s.batch,
            nh,
            s.seq,
        )
    }?;
    checks.push(compare(
        "masked_softmax",
        dtype,
        label,
        &d_scores.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(d_len)
}

/// Pooling, every mode, with and without normalize, over the lengths `d_len`.
fn check_pooling(cx: &Pieces<'_>, d_len: &Buf, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let x = rng.values(dtype, t * h, 2.0);
    let d_x = Buf::input(st, dtype, &x, off)?;
    for mode in [
        Pooling::Mean,
        Pooling::Cls,
        Pooling::Max,
        Pooling::MeanSqrtLen,
    ] {
        for normalize in [false, true] {
            let mut want = vec![0.0; s.batch * h];
            reference::pool(
                &x, &s.lengths, &mut want, s.batch, s.seq, h, mode, normalize,
            );
            let d_out = Buf::output(st, WeightDtype::F32, s.batch * h, 0)?;
            // SAFETY: d_x holds batch·seq·hidden elements, d_len batch i32, d_out
            // batch·hidden f32.
            unsafe {
                encoder::pool(
                    cache,
                    st,
                    dtype,
                    d_x.ptr(st),
                    d_len.ptr(st),
                    d_out.ptr(st),
                    s.batch,
                    s.seq,
                    h,
                    mode,
                    normalize,
                )
            }?;
            let name = format!("pool {mode:?}{}", if normalize { " norm" } else { "" });
            checks.push(compare(
                &name,
                dtype,
                label,
                &d_out.read(st)?,
                &want,
                POOL_TOL,
            ));
        }
    }
    Ok(())
}

/// The products: a linear layer.
fn check_blas_linear(cx: &Pieces<'_>, rng: &mut Rng, checks: &mut Vec<Check>) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let ffn = 4 * h;
    let x = rng.values(dtype, t * h, 1.0);
    let w = rng.values(dtype, ffn * h, 1.0);
    let mut want = vec![0.0; t * ffn];
    reference::linear(&x, &w, &mut want, t, h, ffn);
    let d_x = Buf::input(st, dtype, &x, off)?;
    let d_w = Buf::input(st, dtype, &w, off)?;
    let d_y = Buf::output(st, dtype, t * ffn, off)?;
    // SAFETY: x [t, h], w [ffn, h], y [t, ffn] on the blas stream.
    unsafe {
        env.blas
            .linear(dtype, d_x.ptr(st), d_w.ptr(st), d_y.ptr(st), t, h, ffn)
    }?;
    checks.push(compare(
        "blas linear",
        dtype,
        label,
        &d_y.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));
    Ok(())
}

/// The products: attention's Q·Kᵀ (scaled by `scale`) and P·V.
fn check_blas_attention(
    cx: &Pieces<'_>,
    scale: f32,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let (env, dtype, s) = (cx.env, cx.dtype, cx.s);
    let label = cx.label.as_str();
    let st = &env.stream;
    let t = s.tokens();
    let h = s.hidden;
    let off = s.offset;
    let nh = s.heads;
    let hd = s.head_dim();
    let bh = s.batch * nh;
    let (q, k) = (rng.values(dtype, t * h, 1.0), rng.values(dtype, t * h, 1.0));
    let mut want = vec![0.0; bh * s.seq * s.seq];
    reference::batched_matmul(&q, &k, &mut want, s.seq, s.seq, hd, bh, true, scale);
    let (d_q, d_k) = (
        Buf::input(st, dtype, &q, off)?,
        Buf::input(st, dtype, &k, off)?,
    );
    let d_s = Buf::output(st, dtype, bh * s.seq * s.seq, off)?;
    let qk = BatchedMatmul {
        a: d_q.ptr(st),
        b: d_k.ptr(st),
        c: d_s.ptr(st),
        m: s.seq,
        n: s.seq,
        k: hd,
        batch: bh,
        stride_a: s.seq * hd,
        stride_b: s.seq * hd,
        stride_c: s.seq * s.seq,
        b_transposed: true,
        alpha: scale,
    };
    // SAFETY: bh matrices of [seq, hd] in q and k, [seq, seq] in s, packed.
    unsafe { env.blas.batched_matmul(dtype, &qk) }?;
    checks.push(compare(
        "blas q·kᵀ",
        dtype,
        label,
        &d_s.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));

    let p = rng.values(dtype, bh * s.seq * s.seq, 1.0);
    let v = rng.values(dtype, t * h, 1.0);
    let mut want = vec![0.0; t * h];
    reference::batched_matmul(&p, &v, &mut want, s.seq, hd, s.seq, bh, false, 1.0);
    let (d_p, d_v) = (
        Buf::input(st, dtype, &p, off)?,
        Buf::input(st, dtype, &v, off)?,
    );
    let d_c = Buf::output(st, dtype, t * h, off)?;
    let pv = BatchedMatmul {
        a: d_p.ptr(st),
        b: d_v.ptr(st),
        c: d_c.ptr(st),
        m: s.seq,
        n: hd,
        k: s.seq,
        batch: bh,
        stride_a: s.seq * s.seq,
        stride_b: s.seq * hd,
        stride_c: s.seq * hd,
        b_transposed: false,
        alpha: 1.0,
    };
    // SAFETY: bh matrices of [seq, seq] in p, [seq, hd] in v and c, packed.
    unsafe { env.blas.batched_matmul(dtype, &pv) }?;
    checks.push(compare(
        "blas p·v",
        dtype,
        label,
        &d_c.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));
    Ok(())
}

/// LayerNorm rows wider than the BERT sizes: several warps per row, up to the limit.
fn check_wide_norm(
    env: &Env,
    dtype: WeightDtype,
    cols: usize,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let st = &env.stream;
    let rows = 33;
    let x = rng.values(dtype, rows * cols, 2.0);
    let residual = rng.values(dtype, rows * cols, 2.0);
    let bias = rng.values(dtype, cols, 1.0);
    let gamma = rng.values(dtype, cols, 1.0);
    let beta = rng.values(dtype, cols, 1.0);
    let mut want = vec![0.0; rows * cols];
    reference::bias_residual_layer_norm(&mut want, &x, &bias, &residual, &gamma, &beta, EPS);
    let bufs: Vec<Buf> = [&x, &bias, &residual, &gamma, &beta]
        .iter()
        .map(|v| Buf::input(st, dtype, v, 0))
        .collect::<Res<_>>()?;
    let d_out = Buf::output(st, dtype, rows * cols, 0)?;
    let args = ResidualNormArgs {
        out: d_out.ptr(st),
        x: bufs[0].ptr(st),
        bias: bufs[1].ptr(st),
        residual: bufs[2].ptr(st),
        gamma: bufs[3].ptr(st),
        beta: bufs[4].ptr(st),
        rows,
        cols,
        eps: EPS,
    };
    // SAFETY: the buffers hold [rows, cols] or [cols] elements.
    unsafe { encoder::bias_residual_layer_norm(&env.cache, st, dtype, &args) }?;
    let label = format!("rows {rows} cols {cols}");
    checks.push(compare(
        "residual_ln wide",
        dtype,
        &label,
        &d_out.read(st)?,
        &want,
        unit_tol(dtype),
    ));
    Ok(())
}

/// A linear layer of odd sizes at unaligned addresses.
fn check_odd_linear(
    env: &Env,
    dtype: WeightDtype,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let st = &env.stream;
    let (rows, inf, outf) = (5, 37, 19);
    let x = rng.values(dtype, rows * inf, 1.0);
    let w = rng.values(dtype, outf * inf, 1.0);
    let mut want = vec![0.0; rows * outf];
    reference::linear(&x, &w, &mut want, rows, inf, outf);
    let (d_x, d_w) = (Buf::input(st, dtype, &x, 1)?, Buf::input(st, dtype, &w, 3)?);
    let d_y = Buf::output(st, dtype, rows * outf, 1)?;
    // SAFETY: x [rows, in], w [out, in], y [rows, out].
    unsafe {
        env.blas.linear(
            dtype,
            d_x.ptr(st),
            d_w.ptr(st),
            d_y.ptr(st),
            rows,
            inf,
            outf,
        )
    }?;
    checks.push(compare(
        "blas linear odd",
        dtype,
        "5x37 · 19x37ᵀ, +1/+3",
        &d_y.read(st)?,
        &want,
        matmul_tol(dtype, &want),
    ));
    Ok(())
}

/// One encoder layer's weights, rounded to the dtype.
struct LayerWeights {
    w: [Vec<f32>; 6],
    b: [Vec<f32>; 6],
    ln: [Vec<f32>; 4],
}

/// The weights of a layer: Wq, Wk, Wv, Wo [h, h], W1 [ffn, h], W2 [h, ffn], scaled by
/// 1/√fan_in; biases; LayerNorm gammas (around 1) and betas.
fn layer_weights(dtype: WeightDtype, h: usize, ffn: usize, rng: &mut Rng) -> LayerWeights {
    let (sh, sf) = (1.0 / (h as f32).sqrt(), 1.0 / (ffn as f32).sqrt());
    let mut w = |n, s| rng.values(dtype, n, s);
    let weights = [
        w(h * h, sh),
        w(h * h, sh),
        w(h * h, sh),
        w(h * h, sh),
        w(ffn * h, sh),
        w(h * ffn, sf),
    ];
    let biases = [
        w(h, 0.1),
        w(h, 0.1),
        w(h, 0.1),
        w(h, 0.1),
        w(ffn, 0.1),
        w(h, 0.1),
    ];
    let g1: Vec<f32> = w(h, 0.2).iter().map(|v| round(dtype, 1.0 + v)).collect();
    let g2: Vec<f32> = w(h, 0.2).iter().map(|v| round(dtype, 1.0 + v)).collect();
    let ln = [g1, w(h, 0.1), g2, w(h, 0.1)];
    LayerWeights {
        w: weights,
        b: biases,
        ln,
    }
}

/// The CPU composite: returns (layer output [tokens, h], pooled [batch, h]), rounding to the
/// dtype wherever the GPU stores an intermediate.
fn cpu_layer(dtype: WeightDtype, s: &Shape, x: &[f32], lw: &LayerWeights) -> (Vec<f32>, Vec<f32>) {
    let (t, h, nh, hd) = (s.tokens(), s.hidden, s.heads, s.head_dim());
    let ffn = 4 * h;
    let bh = s.batch * nh;
    let r = |v: &mut Vec<f32>| round_all(dtype, v);
    let lin = |x: &[f32], w: &[f32], inf: usize, outf: usize| {
        let mut y = vec![0.0; t * outf];
        reference::linear(x, w, &mut y, t, inf, outf);
        round_all(dtype, &mut y);
        y
    };
    let scale = 1.0 / (hd as f32).sqrt();
    let mut heads = Vec::new();
    for i in 0..3 {
        let p = lin(x, &lw.w[i], h, h);
        let mut o = vec![0.0; t * h];
        reference::split_heads(
            &p,
            &lw.b[i],
            &mut o,
            s.batch,
            s.seq,
            nh,
            hd,
            if i == 0 { scale } else { 1.0 },
        );
        r(&mut o);
        heads.push(o);
    }
    let mut scores = vec![0.0; bh * s.seq * s.seq];
    reference::batched_matmul(
        &heads[0],
        &heads[1],
        &mut scores,
        s.seq,
        s.seq,
        hd,
        bh,
        true,
        1.0,
    );
    r(&mut scores);
    reference::masked_softmax(&mut scores, &s.lengths, s.batch, nh, s.seq);
    r(&mut scores);
    let mut ctx = vec![0.0; t * h];
    reference::batched_matmul(
        &scores, &heads[2], &mut ctx, s.seq, hd, s.seq, bh, false, 1.0,
    );
    r(&mut ctx);
    let mut merged = vec![0.0; t * h];
    reference::merge_heads(&ctx, &mut merged, s.batch, s.seq, nh, hd);
    let attn = lin(&merged, &lw.w[3], h, h);
    let mut h1 = x.to_vec();
    reference::bias_residual_layer_norm_in_place(
        &mut h1, &attn, &lw.b[3], &lw.ln[0], &lw.ln[1], EPS,
    );
    r(&mut h1);
    let mut f = lin(&h1, &lw.w[4], h, ffn);
    reference::bias_gelu(&mut f, &lw.b[4]);
    r(&mut f);
    let o = lin(&f, &lw.w[5], ffn, h);
    let mut h2 = vec![0.0; t * h];
    reference::bias_residual_layer_norm(&mut h2, &o, &lw.b[5], &h1, &lw.ln[2], &lw.ln[3], EPS);
    r(&mut h2);
    let mut pooled = vec![0.0; s.batch * h];
    reference::pool(
        &h2,
        &s.lengths,
        &mut pooled,
        s.batch,
        s.seq,
        h,
        Pooling::Mean,
        true,
    );
    (h2, pooled)
}

/// Device buffers of one layer.
struct LayerBufs {
    x: Buf,
    w: Vec<Buf>,
    b: Vec<Buf>,
    ln: Vec<Buf>,
    qkv: Vec<Buf>,
    heads: Vec<Buf>,
    scores: Buf,
    ctx: Buf,
    merged: Buf,
    attn: Buf,
    f: Buf,
    o: Buf,
    h2: Buf,
    pooled: Buf,
    lengths: Buf,
}

fn layer_bufs(
    st: &Arc<CudaStream>,
    dtype: WeightDtype,
    s: &Shape,
    x: &[f32],
    lw: &LayerWeights,
) -> Res<LayerBufs> {
    let (t, h) = (s.tokens(), s.hidden);
    let off = s.offset;
    let out = |n| Buf::output(st, dtype, n, off);
    Ok(LayerBufs {
        x: Buf::input(st, dtype, x, off)?,
        w: lw
            .w
            .iter()
            .map(|v| Buf::input(st, dtype, v, off))
            .collect::<Res<_>>()?,
        b: lw
            .b
            .iter()
            .map(|v| Buf::input(st, dtype, v, off))
            .collect::<Res<_>>()?,
        ln: lw
            .ln
            .iter()
            .map(|v| Buf::input(st, dtype, v, off))
            .collect::<Res<_>>()?,
        qkv: (0..3).map(|_| out(t * h)).collect::<Res<_>>()?,
        heads: (0..3).map(|_| out(t * h)).collect::<Res<_>>()?,
        scores: out(s.batch * s.heads * s.seq * s.seq)?,
        ctx: out(t * h)?,
        merged: out(t * h)?,
        attn: out(t * h)?,
        f: out(t * 4 * h)?,
        o: out(t * h)?,
        h2: out(t * h)?,
        pooled: Buf::output(st, WeightDtype::F32, s.batch * h, 0)?,
        lengths: Buf::ints(st, &s.lengths)?,
    })
}

/// Timing marks: (step, start, end) per enqueued step.
type Marks = Vec<(&'static str, CudaEvent, CudaEvent)>;

/// Enqueues one encoder layer on `b` (h1 written over `b.x`), marking each step when
/// `marks` is given.
fn enqueue_layer(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    mut marks: Option<&mut Marks>,
) -> Res<()> {
    enqueue_attention_scores(env, dtype, s, b, &mut marks)?;
    enqueue_attention_output(env, dtype, s, b, &mut marks)?;
    enqueue_feed_forward(env, dtype, s, b, &mut marks)?;
    Ok(())
}

/// Runs `f` (one step of a layer, named `name`), between two events recorded on `st` when
/// `marks` is given.
fn marked_step(
    st: &Arc<CudaStream>,
    marks: &mut Option<&mut Marks>,
    name: &'static str,
    f: &mut dyn FnMut() -> Res<()>,
) -> Res<()> {
    match marks.as_deref_mut() {
        Some(m) => {
            let start = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            f()?;
            let end = st.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            m.push((name, start, end));
            Ok(())
        }
        None => f(),
    }
}

/// Enqueues the attention scores of the layer: the Q, K and V projections, the heads, Q·Kᵀ
/// and the masked softmax.
fn enqueue_attention_scores(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    marks: &mut Option<&mut Marks>,
) -> Res<()> {
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let nh = s.heads;
    let hd = s.head_dim();
    let bh = s.batch * nh;
    let p = |buf: &Buf| buf.ptr(st);
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Res<()>| -> Res<()> {
        marked_step(st, marks, name, f)
    };
    // SAFETY (every unsafe block below): LayerBufs allocated each buffer with the
    // elements this layer reads or writes, on this stream; nothing else runs on them.
    step("linear qkv (3x)", &mut || {
        for i in 0..3 {
            // SAFETY: see above.
            unsafe {
                env.blas
                    .linear(dtype, p(&b.x), p(&b.w[i]), p(&b.qkv[i]), t, h, h)
            }?;
        }
        Ok(())
    })?;
    step("split_heads", &mut || {
        let a = HeadsArgs {
            q: p(&b.qkv[0]),
            k: p(&b.qkv[1]),
            v: p(&b.qkv[2]),
            q_bias: p(&b.b[0]),
            k_bias: p(&b.b[1]),
            v_bias: p(&b.b[2]),
            q_out: p(&b.heads[0]),
            k_out: p(&b.heads[1]),
            v_out: p(&b.heads[2]),
            batch: s.batch,
            seq: s.seq,
            heads: nh,
            head_dim: hd,
            q_scale: 1.0 / (hd as f32).sqrt(),
        };
        // SAFETY: see above.
        unsafe { encoder::split_heads(cache, st, dtype, &a) }?;
        Ok(())
    })?;
    step("q·kᵀ", &mut || {
        let m = BatchedMatmul {
            a: p(&b.heads[0]),
            b: p(&b.heads[1]),
            c: p(&b.scores),
            m: s.seq,
            n: s.seq,
            k: hd,
            batch: bh,
            stride_a: s.seq * hd,
            stride_b: s.seq * hd,
            stride_c: s.seq * s.seq,
            b_transposed: true,
            alpha: 1.0,
        };
        // SAFETY: see above.
        unsafe { env.blas.batched_matmul(dtype, &m) }?;
        Ok(())
    })?;
    step("masked_softmax", &mut || {
        // SAFETY: see above.
        unsafe {
            encoder::masked_softmax(
                cache,
                st,
                dtype,
                p(&b.scores),
                p(&b.lengths),
                s.batch,
                nh,
                s.seq,
            )
        }?;
        Ok(())
    })?;
    Ok(())
}

/// Enqueues the attention output of the layer: P·V, the merged heads, the output projection
/// and the first residual LayerNorm (in place over `b.x`).
fn enqueue_attention_output(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    marks: &mut Option<&mut Marks>,
) -> Res<()> {
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let nh = s.heads;
    let hd = s.head_dim();
    let bh = s.batch * nh;
    let p = |buf: &Buf| buf.ptr(st);
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Res<()>| -> Res<()> {
        marked_step(st, marks, name, f)
    };
    // SAFETY (every unsafe block below): LayerBufs allocated each buffer with the
    // elements this layer reads or writes, on this stream; nothing else runs on them.
    step("p·v", &mut || {
        let m = BatchedMatmul {
            a: p(&b.scores),
            b: p(&b.heads[2]),
            c: p(&b.ctx),
            m: s.seq,
            n: hd,
            k: s.seq,
            batch: bh,
            stride_a: s.seq * s.seq,
            stride_b: s.seq * hd,
            stride_c: s.seq * hd,
            b_transposed: false,
            alpha: 1.0,
        };
        // SAFETY: see above.
        unsafe { env.blas.batched_matmul(dtype, &m) }?;
        Ok(())
    })?;
    step("merge_heads", &mut || {
        // SAFETY: see above.
        unsafe {
            encoder::merge_heads(
                cache,
                st,
                dtype,
                p(&b.ctx),
                p(&b.merged),
                s.batch,
                nh,
                s.seq,
                hd,
            )
        }?;
        Ok(())
    })?;
    step("linear out", &mut || {
        // SAFETY: see above.
        unsafe {
            env.blas
                .linear(dtype, p(&b.merged), p(&b.w[3]), p(&b.attn), t, h, h)
        }?;
        Ok(())
    })?;
    step("residual_ln 1 (in place)", &mut || {
        let a = ResidualNormArgs {
            out: p(&b.x),
            x: p(&b.attn),
            bias: p(&b.b[3]),
            residual: p(&b.x),
            gamma: p(&b.ln[0]),
            beta: p(&b.ln[1]),
            rows: t,
            cols: h,
            eps: EPS,
        };
        // SAFETY: see above; out is the residual itself, which the launcher allows.
        unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &a) }?;
        Ok(())
    })?;
    Ok(())
}

/// Enqueues the feed-forward half of the layer, the second residual LayerNorm and the
/// pooling.
fn enqueue_feed_forward(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    b: &LayerBufs,
    marks: &mut Option<&mut Marks>,
) -> Res<()> {
    let st = &env.stream;
    let cache = &env.cache;
    let t = s.tokens();
    let h = s.hidden;
    let ffn = 4 * h;
    let p = |buf: &Buf| buf.ptr(st);
    let mut step = |name: &'static str, f: &mut dyn FnMut() -> Res<()>| -> Res<()> {
        marked_step(st, marks, name, f)
    };
    // SAFETY (every unsafe block below): LayerBufs allocated each buffer with the
    // elements this layer reads or writes, on this stream; nothing else runs on them.
    step("linear ffn up", &mut || {
        // SAFETY: see above.
        unsafe {
            env.blas
                .linear(dtype, p(&b.x), p(&b.w[4]), p(&b.f), t, h, ffn)
        }?;
        Ok(())
    })?;
    step("bias_gelu", &mut || {
        // SAFETY: see above.
        unsafe { encoder::bias_gelu(cache, st, dtype, p(&b.f), p(&b.b[4]), t, ffn) }?;
        Ok(())
    })?;
    step("linear ffn down", &mut || {
        // SAFETY: see above.
        unsafe {
            env.blas
                .linear(dtype, p(&b.f), p(&b.w[5]), p(&b.o), t, ffn, h)
        }?;
        Ok(())
    })?;
    step("residual_ln 2", &mut || {
        let a = ResidualNormArgs {
            out: p(&b.h2),
            x: p(&b.o),
            bias: p(&b.b[5]),
            residual: p(&b.x),
            gamma: p(&b.ln[2]),
            beta: p(&b.ln[3]),
            rows: t,
            cols: h,
            eps: EPS,
        };
        // SAFETY: see above.
        unsafe { encoder::bias_residual_layer_norm(cache, st, dtype, &a) }?;
        Ok(())
    })?;
    step("pool mean + normalize", &mut || {
        // SAFETY: see above.
        unsafe {
            encoder::pool(
                cache,
                st,
                dtype,
                p(&b.h2),
                p(&b.lengths),
                p(&b.pooled),
                s.batch,
                s.seq,
                h,
                Pooling::Mean,
                true,
            )
        }?;
        Ok(())
    })?;
    Ok(())
}

/// One whole layer on the GPU against the CPU composite.
fn check_layer(
    env: &Env,
    dtype: WeightDtype,
    s: &Shape,
    rng: &mut Rng,
    checks: &mut Vec<Check>,
) -> Res<()> {
    let h = s.hidden;
    let lw = layer_weights(dtype, h, 4 * h, rng);
    let x = rng.values(dtype, s.tokens() * h, 1.0);
    let (want_h2, want_pooled) = cpu_layer(dtype, s, &x, &lw);
    let bufs = layer_bufs(&env.stream, dtype, s, &x, &lw)?;
    enqueue_layer(env, dtype, s, &bufs, None)?;
    let limit = match dtype {
        WeightDtype::F32 => 1e-4,
        WeightDtype::F16 => 5e-3,
        WeightDtype::BF16 => 3e-2,
    };
    let label = s.label();
    let st = &env.stream;
    checks.push(compare_norm(
        "layer output",
        dtype,
        &label,
        &bufs.h2.read(st)?,
        &want_h2,
        limit,
    ));
    checks.push(compare_norm(
        "layer pooled",
        dtype,
        &label,
        &bufs.pooled.read(st)?,
        &want_pooled,
        limit,
    ));
    Ok(())
}

struct Timing {
    name: String,
    us: f64,
    tflops: Option<f64>,
    gbps: Option<f64>,
}

/// Median times of each step of a BERT-large-shaped f16 layer and of the whole layer.
fn time_bert_large(env: &Env) -> Res<Vec<Timing>> {
    let dtype = WeightDtype::F16;
    let s = Shape {
        batch: 128,
        seq: 64,
        hidden: 1024,
        heads: 16,
        lengths: (0..128).map(|i| 32 + (i * 7) % 33).collect(),
        offset: 0,
        type_ids: false,
        position_offset: 0,
    };
    let mut rng = Rng(0x5eed_b1a5);
    let lw = layer_weights(dtype, s.hidden, 4 * s.hidden, &mut rng);
    let x = rng.values(dtype, s.tokens() * s.hidden, 1.0);
    let bufs = layer_bufs(&env.stream, dtype, &s, &x, &lw)?;
    for _ in 0..3 {
        enqueue_layer(env, dtype, &s, &bufs, None)?;
    }
    let mut per_step: Vec<(&'static str, Vec<f64>)> = Vec::new();
    let mut whole = Vec::new();
    for _ in 0..TIMED_RUNS {
        let start = env
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        enqueue_layer(env, dtype, &s, &bufs, None)?;
        let end = env
            .stream
            .record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let mut marks = Marks::new();
        enqueue_layer(env, dtype, &s, &bufs, Some(&mut marks))?;
        env.stream.synchronize()?;
        whole.push(f64::from(start.elapsed_ms(&end)?) * 1e3);
        for (i, (name, a, b)) in marks.iter().enumerate() {
            if per_step.len() <= i {
                per_step.push((name, Vec::new()));
            }
            per_step[i].1.push(f64::from(a.elapsed_ms(b)?) * 1e3);
        }
    }
    let (t, h) = (s.tokens() as f64, s.hidden as f64);
    let (ffn, seq, bh) = (4.0 * h, s.seq as f64, (s.batch * s.heads) as f64);
    let hd = h / s.heads as f64;
    let es = 2.0;
    // FLOPs of the products; bytes moved (read + write) of the other steps.
    let work = |name: &str| -> (Option<f64>, Option<f64>) {
        match name {
            "linear qkv (3x)" => (Some(3.0 * 2.0 * t * h * h), None),
            "linear out" => (Some(2.0 * t * h * h), None),
            "linear ffn up" | "linear ffn down" => (Some(2.0 * t * h * ffn), None),
            "q·kᵀ" => (Some(2.0 * bh * seq * seq * hd), None),
            "p·v" => (Some(2.0 * bh * seq * hd * seq), None),
            "split_heads" => (None, Some(es * 6.0 * t * h)),
            "masked_softmax" => (None, Some(es * 2.0 * bh * seq * seq)),
            "merge_heads" => (None, Some(es * 2.0 * t * h)),
            "residual_ln 1 (in place)" | "residual_ln 2" => (None, Some(es * 3.0 * t * h)),
            "bias_gelu" => (None, Some(es * 2.0 * t * ffn)),
            "pool mean + normalize" => (None, Some(es * t * h)),
            _ => (None, None),
        }
    };
    let mut out = Vec::new();
    let mut total_flops = 0.0;
    for (name, mut times) in per_step {
        let us = median(&mut times);
        let (flops, bytes) = work(name);
        total_flops += flops.unwrap_or(0.0);
        out.push(Timing {
            name: name.to_owned(),
            us,
            tflops: flops.map(|f| f / us / 1e6),
            gbps: bytes.map(|b| b / us / 1e3),
        });
    }
    let us = median(&mut whole);
    out.push(Timing {
        name: "whole layer".to_owned(),
        us,
        tflops: Some(total_flops / us / 1e6),
        gbps: None,
    });
    Ok(out)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn json_line(device: &str, checks: &[Check], timings: &[Timing]) -> String {
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
