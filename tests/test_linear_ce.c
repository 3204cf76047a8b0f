/* ct_linear_cross_entropy and its backward: values and gradients against
 * float64 loops written here and against the unfused ct_linear +
 * ct_cross_entropy, for every reduction, ignore_index, label smoothing,
 * bias or not, chunk boundaries (chunks forced small through the test hook),
 * every floating dtype, non-contiguous and 3-d inputs; float64 gradient
 * checks; and every bad input with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "autograd_util.h"
#include "test_util.h"

#include "test_fixture.h"

/* Private test hook (src/ops/linear_ce.c): chunks of rows rows, 0 for automatic. */
void cti_linear_ce_set_chunk_rows(int64_t rows);

#define IGN (-100)

typedef struct lce_case {
    int64_t n, d, v;
    int64_t batch; /* > 1: x [batch, n / batch, d] and target [batch, n / batch] */
    bool bias;
    ct_reduction red;
    int64_t ignore;
    double ls;
    ct_dtype dt;
    int64_t chunk;
    bool noncontig;
} lce_case;

/* ---- the float64 reference ------------------------------------------------------------------ */

/* The largest |log-sum-exp| of the last ref_lce: a loss is lse - z_t, formed in the
 * dtype from values of that size, so its absolute error scales with it. */
static double lse_max;

/* loss: n values (none) or 1; g: the incoming gradient (n values for none, else 1);
 * dx [n, d], dw [v, d], db [v] are accumulated (zeroed here); dbabs and dwabs
 * (or NULL) the sums of the magnitudes of db's and dw's terms. */
static void ref_lce(const lce_case *k, const double *x, const double *w, const double *b,
                    const int64_t *t, const double *g, double *loss, double *dx, double *dw,
                    double *db, double *dbabs, double *dwabs) {
    int64_t n = k->n, d = k->d, v = k->v, count = 0;
    double total = 0, *z = malloc(sizeof(double) * (size_t)v);
    memset(dx, 0, sizeof(double) * (size_t)(n * d));
    memset(dw, 0, sizeof(double) * (size_t)(v * d));
    memset(db, 0, sizeof(double) * (size_t)v);
    if (dbabs) memset(dbabs, 0, sizeof(double) * (size_t)v);
    if (dwabs) memset(dwabs, 0, sizeof(double) * (size_t)(v * d));
    lse_max = 0;
    for (int64_t i = 0; i < n; i++) count += t[i] != k->ignore;
    for (int64_t i = 0; i < n; i++) {
        double rl = 0;
        if (t[i] != k->ignore) {
            double m = -INFINITY, s = 0, sz = 0;
            for (int64_t j = 0; j < v; j++) {
                z[j] = b ? b[j] : 0;
                for (int64_t q = 0; q < d; q++) z[j] += x[i * d + q] * w[j * d + q];
                m = fmax(m, z[j]);
                sz += z[j];
            }
            for (int64_t j = 0; j < v; j++) s += exp(z[j] - m);
            double lse = m + log(s);
            lse_max = fmax(lse_max, fabs(lse));
            rl = lse - (1 - k->ls) * z[t[i]] - k->ls / (double)v * sz;
            double gi = k->red == CT_REDUCTION_NONE   ? g[i]
                        : k->red == CT_REDUCTION_MEAN ? g[0] / (double)count
                                                      : g[0];
            for (int64_t j = 0; j < v; j++) {
                double onehot = j == t[i] ? 1 - k->ls : 0;
                double dz = gi * (exp(z[j] - lse) - onehot - k->ls / (double)v);
                db[j] += dz;
                if (dbabs) dbabs[j] += fabs(dz);
                for (int64_t q = 0; q < d; q++) {
                    dx[i * d + q] += dz * w[j * d + q];
                    dw[j * d + q] += dz * x[i * d + q];
                    if (dwabs) dwabs[j * d + q] += fabs(dz * x[i * d + q]);
                }
            }
        }
        if (k->red == CT_REDUCTION_NONE) loss[i] = rl;
        total += rl;
    }
    if (k->red == CT_REDUCTION_SUM) loss[0] = total;
    if (k->red == CT_REDUCTION_MEAN) loss[0] = total / (double)count; /* 0 / 0: NaN */
    free(z);
}

/* |got - ref| <= rtol |ref| + atol * max(max|ref|, floor) elementwise; a floor keeps an
 * all-but-zero reference (one class: loss 0) from asking for exact zeros. */
