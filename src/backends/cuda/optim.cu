// Fused optimizer updates: SGD (momentum, dampening, nesterov, weight decay)
// and AdamW over up to CTI_CUDA_OPTIM_MAX parameters in one launch.
//
// Every parameter is cut into chunks of kChunk elements; the chunks of all
// parameters are numbered one after the other and block b takes chunks b,
// b + gridDim.x, ... . A block finds its parameter by scanning the chunk
// offsets (at most CTI_CUDA_OPTIM_MAX entries, in the launch arguments).
// Thread t of a block handles elements t, t + 256, ... of its chunk: all
// loads of a chunk are issued before any arithmetic, then every tensor is
// written once. float16/bfloat16/float32 compute in float, float64 in double.
#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

constexpr int kOptThreads = 256;
constexpr int kOptIlp = 8;
constexpr int kChunk = kOptThreads * kOptIlp;
constexpr int kMax = CTI_CUDA_OPTIM_MAX;

template <int DT> struct opmath { typedef float A; };
template <> struct opmath<CT_F64> { typedef double A; };

// The launch arguments (about 2.3 KB for double, under the 4 KB limit).
template <class A> struct OptArgs {
    void *p[kMax];
    const void *g[kMax];
    void *s0[kMax];
    void *s1[kMax];
    int64_t numel[kMax];
    int64_t start[kMax + 1]; // first chunk of each parameter; start[n]: all chunks
    A a0[kMax], a1[kMax];
    int n;
    // SGD: -lr, weight_decay, momentum, 1 - dampening; AdamW: 1 - lr * wd,
    // beta1, 1 - beta1, beta2, 1 - beta2, eps
    A h[6];
    bool nesterov, has_momentum, decay;
};

template <int DT, bool ADAMW>
__global__ void __launch_bounds__(kOptThreads)
    optim_kernel(const OptArgs<typename opmath<DT>::A> a) {
    typedef typename dtype<DT>::T T;
    typedef typename opmath<DT>::A A;
    const int64_t total = a.start[a.n];
    for (int64_t c = blockIdx.x; c < total; c += gridDim.x) {
        int t = 0;
        while (c >= a.start[t + 1]) t++;
        const int64_t n = a.numel[t];
        const int64_t base = (c - a.start[t]) * kChunk + threadIdx.x;
        T *p = static_cast<T *>(a.p[t]);
        const T *g = static_cast<const T *>(a.g[t]);
        T *s0 = static_cast<T *>(a.s0[t]);
        T *s1 = static_cast<T *>(a.s1[t]);
        // SGD reads its buffer only after the first step.
        const bool read0 = ADAMW || (a.has_momentum && a.a0[t] == 0);
        A rp[kOptIlp], rg[kOptIlp], r0[kOptIlp], r1[kOptIlp];
#pragma unroll
        for (int k = 0; k < kOptIlp; k++) {
            const int64_t i = base + (int64_t)k * kOptThreads;
            rp[k] = rg[k] = r0[k] = r1[k] = A(0);
            if (i < n) {
                rp[k] = dtype<DT>::dec(p[i]);
                rg[k] = dtype<DT>::dec(g[i]);
                if (read0) r0[k] = dtype<DT>::dec(s0[i]);
                if (ADAMW) r1[k] = dtype<DT>::dec(s1[i]);
            }
        }
#pragma unroll
        for (int k = 0; k < kOptIlp; k++) {
            if constexpr (ADAMW) {
                const A gi = rg[k];
                const A m = a.h[1] * r0[k] + a.h[2] * gi;
                const A v = a.h[3] * r1[k] + a.h[4] * (gi * gi);
                r0[k] = m;
                r1[k] = v;
                const A pd = a.decay ? rp[k] * a.h[0] : rp[k];
                rp[k] = pd + a.a0[t] * (m / (sqrt(v) / a.a1[t] + a.h[5]));
            } else {
                A d = rg[k];
                if (a.h[1] != A(0)) d += a.h[1] * rp[k];
                if (a.has_momentum) {
                    const A b = read0 ? a.h[2] * r0[k] + a.h[3] * d : d;
                    r0[k] = b;
                    d = a.nesterov ? d + a.h[2] * b : b;
                }
                rp[k] += a.h[0] * d;
            }
        }
#pragma unroll
        for (int k = 0; k < kOptIlp; k++) {
            const int64_t i = base + (int64_t)k * kOptThreads;
            if (i < n) {
                p[i] = dtype<DT>::enc(rp[k]);
                if (ADAMW || a.has_momentum) s0[i] = dtype<DT>::enc(r0[k]);
                if (ADAMW) s1[i] = dtype<DT>::enc(r1[k]);
            }
        }
    }
}

template <int DT, bool ADAMW>
cudaError_t launch(const cti_cuda_optim *o, int sm_count, cudaStream_t stream) {
    typedef typename opmath<DT>::A A;
    OptArgs<A> a;
    a.n = o->n;
    a.start[0] = 0;
    for (int k = 0; k < o->n; k++) {
        a.p[k] = o->p[k];
        a.g[k] = o->g[k];
        a.s0[k] = o->s0[k];
        a.s1[k] = o->s1[k];
        a.numel[k] = o->numel[k];
        a.start[k + 1] = a.start[k] + (o->numel[k] + kChunk - 1) / kChunk;
        a.a0[k] = A(o->a0[k]);
        a.a1[k] = A(o->a1[k]);
    }
    for (int k = o->n; k < kMax; k++) {
        a.p[k] = a.s0[k] = a.s1[k] = nullptr;
        a.g[k] = nullptr;
        a.numel[k] = 0;
        a.start[k + 1] = a.start[o->n];
        a.a0[k] = a.a1[k] = A(0);
    }
    if (ADAMW) {
        const double h[6] = {1 - o->lr * o->weight_decay, o->beta1, 1 - o->beta1,
                             o->beta2, 1 - o->beta2, o->eps};
        for (int j = 0; j < 6; j++) a.h[j] = A(h[j]);
        a.decay = o->weight_decay != 0;
        a.nesterov = a.has_momentum = false;
    } else {
        const double h[6] = {-o->lr, o->weight_decay, o->momentum, 1 - o->dampening, 0, 0};
        for (int j = 0; j < 6; j++) a.h[j] = A(h[j]);
        a.nesterov = o->nesterov;
        a.has_momentum = o->momentum != 0;
        a.decay = false;
    }
    const int64_t total = a.start[o->n];
    if (total == 0) return cudaSuccess;
    const int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 16;
    const unsigned grid = (unsigned)(total < cap ? total : cap);
    optim_kernel<DT, ADAMW><<<grid, kOptThreads, 0, stream>>>(a);
    return cudaGetLastError();
}

template <bool ADAMW>
cudaError_t launch_dt(const cti_cuda_optim *o, int sm_count, cudaStream_t stream) {
    switch (o->dt) {
    case CT_F32: return launch<CT_F32, ADAMW>(o, sm_count, stream);
    case CT_F64: return launch<CT_F64, ADAMW>(o, sm_count, stream);
    case CT_F16: return launch<CT_F16, ADAMW>(o, sm_count, stream);
    case CT_BF16: return launch<CT_BF16, ADAMW>(o, sm_count, stream);
    default: return cudaErrorInvalidValue;
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
    *routine = o->adamw ? "cten_adamw_step_multi_tensor" : "cten_sgd_step_multi_tensor";
    return o->adamw ? cti::launch_dt<true>(o, sm_count, stream)
                    : cti::launch_dt<false>(o, sm_count, stream);
}

} // extern "C"
