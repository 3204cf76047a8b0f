/* Tests of sort, argsort, kthvalue, median, cumprod, logsumexp, all, any,
 * amax/amin, count_nonzero, nonzero and unique against float64 references
 * written here: every dtype, random shapes (size-1 dims, short rows and rows
 * long enough for the radix sort), every dim, non-contiguous inputs, outputs
 * into poisoned memory, ties, NaN, +-0 and infinities; gradients by finite
 * differences in float64 and by their closed forms (ties split evenly, the
 * zeros of cumprod); bad inputs with status and message. */
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

/* Frees CPU blocks of about bytes filled with NaN bits, so that the outputs
 * allocated next start as garbage. */
static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = chk(ct_tensor_empty(1, &n, CT_F32, CT_CPU));
    assert_int_equal(ct_fill_(t, NAN), CT_OK);
    ct_tensor_release(t);
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

/* Values with ties, and NaN, +-0 and infinities for floating dtypes. */
static double *special_vals(int64_t n, ct_dtype dt) {
    double *v = tu_rand_vals(n, dt, -100, 100);
    for (int64_t i = 0; i < n; i++) {
        int r = (int)tu_randint(0, 10);
        if (r <= 1) v[i] = (double)tu_randint(-3, 4); /* ties */
        else if (r == 2 && ct_dtype_is_floating(dt)) v[i] = NAN;
        else if (r == 3 && ct_dtype_is_floating(dt)) v[i] = tu_randint(0, 2) ? 0.0 : -0.0;
        else if (r == 4 && ct_dtype_is_floating(dt)) v[i] = tu_randint(0, 2) ? INFINITY : -INFINITY;
        if (dt == CT_BOOL) v[i] = v[i] != 0;
    }
    return v;
}

/* The geometry of a slicing along d: rows = outer * inner lines of len. */
typedef struct lines {
    int64_t len, inner, rows;
} lines;

static lines lines_of(int nd, const int64_t *shape, int d) {
    lines L = {.len = nd ? shape[d] : 1, .inner = 1};
    for (int i = d + 1; i < nd; i++) L.inner *= shape[i];
    int64_t n = tu_numel(nd, shape);
    L.rows = L.len ? n / L.len : 0;
    return L;
}

/* Element j of line r in row-major order. */
static int64_t at(lines L, int64_t r, int64_t j) {
    return (r / L.inner * L.len + j) * L.inner + r % L.inner;
}

static int wrap(int dim, int nd) { return dim < 0 ? dim + (nd ? nd : 1) : dim; }

/* ---- sort / argsort --------------------------------------------------------------------------- */

typedef struct vi {
    double v;
    int64_t i;
} vi;
static bool ref_descending;
/* ascending (descending) with NaN the largest, -0 == +0, ties by index */
static int cmp_vi(const void *pa, const void *pb) {
    const vi *a = pa, *b = pb;
    bool an = isnan(a->v), bn = isnan(b->v);
    int c;
    if (an || bn) c = an && bn ? 0 : an ? 1 : -1;
    else c = a->v > b->v ? 1 : a->v < b->v ? -1 : 0;
    if (ref_descending) c = -c;
    if (c) return c;
    return a->i < b->i ? -1 : a->i > b->i ? 1 : 0;
}

static bool same_value(double got, double want) {
    return isnan(want) ? isnan(got) : got == want && signbit(got) == signbit(want);
}

static void sort_case(ct_dtype dt, int nd, const int64_t *shape, int dim, bool desc, bool nc) {
    int64_t n = tu_numel(nd, shape);
    double *v = special_vals(n, dt);
    ct_tensor *x = make(v, nd, shape, dt, nc);
    poison(n * 16);
    ct_tensor *idx = NULL;
    ct_tensor *y = chk(ct_sort(x, dim, desc, tu_randint(0, 2), &idx));
    check_shape(y, nd, shape);
    check_shape(idx, nd, shape);
    assert_int_equal(ct_tensor_dtype(y), dt);
    assert_int_equal(ct_tensor_dtype(idx), CT_I64);
    ct_tensor *as = chk(ct_argsort(x, dim, desc, true));
    lines L = lines_of(nd, shape, wrap(dim, nd));
    double *gv = tu_values(y), *gi = tu_values(idx), *ga = tu_values(as);
    vi *row = malloc((size_t)(L.len ? L.len : 1) * sizeof *row);
    ref_descending = desc;
    for (int64_t r = 0; r < L.rows; r++) {
        for (int64_t j = 0; j < L.len; j++) row[j] = (vi){v[at(L, r, j)], j};
        qsort(row, (size_t)L.len, sizeof *row, cmp_vi);
        for (int64_t j = 0; j < L.len; j++) {
            int64_t e = at(L, r, j);
            if (!same_value(gv[e], row[j].v) || gi[e] != (double)row[j].i ||
                ga[e] != (double)row[j].i) {
                fprintf(stderr, "sort %s desc %d len %lld row %lld rank %lld: got %g at %g "
                        "(argsort %g), expected %g at %lld\n", ct_dtype_name(dt), desc,
                        (long long)L.len, (long long)r, (long long)j, gv[e], gi[e], ga[e],
                        row[j].v, (long long)row[j].i);
                fail();
            }
        }
    }
    free(row);
    free(gv);
    free(gi);
    free(ga);
    free(v);
    release_all(4, (ct_tensor *[]){x, y, idx, as});
}

