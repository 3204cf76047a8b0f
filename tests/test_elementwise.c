#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <stdatomic.h>

#include "test_util.h"
#include "test_fixture.h"

#include "backends/cpu/cpu_impl.h"
#include "unary_ops.inc"

#define N_FLOAT 4
#define N_ALL 7

/* ---- helpers ------------------------------------------------------------------------- */

static double tol_of(ct_dtype dt) { return tu_rtol(dt); }

/* Asserts dtype, shape and values of got against ref (already rounded to the
 * output dtype where the caller wants it). */
static void check_tensor(ct_tensor *got, ct_dtype dt, int nd, const int64_t *shape,
                         const double *ref, double rtol, double atol) {
    assert_non_null(got);
    assert_int_equal(ct_tensor_dtype(got), dt);
    assert_int_equal(ct_tensor_ndim(got), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(got)[d], shape[d]);
    int64_t n = tu_numel(nd, shape);
    double *v = tu_values(got);
    tu_assert_close(v, ref, n, rtol, atol);
    free(v);
}

/* Row-major index of the element of an operand of shape (nd_in, sh_in) that
 * output element `lin` of shape (nd, sh) reads under broadcasting. */
static int64_t bcast_index(int64_t lin, int nd, const int64_t *sh, int nd_in,
                           const int64_t *sh_in) {
    int64_t idx = 0, mul = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t i = lin % sh[d];
        lin /= sh[d];
        int di = d - (nd - nd_in);
        if (di >= 0) {
            if (sh_in[di] != 1) idx += i * mul;
            mul *= sh_in[di];
        }
    }
    return idx;
}

static int bcast(int na, const int64_t *sa, int nb, const int64_t *sb, int64_t *out) {
    int nd = na > nb ? na : nb;
    for (int d = 0; d < nd; d++) {
        int da = d - (nd - na), db = d - (nd - nb);
        int64_t x = da >= 0 ? sa[da] : 1, y = db >= 0 ? sb[db] : 1;
        out[d] = x == 1 ? y : x;
    }
    return nd;
}

static ct_tensor *maybe_noncontig(ct_tensor *t, bool nc) {
    if (!nc) return t;
    ct_tensor *v = tu_noncontig(t);
    ct_tensor_release(t);
    return v;
}

/* ---- unary ------------------------------------------------------------------------------- */
typedef ct_tensor *(*un_fn)(ct_tensor *);
typedef double (*un_ref)(double);
typedef struct un_case {
    const char *name;
    un_fn fn;
    un_ref ref;
    int ints; /* UT_KEEP, UT_FLOAT or UT_REFUSE (unary_ops.inc) */
    double lo, hi;
    const char *call; /* the call's text, which starts with the function's name */
} un_case;

#define UN_FNS_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi)                          \
    static ct_tensor *f_##nm(ct_tensor *x) { return call; }                                 \
    static double r_##nm(double x) { return (ref); }
CT_UNARY_OPS(UN_FNS_)
CT_UNARY_VARIANTS(UN_FNS_)
#undef UN_FNS_

static const un_case float_unary[] = {
#define UN_ROW_(ID, nm, call, ref, dref, ints, vlo, vhi, glo, ghi)                          \
    {#nm, f_##nm, r_##nm, ints, vlo, vhi, #call},
    CT_UNARY_OPS(UN_ROW_)
    CT_UNARY_VARIANTS(UN_ROW_)
#undef UN_ROW_
};
#define N_FLOAT_UNARY (sizeof float_unary / sizeof float_unary[0])

static const un_case *unary_case(const char *name) {
    for (size_t k = 0; k < N_FLOAT_UNARY; k++)
        if (strcmp(float_unary[k].name, name) == 0) return &float_unary[k];
    fail_msg("no unary row %s", name);
    return NULL;
}

/* Fills a freed block of the size of a result with NaN first, so that an
 * output the allocator hands back from it and the kernel leaves unwritten
 * fails the comparison. */
static void poison_output(int nd, const int64_t *shape, ct_dtype dt) {
    if (!ct_dtype_is_floating(dt)) return;
    ct_tensor *t = ct_tensor_full(nd, shape, NAN, dt, CT_CPU);
    assert_non_null(t);
    ct_tensor_release(t);
}

static void run_unary_case(const un_case *c, ct_dtype dt, ct_dtype out_dt, int nd,
                           const int64_t *shape, bool nc) {
    double *v;
    ct_tensor *x = maybe_noncontig(tu_rand(nd, shape, dt, c->lo, c->hi, &v), nc);
    int64_t n = tu_numel(nd, shape);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) ref[i] = tu_round(c->ref(v[i]), out_dt);
    poison_output(nd, shape, out_dt);
    ct_tensor *y = c->fn(x);
    if (!y) fprintf(stderr, "%s %s: %s\n", c->name, ct_dtype_name(dt), ct_last_error());
    double tol = ct_dtype_is_floating(out_dt) ? tol_of(out_dt) : 0;
    check_tensor(y, out_dt, nd, shape, ref, tol, tol);
    ct_tensor_release(y);
    ct_tensor_release(x);
    free(ref);
    free(v);
}

static void test_unary_float(void **state) {
    (void)state;
    static const int64_t s3[] = {3, 5, 7}, s1[] = {37}, s0[] = {4, 0};
    for (size_t k = 0; k < N_FLOAT_UNARY; k++) {
        for (int d = 0; d < N_FLOAT; d++) {
            ct_dtype dt = tu_float_dtypes[d];
            run_unary_case(&float_unary[k], dt, dt, 3, s3, false);
            run_unary_case(&float_unary[k], dt, dt, 3, s3, true);
            run_unary_case(&float_unary[k], dt, dt, 1, s1, false);
            run_unary_case(&float_unary[k], dt, dt, 0, NULL, false);
            run_unary_case(&float_unary[k], dt, dt, 2, s0, false);
        }
    }
}

/* The function's name: the call's text up to its parenthesis. */
static const char *fn_name(const un_case *c, char *buf, size_t size) {
    size_t k = strcspn(c->call, "(");
    snprintf(buf, size, "%.*s", (int)k, c->call);
    return buf;
}

/* An op refusing integer and bool inputs (as PyTorch) names itself and the dtype. */
static void check_refuses_ints(const un_case *c) {
    static const int64_t s2[] = {6, 9};
    static const ct_dtype dts[] = {CT_I32, CT_I64, CT_BOOL};
    char fn[64];
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        ct_tensor *x = tu_rand(2, s2, dts[d], -3, 4, NULL);
        ct_clear_error();
        tu_assert_null_error(c->fn(x), CT_ERR_DTYPE, fn_name(c, fn, sizeof fn), "floating",
                             ct_dtype_name(dts[d]));
        ct_tensor_release(x);
    }
}

/* Integer and bool inputs: float math gives float32, the rest keep the dtype. */
/* ---- float32 accuracy of the vectorized unary ops ------------------------------------------
 * Every float32 input of the op's range, walked in order of value with a
 * stride (about 2^19 points, all binades), plus the specials, against the
 * float64 reference; the error in ulps of the exact value (a correctly
 * rounded result is within 0.5), for results of at least FLT_MIN (smaller
 * ones within FLT_MIN). The bounds are what vmath.h states, from exhaustive
 * sweeps; meson runs this at every ISA level. Contiguous and strided. */
