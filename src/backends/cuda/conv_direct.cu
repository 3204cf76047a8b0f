// Direct convolution kernels for small problems, and the bias gradient.
//
// cuDNN's convolution calls cost 20-35 us of host time each, more than the
// whole kernel of a small layer: a batch-64 Fashion-MNIST CNN step makes
// five of them and spends half its time inside cuDNN on the host. Below a
// work limit (conv.c decides) the forward (bias fused) and the input
// gradient run here instead, one thread per output element, any operand
// strides. The weight gradient stays with cuDNN: a sum over the whole batch
// per element needs cuDNN's blocking to run fast. The bias gradient is one
// block per channel for every size. Sums run in a fixed order, so results
// repeat from run to run; f16/bf16 accumulate in float and round once, f64
// accumulates in double.
#include <cstring>

#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

struct Geo {
    int64_t N, C, H, W, Co, kh, kw, sh, sw, ph, pw, dh, dw, G, OH, OW;
};
struct St {
    int64_t n, c, h, w;
};

template <int DT> using acc_t = typename std::conditional<DT == CT_F64, double, float>::type;

constexpr int kReduceThreads = 512;

// Sum of v over the block, in a fixed order; the result is valid in thread 0.
template <class A> __device__ __forceinline__ A block_sum(A v) {
    __shared__ A warp_sums[kReduceThreads / 32];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    if (lane == 0) warp_sums[wid] = v;
    __syncthreads();
    A s = 0;
    if (threadIdx.x == 0)
        for (int k = 0; k < (int)(blockDim.x >> 5); k++) s += warp_sums[k];
    return s;
}

// 32-bit geometry and strides: conv.c sends only convolutions whose every
// index and offset fits (a small problem), and 64-bit division would cost
// more than the arithmetic it indexes.
struct Geo32 {
    int N, C, H, W, Co, kh, kw, sh, sw, ph, pw, dh, dw, G, OH, OW;
};
struct St32 {
    int n, c, h, w;
};

// The NCHW coordinates of linear index i over [*, C, H, W].
__device__ __forceinline__ void unravel(unsigned i, int C, int H, int W, int &n, int &c, int &h,
                                        int &w) {
    w = (int)(i % (unsigned)W);
    i /= (unsigned)W;
    h = (int)(i % (unsigned)H);
    i /= (unsigned)H;
    c = (int)(i % (unsigned)C);
    n = (int)(i / (unsigned)C);
}

// y[n, co, oh, ow] = bias[co] + sum over the group's channels and the taps.
template <int DT>
__global__ void __launch_bounds__(kThreads)
    conv_fwd(Geo32 g, const void *xv, St32 xs, const void *wv, St32 ws, const void *bv, int bs,
             void *yv) {
    typedef typename dtype<DT>::T T;
    typedef acc_t<DT> A;
    const T *x = static_cast<const T *>(xv), *w = static_cast<const T *>(wv);
    const T *b = static_cast<const T *>(bv);
    T *y = static_cast<T *>(yv);
    const unsigned total = (unsigned)g.N * g.Co * g.OH * g.OW;
    const int cg = g.C / g.G, cog = g.Co / g.G;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        int n, co, oh, ow;
        unravel(i, g.Co, g.OH, g.OW, n, co, oh, ow);
        const int h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        const T *xp = x + n * xs.n + (co / cog) * cg * xs.c, *wp = w + co * ws.n;
        A acc = b ? (A)dtype<DT>::dec(b[co * bs]) : (A)0;
        for (int ci = 0; ci < cg; ci++, xp += xs.c, wp += ws.c)
            for (int ki = 0; ki < g.kh; ki++) {
                const int ih = h0 + ki * g.dh;
                if ((unsigned)ih >= (unsigned)g.H) continue;
                for (int kj = 0; kj < g.kw; kj++) {
                    const int iw = w0 + kj * g.dw;
                    if ((unsigned)iw >= (unsigned)g.W) continue;
                    acc += (A)dtype<DT>::dec(xp[ih * xs.h + iw * xs.w]) *
                           (A)dtype<DT>::dec(wp[ki * ws.h + kj * ws.w]);
                }
            }
        y[i] = dtype<DT>::template enc<A>(acc);
    }
}

// dx[n, c, ih, iw] = sum over the group's output channels and the taps that
// reach (ih, iw). UNIT: both strides 1, so no tap needs a divisibility test.
template <int DT, bool UNIT>
__global__ void __launch_bounds__(kThreads)
    conv_bwd_data(Geo32 g, const void *dyv, St32 ds, const void *wv, St32 ws, void *dxv) {
    typedef typename dtype<DT>::T T;
    typedef acc_t<DT> A;
    const T *dy = static_cast<const T *>(dyv), *w = static_cast<const T *>(wv);
    T *dx = static_cast<T *>(dxv);
    const unsigned total = (unsigned)g.N * g.C * g.H * g.W;
    const int cg = g.C / g.G, cog = g.Co / g.G;
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += gridDim.x * blockDim.x) {
        int n, c, ih, iw;
        unravel(i, g.C, g.H, g.W, n, c, ih, iw);
        const int grp = c / cg, ci = c - grp * cg;
        const T *dp = dy + n * ds.n + grp * cog * ds.c, *wp = w + grp * cog * ws.n + ci * ws.c;
        A acc = 0;
        for (int k = 0; k < cog; k++, dp += ds.c, wp += ws.n)
            for (int ki = 0; ki < g.kh; ki++) {
                int oh = ih + g.ph - ki * g.dh;
                if (oh < 0) continue;
                if constexpr (!UNIT) {
                    if (oh % g.sh) continue;
                    oh /= g.sh;
                }
                if (oh >= g.OH) continue;
                for (int kj = 0; kj < g.kw; kj++) {
                    int ow = iw + g.pw - kj * g.dw;
                    if (ow < 0) continue;
                    if constexpr (!UNIT) {
                        if (ow % g.sw) continue;
                        ow /= g.sw;
                    }
                    if (ow >= g.OW) continue;
                    acc += (A)dtype<DT>::dec(dp[oh * ds.h + ow * ds.w]) *
                           (A)dtype<DT>::dec(wp[ki * ws.h + kj * ws.w]);
                }
            }
        dx[i] = dtype<DT>::template enc<A>(acc);
    }
}

