/* Autograd of the reductions and the views: gradchecks of every formula with
 * every dims option (single, several, negative, all, keepdim) on contiguous
 * and non-contiguous inputs, the edge cases PyTorch defines (prod with zeros,
 * norm subgradients at 0, ties of max/min, NaN), composed view chains, the
 * history views carry and the in-place rules that follow, reduced-precision
 * gradients, and memory. */
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

/* Makes t non-contiguous (same values) when nc, requiring grad. */
static ct_tensor *finish_leaf(ct_tensor *t, shp s, bool nc) {
    assert_non_null(t);
    if (nc) {
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        t = v;
        assert_non_null(t);
        if (s.nd > 0 && tu_numel(s.nd, s.s) > 1) assert_false(ct_tensor_is_contiguous(t));
    }
    assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

/* A random float64 leaf in [lo, hi). */
static ct_tensor *rand_leaf(shp s, double lo, double hi, bool nc) {
    return finish_leaf(tu_rand(s.nd, s.s, CT_F64, lo, hi, NULL), s, nc);
}

/* A random float64 leaf with |x| in [lo, hi) and random signs: away from 0,
 * where norms and prod with p < 1 are not smooth. */
static ct_tensor *signed_leaf(shp s, double lo, double hi, bool nc) {
    int64_t n = tu_numel(s.nd, s.s);
    double *v = tu_rand_vals(n, CT_F64, lo, hi);
    for (int64_t i = 0; i < n; i++)
        if (tu_next() & 1) v[i] = -v[i];
    ct_tensor *t = tu_from_f64(v, s.nd, s.s, CT_F64);
    free(v);
    return finish_leaf(t, s, nc);
}

/* A random float64 leaf whose elements are pairwise at least (hi - lo) / (2 n)
 * apart: a shuffled grid with jitter. max and min are not differentiable at
 * ties, and two uniform draws closer than the finite-difference step make the
 * numeric gradient straddle the kink (it happens for some seeds). */
static ct_tensor *distinct_leaf(shp s, double lo, double hi, bool nc) {
    int64_t n = tu_numel(s.nd, s.s);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    assert_non_null(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = lo + (hi - lo) * ((double)i + 0.25 + 0.5 * tu_uniform(0, 1)) / (double)n;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(tu_next() % (uint64_t)(i + 1));
        double t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
    ct_tensor *t = tu_from_f64(v, s.nd, s.s, CT_F64);
    free(v);
    return finish_leaf(t, s, nc);
}

/* distinct_leaf's magnitudes in [lo, hi) with random signs: the infinity
 * norms are max and min of |x| and have the same kinks at ties. */
static ct_tensor *distinct_signed_leaf(shp s, double lo, double hi, bool nc) {
    ct_tensor *m = distinct_leaf(s, lo, hi, false);
    int64_t n = tu_numel(s.nd, s.s);
    double *v = tu_values(m);
    for (int64_t i = 0; i < n; i++)
        if (tu_next() & 1) v[i] = -v[i];
    ct_tensor_release(m);
    ct_tensor *t = tu_from_f64(v, s.nd, s.s, CT_F64);
    free(v);
    return finish_leaf(t, s, nc);
}

/* ---- reductions: the function under gradcheck ------------------------------------------ */

typedef enum rk {
    R_SUM, R_MEAN, R_PROD, R_VAR, R_STD, R_NORM, R_MAX, R_MIN, R_MAX_DIM, R_MIN_DIM
} rk;

static const char *const rk_names[] = {"sum", "mean", "prod", "var", "std",
                                       "norm", "max", "min", "max_dim", "min_dim"};

typedef struct rctx {
    rk k;
    int nd;
    int64_t dims[4];
    bool keepdim;
    double param;
    bool want_idx; /* max_dim/min_dim: ask for the indices too */
} rctx;

static ct_tensor *run_reduce(ct_tensor *x, const rctx *c) {
    const int64_t *d = c->nd ? c->dims : NULL;
    ct_tensor *idx = NULL;
    ct_tensor *y = NULL;
    switch (c->k) {
    case R_SUM: return ct_sum(x, c->nd, d, c->keepdim);
    case R_MEAN: return ct_mean(x, c->nd, d, c->keepdim);
    case R_PROD: return ct_prod(x, c->nd, d, c->keepdim);
    case R_VAR: return ct_var(x, c->nd, d, c->param, c->keepdim);
    case R_STD: return ct_std(x, c->nd, d, c->param, c->keepdim);
    case R_NORM: return ct_norm(x, c->param, c->nd, d, c->keepdim);
    case R_MAX: return ct_max(x);
    case R_MIN: return ct_min(x);
    case R_MAX_DIM:
    case R_MIN_DIM:
        y = (c->k == R_MAX_DIM ? ct_max_dim : ct_min_dim)(x, (int)c->dims[0], c->keepdim,
                                                          c->want_idx ? &idx : NULL);
        if (c->want_idx) {
            assert_non_null(idx);
            assert_false(ct_requires_grad(idx));
            assert_int_equal(ct_tensor_dtype(idx), CT_I64);
        }
        ct_tensor_release(idx);
        return y;
    }
    return NULL;
}

static ct_tensor *gc_reduce(ct_tensor *const *in, void *v) { return run_reduce(in[0], v); }

/* Dims options over a 3-d tensor: all (the empty list), single, negative,
 * several, several negative, all listed out of order. */
typedef struct dims_opt {
    int nd;
    int64_t d[4];
} dims_opt;

static const dims_opt dims3[] = {{0, {0}},     {1, {0}},      {1, {1}},        {1, {-1}},
                                 {2, {0, 2}}, {2, {-3, -1}}, {3, {2, 0, 1}}, {2, {-2, 2}}};
#define NDIMS3 (int)(sizeof dims3 / sizeof dims3[0])

static void gradcheck_reduce_all_dims(rk k, double param, double lo, double hi, bool signed_vals) {
    char what[160];
    shp s = SHP(3, 4, 5);
    for (int nc = 0; nc < 2; nc++)
        for (int o = 0; o < NDIMS3; o++)
            for (int keep = 0; keep < 2; keep++) {
                rctx c = {k, dims3[o].nd, {0}, keep, param, false};
                memcpy(c.dims, dims3[o].d, sizeof c.dims);
                ct_tensor *x = k == R_NORM && isinf(param) ? distinct_signed_leaf(s, lo, hi, nc)
                               : signed_vals ? signed_leaf(s, lo, hi, nc)
                                             : rand_leaf(s, lo, hi, nc);
                snprintf(what, sizeof what, "%s(p=%g) dims option %d keepdim %d nc %d",
                         rk_names[k], param, o, keep, nc);
                gradcheck_ok(what, gc_reduce, &c, 1, &x);
                ct_tensor_release(x);
            }
}

/* 0-d inputs (reduce over nothing, with dims () / (0) / (-1)) and size-1 dims. */
static void gradcheck_reduce_small(rk k, double param) {
    char what[160];
    static const dims_opt d0[] = {{0, {0}}, {1, {0}}, {1, {-1}}};
    for (int o = 0; o < 3; o++) {
        rctx c = {k, d0[o].nd, {d0[o].d[0]}, o == 1, param, false};
        ct_tensor *x = signed_leaf((shp)SHP0, 0.5, 1.5, false);
        snprintf(what, sizeof what, "%s(p=%g) of a 0-d tensor, option %d", rk_names[k], param, o);
        gradcheck_ok(what, gc_reduce, &c, 1, &x);
        ct_tensor_release(x);
    }
    for (int keep = 0; keep < 2; keep++) {
        rctx c = {k, 2, {1, 3}, keep, param, false};
        /* the pairs reduced are at least 1/48 apart: std of two values is
         * |a - b| / 2 there, and the infinity norm max(|a|, |b|), both with
         * a kink where they meet */
        ct_tensor *x = distinct_signed_leaf((shp)SHP(3, 1, 4, 2), 0.5, 1.5, true);
        snprintf(what, sizeof what, "%s(p=%g) over size-1 dims keepdim %d", rk_names[k], param,
                 keep);
        gradcheck_ok(what, gc_reduce, &c, 1, &x);
        ct_tensor_release(x);
    }
}

static void test_gradcheck_sum_mean(void **state) {
    (void)state;
    gradcheck_reduce_all_dims(R_SUM, 0, -2, 2, false);
    gradcheck_reduce_all_dims(R_MEAN, 0, -2, 2, false);
    gradcheck_reduce_small(R_SUM, 0);
    gradcheck_reduce_small(R_MEAN, 0);
}

static void test_gradcheck_prod(void **state) {
    (void)state;
    gradcheck_reduce_all_dims(R_PROD, 0, 0.5, 1.5, true);
    gradcheck_reduce_small(R_PROD, 0);
}

static void test_gradcheck_var_std(void **state) {
    (void)state;
    const double corr[] = {1, 0, 2.5};
    for (int i = 0; i < 3; i++) {
        gradcheck_reduce_all_dims(R_VAR, corr[i], -2, 2, false);
        gradcheck_reduce_all_dims(R_STD, corr[i], -2, 2, false);
    }
    /* size-1 dims need correction 0 to stay finite */
    gradcheck_reduce_small(R_VAR, 0);
    gradcheck_reduce_small(R_STD, 0);
}

static void test_gradcheck_norm(void **state) {
    (void)state;
    const double ps[] = {2, 1, INFINITY, -INFINITY, 3, 1.5, 0.5, -1, 0};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        gradcheck_reduce_all_dims(R_NORM, ps[i], 0.3, 1.2, true);
        gradcheck_reduce_small(R_NORM, ps[i]);
    }
}

static void test_gradcheck_max_min(void **state) {
    (void)state;
    char what[160];
    for (int nc = 0; nc < 2; nc++) {
        for (rk k = R_MAX; k <= R_MIN; k++) {
            rctx c = {k, 0, {0}, false, 0, false};
            ct_tensor *x = distinct_leaf((shp)SHP(3, 4, 5), -2, 2, nc);
            snprintf(what, sizeof what, "%s nc %d", rk_names[k], nc);
            gradcheck_ok(what, gc_reduce, &c, 1, &x);
            ct_tensor_release(x);
        }
        static const int64_t dims[] = {0, 1, 2, -1, -3};
        for (rk k = R_MAX_DIM; k <= R_MIN_DIM; k++)
            for (int o = 0; o < 5; o++)
                for (int keep = 0; keep < 2; keep++) {
                    rctx c = {k, 1, {dims[o]}, keep, 0, (o + keep) % 2 == 0};
                    ct_tensor *x = distinct_leaf((shp)SHP(3, 4, 5), -2, 2, nc);
                    snprintf(what, sizeof what, "%s dim %lld keepdim %d nc %d", rk_names[k],
                             (long long)dims[o], keep, nc);
                    gradcheck_ok(what, gc_reduce, &c, 1, &x);
                    ct_tensor_release(x);
                }
    }
    for (rk k = R_MAX; k <= R_MIN_DIM; k++) {
        rctx c = {k, 1, {0}, false, 0, true};
        ct_tensor *x = rand_leaf((shp)SHP0, -2, 2, false);
        snprintf(what, sizeof what, "%s of a 0-d tensor", rk_names[k]);
        gradcheck_ok(what, gc_reduce, &c, 1, &x);
        ct_tensor_release(x);
    }
}

/* ---- reductions: edge cases with exact references ------------------------------------------ */

/* d/dx of sum(prod(x, dim) * w) with naive products of the others. */
static void test_prod_zeros(void **state) {
    (void)state;
    /* row 0: one zero, row 1: two zeros, row 2: none, row 3: all zero */
    double xv[16];
    for (int i = 0; i < 16; i++) xv[i] = tu_uniform(0.5, 2) * (tu_next() & 1 ? -1 : 1);
    xv[2] = 0;
    xv[4] = 0;
    xv[7] = 0;
    for (int j = 12; j < 16; j++) xv[j] = 0;
    for (int dimcase = 0; dimcase < 3; dimcase++) { /* dim 1, dim 0, all */
        ct_tensor *x = leaf_of(xv, CT_SHAPE(4, 4), CT_F64);
        ct_tensor *y = dimcase == 2 ? ct_prod(x, CT_NONE, false)
                                    : ct_prod(x, CT_DIMS(dimcase == 0 ? 1 : 0), false);
        assert_non_null(y);
        assert_string_equal(ct_grad_fn_name(y), "ProdBackward");
        int64_t ny = ct_tensor_numel(y);
        double w[4];
        for (int i = 0; i < ny; i++) w[i] = tu_uniform(0.5, 1.5);
        ct_tensor *wt = tu_from_f64(w, ct_tensor_ndim(y), ct_tensor_shape(y), CT_F64);
        assert_int_equal(ct_backward(y, wt, false), CT_OK);
        double ref[16];
        for (int e = 0; e < 16; e++) {
            int r = e / 4, c = e % 4;
            double p = 1;
            int o;
            for (int f = 0; f < 16; f++) {
                bool same = dimcase == 0 ? f / 4 == r : dimcase == 1 ? f % 4 == c : true;
                if (same && f != e) p *= xv[f];
            }
            o = dimcase == 0 ? r : dimcase == 1 ? c : 0;
            ref[e] = p * w[o];
        }
        check_values(ct_grad(x), ref, 16, 1e-12, 1e-14);
        /* and the numeric check, exact for a multilinear function */
        rctx c = {R_PROD, dimcase == 2 ? 0 : 1, {dimcase == 0 ? 1 : 0}, dimcase == 1, 0, false};
        gradcheck_ok("prod with zeros", gc_reduce, &c, 1, &x);
        ct_tensor *ts[3] = {x, y, wt};
        release_all(3, ts);
    }
    /* a single zero over all elements gets the product of the others */
    const double v[4] = {2, 0, -3, 0.5};
    ct_tensor *x = leaf_of(v, CT_SHAPE(4), CT_F64);
    ct_tensor *y = ct_prod(x, CT_NONE, false);
    assert_int_equal(ct_backward(y, NULL, false), CT_OK);
    check_values(ct_grad(x), (double[]){0, -3, 0, 0}, 4, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

static void test_norm_subgradient_at_zero(void **state) {
    (void)state;
    const double ps[] = {2, 1, 3, 1.5, 0.5, INFINITY};
    /* row 0 all zero (norm 0), row 1 with one zero element */
    const double v[6] = {0, 0, 0, 3, 0, -4};
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        double p = ps[i];
        ct_tensor *x = leaf_of(v, CT_SHAPE(2, 3), CT_F64);
        ct_tensor *y = ct_norm(x, p, CT_DIMS(1), false);
        assert_non_null(y);
        assert_string_equal(ct_grad_fn_name(y), "NormBackward");
        backward_ones(y);
        double nrm = isinf(p) ? 4 : pow(pow(3, p) + pow(4, p), 1 / p);
        double ref[6] = {0, 0, 0, 0, 0, 0};
        if (isinf(p)) {
            ref[5] = -1;
        } else {
            ref[3] = pow(3, p - 1) * pow(nrm, 1 - p);
            ref[5] = -pow(4, p - 1) * pow(nrm, 1 - p);
        }
        check_values(ct_grad(x), ref, 6, 1e-12, 1e-14);
        ct_tensor_release(y);
        ct_tensor_release(x);
    }
}

static void test_std_of_constant(void **state) {
    (void)state;
    const double v[6] = {1.5, 1.5, 1.5, 1, 2, 4};
    ct_tensor *x = leaf_of(v, CT_SHAPE(2, 3), CT_F64);
    ct_tensor *y = ct_std(x, CT_DIMS(-1), 1, true);
    check_shape(y, 2, (const int64_t[]){2, 1});
    backward_ones(y);
    double m = 7.0 / 3, sd = sqrt(((1 - m) * (1 - m) + (2 - m) * (2 - m) + (4 - m) * (4 - m)) / 2);
    double ref[6] = {0, 0, 0, (1 - m) / (2 * sd), (2 - m) / (2 * sd), (4 - m) / (2 * sd)};
    check_values(ct_grad(x), ref, 6, 1e-12, 1e-14);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

/* var and std of a constant are exactly 0 and so are their gradients (as
 * PyTorch's), whatever rounding the mean of 0.1 has: rows of 120 (the row
 * path), columns (the strided path), all elements, f32 and f64. */
static void test_var_std_of_constant_exact(void **state) {
    (void)state;
    static const ct_dtype dts[2] = {CT_F32, CT_F64};
    for (int di = 0; di < 2; di++)
        for (int std = 0; std < 2; std++)
            for (int layout = 0; layout < 3; layout++) {
                int64_t shape[2] = {layout == 1 ? 120 : 3, layout == 1 ? 3 : 120};
                ct_tensor *x = ct_tensor_full(2, shape, 0.1, dts[di], CT_CPU);
                assert_non_null(x);
                assert_int_equal(ct_requires_grad_(x, true), CT_OK);
                int64_t dim = layout == 1 ? 0 : 1;
                ct_tensor *y = layout == 2 ? (std ? ct_std(x, 0, NULL, 1, false) : ct_var(x, 0, NULL, 1, false))
                                           : (std ? ct_std(x, 1, &dim, 1, false) : ct_var(x, 1, &dim, 1, false));
                assert_non_null(y);
                double *yv = tu_values(y);
                for (int64_t i = 0; i < ct_tensor_numel(y); i++) assert_true(yv[i] == 0.0);
                free(yv);
                backward_ones(y);
                double *g = tu_values(ct_grad(x));
                for (int64_t i = 0; i < 360; i++) {
                    if (g[i] != 0.0) fprintf(stderr, "dtype %d std %d layout %d: grad[%lld] = %g\n", di, std, layout, (long long)i, g[i]);
                    assert_true(g[i] == 0.0);
                }
                free(g);
                ct_tensor_release(y);
                ct_tensor_release(x);
            }
}

static void test_max_min_ties(void **state) {
    (void)state;
    const double v[6] = {1, 3, 3, -2, 3, -2};
    ct_tensor *x = leaf_of(v, CT_SHAPE(2, 3), CT_F64);
    ct_tensor *y = ct_max(x);
    assert_string_equal(ct_grad_fn_name(y), "MaxBackward");
    ct_tensor *g = ct_tensor_scalar(6.0, CT_F64, ct_tensor_device(x));
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    check_values(ct_grad(x), (double[]){0, 2, 2, 0, 2, 0}, 6, 0, 0);
    ct_zero_grad(x);
    ct_tensor *z = ct_min(x);
    assert_string_equal(ct_grad_fn_name(z), "MinBackward");
    assert_int_equal(ct_backward(z, NULL, false), CT_OK);
    check_values(ct_grad(x), (double[]){0, 0, 0, 0.5, 0, 0.5}, 6, 0, 0);
    ct_zero_grad(x);
    /* along a dim the selected (first) index takes it all */
    ct_tensor *idx = NULL;
    ct_tensor *m = ct_max_dim(x, 1, false, &idx);
    assert_string_equal(ct_grad_fn_name(m), "MaxDimBackward");
    check_values(idx, (double[]){1, 1}, 2, 0, 0);
    ct_tensor *gm = tu_from_f64((double[]){5, 7}, CT_SHAPE(2), CT_F64);
    assert_int_equal(ct_backward(m, gm, false), CT_OK);
    check_values(ct_grad(x), (double[]){0, 5, 0, 0, 7, 0}, 6, 0, 0);
    ct_zero_grad(x);
    ct_tensor *mn = ct_min_dim(x, 0, true, NULL);
    assert_string_equal(ct_grad_fn_name(mn), "MinDimBackward");
    check_shape(mn, 2, (const int64_t[]){1, 3});
    backward_ones(mn);
    check_values(ct_grad(x), (double[]){0, 1, 0, 1, 0, 1}, 6, 0, 0);
    ct_tensor *ts[8] = {x, y, g, z, idx, m, gm, mn};
    release_all(8, ts);
}

/* A NaN result sends the gradient to the NaNs, as PyTorch's max(). */
static void test_max_nan(void **state) {
    (void)state;
    const double v[4] = {1, NAN, 5, NAN};
    ct_tensor *x = leaf_of(v, CT_SHAPE(4), CT_F64);
    ct_tensor *y = ct_max(x);
    double r;
    assert_int_equal(ct_tensor_item(y, &r), CT_OK);
    assert_true(isnan(r));
    assert_int_equal(ct_backward(y, NULL, false), CT_OK);
    check_values(ct_grad(x), (double[]){0, 0.5, 0, 0.5}, 4, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

/* Empty inputs: the gradient is empty or zero, never an error. */
static void test_reduce_empty(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(0, 3), -1, 1, false);
    ct_tensor *s = ct_sum(x, CT_DIMS(0), false);
    check_shape(s, 1, (const int64_t[]){3});
    backward_ones(s);
    check_shape(ct_grad(x), 2, (const int64_t[]){0, 3});
    ct_zero_grad(x);
    ct_tensor *p = ct_prod(x, CT_NONE, false);
    assert_int_equal(ct_backward(p, NULL, false), CT_OK);
    check_shape(ct_grad(x), 2, (const int64_t[]){0, 3});
    ct_tensor *ts[3] = {x, s, p};
    release_all(3, ts);
}

/* float32 gives float32 gradients; float16/bfloat16 gradients match the
 * float64 ones of the same (rounded) values. */
static void test_reduce_dtypes(void **state) {
    (void)state;
    const rctx cases[] = {
        {R_SUM, 1, {1}, false, 0, false},     {R_MEAN, 2, {0, -1}, true, 0, false},
        {R_PROD, 1, {-1}, false, 0, false},   {R_VAR, 1, {1}, false, 1, false},
        {R_STD, 0, {0}, false, 1, false},     {R_NORM, 1, {0}, true, 2, false},
        {R_NORM, 1, {1}, false, 3, false},    {R_NORM, 1, {1}, false, INFINITY, false},
        {R_MAX, 0, {0}, false, 0, false},     {R_MIN_DIM, 1, {1}, true, 0, true},
    };
    const ct_dtype dts[] = {CT_F32, CT_F16, CT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int j = 0; j < 3; j++) {
            ct_dtype dt = dts[j];
            int64_t shape[2] = {3, 4};
            double *v = tu_rand_vals(12, dt, 0.5, 1.5);
            for (int e = 0; e < 12; e++)
                if (tu_next() & 1) v[e] = -v[e];
            ct_tensor *x = leaf_of(v, 2, shape, dt);
            ct_tensor *x64 = leaf_of(v, 2, shape, CT_F64);
            ct_tensor *y = run_reduce(x, &cases[i]);
            ct_tensor *y64 = run_reduce(x64, &cases[i]);
            assert_non_null(y);
            assert_int_equal(ct_tensor_dtype(y), dt);
            backward_ones(y);
            backward_ones(y64);
            ct_tensor *g = ct_grad(x);
            assert_non_null(g);
            assert_int_equal(ct_tensor_dtype(g), dt);
            check_shape(g, 2, shape);
            double *ref = tu_values(ct_grad(x64));
            double tol = dt == CT_F32 ? 1e-5 : dt == CT_F16 ? 4e-3 : 3e-2;
            double *got = tu_values(g);
            tu_assert_close(got, ref, 12, tol, tol);
            free(got);
            free(ref);
            free(v);
            ct_tensor *ts[4] = {x, x64, y, y64};
            release_all(4, ts);
        }
}

/* ---- views: the functions under gradcheck ------------------------------------------- */

typedef enum vk {
    V_VIEW, V_TRANSPOSE, V_T, V_PERMUTE, V_SQUEEZE, V_SQUEEZE_DIM, V_UNSQUEEZE, V_SLICE,
    V_NARROW, V_SELECT, V_EXPAND, V_EXPAND_AS
} vk;

typedef struct vctx {
    vk k; /* the fields each kind reads are set by name, the others stay 0 */
    int a, b;
    int64_t p0, p1, p2;
    int n;
    int64_t list[6];
    ct_tensor *other;
} vctx;

static ct_tensor *run_view(ct_tensor *x, const vctx *c) {
    switch (c->k) {
    case V_VIEW: return ct_view(x, c->n, c->list);
    case V_TRANSPOSE: return ct_transpose(x, c->a, c->b);
    case V_T: return ct_t(x);
    case V_PERMUTE: return ct_permute(x, c->n, c->list);
    case V_SQUEEZE: return ct_squeeze(x);
    case V_SQUEEZE_DIM: return ct_squeeze_dim(x, c->a);
    case V_UNSQUEEZE: return ct_unsqueeze(x, c->a);
    case V_SLICE: return ct_slice(x, c->a, c->p0, c->p1, c->p2);
    case V_NARROW: return ct_narrow(x, c->a, c->p0, c->p1);
    case V_SELECT: return ct_select(x, c->a, c->p0);
    case V_EXPAND: return ct_expand(x, c->n, c->list);
    case V_EXPAND_AS: return ct_expand_as(x, c->other);
    }
    return NULL;
}

static ct_tensor *gc_view(ct_tensor *const *in, void *v) { return run_view(in[0], v); }

typedef struct view_case {
    const char *name;
    shp in;
    vctx c;
    const char *fn_name;
    bool viewable_nc; /* the view also exists for tu_noncontig's layout */
} view_case;

static void test_gradcheck_views(void **state) {
    (void)state;
    ct_tensor *other = ct_tensor_zeros(CT_SHAPE(2, 3, 4, 5), CT_F64, CT_CPU);
    const view_case cases[] = {
        {"view flat", SHP(3, 4, 5), {.k = V_VIEW, .n = 1, .list = {-1}}, "ViewBackward", false},
        {"view merge", SHP(3, 4, 5), {.k = V_VIEW, .n = 2, .list = {12, 5}}, "ViewBackward", false},
        {"view split", SHP(3, 4, 5), {.k = V_VIEW, .n = 4, .list = {3, 2, 2, 5}}, "ViewBackward",
         true},
        {"view 0-d", SHP0, {.k = V_VIEW, .n = 2, .list = {1, 1}}, "ViewBackward", true},
        {"transpose", SHP(3, 4, 5), {.k = V_TRANSPOSE, .a = 0, .b = 2}, "TransposeBackward", true},
        {"transpose neg", SHP(3, 4, 5), {.k = V_TRANSPOSE, .a = -1, .b = 1}, "TransposeBackward",
         true},
        {"transpose same", SHP(3, 4), {.k = V_TRANSPOSE, .a = 1, .b = -1},
         "TransposeBackward", true},
        {"transpose 0-d", SHP0, {.k = V_TRANSPOSE, .a = 0, .b = -1}, "TransposeBackward", true},
        {"t", SHP(3, 4), {.k = V_T}, "TBackward", true},
        {"t 1-d", SHP(5), {.k = V_T}, "TBackward", true},
        {"permute", SHP(2, 3, 4), {.k = V_PERMUTE, .n = 3, .list = {2, 0, 1}}, "PermuteBackward",
         true},
        {"permute neg", SHP(2, 3, 4, 2), {.k = V_PERMUTE, .n = 4, .list = {-1, 1, -4, 2}},
         "PermuteBackward", true},
        {"squeeze", SHP(3, 1, 4, 1), {.k = V_SQUEEZE}, "SqueezeBackward", true},
        {"squeeze_dim", SHP(3, 1, 4), {.k = V_SQUEEZE_DIM, .a = -2}, "SqueezeBackward", true},
        {"squeeze_dim no-op", SHP(3, 4), {.k = V_SQUEEZE_DIM, .a = 0}, "SqueezeBackward", true},
        {"unsqueeze", SHP(3, 4), {.k = V_UNSQUEEZE, .a = 1}, "UnsqueezeBackward", true},
        {"unsqueeze end", SHP(3, 4), {.k = V_UNSQUEEZE, .a = -1}, "UnsqueezeBackward", true},
        {"slice", SHP(7, 4), {.k = V_SLICE, .a = 0, .p0 = 1, .p1 = 6, .p2 = 1},
         "SliceBackward", true},
        {"slice step", SHP(4, 9), {.k = V_SLICE, .a = -1, .p0 = 1, .p1 = 8, .p2 = 3},
         "SliceBackward",
         true},
        {"slice neg clamp", SHP(3, 8), {.k = V_SLICE, .a = 1, .p0 = -5, .p1 = 100, .p2 = 2},
         "SliceBackward", true},
        {"slice empty", SHP(3, 4), {.k = V_SLICE, .a = 1, .p0 = 3, .p1 = 1, .p2 = 1},
         "SliceBackward",
         true},
        {"narrow", SHP(3, 6), {.k = V_NARROW, .a = 1, .p0 = 2, .p1 = 3}, "NarrowBackward", true},
        {"narrow neg", SHP(5, 3), {.k = V_NARROW, .a = -2, .p0 = -4, .p1 = 2},
         "NarrowBackward", true},
        {"select", SHP(3, 4, 5), {.k = V_SELECT, .a = 1, .p0 = 2}, "SelectBackward", true},
        {"select neg", SHP(3, 4, 5), {.k = V_SELECT, .a = -1, .p0 = -2}, "SelectBackward", true},
        {"select 1-d", SHP(5), {.k = V_SELECT, .a = 0, .p0 = 3}, "SelectBackward", true},
        {"expand", SHP(3, 1), {.k = V_EXPAND, .n = 3, .list = {2, 3, 4}}, "ExpandBackward", true},
        {"expand keep", SHP(1, 4), {.k = V_EXPAND, .n = 2, .list = {5, -1}},
         "ExpandBackward", true},
        {"expand 0-d", SHP0, {.k = V_EXPAND, .n = 2, .list = {2, 3}}, "ExpandBackward", true},
        {"expand_as", SHP(4, 1), {.k = V_EXPAND_AS, .other = other}, "ExpandBackward", true},
    };
    char what[160];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int nc = 0; nc < 2; nc++) {
            if (nc && !cases[i].viewable_nc) continue;
            ct_tensor *x = rand_leaf(cases[i].in, -2, 2, nc);
            snprintf(what, sizeof what, "%s nc %d", cases[i].name, nc);
            ct_tensor *y = run_view(x, &cases[i].c);
            if (!y) fprintf(stderr, "%s: %s\n", what, ct_last_error());
            assert_non_null(y);
            assert_true(ct_tensor_shares_storage(x, y));
            assert_true(ct_requires_grad(y));
            assert_false(ct_is_leaf(y));
            assert_string_equal(ct_grad_fn_name(y), cases[i].fn_name);
            ct_tensor_release(y);
            gradcheck_ok(what, gc_view, (void *)&cases[i].c, 1, &x);
            ct_tensor_release(x);
        }
    ct_tensor_release(other);
}

/* Exact gradients of views, with a random grad_out. */
static void test_view_grad_values(void **state) {
    (void)state;
    /* slice with step: the grad lands on the taken elements only */
    ct_tensor *x = rand_leaf((shp)SHP(2, 7), -1, 1, true);
    ct_tensor *y = ct_slice(x, 1, 1, 7, 2);
    check_shape(y, 2, (const int64_t[]){2, 3});
    double gv[6];
    for (int i = 0; i < 6; i++) gv[i] = tu_uniform(-1, 1);
    ct_tensor *g = tu_from_f64(gv, CT_SHAPE(2, 3), CT_F64);
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    double ref[14] = {0};
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++) ref[r * 7 + 1 + 2 * k] = gv[r * 3 + k];
    check_values(ct_grad(x), ref, 14, 0, 0);
    /* expand sums over the broadcast dims */
    ct_zero_grad(x);
    ct_tensor *s = ct_select(x, 0, -1);
    ct_tensor *u = ct_unsqueeze(s, 0);
    ct_tensor *e = ct_expand(u, CT_SHAPE(3, 4, 7));
    double ev[84];
    for (int i = 0; i < 84; i++) ev[i] = tu_uniform(-1, 1);
    ct_tensor *ge = tu_from_f64(ev, CT_SHAPE(3, 4, 7), CT_F64);
    assert_int_equal(ct_backward(e, ge, false), CT_OK);
    double ref2[14] = {0};
    for (int i = 0; i < 84; i++) ref2[7 + i % 7] += ev[i];
    check_values(ct_grad(x), ref2, 14, 1e-12, 1e-14);
    ct_tensor *ts[7] = {x, y, g, s, u, e, ge};
    release_all(7, ts);
}

/* Chains of views, ending in a reduction or an elementwise op, and two
 * overlapping views of one tensor whose gradients add up. */
static ct_tensor *gc_chain(ct_tensor *const *in, void *v) {
    (void)v;
    ct_tensor *x = in[0]; /* [3, 4, 6] */
    ct_tensor *p = ct_permute(x, CT_DIMS(2, 0, 1));           /* [6, 3, 4] */
    ct_tensor *s = ct_slice(p, 0, 1, 6, 2);                     /* [3, 3, 4] */
    ct_tensor *u = ct_unsqueeze(s, 1);                          /* [3, 1, 3, 4] */
    ct_tensor *n = ct_narrow(u, -1, 1, 3);                      /* [3, 1, 3, 3] */
    ct_tensor *t = ct_transpose(n, 0, -1);                      /* [3, 1, 3, 3] */
    ct_tensor *q = ct_squeeze_dim(t, 1);                        /* [3, 3, 3] */
    ct_tensor *sel = ct_select(q, 2, -1);                       /* [3, 3] */
    ct_tensor *e = ct_expand(ct_unsqueeze(sel, 0), CT_SHAPE(2, 3, 3));
    ct_tensor *sq = ct_mul(e, e);
    ct_tensor *r = ct_std(sq, CT_DIMS(0, -1), 1, false);       /* [3] */
    ct_tensor *o = ct_add(r, ct_norm(q, 3, CT_DIMS(-1, 0), false));
    return o;
}

static ct_tensor *gc_chain_view(ct_tensor *const *in, void *v) {
    (void)v;
    ct_tensor *x = in[0];                                /* [4, 6] contiguous */
    ct_tensor *a = ct_view(x, CT_SHAPE(2, 2, 6));        /* strides (12, 6, 1) */
    ct_tensor *b = ct_permute(a, CT_DIMS(1, 2, 0));      /* [2, 6, 2] */
    ct_tensor *c = ct_view(b, CT_SHAPE(2, 2, 3, 2));     /* splits the stride-1 dim */
    ct_tensor *d = ct_slice(c, 2, 0, 3, 2);              /* [2, 2, 2, 2] */
    ct_tensor *s1 = ct_slice(x, 1, 0, 4, 1);
    ct_tensor *s2 = ct_slice(x, 1, 2, 6, 1); /* overlaps s1 in columns 2..3 */
    ct_tensor *m = ct_mul(s1, s2);
    ct_tensor *pm = ct_prod(d, CT_DIMS(-1, 1), true);
    return ct_add(ct_sum(m, CT_NONE, false), ct_max(pm));
}

static void test_view_chains(void **state) {
    (void)state;
    for (int nc = 0; nc < 2; nc++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *x = rand_leaf((shp)SHP(3, 4, 6), -2, 2, nc);
        gradcheck_ok("permute/slice/unsqueeze/narrow/transpose/squeeze/select/expand chain",
                     gc_chain, NULL, 1, &x);
        ct_scope_end(sc);
    }
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = rand_leaf((shp)SHP(4, 6), -2, 2, false);
    gradcheck_ok("view chain with overlapping slices", gc_chain_view, NULL, 1, &x);
    ct_scope_end(sc);
}

/* ---- history, in-place rules, grad mode, accumulation, failures -------------------------- */

static void test_view_history_and_inplace(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3, 4), -1, 1, false);
    ct_tensor *v = ct_narrow(x, 0, 1, 2);
    assert_true(ct_requires_grad(v));
    assert_string_equal(ct_grad_fn_name(v), "NarrowBackward");
    /* writes through a view of a leaf that requires grad are refused */
    ct_tensor *src = ct_tensor_ones(CT_SHAPE(2, 4), CT_F64, CT_CPU);
    tu_assert_error(ct_add_(v, src), CT_ERR_AUTOGRAD, "ct_add_", "NarrowBackward");
    tu_assert_error(ct_mul_scalar_(v, 2), CT_ERR_AUTOGRAD, "ct_mul_scalar_");
    double xv[12];
    assert_int_equal(ct_tensor_copy_to_host(x, xv, sizeof xv), CT_OK);
    for (int i = 0; i < 12; i++) assert_true(xv[i] != 1.0);
    /* in no-grad mode views have no history and writes go through */
    bool prev = ct_no_grad_begin();
    ct_tensor *w = ct_narrow(x, 0, 1, 2);
    assert_false(ct_requires_grad(w));
    assert_null(ct_grad_fn_name(w));
    assert_int_equal(ct_copy_(w, src), CT_OK);
    ct_no_grad_end(prev);
    assert_int_equal(ct_tensor_copy_to_host(x, xv, sizeof xv), CT_OK);
    for (int i = 4; i < 12; i++) assert_true(xv[i] == 1.0);
    /* a view of a tensor that does not require grad records nothing */
    ct_tensor *y = ct_transpose(src, 0, 1);
    assert_false(ct_requires_grad(y));
    assert_int_equal(ct_add_(y, y), CT_OK);
    /* the detached view of a view is a plain tensor */
    ct_tensor *d = ct_detach(v);
    assert_false(ct_requires_grad(d));
    ct_tensor *ts[6] = {x, v, src, w, y, d};
    release_all(6, ts);
}