static void test_sort_values(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        ct_dtype dt = tu_all_dtypes[di];
        for (int rep = 0; rep < 8; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 9, shape);
            sort_case(dt, nd, shape, (int)tu_randint(-nd, nd), rep & 1, rep % 3 == 1);
        }
        sort_case(dt, 0, NULL, 0, false, false);
        /* rows past the insertion sort: the radix sort, both directions */
        sort_case(dt, 2, (const int64_t[]){3, 300}, 1, di & 1, true);
        sort_case(dt, 2, (const int64_t[]){700, 2}, 0, !(di & 1), false);
    }
    sort_case(CT_F32, 1, (const int64_t[]){20000}, 0, false, false);
    sort_case(CT_I64, 2, (const int64_t[]){2, 0}, 1, false, false);
}

static ct_tensor *fn_sort(ct_tensor *const *in, void *ctx) {
    int *c = ctx;
    return ct_sort(in[0], c[0], c[1], true, NULL);
}

static void test_sort_grad(void **state) {
    (void)state;
    for (int dim = -2; dim < 2; dim++) {
        /* distinct values, far apart, so finite differences do not reorder them */
        double v[15];
        for (int i = 0; i < 15; i++) v[i] = (double)((i * 7) % 15) + 0.25 * tu_uniform(-1, 1);
        ct_tensor *x = leaf_of(v, 2, (const int64_t[]){3, 5}, CT_F64);
        int c[2] = {dim, dim & 1};
        gradcheck_ok("sort", fn_sort, c, 1, &x);
        ct_tensor_release(x);
    }
    /* the gradient goes back to each value's place */
    double v[5] = {3, 1, 4, 1, 5};
    ct_tensor *x = leaf_of(v, 1, (const int64_t[]){5}, CT_F32);
    ct_tensor *y = chk(ct_sort(x, 0, true, true, NULL));
    double w[5] = {10, 20, 30, 40, 50};
    ct_tensor *g = chk(tu_from_f64(w, 1, (const int64_t[]){5}, CT_F32));
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    /* sorted descending: 5(4) 4(2) 3(0) 1(1) 1(3) */
    expect_values(ct_grad(x), (const double[]){30, 40, 20, 50, 10}, 5, 0, 0);
    release_all(3, (ct_tensor *[]){y, x, g});
}

/* ---- kthvalue / median ---------------------------------------------------------------------- */

static void kth_case(ct_dtype dt, int nd, const int64_t *shape, int dim, bool keepdim, bool nc,
                     bool median) {
    int64_t n = tu_numel(nd, shape);
    double *v = special_vals(n, dt);
    ct_tensor *x = make(v, nd, shape, dt, nc);
    int d = wrap(dim, nd);
    lines L = lines_of(nd, shape, d);
    int64_t k = tu_randint(1, L.len + 1);
    poison(n * 16);
    ct_tensor *idx = NULL;
    ct_tensor *y = chk(median ? ct_median_dim(x, dim, keepdim, &idx)
                              : ct_kthvalue(x, k, dim, keepdim, &idx));
    int64_t oshape[4];
    int ond = 0;
    for (int i = 0; i < nd; i++)
        if (i != d) oshape[ond++] = shape[i];
        else if (keepdim) oshape[ond++] = 1;
    check_shape(y, ond, oshape);
    check_shape(idx, ond, oshape);
    assert_int_equal(ct_tensor_dtype(y), dt);
    double *gv = tu_values(y), *gi = tu_values(idx);
    vi *row = malloc((size_t)L.len * sizeof *row);
    ref_descending = false;
    for (int64_t r = 0; r < L.rows; r++) {
        int64_t nans = 0;
        for (int64_t j = 0; j < L.len; j++) {
            row[j] = (vi){v[at(L, r, j)], j};
            nans += isnan(row[j].v);
        }
        qsort(row, (size_t)L.len, sizeof *row, cmp_vi);
        int64_t want = median ? (nans ? L.len - nans : (L.len - 1) / 2) : k - 1;
        double wv = row[want].v;
        int64_t wi = row[want].i;
        /* the value must match; the index must hold that value (a tie may pick any) */
        if (!same_value(gv[r], wv) && !(wv == 0 && gv[r] == 0)) {
            fprintf(stderr, "%s %s row %lld: got %g, expected %g\n", median ? "median" : "kthvalue",
                    ct_dtype_name(dt), (long long)r, gv[r], wv);
            fail();
        }
        assert_true(gi[r] >= 0 && gi[r] < (double)L.len);
        double at_i = v[at(L, r, (int64_t)gi[r])];
        assert_true(isnan(wv) ? isnan(at_i) : at_i == wv);
        if (isnan(wv)) assert_true(gi[r] == (double)wi); /* the first NaN, as PyTorch */
    }
    free(row);
    free(gv);
    free(gi);
    free(v);
    release_all(3, (ct_tensor *[]){x, y, idx});
}

static void test_kthvalue_median(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 9, shape);
            int dim = (int)tu_randint(-nd, nd);
            kth_case(tu_all_dtypes[di], nd, shape, dim, rep & 1, rep % 3 == 2, rep % 2 == 0);
        }
        kth_case(tu_all_dtypes[di], 0, NULL, 0, false, false, true);
        kth_case(tu_all_dtypes[di], 0, NULL, -1, true, false, false);
    }
    /* whole-tensor median: the lower one; NaN wins */
    double v[6] = {5, 1, 4, 2, 3, 6};
    ct_tensor *x = chk(tu_from_f64(v, 2, (const int64_t[]){2, 3}, CT_F64));
    ct_tensor *m = chk(ct_median(x));
    assert_int_equal(ct_tensor_ndim(m), 0);
    expect_values(m, (const double[]){3}, 1, 0, 0);
    ct_tensor_release(m);
    ct_tensor_release(x);
    v[4] = NAN;
    x = chk(tu_from_f64(v, 1, (const int64_t[]){6}, CT_F32));
    m = chk(ct_median(x));
    expect_values(m, (const double[]){NAN}, 1, 0, 0);
    ct_tensor *t = chk(ct_kthvalue(x, 6, 0, false, NULL)); /* NaN counts as the largest */
    expect_values(t, (const double[]){NAN}, 1, 0, 0);
    release_all(3, (ct_tensor *[]){m, x, t});
}

