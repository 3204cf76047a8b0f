// Elementwise kernels: unary, binary, comparisons, logical ops, clamp and
// where, with the CPU backend's semantics (src/backends/cpu/elementwise.c):
// f16/bf16 compute in f32, integers wrap, NaN propagates through maximum,
// minimum, relu and clamp, comparisons and logical ops give bool.
//
// Two kernel shapes per (op, dtype): contiguous operands are processed in
// tiles of kThreads * VEC * UNROLL elements with 16-byte loads and stores,
// every load of a tile issued before the first use; anything else (strided,
// broadcast, permuted) goes through cti_cuda_iter's index arithmetic. Single
// values (a CPU scalar passed by value, or one element in device memory) are
// read once per thread and never indexed.
#include <string.h>

#include <array>
#include <utility>

#include "kernels.cuh"
#include "ops_impl.h"

namespace cti {
namespace {

constexpr int kUnroll = 4;

template <class V> constexpr bool isf = std::is_floating_point<V>::value;
template <class V> constexpr bool isb = std::is_same<V, uint8_t>::value;

// The value type a dtype computes in: f16/bf16 in float, bool as 0/1 bytes.
template <int DT> struct value_of { typedef typename dtype<DT>::T V; };
template <> struct value_of<CT_F16> { typedef float V; };
template <> struct value_of<CT_BF16> { typedef float V; };

// ---- math with one name per precision --------------------------------------------------
__device__ __forceinline__ float mexp(float x) { return expf(x); }
__device__ __forceinline__ double mexp(double x) { return exp(x); }
__device__ __forceinline__ float mlog(float x) { return logf(x); }
__device__ __forceinline__ double mlog(double x) { return log(x); }
__device__ __forceinline__ float mlog1p(float x) { return log1pf(x); }
__device__ __forceinline__ double mlog1p(double x) { return log1p(x); }
__device__ __forceinline__ float msqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double msqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float msin(float x) { return sinf(x); }
__device__ __forceinline__ double msin(double x) { return sin(x); }
__device__ __forceinline__ float mcos(float x) { return cosf(x); }
__device__ __forceinline__ double mcos(double x) { return cos(x); }
__device__ __forceinline__ float mtanh(float x) { return tanhf(x); }
__device__ __forceinline__ double mtanh(double x) { return tanh(x); }
__device__ __forceinline__ float merf(float x) { return erff(x); }
__device__ __forceinline__ double merf(double x) { return erf(x); }
__device__ __forceinline__ float mfabs(float x) { return fabsf(x); }
__device__ __forceinline__ double mfabs(double x) { return fabs(x); }
__device__ __forceinline__ float mpow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double mpow(double x, double y) { return pow(x, y); }
#define MF1(name, f, d)                                                                     \
    __device__ __forceinline__ float name(float x) { return f(x); }                          \
    __device__ __forceinline__ double name(double x) { return d(x); }
MF1(mexpm1, expm1f, expm1)
MF1(mlog2, log2f, log2)
MF1(mlog10, log10f, log10)
MF1(mexp2, exp2f, exp2)
MF1(mfloor, floorf, floor)
MF1(mceil, ceilf, ceil)
MF1(mrint, rintf, rint)
MF1(mtrunc, truncf, trunc)
MF1(merfc, erfcf, erfc)
MF1(merfinv, erfinvf, erfinv)
MF1(mtan, tanf, tan)
MF1(masin, asinf, asin)
MF1(macos, acosf, acos)
MF1(matan, atanf, atan)
MF1(msinh, sinhf, sinh)
MF1(mcosh, coshf, cosh)
MF1(masinh, asinhf, asinh)
MF1(macosh, acoshf, acosh)
MF1(matanh, atanhf, atanh)
#undef MF1
__device__ __forceinline__ float matan2(float y, float x) { return atan2f(y, x); }
__device__ __forceinline__ double matan2(double y, double x) { return atan2(y, x); }
__device__ __forceinline__ float mfmod(float a, float b) { return fmodf(a, b); }
__device__ __forceinline__ double mfmod(double a, double b) { return fmod(a, b); }
// a + alpha * b rounded twice, as the CPU computes it (no fused multiply-add).
__device__ __forceinline__ float madd(float a, float al, float b) {
    return __fadd_rn(a, __fmul_rn(al, b));
}
__device__ __forceinline__ double madd(double a, double al, double b) {
    return __dadd_rn(a, __dmul_rn(al, b));
}

// The op's parameters in its compute type (cti_pointwise_params' names).
template <class V> struct Prm {
    V alpha, lo, hi, beta, threshold;
    // leaky_relu, elu, nan_to_num, round with decimals (10^|decimals|)
    V slope, ealpha, escale, einscale, nanv, posinf, neginf, tenpow;
    bool negdec;
    bool gelu_tanh; // gelu_backward: the forward's tanh approximation
    bool half;      // results stored as float16/bfloat16 (gelu's fast forms, kernels.cuh)
};

// Integer power by repeated squaring, wrapping; negative exponents give
// 1 / a^-b truncated (1, +-1 or 0).
template <class V> __device__ __forceinline__ V ipow(V a, V b) {
    typedef typename std::make_unsigned<V>::type U;
    if (b < 0) {
        if (a == 1) return 1;
        if (a == -1) return (b & 1) ? -1 : 1;
        return 0;
    }
    U base = (U)a, r = 1;
    while (b) {
        if (b & 1) r *= base;
        base *= base;
        b >>= 1;
    }
    return (V)r;
}

#define SQRT1_2 0.70710678118654752440
#define SQRT_2_OVER_PI 0.79788456080286535588

// ---- the ops ---------------------------------------------------------------------------------
// fam: which dtypes the CPU registers the op for. to_bool: the result is bool.
enum { F_FLOAT = 1, F_INT = 2, F_BOOL = 4 };
constexpr int F_FI = F_FLOAT | F_INT, F_ALL = F_FLOAT | F_INT | F_BOOL;

// Op<OP>: the op's arity, dtype families and element function; the launch
// table below holds every op given one (a UOP or BOP row), nothing else.
template <int OP> struct Op {
    static constexpr bool defined = false;
};

#define UOP(ID, FAM, R, ...)                                                                \
    template <> struct Op<CT_OP_##ID> {                                                     \
        static constexpr bool defined = true;                                               \
        static constexpr int nin = 1, fam = FAM;                                            \
        static constexpr bool to_bool = std::is_same<R<float>, bool>::value;                \
        template <class V> __device__ __forceinline__ static R<V> f(V x, const Prm<V> &p) { \
            typedef typename std::conditional<isf<V>, int, V>::type IV;                     \
            typedef typename std::make_unsigned<IV>::type U;                                \
            (void)p;                                                                        \
            (void)sizeof(U);                                                                \
            __VA_ARGS__                                                                     \
        }                                                                                   \
    };
#define TOP(ID, FAM, R, ...)                                                                \
    template <> struct Op<CT_OP_##ID> {                                                     \
        static constexpr bool defined = true;                                               \
        static constexpr int nin = 3, fam = FAM;                                            \
        static constexpr bool to_bool = false;                                              \
        template <class V>                                                                  \
        __device__ __forceinline__ static R<V> f(V a, V b, V w, const Prm<V> &p) {          \
            (void)p;                                                                        \
            __VA_ARGS__                                                                     \
        }                                                                                   \
    };
