// Direct convolution kernels for small problems, and the bias gradient.
//
// cuDNN's convolution calls cost 20-35 us of host time each, more than the
// whole kernel of a small layer: a batch-64 Fashion-MNIST CNN step makes
// five of them and spends half its time inside cuDNN on the host. Below a
// work limit (conv.c decides) these kernels run instead: one thread per
// output element for the forward (bias fused) and the input gradient, one
// block per weight element for the weight gradient, any operand strides. The
// sums run in a fixed order, so results repeat from run to run. f16/bf16
// accumulate in float and round once; f64 accumulates in double.
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

constexpr int kReduceThreads = 256;

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

// y[n, co, oh, ow] = bias[co] + sum over the group's channels and the taps.
template <int DT>
__global__ void __launch_bounds__(kThreads)
    conv_fwd(Geo g, const void *xv, St xs, const void *wv, St ws, const void *bv, int64_t bs,
             void *yv) {
    typedef typename dtype<DT>::T T;
    typedef acc_t<DT> A;
    const T *x = static_cast<const T *>(xv), *w = static_cast<const T *>(wv);
    const T *b = static_cast<const T *>(bv);
    T *y = static_cast<T *>(yv);
    const int64_t total = g.N * g.Co * g.OH * g.OW, cg = g.C / g.G, cog = g.Co / g.G;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i;
        const int64_t ow = t % g.OW;
        t /= g.OW;
        const int64_t oh = t % g.OH;
        t /= g.OH;
        const int64_t co = t % g.Co, n = t / g.Co;
        const int64_t c0 = co / cog * cg, h0 = oh * g.sh - g.ph, w0 = ow * g.sw - g.pw;
        A acc = b ? (A)dtype<DT>::dec(b[co * bs]) : (A)0;
        for (int64_t ci = 0; ci < cg; ci++) {
            const T *xp = x + n * xs.n + (c0 + ci) * xs.c, *wp = w + co * ws.n + ci * ws.c;
            for (int64_t ki = 0; ki < g.kh; ki++) {
                const int64_t ih = h0 + ki * g.dh;
                if (ih < 0 || ih >= g.H) continue;
                for (int64_t kj = 0; kj < g.kw; kj++) {
                    const int64_t iw = w0 + kj * g.dw;
                    if (iw < 0 || iw >= g.W) continue;
                    acc += (A)dtype<DT>::dec(xp[ih * xs.h + iw * xs.w]) *
                           (A)dtype<DT>::dec(wp[ki * ws.h + kj * ws.w]);
                }
            }
        }
        y[i] = dtype<DT>::template enc<A>(acc);
    }
}

// dx[n, c, ih, iw] = sum over the group's output channels and the taps that
// reach (ih, iw).
template <int DT>
__global__ void __launch_bounds__(kThreads)
    conv_bwd_data(Geo g, const void *dyv, St ds, const void *wv, St ws, void *dxv) {
    typedef typename dtype<DT>::T T;
    typedef acc_t<DT> A;
    const T *dy = static_cast<const T *>(dyv), *w = static_cast<const T *>(wv);
    T *dx = static_cast<T *>(dxv);
    const int64_t total = g.N * g.C * g.H * g.W, cg = g.C / g.G, cog = g.Co / g.G;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total;
         i += (int64_t)gridDim.x * blockDim.x) {
        int64_t t = i;
        const int64_t iw = t % g.W;
        t /= g.W;
        const int64_t ih = t % g.H;
        t /= g.H;
        const int64_t c = t % g.C, n = t / g.C;
        const int64_t grp = c / cg, ci = c - grp * cg;
        A acc = 0;
        for (int64_t k = 0; k < cog; k++) {
            const int64_t co = grp * cog + k;
            const T *dp = dy + n * ds.n + co * ds.c, *wp = w + co * ws.n + ci * ws.c;
            for (int64_t ki = 0; ki < g.kh; ki++) {
                const int64_t th = ih + g.ph - ki * g.dh;
                if (th < 0 || th % g.sh) continue;
                const int64_t oh = th / g.sh;
                if (oh >= g.OH) continue;
                for (int64_t kj = 0; kj < g.kw; kj++) {
                    const int64_t tw = iw + g.pw - kj * g.dw;
                    if (tw < 0 || tw % g.sw) continue;
                    const int64_t ow = tw / g.sw;
                    if (ow >= g.OW) continue;
                    acc += (A)dtype<DT>::dec(dp[oh * ds.h + ow * ds.w]) *
                           (A)dtype<DT>::dec(wp[ki * ws.h + kj * ws.w]);
                }
            }
        }
        dx[i] = dtype<DT>::template enc<A>(acc);
    }
}

