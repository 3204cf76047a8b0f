// Reduction kernels: sum, mean, prod, var/std, norm, max/min (values, or
// values and indices) and argmax/argmin over any set of dims.
//
// Every output owns a set of lanes; lane L folds reduction positions
// L, L + NL, L + 2 NL, ... in order, and the lanes are merged in a fixed
// tree: warp shuffles then shared memory inside a block, then, when the
// reduction is split over several blocks, one pass over the blocks' partial
// results in block order. The lanes and splits depend on the shapes only, so
// results are the same from run to run. f16/bf16/f32 accumulate in f32, f64
// in f64, integers and bool in int64 (sums and products wrap).
//
// Two thread layouts: "rows" when the reduced elements of an output are
// closer together in memory than neighbouring outputs (a warp walks along a
// row), "columns" otherwise (a warp covers 32 neighbouring outputs and their
// lanes are spread over threadIdx.y).
#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

constexpr int kRedThreads = 256;
enum { P_TWO, P_ONE, P_INF, P_NINF, P_ZERO, P_GEN };

template <class A> struct Acc {
    A s, m2;      // sum / product / extreme / running mean; var: squared deviations
    int64_t n;    // elements folded
    int64_t idx;  // arg kinds: the position of s
};

template <int DT> struct acc_of { typedef float A; };
template <> struct acc_of<CT_F64> { typedef double A; };
template <> struct acc_of<CT_BOOL> { typedef int64_t A; };
template <> struct acc_of<CT_I32> { typedef int64_t A; };
template <> struct acc_of<CT_I64> { typedef int64_t A; };

struct Geo {
    const void *x;
    void *out;
    int64_t *idx;
    void *work;
    int nk, nr;
    int64_t ksh[CT_MAX_DIMS], kst[CT_MAX_DIMS];
    int64_t rsh[CT_MAX_DIMS], rst[CT_MAX_DIMS];
    int64_t O, R;
    double p;
    int pk;
    bool want_std, col;
    bool wide;     // float16/bfloat16 values stored as float32 (the accumulator, unrounded)
    bool by_block; // partials stored block by block, work[s * O + o] (else work[o * S + s])
    int S;         // blocks sharing one output's reduction
    const void *gelu_x; // reduce_vec_columns<.., true>: the pre-activation, laid out as x
    bool gelu_tanh;
};

__device__ __forceinline__ float mabs(float x) { return fabsf(x); }
__device__ __forceinline__ double mabs(double x) { return fabs(x); }
__device__ __forceinline__ float mpow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double mpow(double x, double y) { return pow(x, y); }
__device__ __forceinline__ float msqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double msqrt(double x) { return sqrt(x); }

template <class A> __device__ __forceinline__ A pick_max(A a, A b) {
    return ((b > a) | (b != b)) ? b : a;
}
template <class A> __device__ __forceinline__ A pick_min(A a, A b) {
    return ((b < a) | (b != b)) ? b : a;
}

// (v, vi) beats (r, ri): the first NaN, else the larger (smaller) value, else
// the smaller position. A total order, so any merge tree gives one answer.
template <class A>
__device__ __forceinline__ bool better(A v, int64_t vi, A r, int64_t ri, bool ismin) {
    if (r != r) return v != v && vi < ri;
    if (v != v) return true;
    if (ismin ? v < r : v > r) return true;
    return v == r && vi < ri;
}

template <int K> constexpr bool min_kind = K == CTI_RED_MIN || K == CTI_RED_ARGMIN;

