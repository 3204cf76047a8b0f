// Fused optimizer updates: SGD (momentum, dampening, nesterov, weight decay),
// AdamW, Adam (amsgrad), RMSprop (momentum, centered) and Adagrad (lr_decay)
// over up to CTI_CUDA_OPTIM_MAX parameters in one launch, and a
// gradient scaler's non-finite check + unscale (multi-tensor) and scale
// update.
//
// Every tensor is cut into chunks of kChunk elements; the chunks of all
// tensors are numbered one after the other and block b takes chunks b,
// b + gridDim.x, ... . A block finds its tensor by scanning the chunk
// offsets (in the launch arguments). Thread t of a block handles the groups
// of kVec consecutive elements t, t + 256, ... of its chunk, each group one
// 16-byte load per float32 tensor (8 bytes for float16/bfloat16) where the
// tensor's address allows it: all loads of a chunk are issued before any
// arithmetic, then every tensor is written once. float16/bfloat16/float32
// compute in float, float64 in double.
//
// Step counts in memory (capturable): each block reads the count and the
// learning rate, the per-parameter scalars (bias corrections) are computed
// in double in the kernel (once per parameter a block meets), and the last
// block to finish (a counter in ctl[1]) advances the counts, so no block
// can read a count already advanced. A found_inf that is not zero makes
// every block return before writing anything or counting.
#include <cstring>

#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

constexpr int kOptThreads = 256;
constexpr int kVec = 4;
constexpr int kIlp = 2;
constexpr int kChunk = kOptThreads * kVec * kIlp;
constexpr int kMax = CTI_CUDA_OPTIM_MAX;
constexpr int kAmpMax = CTI_CUDA_AMP_MAX;

template <int DT> struct opmath { typedef float A; };
template <> struct opmath<CT_F64> { typedef double A; };

// kVec elements of T, aligned so that one access moves them all.
template <class T> struct alignas(sizeof(T) * kVec) Pack {
    T v[kVec];
};

// Group i..i+kVec of ptr (elements at or past n read as zero bits).
template <class T>
__device__ __forceinline__ void load_pack(const T *ptr, int64_t i, int64_t n, bool vec,
                                          T (&out)[kVec]) {
    if (vec && i + kVec <= n) {
        const Pack<T> p = *reinterpret_cast<const Pack<T> *>(ptr + i);
#pragma unroll
        for (int j = 0; j < kVec; j++) out[j] = p.v[j];
    } else {
#pragma unroll
        for (int j = 0; j < kVec; j++) out[j] = i + j < n ? ptr[i + j] : T();
    }
}

template <class T>
__device__ __forceinline__ void store_pack(T *ptr, int64_t i, int64_t n, bool vec,
                                           const T (&in)[kVec]) {
    if (vec && i + kVec <= n) {
        Pack<T> p;
#pragma unroll
        for (int j = 0; j < kVec; j++) p.v[j] = in[j];
        *reinterpret_cast<Pack<T> *>(ptr + i) = p;
    } else {
#pragma unroll
        for (int j = 0; j < kVec; j++)
            if (i + j < n) ptr[i + j] = in[j];
    }
}

// The chunk index c's tensor: the last t with start[t] <= c.
__device__ __forceinline__ int tensor_of(const int64_t *start, int64_t c) {
    int t = 0;
    while (c >= start[t + 1]) t++;
    return t;
}

// ---- optimizer updates ------------------------------------------------------------------

// The launch arguments (static_assert below: within the 4 KB of a launch).
struct OptArgs {
    void *p[kMax];
    const void *g[kMax];
    void *s0[kMax];
    void *s1[kMax];
    void *s2[kMax];
    void *model[kMax];
    double *step[kMax];
    int64_t numel[kMax];
    int64_t start[kMax + 1]; // first chunk of each parameter; start[n]: all chunks
    double cnt[kMax];
    double *ctl;
    const float *found_inf;
    double lr, wd, beta1, beta2, eps, momentum, dampening, lr_decay;
    int n;
    bool vec[kMax]; // every address of parameter k allows packed accesses
    bool nesterov, has_momentum, amsgrad, centered;
};
static_assert(sizeof(OptArgs) <= 4096, "optimizer launch arguments exceed 4 KB");