#define BOP(ID, FAM, R, ...)                                                                \
    template <> struct Op<CT_OP_##ID> {                                                     \
        static constexpr bool defined = true;                                               \
        static constexpr int nin = 2, fam = FAM;                                            \
        static constexpr bool to_bool = std::is_same<R<float>, bool>::value;                \
        template <class V>                                                                  \
        __device__ __forceinline__ static R<V> f(V a, V b, const Prm<V> &p) {               \
            typedef typename std::conditional<isf<V>, int, V>::type IV;                     \
            typedef typename std::make_unsigned<IV>::type U;                                \
            (void)p;                                                                        \
            (void)sizeof(U);                                                                \
            __VA_ARGS__                                                                     \
        }                                                                                   \
    };
template <class V> using Same = V;
template <class V> using Bool = bool;

UOP(NEG, F_FI, Same, if constexpr (isf<V>) return -x; else return (V)(0 - (U)x);)
UOP(ABS, F_FI, Same,
    if constexpr (isf<V>) return mfabs(x); else return x < 0 ? (V)(0 - (U)x) : x;)
UOP(EXP, F_FLOAT, Same, return mexp(x);)
UOP(LOG, F_FLOAT, Same, return mlog(x);)
UOP(SQRT, F_FLOAT, Same, return msqrt(x);)
UOP(RSQRT, F_FLOAT, Same, return (V)1 / msqrt(x);)
UOP(SIN, F_FLOAT, Same, return msin(x);)
UOP(COS, F_FLOAT, Same, return mcos(x);)
UOP(TANH, F_FLOAT, Same, return mtanh(x);)
UOP(SIGMOID, F_FLOAT, Same, return (V)1 / ((V)1 + mexp(-x));)
UOP(RELU, F_FI, Same,
    if constexpr (isf<V>) return (x > 0 || x != x) ? x : (V)0; else return x > 0 ? x : (V)0;)
