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
//! sequence, batch 1, unaligned pointers (the scalar kernels) and wide rows (4096, 8192);
//! the kernels that read or write token rows again on the same sequences packed without
//! padding (`Layout::Packed`), against the reference run padded.
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
//!
//! # Layout
//!
//! - `main.rs`: the order of the checks, the verdict and the exit code.
//! - `env.rs`: what the checks run in: the device, one shape's context, ε, the error type.
//! - `shape.rs`: the shapes the checks run over.
//! - `buf.rs`: device buffers with an offset and a guard; dtype rounding and bytes.
//! - `rng.rs`: the deterministic inputs.
//! - `compare.rs`: the tolerances and the comparison of an output with its reference.
//! - `norms.rs`: embeddings + LayerNorm and bias + residual + LayerNorm, narrow and wide.
//! - `gelu.rs`: bias + GELU.
//! - `attention.rs`: split and merge heads, masked softmax.
//! - `pooling.rs`: pooling, every mode, with and without normalize.
//! - `fused.rs`: the fused attention against an f64 reference (sm_80+), and its timing.
//! - `packed.rs`: embeddings, head split and merge, pooling on packed sequences.
//! - `products.rs`: the cuBLAS linear layer and batched products.
//! - `layer.rs`: one encoder layer's weights and device buffers.
//! - `enqueue.rs`: one encoder layer enqueued step by step, with optional timing marks.
//! - `layer_check.rs`: the CPU composite layer, and the GPU layer checked against it.
//! - `timing.rs`: the BERT-large f16 layer's timings.
//! - `report.rs`: the table of checks, the timing table, the counts and the JSON line.

mod attention;
mod buf;
mod compare;
mod enqueue;
mod env;
mod fused;
mod gelu;
mod layer;
mod layer_check;
mod norms;
mod packed;
mod pooling;
mod products;
mod report;
mod rng;
mod shape;
mod timing;

use std::process::ExitCode;

use cudarc::driver::CudaContext;
use modelshare_kernels::{Blas, KernelCache, WeightDtype, encoder, sys};

use crate::attention::{check_heads, check_masked_softmax};
use crate::compare::Check;
use crate::env::{Env, Pieces, Res};
use crate::fused::{check_fused_attention, check_fused_packed};
use crate::gelu::check_bias_gelu;
use crate::layer_check::check_layer;
use crate::norms::{check_embed_layer_norm, check_residual_layer_norm, check_wide_norm};
use crate::packed::check_packed;
use crate::pooling::check_pooling;
use crate::products::{check_blas_attention, check_blas_linear, check_odd_linear};
use crate::report::{print_checks, print_summary};
use crate::rng::Rng;
use crate::shape::{Shape, shapes};
use crate::timing::time_bert_large;

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
        if encoder::attention_supported(dtype, 64, major) {
            check_fused_attention(&env, dtype, &mut rng, &mut checks)?;
            check_fused_packed(&env, dtype, &mut rng, &mut checks)?;
        }
    }
    print_checks(&checks);
    let all_ok = checks.iter().all(|c| c.ok);

    let timings = time_bert_large(&env)?;
    print_summary(&device, &checks, &timings);
    Ok(all_ok)
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
    check_packed(&cx, rng, checks)?;
    Ok(())
}