static ct_tensor *fn_kth(ct_tensor *const *in, void *ctx) {
    int64_t *c = ctx;
    return c[0] ? ct_kthvalue(in[0], c[0], (int)c[1], c[2], NULL)
                : ct_median_dim(in[0], (int)c[1], c[2], NULL);
}

static ct_tensor *fn_median_all(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_median(in[0]);
}

static void test_kthvalue_median_grad(void **state) {
    (void)state;
    double v[20];
    for (int i = 0; i < 20; i++) v[i] = (double)((i * 7) % 20) + 0.25 * tu_uniform(-1, 1);
    ct_tensor *x = leaf_of(v, 2, (const int64_t[]){4, 5}, CT_F64);
    for (int64_t k = 0; k <= 4; k++) {
        int64_t c[3] = {k, k % 2 ? 1 : -2, k % 3 == 0};
        gradcheck_ok(k ? "kthvalue" : "median", fn_kth, c, 1, &x);
    }
    gradcheck_ok("median all", fn_median_all, NULL, 1, &x);
    ct_tensor_release(x);
}

/* ---- mode ------------------------------------------------------------------------------------ */

static void mode_case(ct_dtype dt, int nd, const int64_t *shape, int dim, bool keepdim, bool nc) {
    int64_t n = tu_numel(nd, shape);
    double *v = special_vals(n, dt);
    ct_tensor *x = make(v, nd, shape, dt, nc);
    int d = wrap(dim, nd);
    lines L = lines_of(nd, shape, d);
    poison(n * 16);
    ct_tensor *idx = NULL;
    ct_tensor *y = chk(ct_mode(x, dim, keepdim, &idx));
    assert_int_equal(ct_tensor_dtype(y), dt);
    assert_int_equal(ct_tensor_numel(y), L.rows);
    double *gv = tu_values(y), *gi = tu_values(idx);
    double *row = malloc((size_t)L.len * sizeof *row);
    for (int64_t r = 0; r < L.rows; r++) {
        for (int64_t j = 0; j < L.len; j++) row[j] = v[at(L, r, j)];
        /* the most frequent value, the smallest among ties; each NaN alone */
        double best = NAN;
        int64_t best_n = 0;
        for (int64_t j = 0; j < L.len; j++) {
            int64_t c = 0;
            for (int64_t k = 0; k < L.len; k++) c += row[k] == row[j];
            bool nan = isnan(row[j]);
            if (nan) c = 1;
            bool smaller = isnan(best) ? !nan : !nan && row[j] < best;
            if (c > best_n || (c == best_n && smaller)) {
                best = row[j];
                best_n = c;
            }
        }
        if (!(isnan(best) ? isnan(gv[r]) : gv[r] == best)) {
            fprintf(stderr, "mode %s row %lld: got %g, expected %g (%lld times)\n",
                    ct_dtype_name(dt), (long long)r, gv[r], best, (long long)best_n);
            fail();
        }
        assert_true(gi[r] >= 0 && gi[r] < (double)L.len);
        double at_i = row[(int64_t)gi[r]];
        assert_true(isnan(best) ? isnan(at_i) : at_i == best);
    }
    free(row);
    free(gv);
    free(gi);
    free(v);
    release_all(3, (ct_tensor *[]){x, y, idx});
}

static void test_mode(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 9, shape);
            mode_case(tu_all_dtypes[di], nd, shape, (int)tu_randint(-nd, nd), rep & 1, rep % 3 == 2);
        }
        mode_case(tu_all_dtypes[di], 0, NULL, 0, false, false);
    }
    /* [1, 2, 2, 3, 3]: 2 and 3 twice, the smaller wins */
    double v[5] = {3, 2, 1, 3, 2};
    ct_tensor *x = chk(tu_from_f64(v, 1, (const int64_t[]){5}, CT_I64));
    ct_tensor *idx = NULL;
    ct_tensor *m = chk(ct_mode(x, 0, false, &idx));
    expect_values(m, (const double[]){2}, 1, 0, 0);
    double *gi = tu_values(idx);
    assert_true(gi[0] == 1 || gi[0] == 4);
    free(gi);
    release_all(3, (ct_tensor *[]){x, m, idx});
    /* the gradient lands on the returned place (ties make finite differences meaningless) */
    double w[12] = {1, 2, 2, 5, 0.5, 0.5, 0.5, 1, 7, 8, 9, 7};
    x = leaf_of(w, 2, (const int64_t[]){3, 4}, CT_F64);
    m = chk(ct_mode(x, 1, false, &idx));
    expect_values(m, (const double[]){2, 0.5, 7}, 3, 0, 0);
    backward_ones(m);
    gi = tu_values(idx);
    double want[12] = {0}, modes[3] = {2, 0.5, 7};
    for (int r = 0; r < 3; r++) {
        assert_true(w[r * 4 + (int)gi[r]] == modes[r]);
        want[r * 4 + (int)gi[r]] = 1;
    }
    expect_values(ct_grad(x), want, 12, 0, 0);
    free(gi);
    release_all(3, (ct_tensor *[]){x, m, idx});
    tu_assert_null_error(ct_mode(NULL, 0, false, NULL), CT_ERR_INVALID_ARG, "ct_mode");
    ct_tensor *e = chk(ct_tensor_zeros(2, (const int64_t[]){2, 0}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_mode(e, 1, false, NULL), CT_ERR_SHAPE, "ct_mode", "zero-size dim 1");
    tu_assert_null_error(ct_mode(e, 2, false, NULL), CT_ERR_INDEX, "ct_mode");
    ct_tensor_release(e);
}

