// CROSS_ENTROPY_FUSED on CUDA: one block per row of the logits [rows, C],
// the math of the CPU kernel (src/backends/cpu/linear_ce.c):
//   loss = lse - (1 - ls) z_t - ls / C * sum(z)
//   grad = scale * s_row * (softmax(z) - (1 - ls) [j == t] - ls / C), over z
// in f32 for f32/f16/bf16 and f64 for f64. A first pass over the row folds
// an online max and sum of exponentials (and the sum of z for label
// smoothing); the second writes the gradient over the row. Thread 0 reads
// z_t before the block's first barrier, so no thread has overwritten it yet.
// A row whose target is ignore_index gets loss 0 and gradient 0; a target
// outside [0, C) is recorded in the device's fault record (returned by the
// next wait for the device, cuda_impl.h) and gives that row NaN.
#include "kernels.cuh"
#include "linear_ce_impl.h"

namespace cti {
namespace {

template <int DT> struct LceAcc { typedef float A; };
template <> struct LceAcc<CT_F64> { typedef double A; };

// The hardware exponential (ex2.approx on x log2 e): arguments are x - max or
// x - lse <= 0 (or a rescale m - x < 0), where its relative error stays near
// 1e-6 for |x| < 20, far inside float32's loss and the half gradients' rounding;
// the row kernel is bound by its exponentials, and this takes it from 1.59 to
// 1.35 ms on [16384, 50304] bf16 logits (H200, docs/BENCHMARKS.md).
__device__ __forceinline__ float lce_exp(float x) { return __expf(x); }
__device__ __forceinline__ double lce_exp(double x) { return exp(x); }
__device__ __forceinline__ float lce_log(float x) { return logf(x); }
__device__ __forceinline__ double lce_log(double x) { return log(x); }

// Online softmax statistics: m the running max, s the sum of exp(x - m).
template <class A> __device__ __forceinline__ void ol_add(A &m, A &s, A x) {
    if (x > m) {
        s = s * lce_exp(m - x) + (A)1;
        m = x;
    } else if (x != (A)-INFINITY) {
        s += lce_exp(x - m);
    }
}

template <class A> __device__ __forceinline__ void ol_merge(A &m, A &s, A m2, A s2) {
    A mx = m2 > m ? m2 : m;
    if (mx == (A)-INFINITY) {
        s += s2;
    } else {
        s = s * lce_exp(m - mx) + s2 * lce_exp(m2 - mx);
        m = mx;
    }
}

// Folds (m, s, sz) over the block; every thread gets the result.
template <class A> __device__ void block_fold(A &m, A &s, A &sz) {
    __shared__ A shm[32], shs[32], shz[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        A m2 = __shfl_down_sync(0xffffffffu, m, o), s2 = __shfl_down_sync(0xffffffffu, s, o);
        sz += __shfl_down_sync(0xffffffffu, sz, o);
        ol_merge(m, s, m2, s2);
    }
    if (lane == 0) {
        shm[w] = m;
        shs[w] = s;
        shz[w] = sz;
    }
    __syncthreads();
    if (w == 0) {
        m = lane < nw ? shm[lane] : (A)-INFINITY;
        s = lane < nw ? shs[lane] : (A)0;
        sz = lane < nw ? shz[lane] : (A)0;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            A m2 = __shfl_down_sync(0xffffffffu, m, o), s2 = __shfl_down_sync(0xffffffffu, s, o);
            sz += __shfl_down_sync(0xffffffffu, sz, o);
            ol_merge(m, s, m2, s2);
        }
        if (lane == 0) {
            shm[0] = m;
            shs[0] = s;
            shz[0] = sz;
        }
    }
    __syncthreads();
    m = shm[0];
    s = shs[0];
    sz = shz[0];
}

__device__ __noinline__ void report_bad(const cti_lce_rows &a, int64_t row, int64_t t) {
    cti_cuda_fault *f = a.fault.record;
    if (!f || atomicCAS(&f->claimed, 0u, 1u) != 0u) return;
    f->op = a.op;
    f->value = (long long)t;
    f->limit = (long long)a.c;
    f->ignore = (long long)a.ignore;
    f->position = (long long)row;
    __threadfence_system();
    *a.fault.flag = 1u;
}

template <int DT> __global__ void lce_rows_kernel(cti_lce_rows a) {
    typedef typename dtype<DT>::T T;
    typedef typename LceAcc<DT>::A A;
    const int64_t r = blockIdx.x, C = a.c;
    T *row = (T *)a.logits + r * C;
    A *loss = (A *)a.loss;
    const int64_t t = a.target[r];
    if (t == a.ignore || t < 0 || t >= C) {
        const bool bad = t != a.ignore;
        if (threadIdx.x == 0) {
            loss[r] = bad ? (A)NAN : (A)0;
            if (bad) report_bad(a, r, t);
        }
        if (a.grad)
            for (int64_t j = threadIdx.x; j < C; j += blockDim.x)
                row[j] = dtype<DT>::enc(bad ? (A)NAN : (A)0);
        return;
    }
    const A zt = threadIdx.x == 0 ? (A)dtype<DT>::dec(row[t]) : (A)0;
    A m = (A)-INFINITY, s = 0, sz = 0;
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        const A x = (A)dtype<DT>::dec(row[j]);
        ol_add(m, s, x);
        sz += x;
    }
    block_fold(m, s, sz); // a barrier: every read of z_t and the row's first pass is done
    const A lse = m + lce_log(s), ls = (A)a.ls, off = (A)(a.ls / (double)C);
    if (threadIdx.x == 0) loss[r] = lse - (1 - ls) * zt - (a.ls > 0 ? off * sz : (A)0);
    if (!a.grad) return;
    A sc = (A)a.scale;
    if (a.rscale) sc *= (A)dtype<DT>::dec(((const T *)a.rscale)[r]);
    for (int64_t j = threadIdx.x; j < C; j += blockDim.x) {
        const A x = (A)dtype<DT>::dec(row[j]);
        A g = sc * (lce_exp(x - lse) - off);
        if (j == t) g -= sc * (1 - ls);
        row[j] = dtype<DT>::enc(g);
    }
}

