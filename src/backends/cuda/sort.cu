// CUDA kernels of sort, cumprod and nonzero, with the CPU kernels' results
// (src/backends/cpu/sort.c; the contract is schema.h's "sort, cumprod,
// nonzero"):
//  - sort maps each element to an unsigned key of its own width (NaN above
//    all, -0 == +0; descending flips the bits) and sorts (key, index) pairs
//    with CUB's radix sorts, which are stable, as the contract asks. Rows of
//    up to kBlockMax elements: one block per row sorts them in shared memory
//    (cub::BlockRadixSort, as PyTorch's sort of short rows), so many short
//    rows take one launch; longer rows: cub::DeviceSegmentedRadixSort, or
//    cub::DeviceRadixSort row by row for a few very long rows (one row per
//    CUB call fills the device; a segment gets one block), the index of each element
//    (int64) as the payload, written straight into the indices. The values
//    are then gathered from x by index, so every bit (NaN payloads, -0)
//    comes through.
//  - cumprod runs one thread per line and multiplies in the CPU's order.
//  - nonzero: one thread per element writes a non-zero element's
//    coordinates at the row its running count gives.
#include <cub/block/block_radix_sort.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_segmented_radix_sort.cuh>

#include "kernels.cuh"
#include "sort_impl.h"

namespace cti {
namespace {

constexpr int kBlockMax = 4096; // the longest row sorted in shared memory

// ---- keys -----------------------------------------------------------------------------------
template <int DT> struct sort_key;
template <> struct sort_key<CT_BOOL> {
    typedef uint8_t K;
    static __device__ __forceinline__ K of(uint8_t v) { return v != 0; }
};
template <> struct sort_key<CT_I32> {
    typedef uint32_t K;
    static __device__ __forceinline__ K of(int32_t v) { return (uint32_t)v ^ 0x80000000u; }
};
template <> struct sort_key<CT_I64> {
    typedef uint64_t K;
    static __device__ __forceinline__ K of(int64_t v) { return (uint64_t)v ^ (1ull << 63); }
};
// Halves by their bits: exponent mask em, mantissa mask mm.
template <uint16_t em, uint16_t mm> __device__ __forceinline__ uint16_t half_key(uint16_t h) {
    if ((h & em) == em && (h & mm)) return 0xFFFFu;
    if ((h & 0x7FFFu) == 0) h = 0;
    return (h & 0x8000u) ? (uint16_t)~h : (uint16_t)(h | 0x8000u);
}
template <> struct sort_key<CT_F16> {
    typedef uint16_t K;
    static __device__ __forceinline__ K of(uint16_t h) { return half_key<0x7C00u, 0x03FFu>(h); }
};
template <> struct sort_key<CT_BF16> {
    typedef uint16_t K;
    static __device__ __forceinline__ K of(uint16_t h) { return half_key<0x7F80u, 0x007Fu>(h); }
};
template <> struct sort_key<CT_F32> {
    typedef uint32_t K;
    static __device__ __forceinline__ K of(float v) {
        if (v != v) return 0xFFFFFFFFu;
        if (v == 0) return 0x80000000u;
        uint32_t b = __float_as_uint(v);
        return (b >> 31) ? ~b : b | 0x80000000u;
    }
};
template <> struct sort_key<CT_F64> {
    typedef uint64_t K;
    static __device__ __forceinline__ K of(double v) {
        if (v != v) return ~0ull;
        if (v == 0) return 1ull << 63;
        uint64_t b = (uint64_t)__double_as_longlong(v);
        return (b >> 63) ? ~b : b | (1ull << 63);
    }
};

// ---- short rows: one block per row --------------------------------------------------------------
// Keys are staged through shared memory with coalesced loads, read back in
// the blocked arrangement (thread t holds elements t * IPT ..), sorted, and
// come out striped, so the stores are coalesced too. Padding keys are all
// ones after the row's end: the sort is stable, so they stay behind every
// real key, the largest ones included.
template <int DT, int BT, int IPT>
__global__ void __launch_bounds__(BT)
block_sort_kernel(const typename dtype<DT>::T *x, typename dtype<DT>::T *vals, int64_t *idx,
                  int64_t rows, int n, bool desc) {
    typedef typename sort_key<DT>::K K;
    typedef cub::BlockRadixSort<K, BT, IPT, int> Sort;
    __shared__ union {
        typename Sort::TempStorage sort;
        K keys[BT * IPT];
    } sh;
    const K flip = desc ? (K)~(K)0 : (K)0;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const typename dtype<DT>::T *xr = x + row * n;
        for (int i = threadIdx.x; i < BT * IPT; i += BT)
            sh.keys[i] = i < n ? (K)(sort_key<DT>::of(xr[i]) ^ flip) : (K)~(K)0;
        __syncthreads();
        K k[IPT];
        int v[IPT];
#pragma unroll
        for (int i = 0; i < IPT; i++) {
            k[i] = sh.keys[threadIdx.x * IPT + i];
            v[i] = threadIdx.x * IPT + i;
        }
        __syncthreads();
        Sort(sh.sort).SortBlockedToStriped(k, v, 0, (int)(sizeof(K) * 8));
#pragma unroll
        for (int i = 0; i < IPT; i++) {
            int r = i * BT + threadIdx.x;
            if (r < n) {
                vals[row * n + r] = xr[v[i]];
                idx[row * n + r] = v[i];
            }
        }
        __syncthreads(); // the next row reuses the shared memory
    }
}

template <int DT, int BT, int IPT>
cudaError_t launch_block_sort(const cti_cuda_sort &a, cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    int64_t blocks = a.p.outer < (int64_t)a.sms * 32 ? a.p.outer : (int64_t)a.sms * 32;
    block_sort_kernel<DT, BT, IPT><<<(unsigned)(blocks > 0 ? blocks : 1), BT, 0, st>>>(
        (const T *)a.x, (T *)a.out, (int64_t *)a.out2, a.p.outer, (int)a.p.n, a.p.descending);
    return cudaGetLastError();
}

// ---- long rows: CUB's device-wide sorts ---------------------------------------------------------
template <int DT>
__global__ void keys_kernel(const typename dtype<DT>::T *x, typename sort_key<DT>::K *keys,
                            int64_t *pos, int64_t total, int64_t n, bool desc) {
    typedef typename sort_key<DT>::K K;
    const K flip = desc ? (K)~(K)0 : (K)0;
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        keys[e] = (K)(sort_key<DT>::of(x[e]) ^ flip);
        pos[e] = e % n;
    }
}

