/* Autograd of convolution and pooling: gradchecks of conv2d over every option
 * (stride, padding, dilation, groups and depthwise, non-square kernels, with
 * and without bias, 3-d input, non-contiguous operands, partial
 * requires_grad), of max pooling on distinct values (so finite differences
 * never flip the argmax), average and adaptive average pooling over their
 * options, and of a small CNN end to end; then reduced-precision gradients,
 * accumulation, reuse of one tensor, what records nothing, saved-tensor
 * versions, failures and memory. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

/* ---- fixtures: every test must leave no tensor or storage alive ---------------------- */

/* ---- helpers ------------------------------------------------------------------------- */

/* A two-element parameter (kernel, stride, padding, dilation). */
#define P2(a, b) ((const int64_t[]){a, b})
static const int64_t S1[2] = {1, 1}, S2[2] = {2, 2}, S12[2] = {1, 2}, S21[2] = {2, 1};

/* t made non-contiguous (same values) when nc, then requiring grad when rg. */
static ct_tensor *finish(ct_tensor *t, shp s, bool nc, bool rg) {
    assert_non_null(t);
    if (nc) {
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        t = v;
        assert_non_null(t);
        if (tu_numel(s.nd, s.s) > 1) assert_false(ct_tensor_is_contiguous(t));
    }
    if (rg) assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

/* A random float64 tensor in [-1, 1). */
static ct_tensor *rand_t(shp s, bool nc, bool rg) {
    return finish(tu_rand(s.nd, s.s, CT_F64, -1, 1, NULL), s, nc, rg);
}

/* n distinct values, spaced at least 1/n apart in [-1, 1], in random order. */
static double *distinct_vals(int64_t n) {
    double *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = -1 + 2 * (i + tu_uniform(0.25, 0.75)) / (double)n;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = tu_randint(0, i + 1);
        double t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
    return v;
}

/* A float64 tensor of distinct values: no ties for max pooling to break. */
static ct_tensor *distinct_t(shp s, bool nc, bool rg) {
    double *v = distinct_vals(tu_numel(s.nd, s.s));
    ct_tensor *t = tu_from_f64(v, s.nd, s.s, CT_F64);
    free(v);
    return finish(t, s, nc, rg);
}

/* Asserts got (any float dtype) is close to ref (float64) up to tol times the
 * largest magnitude of ref. */
static void check_close_scaled(const ct_tensor *got, const ct_tensor *ref, double tol) {
    assert_non_null(got);
    assert_non_null(ref);
    int64_t n = ct_tensor_numel(ref);
    assert_int_equal(ct_tensor_numel(got), n);
    double *g = tu_values(got), *r = tu_values(ref);
    double scale = 0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(r[i]));
    tu_assert_close(g, r, n, 0, tol * (scale > 0 ? scale : 1));
    free(g);
    free(r);
}

/* ---- conv2d ---------------------------------------------------------------------------- */

typedef struct conv_case {
    const char *name;
    shp x, w;
    bool bias;
    int64_t stride[2], padding[2], dilation[2], groups;
} conv_case;

static ct_tensor *gc_conv(ct_tensor *const *in, void *v) {
    const conv_case *c = v;
    return ct_conv2d(in[0], in[1], c->bias ? in[2] : NULL, c->stride, c->padding, c->dilation,
                     c->groups);
}

static const conv_case conv_cases[] = {
    {"plain", SHP(2, 3, 5, 6), SHP(4, 3, 3, 3), true, {1, 1}, {0, 0}, {1, 1}, 1},
    {"stride", SHP(2, 2, 7, 6), SHP(3, 2, 3, 2), true, {2, 3}, {0, 0}, {1, 1}, 1},
    {"padding", SHP(1, 2, 4, 5), SHP(3, 2, 3, 3), false, {1, 1}, {1, 2}, {1, 1}, 1},
    {"stride+padding", SHP(2, 2, 6, 5), SHP(2, 2, 3, 3), true, {2, 2}, {1, 1}, {1, 1}, 1},
    {"dilation", SHP(1, 2, 7, 7), SHP(2, 2, 3, 2), true, {1, 1}, {1, 0}, {2, 3}, 1},
    {"groups", SHP(2, 4, 5, 5), SHP(6, 2, 2, 3), true, {1, 2}, {1, 0}, {1, 1}, 2},
    {"depthwise", SHP(2, 3, 5, 4), SHP(3, 1, 3, 3), false, {1, 1}, {1, 1}, {1, 1}, 3},
    {"depthwise x2", SHP(1, 2, 6, 6), SHP(4, 1, 3, 3), true, {2, 1}, {0, 1}, {2, 1}, 2},
    {"non-square 1x4", SHP(1, 2, 3, 7), SHP(2, 2, 1, 4), true, {1, 2}, {0, 1}, {1, 1}, 1},
    {"3-d input", SHP(3, 5, 5), SHP(2, 3, 2, 3), true, {2, 1}, {1, 1}, {1, 1}, 1},
    {"3-d grouped", SHP(4, 5, 4), SHP(2, 2, 3, 2), false, {1, 1}, {1, 0}, {1, 2}, 2},
    {"1x1", SHP(2, 3, 3, 4), SHP(5, 3, 1, 1), true, {1, 1}, {0, 0}, {1, 1}, 1},
};
#define NCONV (int)(sizeof conv_cases / sizeof conv_cases[0])

