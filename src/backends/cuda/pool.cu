// 2-d pooling kernels: max (values and int64 argmax indices), average and
// adaptive average, forward and backward, with the CPU backend's window rules
// (src/backends/cpu/pool2d.c).
//
// Every kernel is a grid-stride loop with one thread per element it writes,
// in the written tensor's NCHW order, so neighbouring threads write
// neighbouring addresses. Inputs are read through their own strides (any
// layout, broadcast dims included). The forward kernels and the average
// backward ones gather (each element sums its own window, or the windows
// that cover it), so they need no atomics and give the same bits on every
// run; the max backward only has the indices, so it scatters with atomic
// adds, into the output itself for float32/float64 and into a float32
// buffer for the half types. f16/bf16/f32 accumulate in float32, f64 in
// float64. Indexing is 32-bit when every offset fits, else 64-bit.
#include <string.h>

#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

// The geometry pool.c passes, from the call's cti_pool_params (ops_impl.h).
struct PoolGeo {
    int64_t N, C, H, W, kh, kw, sh, sw, ph, pw, dh, dw, OH, OW, count_include_pad;
};

struct Strides {
    int64_t n, c, h, w;
};

template <int DT> struct acc_t { typedef float A; };
template <> struct acc_t<CT_F64> { typedef double A; };

__device__ __forceinline__ bool is_nan(float v) { return v != v; }
__device__ __forceinline__ bool is_nan(double v) { return v != v; }

// Splits linear index i of an [N, C, A, B] row-major walk into (plane, a, b),
// plane = n * C + c.
template <class I>
__device__ __forceinline__ void split(I i, I A, I B, I &plane, I &a, I &b) {
    b = i % B;
    I q = i / B;
    a = q % A;
    plane = q / A;
}

template <class I>
__device__ __forceinline__ int64_t plane_off(I plane, int64_t C, const Strides &s) {
    int64_t p = (int64_t)plane;
    return (p / C) * s.n + (p % C) * s.c;
}

// ---- max pooling --------------------------------------------------------------------------

template <int DT, class I>
__global__ void __launch_bounds__(kThreads)
max_fwd(const typename dtype<DT>::T *__restrict__ x, Strides xs, typename dtype<DT>::T *__restrict__ y,
        int64_t *__restrict__ idx, PoolGeo g) {
    typedef typename acc_t<DT>::A A;
    const I n = (I)(g.N * g.C * g.OH * g.OW), step = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I plane, oh, ow;
        split<I>(i, (I)g.OH, (I)g.OW, plane, oh, ow);
        const typename dtype<DT>::T *src = x + plane_off<I>(plane, g.C, xs);
        int64_t hs = (int64_t)oh * g.sh - g.ph, he = hs + (g.kh - 1) * g.dh + 1;
        if (he > g.H) he = g.H;
        if (hs < 0) hs += (-hs + g.dh - 1) / g.dh * g.dh; // first tap inside the input
        int64_t ws = (int64_t)ow * g.sw - g.pw, we = ws + (g.kw - 1) * g.dw + 1;
        if (we > g.W) we = g.W;
        if (ws < 0) ws += (-ws + g.dw - 1) / g.dw * g.dw;
        // A dilated window can miss the input entirely: -inf and index -1,
        // whose gradient the backward drops.
        A best = (A)-INFINITY;
        int64_t bi = hs < he && ws < we ? hs * g.W + ws : -1;
        for (int64_t h = hs; h < he; h += g.dh) {
            const typename dtype<DT>::T *row = src + h * xs.h;
            for (int64_t w = ws; w < we; w += g.dw) {
                A v = (A)dtype<DT>::dec(row[w * xs.w]);
                // the first maximum wins; NaN propagates (the CPU's rule)
                if (v > best || is_nan(v)) {
                    best = v;
                    bi = h * g.W + w;
                }
            }
        }
        y[i] = dtype<DT>::enc(best);
        idx[i] = bi;
    }
}

__device__ __forceinline__ void atomic_add(float *p, float v) { atomicAdd(p, v); }
__device__ __forceinline__ void atomic_add(double *p, double v) { atomicAdd(p, v); }

