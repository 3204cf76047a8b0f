// Kernels of the neural-network ops: softmax and log_softmax and their
// backward over any dim, cross-entropy fused from the logits (no softmax is
// stored), nll_loss, mse_loss, embedding and its backward, dropout.
//
// Inputs are contiguous (the front ends in src/ops/nn.c copy the others)
// and viewed as [outer, D, inner] (softmax) or [N, C, inner] (losses). Math
// runs in f32 for f32/f16/bf16 and in f64 for f64, as on the CPU; sums of
// losses run in f64. Every reduction folds in an order fixed by the shapes
// (warp shuffles down to lane 0, then the warps of a block in order, then the
// blocks in order), so results repeat bit for bit from run to run; nothing
// uses floating-point atomics.
//
// A target class outside [0, C) (and not ignore_index) makes its position's
// loss, its gradient row and any mean or sum that includes it NaN, and is
// recorded in the device's fault record, which the next wait for the device
// returns as the op's error (cuda_impl.h): checking it as the CPU does, in
// the call, would need the host to wait for the device on every loss. Embedding indices are checked exactly as on the CPU: the kernels
// record the first bad position and the C side reads it back before
// returning (src/backends/cuda/nn.c).
#include <cub/device/device_radix_sort.cuh>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "kernels.cuh"
#include "ops_impl.h"

enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

namespace cti {
namespace {

template <int DT> struct Acc { typedef float A; };
template <> struct Acc<CT_F64> { typedef double A; };

__device__ __forceinline__ float ex(float x) { return expf(x); }
__device__ __forceinline__ double ex(double x) { return exp(x); }
__device__ __forceinline__ float ln(float x) { return logf(x); }
__device__ __forceinline__ double ln(double x) { return log(x); }
// Products that must not fuse into an fma (both merge orders round alike).
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }

template <class A> __device__ __forceinline__ A ninf() { return (A)-INFINITY; }
template <class A> __device__ __forceinline__ A qnan() { return (A)NAN; }

// ---- warp and block folds ------------------------------------------------------------
// Warp folds leave the result in lane 0; bcast hands lane 0's value to all.
template <class A> __device__ __forceinline__ A bcast(A v) { return __shfl_sync(0xffffffffu, v, 0); }

template <class A> __device__ __forceinline__ A warp_sum(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

// NaN-ignoring max, as the CPU's (a NaN still poisons the sum that follows).
template <class A> __device__ __forceinline__ A warp_max(A v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A u = __shfl_down_sync(0xffffffffu, v, o);
        v = u > v ? u : v;
    }
    return v;
}

// Online softmax statistics: m the running max, s the sum of exp(x - m).
// -inf elements add nothing (a row of only -inf gives s = 0, hence NaN
// outputs, as the CPU's exp(-inf - -inf)); NaN makes s NaN.
template <class A> __device__ __forceinline__ void ol_add(A &m, A &s, A x) {
    if (x > m) {
        s = mul_rn(s, ex(m - x)) + (A)1;
        m = x;
    } else if (x != ninf<A>()) {
        s += ex(x - m);
    }
}

template <class A> __device__ __forceinline__ void ol_merge(A &m, A &s, A m2, A s2) {
    A mx = m2 > m ? m2 : m;
    if (mx == ninf<A>()) {
        s += s2;
    } else {
        s = mul_rn(s, ex(m - mx)) + mul_rn(s2, ex(m2 - mx));
        m = mx;
    }
}

template <class A> __device__ __forceinline__ void warp_ol(A &m, A &s) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A m2 = __shfl_down_sync(0xffffffffu, m, o), s2 = __shfl_down_sync(0xffffffffu, s, o);
        ol_merge(m, s, m2, s2);
    }
}

// Block folds: every thread of the block calls them (blockDim a multiple of
// 32, at most 1024); all get the result. sh holds 33 values.
template <bool MAX, class A> __device__ A block_fold(A v, A *sh) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0) sh[w] = v;
    __syncthreads();
    if (w == 0) {
        v = lane < nw ? sh[lane] : MAX ? ninf<A>() : (A)0;
        v = MAX ? warp_max(v) : warp_sum(v);
        if (lane == 0) sh[32] = v;
    }
    __syncthreads();
    A r = sh[32];
    __syncthreads(); // sh may be reused as soon as this returns
    return r;
}
template <class A> __device__ A block_sum(A v, A *sh) { return block_fold<false>(v, sh); }
template <class A> __device__ A block_max(A v, A *sh) { return block_fold<true>(v, sh); }

template <class A> __device__ void block_ol(A &m, A &s, A *shm, A *shs) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    warp_ol(m, s);
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
    }
    __syncthreads();
    if (w == 0) {
        m = lane < nw ? shm[lane] : ninf<A>();
        s = lane < nw ? shs[lane] : (A)0;
        warp_ol(m, s);
        if (lane == 0) {
            shm[32] = m;
            shs[32] = s;
        }
    }
    __syncthreads();
    m = shm[32];
    s = shs[32];
    __syncthreads();
}

static inline unsigned blocks_for(int64_t items, int64_t per_block, int64_t cap) {
    int64_t b = (items + per_block - 1) / per_block;
    if (b > cap) b = cap;
    return (unsigned)(b < 1 ? 1 : b);
}

// ---- softmax / log_softmax ----------------------------------------------------------
// Forward: a = x, out = y. Backward: a = grad_y, b = y, out = dx with
// softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g).

constexpr int kWarpRowsThreads = 128; // 4 rows per block
constexpr int kBlockRowThreads = 512;
constexpr int kThreads256 = 256;
constexpr int64_t kGridCap = 65535;

// Rows of d <= 32 * E elements, one warp per row, the row held in registers.
template <int DT, int E, bool LOG, bool BWD>
__global__ void __launch_bounds__(kWarpRowsThreads)
sm_warp(const typename dtype<DT>::T *__restrict__ a, const typename dtype<DT>::T *__restrict__ b,
        typename dtype<DT>::T *__restrict__ out, int64_t rows, int d) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    const int lane = threadIdx.x & 31;
    const int64_t wpb = blockDim.x >> 5, nwarps = (int64_t)gridDim.x * wpb;
    for (int64_t r = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); r < rows; r += nwarps) {
        const T *ar = a + r * d;
        T *orow = out + r * d;
        A va[E];
        if constexpr (!BWD) {
            A m = ninf<A>();
#pragma unroll
            for (int k = 0; k < E; k++) {
                int c = lane + 32 * k;
                va[k] = c < d ? (A)dtype<DT>::dec(ar[c]) : ninf<A>();
                m = va[k] > m ? va[k] : m;
            }
            m = bcast(warp_max(m));
            A s = 0;
#pragma unroll
            for (int k = 0; k < E; k++) {
                if (lane + 32 * k < d) {
                    A e = ex(va[k] - m);
                    s += e;
                    if (!LOG) va[k] = e;
                }
            }
            s = bcast(warp_sum(s));
            if (LOG) {
                A ls = ln(s);
#pragma unroll
                for (int k = 0; k < E; k++)
                    if (lane + 32 * k < d) orow[lane + 32 * k] = dtype<DT>::enc((va[k] - m) - ls);
            } else {
                A inv = (A)1 / s;
#pragma unroll
                for (int k = 0; k < E; k++)
                    if (lane + 32 * k < d) orow[lane + 32 * k] = dtype<DT>::enc(va[k] * inv);
            }
        } else {
            const T *br = b + r * d;
            A vb[E];
            A s = 0;
#pragma unroll
            for (int k = 0; k < E; k++) {
                int c = lane + 32 * k;
                va[k] = c < d ? (A)dtype<DT>::dec(ar[c]) : (A)0;
                vb[k] = c < d ? (A)dtype<DT>::dec(br[c]) : (A)0;
                s += LOG ? va[k] : va[k] * vb[k];
            }
            s = bcast(warp_sum(s));
#pragma unroll
            for (int k = 0; k < E; k++)
                if (lane + 32 * k < d)
                    orow[lane + 32 * k] =
                        dtype<DT>::enc(LOG ? va[k] - ex(vb[k]) * s : vb[k] * (va[k] - s));
        }
    }
}

// Long rows: one block per row, two passes over memory (statistics, then the
// outputs).
template <int DT, bool LOG, bool BWD>
__global__ void __launch_bounds__(kBlockRowThreads)
sm_block(const typename dtype<DT>::T *__restrict__ a, const typename dtype<DT>::T *__restrict__ b,
         typename dtype<DT>::T *__restrict__ out, int64_t rows, int64_t d) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    __shared__ A shm[33], shs[33];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *ar = a + r * d;
        T *orow = out + r * d;
        if constexpr (!BWD) {
            A m = ninf<A>(), s = 0;
            for (int64_t c = threadIdx.x; c < d; c += blockDim.x) ol_add(m, s, (A)dtype<DT>::dec(ar[c]));
            block_ol(m, s, shm, shs);
            if (LOG) {
                A ls = ln(s);
                for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
                    orow[c] = dtype<DT>::enc(((A)dtype<DT>::dec(ar[c]) - m) - ls);
            } else {
                A inv = (A)1 / s;
                for (int64_t c = threadIdx.x; c < d; c += blockDim.x)
                    orow[c] = dtype<DT>::enc(ex((A)dtype<DT>::dec(ar[c]) - m) * inv);
            }
        } else {
            const T *br = b + r * d;
            A s = 0;
            for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
                A g = dtype<DT>::dec(ar[c]);
                s += LOG ? g : g * (A)dtype<DT>::dec(br[c]);
            }
            s = block_sum(s, shs);
            for (int64_t c = threadIdx.x; c < d; c += blockDim.x) {
                A g = dtype<DT>::dec(ar[c]), y = dtype<DT>::dec(br[c]);
                orow[c] = dtype<DT>::enc(LOG ? g - ex(y) * s : y * (g - s));
            }
        }
    }
}

// Rows up to kRowsMaxNV chunks a thread: one block of kBlockRowThreads per
// row, the row held in registers, so x (and for the backward g and y) is
// read from memory once and the output written once, with 16-byte accesses
// when VEC > 1. Every chunk is loaded before any is decoded: a decode
// between two loads would make the second wait for the first. The block's
// max and sums go through block_max / block_sum, so every thread holds the
// same bits.
constexpr int kRowsMaxNV = 8;

template <int DT, int VEC> struct RowChunk {
    typedef typename dtype<DT>::T T;
    typedef typename std::conditional<(VEC > 1), uint4, T>::type R;
    static __device__ __forceinline__ R load(const T *p) {
        if constexpr (VEC > 1) return *reinterpret_cast<const uint4 *>(p);
        else return *p;
    }
    template <class A> static __device__ __forceinline__ void decode(const R &r, A (&v)[VEC]) {
        T t[VEC];
        memcpy(t, &r, sizeof t);
#pragma unroll
        for (int i = 0; i < VEC; i++) v[i] = (A)dtype<DT>::dec(t[i]);
    }
    template <class A> static __device__ __forceinline__ void store(T *p, const A (&v)[VEC]) {
        T t[VEC];
#pragma unroll
        for (int i = 0; i < VEC; i++) t[i] = dtype<DT>::enc(v[i]);
        if constexpr (VEC > 1) {
            uint4 u;
            memcpy(&u, t, sizeof u);
            *reinterpret_cast<uint4 *>(p) = u;
        } else {
            *p = t[0];
        }
    }
};

