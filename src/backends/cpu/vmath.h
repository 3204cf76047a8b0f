/* Private to the CPU kernels: float32 transcendental functions that GCC
 * vectorizes.
 *
 * GCC cannot vectorize a loop that calls libm (a call per element: glibc's
 * tanhf costs about 14 ns), so these are written branch-free on scalars:
 * both sides of every case are computed and one is selected, integers stand
 * in for frexp/ldexp, and the loops that call them vectorize at whatever
 * width the kernel set is compiled for (cpu_impl.h). Each is meant for
 * float32 data, including float16/bfloat16 widened to float32; float64 keeps
 * libm, as the reference dtype.
 *
 * Accuracy: the largest error in ulps of the exact value (a correctly
 * rounded result is within 0.5), over every float32 input (exhaustive
 * sweeps, docs/BENCHMARKS.md; tests/test_elementwise.c checks these bounds
 * on a dense sweep at every ISA level), for results of at least FLT_MIN
 * (smaller ones are within FLT_MIN):
 *   vm_sin, vm_cos        0.8 float32 reduction and polynomials (|x| <=
 *                               VM_TRIG_FAST_MAX), measured 0.72 with FMA,
 *                               0.78 without
 *   vm_sin_wide, vm_cos_wide  in float64 (|x| <= VM_TRIG_MAX), measured 0.5
 *   vm_log                1   Cephes' float32 polynomial
 *   vm_exp, vm_tanh       1.5 Cephes' float32 polynomials
 *   vm_sigmoid, vm_softplus 3 from vm_exp and vm_log
 *   vm_silu, vm_gelu_tanh 4   x times an exp-based factor
 *   vm_gelu               7   through erfc (fitted here)
 * and, measured on the test's sweep (about 2^19 points over the range, not
 * exhaustive; the bounds test_elementwise.c checks are these plus a margin):
 *   vm_exp2 0.9, vm_log2 1.7, vm_log10 1.9, vm_log1p 0.9, vm_expm1 1.4,
 *   vm_tan 1.8, vm_asin 2.2, vm_acos 1.2, vm_atan 2.2, vm_sinh 1.9, vm_cosh 1.4,
 *   vm_asinh 1.5, vm_acosh 1.5, vm_atanh 1.8, vm_erf 2.9, vm_erfc 5.1,
 *   vm_erfinv 3.4, vm_mish 3.5 (x n / (n + 2), n = e^x (e^x + 2)), and -vm_softplus(-x)
 *   (logsigmoid) 2.1.
 * That is within a few roundings of glibc (1 to 2 ulp) and of the fast exp
 * the softmax kernels always used (1 ulp), far inside the 1e-5 relative
 * (84 ulp) that float32 results are tested to elsewhere.
 * vm_sin and vm_cos hold for |x| <= VM_TRIG_FAST_MAX and the _wide ones for
 * |x| <= VM_TRIG_MAX; callers take libm's float64 sin/cos beyond
 * (elementwise.c), so that sin and cos of float32 are within 0.8 ulp for
 * every input.
 *
 * Where the kernel set has FMA, polynomials use it (the library is built in
 * ISO C mode, so the compiler never contracts a * b + c by itself); results
 * of the levels may then differ in the last bit, all within the bounds. */
#ifndef CTEN_CPU_VMATH_H
#define CTEN_CPU_VMATH_H

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define VM_INLINE static inline __attribute__((always_inline, unused))

#ifdef __FMA__
#define VM_FMA(a, b, c) __builtin_fmaf(a, b, c)
#define VM_FMAD(a, b, c) __builtin_fma(a, b, c)
#else
#define VM_FMA(a, b, c) ((a) * (b) + (c))
#define VM_FMAD(a, b, c) ((a) * (b) + (c))
#endif

VM_INLINE uint32_t vm_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
VM_INLINE float vm_from_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}
VM_INLINE uint64_t vm_bits_d(double x) {
    uint64_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}