/* ---- cumprod -------------------------------------------------------------------------------- */

static void cumprod_case(ct_dtype dt, int nd, const int64_t *shape, int dim, bool nc) {
    int64_t n = tu_numel(nd, shape);
    bool fl = ct_dtype_is_floating(dt);
    double *v = tu_rand_vals(n > 0 ? n : 1, dt, fl ? -1.6 : -3, fl ? 1.6 : 4);
    for (int64_t i = 0; fl && i < n; i++)
        if (tu_randint(0, 8) == 0) v[i] = 0;
    ct_tensor *x = make(v, nd, shape, dt, nc);
    poison(n * 8);
    ct_tensor *y = chk(ct_cumprod(x, dim));
    assert_int_equal(ct_tensor_dtype(y), fl ? dt : CT_I64);
    check_shape(y, nd, shape);
    lines L = lines_of(nd, shape, wrap(dim, nd));
    double *ref = malloc((size_t)(n ? n : 1) * sizeof *ref);
    for (int64_t r = 0; r < L.rows; r++) {
        double acc = 1;
        for (int64_t j = 0; j < L.len; j++) {
            acc *= v[at(L, r, j)];
            /* halves keep f32 products and round each output; f32 rounds each step */
            if (dt == CT_F32) acc = (double)(float)acc;
            ref[at(L, r, j)] = acc;
        }
    }
    double rtol = dt == CT_F16 ? 4e-3 : dt == CT_BF16 ? 3e-2 : dt == CT_F32 ? 1e-6 : 1e-12;
    /* float16 outputs below 2^-14 are subnormal: their rounding is absolute,
     * an ulp of 2^-24 */
    double atol = dt == CT_F16 ? 0x1p-24 : 1e-30;
    expect_values(y, ref, n, fl ? rtol : 0, fl ? atol : 0);
    free(ref);
    free(v);
    release_all(2, (ct_tensor *[]){x, y});
}

static void test_cumprod_values(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 6, shape); /* integers: at most 6 factors of |v| <= 3, exact */
            cumprod_case(tu_all_dtypes[di], nd, shape, (int)tu_randint(-nd, nd), rep % 3 == 1);
        }
        cumprod_case(tu_all_dtypes[di], 0, NULL, 0, false);
    }
    cumprod_case(CT_F64, 2, (const int64_t[]){3, 0}, 1, false);
    /* int64 wraps as two's complement */
    int64_t big[3] = {INT64_C(1) << 40, INT64_C(1) << 30, 3};
    ct_tensor *x = chk(ct_tensor_from_data(big, CT_I64, 1, (const int64_t[]){3}));
    ct_tensor *y = chk(ct_cumprod(x, 0));
    const int64_t *p = ct_tensor_data_ptr(y);
    assert_true(p[1] == 0 && p[2] == 0); /* 2^70 wraps to 0 */
    release_all(2, (ct_tensor *[]){x, y});
}

static ct_tensor *fn_cumprod(ct_tensor *const *in, void *ctx) {
    return ct_cumprod(in[0], *(int *)ctx);
}

static void test_cumprod_grad(void **state) {
    (void)state;
    /* lines with no zero, one zero, two zeros, a zero first and last */
    double v[5][6] = {{0.5, -1.2, 0.8, 1.5, -0.7, 1.1},
                      {0.5, 0, 0.8, 1.5, -0.7, 1.1},
                      {0.5, 0, 0.8, 0, -0.7, 1.1},
                      {0, 1.3, 0.8, 1.5, -0.7, 1.1},
                      {0.5, 1.3, 0.8, 1.5, -0.7, 0}};
    double t[6][5]; /* the same lines along dim 0 */
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 6; j++) t[j][i] = v[i][j];
    for (int dim = -2; dim < 2; dim++) {
        bool along1 = dim == 1 || dim == -1;
        ct_tensor *x = along1 ? leaf_of(&v[0][0], 2, (const int64_t[]){5, 6}, CT_F64)
                              : leaf_of(&t[0][0], 2, (const int64_t[]){6, 5}, CT_F64);
        int d = dim;
        gradcheck_ok("cumprod", fn_cumprod, &d, 1, &x);
        ct_tensor_release(x);
    }
    /* closed form at a zero: d/dx1 of sum(cumprod([2, 0, 3])) = 2 + 2*3 = 8 */
    double w[3] = {2, 0, 3};
    ct_tensor *x = leaf_of(w, 1, (const int64_t[]){3}, CT_F32);
    ct_tensor *y = chk(ct_cumprod(x, 0));
    backward_ones(y);
    expect_values(ct_grad(x), (const double[]){1, 8, 0}, 3, 0, 0);
    release_all(2, (ct_tensor *[]){y, x});
}

/* ---- logsumexp ------------------------------------------------------------------------------ */

/* The reduced dims of a mask as a list; returns their count. */
static int mask_dims(int nd, unsigned mask, int64_t *dims) {
    int k = 0;
    for (int d = 0; d < nd; d++)
        if (mask >> d & 1) dims[k++] = d - (tu_randint(0, 2) ? nd : 0); /* negatives too */
    return k;
}