UOP(GELU, F_FLOAT, Same, return (V)0.5 * x * ((V)1 + merf(x * (V)SQRT1_2));)
UOP(GELU_TANH, F_FLOAT, Same,
    if constexpr (std::is_same<V, float>::value) if (p.half) return gelu_tanh_half(x);
    return (V)0.5 * x * ((V)1 + mtanh((V)SQRT_2_OVER_PI * (x + (V)0.044715 * x * x * x)));)
UOP(SILU, F_FLOAT, Same, return x / ((V)1 + mexp(-x));)
UOP(SOFTPLUS, F_FLOAT, Same,
    const V bx = x * p.beta;
    return bx > p.threshold ? x : mlog1p(mexp(bx)) / p.beta;)
UOP(RECIPROCAL, F_FLOAT, Same, return (V)1 / x;)
UOP(SQUARE, F_FI, Same, if constexpr (isf<V>) return x * x; else return (V)((U)x * (U)x);)
UOP(SIGN, F_ALL, Same,
    if constexpr (isb<V>) return x; else return (V)((x > 0) - (x < 0));)
UOP(LOGICAL_NOT, F_ALL, Bool, return x == 0;)
UOP(CLAMP, F_FI, Same,
    if constexpr (isf<V>) {
        V y = (x < p.lo || p.lo != p.lo) ? p.lo : x;
        return (y > p.hi || p.hi != p.hi) ? p.hi : y;
    } else {
        V y = x < p.lo ? p.lo : x;
        return y > p.hi ? p.hi : y;
    })

BOP(ADD, F_ALL, Same,
    if constexpr (isf<V>) return madd(a, p.alpha, b);
    else if constexpr (isb<V>) return (V)(a | (b & p.alpha));
    else return (V)((U)a + (U)p.alpha * (U)b);)
BOP(SUB, F_FI, Same,
    if constexpr (isf<V>) return madd(a, p.alpha, b); else return (V)((U)a + (U)p.alpha * (U)b);)
BOP(MUL, F_ALL, Same,
    if constexpr (isf<V>) return a * b;
    else if constexpr (isb<V>) return (V)(a & b);
    else return (V)((U)a * (U)b);)
BOP(DIV, F_FLOAT, Same, return a / b;)
BOP(POW, F_FI, Same, if constexpr (isf<V>) return mpow(a, b); else return ipow<V>(a, b);)
BOP(MAXIMUM, F_ALL, Same,
    if constexpr (isf<V>) return (a > b || a != a) ? a : b;
    else if constexpr (isb<V>) return (V)(a | b);
    else return a > b ? a : b;)
BOP(MINIMUM, F_ALL, Same,
    if constexpr (isf<V>) return (a < b || a != a) ? a : b;
    else if constexpr (isb<V>) return (V)(a & b);
    else return a < b ? a : b;)
BOP(EQ, F_ALL, Bool, return a == b;)
BOP(NE, F_ALL, Bool, return a != b;)
BOP(LT, F_ALL, Bool, return a < b;)
BOP(LE, F_ALL, Bool, return a <= b;)
BOP(GT, F_ALL, Bool, return a > b;)
BOP(GE, F_ALL, Bool, return a >= b;)
BOP(LOGICAL_AND, F_ALL, Bool, return (a != 0) & (b != 0);)
BOP(LOGICAL_OR, F_ALL, Bool, return (a != 0) | (b != 0);)


// ---- math, activations, rounding, bitwise, lerp (the CPU table's rows) ----
UOP(LOG1P, F_FLOAT, Same, return mlog1p(x);)
UOP(EXPM1, F_FLOAT, Same, return mexpm1(x);)
UOP(LOG2, F_FLOAT, Same, return mlog2(x);)
UOP(LOG10, F_FLOAT, Same, return mlog10(x);)
UOP(EXP2, F_FLOAT, Same, return mexp2(x);)
UOP(FLOOR, F_FI, Same, if constexpr (isf<V>) return mfloor(x); else return x;)
UOP(CEIL, F_FI, Same, if constexpr (isf<V>) return mceil(x); else return x;)
UOP(ROUND, F_FI, Same, if constexpr (isf<V>) return mrint(x); else return x;)
UOP(ROUND_DECIMALS, F_FLOAT, Same,
    return p.negdec ? mrint(x / p.tenpow) * p.tenpow : mrint(x * p.tenpow) / p.tenpow;)