/* Every case with contiguous and non-contiguous operands. */
static void test_gradcheck_conv2d(void **state) {
    (void)state;
    char what[128];
    for (int k = 0; k < NCONV; k++)
        for (int nc = 0; nc < 2; nc++) {
            const conv_case *c = &conv_cases[k];
            ct_tensor *in[3] = {rand_t(c->x, nc, true), rand_t(c->w, nc, true),
                                c->bias ? rand_t((shp)SHP(c->w.s[0]), nc, true) : NULL};
            ct_tensor *y = gc_conv(in, (void *)c);
            assert_non_null(y);
            assert_string_equal(ct_grad_fn_name(y), "ConvolutionBackward");
            assert_int_equal(ct_tensor_ndim(y), c->x.nd);
            ct_tensor_release(y);
            snprintf(what, sizeof what, "conv2d %s%s", c->name, nc ? " non-contiguous" : "");
            gradcheck_ok(what, gc_conv, (void *)c, c->bias ? 3 : 2, in);
            release_all(3, in);
        }
}

/* Only some operands require grad: each gets its gradient, the others none
 * (the node then saves only what those gradients need). */
static void test_gradcheck_conv2d_partial(void **state) {
    (void)state;
    const conv_case *c = &conv_cases[5]; /* groups */
    char what[64];
    for (int mask = 1; mask < 8; mask++) {
        ct_tensor *in[3];
        shp shapes[3] = {c->x, c->w, SHP(c->w.s[0])};
        for (int k = 0; k < 3; k++) in[k] = rand_t(shapes[k], k == 1, mask >> k & 1);
        snprintf(what, sizeof what, "conv2d requires_grad mask %d", mask);
        gradcheck_ok(what, gc_conv, (void *)c, 3, in);
        for (int k = 0; k < 3; k++) {
            if (mask >> k & 1) check_shape(ct_grad(in[k]), shapes[k].nd, shapes[k].s);
            else assert_null(ct_grad(in[k]));
        }
        release_all(3, in);
    }
}

/* A batch of zero images: the weight and bias get zero gradients, through
 * pooling too. */
static void test_conv2d_empty_batch(void **state) {
    (void)state;
    ct_tensor *x = rand_t((shp)SHP(0, 2, 4, 4), false, true);
    ct_tensor *w = rand_t((shp)SHP(3, 2, 3, 3), false, true);
    ct_tensor *b = rand_t((shp)SHP(3), false, true);
    ct_tensor *y = ct_conv2d(x, w, b, NULL, P2(1, 1), NULL, 1);
    check_shape(y, 4, (const int64_t[]){0, 3, 4, 4});
    /* the pooling backwards take empty batches too */
    ct_scope *sc = ct_scope_begin();
    ct_tensor *p = ct_max_pool2d(y, P2(2, 2), NULL, NULL, NULL, false, NULL);
    p = ct_adaptive_avg_pool2d(ct_avg_pool2d(p, P2(2, 2), S1, NULL, true, false), 2, 2);
    ct_tensor *s = ct_keep(ct_sum(p, 0, NULL, false));
    ct_scope_end(sc);
    assert_int_equal(ct_backward(s, NULL, false), CT_OK);
    double zeros[54] = {0};
    double *gw = tu_values(ct_grad(w)), *gb = tu_values(ct_grad(b));
    tu_assert_close(gw, zeros, 54, 0, 0);
    tu_assert_close(gb, zeros, 3, 0, 0);
    free(gw);
    free(gb);
    check_shape(ct_grad(x), 4, (const int64_t[]){0, 2, 4, 4});
    ct_tensor *ts[5] = {x, w, b, y, s};
    release_all(5, ts);
}

