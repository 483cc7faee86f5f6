// encoder.cu: the element-wise and row-wise pieces of a BERT encoder forward
// pass (the matrix products are cuBLAS, kernels/src/blas.rs): embeddings +
// LayerNorm, bias + GELU, bias + residual + LayerNorm, head split and merge,
// masked softmax, pooling.
//
// Compiled at run time by NVRTC (kernels/src/compile.rs); it includes no header,
// so half and bfloat16 are raw 16-bit words converted with PTX cvt (f16) or bit
// operations (bf16). Activations and weights share one element type; all math
// is f32, rounded once (to nearest even) on store. Launched by
// kernels/src/encoder.rs, which checks sizes and pointers and picks, for each
// operation, one of two widths:
//   *_v: 16-byte loads and stores (4 f32 or 8 f16/bf16 per chunk), when every
//     pointer is 16-byte aligned and the rows (or heads) are whole chunks;
//   *_s: one element per chunk, any alignment.
//
// Row kernels (LayerNorms, softmax) keep the row in registers: thread x of row
// y holds chunks x, x + blockDim.x, ... (at most 16 elements), so each element
// is read and written by the same thread and a row may be normalized in place.
// Block (blockDim.x, blockDim.y): blockDim.x threads per row (a power of two
// below 32 for short rows, so a warp holds several rows, else a multiple of
// 32), blockDim.y rows per block; row = blockIdx.x * blockDim.y + threadIdx.y.
// Element-wise kernels stride over chunks with 64-bit indices.

#define MS_FULL_MASK 0xffffffffu
// Elements of a row one thread holds in registers (the launcher sizes blocks so).
#define MS_ROW_ELEMS 16
// No header, so no INFINITY: the bits of -inf.
#define MS_NEG_INF __uint_as_float(0xff800000u)

typedef unsigned long long ms_u64;

// --- element types ---------------------------------------------------------

__device__ __forceinline__ float ms_f16_to_f32(unsigned short v) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(v));
    return f;
}

__device__ __forceinline__ unsigned short ms_f32_to_f16(float f) {
    unsigned short h;
    asm("{ cvt.rn.f16.f32 %0, %1; }" : "=h"(h) : "f"(f));
    return h;
}

// A bf16 is the high half of an f32.
__device__ __forceinline__ float ms_bf16_to_f32(unsigned short v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

// Round to nearest even (as the `half` crate's bf16::from_f32); NaN stays NaN.
__device__ __forceinline__ unsigned short ms_f32_to_bf16(float f) {
    unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x0040u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (unsigned short)(u >> 16);
}

// Element types: VEC elements per 16-byte chunk, scalar load and store, and
// the unpacking / packing of one 16-byte chunk.
struct MsF32 {
    typedef float T;
    enum { VEC = 4 };
    static __device__ __forceinline__ float ld(const float* p) { return *p; }
    static __device__ __forceinline__ void st(float* p, float v) { *p = v; }
    static __device__ __forceinline__ void unpack(uint4 r, float* o) {
        o[0] = __uint_as_float(r.x);
        o[1] = __uint_as_float(r.y);
        o[2] = __uint_as_float(r.z);
        o[3] = __uint_as_float(r.w);
    }
    static __device__ __forceinline__ uint4 pack(const float* v) {
        return make_uint4(__float_as_uint(v[0]), __float_as_uint(v[1]), __float_as_uint(v[2]),
                          __float_as_uint(v[3]));
    }
};

struct MsF16 {
    typedef unsigned short T;
    enum { VEC = 8 };
    static __device__ __forceinline__ float ld(const unsigned short* p) { return ms_f16_to_f32(*p); }
    static __device__ __forceinline__ void st(unsigned short* p, float v) { *p = ms_f32_to_f16(v); }
    static __device__ __forceinline__ void two(unsigned int w, float* o) {
        o[0] = ms_f16_to_f32((unsigned short)(w & 0xffffu));
        o[1] = ms_f16_to_f32((unsigned short)(w >> 16));
    }
    static __device__ __forceinline__ void unpack(uint4 r, float* o) {
        two(r.x, o);
        two(r.y, o + 2);
        two(r.z, o + 4);
        two(r.w, o + 6);
    }
    static __device__ __forceinline__ unsigned int pair(const float* v) {
        return (unsigned int)ms_f32_to_f16(v[0]) | ((unsigned int)ms_f32_to_f16(v[1]) << 16);
    }
    static __device__ __forceinline__ uint4 pack(const float* v) {
        return make_uint4(pair(v), pair(v + 2), pair(v + 4), pair(v + 6));
    }
};

struct MsBF16 {
    typedef unsigned short T;
    enum { VEC = 8 };
    static __device__ __forceinline__ float ld(const unsigned short* p) { return ms_bf16_to_f32(*p); }
    static __device__ __forceinline__ void st(unsigned short* p, float v) { *p = ms_f32_to_bf16(v); }
    static __device__ __forceinline__ void two(unsigned int w, float* o) {
        o[0] = __uint_as_float(w << 16);
        o[1] = __uint_as_float(w & 0xffff0000u);
    }
    static __device__ __forceinline__ void unpack(uint4 r, float* o) {
        two(r.x, o);
        two(r.y, o + 2);
        two(r.z, o + 4);
        two(r.w, o + 6);
    }
    static __device__ __forceinline__ unsigned int pair(const float* v) {
        return (unsigned int)ms_f32_to_bf16(v[0]) | ((unsigned int)ms_f32_to_bf16(v[1]) << 16);
    }
    static __device__ __forceinline__ uint4 pack(const float* v) {
        return make_uint4(pair(v), pair(v + 2), pair(v + 4), pair(v + 6));
    }
};

// W consecutive elements at p (W == 1, or W == E::VEC with p 16-byte aligned).
template <class E, int W>
__device__ __forceinline__ void ms_ld(const typename E::T* p, float (&o)[W]) {
    if constexpr (W == 1) {
        o[0] = E::ld(p);
    } else {
        E::unpack(*reinterpret_cast<const uint4*>(p), o);
    }
}

template <class E, int W>
__device__ __forceinline__ void ms_st(typename E::T* p, const float (&v)[W]) {
    if constexpr (W == 1) {
        E::st(p, v[0]);
    } else {
        *reinterpret_cast<uint4*>(p) = E::pack(v);
    }
}

// --- reductions ------------------------------------------------------------

// The sum (or max) of v over the blockDim.x threads of this thread's row,
// returned to all of them. Every thread of the block must call it (it may
// hold __syncthreads). blockDim.x is a power of two below 32 (a row is a
// group of lanes within a warp; xor shuffles stay inside the group) or a
// multiple of 32; blockDim.x * blockDim.y is a multiple of 32, at most 1024.
template <bool MAX>
__device__ __forceinline__ float ms_row_reduce(float v) {
    __shared__ float partial[32];
    const int width = blockDim.x < 32 ? (int)blockDim.x : 32;
    for (int o = width >> 1; o > 0; o >>= 1) {
        const float t = __shfl_xor_sync(MS_FULL_MASK, v, o);
        v = MAX ? fmaxf(v, t) : v + t;
    }
    const int warps = blockDim.x >> 5;
    if (warps <= 1) return v;
    const int lane = threadIdx.x & 31;
    const int base = threadIdx.y * warps;
    __syncthreads();  // the previous call's readers are done with `partial`
    if (lane == 0) partial[base + (threadIdx.x >> 5)] = v;
    __syncthreads();
    float t = lane < warps ? partial[base + lane] : (MAX ? MS_NEG_INF : 0.0f);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(MS_FULL_MASK, t, o);
        t = MAX ? fmaxf(t, u) : t + u;
    }
    return t;
}