UOP(TRUNC, F_FI, Same, if constexpr (isf<V>) return mtrunc(x); else return x;)
UOP(FRAC, F_FLOAT, Same, return x - mtrunc(x);)
UOP(ERF, F_FLOAT, Same, return merf(x);)
UOP(ERFC, F_FLOAT, Same, return merfc(x);)
UOP(ERFINV, F_FLOAT, Same, return merfinv(x);)
UOP(TAN, F_FLOAT, Same, return mtan(x);)
UOP(ASIN, F_FLOAT, Same, return masin(x);)
UOP(ACOS, F_FLOAT, Same, return macos(x);)
UOP(ATAN, F_FLOAT, Same, return matan(x);)
UOP(SINH, F_FLOAT, Same, return msinh(x);)
UOP(COSH, F_FLOAT, Same, return mcosh(x);)
UOP(ASINH, F_FLOAT, Same, return masinh(x);)
UOP(ACOSH, F_FLOAT, Same, return macosh(x);)
UOP(ATANH, F_FLOAT, Same, return matanh(x);)
UOP(LEAKY_RELU, F_FLOAT, Same, return x > 0 ? x : x * p.slope;)
UOP(ELU, F_FLOAT, Same,
    return x > 0 ? p.escale * x : p.escale * p.ealpha * mexpm1(x * p.einscale);)
// mish: tanh(log(1 + e)) = n / (n + 2) with n = e (e + 2), e = e^x: one exp
// and a division instead of three functions (the CPU's vm_mish); past x = 20
// the factor is 1 in float64 as well, and n would overflow from x = 44.
UOP(MISH, F_FLOAT, Same,
    V e = mexp(x), n = e * (e + (V)2);
    return x > (V)20 ? x : x * (n / (n + (V)2));)
UOP(HARDTANH, F_FLOAT, Same,
    V y = (x < p.lo || p.lo != p.lo) ? p.lo : x;
    return (y > p.hi || p.hi != p.hi) ? p.hi : y;)
// NaN passes through both, as PyTorch's min(max(x + 3, 0), 6)
UOP(HARDSIGMOID, F_FLOAT, Same,
    V t = x + (V)3;
    t = t < 0 ? (V)0 : t;
    t = t > 6 ? (V)6 : t;
    return t / (V)6;)
UOP(HARDSWISH, F_FLOAT, Same,
    V t = x + (V)3;
    t = t < 0 ? (V)0 : t;
    t = t > 6 ? (V)6 : t;
    return x * t / (V)6;)
UOP(LOGSIGMOID, F_FLOAT, Same, return (x < 0 ? x : (V)0) - mlog1p(mexp(-mfabs(x)));)
UOP(NAN_TO_NUM, F_ALL, Same,
    if constexpr (isf<V>)
        return x != x ? p.nanv : x == (V)INFINITY ? p.posinf : x == -(V)INFINITY ? p.neginf : x;
    else return x;)
UOP(ISNAN, F_ALL, Bool, if constexpr (isf<V>) return x != x; else return false;)
UOP(ISINF, F_ALL, Bool, if constexpr (isf<V>) return x == x && x - x != 0; else return false;)
UOP(ISFINITE, F_ALL, Bool, if constexpr (isf<V>) return x - x == 0; else return true;)
UOP(BITWISE_NOT, F_INT | F_BOOL, Same, if constexpr (isb<V>) return (V)!x; else return (V)~x;)

// Integer fmod/remainder: a zero divisor gives 0 (as the CPU's), -1 too (no overflow).
BOP(ATAN2, F_FLOAT, Same, return matan2(a, b);)
// gelu_backward: grad_out (a) times d/dx gelu(x) at x (b) (kernels.cuh's gelu_grad).
BOP(GELU_BACKWARD, F_FLOAT, Same,
    if constexpr (std::is_same<V, float>::value) if (p.half) return a * gelu_grad_half(b, p.gelu_tanh);
    return a * gelu_grad(b, p.gelu_tanh);)
// threshold_backward: grad_out (a) where x (b) > threshold, else 0 (NaN x passes a).
BOP(THRESHOLD_BACKWARD, F_FLOAT, Same, return b <= p.threshold ? (V)0 : a;)
BOP(FMOD, F_FI, Same,
    if constexpr (isf<V>) return mfmod(a, b);
    else return (b == 0 || b == -1) ? (V)0 : (V)(a % b);)
