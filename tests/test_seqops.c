/* Tests of tril/triu, cumsum, topk and multinomial against float64
 * references written here: every dtype, random shapes (odd sizes, size-1
 * dims), non-contiguous inputs, every dim; gradients by finite differences
 * in float64; multinomial's samples against the inverse-CDF rule of its
 * contract, and their distribution against chi-square bounds (fixed seeds:
 * a sampler off by one category or with wrong weights fails by far); bad
 * inputs with status and message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static ct_tensor *chk(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

/* A CPU tensor of dt from vals, non-contiguous when nc. */
static ct_tensor *make(const double *vals, int nd, const int64_t *shape, ct_dtype dt, bool nc) {
    ct_tensor *t = chk(tu_from_f64(vals, nd, shape, dt));
    if (!nc) return t;
    ct_tensor *v = chk(tu_noncontig(t));
    ct_tensor_release(t);
    return v;
}

static void rand_shape(int nd, int64_t lo, int64_t hi, int64_t *shape) {
    for (int i = 0; i < nd; i++) shape[i] = tu_randint(lo, hi + 1);
}

static void expect_values(ct_tensor *t, const double *ref, int64_t n, double rtol, double atol) {
    assert_int_equal(ct_tensor_numel(t), n);
    double *g = tu_values(t);
    tu_assert_close(g, ref, n, rtol, atol);
    free(g);
}

/* ---- tril / triu ----------------------------------------------------------------------------- */

static void tri_case(bool upper, ct_dtype dt, int nd, const int64_t *shape, int64_t diag, bool nc) {
    int64_t n = tu_numel(nd, shape), R = shape[nd - 2], C = shape[nd - 1];
    double *v = tu_rand_vals(n, dt, -9, 9);
    for (int64_t i = 0; i < n; i++)
        if (v[i] == 0 && dt != CT_BOOL) v[i] = 1; /* zeros must come from the op */
    ct_tensor *x = make(v, nd, shape, dt, nc);
    ct_tensor *y = chk(upper ? ct_triu(x, diag) : ct_tril(x, diag));
    assert_int_equal(ct_tensor_dtype(y), dt);
    check_shape(y, nd, shape);
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    for (int64_t e = 0; e < n; e++) {
        int64_t j = e % C, i = (e / C) % R;
        bool keep = upper ? j - i >= diag : j - i <= diag;
        ref[e] = keep ? v[e] : 0;
    }
    expect_values(y, ref, n, 0, 0);
    free(ref);
    free(v);
    ct_tensor_release(x);
    ct_tensor_release(y);
}

static void test_tril_triu_values(void **state) {
    (void)state;
    static const int64_t diags[] = {0, 1, -1, 2, -3, 5, -7, 100, -100, INT64_MAX, INT64_MIN};
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        for (int rep = 0; rep < 6; rep++) {
            int nd = 2 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 7, shape);
            int64_t diag = diags[tu_randint(0, sizeof diags / sizeof diags[0])];
            tri_case(rep & 1, dt, nd, shape, diag, rep % 3 == 1);
        }
    }
    /* a tall and a wide matrix, every diagonal that matters */
    for (int64_t d = -6; d <= 6; d++) {
        tri_case(false, CT_F32, 2, (const int64_t[]){5, 3}, d, false);
        tri_case(true, CT_I64, 3, (const int64_t[]){2, 3, 5}, d, true);
    }
    /* empty */
    ct_tensor *e = chk(ct_tensor_zeros(3, (const int64_t[]){2, 0, 3}, CT_F32, CT_CPU));
    ct_tensor *y = chk(ct_tril(e, 0));
    assert_int_equal(ct_tensor_numel(y), 0);
    ct_tensor_release(y);
    ct_tensor_release(e);
}

static ct_tensor *fn_tril(ct_tensor *const *in, void *ctx) { return ct_tril(in[0], *(int64_t *)ctx); }
static ct_tensor *fn_triu(ct_tensor *const *in, void *ctx) { return ct_triu(in[0], *(int64_t *)ctx); }