template <int DT, bool LOG, bool BWD, int VEC, int NV>
__global__ void __launch_bounds__(kBlockRowThreads)
sm_rows(const typename dtype<DT>::T *__restrict__ a, const typename dtype<DT>::T *__restrict__ b,
        typename dtype<DT>::T *__restrict__ out, int64_t rows, int64_t d) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    typedef RowChunk<DT, VEC> C;
    __shared__ A sh[33];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const T *ar = a + r * d;
        const T *br = BWD ? b + r * d : nullptr;
        T *orow = out + r * d;
        typename C::R ra[NV], rb[BWD ? NV : 1];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
            if (e < d) {
                ra[j] = C::load(ar + e);
                if constexpr (BWD) rb[j] = C::load(br + e);
            }
        }
        A va[NV][VEC];
        A vb[BWD ? NV : 1][VEC];
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const bool ok = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC < d;
            if (ok) {
                C::decode(ra[j], va[j]);
                if constexpr (BWD) C::decode(rb[j], vb[j]);
            }
        }
        if constexpr (!BWD) {
            A m = ninf<A>();
#pragma unroll
            for (int j = 0; j < NV; j++)
                if (((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC < d)
#pragma unroll
                    for (int i = 0; i < VEC; i++) m = va[j][i] > m ? va[j][i] : m;
            m = block_max(m, sh);
            A s = 0;
#pragma unroll
            for (int j = 0; j < NV; j++)
                if (((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC < d)
#pragma unroll
                    for (int i = 0; i < VEC; i++) {
                        A e = ex(va[j][i] - m);
                        s += e;
                        if (!LOG) va[j][i] = e;
                    }
            s = block_sum(s, sh);
            const A k = LOG ? ln(s) : (A)1 / s;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
                if (e >= d) continue;
                A o[VEC];
#pragma unroll
                for (int i = 0; i < VEC; i++) o[i] = LOG ? (va[j][i] - m) - k : va[j][i] * k;
                C::store(orow + e, o);
            }
        } else {
            // a = grad_y, b = y
            A s = 0;
#pragma unroll
            for (int j = 0; j < NV; j++)
                if (((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC < d)
#pragma unroll
                    for (int i = 0; i < VEC; i++) s += LOG ? va[j][i] : va[j][i] * vb[j][i];
            s = block_sum(s, sh);
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
                if (e >= d) continue;
                A o[VEC];
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    o[i] = LOG ? va[j][i] - ex(vb[j][i]) * s : vb[j][i] * (va[j][i] - s);
                C::store(orow + e, o);
            }
        }
    }
}

// Softmax over a dim that is not the last: one thread per (outer, inner)
// column; neighbouring threads read neighbouring addresses.
template <int DT, bool LOG, bool BWD>
__global__ void __launch_bounds__(kThreads256)
sm_strided(const typename dtype<DT>::T *__restrict__ a, const typename dtype<DT>::T *__restrict__ b,
           typename dtype<DT>::T *__restrict__ out, int64_t outer, int64_t d, int64_t inner) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    const int64_t cols = outer * inner, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; col < cols; col += step) {
        int64_t o = col / inner, j = col - o * inner;
        int64_t base = o * d * inner + j;
        if constexpr (!BWD) {
            A m = ninf<A>(), s = 0;
            for (int64_t k = 0; k < d; k++) ol_add(m, s, (A)dtype<DT>::dec(a[base + k * inner]));
            A ls = LOG ? ln(s) : (A)1 / s;
            for (int64_t k = 0; k < d; k++) {
                A x = dtype<DT>::dec(a[base + k * inner]);
                out[base + k * inner] = dtype<DT>::enc(LOG ? (x - m) - ls : ex(x - m) * ls);
            }
        } else {
            A s = 0;
            for (int64_t k = 0; k < d; k++) {
                A g = dtype<DT>::dec(a[base + k * inner]);
                s += LOG ? g : g * (A)dtype<DT>::dec(b[base + k * inner]);
            }
            for (int64_t k = 0; k < d; k++) {
                A g = dtype<DT>::dec(a[base + k * inner]), y = dtype<DT>::dec(b[base + k * inner]);
                out[base + k * inner] = dtype<DT>::enc(LOG ? g - ex(y) * s : y * (g - s));
            }
        }
    }
}

template <int DT, int E, bool LOG, bool BWD>
void launch_sm_warp(const void *a, const void *b, void *out, int64_t rows, int d, cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    unsigned g = blocks_for(rows, kWarpRowsThreads / 32, kGridCap);
    sm_warp<DT, E, LOG, BWD><<<g, kWarpRowsThreads, 0, st>>>((const T *)a, (const T *)b, (T *)out,
                                                              rows, d);
}

template <int DT, bool LOG, bool BWD, int VEC>
bool launch_sm_rows_vec(const void *a, const void *b, void *out, int64_t rows, int64_t d,
                        cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    const int64_t nvec = (d + VEC - 1) / VEC;
    const unsigned g = blocks_for(rows, 1, kGridCap);
    const T *ta = (const T *)a, *tb = (const T *)b;
    T *to = (T *)out;
    if (nvec <= kBlockRowThreads) sm_rows<DT, LOG, BWD, VEC, 1><<<g, kBlockRowThreads, 0, st>>>(ta, tb, to, rows, d);
    else if (nvec <= 2 * kBlockRowThreads) sm_rows<DT, LOG, BWD, VEC, 2><<<g, kBlockRowThreads, 0, st>>>(ta, tb, to, rows, d);
    else if (nvec <= 4 * kBlockRowThreads) sm_rows<DT, LOG, BWD, VEC, 4><<<g, kBlockRowThreads, 0, st>>>(ta, tb, to, rows, d);
    else if (nvec <= kRowsMaxNV * kBlockRowThreads) sm_rows<DT, LOG, BWD, VEC, kRowsMaxNV><<<g, kBlockRowThreads, 0, st>>>(ta, tb, to, rows, d);
    else return false;
    return true;
}

inline bool aligned16_ptr(const void *p) { return p == nullptr || ((uintptr_t)p & 15) == 0; }

// Rows that fit the registers of one block (kRowsMaxNV chunks a thread):
// 16-byte chunks when every pointer is aligned and d a multiple of the
// chunk, else one element a chunk. false: the row is too long.
template <int DT, bool LOG, bool BWD>
bool launch_sm_rows(const void *a, const void *b, void *out, int64_t rows, int64_t d,
                    cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    constexpr int FV = 16 / sizeof(T);
    if (d % FV == 0 && aligned16_ptr(a) && aligned16_ptr(b) && aligned16_ptr(out))
        return launch_sm_rows_vec<DT, LOG, BWD, FV>(a, b, out, rows, d, st);
    return launch_sm_rows_vec<DT, LOG, BWD, 1>(a, b, out, rows, d, st);
}

template <int DT, bool LOG, bool BWD>
cudaError_t softmax_launch(const void *a, const void *b, void *out, int64_t outer, int64_t d,
                           int64_t inner, cudaStream_t st, const char **routine) {
    typedef typename dtype<DT>::T T;
    if (inner == 1 && d <= 1024) {
        int di = (int)d;
        if (d <= 32) launch_sm_warp<DT, 1, LOG, BWD>(a, b, out, outer, di, st);
        else if (d <= 64) launch_sm_warp<DT, 2, LOG, BWD>(a, b, out, outer, di, st);
        else if (d <= 128) launch_sm_warp<DT, 4, LOG, BWD>(a, b, out, outer, di, st);
        else if (d <= 256) launch_sm_warp<DT, 8, LOG, BWD>(a, b, out, outer, di, st);
        else if (d <= 512) launch_sm_warp<DT, 16, LOG, BWD>(a, b, out, outer, di, st);
        else launch_sm_warp<DT, 32, LOG, BWD>(a, b, out, outer, di, st);
        *routine = BWD ? "cten_softmax_bwd_warp_per_row" : "cten_softmax_warp_per_row";
    } else if (inner == 1 && launch_sm_rows<DT, LOG, BWD>(a, b, out, outer, d, st)) {
        *routine = BWD ? "cten_softmax_bwd_row_in_registers" : "cten_softmax_row_in_registers";
    } else if (inner == 1) {
        unsigned g = blocks_for(outer, 1, kGridCap);
        sm_block<DT, LOG, BWD><<<g, kBlockRowThreads, 0, st>>>((const T *)a, (const T *)b, (T *)out,
                                                               outer, d);
        *routine = BWD ? "cten_softmax_bwd_block_per_row" : "cten_softmax_block_per_row";
    } else {
        unsigned g = blocks_for(outer * inner, kThreads256, kGridCap);
        sm_strided<DT, LOG, BWD><<<g, kThreads256, 0, st>>>((const T *)a, (const T *)b, (T *)out,
                                                             outer, d, inner);
        *routine = BWD ? "cten_softmax_bwd_strided" : "cten_softmax_strided";
    }
    return cudaGetLastError();
}

template <int DT>
cudaError_t softmax_dt(int bwd, int lg, const void *a, const void *b, void *out, int64_t outer,
                       int64_t d, int64_t inner, cudaStream_t st, const char **routine) {
    if (bwd) {
        if (lg) return softmax_launch<DT, true, true>(a, b, out, outer, d, inner, st, routine);
        return softmax_launch<DT, false, true>(a, b, out, outer, d, inner, st, routine);
    }
    if (lg) return softmax_launch<DT, true, false>(a, b, out, outer, d, inner, st, routine);
    return softmax_launch<DT, false, false>(a, b, out, outer, d, inner, st, routine);
}

// ---- classification losses -------------------------------------------------------------
struct Cls {
    const void *input;
    const int64_t *target;
    const void *weight;
    const void *grad;
    void *out;
    int64_t c, inner, npos, reduction, ignore;
    double ls;
    int op;
    cti_cuda_fault *fault;
    volatile unsigned int *flag;
    // The row statistics (schema.h's CROSS_ENTROPY), Acc<DT>::A, or null: the
    // forward writes them, the backward's ce_bwd_saved reads them.
    void *stats;
    // The loss (the forward's out) and grad_loss are float32, not DT: autocast's
    // cross-entropy of float16/bfloat16 logits, computed in float32 as ever.
    bool lossf;
};

// grad_loss at i, in the loss's dtype.
template <int DT> __device__ __forceinline__ double loss_grad(const Cls &a, int64_t i) {
    if (a.lossf) return (double)((const float *)a.grad)[i];
    return (double)dtype<DT>::dec(((const typename dtype<DT>::T *)a.grad)[i]);
}

// Stores a loss value at i of out, float32 when lossf, else DT.
template <int DT, class V> __device__ __forceinline__ void put_loss(void *out, bool lossf, int64_t i, V v) {
    if (lossf) ((float *)out)[i] = (float)v;
    else ((typename dtype<DT>::T *)out)[i] = dtype<DT>::enc(v);
}

// Positions below this count let every block of a backward kernel fold the
// weight sum of the mean itself (one launch); above it a separate pass does.
constexpr int64_t kScanMax = 8192;
constexpr int64_t kRedBlocksCap = 1024;

__device__ __forceinline__ bool bad_target(int64_t t, int64_t c) { return t < 0 || t >= c; }