static void close_scaled_floor(const char *what, const double *got, const double *ref, int64_t n,
                               double rtol, double atol, double floor) {
    double mx = floor;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i])) mx = fmax(mx, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++) {
        bool ok = isnan(ref[i]) ? isnan(got[i])
                                : fabs(got[i] - ref[i]) <= rtol * fabs(ref[i]) + atol * mx;
        if (!ok) {
            fprintf(stderr, "%s: element %lld: got %.17g, expected %.17g (rtol %g, atol %g * %g)\n",
                    what, (long long)i, got[i], ref[i], rtol, atol, mx);
            fail();
        }
    }
}

static void tol_of(ct_dtype dt, double *rtol, double *atol) {
    switch (dt) {
    case CT_F64: *rtol = 1e-10, *atol = 1e-12; break;
    case CT_F32: *rtol = 1e-4, *atol = 2e-5; break;
    case CT_F16: *rtol = 1e-2, *atol = 1e-2; break;
    default: *rtol = 4e-2, *atol = 4e-2; break;
    }
}

/* ---- one case ------------------------------------------------------------------------------ */

typedef struct lce_inputs {
    double *x, *w, *b;
    int64_t *t;
    ct_tensor *tx, *tw, *tb, *tt; /* the leaves (tx, tw possibly non-contiguous) */
} lce_inputs;

static void make_inputs(const lce_case *k, lce_inputs *in, bool requires_grad) {
    double lo = ct_dtype_size(k->dt) == 2 ? -0.5 : -1.5, hi = -lo;
    int64_t xs2[2] = {k->n, k->d}, xs3[3] = {k->batch, k->n / (k->batch > 1 ? k->batch : 1), k->d};
    int64_t ws[2] = {k->v, k->d};
    bool three = k->batch > 1;
    ct_tensor *x = tu_rand(three ? 3 : 2, three ? xs3 : xs2, k->dt, lo, hi, &in->x);
    ct_tensor *w = tu_rand(2, ws, k->dt, lo, hi, &in->w);
    in->b = NULL;
    in->tb = k->bias ? tu_rand(1, &k->v, k->dt, lo, hi, &in->b) : NULL;
    in->t = malloc(sizeof(int64_t) * (size_t)(k->n > 0 ? k->n : 1));
    for (int64_t i = 0; i < k->n; i++)
        in->t[i] = tu_uniform(0, 1) < 0.2 ? k->ignore : tu_randint(0, k->v);
    in->tt = ct_tensor_from_data(in->t, CT_I64, three ? 2 : 1, three ? xs3 : xs2);
    if (k->noncontig) {
        in->tx = tu_noncontig(x);
        in->tw = tu_noncontig(w);
        ct_tensor_release(x);
        ct_tensor_release(w);
    } else {
        in->tx = x;
        in->tw = w;
    }
    if (requires_grad) {
        ct_requires_grad_(in->tx, true);
        ct_requires_grad_(in->tw, true);
        if (in->tb) ct_requires_grad_(in->tb, true);
    }
}

static void free_inputs(lce_inputs *in) {
    free(in->x);
    free(in->w);
    free(in->b);
    free(in->t);
    ct_tensor_release(in->tx);
    ct_tensor_release(in->tw);
    ct_tensor_release(in->tb);
    ct_tensor_release(in->tt);
}

static void close_scaled(const char *what, const double *got, const double *ref, int64_t n,
                         double rtol, double atol) {
    close_scaled_floor(what, got, ref, n, rtol, atol, 0.05);
}

static void check_grad(const char *what, ct_tensor *leaf, const double *ref, int64_t n,
                       double rtol, double atol) {
    ct_tensor *g = ct_grad(leaf);
    assert_non_null(g);
    assert_int_equal(ct_tensor_numel(g), n);
    assert_int_equal(ct_tensor_dtype(g), ct_tensor_dtype(leaf));
    double *v = tu_values(g);
    close_scaled(what, v, ref, n, rtol, atol);
    free(v);
}