BOP(REMAINDER, F_FI, Same,
    if constexpr (isf<V>) {
        V m = mfmod(a, b);
        return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;
    } else {
        V m = (b == 0 || b == -1) ? (V)0 : (V)(a % b);
        return (m != 0 && ((m < 0) != (b < 0))) ? (V)(m + b) : m;
    })
BOP(BITWISE_AND, F_INT | F_BOOL, Same, return (V)(a & b);)
BOP(BITWISE_OR, F_INT | F_BOOL, Same, return (V)(a | b);)
BOP(BITWISE_XOR, F_INT | F_BOOL, Same, return (V)(a ^ b);)
// counts outside [0, bits) (negative ones read as unsigned): 0 to the left, the sign fill
// to the right, as PyTorch
BOP(BITWISE_LEFT_SHIFT, F_INT, Same,
    if constexpr (isf<V>) return a;
    else {
        constexpr U bits = sizeof(V) * 8;
        return (U)b >= bits ? (V)0 : (V)((U)a << b);
    })
BOP(BITWISE_RIGHT_SHIFT, F_INT, Same,
    if constexpr (isf<V>) return a;
    else {
        constexpr U bits = sizeof(V) * 8;
        return (U)b >= bits - 1 ? (V)(a >> (bits - 1)) : (V)(a >> b);
    })
// lerp as PyTorch: from the nearer end, so weight 1 gives end exactly
TOP(LERP, F_FLOAT, Same,
    return mfabs(w) < (V)0.5 ? a + w * (b - a) : b - (b - a) * ((V)1 - w);)

#undef UOP
#undef BOP
#undef TOP

constexpr int fam_of(int dt) {
    return dt == CT_BOOL ? F_BOOL : (dt == CT_I32 || dt == CT_I64) ? F_INT : F_FLOAT;
}

// ---- kernel arguments -------------------------------------------------------------------------
struct KArgs {
    void *out;
    const void *in[CTI_EW_MAX_IN];
    int mode[CTI_EW_MAX_IN];
    int sdt[CTI_EW_MAX_IN];
    double dval[CTI_EW_MAX_IN];
    int64_t ival[CTI_EW_MAX_IN];
    cti_pointwise_params prm;
    int64_t n;
};

// One element of any dtype at p, as a double and as an integer.
__device__ __forceinline__ void read_any(const void *p, int dt, double &d, int64_t &i) {
    switch (dt) {
    case CT_BOOL: i = *(const uint8_t *)p != 0; d = (double)i; break;
    case CT_I32: i = *(const int32_t *)p; d = (double)i; break;
    case CT_I64: i = *(const int64_t *)p; d = (double)i; break;
    case CT_F16: d = dec_f16(*(const uint16_t *)p); i = f2i64(d); break;
    case CT_BF16: d = dec_bf16(*(const uint16_t *)p); i = f2i64(d); break;
    case CT_F32: d = *(const float *)p; i = f2i64(d); break;
    default: d = *(const double *)p; i = f2i64(d); break;
    }
}

template <class V> __device__ __forceinline__ V scalar_value(const KArgs &a, int k) {
    double d = a.dval[k];
    int64_t i = a.ival[k];
    if (a.mode[k] == CTI_EW_DEVSCALAR) read_any(a.in[k], a.sdt[k], d, i);
    if constexpr (isf<V>) return (V)d;
    else return (V)i;
}

// The call's cti_pointwise_params in the compute type: floating ops read
// the floating fields, integer ops the integer ones.
template <class V, int DT> __device__ __forceinline__ Prm<V> params(const KArgs &a) {
    const cti_pointwise_params &q = a.prm;
    Prm<V> p = {};
    p.half = DT == CT_F16 || DT == CT_BF16;
    if constexpr (isf<V>) {
        p.alpha = (V)q.alpha;
        p.lo = (V)q.lo;
        p.hi = (V)q.hi;
        p.beta = (V)q.beta;
        p.threshold = (V)q.threshold;
        p.slope = (V)q.negative_slope;
        p.ealpha = (V)q.elu_alpha;
        p.escale = (V)q.elu_scale;
        p.einscale = (V)q.elu_input_scale;
        p.nanv = (V)q.nan_val;
        p.posinf = (V)q.posinf_val;
        p.neginf = (V)q.neginf_val;
        p.negdec = q.decimals < 0;
        p.tenpow = (V)pow(10.0, (double)(p.negdec ? -q.decimals : q.decimals));
        p.gelu_tanh = q.approximate == 1; // CT_GELU_TANH
    } else if constexpr (isb<V>) {
        p.alpha = q.ialpha != 0;
        p.lo = 0;
        p.hi = 1;
        p.beta = p.threshold = 0;
    } else {
        p.alpha = (V)q.ialpha;
        p.lo = (V)q.ilo;
        p.hi = (V)q.ihi;
        p.beta = p.threshold = 0;
    }
    return p;
}