// The first bad target of any kernel claims the record; the flag tells the
// host to read it after its next wait. It takes the record's fields by value:
// a reference to the kernel's Cls would make every thread copy the whole
// parameter block to local memory at the kernel's start, to take its address
// (112 bytes a thread, more than a row's worth of traffic for a block per row).
__device__ __noinline__ void report_bad_target_(cti_cuda_fault *f, volatile unsigned int *flag,
                                                int op, int64_t c, int64_t ignore, int64_t p,
                                                int64_t t) {
    if (!f || atomicCAS(&f->claimed, 0u, 1u) != 0u) return;
    f->op = op;
    f->value = (long long)t;
    f->limit = (long long)c;
    f->ignore = (long long)ignore;
    f->position = (long long)p;
    __threadfence_system();
    *flag = 1u;
}
__device__ __forceinline__ void report_bad_target(const Cls &a, int64_t p, int64_t t) {
    report_bad_target_(a.fault, a.flag, a.op, a.c, a.ignore, p, t);
}

// Sum over counted positions of their class weights (1 without weights); an
// out-of-range target makes it NaN. Every thread of the block calls it.
template <int DT> __device__ __forceinline__ double block_wsum(const Cls &a, double *sh) {
    typedef typename dtype<DT>::T T;
    const T *w = (const T *)a.weight;
    double s = 0;
    for (int64_t p = threadIdx.x; p < a.npos; p += blockDim.x) {
        int64_t t = a.target[p];
        if (t == a.ignore) continue;
        s += bad_target(t, a.c) ? (double)NAN : w ? (double)dtype<DT>::dec(w[t]) : 1.0;
    }
    return block_sum(s, sh);
}

// The weight sum over several blocks: block partials (or the result when the
// grid has one block), then wsum_final.
template <int DT> __global__ void __launch_bounds__(kThreads256) wsum_part(const Cls a, double *part, double *result) {
    typedef typename dtype<DT>::T T;
    __shared__ double sh[33];
    const T *w = (const T *)a.weight;
    double s = 0;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < a.npos; p += step) {
        int64_t t = a.target[p];
        if (t == a.ignore) continue;
        s += bad_target(t, a.c) ? (double)NAN : w ? (double)dtype<DT>::dec(w[t]) : 1.0;
    }
    s = block_sum(s, sh);
    if (threadIdx.x == 0) {
        if (gridDim.x == 1) *result = s;
        else part[blockIdx.x] = s;
    }
}

__global__ void __launch_bounds__(kThreads256) wsum_final(const double *part, int nb, double *result) {
    __shared__ double sh[33];
    double s = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    s = block_sum(s, sh);
    if (threadIdx.x == 0) *result = s;
}

// The end of a reducing forward: every thread holds (loss sum, weight sum) of
// its positions; the block folds them and writes the result (one block) or
// its partials. wout (Acc<DT>::A, or null) receives the weight sum with the
// result.
template <int DT>
__device__ void reduce_epilogue(double l, double w, int reduction, double *part, void *out,
                                void *wout = nullptr, bool lossf = false) {
    __shared__ double sh[2][33];
    l = block_sum(l, sh[0]);
    w = block_sum(w, sh[1]);
    if (threadIdx.x != 0) return;
    if (part) {
        part[2 * blockIdx.x] = l;
        part[2 * blockIdx.x + 1] = w;
    } else {
        /* a mean over nothing counted is 0/0 = NaN, as on the CPU */
        put_loss<DT>(out, lossf, 0, reduction == RED_MEAN ? l / w : l);
        if (wout) *(typename Acc<DT>::A *)wout = (typename Acc<DT>::A)w;
    }
}

template <int DT>
__global__ void __launch_bounds__(kThreads256) reduce_final(const double *part, int nb, int reduction, void *out,
                                                            void *wout = nullptr, bool lossf = false) {
    double l = 0, w = 0;
    for (int i = threadIdx.x; i < nb; i += blockDim.x) {
        l += part[2 * i];
        w += part[2 * i + 1];
    }
    reduce_epilogue<DT>(l, w, reduction, nullptr, out, wout, lossf);
}

// The row statistics: position p's log-sum-exp, and where a mean's forward
// puts its weight sum (null: none kept; the backward of a sum or none does
// not read it).
template <int DT> __device__ __forceinline__ void stats_lse(const Cls &a, int64_t p, typename Acc<DT>::A lse) {
    if (a.stats) ((typename Acc<DT>::A *)a.stats)[p] = lse;
}
template <int DT> __device__ __forceinline__ void *stats_wsum(const Cls &a) {
    if (!a.stats || a.reduction != RED_MEAN) return nullptr;
    return (typename Acc<DT>::A *)a.stats + a.npos;
}

// Cross-entropy forward. ROWS (inner == 1): one warp per position, its lanes
// striding over the classes; otherwise one thread per position. One pass
// gives the max and the sum of exponentials (online), the smoothing sums and
// the target logit:
// loss = (1-ls) * w_t * (lse - z_t) + ls/C * sum_c w_c * (lse - z_c).
template <int DT, bool ROWS>
__global__ void __launch_bounds__(kThreads256) ce_fwd(const Cls a, double *part) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    const T *x = (const T *)a.input, *w = (const T *)a.weight;
    const int lane = threadIdx.x & 31;
    const bool leader = !ROWS || lane == 0;
    const A ls = (A)a.ls;
    const int64_t C = a.c;
    const int64_t per = ROWS ? (kThreads256 / 32) : kThreads256;
    const int64_t first = (int64_t)blockIdx.x * per + (ROWS ? (threadIdx.x >> 5) : threadIdx.x);
    const int64_t step = (int64_t)gridDim.x * per;
    double lsum = 0, wsum = 0;
    for (int64_t p = first; p < a.npos; p += step) {
        const int64_t t = a.target[p];
        const bool ign = t == a.ignore, bad = !ign && bad_target(t, C);
        A loss = 0, wt = 0;
        if (bad) {
            loss = wt = qnan<A>();
            if (leader) report_bad_target(a, p, t);
        } else if (!ign) {
            int64_t nn = p / a.inner, j = p - nn * a.inner;
            const T *row = x + nn * C * a.inner + j;
            A m = ninf<A>(), s = 0, sz = 0, sw = 0;
            for (int64_t c = ROWS ? lane : 0; c < C; c += ROWS ? 32 : 1) {
                A z = dtype<DT>::dec(row[c * a.inner]);
                ol_add(m, s, z);
                if (ls > (A)0) {
                    A wc = w ? (A)dtype<DT>::dec(w[c]) : (A)1;
                    sz += w ? wc * z : z;
                    sw += wc;
                }
            }
            if (ROWS) {
                warp_ol(m, s);
                sz = warp_sum(sz);
                sw = warp_sum(sw);
            }
            if (leader) {
                A lse = m + ln(s);
                stats_lse<DT>(a, p, lse);
                wt = w ? (A)dtype<DT>::dec(w[t]) : (A)1;
                loss = ((A)1 - ls) * wt * (lse - (A)dtype<DT>::dec(row[t * a.inner]));
                if (ls > (A)0) loss += ls / (A)C * (w ? lse * sw - sz : lse * (A)C - sz);
            }
        }
        if (leader) {
            if (a.reduction == RED_NONE) {
                put_loss<DT>(a.out, a.lossf, p, loss);
            } else {
                lsum += (double)loss;
                wsum += (double)wt;
            }
        }
    }
    if (a.reduction != RED_NONE)
        reduce_epilogue<DT>(lsum, wsum, (int)a.reduction, part, a.out, stats_wsum<DT>(a), a.lossf);
}

// Cross-entropy backward, the same layouts:
// dz_c = g * ((1-ls) * w_t * (p_c - [c == t]) + ls/C * (sum(w) * p_c - w_c)).
// Ignored positions get zeros, out-of-range targets NaN rows.
template <int DT, bool ROWS>
__global__ void __launch_bounds__(kThreads256) ce_bwd(const Cls a, const double *wsum_dev) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    __shared__ double sh[33];
    const T *x = (const T *)a.input, *w = (const T *)a.weight;
    T *out = (T *)a.out;
    const int lane = threadIdx.x & 31;
    const A ls = (A)a.ls;
    const int64_t C = a.c;
    double gs = 0;
    if (a.reduction != RED_NONE) {
        gs = loss_grad<DT>(a, 0);
        if (a.reduction == RED_MEAN) gs /= wsum_dev ? *wsum_dev : block_wsum<DT>(a, sh);
    }
    const int64_t per = ROWS ? (kThreads256 / 32) : kThreads256;
    const int64_t first = (int64_t)blockIdx.x * per + (ROWS ? (threadIdx.x >> 5) : threadIdx.x);
    const int64_t step = (int64_t)gridDim.x * per;
    const int64_t c0 = ROWS ? lane : 0, cs = ROWS ? 32 : 1;
    for (int64_t p = first; p < a.npos; p += step) {
        const int64_t t = a.target[p];
        const bool ign = t == a.ignore, bad = !ign && bad_target(t, C);
        int64_t nn = p / a.inner, j = p - nn * a.inner;
        const T *row = x + nn * C * a.inner + j;
        T *orow = out + nn * C * a.inner + j;
        if (ign || bad) {
            if (bad && c0 == 0) report_bad_target(a, p, t);
            T v = dtype<DT>::enc(bad ? qnan<A>() : (A)0);
            for (int64_t c = c0; c < C; c += cs) orow[c * a.inner] = v;
            continue;
        }
        A gp = (A)(a.reduction == RED_NONE ? loss_grad<DT>(a, p) : gs);
        A m = ninf<A>(), s = 0, sw = 0;
        for (int64_t c = c0; c < C; c += cs) {
            ol_add(m, s, (A)dtype<DT>::dec(row[c * a.inner]));
            if (w && ls > (A)0) sw += (A)dtype<DT>::dec(w[c]);
        }
        if (ROWS) {
            warp_ol(m, s);
            m = bcast(m);
            s = bcast(s);
            sw = bcast(warp_sum(sw));
        }
        A lse = m + ln(s);
        A wt = w ? (A)dtype<DT>::dec(w[t]) : (A)1;
        A ca = gp * ((A)1 - ls) * wt, cb = gp * ls / (A)C;
        A sumw = w ? sw : (A)C;
        for (int64_t c = c0; c < C; c += cs) {
            A pr = ex((A)dtype<DT>::dec(row[c * a.inner]) - lse);
            A dz = ca * pr + cb * (sumw * pr - (w ? (A)dtype<DT>::dec(w[c]) : (A)1));
            if (c == t) dz -= ca;
            orow[c * a.inner] = dtype<DT>::enc(dz);
        }
    }
}

// Cross-entropy over long rows (inner == 1): one block of kBlockRowThreads
// per row, the row held in registers in 16-byte chunks (as sm_rows), so the
// forward reads x once and the backward reads it once and writes dz once;
// the backward takes its probabilities from the exponentials it formed for
// the sum. The target's logit is read from memory by one thread (the row
// was just loaded, so it comes from cache). Rows are block-uniform, so the
// branches on the target keep every thread at the block folds.
// The row's chunks are loaded before the target is looked at: a load that
// waited for the target would add a round trip to memory to every row.
template <int DT, int VEC, int NV>
__device__ __forceinline__ void ce_row_issue(const typename dtype<DT>::T *row, int64_t C,
                                             typename RowChunk<DT, VEC>::R (&r)[NV]) {
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
        if (e < C) r[j] = RowChunk<DT, VEC>::load(row + e);
    }
}

