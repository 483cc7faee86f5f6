// gemv.cu: y = W·x for a row-major W [rows, cols] of f32, f16 or bf16, with
// x f32 [cols], y f32 [rows] and f32 accumulation.
//
// Compiled at run time by NVRTC (kernels/src/compile.rs); it includes no header,
// so half and bfloat16 are handled as raw 16-bit words. Launched by
// kernels/src/gemv.rs, which picks one of three layouts:
//   *_aligned: the fast path, when W's rows and x are 16-byte aligned (W and x
//     pointers aligned, cols * sizeof(elem) a multiple of 16). Each warp takes
//     MS_ROWS rows (2 for 16-bit weights, so each x value loaded serves two
//     rows; 1 for f32), with MS_STEPS 16-byte loads of each row in flight per
//     lane, and x loaded once per step for all its rows.
//   *_warp: any alignment, one warp per row. A row is read as a scalar head up
//     to its first 16-byte boundary, a 16-byte vector body and a scalar tail.
//   *_block: any alignment, one block per row, for few long rows.
// W is read exactly once, bypassing L1 (x stays there instead); all layouts
// stride over rows, so any grid size is correct.
// Per-row indices are 32-bit: the launcher refuses cols > 2^31 - 4097.
//
// Measured on an H100 (tuning notes in kernels/examples/gemv_lab.rs): the
// aligned layout reads 16384x16384 f16 and 8192x16384 f32 at 99-100% of the
// device-to-device copy bandwidth.

#define MS_UNROLL 4
#define MS_FULL_MASK 0xffffffffu

typedef unsigned long long ms_u64;

// Two f16 (the low half is the element at the lower address) to two f32.
__device__ __forceinline__ void ms_f16x2_to_f32(unsigned int v, float& lo, float& hi) {
    asm("{\n\t"
        ".reg .f16 l, h;\n\t"
        "mov.b32 {l, h}, %2;\n\t"
        "cvt.f32.f16 %0, l;\n\t"
        "cvt.f32.f16 %1, h;\n\t"
        "}"
        : "=f"(lo), "=f"(hi)
        : "r"(v));
}

__device__ __forceinline__ float ms_f16_to_f32(unsigned short v) {
    float f;
    asm("{ cvt.f32.f16 %0, %1; }" : "=f"(f) : "h"(v));
    return f;
}

// A bf16 is the high half of an f32.
__device__ __forceinline__ float ms_bf16_to_f32(unsigned short v) {
    return __uint_as_float(((unsigned int)v) << 16);
}

// A 16-byte load of data read once: read-only path, no L1 allocation.
__device__ __forceinline__ uint4 ms_ld_stream(const uint4* p) {
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
        : "l"(p));
    return r;
}

// E::VEC consecutive x values from x[0]; `vec`: x is 16-byte aligned.
template <int N>
__device__ __forceinline__ void ms_load_x(const float* __restrict__ x, bool vec, float (&o)[N]) {
    if (vec) {
#pragma unroll
        for (int k = 0; k < N / 4; ++k) {
            const float4 t = __ldg(reinterpret_cast<const float4*>(x) + k);
            o[4 * k] = t.x; o[4 * k + 1] = t.y; o[4 * k + 2] = t.z; o[4 * k + 3] = t.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < N; ++i) o[i] = __ldg(x + i);
    }
}

// Element types: VEC elements per 16-byte load, a scalar load, and the dot
// product of one 16-byte load of W with VEC values of x (two FMA chains).
struct MsF32 {
    typedef float elem;
    enum { VEC = 4 };
    static __device__ __forceinline__ float load1(const float* p) { return __ldg(p); }
    static __device__ __forceinline__ float dot(uint4 r, const float (&xs)[VEC]) {
        const float s0 = fmaf(__uint_as_float(r.z), xs[2], __uint_as_float(r.x) * xs[0]);
        const float s1 = fmaf(__uint_as_float(r.w), xs[3], __uint_as_float(r.y) * xs[1]);
        return s0 + s1;
    }
};

struct MsF16 {
    typedef unsigned short elem;
    enum { VEC = 8 };
    static __device__ __forceinline__ float load1(const unsigned short* p) {
        return ms_f16_to_f32(__ldg(p));
    }
    static __device__ __forceinline__ float dot(uint4 r, const float (&xs)[VEC]) {
        float w[8];
        ms_f16x2_to_f32(r.x, w[0], w[1]);
        ms_f16x2_to_f32(r.y, w[2], w[3]);
        ms_f16x2_to_f32(r.z, w[4], w[5]);
        ms_f16x2_to_f32(r.w, w[6], w[7]);
        float s0 = w[0] * xs[0];
        float s1 = w[1] * xs[1];
        s0 = fmaf(w[2], xs[2], s0);
        s1 = fmaf(w[3], xs[3], s1);
        s0 = fmaf(w[4], xs[4], s0);
        s1 = fmaf(w[5], xs[5], s1);
        s0 = fmaf(w[6], xs[6], s0);
        s1 = fmaf(w[7], xs[7], s1);
        return s0 + s1;
    }
};

