// Random fills and ranges with the CPU backend's exact results.
//
// Philox-4x32-10 is counter based: draw number j of seed s is word j % 4 of
// the block for counter j / 4, whatever device computes it. The kernels use
// the CPU's layout (documented in src/backends/cpu/copy.c) and its
// arithmetic in double, rounded where the CPU rounds (no fused multiply-add),
// so uniform and randint values are bit-identical to the CPU's and normal
// values agree up to the last bit of the device's log and sincos.
//
// A thread handles one "unit" of four consecutive draws at a time: four
// uniforms of a 32-bit draw each, two of f64 or randint, two normal pairs,
// or one f64 normal pair; the unit's draws need one Philox block, two when
// the call's first draw is not a multiple of four.
#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

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

// Draws first + 4u ... first + 4u + 3.
__device__ __forceinline__ void unit_draws(uint64_t seed, uint64_t first, uint64_t u,
                                           uint32_t d[4]) {
    uint64_t j = first + 4 * u;
    unsigned sh = (unsigned)(j & 3);
    uint32_t a[4];
    philox(seed, j >> 2, a);
    if (sh == 0) {
#pragma unroll
        for (int k = 0; k < 4; k++) d[k] = a[k];
        return;
    }
    uint32_t b[4];
    philox(seed, (j >> 2) + 1, b);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        unsigned w = sh + (unsigned)k;
        uint32_t x = w == 0 ? a[0] : w == 1 ? a[1] : w == 2 ? a[2] : w == 3 ? a[3] : 0;
        uint32_t y = w == 4 ? b[0] : w == 5 ? b[1] : w == 6 ? b[2] : 0;
        d[k] = w < 4 ? x : y;
    }
}

__device__ __forceinline__ double u53(uint32_t hi, uint32_t lo) {
    return (double)((((uint64_t)hi << 32) | lo) >> 11) * 0x1p-53;
}

// A uniform in [0, 1) from one 32-bit draw, as many bits as DT's significand.
template <int DT> __device__ __forceinline__ double u32_uniform(uint32_t d) {
    if (DT == CT_F16) return (double)(d >> 21) * 0x1p-11;
    if (DT == CT_BF16) return (double)(d >> 24) * 0x1p-8;
    return (double)(d >> 8) * 0x1p-24;
}

struct RArgs {
    void *out;
    int64_t n;
    uint64_t seed, first, units;
    const uint64_t *state; // in a CUDA graph: (seed, base of first), read at run time
    double a, b;
    int64_t ilow;
    uint64_t irange;
};

template <int DT>
__device__ __forceinline__ void put(const RArgs &r, int64_t e, double v) {
    if (e < r.n) ((typename dtype<DT>::T *)r.out)[e] = dtype<DT>::enc(v);
}

template <int DT>
__device__ __forceinline__ void normal_pair(const RArgs &r, int64_t e, double u1, double u2) {
    double rad = sqrt(-2.0 * log(u1)), sn, cs;
    sincos(__dmul_rn(2.0 * M_PI, u2), &sn, &cs);
    double scale = __dmul_rn(r.b, rad);
    put<DT>(r, e, __dadd_rn(r.a, __dmul_rn(scale, cs)));
    put<DT>(r, e + 1, __dadd_rn(r.a, __dmul_rn(scale, sn)));
}

template <int KIND, int DT> __global__ void __launch_bounds__(kThreads) rng_kernel(const RArgs r) {
    const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
    const double span = r.b - r.a;
    const uint64_t seed = r.state ? r.state[0] : r.seed;
    const uint64_t first = r.state ? r.state[1] + r.first : r.first;
    for (uint64_t u = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; u < r.units; u += stride) {
        uint32_t d[4];
        unit_draws(seed, first, u, d);
        if constexpr (KIND == CTI_RNG_UNIFORM && DT != CT_F64) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                put<DT>(r, (int64_t)(4 * u) + k, __dadd_rn(r.a, __dmul_rn(span, u32_uniform<DT>(d[k]))));
        } else if constexpr (KIND == CTI_RNG_UNIFORM) {
#pragma unroll
            for (int k = 0; k < 2; k++)
                put<DT>(r, (int64_t)(2 * u) + k, __dadd_rn(r.a, __dmul_rn(span, u53(d[2 * k], d[2 * k + 1]))));
        } else if constexpr (KIND == CTI_RNG_NORMAL && DT != CT_F64) {
#pragma unroll
            for (int k = 0; k < 2; k++)
                normal_pair<DT>(r, (int64_t)(4 * u) + 2 * k, ((double)d[2 * k] + 1.0) * 0x1p-32,
                                (double)d[2 * k + 1] * 0x1p-32);
        } else if constexpr (KIND == CTI_RNG_NORMAL) {
            normal_pair<DT>(r, (int64_t)(2 * u), 1.0 - u53(d[0], d[1]), u53(d[2], d[3]));
        } else {
#pragma unroll
            for (int k = 0; k < 2; k++) {
                int64_t e = (int64_t)(2 * u) + k;
                uint64_t v = ((uint64_t)d[2 * k] << 32) | d[2 * k + 1];
                int64_t x = (int64_t)((uint64_t)r.ilow + v % r.irange);
                if (e < r.n) ((typename dtype<DT>::T *)r.out)[e] = dtype<DT>::enc(x);
            }
        }
    }
}