/* ---- pooling ----------------------------------------------------------------------------- */

typedef enum pk { P_MAX, P_AVG, P_ADAPTIVE } pk;

typedef struct pool_case {
    const char *name;
    pk kind;
    shp x;
    int64_t kernel[2];
    const int64_t *stride; /* NULL: the kernel size */
    int64_t padding[2], dilation[2];
    bool ceil_mode, count_include_pad, want_indices;
} pool_case;

static ct_tensor *run_pool(ct_tensor *x, const pool_case *c) {
    ct_tensor *idx = NULL, *y = NULL;
    switch (c->kind) {
    case P_MAX:
        y = ct_max_pool2d(x, c->kernel, c->stride, c->padding, c->dilation, c->ceil_mode,
                          c->want_indices ? &idx : NULL);
        if (c->want_indices && y) {
            assert_non_null(idx);
            assert_int_equal(ct_tensor_dtype(idx), CT_I64);
            assert_false(ct_requires_grad(idx));
            ct_tensor_release(idx);
        }
        return y;
    case P_AVG:
        return ct_avg_pool2d(x, c->kernel, c->stride, c->padding, c->ceil_mode,
                             c->count_include_pad);
    case P_ADAPTIVE: return ct_adaptive_avg_pool2d(x, c->kernel[0], c->kernel[1]);
    }
    return NULL;
}

static ct_tensor *gc_pool(ct_tensor *const *in, void *v) { return run_pool(in[0], v); }

static const pool_case pool_cases[] = {
    {"max 2x2", P_MAX, SHP(2, 2, 4, 6), {2, 2}, NULL, {0, 0}, {1, 1}, false, false, true},
    {"max 3x3 s2 p1", P_MAX, SHP(1, 3, 5, 6), {3, 3}, S2, {1, 1}, {1, 1}, false, false, false},
    {"max overlapping", P_MAX, SHP(2, 1, 5, 5), {3, 2}, S1, {1, 0}, {1, 1}, false, false, true},
    {"max non-square", P_MAX, SHP(1, 2, 5, 7), {2, 3}, S12, {1, 1}, {1, 1}, false, false, false},
    {"max dilation", P_MAX, SHP(1, 2, 6, 7), {2, 3}, S21, {1, 1}, {2, 2}, false, false, true},
    {"max ceil", P_MAX, SHP(2, 2, 5, 5), {2, 2}, NULL, {0, 0}, {1, 1}, true, false, false},
    {"max ceil p1", P_MAX, SHP(1, 2, 6, 6), {3, 3}, S2, {1, 1}, {1, 1}, true, false, true},
    {"max ceil dilation", P_MAX, SHP(1, 2, 7, 6), {2, 2}, S2, {1, 0}, {2, 1}, true, false,
     false},
    {"max 3-d", P_MAX, SHP(3, 5, 4), {2, 2}, S1, {1, 0}, {1, 1}, false, false, true},
    {"avg 2x2", P_AVG, SHP(2, 2, 4, 6), {2, 2}, NULL, {0, 0}, {1, 1}, false, true, false},
    {"avg p1 incl", P_AVG, SHP(1, 2, 5, 5), {3, 3}, S2, {1, 1}, {1, 1}, false, true, false},
    {"avg p1 excl", P_AVG, SHP(1, 2, 5, 5), {3, 3}, S2, {1, 1}, {1, 1}, false, false, false},
    {"avg ceil incl", P_AVG, SHP(2, 1, 5, 6), {2, 3}, S2, {1, 1}, {1, 1}, true, true, false},
    {"avg ceil excl", P_AVG, SHP(2, 1, 5, 6), {2, 3}, S2, {1, 1}, {1, 1}, true, false, false},
    {"avg ceil no pad", P_AVG, SHP(1, 2, 5, 7), {2, 2}, NULL, {0, 0}, {1, 1}, true, true, false},
    {"avg overlapping", P_AVG, SHP(1, 2, 5, 5), {3, 2}, S1, {0, 1}, {1, 1}, false, false, false},
    {"avg 3-d", P_AVG, SHP(2, 5, 6), {2, 3}, S21, {1, 1}, {1, 1}, true, false, false},
    {"adaptive 1x1", P_ADAPTIVE, SHP(2, 2, 5, 7), {1, 1}, NULL, {0, 0}, {1, 1}, 0, 0, 0},
    {"adaptive 2x3", P_ADAPTIVE, SHP(2, 2, 5, 7), {2, 3}, NULL, {0, 0}, {1, 1}, 0, 0, 0},
    {"adaptive 3x2", P_ADAPTIVE, SHP(1, 3, 5, 7), {3, 2}, NULL, {0, 0}, {1, 1}, 0, 0, 0},
    {"adaptive 4x4", P_ADAPTIVE, SHP(1, 2, 5, 7), {4, 4}, NULL, {0, 0}, {1, 1}, 0, 0, 0},
    {"adaptive identity", P_ADAPTIVE, SHP(1, 2, 5, 7), {5, 7}, NULL, {0, 0}, {1, 1}, 0, 0, 0},
    {"adaptive upsample", P_ADAPTIVE, SHP(1, 2, 3, 4), {5, 6}, NULL, {0, 0}, {1, 1}, 0, 0, 0},
    {"adaptive 3-d", P_ADAPTIVE, SHP(3, 6, 5), {4, 2}, NULL, {0, 0}, {1, 1}, 0, 0, 0},
};
#define NPOOL (int)(sizeof pool_cases / sizeof pool_cases[0])