static double u_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double u_silu(double x) { return x / (1 + exp(-x)); }
static double u_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }
static double u_gelu(double x) { return 0.5 * x * erfc(-x * M_SQRT1_2); }
static double u_gelu_tanh(double x) { /* x sigmoid(2u): no cancellation in the reference either */
    return x / (1 + exp(-2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
static double u_mish(double x) { return x * tanh(ut_softplus1(x)); }
static double u_logsigmoid(double x) { return ut_logsigmoid(x); }
static double u_erfinv(double x) { return ut_erfinv(x); }
static double u_elu(double x) { return x > 0 ? x : expm1(x); }
static ct_tensor *c_elu(ct_tensor *x) { return ct_elu(x, 1); }
static ct_tensor *c_softplus(ct_tensor *x) { return ct_softplus(x, 1, 1e30); }
static ct_tensor *c_gelu(ct_tensor *x) { return ct_gelu(x, CT_GELU_NONE); }
static ct_tensor *c_gelu_tanh(ct_tensor *x) { return ct_gelu(x, CT_GELU_TANH); }

static const struct {
    const char *name;
    ct_tensor *(*fn)(ct_tensor *);
    double (*ref)(double);
    float lo, hi;
    double max_ulp;
} ulp_cases[] = {
    {"exp", ct_exp, exp, -110, 90, 1.5},
    {"log", ct_log, log, 0, INFINITY, 1},
    {"sin", ct_sin, sin, -3e7f, 3e7f, 0.8}, /* past VM_TRIG_MAX: the libm fallback */
    {"cos", ct_cos, cos, -3e7f, 3e7f, 0.8},
    {"tanh", ct_tanh, tanh, -20, 20, 1.5},
    {"sigmoid", ct_sigmoid, u_sigmoid, -110, 110, 3},
    {"silu", ct_silu, u_silu, -110, 110, 4},
    {"softplus", c_softplus, u_softplus, -110, 110, 3},
    {"gelu", c_gelu, u_gelu, -20, 20, 7},
    {"gelu_tanh", c_gelu_tanh, u_gelu_tanh, -20, 20, 4},
    {"log1p", ct_log1p, log1p, -1, INFINITY, 2},
    {"expm1", ct_expm1, expm1, -110, 90, 2},
    {"log2", ct_log2, log2, 0, INFINITY, 2},
    {"log10", ct_log10, log10, 0, INFINITY, 2},
    {"exp2", ct_exp2, exp2, -160, 130, 1.5},
    {"erf", ct_erf, erf, -10, 10, 3.5},
    {"erfc", ct_erfc, erfc, -10, 12, 6},
    {"tan", ct_tan, tan, -3e7f, 3e7f, 2.5},
    {"asin", ct_asin, asin, -1.5f, 1.5f, 2.5},
    {"acos", ct_acos, acos, -1.5f, 1.5f, 2},
    {"atan", ct_atan, atan, -INFINITY, INFINITY, 2.5},
    {"sinh", ct_sinh, sinh, -95, 95, 2.5},
    {"cosh", ct_cosh, cosh, -95, 95, 2.5},
    {"asinh", ct_asinh, asinh, -INFINITY, INFINITY, 2.5},
    {"acosh", ct_acosh, acosh, 0, INFINITY, 2},
    {"atanh", ct_atanh, atanh, -1.5f, 1.5f, 2.5},
    {"mish", ct_mish, u_mish, -110, 110, 4},
    {"logsigmoid", ct_logsigmoid, u_logsigmoid, -110, 110, 3},
    {"elu", c_elu, u_elu, -110, 110, 2},
    {"erfinv", ct_erfinv, u_erfinv, -1, 1, 4.5},
};

/* float32 in order of value <-> unsigned keys */
static uint32_t f_key(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
static float f_unkey(uint32_t k) {
    uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The largest error in ulps of ref(x) over got = f(x) for results of at
 * least FLT_MIN (its x in *worst_x), the largest of smaller ones in units of
 * FLT_MIN in *worst_tiny; fails at once where one of ref and got is NaN,
 * infinite or beyond float32's range and the other is not the same. */
static double ulp_worst(const char *name, double (*ref_fn)(double), const float *xs,
                        const float *v, int64_t n, double *worst_x, double *worst_tiny) {
    double worst = 0;
    *worst_x = 0, *worst_tiny = 0;
    for (int64_t i = 0; i < n; i++) {
        double ref = ref_fn(xs[i]), got = v[i];
        if (isnan(ref) || isnan(got) || isinf(ref) || isinf(got) || fabs(ref) > FLT_MAX) {
            bool same = (isnan(ref) && isnan(got)) || ref == got ||
                        (fabs(ref) > FLT_MAX && isinf(got) && (ref > 0) == (got > 0));
            if (!same) fail_msg("%s(%a) = %a, float64 %a", name, xs[i], got, ref);
            continue;
        }
        if (fabs(ref) < FLT_MIN) {
            *worst_tiny = fmax(*worst_tiny, fabs(got - ref) / FLT_MIN);
            continue;
        }
        int e;
        frexp(ref, &e);
        double err = fabs(got - ref) / ldexp(1.0, e - 24);
        if (err > worst) worst = err, *worst_x = xs[i];
    }
    return worst;
}

static void test_unary_f32_ulp(void **state) {
    (void)state;
    static const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, FLT_MIN, -FLT_MIN,
                                     FLT_MAX, -FLT_MAX, 1e-45f, -1e-45f};
    const int ns = (int)(sizeof specials / sizeof specials[0]);
    for (size_t k = 0; k < sizeof ulp_cases / sizeof ulp_cases[0]; k++) {
        uint32_t k0 = f_key(ulp_cases[k].lo), k1 = f_key(ulp_cases[k].hi);
        uint32_t stride = (k1 - k0) / (1u << 19) + 1;
        int64_t n = (int64_t)((k1 - k0) / stride) + 1 + ns;
        float *xs = malloc(sizeof(float) * (size_t)n * 2);
        assert_non_null(xs);
        for (int64_t i = 0; i < n - ns; i++) xs[i] = f_unkey(k0 + (uint32_t)i * stride);
        for (int i = 0; i < ns; i++) xs[n - ns + i] = specials[i];
        /* the same values at every other element of a twice as long buffer */
        float *wide = xs + n;
        for (int64_t i = 0; i < n; i++) wide[i] = xs[i];
        ct_tensor *x = ct_tensor_from_data(xs, CT_F32, 1, &n);
        int64_t n2[2] = {n, 2};
        float *pairs = malloc(sizeof(float) * (size_t)n * 2);
        assert_non_null(pairs);
        for (int64_t i = 0; i < n; i++) pairs[2 * i] = wide[i], pairs[2 * i + 1] = 0;
        ct_tensor *xp = ct_tensor_from_data(pairs, CT_F32, 2, n2);
        ct_tensor *xs2 = xp ? ct_select(xp, 1, 0) : NULL; /* stride 2 */
        assert_non_null(x);
        assert_non_null(xs2);
        for (int strided = 0; strided < 2; strided++) {
            ct_tensor *y = ulp_cases[k].fn(strided ? xs2 : x);
            assert_non_null(y);
            ct_tensor *yc = ct_contiguous(y);
            assert_non_null(yc);
            const float *v = ct_tensor_data_ptr(yc);
            double worst_x, worst_tiny;
            double worst = ulp_worst(ulp_cases[k].name, ulp_cases[k].ref, xs, v, n, &worst_x,
                                     &worst_tiny);
            if (!strided)
                fprintf(stderr, "[ ulp      ] %-10s max %.2f ulp at %a (bound %g), subnormal results within %.2g FLT_MIN\n",
                        ulp_cases[k].name, worst, worst_x, ulp_cases[k].max_ulp, worst_tiny);
            assert_true(worst <= ulp_cases[k].max_ulp);
            assert_true(worst_tiny <= 1.0);
            ct_tensor_release(yc);
            ct_tensor_release(y);
        }
        ct_tensor_release(xs2);
        ct_tensor_release(xp);
        ct_tensor_release(x);
        free(pairs);
        free(xs);
    }
}

/* ---- float32 sin and cos over every argument range ------------------------------------
 * The ulp bound of vmath.h (0.8) against libm's float64 sin and cos on:
 * random arguments of magnitudes log-uniform from 2^-30 to 1e30 (the float32
 * reduction, the float64 one past VM_TRIG_FAST_MAX, libm's past VM_TRIG_MAX,
 * and blocks that mix them); the float32 nearest k pi/2 and its four
 * neighbours for random k up to 2^25; the float32 nearest a multiple of
 * pi/2 in each binade to 2^24, where the reduction cancels the most (|r|
 * down to 2^-27.8 at 252.898209), with its neighbours; both sides of each
 * level's VM_TRIG_FAST_MAX (8192 without FMA, 131072 with) and of
 * VM_TRIG_MAX; all with both signs, and the specials (sin(-0) = -0).
 * Contiguous (the kernels' direct path) and strided (their blocks). */
static float f_step(float x, int k) { /* k floats up (k > 0) or down from x */
    for (; k > 0; k--) x = nextafterf(x, INFINITY);
    for (; k < 0; k++) x = nextafterf(x, -INFINITY);
    return x;
}

static void put_pm(float *xs, int64_t *n, float v) { /* v and -v */
    xs[(*n)++] = v;
    xs[(*n)++] = -v;
}

static int64_t sincos_inputs(float *xs, int64_t cap) {
    static const float hardest[] = {0x1.921fb6p+0f, 0x1.2d97c8p+2f, 0x1.f9cbe2p+7f,
                                    0x1.17cc5p+11f, 0x1.9a48dep+15f, 0x1.04ccbcp+18f,
                                    0x1.4ac55cp+21f};
    static const float edges[] = {8192.0f, 131072.0f, 16777216.0f, 0.78539816f, 1e30f};
    static const float specials[] = {0.0f, INFINITY, NAN, FLT_MIN, FLT_MAX, 1e-45f, 1e-30f};
    int64_t n = 0;
    for (size_t k = 0; k < sizeof hardest / sizeof hardest[0]; k++)
        for (int sh = 0; sh < 5; sh++) /* twice a multiple of pi/2 is one too */
            for (int d = -2; d <= 2; d++) put_pm(xs, &n, f_step(ldexpf(hardest[k], sh), d));
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++)
        for (int d = -3; d <= 3; d++) put_pm(xs, &n, f_step(edges[k], d));
    for (size_t k = 0; k < sizeof specials / sizeof specials[0]; k++) put_pm(xs, &n, specials[k]);
    while (n + 10 <= cap / 2) { /* near k pi/2 */
        double kk = floor(exp2(tu_uniform(0, 25)));
        float x = (float)(kk * 1.57079632679489661923);
        for (int d = -2; d <= 2; d++) put_pm(xs, &n, f_step(x, d));
    }
    for (int64_t k = 0; n + 2 <= cap; k++) /* half below 2^24, half to 1e30 */
        put_pm(xs, &n, (float)exp2(tu_uniform(-30, (k & 1) ? 24 : 99.7)));
    return n;
}

static void test_sin_cos_ulp(void **state) {
    (void)state;
    const int64_t cap = (int64_t)1 << 18;
    float *xs = malloc(sizeof(float) * (size_t)cap), *pairs = malloc(sizeof(float) * 2 * (size_t)cap);
    assert_non_null(xs);
    assert_non_null(pairs);
    int64_t n = sincos_inputs(xs, cap);
    for (int64_t i = 0; i < n; i++) pairs[2 * i] = xs[i], pairs[2 * i + 1] = 0;
    int64_t n2[2] = {n, 2};
    ct_tensor *x = ct_tensor_from_data(xs, CT_F32, 1, &n);
    ct_tensor *xp = ct_tensor_from_data(pairs, CT_F32, 2, n2);
    ct_tensor *xs2 = xp ? ct_select(xp, 1, 0) : NULL; /* stride 2 */
    assert_non_null(x);
    assert_non_null(xs2);
    static const struct {
        const char *name;
        ct_tensor *(*fn)(ct_tensor *);
        double (*ref)(double);
    } fns[] = {{"sin", ct_sin, sin}, {"cos", ct_cos, cos}};
    for (size_t f = 0; f < 2; f++) {
        for (int strided = 0; strided < 2; strided++) {
            poison_output(1, &n, CT_F32);
            ct_tensor *y = fns[f].fn(strided ? xs2 : x);
            assert_non_null(y);
            ct_tensor *yc = ct_contiguous(y);
            assert_non_null(yc);
            const float *v = ct_tensor_data_ptr(yc);
            double worst_x, worst_tiny;
            double worst = ulp_worst(fns[f].name, fns[f].ref, xs, v, n, &worst_x, &worst_tiny);
            if (!strided)
                fprintf(stderr, "[ ulp      ] %s of %lld arguments to 1e30: max %.3f ulp at %a\n",
                        fns[f].name, (long long)n, worst, worst_x);
            assert_true(worst <= 0.8);
            assert_true(worst_tiny <= 1.0);
            for (int64_t i = 0; i < n; i++) /* sin keeps the sign of zero, cos(+-0) is 1 */
                if (xs[i] == 0.0f) {
                    float want = f ? 1.0f : xs[i];
                    assert_memory_equal(&v[i], &want, sizeof want);
                }
            ct_tensor_release(yc);
            ct_tensor_release(y);
        }
    }
    ct_tensor_release(xs2);
    ct_tensor_release(xp);
    ct_tensor_release(x);
    free(pairs);
    free(xs);
}

static void test_unary_int(void **state) {
    (void)state;
    static const int64_t s2[] = {6, 9};
    for (size_t k = 0; k < N_FLOAT_UNARY; k++) {
        const un_case *c = &float_unary[k];
        if (c->ints == UT_REFUSE) {
            check_refuses_ints(c);
            continue;
        }
        bool keeps = c->ints == UT_KEEP;
        un_case ic = *c;
        if (ic.lo < 1 && ic.lo > 0) ic.lo = 1; /* no zeros where the math needs positives */
        if (ic.lo == 0) ic.lo = 1;
        ic.hi = ic.hi < 4 ? 4 : ic.hi;
        for (int nc = 0; nc < 2; nc++) {
            run_unary_case(&ic, CT_I32, keeps ? CT_I32 : CT_F32, 2, s2, nc);
            run_unary_case(&ic, CT_I64, keeps ? CT_I64 : CT_F32, 2, s2, nc);
            if (!keeps) run_unary_case(&ic, CT_BOOL, CT_F32, 2, s2, nc);
        }
    }
    /* bool: sign keeps bool, square gives int64 (pow(x, 2)), neg is refused. */
    run_unary_case(unary_case("sign"), CT_BOOL, CT_BOOL, 2, s2, true);
    run_unary_case(unary_case("square"), CT_BOOL, CT_I64, 2, s2, false);
    ct_tensor *b = tu_rand(2, s2, CT_BOOL, 0, 2, NULL);
    ct_clear_error();
    tu_assert_null_error(ct_neg(b), CT_ERR_DTYPE, "ct_neg", "bool");
    tu_assert_null_error(ct_abs(b), CT_ERR_DTYPE, "ct_abs", "bool");
    tu_assert_null_error(ct_relu(b), CT_ERR_DTYPE, "ct_relu", "bool");
    tu_assert_error(ct_neg_(b), CT_ERR_DTYPE, "ct_neg_", "bool");
    ct_tensor_release(b);
    /* Wrapping as in PyTorch: neg/abs of INT32_MIN stay INT32_MIN. */
    int32_t m = INT32_MIN;
    ct_tensor *t = ct_tensor_from_data(&m, CT_I32, CT_SHAPE(1));
    ct_tensor *r = ct_neg(t);
    double *v = tu_values(r);
    assert_true(v[0] == (double)INT32_MIN);
    free(v);
    ct_tensor_release(r);
    r = ct_abs(t);
    v = tu_values(r);
    assert_true(v[0] == (double)INT32_MIN);
    free(v);
    ct_tensor_release(r);
    ct_tensor_release(t);
}

/* The rows' pinned points (unary_ops.inc) in float64 and float32: relative
 * accuracy in the tails, and the branch the reference takes; in float32,
 * results below the normal range are compared absolutely. */
static void test_unary_points(void **state) {
    (void)state;
    static const struct {
        const char *name;
        double x;
    } points[] = {
#define UN_POINT_(nm, px) {#nm, px},
        CT_UNARY_POINTS(UN_POINT_)
#undef UN_POINT_
    };
    static const int64_t s1[] = {1};
    for (size_t k = 0; k < sizeof points / sizeof points[0]; k++) {
        const un_case *c = unary_case(points[k].name);
        for (int d = 0; d < 2; d++) {
            ct_dtype dt = d ? CT_F32 : CT_F64;
            double x = tu_round(points[k].x, dt), ref = tu_round(c->ref(x), dt);
            ct_tensor *t = tu_from_f64(&x, 1, s1, dt);
            ct_tensor *y = c->fn(t);
            if (!y) fprintf(stderr, "%s(%g): %s\n", c->name, x, ct_last_error());
            double rtol = d ? tu_rtol(dt) : 1e-12, atol = d ? FLT_MIN : 0;
            check_tensor(y, dt, 1, s1, &ref, rtol, atol);
            ct_tensor_release(y);
            ct_tensor_release(t);
        }
    }
}

static void test_logical_not(void **state) {
    (void)state;
    static const int64_t s2[] = {5, 8};
    for (int d = 0; d < N_ALL; d++) {
        ct_dtype dt = tu_all_dtypes[d];
        for (int nc = 0; nc < 2; nc++) {
            /* Integers in [-2, 3) contain zeros; floats get some exact zeros. */
            double *v;
            ct_tensor *x = tu_rand(2, s2, dt, -2, 3, &v);
            if (ct_dtype_is_floating(dt)) {
                ct_tensor_release(x);
                for (int i = 0; i < 40; i += 3) v[i] = 0;
                x = tu_from_f64(v, 2, s2, dt);
            }
            x = maybe_noncontig(x, nc);
            double ref[40];
            for (int i = 0; i < 40; i++) ref[i] = v[i] == 0;
            ct_tensor *y = ct_logical_not(x);
            check_tensor(y, CT_BOOL, 2, s2, ref, 0, 0);
            ct_tensor_release(y);
            ct_tensor_release(x);
            free(v);
        }
    }
}

/* ---- binary ------------------------------------------------------------------------------- */
typedef ct_tensor *(*bin_fn)(ct_tensor *, ct_tensor *);
typedef double (*bin_ref)(double, double);
typedef enum { R_SAME, R_FLOATIFY, R_BOOL } res_rule;
typedef struct bin_case {
    const char *name;
    bin_fn fn;
    bin_ref ref;
    res_rule rule;
    double lo, hi;     /* a's range */
    double blo, bhi;   /* b's range */
    bool no_bool;      /* refuses (or has no kernel for) bool */
} bin_case;

static double r_add(double a, double b) { return a + b; }
static double r_sub(double a, double b) { return a - b; }
static double r_mul(double a, double b) { return a * b; }
static double r_div(double a, double b) { return a / b; }
static double r_max(double a, double b) { return a > b ? a : b; }
static double r_min(double a, double b) { return a < b ? a : b; }
static double r_eq(double a, double b) { return a == b; }
static double r_ne(double a, double b) { return a != b; }
static double r_lt(double a, double b) { return a < b; }
static double r_le(double a, double b) { return a <= b; }
static double r_gt(double a, double b) { return a > b; }
static double r_ge(double a, double b) { return a >= b; }
static double r_and(double a, double b) { return a != 0 && b != 0; }
static double r_or(double a, double b) { return a != 0 || b != 0; }
static double r_pow(double a, double b) { return pow(a, b); }
/* Integer powers: negative exponents truncate 1 / a^-b. */
static double r_ipow(double a, double b) {
    if (b < 0) return a == 1 ? 1 : a == -1 ? (fmod(b, 2) != 0 ? -1 : 1) : 0;
    return pow(a, b);
}
/* bool arithmetic: add is or, mul is and. */
static double r_bool_add(double a, double b) { return a != 0 || b != 0; }

static const bin_case bin_cases[] = {
    {"add", ct_add, r_add, R_SAME, -5, 5, -5, 5, false},
    {"sub", ct_sub, r_sub, R_SAME, -5, 5, -5, 5, true},
    {"mul", ct_mul, r_mul, R_SAME, -5, 5, -5, 5, false},
    {"div", ct_div, r_div, R_FLOATIFY, -5, 5, 1, 5, false},
    {"maximum", ct_maximum, r_max, R_SAME, -3, 3, -3, 3, false},
    {"minimum", ct_minimum, r_min, R_SAME, -3, 3, -3, 3, false},
    {"eq", ct_eq, r_eq, R_BOOL, -2, 2, -2, 2, false},
    {"ne", ct_ne, r_ne, R_BOOL, -2, 2, -2, 2, false},
    {"lt", ct_lt, r_lt, R_BOOL, -2, 2, -2, 2, false},
    {"le", ct_le, r_le, R_BOOL, -2, 2, -2, 2, false},
    {"gt", ct_gt, r_gt, R_BOOL, -2, 2, -2, 2, false},
    {"ge", ct_ge, r_ge, R_BOOL, -2, 2, -2, 2, false},
    {"logical_and", ct_logical_and, r_and, R_BOOL, -2, 2, -2, 2, false},
    {"logical_or", ct_logical_or, r_or, R_BOOL, -2, 2, -2, 2, false},
    {"pow", ct_pow, r_pow, R_SAME, 0.5, 2, -2, 3, true},
};
#define N_BIN (sizeof bin_cases / sizeof bin_cases[0])

static ct_dtype out_dtype(const bin_case *c, ct_dtype rt) {
    if (c->rule == R_BOOL) return CT_BOOL;
    if (c->rule == R_FLOATIFY && !ct_dtype_is_floating(rt)) return CT_F32;
    return rt;
}

/* Random values with some ties and zeros (comparisons and logical ops see
 * both outcomes): float values are drawn from a coarse grid. */
static ct_tensor *bin_operand(int nd, const int64_t *sh, ct_dtype dt, double lo, double hi,
                              bool grid, double **vals) {
    int64_t n = tu_numel(nd, sh);
    double *v = tu_rand_vals(n, dt, lo, hi);
    if (grid && ct_dtype_is_floating(dt))
        for (int64_t i = 0; i < n; i++) v[i] = tu_round(floor(v[i] * 2) / 2, dt);
    ct_tensor *t = tu_from_f64(v, nd, sh, dt);
    *vals = v;
    return t;
}

static void run_binary_case(const bin_case *c, ct_dtype da, int na, const int64_t *sa,
                            ct_dtype db, int nb, const int64_t *sb, bool nc) {
    double *va, *vb;
    bool grid = c->rule == R_BOOL || c->fn == ct_maximum || c->fn == ct_minimum;
    ct_tensor *a = maybe_noncontig(bin_operand(na, sa, da, c->lo, c->hi, grid, &va), nc);
    ct_tensor *b = maybe_noncontig(bin_operand(nb, sb, db, c->blo, c->bhi, grid, &vb), nc);
    ct_tensor *ts[2] = {a, b};
    ct_dtype rt = cti_result_type(2, ts);
    ct_dtype od = out_dtype(c, rt);
    int64_t sh[CT_MAX_DIMS];
    int nd = bcast(na, sa, nb, sb, sh);
    int64_t n = tu_numel(nd, sh);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    bool bool_arith = rt == CT_BOOL && c->rule == R_SAME;
    for (int64_t i = 0; i < n; i++) {
        double x = va[bcast_index(i, nd, sh, na, sa)], y = vb[bcast_index(i, nd, sh, nb, sb)];
        double r;
        if (bool_arith && c->fn == ct_add) r = r_bool_add(x, y);
        else if (c->fn == ct_pow && !ct_dtype_is_floating(rt)) r = r_ipow(x, y);
        else r = c->ref(x, y);
        ref[i] = tu_round(r, od);
    }
    ct_tensor *y = c->fn(a, b);
    if (!y)
        fprintf(stderr, "%s(%s, %s): %s\n", c->name, ct_dtype_name(da), ct_dtype_name(db),
                ct_last_error());
    double tol = ct_dtype_is_floating(od) ? tol_of(od) : 0;
    check_tensor(y, od, nd, sh, ref, tol, tol);
    ct_tensor_release(y);
    ct_tensor_release(a);
    ct_tensor_release(b);
    free(ref);
    free(va);
    free(vb);
}

typedef struct shape_pair {
    int na;
    int64_t sa[4];
    int nb;
    int64_t sb[4];
} shape_pair;

static const shape_pair pairs[] = {
    {2, {3, 4}, 2, {3, 4}},       {2, {3, 4}, 1, {4}},          {2, {3, 1}, 2, {1, 4}},
    {3, {2, 3, 4}, 2, {3, 1}},    {0, {0}, 2, {2, 3}},          {2, {2, 3}, 0, {0}},
    {2, {0, 3}, 2, {1, 3}},       {1, {0}, 0, {0}},             {1, {1}, 1, {5}},
    {3, {5, 1, 3}, 3, {1, 4, 1}}, {4, {2, 1, 3, 1}, 3, {4, 1, 5}}, {2, {1, 1}, 1, {1}},
    {3, {2, 0, 3}, 3, {2, 1, 3}}, {0, {0}, 0, {0}},             {1, {7}, 2, {3, 1}},
};
#define N_PAIRS (sizeof pairs / sizeof pairs[0])

static void test_binary_same_dtype(void **state) {
    (void)state;
    for (size_t k = 0; k < N_BIN; k++) {
        const bin_case *c = &bin_cases[k];
        for (int d = 0; d < N_ALL; d++) {
            ct_dtype dt = tu_all_dtypes[d];
            if (dt == CT_BOOL && c->no_bool) continue;
            for (size_t p = 0; p < N_PAIRS; p++)
                for (int nc = 0; nc < 2; nc++)
                    run_binary_case(c, dt, pairs[p].na, pairs[p].sa, dt, pairs[p].nb,
                                    pairs[p].sb, nc);
        }
    }
}

/* Mixed dtypes: promotion (incl. 0-d operands) and conversion of inputs. */
static void test_binary_mixed(void **state) {
    (void)state;
    static const int64_t s2[] = {4, 6}, s1[] = {6};
    for (size_t k = 0; k < N_BIN; k++) {
        const bin_case *c = &bin_cases[k];
        for (int i = 0; i < N_ALL; i++) {
            for (int j = 0; j < N_ALL; j++) {
                ct_dtype da = tu_all_dtypes[i], db = tu_all_dtypes[j];
                if (c->no_bool && (da == CT_BOOL || db == CT_BOOL)) continue;
                if (c->fn == ct_pow && !ct_dtype_is_floating(da) && !ct_dtype_is_floating(db))
                    continue; /* integer powers are tested apart */
                run_binary_case(c, da, 2, s2, db, 1, s1, false);
                run_binary_case(c, da, 2, s2, db, 0, NULL, true);
                run_binary_case(c, da, 0, NULL, db, 1, s1, false);
            }
        }
    }
}

/* ---- gelu_backward ------------------------------------------------------------------------
 * grad_out times d/dx gelu(x) against float64 references written here: exact Phi(x) +
 * x phi(x), Phi through erfc (no cancellation in the left tail); tanh with (1 + t) / 2
 * as sigmoid(2u) and 1 - t^2 as 4 s (1 - s), which keep their digits where t nears -1
 * and 1, unlike the kernels' form of the same formula. */
static double r_gelu_grad(double x) {
    if (isinf(x)) return x > 0 ? 1 : 0;
    return 0.5 * erfc(-x * M_SQRT1_2) + x * exp(-0.5 * x * x) / sqrt(2 * M_PI);
}
static double r_gelu_tanh_grad(double x) {
    if (isinf(x)) return x > 0 ? 1 : 0;
    const double k = sqrt(2 / M_PI), c = 0.044715;
    double s = 1 / (1 + exp(-2 * k * (x + c * x * x * x))); /* (1 + t) / 2 */
    return s + 0.5 * x * (4 * s * (1 - s)) * k * (1 + 3 * c * x * x);
}
static double r_gelu_bw(double g, double x, ct_gelu_approx a) {
    return g * (a == CT_GELU_TANH ? r_gelu_tanh_grad(x) : r_gelu_grad(x));
}

/* Absolute tolerances: the derivative crosses 0 near x = -0.75, where a relative one
 * cannot hold; the float32 kernels' 1 - t^2 loses a few ulps of 1 times up to about 20 */
static double gelu_bw_atol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-13;
    case CT_F32: return 1e-5;
    default: return 1e-4;
    }
}

/* grad_out in [-2, 2], x in [lo, hi), either operand non-contiguous (nc bits 1: grad_out,
 * 2: x), into a poisoned output. */
static void run_gelu_bw(ct_dtype dt, ct_gelu_approx a, int nd, const int64_t *shape, int nc,
                        double lo, double hi) {
    double *gv, *xv;
    ct_tensor *g = maybe_noncontig(tu_rand(nd, shape, dt, -2, 2, &gv), nc & 1);
    ct_tensor *x = maybe_noncontig(tu_rand(nd, shape, dt, lo, hi, &xv), nc & 2);
    int64_t n = tu_numel(nd, shape);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) ref[i] = tu_round(r_gelu_bw(gv[i], xv[i], a), dt);
    poison_output(nd, shape, dt);
    ct_tensor *y = ct_gelu_backward(g, x, a);
    if (!y) fprintf(stderr, "gelu_backward %s: %s\n", ct_dtype_name(dt), ct_last_error());
    check_tensor(y, dt, nd, shape, ref, tol_of(dt), gelu_bw_atol(dt));
    ct_tensor_release(y);
    ct_tensor_release(x);
    ct_tensor_release(g);
    free(ref);
    free(xv);
    free(gv);
}

