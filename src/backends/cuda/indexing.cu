// Kernels of gather / index_select and scatter_add (cti_cuda_index,
// ops_impl.h). Every tensor is read through its strides, as on the CPU.
//
// An index outside [0, size) is never used as an address: the thread records
// its row-major position with atomicMin (the smallest wins: the first in
// row-major order, the one the CPU reports) and skips it; the C side
// (indexing.c) reads the record back and fails the call.
//
// scatter_add runs one thread per line along dim: the positions of a line
// are the only ones that write that line's output elements, so nothing races,
// no atomics are needed, and each element sums in index order with each add
// rounded to the dtype, as the CPU kernel does: the results are the CPU's
// bit for bit in every dtype. Simple before fast: a long line is one
// thread's loop.
#include <cstdint>
#include <type_traits>

#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

template <int ES> struct Bits;
template <> struct Bits<1> { typedef uint8_t T; };
template <> struct Bits<2> { typedef uint16_t T; };
template <> struct Bits<4> { typedef uint32_t T; };
template <> struct Bits<8> { typedef unsigned long long T; };

// Element offsets of row-major position p of a.shape in the indexed tensor
// (t), index (i) and src (s), and its row-major position in index's own
// shape (r).
struct Where {
    int64_t t, i, s, r;
};

__device__ __forceinline__ Where locate(const cti_cuda_index &a, int64_t p) {
    Where w = {0, 0, 0, 0};
    for (int k = a.nd - 1; k >= 0; k--) {
        int64_t n = a.shape[k] > 0 ? a.shape[k] : 1;
        int64_t c = p % n;
        p /= n;
        w.t += c * a.ts[k];
        w.i += c * a.is[k];
        w.s += c * a.ss[k];
        w.r += c * a.cs[k];
    }
    return w;
}

template <class E, class I>
__global__ void __launch_bounds__(kThreads) gather_kernel(const cti_cuda_index a, int64_t n) {
    const E *x = (const E *)a.x;
    const I *idx = (const I *)a.idx;
    E *out = (E *)a.out;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += step) {
        Where w = locate(a, p);
        int64_t v = (int64_t)idx[w.i];
        if (v < 0 || v >= a.size) {
            atomicMin(a.bad, (unsigned long long)p);
            continue;
        }
        out[p] = x[w.t + v * a.tdim];
    }
}

template <class E, class I>
cudaError_t gather_launch(const cti_cuda_index *a, int64_t n, unsigned g, cudaStream_t st) {
    gather_kernel<E, I><<<g, kThreads, 0, st>>>(*a, n);
    return cudaGetLastError();
}

template <class I>
cudaError_t gather_bits(const cti_cuda_index *a, int64_t n, unsigned g, cudaStream_t st) {
    switch (ct_dtype_size((ct_dtype)a->dt)) {
    case 1: return gather_launch<Bits<1>::T, I>(a, n, g, st);
    case 2: return gather_launch<Bits<2>::T, I>(a, n, g, st);
    case 4: return gather_launch<Bits<4>::T, I>(a, n, g, st);
    case 8: return gather_launch<Bits<8>::T, I>(a, n, g, st);
    default: return cudaErrorInvalidValue;
    }
}

// a + b in dtype DT, rounded to it; integers wrap (bool: or).
template <int DT>
__device__ __forceinline__ typename dtype<DT>::T add(typename dtype<DT>::T a,
                                                     typename dtype<DT>::T b) {
    if constexpr (DT == CT_I32 || DT == CT_I64 || DT == CT_BOOL)
        return dtype<DT>::enc((int64_t)((uint64_t)dtype<DT>::dec(a) + (uint64_t)dtype<DT>::dec(b)));
    else
        return dtype<DT>::enc(dtype<DT>::dec(a) + dtype<DT>::dec(b));
}

template <int DT, class I>
__global__ void __launch_bounds__(kThreads) scatter_kernel(const cti_cuda_index a, int64_t lines) {
    typedef typename dtype<DT>::T E;
    const I *idx = (const I *)a.idx;
    const E *src = (const E *)a.src;
    E *out = (E *)a.out;
    const int64_t id = a.is[a.dim], sd = a.ss[a.dim], rd = a.cs[a.dim];
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t l = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; l < lines; l += step) {
        Where w = locate(a, l);
        for (int64_t j = 0; j < a.len; j++) {
            int64_t v = (int64_t)idx[w.i + j * id];
            if (v < 0 || v >= a.size) {
                atomicMin(a.bad, (unsigned long long)(w.r + j * rd));
                continue;
            }
            E *o = out + w.t + v * a.tdim;
            *o = add<DT>(*o, src[w.s + j * sd]);
        }
    }
}

template <int DT>
cudaError_t scatter_launch(const cti_cuda_index *a, int64_t n, unsigned g, cudaStream_t st) {
    if (a->idx_i32) scatter_kernel<DT, int32_t><<<g, kThreads, 0, st>>>(*a, n);
    else scatter_kernel<DT, int64_t><<<g, kThreads, 0, st>>>(*a, n);
    return cudaGetLastError();
}

} // namespace
} // namespace cti

using namespace cti;

extern "C" cudaError_t cti_cuda_gather(const cti_cuda_index *a, int64_t n, int sm_count,
                                       cudaStream_t st, const char **routine) {
    *routine = "cten_gather";
    unsigned g = grid_for(n, sm_count);
    return a->idx_i32 ? gather_bits<int32_t>(a, n, g, st) : gather_bits<int64_t>(a, n, g, st);
}

extern "C" cudaError_t cti_cuda_scatter_add(const cti_cuda_index *a, int64_t n, int sm_count,
                                            cudaStream_t st, const char **routine) {
    *routine = "cten_scatter_add_lines";
    unsigned g = grid_for(n, sm_count);
    switch (a->dt) {
    case CT_BOOL: return scatter_launch<CT_BOOL>(a, n, g, st);
    case CT_I32: return scatter_launch<CT_I32>(a, n, g, st);
    case CT_I64: return scatter_launch<CT_I64>(a, n, g, st);
    case CT_F16: return scatter_launch<CT_F16>(a, n, g, st);
    case CT_BF16: return scatter_launch<CT_BF16>(a, n, g, st);
    case CT_F32: return scatter_launch<CT_F32>(a, n, g, st);
    case CT_F64: return scatter_launch<CT_F64>(a, n, g, st);
    default: return cudaErrorInvalidValue;
    }
}