template <int DT>
__global__ void __launch_bounds__(kThreads)
range_kernel(typename dtype<DT>::T *out, int64_t n, double start, double step, double end,
             int64_t steps, bool linspace) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double v = !linspace || i < steps / 2
                       ? __dadd_rn(start, __dmul_rn((double)i, step))
                       : __dsub_rn(end, __dmul_rn((double)(steps - 1 - i), step));
        out[i] = dtype<DT>::enc(v);
    }
}

template <int KIND, int DT>
cudaError_t launch_rng(const RArgs &r, int sms, cudaStream_t st) {
    rng_kernel<KIND, DT><<<grid_for((int64_t)r.units, sms), kThreads, 0, st>>>(r);
    return cudaGetLastError();
}

template <int KIND> cudaError_t rng_for(int dt, const RArgs &r, int sms, cudaStream_t st) {
    switch (dt) {
    case CT_F16: return launch_rng<KIND, CT_F16>(r, sms, st);
    case CT_BF16: return launch_rng<KIND, CT_BF16>(r, sms, st);
    case CT_F32: return launch_rng<KIND, CT_F32>(r, sms, st);
    case CT_F64: return launch_rng<KIND, CT_F64>(r, sms, st);
    default: break;
    }
    if constexpr (KIND == CTI_RNG_RANDINT) {
        switch (dt) {
        case CT_BOOL: return launch_rng<KIND, CT_BOOL>(r, sms, st);
        case CT_I32: return launch_rng<KIND, CT_I32>(r, sms, st);
        case CT_I64: return launch_rng<KIND, CT_I64>(r, sms, st);
        default: break;
        }
    }
    return cudaErrorInvalidValue;
}

template <int DT>
cudaError_t launch_range(void *out, int64_t n, double start, double step, double end,
                         int64_t steps, bool linspace, int sms, cudaStream_t st) {
    range_kernel<DT><<<grid_for(n, sms), kThreads, 0, st>>>((typename dtype<DT>::T *)out, n, start,
                                                            step, end, steps, linspace);
    return cudaGetLastError();
}

} // namespace
} // namespace cti

extern "C" {

cudaError_t cti_cuda_random(int kind, void *out, ct_dtype dt, int64_t n, uint64_t seed,
                            uint64_t first, const uint64_t *state, double a, double b,
                            int64_t ilow, uint64_t irange, int sm_count, cudaStream_t stream) {
    cti::RArgs r;
    r.out = out;
    r.n = n;
    r.seed = seed;
    r.first = first;
    r.state = state;
    r.a = a;
    r.b = b;
    r.ilow = ilow;
    r.irange = irange;
    // Draws the call uses (normal: whole pairs), four per unit.
    uint64_t per = kind == CTI_RNG_RANDINT || dt == CT_F64 ? 2 : 1;
    uint64_t elems = kind == CTI_RNG_NORMAL ? (uint64_t)(n + 1) / 2 * 2 : (uint64_t)n;
    r.units = (elems * per + 3) / 4;
    switch (kind) {
    case CTI_RNG_UNIFORM: return cti::rng_for<CTI_RNG_UNIFORM>(dt, r, sm_count, stream);
    case CTI_RNG_NORMAL: return cti::rng_for<CTI_RNG_NORMAL>(dt, r, sm_count, stream);
    default: return cti::rng_for<CTI_RNG_RANDINT>(dt, r, sm_count, stream);
    }
}

cudaError_t cti_cuda_range(void *out, ct_dtype dt, int64_t n, double start, double step,
                           double end, int64_t steps, bool linspace, int sm_count,
                           cudaStream_t stream) {
    switch (dt) {
    case CT_BOOL: return cti::launch_range<CT_BOOL>(out, n, start, step, end, steps, linspace, sm_count, stream);
    case CT_I32: return cti::launch_range<CT_I32>(out, n, start, step, end, steps, linspace, sm_count, stream);
    case CT_I64: return cti::launch_range<CT_I64>(out, n, start, step, end, steps, linspace, sm_count, stream);
    case CT_F16: return cti::launch_range<CT_F16>(out, n, start, step, end, steps, linspace, sm_count, stream);
    case CT_BF16: return cti::launch_range<CT_BF16>(out, n, start, step, end, steps, linspace, sm_count, stream);
    case CT_F32: return cti::launch_range<CT_F32>(out, n, start, step, end, steps, linspace, sm_count, stream);
    case CT_F64: return cti::launch_range<CT_F64>(out, n, start, step, end, steps, linspace, sm_count, stream);
    default: return cudaErrorInvalidValue;
    }
}

} // extern "C"