// --- LayerNorm over a row held in registers ---------------------------------

// out_row = (v - mean) / sqrt(var + eps) * gamma + beta over the row's `cols`
// elements, held as chunks (see the top). Inactive rows (past the last) take
// part in the reductions and store nothing.
template <class E, int W>
__device__ __forceinline__ void ms_layer_norm_store(float (&v)[MS_ROW_ELEMS / W][W], bool active,
                                                    int cols, const typename E::T* gamma,
                                                    const typename E::T* beta,
                                                    typename E::T* out_row, float eps) {
    constexpr int CPT = MS_ROW_ELEMS / W;
    const int nch = cols / W;
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        if ((int)threadIdx.x + k * (int)blockDim.x < nch) {
#pragma unroll
            for (int w = 0; w < W; ++w) s += v[k][w];
        }
    }
    const float mean = ms_row_reduce<false>(s) / (float)cols;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        if ((int)threadIdx.x + k * (int)blockDim.x < nch) {
#pragma unroll
            for (int w = 0; w < W; ++w) {
                const float d = v[k][w] - mean;
                q = fmaf(d, d, q);
            }
        }
    }
    const float var = ms_row_reduce<false>(q) / (float)cols;
    const float rstd = 1.0f / sqrtf(var + eps);
    if (!active) return;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = (int)threadIdx.x + k * (int)blockDim.x;
        if (c < nch) {
            float g[W], b[W], o[W];
            ms_ld<E, W>(gamma + c * W, g);
            ms_ld<E, W>(beta + c * W, b);
#pragma unroll
            for (int w = 0; w < W; ++w) o[w] = fmaf((v[k][w] - mean) * rstd, g[w], b[w]);
            ms_st<E, W>(out_row + (long long)c * W, o);
        }
    }
}

// out[t] = LayerNorm(word[ids[t]] + position[p + pos_offset] +
// token_type[type_ids[t]]) with p = position_ids[t], or t % seq_len where
// position_ids is null (sequences packed without padding give each token's
// own); an id out of range contributes zeros, type_ids null means type 0 for
// every token.
template <class E, int W>
__device__ __forceinline__ void ms_embed_ln(typename E::T* __restrict__ out, const int* __restrict__ ids,
                                            const int* __restrict__ type_ids,
                                            const int* __restrict__ position_ids,
                                            const typename E::T* __restrict__ word,
                                            const typename E::T* __restrict__ position,
                                            const typename E::T* __restrict__ token_type,
                                            const typename E::T* __restrict__ gamma,
                                            const typename E::T* __restrict__ beta, long long tokens,
                                            int seq_len, int hidden, int vocab, int positions,
                                            int type_vocab, int pos_offset, float eps) {
    typedef typename E::T T;
    constexpr int CPT = MS_ROW_ELEMS / W;
    const long long t = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool active = t < tokens;
    const int nch = hidden / W;
    float v[CPT][W];
#pragma unroll
    for (int k = 0; k < CPT; ++k)
#pragma unroll
        for (int w = 0; w < W; ++w) v[k][w] = 0.0f;
    if (active) {
        const int id = ids[t];
        const int tt = type_ids ? type_ids[t] : 0;
        const int p = (position_ids ? position_ids[t] : (int)(t % seq_len)) + pos_offset;
        const T* wrow = (id >= 0 && id < vocab) ? word + (long long)id * hidden : nullptr;
        const T* trow = (tt >= 0 && tt < type_vocab) ? token_type + (long long)tt * hidden : nullptr;
        const T* prow = (p >= 0 && p < positions) ? position + (long long)p * hidden : nullptr;
#pragma unroll
        for (int k = 0; k < CPT; ++k) {
            const int c = (int)threadIdx.x + k * (int)blockDim.x;
            if (c < nch) {
                float a[W];
                if (wrow) {
                    ms_ld<E, W>(wrow + c * W, a);
#pragma unroll
                    for (int w = 0; w < W; ++w) v[k][w] += a[w];
                }
                if (prow) {
                    ms_ld<E, W>(prow + c * W, a);
#pragma unroll
                    for (int w = 0; w < W; ++w) v[k][w] += a[w];
                }
                if (trow) {
                    ms_ld<E, W>(trow + c * W, a);
#pragma unroll
                    for (int w = 0; w < W; ++w) v[k][w] += a[w];
                }
            }
        }
    }
    ms_layer_norm_store<E, W>(v, active, hidden, gamma, beta, out + t * hidden, eps);
}