template <int OP, class V>
__device__ __forceinline__ auto apply(const V (&x)[CTI_EW_MAX_IN], const Prm<V> &p) {
    if constexpr (Op<OP>::nin == 1) return Op<OP>::template f<V>(x[0], p);
    else if constexpr (Op<OP>::nin == 2) return Op<OP>::template f<V>(x[0], x[1], p);
    else return Op<OP>::template f<V>(x[0], x[1], x[2], p);
}

// Storage of the result.
template <int OP, int DT> struct out_of {
    typedef typename std::conditional<Op<OP>::to_bool, uint8_t, typename dtype<DT>::T>::type T;
};

template <int OP, int DT, class R>
__device__ __forceinline__ typename out_of<OP, DT>::T store_value(R r) {
    if constexpr (Op<OP>::to_bool) return (uint8_t)(r ? 1 : 0);
    else return dtype<DT>::enc(r);
}

template <class T, int N> struct alignas(sizeof(T) * N) pack {
    T v[N];
};

// ---- contiguous: tiles of 16-byte accesses ----------------------------------------------------
template <int OP, int DT, int VEC>
__global__ void __launch_bounds__(kThreads) ew_contig(const KArgs a) {
    typedef typename value_of<DT>::V V;
    typedef typename dtype<DT>::T S;
    typedef typename out_of<OP, DT>::T O;
    constexpr int NIN = Op<OP>::nin;
    constexpr int64_t TILE = (int64_t)kThreads * VEC * kUnroll;
    const Prm<V> p = params<V, DT>(a);
    V sv[CTI_EW_MAX_IN];
    bool arr[CTI_EW_MAX_IN];
#pragma unroll
    for (int k = 0; k < NIN; k++) {
        arr[k] = a.mode[k] == CTI_EW_ARRAY;
        sv[k] = arr[k] ? (V)0 : scalar_value<V>(a, k);
    }
    const int64_t base = (int64_t)blockIdx.x * TILE;
    if (base + TILE <= a.n) {
        pack<S, VEC> x[NIN][kUnroll];
#pragma unroll
        for (int k = 0; k < NIN; k++) {
            if (!arr[k]) continue;
            const pack<S, VEC> *src = reinterpret_cast<const pack<S, VEC> *>((const S *)a.in[k] + base);
#pragma unroll
            for (int u = 0; u < kUnroll; u++) x[k][u] = src[u * kThreads + threadIdx.x];
        }
        pack<O, VEC> *dst = reinterpret_cast<pack<O, VEC> *>((O *)a.out + base);
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            pack<O, VEC> r;
#pragma unroll
            for (int j = 0; j < VEC; j++) {
                V v[CTI_EW_MAX_IN];
#pragma unroll
                for (int k = 0; k < NIN; k++) v[k] = arr[k] ? (V)dtype<DT>::dec(x[k][u].v[j]) : sv[k];
                r.v[j] = store_value<OP, DT>(apply<OP, V>(v, p));
            }
            dst[u * kThreads + threadIdx.x] = r;
        }
    } else {
        for (int64_t i = base + threadIdx.x; i < a.n; i += kThreads) {
            V v[CTI_EW_MAX_IN];
#pragma unroll
            for (int k = 0; k < NIN; k++) v[k] = arr[k] ? (V)dtype<DT>::dec(((const S *)a.in[k])[i]) : sv[k];
            ((O *)a.out)[i] = store_value<OP, DT>(apply<OP, V>(v, p));
        }
    }
}