template <int K, int DT> struct Red {
    typedef typename dtype<DT>::T T;
    typedef typename acc_of<DT>::A A;
    static constexpr bool flt = std::is_floating_point<A>::value;
    // The values' dtype: int64 for integer sums and products.
    static constexpr int ODT = (!flt && (K == CTI_RED_SUM || K == CTI_RED_PROD)) ? CT_I64 : DT;

    static __device__ __forceinline__ Acc<A> init(const Geo &g) {
        Acc<A> a;
        a.s = 0;
        a.m2 = 0;
        a.n = 0;
        a.idx = -1;
        if (K == CTI_RED_PROD) a.s = 1;
        if constexpr (flt)
            if (K == CTI_RED_NORM && g.pk == P_NINF) a.s = (A)INFINITY;
        return a;
    }

    static __device__ __forceinline__ void fold(Acc<A> &a, T raw, int64_t r, const Geo &g) {
        A v = (A)dtype<DT>::dec(raw);
        if constexpr (K == CTI_RED_SUM || K == CTI_RED_MEAN) {
            if constexpr (flt) a.s += v;
            else a.s = (A)((uint64_t)a.s + (uint64_t)v);
        } else if constexpr (K == CTI_RED_PROD) {
            if constexpr (flt) a.s *= v;
            else a.s = (A)((uint64_t)a.s * (uint64_t)v);
        } else if constexpr (K == CTI_RED_NORM) {
            switch (g.pk) {
            case P_TWO: a.s += v * v; break;
            case P_ONE: a.s += mabs(v); break;
            case P_ZERO: a.s += v != 0 ? (A)1 : (A)0; break;
            case P_INF: a.s = pick_max(a.s, mabs(v)); break;
            case P_NINF: a.s = pick_min(a.s, mabs(v)); break;
            default: a.s += mpow(mabs(v), (A)g.p); break;
            }
        } else if constexpr (K == CTI_RED_VAR) {
            a.n++;
            A d = v - a.s;
            a.s += d / (A)a.n;
            a.m2 += d * (v - a.s);
            return;
        } else if constexpr (K == CTI_RED_MAX || K == CTI_RED_MIN) {
            if (a.n == 0) a.s = v;
            else if constexpr (flt) a.s = min_kind<K> ? pick_min(a.s, v) : pick_max(a.s, v);
            else a.s = min_kind<K> ? (v < a.s ? v : a.s) : (v > a.s ? v : a.s);
        } else {
            if (a.n == 0 || better(v, r, a.s, a.idx, min_kind<K>)) {
                a.s = v;
                a.idx = r;
            }
        }
        a.n++;
    }

    // Folds b into a.
    static __device__ __forceinline__ void merge(Acc<A> &a, const Acc<A> &b, const Geo &g) {
        if constexpr (K == CTI_RED_SUM || K == CTI_RED_MEAN) {
            if constexpr (flt) a.s += b.s;
            else a.s = (A)((uint64_t)a.s + (uint64_t)b.s);
        } else if constexpr (K == CTI_RED_PROD) {
            if constexpr (flt) a.s *= b.s;
            else a.s = (A)((uint64_t)a.s * (uint64_t)b.s);
        } else if constexpr (K == CTI_RED_NORM) {
            if (g.pk == P_INF) a.s = pick_max(a.s, b.s);
            else if (g.pk == P_NINF) a.s = pick_min(a.s, b.s);
            else a.s += b.s;
        } else if constexpr (K == CTI_RED_VAR) {
            if (b.n == 0) return;
            if (a.n == 0) {
                a = b;
                return;
            }
            A na = (A)a.n, nb = (A)b.n, n = na + nb;
            A d = b.s - a.s;
            a.s += d * (nb / n);
            a.m2 += b.m2 + d * d * (na * nb / n);
        } else if constexpr (K == CTI_RED_MAX || K == CTI_RED_MIN) {
            if (b.n == 0) return;
            if (a.n == 0) a.s = b.s;
            else if constexpr (flt) a.s = min_kind<K> ? pick_min(a.s, b.s) : pick_max(a.s, b.s);
            else a.s = min_kind<K> ? (b.s < a.s ? b.s : a.s) : (b.s > a.s ? b.s : a.s);
        } else {
            if (b.n == 0) return;
            if (a.n == 0 || better(b.s, b.idx, a.s, a.idx, min_kind<K>)) {
                a.s = b.s;
                a.idx = b.idx;
            }
        }
        a.n += b.n;
    }

    static __device__ __forceinline__ void finish(const Acc<A> &a, int64_t o, const Geo &g) {
        if (g.idx) g.idx[o] = a.idx;
        if (!g.out) return;
        A v = a.s;
        if constexpr (flt) {
            if (K == CTI_RED_MEAN) v = a.s / (A)g.R;
            if (K == CTI_RED_VAR) {
                A div = (A)a.n > (A)g.p ? (A)a.n - (A)g.p : (A)0;
                v = a.m2 / div;
                if (g.want_std) v = msqrt(v);
            }
            if (K == CTI_RED_NORM) {
                if (g.pk == P_TWO) v = msqrt(a.s);
                else if (g.pk == P_GEN) v = mpow(a.s, (A)(1.0 / g.p));
            }
        }
        if constexpr (flt && sizeof(T) == 2) {
            if (g.wide) {
                ((float *)g.out)[o] = (float)v;
                return;
            }
        }
        ((typename dtype<ODT>::T *)g.out)[o] = dtype<ODT>::enc(v);
    }
};