static const char *const pool_fn_names[] = {"MaxPool2DWithIndicesBackward", "AvgPool2DBackward",
                                            "AdaptiveAvgPool2DBackward"};

static void test_gradcheck_pooling(void **state) {
    (void)state;
    char what[128];
    for (int k = 0; k < NPOOL; k++)
        for (int nc = 0; nc < 2; nc++) {
            const pool_case *c = &pool_cases[k];
            ct_tensor *x = distinct_t(c->x, nc, true);
            ct_tensor *y = run_pool(x, c);
            assert_non_null(y);
            assert_true(ct_requires_grad(y));
            assert_string_equal(ct_grad_fn_name(y), pool_fn_names[c->kind]);
            ct_tensor_release(y);
            snprintf(what, sizeof what, "%s%s", c->name, nc ? " non-contiguous" : "");
            gradcheck_ok(what, gc_pool, (void *)c, 1, &x);
            ct_tensor_release(x);
        }
}

/* The max pooling gradient routes each output's gradient to its argmax,
 * summing where windows overlap on one maximum. */
static void test_max_pool2d_grad_values(void **state) {
    (void)state;
    /* one plane 3x4; windows 2x2 with stride 1 */
    double xv[12] = {1, 5, 2, 0, 3, 4, 9, 1, 0, 8, 2, 7};
    ct_tensor *x = tu_from_f64(xv, 4, (const int64_t[]){1, 1, 3, 4}, CT_F64);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *y = ct_max_pool2d(x, P2(2, 2), S1, NULL, NULL, false, NULL);
    check_shape(y, 4, (const int64_t[]){1, 1, 2, 3});
    double gv[6] = {1, 2, 3, 4, 5, 6};
    ct_tensor *g = tu_from_f64(gv, 4, (const int64_t[]){1, 1, 2, 3}, CT_F64);
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    /* maxima: 5 (idx 1), 9 (6), 9 (6) / 8 (9), 9 (6), 9 (6) */
    double ref[12] = {0, 1, 0, 0, 0, 0, 2 + 3 + 5 + 6, 0, 0, 4, 0, 0};
    double *got = tu_values(ct_grad(x));
    tu_assert_close(got, ref, 12, 0, 0);
    free(got);
    ct_tensor *ts[3] = {x, y, g};
    release_all(3, ts);
}

/* ---- a small CNN end to end ---------------------------------------------------------------- */

static ct_tensor *gc_cnn(ct_tensor *const *in, void *v) {
    (void)v;
    ct_scope *s = ct_scope_begin();
    ct_tensor *h = ct_relu(ct_conv2d(in[0], in[1], in[2], NULL, P2(1, 1), NULL, 1));
    h = ct_max_pool2d(h, P2(2, 2), NULL, NULL, NULL, false, NULL);
    h = ct_relu(ct_conv2d(h, in[3], in[4], S1, P2(1, 0), NULL, 2));
    ct_tensor *y = ct_keep(ct_adaptive_avg_pool2d(h, 2, 1));
    ct_scope_end(s);
    return y;
}