template <int DT, int VEC, int NV>
__device__ __forceinline__ void ce_row_decode(const typename RowChunk<DT, VEC>::R (&r)[NV],
                                              int64_t C, typename Acc<DT>::A (&v)[NV][VEC]) {
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
        if (e < C) RowChunk<DT, VEC>::decode(r[j], v[j]);
    }
}

// max over the row, then v = exp(v - max) and their sum; returns the sum,
// *m the max. Elements past C are left alone.
template <int VEC, int NV, class A>
__device__ __forceinline__ A ce_row_exp(A (&v)[NV][VEC], int64_t C, A *sh, A *m_out) {
    A m = ninf<A>();
#pragma unroll
    for (int j = 0; j < NV; j++)
        if (((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC < C)
#pragma unroll
            for (int i = 0; i < VEC; i++) m = v[j][i] > m ? v[j][i] : m;
    m = block_max(m, sh);
    A s = 0;
#pragma unroll
    for (int j = 0; j < NV; j++)
        if (((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC < C)
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                v[j][i] = ex(v[j][i] - m);
                s += v[j][i];
            }
    *m_out = m;
    return block_sum(s, sh);
}

// Label smoothing's sums over the row: sum_c w_c z_c (or sum_c z_c) into
// *sz, sum_c w_c (or C) into *sw. Reads v before ce_row_exp changes it.
template <int DT, int VEC, int NV, class A>
__device__ __forceinline__ void ce_row_smooth(const A (&v)[NV][VEC], const typename dtype<DT>::T *w,
                                              int64_t C, A *sh, A *sz, A *sw) {
    A a = 0, b = 0;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
        if (e < C)
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                A wc = w ? (A)dtype<DT>::dec(w[e + i]) : (A)1;
                a += wc * v[j][i];
                b += wc;
            }
    }
    *sz = block_sum(a, sh);
    *sw = w ? block_sum(b, sh) : (A)C;
}

// One row of the forward: r holds its chunks (loaded), t its target.
// Thread 0 adds the row's loss and weight to *lsum, *wsum (or writes the
// loss for reduction none).
template <int DT, int VEC, int NV>
__device__ __forceinline__ void ce_fwd_row(const Cls &a, int64_t p, int64_t t,
                                           const typename RowChunk<DT, VEC>::R (&r)[NV],
                                           typename Acc<DT>::A *sh, double *lsum, double *wsum) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    const T *w = (const T *)a.weight;
    const T *row = (const T *)a.input + p * a.c;
    const A ls = (A)a.ls;
    const int64_t C = a.c;
    const bool ign = t == a.ignore, bad = !ign && bad_target(t, C);
    A loss = 0, wt = 0;
    if (bad) {
        loss = wt = qnan<A>();
        if (threadIdx.x == 0) report_bad_target(a, p, t);
    } else if (!ign) {
        // The target's logit and weight, asked for before the folds.
        T zt = T(), wtr = T();
        if (threadIdx.x == 0) {
            zt = row[t];
            if (w) wtr = w[t];
        }
        A v[NV][VEC];
        ce_row_decode<DT, VEC, NV>(r, C, v);
        A sz = 0, sw = 0, m;
        if (ls > (A)0) ce_row_smooth<DT, VEC, NV>(v, w, C, sh, &sz, &sw);
        A s = ce_row_exp<VEC, NV>(v, C, sh, &m);
        if (threadIdx.x == 0) {
            A lse = m + ln(s);
            stats_lse<DT>(a, p, lse);
            wt = w ? (A)dtype<DT>::dec(wtr) : (A)1;
            loss = ((A)1 - ls) * wt * (lse - (A)dtype<DT>::dec(zt));
            if (ls > (A)0) loss += ls / (A)C * (lse * sw - sz);
        }
    }
    if (threadIdx.x == 0) {
        if (a.reduction == RED_NONE) {
            put_loss<DT>(a.out, a.lossf, p, loss);
        } else {
            *lsum += (double)loss;
            *wsum += (double)wt;
        }
    }
}

// One row of the backward, as ce_fwd_row; gs is the reduced loss's gradient.
template <int DT, int VEC, int NV>
__device__ __forceinline__ void ce_bwd_row(const Cls &a, int64_t p, int64_t t,
                                           const typename RowChunk<DT, VEC>::R (&r)[NV],
                                           typename Acc<DT>::A *sh, double gs) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    typedef RowChunk<DT, VEC> K;
    const T *w = (const T *)a.weight;
    T *orow = (T *)a.out + p * a.c;
    const A ls = (A)a.ls;
    const int64_t C = a.c;
    const bool ign = t == a.ignore, bad = !ign && bad_target(t, C);
    if (ign || bad) {
        if (bad && threadIdx.x == 0) report_bad_target(a, p, t);
        A z[VEC];
#pragma unroll
        for (int i = 0; i < VEC; i++) z[i] = bad ? qnan<A>() : (A)0;
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
            if (e < C) K::store(orow + e, z);
        }
        return;
    }
    A v[NV][VEC];
    ce_row_decode<DT, VEC, NV>(r, C, v);
    A sw = (A)C;
    if (w && ls > (A)0) {
        A b = 0;
        for (int64_t c = threadIdx.x; c < C; c += kBlockRowThreads) b += (A)dtype<DT>::dec(w[c]);
        sw = block_sum(b, sh);
    }
    A m;
    const A inv = (A)1 / ce_row_exp<VEC, NV>(v, C, sh, &m);
    const A gp = (A)(a.reduction == RED_NONE ? loss_grad<DT>(a, p) : gs);
    const A wt = w ? (A)dtype<DT>::dec(w[t]) : (A)1;
    const A ca = gp * ((A)1 - ls) * wt, cb = gp * ls / (A)C;
#pragma unroll
    for (int j = 0; j < NV; j++) {
        const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
        if (e >= C) continue;
        A o[VEC];
#pragma unroll
        for (int i = 0; i < VEC; i++) {
            A pr = v[j][i] * inv;
            A dz = ca * pr;
            if (ls > (A)0) dz += cb * (sw * pr - (w ? (A)dtype<DT>::dec(w[e + i]) : (A)1));
            o[i] = e + i == t ? dz - ca : dz;
        }
        K::store(orow + e, o);
    }
}

// The rows of a block, two at a time: while one row is folded the next
// one's chunks and target are in flight (the loop is unrolled by hand so
// each buffer keeps its registers; copying a buffer that is still loading
// would wait for it). ROW(p, t, r) handles row p.
#define CE_ROWS_LOOP(ROW)                                                                        \
    do {                                                                                          \
        const T *x_ = (const T *)a.input;                                                         \
        const int64_t G = gridDim.x, C_ = a.c;                                                    \
        typename RowChunk<DT, VEC>::R r0[NV], r1[NV];                                             \
        int64_t p = blockIdx.x, t0 = 0, t1 = 0;                                                   \
        if (p < a.npos) {                                                                         \
            ce_row_issue<DT, VEC, NV>(x_ + p * C_, C_, r0);                                       \
            t0 = a.target[p];                                                                     \
        }                                                                                         \
        for (; p < a.npos; p += 2 * G) {                                                          \
            if (p + G < a.npos) {                                                                 \
                ce_row_issue<DT, VEC, NV>(x_ + (p + G) * C_, C_, r1);                             \
                t1 = a.target[p + G];                                                             \
            }                                                                                     \
            ROW(p, t0, r0);                                                                       \
            if (p + G >= a.npos) break;                                                           \
            if (p + 2 * G < a.npos) {                                                             \
                ce_row_issue<DT, VEC, NV>(x_ + (p + 2 * G) * C_, C_, r0);                         \
                t0 = a.target[p + 2 * G];                                                         \
            }                                                                                     \
            ROW(p + G, t1, r1);                                                                   \
        }                                                                                         \
    } while (0)

template <int DT, int VEC, int NV>
__global__ void __launch_bounds__(kBlockRowThreads) ce_fwd_rows(const Cls a, double *part) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    __shared__ A sh[33];
    double lsum = 0, wsum = 0;
#define FWD_ROW_(P, TT, R) ce_fwd_row<DT, VEC, NV>(a, P, TT, R, sh, &lsum, &wsum)
    CE_ROWS_LOOP(FWD_ROW_);
#undef FWD_ROW_
    if (a.reduction != RED_NONE)
        reduce_epilogue<DT>(lsum, wsum, (int)a.reduction, part, a.out, stats_wsum<DT>(a), a.lossf);
}

template <int DT, int VEC, int NV>
__global__ void __launch_bounds__(kBlockRowThreads) ce_bwd_rows(const Cls a, const double *wsum_dev) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    __shared__ A sh[33];
    __shared__ double shd[33];
    double gs = 0;
    if (a.reduction != RED_NONE) {
        gs = loss_grad<DT>(a, 0);
        if (a.reduction == RED_MEAN) gs /= wsum_dev ? *wsum_dev : block_wsum<DT>(a, shd);
    }
#define BWD_ROW_(P, TT, R) ce_bwd_row<DT, VEC, NV>(a, P, TT, R, sh, gs)
    CE_ROWS_LOOP(BWD_ROW_);
#undef BWD_ROW_
}

// The backward over long rows without class weights or label smoothing
// when the forward's row statistics are not at hand (the backward op called
// by itself), shaped as sm_rows (which moves a softmax at the copy rate): a
// block per row held in registers, the row's chunks and its target issued
// together, within 32 registers a thread for rows of up to 2 chunks a
// thread, so four blocks of 512 fit a multiprocessor (the double-buffered
// kernels above need 64 and fit two).
//
// Measured on the H200 (16384 x 4096 f32, 2026-12-02): 170 us, against
// 135 us for ce_bwd_saved, which has the log-sum-exp of each row at hand.
template <int NV> constexpr int ce_plain_min_blocks() { return NV <= 2 ? 4 : NV == 4 ? 2 : 1; }

template <int DT, int VEC, int NV>
__global__ void __launch_bounds__(kBlockRowThreads, ce_plain_min_blocks<NV>())
ce_bwd_plain(const Cls a, const double *wsum_dev) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    typedef RowChunk<DT, VEC> K;
    __shared__ A sh[33];
    __shared__ double shd[33];
    const T *x = (const T *)a.input;
    const int64_t C = a.c;
    // The reduced loss's gradient, once a block, after the first row's loads
    // are on their way.
    typename RowChunk<DT, VEC>::R r[NV];
    if (blockIdx.x < a.npos) ce_row_issue<DT, VEC, NV>(x + blockIdx.x * C, C, r);
    A gs = 0;
    if (a.reduction != RED_NONE) {
        double d = loss_grad<DT>(a, 0);
        if (a.reduction == RED_MEAN) d /= wsum_dev ? *wsum_dev : block_wsum<DT>(a, shd);
        gs = (A)d;
    }
    for (int64_t p = blockIdx.x; p < a.npos; p += gridDim.x) {
        if (p != blockIdx.x) ce_row_issue<DT, VEC, NV>(x + p * C, C, r);
        const int64_t t = a.target[p];
        T *orow = (T *)a.out + p * C;
        const bool ign = t == a.ignore, bad = !ign && bad_target(t, C);
        if (ign || bad) {
            if (bad && threadIdx.x == 0) report_bad_target(a, p, t);
            A z[VEC];
#pragma unroll
            for (int i = 0; i < VEC; i++) z[i] = bad ? qnan<A>() : (A)0;
#pragma unroll
            for (int j = 0; j < NV; j++) {
                const int64_t e = ((int64_t)j * kBlockRowThreads + threadIdx.x) * VEC;
                if (e < C) K::store(orow + e, z);
            }
            continue;
        }
        const A gp = a.reduction == RED_NONE ? (A)loss_grad<DT>(a, p) : gs;
        const int tc = (int)t; // in range: C fits an int here
        A v[NV][VEC];
        ce_row_decode<DT, VEC, NV>(r, C, v);
        A m;
        const A k = gp / ce_row_exp<VEC, NV>(v, C, sh, &m);
#pragma unroll
        for (int j = 0; j < NV; j++) {
            const int e = (j * kBlockRowThreads + (int)threadIdx.x) * VEC;
            if (e >= C) continue;
            A o[VEC];
#pragma unroll
            for (int i = 0; i < VEC; i++) o[i] = e + i == tc ? v[j][i] * k - gp : v[j][i] * k;
            K::store(orow + e, o);
        }
    }
}