// acc is the zeroed [N, C, H, W] destination (the output, or a float32
// buffer for the half types). Indices outside the plane (other than the -1
// of an empty window) cannot come from ct_max_pool2d; they are skipped so a
// bad one never writes outside the buffer.
template <int DT, class I>
__global__ void __launch_bounds__(kThreads)
max_bwd(const typename dtype<DT>::T *__restrict__ dy, Strides ds, const int64_t *__restrict__ idx,
        Strides is, typename acc_t<DT>::A *__restrict__ acc, PoolGeo g) {
    const I n = (I)(g.N * g.C * g.OH * g.OW), step = (I)gridDim.x * (I)blockDim.x;
    const int64_t hw = g.H * g.W;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I plane, oh, ow;
        split<I>(i, (I)g.OH, (I)g.OW, plane, oh, ow);
        int64_t k = idx[plane_off<I>(plane, g.C, is) + (int64_t)oh * is.h + (int64_t)ow * is.w];
        if (k < 0 || k >= hw) continue;
        typename acc_t<DT>::A v = (typename acc_t<DT>::A)dtype<DT>::dec(
            dy[plane_off<I>(plane, g.C, ds) + (int64_t)oh * ds.h + (int64_t)ow * ds.w]);
        atomic_add(acc + (int64_t)plane * hw + k, v);
    }
}

// ---- average pooling ----------------------------------------------------------------------

// The window of output (oh, ow) clipped to the input and its divisor
// (count_include_pad: the window clipped to the padded input).
struct Window {
    int64_t hs, he, ws, we, div;
};

__device__ __forceinline__ Window avg_window(const PoolGeo &g, int64_t oh, int64_t ow) {
    Window r;
    int64_t h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
    int64_t h1 = h0 + g.kh, w1 = w0 + g.kw;
    if (h1 > g.H + g.ph) h1 = g.H + g.ph;
    if (w1 > g.W + g.pw) w1 = g.W + g.pw;
    int64_t pool_size = (h1 - h0) * (w1 - w0);
    if (h0 < 0) h0 = 0;
    if (w0 < 0) w0 = 0;
    if (h1 > g.H) h1 = g.H;
    if (w1 > g.W) w1 = g.W;
    r.hs = h0;
    r.he = h1;
    r.ws = w0;
    r.we = w1;
    r.div = g.count_include_pad ? pool_size : (h1 - h0) * (w1 - w0);
    return r;
}

// PyTorch's adaptive window along one dim: [floor(i*in/out), ceil((i+1)*in/out)).
__device__ __forceinline__ int64_t ad_start(int64_t i, int64_t in, int64_t out) {
    return i * in / out;
}
__device__ __forceinline__ int64_t ad_end(int64_t i, int64_t in, int64_t out) {
    return ((i + 1) * in + out - 1) / out;
}

template <bool ADAPTIVE>
__device__ __forceinline__ Window window_of(const PoolGeo &g, int64_t oh, int64_t ow) {
    if constexpr (ADAPTIVE) {
        Window r;
        r.hs = ad_start(oh, g.H, g.OH);
        r.he = ad_end(oh, g.H, g.OH);
        r.ws = ad_start(ow, g.W, g.OW);
        r.we = ad_end(ow, g.W, g.OW);
        r.div = (r.he - r.hs) * (r.we - r.ws);
        return r;
    } else {
        return avg_window(g, oh, ow);
    }
}

// Adaptive max pooling: the largest x of the adaptive window (the first
// maximum wins, NaN propagates) and its index h * W + w in the plane, which
// max_bwd scatters into as for max_pool2d. Adaptive windows are never empty.
template <int DT, class I>
__global__ void __launch_bounds__(kThreads)
ada_max_fwd(const typename dtype<DT>::T *__restrict__ x, Strides xs,
            typename dtype<DT>::T *__restrict__ y, int64_t *__restrict__ idx, PoolGeo g) {
    typedef typename acc_t<DT>::A A;
    const I n = (I)(g.N * g.C * g.OH * g.OW), step = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I plane, oh, ow;
        split<I>(i, (I)g.OH, (I)g.OW, plane, oh, ow);
        const typename dtype<DT>::T *src = x + plane_off<I>(plane, g.C, xs);
        Window r = window_of<true>(g, (int64_t)oh, (int64_t)ow);
        A best = (A)-INFINITY;
        int64_t bi = r.hs * g.W + r.ws;
        for (int64_t h = r.hs; h < r.he; h++) {
            const typename dtype<DT>::T *row = src + h * xs.h;
            for (int64_t w = r.ws; w < r.we; w++) {
                A v = (A)dtype<DT>::dec(row[w * xs.w]);
                if (v > best || is_nan(v)) {
                    best = v;
                    bi = h * g.W + w;
                }
            }
        }
        y[i] = dtype<DT>::enc(best);
        idx[i] = bi;
    }
}