template <class A> __device__ __forceinline__ Acc<A> shfl_down(const Acc<A> &a, int off) {
    Acc<A> b;
    b.s = __shfl_down_sync(0xffffffffu, a.s, off);
    b.m2 = __shfl_down_sync(0xffffffffu, a.m2, off);
    b.n = __shfl_down_sync(0xffffffffu, a.n, off);
    b.idx = __shfl_down_sync(0xffffffffu, a.idx, off);
    return b;
}

__device__ __forceinline__ int64_t kept_offset(const Geo &g, int64_t o) {
    int64_t off = 0;
    for (int d = g.nk - 1; d >= 0; d--) {
        int64_t q = o / g.ksh[d];
        off += (o - q * g.ksh[d]) * g.kst[d];
        o = q;
    }
    return off;
}

__device__ __forceinline__ int64_t red_offset(const Geo &g, int64_t r) {
    if (g.nr == 1) return r * g.rst[0];
    int64_t off = 0;
    for (int d = g.nr - 1; d >= 0; d--) {
        int64_t q = r / g.rsh[d];
        off += (r - q * g.rsh[d]) * g.rst[d];
        r = q;
    }
    return off;
}

template <int K, int DT>
__global__ void __launch_bounds__(kRedThreads) reduce_kernel(const Geo g) {
    typedef Red<K, DT> RD;
    typedef typename RD::A A;
    __shared__ Acc<A> sh[kRedThreads];
    const int ol = g.col ? threadIdx.x : threadIdx.y;  // output within the block
    const int ll = g.col ? threadIdx.y : threadIdx.x;  // lane within the block
    const int OB = g.col ? blockDim.x : blockDim.y;
    const int LB = g.col ? blockDim.y : blockDim.x;
    const int64_t o = (int64_t)blockIdx.x * OB + ol;
    const int64_t NL = (int64_t)g.S * LB;
    Acc<A> a = RD::init(g);
    if (o < g.O) {
        const typename RD::T *x = (const typename RD::T *)g.x + kept_offset(g, o);
        for (int64_t r = (int64_t)blockIdx.y * LB + ll; r < g.R; r += NL)
            RD::fold(a, x[red_offset(g, r)], r, g);
    }
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
    if (!g.col) {
        // A row's lanes are whole warps: shuffles, then the warps in order.
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            Acc<A> b = shfl_down(a, off);
            RD::merge(a, b, g);
        }
        if ((threadIdx.x & 31) == 0) sh[tid >> 5] = a;
        __syncthreads();
        if (threadIdx.x != 0) return;
        const int w0 = tid >> 5, nw = blockDim.x >> 5;
        a = sh[w0];
        for (int w = 1; w < nw; w++) RD::merge(a, sh[w0 + w], g);
    } else {
        sh[tid] = a;
        __syncthreads();
        for (int s = blockDim.y >> 1; s > 0; s >>= 1) {
            if ((int)threadIdx.y < s) {
                Acc<A> b = sh[tid + s * blockDim.x];
                RD::merge(sh[tid], b, g);
            }
            __syncthreads();
        }
        if (threadIdx.y != 0) return;
        a = sh[tid];
    }
    if (o >= g.O) return;
    if (g.S == 1) RD::finish(a, o, g);
    else ((Acc<A> *)g.work)[o * g.S + blockIdx.y] = a;
}

// Merges the S partial results of each output in block order (the same
// order for either layout of the partials).
template <int K, int DT> __global__ void __launch_bounds__(kRedThreads) reduce_finish(const Geo g) {
    typedef Red<K, DT> RD;
    typedef typename RD::A A;
    const int64_t o = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (o >= g.O) return;
    const Acc<A> *p = (const Acc<A> *)g.work + (g.by_block ? o : o * g.S);
    const int64_t step = g.by_block ? g.O : 1; // by block: a warp reads consecutive outputs
    Acc<A> a = p[0];
    for (int s = 1; s < g.S; s++) RD::merge(a, p[s * step], g);
    RD::finish(a, o, g);
}