// The forward over long rows without class weights or smoothing: a warp
// per row and no barrier; each lane streams its 16-byte chunks kWarpFwdU at
// a time through an online (max, sum), the warp folds them with shuffles,
// and the lane that met the target's logit hands it over in a warp sum.
// Measured on the H200 (16384 x 4096 f32, 2026-12-02): 99.5 us at 56 % of
// DRAM peak, where a block per row held in registers (two block folds a
// row) took 196 us and a block per row with one online fold 130 us.
constexpr int kWarpFwdU = 2;

template <int DT, int VEC>
__global__ void __launch_bounds__(kThreads256, 8) ce_fwd_warp(const Cls a, double *part) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    typedef RowChunk<DT, VEC> K;
    const int lane = threadIdx.x & 31;
    const int64_t C = a.c, nch = C / VEC, wpb = kThreads256 / 32;
    double lsum = 0, wsum = 0;
    for (int64_t p = (int64_t)blockIdx.x * wpb + (threadIdx.x >> 5); p < a.npos;
         p += (int64_t)gridDim.x * wpb) {
        const T *row = (const T *)a.input + p * C;
        const int64_t t = a.target[p];
        A m = ninf<A>(), s = 0, zt = 0;
        for (int64_t j0 = lane; j0 < nch; j0 += 32 * kWarpFwdU) {
            typename K::R r[kWarpFwdU];
#pragma unroll
            for (int u = 0; u < kWarpFwdU; u++)
                if (j0 + 32 * u < nch) r[u] = K::load(row + (j0 + 32 * u) * VEC);
#pragma unroll
            for (int u = 0; u < kWarpFwdU; u++) {
                const int64_t j = j0 + 32 * u;
                if (j >= nch) continue;
                A v[VEC];
                K::decode(r[u], v);
                A mc = v[0];
#pragma unroll
                for (int i = 1; i < VEC; i++) mc = v[i] > mc ? v[i] : mc;
                if (mc > m) {
                    s = m == ninf<A>() ? (A)0 : s * ex(m - mc);
                    m = mc;
                }
                if (m != ninf<A>())
#pragma unroll
                    for (int i = 0; i < VEC; i++) s += ex(v[i] - m);
                const int64_t k = t - j * VEC;
                if (k >= 0 && k < VEC)
#pragma unroll
                    for (int i = 0; i < VEC; i++)
                        if (i == k) zt = v[i];
            }
        }
        warp_ol(m, s);
        zt = warp_sum(zt);
        if (lane == 0) {
            const A lse = m + ln(s);
            stats_lse<DT>(a, p, lse);
            A loss = 0, wt = 0;
            if (t != a.ignore) {
                if (bad_target(t, C)) {
                    loss = wt = qnan<A>();
                    report_bad_target(a, p, t);
                } else {
                    loss = lse - zt;
                    wt = 1;
                }
            }
            if (a.reduction == RED_NONE) {
                put_loss<DT>(a.out, a.lossf, p, loss);
            } else {
                lsum += (double)loss;
                wsum += (double)wt;
            }
        }
    }
    if (a.reduction != RED_NONE)
        reduce_epilogue<DT>(lsum, wsum, (int)a.reduction, part, a.out, stats_wsum<DT>(a), a.lossf);
}

// The backward from the forward's row statistics (inner == 1): with each
// position's log-sum-exp at hand no fold is left, so it is a map over the
// logits, read once and written once:
//   dz_c = g_p ((1-ls) w_t (p_c - [c == t]) + ls/C (sum(w) p_c - w_c)),
//   p_c = exp(z_c - lse_p),
// g_p the loss's gradient (divided by the saved weight sum for mean). A
// block takes a row at a time, each thread U chunks of VEC elements, all
// loaded before any is stored. Ignored rows get zeros, out-of-range
// targets NaN rows (and the fault record).

template <int DT, int VEC, int U>
__device__ __forceinline__ void ce_saved_issue(const typename dtype<DT>::T *row, int j0, int nch,
                                               typename RowChunk<DT, VEC>::R (&r)[U]) {
#pragma unroll
    for (int u = 0; u < U; u++) {
        const int j = j0 + u * kThreads256;
        if (j < nch) r[u] = RowChunk<DT, VEC>::load(row + (int64_t)j * VEC);
    }
}

// PLAIN: no class weights, no label smoothing (the common case, in fewer
// registers). Within 32 registers a thread (offsets within a row are ints:
// ce_saved_ok keeps C below 2^31), so 8 blocks fill a multiprocessor:
// U chunks a thread in flight, 2048 threads.
template <int DT, int VEC, bool PLAIN, int U>
__global__ void __launch_bounds__(kThreads256, 8) ce_bwd_saved(const Cls a) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    typedef RowChunk<DT, VEC> K;
    __shared__ A sh[33];
    const T *x = (const T *)a.input, *w = (const T *)a.weight;
    const A *st = (const A *)a.stats;
    const int C = (int)a.c, nch = C / VEC;
    const A ls = PLAIN ? (A)0 : (A)a.ls;
    A sw = (A)C;
    if (!PLAIN && w && ls > (A)0) {
        A b = 0;
        for (int c = threadIdx.x; c < C; c += kThreads256) b += (A)dtype<DT>::dec(w[c]);
        sw = block_sum(b, sh);
    }
    for (int64_t p = blockIdx.x; p < a.npos; p += gridDim.x) {
        const T *row = x + p * C;
        T *orow = (T *)a.out + p * C;
        // The row's first chunks are on their way before anything else is
        // read: a load that waited for the target or the statistics would
        // add a round trip to memory to every row.
        typename K::R r[U];
        ce_saved_issue<DT, VEC, U>(row, threadIdx.x, nch, r);
        const int64_t t = a.target[p];
        const A lse = st[p];
        A gp;
        if (a.reduction == RED_NONE) gp = (A)loss_grad<DT>(a, p);
        else if (a.reduction == RED_MEAN) gp = (A)loss_grad<DT>(a, 0) / st[a.npos];
        else gp = (A)loss_grad<DT>(a, 0);
        const bool ign = t == a.ignore, bad = !ign && bad_target(t, C);
        if (ign || bad) {
            if (bad && threadIdx.x == 0) report_bad_target(a, p, t);
            A z[VEC];
#pragma unroll
            for (int i = 0; i < VEC; i++) z[i] = bad ? qnan<A>() : (A)0;
            for (int j = threadIdx.x; j < nch; j += kThreads256) K::store(orow + (int64_t)j * VEC, z);
            continue;
        }
        const int tc = (int)t;
        const A wt = !PLAIN && w ? (A)dtype<DT>::dec(w[tc]) : (A)1;
        const A ca = gp * ((A)1 - ls) * wt, cb = gp * ls / (A)C;
        for (int j0 = threadIdx.x; j0 < nch; j0 += U * kThreads256) {
            if (j0 != (int)threadIdx.x) ce_saved_issue<DT, VEC, U>(row, j0, nch, r);
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int j = j0 + u * kThreads256;
                if (j >= nch) continue;
                A v[VEC], o[VEC];
                K::decode(r[u], v);
#pragma unroll
                for (int i = 0; i < VEC; i++) {
                    const int e = j * VEC + i;
                    const A pr = ex(v[i] - lse);
                    A dz = ca * pr;
                    if (!PLAIN && ls > (A)0)
                        dz += cb * (sw * pr - (w ? (A)dtype<DT>::dec(w[e]) : (A)1));
                    o[i] = e == tc ? dz - ca : dz;
                }
                K::store(orow + (int64_t)j * VEC, o);
            }
        }
    }
}

// Whether the backward can take the saved-statistics map, with 16-byte
// chunks (*vec) where C and the pointers allow.
template <int DT> bool ce_saved_ok(const cti_nn_cls *r, bool *vec) {
    constexpr int VEC = 16 / sizeof(typename dtype<DT>::T);
    if (!r->stats || r->inner != 1 || r->c > INT_MAX - 16) return false;
    *vec = r->c % VEC == 0 && ((uintptr_t)r->input & 15) == 0 && ((uintptr_t)r->out & 15) == 0;
    return true;
}

// The chunks a thread holds for rows of C elements in 16-byte chunks, or 0
// when the rows do not fit the register kernels (or are short enough for
// the warp-per-row ones).
template <int DT> int ce_rows_nv(const cti_nn_cls *r) {
    constexpr int VEC = 16 / sizeof(typename dtype<DT>::T);
    if (r->inner != 1 || r->c <= 1024 || r->c % VEC != 0 || ((uintptr_t)r->input & 15) != 0 ||
        (r->out && r->kind == CTI_NN_CE_BWD && ((uintptr_t)r->out & 15) != 0))
        return 0;
    const int64_t nvec = r->c / VEC;
    for (int nv = 1; nv <= kRowsMaxNV; nv *= 2)
        if (nvec <= (int64_t)nv * kBlockRowThreads) return nv;
    return 0;
}

// Blocks of the row kernels: what the device holds at once (each block
// loops over rows, so a block's start-up and its prefetch pay off over many
// rows), at most the rows and the forward's partials cap.
template <int DT, bool BWD, int NV> unsigned ce_rows_resident(int sms) {
    constexpr int VEC = 16 / sizeof(typename dtype<DT>::T);
    static std::atomic<int> per_sm{0}; // the same answer on every thread: a race is harmless
    int k = per_sm.load(std::memory_order_relaxed);
    if (k == 0) {
        int n = 0;
        if (BWD) cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ce_bwd_rows<DT, VEC, NV>, kBlockRowThreads, 0);
        else cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, ce_fwd_rows<DT, VEC, NV>, kBlockRowThreads, 0);
        cudaGetLastError();
        k = n > 0 ? n : 1;
        per_sm.store(k, std::memory_order_relaxed);
    }
    return (unsigned)(k * (sms > 0 ? sms : 1));
}

template <int DT, bool BWD>
unsigned ce_rows_blocks(int nv, int sms) {
    switch (nv) {
    case 1: return ce_rows_resident<DT, BWD, 1>(sms);
    case 2: return ce_rows_resident<DT, BWD, 2>(sms);
    case 4: return ce_rows_resident<DT, BWD, 4>(sms);
    default: return ce_rows_resident<DT, BWD, kRowsMaxNV>(sms);
    }
}