// out[r] = LayerNorm(x[r] + bias + residual[r]); out may be x or residual
// (no __restrict__ on those: each element is read before the same thread
// writes it).
template <class E, int W>
__device__ __forceinline__ void ms_residual_ln(typename E::T* out, const typename E::T* x,
                                               const typename E::T* __restrict__ bias,
                                               const typename E::T* residual,
                                               const typename E::T* __restrict__ gamma,
                                               const typename E::T* __restrict__ beta, long long rows,
                                               int cols, float eps) {
    constexpr int CPT = MS_ROW_ELEMS / W;
    const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool active = r < rows;
    const int nch = cols / W;
    float v[CPT][W];
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
#pragma unroll
        for (int w = 0; w < W; ++w) v[k][w] = 0.0f;
        const int c = (int)threadIdx.x + k * (int)blockDim.x;
        if (active && c < nch) {
            float a[W], b[W], res[W];
            ms_ld<E, W>(x + r * cols + (long long)c * W, a);
            ms_ld<E, W>(bias + c * W, b);
            ms_ld<E, W>(residual + r * cols + (long long)c * W, res);
#pragma unroll
            for (int w = 0; w < W; ++w) v[k][w] = (a[w] + b[w]) + res[w];
        }
    }
    ms_layer_norm_store<E, W>(v, active, cols, gamma, beta, out + r * cols, eps);
}

// --- masked softmax ---------------------------------------------------------

// Rows of scores [batch * heads * seq, seq]; row r belongs to batch
// r / (heads * seq) and keeps keys j < lengths[batch] (clamped to [0, seq]).
template <class E, int W>
__device__ __forceinline__ void ms_masked_softmax(typename E::T* scores, const int* __restrict__ lengths,
                                                  long long rows, int seq, int heads) {
    constexpr int CPT = MS_ROW_ELEMS / W;
    const long long r = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    const bool active = r < rows;
    const int nch = seq / W;
    int len = 0;
    if (active) {
        len = lengths[r / ((long long)heads * seq)];
        len = len < 0 ? 0 : (len > seq ? seq : len);
    }
    typename E::T* row = scores + r * seq;
    float v[CPT][W];
    float m = MS_NEG_INF;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = (int)threadIdx.x + k * (int)blockDim.x;
#pragma unroll
        for (int w = 0; w < W; ++w) v[k][w] = MS_NEG_INF;
        if (active && c < nch && c * W < len) {
            float a[W];
            ms_ld<E, W>(row + (long long)c * W, a);
#pragma unroll
            for (int w = 0; w < W; ++w) {
                if (c * W + w < len) {
                    v[k][w] = a[w];
                    m = fmaxf(m, a[w]);
                }
            }
        }
    }
    m = ms_row_reduce<true>(m);
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = (int)threadIdx.x + k * (int)blockDim.x;
#pragma unroll
        for (int w = 0; w < W; ++w) {
            const float e = (c * W + w < len) ? expf(v[k][w] - m) : 0.0f;
            v[k][w] = e;
            s += e;
        }
    }
    s = ms_row_reduce<false>(s);
    if (!active) return;
    // len == 0: every e is 0 and s is 0; store zeros, not 0 * inf.
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
#pragma unroll
    for (int k = 0; k < CPT; ++k) {
        const int c = (int)threadIdx.x + k * (int)blockDim.x;
        if (c < nch) {
            float o[W];
#pragma unroll
            for (int w = 0; w < W; ++w) o[w] = v[k][w] * inv;
            ms_st<E, W>(row + (long long)c * W, o);
        }
    }
}

// --- element-wise ------------------------------------------------------------

// Exact GELU, 0.5 v (1 + erf(v / sqrt 2)).
__device__ __forceinline__ float ms_gelu(float v) {
    return 0.5f * v * (1.0f + erff(v * 0.70710678118654752440f));
}

// x[r, c] = gelu(x[r, c] + bias[c]) in place, over rows * cols elements.
template <class E, int W>
__device__ __forceinline__ void ms_bias_gelu(typename E::T* x, const typename E::T* __restrict__ bias,
                                             long long rows, int cols) {
    const long long per_row = cols / W;
    const long long chunks = rows * per_row;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < chunks;
         i += (long long)gridDim.x * blockDim.x) {
        const int c = (int)(i % per_row) * W;
        float a[W], b[W];
        ms_ld<E, W>(x + i * W, a);
        ms_ld<E, W>(bias + c, b);
#pragma unroll
        for (int w = 0; w < W; ++w) a[w] = ms_gelu(a[w] + b[w]);
        ms_st<E, W>(x + i * W, a);
    }
}