static void test_gradcheck_cnn(void **state) {
    (void)state;
    ct_tensor *in[5] = {rand_t((shp)SHP(2, 2, 6, 6), false, true),
                        rand_t((shp)SHP(4, 2, 3, 3), false, true),
                        rand_t((shp)SHP(4), false, true),
                        rand_t((shp)SHP(4, 2, 3, 2), true, true),
                        rand_t((shp)SHP(4), false, true)};
    ct_tensor *y = gc_cnn(in, NULL);
    check_shape(y, 4, (const int64_t[]){2, 4, 2, 1});
    assert_string_equal(ct_grad_fn_name(y), "AdaptiveAvgPool2DBackward");
    ct_tensor_release(y);
    gradcheck_ok("cnn", gc_cnn, NULL, 5, in);
    release_all(5, in);
}

/* ---- dtypes ---------------------------------------------------------------------------- */

/* Gradients of conv2d in float32/float16/bfloat16 have that dtype and match
 * the float64 gradients of the same (rounded) values (computed by im2col in
 * float64 whatever path the reduced types take). */
static void check_dtypes(const conv_case *c, bool nc) {
    static const ct_dtype dts[] = {CT_F32, CT_F16, CT_BF16};
    static const double tol[] = {1e-5, 4e-3, 3e-2};
    shp shapes[3] = {c->x, c->w, SHP(c->w.s[0])};
    for (int d = 0; d < 3; d++) {
        ct_tensor *lo[3] = {NULL, NULL, NULL}, *hi[3] = {NULL, NULL, NULL};
        int n = c->bias ? 3 : 2;
        for (int k = 0; k < n; k++) {
            double *v;
            lo[k] = tu_rand(shapes[k].nd, shapes[k].s, dts[d], -1, 1, &v);
            hi[k] = tu_from_f64(v, shapes[k].nd, shapes[k].s, CT_F64);
            free(v);
            lo[k] = finish(lo[k], shapes[k], nc && shapes[k].s[0] > 1, true);
            assert_int_equal(ct_requires_grad_(hi[k], true), CT_OK);
        }
        ct_tensor *ylo = gc_conv(lo, (void *)c), *yhi = gc_conv(hi, (void *)c);
        assert_non_null(ylo);
        assert_int_equal(ct_tensor_dtype(ylo), dts[d]);
        check_close_scaled(ylo, yhi, tol[d]);
        backward_ones(ylo);
        backward_ones(yhi);
        for (int k = 0; k < n; k++) {
            assert_int_equal(ct_tensor_dtype(ct_grad(lo[k])), dts[d]);
            check_close_scaled(ct_grad(lo[k]), ct_grad(hi[k]), tol[d]);
        }
        release_all(3, lo);
        release_all(3, hi);
        ct_tensor_release(ylo);
        ct_tensor_release(yhi);
    }
}

static void test_conv2d_dtypes(void **state) {
    (void)state;
    check_dtypes(&conv_cases[3], false); /* stride + padding */
}

/* 3x3 stride-1 layers with enough channels take the Winograd path on AVX-512
 * CPUs for all three ops in the reduced types: odd sizes, padding 0..2,
 * groups, 3-d input, N = 1, non-contiguous operands. */
