// CUDA kernels of tril/triu, cumsum, topk, topk_backward and multinomial,
// with the CPU kernels' results (src/backends/cpu/seqops.c; the contract is
// schema.h's "tril, cumsum, topk, multinomial"):
//  - tril/triu copy or zero each element; cumsum runs one thread per line
//    and adds in the CPU's order, so f32 sums are bit-identical.
//  - topk compares order-preserving 64-bit keys (NaN above all, -0 == +0),
//    best first, ties by lower index. k <= kSelectMax: one block per row
//    finds the k-th key by radix select (8 passes of 8 bits over the row in
//    global memory, a shared histogram), gathers the k winners into shared
//    memory (the tied ones by index) and sorts them there (bitonic). Larger
//    k: CUB's segmented radix sort of each row's keys (stable, so ties keep
//    index order), then the first k.
//  - multinomial: one block of CTI_MULTINOMIAL_CHUNKS threads per row, one
//    chunk each, in the contract's f64 arithmetic (no fused multiply-add),
//    so the samples equal the CPU's. Bad weights are recorded in the
//    device's fault record (cuda_impl.h) and fail the next wait.
#include <cub/device/device_segmented_radix_sort.cuh>

#include "kernels.cuh"
#include "seqops_impl.h"

namespace cti {
namespace {

constexpr int kSelectMax = 2048; // the largest k sorted in shared memory
constexpr int kSelThreads = 256;

// ---- faults ---------------------------------------------------------------------------------
__device__ __noinline__ void report(const cti_cuda_fault_slot &s, int op, long long kind,
                                    long long limit, long long ignore, long long position) {
    cti_cuda_fault *f = s.record;
    if (!f || atomicCAS(&f->claimed, 0u, 1u) != 0u) return;
    f->op = op;
    f->value = kind;
    f->limit = limit;
    f->ignore = ignore;
    f->position = position;
    __threadfence_system();
    *s.flag = 1u;
}

// ---- tril / triu ----------------------------------------------------------------------------
template <class T>
__global__ void tri_kernel(const T *x, T *y, int64_t total, int64_t rows, int64_t cols,
                           int64_t diag, bool upper) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = e % cols, i = (e / cols) % rows;
        bool keep = upper ? j - i >= diag : j - i <= diag;
        y[e] = keep ? x[e] : T(0);
    }
}

cudaError_t launch_tri(const cti_cuda_seq &a, cudaStream_t st) {
    const cti_seq_params &p = a.p;
    int64_t total = p.outer * p.n * p.inner;
    if (total == 0) return cudaSuccess;
    // diag clamped as the CPU's: j - i ranges over (-rows, cols)
    int64_t diag = p.diagonal < -p.n - 1 ? -p.n - 1 : p.diagonal > p.inner + 1 ? p.inner + 1 : p.diagonal;
    bool upper = a.op == CT_OP_TRIU;
    unsigned g = grid_for(total, a.sms);
    switch (ct_dtype_size(a.dt)) {
    case 1: tri_kernel<uint8_t><<<g, kThreads, 0, st>>>((const uint8_t *)a.x, (uint8_t *)a.out, total, p.n, p.inner, diag, upper); break;
    case 2: tri_kernel<uint16_t><<<g, kThreads, 0, st>>>((const uint16_t *)a.x, (uint16_t *)a.out, total, p.n, p.inner, diag, upper); break;
    case 4: tri_kernel<uint32_t><<<g, kThreads, 0, st>>>((const uint32_t *)a.x, (uint32_t *)a.out, total, p.n, p.inner, diag, upper); break;
    default: tri_kernel<uint64_t><<<g, kThreads, 0, st>>>((const uint64_t *)a.x, (uint64_t *)a.out, total, p.n, p.inner, diag, upper); break;
    }
    return cudaGetLastError();
}

// ---- cumsum ---------------------------------------------------------------------------------
// Acc: float for f16/bf16/f32, double for f64, uint64 (wrapping) for integers.
template <int DT> struct cum_types {
    typedef float Acc;
    typedef typename dtype<DT>::T Out;
    static __device__ __forceinline__ Out put(Acc v) { return dtype<DT>::enc(v); }
};
template <> struct cum_types<CT_F64> {
    typedef double Acc;
    typedef double Out;
    static __device__ __forceinline__ Out put(Acc v) { return v; }
};
template <int DT> struct cum_int_types {
    typedef uint64_t Acc;
    typedef int64_t Out;
    static __device__ __forceinline__ Out put(Acc v) { return (int64_t)v; }
};
template <> struct cum_types<CT_BOOL> : cum_int_types<CT_BOOL> {};
template <> struct cum_types<CT_I32> : cum_int_types<CT_I32> {};
template <> struct cum_types<CT_I64> : cum_int_types<CT_I64> {};

