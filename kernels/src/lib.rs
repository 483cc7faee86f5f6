//! CUDA kernels for modelshare workers: CUDA C sources compiled at run time with NVRTC and
//! cached, their launchers on raw device pointers, CPU references of the same operations,
//! and the host matrix products of workers' CPU backend.
//!
//! # Layout
//!
//! - `cuda/gemv.cu`, `cuda/encoder.cu` (and `device/cuda/checksum.cu`, owned by
//!   `modelshare-device`): the kernels, plain CUDA C with no header, compiled for the
//!   device's own architecture.
//! - [`compile`]: [`KernelCache`], NVRTC compilation cached in memory per context and on
//!   disk as PTX (`$MODELSHARE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/modelshare/kernels`, else
//!   `~/.cache/modelshare/kernels`).
//! - [`gemv`]: [`gemv()`](gemv::gemv), `y = W·x` with W in f32, f16 or bf16 and x, y in f32.
//! - [`encoder`]: the pieces of a BERT encoder forward pass around its matrix products, on
//!   activations and weights of one [`WeightDtype`] with f32 math: embeddings + LayerNorm,
//!   bias + GELU, bias + residual + LayerNorm, head split/merge, masked softmax, pooling.
//! - [`blas`]: [`Blas`], cuBLAS on raw pointers: the linear layers (`x·wᵀ`) and the
//!   attention's strided batched products, row-major, f32 accumulation.
//! - [`checksum`]: [`ms64()`](checksum::ms64), the ms64 of device bytes.
//! - [`host_gemm`]: f32 matrix products on the host (the `gemm` crate, multithreaded) over
//!   strided views of borrowed slices, for workers' CPU backend.
//! - [`reference`](mod@reference): CPU references: `gemv_f32/f16/bf16` (f64 accumulation), the fast
//!   [`ms64`](reference::ms64) / [`ms64_parallel`](reference::ms64_parallel) the server's
//!   loader puts in manifests, and the encoder's pieces in f32
//!   ([`reference::encoder`]), fast enough for a CPU forward pass.
//! - [`sys`]: whether the driver, NVRTC and cuBLAS libraries can be loaded (cudarc loads them at run
//!   time and panics when one is missing; these return [`KernelError::LibraryMissing`]).
//! - [`error`]: [`KernelError`], the crate's one error type.
//!
//! Data flow in a worker: `sys::driver_available` → `CudaContext::new` → one shared
//! [`KernelCache`] → `gemv::gemv(&cache, &stream, dtype, w_ptr, x_ptr, y_ptr, rows, cols)`
//! with `w_ptr` pointing into the imported arena. Launchers validate sizes and pointers
//! (never panicking on them), fetch the function from the cache (compiling on first use)
//! and enqueue on the caller's stream; they are `unsafe fn`s because the memory behind a
//! raw pointer is the caller's promise.
//!
//! An encoder layer on the device, `h` `[batch·seq, hidden]`, one stream, no host
//! synchronization (so a graph can capture it): `Blas::linear` ×3 (Q, K, V) →
//! [`encoder::split_heads`] (bias, `1/√d` on Q) → `Blas::batched_matmul` (`Q·Kᵀ`) →
//! [`encoder::masked_softmax`] → `Blas::batched_matmul` (`P·V`) → [`encoder::merge_heads`]
//! → `Blas::linear` → [`encoder::bias_residual_layer_norm`] (into `h`) → `Blas::linear` →
//! [`encoder::bias_gelu`] → `Blas::linear` → [`encoder::bias_residual_layer_norm`]; after
//! the last layer, [`encoder::pool`]. `examples/encoder_check/` runs exactly this against
//! the CPU references.
//!
//! # ms64, the device-friendly checksum
//!
//! For a byte string of length `len`, let `n = ceil(len / 8)` and let word `w_i`
//! (`i` in `0..n`) be the little-endian `u64` of bytes `[8i, 8i + 8)`, zero-padded past
//! `len`. Then, with all arithmetic wrapping mod 2^64:
//!
//! ```text
//! ms64 = len * 0x9E3779B97F4A7C15 + Σ_i splitmix64(w_i ^ (i * 0xD1B54A32D192ED03))
//!
//! splitmix64(z):  z += 0x9E3779B97F4A7C15
//!                 z  = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
//!                 z  = (z ^ (z >> 27)) * 0x94D049BB133111EB
//!                 return z ^ (z >> 31)
//! ```
//!
//! So `ms64(b"") == 0`. Why it exists: the server checksums every byte it loads and a worker
//! may verify what it imported on the device. xxh3, fast on one CPU core, is a
//! sequential chain per stream and does not map onto thousands of GPU threads; ms64 is a
//! sum of independent per-word terms, so any split of the words (threads, blocks, host
//! threads in [`ms64_parallel`](crate::reference::ms64_parallel)) adds up to the same value, on the CPU and the
//! GPU alike. The word index mixed into each term makes it position-dependent (swapping
//! two words changes it), and the length term tells real trailing zero bytes from padding.
//! It is an integrity check against corruption and mix-ups, **not** a cryptographic hash:
//! anyone can construct collisions on purpose.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod bert;
pub mod blas;
pub mod checksum;
pub mod compile;
pub mod encoder;
pub mod error;
pub mod gemv;
pub mod host_gemm;
pub mod reference;
pub mod sys;

pub use blas::{BatchedMatmul, Blas};
pub use compile::{CacheStats, DeviceInfo, KernelCache, KernelSource};
pub use encoder::Pooling;
pub use error::KernelError;
pub use gemv::WeightDtype;