static void test_gelu_backward(void **state) {
    (void)state;
    static const int64_t s2[] = {37, 29}, s3[] = {3, 5, 7}, s1[] = {300}, s0[] = {4, 0};
    static const ct_gelu_approx approx[] = {CT_GELU_NONE, CT_GELU_TANH};
    for (int d = 0; d < N_FLOAT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (int k = 0; k < 2; k++) {
            ct_gelu_approx a = approx[k];
            run_gelu_bw(dt, a, 2, s2, 0, -8, 8); /* both tails */
            run_gelu_bw(dt, a, 1, s1, 0, -3, 3); /* densely where it curves */
            run_gelu_bw(dt, a, 3, s3, 1, -4, 4);
            run_gelu_bw(dt, a, 3, s3, 2, -4, 4);
            run_gelu_bw(dt, a, 3, s3, 3, -4, 4);
            run_gelu_bw(dt, a, 0, NULL, 0, -4, 4);
            run_gelu_bw(dt, a, 2, s0, 0, -4, 4);
        }
    }
}

/* Pinned points: 0, the zero of the derivative's neighbourhood, far tails, the
 * infinities (the limits 1 and 0, not inf * 0) and NaN, in float32 and float64. */
static void test_gelu_backward_points(void **state) {
    (void)state;
    static const double xs[] = {0, -0.0, 1e-30, -0.75, 0.5, -1, 3, -5, 9, -9,
                                30, -30, 1e20, -1e20, INFINITY, -INFINITY, NAN};
    const int64_t n = (int64_t)(sizeof xs / sizeof xs[0]);
    static const ct_dtype dts[] = {CT_F32, CT_F64};
    static const ct_gelu_approx approx[] = {CT_GELU_NONE, CT_GELU_TANH};
    double gs[sizeof xs / sizeof xs[0]], ref[sizeof xs / sizeof xs[0]];
    for (int64_t i = 0; i < n; i++) gs[i] = i % 2 ? -1.5 : 1;
    for (size_t d = 0; d < 2; d++) {
        for (int k = 0; k < 2; k++) {
            ct_tensor *x = tu_from_f64(xs, 1, &n, dts[d]);
            ct_tensor *g = tu_from_f64(gs, 1, &n, dts[d]);
            for (int64_t i = 0; i < n; i++) {
                double xi = tu_round(xs[i], dts[d]);
                ref[i] = isnan(xi) ? NAN : tu_round(r_gelu_bw(gs[i], xi, approx[k]), dts[d]);
            }
            ct_tensor *y = ct_gelu_backward(g, x, approx[k]);
            check_tensor(y, dts[d], 1, &n, ref, tol_of(dts[d]), gelu_bw_atol(dts[d]));
            ct_tensor_release(y);
            ct_tensor_release(g);
            ct_tensor_release(x);
        }
    }
}