struct MsBF16 {
    typedef unsigned short elem;
    enum { VEC = 8 };
    static __device__ __forceinline__ float load1(const unsigned short* p) {
        return ms_bf16_to_f32(__ldg(p));
    }
    static __device__ __forceinline__ float dot(uint4 r, const float (&xs)[VEC]) {
        float s0 = __uint_as_float(r.x << 16) * xs[0];
        float s1 = __uint_as_float(r.x & 0xffff0000u) * xs[1];
        s0 = fmaf(__uint_as_float(r.y << 16), xs[2], s0);
        s1 = fmaf(__uint_as_float(r.y & 0xffff0000u), xs[3], s1);
        s0 = fmaf(__uint_as_float(r.z << 16), xs[4], s0);
        s1 = fmaf(__uint_as_float(r.z & 0xffff0000u), xs[5], s1);
        s0 = fmaf(__uint_as_float(r.w << 16), xs[6], s0);
        s1 = fmaf(__uint_as_float(r.w & 0xffff0000u), xs[7], s1);
        return s0 + s1;
    }
};

// This thread's share (threads tid, tid + nthreads, ...) of dot(W[row], x).
template <class E>
__device__ __forceinline__ float ms_row_dot(const typename E::elem* __restrict__ wrow,
                                            const float* __restrict__ x, int cols, int tid,
                                            int nthreads, bool x_aligned) {
    typedef typename E::elem T;
    float acc_scalar = 0.0f;
    float acc_vec = 0.0f;

    // Scalar head: elements before the first 16-byte boundary of the row.
    int head = (int)(((16u - ((unsigned int)(ms_u64)wrow & 15u)) & 15u) / (unsigned int)sizeof(T));
    if (head > cols) head = cols;
    for (int c = tid; c < head; c += nthreads) acc_scalar = fmaf(E::load1(wrow + c), __ldg(x + c), acc_scalar);

    // Vector body: 16-byte loads of W, MS_UNROLL in flight per thread.
    const int nvec = (cols - head) / E::VEC;
    const uint4* __restrict__ wv = reinterpret_cast<const uint4*>(wrow + head);
    const float* __restrict__ xb = x + head;
    const bool xvec = x_aligned && ((head & 3) == 0);
    for (int v0 = tid; v0 < nvec; v0 += nthreads * MS_UNROLL) {
        uint4 r[MS_UNROLL];
#pragma unroll
        for (int u = 0; u < MS_UNROLL; ++u) {
            const int v = v0 + u * nthreads;
            r[u] = v < nvec ? ms_ld_stream(wv + v) : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < MS_UNROLL; ++u) {
            const int v = v0 + u * nthreads;
            if (v < nvec) {
                float xs[E::VEC];
                ms_load_x(xb + (long long)v * E::VEC, xvec, xs);
                acc_vec += E::dot(r[u], xs);
            }
        }
    }

    // Scalar tail: fewer than VEC elements after the body.
    for (int c = head + nvec * E::VEC + tid; c < cols; c += nthreads)
        acc_scalar = fmaf(E::load1(wrow + c), __ldg(x + c), acc_scalar);
    return acc_scalar + acc_vec;
}

__device__ __forceinline__ float ms_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MS_FULL_MASK, v, o);
    return v;
}

// One warp per row; blockDim.x is a multiple of 32.
template <class E>
__device__ __forceinline__ void ms_gemv_warp(const typename E::elem* __restrict__ w,
                                             const float* __restrict__ x, float* __restrict__ y,
                                             long long rows, int cols) {
    const int lane = threadIdx.x & 31;
    const long long warps_per_block = blockDim.x >> 5;
    const long long stride = (long long)gridDim.x * warps_per_block;
    const bool x_aligned = (((ms_u64)x) & 15u) == 0;
    for (long long row = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); row < rows;
         row += stride) {
        float acc = ms_row_dot<E>(w + row * (long long)cols, x, cols, lane, 32, x_aligned);
        acc = ms_warp_sum(acc);
        if (lane == 0) y[row] = acc;
    }
}