// ---- strided / broadcast ------------------------------------------------------------------------
template <int OP, int DT, class I>
__global__ void __launch_bounds__(kThreads) ew_strided(const KArgs a, const cti_cuda_iter it) {
    typedef typename value_of<DT>::V V;
    typedef typename dtype<DT>::T S;
    typedef typename out_of<OP, DT>::T O;
    constexpr int NIN = Op<OP>::nin;
    const Prm<V> p = params<V, DT>(a);
    V sv[CTI_EW_MAX_IN];
    bool arr[CTI_EW_MAX_IN];
#pragma unroll
    for (int k = 0; k < NIN; k++) {
        arr[k] = a.mode[k] == CTI_EW_ARRAY;
        sv[k] = arr[k] ? (V)0 : scalar_value<V>(a, k);
    }
    const I n = (I)it.numel, stride = (I)(gridDim.x * blockDim.x);
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        int64_t off[NIN + 1];
        offsets<NIN + 1, I>(it, i, off);
        V v[CTI_EW_MAX_IN];
#pragma unroll
        for (int k = 0; k < NIN; k++)
            v[k] = arr[k] ? (V)dtype<DT>::dec(((const S *)a.in[k])[off[k + 1]]) : sv[k];
        ((O *)a.out)[off[0]] = store_value<OP, DT>(apply<OP, V>(v, p));
    }
}

// ---- where: a select on the bits ------------------------------------------------------------------
template <class T, int VEC>
__global__ void __launch_bounds__(kThreads)
where_contig(T *out, const uint8_t *cond, const T *x, const T *y, int64_t n) {
    constexpr int64_t TILE = (int64_t)kThreads * VEC * kUnroll;
    const int64_t base = (int64_t)blockIdx.x * TILE;
    if (base + TILE <= n) {
        pack<uint8_t, VEC> c[kUnroll];
        pack<T, VEC> a[kUnroll], b[kUnroll];
        const pack<uint8_t, VEC> *pc = reinterpret_cast<const pack<uint8_t, VEC> *>(cond + base);
        const pack<T, VEC> *pa = reinterpret_cast<const pack<T, VEC> *>(x + base);
        const pack<T, VEC> *pb = reinterpret_cast<const pack<T, VEC> *>(y + base);
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            c[u] = pc[u * kThreads + threadIdx.x];
            a[u] = pa[u * kThreads + threadIdx.x];
            b[u] = pb[u * kThreads + threadIdx.x];
        }
        pack<T, VEC> *po = reinterpret_cast<pack<T, VEC> *>(out + base);
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            pack<T, VEC> r;
#pragma unroll
            for (int j = 0; j < VEC; j++) r.v[j] = c[u].v[j] ? a[u].v[j] : b[u].v[j];
            po[u * kThreads + threadIdx.x] = r;
        }
    } else {
        for (int64_t i = base + threadIdx.x; i < n; i += kThreads) out[i] = cond[i] ? x[i] : y[i];
    }
}

template <class T, class I>
__global__ void __launch_bounds__(kThreads)
where_strided(T *out, const uint8_t *cond, const T *x, const T *y, const cti_cuda_iter it) {
    const I n = (I)it.numel, stride = (I)(gridDim.x * blockDim.x);
    for (I i = (I)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
        int64_t off[4];
        offsets<4, I>(it, i, off);
        out[off[0]] = cond[off[1]] ? x[off[2]] : y[off[3]];
    }
}

// ---- host side ---------------------------------------------------------------------------------------
bool aligned(const void *p, size_t bytes) { return (uintptr_t)p % bytes == 0; }

unsigned tiles(int64_t n, int64_t tile) { return (unsigned)((n + tile - 1) / tile); }

KArgs kargs(const cti_cuda_ew *e) {
    KArgs a;
    memset(&a, 0, sizeof a);
    a.out = e->out;
    for (int k = 0; k < CTI_EW_MAX_IN; k++) {
        a.in[k] = e->in[k];
        a.mode[k] = e->mode[k];
        a.sdt[k] = e->sdt[k];
        a.dval[k] = e->dval[k];
        a.ival[k] = e->ival[k];
    }
    a.prm = e->prm;
    a.n = e->n;
    return a;
}

