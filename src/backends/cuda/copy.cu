// Device kernels for copy/convert and fill. Host-side decisions (which
// transfer, staging, temporaries) live in transfer.c; these only launch.
#include <string.h>

#include "kernels.cuh"

namespace cti {
namespace {

// ---- contiguous conversion, 16-byte accesses -------------------------------------------
// VEC elements per access, so the wider side moves 16 bytes at a time; each
// thread keeps two accesses in flight before storing.
template <int D, int S>
struct vec_of {
    static constexpr int es = sizeof(typename dtype<D>::T) > sizeof(typename dtype<S>::T)
                                  ? (int)sizeof(typename dtype<D>::T)
                                  : (int)sizeof(typename dtype<S>::T);
    static constexpr int value = 16 / es;
};

template <class T, int N> struct alignas(sizeof(T) * N) pack {
    T v[N];
};

template <int D, int S, int VEC>
__global__ void __launch_bounds__(kThreads)
convert_contig(typename dtype<D>::T *__restrict__ dst, const typename dtype<S>::T *__restrict__ src,
               int64_t n) {
    typedef pack<typename dtype<D>::T, VEC> VD;
    typedef pack<typename dtype<S>::T, VEC> VS;
    const int64_t nvec = n / VEC;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const VS *s = reinterpret_cast<const VS *>(src);
    VD *d = reinterpret_cast<VD *>(dst);
    int64_t i = tid;
    for (; i + stride < nvec; i += 2 * stride) {
        VS a = s[i], b = s[i + stride];
        VD x, y;
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            x.v[k] = convert<D, S>(a.v[k]);
            y.v[k] = convert<D, S>(b.v[k]);
        }
        d[i] = x;
        d[i + stride] = y;
    }
    if (i < nvec) {
        VS a = s[i];
        VD x;
#pragma unroll
        for (int k = 0; k < VEC; k++) x.v[k] = convert<D, S>(a.v[k]);
        d[i] = x;
    }
    int64_t t = nvec * VEC + tid;
    if (t < n) dst[t] = convert<D, S>(src[t]);
}

template <int D, int S, class I>
__global__ void __launch_bounds__(kThreads)
convert_strided(typename dtype<D>::T *__restrict__ dst, const typename dtype<S>::T *__restrict__ src,
                const cti_cuda_iter it) {
    const I n = (I)it.numel, stride = (I)(gridDim.x * blockDim.x);
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        int64_t off[2];
        offsets<2, I>(it, i, off);
        dst[off[0]] = convert<D, S>(src[off[1]]);
    }
}

template <class T, class I>
__global__ void __launch_bounds__(kThreads)
move_strided(T *__restrict__ dst, const T *__restrict__ src, const cti_cuda_iter it) {
    const I n = (I)it.numel, stride = (I)(gridDim.x * blockDim.x);
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        int64_t off[2];
        offsets<2, I>(it, i, off);
        dst[off[0]] = src[off[1]];
    }
}

// ---- launch tables -----------------------------------------------------------------------

typedef cudaError_t (*contig_fn)(void *, const void *, int64_t, int, cudaStream_t);
typedef cudaError_t (*strided_fn)(void *, const void *, const cti_cuda_iter *, int, cudaStream_t);

template <int D, int S>
cudaError_t launch_contig(void *dst, const void *src, int64_t n, int sms, cudaStream_t st) {
    typedef typename dtype<D>::T TD;
    typedef typename dtype<S>::T TS;
    constexpr int VEC = vec_of<D, S>::value;
    bool aligned = (uintptr_t)dst % (sizeof(TD) * VEC) == 0 &&
                   (uintptr_t)src % (sizeof(TS) * VEC) == 0;
    if (aligned) {
        int64_t work = n / VEC / 2 + 1;
        convert_contig<D, S, VEC><<<grid_for(work, sms), kThreads, 0, st>>>((TD *)dst,
                                                                           (const TS *)src, n);
    } else {
        convert_contig<D, S, 1><<<grid_for(n / 2 + 1, sms), kThreads, 0, st>>>((TD *)dst,
                                                                              (const TS *)src, n);
    }
    return cudaGetLastError();
}

template <int D, int S>
cudaError_t launch_strided(void *dst, const void *src, const cti_cuda_iter *it, int sms,
                           cudaStream_t st) {
    typedef typename dtype<D>::T TD;
    typedef typename dtype<S>::T TS;
    unsigned grid = grid_for(it->numel, sms);
    if (it->use32)
        convert_strided<D, S, uint32_t><<<grid, kThreads, 0, st>>>((TD *)dst, (const TS *)src, *it);
    else
        convert_strided<D, S, int64_t><<<grid, kThreads, 0, st>>>((TD *)dst, (const TS *)src, *it);
    return cudaGetLastError();
}

template <class T>
cudaError_t launch_move(void *dst, const void *src, const cti_cuda_iter *it, int sms,
                        cudaStream_t st) {
    unsigned grid = grid_for(it->numel, sms);
    if (it->use32)
        move_strided<T, uint32_t><<<grid, kThreads, 0, st>>>((T *)dst, (const T *)src, *it);
    else
        move_strided<T, int64_t><<<grid, kThreads, 0, st>>>((T *)dst, (const T *)src, *it);
    return cudaGetLastError();
}