/* ct_gelu's gradient through autograd is the kernel's, in every floating dtype. */
static void test_gelu_backward_autograd(void **state) {
    (void)state;
    static const int64_t s2[] = {23, 17};
    static const ct_gelu_approx approx[] = {CT_GELU_NONE, CT_GELU_TANH};
    const int64_t n = 23 * 17;
    for (int d = 0; d < N_FLOAT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (int k = 0; k < 2; k++) {
            double *gv, *xv;
            ct_tensor *x = tu_rand(2, s2, dt, -5, 5, &xv);
            ct_tensor *g = tu_rand(2, s2, dt, -2, 2, &gv);
            assert_int_equal(ct_requires_grad_(x, true), CT_OK);
            ct_tensor *y = ct_gelu(x, approx[k]);
            assert_non_null(y);
            assert_int_equal(ct_backward(y, g, false), CT_OK);
            double *ref = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) ref[i] = tu_round(r_gelu_bw(gv[i], xv[i], approx[k]), dt);
            check_tensor(ct_grad(x), dt, 2, s2, ref, tol_of(dt), gelu_bw_atol(dt));
            free(ref);
            free(xv);
            free(gv);
            ct_tensor_release(y);
            ct_tensor_release(g);
            ct_tensor_release(x);
        }
    }
}

/* The operand checks a backward pointwise op (fn, called name) shares: NULLs, grad_out of
 * another dtype, integers, another shape, each refused with the op's name and the reason.
 * The tensors are the caller's: a [3, 4] float32, b float64, c a [4, 3] float32. */
typedef ct_tensor *(*pair_fn)(ct_tensor *grad_out, ct_tensor *x);
static void check_backward_pair_errors(pair_fn fn, const char *name, ct_tensor *a, ct_tensor *b,
                                       ct_tensor *c) {
    ct_tensor *i = tu_rand(CT_SHAPE(3, 4), CT_I64, -3, 3, NULL);
    ct_clear_error();
    tu_assert_null_error(fn(NULL, a), CT_ERR_INVALID_ARG, name, "argument 1", "NULL");
    ct_clear_error();
    tu_assert_null_error(fn(a, NULL), CT_ERR_INVALID_ARG, name, "argument 2", "NULL");
    tu_assert_null_error(fn(b, a), CT_ERR_DTYPE, name, "grad_out", "float32", "float64");
    tu_assert_null_error(fn(i, i), CT_ERR_DTYPE, name, "floating", "int64");
    tu_assert_null_error(fn(c, a), CT_ERR_SHAPE, name, "shape", "[4, 3]", "[3, 4]");
    ct_tensor_release(i);
}
static ct_tensor *gelu_bw_none(ct_tensor *g, ct_tensor *x) {
    return ct_gelu_backward(g, x, CT_GELU_NONE);
}
static ct_tensor *gelu_bw_tanh(ct_tensor *g, ct_tensor *x) {
    return ct_gelu_backward(g, x, CT_GELU_TANH);
}
static ct_tensor *thr_bw_zero(ct_tensor *g, ct_tensor *x) { return ct_threshold_backward(g, x, 0); }

static void test_gelu_backward_errors(void **state) {
    (void)state;
    ct_tensor *a = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(3, 4), CT_F64, -1, 1, NULL);
    ct_tensor *c = tu_rand(CT_SHAPE(4, 3), CT_F32, -1, 1, NULL);
    check_backward_pair_errors(gelu_bw_none, "ct_gelu_backward", a, b, c);
    check_backward_pair_errors(gelu_bw_tanh, "ct_gelu_backward", a, b, c);
    tu_assert_null_error(ct_gelu_backward(a, a, (ct_gelu_approx)7), CT_ERR_INVALID_ARG,
                         "ct_gelu_backward", "CT_GELU_TANH", "7");
    /* no double backward: a result that needs grad refuses backward with the reason */
    assert_int_equal(ct_requires_grad_(c, true), CT_OK);
    ct_tensor *ct = ct_transpose(c, 0, 1);
    ct_tensor *y = ct_gelu_backward(ct, a, CT_GELU_NONE);
    assert_non_null(y);
    tu_assert_error(ct_backward(y, a, false), CT_ERR_AUTOGRAD, "gelu_backward",
                    "double backward");
    ct_tensor_release(y);
    ct_tensor_release(ct);
    ct_tensor_release(c);
    ct_tensor_release(b);
    ct_tensor_release(a);
}

/* ---- threshold_backward ---------------------------------------------------------------------
 * grad_out where x > threshold, else 0: exact in every dtype, so the references are the
 * rounded inputs themselves. x is drawn from a few values around the threshold as well as
 * a range, so that ties (x == threshold gives 0) are in every run. */
static double r_thr_bw(double g, double x, double thr) { return x <= thr ? 0.0 : g; }