/* ct_copy_ into a view of a leaf that requires grad is refused like every
 * other in-place write, and leaves the leaf unchanged. */
static void test_copy_into_view_refused(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3, 4), -1, 1, false);
    ct_tensor *src = ct_tensor_ones(CT_SHAPE(4), CT_F64, CT_CPU);
    ct_tensor *v = ct_select(x, 0, 1);
    tu_assert_error(ct_copy_(v, src), CT_ERR_AUTOGRAD, "ct_copy_", "SelectBackward");
    tu_assert_error(ct_copy_(x, src), CT_ERR_AUTOGRAD, "ct_copy_", "leaf");
    double xv[12];
    assert_int_equal(ct_tensor_copy_to_host(x, xv, sizeof xv), CT_OK);
    for (int i = 0; i < 12; i++) assert_true(xv[i] != 1.0);
    ct_tensor *ts[3] = {x, src, v};
    release_all(3, ts);
}

static void test_accumulate_and_reuse(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3, 4), -1, 1, true);
    double *xv = tu_values(x);
    for (int round = 0; round < 2; round++) {
        ct_tensor *tt = ct_t(x);
        ct_tensor *y = ct_sum(tt, CT_DIMS(0), false); /* row sums of x */
        ct_tensor *z = ct_mean(y, CT_NONE, false);
        assert_int_equal(ct_backward(z, NULL, false), CT_OK);
        ct_tensor *ts[3] = {tt, y, z};
        release_all(3, ts);
    }
    double ref[12];
    for (int i = 0; i < 12; i++) ref[i] = 2.0 / 3;
    check_values(ct_grad(x), ref, 12, 1e-15, 0);
    ct_zero_grad(x);
    /* the same tensor through two views: both paths reach it */
    ct_tensor *a = ct_select(x, 1, 0);
    ct_tensor *b = ct_select(x, 1, 0);
    ct_tensor *p = ct_mul(a, b);
    ct_tensor *s = ct_sum(p, CT_NONE, false);
    assert_int_equal(ct_backward(s, NULL, false), CT_OK);
    double ref2[12] = {0};
    for (int r = 0; r < 3; r++) ref2[r * 4] = 2 * xv[r * 4];
    check_values(ct_grad(x), ref2, 12, 1e-15, 0);
    free(xv);
    ct_tensor *ts[5] = {x, a, b, p, s};
    release_all(5, ts);
}