// --- packed sequences -------------------------------------------------------

// Where row j of sequence b lies in a [rows, width] tensor: b * seq + j when
// offsets is null (every sequence padded to seq), else offsets[b] + j, the
// sequences packed one after the other (offsets i32 [batch + 1], from 0). -1
// for a row past the sequence's end (offsets[b + 1] - offsets[b], at most seq)
// or outside the tensor's rows.
__device__ __forceinline__ long long ms_row_of(const int* __restrict__ offsets, long long b, int j,
                                               int seq, long long rows) {
    if (!offsets) return b * seq + j;
    const long long start = offsets[b];
    const long long len = (long long)offsets[b + 1] - start;
    const long long r = start + j;
    return (j < len && j < seq && start >= 0 && r < rows) ? r : -1;
}

// The head kernels take one token row of the padded per-head layout per
// (threadIdx.y, block): row = b * seq + s over batch * seq rows, its width
// (heads * head_dim) in chunks of W strided over threadIdx.x. The row's index
// math is done once per thread, the chunks' in 32 bits.

// blockIdx.y picks q, k or v: out[(b * heads + h) * seq + s, d] =
// (in[src, h * head_dim + d] + bias[h * head_dim + d]) * scale, with src =
// ms_row_of(offsets, b, s, seq, rows) (zeros where it is -1, so that padded
// keys and values are zeros, never stale memory) and scale = q_scale for q
// and 1 for k and v. `rows` is in's; the output has batch * seq rows per head.
template <class E, int W>
__device__ __forceinline__ void ms_split_heads(
    const typename E::T* __restrict__ q, const typename E::T* __restrict__ k,
    const typename E::T* __restrict__ v, const typename E::T* __restrict__ q_bias,
    const typename E::T* __restrict__ k_bias, const typename E::T* __restrict__ v_bias,
    typename E::T* __restrict__ q_out, typename E::T* __restrict__ k_out,
    typename E::T* __restrict__ v_out, const int* __restrict__ offsets, long long batch,
    long long rows, int seq, int heads, int head_dim, float q_scale) {
    typedef typename E::T T;
    const long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= batch * seq) return;
    const T* in = blockIdx.y == 0 ? q : (blockIdx.y == 1 ? k : v);
    const T* bias = blockIdx.y == 0 ? q_bias : (blockIdx.y == 1 ? k_bias : v_bias);
    T* out = blockIdx.y == 0 ? q_out : (blockIdx.y == 1 ? k_out : v_out);
    const float scale = blockIdx.y == 0 ? q_scale : 1.0f;
    const long long b = row / seq;
    const int s = (int)(row % seq);
    const long long src = ms_row_of(offsets, b, s, seq, rows);
    const int width = heads * head_dim;
    const int per_head = head_dim / W;
    T* out_seq = out + (b * heads * seq + s) * (long long)head_dim;
    for (int c = threadIdx.x; c < width / W; c += blockDim.x) {
        const int h = c / per_head;
        const int d = (c - h * per_head) * W;
        float a[W];
        if (src >= 0) {
            float bb[W];
            ms_ld<E, W>(in + src * width + h * head_dim + d, a);
            ms_ld<E, W>(bias + h * head_dim + d, bb);
#pragma unroll
            for (int w = 0; w < W; ++w) a[w] = (a[w] + bb[w]) * scale;
        } else {
#pragma unroll
            for (int w = 0; w < W; ++w) a[w] = 0.0f;
        }
        ms_st<E, W>(out_seq + (long long)h * seq * head_dim + d, a);
    }
}

// out[dst, h * head_dim + d] = ctx[(b * heads + h) * seq + s, d] with dst =
// ms_row_of(offsets, b, s, seq, rows), for the rows where it is not -1 (a
// padded row is not written). `rows` is out's.
template <class E, int W>
__device__ __forceinline__ void ms_merge_heads(const typename E::T* __restrict__ ctx,
                                               typename E::T* __restrict__ out,
                                               const int* __restrict__ offsets, long long batch,
                                               long long rows, int seq, int heads, int head_dim) {
    typedef typename E::T T;
    const long long row = (long long)blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= batch * seq) return;
    const long long b = row / seq;
    const int s = (int)(row % seq);
    const long long dst = ms_row_of(offsets, b, s, seq, rows);
    if (dst < 0) return;
    const int width = heads * head_dim;
    const int per_head = head_dim / W;
    const T* ctx_seq = ctx + (b * heads * seq + s) * (long long)head_dim;
    T* out_row = out + dst * width;
    for (int c = threadIdx.x; c < width / W; c += blockDim.x) {
        const int h = c / per_head;
        const int d = (c - h * per_head) * W;
        float a[W];
        ms_ld<E, W>(ctx_seq + (long long)h * seq * head_dim + d, a);
        ms_st<E, W>(out_row + h * head_dim + d, a);
    }
}

// --- pooling -------------------------------------------------------------------