static void test_conv2d_dtypes_winograd(void **state) {
    (void)state;
    static const conv_case cases[] = {
        {"wino pad 1", SHP(2, 17, 9, 11), SHP(18, 17, 3, 3), true, {1, 1}, {1, 1}, {1, 1}, 1},
        {"wino pad 0", SHP(1, 8, 7, 6), SHP(4, 8, 3, 3), false, {1, 1}, {0, 0}, {1, 1}, 1},
        {"wino groups pad 2", SHP(2, 16, 6, 7), SHP(10, 8, 3, 3), true, {1, 1}, {2, 2}, {1, 1}, 2},
        {"wino 3-d pad 2x1", SHP(9, 5, 19), SHP(16, 9, 3, 3), true, {1, 1}, {2, 1}, {1, 1}, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int nc = 0; nc < 2; nc++) check_dtypes(&cases[i], nc);
}

/* Pooling gradients in every float dtype: values k/32 are exact in all of
 * them, so the argmax is the same as in float64. */
static void test_pooling_dtypes(void **state) {
    (void)state;
    const int pick[3] = {6, 12, 20}; /* max ceil p1, avg ceil incl, adaptive 4x4 */
    for (int d = 0; d < 4; d++)
        for (int p = 0; p < 3; p++) {
            const pool_case *c = &pool_cases[pick[p]];
            int64_t n = tu_numel(c->x.nd, c->x.s);
            double *v = malloc((size_t)n * sizeof *v);
            for (int64_t i = 0; i < n; i++) v[i] = (double)(i * 37 % n - n / 2) / 32;
            ct_tensor *lo = tu_from_f64(v, c->x.nd, c->x.s, tu_float_dtypes[d]);
            ct_tensor *hi = tu_from_f64(v, c->x.nd, c->x.s, CT_F64);
            free(v);
            assert_int_equal(ct_requires_grad_(lo, true), CT_OK);
            assert_int_equal(ct_requires_grad_(hi, true), CT_OK);
            ct_tensor *ylo = run_pool(lo, c), *yhi = run_pool(hi, c);
            backward_ones(ylo);
            backward_ones(yhi);
            assert_int_equal(ct_tensor_dtype(ct_grad(lo)), tu_float_dtypes[d]);
            check_close_scaled(ct_grad(lo), ct_grad(hi), tu_rtol(tu_float_dtypes[d]) * 2);
            ct_tensor *ts[4] = {lo, hi, ylo, yhi};
            release_all(4, ts);
        }
}

/* ---- graph behaviour --------------------------------------------------------------------- */

static void test_accumulate_and_reuse(void **state) {
    (void)state;
    const conv_case *c = &conv_cases[1];
    ct_tensor *in[3] = {rand_t(c->x, false, true), rand_t(c->w, false, true),
                        rand_t((shp)SHP(c->w.s[0]), false, true)};
    ct_tensor *first[3] = {NULL, NULL, NULL};
    for (int round = 0; round < 2; round++) {
        ct_tensor *y = gc_conv(in, (void *)c);
        backward_ones(y);
        ct_tensor_release(y);
        for (int k = 0; round == 0 && k < 3; k++) first[k] = ct_mul_scalar(ct_grad(in[k]), 2);
    }
    for (int k = 0; k < 3; k++) check_close_scaled(ct_grad(in[k]), first[k], 1e-14);
    release_all(3, first);
    release_all(3, in);

    /* one tensor as both the input and the weight: both paths reach it */
    conv_case self = {"self", SHP(3, 2, 3, 3), SHP(3, 2, 3, 3), false, {1, 1}, {1, 0},
                      {1, 1}, 1};
    ct_tensor *t = rand_t(self.x, false, true);
    ct_tensor *tt[2] = {t, t};
    gradcheck_ok("conv2d(t, t)", gc_conv, &self, 2, tt);
    ct_tensor_release(t);
}

/* max_pool2d(x) + avg_pool2d(x): both gradients reach x. */
static ct_tensor *gc_two_pools(ct_tensor *const *in, void *v) {
    (void)v;
    ct_tensor *a = ct_max_pool2d(in[0], P2(2, 2), S1, NULL, NULL, false, NULL);
    ct_tensor *b = ct_avg_pool2d(in[0], P2(2, 2), S1, NULL, false, true);
    ct_tensor *y = ct_add(a, b);
    ct_tensor_release(a);
    ct_tensor_release(b);
    return y;
}

static void test_two_paths(void **state) {
    (void)state;
    ct_tensor *x = distinct_t((shp)SHP(2, 2, 4, 5), true, true);
    gradcheck_ok("max_pool2d + avg_pool2d", gc_two_pools, NULL, 1, &x);
    ct_tensor_release(x);
}

static void test_non_differentiable(void **state) {
    (void)state;
    ct_tensor *x = rand_t((shp)SHP(1, 2, 5, 5), false, false);
    ct_tensor *w = rand_t((shp)SHP(3, 2, 3, 3), false, true);
    /* an input that does not require grad gets no gradient */
    ct_tensor *y = ct_conv2d(x, w, NULL, NULL, NULL, NULL, 1);
    assert_true(ct_requires_grad(y));
    backward_ones(y);
    assert_null(ct_grad(x));
    assert_non_null(ct_grad(w));
    /* nothing requires grad: nothing records */
    ct_tensor *px = ct_max_pool2d(x, P2(2, 2), NULL, NULL, NULL, false, NULL);
    assert_false(ct_requires_grad(px));
    assert_null(ct_grad_fn_name(px));
    /* no-grad mode records nothing */
    bool prev = ct_no_grad_begin();
    ct_tensor *ng[4] = {ct_conv2d(x, w, NULL, NULL, NULL, NULL, 1),
                        ct_max_pool2d(w, P2(2, 2), S1, NULL, NULL, false, NULL),
                        ct_avg_pool2d(w, P2(2, 2), NULL, NULL, false, true),
                        ct_adaptive_avg_pool2d(w, 2, 2)};
    ct_no_grad_end(prev);
    for (int k = 0; k < 4; k++) {
        assert_non_null(ng[k]);
        assert_false(ct_requires_grad(ng[k]));
    }
    /* the backward ops have no formula of their own: on inputs that require
     * grad they carry a node that makes backward fail naming them */
    ct_tensor *g = rand_t((shp)SHP(1, 3, 3, 3), false, true);
    ct_tensor *bw[3] = {
        ct_conv2d_backward_input(g, w, (const int64_t[]){1, 2, 5, 5}, NULL, NULL, NULL, 1),
        ct_conv2d_backward_weight(g, x, (const int64_t[]){3, 2, 3, 3}, NULL, NULL, NULL, 1),
        ct_conv2d_backward_bias(g)};
    for (int k = 0; k < 3; k++) {
        assert_non_null(bw[k]);
        assert_true(ct_requires_grad(bw[k]));
        ct_scope *sc = ct_scope_begin();
        ct_status st = ct_backward(ct_sum(bw[k], CT_NONE, false), NULL, false);
        tu_assert_error(st, CT_ERR_AUTOGRAD, "ct_conv2d_backward_", "no backward formula");
        ct_scope_end(sc);
    }
    ct_tensor *idx = NULL;
    ct_tensor *pw = ct_max_pool2d(w, P2(2, 2), S1, NULL, NULL, false, &idx);
    ct_tensor *gp = rand_t((shp)SHP(3, 2, 2, 2), false, true);
    ct_tensor *bp[3] = {ct_max_pool2d_backward(gp, w, idx),
                        ct_avg_pool2d_backward(gp, w, P2(2, 2), S1, NULL, false, true),
                        ct_adaptive_avg_pool2d_backward(gp, w)};
    for (int k = 0; k < 3; k++) {
        assert_non_null(bp[k]);
        assert_true(ct_requires_grad(bp[k]));
        ct_scope *sc = ct_scope_begin();
        ct_status st = ct_backward(ct_sum(bp[k], CT_NONE, false), NULL, false);
        tu_assert_error(st, CT_ERR_AUTOGRAD, "pool2d_backward", "no backward formula");
        ct_scope_end(sc);
    }
    ct_tensor *ts[8] = {x, w, y, px, g, idx, pw, gp};
    release_all(8, ts);
    release_all(4, ng);
    release_all(3, bw);
    release_all(3, bp);
}

/* A bad argument fails with nothing recorded and nothing left allocated. */
static void test_failure_no_graph(void **state) {
    (void)state;
    ct_tensor *x = rand_t((shp)SHP(1, 3, 5, 5), false, true);
    ct_tensor *w = rand_t((shp)SHP(4, 2, 3, 3), false, true);
    ct_tensor *idx = NULL;
    cti_alloc_stats before = cti_get_alloc_stats();
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, NULL, NULL, 1), CT_ERR_SHAPE, "ct_conv2d",
                         "channels");
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, NULL, NULL, 0), CT_ERR_INVALID_ARG,
                         "ct_conv2d", "groups");
    tu_assert_null_error(ct_max_pool2d(x, P2(2, 2), NULL, P2(2, 2), NULL,
                                       false, &idx),
                         CT_ERR_INVALID_ARG, "ct_max_pool2d", "padding");
    assert_null(idx);
    tu_assert_null_error(ct_avg_pool2d(x, P2(6, 6), NULL, NULL, false, true),
                         CT_ERR_SHAPE, "ct_avg_pool2d", "too small");
    tu_assert_null_error(ct_adaptive_avg_pool2d(x, 0, 2), CT_ERR_INVALID_ARG,
                         "ct_adaptive_avg_pool2d", "positive");
    assert_true(same_stats(before, cti_get_alloc_stats()));
    assert_true(ct_is_leaf(x));
    assert_null(ct_grad(x));
    assert_null(ct_grad(w));
    ct_tensor_release(x);
    ct_tensor_release(w);
}

