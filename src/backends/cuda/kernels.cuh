// Device-side helpers shared by the backend's .cu files: element types and
// conversions with the CPU backend's exact semantics, and the offset
// arithmetic of a cti_cuda_iter.
#ifndef CTEN_CUDA_KERNELS_CUH
#define CTEN_CUDA_KERNELS_CUH

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "cuda_impl.h"

namespace cti {

constexpr int kThreads = 256;

// ---- conversions -----------------------------------------------------------------
// As the CPU backend: float to integer truncates toward zero and saturates
// (NaN gives 0), int64 to int32 wraps, anything to bool is v != 0, f16 and
// bf16 round to nearest even through float, and NaN becomes the CPU's NaN.

__device__ __forceinline__ int32_t f2i32(double v) {
    int32_t r = (int32_t)(v > -2147483649.0 && v < 2147483648.0 ? v : 0.0);
    r = v >= 2147483648.0 ? INT32_MAX : r;
    return v <= -2147483649.0 ? INT32_MIN : r;
}

__device__ __forceinline__ int64_t f2i64(double v) {
    int64_t r = (int64_t)(v >= -9223372036854775808.0 && v < 9223372036854775808.0 ? v : 0.0);
    r = v >= 9223372036854775808.0 ? INT64_MAX : r;
    return v < -9223372036854775808.0 ? INT64_MIN : r;
}

__device__ __forceinline__ uint16_t enc_f16(float f) {
    if (f != f) return (uint16_t)((__float_as_uint(f) >> 16 & 0x8000u) | 0x7E00u);
    return __half_as_ushort(__float2half_rn(f));
}

__device__ __forceinline__ float dec_f16(uint16_t h) {
    if ((h & 0x7C00u) == 0x7C00u && (h & 0x03FFu)) /* NaN: quieted, payload kept */
        return __uint_as_float(((uint32_t)(h & 0x8000u) << 16) | 0x7FC00000u |
                               ((uint32_t)(h & 0x03FFu) << 13));
    return __half2float(__ushort_as_half(h));
}

__device__ __forceinline__ uint16_t enc_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float dec_bf16(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

// dtype<DT>: T is the storage type; dec() gives the value kernels compute
// with (int64_t, float or double); enc() stores any such value.
template <int DT> struct dtype;

template <> struct dtype<CT_BOOL> {
    typedef uint8_t T;
    static __device__ __forceinline__ int64_t dec(T x) { return x; }
    template <class V> static __device__ __forceinline__ T enc(V v) { return v != 0; }
};
template <> struct dtype<CT_I32> {
    typedef int32_t T;
    static __device__ __forceinline__ int64_t dec(T x) { return x; }
    template <class V> static __device__ __forceinline__ T enc(V v) {
        if constexpr (std::is_integral<V>::value) return (int32_t)(uint32_t)(uint64_t)v;
        else return f2i32((double)v);
    }
};
template <> struct dtype<CT_I64> {
    typedef int64_t T;
    static __device__ __forceinline__ int64_t dec(T x) { return x; }
    template <class V> static __device__ __forceinline__ T enc(V v) {
        if constexpr (std::is_integral<V>::value) return (int64_t)v;
        else return f2i64((double)v);
    }
};
template <> struct dtype<CT_F16> {
    typedef uint16_t T;
    static __device__ __forceinline__ float dec(T x) { return dec_f16(x); }
    template <class V> static __device__ __forceinline__ T enc(V v) { return enc_f16((float)v); }
};
template <> struct dtype<CT_BF16> {
    typedef uint16_t T;
    static __device__ __forceinline__ float dec(T x) { return dec_bf16(x); }
    template <class V> static __device__ __forceinline__ T enc(V v) { return enc_bf16((float)v); }
};
template <> struct dtype<CT_F32> {
    typedef float T;
    static __device__ __forceinline__ float dec(T x) { return x; }
    template <class V> static __device__ __forceinline__ T enc(V v) { return (float)v; }
};
template <> struct dtype<CT_F64> {
    typedef double T;
    static __device__ __forceinline__ double dec(T x) { return x; }
    template <class V> static __device__ __forceinline__ T enc(V v) { return (double)v; }
};

template <int D, int S>
__device__ __forceinline__ typename dtype<D>::T convert(typename dtype<S>::T x) {
    return dtype<D>::enc(dtype<S>::dec(x));
}

// ---- activations' derivatives -----------------------------------------------------------
// d/dx gelu(x) in V (float for f16/bf16/f32, double), as the CPU's (elementwise.c): the exact
// form Phi(x) + x phi(x) with Phi through erfc, the tanh form PyTorch's formula; the x term
// is 0 where phi or 1 - t^2 is, so that x = +-inf gives the limits. Shared by gelu_backward
// and the reductions that fold it in (LINEAR_DGELU's row sums).
template <class V> __device__ __forceinline__ V gelu_grad(V x, bool tanh_form) {
    const V x2 = x * x;
    if (tanh_form) {
        const V k = (V)0.79788456080286535588, c = (V)0.044715;
        V t;
        if constexpr (std::is_same<V, float>::value) t = tanhf(k * x * ((V)1 + c * x2));
        else t = tanh(k * x * ((V)1 + c * x2));
        const V s = (V)1 - t * t;
        const V r = s > 0 ? x * s * (k * ((V)1 + (V)3 * c * x2)) : (V)0;
        return (V)0.5 * ((V)1 + t) + (V)0.5 * r;
    }
    V pdf, cdf2;
    if constexpr (std::is_same<V, float>::value) {
        pdf = expf((V)-0.5 * x2) * (V)0.39894228040143267794;
        cdf2 = erfcf(-x * (V)0.70710678118654752440);
    } else {
        pdf = exp((V)-0.5 * x2) * (V)0.39894228040143267794;
        cdf2 = erfc(-x * (V)0.70710678118654752440);
    }
    return (V)0.5 * cdf2 + (pdf > 0 ? x * pdf : (V)0);
}

// gelu's tanh form and its derivative for results stored as float16 or bfloat16, through
// 0.5 (1 + tanh u) = sigma(2u) = 1 / (1 + e^-2u) and 1 - sigma = e^-2u sigma with the
// hardware exponential and division: within a few float32 ulps, far below those dtypes'
// rounding, at a fraction of tanhf's instructions (the passes over GPT-2's [rows, 3072]
// activations ran at the issue rate, not at the memory's). |u| >= 40, infinities and NaN
// take the accurate forms above. The exact form (erf) has no such path.
__device__ __forceinline__ float gelu_tanh_half(float x) {
    const float k = 0.79788456080286535588f, c = 0.044715f;
    const float u = k * x * (1.0f + c * x * x);
    if (!(fabsf(u) < 40.0f)) return 0.5f * x * (1.0f + tanhf(k * (x + c * x * x * x)));
    return __fdividef(x, 1.0f + __expf(-2.0f * u));
}

__device__ __forceinline__ float gelu_grad_half(float x, bool tanh_form) {
    const float k = 0.79788456080286535588f, c = 0.044715f, x2 = x * x;
    const float u = k * x * (1.0f + c * x2);
    if (!tanh_form || !(fabsf(u) < 40.0f)) return gelu_grad(x, tanh_form);
    const float e = __expf(-2.0f * u), s = __fdividef(1.0f, 1.0f + e);
    return s + 2.0f * x * s * (e * s) * k * (1.0f + 3.0f * c * x2);
}

// ---- offsets ----------------------------------------------------------------------
// Element offsets of linear index i (row-major over the output) in the first
// NOPS operands of it. I is uint32_t when it.use32, else int64_t.
template <int NOPS, class I>
__device__ __forceinline__ void offsets(const cti_cuda_iter &it, I i, int64_t (&off)[NOPS]) {
#pragma unroll
    for (int k = 0; k < NOPS; k++) off[k] = 0;
#pragma unroll
    for (int d = 0; d < CT_MAX_DIMS; d++) {
        if (d == it.ndim) break;
        I q;
        if constexpr (std::is_same<I, uint32_t>::value)
            q = (__umulhi(i, it.magic[d]) + i) >> it.shift[d];
        else
            q = i / (I)it.shape[d];
        int64_t r = (int64_t)(i - q * (I)it.shape[d]);
#pragma unroll
        for (int k = 0; k < NOPS; k++) off[k] += r * it.stride[k][d];
        i = q;
    }
}

// Blocks for a grid-stride loop over n items: enough to fill the device a
// few times over, never more than the work needs.
static inline unsigned grid_for(int64_t n, int sm_count) {
    int64_t blocks = (n + kThreads - 1) / kThreads;
    int64_t cap = (int64_t)(sm_count > 0 ? sm_count : 1) * 32;
    if (blocks > cap) blocks = cap;
    return (unsigned)(blocks > 0 ? blocks : 1);
}

} // namespace cti

#endif