template <int DT>
__global__ void cumsum_kernel(const typename dtype<DT>::T *x, typename cum_types<DT>::Out *y,
                              int64_t outer, int64_t n, int64_t inner, bool reverse) {
    typedef typename cum_types<DT>::Acc Acc;
    int64_t lines = outer * inner;
    for (int64_t l = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; l < lines;
         l += (int64_t)gridDim.x * blockDim.x) {
        int64_t o = l / inner, r = l % inner;
        Acc acc = 0;
        for (int64_t t = 0; t < n; t++) {
            int64_t i = reverse ? n - 1 - t : t;
            int64_t e = (o * n + i) * inner + r;
            acc = t ? acc + (Acc)dtype<DT>::dec(x[e]) : (Acc)dtype<DT>::dec(x[e]);
            y[e] = cum_types<DT>::put(acc);
        }
    }
}

template <int DT> cudaError_t launch_cumsum_t(const cti_cuda_seq &a, cudaStream_t st) {
    const cti_seq_params &p = a.p;
    int64_t lines = p.outer * p.inner;
    cumsum_kernel<DT><<<grid_for(lines, a.sms), kThreads, 0, st>>>(
        (const typename dtype<DT>::T *)a.x, (typename cum_types<DT>::Out *)a.out, p.outer, p.n,
        p.inner, p.reverse);
    return cudaGetLastError();
}

cudaError_t launch_cumsum(const cti_cuda_seq &a, cudaStream_t st) {
    if (a.p.outer * a.p.n * a.p.inner == 0) return cudaSuccess;
    switch (a.dt) {
    case CT_BOOL: return launch_cumsum_t<CT_BOOL>(a, st);
    case CT_I32: return launch_cumsum_t<CT_I32>(a, st);
    case CT_I64: return launch_cumsum_t<CT_I64>(a, st);
    case CT_F16: return launch_cumsum_t<CT_F16>(a, st);
    case CT_BF16: return launch_cumsum_t<CT_BF16>(a, st);
    case CT_F32: return launch_cumsum_t<CT_F32>(a, st);
    case CT_F64: return launch_cumsum_t<CT_F64>(a, st);
    default: return cudaErrorInvalidValue;
    }
}

// ---- topk -----------------------------------------------------------------------------------
__device__ __forceinline__ uint64_t f64_key(double v) {
    if (v != v) return ~0ull;
    if (v == 0) v = 0.0;
    uint64_t b = (uint64_t)__double_as_longlong(v);
    return (b >> 63) ? ~b : b | (1ull << 63);
}

template <int DT> __device__ __forceinline__ uint64_t elem_key(typename dtype<DT>::T x) {
    if constexpr (DT == CT_I32 || DT == CT_I64 || DT == CT_BOOL)
        return (uint64_t)dtype<DT>::dec(x) ^ (1ull << 63);
    else
        return f64_key((double)dtype<DT>::dec(x));
}

// The selection key: larger is better.
template <int DT>
__device__ __forceinline__ uint64_t sel_key(typename dtype<DT>::T x, bool largest) {
    uint64_t k = elem_key<DT>(x);
    return largest ? k : ~k;
}

// The selection's own keys, as narrow as the dtype: 16 bits for f16/bf16,
// 32 for f32/i32, 64 for f64/i64, with the order of elem_key (NaN above all,
// -0 == +0), so that a radix select makes 2, 4 or 8 passes of 8 bits.
template <int DT> struct nkey {
    typedef typename std::conditional<(sizeof(typename dtype<DT>::T) > 4), uint64_t,
                                      uint32_t>::type K;
    static constexpr int bits = (int)sizeof(typename dtype<DT>::T) * 8;
};

template <int DT>
__device__ __forceinline__ typename nkey<DT>::K nat_key(typename dtype<DT>::T x) {
    if constexpr (DT == CT_I32) return (uint32_t)x ^ 0x80000000u;
    else if constexpr (DT == CT_I64) return (uint64_t)x ^ (1ull << 63);
    else if constexpr (DT == CT_F16 || DT == CT_BF16) {
        const uint32_t b = x, mag = b & 0x7fffu;
        const uint32_t inf = DT == CT_F16 ? 0x7c00u : 0x7f80u;
        if (mag > inf) return 0xffffu;
        if (mag == 0) return 0x8000u;
        return (b & 0x8000u) ? (~b & 0xffffu) : (b | 0x8000u);
    } else if constexpr (DT == CT_F32) {
        if (x != x) return 0xffffffffu;
        const uint32_t b = x == 0.0f ? 0u : __float_as_uint(x);
        return (b >> 31) ? ~b : b | 0x80000000u;
    } else {
        return f64_key(x);
    }
}

// The selection key: larger is better; the dtype's width.
template <int DT>
__device__ __forceinline__ typename nkey<DT>::K nsel_key(typename dtype<DT>::T x, bool largest) {
    typedef typename nkey<DT>::K K;
    constexpr K all = nkey<DT>::bits == 64 ? ~(K)0 : (K)((1ull << nkey<DT>::bits) - 1);
    const K k = nat_key<DT>(x);
    return largest ? k : (K)(~k & all);
}

template <class K> __device__ __forceinline__ bool better(K ka, int64_t ia, K kb, int64_t ib) {
    return ka > kb || (ka == kb && ia < ib);
}