static void run_thr_bw(ct_dtype dt, double thr, int nd, const int64_t *shape, int nc) {
    double *gv, *xv;
    ct_tensor *g = maybe_noncontig(tu_rand(nd, shape, dt, -2, 2, &gv), nc & 1);
    int64_t n = tu_numel(nd, shape);
    /* every third x on the threshold or a neighbour of it */
    ct_tensor *xr = tu_rand(nd, shape, dt, thr - 2, thr + 2, &xv);
    static const double near[] = {0.0, 0.25, -0.25};
    for (int64_t i = 0; i < n; i += 3) xv[i] = tu_round(thr + near[(i / 3) % 3], dt);
    ct_tensor *xc = tu_from_f64(xv, nd, shape, dt);
    ct_tensor_release(xr);
    ct_tensor *x = maybe_noncontig(xc, nc & 2);
    double *ref = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double tr = tu_round(thr, dt); /* the kernels compare in the compute type */
    for (int64_t i = 0; i < n; i++) ref[i] = r_thr_bw(gv[i], xv[i], tr);
    poison_output(nd, shape, dt);
    ct_tensor *y = ct_threshold_backward(g, x, thr);
    if (!y) fprintf(stderr, "threshold_backward %s: %s\n", ct_dtype_name(dt), ct_last_error());
    check_tensor(y, dt, nd, shape, ref, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(x);
    ct_tensor_release(g);
    free(ref);
    free(xv);
    free(gv);
}

static void test_threshold_backward(void **state) {
    (void)state;
    static const int64_t s2[] = {37, 29}, s3[] = {3, 5, 7}, s1[] = {1000}, s0[] = {4, 0};
    static const double thr[] = {0.0, 0.5, -1.25};
    for (int d = 0; d < N_FLOAT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        for (int k = 0; k < 3; k++) {
            run_thr_bw(dt, thr[k], 2, s2, 0);
            run_thr_bw(dt, thr[k], 1, s1, 0);
            run_thr_bw(dt, thr[k], 3, s3, 1);
            run_thr_bw(dt, thr[k], 3, s3, 2);
            run_thr_bw(dt, thr[k], 3, s3, 3);
            run_thr_bw(dt, thr[k], 0, NULL, 0);
            run_thr_bw(dt, thr[k], 2, s0, 0);
        }
    }
}

/* Pinned points at threshold 0: both zeros give 0, NaN x passes grad_out, the
 * infinities, and a NaN gradient stays where x > 0 and is dropped where x <= 0. */
static void test_threshold_backward_points(void **state) {
    (void)state;
    static const double xs[] = {0, -0.0, 1e-30, -1e-30, 2, -2, INFINITY, -INFINITY, NAN, 3, -3};
    static const double gs[] = {1, -2, 3, 4, -5, 6, 7, 8, -9, NAN, NAN};
    static const double want[] = {0, 0, 3, 0, -5, 0, 7, 0, -9, NAN, 0};
    const int64_t n = (int64_t)(sizeof xs / sizeof xs[0]);
    for (int d = 0; d < N_FLOAT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *x = tu_from_f64(xs, 1, &n, dt);
        ct_tensor *g = tu_from_f64(gs, 1, &n, dt);
        double ref[sizeof xs / sizeof xs[0]];
        for (int64_t i = 0; i < n; i++) ref[i] = tu_round(want[i], dt);
        /* 1e-30 underflows in float16 and bfloat16 keeps it: the reference follows x */
        for (int64_t i = 2; i < 4; i++) ref[i] = tu_round(xs[i], dt) > 0 ? tu_round(gs[i], dt) : 0;
        ct_tensor *y = ct_threshold_backward(g, x, 0.0);
        check_tensor(y, dt, 1, &n, ref, 0, 0);
        ct_tensor_release(y);
        ct_tensor_release(g);
        ct_tensor_release(x);
    }
}

/* relu's gradient through autograd is threshold_backward's at 0 on its output, in every
 * floating dtype, with exact zeros among the inputs (gradient 0 there, as PyTorch). */
static void test_relu_backward_autograd(void **state) {
    (void)state;
    static const int64_t s2[] = {23, 17};
    const int64_t n = 23 * 17;
    for (int d = 0; d < N_FLOAT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        double *gv, *xv;
        ct_tensor *x0 = tu_rand(2, s2, dt, -3, 3, &xv);
        for (int64_t i = 0; i < n; i += 5) xv[i] = 0.0;
        ct_tensor *x = tu_from_f64(xv, 2, s2, dt);
        ct_tensor_release(x0);
        ct_tensor *g = tu_rand(2, s2, dt, -2, 2, &gv);
        assert_int_equal(ct_requires_grad_(x, true), CT_OK);
        ct_tensor *y = ct_relu(x);
        assert_non_null(y);
        assert_int_equal(ct_backward(y, g, false), CT_OK);
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) ref[i] = xv[i] > 0 ? gv[i] : 0.0;
        check_tensor(ct_grad(x), dt, 2, s2, ref, 0, 0);
        free(ref);
        free(xv);
        free(gv);
        ct_tensor_release(y);
        ct_tensor_release(g);
        ct_tensor_release(x);
    }
}

static void test_threshold_backward_errors(void **state) {
    (void)state;
    ct_tensor *a = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(3, 4), CT_F64, -1, 1, NULL);
    ct_tensor *c = tu_rand(CT_SHAPE(4, 3), CT_F32, -1, 1, NULL);
    check_backward_pair_errors(thr_bw_zero, "ct_threshold_backward", a, b, c);
    ct_tensor_release(c);
    ct_tensor_release(b);
    ct_tensor_release(a);
}

static void test_broadcast_errors(void **state) {
    (void)state;
    ct_tensor *a = tu_rand(CT_SHAPE(3), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(4), CT_F32, -1, 1, NULL);
    ct_tensor *c = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, NULL);
    ct_tensor *d = tu_rand(CT_SHAPE(3, 2), CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_add(a, b), CT_ERR_SHAPE, "ct_add", "[3]", "[4]");
    tu_assert_null_error(ct_mul(c, d), CT_ERR_SHAPE, "ct_mul", "[2, 3]", "[3, 2]");
    tu_assert_null_error(ct_lt(c, d), CT_ERR_SHAPE, "ct_lt");
    tu_assert_null_error(ct_add(a, NULL), CT_ERR_INVALID_ARG, "ct_add", "NULL");
    tu_assert_null_error(ct_div(NULL, a), CT_ERR_INVALID_ARG, "ct_div", "NULL");
    tu_assert_null_error(ct_exp(NULL), CT_ERR_INVALID_ARG, "ct_exp", "NULL");
    tu_assert_null_error(ct_add_scalar(NULL, 1), CT_ERR_INVALID_ARG, "ct_add_scalar", "NULL");
    tu_assert_null_error(ct_gelu(a, (ct_gelu_approx)7), CT_ERR_INVALID_ARG, "ct_gelu", "7");
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(c);
    ct_tensor_release(d);
}

/* ---- type promotion (cases checked against PyTorch) ---------------------------------------- */
static ct_dtype dtype_of_result(ct_tensor *t) {
    assert_non_null(t);
    ct_dtype d = ct_tensor_dtype(t);
    ct_tensor_release(t);
    return d;
}

static void test_promotion(void **state) {
    (void)state;
    ct_tensor *i32 = tu_rand(CT_SHAPE(5), CT_I32, -9, 9, NULL);
    ct_tensor *i64 = tu_rand(CT_SHAPE(5), CT_I64, -9, 9, NULL);
    ct_tensor *f16 = tu_rand(CT_SHAPE(5), CT_F16, -1, 1, NULL);
    ct_tensor *bf16 = tu_rand(CT_SHAPE(5), CT_BF16, -1, 1, NULL);
    ct_tensor *f32 = tu_rand(CT_SHAPE(5), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(5), CT_BOOL, 0, 2, NULL);
    ct_tensor *f64_0d = ct_tensor_scalar(0.1, CT_F64, CT_CPU);
    ct_tensor *f32_0d = ct_tensor_scalar(2.5, CT_F32, CT_CPU);
    ct_tensor *i64_0d = ct_tensor_scalar(3, CT_I64, CT_CPU);

    assert_int_equal(dtype_of_result(ct_add_scalar(i32, 2)), CT_I32);
    assert_int_equal(dtype_of_result(ct_mul_scalar(i32, 2.5)), CT_F32);
    assert_int_equal(dtype_of_result(ct_mul_scalar(i64, 2.0)), CT_I64);
    assert_int_equal(dtype_of_result(ct_mul_scalar(f16, 3.0)), CT_F16);
    assert_int_equal(dtype_of_result(ct_add_scalar(b, 1)), CT_I64);
    assert_int_equal(dtype_of_result(ct_add_scalar(b, 0.5)), CT_F32);
    assert_int_equal(dtype_of_result(ct_add(b, b)), CT_BOOL);
    assert_int_equal(dtype_of_result(ct_add(i32, f32_0d)), CT_F32);
    assert_int_equal(dtype_of_result(ct_add(f16, f64_0d)), CT_F16);
    assert_int_equal(dtype_of_result(ct_add(f16, f32)), CT_F32);
    assert_int_equal(dtype_of_result(ct_add(f16, bf16)), CT_F32);
    assert_int_equal(dtype_of_result(ct_add(i32, i64_0d)), CT_I32);
    assert_int_equal(dtype_of_result(ct_add(i32, i64)), CT_I64);
    assert_int_equal(dtype_of_result(ct_div(i32, i64)), CT_F32);
    assert_int_equal(dtype_of_result(ct_div_scalar(i32, 2)), CT_F32);
    assert_int_equal(dtype_of_result(ct_lt(i32, f16)), CT_BOOL);
    assert_int_equal(dtype_of_result(ct_pow_scalar(i32, 2)), CT_I32);
    assert_int_equal(dtype_of_result(ct_pow_scalar(i32, 0.5)), CT_F32);
    assert_int_equal(dtype_of_result(ct_maximum(b, i32)), CT_I32);

    /* f16 * 1e5 overflows to inf in float16. */
    ct_tensor *big = ct_mul_scalar(f16, 1e5);
    double *vf = tu_values(f16), *vb = tu_values(big);
    for (int i = 0; i < 5; i++) {
        if (fabs(vf[i]) * 1e5 > 65520) assert_true(isinf(vb[i]) && (vb[i] > 0) == (vf[i] > 0));
        else assert_true(fabs(vb[i] - tu_round(vf[i] * 1e5, CT_F16)) <= 2e-3 * fabs(vb[i]));
    }
    free(vf);
    free(vb);
    ct_tensor_release(big);

    /* f16 + 0-d f64 0.1: the scalar keeps float32 precision, result rounded once. */
    ct_tensor *r = ct_add(f16, f64_0d);
    vf = tu_values(f16);
    vb = tu_values(r);
    for (int i = 0; i < 5; i++)
        assert_true(vb[i] == tu_round((double)((float)vf[i] + 0.1f), CT_F16));
    free(vf);
    free(vb);
    ct_tensor_release(r);

    /* int32 + 2 stays int32 with exact values; int32 * 2.5 is float. */
    r = ct_add_scalar(i32, 2);
    double *vi = tu_values(i32), *vr = tu_values(r);
    for (int i = 0; i < 5; i++) assert_true(vr[i] == vi[i] + 2);
    free(vr);
    ct_tensor_release(r);
    r = ct_mul_scalar(i32, 2.5);
    vr = tu_values(r);
    for (int i = 0; i < 5; i++) assert_true(vr[i] == vi[i] * 2.5);
    free(vr);
    free(vi);
    ct_tensor_release(r);

    /* A scalar that does not fit the integer dtype. */
    ct_clear_error();
    tu_assert_null_error(ct_add_scalar(i32, 3e9), CT_ERR_OVERFLOW, "ct_add_scalar", "int32");
    /* 1e19 is no int64: it is a float scalar, and the result float32. */
    assert_int_equal(dtype_of_result(ct_mul_scalar(i64, 1e19)), CT_F32);

    ct_tensor_release(i32);
    ct_tensor_release(i64);
    ct_tensor_release(f16);
    ct_tensor_release(bf16);
    ct_tensor_release(f32);
    ct_tensor_release(b);
    ct_tensor_release(f64_0d);
    ct_tensor_release(f32_0d);
    ct_tensor_release(i64_0d);
}