__global__ void row_offsets_kernel(int *off, int count, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= count; i += gridDim.x * blockDim.x)
        off[i] = i * n;
}

template <class T>
__global__ void take_kernel(const T *x, const int64_t *idx, T *vals, int64_t total, int64_t n) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x)
        vals[e] = x[e - e % n + idx[e]];
}

// Rows per CUB call: at most 2^30 items (its counts are int). A few very
// long rows go one at a time to the device-wide sort instead of the
// segmented one, which gives each row one block per pass (PyTorch sorts
// such rows one by one too).
int64_t group_rows(int64_t rows, int64_t n, int sms) {
    if (n >= ((int64_t)1 << 17) && rows <= 2 * (int64_t)(sms > 0 ? sms : 1)) return 1;
    int64_t g = ((int64_t)1 << 30) / (n > 0 ? n : 1);
    return g > 0 ? g : 1;
}

struct layout {
    int64_t g, items;
    size_t keys, keys_out, pos, off, temp, total, temp_bytes; // byte offsets; temp_bytes: CUB's
};

template <class K> layout layout_for(int64_t rows, int64_t n, int sms) {
    layout L{};
    L.g = group_rows(rows, n, sms);
    if (L.g > rows) L.g = rows;
    L.items = L.g * n;
    size_t temp = 0;
    if (L.g == 1)
        cub::DeviceRadixSort::SortPairs(nullptr, temp, (const K *)nullptr, (K *)nullptr,
                                        (const int64_t *)nullptr, (int64_t *)nullptr, (int)L.items);
    else
        cub::DeviceSegmentedRadixSort::SortPairs(nullptr, temp, (const K *)nullptr, (K *)nullptr,
                                                 (const int64_t *)nullptr, (int64_t *)nullptr,
                                                 (int)L.items, (int)L.g, (const int *)nullptr,
                                                 (const int *)nullptr);
    auto al = [](size_t v) { return (v + 255) & ~(size_t)255; };
    size_t o = 0;
    L.keys = o; o = al(o + (size_t)L.items * sizeof(K));
    L.keys_out = o; o = al(o + (size_t)L.items * sizeof(K));
    L.pos = o; o = al(o + (size_t)L.items * 8);
    L.off = o; o = al(o + (size_t)(L.g + 1) * 4);
    L.temp = o; o = al(o + temp);
    L.temp_bytes = temp;
    L.total = o;
    return L;
}