// Sorts P (a power of two) keys and indices in shared memory, best first;
// every thread of the block calls it.
template <class K> __device__ void bitonic_best_first(K *sk, int64_t *si, int P) {
    for (int size = 2; size <= P; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int t = threadIdx.x; t < P / 2; t += blockDim.x) {
                int pos = 2 * t - (t & (stride - 1)), q = pos + stride;
                bool up = (pos & size) == 0;
                K ka = sk[pos], kb = sk[q];
                int64_t ia = si[pos], ib = si[q];
                bool swap = up ? better(kb, ib, ka, ia) : better(ka, ia, kb, ib);
                if (swap) {
                    sk[pos] = kb;
                    sk[q] = ka;
                    si[pos] = ib;
                    si[q] = ia;
                }
            }
            __syncthreads();
        }
    }
}

// The bucket of the k-th best key among the 256 counts h (descending digit
// order): the row's prefix and mask gain the digit, kk what remains to take
// from it.
template <class K>
__device__ __forceinline__ void pick_digit(const unsigned int *h, int shift, K &prefix, K &mask,
                                           long long &kk) {
    long long cum = 0;
    for (int b = 255; b >= 0; b--) {
        long long c = h[b];
        if (cum + c >= kk) {
            prefix |= (K)b << shift;
            mask |= (K)255 << shift;
            kk -= cum;
            return;
        }
        cum += c;
    }
}

// One block per row (grid-stride), for many rows. Shared: P keys and P
// indices (P a power of two >= k), dynamic.
template <int DT>
__global__ void __launch_bounds__(kSelThreads)
topk_select_kernel(const typename dtype<DT>::T *x, typename dtype<DT>::T *vals, int64_t *idx,
                   int64_t rows, int64_t n, int64_t k, int P, bool largest) {
    typedef typename nkey<DT>::K K;
    extern __shared__ unsigned long long smem_u64[];
    K *sk = (K *)smem_u64;
    int64_t *si = (int64_t *)(smem_u64 + ((size_t)P * sizeof(K) + 7) / 8);
    __shared__ unsigned int hist[256];
    __shared__ K s_prefix, s_mask;
    __shared__ long long s_kk;
    __shared__ int s_gt, s_eqbase;
    __shared__ int warp_cnt[kSelThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
        const typename dtype<DT>::T *xr = x + row * n;
        if (tid == 0) {
            s_prefix = 0;
            s_mask = 0;
            s_kk = k;
        }
        __syncthreads();
        for (int shift = nkey<DT>::bits - 8; shift >= 0; shift -= 8) {
            for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            const K prefix = s_prefix, mask = s_mask;
            for (int64_t i = tid; i < n; i += blockDim.x) {
                K t = nsel_key<DT>(xr[i], largest);
                if ((t & mask) == prefix) atomicAdd(&hist[(t >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (tid == 0) {
                K pf = prefix, mk = mask;
                long long kk = s_kk;
                pick_digit(hist, shift, pf, mk, kk);
                s_prefix = pf;
                s_mask = mk;
                s_kk = kk;
            }
            __syncthreads();
        }
        const K T = s_prefix;
        const long long take_eq = s_kk; // the T-keyed elements to take, lowest indices first
        const long long base_eq = k - take_eq;
        if (tid == 0) {
            s_gt = 0;
            s_eqbase = 0;
        }
        __syncthreads();
        for (int64_t b0 = 0; b0 < n; b0 += blockDim.x) {
            int64_t i = b0 + tid;
            K t = i < n ? nsel_key<DT>(xr[i], largest) : (K)0;
            bool gt = i < n && t > T, eq = i < n && t == T;
            if (gt) {
                int slot = atomicAdd(&s_gt, 1);
                sk[slot] = t;
                si[slot] = i;
            }
            unsigned bal = __ballot_sync(0xffffffffu, eq);
            if (lane == 0) warp_cnt[warp] = __popc(bal);
            __syncthreads();
            int off = s_eqbase, tot = 0;
            for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
                if (w < warp) off += warp_cnt[w];
                tot += warp_cnt[w];
            }
            int rank = off + __popc(bal & ((1u << lane) - 1u));
            if (eq && rank < take_eq) {
                sk[base_eq + rank] = t;
                si[base_eq + rank] = i;
            }
            __syncthreads();
            if (tid == 0) s_eqbase += tot;
            __syncthreads();
        }
        for (int j = (int)k + tid; j < P; j += blockDim.x) {
            sk[j] = 0;
            si[j] = INT64_MAX;
        }
        __syncthreads();
        bitonic_best_first(sk, si, P);
        for (int64_t j = tid; j < k; j += blockDim.x) {
            int64_t i = si[j];
            vals[row * k + j] = xr[i];
            idx[row * k + j] = i;
        }
        __syncthreads();
    }
}

// ---- topk of few long rows: each row split over many blocks ----------------------------------
// Per row in the scratch: the select's state, a 256-bin histogram in global
// memory that the row's blocks add their shared histograms to, each block's
// count of threshold-keyed elements, and the k winners before their sort.
// A pass is two launches (counts, then one block a row picks the digit and
// clears the counts), so nothing waits on the host. The threshold-keyed
// winners are the lowest-indexed: a block's elements rank after those of the
// blocks before it, and within a block by position.
template <class K> struct mb_state {
    K prefix, mask;
    long long kk;
    unsigned long long gt;
};

struct mb_layout {
    int64_t blocks, seg; // blocks a row, elements a block
    size_t state, hist, eqcnt, ckey, cidx, total;
};

template <class K> mb_layout layout_mb(int64_t rows, int64_t n, int64_t k, int sms) {
    mb_layout L{};
    int64_t want = ((int64_t)sms * 4 + rows - 1) / rows, most = (n + 4095) / 4096;
    L.blocks = want < most ? want : most;
    if (L.blocks < 1) L.blocks = 1;
    L.seg = (n + L.blocks - 1) / L.blocks;
    auto al = [](size_t v) { return (v + 255) & ~(size_t)255; };
    size_t o = 0;
    L.state = o; o = al(o + (size_t)rows * sizeof(mb_state<K>));
    L.hist = o; o = al(o + (size_t)rows * 256 * 4);
    L.eqcnt = o; o = al(o + (size_t)(rows * L.blocks) * 8);
    L.ckey = o; o = al(o + (size_t)(rows * k) * sizeof(K));
    L.cidx = o; o = al(o + (size_t)(rows * k) * 8);
    L.total = o;
    return L;
}

template <int DT>
__global__ void __launch_bounds__(kSelThreads)
mb_hist_kernel(const typename dtype<DT>::T *x, int64_t n, int64_t seg, bool largest,
               const mb_state<typename nkey<DT>::K> *st, unsigned int *hist, int shift) {
    typedef typename nkey<DT>::K K;
    __shared__ unsigned int h[256];
    const int64_t row = blockIdx.y, lo = blockIdx.x * seg, hi = lo + seg < n ? lo + seg : n;
    for (int b = threadIdx.x; b < 256; b += blockDim.x) h[b] = 0;
    __syncthreads();
    const K prefix = st[row].prefix, mask = st[row].mask;
    const typename dtype<DT>::T *xr = x + row * n;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        K t = nsel_key<DT>(xr[i], largest);
        if ((t & mask) == prefix) atomicAdd(&h[(t >> shift) & 255u], 1u);
    }
    __syncthreads();
    for (int b = threadIdx.x; b < 256; b += blockDim.x)
        if (h[b]) atomicAdd(&hist[row * 256 + b], h[b]);
}

template <class K>
__global__ void mb_pick_kernel(mb_state<K> *st, unsigned int *hist, int shift) {
    __shared__ unsigned int h[256];
    const int64_t row = blockIdx.x;
    for (int b = threadIdx.x; b < 256; b += blockDim.x) {
        h[b] = hist[row * 256 + b];
        hist[row * 256 + b] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        mb_state<K> s = st[row];
        pick_digit(h, shift, s.prefix, s.mask, s.kk);
        st[row] = s;
    }
}

template <int DT>
__global__ void __launch_bounds__(kSelThreads)
mb_count_eq_kernel(const typename dtype<DT>::T *x, int64_t n, int64_t seg, bool largest,
                   const mb_state<typename nkey<DT>::K> *st, long long *eqcnt) {
    typedef typename nkey<DT>::K K;
    __shared__ long long part[kSelThreads / 32];
    const int64_t row = blockIdx.y, lo = blockIdx.x * seg, hi = lo + seg < n ? lo + seg : n;
    const K T = st[row].prefix;
    const typename dtype<DT>::T *xr = x + row * n;
    long long c = 0;
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) c += nsel_key<DT>(xr[i], largest) == T;
    for (int off = 16; off > 0; off >>= 1) c += __shfl_xor_sync(0xffffffffu, c, off);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = c;
    __syncthreads();
    if (threadIdx.x == 0) {
        long long s = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) s += part[w];
        eqcnt[row * gridDim.x + blockIdx.x] = s;
    }
}