/* ---- scalar ops ------------------------------------------------------------------------- */
typedef ct_tensor *(*sc_fn)(ct_tensor *, double);
typedef struct sc_case {
    const char *name;
    sc_fn fn;
    bin_ref ref;
    res_rule rule;
    bool reverse;
} sc_case;
static double r_rsub(double a, double b) { return b - a; }
static const sc_case sc_cases[] = {
    {"add_scalar", ct_add_scalar, r_add, R_SAME, false},
    {"sub_scalar", ct_sub_scalar, r_sub, R_SAME, false},
    {"rsub_scalar", ct_rsub_scalar, r_rsub, R_SAME, false},
    {"mul_scalar", ct_mul_scalar, r_mul, R_SAME, false},
    {"div_scalar", ct_div_scalar, r_div, R_FLOATIFY, false},
    {"pow_scalar", ct_pow_scalar, r_pow, R_SAME, false},
    {"maximum_scalar", ct_maximum_scalar, r_max, R_SAME, false},
    {"minimum_scalar", ct_minimum_scalar, r_min, R_SAME, false},
    {"eq_scalar", ct_eq_scalar, r_eq, R_BOOL, false},
    {"ne_scalar", ct_ne_scalar, r_ne, R_BOOL, false},
    {"lt_scalar", ct_lt_scalar, r_lt, R_BOOL, false},
    {"le_scalar", ct_le_scalar, r_le, R_BOOL, false},
    {"gt_scalar", ct_gt_scalar, r_gt, R_BOOL, false},
    {"ge_scalar", ct_ge_scalar, r_ge, R_BOOL, false},
};

static void test_scalar_ops(void **state) {
    (void)state;
    static const int64_t s2[] = {7, 5};
    const double scalars[] = {2, -3, 0.75, 1.5};
    const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16, CT_I32, CT_I64};
    for (size_t k = 0; k < sizeof sc_cases / sizeof sc_cases[0]; k++) {
        const sc_case *c = &sc_cases[k];
        for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
            for (size_t si = 0; si < 4; si++) {
                ct_dtype dt = dts[d];
                double s = scalars[si];
                bool is_pow = c->fn == ct_pow_scalar;
                if (is_pow && !ct_dtype_is_floating(dt) && s < 0) continue;
                double lo = is_pow ? 0.5 : -4, hi = is_pow ? 3 : 4;
                double *v;
                ct_tensor *x = maybe_noncontig(tu_rand(2, s2, dt, lo, hi, &v), si & 1);
                bool sint = s == trunc(s);
                ct_dtype rt = ct_dtype_is_floating(dt) ? dt : (sint ? dt : CT_F32);
                ct_dtype od = c->rule == R_BOOL ? CT_BOOL
                              : (c->rule == R_FLOATIFY && !ct_dtype_is_floating(rt)) ? CT_F32
                                                                                       : rt;
                /* Reduced-precision kernels use the scalar in float32. */
                double sv = (dt == CT_F16 || dt == CT_BF16) ? (double)(float)s : s;
                double ref[35];
                for (int i = 0; i < 35; i++) ref[i] = tu_round(c->ref(v[i], sv), od);
                ct_tensor *y = c->fn(x, s);
                if (!y) fprintf(stderr, "%s %s: %s\n", c->name, ct_dtype_name(dt), ct_last_error());
                double tol = ct_dtype_is_floating(od) ? tol_of(od) : 0;
                check_tensor(y, od, 2, s2, ref, tol, tol);
                ct_tensor_release(y);
                ct_tensor_release(x);
                free(v);
            }
        }
    }
    ct_tensor *i = tu_rand(CT_SHAPE(3), CT_I32, 1, 5, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(3), CT_BOOL, 0, 2, NULL);
    tu_assert_null_error(ct_pow_scalar(i, -1), CT_ERR_INVALID_ARG, "ct_pow_scalar",
                         "negative");
    tu_assert_null_error(ct_sub_scalar(b, 1), CT_ERR_DTYPE, "ct_sub_scalar", "bool");
    tu_assert_null_error(ct_rsub_scalar(b, 1), CT_ERR_DTYPE, "ct_rsub_scalar", "bool");
    ct_tensor_release(i);
    ct_tensor_release(b);
}

/* ---- add_alpha, bool arithmetic, integer pow -------------------------------------------- */
static void test_add_alpha(void **state) {
    (void)state;
    static const int64_t sa[] = {4, 5}, sb[] = {5};
    const double alphas[] = {0.5, -2, 3};
    for (int d = 0; d < 6; d++) {
        ct_dtype dt = tu_all_dtypes[d];
        for (int k = 0; k < 3; k++) {
            double alpha = alphas[k];
            for (int sub = 0; sub < 2; sub++) {
                double *va, *vb;
                ct_tensor *a = maybe_noncontig(tu_rand(2, sa, dt, -5, 5, &va), k & 1);
                ct_tensor *b = tu_rand(1, sb, dt, -5, 5, &vb);
                ct_tensor *y = sub ? ct_sub_alpha(a, b, alpha) : ct_add_alpha(a, b, alpha);
                if (!ct_dtype_is_floating(dt) && alpha != trunc(alpha)) {
                    tu_assert_null_error(y, CT_ERR_INVALID_ARG, sub ? "ct_sub_alpha" : "ct_add_alpha",
                                         "alpha", "integer");
                } else {
                    /* Reduced precision computes alpha * b in float32. */
                    double ref[20];
                    for (int i = 0; i < 20; i++)
                        ref[i] = tu_round(va[i] + (sub ? -alpha : alpha) * vb[i % 5], dt);
                    double tol = ct_dtype_is_floating(dt) ? tol_of(dt) : 0;
                    check_tensor(y, dt, 2, sa, ref, tol, tol);
                    ct_tensor_release(y);
                }
                ct_tensor_release(a);
                ct_tensor_release(b);
                free(va);
                free(vb);
            }
        }
    }
}