static void run_case(const lce_case *k) {
    lce_inputs in;
    make_inputs(k, &in, true);
    cti_linear_ce_set_chunk_rows(k->chunk);
    ct_tensor *loss = ct_linear_cross_entropy(in.tx, in.tw, in.tb, in.tt, k->ignore, k->ls, k->red);
    if (!loss) fprintf(stderr, "%s\n", ct_last_error());
    assert_non_null(loss);
    bool none = k->red == CT_REDUCTION_NONE;
    int64_t nl = none ? k->n : 1;
    assert_int_equal(ct_tensor_ndim(loss), none ? ct_tensor_ndim(in.tt) : 0);
    assert_int_equal(ct_tensor_dtype(loss), k->dt);
    assert_int_equal(ct_tensor_numel(loss), nl);

    double *g = tu_rand_vals(nl, k->dt, 0.5, 2.0);
    double *rl = malloc(sizeof(double) * (size_t)(nl > 0 ? nl : 1));
    double *dx = malloc(sizeof(double) * (size_t)(k->n * k->d + 1));
    double *dw = malloc(sizeof(double) * (size_t)(k->v * k->d));
    double *db = malloc(sizeof(double) * (size_t)k->v);
    double *dbabs = malloc(sizeof(double) * (size_t)k->v);
    double *dwabs = malloc(sizeof(double) * (size_t)(k->v * k->d));
    ref_lce(k, in.x, in.w, in.b, in.t, g, rl, dx, dw, db, dbabs, dwabs);
    double rtol, atol;
    tol_of(k->dt, &rtol, &atol);
    double *got = tu_values(loss);
    close_scaled_floor("loss", got, rl, nl, rtol, atol, fmax(0.05, lse_max));
    free(got);

    ct_tensor *go = tu_from_f64(g, ct_tensor_ndim(loss), ct_tensor_shape(loss), k->dt);
    assert_int_equal(ct_backward(loss, go, false), CT_OK);
    check_grad("dx", in.tx, dx, k->n * k->d, rtol, atol);
    /* dweight and dbias sum each class's gradient over the rows, each rounded to
     * the dtype before the sum: the error scales with the sum of their
     * magnitudes, which cancellation can leave far above the result */
    {
        ct_tensor *gw = ct_grad(in.tw);
        assert_non_null(gw);
        assert_int_equal(ct_tensor_dtype(gw), k->dt);
        double *v = tu_values(gw), mx = 0.05;
        for (int64_t e = 0; e < k->v * k->d; e++) mx = fmax(mx, fabs(dw[e]));
        for (int64_t e = 0; e < k->v * k->d; e++)
            if (!(fabs(v[e] - dw[e]) <= rtol * (fabs(dw[e]) + dwabs[e]) + atol * mx)) {
                fprintf(stderr, "dweight: element %lld: got %.17g, expected %.17g (rtol %g, "
                        "sum of |terms| %g, atol %g * %g)\n", (long long)e, v[e], dw[e], rtol,
                        dwabs[e], atol, mx);
                fail();
            }
        free(v);
    }
    if (k->bias) {
        ct_tensor *gb = ct_grad(in.tb);
        assert_non_null(gb);
        double *v = tu_values(gb);
        for (int64_t j = 0; j < k->v; j++)
            if (fabs(v[j] - db[j]) > rtol * (fabs(db[j]) + dbabs[j]) + atol * 0.05) {
                fprintf(stderr, "dbias: element %lld: got %.17g, expected %.17g (rtol %g, "
                        "sum of |terms| %g)\n", (long long)j, v[j], db[j], rtol, dbabs[j]);
                fail();
            }
        free(v);
    }
    ct_tensor_release(go);
    ct_tensor_release(loss);
    free(g);
    free(rl);
    free(dx);
    free(dw);
    free(db);
    free(dbabs);
    free(dwabs);
    free_inputs(&in);
    cti_linear_ce_set_chunk_rows(0);
}

static lce_case random_case(ct_dtype dt) {
    static const ct_reduction reds[] = {CT_REDUCTION_NONE, CT_REDUCTION_MEAN, CT_REDUCTION_SUM};
    static const double lss[] = {0.0, 0.1, 0.35, 1.0};
    static const int64_t chunks[] = {0, 1, 2, 3, 5, 7};
    lce_case k = {.n = tu_randint(1, 30), .d = tu_randint(1, 10), .v = tu_randint(1, 20),
                  .batch = 1, .bias = tu_next() & 1, .red = reds[tu_randint(0, 3)],
                  .ignore = tu_next() & 1 ? IGN : 2, .ls = lss[tu_randint(0, 4)], .dt = dt,
                  .chunk = chunks[tu_randint(0, 6)], .noncontig = tu_uniform(0, 1) < 0.3};
    if (tu_uniform(0, 1) < 0.25) {
        k.batch = tu_randint(2, 4);
        k.n = k.batch * tu_randint(1, 6);
    }
    return k;
}