template <int DT>
__global__ void __launch_bounds__(kSelThreads)
mb_gather_kernel(const typename dtype<DT>::T *x, int64_t n, int64_t seg, int64_t k, bool largest,
                 mb_state<typename nkey<DT>::K> *st, const long long *eqcnt,
                 typename nkey<DT>::K *ckey, int64_t *cidx) {
    typedef typename nkey<DT>::K K;
    __shared__ long long s_base;
    __shared__ int warp_cnt[kSelThreads / 32];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t row = blockIdx.y, lo = blockIdx.x * seg, hi = lo + seg < n ? lo + seg : n;
    const K T = st[row].prefix;
    const long long take_eq = st[row].kk, base_eq = k - take_eq;
    if (tid == 0) {
        long long b = 0;
        for (unsigned j = 0; j < blockIdx.x; j++) b += eqcnt[row * gridDim.x + j];
        s_base = b;
    }
    __syncthreads();
    const bool want_eq = s_base < take_eq; // the same in every thread of the block
    const typename dtype<DT>::T *xr = x + row * n;
    K *ck = ckey + row * k;
    int64_t *ci = cidx + row * k;
    for (int64_t b0 = lo; b0 < hi; b0 += blockDim.x) {
        const int64_t i = b0 + tid;
        const K t = i < hi ? nsel_key<DT>(xr[i], largest) : (K)0;
        if (i < hi && t > T) {
            long long slot = (long long)atomicAdd(&st[row].gt, 1ull);
            ck[slot] = t;
            ci[slot] = i;
        }
        if (!want_eq) continue;
        const bool eq = i < hi && t == T;
        if (!__syncthreads_or(eq)) continue;
        const unsigned bal = __ballot_sync(0xffffffffu, eq);
        if (lane == 0) warp_cnt[warp] = __popc(bal);
        __syncthreads();
        long long off = s_base, tot = 0;
        for (int w = 0; w < (int)(blockDim.x >> 5); w++) {
            if (w < warp) off += warp_cnt[w];
            tot += warp_cnt[w];
        }
        const long long rank = off + __popc(bal & ((1u << lane) - 1u));
        if (eq && rank < take_eq) {
            ck[base_eq + rank] = t;
            ci[base_eq + rank] = i;
        }
        __syncthreads();
        if (tid == 0) s_base += tot;
        __syncthreads();
    }
}