/* out[o] for every x element e, o its slice under mask (keepdim layout). */
static int64_t slice_of(int nd, const int64_t *shape, unsigned mask, int64_t e) {
    int64_t o = 0, rest = e, mul = 1;
    for (int d = nd - 1; d >= 0; d--) {
        int64_t c = rest % shape[d];
        rest /= shape[d];
        if (!(mask >> d & 1)) {
            o += c * mul;
            mul *= shape[d];
        }
    }
    return o;
}

static int64_t slices(int nd, const int64_t *shape, unsigned mask) {
    int64_t m = 1;
    for (int d = 0; d < nd; d++)
        if (!(mask >> d & 1)) m *= shape[d];
    return m;
}

static void lse_case(ct_dtype dt, int nd, const int64_t *shape, unsigned mask, bool keepdim,
                     bool nc) {
    int64_t n = tu_numel(nd, shape), dims[4];
    int k = mask_dims(nd, mask, dims);
    if (k == nd) mask = nd ? (1u << nd) - 1 : 0;
    bool fl = ct_dtype_is_floating(dt);
    double *v = tu_rand_vals(n, dt, fl ? -20 : -5, fl ? 20 : 6);
    for (int64_t i = 0; fl && i < n; i++)
        if (tu_randint(0, 12) == 0) v[i] = -INFINITY;
    ct_tensor *x = make(v, nd, shape, dt, nc);
    poison(n * 8);
    ct_tensor *y = chk(ct_logsumexp(x, k, dims, keepdim));
    assert_int_equal(ct_tensor_dtype(y), fl ? dt : CT_F32);
    int64_t m = slices(nd, shape, mask);
    assert_int_equal(ct_tensor_numel(y), m);
    double *mx = malloc((size_t)m * sizeof *mx), *s = calloc((size_t)m, sizeof *s);
    for (int64_t o = 0; o < m; o++) mx[o] = -INFINITY;
    for (int64_t e = 0; e < n; e++) {
        int64_t o = slice_of(nd, shape, mask, e);
        if (v[e] > mx[o]) mx[o] = v[e];
    }
    for (int64_t e = 0; e < n; e++) {
        int64_t o = slice_of(nd, shape, mask, e);
        if (mx[o] > -INFINITY) s[o] += exp(v[e] - mx[o]);
    }
    for (int64_t o = 0; o < m; o++) s[o] = mx[o] == -INFINITY ? -INFINITY : mx[o] + log(s[o]);
    double rtol = dt == CT_F64 ? 1e-12 : dt == CT_F16 ? 3e-3 : dt == CT_BF16 ? 2e-2 : 1e-5;
    expect_values(y, s, m, rtol, rtol * 4);
    free(mx);
    free(s);
    free(v);
    release_all(2, (ct_tensor *[]){x, y});
}

static void test_logsumexp_values(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 7, shape);
            unsigned mask = (unsigned)tu_randint(1, 1 << nd);
            lse_case(tu_all_dtypes[di], nd, shape, mask, rep & 1, rep % 3 == 2);
        }
        lse_case(tu_all_dtypes[di], 0, NULL, 0, false, false);
    }
    /* large values stay finite; +inf gives +inf; an empty slice gives -inf */
    double v[4] = {1000, 1000, INFINITY, 3};
    ct_tensor *x = chk(tu_from_f64(v, 2, (const int64_t[]){2, 2}, CT_F32));
    ct_tensor *y = chk(ct_logsumexp(x, 1, (const int64_t[]){1}, false));
    expect_values(y, (const double[]){1000 + log(2.0), INFINITY}, 2, 1e-6, 0);
    ct_tensor *e = chk(ct_tensor_zeros(2, (const int64_t[]){2, 0}, CT_F32, CT_CPU));
    ct_tensor *ye = chk(ct_logsumexp(e, 1, (const int64_t[]){1}, false));
    expect_values(ye, (const double[]){-INFINITY, -INFINITY}, 2, 0, 0);
    release_all(4, (ct_tensor *[]){x, y, e, ye});
}

static ct_tensor *fn_lse(ct_tensor *const *in, void *ctx) {
    int64_t *c = ctx;
    return ct_logsumexp(in[0], (int)c[0], c + 2, c[1]);
}

static void test_logsumexp_grad(void **state) {
    (void)state;
    double *v = tu_rand_vals(24, CT_F64, -3, 3);
    ct_tensor *x = leaf_of(v, 3, (const int64_t[]){2, 3, 4}, CT_F64);
    int64_t cases[4][4] = {{1, 0, -1, 0}, {2, 1, 0, 2}, {0, 0, 0, 0}, {2, 0, 1, -1}};
    for (int i = 0; i < 4; i++) gradcheck_ok("logsumexp", fn_lse, cases[i], 1, &x);
    ct_tensor_release(x);
    free(v);
}

/* ---- amax / amin ---------------------------------------------------------------------------- */