// One block per row; blockDim.x is a multiple of 32, at most 1024.
template <class E>
__device__ __forceinline__ void ms_gemv_block(const typename E::elem* __restrict__ w,
                                              const float* __restrict__ x, float* __restrict__ y,
                                              long long rows, int cols) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int nwarps = blockDim.x >> 5;
    const bool x_aligned = (((ms_u64)x) & 15u) == 0;
    // `row` depends on blockIdx only: the whole block runs the same iterations.
    for (long long row = blockIdx.x; row < rows; row += gridDim.x) {
        float acc = ms_row_dot<E>(w + row * (long long)cols, x, cols, threadIdx.x, blockDim.x, x_aligned);
        acc = ms_warp_sum(acc);
        if (lane == 0) partial[warp] = acc;
        __syncthreads();
        if (warp == 0) {
            float v = lane < nwarps ? partial[lane] : 0.0f;
            v = ms_warp_sum(v);
            if (lane == 0) y[row] = v;
        }
        __syncthreads();
    }
}

// MS_ROWS consecutive rows per warp; needs 16-byte aligned rows and x, and
// cols a multiple of E::VEC.
template <class E, int MS_ROWS, int MS_STEPS>
__device__ __forceinline__ void ms_gemv_aligned(const typename E::elem* __restrict__ w,
                                                const float* __restrict__ x, float* __restrict__ y,
                                                long long rows, int cols) {
    const int lane = threadIdx.x & 31;
    const long long warps_per_block = blockDim.x >> 5;
    const long long groups = (rows + MS_ROWS - 1) / MS_ROWS;
    const int nvec = cols / E::VEC;
    for (long long g = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); g < groups;
         g += (long long)gridDim.x * warps_per_block) {
        const uint4* __restrict__ wr[MS_ROWS];
        float acc[MS_ROWS];
#pragma unroll
        for (int r = 0; r < MS_ROWS; ++r) {
            // Past the last row, re-read it (the result is not stored).
            long long row = g * MS_ROWS + r;
            if (row >= rows) row = rows - 1;
            wr[r] = reinterpret_cast<const uint4*>(w + row * (long long)cols);
            acc[r] = 0.0f;
        }
        for (int v0 = lane; v0 < nvec; v0 += 32 * MS_STEPS) {
            uint4 q[MS_STEPS][MS_ROWS];
#pragma unroll
            for (int u = 0; u < MS_STEPS; ++u) {
                const int v = v0 + u * 32;
#pragma unroll
                for (int r = 0; r < MS_ROWS; ++r)
                    q[u][r] = v < nvec ? ms_ld_stream(wr[r] + v) : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < MS_STEPS; ++u) {
                const int v = v0 + u * 32;
                if (v < nvec) {
                    float xs[E::VEC];
                    ms_load_x(x + (long long)v * E::VEC, true, xs);
#pragma unroll
                    for (int r = 0; r < MS_ROWS; ++r) acc[r] += E::dot(q[u][r], xs);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MS_ROWS; ++r) {
            const float sum = ms_warp_sum(acc[r]);
            if (lane == 0 && g * MS_ROWS + r < rows) y[g * MS_ROWS + r] = sum;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_f32_aligned(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                    long long rows, int cols) {
    ms_gemv_aligned<MsF32, 1, 4>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_f16_aligned(const unsigned short* __restrict__ w, const float* __restrict__ x,
                    float* __restrict__ y, long long rows, int cols) {
    ms_gemv_aligned<MsF16, 2, 2>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_bf16_aligned(const unsigned short* __restrict__ w, const float* __restrict__ x,
                     float* __restrict__ y, long long rows, int cols) {
    ms_gemv_aligned<MsBF16, 2, 2>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_f32_warp(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                 long long rows, int cols) {
    ms_gemv_warp<MsF32>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_f16_warp(const unsigned short* __restrict__ w, const float* __restrict__ x,
                 float* __restrict__ y, long long rows, int cols) {
    ms_gemv_warp<MsF16>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_bf16_warp(const unsigned short* __restrict__ w, const float* __restrict__ x,
                  float* __restrict__ y, long long rows, int cols) {
    ms_gemv_warp<MsBF16>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_f32_block(const float* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                  long long rows, int cols) {
    ms_gemv_block<MsF32>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_f16_block(const unsigned short* __restrict__ w, const float* __restrict__ x,
                  float* __restrict__ y, long long rows, int cols) {
    ms_gemv_block<MsF16>(w, x, y, rows, cols);
}

extern "C" __global__ void __launch_bounds__(256)
ms_gemv_bf16_block(const unsigned short* __restrict__ w, const float* __restrict__ x,
                   float* __restrict__ y, long long rows, int cols) {
    ms_gemv_block<MsBF16>(w, x, y, rows, cols);
}