static void test_tril_triu_grad(void **state) {
    (void)state;
    for (int64_t d = -2; d <= 2; d++) {
        double *v = tu_rand_vals(2 * 3 * 4, CT_F64, -1, 1);
        ct_tensor *x = leaf_of(v, 3, (const int64_t[]){2, 3, 4}, CT_F64);
        gradcheck_ok("tril", fn_tril, &d, 1, &x);
        gradcheck_ok("triu", fn_triu, &d, 1, &x);
        /* the gradient is exactly the mask */
        ct_tensor *x2 = leaf_of(v, 3, (const int64_t[]){2, 3, 4}, CT_F64);
        ct_tensor *y = chk(ct_tril(x2, d));
        backward_ones(y);
        double *g = tu_values(ct_grad(x2));
        for (int64_t e = 0; e < 24; e++) {
            int64_t j = e % 4, i = (e / 4) % 3;
            assert_true(g[e] == (j - i <= d ? 1.0 : 0.0));
        }
        free(g);
        release_all(3, (ct_tensor *[]){y, x, x2});
        free(v);
    }
}

static void test_tril_triu_errors(void **state) {
    (void)state;
    tu_assert_null_error(ct_tril(NULL, 0), CT_ERR_INVALID_ARG, "ct_tril");
    ct_tensor *x = chk(ct_tensor_zeros(1, (const int64_t[]){4}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_tril(x, 0), CT_ERR_SHAPE, "ct_tril", "at least 2 dims", "[4]");
    tu_assert_null_error(ct_triu(x, 0), CT_ERR_SHAPE, "ct_triu", "at least 2 dims");
    ct_tensor_release(x);
}

/* ---- cumsum ---------------------------------------------------------------------------------- */

static void cumsum_case(ct_dtype dt, int nd, const int64_t *shape, int dim, bool nc) {
    int64_t n = tu_numel(nd, shape);
    double *v = tu_rand_vals(n, dt, dt == CT_I32 || dt == CT_I64 ? -1000 : -2, dt == CT_I32 || dt == CT_I64 ? 1000 : 2);
    ct_tensor *x = make(v, nd, shape, dt, nc);
    ct_tensor *y = chk(ct_cumsum(x, dim));
    bool fl = ct_dtype_is_floating(dt);
    assert_int_equal(ct_tensor_dtype(y), fl ? dt : CT_I64);
    check_shape(y, nd, shape);
    int d = dim < 0 ? dim + (nd ? nd : 1) : dim;
    int64_t len = nd ? shape[d] : 1, inner = 1;
    for (int i = d + 1; i < nd; i++) inner *= shape[i];
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    double *abs_ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    for (int64_t e = 0; e < n; e++) {
        int64_t i = (e / inner) % len, base = e - i * inner;
        double s = 0, a = 0;
        for (int64_t j = 0; j <= i; j++) {
            s += v[base + j * inner];
            a += fabs(v[base + j * inner]);
        }
        ref[e] = s;
        abs_ref[e] = a;
    }
    double *g = tu_values(y);
    for (int64_t e = 0; e < n; e++) {
        /* f16/bf16: the sum in f32, one rounding of the result; f32: n roundings */
        double tol = !fl ? 0
                     : dt == CT_F64 ? 1e-13 * abs_ref[e]
                     : dt == CT_F32 ? 1e-6 * abs_ref[e] * (1 + len / 16.0)
                                    : tu_rtol(dt) * fabs(ref[e]) + 1e-5 * abs_ref[e] + 1e-6;
        if (!(fabs(g[e] - ref[e]) <= tol)) {
            fprintf(stderr, "cumsum %s dim %d element %lld: got %.17g, expected %.17g\n",
                    ct_dtype_name(dt), dim, (long long)e, g[e], ref[e]);
            fail();
        }
    }
    free(g);
    free(ref);
    free(abs_ref);
    free(v);
    ct_tensor_release(x);
    ct_tensor_release(y);
}

static void test_cumsum_values(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        for (int rep = 0; rep < 8; rep++) {
            int nd = 1 + rep % 4;
            int64_t shape[4];
            rand_shape(nd, 1, 9, shape);
            int dim = (int)tu_randint(-nd, nd);
            cumsum_case(dt, nd, shape, dim, rep % 2 == 1);
        }
        cumsum_case(dt, 0, NULL, 0, false);
        cumsum_case(dt, 0, NULL, -1, false);
        cumsum_case(dt, 1, (const int64_t[]){1000}, 0, false); /* a long run */
        cumsum_case(dt, 3, (const int64_t[]){3, 300, 5}, 1, true);
    }
    /* int64 sums past int32 */
    int64_t big[3] = {INT32_MAX, INT32_MAX, 5};
    ct_tensor *x = chk(ct_tensor_from_data(big, CT_I64, 1, (const int64_t[]){3}));
    ct_tensor *y = chk(ct_cumsum(x, 0));
    expect_values(y, (const double[]){2147483647.0, 4294967294.0, 4294967299.0}, 3, 0, 0);
    ct_tensor_release(x);
    ct_tensor_release(y);
    /* bool counts */
    uint8_t b[5] = {1, 0, 1, 1, 0};
    x = chk(ct_tensor_from_data(b, CT_BOOL, 1, (const int64_t[]){5}));
    y = chk(ct_cumsum(x, -1));
    assert_int_equal(ct_tensor_dtype(y), CT_I64);
    expect_values(y, (const double[]){1, 1, 2, 3, 3}, 5, 0, 0);
    ct_tensor_release(x);
    ct_tensor_release(y);
    /* a leading -0 stays -0 in every floating dtype (the CUDA kernels agree bit for bit) */
    for (size_t di = 0; di < 4; di++) {
        ct_tensor *z = chk(tu_from_f64((const double[]){-0.0, 1}, 1, (const int64_t[]){2},
                                       tu_float_dtypes[di]));
        ct_tensor *zy = chk(ct_cumsum(z, 0));
        double *zv = tu_values(zy);
        assert_true(zv[0] == 0 && signbit(zv[0]) && zv[1] == 1);
        free(zv);
        ct_tensor_release(z);
        ct_tensor_release(zy);
    }
    /* f16 accumulates in f32: 4096 ones reach 4096, where an f16 sum stops at 2048 */
    ct_tensor *o = chk(ct_tensor_ones(1, (const int64_t[]){4096}, CT_F16, CT_CPU));
    y = chk(ct_cumsum(o, 0));
    double *g = tu_values(y);
    assert_true(g[4095] == 4096.0);
    free(g);
    ct_tensor_release(o);
    ct_tensor_release(y);
}