template <int OP, int DT>
cudaError_t launch_op(const cti_cuda_ew *e, int sms, cudaStream_t st, const char **routine) {
    typedef typename dtype<DT>::T S;
    typedef typename out_of<OP, DT>::T O;
    constexpr int ES = sizeof(S) > sizeof(O) ? (int)sizeof(S) : (int)sizeof(O);
    constexpr int VEC = 16 / ES;
    const KArgs a = kargs(e);
    if (e->contiguous) {
        bool vec = aligned(e->out, sizeof(O) * VEC);
        for (int k = 0; k < Op<OP>::nin; k++)
            if (e->mode[k] == CTI_EW_ARRAY) vec = vec && aligned(e->in[k], sizeof(S) * VEC);
        if (vec) {
            *routine = "cuda_elementwise_vec16";
            ew_contig<OP, DT, VEC><<<tiles(e->n, (int64_t)kThreads * VEC * kUnroll), kThreads, 0, st>>>(a);
        } else {
            *routine = "cuda_elementwise_contiguous";
            ew_contig<OP, DT, 1><<<tiles(e->n, (int64_t)kThreads * kUnroll), kThreads, 0, st>>>(a);
        }
    } else {
        *routine = "cuda_elementwise_strided";
        unsigned grid = grid_for(e->it->numel, sms);
        if (e->it->use32) ew_strided<OP, DT, uint32_t><<<grid, kThreads, 0, st>>>(a, *e->it);
        else ew_strided<OP, DT, int64_t><<<grid, kThreads, 0, st>>>(a, *e->it);
    }
    return cudaGetLastError();
}

template <class T>
cudaError_t launch_where(const cti_cuda_ew *e, int sms, cudaStream_t st, const char **routine) {
    constexpr int VEC = 16 / sizeof(T);
    T *out = (T *)e->out;
    const uint8_t *c = (const uint8_t *)e->in[0];
    const T *x = (const T *)e->in[1], *y = (const T *)e->in[2];
    if (e->contiguous && aligned(out, 16) && aligned(c, VEC) && aligned(x, 16) && aligned(y, 16)) {
        *routine = "cuda_where_vec16";
        where_contig<T, VEC><<<tiles(e->n, (int64_t)kThreads * VEC * kUnroll), kThreads, 0, st>>>(
            out, c, x, y, e->n);
    } else if (e->contiguous) {
        *routine = "cuda_where_contiguous";
        where_contig<T, 1><<<tiles(e->n, (int64_t)kThreads * kUnroll), kThreads, 0, st>>>(out, c, x, y,
                                                                                        e->n);
    } else {
        *routine = "cuda_where_strided";
        unsigned grid = grid_for(e->it->numel, sms);
        if (e->it->use32) where_strided<T, uint32_t><<<grid, kThreads, 0, st>>>(out, c, x, y, *e->it);
        else where_strided<T, int64_t><<<grid, kThreads, 0, st>>>(out, c, x, y, *e->it);
    }
    return cudaGetLastError();
}

typedef cudaError_t (*launch_fn)(const cti_cuda_ew *, int, cudaStream_t, const char **);

// The launcher of (OP, DT), or NULL where the op has no row or the CPU
// registers no kernel for the dtype.
template <int OP, int DT> constexpr launch_fn entry() {
    if constexpr (Op<OP>::defined) {
        if constexpr ((Op<OP>::fam & fam_of(DT)) != 0) return launch_op<OP, DT>;
    }
    return nullptr;
}

// The launchers of every (op, dtype), built at compile time from the rows.
typedef std::array<launch_fn, CT_NUM_DTYPES> launch_row;
template <int OP, int... DT> constexpr launch_row row_of(std::integer_sequence<int, DT...>) {
    return launch_row{{entry<OP, DT>()...}};
}
template <int... OP>
constexpr std::array<launch_row, sizeof...(OP)> table_of(std::integer_sequence<int, OP...>) {
    return {{row_of<OP>(std::make_integer_sequence<int, CT_NUM_DTYPES>{})...}};
}
constexpr auto kLaunch = table_of(std::make_integer_sequence<int, CT_NUM_OPS>{});

launch_fn find(int op, int dt) {
    if ((unsigned)op >= CT_NUM_OPS || (unsigned)dt >= CT_NUM_DTYPES) return nullptr;
    if (op != CT_OP_WHERE) return kLaunch[op][dt];
    switch (ct_dtype_size((ct_dtype)dt)) {
    case 1: return launch_where<uint8_t>;
    case 2: return launch_where<uint16_t>;
    case 4: return launch_where<uint32_t>;
    default: return launch_where<uint64_t>;
    }
}

} // namespace
} // namespace cti

extern "C" {

bool cti_cuda_ew_supported(int op, ct_dtype dtype) { return cti::find(op, dtype) != nullptr; }

cudaError_t cti_cuda_elementwise(const cti_cuda_ew *a, int sm_count, cudaStream_t stream,
                                 const char **routine) {
    cti::launch_fn fn = cti::find(a->op, a->dtype);
    if (!fn) return cudaErrorInvalidValue;
    return fn(a, sm_count, stream, routine);
}

} // extern "C"