static void test_values_and_grads(void **state) {
    (void)state;
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        for (int it = 0; it < (dt == CT_F64 || dt == CT_F32 ? 60 : 25); it++) {
            lce_case k = random_case(dt);
            run_case(&k);
        }
    }
}

/* Each reduction, bias or not, at chunk sizes around N (N a multiple of the chunk and not). */
static void test_chunk_boundaries(void **state) {
    (void)state;
    static const int64_t chunks[] = {1, 4, 5, 6, 19, 20, 21, 0};
    for (int r = 0; r < 3; r++)
        for (int bias = 0; bias < 2; bias++)
            for (size_t c = 0; c < sizeof chunks / sizeof chunks[0]; c++) {
                lce_case k = {.n = 20, .d = 7, .v = 13, .batch = 1, .bias = bias,
                              .red = (ct_reduction)r, .ignore = IGN, .ls = 0.2, .dt = CT_F64,
                              .chunk = chunks[c]};
                run_case(&k);
            }
}

/* Large rows for the vectorized paths and a 3-d non-contiguous x. */
static void test_wide_rows(void **state) {
    (void)state;
    lce_case k = {.n = 9, .d = 17, .v = 300, .batch = 3, .bias = true, .red = CT_REDUCTION_MEAN,
                  .ignore = IGN, .ls = 0.05, .dt = CT_F32, .chunk = 4, .noncontig = true};
    run_case(&k);
    k.dt = CT_BF16;
    k.red = CT_REDUCTION_SUM;
    run_case(&k);
    k.dt = CT_F16;
    k.red = CT_REDUCTION_NONE;
    run_case(&k);
}

/* Same values and gradients as ct_cross_entropy(ct_linear(...)). */
static void test_matches_unfused(void **state) {
    (void)state;
    for (int it = 0; it < 24; it++) {
        lce_case k = random_case(it % 2 ? CT_F32 : CT_F64);
        k.batch = 1;
        k.red = (ct_reduction)(it % 3);
        lce_inputs a, b;
        make_inputs(&k, &a, true);
        /* the same values in fresh leaves */
        b = a;
        bool prev = ct_no_grad_begin();
        b.tx = ct_clone(a.tx);
        b.tw = ct_clone(a.tw);
        b.tb = a.tb ? ct_clone(a.tb) : NULL;
        ct_no_grad_end(prev);
        ct_requires_grad_(b.tx, true);
        ct_requires_grad_(b.tw, true);
        if (b.tb) ct_requires_grad_(b.tb, true);
        cti_linear_ce_set_chunk_rows(k.chunk);
        ct_tensor *fused = ct_linear_cross_entropy(a.tx, a.tw, a.tb, a.tt, k.ignore, k.ls, k.red);
        ct_tensor *logits = ct_linear(b.tx, b.tw, b.tb);
        ct_tensor *plain = ct_cross_entropy(logits, a.tt, NULL, k.red, k.ignore, k.ls);
        assert_non_null(fused);
        assert_non_null(plain);
        double rtol, atol;
        tol_of(k.dt, &rtol, &atol);
        double *fv = tu_values(fused), *pv = tu_values(plain);
        close_scaled("loss vs unfused", fv, pv, ct_tensor_numel(plain), rtol, atol);
        ct_tensor *go = tu_rand(ct_tensor_ndim(plain), ct_tensor_shape(plain), k.dt, -2, 2, NULL);
        assert_int_equal(ct_backward(fused, go, false), CT_OK);
        assert_int_equal(ct_backward(plain, go, false), CT_OK);
        ct_tensor *pairs[3][2] = {{a.tx, b.tx}, {a.tw, b.tw}, {a.tb, b.tb}};
        for (int i = 0; i < (k.bias ? 3 : 2); i++) {
            double *g1 = tu_values(ct_grad(pairs[i][0])), *g2 = tu_values(ct_grad(pairs[i][1]));
            close_scaled("grad vs unfused", g1, g2, ct_tensor_numel(pairs[i][0]), rtol, atol);
            free(g1);
            free(g2);
        }
        free(fv);
        free(pv);
        ct_tensor_release(go);
        ct_tensor_release(fused);
        ct_tensor_release(plain);
        ct_tensor_release(logits);
        ct_tensor_release(b.tx);
        ct_tensor_release(b.tw);
        ct_tensor_release(b.tb);
        free_inputs(&a);
        cti_linear_ce_set_chunk_rows(0);
    }
}

/* Every target ignored: mean is 0 / 0 = NaN with zero gradients, sum 0, none zeros
 * (as PyTorch); and an empty batch. */