// Storage and compute types: the parameter's dtype DT, or float32 masters
// and states for a DT parameter (MASTER).
template <int DT, bool MASTER> struct OptTypes {
    typedef typename dtype<DT>::T G; // gradient, and the model copy with masters
    typedef typename opmath<DT>::A A;
    typedef typename std::conditional<MASTER, float, typename dtype<DT>::T>::type P;
    static __device__ __forceinline__ A dec(P x) {
        if constexpr (MASTER) return x;
        else return dtype<DT>::dec(x);
    }
    static __device__ __forceinline__ P enc(A v) {
        if constexpr (MASTER) return v;
        else return dtype<DT>::enc(v);
    }
};

// The updates (ALG of the kernel).
enum { kSgd = CTI_CUDA_OPT_SGD, kAdamW = CTI_CUDA_OPT_ADAMW, kAdam = CTI_CUDA_OPT_ADAM,
       kRms = CTI_CUDA_OPT_RMSPROP, kAdagrad = CTI_CUDA_OPT_ADAGRAD };

// One parameter's scalars for this update, in the compute type.
template <class A> struct Scalars {
    A neg_step, bc2s, decay; // AdamW, Adam; Adagrad: neg_step = -clr
    A neg_lr;                // SGD, RMSprop
    bool first;              // SGD: the buffer starts as the update
};

template <class A, int ALG>
__device__ __forceinline__ Scalars<A> scalars_of(const OptArgs &a, int t) {
    const bool mem = a.step[t] != nullptr;
    const double cnt = mem ? *a.step[t] + 1.0 : a.cnt[t];
    const double lr = mem ? a.ctl[0] : a.lr;
    Scalars<A> s;
    if constexpr (ALG == kAdagrad) {
        // cti_adagrad_clr's formula (a host function there)
        s.neg_step = A(-(lr / (1 + (cnt - 1) * a.lr_decay)));
        s.bc2s = s.decay = s.neg_lr = A(0);
        s.first = false;
    } else if constexpr (ALG == kRms) {
        s.neg_step = s.bc2s = s.decay = A(0);
        s.neg_lr = A(-lr);
        s.first = false;
    } else if constexpr (ALG == kAdamW || ALG == kAdam) {
        const double bc1 = 1.0 - pow(a.beta1, cnt), bc2 = 1.0 - pow(a.beta2, cnt);
        s.neg_step = A(-(lr / bc1));
        s.bc2s = A(sqrt(bc2));
        s.decay = A(ALG == kAdamW ? 1.0 - lr * a.wd : 1.0);
        s.neg_lr = A(0);
        s.first = false;
    } else {
        s.neg_step = s.bc2s = s.decay = A(0);
        s.neg_lr = A(-lr);
        s.first = cnt == 1.0;
    }
    return s;
}

// The last block to arrive advances the counts in memory and resets the
// counter; every other block has read the counts by then.
__device__ __forceinline__ void advance_counts(const OptArgs &a) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned long long *counter = reinterpret_cast<unsigned long long *>(a.ctl + 1);
        last = atomicAdd(counter, 1ULL) == (unsigned long long)gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    for (int k = threadIdx.x; k < a.n; k += blockDim.x)
        if (a.step[k]) *a.step[k] += 1.0;
    if (threadIdx.x == 0) *reinterpret_cast<unsigned long long *>(a.ctl + 1) = 0ULL;
}

// CP: the dtype of a float32 parameter's rounded copy in model[] (autocast's
// lasting cast; an entry without one has a null pointer), or kNoCopy.
constexpr int kNoCopy = -1;