static void amax_case(bool mx, ct_dtype dt, int nd, const int64_t *shape, unsigned mask,
                      bool keepdim, bool nc) {
    int64_t n = tu_numel(nd, shape), dims[4];
    int k = mask_dims(nd, mask, dims);
    double *v = special_vals(n, dt);
    ct_tensor *x = make(v, nd, shape, dt, nc);
    poison(n * 8);
    ct_tensor *y = chk(mx ? ct_amax(x, k, dims, keepdim) : ct_amin(x, k, dims, keepdim));
    assert_int_equal(ct_tensor_dtype(y), dt);
    int64_t m = slices(nd, shape, mask);
    double *ref = malloc((size_t)m * sizeof *ref);
    bool *seen = calloc((size_t)m, 1);
    for (int64_t e = 0; e < n; e++) {
        int64_t o = slice_of(nd, shape, mask, e);
        double a = v[e];
        if (!seen[o] || isnan(a) || (!isnan(ref[o]) && (mx ? a > ref[o] : a < ref[o])))
            ref[o] = a;
        seen[o] = true;
    }
    double *g = tu_values(y);
    for (int64_t o = 0; o < m; o++)
        if (!(isnan(ref[o]) ? isnan(g[o]) : g[o] == ref[o])) {
            fprintf(stderr, "%s %s slice %lld: got %g, expected %g\n", mx ? "amax" : "amin",
                    ct_dtype_name(dt), (long long)o, g[o], ref[o]);
            fail();
        }
    free(g);
    free(ref);
    free(seen);
    free(v);
    release_all(2, (ct_tensor *[]){x, y});
}

static ct_tensor *fn_amax(ct_tensor *const *in, void *ctx) {
    int64_t *c = ctx;
    return c[0] ? ct_amax(in[0], 2, c + 1, c[3]) : ct_amin(in[0], 2, c + 1, c[3]);
}

static void test_amax_amin(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 7, shape);
            unsigned mask = (unsigned)tu_randint(1, 1 << nd);
            amax_case(rep & 1, tu_all_dtypes[di], nd, shape, mask, rep % 3 == 0, rep % 2 == 0);
        }
    }
    /* ties per slice share the gradient evenly: [[1, 3, 3], [2, 2, 0]] over dim 1 */
    double v[6] = {1, 3, 3, 2, 2, 0};
    ct_tensor *x = leaf_of(v, 2, (const int64_t[]){2, 3}, CT_F32);
    ct_tensor *y = chk(ct_amax(x, 1, (const int64_t[]){1}, false));
    expect_values(y, (const double[]){3, 2}, 2, 0, 0);
    backward_ones(y);
    expect_values(ct_grad(x), (const double[]){0, 0.5, 0.5, 0.5, 0.5, 0}, 6, 0, 0);
    release_all(2, (ct_tensor *[]){y, x});
    /* over both dims: three ties of the min share one */
    double w[6] = {0, 3, 0, 2, 0, 5};
    x = leaf_of(w, 2, (const int64_t[]){2, 3}, CT_F64);
    y = chk(ct_amin(x, 2, (const int64_t[]){0, -1}, true));
    check_shape(y, 2, (const int64_t[]){1, 1});
    backward_ones(y);
    expect_values(ct_grad(x), (const double[]){1 / 3., 0, 1 / 3., 0, 1 / 3., 0}, 6, 1e-15, 0);
    release_all(2, (ct_tensor *[]){y, x});
    /* finite differences on distinct values */
    double u[24];
    for (int i = 0; i < 24; i++) u[i] = (double)((i * 5) % 24) + 0.25 * tu_uniform(-1, 1);
    x = leaf_of(u, 3, (const int64_t[]){2, 3, 4}, CT_F64);
    int64_t c1[4] = {1, 0, 2, 0}, c2[4] = {0, -1, 1, 1};
    gradcheck_ok("amax", fn_amax, c1, 1, &x);
    gradcheck_ok("amin", fn_amax, c2, 1, &x);
    ct_tensor_release(x);
}

/* ---- all / any / count_nonzero -------------------------------------------------------------- */

static void logic_case(ct_dtype dt, int nd, const int64_t *shape, unsigned mask, bool keepdim,
                       bool nc) {
    int64_t n = tu_numel(nd, shape), dims[4];
    int k = mask_dims(nd, mask, dims);
    double *v = special_vals(n, dt);
    for (int64_t i = 0; i < n; i++)
        if (tu_randint(0, 3) == 0) v[i] = tu_randint(0, 2) ? 0.0 : -0.0;
    ct_tensor *x = make(v, nd, shape, dt, nc);
    poison(n * 8);
    ct_tensor *a = chk(ct_all(x, k, dims, keepdim)), *o = chk(ct_any(x, k, dims, keepdim));
    ct_tensor *c = chk(ct_count_nonzero(x, k, dims));
    assert_int_equal(ct_tensor_dtype(a), CT_BOOL);
    assert_int_equal(ct_tensor_dtype(o), CT_BOOL);
    assert_int_equal(ct_tensor_dtype(c), CT_I64);
    int64_t m = slices(nd, shape, mask);
    double *cnt = calloc((size_t)m, sizeof *cnt), *len = calloc((size_t)m, sizeof *len);
    for (int64_t e = 0; e < n; e++) {
        int64_t s = slice_of(nd, shape, mask, e);
        cnt[s] += v[e] != 0; /* NaN counts */
        len[s] += 1;
    }
    double *ra = malloc((size_t)(m ? m : 1) * sizeof *ra), *ro = malloc((size_t)(m ? m : 1) * sizeof *ro);
    for (int64_t s = 0; s < m; s++) {
        ra[s] = cnt[s] == len[s];
        ro[s] = cnt[s] > 0;
    }
    expect_values(a, ra, m, 0, 0);
    expect_values(o, ro, m, 0, 0);
    expect_values(c, cnt, m, 0, 0);
    free(cnt);
    free(len);
    free(ra);
    free(ro);
    free(v);
    release_all(4, (ct_tensor *[]){x, a, o, c});
}