// Sums and means over the rows of a matrix whose outputs are contiguous
// (x[r * rs + o], a linear layer's bias gradient): each thread owns the VEC
// outputs of one 16-byte vector and folds rows L, L + NL, ... of them in
// order, four loads in flight; the lanes of a block (threadIdx.y) merge in a
// fixed tree, the blocks sharing a column (blockIdx.y) in reduce_finish. The
// general kernel's columns layout loads one element a thread, 64 bytes a
// warp, and on bf16 [16384, 3072] ran at a sixth of the copy rate.
// DG (sums only): x is a gradient that gelu's backward is folded into on the
// way: each element becomes x * gelu'(pre) (pre at gelu_x, x's layout),
// rounded to x's dtype, is stored back in place and summed as stored, as
// gelu_backward followed by the sum computes it, in one pass over the matrix.
template <int K, int DT, bool DG>
__global__ void __launch_bounds__(kRedThreads) reduce_vec_columns(const Geo g) {
    typedef Red<K, DT> RD;
    typedef typename RD::A A;
    typedef typename RD::T T;
    constexpr int VEC = 16 / sizeof(T);
    __shared__ A sh[kRedThreads * VEC];
    const int64_t o0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * VEC;
    const int64_t NL = (int64_t)g.S * blockDim.y, rs = g.rst[0];
    A acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; i++) acc[i] = 0;
    if (o0 < g.O) {
        T *x = (T *)g.x + o0;
        const T *pre = DG ? (const T *)g.gelu_x + o0 : nullptr;
        int64_t r = (int64_t)blockIdx.y * blockDim.y + threadIdx.y;
        auto fold = [&](uint4 u, const uint4 &pu, int64_t at) {
            T raw[VEC];
            memcpy(raw, &u, 16);
            if constexpr (DG) {
                T praw[VEC];
                memcpy(praw, &pu, 16);
#pragma unroll
                for (int i = 0; i < VEC; i++)
                    if constexpr (DT == CT_F16 || DT == CT_BF16)
                        raw[i] = dtype<DT>::enc(dtype<DT>::dec(raw[i]) *
                                                gelu_grad_half(dtype<DT>::dec(praw[i]), g.gelu_tanh));
                    else
                        raw[i] = dtype<DT>::enc(dtype<DT>::dec(raw[i]) *
                                                gelu_grad(dtype<DT>::dec(praw[i]), g.gelu_tanh));
                memcpy(&u, raw, 16);
                *reinterpret_cast<uint4 *>(x + at) = u;
            }
#pragma unroll
            for (int i = 0; i < VEC; i++) acc[i] += (A)dtype<DT>::dec(raw[i]);
        };
        const uint4 none = make_uint4(0, 0, 0, 0);
        for (; r + 3 * NL < g.R; r += 4 * NL) {
            uint4 u[4], pu[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                u[k] = *reinterpret_cast<const uint4 *>(x + (r + k * NL) * rs);
                pu[k] = DG ? *reinterpret_cast<const uint4 *>(pre + (r + k * NL) * rs) : none;
            }
#pragma unroll
            for (int k = 0; k < 4; k++) fold(u[k], pu[k], (r + k * NL) * rs);
        }
        for (; r < g.R; r += NL)
            fold(*reinterpret_cast<const uint4 *>(x + r * rs),
                 DG ? *reinterpret_cast<const uint4 *>(pre + r * rs) : none, r * rs);
    }
    const int tid = threadIdx.y * blockDim.x + threadIdx.x;
#pragma unroll
    for (int i = 0; i < VEC; i++) sh[tid * VEC + i] = acc[i];
    __syncthreads();
    for (int s = blockDim.y >> 1; s > 0; s >>= 1) {
        if ((int)threadIdx.y < s)
#pragma unroll
            for (int i = 0; i < VEC; i++) sh[tid * VEC + i] += sh[(tid + s * blockDim.x) * VEC + i];
        __syncthreads();
    }
    if (threadIdx.y != 0 || o0 >= g.O) return;
#pragma unroll
    for (int i = 0; i < VEC; i++) {
        Acc<A> a = RD::init(g);
        a.s = sh[tid * VEC + i];
        if (g.S == 1) RD::finish(a, o0 + i, g);
        else ((Acc<A> *)g.work)[(int64_t)blockIdx.y * g.O + o0 + i] = a;
    }
}

// ---- host side ----------------------------------------------------------------------------------
struct Plan {
    bool col, vec; // vec: reduce_vec_columns
    int bx, by, S;
    int64_t blocks;
};