template <int DT>
void ce_plain_bwd_launch(const Cls &a, int nv, unsigned blocks, const double *wsum, cudaStream_t st) {
    constexpr int VEC = 16 / sizeof(typename dtype<DT>::T);
    switch (nv) {
    case 1: ce_bwd_plain<DT, VEC, 1><<<blocks, kBlockRowThreads, 0, st>>>(a, wsum); break;
    case 2: ce_bwd_plain<DT, VEC, 2><<<blocks, kBlockRowThreads, 0, st>>>(a, wsum); break;
    case 4: ce_bwd_plain<DT, VEC, 4><<<blocks, kBlockRowThreads, 0, st>>>(a, wsum); break;
    default: ce_bwd_plain<DT, VEC, kRowsMaxNV><<<blocks, kBlockRowThreads, 0, st>>>(a, wsum); break;
    }
}

template <int DT, bool BWD>
void ce_rows_launch(const Cls &a, int nv, unsigned blocks, double *part, const double *wsum,
                    cudaStream_t st) {
    constexpr int VEC = 16 / sizeof(typename dtype<DT>::T);
#define CE_ROWS_(NV)                                                                              \
    if (BWD) ce_bwd_rows<DT, VEC, NV><<<blocks, kBlockRowThreads, 0, st>>>(a, wsum);              \
    else ce_fwd_rows<DT, VEC, NV><<<blocks, kBlockRowThreads, 0, st>>>(a, part)
    switch (nv) {
    case 1: CE_ROWS_(1); break;
    case 2: CE_ROWS_(2); break;
    case 4: CE_ROWS_(4); break;
    default: CE_ROWS_(kRowsMaxNV); break;
    }
#undef CE_ROWS_
}

// nll_loss forward: loss_p = -w_t * lp[n, t, j], one thread per position.
template <int DT> __global__ void __launch_bounds__(kThreads256) nll_fwd(const Cls a, double *part) {
    typedef typename dtype<DT>::T T;
    const T *x = (const T *)a.input, *w = (const T *)a.weight;
    const int64_t C = a.c, step = (int64_t)gridDim.x * blockDim.x;
    double lsum = 0, wsum = 0;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < a.npos; p += step) {
        const int64_t t = a.target[p];
        double loss = 0, wt = 0;
        if (t != a.ignore) {
            if (bad_target(t, C)) {
                loss = wt = (double)NAN;
                report_bad_target(a, p, t);
            } else {
                int64_t nn = p / a.inner, j = p - nn * a.inner;
                wt = w ? (double)dtype<DT>::dec(w[t]) : 1.0;
                loss = -wt * (double)dtype<DT>::dec(x[(nn * C + t) * a.inner + j]);
            }
        }
        if (a.reduction == RED_NONE) {
            put_loss<DT>(a.out, a.lossf, p, loss);
        } else {
            lsum += loss;
            wsum += wt;
        }
    }
    if (a.reduction != RED_NONE)
        reduce_epilogue<DT>(lsum, wsum, (int)a.reduction, part, a.out, stats_wsum<DT>(a), a.lossf);
}

// nll_loss backward: one thread per gradient element; -w_t * g at each
// counted target, zeros elsewhere.
template <int DT> __global__ void __launch_bounds__(kThreads256) nll_bwd(const Cls a, const double *wsum_dev) {
    typedef typename dtype<DT>::T T;
    __shared__ double sh[33];
    const T *w = (const T *)a.weight;
    T *out = (T *)a.out;
    const int64_t C = a.c, total = a.npos * C, step = (int64_t)gridDim.x * blockDim.x;
    double gs = 0;
    if (a.reduction != RED_NONE) {
        gs = loss_grad<DT>(a, 0);
        if (a.reduction == RED_MEAN) gs /= wsum_dev ? *wsum_dev : block_wsum<DT>(a, sh);
    }
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        int64_t q = e / a.inner, j = e - q * a.inner;
        int64_t nn = q / C, c = q - nn * C;
        int64_t p = nn * a.inner + j;
        int64_t t = a.target[p];
        double v = 0;
        if (t != a.ignore) {
            if (bad_target(t, C)) {
                v = (double)NAN;
                if (c == 0) report_bad_target(a, p, t);
            } else if (c == t)
                v = -(w ? (double)dtype<DT>::dec(w[t]) : 1.0) *
                    (a.reduction == RED_NONE ? loss_grad<DT>(a, p) : gs);
        }
        out[e] = dtype<DT>::enc(v);
    }
}

struct ClsPlan {
    bool saved;       // cross-entropy backward from the forward's row statistics
    bool saved_vec;   // ... in 16-byte chunks
    bool rows;        // cross-entropy with inner == 1: a warp per position
    int rows_nv;      // cross-entropy with long rows: a block per row, NV chunks a thread (0: no)
    bool plain;       // ... and no class weights or smoothing: ce_fwd_warp / ce_bwd_plain
    unsigned blocks;  // of the main kernel
    bool split;       // forward: partials, then reduce_final
    unsigned wblocks; // backward mean over many positions: blocks of wsum_part (0: none)
    size_t part_off, wsum_off, bytes;
};

int ce_rows_nv_dt(const cti_nn_cls *r) {
    switch (r->dt) {
    case CT_F32: return ce_rows_nv<CT_F32>(r);
    case CT_F64: return ce_rows_nv<CT_F64>(r);
    case CT_F16: return ce_rows_nv<CT_F16>(r);
    case CT_BF16: return ce_rows_nv<CT_BF16>(r);
    default: return 0;
    }
}

unsigned ce_rows_blocks_dt(const cti_nn_cls *r, int nv, bool bwd) {
    switch (r->dt) {
    case CT_F32: return bwd ? ce_rows_blocks<CT_F32, true>(nv, r->sms) : ce_rows_blocks<CT_F32, false>(nv, r->sms);
    case CT_F64: return bwd ? ce_rows_blocks<CT_F64, true>(nv, r->sms) : ce_rows_blocks<CT_F64, false>(nv, r->sms);
    case CT_F16: return bwd ? ce_rows_blocks<CT_F16, true>(nv, r->sms) : ce_rows_blocks<CT_F16, false>(nv, r->sms);
    default: return bwd ? ce_rows_blocks<CT_BF16, true>(nv, r->sms) : ce_rows_blocks<CT_BF16, false>(nv, r->sms);
    }
}

ClsPlan cls_plan(const cti_nn_cls *r) {
    ClsPlan pl = {};
    const int64_t npos = r->n * r->inner, c = r->c > 0 ? r->c : 1;
    const bool ce = r->kind == CTI_NN_CE || r->kind == CTI_NN_CE_BWD;
    const bool bwd = r->kind == CTI_NN_CE_BWD || r->kind == CTI_NN_NLL_BWD;
    if (r->kind == CTI_NN_CE_BWD) {
        switch (r->dt) {
        case CT_F32: pl.saved = ce_saved_ok<CT_F32>(r, &pl.saved_vec); break;
        case CT_F64: pl.saved = ce_saved_ok<CT_F64>(r, &pl.saved_vec); break;
        case CT_F16: pl.saved = ce_saved_ok<CT_F16>(r, &pl.saved_vec); break;
        default: pl.saved = ce_saved_ok<CT_BF16>(r, &pl.saved_vec); break;
        }
        if (pl.saved) {
            pl.blocks = blocks_for(npos, 1, kGridCap);
            return pl;
        }
    }
    pl.rows = ce && r->inner == 1;
    pl.rows_nv = ce ? ce_rows_nv_dt(r) : 0;
    pl.plain = pl.rows_nv && !r->weight && r->ls == 0;
    if (pl.plain && !bwd) {
        pl.blocks = blocks_for(npos, kThreads256 / 32, kRedBlocksCap);
        pl.split = r->reduction != RED_NONE && pl.blocks > 1;
        if (pl.split) pl.bytes = (size_t)pl.blocks * 2 * sizeof(double);
        return pl;
    }
    const int64_t per = pl.rows_nv ? 1 : pl.rows ? kThreads256 / 32 : kThreads256;
    if (!bwd && pl.rows_nv) {
        int64_t b = (int64_t)ce_rows_blocks_dt(r, pl.rows_nv, false);
        if (b > kRedBlocksCap) b = kRedBlocksCap;
        if (b > npos) b = npos;
        pl.blocks = (unsigned)(b < 1 ? 1 : b);
        pl.split = r->reduction != RED_NONE && pl.blocks > 1;
        if (pl.split) pl.bytes = (size_t)pl.blocks * 2 * sizeof(double);
        return pl;
    }
    if (!bwd) {
        // A block per 16K logits read: a small batch is one launch.
        int64_t work = ce ? npos * c : npos;
        int64_t b = (work + 16383) / 16384;
        int64_t most = (npos + per - 1) / per;
        if (b > most) b = most;
        if (b > kRedBlocksCap) b = kRedBlocksCap;
        pl.blocks = (unsigned)(b < 1 ? 1 : b);
        pl.split = r->reduction != RED_NONE && pl.blocks > 1;
        if (pl.split) pl.bytes = (size_t)pl.blocks * 2 * sizeof(double);
        return pl;
    }
    if (r->kind == CTI_NN_NLL_BWD) pl.blocks = blocks_for(npos * r->c, kThreads256, 8192);
    else if (pl.plain) pl.blocks = blocks_for(npos, 1, kGridCap);
    else if (pl.rows_nv)
        pl.blocks = blocks_for(npos, 1, ce_rows_blocks_dt(r, pl.rows_nv, true));
    else pl.blocks = blocks_for(npos, per, 8192);
    if (r->reduction == RED_MEAN && npos > kScanMax) {
        pl.wblocks = blocks_for(npos, kThreads256 * 16, kRedBlocksCap);
        pl.part_off = 0;
        pl.wsum_off = ((size_t)pl.wblocks * sizeof(double) + 255) / 256 * 256;
        pl.bytes = pl.wsum_off + sizeof(double);
    }
    return pl;
}