static void test_all_any_count_nonzero(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 6, shape);
            unsigned mask = (unsigned)tu_randint(1, 1 << nd);
            logic_case(tu_all_dtypes[di], nd, shape, mask, rep & 1, rep % 3 == 2);
        }
        logic_case(tu_all_dtypes[di], 0, NULL, 0, false, false);
    }
    /* empty slices: all true, any false, count 0 */
    ct_tensor *e = chk(ct_tensor_zeros(2, (const int64_t[]){3, 0}, CT_F32, CT_CPU));
    ct_tensor *a = chk(ct_all(e, 1, (const int64_t[]){1}, false));
    ct_tensor *o = chk(ct_any(e, CT_NONE, false));
    ct_tensor *c = chk(ct_count_nonzero(e, 1, (const int64_t[]){-1}));
    expect_values(a, (const double[]){1, 1, 1}, 3, 0, 0);
    expect_values(o, (const double[]){0}, 1, 0, 0);
    expect_values(c, (const double[]){0, 0, 0}, 3, 0, 0);
    release_all(4, (ct_tensor *[]){e, a, o, c});
}

/* ---- nonzero -------------------------------------------------------------------------------- */

static void nonzero_case(ct_dtype dt, int nd, const int64_t *shape, bool nc) {
    int64_t n = tu_numel(nd, shape);
    double *v = special_vals(n, dt);
    for (int64_t i = 0; i < n; i++)
        if (tu_randint(0, 2) == 0) v[i] = tu_randint(0, 2) ? 0.0 : -0.0;
    ct_tensor *x = make(v, nd, shape, dt, nc);
    poison(n * 8 * (nd + 1));
    ct_tensor *y = chk(ct_nonzero(x));
    assert_int_equal(ct_tensor_dtype(y), CT_I64);
    int64_t cnt = 0;
    for (int64_t i = 0; i < n; i++) cnt += v[i] != 0;
    check_shape(y, 2, (const int64_t[]){cnt, nd});
    double *ref = malloc((size_t)(cnt * nd + 1) * sizeof *ref);
    int64_t r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (v[i] == 0) continue;
        int64_t rest = i;
        for (int d = nd - 1; d >= 0; d--) {
            ref[r * nd + d] = (double)(rest % shape[d]);
            rest /= shape[d];
        }
        r++;
    }
    expect_values(y, ref, cnt * nd, 0, 0);
    free(ref);
    free(v);
    release_all(2, (ct_tensor *[]){x, y});
}

static void test_nonzero(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 6; rep++) {
            int nd = 1 + rep % 4;
            int64_t shape[4];
            rand_shape(nd, 1, 7, shape);
            nonzero_case(tu_all_dtypes[di], nd, shape, rep % 2 == 1);
        }
        nonzero_case(tu_all_dtypes[di], 0, NULL, false);
        nonzero_case(tu_all_dtypes[di], 2, (const int64_t[]){3, 0}, false);
    }
    nonzero_case(CT_F32, 2, (const int64_t[]){300, 500}, false); /* several threads' chunks */
}

/* ---- unique --------------------------------------------------------------------------------- */

static int cmp_d(const void *pa, const void *pb) {
    double a = *(const double *)pa, b = *(const double *)pb;
    bool an = isnan(a), bn = isnan(b);
    if (an || bn) return an && bn ? 0 : an ? 1 : -1;
    return a < b ? -1 : a > b;
}

static void unique_case(ct_dtype dt, int nd, const int64_t *shape, bool nc) {
    int64_t n = tu_numel(nd, shape);
    double *v = special_vals(n, dt);
    ct_tensor *x = make(v, nd, shape, dt, nc);
    poison(n * 16);
    ct_tensor *inv = NULL, *cnt = NULL;
    ct_tensor *u = chk(ct_unique(x, true, &inv, &cnt));
    assert_int_equal(ct_tensor_dtype(u), dt);
    check_shape(inv, nd, shape);
    /* the reference: sorted, equal values merged (each NaN its own) */
    double *s = malloc((size_t)(n ? n : 1) * sizeof *s), *rv = malloc((size_t)(n ? n : 1) * sizeof *rv);
    double *rc = calloc((size_t)(n ? n : 1), sizeof *rc);
    memcpy(s, v, (size_t)n * sizeof *s);
    qsort(s, (size_t)n, sizeof *s, cmp_d);
    int64_t U = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i == 0 || !(s[i] == s[i - 1])) rv[U++] = s[i];
        rc[U - 1] += 1;
    }
    check_shape(u, 1, &U);
    check_shape(cnt, 1, &U);
    double *gu = tu_values(u), *gi = tu_values(inv);
    for (int64_t i = 0; i < U; i++) assert_true(isnan(rv[i]) ? isnan(gu[i]) : gu[i] == rv[i]);
    expect_values(cnt, rc, U, 0, 0);
    for (int64_t i = 0; i < n; i++) {
        assert_true(gi[i] >= 0 && gi[i] < (double)U);
        double w = gu[(int64_t)gi[i]];
        assert_true(isnan(v[i]) ? isnan(w) : w == v[i]);
    }
    free(gu);
    free(gi);
    free(s);
    free(rv);
    free(rc);
    free(v);
    release_all(4, (ct_tensor *[]){x, u, inv, cnt});
}

static void test_unique(void **state) {
    (void)state;
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++) {
        for (int rep = 0; rep < 5; rep++) {
            int nd = 1 + rep % 3;
            int64_t shape[4];
            rand_shape(nd, 1, 8, shape);
            unique_case(tu_all_dtypes[di], nd, shape, rep % 2 == 1);
        }
        unique_case(tu_all_dtypes[di], 0, NULL, false);
        unique_case(tu_all_dtypes[di], 2, (const int64_t[]){0, 3}, false);
    }
    /* without inverse and counts */
    double v[6] = {3, 1, 3, -0.0, 0, 1};
    ct_tensor *x = chk(tu_from_f64(v, 1, (const int64_t[]){6}, CT_I32));
    ct_tensor *u = chk(ct_unique(x, false, NULL, NULL));
    expect_values(u, (const double[]){0, 1, 3}, 3, 0, 0);
    release_all(2, (ct_tensor *[]){x, u});
}