static void test_bool_arith(void **state) {
    (void)state;
    const double av[] = {0, 0, 1, 1}, bv[] = {0, 1, 0, 1};
    ct_tensor *a = tu_from_f64(av, CT_SHAPE(4), CT_BOOL);
    ct_tensor *b = tu_from_f64(bv, CT_SHAPE(4), CT_BOOL);
    const double r_or_[] = {0, 1, 1, 1}, r_and_[] = {0, 0, 0, 1};
    static const int64_t s4[] = {4};
    ct_tensor *y = ct_add(a, b);
    check_tensor(y, CT_BOOL, 1, s4, r_or_, 0, 0);
    ct_tensor_release(y);
    y = ct_mul(a, b);
    check_tensor(y, CT_BOOL, 1, s4, r_and_, 0, 0);
    ct_tensor_release(y);
    y = ct_maximum(a, b);
    check_tensor(y, CT_BOOL, 1, s4, r_or_, 0, 0);
    ct_tensor_release(y);
    y = ct_minimum(a, b);
    check_tensor(y, CT_BOOL, 1, s4, r_and_, 0, 0);
    ct_tensor_release(y);
    y = ct_add_alpha(a, b, 0);
    check_tensor(y, CT_BOOL, 1, s4, av, 0, 0);
    ct_tensor_release(y);
    tu_assert_null_error(ct_sub(a, b), CT_ERR_DTYPE, "ct_sub", "bool");
    ct_tensor *f = tu_rand(CT_SHAPE(4), CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_sub(f, b), CT_ERR_DTYPE, "ct_sub", "bool");
    tu_assert_error(ct_sub_(f, b), CT_ERR_DTYPE, "ct_sub_", "bool");
    y = ct_pow(a, b);
    tu_assert_null_error(y, CT_ERR_UNSUPPORTED, "pow", "bool");
    ct_tensor_release(f);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

static void test_int_pow(void **state) {
    (void)state;
    const double base[] = {2, -3, 1, -1, -1, 0, 5, 7, 3, -2};
    const double ex[] = {10, 3, -5, -3, -4, 4, -1, 0, 40, 63};
    for (int d = 0; d < 2; d++) {
        ct_dtype dt = d ? CT_I64 : CT_I32;
        ct_tensor *a = tu_from_f64(base, CT_SHAPE(10), dt);
        ct_tensor *b = tu_from_f64(ex, CT_SHAPE(10), dt);
        ct_tensor *y = ct_pow(a, b);
        assert_non_null(y);
        assert_int_equal(ct_tensor_dtype(y), dt);
        double *v = tu_values(y);
        for (int i = 0; i < 10; i++) {
            /* Reference: repeated multiplication wrapping in the dtype's width. */
            int64_t r;
            if (ex[i] < 0) r = base[i] == 1 ? 1 : base[i] == -1 ? (((int64_t)ex[i] & 1) ? -1 : 1) : 0;
            else {
                uint64_t acc = 1;
                for (int k = 0; k < (int)ex[i]; k++) acc *= (uint64_t)(int64_t)base[i];
                r = dt == CT_I32 ? (int64_t)(int32_t)(uint32_t)acc : (int64_t)acc;
            }
            if (v[i] != (double)r)
                fprintf(stderr, "pow %g^%g: got %g want %lld\n", base[i], ex[i], v[i], (long long)r);
            assert_true(v[i] == (double)r);
        }
        free(v);
        ct_tensor_release(y);
        ct_tensor_release(a);
        ct_tensor_release(b);
    }
}

/* ---- NaN ---------------------------------------------------------------------------------- */
static void test_nan(void **state) {
    (void)state;
    const double av[] = {NAN, 1, NAN, -2, INFINITY};
    const double bv[] = {1, NAN, NAN, 3, -INFINITY};
    static const int64_t s5[] = {5};
    for (int d = 0; d < N_FLOAT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        ct_tensor *a = tu_from_f64(av, CT_SHAPE(5), dt);
        ct_tensor *b = tu_from_f64(bv, CT_SHAPE(5), dt);
        const double rmax[] = {NAN, NAN, NAN, 3, INFINITY}, rmin[] = {NAN, NAN, NAN, -2, -INFINITY};
        ct_tensor *y = ct_maximum(a, b);
        check_tensor(y, dt, 1, s5, rmax, 0, 0);
        ct_tensor_release(y);
        y = ct_minimum(a, b);
        check_tensor(y, dt, 1, s5, rmin, 0, 0);
        ct_tensor_release(y);
        y = ct_maximum_scalar(a, 0);
        const double rms[] = {NAN, 1, NAN, 0, INFINITY};
        check_tensor(y, dt, 1, s5, rms, 0, 0);
        ct_tensor_release(y);
        const double rrelu[] = {NAN, 1, NAN, 0, INFINITY};
        y = ct_relu(a);
        check_tensor(y, dt, 1, s5, rrelu, 0, 0);
        ct_tensor_release(y);
        const double rsign[] = {0, 1, 0, -1, 1}; /* PyTorch: sign(NaN) = 0 */
        y = ct_sign(a);
        check_tensor(y, dt, 1, s5, rsign, 0, 0);
        ct_tensor_release(y);
        const double rclamp[] = {NAN, 1, NAN, -1, 1.5};
        y = ct_clamp(a, -1, 1.5);
        check_tensor(y, dt, 1, s5, rclamp, 0, 0);
        ct_tensor_release(y);
        const double rallnan[] = {NAN, NAN, NAN, NAN, NAN};
        y = ct_clamp(a, NAN, 1);
        check_tensor(y, dt, 1, s5, rallnan, 0, 0);
        ct_tensor_release(y);
        const double req[] = {0, 0, 0, 0, 0}, rne[] = {1, 1, 1, 1, 1};
        y = ct_eq(a, b);
        check_tensor(y, CT_BOOL, 1, s5, req, 0, 0);
        ct_tensor_release(y);
        y = ct_ne(a, b);
        check_tensor(y, CT_BOOL, 1, s5, rne, 0, 0);
        ct_tensor_release(y);
        ct_tensor_release(a);
        ct_tensor_release(b);
    }
}

/* ---- where and clamp ------------------------------------------------------------------------ */
static void test_where(void **state) {
    (void)state;
    static const int64_t sc[] = {4, 1, 6}, sa[] = {3, 1}, sb[] = {6};
    for (int i = 0; i < N_ALL; i++) {
        for (int j = 0; j < N_ALL; j += 2) {
            ct_dtype da = tu_all_dtypes[i], db = tu_all_dtypes[(i + j) % N_ALL];
            double *vc, *va, *vb;
            ct_tensor *c = maybe_noncontig(tu_rand(3, sc, CT_BOOL, 0, 2, &vc), j & 2);
            ct_tensor *a = maybe_noncontig(tu_rand(2, sa, da, -9, 9, &va), j & 2);
            ct_tensor *b = tu_rand(1, sb, db, -9, 9, &vb);
            ct_tensor *ab[2] = {a, b};
            ct_dtype rt = cti_result_type(2, ab);
            int64_t sh[] = {4, 3, 6};
            double ref[72];
            for (int64_t k = 0; k < 72; k++) {
                double cv = vc[bcast_index(k, 3, sh, 3, sc)];
                ref[k] = tu_round(cv != 0 ? va[bcast_index(k, 3, sh, 2, sa)]
                                          : vb[bcast_index(k, 3, sh, 1, sb)],
                                  rt);
            }
            ct_tensor *y = ct_where(c, a, b);
            check_tensor(y, rt, 3, sh, ref, 0, 0);
            ct_tensor_release(y);
            ct_tensor_release(a);
            ct_tensor_release(b);
            ct_tensor_release(c);
            free(vc);
            free(va);
            free(vb);
        }
    }
    ct_tensor *f = tu_rand(CT_SHAPE(3), CT_F32, -1, 1, NULL);
    ct_tensor *i = tu_rand(CT_SHAPE(3), CT_I32, -1, 1, NULL);
    ct_tensor *b4 = tu_rand(CT_SHAPE(4), CT_BOOL, 0, 2, NULL);
    tu_assert_null_error(ct_where(f, f, f), CT_ERR_DTYPE, "ct_where", "bool", "float32");
    tu_assert_null_error(ct_where(i, f, f), CT_ERR_DTYPE, "ct_where", "int32");
    tu_assert_null_error(ct_where(b4, f, f), CT_ERR_SHAPE, "ct_where");
    tu_assert_null_error(ct_where(b4, NULL, f), CT_ERR_INVALID_ARG, "ct_where");
    ct_tensor_release(f);
    ct_tensor_release(i);
    ct_tensor_release(b4);
}

static double clamp_ref(double x, double lo, double hi) {
    if (isnan(x)) return x;
    double t = x < lo ? lo : x;
    return t > hi ? hi : t;
}

static void test_clamp(void **state) {
    (void)state;
    static const int64_t s2[] = {6, 7};
    const double bounds[][2] = {{-1, 1}, {-INFINITY, 0.5}, {-0.25, INFINITY}, {1, -1},
                                {-2.5, 2.5}, {-INFINITY, INFINITY}};
    for (int d = 0; d < 6; d++) {
        ct_dtype dt = tu_all_dtypes[d];
        for (int k = 0; k < 6; k++) {
            double lo = bounds[k][0], hi = bounds[k][1];
            double *v;
            ct_tensor *x = maybe_noncontig(tu_rand(2, s2, dt, -4, 4, &v), k & 1);
            /* Integers with a bound that has a fraction: a float32 result,
             * as PyTorch's Python-float bounds give, which in place is refused. */
            bool promote = !ct_dtype_is_floating(dt) && ((isfinite(lo) && lo != floor(lo)) ||
                                                         (isfinite(hi) && hi != floor(hi)));
            ct_dtype rdt = promote ? CT_F32 : dt;
            double ref[42];
            for (int i = 0; i < 42; i++) ref[i] = tu_round(clamp_ref(v[i], lo, hi), rdt);
            ct_tensor *y = ct_clamp(x, lo, hi);
            double tol = ct_dtype_is_floating(rdt) ? tol_of(rdt) : 0;
            check_tensor(y, rdt, 2, s2, ref, tol, 0);
            ct_tensor_release(y);
            if (promote) {
                tu_assert_error(ct_clamp_(x, lo, hi), CT_ERR_DTYPE, "ct_clamp_", "float32");
                for (int i = 0; i < 42; i++) ref[i] = v[i];
            } else {
                assert_int_equal(ct_clamp_(x, lo, hi), CT_OK);
            }
            check_tensor(x, dt, 2, s2, ref, tol, 0);
            ct_tensor_release(x);
            free(v);
        }
    }
    ct_tensor *b = tu_rand(CT_SHAPE(3), CT_BOOL, 0, 2, NULL);
    ct_tensor *i = tu_rand(CT_SHAPE(3), CT_I32, -3, 3, NULL);
    tu_assert_null_error(ct_clamp(b, 0, 1), CT_ERR_DTYPE, "ct_clamp", "bool");
    tu_assert_null_error(ct_clamp(i, NAN, 1), CT_ERR_INVALID_ARG, "ct_clamp", "NaN");
    tu_assert_error(ct_clamp_(b, 0, 1), CT_ERR_DTYPE, "ct_clamp_", "bool");
    tu_assert_null_error(ct_clamp(NULL, 0, 1), CT_ERR_INVALID_ARG, "ct_clamp");
    /* Huge bounds saturate to the integer range. */
    ct_tensor *y = ct_clamp(i, -1e300, 1e300);
    double *vi = tu_values(i), *vy = tu_values(y);
    for (int k = 0; k < 3; k++) assert_true(vi[k] == vy[k]);
    free(vi);
    free(vy);
    ct_tensor_release(y);
    ct_tensor_release(b);
    ct_tensor_release(i);
}

/* ---- in place ---------------------------------------------------------------------------- */
typedef ct_status (*ip_fn)(ct_tensor *, ct_tensor *);
typedef struct ip_case {
    const char *name;
    ip_fn fn;
    bin_ref ref;
} ip_case;

static unsigned version_of(const ct_tensor *t) { return atomic_load(&t->storage->version); }

static void test_inplace_binary(void **state) {
    (void)state;
    const ip_case cases[] = {{"add_", ct_add_, r_add}, {"sub_", ct_sub_, r_sub},
                             {"mul_", ct_mul_, r_mul}, {"div_", ct_div_, r_div},
                             {"pow_", ct_pow_, r_pow}};
    static const int64_t sa[] = {5, 3, 4}, sb[] = {3, 1};
    for (size_t k = 0; k < 5; k++) {
        for (int d = 0; d < N_FLOAT; d++) {
            for (int bd = 0; bd < 3; bd++) {
                ct_dtype dt = tu_float_dtypes[d];
                ct_dtype dtb = bd == 0 ? dt : bd == 1 ? CT_I32 : CT_F64;
                double *va, *vb;
                bool is_pow = cases[k].fn == ct_pow_;
                ct_tensor *a = maybe_noncontig(tu_rand(3, sa, dt, is_pow ? 0.5 : -3, 3, &va), true);
                ct_tensor *b = maybe_noncontig(
                    tu_rand(2, sb, dtb, is_pow ? -2 : 1, 3, &vb), bd != 1);
                ct_tensor *ab[2] = {a, b};
                ct_dtype rt = cti_result_type(2, ab);
                double ref[60];
                for (int i = 0; i < 60; i++) {
                    double r = cases[k].ref(va[i], vb[(i / 4) % 3]);
                    /* A wider result type rounds there first, then into a. */
                    ref[i] = tu_round(tu_round(r, rt), dt);
                }
                unsigned v0 = version_of(a);
                assert_int_equal(cases[k].fn(a, b), CT_OK);
                assert_true(version_of(a) != v0);
                double tol = tol_of(dt);
                check_tensor(a, dt, 3, sa, ref, tol, tol);
                ct_tensor_release(a);
                ct_tensor_release(b);
                free(va);
                free(vb);
            }
        }
    }
    /* Integer destinations. */
    double *va, *vb;
    ct_tensor *a = maybe_noncontig(tu_rand(CT_SHAPE(4, 6), CT_I64, -50, 50, &va), true);
    ct_tensor *b = tu_rand(CT_SHAPE(6), CT_I32, -50, 50, &vb);
    assert_int_equal(ct_mul_(a, b), CT_OK);
    double ref[24];
    for (int i = 0; i < 24; i++) ref[i] = va[i] * vb[i % 6];
    static const int64_t s46[] = {4, 6};
    check_tensor(a, CT_I64, 2, s46, ref, 0, 0);
    assert_int_equal(ct_add_alpha_(a, b, -2), CT_OK);
    for (int i = 0; i < 24; i++) ref[i] -= 2 * vb[i % 6];
    check_tensor(a, CT_I64, 2, s46, ref, 0, 0);
    ct_tensor *bb = tu_rand(CT_SHAPE(6), CT_BOOL, 0, 2, NULL);
    double *vbb = tu_values(bb);
    assert_int_equal(ct_add_(a, bb), CT_OK);
    for (int i = 0; i < 24; i++) ref[i] += vbb[i % 6];
    check_tensor(a, CT_I64, 2, s46, ref, 0, 0);
    free(vbb);
    ct_tensor_release(bb);
    ct_tensor_release(a);
    ct_tensor_release(b);
    free(va);
    free(vb);
}

static void test_inplace_errors(void **state) {
    (void)state;
    ct_tensor *a31 = tu_rand(CT_SHAPE(3, 1), CT_F32, -1, 1, NULL);
    ct_tensor *b34 = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
    ct_tensor *i34 = tu_rand(CT_SHAPE(3, 4), CT_I32, -5, 5, NULL);
    ct_tensor *b4 = tu_rand(CT_SHAPE(4), CT_BOOL, 0, 2, NULL);
    double *before = tu_values(a31);
    tu_assert_error(ct_add_(a31, b34), CT_ERR_SHAPE, "ct_add_", "output with shape [3, 1]",
                    "doesn't match the broadcast shape [3, 4]");
    double *after = tu_values(a31);
    for (int i = 0; i < 3; i++) assert_true(before[i] == after[i]);
    free(before);
    free(after);
    tu_assert_error(ct_add_(i34, b34), CT_ERR_DTYPE, "ct_add_", "float32", "int32");
    tu_assert_error(ct_div_(i34, i34), CT_ERR_DTYPE, "ct_div_", "float32", "int32");
    tu_assert_error(ct_mul_scalar_(i34, 2.5), CT_ERR_DTYPE, "ct_mul_scalar_", "float32",
                    "int32");
    assert_int_equal(ct_add_(b4, b4), CT_OK); /* bool += bool is allowed */
    tu_assert_error(ct_add_scalar_(b4, 1), CT_ERR_DTYPE, "ct_add_scalar_", "int64", "bool");
    tu_assert_error(ct_exp_(i34), CT_ERR_DTYPE, "ct_exp_", "float32", "int32");
    tu_assert_error(ct_sqrt_(i34), CT_ERR_DTYPE, "ct_sqrt_");
    tu_assert_error(ct_add_alpha_(i34, i34, 0.5), CT_ERR_INVALID_ARG, "ct_add_alpha_", "alpha");
    tu_assert_error(ct_add_(NULL, b34), CT_ERR_INVALID_ARG, "ct_add_");
    tu_assert_error(ct_add_scalar_(NULL, 1), CT_ERR_INVALID_ARG, "ct_add_scalar_");
    /* An expanded destination repeats memory. */
    ct_tensor *e = ct_expand(a31, CT_SHAPE(3, 4));
    tu_assert_error(ct_add_(e, b34), CT_ERR_INVALID_ARG, "ct_add_", "memory");
    tu_assert_error(ct_relu_(e), CT_ERR_INVALID_ARG, "ct_relu_");
    ct_tensor_release(e);
    ct_tensor_release(a31);
    ct_tensor_release(b34);
    ct_tensor_release(i34);
    ct_tensor_release(b4);
}

/* b a view of a in another layout: the result must be as if b were read
 * before any write. The reference is computed in float arithmetic (each step
 * rounds as the kernel does). */
static void check_f32(ct_tensor *t, const float *ref, int64_t n) {
    double *v = tu_values(t);
    for (int64_t i = 0; i < n; i++) {
        if (v[i] != (double)ref[i]) fprintf(stderr, "element %lld: got %.9g, expected %.9g\n",
                                            (long long)i, v[i], (double)ref[i]);
        assert_true(v[i] == (double)ref[i]);
    }
    free(v);
}

static void test_inplace_alias(void **state) {
    (void)state;
    double *va;
    ct_tensor *a = tu_rand(CT_SHAPE(6, 6), CT_F32, -3, 3, &va);
    float x[36], ref[36];
    for (int i = 0; i < 36; i++) x[i] = (float)va[i];
    ct_tensor *at = ct_transpose(a, 0, 1);
    assert_int_equal(ct_add_(a, at), CT_OK);
    for (int i = 0; i < 6; i++)
        for (int j = 0; j < 6; j++) ref[i * 6 + j] = x[i * 6 + j] + x[j * 6 + i];
    check_f32(a, ref, 36);
    ct_tensor_release(at);
    /* Same layout: a *= a. */
    for (int i = 0; i < 36; i++) ref[i] = ref[i] * ref[i];
    assert_int_equal(ct_mul_(a, a), CT_OK);
    check_f32(a, ref, 36);
    /* A row of a broadcast over a. */
    ct_tensor *row = ct_select(a, 0, 2);
    float r2[6];
    for (int j = 0; j < 6; j++) r2[j] = ref[12 + j];
    for (int i = 0; i < 36; i++) ref[i] = ref[i] - r2[i % 6];
    assert_int_equal(ct_sub_(a, row), CT_OK);
    check_f32(a, ref, 36);
    ct_tensor_release(row);
    ct_tensor_release(a);
    free(va);
}

static void test_inplace_unary_scalar(void **state) {
    (void)state;
    static const int64_t s2[] = {5, 7};
    for (int d = 0; d < N_FLOAT; d++) {
        ct_dtype dt = tu_float_dtypes[d];
        double *v;
        ct_tensor *x = maybe_noncontig(tu_rand(2, s2, dt, 0.1, 3, &v), true);
        double ref[35];
        double tol = tol_of(dt);
        assert_int_equal(ct_neg_(x), CT_OK);
        for (int i = 0; i < 35; i++) ref[i] = -v[i];
        check_tensor(x, dt, 2, s2, ref, tol, tol);
        assert_int_equal(ct_relu_(x), CT_OK);
        for (int i = 0; i < 35; i++) ref[i] = 0;
        check_tensor(x, dt, 2, s2, ref, tol, tol);
        assert_int_equal(ct_add_scalar_(x, 2.25), CT_OK);
        assert_int_equal(ct_mul_scalar_(x, 3), CT_OK);
        assert_int_equal(ct_sub_scalar_(x, 0.75), CT_OK);
        assert_int_equal(ct_div_scalar_(x, 2), CT_OK);
        assert_int_equal(ct_sqrt_(x), CT_OK);
        assert_int_equal(ct_exp_(x), CT_OK);
        double e = tu_round(exp(tu_round(sqrt(tu_round((2.25 * 3 - 0.75) / 2, dt)), dt)), dt);
        for (int i = 0; i < 35; i++) ref[i] = e;
        check_tensor(x, dt, 2, s2, ref, 2 * tol, tol);
        ct_tensor_release(x);
        free(v);
    }
    /* Integer destination: integral scalars stay exact. */
    double *v;
    ct_tensor *x = maybe_noncontig(tu_rand(CT_SHAPE(3, 4), CT_I32, -20, 20, &v), true);
    assert_int_equal(ct_mul_scalar_(x, -3), CT_OK);
    assert_int_equal(ct_sub_scalar_(x, 7), CT_OK);
    assert_int_equal(ct_relu_(x), CT_OK);
    double ref[12];
    for (int i = 0; i < 12; i++) ref[i] = fmax(v[i] * -3 - 7, 0);
    static const int64_t s34[] = {3, 4};
    check_tensor(x, CT_I32, 2, s34, ref, 0, 0);
    ct_tensor_release(x);
    free(v);
}

/* ---- threads and the parallel path ------------------------------------------------------ */
typedef struct cover_ctx {
    atomic_int *hits;
    atomic_int chunks;
    atomic_int bad_nested; /* nested calls that did not run inline in one piece */
} cover_ctx;

static void count_fn(int64_t b, int64_t e, void *ctx) {
    (void)b;
    (void)e;
    ++*(int *)ctx;
}
static void cover_fn(int64_t b, int64_t e, void *ctx) {
    cover_ctx *c = ctx;
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
    atomic_fetch_add(&c->chunks, 1);
    int calls = 0;
    cti_parallel_for(100000, 1, count_fn, &calls);
    if (calls != 1) atomic_fetch_add(&c->bad_nested, 1);
}

static void test_parallel_for(void **state) {
    (void)state;
    const int64_t ns[] = {1, 7, 1000, 100003};
    const int64_t grains[] = {1, 10, 4096};
    for (int t = 1; t <= 3; t++) {
        assert_int_equal(ct_set_num_threads(t), CT_OK);
        for (int i = 0; i < 4; i++) {
            for (int g = 0; g < 3; g++) {
                int64_t n = ns[i];
                atomic_int *hits = calloc((size_t)n, sizeof(atomic_int));
                cover_ctx c = {hits, 0, 0};
                cti_parallel_for(n, grains[g], cover_fn, &c);
                for (int64_t k = 0; k < n; k++) assert_int_equal(atomic_load(&hits[k]), 1);
                /* Chunks hold at least grain indices and never exceed the threads;
                 * calls made from inside them run inline. */
                int calls = atomic_load(&c.chunks);
                if (calls > 1) assert_int_equal(atomic_load(&c.bad_nested), 0);
                if (t > 1 && n >= 2 * grains[g]) assert_true(calls >= 2);
                assert_true(calls >= 1 && calls <= t);
                assert_true(calls == 1 || n / calls >= grains[g]);
                free(hits);
            }
        }
    }
    assert_int_equal(ct_set_num_threads(2), CT_OK);
}

static void test_threads_setting(void **state) {
    (void)state;
    int n0 = ct_get_num_threads();
    assert_true(n0 >= 1);
    tu_assert_error(ct_set_num_threads(0), CT_ERR_INVALID_ARG, "ct_set_num_threads", "0");
    tu_assert_error(ct_set_num_threads(-3), CT_ERR_INVALID_ARG, "ct_set_num_threads", "-3");
    assert_int_equal(ct_get_num_threads(), n0);
    assert_int_equal(ct_set_num_threads(1), CT_OK);
    assert_int_equal(ct_get_num_threads(), 1);
    assert_int_equal(ct_set_num_threads(2), CT_OK);
    assert_int_equal(ct_get_num_threads(), 2);
    assert_int_equal(ct_set_num_threads(n0), CT_OK);
}

/* Above CTI_GRAIN elements the work splits over the pool; non-contiguous and
 * broadcast operands take the general iterator there. Results must match the
 * reference and be bitwise the same with 1 and 2 threads. */
static void test_parallel_large(void **state) {
    (void)state;
    static const int64_t sa[] = {257, 301}, sb[] = {301};
    const int64_t n = 257 * 301;
    assert_true(n > CTI_GRAIN);
    for (int d = 0; d < N_FLOAT + 1; d++) {
        ct_dtype dt = d < N_FLOAT ? tu_float_dtypes[d] : CT_I32;
        double *va, *vb;
        ct_tensor *a = maybe_noncontig(tu_rand(2, sa, dt, -3, 3, &va), true);
        ct_tensor *b = tu_rand(1, sb, dt, -3, 3, &vb);
        double *ref = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) ref[i] = tu_round(va[i] * vb[i % 301], dt);
        ct_tensor *r[2];
        for (int t = 0; t < 2; t++) {
            assert_int_equal(ct_set_num_threads(t + 1), CT_OK);
            r[t] = ct_mul(a, b);
            double tol = ct_dtype_is_floating(dt) ? tol_of(dt) : 0;
            check_tensor(r[t], dt, 2, sa, ref, tol, tol);
        }
        double *v0 = tu_values(r[0]), *v1 = tu_values(r[1]);
        assert_memory_equal(v0, v1, sizeof(double) * (size_t)n);
        free(v0);
        free(v1);
        ct_tensor_release(r[0]);
        ct_tensor_release(r[1]);
        if (ct_dtype_is_floating(dt)) {
            /* A unary op and an in-place op on a non-contiguous destination. */
            ct_tensor *y = ct_tanh(a);
            for (int64_t i = 0; i < n; i++) ref[i] = tu_round(tanh(va[i]), dt);
            check_tensor(y, dt, 2, sa, ref, tol_of(dt), tol_of(dt));
            ct_tensor_release(y);
            assert_int_equal(ct_add_(a, b), CT_OK);
            for (int64_t i = 0; i < n; i++) ref[i] = tu_round(va[i] + vb[i % 301], dt);
            check_tensor(a, dt, 2, sa, ref, tol_of(dt), tol_of(dt));
            /* Contiguous large operands: the flat path, split. */
            ct_tensor *ca = ct_contiguous(a);
            ct_tensor *y2 = ct_sub(ca, ca);
            for (int64_t i = 0; i < n; i++) ref[i] = 0;
            check_tensor(y2, dt, 2, sa, ref, 0, 0);
            ct_tensor_release(y2);
            ct_tensor_release(ca);
        }
        ct_tensor_release(a);
        ct_tensor_release(b);
        free(ref);
        free(va);
        free(vb);
    }
    assert_int_equal(ct_set_num_threads(2), CT_OK);
}