#define CTI_ROW(F, D) {F<D, 0>, F<D, 1>, F<D, 2>, F<D, 3>, F<D, 4>, F<D, 5>, F<D, 6>}
// [dst dtype][src dtype], in ct_dtype order.
const contig_fn contig_table[CT_NUM_DTYPES][CT_NUM_DTYPES] = {
    CTI_ROW(launch_contig, 0), CTI_ROW(launch_contig, 1), CTI_ROW(launch_contig, 2),
    CTI_ROW(launch_contig, 3), CTI_ROW(launch_contig, 4), CTI_ROW(launch_contig, 5),
    CTI_ROW(launch_contig, 6)};
const strided_fn strided_table[CT_NUM_DTYPES][CT_NUM_DTYPES] = {
    CTI_ROW(launch_strided, 0), CTI_ROW(launch_strided, 1), CTI_ROW(launch_strided, 2),
    CTI_ROW(launch_strided, 3), CTI_ROW(launch_strided, 4), CTI_ROW(launch_strided, 5),
    CTI_ROW(launch_strided, 6)};
#undef CTI_ROW

// ---- fill ---------------------------------------------------------------------------------

// A contiguous run: head elements up to 16-byte alignment, then 16-byte
// stores of the repeated pattern, then the tail.
template <class T>
__global__ void __launch_bounds__(kThreads)
fill_contig(T *__restrict__ dst, T v, int64_t head, int64_t nvec, int64_t tail) {
    constexpr int VEC = 16 / sizeof(T);
    pack<T, VEC> p;
#pragma unroll
    for (int k = 0; k < VEC; k++) p.v[k] = v;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    pack<T, VEC> *body = reinterpret_cast<pack<T, VEC> *>(dst + head);
    for (int64_t i = tid; i < nvec; i += stride) body[i] = p;
    if (tid < head) dst[tid] = v;
    if (tid < tail) dst[head + nvec * VEC + tid] = v;
}

template <class T, class I>
__global__ void __launch_bounds__(kThreads)
fill_strided(T *__restrict__ dst, T v, const cti_cuda_iter it) {
    const I n = (I)it.numel, stride = (I)(gridDim.x * blockDim.x);
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        int64_t off[1];
        offsets<1, I>(it, i, off);
        dst[off[0]] = v;
    }
}

template <class T>
cudaError_t launch_fill(void *dst, const void *value, const cti_cuda_iter *it, int sms,
                        cudaStream_t st) {
    T v;
    memcpy(&v, value, sizeof v);
    if (it->ndim == 1 && it->stride[0][0] == 1) {
        constexpr int VEC = 16 / sizeof(T);
        int64_t n = it->numel;
        int64_t head = (int64_t)((16 - (uintptr_t)dst % 16) % 16 / sizeof(T));
        if (head > n) head = n;
        int64_t nvec = (n - head) / VEC, tail = n - head - nvec * VEC;
        fill_contig<T><<<grid_for(nvec, sms), kThreads, 0, st>>>(
            (T *)dst, v, head, nvec, tail);
    } else if (it->use32) {
        fill_strided<T, uint32_t><<<grid_for(it->numel, sms), kThreads, 0, st>>>((T *)dst, v, *it);
    } else {
        fill_strided<T, int64_t><<<grid_for(it->numel, sms), kThreads, 0, st>>>((T *)dst, v, *it);
    }
    return cudaGetLastError();
}

} // namespace
} // namespace cti

extern "C" {

cudaError_t cti_cuda_convert_contiguous(void *dst, ct_dtype dst_dt, const void *src,
                                        ct_dtype src_dt, int64_t n, int sm_count,
                                        cudaStream_t stream) {
    return cti::contig_table[dst_dt][src_dt](dst, src, n, sm_count, stream);
}

cudaError_t cti_cuda_copy_strided(void *dst, ct_dtype dst_dt, const void *src, ct_dtype src_dt,
                                  const cti_cuda_iter *it, int sm_count, cudaStream_t stream) {
    if (dst_dt != src_dt) return cti::strided_table[dst_dt][src_dt](dst, src, it, sm_count, stream);
    switch (ct_dtype_size(dst_dt)) {
    case 1: return cti::launch_move<uint8_t>(dst, src, it, sm_count, stream);
    case 2: return cti::launch_move<uint16_t>(dst, src, it, sm_count, stream);
    case 4: return cti::launch_move<uint32_t>(dst, src, it, sm_count, stream);
    default: return cti::launch_move<uint64_t>(dst, src, it, sm_count, stream);
    }
}

cudaError_t cti_cuda_move_strided(void *dst, const void *src, int elsize, const cti_cuda_iter *it,
                                  int sm_count, cudaStream_t stream) {
    switch (elsize) {
    case 1: return cti::launch_move<uint8_t>(dst, src, it, sm_count, stream);
    case 2: return cti::launch_move<uint16_t>(dst, src, it, sm_count, stream);
    case 4: return cti::launch_move<uint32_t>(dst, src, it, sm_count, stream);
    case 8: return cti::launch_move<uint64_t>(dst, src, it, sm_count, stream);
    default: return cti::launch_move<uint4>(dst, src, it, sm_count, stream);
    }
}

cudaError_t cti_cuda_fill(void *dst, int elsize, const void *value, const cti_cuda_iter *it,
                          int sm_count, cudaStream_t stream) {
    switch (elsize) {
    case 1: return cti::launch_fill<uint8_t>(dst, value, it, sm_count, stream);
    case 2: return cti::launch_fill<uint16_t>(dst, value, it, sm_count, stream);
    case 4: return cti::launch_fill<uint32_t>(dst, value, it, sm_count, stream);
    default: return cti::launch_fill<uint64_t>(dst, value, it, sm_count, stream);
    }
}

} // extern "C"