template <int DT> cudaError_t launch_device_sort(const cti_cuda_sort &a, cudaStream_t st) {
    typedef typename dtype<DT>::T T;
    typedef typename sort_key<DT>::K K;
    const cti_sort_params &p = a.p;
    layout L = layout_for<K>(p.outer, p.n, a.sms);
    char *w = (char *)a.work;
    K *keys = (K *)(w + L.keys), *keys_out = (K *)(w + L.keys_out);
    int64_t *pos = (int64_t *)(w + L.pos);
    int *off = (int *)(w + L.off);
    if (L.g > 1)
        row_offsets_kernel<<<grid_for(L.g + 1, a.sms), kThreads, 0, st>>>(off, (int)L.g, (int)p.n);
    const T *x = (const T *)a.x;
    for (int64_t r0 = 0; r0 < p.outer; r0 += L.g) {
        int64_t g = p.outer - r0 < L.g ? p.outer - r0 : L.g, items = g * p.n;
        int64_t *idx = (int64_t *)a.out2 + r0 * p.n;
        keys_kernel<DT><<<grid_for(items, a.sms), kThreads, 0, st>>>(x + r0 * p.n, keys, pos,
                                                                      items, p.n, p.descending);
        size_t temp = L.temp_bytes;
        cudaError_t e =
            L.g == 1 ? cub::DeviceRadixSort::SortPairs((void *)(w + L.temp), temp, keys, keys_out,
                                                       pos, idx, (int)items, 0,
                                                       (int)(sizeof(K) * 8), st)
                     : cub::DeviceSegmentedRadixSort::SortPairs(
                           (void *)(w + L.temp), temp, keys, keys_out, pos, idx, (int)items, (int)g,
                           off, off + 1, 0, (int)(sizeof(K) * 8), st);
        if (e != cudaSuccess) return e;
        take_kernel<T><<<grid_for(items, a.sms), kThreads, 0, st>>>(x + r0 * p.n, idx,
                                                                    (T *)a.out + r0 * p.n, items,
                                                                    p.n);
    }
    return cudaGetLastError();
}

template <int DT> cudaError_t launch_sort_t(const cti_cuda_sort &a, cudaStream_t st,
                                            const char **routine) {
    int64_t n = a.p.n;
    if (n > kBlockMax) {
        *routine = group_rows(a.p.outer, n, a.sms) == 1 ? "cuda_sort_device_radix"
                                                         : "cuda_sort_segmented_radix";
        return launch_device_sort<DT>(a, st);
    }
    *routine = "cuda_sort_block_radix";
    if (n <= 128) return launch_block_sort<DT, 32, 4>(a, st);
    if (n <= 512) return launch_block_sort<DT, 64, 8>(a, st);
    if (n <= 1024) return launch_block_sort<DT, 128, 8>(a, st);
    if (n <= 2048) return launch_block_sort<DT, 256, 8>(a, st);
    return launch_block_sort<DT, 512, 8>(a, st);
}

template <int DT> size_t sort_work_t(const cti_cuda_sort &a) {
    if (a.p.n <= kBlockMax || a.p.outer == 0) return 0;
    return layout_for<typename sort_key<DT>::K>(a.p.outer, a.p.n, a.sms).total;
}

// ---- cumprod --------------------------------------------------------------------------------
template <int DT> struct prod_types {
    typedef typename std::conditional<DT == CT_F64, double, float>::type Acc;
    typedef typename dtype<DT>::T Out;
    static __device__ __forceinline__ Out put(Acc v) { return dtype<DT>::enc(v); }
};
template <int DT> struct prod_int_types {
    typedef uint64_t Acc; // wraps as two's complement, as the CPU's
    typedef int64_t Out;
    static __device__ __forceinline__ Out put(Acc v) { return (int64_t)v; }
};
template <> struct prod_types<CT_BOOL> : prod_int_types<CT_BOOL> {};
template <> struct prod_types<CT_I32> : prod_int_types<CT_I32> {};
template <> struct prod_types<CT_I64> : prod_int_types<CT_I64> {};