template <int DT, class I, bool ADAPTIVE>
__global__ void __launch_bounds__(kThreads)
avg_fwd(const typename dtype<DT>::T *__restrict__ x, Strides xs, typename dtype<DT>::T *__restrict__ y,
        PoolGeo g) {
    typedef typename acc_t<DT>::A A;
    const I n = (I)(g.N * g.C * g.OH * g.OW), step = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I plane, oh, ow;
        split<I>(i, (I)g.OH, (I)g.OW, plane, oh, ow);
        const typename dtype<DT>::T *src = x + plane_off<I>(plane, g.C, xs);
        Window r = window_of<ADAPTIVE>(g, (int64_t)oh, (int64_t)ow);
        A s = 0;
        for (int64_t h = r.hs; h < r.he; h++) {
            const typename dtype<DT>::T *row = src + h * xs.h;
            for (int64_t w = r.ws; w < r.we; w++) s += (A)dtype<DT>::dec(row[w * xs.w]);
        }
        y[i] = dtype<DT>::enc(r.hs < r.he && r.ws < r.we ? s / (A)r.div : (A)0);
    }
}

// Output rows whose window covers input row h: [lo, hi).
__device__ __forceinline__ void covering(int64_t h, int64_t k, int64_t s, int64_t p, int64_t out,
                                         int64_t &lo, int64_t &hi) {
    lo = h + p < k ? 0 : (h + p - k) / s + 1;
    hi = (h + p) / s + 1;
    if (hi > out) hi = out;
}

template <int DT, class I, bool ADAPTIVE>
__global__ void __launch_bounds__(kThreads)
avg_bwd(const typename dtype<DT>::T *__restrict__ dy, Strides ds, typename dtype<DT>::T *__restrict__ dx,
        PoolGeo g) {
    typedef typename acc_t<DT>::A A;
    const I n = (I)(g.N * g.C * g.H * g.W), step = (I)gridDim.x * (I)blockDim.x;
    for (I i = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; i < n; i += step) {
        I plane, hh, ww;
        split<I>(i, (I)g.H, (I)g.W, plane, hh, ww);
        const int64_t h = (int64_t)hh, w = (int64_t)ww;
        const typename dtype<DT>::T *src = dy + plane_off<I>(plane, g.C, ds);
        int64_t oh0, oh1, ow0, ow1;
        if constexpr (ADAPTIVE) {
            oh0 = h * g.OH / g.H;
            oh1 = ((h + 1) * g.OH + g.H - 1) / g.H;
            ow0 = w * g.OW / g.W;
            ow1 = ((w + 1) * g.OW + g.W - 1) / g.W;
            if (oh1 > g.OH) oh1 = g.OH;
            if (ow1 > g.OW) ow1 = g.OW;
        } else {
            covering(h, g.kh, g.sh, g.ph, g.OH, oh0, oh1);
            covering(w, g.kw, g.sw, g.pw, g.OW, ow0, ow1);
        }
        A s = 0;
        for (int64_t oh = oh0; oh < oh1; oh++)
            for (int64_t ow = ow0; ow < ow1; ow++) {
                Window r = window_of<ADAPTIVE>(g, oh, ow);
                // the ranges above are exact; the test keeps a wrong bound harmless
                if (h < r.hs || h >= r.he || w < r.ws || w >= r.we) continue;
                s += (A)dtype<DT>::dec(src[oh * ds.h + ow * ds.w]) / (A)r.div;
            }
        dx[i] = dtype<DT>::enc(s);
    }
}

// ---- launching ----------------------------------------------------------------------------


struct Args {
    int kind;
    PoolGeo g;
    const void *in;
    Strides is;
    const int64_t *idx;
    Strides xs; // indices' strides (max backward)
    void *out;
    int64_t *out_idx;
    void *acc;
    int64_t n;   // threads' elements
    bool use32;  // every offset fits in 31 bits
    unsigned grid;
};

template <int DT, class I> cudaError_t launch_typed(const Args &a, cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    typedef typename acc_t<DT>::A A;
    switch (a.kind) {
    case CTI_POOL_MAX_FWD:
        max_fwd<DT, I><<<a.grid, kThreads, 0, st>>>((const T *)a.in, a.is, (T *)a.out, a.out_idx,
                                                    a.g);
        break;
    case CTI_POOL_MAX_BWD:
        max_bwd<DT, I><<<a.grid, kThreads, 0, st>>>((const T *)a.in, a.is, a.idx, a.xs, (A *)a.acc,
                                                    a.g);
        break;
    case CTI_POOL_AVG_FWD:
        avg_fwd<DT, I, false><<<a.grid, kThreads, 0, st>>>((const T *)a.in, a.is, (T *)a.out, a.g);
        break;
    case CTI_POOL_AVG_BWD:
        avg_bwd<DT, I, false><<<a.grid, kThreads, 0, st>>>((const T *)a.in, a.is, (T *)a.out, a.g);
        break;
    case CTI_POOL_ADA_FWD:
        avg_fwd<DT, I, true><<<a.grid, kThreads, 0, st>>>((const T *)a.in, a.is, (T *)a.out, a.g);
        break;
    case CTI_POOL_ADA_MAX_FWD:
        ada_max_fwd<DT, I><<<a.grid, kThreads, 0, st>>>((const T *)a.in, a.is, (T *)a.out,
                                                        a.out_idx, a.g);
        break;
    default:
        avg_bwd<DT, I, true><<<a.grid, kThreads, 0, st>>>((const T *)a.in, a.is, (T *)a.out, a.g);
        break;
    }
    return cudaGetLastError();
}