VM_INLINE double vm_from_bits_d(uint64_t u) {
    double x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* ---- exp ------------------------------------------------------------------------------
 * exp(x) = 2^n exp(r), n = round(x / ln 2) (the 1.5 * 2^23 addend rounds),
 * r = x - n ln 2 in two parts (Cody-Waite), Cephes' degree-6 polynomial for
 * exp(r), 2^n put into the exponent. The exps inside the other functions
 * (and softmax's) flush results below FLT_MIN to 0 and scale once; the exp
 * op scales in two factors, so that its subnormal results come out right. */
VM_INLINE float vm_exp_poly(float r) {
    float p = 1.9875691500e-4f;
    p = VM_FMA(p, r, 1.3981999507e-3f);
    p = VM_FMA(p, r, 8.3334519073e-3f);
    p = VM_FMA(p, r, 4.1665795894e-2f);
    p = VM_FMA(p, r, 1.6666665459e-1f);
    p = VM_FMA(p, r, 5.0000001201e-1f);
    return VM_FMA(p * r, r, r) + 1.0f;
}
#define VM_EXP_REDUCE(x, t, n, r)                                                    \
    float t = VM_FMA(x, 1.44269504088896341f, 12582912.0f);                          \
    float n = t - 12582912.0f;                                                       \
    float r = VM_FMA(-n, 0.693359375f, x); /* n * 0.693359375 is exact */            \
    r = VM_FMA(n, 2.12194440e-4f, r)

/* exp(hi + lo) 2^k, rounded once, 0 where that is below FLT_MIN, for
 * hi + lo <= 88 - k ln 2 (more gives inf or garbage) and |lo| at most an ulp
 * of hi: lo carries the digits of an argument that float32 cannot hold
 * (gelu's -x^2 / 2), k (0 <= k <= 64) lifts results that would be subnormal
 * so that a product with them keeps its digits. NaN in, NaN out; -inf gives
 * 0, so that x e^x is NaN for x = -inf, as the plain formulas give. */
VM_INLINE float vm_exp_ftz(float hi, float lo, int32_t k) {
    const float lowest = -87.33654f - (float)k * 0.693147181f; /* result FLT_MIN */
    float xc = hi > 88.8f ? 88.8f : hi;
    VM_EXP_REDUCE(xc, t, n, r);
    r = r + lo;
    float p = vm_exp_poly(r);
    /* 2^(n + k) from t's low bits, in unsigned arithmetic: NaN's bits or a
     * flushed argument's give garbage, never overflow */
    float res = p * vm_from_bits((vm_bits(t) - (0x4B400000u - 127u - (uint32_t)k)) << 23);
    return hi < lowest ? 0.0f : res;
}

/* exp(x) over the whole float32 range, subnormal results included: 2^n in
 * two factors (n runs from -150 to 128). */
VM_INLINE float vm_exp(float x) {
    float xc = x < -104.0f ? -104.0f : (x > 89.0f ? 89.0f : x);
    VM_EXP_REDUCE(xc, t, n, r);
    float p = vm_exp_poly(r);
    int32_t ni = (int32_t)(vm_bits(t) - 0x4B400000u);
    int32_t n1 = ni >> 1;
    float s1 = vm_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = vm_from_bits((uint32_t)(ni - n1 + 127) << 23);
    return p * s1 * s2; /* NaN stays NaN through p */
}

/* Cephes' polynomial part of log(1 + f) for f in [sqrt(1/2) - 1, sqrt(2) - 1):
 * log(1 + f) = f - f^2 / 2 + vm_log_poly(f) (vm_log, vm_log_pos and vm_log_split add the
 * exponent's terms around it). */
VM_INLINE float vm_log_poly(float f) {
    float z = f * f;
    float y = 7.0376836292E-2f;
    y = VM_FMA(y, f, -1.1514610310E-1f);
    y = VM_FMA(y, f, 1.1676998740E-1f);
    y = VM_FMA(y, f, -1.2420140846E-1f);
    y = VM_FMA(y, f, 1.4249322787E-1f);
    y = VM_FMA(y, f, -1.6668057665E-1f);
    y = VM_FMA(y, f, 2.0000714765E-1f);
    y = VM_FMA(y, f, -2.4999993993E-1f);
    y = VM_FMA(y, f, 3.3333331174E-1f);
    return y * f * z;
}

/* ---- log ------------------------------------------------------------------------------
 * x = 2^e m with m in [sqrt(1/2), sqrt(2)), log x = e ln 2 + log m, Cephes'
 * polynomial for log(1 + f), f = m - 1. Subnormal x is scaled by 2^23 first. */
VM_INLINE float vm_log(float x) {
    int sub = x < FLT_MIN;
    float xs = sub ? x * 8388608.0f : x;
    uint32_t u = vm_bits(xs);
    int32_t e = (int32_t)((u >> 23) & 0xffu) - 126 - (sub ? 23 : 0);
    float m = vm_from_bits((u & 0x007fffffu) | 0x3f000000u); /* [0.5, 1) */
    int lo = m < 0.707106781186547524f;
    float f = lo ? m + m - 1.0f : m - 1.0f; /* exact */
    float fe = (float)(lo ? e - 1 : e);
    float z = f * f;
    float y = vm_log_poly(f);
    y = VM_FMA(fe, -2.12194440e-4f, y);
    y = VM_FMA(z, -0.5f, y);
    float res = VM_FMA(fe, 0.693359375f, f + y);
    res = x == INFINITY ? x : res;
    res = x == 0.0f ? -INFINITY : res;
    return x >= 0.0f ? res : NAN; /* also for NaN */
}

/* ---- built from exp and log -------------------------------------------------------- */
/* 1 / (1 + e^-x), as e / (1 + e) with e = e^x for x < 0: never e^|x| large. */
VM_INLINE float vm_sigmoid(float x) {
    float e = vm_exp_ftz(-fabsf(x), 0.0f, 0);
    float d = 1.0f + e;
    return (x >= 0.0f ? 1.0f : e) / d; /* NaN: e is NaN */
}

/* x sigmoid(x), with e = e^-|x| taken as e 2^64: for x < -87, e is
 * subnormal but x e is not, and keeps its digits that way. */
VM_INLINE float vm_silu(float x) {
    float e64 = vm_exp_ftz(-fabsf(x), 0.0f, 64);
    float d = 1.0f + e64 * 0x1p-64f;
    return x >= 0.0f ? x / d : ((x * e64) / d) * 0x1p-64f;
}

/* log(1 + e^x) = max(x, 0) + log1p(u), u = e^-|x| in (0, 1]: the exp never
 * overflows. log1p(u) = u P(u), P a degree-9 polynomial fitted here to
 * log1p(u) / u on [0, 1] (relative error 5e-9): no division, no exponent
 * and mantissa split, and u's relative precision kept where it is tiny. */
VM_INLINE float vm_softplus(float x) {
    float u = vm_exp_ftz(-fabsf(x), 0.0f, 0);
    float p = -3.252848008e-03f;
    p = VM_FMA(p, u, 1.989155703e-02f);
    p = VM_FMA(p, u, -5.703556248e-02f);
    p = VM_FMA(p, u, 1.061144295e-01f);
    p = VM_FMA(p, u, -1.531025252e-01f);
    p = VM_FMA(p, u, 1.967758183e-01f);
    p = VM_FMA(p, u, -2.495446013e-01f);
    p = VM_FMA(p, u, 3.332999509e-01f);
    p = VM_FMA(p, u, -4.999990369e-01f);
    p = VM_FMA(p, u, 9.999999954e-01f);
    float r = (x > 0.0f ? x : 0.0f) + u * p;
    return x != x ? x : r;
}

/* Cephes' tanhf: an odd polynomial below |x| = 0.625, where 1 - 2 / (e^2|x| + 1)
 * would cancel; that form above (1 at overflow). */
VM_INLINE float vm_tanh(float x) {
    float a = fabsf(x);
    float s = x * x;
    float p = -5.70498872745E-3f;
    p = VM_FMA(p, s, 2.06390887954E-2f);
    p = VM_FMA(p, s, -5.37397155531E-2f);
    p = VM_FMA(p, s, 1.33314422036E-1f);
    p = VM_FMA(p, s, -3.33332819422E-1f);
    float small = VM_FMA(p * s, x, x);
    float big = 1.0f - 2.0f / (vm_exp_ftz(a + a, 0.0f, 0) + 1.0f);
    big = copysignf(big, x);
    return a < 0.625f ? small : big; /* NaN: big is NaN */
}

/* ---- sin, cos ---------------------------------------------------------------------------
 * In float32, on a = |x| (sin x = sign(x) sin a, cos x = cos a):
 * j = round(a 2 / pi), r = a - j pi/2 = hi + lo by Cody-Waite with pi/2 in
 * parts (below), minimax polynomials of sin and cos on |r| <= pi/4 (to
 * 0.7925: j comes from a rounded a 2 / pi, which moves |r| up to 0.0054 past
 * pi/4 at 2^17), chosen and signed by j mod 4. r is kept to about 2^-55: the
 * float32 nearest a multiple of pi/2 below 2^24 (252.898209) leaves
 * |r| = 2^-27.8, and the 24 bits of the result need r to about 2^-52.
 *
 * With FMA: pi/2 = A + B + C (24 bits each, rest 1.1e-23). a - j A is exact
 * (a multiple of 2^-24 below 1, for any j); j B is an exact pair (pB, eB)
 * from an FMA, and a - j A - pB an exact pair by Fast2Sum (a - j A is a
 * multiple of 2^-24 under 1 and |pB| < 1/2); j C and eB go into lo rounded.
 * Without FMA: pi/2 in five parts of at most 11 bits but the last, so that
 * j A .. j D are exact for j < 2^13; a - j A is exact (Sterbenz), so is
 * its difference with j B (a multiple of 2^-24 below 1), then two Fast2Sums
 * for j C and j D, j E rounded into lo.
 * Either way the rounding errors and the truncated rest stay below about
 * 2^-55 up to VM_TRIG_FAST_MAX; beyond it callers take vm_sin_wide/vm_cos_wide
 * (the reduction in float64, to 2^24), and libm's float64 sin/cos after
 * that (elementwise.c). */
#ifdef __FMA__
#define VM_TRIG_FAST_MAX 131072.0f /* 2^17: j < 2^17 */
#else
#define VM_TRIG_FAST_MAX 8192.0f /* 2^13: j < 2^13 */
#endif
#define VM_TRIG_MAX 16777216.0f /* 2^24: from there on, floats are even integers */

/* r = a - j pi/2 = hi + lo for a = |x| <= VM_TRIG_FAST_MAX; j mod 4 in *q */
VM_INLINE float vm_trig_reduce(float a, float *lo, uint32_t *q) {
    float t = VM_FMA(a, 0.636619772f, 12582912.0f); /* 1.5 * 2^23 + j */
    float j = t - 12582912.0f;
    *q = vm_bits(t) & 3u;
#ifdef __FMA__
    float r1 = __builtin_fmaf(-j, 0x1.921fb6p+0f, a);
    float pb = j * -0x1.777a5cp-25f, eb = __builtin_fmaf(j, -0x1.777a5cp-25f, -pb);
    float hi = r1 - pb;
    float l = (r1 - hi) - pb;
    *lo = __builtin_fmaf(-j, -0x1.ee59dap-50f, l - eb);
#else
    float r2 = (a - j * 0x1.92p+0f) - j * 0x1.fb4p-12f;
    float pc = j * 0x1.444p-24f, pd = j * 0x1.68cp-39f;
    float h1 = r2 - pc;
    float l1 = (r2 - h1) - pc;
    float hi = h1 - pd;
    float l2 = (h1 - hi) - pd;
    *lo = (l1 + l2) - j * 0x1.1a6264p-54f;
#endif
    return hi;
}
/* sin(hi + lo) and cos(hi + lo): h + h^3 P(z) and 1 - z/2 + z^2 Q(z), z = h^2,
 * P and Q fitted here (relative minimax, float coefficients) on |h| <= 0.7925
 * (relative error 1.7e-10 and 1.4e-10), and lo's first-order terms. */
VM_INLINE float vm_sin_kernel(float hi, float lo, float z) {
    float p = 2.826340506e-06f;
    p = VM_FMA(p, z, -1.985256240e-04f);
    p = VM_FMA(p, z, 8.333378471e-03f);
    p = VM_FMA(p, z, -1.666666716e-01f);
    return hi + VM_FMA(hi * z, p, VM_FMA(-0.5f * z, lo, lo)); /* lo cos(hi) */
}
VM_INLINE float vm_cos_kernel(float hi, float lo, float z) {
    float p = 2.443030826e-05f;
    p = VM_FMA(p, z, -1.388729899e-03f);
    p = VM_FMA(p, z, 4.166664556e-02f);
    float hz = 0.5f * z, w = 1.0f - hz;
#ifdef __FMA__
    float t = __builtin_fmaf(-0.5f, __builtin_fmaf(hi, hi, -z), -hi * lo); /* z's error too */
#else
    float t = -hi * lo;
#endif
    /* 1 - hz rounded is w; (1 - w) - hz, exact, is what it lost */
    return w + (((1.0f - w) - hz) + VM_FMA(z * z, p, t));
}
/* quadrant offset q0: 0 for sin, 1 for cos (cos x = sin(x + pi/2)) */
VM_INLINE float vm_sincos(float x, uint32_t q0) {
    float a = fabsf(x), lo;
    uint32_t q;
    float hi = vm_trig_reduce(a, &lo, &q);
    q += q0;
    float z = hi * hi;
    float v = (q & 1u) ? vm_cos_kernel(hi, lo, z) : vm_sin_kernel(hi, lo, z);
    /* the sign: of the quadrant, and of x for sin (sin(-0) = -0) */
    uint32_t sign = ((q & 2u) << 30) ^ (q0 ? 0u : (vm_bits(x) & 0x80000000u));
    return vm_from_bits(vm_bits(v) ^ sign);
}
VM_INLINE float vm_sin(float x) { return vm_sincos(x, 0); }
VM_INLINE float vm_cos(float x) { return vm_sincos(x, 1); }

/* The same in float64 for VM_TRIG_FAST_MAX < |x| <= VM_TRIG_MAX: j = round(x
 * 2 / pi), r = x - j pi/2 with pi/2 in four parts of 29 bits (each j * part
 * exact for |j| < 2^24), Taylor polynomials of sin and cos on |r| <= pi/4
 * (to r^13 and r^14: below 1e-14), chosen and signed by j mod 4. */
VM_INLINE double vm_sin_poly_d(double r, double r2) {
    double p = 1.0 / 6227020800.0;
    p = VM_FMAD(p, r2, -1.0 / 39916800.0);
    p = VM_FMAD(p, r2, 1.0 / 362880.0);
    p = VM_FMAD(p, r2, -1.0 / 5040.0);
    p = VM_FMAD(p, r2, 1.0 / 120.0);
    p = VM_FMAD(p, r2, -1.0 / 6.0);
    return VM_FMAD(p * r2, r, r);
}
VM_INLINE double vm_cos_poly_d(double r2) {
    double p = -1.0 / 87178291200.0;
    p = VM_FMAD(p, r2, 1.0 / 479001600.0);
    p = VM_FMAD(p, r2, -1.0 / 3628800.0);
    p = VM_FMAD(p, r2, 1.0 / 40320.0);
    p = VM_FMAD(p, r2, -1.0 / 720.0);
    p = VM_FMAD(p, r2, 1.0 / 24.0);
    p = VM_FMAD(p, r2, -0.5);
    return VM_FMAD(p, r2, 1.0);
}
VM_INLINE float vm_sincos_wide(float xf, unsigned q0) {
    double x = xf;
    double t = x * 0.6366197723675814 + 6755399441055744.0;
    double j = t - 6755399441055744.0;
    double r = x - j * 1.570796325802803;
    r = r - j * 9.920935774287987e-10;
    r = r - j * 2.2517417706346578e-18;
    r = r - j * 3.521559857935336e-27;
    unsigned q = ((unsigned)vm_bits_d(t) + q0) & 3u;
    double r2 = r * r;
    double s = vm_sin_poly_d(r, r2), c = vm_cos_poly_d(r2);
    double v = (q & 1u) ? c : s;
    return (float)((q & 2u) ? -v : v);
}
VM_INLINE float vm_sin_wide(float x) { return vm_sincos_wide(x, 0); }
VM_INLINE float vm_cos_wide(float x) { return vm_sincos_wide(x, 1); }

/* ---- GELU ------------------------------------------------------------------------------
 * x Phi(x), Phi the normal CDF; with z = |x| / sqrt 2:
 *   z < 0.5:  Phi = (1 +- erf z) / 2, erf's Taylor series to z^13 (below 1e-9)
 *   z >= 0.5: Phi = 1 - erfc(z) / 2 for x > 0 and erfc(z) / 2 for x < 0, with
 *             erfc z = exp(-z^2) t S(t), t = 1 / (1 + z / 2), S a degree-9
 *             polynomial fitted to erfc(z) exp(z^2) / t on z in [0.5, 10.5]
 *             (least squares on Chebyshev nodes reweighted towards minimax,
 *             relative error 3e-9); beyond 10.5, exp(-z^2) makes the result
 *             0 or x whatever S does.
 * The left tail is erfc itself, not 1 + erf(z) cancelling, so gelu keeps its
 * relative accuracy where it is tiny (x = -10: 7.6e-23). -z^2 = -x^2 / 2 is
 * exact in float64 and goes to exp as two float32 parts. */
VM_INLINE float vm_gelu(float x) {
    float z = fabsf(x) * 0.70710678118654752440f;
    float z2 = z * z;
    float e = 1.0f / 9360.0f; /* erf(z) / (z 2 / sqrt(pi)) */
    e = VM_FMA(e, z2, -1.0f / 1320.0f);
    e = VM_FMA(e, z2, 1.0f / 216.0f);
    e = VM_FMA(e, z2, -1.0f / 42.0f);
    e = VM_FMA(e, z2, 1.0f / 10.0f);
    e = VM_FMA(e, z2, -1.0f / 3.0f);
    e = VM_FMA(e, z2, 1.0f);
    float half_erf = (0.56418958354775628695f * z) * e;
    float small = x * (x >= 0.0f ? 0.5f + half_erf : 0.5f - half_erf);

#ifdef __FMA__
    /* -x^2 / 2 as hi + lo exactly: the product's rounding error from an FMA,
     * both halved exactly (x^2 >= 1/2 wherever the result is used) */
    float sq = x * x;
    float hi = -0.5f * sq, lo = -0.5f * fmaf(x, x, -sq);
#else
    double h = -0.5 * (double)x * (double)x;
    float hi = (float)h, lo = (float)(h - (double)hi);
#endif
    float t = 1.0f / (1.0f + 0.5f * z);
    float sp = -0.0319926118f;
    sp = VM_FMA(sp, t, 0.0741026024f);
    sp = VM_FMA(sp, t, 0.0490151608f);
    sp = VM_FMA(sp, t, -0.256582401f);
    sp = VM_FMA(sp, t, 0.141728171f);
    sp = VM_FMA(sp, t, 0.0231444587f);
    sp = VM_FMA(sp, t, 0.191711547f);
    sp = VM_FMA(sp, t, 0.244457408f);
    sp = VM_FMA(sp, t, 0.28229879f);
    sp = VM_FMA(sp, t, 0.28208732f);
    float c64 = vm_exp_ftz(hi, lo, 64) * (t * sp); /* erfc(z) 2^64 */
    float pos = x * (1.0f - 0.5f * (c64 * 0x1p-64f));
    float neg = (x * 0.5f * c64) * 0x1p-64f;
    float large = x >= 0.0f ? pos : neg;
    return z < 0.5f ? small : large; /* NaN: large is NaN */
}

/* x (1 + tanh u) / 2 = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3):
 * no cancellation of 1 + tanh(u) where u < 0. 2u is formed in float64 and
 * goes to exp as two float32 parts, since a rounded -2|u| of 80 would cost
 * the result 80 times its relative error. */
VM_INLINE float vm_gelu_tanh(float x) {
    double xd = x;
    double u2 = 2.0 * 0.79788456080286535588 * xd * (1.0 + 0.044715 * xd * xd);
    double a = -fabs(u2);
    float hi = (float)a, lo = (float)(a - (double)hi);
    float e64 = vm_exp_ftz(hi, lo, 64); /* e^-|2u| 2^64 */
    float s = 1.0f / (1.0f + e64 * 0x1p-64f);
    return u2 >= 0.0 ? x * s : (x * e64 * s) * 0x1p-64f; /* NaN: the right side is NaN */
}


/* ---- log1p, expm1, log2, log10, exp2 ------------------------------------------------------
 * log1p(x) = log(u) + (x - (u - 1)) / u with u = 1 + x rounded: the quotient puts back what
 * the rounding of u lost (exact for tiny x, where u = 1). expm1: x = n ln 2 + r as in exp,
 * expm1(r) by its Taylor polynomial to r^8 (|r| <= ln 2 / 2: the rest below 2^-31 of r),
 * then 2^n (expm1(r) + 1) - 1 = 2^n expm1(r) + (2^n - 1), exact for n = 0, so tiny x keeps
 * its digits (up to n = 24; exp beyond). log2 and log10 take vm_log's exponent and mantissa apart, so that log2 of a
 * power of two is exact. exp2: n = round(x), r = x - n exact, 2^r = exp(r ln 2). */
/* log(u) + c for u positive, normal and finite (anything else gives garbage): vm_log
 * without its subnormal scaling and its specials, for the functions that know their
 * argument and put their own specials back with a select or two at the end. The
 * exponent and mantissa split is integer arithmetic only: offsetting u's bits by
 * 1 - sqrt(1/2) moves the mantissas from sqrt(1/2) up into the next binade, so that m
 * lands in [sqrt(1/2), sqrt(2)) without a compare; the same f, e and polynomial as
 * vm_log, so the same results. c goes in before the last rounding (log1p's correction). */
VM_INLINE float vm_log_pos(float u, float c) {
    uint32_t ix = vm_bits(u) + (0x3f800000u - 0x3f3504f3u);
    float e = (float)((int32_t)(ix >> 23) - 127);
    float f = vm_from_bits((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f; /* exact */
    float z = f * f;
    float y = vm_log_poly(f);
    y = VM_FMA(e, -2.12194440e-4f, y + c);
    y = VM_FMA(z, -0.5f, y);
    return VM_FMA(e, 0.693359375f, f + y);
}
/* log1p(w) for w > -1 finite, as vm_log_pos(u) with u = 1 + w rounded (at least 2^-24:
 * normal) and the quotient that puts back what that rounding lost */
VM_INLINE float vm_log1p_core(float w) {
    float u = 1.0f + w;
    return vm_log_pos(u, (w - (u - 1.0f)) / u);
}
/* The result has x's sign (which keeps -0); +inf, -1, below -1 and NaN by one select. */
VM_INLINE float vm_log1p(float x) {
    float r = copysignf(vm_log1p_core(x), x);
    float special = x == INFINITY ? x : (x == -1.0f ? -INFINITY : NAN);
    return (x > -1.0f && x < INFINITY) ? r : special;
}

VM_INLINE float vm_expm1(float x) {
    float xc = x < -30.0f ? -30.0f : (x > 89.0f ? 89.0f : x);
    VM_EXP_REDUCE(xc, t, n, r);
    float p = 1.0f / 40320.0f;
    p = VM_FMA(p, r, 1.0f / 5040.0f);
    p = VM_FMA(p, r, 1.0f / 720.0f);
    p = VM_FMA(p, r, 1.0f / 120.0f);
    p = VM_FMA(p, r, 1.0f / 24.0f);
    p = VM_FMA(p, r, 1.0f / 6.0f);
    p = VM_FMA(p, r, 0.5f);
    float em = VM_FMA(p * r, r, r); /* expm1(r) */
    int32_t ni = (int32_t)(vm_bits(t) - 0x4B400000u);
    float s = vm_from_bits((uint32_t)(ni + 127) << 23); /* 2^n, n in [-44, 128] */
    float small = VM_FMA(s, em, s - 1.0f);
    /* past n = 24 the - 1 is below the rounding: exp, 2^n in two factors (2^128 would
     * overflow where (em + 1) 2^128 does not) */
    int32_t n1 = ni >> 1;
    float s1 = vm_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = vm_from_bits((uint32_t)(ni - n1 + 127) << 23);
    float big = ((em + 1.0f) * s1) * s2 - 1.0f;
    float res = ni > 24 ? big : (x < -30.0f ? -1.0f : small);
    return x == 0.0f ? x : res; /* keeps -0; NaN stays NaN through small */
}

/* log(x) = e ln 2 + log(m) as vm_log splits it: *e the exponent, the result log(m) - f's
 * part in *f (log(m) = f + result), or the specials' value in *special (0 where x is a
 * positive finite number). */
VM_INLINE float vm_log_split(float x, float *e, float *f) {
    int sub = x < FLT_MIN;
    float xs = sub ? x * 8388608.0f : x;
    uint32_t u = vm_bits(xs);
    int32_t ex = (int32_t)((u >> 23) & 0xffu) - 126 - (sub ? 23 : 0);
    float m = vm_from_bits((u & 0x007fffffu) | 0x3f000000u);
    int lo = m < 0.707106781186547524f;
    float ff = lo ? m + m - 1.0f : m - 1.0f;
    *e = (float)(lo ? ex - 1 : ex);
    float z = ff * ff;
    float y = vm_log_poly(ff);
    *f = ff;
    return VM_FMA(z, -0.5f, y);
}
/* The value of log_b at the specials: +inf, 0 (-inf), negative or NaN (NaN); r elsewhere. */
VM_INLINE float vm_log_specials(float x, float r) {
    r = x == INFINITY ? x : r;
    r = x == 0.0f ? -INFINITY : r;
    return x >= 0.0f ? r : NAN;
}
VM_INLINE float vm_log2(float x) {
    float e, f;
    float y = vm_log_split(x, &e, &f);
    const float l2e = 1.44269504088896341f;
    return vm_log_specials(x, e + VM_FMA(f, l2e, y * l2e));
}
VM_INLINE float vm_log10(float x) {
    float e, f;
    float y = vm_log_split(x, &e, &f);
    const float l10e = 0.434294481903251828f;
    /* log10(2) = 0.30102999566: a float hi part (12 bits, so e * hi is exact) and the rest */
    float r = VM_FMA(e, 0.301025390625f, VM_FMA(f, l10e, VM_FMA(e, 4.6050389811952e-06f, y * l10e)));
    return vm_log_specials(x, r);
}

VM_INLINE float vm_exp2(float x) {
    float xc = x < -151.0f ? -151.0f : (x > 129.0f ? 129.0f : x);
    float t = xc + 12582912.0f;
    float n = t - 12582912.0f;
    float r = xc - n; /* exact, |r| <= 1/2 */
    float p = vm_exp_poly(r * 0.693147180559945309f);
    int32_t ni = (int32_t)(vm_bits(t) - 0x4B400000u);
    int32_t n1 = ni >> 1;
    float s1 = vm_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = vm_from_bits((uint32_t)(ni - n1 + 127) << 23);
    return p * s1 * s2; /* NaN stays NaN through p */
}

/* ---- sinh, cosh, asinh, acosh, atanh --------------------------------------------------------
 * With h = exp(|x|) / 2 (vm_exp's reduction, the halving put into the power of two, so h is
 * finite up to |x| = 89.4 where exp itself overflows): cosh = h + 1/(4h), sinh = h - 1/(4h)
 * above |x| = 1/2 and its odd Taylor series to x^11 below (the subtraction would cancel
 * there; the next term is below 2^-34 of the result). The inverses go through log1p:
 * asinh(a) = log1p(a + a^2 / (1 + sqrt(1 + a^2))), acosh(x) = log1p(t + sqrt(2t + t^2))
 * with t = x - 1 (exact), atanh(a) = log1p(2a / (1 - a)) / 2; past 2^12, asinh and acosh
 * are log(2a). */
VM_INLINE float vm_exp_half(float x) { /* exp(x) / 2 for x <= 89.5, 0 below -104 */
    float xc = x < -104.0f ? -104.0f : (x > 90.0f ? 90.0f : x);
    VM_EXP_REDUCE(xc, t, n, r);
    float p = vm_exp_poly(r);
    int32_t ni = (int32_t)(vm_bits(t) - 0x4B400000u) - 1;
    int32_t n1 = ni >> 1;
    float s1 = vm_from_bits((uint32_t)(n1 + 127) << 23);
    float s2 = vm_from_bits((uint32_t)(ni - n1 + 127) << 23);
    return p * s1 * s2; /* NaN stays NaN through p */
}
VM_INLINE float vm_sinh(float x) {
    float a = fabsf(x);
    float h = vm_exp_half(a);
    float big = h - 0.25f / h;
    float z = a * a;
    float p = 1.0f / 39916800.0f;
    p = VM_FMA(p, z, 1.0f / 362880.0f);
    p = VM_FMA(p, z, 1.0f / 5040.0f);
    p = VM_FMA(p, z, 1.0f / 120.0f);
    p = VM_FMA(p, z, 1.0f / 6.0f);
    float small = VM_FMA(p * z, a, a);
    float r = a < 0.5f ? small : big;
    return copysignf(r, x); /* NaN: big is NaN */
}
VM_INLINE float vm_cosh(float x) {
    float h = vm_exp_half(fabsf(x));
    return h + 0.25f / h;
}
/* One log for both ranges: log1p's argument below 2^12, log(a) + ln 2 above, selected
 * before the log; inf and NaN (a itself) by a select at the end. */
VM_INLINE float vm_asinh(float x) {
    float a = fabsf(x);
    int big = a > 4096.0f;
    float ac = big ? 4096.0f : a;
    float a2 = ac * ac;
    float w = ac + a2 / (1.0f + sqrtf(1.0f + a2));
    float u = 1.0f + w;
    float c = (w - (u - 1.0f)) / u;
    float r = vm_log_pos(big ? a : u, big ? 0.693147180559945309f : c);
    r = a < INFINITY ? r : a;
    return copysignf(r, x);
}
VM_INLINE float vm_acosh(float x) { /* as asinh: one log, the specials at the end */
    int big = x > 4096.0f;
    float t = (big ? 4096.0f : x) - 1.0f;
    float w = t + sqrtf(VM_FMA(t, t, t + t));
    float u = 1.0f + w;
    float c = (w - (u - 1.0f)) / u;
    float r = vm_log_pos(big ? x : u, big ? 0.693147180559945309f : c);
    r = x < INFINITY ? r : x;
    return x >= 1.0f ? r : NAN; /* also for NaN */
}
VM_INLINE float vm_atanh(float x) {
    float a = fabsf(x);
    float r = 0.5f * vm_log1p_core((a + a) / (1.0f - a));
    r = a < 1.0f ? r : (a == 1.0f ? INFINITY : NAN); /* NaN too */
    return copysignf(r, x);
}

/* mish: x tanh(softplus(x)); below -20, where tanh(softplus(x)) is e^x to 2e-9, x e^x
 * with e^x lifted by 2^64 as silu does, so results past the float32 exp's flush (x < -87)
 * keep their digits. */
VM_INLINE float vm_mish(float x) {
    /* tanh(log(1 + u)) = n / (n + 2) with u = e^x, n = u (u + 2): one exp, one division;
     * 1 to float32 precision past x = 9 */
    float xc = x > 20.0f ? 20.0f : x;
    float u64 = vm_exp_ftz(xc, 0.0f, 64); /* e^x 2^64 */
    float tail = (x * u64) * 0x1p-64f;
    float u = u64 * 0x1p-64f;
    float n = u * (u + 2.0f);
    float mid = x * (n / (n + 2.0f));
    return x < -20.0f ? tail : (x > 20.0f ? x : mid); /* NaN: mid is NaN */
}

/* ---- atan, atan2, asin, acos ---------------------------------------------------------------
 * Cephes' atanf: |x| reduced to [0, tan(pi/8)] by atan(a) = pi/4 + atan((a - 1) / (a + 1))
 * (a > tan(pi/8)) or pi/2 + atan(-1 / a) (a > tan(3pi/8)), one division either way, then
 * its odd polynomial. atan2 takes atan of min / max of |x|, |y| in [0, 1] and puts the
 * quadrant back (pi/2 - r, pi - r, the sign of y). asinf: an odd polynomial below 1/2,
 * asin(a) = pi/2 - 2 asin(sqrt((1 - a) / 2)) above; acos from the same two pieces. */
VM_INLINE float vm_atan_pos(float a) {
    int big = a > 2.414213562373095f, mid = a > 0.4142135623730950f;
    float num = big ? -1.0f : (mid ? a - 1.0f : a);
    float den = big ? a : (mid ? a + 1.0f : 1.0f);
    /* pi/2 and pi/4 as float plus the rest they round away */
    float y0 = big ? 1.57079632679489662f : (mid ? 0.785398163397448310f : 0.0f);
    float y0lo = big ? -4.371139000186241e-08f : (mid ? -2.1855695000931204e-08f : 0.0f);
    float xr = num / den;
    float z = xr * xr;
    float p = 8.05374449538e-2f;
    p = VM_FMA(p, z, -1.38776856032E-1f);
    p = VM_FMA(p, z, 1.99777106478E-1f);
    p = VM_FMA(p, z, -3.33329491539E-1f);
    return y0 + (VM_FMA(p * z, xr, xr) + y0lo);
}
VM_INLINE float vm_atan(float x) { return copysignf(vm_atan_pos(fabsf(x)), x); }

VM_INLINE float vm_atan2(float y, float x) {
    float ax = fabsf(x), ay = fabsf(y);
    float mn = ax < ay ? ax : ay, mx = ax < ay ? ay : ax;
    int both_inf = ax == INFINITY && ay == INFINITY;
    float q = both_inf ? 1.0f : (mx == 0.0f ? 0.0f : mn / mx);
    float r = vm_atan_pos(q);
    r = ay > ax ? 1.57079632679489662f - r : r;
    r = (vm_bits(x) >> 31) ? 3.14159265358979324f - r : r;
    r = (x != x || y != y) ? x + y : r;
    return copysignf(r, y);
}

/* asin(p) polynomial on [0, 1/2]: xr + xr z P(z), z = xr^2 */
VM_INLINE float vm_asin_poly(float xr, float z) {
    float p = 4.2163199048E-2f;
    p = VM_FMA(p, z, 2.4181311049E-2f);
    p = VM_FMA(p, z, 4.5470025998E-2f);
    p = VM_FMA(p, z, 7.4953002686E-2f);
    p = VM_FMA(p, z, 1.6666752422E-1f);
    return VM_FMA(p * z, xr, xr);
}
VM_INLINE float vm_asin(float x) {
    float a = fabsf(x);
    int hi = a > 0.5f;
    float z = hi ? 0.5f * (1.0f - a) : a * a;
    float xr = hi ? sqrtf(z) : a; /* a > 1: NaN */
    float p = vm_asin_poly(xr, z);
    float r = hi ? 1.57079632679489662f - (p + p) : p;
    return copysignf(r, x);
}
VM_INLINE float vm_acos(float x) {
    float a = fabsf(x);
    int hi = a > 0.5f;
    float z = hi ? 0.5f * (1.0f - a) : x * x;
    float xr = hi ? sqrtf(z) : x;
    float p = vm_asin_poly(xr, z); /* asin(x) below 1/2, asin(sqrt(z)) above */
    float r = hi ? (x > 0.0f ? p + p : 3.14159265358979324f - (p + p)) : 1.57079632679489662f - p;
    return a <= 1.0f ? r : NAN; /* also for NaN */
}

/* ---- tan ---------------------------------------------------------------------------------
 * From the sin and cos reductions: sin(r) / cos(r) in even quadrants, -cos(r) / sin(r) in
 * odd ones, with x's sign; the _wide form in float64 for VM_TRIG_FAST_MAX < |x| <=
 * VM_TRIG_MAX, as sin and cos (callers take libm's float64 tan beyond). */
VM_INLINE float vm_tan(float x) {
    float a = fabsf(x), lo;
    uint32_t q;
    float hi = vm_trig_reduce(a, &lo, &q);
    float z = hi * hi;
    float s = vm_sin_kernel(hi, lo, z), c = vm_cos_kernel(hi, lo, z);
    float r = (q & 1u) ? -c / s : s / c;
    return vm_from_bits(vm_bits(r) ^ (vm_bits(x) & 0x80000000u));
}
VM_INLINE float vm_tan_wide(float xf) {
    double x = xf;
    double t = x * 0.6366197723675814 + 6755399441055744.0;
    double j = t - 6755399441055744.0;
    double r = x - j * 1.570796325802803;
    r = r - j * 9.920935774287987e-10;
    r = r - j * 2.2517417706346578e-18;
    r = r - j * 3.521559857935336e-27;
    unsigned q = (unsigned)vm_bits_d(t) & 3u;
    double r2 = r * r;
    double s = vm_sin_poly_d(r, r2), c = vm_cos_poly_d(r2);
    return (float)((q & 1u) ? -c / s : s / c);
}

/* ---- erf, erfc ------------------------------------------------------------------------------
 * vm_gelu's two pieces: erf's Taylor series below z = 1/2, erfc(z) = exp(-z^2) t S(t) above
 * (-z^2 as an exact pair into exp); erf = 1 - erfc above 1/2, erfc = 1 - erf below, and 2 -
 * erfc(|x|) for x <= -1/2. erfc flushes results below FLT_MIN (x > 9.2) to 0. */
VM_INLINE float vm_erf_small(float z) { /* erf(z), |z| < 1/2 */
    float z2 = z * z;
    float e = 1.0f / 9360.0f;
    e = VM_FMA(e, z2, -1.0f / 1320.0f);
    e = VM_FMA(e, z2, 1.0f / 216.0f);
    e = VM_FMA(e, z2, -1.0f / 42.0f);
    e = VM_FMA(e, z2, 1.0f / 10.0f);
    e = VM_FMA(e, z2, -1.0f / 3.0f);
    e = VM_FMA(e, z2, 1.0f);
    return (1.12837916709551257f * z) * e;
}
/* t S(t), t = 1 / (1 + z / 2): erfc(z) exp(z^2) for z >= 1/2 */
VM_INLINE float vm_erfc_ts(float z) {
    float t = 1.0f / (1.0f + 0.5f * z);
    float sp = -0.0319926118f;
    sp = VM_FMA(sp, t, 0.0741026024f);
    sp = VM_FMA(sp, t, 0.0490151608f);
    sp = VM_FMA(sp, t, -0.256582401f);
    sp = VM_FMA(sp, t, 0.141728171f);
    sp = VM_FMA(sp, t, 0.0231444587f);
    sp = VM_FMA(sp, t, 0.191711547f);
    sp = VM_FMA(sp, t, 0.244457408f);
    sp = VM_FMA(sp, t, 0.28229879f);
    sp = VM_FMA(sp, t, 0.28208732f);
    return t * sp;
}
/* erfc(z) for z >= 1/2: 0 past 9.2 (the flush of vm_exp_ftz, also for z = inf, where t
 * is 0), NaN for NaN */
VM_INLINE float vm_erfc_big(float z) {
#ifdef __FMA__
    float sq = z * z;
    float hi = -sq, lo = -fmaf(z, z, -sq);
#else
    double h = -(double)z * (double)z;
    float hi = (float)h, lo = (float)(h - (double)hi);
#endif
    return vm_exp_ftz(hi, lo, 0) * vm_erfc_ts(z);
}
/* erf = 1 - erfc for z >= 1/2 needs erfc only to an absolute 2^-26 or so: -z^2 rounded
 * (relative error z^2 2^-24 in exp, under 2^-26 absolute for z <= 4 since erfc(z) z^2
 * is below 0.17 there), z clamped to 4 (erf is 1 in float32 past 3.92), so exp needs no
 * flush: its argument stays above -16. NaN stays NaN (the clamp keeps it). */
VM_INLINE float vm_erf(float x) {
    float z = fabsf(x);
    float zc = z > 4.0f ? 4.0f : z;
    VM_EXP_REDUCE(-zc * zc, t, n, r);
    float e = vm_exp_poly(r) * vm_from_bits((vm_bits(t) - (0x4B400000u - 127u)) << 23);
    float big = 1.0f - e * vm_erfc_ts(zc);
    float res = z < 0.5f ? vm_erf_small(z) : big;
    return copysignf(res, x);
}
/* 1 - erf below 1/2, erfc(|x|) above (2 - that for x < 0); NaN through the right side */
VM_INLINE float vm_erfc(float x) {
    float z = fabsf(x);
    float c = vm_erfc_big(z);
    return z < 0.5f ? 1.0f - vm_erf_small(x) : (x > 0.0f ? c : 2.0f - c);
}


/* ---- erfinv -----------------------------------------------------------------------------------
 * Giles' single-precision approximation (Approximating the erfinv function, GPU Computing
 * Gems, 2010): with w = -log((1 - y)(1 + y)), a polynomial in w - 2.5 below w = 5 and one
 * in sqrt(w) - 3 above, times y. vm_erfinv computes both and selects one; +-1 give +-inf,
 * |y| > 1 NaN. vm_erfinv_central is the first alone, for the loops that take it on
 * whole vectors and vm_erfinv only where a vector has an element it flags (w >= 5 is
 * |y| > 0.9966, rare in most data; elementwise.c's SPLIT_LOOP). */
/* w = -log((1 - y)(1 + y)); (1 - y)(1 + y) = 2^e m is at least 2^-23 for |y| < 1 (positive
 * normal), m in [sqrt(1/2), sqrt(2)) as vm_log_pos splits it. The polynomials need w only
 * to an absolute 1e-8 or so (erfinv's relative change is at most w's change / 4 where
 * w > 2^-4; below, w ~ y^2 keeps its relative precision), so log(m) = 2 atanh(s), s =
 * (m - 1) / (m + 1) in [-0.172, 0.172], by its series to s^9 (the rest below 1e-9):
 * fewer operations than vm_log's polynomial. */
VM_INLINE float vm_erfinv_w(float y) {
    float v = (1.0f - y) * (1.0f + y);
    uint32_t ix = vm_bits(v) + (0x3f800000u - 0x3f3504f3u);
    float e = (float)((int32_t)(ix >> 23) - 127);
    float f = vm_from_bits((ix & 0x007fffffu) + 0x3f3504f3u) - 1.0f; /* exact */
    float s = f / (2.0f + f);
    float z = s * s;
    float p = 2.0f / 9.0f;
    p = VM_FMA(p, z, 2.0f / 7.0f);
    p = VM_FMA(p, z, 2.0f / 5.0f);
    p = VM_FMA(p, z, 2.0f / 3.0f);
    float lm = VM_FMA(s * z, p, s + s);
    return -VM_FMA(e, 0.693359375f, VM_FMA(e, -2.12194440e-4f, lm));
}
VM_INLINE float vm_erfinv_p(float w) {
    float a = w - 2.5f;
    float p = 2.81022636e-08f;
    p = VM_FMA(p, a, 3.43273939e-07f);
    p = VM_FMA(p, a, -3.5233877e-06f);
    p = VM_FMA(p, a, -4.39150654e-06f);
    p = VM_FMA(p, a, 0.00021858087f);
    p = VM_FMA(p, a, -0.00125372503f);
    p = VM_FMA(p, a, -0.00417768164f);
    p = VM_FMA(p, a, 0.246640727f);
    return VM_FMA(p, a, 1.50140941f);
}
/* erfinv(y) where *tail comes back 0; *tail is 1 for |y| >= 1, NaN and w >= 5 */
VM_INLINE float vm_erfinv_central(float y, int *tail) {
    float w = vm_erfinv_w(y);
    *tail = ((w < 5.0f) & (fabsf(y) < 1.0f)) ? 0 : 1;
    return vm_erfinv_p(w) * y;
}
VM_INLINE float vm_erfinv(float y) {
    float w = vm_erfinv_w(y);
    float b = sqrtf(w) - 3.0f;
    float q = -0.000200214257f;
    q = VM_FMA(q, b, 0.000100950558f);
    q = VM_FMA(q, b, 0.00134934322f);
    q = VM_FMA(q, b, -0.00367342844f);
    q = VM_FMA(q, b, 0.00573950773f);
    q = VM_FMA(q, b, -0.0076224613f);
    q = VM_FMA(q, b, 0.00943887047f);
    q = VM_FMA(q, b, 1.00167406f);
    q = VM_FMA(q, b, 2.83297682f);
    float r = (w < 5.0f ? vm_erfinv_p(w) : q) * y;
    r = fabsf(y) == 1.0f ? y * INFINITY : r;
    return fabsf(y) <= 1.0f ? r : NAN; /* also for NaN */
}


/* ---- fmod -----------------------------------------------------------------------------------
 * fmod(a, b) exactly for |a / b| < 2^28, in float64: t = trunc(a / b) has at most 28 bits
 * and b 24, so t b and a - t b are exact; where the division rounded up to the next
 * integer, a - t b has the wrong sign and b goes back in. A zero keeps a's sign. The caller
 * takes libm's fmodf elsewhere (larger quotients, b = 0, infinities, NaN). */
VM_INLINE float vm_fmod(float a, float b) {
    double ad = a, bd = b;
    double t = trunc(ad / bd);
    double r = t == 0.0 ? ad : ad - t * bd; /* |a| < |b|: a, also for b infinite */
    r = (r != 0.0 && (r < 0.0) != (ad < 0.0)) ? r + copysign(fabs(bd), ad) : r;
    float rf = (float)r;
    return rf == 0.0f ? copysignf(0.0f, a) : rf;
}

#endif