static void test_all_ignored_and_empty(void **state) {
    (void)state;
    for (int r = 0; r < 3; r++)
        for (int empty = 0; empty < 2; empty++) {
            lce_case k = {.n = empty ? 0 : 6, .d = 3, .v = 5, .batch = 1, .bias = true,
                          .red = (ct_reduction)r, .ignore = IGN, .ls = 0.1, .dt = CT_F32,
                          .chunk = 4};
            lce_inputs in;
            make_inputs(&k, &in, true);
            for (int64_t i = 0; i < k.n; i++) ((int64_t *)ct_tensor_data_ptr(in.tt))[i] = IGN;
            cti_linear_ce_set_chunk_rows(k.chunk);
            ct_tensor *loss = ct_linear_cross_entropy(in.tx, in.tw, in.tb, in.tt, IGN, 0.1, k.red);
            assert_non_null(loss);
            double *lv = tu_values(loss);
            if (k.red == CT_REDUCTION_MEAN) assert_true(isnan(lv[0]));
            for (int64_t i = 0; k.red != CT_REDUCTION_MEAN && i < ct_tensor_numel(loss); i++)
                assert_true(lv[i] == 0.0);
            free(lv);
            ct_tensor *go = ct_tensor_ones_like(loss);
            assert_int_equal(ct_backward(loss, go, false), CT_OK);
            ct_tensor *leaves[3] = {in.tx, in.tw, in.tb};
            for (int l = 0; l < 3; l++) {
                ct_tensor *g = ct_grad(leaves[l]);
                assert_non_null(g);
                double *gv = tu_values(g);
                for (int64_t i = 0; i < ct_tensor_numel(g); i++) assert_true(gv[i] == 0.0);
                free(gv);
            }
            ct_tensor_release(go);
            ct_tensor_release(loss);
            free_inputs(&in);
            cti_linear_ce_set_chunk_rows(0);
        }
}

/* No grad mode and inputs without requires_grad: a loss without history; only one
 * input requiring grad gets a gradient. */
static void test_grad_modes(void **state) {
    (void)state;
    lce_case k = {.n = 7, .d = 4, .v = 6, .batch = 1, .bias = true, .red = CT_REDUCTION_MEAN,
                  .ignore = IGN, .ls = 0, .dt = CT_F64, .chunk = 3};
    lce_inputs in;
    make_inputs(&k, &in, false);
    ct_tensor *l0 = ct_linear_cross_entropy(in.tx, in.tw, in.tb, in.tt, IGN, 0, k.red);
    assert_non_null(l0);
    assert_false(ct_requires_grad(l0));
    ct_requires_grad_(in.tw, true);
    bool prev = ct_no_grad_begin();
    ct_tensor *l1 = ct_linear_cross_entropy(in.tx, in.tw, in.tb, in.tt, IGN, 0, k.red);
    ct_no_grad_end(prev);
    assert_false(ct_requires_grad(l1));
    double *a = tu_values(l0), *b = tu_values(l1);
    assert_true(a[0] == b[0]);
    ct_tensor *l2 = ct_linear_cross_entropy(in.tx, in.tw, in.tb, in.tt, IGN, 0, k.red);
    assert_true(ct_requires_grad(l2));
    assert_int_equal(ct_backward(l2, NULL, false), CT_OK);
    assert_non_null(ct_grad(in.tw));
    assert_null(ct_grad(in.tx));
    assert_null(ct_grad(in.tb));
    double g1 = 1, *rl = malloc(sizeof(double)), *dx = malloc(sizeof(double) * 28),
           *dw = malloc(sizeof(double) * 24), *db = malloc(sizeof(double) * 6);
    ref_lce(&k, in.x, in.w, in.b, in.t, &g1, rl, dx, dw, db, NULL, NULL);
    check_grad("dweight only", in.tw, dw, 24, 1e-10, 1e-12);
    free(a);
    free(b);
    free(rl);
    free(dx);
    free(dw);
    free(db);
    ct_tensor_release(l0);
    ct_tensor_release(l1);
    ct_tensor_release(l2);
    free_inputs(&in);
}