// One block per weight element: dw[co, ci, ki, kj] = sum over n, oh, ow of
// dy[n, co, oh, ow] * x[n, c, oh*sh - ph + ki*dh, ow*sw - pw + kj*dw].
template <int DT>
__global__ void __launch_bounds__(kReduceThreads)
    conv_bwd_filter(Geo g, const void *dyv, St ds, const void *xv, St xs, void *dwv) {
    typedef typename dtype<DT>::T T;
    typedef acc_t<DT> A;
    const T *dy = static_cast<const T *>(dyv), *x = static_cast<const T *>(xv);
    const int64_t cg = g.C / g.G, cog = g.Co / g.G, per = g.N * g.OH * g.OW;
    const int64_t nw = g.Co * cg * g.kh * g.kw;
    for (int64_t e = blockIdx.x; e < nw; e += gridDim.x) {
        int64_t t = e;
        const int64_t kj = t % g.kw;
        t /= g.kw;
        const int64_t ki = t % g.kh;
        t /= g.kh;
        const int64_t ci = t % cg, co = t / cg;
        const int64_t c = co / cog * cg + ci;
        A acc = 0;
        for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
            const int64_t ow = j % g.OW, r = j / g.OW, oh = r % g.OH, n = r / g.OH;
            const int64_t ih = oh * g.sh - g.ph + ki * g.dh, iw = ow * g.sw - g.pw + kj * g.dw;
            if (ih < 0 || ih >= g.H || iw < 0 || iw >= g.W) continue;
            acc += (A)dtype<DT>::dec(dy[n * ds.n + co * ds.c + oh * ds.h + ow * ds.w]) *
                   (A)dtype<DT>::dec(x[n * xs.n + c * xs.c + ih * xs.h + iw * xs.w]);
        }
        acc = block_sum(acc);
        if (threadIdx.x == 0) static_cast<T *>(dwv)[e] = dtype<DT>::template enc<A>(acc);
        __syncthreads(); // warp_sums is reused by the next element
    }
}

// One block per channel: db[co] = sum over n, oh, ow of dy.
template <int DT>
__global__ void __launch_bounds__(kReduceThreads)
    conv_bwd_bias(Geo g, const void *dyv, St ds, void *dbv) {
    typedef typename dtype<DT>::T T;
    typedef acc_t<DT> A;
    const T *dy = static_cast<const T *>(dyv);
    const int64_t per = g.N * g.OH * g.OW;
    for (int64_t co = blockIdx.x; co < g.Co; co += gridDim.x) {
        A acc = 0;
        for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
            const int64_t ow = j % g.OW, r = j / g.OW, oh = r % g.OH, n = r / g.OH;
            acc += (A)dtype<DT>::dec(dy[n * ds.n + co * ds.c + oh * ds.h + ow * ds.w]);
        }
        acc = block_sum(acc);
        if (threadIdx.x == 0) static_cast<T *>(dbv)[co] = dtype<DT>::template enc<A>(acc);
        __syncthreads();
    }
}

St st_of(const int64_t *s) { return St{s[0], s[1], s[2], s[3]}; }

unsigned blocks_for(int64_t items, int sm_count) {
    int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 32;
    return (unsigned)(items < 1 ? 1 : items < cap ? items : cap);
}

template <int DT>
cudaError_t launch(int kind, const Geo &g, const void *const *p, const int64_t *const *st,
                   int64_t bias_stride, int sm_count, cudaStream_t stream) {
    switch (kind) {
    case CTI_CONV_DIRECT_FWD:
        conv_fwd<DT><<<grid_for(g.N * g.Co * g.OH * g.OW, sm_count), kThreads, 0, stream>>>(
            g, p[0], st_of(st[0]), p[1], st_of(st[1]), p[3], bias_stride, const_cast<void *>(p[2]));
        break;
    case CTI_CONV_DIRECT_BWD_DATA:
        conv_bwd_data<DT><<<grid_for(g.N * g.C * g.H * g.W, sm_count), kThreads, 0, stream>>>(
            g, p[2], st_of(st[2]), p[1], st_of(st[1]), const_cast<void *>(p[0]));
        break;
    case CTI_CONV_DIRECT_BWD_FILTER:
        conv_bwd_filter<DT>
            <<<blocks_for(g.Co * (g.C / g.G) * g.kh * g.kw, sm_count), kReduceThreads, 0,
               stream>>>(g, p[2], st_of(st[2]), p[0], st_of(st[0]), const_cast<void *>(p[1]));
        break;
    default:
        conv_bwd_bias<DT><<<blocks_for(g.Co, sm_count), kReduceThreads, 0, stream>>>(
            g, p[2], st_of(st[2]), const_cast<void *>(p[3]));
        break;
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
