/* bench_vmath_ulp_<level>: the accuracy of the vectorized float32 functions
 * of the CPU kernels (src/backends/cpu/vmath.h), compiled with the flags of
 * one kernel level, over every float32 input of each function's range (or
 * every stride-th one), against libm in float64. Prints, per function, the
 * largest error in ulps of the exact value (a correctly rounded result is
 * within 0.5) for results of at least FLT_MIN, and the largest error of
 * smaller results in units of FLT_MIN.
 *
 * usage: bench_vmath_ulp_avx512 [stride [function]]   (stride 1: exhaustive) */
#include <float.h>
#include <stdbool.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cpu/vmath.h"

static double r_exp(double x) { return exp(x); }
static double r_log(double x) { return log(x); }
static double r_tanh(double x) { return tanh(x); }
static double r_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double r_silu(double x) { return x / (1 + exp(-x)); }
static double r_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double r_sin(double x) { return sin(x); }
static double r_cos(double x) { return cos(x); }
static double r_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static double r_gelu_tanh(double x) { /* x sigmoid(2u): no cancellation here either */
    return x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

/* A block through the function, as the kernels' loops call it (vectorized). */
#define BLOCK 4096
#define LOOP(f)                                                                   \
    static void v_##f(const float *restrict x, float *restrict y, int n) {        \
        for (int i = 0; i < n; i++) y[i] = vm_##f(x[i]);                          \
    }
LOOP(exp)
LOOP(log)
LOOP(tanh)
LOOP(sigmoid)
LOOP(silu)
LOOP(softplus)
LOOP(sin)
LOOP(cos)
LOOP(sin_wide)
LOOP(cos_wide)
LOOP(gelu)
LOOP(gelu_tanh)

static const struct {
    const char *name;
    void (*v)(const float *restrict, float *restrict, int);
    double (*ref)(double);
    float lo, hi; /* beyond: constant, overflowing or (sin, cos) libm's */
} fns[] = {
    {"exp", v_exp, r_exp, -110, 90},
    {"log", v_log, r_log, 0, INFINITY},
    {"sin", v_sin, r_sin, -VM_TRIG_FAST_MAX, VM_TRIG_FAST_MAX},
    {"cos", v_cos, r_cos, -VM_TRIG_FAST_MAX, VM_TRIG_FAST_MAX},
    {"sin_wide", v_sin_wide, r_sin, -VM_TRIG_MAX, VM_TRIG_MAX},
    {"cos_wide", v_cos_wide, r_cos, -VM_TRIG_MAX, VM_TRIG_MAX},
    {"tanh", v_tanh, r_tanh, -20, 20},
    {"sigmoid", v_sigmoid, r_sigmoid, -110, 110},
    {"silu", v_silu, r_silu, -110, 110},
    {"softplus", v_softplus, r_softplus, -110, 110},
    {"gelu", v_gelu, r_gelu, -20, 20},
    {"gelu_tanh", v_gelu_tanh, r_gelu_tanh, -20, 20},
};

/* float32 in order of value <-> unsigned keys */
static uint32_t key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static float unkey(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int main(int argc, char **argv) {
    uint64_t stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 1;
    const char *only = argc > 2 ? argv[2] : NULL;
    if (stride < 1) stride = 1;
    for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
        if (only && strcmp(only, fns[f].name) != 0) continue;
        static float xs[BLOCK], ys[BLOCK];
        double worst = 0, worst_tiny = 0;
        float wx = 0;
        long long count = 0, special = 0;
        uint64_t k1 = key(fns[f].hi);
        for (uint64_t k = key(fns[f].lo); k <= k1;) {
            int n = 0;
            for (; n < BLOCK && k <= k1; n++, k += stride) xs[n] = unkey((uint32_t)k);
            fns[f].v(xs, ys, n);
            for (int i = 0; i < n; i++, count++) {
                double ref = fns[f].ref(xs[i]), y = ys[i];
                if (isnan(ref) || isnan(y) || isinf(ref) || isinf(y) || fabs(ref) > FLT_MAX) {
                    bool same = (isnan(ref) && isnan(y)) || ref == y ||
                                (fabs(ref) > FLT_MAX && isinf(y) && (ref > 0) == (y > 0));
                    if (!same && special++ < 5)
                        printf("  %s(%a) = %a, float64 %a\n", fns[f].name, xs[i], y, ref);
                    continue;
                }
                if (fabs(ref) < FLT_MIN) {
                    worst_tiny = fmax(worst_tiny, fabs(y - ref) / FLT_MIN);
                    continue;
                }
                int e;
                frexp(ref, &e);
                double err = fabs(y - ref) / ldexp(1.0, e - 24);
                if (err > worst) worst = err, wx = xs[i];
            }
        }
        printf("%-10s max %.3f ulp at %a (%g); results below FLT_MIN within %.2g FLT_MIN; "
               "%lld inputs, %lld special mismatches\n",
               fns[f].name, worst, wx, wx, worst_tiny, count, special);
        fflush(stdout);
    }
    return 0;
}