/* conv2d saves x only for the weight's gradient and w only for the input's:
 * an in-place change to a saved one makes backward fail, to an unsaved one
 * does not. Pooling saves neither its input nor (avg) anything. */
static void test_saved_versions(void **state) {
    (void)state;
    ct_tensor *x = rand_t((shp)SHP(1, 2, 5, 5), false, false);
    ct_tensor *w = rand_t((shp)SHP(3, 2, 3, 3), false, true);
    /* x saved for w's gradient */
    ct_tensor *y = ct_conv2d(x, w, NULL, NULL, NULL, NULL, 1);
    assert_int_equal(ct_mul_scalar_(x, 2), CT_OK);
    ct_tensor *g = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, g, false), CT_ERR_AUTOGRAD, "ConvolutionBackward", "in-place");
    ct_tensor_release(y);
    /* w is not saved when x needs no gradient: an optimizer-like step on w
     * between forward and backward is fine */
    y = ct_conv2d(x, w, NULL, NULL, NULL, NULL, 1);
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(w, 0.5), CT_OK);
    ct_no_grad_end(prev);
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    ct_tensor_release(y);
    /* an activation feeding a frozen weight is not kept alive by the graph */
    ct_tensor *xr = rand_t((shp)SHP(1, 2, 5, 5), false, true);
    ct_tensor *act = ct_mul_scalar(xr, 1.0);
    prev = ct_no_grad_begin();
    ct_tensor *frozen = ct_mul_scalar(w, 1.0);
    ct_no_grad_end(prev);
    y = ct_conv2d(act, frozen, NULL, NULL, NULL, NULL, 1);
    cti_alloc_stats with_act = cti_get_alloc_stats();
    ct_tensor_release(act);
    assert_int_equal(cti_get_alloc_stats().live_storages, with_act.live_storages - 1);
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    assert_non_null(ct_grad(xr));
    ct_tensor *ts2[3] = {xr, frozen, y};
    release_all(3, ts2);
    /* pooling saves no input */
    ct_tensor *h = ct_mul_scalar(w, 1.0);
    ct_tensor *p[3] = {ct_max_pool2d(h, P2(2, 2), S1, NULL, NULL, false, NULL),
                       ct_avg_pool2d(h, P2(2, 2), S1, NULL, false, false),
                       ct_adaptive_avg_pool2d(h, 2, 1)};
    prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(h, 3), CT_OK);
    ct_no_grad_end(prev);
    for (int k = 0; k < 3; k++) backward_ones(p[k]);
    /* max pooling does save its indices */
    ct_tensor *idx = NULL;
    ct_tensor *m = ct_max_pool2d(h, P2(2, 2), S1, NULL, NULL, false, &idx);
    assert_int_equal(ct_fill_(idx, 0), CT_OK);
    ct_tensor *gm = ct_tensor_ones_like(m);
    tu_assert_error(ct_backward(m, gm, false), CT_ERR_AUTOGRAD, "MaxPool2DWithIndicesBackward",
                    "in-place");
    ct_tensor *ts[7] = {x, w, g, h, idx, m, gm};
    release_all(7, ts);
    release_all(3, p);
}