// One block (blockDim.y == 1) per batch row b: out f32 [b, :] from the rows
// of x of sequence b, from offsets[b] (b * seq where offsets is null), len =
// lengths[b] of them, clamped to [0, seq] and to x's `rows`. mode: 0 mean, 1 cls, 2 max,
// 3 sum / sqrt(len); then, if normalize, divided by max(L2 norm, 1e-12).
template <class E>
__device__ __forceinline__ void ms_pool(const typename E::T* __restrict__ x,
                                        const int* __restrict__ lengths,
                                        const int* __restrict__ offsets, float* __restrict__ out,
                                        long long rows, int seq, int hidden, int mode,
                                        int normalize) {
    typedef typename E::T T;
    const long long b = blockIdx.x;
    int len = lengths[b];
    len = len < 0 ? 0 : (len > seq ? seq : len);
    long long start = offsets ? (long long)offsets[b] : b * seq;
    if (start < 0 || start > rows) start = rows;
    if (start + len > rows) len = (int)(rows - start);
    const T* xb = x + start * (long long)hidden;
    float* ob = out + b * (long long)hidden;
    const int tokens = mode == 1 ? (len > 0 ? 1 : 0) : len;
    float sq = 0.0f;
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
        // Four independent chains over the tokens, for loads in flight.
        float acc[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) acc[u] = mode == 2 ? MS_NEG_INF : 0.0f;
        int t = 0;
        for (; t + 4 <= tokens; t += 4) {
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const float e = E::ld(xb + (long long)(t + u) * hidden + c);
                acc[u] = mode == 2 ? fmaxf(acc[u], e) : acc[u] + e;
            }
        }
        for (; t < tokens; ++t) {
            const float e = E::ld(xb + (long long)t * hidden + c);
            acc[0] = mode == 2 ? fmaxf(acc[0], e) : acc[0] + e;
        }
        float r;
        if (tokens == 0) {
            r = 0.0f;
        } else if (mode == 2) {
            r = fmaxf(fmaxf(acc[0], acc[1]), fmaxf(acc[2], acc[3]));
        } else {
            r = (acc[0] + acc[1]) + (acc[2] + acc[3]);
            if (mode == 0) r = r / (float)len;
            if (mode == 3) r = r / sqrtf((float)len);
        }
        ob[c] = r;
        sq = fmaf(r, r, sq);
    }
    if (!normalize) return;
    const float norm = sqrtf(ms_row_reduce<false>(sq));
    const float inv = 1.0f / fmaxf(norm, 1e-12f);
    // Each thread rescales the values it wrote itself.
    for (int c = threadIdx.x; c < hidden; c += blockDim.x) ob[c] = ob[c] * inv;
}

// --- entry points ------------------------------------------------------------------

#define MS_EMBED_LN(NAME, E, W)                                                                    \
    extern "C" __global__ void __launch_bounds__(512) NAME(                                     \
        E::T* out, const int* ids, const int* type_ids, const int* position_ids, const E::T* word, \
        const E::T* position, const E::T* token_type, const E::T* gamma, const E::T* beta,         \
        long long tokens, int seq_len, int hidden, int vocab, int positions, int type_vocab,       \
        int pos_offset, float eps) {                                                               \
        ms_embed_ln<E, W>(out, ids, type_ids, position_ids, word, position, token_type, gamma,     \
                          beta, tokens, seq_len, hidden, vocab, positions, type_vocab, pos_offset, \
                          eps);                                                                    \
    }

#define MS_RESIDUAL_LN(NAME, E, W)                                                                 \
    extern "C" __global__ void __launch_bounds__(512) NAME(                                     \
        E::T* out, const E::T* x, const E::T* bias, const E::T* residual, const E::T* gamma,       \
        const E::T* beta, long long rows, int cols, float eps) {                                   \
        ms_residual_ln<E, W>(out, x, bias, residual, gamma, beta, rows, cols, eps);               \
    }

#define MS_SOFTMAX(NAME, E, W)                                                                     \
    extern "C" __global__ void __launch_bounds__(512) NAME(E::T* scores, const int* lengths,    \
                                                            long long rows, int seq, int heads) { \
        ms_masked_softmax<E, W>(scores, lengths, rows, seq, heads);                                \
    }

#define MS_BIAS_GELU(NAME, E, W)                                                                   \
    extern "C" __global__ void __launch_bounds__(256) NAME(E::T* x, const E::T* bias,            \
                                                           long long rows, int cols) {             \
        ms_bias_gelu<E, W>(x, bias, rows, cols);                                                   \
    }

#define MS_SPLIT_HEADS(NAME, E, W)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                      \
        const E::T* q, const E::T* k, const E::T* v, const E::T* q_bias, const E::T* k_bias,       \
        const E::T* v_bias, E::T* q_out, E::T* k_out, E::T* v_out, const int* offsets,             \
        long long batch, long long rows, int seq, int heads, int head_dim, float q_scale) {        \
        ms_split_heads<E, W>(q, k, v, q_bias, k_bias, v_bias, q_out, k_out, v_out, offsets, batch, \
                             rows, seq, heads, head_dim, q_scale);                                 \
    }

#define MS_MERGE_HEADS(NAME, E, W)                                                                 \
    extern "C" __global__ void __launch_bounds__(256) NAME(                                      \
        const E::T* ctx, E::T* out, const int* offsets, long long batch, long long rows, int seq,  \
        int heads, int head_dim) {                                                                 \
        ms_merge_heads<E, W>(ctx, out, offsets, batch, rows, seq, heads, head_dim);                \
    }

#define MS_POOL(NAME, E)                                                                           \
    extern "C" __global__ void __launch_bounds__(1024) NAME(                                     \
        const E::T* x, const int* lengths, const int* offsets, float* out, long long rows, int seq, \
        int hidden, int mode, int normalize) {                                                     \
        ms_pool<E>(x, lengths, offsets, out, rows, seq, hidden, mode, normalize);                  \
    }