// One block per channel: db[co] = sum over n, oh, ow of dy. Each thread
// takes positions of the plane and runs down the batch, so the loop body
// has no division.
template <int DT>
__global__ void __launch_bounds__(kReduceThreads)
    conv_bwd_bias(Geo g, const void *dyv, St ds, void *dbv) {
    typedef typename dtype<DT>::T T;
    typedef acc_t<DT> A;
    const T *dy = static_cast<const T *>(dyv);
    const int64_t plane = g.OH * g.OW;
    for (int64_t co = blockIdx.x; co < g.Co; co += gridDim.x) {
        A acc = 0;
        for (int64_t p = threadIdx.x; p < plane; p += blockDim.x) {
            const int64_t oh = p / g.OW, ow = p - oh * g.OW;
            const T *q = dy + co * ds.c + oh * ds.h + ow * ds.w;
#pragma unroll 4
            for (int64_t n = 0; n < g.N; n++) acc += (A)dtype<DT>::dec(q[n * ds.n]);
        }
        acc = block_sum(acc);
        if (threadIdx.x == 0) static_cast<T *>(dbv)[co] = dtype<DT>::template enc<A>(acc);
        __syncthreads(); // warp_sums is reused by the next channel
    }
}

St st_of(const int64_t *s) { return St{s[0], s[1], s[2], s[3]}; }

unsigned blocks_for(int64_t items, int sm_count) {
    int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 32;
    return (unsigned)(items < 1 ? 1 : items < cap ? items : cap);
}

St32 st32_of(const int64_t *s) { return St32{(int)s[0], (int)s[1], (int)s[2], (int)s[3]}; }

Geo32 geo32_of(const Geo &g) {
    return Geo32{(int)g.N,  (int)g.C,  (int)g.H,  (int)g.W,  (int)g.Co, (int)g.kh,
                 (int)g.kw, (int)g.sh, (int)g.sw, (int)g.ph, (int)g.pw, (int)g.dh,
                 (int)g.dw, (int)g.G,  (int)g.OH, (int)g.OW};
}

template <int DT>
cudaError_t launch(int kind, const Geo &g, const void *const *p, const int64_t *const *st,
                   int64_t bias_stride, int sm_count, cudaStream_t stream) {
    const Geo32 g32 = geo32_of(g);
    switch (kind) {
    case CTI_CONV_DIRECT_FWD:
        conv_fwd<DT><<<grid_for(g.N * g.Co * g.OH * g.OW, sm_count), kThreads, 0, stream>>>(
            g32, p[0], st32_of(st[0]), p[1], st32_of(st[1]), p[3], (int)bias_stride,
            const_cast<void *>(p[2]));
        break;
    case CTI_CONV_DIRECT_BWD_DATA:
        if (g.sh == 1 && g.sw == 1)
            conv_bwd_data<DT, true>
                <<<grid_for(g.N * g.C * g.H * g.W, sm_count), kThreads, 0, stream>>>(
                    g32, p[2], st32_of(st[2]), p[1], st32_of(st[1]), const_cast<void *>(p[0]));
        else
            conv_bwd_data<DT, false>
                <<<grid_for(g.N * g.C * g.H * g.W, sm_count), kThreads, 0, stream>>>(
                    g32, p[2], st32_of(st[2]), p[1], st32_of(st[1]), const_cast<void *>(p[0]));
        break;
    case CTI_CONV_DIRECT_BWD_BIAS:
        conv_bwd_bias<DT><<<blocks_for(g.Co, sm_count), kReduceThreads, 0, stream>>>(
            g, p[2], st_of(st[2]), const_cast<void *>(p[3]));
        break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

} // namespace
} // namespace cti

extern "C" {

// Arguments: ops_impl.h.
cudaError_t cti_cuda_conv_direct(int kind, ct_dtype dt, const int64_t *geo,
                                 const void *const *ptr, const int64_t *const *strides,
                                 int64_t bias_stride, int sm_count, cudaStream_t stream) {
    using namespace cti;
    Geo g;
    memcpy(&g, geo, sizeof g);
    switch (dt) {
    case CT_F32: return launch<CT_F32>(kind, g, ptr, strides, bias_stride, sm_count, stream);
    case CT_F64: return launch<CT_F64>(kind, g, ptr, strides, bias_stride, sm_count, stream);
    case CT_F16: return launch<CT_F16>(kind, g, ptr, strides, bias_stride, sm_count, stream);
    case CT_BF16: return launch<CT_BF16>(kind, g, ptr, strides, bias_stride, sm_count, stream);
    default: return cudaErrorInvalidValue;
    }
}

} // extern "C"