bool aligned16(const void *p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// reduce_vec_columns takes floating sums and means over one reduced dim of
// a matrix whose outputs are contiguous, in 16-byte vectors at 16-byte
// aligned addresses.
bool vec_columns(const cti_cuda_red *r) {
    if (r->kind != CTI_RED_SUM && r->kind != CTI_RED_MEAN) return false;
    if (!ct_dtype_is_floating(r->dt) || r->nk != 1 || r->nr != 1 || r->kst[0] != 1) return false;
    const int64_t vec = 16 / (int64_t)ct_dtype_size(r->dt);
    return r->O % vec == 0 && r->rst[0] > 0 && r->rst[0] % vec == 0 && r->R >= 32 &&
           aligned16(r->x);
}

Plan plan(const cti_cuda_red *r) {
    Plan p;
    int64_t R = r->R, O = r->O;
    p.vec = vec_columns(r);
    if (p.vec) {
        // 32 vectors of outputs a block by 8 lanes (fewer vectors for a
        // narrow matrix, more lanes); blocks share a column until there are
        // about a thousand, each lane keeping 16 rows or more.
        const int64_t nvec = O / (16 / (int64_t)ct_dtype_size(r->dt));
        p.col = true;
        p.bx = nvec >= 32 ? 32 : nvec >= 16 ? 16 : 8;
        p.by = kRedThreads / p.bx;
        p.blocks = (nvec + p.bx - 1) / p.bx;
        int64_t s = R / ((int64_t)p.by * 16);
        int64_t want = (1024 + p.blocks - 1) / p.blocks;
        if (s > want) s = want;
        if (s > 1024) s = 1024;
        p.S = s > 1 ? (int)s : 1;
        return p;
    }
    int64_t ks = r->nk ? r->kst[r->nk - 1] : 0, rs = r->nr ? r->rst[r->nr - 1] : 0;
    if (ks < 0) ks = -ks;
    if (rs < 0) rs = -rs;
    p.col = r->nk > 0 && (r->nr == 0 || ks < rs || R < 32);
    if (!p.col) {
        p.bx = R >= 4096 ? 256 : R >= 1024 ? 128 : R >= 256 ? 64 : 32;
        p.by = kRedThreads / p.bx;
    } else {
        p.by = R >= 128 ? 8 : R >= 16 ? 2 : 1;
        p.bx = kRedThreads / p.by;
    }
    int ob = p.col ? p.bx : p.by, lb = p.col ? p.by : p.bx;
    p.blocks = (O + ob - 1) / ob;
    // Split long reductions over blocks until there are a few hundred, each
    // lane keeping at least 32 elements.
    int64_t s = R / ((int64_t)lb * 32);
    int64_t want = (512 + p.blocks - 1) / p.blocks;
    if (s > want) s = want;
    if (s > 1024) s = 1024;
    p.S = s > 1 ? (int)s : 1;
    return p;
}

template <class A> size_t work_bytes(const cti_cuda_red *r, const Plan &p) {
    return p.S > 1 ? (size_t)r->O * (size_t)p.S * sizeof(Acc<A>) : 0;
}

size_t work_for(const cti_cuda_red *r) {
    Plan p = plan(r);
    if (r->dt == CT_F64) return work_bytes<double>(r, p);
    if (ct_dtype_is_floating(r->dt)) return work_bytes<float>(r, p);
    return work_bytes<int64_t>(r, p);
}

int norm_kind(double p) {
    if (p == 2) return P_TWO;
    if (p == 1) return P_ONE;
    if (p == 0) return P_ZERO;
    if (p == INFINITY) return P_INF;
    if (p == -INFINITY) return P_NINF;
    return P_GEN;
}

template <int K, int DT>
cudaError_t launch(const cti_cuda_red *r, cudaStream_t st, const char **routine) {
    Plan p = plan(r);
    Geo g;
    memset(&g, 0, sizeof g);
    g.x = r->x;
    g.out = r->out;
    g.wide = r->odt == CT_F32 && (r->dt == CT_F16 || r->dt == CT_BF16);
    g.idx = r->idx;
    g.work = r->work;
    g.nk = r->nk;
    g.nr = r->nr;
    for (int d = 0; d < CT_MAX_DIMS; d++) {
        g.ksh[d] = r->ksh[d];
        g.kst[d] = r->kst[d];
        g.rsh[d] = r->rsh[d];
        g.rst[d] = r->rst[d];
    }
    g.O = r->O;
    g.R = r->R;
    g.p = r->p;
    g.pk = K == CTI_RED_NORM ? norm_kind(r->p) : 0;
    g.want_std = r->want_std;
    g.col = p.col;
    g.by_block = p.vec;
    g.S = p.S;
    g.gelu_x = r->gelu_x;
    g.gelu_tanh = r->gelu_tanh;
    if (p.S > 1 && !r->work) return cudaErrorInvalidValue;
    if (r->gelu_x && (K != CTI_RED_SUM || !p.vec || !aligned16(r->gelu_x)))
        return cudaErrorInvalidValue;
    static const char *const names[6] = {"cuda_reduce_rows",          "cuda_reduce_columns",
                                         "cuda_reduce_rows_split",    "cuda_reduce_columns_split",
                                         "cuda_reduce_columns_vec16", "cuda_reduce_columns_vec16_split"};
    *routine = names[p.vec ? 4 + (p.S > 1 ? 1 : 0) : (p.col ? 1 : 0) + (p.S > 1 ? 2 : 0)];
    if constexpr ((K == CTI_RED_SUM || K == CTI_RED_MEAN) && std::is_floating_point<typename acc_of<DT>::A>::value) {
        const dim3 grid((unsigned)p.blocks, (unsigned)p.S), block(p.bx, p.by);
        if (r->gelu_x) {
            if constexpr (K == CTI_RED_SUM) {
                *routine = p.S > 1 ? "cuda_gelu_backward_column_sums_vec16_split"
                                   : "cuda_gelu_backward_column_sums_vec16";
                reduce_vec_columns<K, DT, true><<<grid, block, 0, st>>>(g);
            }
        } else if (p.vec)
            reduce_vec_columns<K, DT, false><<<grid, block, 0, st>>>(g);
        else
            reduce_kernel<K, DT><<<dim3((unsigned)p.blocks, (unsigned)p.S), dim3(p.bx, p.by), 0, st>>>(g);
    } else {
        if (p.vec || r->gelu_x) return cudaErrorInvalidValue;
        reduce_kernel<K, DT><<<dim3((unsigned)p.blocks, (unsigned)p.S), dim3(p.bx, p.by), 0, st>>>(g);
    }
    if (p.S > 1) {
        cudaError_t e = cudaGetLastError();
        if (e != cudaSuccess) return e;
        reduce_finish<K, DT><<<(unsigned)((r->O + kRedThreads - 1) / kRedThreads), kRedThreads, 0,
                               st>>>(g);
    }
    return cudaGetLastError();
}

typedef cudaError_t (*red_fn)(const cti_cuda_red *, cudaStream_t, const char **);

template <int K> red_fn pick(int dt) {
    constexpr bool float_only = K == CTI_RED_MEAN || K == CTI_RED_VAR || K == CTI_RED_NORM;
    switch (dt) {
    case CT_F16: return launch<K, CT_F16>;
    case CT_BF16: return launch<K, CT_BF16>;
    case CT_F32: return launch<K, CT_F32>;
    case CT_F64: return launch<K, CT_F64>;
    default: break;
    }
    if constexpr (!float_only) {
        switch (dt) {
        case CT_BOOL: return launch<K, CT_BOOL>;
        case CT_I32: return launch<K, CT_I32>;
        case CT_I64: return launch<K, CT_I64>;
        default: break;
        }
    }
    return nullptr;
}

red_fn find(int kind, int dt) {
    switch (kind) {
    case CTI_RED_SUM: return pick<CTI_RED_SUM>(dt);
    case CTI_RED_MEAN: return pick<CTI_RED_MEAN>(dt);
    case CTI_RED_PROD: return pick<CTI_RED_PROD>(dt);
    case CTI_RED_VAR: return pick<CTI_RED_VAR>(dt);
    case CTI_RED_NORM: return pick<CTI_RED_NORM>(dt);
    case CTI_RED_MAX: return pick<CTI_RED_MAX>(dt);
    case CTI_RED_MIN: return pick<CTI_RED_MIN>(dt);
    case CTI_RED_ARGMAX: return pick<CTI_RED_ARGMAX>(dt);
    case CTI_RED_ARGMIN: return pick<CTI_RED_ARGMIN>(dt);
    default: return nullptr;
    }
}

} // namespace
} // namespace cti

extern "C" {

size_t cti_cuda_reduce_work(const cti_cuda_red *r) { return cti::work_for(r); }

bool cti_cuda_reduce_vec_columns(const cti_cuda_red *r) { return cti::vec_columns(r); }

cudaError_t cti_cuda_reduce(const cti_cuda_red *r, cudaStream_t stream, const char **routine) {
    cti::red_fn fn = cti::find(r->kind, r->dt);
    if (!fn) return cudaErrorInvalidValue;
    return fn(r, stream, routine);
}

} // extern "C"