// One block a row: the k winners sorted best first, then their values.
template <int DT>
__global__ void __launch_bounds__(kSelThreads)
mb_finish_kernel(const typename dtype<DT>::T *x, int64_t n, int64_t k, int P,
                 const typename nkey<DT>::K *ckey, const int64_t *cidx,
                 typename dtype<DT>::T *vals, int64_t *idx) {
    typedef typename nkey<DT>::K K;
    extern __shared__ unsigned long long smem_u64[];
    K *sk = (K *)smem_u64;
    int64_t *si = (int64_t *)(smem_u64 + ((size_t)P * sizeof(K) + 7) / 8);
    const int64_t row = blockIdx.x;
    for (int j = threadIdx.x; j < P; j += blockDim.x) {
        sk[j] = j < k ? ckey[row * k + j] : (K)0;
        si[j] = j < k ? cidx[row * k + j] : INT64_MAX;
    }
    __syncthreads();
    bitonic_best_first(sk, si, P);
    for (int64_t j = threadIdx.x; j < k; j += blockDim.x) {
        const int64_t i = si[j];
        vals[row * k + j] = x[row * n + i];
        idx[row * k + j] = i;
    }
}

template <class K> __global__ void mb_init_kernel(mb_state<K> *st, int64_t rows, int64_t k) {
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < rows;
         r += (int64_t)gridDim.x * blockDim.x)
        st[r] = mb_state<K>{0, 0, (long long)k, 0};
}

// Few rows (fewer than the multiprocessors) with more than one block's worth
// of elements each go to the split select.
bool use_multi_block(int64_t rows, int64_t n, int64_t k, int sms) {
    return k <= kSelectMax && rows < sms && n > 8192;
}

// The sort path: keys ~sel_key (ascending = best first) and in-row indices.
template <int DT>
__global__ void topk_keys_kernel(const typename dtype<DT>::T *x, uint64_t *keys, int *pos,
                                 int64_t total, int64_t n, bool largest) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < total;
         e += (int64_t)gridDim.x * blockDim.x) {
        keys[e] = ~sel_key<DT>(x[e], largest);
        pos[e] = (int)(e % n);
    }
}

__global__ void offsets_kernel(int *off, int count, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= count; i += gridDim.x * blockDim.x)
        off[i] = i * n;
}

template <class T>
__global__ void topk_take_kernel(const T *x, const int *pos, T *vals, int64_t *idx, int64_t rows,
                                 int64_t n, int64_t k) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < rows * k;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = e / k, j = e % k;
        int i = pos[r * n + j];
        vals[e] = x[r * n + i];
        idx[e] = i;
    }
}

int pow2_at_least(int64_t k) {
    int p = 1;
    while (p < k) p <<= 1;
    return p;
}

// Rows per sort group: at most 2^30 items per CUB call (its counts are int).
int64_t sort_group_rows(int64_t n) {
    int64_t g = ((int64_t)1 << 30) / (n > 0 ? n : 1);
    return g > 0 ? g : 1;
}

struct sort_layout {
    int64_t g, items;
    size_t keys, keys_out, pos, pos_out, off, temp, total; // byte offsets; temp: CUB's bytes
    size_t temp_bytes;
};

sort_layout layout_sort(int64_t rows, int64_t n) {
    sort_layout L{};
    L.g = sort_group_rows(n);
    if (L.g > rows) L.g = rows;
    L.items = L.g * n;
    size_t temp = 0;
    cub::DeviceSegmentedRadixSort::SortPairs(nullptr, temp, (const uint64_t *)nullptr,
                                             (uint64_t *)nullptr, (const int *)nullptr,
                                             (int *)nullptr, (int)L.items, (int)L.g,
                                             (const int *)nullptr, (const int *)nullptr);
    auto al = [](size_t v) { return (v + 255) & ~(size_t)255; };
    size_t o = 0;
    L.keys = o; o = al(o + (size_t)L.items * 8);
    L.keys_out = o; o = al(o + (size_t)L.items * 8);
    L.pos = o; o = al(o + (size_t)L.items * 4);
    L.pos_out = o; o = al(o + (size_t)L.items * 4);
    L.off = o; o = al(o + (size_t)(L.g + 1) * 4);
    L.temp = o; o = al(o + temp);
    L.temp_bytes = temp;
    L.total = o;
    return L;
}