/* A 1-d x [d] with a 0-d target: one row, the loss 0-d for every reduction. */
static void test_single_row(void **state) {
    (void)state;
    int64_t d = 4, v = 6, ws[2] = {6, 4}, tv = 3;
    double *xv, *wv, *bv;
    ct_tensor *x = tu_rand(1, &d, CT_F64, -1, 1, &xv), *w = tu_rand(2, ws, CT_F64, -1, 1, &wv);
    ct_tensor *b = tu_rand(1, &v, CT_F64, -1, 1, &bv);
    ct_tensor *t = ct_tensor_from_data(&tv, CT_I64, 0, NULL);
    ct_requires_grad_(x, true);
    for (int r = 0; r < 3; r++) {
        lce_case k = {.n = 1, .d = 4, .v = 6, .batch = 1, .bias = true, .red = (ct_reduction)r,
                      .ignore = IGN, .ls = 0.25, .dt = CT_F64};
        ct_tensor *loss = ct_linear_cross_entropy(x, w, b, t, IGN, 0.25, k.red);
        assert_non_null(loss);
        assert_int_equal(ct_tensor_ndim(loss), 0);
        double g = 1, rl, dx[4], dw[24], db[6], *lv = tu_values(loss);
        ref_lce(&k, xv, wv, bv, &tv, &g, &rl, dx, dw, db, NULL, NULL);
        close_scaled("1-d loss", lv, &rl, 1, 1e-10, 1e-12);
        assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
        assert_int_equal(ct_tensor_ndim(ct_grad(x)), 1);
        check_grad("1-d dx", x, dx, 4, 1e-10, 1e-12);
        ct_zero_grad(x);
        free(lv);
        ct_tensor_release(loss);
    }
    free(xv);
    free(wv);
    free(bv);
    ct_tensor_release(x);
    ct_tensor_release(w);
    ct_tensor_release(b);
    ct_tensor_release(t);
}

/* The explicit backward, for each reduction, against the reference. */
static void test_backward_function(void **state) {
    (void)state;
    for (int r = 0; r < 3; r++) {
        lce_case k = {.n = 11, .d = 5, .v = 9, .batch = 1, .bias = true, .red = (ct_reduction)r,
                      .ignore = 4, .ls = 0.3, .dt = CT_F64, .chunk = 4};
        lce_inputs in;
        make_inputs(&k, &in, false);
        int64_t nl = r == CT_REDUCTION_NONE ? k.n : 1;
        double *g = tu_rand_vals(nl, CT_F64, -2, 2);
        ct_tensor *go = tu_from_f64(g, r == CT_REDUCTION_NONE ? 1 : 0, &k.n, CT_F64);
        ct_tensor *dx = NULL, *dw = NULL, *db = NULL;
        cti_linear_ce_set_chunk_rows(k.chunk);
        assert_int_equal(ct_linear_cross_entropy_backward(go, in.tx, in.tw, in.tb, in.tt, 4, 0.3,
                                                          k.red, &dx, &dw, &db),
                         CT_OK);
        double *rl = malloc(sizeof(double) * 11), *rdx = malloc(sizeof(double) * 55),
               *rdw = malloc(sizeof(double) * 45), *rdb = malloc(sizeof(double) * 9);
        ref_lce(&k, in.x, in.w, in.b, in.t, g, rl, rdx, rdw, rdb, NULL, NULL);
        ct_tensor *got[3] = {dx, dw, db};
        double *ref[3] = {rdx, rdw, rdb};
        int64_t nn[3] = {55, 45, 9};
        for (int i = 0; i < 3; i++) {
            double *v = tu_values(got[i]);
            close_scaled("explicit backward", v, ref[i], nn[i], 1e-10, 1e-12);
            free(v);
            ct_tensor_release(got[i]);
        }
        /* dweight alone */
        dx = dw = db = NULL;
        assert_int_equal(ct_linear_cross_entropy_backward(go, in.tx, in.tw, in.tb, in.tt, 4, 0.3,
                                                          k.red, NULL, &dw, NULL),
                         CT_OK);
        double *v = tu_values(dw);
        close_scaled("dweight alone", v, rdw, 45, 1e-10, 1e-12);
        free(v);
        ct_tensor_release(dw);
        free(g);
        free(rl);
        free(rdx);
        free(rdw);
        free(rdb);
        ct_tensor_release(go);
        free_inputs(&in);
        cti_linear_ce_set_chunk_rows(0);
    }
}

/* ---- float64 gradient checks ---------------------------------------------------------------- */
typedef struct gc_ctx {
    ct_tensor *target;
    ct_reduction red;
    double ls;
    bool bias;
} gc_ctx;

static ct_tensor *gc_fn(ct_tensor *const *in, void *p) {
    gc_ctx *c = p;
    return ct_linear_cross_entropy(in[0], in[1], c->bias ? in[2] : NULL, c->target, 1, c->ls,
                                   c->red);
}