template <int DT>
__global__ void cumprod_kernel(const typename dtype<DT>::T *x, typename prod_types<DT>::Out *y,
                               int64_t outer, int64_t n, int64_t inner) {
    typedef typename prod_types<DT>::Acc Acc;
    int64_t lines = outer * inner;
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines;
         l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, r = l % inner;
        Acc acc = 1;
        for (int64_t t = 0; t < n; t++) {
            int64_t e = (o * n + t) * inner + r;
            Acc v = (Acc)dtype<DT>::dec(x[e]);
            acc = t ? acc * v : v;
            y[e] = prod_types<DT>::put(acc);
        }
    }
}

template <int DT> cudaError_t launch_cumprod_t(const cti_cuda_sort &a, cudaStream_t st) {
    const cti_seq_params &q = a.q;
    int64_t lines = q.outer * q.inner;
    cumprod_kernel<DT><<<grid_for(lines, a.sms), kThreads, 0, st>>>(
        (const typename dtype<DT>::T *)a.x, (typename prod_types<DT>::Out *)a.out, q.outer, q.n,
        q.inner);
    return cudaGetLastError();
}

// ---- nonzero ------------------------------------------------------------------------------------
template <int DT> __device__ __forceinline__ bool is_nonzero(typename dtype<DT>::T v) {
    if constexpr (DT == CT_F16 || DT == CT_BF16) return (v & 0x7FFFu) != 0;
    else return v != 0;
}

template <int DT>
__global__ void nonzero_kernel(const typename dtype<DT>::T *x, const int64_t *count, int64_t *out,
                               int64_t numel, cti_sort_params p) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < numel;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (!is_nonzero<DT>(x[i])) continue;
        int64_t *row = out + (count[i] - 1) * p.ndim, rest = i;
        for (int d = p.ndim - 1; d >= 0; d--) {
            row[d] = rest % p.shape[d];
            rest /= p.shape[d];
        }
    }
}

template <int DT> cudaError_t launch_nonzero_t(const cti_cuda_sort &a, cudaStream_t st) {
    nonzero_kernel<DT><<<grid_for(a.numel, a.sms), kThreads, 0, st>>>(
        (const typename dtype<DT>::T *)a.x, a.count, (int64_t *)a.out, a.numel, a.p);
    return cudaGetLastError();
}

// ---- dispatch on dtype ----------------------------------------------------------------------------
template <int DT> cudaError_t launch_t(const cti_cuda_sort &a, cudaStream_t st,
                                       const char **routine) {
    switch (a.op) {
    case CT_OP_SORT: return launch_sort_t<DT>(a, st, routine);
    case CT_OP_CUMPROD: *routine = "cuda_cumprod_lines"; return launch_cumprod_t<DT>(a, st);
    case CT_OP_NONZERO: *routine = "cuda_nonzero_scatter"; return launch_nonzero_t<DT>(a, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace
} // namespace cti

extern "C" size_t cti_cuda_sort_work(const cti_cuda_sort *a) {
    if (a->op != CT_OP_SORT) return 0;
#define F(DT) cti::sort_work_t<DT>(*a)
    switch (a->dt) {
    case CT_BOOL: return F(CT_BOOL);
    case CT_I32: return F(CT_I32);
    case CT_I64: return F(CT_I64);
    case CT_F16: return F(CT_F16);
    case CT_BF16: return F(CT_BF16);
    case CT_F32: return F(CT_F32);
    case CT_F64: return F(CT_F64);
    default: return 0;
    }
#undef F
}

extern "C" cudaError_t cti_cuda_sort_launch(const cti_cuda_sort *a, cudaStream_t stream,
                                            const char **routine) {
#define F(DT) cti::launch_t<DT>(*a, stream, routine)
    switch (a->dt) {
    case CT_BOOL: return F(CT_BOOL);
    case CT_I32: return F(CT_I32);
    case CT_I64: return F(CT_I64);
    case CT_F16: return F(CT_F16);
    case CT_BF16: return F(CT_BF16);
    case CT_F32: return F(CT_F32);
    case CT_F64: return F(CT_F64);
    default: return cudaErrorInvalidValue;
    }
#undef F
}