/* ---- kernels registered only where they make sense --------------------------------------- */
static void test_registration(void **state) {
    (void)state;
    assert_true(ct_supports(CT_OP_EXP, CT_DEVICE_CPU, CT_F16));
    assert_true(ct_supports(CT_OP_ADD, CT_DEVICE_CPU, CT_BOOL));
    assert_false(ct_supports(CT_OP_EXP, CT_DEVICE_CPU, CT_I32));
    assert_false(ct_supports(CT_OP_DIV, CT_DEVICE_CPU, CT_I64));
    assert_false(ct_supports(CT_OP_NEG, CT_DEVICE_CPU, CT_BOOL));
    assert_true(ct_supports(CT_OP_WHERE, CT_DEVICE_CPU, CT_BF16));
    assert_true(ct_supports(CT_OP_GELU_TANH, CT_DEVICE_CPU, CT_BF16));
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_unary_float, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unary_f32_ulp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sin_cos_ulp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unary_int, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unary_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logical_not, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary_same_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binary_mixed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gelu_backward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gelu_backward_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gelu_backward_autograd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gelu_backward_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_backward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_backward_points, setup, teardown),
        cmocka_unit_test_setup_teardown(test_relu_backward_autograd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threshold_backward_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_promotion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scalar_ops, setup, teardown),
        cmocka_unit_test_setup_teardown(test_add_alpha, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bool_arith, setup, teardown),
        cmocka_unit_test_setup_teardown(test_int_pow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_where, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clamp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inplace_binary, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inplace_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inplace_alias, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inplace_unary_scalar, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parallel_for, setup, teardown),
        cmocka_unit_test_setup_teardown(test_threads_setting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_parallel_large, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registration, setup, teardown),
    };
    return tu_run_tests(tests);
}