static void test_gradcheck(void **state) {
    (void)state;
    for (int r = 0; r < 3; r++)
        for (int bias = 0; bias < 2; bias++) {
            int64_t xs[2] = {5, 3}, ws[2] = {4, 3}, v = 4;
            int64_t t[5] = {0, 3, 1, 2, 1}; /* 1 is ignore_index */
            ct_tensor *in[3] = {tu_rand(2, xs, CT_F64, -1, 1, NULL),
                                tu_rand(2, ws, CT_F64, -1, 1, NULL),
                                tu_rand(1, &v, CT_F64, -1, 1, NULL)};
            for (int i = 0; i < 3; i++) ct_requires_grad_(in[i], true);
            gc_ctx c = {.target = ct_tensor_from_data(t, CT_I64, 1, xs), .red = (ct_reduction)r,
                        .ls = 0.15, .bias = bias};
            cti_linear_ce_set_chunk_rows(2);
            gradcheck_ok("linear_cross_entropy", gc_fn, &c, bias ? 3 : 2, in);
            cti_linear_ce_set_chunk_rows(0);
            for (int i = 0; i < 3; i++) ct_tensor_release(in[i]);
            ct_tensor_release(c.target);
        }
}

/* ---- bad input ------------------------------------------------------------------------------ */
static void test_errors(void **state) {
    (void)state;
    int64_t xs[2] = {4, 3}, ws[2] = {5, 3}, bad_ws[2] = {5, 2}, v = 5, four = 4, ts2[2] = {2, 2};
    ct_tensor *x = ct_tensor_zeros(2, xs, CT_F32, CT_CPU);
    ct_tensor *w = ct_tensor_zeros(2, ws, CT_F32, CT_CPU);
    ct_tensor *b = ct_tensor_zeros(1, &v, CT_F32, CT_CPU);
    ct_tensor *t = ct_tensor_zeros(1, &four, CT_I64, CT_CPU);
    ct_tensor *w64 = ct_tensor_zeros(2, ws, CT_F64, CT_CPU);
    ct_tensor *wbad = ct_tensor_zeros(2, bad_ws, CT_F32, CT_CPU);
    ct_tensor *bbad = ct_tensor_zeros(1, &four, CT_F32, CT_CPU);
    ct_tensor *t32 = ct_tensor_zeros(1, &four, CT_I32, CT_CPU);
    ct_tensor *tbad = ct_tensor_zeros(2, ts2, CT_I64, CT_CPU);
    ct_tensor *xi = ct_tensor_zeros(2, xs, CT_I64, CT_CPU);
    ct_tensor *x0 = ct_tensor_zeros(0, NULL, CT_F32, CT_CPU);
    int64_t ws0[2] = {0, 3};
    ct_tensor *w0 = ct_tensor_zeros(2, ws0, CT_F32, CT_CPU);
    const char *op = "ct_linear_cross_entropy";
    tu_assert_null_error(ct_linear_cross_entropy(NULL, w, b, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_INVALID_ARG, op, "argument 1 is NULL");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, b, NULL, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_INVALID_ARG, op, "argument 3 is NULL");
    tu_assert_null_error(ct_linear_cross_entropy(xi, w, b, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_DTYPE, op, "floating", "int64");
    tu_assert_null_error(ct_linear_cross_entropy(x, w64, b, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_DTYPE, op, "weight has dtype float64", "x's dtype float32");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, w64, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_DTYPE, op, "bias has dtype float64");
    tu_assert_null_error(ct_linear_cross_entropy(x0, w, b, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_SHAPE, op, "feature dim");
    tu_assert_null_error(ct_linear_cross_entropy(x, wbad, b, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_SHAPE, op, "weight [5, 2]", "must be [V, 3]");
    tu_assert_null_error(ct_linear_cross_entropy(x, w0, NULL, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_SHAPE, op, "no classes");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, bbad, t, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_SHAPE, op, "bias [4]", "must be [5]");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, b, t32, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_DTYPE, op, "int64 class indices", "int32");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, b, tbad, IGN, 0, CT_REDUCTION_MEAN),
                         CT_ERR_SHAPE, op, "target [2, 2]", "expected target shape [4]");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, b, t, IGN, 0, (ct_reduction)7),
                         CT_ERR_INVALID_ARG, op, "unknown reduction 7");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, b, t, IGN, 1.5, CT_REDUCTION_MEAN),
                         CT_ERR_INVALID_ARG, op, "label_smoothing must be in [0, 1], got 1.5");
    tu_assert_null_error(ct_linear_cross_entropy(x, w, b, t, IGN, NAN, CT_REDUCTION_MEAN),
                         CT_ERR_INVALID_ARG, op, "label_smoothing");
    /* targets out of range, found by the kernel, in a later chunk too */
    for (int chunk = 0; chunk < 2; chunk++) {
        cti_linear_ce_set_chunk_rows(chunk ? 1 : 0);
        int64_t tv[4] = {0, 1, 2, chunk ? 5 : -1};
        ct_tensor *tt = ct_tensor_from_data(tv, CT_I64, 1, &four);
        ct_requires_grad_(w, true);
        tu_assert_null_error(ct_linear_cross_entropy(x, w, b, tt, IGN, 0, CT_REDUCTION_MEAN),
                             CT_ERR_INDEX, op, chunk ? "target 5 is out of bounds for 5 classes"
                                                     : "target -1 is out of bounds for 5 classes",
                             "expected 0..4 or ignore_index -100");
        ct_requires_grad_(w, false);
        ct_tensor_release(tt);
        cti_linear_ce_set_chunk_rows(0);
    }
    /* the backward's own checks */
    const char *bop = "ct_linear_cross_entropy_backward";
    ct_tensor *g0 = ct_tensor_ones(0, NULL, CT_F32, CT_CPU), *dx = NULL, *dw = NULL, *db = NULL;
    tu_assert_error(ct_linear_cross_entropy_backward(g0, x, w, b, t, IGN, 0, CT_REDUCTION_MEAN,
                                                     NULL, NULL, NULL),
                    CT_ERR_INVALID_ARG, bop, "no gradient asked for");
    tu_assert_error(ct_linear_cross_entropy_backward(g0, x, w, NULL, t, IGN, 0, CT_REDUCTION_MEAN,
                                                     &dx, NULL, &db),
                    CT_ERR_INVALID_ARG, bop, "dbias asked for without a bias");
    assert_null(dx);
    tu_assert_error(ct_linear_cross_entropy_backward(g0, x, w, b, t, IGN, 0, CT_REDUCTION_NONE,
                                                     &dx, &dw, NULL),
                    CT_ERR_SHAPE, bop, "grad_loss []", "the loss's shape [4]");
    tu_assert_error(ct_linear_cross_entropy_backward(NULL, x, w, b, t, IGN, 0, CT_REDUCTION_MEAN,
                                                     &dx, &dw, NULL),
                    CT_ERR_INVALID_ARG, bop, "NULL");
    ct_tensor *g64 = ct_tensor_ones(0, NULL, CT_F64, CT_CPU);
    tu_assert_error(ct_linear_cross_entropy_backward(g64, x, w, b, t, IGN, 0, CT_REDUCTION_SUM,
                                                     &dx, &dw, NULL),
                    CT_ERR_DTYPE, bop, "grad_loss has dtype float64");
    assert_null(dx);
    assert_null(dw);
    ct_tensor *all[] = {x, w, b, t, w64, wbad, bbad, t32, tbad, xi, x0, w0, g0, g64};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
}