template <int DT> cudaError_t launch_topk_t(const cti_cuda_seq &a, cudaStream_t st,
                                            const char **routine) {
    typedef typename dtype<DT>::T T;
    const cti_seq_params &p = a.p;
    const T *x = (const T *)a.x;
    T *vals = (T *)a.out;
    int64_t *idx = (int64_t *)a.out2;
    typedef typename nkey<DT>::K K;
    if (use_multi_block(p.outer, p.n, p.k, a.sms)) {
        *routine = "cuda_topk_split_radix_select_bitonic";
        const mb_layout L = layout_mb<K>(p.outer, p.n, p.k, a.sms);
        char *w = (char *)a.work;
        mb_state<K> *sel = (mb_state<K> *)(w + L.state);
        unsigned int *hist = (unsigned int *)(w + L.hist);
        long long *eqcnt = (long long *)(w + L.eqcnt);
        K *ckey = (K *)(w + L.ckey);
        int64_t *cidx = (int64_t *)(w + L.cidx);
        cudaError_t e = cudaMemsetAsync(hist, 0, (size_t)p.outer * 256 * 4, st);
        if (e != cudaSuccess) return e;
        mb_init_kernel<K><<<grid_for(p.outer, a.sms), kThreads, 0, st>>>(sel, p.outer, p.k);
        const dim3 grid((unsigned)L.blocks, (unsigned)p.outer);
        for (int shift = nkey<DT>::bits - 8; shift >= 0; shift -= 8) {
            mb_hist_kernel<DT><<<grid, kSelThreads, 0, st>>>(x, p.n, L.seg, p.largest, sel, hist, shift);
            mb_pick_kernel<K><<<(unsigned)p.outer, 256, 0, st>>>(sel, hist, shift);
        }
        mb_count_eq_kernel<DT><<<grid, kSelThreads, 0, st>>>(x, p.n, L.seg, p.largest, sel, eqcnt);
        mb_gather_kernel<DT><<<grid, kSelThreads, 0, st>>>(x, p.n, L.seg, p.k, p.largest, sel, eqcnt,
                                                            ckey, cidx);
        const int P = pow2_at_least(p.k);
        const size_t sh = ((size_t)P * sizeof(K) + 7) / 8 * 8 + (size_t)P * 8;
        mb_finish_kernel<DT><<<(unsigned)p.outer, kSelThreads, sh, st>>>(x, p.n, p.k, P, ckey, cidx,
                                                                        vals, idx);
        return cudaGetLastError();
    }
    if (p.k <= kSelectMax) {
        int P = pow2_at_least(p.k);
        size_t sh = ((size_t)P * sizeof(K) + 7) / 8 * 8 + (size_t)P * 8;
        int64_t blocks = p.outer < (int64_t)a.sms * 16 ? p.outer : (int64_t)a.sms * 16;
        if (blocks < 1) blocks = 1;
        *routine = "cuda_topk_radix_select_bitonic";
        topk_select_kernel<DT><<<(unsigned)blocks, kSelThreads, sh, st>>>(x, vals, idx, p.outer,
                                                                          p.n, p.k, P, p.largest);
        return cudaGetLastError();
    }
    *routine = "cuda_topk_segmented_radix_sort";
    sort_layout L = layout_sort(p.outer, p.n);
    char *w = (char *)a.work;
    uint64_t *keys = (uint64_t *)(w + L.keys), *keys_out = (uint64_t *)(w + L.keys_out);
    int *pos = (int *)(w + L.pos), *pos_out = (int *)(w + L.pos_out), *off = (int *)(w + L.off);
    offsets_kernel<<<grid_for(L.g + 1, a.sms), kThreads, 0, st>>>(off, (int)L.g, (int)p.n);
    for (int64_t r0 = 0; r0 < p.outer; r0 += L.g) {
        int64_t g = p.outer - r0 < L.g ? p.outer - r0 : L.g, items = g * p.n;
        topk_keys_kernel<DT><<<grid_for(items, a.sms), kThreads, 0, st>>>(x + r0 * p.n, keys, pos,
                                                                           items, p.n, p.largest);
        size_t temp = L.temp_bytes;
        cudaError_t e = cub::DeviceSegmentedRadixSort::SortPairs(
            (void *)(w + L.temp), temp, keys, keys_out, pos, pos_out, (int)items, (int)g, off,
            off + 1, 0, 64, st);
        if (e != cudaSuccess) return e;
        topk_take_kernel<T><<<grid_for(g * p.k, a.sms), kThreads, 0, st>>>(
            x + r0 * p.n, pos_out, vals + r0 * p.k, idx + r0 * p.k, g, p.n, p.k);
    }
    return cudaGetLastError();
}

cudaError_t launch_topk(const cti_cuda_seq &a, cudaStream_t st, const char **routine) {
    if (a.p.k == 0 || a.p.outer == 0) return cudaSuccess;
    switch (a.dt) {
    case CT_I32: return launch_topk_t<CT_I32>(a, st, routine);
    case CT_I64: return launch_topk_t<CT_I64>(a, st, routine);
    case CT_F16: return launch_topk_t<CT_F16>(a, st, routine);
    case CT_BF16: return launch_topk_t<CT_BF16>(a, st, routine);
    case CT_F32: return launch_topk_t<CT_F32>(a, st, routine);
    case CT_F64: return launch_topk_t<CT_F64>(a, st, routine);
    default: return cudaErrorInvalidValue;
    }
}