static void test_non_differentiable(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3, 4), -1, 1, false);
    ct_tensor *am = ct_argmax(x, 1, false);
    ct_tensor *an = ct_argmin_all(x);
    assert_false(ct_requires_grad(am));
    assert_false(ct_requires_grad(an));
    assert_null(ct_grad_fn_name(am));
    tu_assert_error(ct_backward(am, NULL, false), CT_ERR_AUTOGRAD, "does not require grad");
    ct_tensor *idx = NULL;
    ct_tensor *m = ct_max_dim(x, 0, false, &idx);
    assert_true(ct_requires_grad(m));
    assert_false(ct_requires_grad(idx));
    /* in no-grad mode nothing records */
    bool prev = ct_no_grad_begin();
    ct_tensor *s = ct_sum(x, CT_NONE, false);
    ct_tensor *mm = ct_min_dim(x, 1, true, NULL);
    ct_no_grad_end(prev);
    assert_false(ct_requires_grad(s));
    assert_false(ct_requires_grad(mm));
    /* a reduction of a tensor not requiring grad, added to one that does */
    ct_tensor *c = tu_rand(2, (const int64_t[]){3, 4}, CT_F64, -1, 1, NULL);
    ct_tensor *sc = ct_sum(c, CT_DIMS(1), false);
    assert_false(ct_requires_grad(sc));
    ct_tensor *sx = ct_sum(x, CT_DIMS(-1), false);
    ct_tensor *y = ct_add(sc, sx);
    backward_ones(y);
    assert_null(ct_grad(c));
    double ref[12];
    for (int i = 0; i < 12; i++) ref[i] = 1;
    check_values(ct_grad(x), ref, 12, 0, 0);
    ct_tensor *ts[11] = {x, am, an, idx, m, s, mm, c, sc, sx, y};
    release_all(11, ts);
}