template <int DT> cudaError_t cls_dt(const cti_nn_cls *r, cudaStream_t st, const char **routine) {
    ClsPlan pl = cls_plan(r);
    Cls a;
    a.input = r->input;
    a.target = r->target;
    a.weight = r->weight;
    a.grad = r->grad;
    a.out = r->out;
    a.c = r->c;
    a.inner = r->inner;
    a.npos = r->n * r->inner;
    a.reduction = r->reduction;
    a.ignore = r->ignore;
    a.ls = r->ls;
    a.op = r->op;
    a.fault = r->fault.record;
    a.flag = r->fault.flag;
    a.stats = r->stats;
    a.lossf = r->lossf != 0;
    char *work = (char *)r->work;
    if (r->kind == CTI_NN_CE || r->kind == CTI_NN_NLL) {
        double *part = pl.split ? (double *)work : nullptr;
        if (r->kind == CTI_NN_NLL) {
            nll_fwd<DT><<<pl.blocks, kThreads256, 0, st>>>(a, part);
            *routine = pl.split ? "cten_nll_loss_fwd+final" : "cten_nll_loss_fwd";
        } else if (pl.plain) {
            ce_fwd_warp<DT, 16 / sizeof(typename dtype<DT>::T)><<<pl.blocks, kThreads256, 0, st>>>(a, part);
            *routine = pl.split ? "cten_cross_entropy_fwd_warp_stream+final"
                                : "cten_cross_entropy_fwd_warp_stream";
        } else if (pl.rows_nv) {
            ce_rows_launch<DT, false>(a, pl.rows_nv, pl.blocks, part, nullptr, st);
            *routine = pl.split ? "cten_cross_entropy_fwd_row_in_registers+final"
                                : "cten_cross_entropy_fwd_row_in_registers";
        } else if (pl.rows) {
            ce_fwd<DT, true><<<pl.blocks, kThreads256, 0, st>>>(a, part);
            *routine = pl.split ? "cten_cross_entropy_fwd_warp_per_row+final"
                                : "cten_cross_entropy_fwd_warp_per_row";
        } else {
            ce_fwd<DT, false><<<pl.blocks, kThreads256, 0, st>>>(a, part);
            *routine = pl.split ? "cten_cross_entropy_fwd_strided+final"
                                : "cten_cross_entropy_fwd_strided";
        }
        if (pl.split) {
            void *wout = a.stats && a.reduction == RED_MEAN
                             ? (void *)((typename Acc<DT>::A *)a.stats + a.npos)
                             : nullptr;
            reduce_final<DT><<<1, kThreads256, 0, st>>>(part, (int)pl.blocks, (int)a.reduction,
                                                        a.out, wout, a.lossf);
        }
        return cudaGetLastError();
    }
    if (pl.saved) {
        constexpr int FV = 16 / sizeof(typename dtype<DT>::T);
        const bool plain = !a.weight && a.ls == 0;
        if (pl.saved_vec && plain) ce_bwd_saved<DT, FV, true, 2><<<pl.blocks, kThreads256, 0, st>>>(a);
        else if (pl.saved_vec) ce_bwd_saved<DT, FV, false, 2><<<pl.blocks, kThreads256, 0, st>>>(a);
        else if (plain) ce_bwd_saved<DT, 1, true, 2><<<pl.blocks, kThreads256, 0, st>>>(a);
        else ce_bwd_saved<DT, 1, false, 2><<<pl.blocks, kThreads256, 0, st>>>(a);
        *routine = pl.saved_vec ? "cten_cross_entropy_bwd_saved_stats_vec16"
                                : "cten_cross_entropy_bwd_saved_stats";
        return cudaGetLastError();
    }
    const double *wsum = nullptr;
    if (pl.wblocks > 0) {
        double *part = (double *)(work + pl.part_off), *res = (double *)(work + pl.wsum_off);
        wsum_part<DT><<<pl.wblocks, kThreads256, 0, st>>>(a, part, res);
        if (pl.wblocks > 1) wsum_final<<<1, kThreads256, 0, st>>>(part, (int)pl.wblocks, res);
        wsum = res;
    }
    if (r->kind == CTI_NN_NLL_BWD) {
        nll_bwd<DT><<<pl.blocks, kThreads256, 0, st>>>(a, wsum);
        *routine = wsum ? "cten_weight_sum+cten_nll_loss_bwd" : "cten_nll_loss_bwd";
    } else if (pl.plain) {
        ce_plain_bwd_launch<DT>(a, pl.rows_nv, pl.blocks, wsum, st);
        *routine = wsum ? "cten_weight_sum+cten_cross_entropy_bwd_block_per_row"
                        : "cten_cross_entropy_bwd_block_per_row";
    } else if (pl.rows_nv) {
        ce_rows_launch<DT, true>(a, pl.rows_nv, pl.blocks, nullptr, wsum, st);
        *routine = wsum ? "cten_weight_sum+cten_cross_entropy_bwd_row_in_registers"
                        : "cten_cross_entropy_bwd_row_in_registers";
    } else if (pl.rows) {
        ce_bwd<DT, true><<<pl.blocks, kThreads256, 0, st>>>(a, wsum);
        *routine = wsum ? "cten_weight_sum+cten_cross_entropy_bwd_warp_per_row"
                        : "cten_cross_entropy_bwd_warp_per_row";
    } else {
        ce_bwd<DT, false><<<pl.blocks, kThreads256, 0, st>>>(a, wsum);
        *routine = wsum ? "cten_weight_sum+cten_cross_entropy_bwd_strided"
                        : "cten_cross_entropy_bwd_strided";
    }
    return cudaGetLastError();
}

// ---- mse_loss ---------------------------------------------------------------------------------
template <int DT>
__global__ void __launch_bounds__(kThreads256)
mse_fwd(const typename dtype<DT>::T *__restrict__ a, const typename dtype<DT>::T *__restrict__ b,
        void *out, int64_t n, int reduction, double *part) {
    typedef typename Acc<DT>::A A;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    double lsum = 0, cnt = 0;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        A d = (A)dtype<DT>::dec(a[i]) - (A)dtype<DT>::dec(b[i]);
        A sq = d * d;
        if (reduction == RED_NONE) {
            ((typename dtype<DT>::T *)out)[i] = dtype<DT>::enc(sq);
        } else {
            lsum += (double)sq;
            cnt += 1.0;
        }
    }
    if (reduction != RED_NONE) reduce_epilogue<DT>(lsum, cnt, reduction, part, out);
}

template <int DT>
__global__ void __launch_bounds__(kThreads256)
mse_bwd(const typename dtype<DT>::T *__restrict__ g, const typename dtype<DT>::T *__restrict__ a,
        const typename dtype<DT>::T *__restrict__ b, typename dtype<DT>::T *__restrict__ out,
        int64_t n, int reduction) {
    typedef typename Acc<DT>::A A;
    A gs = 0;
    if (reduction != RED_NONE) {
        double g0 = (double)dtype<DT>::dec(g[0]);
        gs = (A)(reduction == RED_MEAN ? 2.0 * g0 / (double)n : 2.0 * g0);
    }
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        A d = (A)dtype<DT>::dec(a[i]) - (A)dtype<DT>::dec(b[i]);
        out[i] = dtype<DT>::enc(reduction == RED_NONE ? (A)2 * d * (A)dtype<DT>::dec(g[i]) : gs * d);
    }
}

unsigned mse_blocks(int64_t n) { return blocks_for(n, 4096, kRedBlocksCap); }

template <int DT>
cudaError_t mse_dt(int bwd, const void *a, const void *b, const void *g, void *out, int64_t n,
                   int reduction, void *work, cudaStream_t st, const char **routine) {
    typedef typename dtype<DT>::T T;
    if (bwd) {
        mse_bwd<DT><<<blocks_for(n, kThreads256, 8192), kThreads256, 0, st>>>(
            (const T *)g, (const T *)a, (const T *)b, (T *)out, n, reduction);
        *routine = "cten_mse_loss_bwd";
        return cudaGetLastError();
    }
    unsigned nb = reduction == RED_NONE ? blocks_for(n, kThreads256, 8192) : mse_blocks(n);
    bool split = reduction != RED_NONE && nb > 1;
    double *part = split ? (double *)work : nullptr;
    mse_fwd<DT><<<nb, kThreads256, 0, st>>>((const T *)a, (const T *)b, out, n, reduction, part);
    if (split) reduce_final<DT><<<1, kThreads256, 0, st>>>(part, (int)nb, reduction, out);
    *routine = split ? "cten_mse_loss_fwd+final" : "cten_mse_loss_fwd";
    return cudaGetLastError();
}

// ---- embedding ------------------------------------------------------------------------------------
template <int ES> struct Bits;
template <> struct Bits<1> { typedef uint8_t T; };
template <> struct Bits<2> { typedef uint16_t T; };
template <> struct Bits<4> { typedef uint32_t T; };
template <> struct Bits<8> { typedef unsigned long long T; };

// A bad index at position i: the smallest position wins (the first in index
// order, as the CPU reports), and under a capture the fault record too.
__device__ __forceinline__ void emb_bad(const cti_nn_emb_check &c, int64_t i, int64_t t,
                                        int64_t v) {
    atomicMin(c.bad, (unsigned long long)i);
    if (c.fault.record) report_bad_target_(c.fault.record, c.fault.flag, c.op, v, -1, i, t);
}

// out[i, k] = w[idx[i], k], copied as bits. A bad index's row is left
// unwritten: the call fails. With d == 0 the indices are still checked.
template <class E, class I>
__global__ void __launch_bounds__(kThreads256)
emb_fwd(const E *__restrict__ w, const I *__restrict__ idx, E *__restrict__ out, int64_t v,
        int64_t d, int64_t n, const cti_nn_emb_check chk) {
    const int64_t dd = d > 0 ? d : 1, total = n * dd, step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        int64_t i = e / dd, k = e - i * dd;
        int64_t t = (int64_t)idx[i];
        if (t < 0 || t >= v) {
            if (k == 0) emb_bad(chk, i, t, v);
            continue;
        }
        if (d > 0) out[e] = w[t * d + k];
    }
}

template <class I>
cudaError_t emb_fwd_idx(int esize, const void *w, const I *idx, void *out, int64_t v, int64_t d,
                        int64_t n, const cti_nn_emb_check &chk, cudaStream_t st) {
    unsigned g = blocks_for(n * (d > 0 ? d : 1), kThreads256, 8192);
    switch (esize) {
    case 1: emb_fwd<<<g, kThreads256, 0, st>>>((const uint8_t *)w, idx, (uint8_t *)out, v, d, n, chk); break;
    case 2: emb_fwd<<<g, kThreads256, 0, st>>>((const uint16_t *)w, idx, (uint16_t *)out, v, d, n, chk); break;
    case 4: emb_fwd<<<g, kThreads256, 0, st>>>((const uint32_t *)w, idx, (uint32_t *)out, v, d, n, chk); break;
    case 8:
        emb_fwd<<<g, kThreads256, 0, st>>>((const unsigned long long *)w, idx,
                                           (unsigned long long *)out, v, d, n, chk);
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

// Backward, deterministic without atomics: the positions are sorted by index
// (a stable radix sort, so equal indices keep their order), then each output
// row finds its run of positions by binary search and sums their gradient
// rows in index order - the CPU's order, so f32 and f64 results are the
// CPU's bit for bit. Bad indices get the key v, past every real row.
template <class I>
__global__ void __launch_bounds__(kThreads256)
emb_keys(const I *__restrict__ idx, int64_t n, int64_t v, unsigned long long *__restrict__ keys,
         int *__restrict__ pos, const cti_nn_emb_check chk) {
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t t = (int64_t)idx[i];
        bool ok = t >= 0 && t < v;
        if (!ok) emb_bad(chk, i, t, v);
        keys[i] = (unsigned long long)(ok ? t : v);
        pos[i] = (int)i;
    }
}

constexpr int kEmbCols = 128;

// The weight's gradient from the sorted keys: the block of sorted position
// i, when a run of equal keys starts there, sums the gradient rows of that
// run (in sorted order: the stable sort keeps the tokens' order, so the
// sums are the same from run to run) into the key's row; the rows of tokens
// that do not occur, and the padding row, keep the zeros the launch wrote
// first. A block per vocabulary row, each finding its run by two binary
// searches of dependent loads, took 1.2 ms on 16384 tokens of a 50304-row
// table; this is bound by the bytes.
template <int DT>
__global__ void __launch_bounds__(kEmbCols)
emb_bwd(const typename dtype<DT>::T *__restrict__ g, const unsigned long long *__restrict__ keys,
        const int *__restrict__ pos, typename dtype<DT>::T *__restrict__ out, int64_t v, int64_t d,
        int64_t n, int64_t pad) {
    typedef typename Acc<DT>::A A;
    for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
        const unsigned long long key = keys[i];
        if (key >= (unsigned long long)v || (int64_t)key == pad) continue;
        if (i > 0 && keys[i - 1] == key) continue; // not the start of its run
        int64_t end = i + 1;
        while (end < n && keys[end] == key) end++;
        for (int64_t col = threadIdx.x; col < d; col += kEmbCols) {
            A acc = 0;
            for (int64_t k = i; k < end; k++) acc += (A)dtype<DT>::dec(g[(int64_t)pos[k] * d + col]);
            out[(int64_t)key * d + col] = dtype<DT>::enc(acc);
        }
    }
}