template <int DT, bool MASTER, int ALG, int CP>
__global__ void __launch_bounds__(kOptThreads) optim_kernel(const OptArgs a) {
    constexpr bool ADAMW = ALG == kAdamW;
    typedef OptTypes<DT, MASTER> Ty;
    typedef typename Ty::A A;
    typedef typename Ty::P P;
    typedef typename Ty::G G;
    if (a.found_inf && *a.found_inf != 0.0f) return;
    const A wd = A(a.wd), b1 = A(a.beta1), b1c = A(1.0 - a.beta1), b2 = A(a.beta2),
            b2c = A(1.0 - a.beta2), eps = A(a.eps), mom = A(a.momentum),
            dc = A(1.0 - a.dampening);
    const int64_t total = a.start[a.n];
    int cur = -1;
    Scalars<A> sc{};
    for (int64_t c = blockIdx.x; c < total; c += gridDim.x) {
        const int t = tensor_of(a.start, c);
        if (t != cur) {
            sc = scalars_of<A, ALG>(a, t);
            cur = t;
        }
        const int64_t n = a.numel[t];
        const int64_t base = (c - a.start[t]) * kChunk + (int64_t)threadIdx.x * kVec;
        const bool vec = a.vec[t];
        P *p = static_cast<P *>(a.p[t]);
        const G *g = static_cast<const G *>(a.g[t]);
        P *s0 = static_cast<P *>(a.s0[t]);
        P *s1 = static_cast<P *>(a.s1[t]);
        P *s2 = static_cast<P *>(a.s2[t]);
        // SGD reads its buffer only after the first step; the others read
        // every state they have.
        const bool read0 = ALG == kSgd ? a.has_momentum && !sc.first : true;
        const bool use1 = ALG == kAdamW || ALG == kAdam || (ALG == kRms && a.has_momentum);
        const bool use2 = (ALG == kAdam && a.amsgrad) || (ALG == kRms && a.centered);
        const bool write0 = ALG == kSgd ? a.has_momentum : true;
        P rp[kIlp][kVec], r0[kIlp][kVec], r1[kIlp][kVec], r2[kIlp][kVec];
        G rg[kIlp][kVec];
#pragma unroll
        for (int k = 0; k < kIlp; k++) {
            const int64_t i = base + (int64_t)k * kOptThreads * kVec;
            load_pack(p, i, n, vec, rp[k]);
            load_pack(g, i, n, vec, rg[k]);
            if (read0) load_pack(s0, i, n, vec, r0[k]);
            if (use1) load_pack(s1, i, n, vec, r1[k]);
            if (use2) load_pack(s2, i, n, vec, r2[k]);
        }
#pragma unroll
        for (int k = 0; k < kIlp; k++) {
#pragma unroll
            for (int j = 0; j < kVec; j++) {
                A pv = Ty::dec(rp[k][j]);
                const A gi = dtype<DT>::dec(rg[k][j]);
                if constexpr (ADAMW) {
                    const A m = b1 * Ty::dec(r0[k][j]) + b1c * gi;
                    const A v = b2 * Ty::dec(r1[k][j]) + b2c * (gi * gi);
                    r0[k][j] = Ty::enc(m);
                    r1[k][j] = Ty::enc(v);
                    pv = pv * sc.decay + sc.neg_step * (m / (sqrt(v) / sc.bc2s + eps));
                } else if constexpr (ALG == kAdam) {
                    const A gd = a.wd != 0 ? gi + wd * pv : gi;
                    const A m = b1 * Ty::dec(r0[k][j]) + b1c * gd;
                    A v = b2 * Ty::dec(r1[k][j]) + b2c * (gd * gd);
                    r0[k][j] = Ty::enc(m);
                    r1[k][j] = Ty::enc(v);
                    if (a.amsgrad) {
                        const A vm = Ty::dec(r2[k][j]);
                        v = v > vm ? v : vm;
                        r2[k][j] = Ty::enc(v);
                    }
                    pv += sc.neg_step * (m / (sqrt(v) / sc.bc2s + eps));
                } else if constexpr (ALG == kRms) {
                    // beta1 carries alpha
                    const A gd = a.wd != 0 ? gi + wd * pv : gi;
                    A sq = b1 * Ty::dec(r0[k][j]) + b1c * (gd * gd);
                    r0[k][j] = Ty::enc(sq);
                    if (a.centered) {
                        const A ga = b1 * Ty::dec(r2[k][j]) + b1c * gd;
                        r2[k][j] = Ty::enc(ga);
                        sq = sq - ga * ga;
                    }
                    const A avg = sqrt(sq) + eps;
                    if (a.has_momentum) {
                        const A b = mom * Ty::dec(r1[k][j]) + gd / avg;
                        r1[k][j] = Ty::enc(b);
                        pv += sc.neg_lr * b;
                    } else {
                        pv += sc.neg_lr * (gd / avg);
                    }
                } else if constexpr (ALG == kAdagrad) {
                    const A gd = a.wd != 0 ? gi + wd * pv : gi;
                    const A sm = Ty::dec(r0[k][j]) + gd * gd;
                    r0[k][j] = Ty::enc(sm);
                    pv += sc.neg_step * (gd / (sqrt(sm) + eps));
                } else {
                    A d = gi;
                    if (a.wd != 0) d += wd * pv;
                    if (a.has_momentum) {
                        const A b = read0 ? mom * Ty::dec(r0[k][j]) + dc * d : d;
                        r0[k][j] = Ty::enc(b);
                        d = a.nesterov ? d + mom * b : b;
                    }
                    pv += sc.neg_lr * d;
                }
                rp[k][j] = Ty::enc(pv);
            }
        }
#pragma unroll
        for (int k = 0; k < kIlp; k++) {
            const int64_t i = base + (int64_t)k * kOptThreads * kVec;
            store_pack(p, i, n, vec, rp[k]);
            if (write0) store_pack(s0, i, n, vec, r0[k]);
            if (use1) store_pack(s1, i, n, vec, r1[k]);
            if (use2) store_pack(s2, i, n, vec, r2[k]);
            if constexpr (MASTER) {
                G rm[kVec];
#pragma unroll
                for (int j = 0; j < kVec; j++) rm[j] = dtype<DT>::enc(float(rp[k][j]));
                store_pack(static_cast<G *>(a.model[t]), i, n, vec, rm);
            } else if constexpr (CP != kNoCopy) {
                typedef typename dtype<CP>::T C;
                if (a.model[t]) {
                    C rc[kVec];
#pragma unroll
                    for (int j = 0; j < kVec; j++) rc[j] = dtype<CP>::enc(float(rp[k][j]));
                    store_pack(static_cast<C *>(a.model[t]), i, n, vec, rc);
                }
            }
        }
    }
    if (a.ctl) advance_counts(a);
}

