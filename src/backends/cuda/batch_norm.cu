// BATCH_NORM and BATCH_NORM_BACKWARD (cti_batch_norm_params, schema.h): one
// block per channel walks the channel's N * S elements of the contiguous
// [N, C, S] tensors by flat position (Walk), so a short S (batch norm of
// [N, C]) still spreads over the block and neighbouring threads read
// neighbouring addresses within a row. The statistics are two-pass (the mean, then
// the squared deviations from it) and every sum is accumulated in double,
// whatever the dtype, then reduced across the block with warp shuffles; the
// backward sums dy and dy * xhat the same way and writes dx in a second
// pass (the fused backward: no intermediate tensor). f16/bf16 statistics
// are f32, as the CPU's.
#include "batch_norm_impl.h"
#include "kernels.cuh"

namespace cti {
namespace {

constexpr int kBnThreads = 512;

template <int DT> struct stat_t { typedef float S; };
template <> struct stat_t<CT_F64> { typedef double S; };

// The block's sum of v (every thread gets it). red holds kBnThreads / 32 doubles.
__device__ __forceinline__ double block_sum(double v, double *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads(); // red is reused by consecutive calls
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double s = 0;
    for (int k = 0; k < (int)(blockDim.x >> 5); k++) s += red[k];
    return s;
}

// A thread's walk over channel c's elements: flat positions tid, tid + blockDim,
// ... of the channel's N * S, as (n, s) advanced without a division per step.
struct Walk {
    int64_t n, s, dn, ds, S, rowstep, off; // off: (n * C + c) * S + s
    __device__ __forceinline__ Walk(int64_t c, int64_t C, int64_t S_) {
        S = S_;
        n = (int64_t)threadIdx.x / S;
        s = (int64_t)threadIdx.x - n * S;
        dn = (int64_t)blockDim.x / S;
        ds = (int64_t)blockDim.x - dn * S;
        rowstep = C * S;
        off = (n * C + c) * S + s;
    }
    __device__ __forceinline__ void next() {
        n += dn;
        s += ds;
        off += dn * rowstep + ds;
        if (s >= S) {
            s -= S;
            n++;
            off += rowstep - S;
        }
    }
};

template <int DT>
__global__ void __launch_bounds__(kBnThreads) bn_fwd(const cti_cuda_bn a) {
    typedef typename dtype<DT>::T T;
    typedef typename stat_t<DT>::S St;
    __shared__ double red[kBnThreads / 32];
    const int64_t c = blockIdx.x, M = a.N * a.S;
    const T *x = static_cast<const T *>(a.x);
    double mean, var;
    if (a.training) {
        double s = 0;
        for (Walk w(c, a.C, a.S); w.n < a.N; w.next()) s += (double)dtype<DT>::dec(x[w.off]);
        mean = block_sum(s, red) / (double)M;
        double q = 0;
        for (Walk w(c, a.C, a.S); w.n < a.N; w.next()) {
            const double d = (double)dtype<DT>::dec(x[w.off]) - mean;
            q += d * d;
        }
        var = block_sum(q, red) / (double)M;
        if (threadIdx.x == 0) {
            static_cast<St *>(a.mean_out)[c] = (St)mean;
            static_cast<St *>(a.var_out)[c] = (St)var;
        }
    } else {
        mean = (double)static_cast<const St *>(a.mean_in)[c];
        var = (double)static_cast<const St *>(a.var_in)[c];
    }
    const double w = a.w ? (double)dtype<DT>::dec(static_cast<const T *>(a.w)[c]) : 1.0;
    const double b = a.b ? (double)dtype<DT>::dec(static_cast<const T *>(a.b)[c]) : 0.0;
    const double scale = w / sqrt(var + a.eps), shift = b - mean * scale;
    typedef typename std::conditional<DT == CT_F64, double, float>::type C_;
    const C_ sc = (C_)scale, sh = (C_)shift;
    T *y = static_cast<T *>(a.y);
    for (Walk w(c, a.C, a.S); w.n < a.N; w.next())
        y[w.off] = dtype<DT>::enc((C_)dtype<DT>::dec(x[w.off]) * sc + sh);
}

template <int DT>
__global__ void __launch_bounds__(kBnThreads) bn_bwd(const cti_cuda_bn a) {
    typedef typename dtype<DT>::T T;
    typedef typename stat_t<DT>::S St;
    __shared__ double red[kBnThreads / 32];
    const int64_t c = blockIdx.x, M = a.N * a.S;
    const T *x = static_cast<const T *>(a.x), *dy = static_cast<const T *>(a.dy);
    const double mean = (double)static_cast<const St *>(a.mean_in)[c];
    const double invstd = 1.0 / sqrt((double)static_cast<const St *>(a.var_in)[c] + a.eps);
    double sg = 0, sgx = 0;
    for (Walk w(c, a.C, a.S); w.n < a.N; w.next()) {
        const double g = (double)dtype<DT>::dec(dy[w.off]);
        sg += g;
        sgx += g * ((double)dtype<DT>::dec(x[w.off]) - mean);
    }
    sg = block_sum(sg, red);
    sgx = block_sum(sgx, red) * invstd;
    if (threadIdx.x == 0) {
        if (a.dw) static_cast<T *>(a.dw)[c] = dtype<DT>::enc(sgx);
        if (a.db) static_cast<T *>(a.db)[c] = dtype<DT>::enc(sg);
    }
    if (!a.dx) return;
    const double w = a.w ? (double)dtype<DT>::dec(static_cast<const T *>(a.w)[c]) : 1.0;
    const double k = w * invstd;
    const double mg = a.training ? sg / (double)M : 0.0;
    const double mgx = a.training ? sgx / (double)M : 0.0;
    T *dx = static_cast<T *>(a.dx);
    for (Walk w(c, a.C, a.S); w.n < a.N; w.next()) {
        const double xh = ((double)dtype<DT>::dec(x[w.off]) - mean) * invstd;
        dx[w.off] = dtype<DT>::enc(k * ((double)dtype<DT>::dec(dy[w.off]) - mg - xh * mgx));
    }
}

template <int DT> cudaError_t launch(const cti_cuda_bn *a, cudaStream_t st, bool bwd) {
    // one block per channel; gridDim.x reaches 2^31 - 1
    if (a->C > 0x7fffffff) return cudaErrorInvalidConfiguration;
    const unsigned grid = (unsigned)a->C;
    int64_t m = a->N * a->S;
    const unsigned threads = m >= kBnThreads ? kBnThreads : m > 128 ? 256 : 128;
    if (bwd) bn_bwd<DT><<<grid, threads, 0, st>>>(*a);
    else bn_fwd<DT><<<grid, threads, 0, st>>>(*a);
    return cudaGetLastError();
}

cudaError_t dispatch(const cti_cuda_bn *a, cudaStream_t st, bool bwd) {
    if (a->C == 0) return cudaSuccess;
    switch (a->dt) {
    case CT_F32: return launch<CT_F32>(a, st, bwd);
    case CT_F64: return launch<CT_F64>(a, st, bwd);
    case CT_F16: return launch<CT_F16>(a, st, bwd);
    case CT_BF16: return launch<CT_BF16>(a, st, bwd);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace
} // namespace cti

extern "C" cudaError_t cti_cuda_batch_norm_forward(const cti_cuda_bn *a, cudaStream_t st,
                                                   const char **routine) {
    *routine = "cten_batch_norm_two_pass";
    return cti::dispatch(a, st, false);
}

extern "C" cudaError_t cti_cuda_batch_norm_backward(const cti_cuda_bn *a, cudaStream_t st,
                                                    const char **routine) {
    *routine = "cten_batch_norm_backward";
    return cti::dispatch(a, st, true);
}