#define MS_ALL_WIDTHS(MACRO, OP)                 \
    MACRO(ms_##OP##_f32_s, MsF32, 1)             \
    MACRO(ms_##OP##_f32_v, MsF32, MsF32::VEC)    \
    MACRO(ms_##OP##_f16_s, MsF16, 1)             \
    MACRO(ms_##OP##_f16_v, MsF16, MsF16::VEC)    \
    MACRO(ms_##OP##_bf16_s, MsBF16, 1)           \
    MACRO(ms_##OP##_bf16_v, MsBF16, MsBF16::VEC)

MS_ALL_WIDTHS(MS_EMBED_LN, embed_ln)
MS_ALL_WIDTHS(MS_RESIDUAL_LN, residual_ln)
MS_ALL_WIDTHS(MS_SOFTMAX, softmax)
MS_ALL_WIDTHS(MS_BIAS_GELU, bias_gelu)
MS_ALL_WIDTHS(MS_SPLIT_HEADS, split_heads)
MS_ALL_WIDTHS(MS_MERGE_HEADS, merge_heads)

MS_POOL(ms_pool_f32, MsF32)
MS_POOL(ms_pool_f16, MsF16)
MS_POOL(ms_pool_bf16, MsBF16)

// --- fused attention ---------------------------------------------------------------

// Attention over the split heads in one pass (FlashAttention-2's loop, on the
// tensor cores with mma.sync m16n8k16, f32 accumulation), in place: for head
// bh = b * heads + h, q/k/v [bh, seq, HD] (q already scaled), each query row
// r < len (len = lengths[b] clamped to [0, seq]) becomes softmax(q_r · kᵀ over
// the keys j < len) · v, written over q's row r. Rows at or past len are left
// as they are (the merge drops them). Keys are read only below len, in tiles of
// 64 (32 for head sizes over 80); a CTA of four warps takes MS_ATT_Q query rows
// (16 a warp), so the scores never leave registers. Grid: (batch * heads,
// ceil(seq / MS_ATT_Q)).
// The tensor-core instructions need sm_80: older devices get no attention
// kernel (the launcher then takes the three-step path).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define MS_ATT_Q 64
#define MS_ATT_PAD 8

// The tensor-core operations of one 16-bit type (f16 or bf16, as PTX names it):
// two f32 packed into one register (lo in the low half), and D += A·B.
#define MS_ATT_TYPE(NAME, PTX)                                                                     \
    struct NAME {                                                                                  \
        static __device__ __forceinline__ unsigned int pack(float lo, float hi) {                  \
            unsigned int r;                                                                        \
            asm("{ cvt.rn." PTX "x2.f32 %0, %1, %2; }" : "=r"(r) : "f"(hi), "f"(lo));              \
            return r;                                                                              \
        }                                                                                          \
        static __device__ __forceinline__ void mma(float (&c)[4], const unsigned int (&a)[4],      \
                                                   unsigned int b0, unsigned int b1) {             \
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX "." PTX ".f32 "              \
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"         \
                         : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                          \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));          \
        }                                                                                          \
    };

MS_ATT_TYPE(MsAttF16, "f16")
MS_ATT_TYPE(MsAttBF16, "bf16")

// Two consecutive 16-bit elements of shared memory as one 32-bit word (the
// offset is even: every row stride and column used is).
__device__ __forceinline__ unsigned int ms_att_word(const unsigned short* p) {
    return *reinterpret_cast<const unsigned int*>(p);
}

// The shared-space address of a pointer into shared memory (for ldmatrix).
__device__ __forceinline__ unsigned int ms_att_smem(const void* p) {
    unsigned int a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8x8 blocks of 16-bit elements from shared memory, transposed (ldmatrix
// .trans): lanes 8i..8i+7 give the rows of block i; r[i] is this lane's pair
// of block i's column lane / 4, rows 2 (lane % 4) and 2 (lane % 4) + 1.
__device__ __forceinline__ void ms_att_ldmatrix_t(unsigned int (&r)[4], unsigned int addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// 8 elements of a row at `p` (16-byte aligned), with `bias` added and scaled
// when the heads are read straight from the packed projections (the split's
// math: f32, rounded once), as they are otherwise.
template <class E, bool PACKED>
__device__ __forceinline__ uint4 ms_att_load(const unsigned short* p, const unsigned short* bias,
                                             float scale) {
    uint4 w = *reinterpret_cast<const uint4*>(p);
    if (PACKED) {
        float f[8], bb[8];
        E::unpack(w, f);
        E::unpack(*reinterpret_cast<const uint4*>(bias), bb);
#pragma unroll
        for (int e = 0; e < 8; ++e) f[e] = (f[e] + bb[e]) * scale;
        w = E::pack(f);
    }
    return w;
}

// PACKED: q, k, v are the projections [rows, heads * HD] without bias, the
// sequences packed (sequence b from row offsets[b], offsets[b + 1] - offsets[b]
// rows, at most seq, never past `rows`); head h is columns h * HD.. of each
// row, its bias added (and q scaled by q_scale) as it is read, and the context
// written over q's columns of the head: the split and the merge are gone.
// Else q, k, v are the split heads [batch * heads, seq, HD] and lengths[b]
// each sequence's length.
template <class A, class E, int HD, bool PACKED>
__device__ __forceinline__ void ms_attention(
    unsigned short* __restrict__ q, const unsigned short* __restrict__ k,
    const unsigned short* __restrict__ v, const int* __restrict__ lengths,
    const unsigned short* __restrict__ q_bias, const unsigned short* __restrict__ k_bias,
    const unsigned short* __restrict__ v_bias, const int* __restrict__ offsets, long long rows,
    int heads, int seq, float q_scale) {
    // Keys a tile: 64, or 32 for the widest heads (shared memory under 48 KiB).
    constexpr int KV = HD > 80 ? 32 : 64;
    constexpr int QS = HD + MS_ATT_PAD;  // row stride of Qs, Ks and Vs
    constexpr int CH = HD / 8;           // 16-byte chunks per row
    __shared__ __align__(16) unsigned short Qs[MS_ATT_Q * QS];
    __shared__ __align__(16) unsigned short Ks[KV * QS];
    __shared__ __align__(16) unsigned short Vs[KV * QS];

    const long long bh = blockIdx.x;
    const int q0 = blockIdx.y * MS_ATT_Q;
    // This head's rows: from `at` (elements), `stride` apart, `len` of them.
    long long at;
    int len, stride;
    const unsigned short *qb = q_bias, *kb = k_bias, *vb = v_bias;
    if (PACKED) {
        const int h = (int)(bh % heads);
        const long long b = bh / heads, start = offsets[b];
        long long n = (long long)offsets[b + 1] - start;
        n = n < 0 ? 0 : (n > seq ? seq : n);
        if (start < 0 || start > rows) n = 0;
        else if (start + n > rows) n = rows - start;
        len = (int)n;
        stride = heads * HD;
        at = start * stride + h * HD;
        qb += h * HD;
        kb += h * HD;
        vb += h * HD;
    } else {
        len = lengths[bh / heads];
        len = len < 0 ? 0 : (len > seq ? seq : len);
        stride = HD;
        at = bh * seq * HD;
    }
    if (q0 >= len) return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    unsigned short* qh = q + at;
    const unsigned short* kh = k + at;
    const unsigned short* vh = v + at;

    // The query tile (rows past len as zeros).
    for (int c = tid; c < MS_ATT_Q * CH; c += blockDim.x) {
        const int r = c / CH, col = (c % CH) * 8;
        uint4 w = make_uint4(0, 0, 0, 0);
        if (q0 + r < len)
            w = ms_att_load<E, PACKED>(qh + (long long)(q0 + r) * stride + col, qb + col, q_scale);
        *reinterpret_cast<uint4*>(Qs + r * QS + col) = w;
    }
    __syncthreads();
    unsigned int qf[HD / 16][4];
    const int r0 = warp * 16;
#pragma unroll
    for (int kk = 0; kk < HD / 16; ++kk) {
        qf[kk][0] = ms_att_word(Qs + (r0 + g) * QS + kk * 16 + 2 * t);
        qf[kk][1] = ms_att_word(Qs + (r0 + g + 8) * QS + kk * 16 + 2 * t);
        qf[kk][2] = ms_att_word(Qs + (r0 + g) * QS + kk * 16 + 2 * t + 8);
        qf[kk][3] = ms_att_word(Qs + (r0 + g + 8) * QS + kk * 16 + 2 * t + 8);
    }
    // This lane's row of the four blocks ldmatrix reads from V: lanes 0-7 and 8-15 give
    // keys +0..7 and +8..15 at head columns +0, lanes 16-23 and 24-31 the same at +8; so a
    // load brings b0, b1 of one 8-column tile of the context, then b0, b1 of the next.
    const int vrow = (lane & 7) + ((lane >> 3) & 1) * 8, vcol = (lane >> 4) * 8;
    const unsigned int vs_lane = ms_att_smem(Vs + vrow * QS + vcol);

    float o[HD / 8][4];
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    // Running max and sum of rows g and g + 8 of this warp (log2 domain).
    float m0 = MS_NEG_INF, m1 = MS_NEG_INF, l0 = 0.0f, l1 = 0.0f;
    const float LOG2E = 1.4426950408889634f;

    for (int kv0 = 0; kv0 < len; kv0 += KV) {
        __syncthreads();  // the previous tile's readers are done
        for (int c = tid; c < KV * CH; c += blockDim.x) {
            const int r = c / CH, col = (c % CH) * 8;
            uint4 kw = make_uint4(0, 0, 0, 0), vw = make_uint4(0, 0, 0, 0);
            if (kv0 + r < len) {
                kw = ms_att_load<E, PACKED>(kh + (long long)(kv0 + r) * stride + col, kb + col, 1.0f);
                vw = ms_att_load<E, PACKED>(vh + (long long)(kv0 + r) * stride + col, vb + col, 1.0f);
            }
            *reinterpret_cast<uint4*>(Ks + r * QS + col) = kw;
            *reinterpret_cast<uint4*>(Vs + r * QS + col) = vw;
        }
        __syncthreads();

        // Scores of this warp's 16 rows against the tile's keys, 8 at a time.
        float s[KV / 8][4];
#pragma unroll
        for (int j = 0; j < KV / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; ++kk) {
                const unsigned short* kr = Ks + (j * 8 + g) * QS + kk * 16 + 2 * t;
                A::mma(s[j], qf[kk], ms_att_word(kr), ms_att_word(kr + 8));
            }
        }
        // Mask the keys at or past len; the rows' maxima.
        float mx0 = MS_NEG_INF, mx1 = MS_NEG_INF;
#pragma unroll
        for (int j = 0; j < KV / 8; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const bool in = kv0 + j * 8 + 2 * t + e < len;
                s[j][e] = in ? s[j][e] * LOG2E : MS_NEG_INF;
                s[j][2 + e] = in ? s[j][2 + e] * LOG2E : MS_NEG_INF;
                mx0 = fmaxf(mx0, s[j][e]);
                mx1 = fmaxf(mx1, s[j][2 + e]);
            }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(MS_FULL_MASK, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(MS_FULL_MASK, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(MS_FULL_MASK, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(MS_FULL_MASK, mx1, 2));
        // kv0 < len: every row sees at least one key, so the new maxima are finite.
        const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
        const float a0 = exp2f(m0 - n0), a1 = exp2f(m1 - n1);
        m0 = n0;
        m1 = n1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int j = 0; j < KV / 8; ++j) {
            s[j][0] = exp2f(s[j][0] - n0);
            s[j][1] = exp2f(s[j][1] - n0);
            s[j][2] = exp2f(s[j][2] - n1);
            s[j][3] = exp2f(s[j][3] - n1);
            sum0 += s[j][0] + s[j][1];
            sum1 += s[j][2] + s[j][3];
        }
        l0 = l0 * a0 + sum0;  // this thread's share; summed over the group at the end
        l1 = l1 * a1 + sum1;
#pragma unroll
        for (int d = 0; d < HD / 8; ++d) {
            o[d][0] *= a0;
            o[d][1] *= a0;
            o[d][2] *= a1;
            o[d][3] *= a1;
        }
        // P (as the A operand, 16 keys a step) times V: B operands by ldmatrix.trans from
        // the row-major tile, two head columns of 8 a load.
#pragma unroll
        for (int kc = 0; kc < KV / 16; ++kc) {
            unsigned int p[4];
            p[0] = A::pack(s[2 * kc][0], s[2 * kc][1]);
            p[1] = A::pack(s[2 * kc][2], s[2 * kc][3]);
            p[2] = A::pack(s[2 * kc + 1][0], s[2 * kc + 1][1]);
            p[3] = A::pack(s[2 * kc + 1][2], s[2 * kc + 1][3]);
#pragma unroll
            for (int d = 0; d < HD / 8; d += 2) {
                unsigned int b[4];
                ms_att_ldmatrix_t(b, vs_lane + (unsigned int)((kc * 16 * QS + d * 8) * 2));
                A::mma(o[d], p, b[0], b[1]);
                A::mma(o[d + 1], p, b[2], b[3]);
            }
        }
    }
    l0 += __shfl_xor_sync(MS_FULL_MASK, l0, 1);
    l0 += __shfl_xor_sync(MS_FULL_MASK, l0, 2);
    l1 += __shfl_xor_sync(MS_FULL_MASK, l1, 1);
    l1 += __shfl_xor_sync(MS_FULL_MASK, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    const int row0 = q0 + r0 + g, row1 = row0 + 8;
#pragma unroll
    for (int d = 0; d < HD / 8; ++d) {
        const int col = d * 8 + 2 * t;
        if (row0 < len)
            *reinterpret_cast<unsigned int*>(qh + (long long)row0 * stride + col) =
                A::pack(o[d][0] * inv0, o[d][1] * inv0);
        if (row1 < len)
            *reinterpret_cast<unsigned int*>(qh + (long long)row1 * stride + col) =
                A::pack(o[d][2] * inv1, o[d][3] * inv1);
    }
}

#define MS_ATTENTION(NAME, A, E, HD)                                                               \
    extern "C" __global__ void __launch_bounds__(128)                                              \
        NAME(unsigned short* q, const unsigned short* k, const unsigned short* v,                  \
             const int* lengths, int heads, int seq) {                                             \
        ms_attention<A, E, HD, false>(q, k, v, lengths, nullptr, nullptr, nullptr, nullptr, 0,     \
                                      heads, seq, 1.0f);                                           \
    }

#define MS_ATTENTION_PACKED(NAME, A, E, HD)                                                        \
    extern "C" __global__ void __launch_bounds__(128)                                              \
        NAME(unsigned short* q, const unsigned short* k, const unsigned short* v,                  \
             const unsigned short* q_bias, const unsigned short* k_bias,                           \
             const unsigned short* v_bias, const int* offsets, long long rows, int heads,          \
             int seq, float q_scale) {                                                             \
        ms_attention<A, E, HD, true>(q, k, v, nullptr, q_bias, k_bias, v_bias, offsets, rows,      \
                                     heads, seq, q_scale);                                         \
    }

#define MS_ATTENTION_ALL(MACRO, OP)                      \
    MACRO(ms_##OP##_f16_32, MsAttF16, MsF16, 32)         \
    MACRO(ms_##OP##_f16_64, MsAttF16, MsF16, 64)         \
    MACRO(ms_##OP##_f16_80, MsAttF16, MsF16, 80)         \
    MACRO(ms_##OP##_f16_128, MsAttF16, MsF16, 128)       \
    MACRO(ms_##OP##_bf16_32, MsAttBF16, MsBF16, 32)      \
    MACRO(ms_##OP##_bf16_64, MsAttBF16, MsBF16, 64)      \
    MACRO(ms_##OP##_bf16_80, MsAttBF16, MsBF16, 80)      \
    MACRO(ms_##OP##_bf16_128, MsAttBF16, MsBF16, 128)

MS_ATTENTION_ALL(MS_ATTENTION, attention)
MS_ATTENTION_ALL(MS_ATTENTION_PACKED, attention_packed)
#endif  // __CUDA_ARCH__ >= 800