/* ---- autocast ------------------------------------------------------------------------------ */

/* logsumexp and cumprod are on PyTorch's float32 lists: a region casts
 * float16/bfloat16 input up, and leaves float64 as it is. */
static void test_autocast(void **state) {
    (void)state;
    ct_tensor *h = chk(tu_rand(2, (const int64_t[]){3, 4}, CT_BF16, -2, 2, NULL));
    ct_tensor *d = chk(tu_rand(2, (const int64_t[]){3, 4}, CT_F64, -2, 2, NULL));
    assert_int_equal(ct_autocast_begin(CT_CPU, CT_BF16), CT_OK);
    ct_tensor *a = chk(ct_logsumexp(h, 1, (const int64_t[]){1}, false));
    ct_tensor *b = chk(ct_cumprod(h, 0));
    ct_tensor *c = chk(ct_cumprod(d, 1));
    assert_int_equal(ct_autocast_end(), CT_OK);
    assert_int_equal(ct_tensor_dtype(a), CT_F32);
    assert_int_equal(ct_tensor_dtype(b), CT_F32);
    assert_int_equal(ct_tensor_dtype(c), CT_F64);
    ct_tensor *a2 = chk(ct_logsumexp(h, 1, (const int64_t[]){1}, false));
    assert_int_equal(ct_tensor_dtype(a2), CT_BF16);
    release_all(6, (ct_tensor *[]){h, d, a, b, c, a2});
}

/* ---- errors ----------------------------------------------------------------------------------- */

static void test_errors(void **state) {
    (void)state;
    ct_tensor *x = chk(ct_tensor_zeros(2, (const int64_t[]){2, 5}, CT_F32, CT_CPU));
    ct_tensor *idx = NULL;
    tu_assert_null_error(ct_sort(NULL, 0, false, false, NULL), CT_ERR_INVALID_ARG, "ct_sort");
    tu_assert_null_error(ct_sort(x, 2, false, false, &idx), CT_ERR_INDEX, "ct_sort",
                         "dim 2 out of range");
    assert_null(idx);
    tu_assert_null_error(ct_argsort(x, -3, false, false), CT_ERR_INDEX, "ct_sort");
    tu_assert_null_error(ct_kthvalue(x, 6, 1, false, &idx), CT_ERR_INVALID_ARG, "ct_kthvalue",
                         "k 6 is out of range for dim 1 of size 5", "1..5");
    tu_assert_null_error(ct_kthvalue(x, 0, 0, false, NULL), CT_ERR_INVALID_ARG, "ct_kthvalue",
                         "k 0 is out of range");
    assert_null(idx);
    tu_assert_null_error(ct_kthvalue(NULL, 1, 0, false, NULL), CT_ERR_INVALID_ARG, "ct_kthvalue");
    ct_tensor *e = chk(ct_tensor_zeros(2, (const int64_t[]){2, 0}, CT_F32, CT_CPU));
    tu_assert_null_error(ct_median(e), CT_ERR_SHAPE, "ct_median", "empty");
    tu_assert_null_error(ct_median_dim(e, 1, false, NULL), CT_ERR_SHAPE, "ct_median_dim",
                         "zero-size dim 1");
    tu_assert_null_error(ct_median_dim(x, 3, false, NULL), CT_ERR_INDEX, "ct_median_dim");
    tu_assert_null_error(ct_amax(e, 1, (const int64_t[]){1}, false), CT_ERR_SHAPE, "ct_amax",
                         "zero-size dim 1");
    tu_assert_null_error(ct_amin(x, 2, (const int64_t[]){1, -1}, false), CT_ERR_INVALID_ARG,
                         "ct_amin", "appears multiple times");
    tu_assert_null_error(ct_amax(NULL, CT_NONE, false), CT_ERR_INVALID_ARG, "ct_amax");
    tu_assert_null_error(ct_logsumexp(x, 1, (const int64_t[]){2}, false), CT_ERR_INDEX,
                         "ct_logsumexp", "dim 2 out of range");
    tu_assert_null_error(ct_all(x, 1, (const int64_t[]){-3}, false), CT_ERR_INDEX, "ct_all",
                         "out of range");
    tu_assert_null_error(ct_any(NULL, CT_NONE, false), CT_ERR_INVALID_ARG, "ct_any");
    tu_assert_null_error(ct_count_nonzero(x, 1, (const int64_t[]){5}), CT_ERR_INDEX,
                         "ct_count_nonzero");
    tu_assert_null_error(ct_cumprod(x, 2), CT_ERR_INDEX, "ct_cumprod", "dim 2 out of range");
    tu_assert_null_error(ct_cumprod(NULL, 0), CT_ERR_INVALID_ARG, "ct_cumprod");
    tu_assert_null_error(ct_nonzero(NULL), CT_ERR_INVALID_ARG, "ct_nonzero");
    tu_assert_null_error(ct_unique(NULL, true, NULL, NULL), CT_ERR_INVALID_ARG, "ct_unique");
    release_all(2, (ct_tensor *[]){x, e});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sort_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sort_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kthvalue_median, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kthvalue_median_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cumprod_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cumprod_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logsumexp_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_logsumexp_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_amax_amin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_any_count_nonzero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nonzero, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unique, setup, teardown),
        cmocka_unit_test_setup_teardown(test_autocast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
    };
    return tu_run_tests(tests);
}