template <int DT> cudaError_t launch_dt(const Args &a, cudaStream_t st) {
    return a.use32 ? launch_typed<DT, uint32_t>(a, st) : launch_typed<DT, int64_t>(a, st);
}

// Largest element offset a strided [N, C, A, B] operand reaches, plus one.
int64_t extent(const Strides &s, int64_t N, int64_t C, int64_t A, int64_t B) {
    int64_t e = 1;
    e += (N - 1) * (s.n < 0 ? -s.n : s.n);
    e += (C - 1) * (s.c < 0 ? -s.c : s.c);
    e += (A - 1) * (s.h < 0 ? -s.h : s.h);
    e += (B - 1) * (s.w < 0 ? -s.w : s.w);
    return e;
}

} // namespace
} // namespace cti

extern "C" {

// Arguments: ops_impl.h.
cudaError_t cti_cuda_pool2d(int kind, ct_dtype dt, const int64_t *geo, const void *in,
                            const int64_t *in_st, const int64_t *idx, const int64_t *idx_st,
                            void *out, int64_t *out_idx, void *acc, int sm_count,
                            cudaStream_t stream, const char **routine) {
    using namespace cti;
    Args a;
    memset(&a, 0, sizeof a);
    a.kind = kind;
    memcpy(&a.g, geo, sizeof a.g);
    a.in = in;
    a.is = Strides{in_st[0], in_st[1], in_st[2], in_st[3]};
    if (idx_st) a.xs = Strides{idx_st[0], idx_st[1], idx_st[2], idx_st[3]};
    a.idx = idx;
    a.out = out;
    a.out_idx = out_idx;
    a.acc = acc;
    const PoolGeo &g = a.g;
    bool fwd = kind == CTI_POOL_MAX_FWD || kind == CTI_POOL_AVG_FWD || kind == CTI_POOL_ADA_FWD ||
               kind == CTI_POOL_ADA_MAX_FWD;
    int64_t in_h = fwd ? g.H : g.OH, in_w = fwd ? g.W : g.OW;
    a.n = g.N * g.C * (fwd || kind == CTI_POOL_MAX_BWD ? g.OH * g.OW : g.H * g.W);
    int64_t reach = extent(a.is, g.N, g.C, in_h, in_w);
    if (kind == CTI_POOL_MAX_BWD && extent(a.xs, g.N, g.C, g.OH, g.OW) > reach)
        reach = extent(a.xs, g.N, g.C, g.OH, g.OW);
    int64_t outs = g.N * g.C * (g.H * g.W > g.OH * g.OW ? g.H * g.W : g.OH * g.OW);
    // 32-bit loop indices when every linear index (plus one grid stride) fits
    int64_t lim = (int64_t)1 << 31;
    a.use32 = a.n + (int64_t)sm_count * 32 * kThreads < lim && reach < lim && outs < lim;
    a.grid = grid_for(a.n, sm_count);
    static const char *const names[] = {"cuda_max_pool2d",  "cuda_max_pool2d_backward_scatter",
                                        "cuda_avg_pool2d",  "cuda_avg_pool2d_backward_gather",
                                        "cuda_adaptive_avg_pool2d",
                                        "cuda_adaptive_avg_pool2d_backward_gather",
                                        "cuda_adaptive_max_pool2d"};
    *routine = names[kind < 0 || kind > 6 ? 0 : kind];
    if (a.n == 0) return cudaSuccess;
    switch (dt) {
    case CT_F32: return launch_dt<CT_F32>(a, stream);
    case CT_F64: return launch_dt<CT_F64>(a, stream);
    case CT_F16: return launch_dt<CT_F16>(a, stream);
    case CT_BF16: return launch_dt<CT_BF16>(a, stream);
    default: return cudaErrorInvalidValue;
    }
}

} // extern "C"