// lce_rows_kernel for rows of 16-byte vectors (C a multiple of VEC, the
// logits 16-byte aligned): each thread keeps kLceU vectors in flight in
// both passes, where element accesses kept one.
constexpr int kLceU = 4;

template <class T, int N> struct alignas(sizeof(T) * N) Pack {
    T v[N];
};

template <int DT, int VEC> __global__ void lce_rows_vec(cti_lce_rows a) {
    typedef typename dtype<DT>::T T;
    typedef typename LceAcc<DT>::A A;
    typedef Pack<T, VEC> P;
    const int64_t r = blockIdx.x, C = a.c, nch = C / VEC, step = (int64_t)blockDim.x;
    T *row = (T *)a.logits + r * C;
    P *prow = reinterpret_cast<P *>(row);
    A *loss = (A *)a.loss;
    const int64_t t = a.target[r];
    if (t == a.ignore || t < 0 || t >= C) {
        const bool bad = t != a.ignore;
        if (threadIdx.x == 0) {
            loss[r] = bad ? (A)NAN : (A)0;
            if (bad) report_bad(a, r, t);
        }
        if (a.grad) {
            P z;
#pragma unroll
            for (int i = 0; i < VEC; i++) z.v[i] = dtype<DT>::enc(bad ? (A)NAN : (A)0);
            for (int64_t j = threadIdx.x; j < nch; j += step) prow[j] = z;
        }
        return;
    }
    const A zt = threadIdx.x == 0 ? (A)dtype<DT>::dec(row[t]) : (A)0;
    A m = (A)-INFINITY, s = 0, sz = 0;
    for (int64_t j0 = threadIdx.x; j0 < nch; j0 += kLceU * step) {
        P pk[kLceU];
#pragma unroll
        for (int u = 0; u < kLceU; u++)
            if (j0 + u * step < nch) pk[u] = prow[j0 + u * step];
#pragma unroll
        for (int u = 0; u < kLceU; u++) {
            if (j0 + u * step >= nch) continue;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const A x = (A)dtype<DT>::dec(pk[u].v[i]);
                ol_add(m, s, x);
                sz += x;
            }
        }
    }
    block_fold(m, s, sz); // a barrier: every read of z_t and the row's first pass is done
    const A lse = m + lce_log(s), ls = (A)a.ls, off = (A)(a.ls / (double)C);
    if (threadIdx.x == 0) loss[r] = lse - (1 - ls) * zt - (a.ls > 0 ? off * sz : (A)0);
    if (!a.grad) return;
    A sc = (A)a.scale;
    if (a.rscale) sc *= (A)dtype<DT>::dec(((const T *)a.rscale)[r]);
    for (int64_t j0 = threadIdx.x; j0 < nch; j0 += kLceU * step) {
        P pk[kLceU];
#pragma unroll
        for (int u = 0; u < kLceU; u++)
            if (j0 + u * step < nch) pk[u] = prow[j0 + u * step];
#pragma unroll
        for (int u = 0; u < kLceU; u++) {
            const int64_t j = j0 + u * step;
            if (j >= nch) continue;
            P o;
#pragma unroll
            for (int i = 0; i < VEC; i++) {
                const A x = (A)dtype<DT>::dec(pk[u].v[i]);
                A g = sc * (lce_exp(x - lse) - off);
                if (j * VEC + i == t) g -= sc * (1 - ls);
                o.v[i] = dtype<DT>::enc(g);
            }
            prow[j] = o;
        }
    }
}

template <int DT> cudaError_t lce_rows_dt(const cti_lce_rows *r, cudaStream_t st, const char **routine) {
    constexpr int VEC = 16 / sizeof(typename dtype<DT>::T);
    const int64_t c = r->c;
    // A row's passes are a chain of dependent loads and exponentials, so more rows
    // at once beat more threads a row: on [16384, 50304] bf16 logits (H200), with
    // expf, 128 threads took 1.59 ms, 256 1.76 ms, 512 2.03 ms (docs/BENCHMARKS.md).
    const int threads = c >= 128 ? 128 : 32;
    if (c % VEC == 0 && ((uintptr_t)r->logits & 15) == 0) {
        *routine = "cten_cross_entropy_fused_block_per_row_vec16";
        lce_rows_vec<DT, VEC><<<(unsigned)r->rows, threads, 0, st>>>(*r);
    } else {
        *routine = "cten_cross_entropy_fused_block_per_row";
        lce_rows_kernel<DT><<<(unsigned)r->rows, threads, 0, st>>>(*r);
    }
    return cudaGetLastError();
}

} // namespace
} // namespace cti

extern "C" cudaError_t cti_lce_rows_launch(const cti_lce_rows *r, cudaStream_t st,
                                           const char **routine) {
    if (r->rows <= 0) return cudaSuccess;
    if (r->rows > 2147483647) return cudaErrorInvalidConfiguration;
    switch (r->dt) {
    case CT_F32: return cti::lce_rows_dt<CT_F32>(r, st, routine);
    case CT_F64: return cti::lce_rows_dt<CT_F64>(r, st, routine);
    case CT_F16: return cti::lce_rows_dt<CT_F16>(r, st, routine);
    case CT_BF16: return cti::lce_rows_dt<CT_BF16>(r, st, routine);
    default: return cudaErrorInvalidValue;
    }
}