/* Training-like steps leave nothing behind. */
static void test_memory_loop(void **state) {
    (void)state;
    ct_tensor *in[5] = {rand_t((shp)SHP(2, 2, 6, 6), false, false),
                        rand_t((shp)SHP(4, 2, 3, 3), false, true),
                        rand_t((shp)SHP(4), false, true),
                        rand_t((shp)SHP(4, 2, 3, 2), false, true),
                        rand_t((shp)SHP(4), false, true)};
    cti_alloc_stats before = cti_get_alloc_stats();
    for (int i = 0; i < 10; i++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *y = gc_cnn(in, NULL);
        ct_tensor *a = ct_avg_pool2d(y, P2(2, 1), NULL, NULL, true, false);
        ct_tensor *loss = ct_sum(a, 0, NULL, false);
        assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
        ct_scope_end(sc);
        for (int k = 1; k < 5; k++) {
            assert_non_null(ct_grad(in[k]));
            ct_zero_grad(in[k]);
        }
        assert_true(same_stats(before, cti_get_alloc_stats()));
    }
    release_all(5, in);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gradcheck_conv2d, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_conv2d_partial, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv2d_empty_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_pooling, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_pool2d_grad_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_cnn, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv2d_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv2d_dtypes_winograd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pooling_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accumulate_and_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_two_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_differentiable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_no_graph, setup, teardown),
        cmocka_unit_test_setup_teardown(test_saved_versions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_loop, setup, teardown),
    };
    return tu_run_tests(tests);
}