static void test_failure_no_graph(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(3, 4), -1, 1, false);
    cti_alloc_stats before = cti_get_alloc_stats();
    tu_assert_null_error(ct_sum(x, CT_DIMS(2), false), CT_ERR_INDEX, "ct_sum", "dim 2");
    tu_assert_null_error(ct_var(x, CT_DIMS(0, -2), 1, false), CT_ERR_INVALID_ARG, "ct_var",
                         "multiple");
    tu_assert_null_error(ct_norm(x, NAN, CT_NONE, false), CT_ERR_INVALID_ARG, "ct_norm", "NaN");
    ct_tensor *idx = NULL;
    tu_assert_null_error(ct_max_dim(x, 5, false, &idx), CT_ERR_INDEX, "ct_max_dim");
    assert_null(idx);
    tu_assert_null_error(ct_slice(x, 0, 0, 2, 0), CT_ERR_INVALID_ARG, "ct_slice", "step");
    tu_assert_null_error(ct_select(x, 1, 4), CT_ERR_INDEX, "ct_select", "index 4");
    tu_assert_null_error(ct_narrow(x, 0, 2, 2), CT_ERR_INDEX, "ct_narrow");
    tu_assert_null_error(ct_expand(x, CT_SHAPE(2, 4)), CT_ERR_SHAPE, "ct_expand");
    tu_assert_null_error(ct_permute(x, CT_DIMS(0, 0)), CT_ERR_INDEX, "ct_permute", "repeated");
    ct_tensor *t = ct_t(x);
    tu_assert_null_error(ct_view(t, CT_SHAPE(12)), CT_ERR_SHAPE, "ct_view", "ct_reshape");
    ct_tensor_release(t);
    assert_true(same_stats(before, cti_get_alloc_stats()));
    assert_true(ct_is_leaf(x));
    assert_null(ct_grad(x));
    ct_tensor_release(x);
}