// Whether every pointer is aligned for packs of elements of size es.
static bool packable(const void *ptr, size_t es) {
    return ptr == nullptr || (uintptr_t)ptr % (es * kVec) == 0;
}

template <int DT, bool MASTER, int ALG, int CP = kNoCopy>
cudaError_t launch(const cti_cuda_optim *o, int sm_count, cudaStream_t stream) {
    OptArgs a;
    memset(&a, 0, sizeof a);
    const size_t ps = MASTER ? sizeof(float) : sizeof(typename dtype<DT>::T);
    const size_t gs = sizeof(typename dtype<DT>::T);
    // the model copy's element: the parameter's dtype (masters) or CP's
    const size_t ms = CP == kNoCopy ? gs : sizeof(typename dtype<CP == kNoCopy ? DT : CP>::T);
    a.n = o->n;
    bool any_mem = false;
    for (int k = 0; k < o->n; k++) {
        a.p[k] = o->p[k];
        a.g[k] = o->g[k];
        a.s0[k] = o->s0[k];
        a.s1[k] = o->s1[k];
        a.s2[k] = o->s2[k];
        a.model[k] = o->model[k];
        a.step[k] = o->step[k];
        a.numel[k] = o->numel[k];
        a.start[k + 1] = a.start[k] + (o->numel[k] + kChunk - 1) / kChunk;
        a.cnt[k] = o->cnt[k];
        a.vec[k] = packable(o->p[k], ps) && packable(o->g[k], gs) && packable(o->s0[k], ps) &&
                   packable(o->s1[k], ps) && packable(o->s2[k], ps) &&
                   packable(o->model[k], ms);
        any_mem |= o->step[k] != nullptr;
    }
    for (int k = o->n; k < kMax; k++) a.start[k + 1] = a.start[o->n];
    a.ctl = any_mem ? o->ctl : nullptr;
    a.found_inf = o->found_inf;
    a.lr = o->lr;
    a.wd = o->weight_decay;
    a.beta1 = o->beta1;
    a.beta2 = o->beta2;
    a.eps = o->eps;
    a.momentum = o->momentum;
    a.dampening = o->dampening;
    a.nesterov = o->nesterov;
    a.has_momentum = (ALG == kSgd && o->momentum != 0) || (ALG == kRms && o->momentum > 0);
    a.lr_decay = o->lr_decay;
    a.amsgrad = o->amsgrad;
    a.centered = o->centered;
    const int64_t total = a.start[o->n];
    // Zero-size parameters still count a step: one block does the counting.
    if (total == 0 && !a.ctl) return cudaSuccess;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    const unsigned grid = (unsigned)(total < 1 ? 1 : total < cap ? total : cap);
    optim_kernel<DT, MASTER, ALG, CP><<<grid, kOptThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

template <int ALG>
cudaError_t launch_dt(const cti_cuda_optim *o, int sm_count, cudaStream_t stream) {
    if (o->master) {
        switch (o->dt) {
        case CT_F16: return launch<CT_F16, true, ALG>(o, sm_count, stream);
        case CT_BF16: return launch<CT_BF16, true, ALG>(o, sm_count, stream);
        default: return cudaErrorInvalidValue;
        }
    }
    if (o->dt == CT_F32 && o->copy_dt == CT_BF16)
        return launch<CT_F32, false, ALG, CT_BF16>(o, sm_count, stream);
    if (o->dt == CT_F32 && o->copy_dt == CT_F16)
        return launch<CT_F32, false, ALG, CT_F16>(o, sm_count, stream);
    switch (o->dt) {
    case CT_F32: return launch<CT_F32, false, ALG>(o, sm_count, stream);
    case CT_F64: return launch<CT_F64, false, ALG>(o, sm_count, stream);
    case CT_F16: return launch<CT_F16, false, ALG>(o, sm_count, stream);
    case CT_BF16: return launch<CT_BF16, false, ALG>(o, sm_count, stream);
    default: return cudaErrorInvalidValue;
    }
}

// ---- loss scaling -----------------------------------------------------------------------

struct AmpArgs {
    void *x[kAmpMax];
    int64_t numel[kAmpMax];
    int64_t start[kAmpMax + 1];
    float *found_inf;
    const float *scale;
    int n;
    int8_t dt[kAmpMax];
    bool vec[kAmpMax];
};
static_assert(sizeof(AmpArgs) <= 4096, "unscale launch arguments exceed 4 KB");

// One chunk of a DT tensor: checked, then scaled by inv unless it is 1.
template <int DT>
__device__ __forceinline__ bool unscale_chunk(void *ptr, int64_t base, int64_t n, bool vec,
                                              float inv) {
    typedef typename dtype<DT>::T T;
    typedef typename opmath<DT>::A A;
    T *x = static_cast<T *>(ptr);
    T r[kIlp][kVec];
#pragma unroll
    for (int k = 0; k < kIlp; k++)
        load_pack(x, base + (int64_t)k * kOptThreads * kVec, n, vec, r[k]);
    bool bad = false;
#pragma unroll
    for (int k = 0; k < kIlp; k++)
#pragma unroll
        for (int j = 0; j < kVec; j++) {
            const A v = dtype<DT>::dec(r[k][j]);
            bad |= !isfinite(v);
            r[k][j] = dtype<DT>::enc(v * A(inv));
        }
    if (inv != 1.0f)
#pragma unroll
        for (int k = 0; k < kIlp; k++)
            store_pack(x, base + (int64_t)k * kOptThreads * kVec, n, vec, r[k]);
    return bad;
}

__global__ void __launch_bounds__(kOptThreads) unscale_kernel(const AmpArgs a) {
    const float inv = (float)(1.0 / (double)*a.scale);
    const int64_t total = a.start[a.n];
    bool bad = false;
    for (int64_t c = blockIdx.x; c < total; c += gridDim.x) {
        const int t = tensor_of(a.start, c);
        const int64_t base = (c - a.start[t]) * kChunk + (int64_t)threadIdx.x * kVec;
        const int64_t n = a.numel[t];
        switch (a.dt[t]) {
        case CT_F32: bad |= unscale_chunk<CT_F32>(a.x[t], base, n, a.vec[t], inv); break;
        case CT_F64: bad |= unscale_chunk<CT_F64>(a.x[t], base, n, a.vec[t], inv); break;
        case CT_F16: bad |= unscale_chunk<CT_F16>(a.x[t], base, n, a.vec[t], inv); break;
        default: bad |= unscale_chunk<CT_BF16>(a.x[t], base, n, a.vec[t], inv); break;
        }
    }
    // Every writer stores the same value.
    if (bad) *a.found_inf = 1.0f;
}

__global__ void update_scale_kernel(float *scale, int32_t *tracker, const float *found_inf,
                                    double growth_factor, double backoff_factor,
                                    int64_t growth_interval) {
    if (*found_inf != 0.0f) {
        *scale = (float)(*scale * backoff_factor);
        *tracker = 0;
    } else if ((int64_t)*tracker + 1 == growth_interval) {
        const float grown = (float)(*scale * growth_factor);
        if (isfinite(grown)) *scale = grown;
        *tracker = 0;
    } else {
        *tracker += 1;
    }
}

} // namespace
} // namespace cti