// ---- topk_backward --------------------------------------------------------------------------
template <class T>
__global__ void topk_scatter_kernel(const T *g, const int64_t *index, T *out, int64_t rows,
                                    int64_t k, int64_t n, int dim, int op,
                                    cti_cuda_fault_slot fault) {
    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < rows * k;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t i = index[e];
        if (i < 0 || i >= n) {
            report(fault, op, CTI_SEQ_BAD_INDEX, n, i, dim);
            continue;
        }
        out[(e / k) * n + i] = g[e];
    }
}

cudaError_t launch_topk_backward(const cti_cuda_seq &a, cudaStream_t st) {
    const cti_seq_params &p = a.p;
    size_t es = ct_dtype_size(a.dt);
    cudaError_t e = cudaMemsetAsync(a.out, 0, (size_t)(p.outer * p.n) * es, st);
    if (e != cudaSuccess || p.outer * p.k == 0) return e;
    unsigned g = grid_for(p.outer * p.k, a.sms);
#define SCATTER_(T)                                                                             \
    topk_scatter_kernel<T><<<g, kThreads, 0, st>>>((const T *)a.x, a.index, (T *)a.out, p.outer, \
                                                    p.k, p.n, p.dim, a.op, a.fault)
    switch (es) {
    case 2: SCATTER_(uint16_t); break;
    case 4: SCATTER_(uint32_t); break;
    default: SCATTER_(uint64_t); break;
    }
#undef SCATTER_
    return cudaGetLastError();
}

// ---- multinomial ----------------------------------------------------------------------------
constexpr int kChunks = CTI_MULTINOMIAL_CHUNKS;

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

// The uniform of draw pair t: words offset + 2t and the next (in one block
// unless the offset was set to an odd number), as cti_multinomial_uniform.
__device__ __forceinline__ double draw_uniform(uint64_t seed, uint64_t offset, uint64_t t) {
    uint64_t w = offset + 2 * t;
    uint32_t b[4];
    philox(seed, w >> 2, b);
    unsigned s = (unsigned)(w & 3);
    uint32_t a0 = s == 0 ? b[0] : s == 1 ? b[1] : s == 2 ? b[2] : b[3];
    uint32_t a1 = s == 0 ? b[1] : s == 1 ? b[2] : s == 2 ? b[3] : 0;
    if (s == 3) {
        philox(seed, (w >> 2) + 1, b);
        a1 = b[0];
    }
    return __dmul_rn(__dadd_rn(__dmul_rn((double)(a0 >> 5), 67108864.0), (double)(a1 >> 6)),
                     0x1p-53);
}

template <int DT> __device__ __forceinline__ double weight(const typename dtype<DT>::T *x, int64_t j) {
    return (double)dtype<DT>::dec(x[j]);
}