/* The explicit backward's gradients belong to the scope open around it:
 * ending the scope leaves nothing alive (the fixture counts). */
static void test_results_in_scope(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = tu_rand(CT_SHAPE(8, 4), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(6, 4), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(6), CT_F32, -1, 1, NULL);
    ct_tensor *t = tu_rand(CT_SHAPE(8), CT_I64, 0, 6, NULL);
    ct_tensor *g = ct_tensor_scalar(1.0, CT_F32, CT_CPU);
    ct_tensor *dx = NULL, *dw = NULL, *db = NULL;
    assert_int_equal(ct_linear_cross_entropy_backward(g, x, w, b, t, -100, 0.2,
                                                      CT_REDUCTION_MEAN, &dx, &dw, &db),
                     CT_OK);
    assert_non_null(dx);
    assert_non_null(dw);
    assert_non_null(db);
    assert_non_null(ct_linear_cross_entropy(x, w, b, t, -100, 0, CT_REDUCTION_SUM));
    ct_scope_end(sc);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_values_and_grads), T(test_chunk_boundaries), T(test_wide_rows),
        T(test_matches_unfused), T(test_all_ignored_and_empty), T(test_grad_modes),
        T(test_single_row), T(test_backward_function), T(test_gradcheck), T(test_errors),
        T(test_results_in_scope),
    };
#undef T
    return tu_run_tests(tests);
}