typedef struct dim_ctx {
    int dim;
} dim_ctx;
static ct_tensor *fn_cumsum(ct_tensor *const *in, void *ctx) {
    return ct_cumsum(in[0], ((dim_ctx *)ctx)->dim);
}
static ct_tensor *fn_cumsum_bw(ct_tensor *const *in, void *ctx) {
    return ct_cumsum_backward(in[0], ((dim_ctx *)ctx)->dim);
}

static void test_cumsum_grad(void **state) {
    (void)state;
    for (int dim = -3; dim < 3; dim++) {
        double *v = tu_rand_vals(2 * 3 * 4, CT_F64, -1, 1);
        ct_tensor *x = leaf_of(v, 3, (const int64_t[]){2, 3, 4}, CT_F64);
        dim_ctx c = {dim};
        gradcheck_ok("cumsum", fn_cumsum, &c, 1, &x);
        gradcheck_ok("cumsum_backward", fn_cumsum_bw, &c, 1, &x);
        ct_tensor_release(x);
        free(v);
    }
    /* the gradient of a 1-d cumsum under ones: n - i */
    double v[5] = {1, 2, 3, 4, 5};
    ct_tensor *x = leaf_of(v, 1, (const int64_t[]){5}, CT_F32);
    ct_tensor *y = chk(ct_cumsum(x, 0));
    backward_ones(y);
    expect_values(ct_grad(x), (const double[]){5, 4, 3, 2, 1}, 5, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

static void test_cumsum_errors(void **state) {
    (void)state;
    tu_assert_null_error(ct_cumsum(NULL, 0), CT_ERR_INVALID_ARG, "ct_cumsum");
    ct_tensor *x = chk(ct_tensor_zeros(2, (const int64_t[]){2, 3}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_cumsum(x, 2), CT_ERR_INDEX, "ct_cumsum", "dim 2 out of range");
    tu_assert_null_error(ct_cumsum(x, -3), CT_ERR_INDEX, "ct_cumsum", "dim -3 out of range");
    ct_tensor *i = chk(ct_tensor_zeros(1, (const int64_t[]){3}, CT_I32, CT_CPU));
    tu_assert_null_error(ct_cumsum_backward(i, 0), CT_ERR_DTYPE, "ct_cumsum_backward", "floating");
    ct_tensor_release(i);
    ct_tensor_release(x);
}

/* ---- topk ---------------------------------------------------------------------------------------- */

typedef struct vi {
    double v;
    int64_t i;
} vi;
static bool ref_largest;
/* best first: NaN above every number, ties by lower index */
static int cmp_vi(const void *pa, const void *pb) {
    const vi *a = pa, *b = pb;
    bool an = isnan(a->v), bn = isnan(b->v);
    int c;
    if (an || bn) c = an && bn ? 0 : an ? 1 : -1; /* +1: a is larger */
    else c = a->v > b->v ? 1 : a->v < b->v ? -1 : 0;
    if (!ref_largest) c = -c; /* smallest first: NaN, the largest, comes last */
    if (c) return -c;
    return a->i < b->i ? -1 : a->i > b->i ? 1 : 0;
}

/* Values for topk: with ties, NaN, +-0 and infinities when special. */
static double *topk_vals(int64_t n, ct_dtype dt, bool special) {
    double *v = tu_rand_vals(n, dt, -100, 100);
    if (!special) return v;
    for (int64_t i = 0; i < n; i++) {
        int r = (int)tu_randint(0, 10);
        if (r == 0) v[i] = (double)tu_randint(-3, 4); /* ties */
        else if (r == 1 && ct_dtype_is_floating(dt)) v[i] = NAN;
        else if (r == 2 && ct_dtype_is_floating(dt)) v[i] = tu_randint(0, 2) ? 0.0 : -0.0;
        else if (r == 3 && ct_dtype_is_floating(dt)) v[i] = tu_randint(0, 2) ? INFINITY : -INFINITY;
    }
    return v;
}

static void topk_case(ct_dtype dt, int nd, const int64_t *shape, int dim, int64_t k, bool largest,
                      bool nc, bool special) {
    int64_t n = tu_numel(nd, shape);
    double *v = topk_vals(n, dt, special);
    ct_tensor *x = make(v, nd, shape, dt, nc);
    ct_tensor *idx = NULL;
    ct_tensor *y = chk(ct_topk(x, k, dim, largest, true, &idx));
    assert_non_null(idx);
    int d = dim < 0 ? dim + (nd ? nd : 1) : dim;
    int64_t oshape[4];
    for (int i = 0; i < nd; i++) oshape[i] = i == d ? k : shape[i];
    check_shape(y, nd, oshape);
    check_shape(idx, nd, oshape);
    assert_int_equal(ct_tensor_dtype(y), dt);
    assert_int_equal(ct_tensor_dtype(idx), CT_I64);
    int64_t len = nd ? shape[d] : 1, inner = 1;
    for (int i = d + 1; i < nd; i++) inner *= shape[i];
    int64_t rows = len ? n / len : 0, on = rows * k;
    double *gv = tu_values(y), *gi = tu_values(idx);
    vi *row = malloc((size_t)(len ? len : 1) * sizeof *row);
    ref_largest = largest;
    for (int64_t r = 0; r < rows; r++) {
        int64_t o = r / inner, in = r % inner;
        for (int64_t j = 0; j < len; j++) row[j] = (vi){v[(o * len + j) * inner + in], j};
        qsort(row, (size_t)len, sizeof *row, cmp_vi);
        for (int64_t j = 0; j < k; j++) {
            int64_t e = (o * k + j) * inner + in;
            double got = gv[e], want = row[j].v;
            bool same = isnan(want) ? isnan(got) : got == want && signbit(got) == signbit(want);
            if (!same || gi[e] != (double)row[j].i) {
                fprintf(stderr, "topk %s largest %d row %lld rank %lld: got %g at %g, expected %g at %lld\n",
                        ct_dtype_name(dt), largest, (long long)r, (long long)j, got, gi[e], want,
                        (long long)row[j].i);
                fail();
            }
        }
    }
    (void)on;
    free(row);
    free(gv);
    free(gi);
    free(v);
    ct_tensor_release(x);
    ct_tensor_release(y);
    ct_tensor_release(idx);
}

static void test_topk_values(void **state) {
    (void)state;
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16, CT_I32, CT_I64};
    for (size_t di = 0; di < sizeof dts / sizeof dts[0]; di++) {
        for (int rep = 0; rep < 10; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 12, shape);
            int dim = (int)tu_randint(-nd, nd);
            int d = dim < 0 ? dim + nd : dim;
            int64_t k = rep == 0 ? 0 : rep == 1 ? shape[d] : tu_randint(0, shape[d] + 1);
            topk_case(dts[di], nd, shape, dim, k, rep % 2 == 0, rep % 3 == 2, rep % 4 != 3);
        }
        topk_case(dts[di], 0, NULL, 0, 1, true, false, false);
        topk_case(dts[di], 2, (const int64_t[]){3, 300}, 1, 17, false, true, true);
    }
    /* a vocabulary row: the sampler's shape */
    topk_case(CT_F32, 2, (const int64_t[]){3, 50304}, -1, 50, true, false, false);
    topk_case(CT_BF16, 2, (const int64_t[]){2, 50304}, 1, 40, true, false, true);
    topk_case(CT_F32, 1, (const int64_t[]){5000}, 0, 4000, false, false, true);
    /* NaN first for largest, last for smallest */
    double v[5] = {1, NAN, 3, -2, NAN};
    ct_tensor *x = chk(tu_from_f64(v, 1, (const int64_t[]){5}, CT_F32));
    ct_tensor *idx = NULL;
    ct_tensor *y = chk(ct_topk(x, 3, 0, true, true, &idx));
    expect_values(idx, (const double[]){1, 4, 2}, 3, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(idx);
    y = chk(ct_topk(x, 4, 0, false, false, &idx));
    expect_values(idx, (const double[]){3, 0, 2, 1}, 4, 0, 0);
    expect_values(y, (const double[]){-2, 1, 3, NAN}, 4, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(idx);
    /* without indices */
    y = chk(ct_topk(x, 2, -1, false, true, NULL));
    expect_values(y, (const double[]){-2, 1}, 2, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

typedef struct topk_ctx {
    int64_t k;
    int dim;
    bool largest;
} topk_ctx;
static ct_tensor *fn_topk(ct_tensor *const *in, void *ctx) {
    topk_ctx *c = ctx;
    return ct_topk(in[0], c->k, c->dim, c->largest, true, NULL);
}

static void test_topk_grad(void **state) {
    (void)state;
    for (int dim = -2; dim < 2; dim++) {
        /* distinct values, far apart, so finite differences do not reorder them */
        double v[15];
        for (int i = 0; i < 15; i++) v[i] = (double)((i * 7) % 15) + 0.25 * tu_uniform(-1, 1);
        ct_tensor *x = leaf_of(v, 2, (const int64_t[]){3, 5}, CT_F64);
        topk_ctx c = {.k = 2, .dim = dim, .largest = dim % 2 == 0};
        gradcheck_ok("topk", fn_topk, &c, 1, &x);
        ct_tensor_release(x);
    }
    /* the gradient lands at the indices, zero elsewhere */
    double v[6] = {3, 1, 4, 1, 5, 9};
    ct_tensor *x = leaf_of(v, 1, (const int64_t[]){6}, CT_F32);
    ct_tensor *y = chk(ct_topk(x, 2, 0, true, true, NULL));
    backward_ones(y);
    expect_values(ct_grad(x), (const double[]){0, 0, 0, 0, 1, 1}, 6, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

static void test_topk_errors(void **state) {
    (void)state;
    ct_tensor *x = chk(ct_tensor_zeros(2, (const int64_t[]){2, 5}, CT_F32, CT_CPU));
    ct_tensor *idx = NULL;
    tu_assert_null_error(ct_topk(NULL, 1, 0, true, true, NULL), CT_ERR_INVALID_ARG, "ct_topk");
    tu_assert_null_error(ct_topk(x, 6, 1, true, true, &idx), CT_ERR_INVALID_ARG, "ct_topk",
                         "k 6 is out of range for dim 1 of size 5");
    assert_null(idx);
    tu_assert_null_error(ct_topk(x, -1, -1, true, true, NULL), CT_ERR_INVALID_ARG,
                         "k -1 is out of range");
    tu_assert_null_error(ct_topk(x, 1, 2, true, true, NULL), CT_ERR_INDEX, "ct_topk",
                         "dim 2 out of range");
    ct_tensor *b = chk(ct_tensor_zeros(1, (const int64_t[]){4}, CT_BOOL, CT_CPU));
    tu_assert_null_error(ct_topk(b, 1, 0, true, true, NULL), CT_ERR_DTYPE, "ct_topk", "bool");
    /* topk_backward: indices out of range, dtypes, shapes */
    ct_tensor *g = chk(ct_tensor_ones(2, (const int64_t[]){2, 2}, CT_F32, CT_CPU));
    int64_t bad[4] = {0, 1, 5, 2};
    ct_tensor *bi = chk(ct_tensor_from_data(bad, CT_I64, 2, (const int64_t[]){2, 2}));
    tu_assert_null_error(ct_topk_backward(g, bi, 1, 5), CT_ERR_INDEX, "ct_topk_backward",
                         "index 5 is out of range for dim 1 of size 5");
    bad[2] = -1;
    ct_tensor *bi2 = chk(ct_tensor_from_data(bad, CT_I64, 2, (const int64_t[]){2, 2}));
    tu_assert_null_error(ct_topk_backward(g, bi2, 1, 5), CT_ERR_INDEX, "index -1 is out of range");
    tu_assert_null_error(ct_topk_backward(g, b, 1, 5), CT_ERR_DTYPE, "ct_topk_backward", "int64");
    tu_assert_null_error(ct_topk_backward(g, bi, 1, 1), CT_ERR_INVALID_ARG, "ct_topk_backward",
                         "size 1 is smaller");
    ct_tensor *i3 = chk(ct_tensor_zeros(1, (const int64_t[]){4}, CT_I64, CT_CPU));
    tu_assert_null_error(ct_topk_backward(g, i3, 1, 5), CT_ERR_SHAPE, "ct_topk_backward",
                         "must have grad_values' shape");
    /* good indices give the scatter */
    bad[2] = 4;
    ct_tensor *gi = chk(ct_tensor_from_data(bad, CT_I64, 2, (const int64_t[]){2, 2}));
    ct_tensor *dx = chk(ct_topk_backward(g, gi, -1, 5));
    expect_values(dx, (const double[]){1, 1, 0, 0, 0, 0, 0, 1, 0, 1}, 10, 0, 0);
    release_all(8, (ct_tensor *[]){x, b, g, bi, bi2, i3, gi, dx});
}

/* ---- multinomial ------------------------------------------------------------------------------------ */

/* The contract's rule with a plain f64 running sum: the first j with
 * cdf(j) > u * total. (The kernels sum in chunks; the two differ only when
 * u * total falls within a rounding of a boundary.) */
static int64_t ref_inverse_cdf(const double *w, int64_t n, double u) {
    double total = 0;
    for (int64_t j = 0; j < n; j++) total += w[j];
    double t = u * total, run = 0;
    for (int64_t j = 0; j < n; j++) {
        run += w[j];
        if (run > t) return j;
    }
    for (int64_t j = n - 1; j >= 0; j--)
        if (w[j] > 0) return j;
    return 0;
}

static double ref_uniform(uint64_t seed, uint64_t draw) {
    uint32_t a = ct_philox(seed, draw), b = ct_philox(seed, draw + 1);
    return ((double)(a >> 5) * 67108864.0 + (double)(b >> 6)) * 0x1p-53;
}

static void test_multinomial_rule(void **state) {
    (void)state;
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        for (int rep = 0; rep < 4; rep++) {
            int64_t rows = tu_randint(1, 5), n = rep == 3 ? 1000 : tu_randint(1, 40);
            int64_t S = tu_randint(1, 30);
            double *w = tu_rand_vals(rows * n, dt, 0, 3);
            for (int64_t i = 0; i < rows * n; i++)
                if (tu_randint(0, 4) == 0) w[i] = 0;
            for (int64_t r = 0; r < rows; r++) w[r * n + tu_randint(0, n)] = 1; /* a positive one */
            ct_tensor *p = make(w, 2, (const int64_t[]){rows, n}, dt, rep == 1);
            ct_generator *g = ct_generator_new(1000 + (uint64_t)rep);
            ct_generator_set_offset(g, 5 * (uint64_t)rep); /* odd ones too: pairs across blocks */
            uint64_t off = ct_generator_offset(g);
            ct_tensor *s = chk(ct_multinomial(p, S, true, g));
            check_shape(s, 2, (const int64_t[]){rows, S});
            assert_int_equal(ct_tensor_dtype(s), CT_I64);
            assert_true(ct_generator_offset(g) >= off + 2 * (uint64_t)(rows * S));
            double *got = tu_values(s);
            for (int64_t r = 0; r < rows; r++)
                for (int64_t k = 0; k < S; k++) {
                    double u = ref_uniform(1000 + (uint64_t)rep, off + 2 * (uint64_t)(r * S + k));
                    int64_t want = ref_inverse_cdf(w + r * n, n, u);
                    assert_int_equal((int64_t)got[r * S + k], want);
                    assert_true(w[r * n + want] > 0);
                }
            /* the same generator state draws the same samples; the next call others */
            ct_generator_set_offset(g, off);
            ct_tensor *s2 = chk(ct_multinomial(p, S, true, g));
            double *got2 = tu_values(s2);
            assert_memory_equal(got, got2, (size_t)(rows * S) * sizeof(double));
            free(got);
            free(got2);
            free(w);
            ct_generator_free(g);
            release_all(3, (ct_tensor *[]){p, s, s2});
        }
    }
}

/* Pearson's statistic of counts against probabilities p (categories with
 * p == 0 must have no count). */
static double chi_square(const int64_t *count, const double *p, int64_t n, int64_t N) {
    double x2 = 0;
    for (int64_t j = 0; j < n; j++) {
        if (p[j] == 0) {
            assert_int_equal(count[j], 0);
            continue;
        }
        double e = p[j] * (double)N;
        x2 += ((double)count[j] - e) * ((double)count[j] - e) / e;
    }
    return x2;
}

static void test_multinomial_distribution(void **state) {
    (void)state;
    /* with replacement: 9 positive categories (8 degrees of freedom); the
     * 1e-6 quantile of chi-square(8) is about 41; a sampler shifted by one
     * category or drawing uniformly gives thousands */
    double w[10] = {1, 0, 2, 3, 0.5, 7, 1, 1, 4, 0.25};
    double tot = 0, p[10];
    for (int j = 0; j < 10; j++) tot += w[j];
    for (int j = 0; j < 10; j++) p[j] = w[j] / tot;
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        ct_tensor *pt = make(w, 1, (const int64_t[]){10}, dt, false);
        ct_generator *g = ct_generator_new(42 + di);
        int64_t N = 200000;
        ct_tensor *s = chk(ct_multinomial(pt, N, true, g));
        check_shape(s, 1, (const int64_t[]){N});
        double *v = tu_values(s);
        int64_t count[10] = {0};
        for (int64_t i = 0; i < N; i++) count[(int64_t)v[i]]++;
        double x2 = chi_square(count, p, 10, N);
        if (x2 > 41) fprintf(stderr, "chi-square %g\n", x2);
        assert_true(x2 < 41);
        free(v);
        ct_generator_free(g);
        ct_tensor_release(s);
        ct_tensor_release(pt);
    }
    /* without replacement, 2 of 5 in 40000 rows: the first draw follows p,
     * the second sum_i p_i p_j / (1 - p_i) over i != j; both samples differ */
    double w5[5] = {5, 1, 0, 3, 1}, p5[5], q5[5] = {0};
    double t5 = 10;
    for (int j = 0; j < 5; j++) p5[j] = w5[j] / t5;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 5; j++)
            if (i != j && p5[i] < 1) q5[j] += p5[i] * p5[j] / (1 - p5[i]);
    int64_t R = 40000;
    double *rows = malloc((size_t)R * 5 * sizeof *rows);
    for (int64_t r = 0; r < R; r++) memcpy(rows + r * 5, w5, sizeof w5);
    ct_tensor *pt = make(rows, 2, (const int64_t[]){R, 5}, CT_F32, false);
    ct_generator *g = ct_generator_new(7);
    ct_tensor *s = chk(ct_multinomial(pt, 2, false, g));
    check_shape(s, 2, (const int64_t[]){R, 2});
    double *v = tu_values(s);
    int64_t c0[5] = {0}, c1[5] = {0};
    for (int64_t r = 0; r < R; r++) {
        assert_true(v[2 * r] != v[2 * r + 1]);
        c0[(int64_t)v[2 * r]]++;
        c1[(int64_t)v[2 * r + 1]]++;
    }
    /* 3 degrees of freedom each: the 1e-6 quantile is about 30.7 */
    double x0 = chi_square(c0, p5, 5, R), x1 = chi_square(c1, q5, 5, R);
    if (x0 > 31 || x1 > 31) fprintf(stderr, "chi-square %g %g\n", x0, x1);
    assert_true(x0 < 31 && x1 < 31);
    /* all of them: a permutation of the non-zero categories */
    ct_tensor *all = chk(ct_multinomial(pt, 4, false, g));
    double *va = tu_values(all);
    for (int64_t r = 0; r < 50; r++) {
        int seen = 0;
        for (int k = 0; k < 4; k++) seen |= 1 << (int)va[4 * r + k];
        assert_int_equal(seen, 1 | 2 | 8 | 16);
    }
    free(va);
    free(v);
    free(rows);
    ct_generator_free(g);
    release_all(3, (ct_tensor *[]){s, pt, all});
}

static void test_multinomial_errors(void **state) {
    (void)state;
    const char *op = "ct_multinomial";
    tu_assert_null_error(ct_multinomial(NULL, 1, true, NULL), CT_ERR_INVALID_ARG, op);
    double w[4] = {1, 2, 0, 1};
    ct_tensor *p = chk(tu_from_f64(w, 1, (const int64_t[]){4}, CT_F32));
    tu_assert_null_error(ct_multinomial(p, 0, true, NULL), CT_ERR_INVALID_ARG, op,
                         "num_samples must be positive, got 0");
    tu_assert_null_error(ct_multinomial(p, 5, false, NULL), CT_ERR_INVALID_ARG, op,
                         "cannot draw 5 samples without replacement from 4 categories");
    tu_assert_null_error(ct_multinomial(p, 4, false, NULL), CT_ERR_INVALID_ARG, op,
                         "cannot draw 4 samples without replacement from row 0",
                         "3 non-zero probabilities");
    ct_tensor *i = chk(ct_tensor_ones(1, (const int64_t[]){4}, CT_I64, CT_CPU));
    tu_assert_null_error(ct_multinomial(i, 1, true, NULL), CT_ERR_DTYPE, op, "floating");
    ct_tensor *p3 = chk(ct_tensor_ones(3, (const int64_t[]){2, 2, 2}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_multinomial(p3, 1, true, NULL), CT_ERR_SHAPE, op, "1-d or 2-d");
    ct_tensor *p0 = chk(ct_tensor_ones(2, (const int64_t[]){2, 0}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_multinomial(p0, 1, true, NULL), CT_ERR_SHAPE, op, "no categories");
    static const double bad[] = {-1, NAN, INFINITY};
    for (int b = 0; b < 3; b++) {
        double wb[6] = {1, 1, 1, 1, 1, 1};
        wb[4] = bad[b];
        ct_tensor *pb = chk(tu_from_f64(wb, 2, (const int64_t[]){2, 3}, CT_F64));
        uint64_t off = ct_generator_offset(NULL);
        tu_assert_null_error(ct_multinomial(pb, 2, b == 0, NULL), CT_ERR_INVALID_ARG, op,
                             "finite and non-negative", "row 1, element 1");
        (void)off;
        ct_tensor_release(pb);
    }
    double wz[6] = {1, 1, 1, 0, 0, 0};
    ct_tensor *pz = chk(tu_from_f64(wz, 2, (const int64_t[]){2, 3}, CT_BF16));
    tu_assert_null_error(ct_multinomial(pz, 1, true, NULL), CT_ERR_INVALID_ARG, op,
                         "row 1 of the probabilities sums to 0");
    /* empty batch: an empty result */
    ct_tensor *pe = chk(ct_tensor_ones(2, (const int64_t[]){0, 3}, CT_F32, CT_CPU));
    ct_tensor *se = chk(ct_multinomial(pe, 2, true, NULL));
    check_shape(se, 2, (const int64_t[]){0, 2});
    release_all(7, (ct_tensor *[]){p, i, p3, p0, pz, pe, se});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_tril_triu_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tril_triu_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tril_triu_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cumsum_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cumsum_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cumsum_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_topk_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_topk_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_topk_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multinomial_rule, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multinomial_distribution, setup, teardown),
        cmocka_unit_test_setup_teardown(test_multinomial_errors, setup, teardown),
    };
    tu_seed();
    return tu_run_tests(tests);
}