int key_bits(int64_t v) {
    int b = 1;
    while (b < 64 && ((uint64_t)v >> b) != 0) b++;
    return b;
}

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

struct EmbWork {
    size_t keys_in, keys_out, pos_in, pos_out, temp, temp_bytes, total;
};

cudaError_t emb_work(int64_t n, int64_t v, EmbWork *w) {
    size_t temp = 0;
    cudaError_t e = cudaSuccess;
    if (n > 0)
        e = cub::DeviceRadixSort::SortPairs(nullptr, temp, (const unsigned long long *)nullptr,
                                            (unsigned long long *)nullptr, (const int *)nullptr,
                                            (int *)nullptr, (int)n, 0, key_bits(v));
    size_t kb = align256((size_t)n * sizeof(unsigned long long)), pb = align256((size_t)n * sizeof(int));
    w->keys_in = 0;
    w->keys_out = kb;
    w->pos_in = 2 * kb;
    w->pos_out = 2 * kb + pb;
    w->temp = 2 * kb + 2 * pb;
    w->temp_bytes = temp;
    w->total = w->temp + align256(temp);
    return e;
}

template <int DT, class I>
cudaError_t emb_bwd_dt(const void *g, const I *idx, void *out, int64_t v, int64_t d, int64_t n,
                       int64_t pad, void *work, const cti_nn_emb_check &chk, cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    EmbWork w;
    cudaError_t e = emb_work(n, v, &w);
    if (e != cudaSuccess) return e;
    char *base = (char *)work;
    unsigned long long *kin = (unsigned long long *)(base + w.keys_in);
    unsigned long long *kout = (unsigned long long *)(base + w.keys_out);
    int *pin = (int *)(base + w.pos_in), *pout = (int *)(base + w.pos_out);
    if (n > 0) {
        emb_keys<<<blocks_for(n, kThreads256, 8192), kThreads256, 0, st>>>(idx, n, v, kin, pin, chk);
        if ((e = cudaGetLastError()) != cudaSuccess) return e;
    }
    if (v * d == 0) return cudaSuccess;
    if (n > 0) {
        size_t tb = w.temp_bytes;
        e = cub::DeviceRadixSort::SortPairs((void *)(base + w.temp), tb,
                                            (const unsigned long long *)kin, kout,
                                            (const int *)pin, pout, (int)n, 0, key_bits(v), st);
        if (e != cudaSuccess) return e;
    }
    // zeros (all-zero bits in every float dtype), then the rows of the tokens
    e = cudaMemsetAsync(out, 0, (size_t)(v * d) * sizeof(T), st);
    if (e != cudaSuccess || n == 0) return e;
    emb_bwd<DT><<<blocks_for(n, 1, kGridCap), kEmbCols, 0, st>>>((const T *)g, kout, pout, (T *)out,
                                                                v, d, n, pad);
    return cudaGetLastError();
}

// ---- dropout ------------------------------------------------------------------------------------
// The CPU's layout (src/backends/cpu/dropout.c): element k is kept iff the f32
// uniform of Philox draw first + k, (word >> 8) * 2^-24, is >= p. One thread
// per Philox block of four draws, so masks equal the CPU's for the same
// generator state.
__device__ __forceinline__ void philox(uint64_t seed, uint64_t block, uint32_t out[4]) {
    uint32_t c0 = (uint32_t)block, c1 = (uint32_t)(block >> 32), c2 = 0, c3 = 0;
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
#pragma unroll
    for (int r = 0; r < 10; r++) {
        uint32_t hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        uint32_t hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0;
        c1 = lo1;
        c2 = hi0 ^ c3 ^ k1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0;
    out[1] = c1;
    out[2] = c2;
    out[3] = c3;
}

template <int DT>
__global__ void __launch_bounds__(kThreads256)
drop_fwd(const typename dtype<DT>::T *__restrict__ x, typename dtype<DT>::T *__restrict__ y,
         uint8_t *__restrict__ mask, int64_t n, uint64_t seed, uint64_t first,
         const uint64_t *__restrict__ state, double p, typename Acc<DT>::A scale) {
    typedef typename Acc<DT>::A A;
    if (state) { // in a CUDA graph: this replay's draws
        seed = state[0];
        first += state[1];
    }
    const uint64_t b0 = first >> 2, units = ((first + (uint64_t)n - 1) >> 2) - b0 + 1;
    const uint64_t step = (uint64_t)gridDim.x * blockDim.x;
    for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += step) {
        uint32_t r[4];
        philox(seed, b0 + u, r);
#pragma unroll
        for (int q = 0; q < 4; q++) {
            uint64_t draw = (b0 + u) * 4 + (uint64_t)q;
            if (draw < first || draw - first >= (uint64_t)n) continue;
            int64_t k = (int64_t)(draw - first);
            bool keep = (double)(r[q] >> 8) * 0x1p-24 >= p;
            if (mask) mask[k] = keep;
            y[k] = dtype<DT>::enc(keep ? (A)dtype<DT>::dec(x[k]) * scale : (A)0);
        }
    }
}

template <int DT>
__global__ void __launch_bounds__(kThreads256)
drop_bwd(const typename dtype<DT>::T *__restrict__ g, const uint8_t *__restrict__ mask,
         typename dtype<DT>::T *__restrict__ out, int64_t n, typename Acc<DT>::A scale) {
    typedef typename Acc<DT>::A A;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        out[i] = dtype<DT>::enc(mask[i] ? (A)dtype<DT>::dec(g[i]) * scale : (A)0);
}

template <int DT>
cudaError_t drop_dt(int bwd, const void *x, void *y, const uint8_t *mask_in, uint8_t *mask_out,
                    int64_t n, uint64_t seed, uint64_t first, const uint64_t *state, double p,
                    cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    typedef typename Acc<DT>::A A;
    A scale = (A)(p < 1 ? 1.0 / (1.0 - p) : 0.0);
    if (bwd) {
        drop_bwd<DT><<<blocks_for(n, kThreads256, 8192), kThreads256, 0, st>>>(
            (const T *)x, mask_in, (T *)y, n, scale);
    } else {
        // The kernel loops over its blocks: with state, first's alignment is
        // only known when it runs, so the grid takes the most it may need.
        uint64_t units = state ? ((uint64_t)n + 3) / 4 + 1
                               : ((first + (uint64_t)n - 1) >> 2) - (first >> 2) + 1;
        drop_fwd<DT><<<blocks_for((int64_t)units, kThreads256, 8192), kThreads256, 0, st>>>(
            (const T *)x, (T *)y, mask_out, n, seed, first, state, p, scale);
    }
    return cudaGetLastError();
}

} // namespace
} // namespace cti

#define CTI_NN_FLOAT_SWITCH(dt, CALL)                                                  \
    switch (dt) {                                                                      \
    case CT_F32: { constexpr int DTV = CT_F32; return CALL; }                          \
    case CT_F64: { constexpr int DTV = CT_F64; return CALL; }                          \
    case CT_F16: { constexpr int DTV = CT_F16; return CALL; }                          \
    case CT_BF16: { constexpr int DTV = CT_BF16; return CALL; }                        \
    default: return cudaErrorInvalidValue;                                             \
    }

extern "C" {

cudaError_t cti_nn_softmax(int dt, int bwd, int lg, const void *a, const void *b, void *out,
                           int64_t outer, int64_t d, int64_t inner, cudaStream_t st,
                           const char **routine) {
    CTI_NN_FLOAT_SWITCH(dt, cti::softmax_dt<DTV>(bwd, lg, a, b, out, outer, d, inner, st, routine))
}

size_t cti_nn_cls_work(const cti_nn_cls *r) { return cti::cls_plan(r).bytes; }

cudaError_t cti_nn_cls_launch(const cti_nn_cls *r, cudaStream_t st, const char **routine) {
    CTI_NN_FLOAT_SWITCH((int)r->dt, cti::cls_dt<DTV>(r, st, routine))
}

size_t cti_nn_mse_work(int64_t n, int reduction) {
    if (reduction == RED_NONE) return 0;
    unsigned nb = cti::mse_blocks(n);
    return nb > 1 ? (size_t)nb * 2 * sizeof(double) : 0;
}

cudaError_t cti_nn_mse(int dt, int bwd, const void *a, const void *b, const void *g, void *out,
                       int64_t n, int reduction, void *work, cudaStream_t st, const char **routine) {
    CTI_NN_FLOAT_SWITCH(dt, cti::mse_dt<DTV>(bwd, a, b, g, out, n, reduction, work, st, routine))
}

cudaError_t cti_nn_embedding(int esize, int idx_i32, const void *w, const void *idx, void *out,
                             int64_t v, int64_t d, int64_t n, cti_nn_emb_check chk,
                             cudaStream_t st) {
    if (idx_i32) return cti::emb_fwd_idx(esize, w, (const int32_t *)idx, out, v, d, n, chk, st);
    return cti::emb_fwd_idx(esize, w, (const int64_t *)idx, out, v, d, n, chk, st);
}

cudaError_t cti_nn_embedding_bwd_work(int64_t n, int64_t v, size_t *bytes) {
    cti::EmbWork w;
    cudaError_t e = cti::emb_work(n, v, &w);
    *bytes = w.total;
    return e;
}

cudaError_t cti_nn_embedding_bwd(int dt, int idx_i32, const void *g, const void *idx, void *out,
                                 int64_t v, int64_t d, int64_t n, int64_t pad, void *work,
                                 cti_nn_emb_check chk, cudaStream_t st) {
    if (idx_i32)
        CTI_NN_FLOAT_SWITCH(dt, (cti::emb_bwd_dt<DTV, int32_t>(g, (const int32_t *)idx, out, v, d, n,
                                                               pad, work, chk, st)))
    CTI_NN_FLOAT_SWITCH(dt, (cti::emb_bwd_dt<DTV, int64_t>(g, (const int64_t *)idx, out, v, d, n, pad,
                                                           work, chk, st)))
}

cudaError_t cti_nn_dropout(int dt, int bwd, const void *x, void *y, const uint8_t *mask_in,
                           uint8_t *mask_out, int64_t n, uint64_t seed, uint64_t first,
                           const uint64_t *state, double p, cudaStream_t st) {
    CTI_NN_FLOAT_SWITCH(dt, cti::drop_dt<DTV>(bwd, x, y, mask_in, mask_out, n, seed, first, state,
                                              p, st))
}

} // extern "C"