template <int DT>
__global__ void __launch_bounds__(kChunks)
multinomial_kernel(const typename dtype<DT>::T *x, void *out, cti_seq_params p, int op,
                   cti_cuda_fault_slot fault, const uint64_t *philox) {
    if (philox) { // in a CUDA graph: this replay's draws
        p.seed = philox[0];
        p.offset += philox[1];
    }
    __shared__ double P[kChunks + 1], cs[kChunks];
    __shared__ unsigned long long s_bad;
    __shared__ unsigned long long s_nnz;
    const int c = threadIdx.x;
    const int64_t n = p.n, L = (n + kChunks - 1) / kChunks;
    for (int64_t row = blockIdx.x; row < p.outer; row += gridDim.x) {
        const typename dtype<DT>::T *xr = x + row * n;
        if (c == 0) {
            s_bad = ~0ull;
            s_nnz = 0;
        }
        __syncthreads();
        int64_t a0 = c * L, a1 = a0 + L < n ? a0 + L : n;
        double s = 0.0;
        unsigned long long nnz = 0, bad = ~0ull;
        for (int64_t j = a0; j < a1; j++) {
            double w = weight<DT>(xr, j);
            if (!(w >= 0) || isinf(w)) bad = bad < (unsigned long long)j ? bad : (unsigned long long)j;
            s = __dadd_rn(s, w);
            nnz += w > 0;
        }
        cs[c] = s;
        if (bad != ~0ull) atomicMin(&s_bad, bad);
        if (nnz) atomicAdd(&s_nnz, nnz);
        __syncthreads();
        if (c == 0) {
            P[0] = 0.0;
            for (int q = 0; q < kChunks; q++) P[q + 1] = __dadd_rn(P[q], cs[q]);
        }
        __syncthreads();
        const double total = P[kChunks];
        bool ok = s_bad == ~0ull && total > 0 && (p.replacement || (long long)s_nnz >= p.k);
        if (!ok) {
            if (c == 0) {
                if (s_bad != ~0ull) {
                    double w = weight<DT>(xr, (int64_t)s_bad);
                    report(fault, op, CTI_SEQ_BAD_WEIGHT, __double_as_longlong(w),
                           (long long)s_bad, row);
                } else if (!(total > 0)) {
                    report(fault, op, CTI_SEQ_ZERO_ROW, 0, 0, row);
                } else {
                    report(fault, op, CTI_SEQ_FEW_NONZERO, (long long)s_nnz, p.k, row);
                }
            }
            // defined results: category 0, or keys that rank the categories in order
            if (p.replacement)
                for (int64_t q = c; q < p.k; q += blockDim.x) ((int64_t *)out)[row * p.k + q] = 0;
            else
                for (int64_t j = c; j < n; j += blockDim.x) ((double *)out)[row * n + j] = -1.0;
        } else if (p.replacement) {
            int64_t *o = (int64_t *)out + row * p.k;
            for (int64_t q = c; q < p.k; q += blockDim.x) {
                double u = draw_uniform(p.seed, p.offset, (uint64_t)(row * p.k + q));
                double target = __dmul_rn(u, total);
                int lo = 0, hi = kChunks;
                while (lo < hi) {
                    int mid = (lo + hi) / 2;
                    if (P[mid + 1] > target) hi = mid;
                    else lo = mid + 1;
                }
                int64_t pick = -1;
                if (lo < kChunks) {
                    int64_t b0 = lo * L, b1 = b0 + L < n ? b0 + L : n;
                    double run = 0.0;
                    for (int64_t j = b0; j < b1; j++) {
                        run = __dadd_rn(run, weight<DT>(xr, j));
                        if (__dadd_rn(P[lo], run) > target) {
                            pick = j;
                            break;
                        }
                    }
                }
                if (pick < 0) {
                    pick = 0;
                    for (int64_t j = n - 1; j > 0; j--)
                        if (weight<DT>(xr, j) > 0) {
                            pick = j;
                            break;
                        }
                }
                o[q] = pick;
            }
        } else {
            double *keys = (double *)out + row * n;
            for (int64_t j = c; j < n; j += blockDim.x) {
                double w = weight<DT>(xr, j);
                if (w == 0) {
                    keys[j] = -1.0;
                    continue;
                }
                double u = draw_uniform(p.seed, p.offset, (uint64_t)(row * n + j));
                double e = __dsub_rn(0.0, log(__dsub_rn(1.0, u)));
                keys[j] = __ddiv_rn(w, e);
            }
        }
        __syncthreads();
    }
}

template <int DT> cudaError_t launch_multinomial_t(const cti_cuda_seq &a, cudaStream_t st) {
    int64_t blocks = a.p.outer < (int64_t)a.sms * 16 ? a.p.outer : (int64_t)a.sms * 16;
    if (blocks < 1) blocks = 1;
    multinomial_kernel<DT><<<(unsigned)blocks, kChunks, 0, st>>>(
        (const typename dtype<DT>::T *)a.x, a.out, a.p, a.op, a.fault, a.philox);
    return cudaGetLastError();
}

cudaError_t launch_multinomial(const cti_cuda_seq &a, cudaStream_t st) {
    if (a.p.outer == 0) return cudaSuccess;
    switch (a.dt) {
    case CT_F16: return launch_multinomial_t<CT_F16>(a, st);
    case CT_BF16: return launch_multinomial_t<CT_BF16>(a, st);
    case CT_F32: return launch_multinomial_t<CT_F32>(a, st);
    case CT_F64: return launch_multinomial_t<CT_F64>(a, st);
    default: return cudaErrorInvalidValue;
    }
}

} // namespace
} // namespace cti

extern "C" size_t cti_cuda_seq_work(const cti_cuda_seq *a) {
    if (a->op != CT_OP_TOPK || a->p.outer == 0 || a->p.k == 0) return 0;
    if (cti::use_multi_block(a->p.outer, a->p.n, a->p.k, a->sms)) {
        const bool wide = a->dt == CT_F64 || a->dt == CT_I64;
        return wide ? cti::layout_mb<uint64_t>(a->p.outer, a->p.n, a->p.k, a->sms).total
                    : cti::layout_mb<uint32_t>(a->p.outer, a->p.n, a->p.k, a->sms).total;
    }
    if (a->p.k <= cti::kSelectMax) return 0;
    return cti::layout_sort(a->p.outer, a->p.n).total;
}

extern "C" cudaError_t cti_cuda_seq_launch(const cti_cuda_seq *a, cudaStream_t stream,
                                           const char **routine) {
    switch (a->op) {
    case CT_OP_TRIL:
    case CT_OP_TRIU: *routine = a->op == CT_OP_TRIL ? "cuda_tril" : "cuda_triu"; return cti::launch_tri(*a, stream);
    case CT_OP_CUMSUM: *routine = "cuda_cumsum_lines"; return cti::launch_cumsum(*a, stream);
    case CT_OP_TOPK: return cti::launch_topk(*a, stream, routine);
    case CT_OP_TOPK_BACKWARD: *routine = "cuda_topk_backward_scatter"; return cti::launch_topk_backward(*a, stream);
    case CT_OP_MULTINOMIAL:
        *routine = a->p.replacement ? "cuda_multinomial_inverse_cdf" : "cuda_multinomial_exp_keys";
        return cti::launch_multinomial(*a, stream);
    default: return cudaErrorInvalidValue;
    }
}