extern "C" {

bool cti_cuda_optim_supported(ct_dtype dt) {
    return dt == CT_F32 || dt == CT_F64 || dt == CT_F16 || dt == CT_BF16;
}

cudaError_t cti_cuda_optim_step(const cti_cuda_optim *o, int sm_count, cudaStream_t stream,
                                const char **routine) {
    if (o->n < 1 || o->n > CTI_CUDA_OPTIM_MAX) return cudaErrorInvalidValue;
    // kind 0 with adamw set: a caller of the time before kind
    const int kind = o->adamw ? CTI_CUDA_OPT_ADAMW : o->kind;
    switch (kind) {
    case CTI_CUDA_OPT_ADAMW:
        *routine = "cten_adamw_step_multi_tensor";
        return cti::launch_dt<cti::kAdamW>(o, sm_count, stream);
    case CTI_CUDA_OPT_ADAM:
        *routine = "cten_adam_step_multi_tensor";
        return cti::launch_dt<cti::kAdam>(o, sm_count, stream);
    case CTI_CUDA_OPT_RMSPROP:
        *routine = "cten_rmsprop_step_multi_tensor";
        return cti::launch_dt<cti::kRms>(o, sm_count, stream);
    case CTI_CUDA_OPT_ADAGRAD:
        *routine = "cten_adagrad_step_multi_tensor";
        return cti::launch_dt<cti::kAdagrad>(o, sm_count, stream);
    default:
        *routine = "cten_sgd_step_multi_tensor";
        return cti::launch_dt<cti::kSgd>(o, sm_count, stream);
    }
}

cudaError_t cti_cuda_amp_unscale(const cti_cuda_unscale *u, int sm_count, cudaStream_t stream,
                                 const char **routine) {
    using namespace cti;
    if (u->n < 1 || u->n > CTI_CUDA_AMP_MAX) return cudaErrorInvalidValue;
    *routine = "cten_amp_non_finite_check_and_unscale_multi_tensor";
    AmpArgs a;
    memset(&a, 0, sizeof a);
    a.n = u->n;
    a.found_inf = u->found_inf;
    a.scale = u->scale;
    for (int k = 0; k < u->n; k++) {
        a.x[k] = u->x[k];
        a.numel[k] = u->numel[k];
        a.dt[k] = (int8_t)u->dt[k];
        a.vec[k] = packable(u->x[k], ct_dtype_size(u->dt[k]));
        a.start[k + 1] = a.start[k] + (u->numel[k] + kChunk - 1) / kChunk;
    }
    for (int k = u->n; k < kAmpMax; k++) a.start[k + 1] = a.start[u->n];
    const int64_t total = a.start[u->n];
    if (total == 0) return cudaSuccess;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    unscale_kernel<<<(unsigned)(total < cap ? total : cap), kOptThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

cudaError_t cti_cuda_amp_update_scale(float *scale, int32_t *growth_tracker,
                                      const float *found_inf, double growth_factor,
                                      double backoff_factor, int64_t growth_interval,
                                      cudaStream_t stream) {
    cti::update_scale_kernel<<<1, 1, 0, stream>>>(scale, growth_tracker, found_inf,
                                                  growth_factor, backoff_factor,
                                                  growth_interval);
    return cudaGetLastError();
}

} // extern "C"