/* A saved input changed in place after the forward makes backward fail. */
static void test_saved_version(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(2, 3), 0.5, 1, false);
    ct_tensor *y = ct_prod(x, CT_DIMS(1), false);
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(x, 2), CT_OK);
    ct_no_grad_end(prev);
    ct_tensor *g = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, g, false), CT_ERR_AUTOGRAD, "ProdBackward", "in-place");
    /* sum saves nothing: unaffected */
    ct_tensor *s = ct_sum(x, CT_NONE, false);
    prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(x, 2), CT_OK);
    ct_no_grad_end(prev);
    assert_int_equal(ct_backward(s, NULL, false), CT_OK);
    ct_tensor *ts[4] = {x, y, g, s};
    release_all(4, ts);
}

/* Many training-like steps leave nothing behind. */
static void test_memory_loop(void **state) {
    (void)state;
    ct_tensor *x = rand_leaf((shp)SHP(4, 5), -1, 1, false);
    cti_alloc_stats before = cti_get_alloc_stats();
    for (int i = 0; i < 20; i++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *v = ct_slice(ct_transpose(x, 0, 1), 0, 0, 5, 2);
        ct_tensor *idx = NULL;
        ct_tensor *m = ct_max_dim(v, 1, false, i % 2 ? &idx : NULL);
        ct_tensor *l = ct_add(ct_norm(m, 2, CT_NONE, false), ct_var(x, CT_DIMS(0), 1, false));
        ct_tensor *loss = ct_sum(ct_expand(ct_unsqueeze(l, 0), CT_SHAPE(2, 5)), CT_NONE, false);
        assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
        ct_scope_end(sc);
        ct_zero_grad(x);
        assert_true(same_stats(before, cti_get_alloc_stats()));
    }
    ct_tensor_release(x);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gradcheck_sum_mean, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_prod, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_var_std, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_max_min, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prod_zeros, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_subgradient_at_zero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_std_of_constant, setup, teardown),
        cmocka_unit_test_setup_teardown(test_var_std_of_constant_exact, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_min_ties, setup, teardown),
        cmocka_unit_test_setup_teardown(test_max_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce_empty, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck_views, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_grad_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_chains, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_history_and_inplace, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_into_view_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accumulate_and_reuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_non_differentiable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_no_graph, setup, teardown),
        cmocka_unit_test_setup_teardown(test_saved_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_loop, setup, teardown),
    };
    return tu_run_tests(tests);
}
