/* Tests of the nn ops (normalization, softmax, losses, embedding, dropout)
 * against float64 references written here: forward by the definitions,
 * backward through explicit Jacobians or central finite differences. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/tensor_impl.h"
#include "dispatch/dispatch_impl.h"
#include "test_util.h"
#include "test_fixture.h"

/* ---- helpers ------------------------------------------------------------------------ */

/* A random tensor of dt, replaced by a non-contiguous copy when nc. */
static ct_tensor *rnd(int nd, const int64_t *shape, ct_dtype dt, double lo, double hi, bool nc,
                      double **vals) {
    ct_tensor *t = tu_rand(nd, shape, dt, lo, hi, vals);
    assert_non_null(t);
    if (!nc) return t;
    ct_tensor *v = tu_noncontig(t);
    ct_tensor_release(t);
    assert_non_null(v);
    assert_false(ct_tensor_is_contiguous(v) && ct_tensor_numel(v) > 1 && nd > 0 &&
                 shape[nd - 1] > 1);
    return v;
}

static double max_abs(const double *v, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fabs(v[i]) > m ? fabs(v[i]) : m;
    return m;
}

/* Compares t with ref using dt's tolerance times scale, and an absolute floor
 * of the same size relative to the largest reference magnitude (for values
 * formed by cancellation). */
static void check(ct_tensor *t, const double *ref, int64_t n, ct_dtype dt, double scale) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_numel(t), n);
    double *got = tu_values(t);
    double rtol = tu_rtol(dt) * scale;
    double m = max_abs(ref, n);
    tu_assert_close(got, ref, n, rtol, rtol * (m > 1 ? m : 1));
    free(got);
}

static void check_shape(const ct_tensor *t, int nd, const int64_t *shape) {
    assert_int_equal(ct_tensor_ndim(t), nd);
    for (int i = 0; i < nd; i++) assert_int_equal(ct_tensor_shape(t)[i], shape[i]);
}

/* A random shape of nd dims with sizes in [lo, hi]. */
static void rand_shape(int nd, int64_t lo, int64_t hi, int64_t *shape) {
    for (int i = 0; i < nd; i++) shape[i] = tu_randint(lo, hi + 1);
}

static ct_tensor *i64_tensor(const int64_t *v, int nd, const int64_t *shape) {
    ct_tensor *t = ct_tensor_from_data(v, CT_I64, nd, shape);
    assert_non_null(t);
    return t;
}

/* ---- RMSNorm -------------------------------------------------------------------------- */

static void ref_rms(const double *x, const double *w, int64_t rows, int64_t d, double eps,
                    double *y, double *inv) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += x[r * d + i] * x[r * d + i];
        double v = 1.0 / sqrt(ss / (double)d + eps);
        inv[r] = v;
        for (int64_t i = 0; i < d; i++) y[r * d + i] = x[r * d + i] * v * (w ? w[i] : 1.0);
    }
}

/* dx_j = sum_i g_i * dy_i/dx_j with dy_i/dx_j = w_i (δij r - x_i r^3 x_j / D), summed
 * over the explicit Jacobian; dw_i = sum_rows g_i x_i r. */
static void ref_rms_bwd(const double *g, const double *x, const double *w, int64_t rows,
                        int64_t d, double eps, double *dx, double *dw) {
    for (int64_t i = 0; i < d; i++) dw[i] = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d, *gr = g + r * d;
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += xr[i] * xr[i];
        double rr = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t j = 0; j < d; j++) {
            double s = 0;
            for (int64_t i = 0; i < d; i++) {
                double wi = w ? w[i] : 1.0;
                double jac = wi * ((i == j ? rr : 0.0) - xr[i] * rr * rr * rr * xr[j] / (double)d);
                s += gr[i] * jac;
            }
            dx[r * d + j] = s;
            dw[j] += gr[j] * xr[j] * rr;
        }
    }
}

static void test_rms_norm(void **state) {
    (void)state;
    for (int it = 0; it < 32; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        bool nc = (it / 4) % 2, hasw = (it / 8) % 2 == 0;
        int nlead = (int)tu_randint(0, 3), nnorm = (int)tu_randint(1, 3);
        if (it == 5 && nlead == 0) nlead = 1;
        int64_t shape[6];
        rand_shape(nlead, 1, 5, shape);
        rand_shape(nnorm, 1, 24, shape + nlead);
        if (it == 5) shape[0] = 0; /* no rows */
        int nd = nlead + nnorm;
        int64_t rows = tu_numel(nlead, shape), d = tu_numel(nnorm, shape + nlead), n = rows * d;
        double *xv, *wv = NULL, eps = 1e-5;
        ct_tensor *x = rnd(nd, shape, dt, -2, 2, nc, &xv);
        ct_tensor *w = hasw ? rnd(nnorm, shape + nlead, dt, 0.5, 1.5, nc, &wv) : NULL;
        ct_tensor *inv = NULL;
        ct_tensor *y = ct_rms_norm(x, nnorm, shape + nlead, w, eps, &inv);
        assert_non_null(y);
        assert_non_null(inv);
        check_shape(y, nd, shape);
        check_shape(inv, nlead, shape);
        assert_int_equal(ct_tensor_dtype(y), dt);
        assert_int_equal(ct_tensor_dtype(inv), dt == CT_F64 ? CT_F64 : CT_F32);
        double *yr = malloc(sizeof(double) * (size_t)(n + 1)), *ir = malloc(sizeof(double) * (size_t)(rows + 1));
        ref_rms(xv, wv, rows, d, eps, yr, ir);
        check(y, yr, n, dt, 1);
        check(inv, ir, rows, dt == CT_F64 ? CT_F64 : CT_F32, 1);

        double *gv;
        ct_tensor *g = rnd(nd, shape, dt, -1, 1, !nc, &gv);
        ct_tensor *dx = NULL, *dw = NULL;
        assert_int_equal(ct_rms_norm_backward(g, x, w, inv, &dx, &dw), CT_OK);
        double *dxr = malloc(sizeof(double) * (size_t)(n + 1)), *dwr = malloc(sizeof(double) * (size_t)(d + 1));
        /* the reference starts from the saved statistic's inputs, as the kernel does */
        ref_rms_bwd(gv, xv, wv, rows, d, eps, dxr, dwr);
        check(dx, dxr, n, dt, 4);
        check_shape(dx, nd, shape);
        if (hasw) {
            check(dw, dwr, d, dt, dt == CT_BF16 || dt == CT_F16 ? 4 : 20);
            check_shape(dw, nnorm, shape + nlead);
        } else {
            assert_null(dw);
        }
        ct_tensor *y2 = ct_rms_norm(x, nnorm, shape + nlead, w, eps, NULL);
        check(y2, yr, n, dt, 1);
        ct_tensor_release(y2);
        free(xv), free(wv), free(gv), free(yr), free(ir), free(dxr), free(dwr);
        ct_tensor_release(x), ct_tensor_release(w), ct_tensor_release(y), ct_tensor_release(inv);
        ct_tensor_release(g), ct_tensor_release(dx), ct_tensor_release(dw);
    }
}

/* Large rows cross the parallel split; dweight must not depend on the run. */
static void test_rms_norm_large_deterministic(void **state) {
    (void)state;
    int64_t shape[2] = {257, 1031};
    double *xv, *wv, *gv;
    ct_tensor *x = tu_rand(2, shape, CT_F32, -3, 3, &xv);
    ct_tensor *w = tu_rand(1, shape + 1, CT_F32, -1, 1, &wv);
    ct_tensor *g = tu_rand(2, shape, CT_F32, -1, 1, &gv);
    ct_tensor *inv = NULL, *y = ct_rms_norm(x, 1, shape + 1, w, 1e-6, &inv);
    int64_t n = shape[0] * shape[1];
    double *yr = malloc(sizeof(double) * (size_t)n), *ir = malloc(sizeof(double) * 257);
    ref_rms(xv, wv, shape[0], shape[1], 1e-6, yr, ir);
    check(y, yr, n, CT_F32, 1);
    ct_tensor *dx1, *dw1, *dx2, *dw2;
    assert_int_equal(ct_rms_norm_backward(g, x, w, inv, &dx1, &dw1), CT_OK);
    assert_int_equal(ct_rms_norm_backward(g, x, w, inv, &dx2, &dw2), CT_OK);
    double *a = tu_values(dw1), *b = tu_values(dw2);
    for (int64_t i = 0; i < shape[1]; i++) assert_true(a[i] == b[i]);
    double *dwr = malloc(sizeof(double) * (size_t)shape[1]);
    for (int64_t j = 0; j < shape[1]; j++) {
        dwr[j] = 0;
        for (int64_t r = 0; r < shape[0]; r++)
            dwr[j] += gv[r * shape[1] + j] * xv[r * shape[1] + j] * ir[r];
    }
    check(dw1, dwr, shape[1], CT_F32, 10);
    free(a), free(b), free(dwr), free(xv), free(wv), free(gv), free(yr), free(ir);
    ct_tensor *ts[] = {x, w, g, inv, y, dx1, dw1, dx2, dw2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

/* An output over the cache-bypass size, with rows of both 32-byte alignments. */
static void test_rms_norm_streaming(void **state) {
    (void)state;
    int64_t shape[2] = {1024, 4100};
    double *xv, *wv;
    ct_tensor *x = tu_rand(2, shape, CT_F32, -3, 3, &xv);
    ct_tensor *w = tu_rand(1, shape + 1, CT_F32, -1, 1, &wv);
    ct_tensor *inv = NULL, *y = ct_rms_norm(x, 1, shape + 1, w, 1e-6, &inv);
    int64_t n = shape[0] * shape[1];
    double *yr = malloc(sizeof(double) * (size_t)n), *ir = malloc(sizeof(double) * 1024);
    ref_rms(xv, wv, shape[0], shape[1], 1e-6, yr, ir);
    check(y, yr, n, CT_F32, 1);
    check(inv, ir, shape[0], CT_F32, 1);
    free(xv), free(wv), free(yr), free(ir);
    ct_tensor_release(x), ct_tensor_release(w), ct_tensor_release(y), ct_tensor_release(inv);
}

/* ---- LayerNorm ------------------------------------------------------------------------ */

static void ref_ln(const double *x, const double *w, const double *b, int64_t rows, int64_t d,
                   double eps, double *y, double *mean, double *rstd) {
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d;
        double m = 0, v = 0;
        for (int64_t i = 0; i < d; i++) m += xr[i];
        m /= (double)d;
        for (int64_t i = 0; i < d; i++) v += (xr[i] - m) * (xr[i] - m);
        double rs = 1.0 / sqrt(v / (double)d + eps);
        mean[r] = m;
        rstd[r] = rs;
        for (int64_t i = 0; i < d; i++)
            y[r * d + i] = (xr[i] - m) * rs * (w ? w[i] : 1.0) + (b ? b[i] : 0.0);
    }
}

/* Explicit Jacobian: dy_i/dx_j = w_i [ (δij - 1/D) r - (x_i - μ) r^3 (x_j - μ) / D ]. */
static void ref_ln_bwd(const double *g, const double *x, const double *w, int64_t rows, int64_t d,
                       double eps, double *dx, double *dw, double *db) {
    for (int64_t i = 0; i < d; i++) dw[i] = db[i] = 0;
    for (int64_t r = 0; r < rows; r++) {
        const double *xr = x + r * d, *gr = g + r * d;
        double m = 0, v = 0;
        for (int64_t i = 0; i < d; i++) m += xr[i];
        m /= (double)d;
        for (int64_t i = 0; i < d; i++) v += (xr[i] - m) * (xr[i] - m);
        double rs = 1.0 / sqrt(v / (double)d + eps);
        for (int64_t j = 0; j < d; j++) {
            double s = 0;
            for (int64_t i = 0; i < d; i++) {
                double jac = (w ? w[i] : 1.0) *
                             (((i == j ? 1.0 : 0.0) - 1.0 / (double)d) * rs -
                              (xr[i] - m) * rs * rs * rs * (xr[j] - m) / (double)d);
                s += gr[i] * jac;
            }
            dx[r * d + j] = s;
            dw[j] += gr[j] * (xr[j] - m) * rs;
            db[j] += gr[j];
        }
    }
}

static void test_layer_norm(void **state) {
    (void)state;
    for (int it = 0; it < 32; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        bool nc = (it / 4) % 2, hasw = (it / 8) % 2 == 0, hasb = (it / 16) % 2 == 0;
        int nlead = (int)tu_randint(0, 3), nnorm = (int)tu_randint(1, 3);
        int64_t shape[6];
        rand_shape(nlead, 1, 5, shape);
        rand_shape(nnorm, 1, 20, shape + nlead);
        if (tu_numel(nnorm, shape + nlead) < 2) shape[nlead] = 3;
        int nd = nlead + nnorm;
        int64_t rows = tu_numel(nlead, shape), d = tu_numel(nnorm, shape + nlead), n = rows * d;
        double *xv, *wv = NULL, *bv = NULL, eps = 1e-5;
        ct_tensor *x = rnd(nd, shape, dt, -2, 3, nc, &xv);
        ct_tensor *w = hasw ? rnd(nnorm, shape + nlead, dt, 0.5, 1.5, nc, &wv) : NULL;
        ct_tensor *b = hasb ? rnd(nnorm, shape + nlead, dt, -1, 1, false, &bv) : NULL;
        ct_tensor *mean = NULL, *rstd = NULL;
        ct_tensor *y = ct_layer_norm(x, nnorm, shape + nlead, w, b, eps, &mean, &rstd);
        assert_non_null(y);
        check_shape(mean, nlead, shape);
        check_shape(rstd, nlead, shape);
        ct_dtype sdt = dt == CT_F64 ? CT_F64 : CT_F32;
        assert_int_equal(ct_tensor_dtype(mean), sdt);
        double *yr = malloc(sizeof(double) * (size_t)n), *mr = malloc(sizeof(double) * (size_t)rows),
               *rr = malloc(sizeof(double) * (size_t)rows);
        ref_ln(xv, wv, bv, rows, d, eps, yr, mr, rr);
        /* x - mean loses max|x| / std of its relative precision (a row of two
         * close values is the worst case): y, rstd and the gradients carry that
         * error, so their tolerance grows with it */
        double kappa = 1;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t i = 0; i < d; i++)
                if (fabs(xv[r * d + i]) * rr[r] > kappa) kappa = fabs(xv[r * d + i]) * rr[r];
        check(y, yr, n, dt, 2 * kappa);
        check(mean, mr, rows, sdt, 2);
        check(rstd, rr, rows, sdt, 2 * kappa);

        double *gv;
        ct_tensor *g = rnd(nd, shape, dt, -1, 1, !nc, &gv);
        ct_tensor *dx = NULL, *dw = NULL, *db = NULL;
        assert_int_equal(ct_layer_norm_backward(g, x, w, mean, rstd, &dx, &dw, &db), CT_OK);
        double *dxr = malloc(sizeof(double) * (size_t)n), *dwr = malloc(sizeof(double) * (size_t)d),
               *dbr = malloc(sizeof(double) * (size_t)d);
        ref_ln_bwd(gv, xv, wv, rows, d, eps, dxr, dwr, dbr);
        check(dx, dxr, n, dt, 8 * kappa);
        check(db, dbr, d, dt, 4);
        if (hasw) check(dw, dwr, d, dt, 8 * kappa);
        else assert_null(dw);
        free(xv), free(wv), free(bv), free(gv), free(yr), free(mr), free(rr), free(dxr), free(dwr),
            free(dbr);
        ct_tensor *ts[] = {x, w, b, y, mean, rstd, g, dx, dw, db};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
    }
}

/* ---- softmax ------------------------------------------------------------------------- */

/* Splits shape around dim: outer * D * inner. */
static void geom(int nd, const int64_t *shape, int dim, int64_t *o, int64_t *d, int64_t *in) {
    *o = tu_numel(dim, shape);
    *d = nd ? shape[dim] : 1;
    *in = nd ? tu_numel(nd - dim - 1, shape + dim + 1) : 1;
}

static void ref_softmax(const double *x, int64_t o, int64_t d, int64_t in, bool lg, double *y) {
    for (int64_t a = 0; a < o; a++)
        for (int64_t c = 0; c < in; c++) {
            double m = -INFINITY, s = 0;
            for (int64_t k = 0; k < d; k++) m = fmax(m, x[(a * d + k) * in + c]);
            for (int64_t k = 0; k < d; k++) s += exp(x[(a * d + k) * in + c] - m);
            for (int64_t k = 0; k < d; k++) {
                double v = x[(a * d + k) * in + c] - m;
                y[(a * d + k) * in + c] = lg ? v - log(s) : exp(v) / s;
            }
        }
}

/* Through the Jacobian of softmax, p = softmax(x): dp_i/dx_j = p_i (δij - p_j),
 * dlogp_i/dx_j = δij - p_j. x holds the forward's input. */
static void ref_softmax_bwd(const double *g, const double *x, int64_t o, int64_t d, int64_t in,
                            bool lg, double *dx) {
    double *p = malloc(sizeof(double) * (size_t)(o * d * in + 1));
    ref_softmax(x, o, d, in, false, p);
    for (int64_t a = 0; a < o; a++)
        for (int64_t c = 0; c < in; c++)
            for (int64_t j = 0; j < d; j++) {
                double s = 0;
                for (int64_t i = 0; i < d; i++) {
                    double pi = p[(a * d + i) * in + c], pj = p[(a * d + j) * in + c];
                    double jac = lg ? (i == j) - pj : pi * ((i == j) - pj);
                    s += g[(a * d + i) * in + c] * jac;
                }
                dx[(a * d + j) * in + c] = s;
            }
    free(p);
}

static void test_softmax(void **state) {
    (void)state;
    for (int it = 0; it < 64; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        bool nc = (it / 4) % 2, lg = (it / 8) % 2;
        int nd = (int)tu_randint(0, 5);
        int64_t shape[4];
        rand_shape(nd, 1, 7, shape);
        if (nd && it % 5 == 0) shape[nd - 1] = 70; /* more than one column block */
        int dim = nd ? (int)tu_randint(0, nd) : 0;
        int pass_dim = it % 3 == 0 ? dim - (nd ? nd : 1) : dim; /* negative dims too */
        int64_t o, d, in, n = tu_numel(nd, shape);
        geom(nd, shape, dim, &o, &d, &in);
        double *xv;
        ct_tensor *x = rnd(nd, shape, dt, -6, 6, nc && nd > 0, &xv);
        ct_tensor *y = lg ? ct_log_softmax(x, pass_dim) : ct_softmax(x, pass_dim);
        assert_non_null(y);
        check_shape(y, nd, shape);
        double *yr = malloc(sizeof(double) * (size_t)n);
        ref_softmax(xv, o, d, in, lg, yr);
        check(y, yr, n, dt, 1);

        /* backward from the library's own y, reference from x */
        double *gv;
        ct_tensor *g = rnd(nd, shape, dt, -1, 1, !nc && nd > 0, &gv);
        ct_tensor *dx = lg ? ct_log_softmax_backward(g, y, pass_dim) : ct_softmax_backward(g, y, pass_dim);
        double *dxr = malloc(sizeof(double) * (size_t)n);
        ref_softmax_bwd(gv, xv, o, d, in, lg, dxr);
        check(dx, dxr, n, dt, dt == CT_F64 ? 1e3 : 4);
        free(xv), free(gv), free(yr), free(dxr);
        ct_tensor_release(x), ct_tensor_release(y), ct_tensor_release(g), ct_tensor_release(dx);
    }
}

/* Large and infinite inputs: the max is subtracted, -inf gives exact zeros. */
static void test_softmax_stability(void **state) {
    (void)state;
    for (int k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        double v[8] = {1000, 999, -INFINITY, 998, 1000, -INFINITY, 0, -1000};
        ct_tensor *x = tu_from_f64(v, 2, (const int64_t[]){2, 4}, dt);
        for (int dim = 0; dim < 2; dim++) {
            ct_tensor *y = ct_softmax(x, dim), *ly = ct_log_softmax(x, dim);
            int64_t o, d, in;
            geom(2, (const int64_t[]){2, 4}, dim, &o, &d, &in);
            double r[8], lr[8];
            double xr[8];
            for (int i = 0; i < 8; i++) xr[i] = isinf(v[i]) ? v[i] : tu_round(v[i], dt);
            ref_softmax(xr, o, d, in, false, r);
            ref_softmax(xr, o, d, in, true, lr);
            check(y, r, 8, dt, 1);
            check(ly, lr, 8, dt, 1);
            double *yv = tu_values(y);
            for (int i = 0; i < 8; i++) assert_true(isfinite(yv[i]));
            if (dim == 1) assert_true(yv[2] == 0.0);
            free(yv);
            ct_tensor_release(y), ct_tensor_release(ly);
        }
        ct_tensor_release(x);
    }
}

/* ---- cross-entropy and nll ------------------------------------------------------------ */

typedef struct ce_case {
    int64_t n, c, inner;
    bool flat; /* [C] input and a 0-d target (n = inner = 1) */
    const double *w; /* NULL: no weight */
    int red;
    int64_t ignore;
    double ls;
} ce_case;

/* PyTorch's formula: (1-ls) * nll(logp, t, w) + ls/C * smooth, with the mean of
 * both parts divided by the sum of the counted targets' weights. loss[] gets the
 * per-position values; returns the reduced value. */
static double ref_ce(const ce_case *k, const double *z, const int64_t *t, bool from_logits,
                     double *loss) {
    double total = 0, wsum = 0;
    int64_t c = k->c, in = k->inner;
    double *lp = malloc(sizeof(double) * (size_t)c);
    for (int64_t n = 0; n < k->n; n++)
        for (int64_t j = 0; j < in; j++) {
            int64_t p = n * in + j;
            double m = -INFINITY, s = 0;
            for (int64_t q = 0; q < c; q++) m = fmax(m, z[(n * c + q) * in + j]);
            for (int64_t q = 0; q < c; q++) s += exp(z[(n * c + q) * in + j] - m);
            for (int64_t q = 0; q < c; q++)
                lp[q] = from_logits ? z[(n * c + q) * in + j] - m - log(s) : z[(n * c + q) * in + j];
            double l = 0;
            if (t[p] != k->ignore) {
                double wt = k->w ? k->w[t[p]] : 1.0;
                double smooth = 0;
                for (int64_t q = 0; q < c; q++) smooth -= (k->w ? k->w[q] : 1.0) * lp[q];
                l = (1 - k->ls) * (-wt * lp[t[p]]) + k->ls / (double)c * smooth;
                wsum += wt;
            }
            if (loss) loss[p] = l;
            total += l;
        }
    free(lp);
    return k->red == CT_REDUCTION_MEAN ? total / wsum : total;
}

/* sum_p gl[p] * loss[p] (none) or gl[0] * loss: the scalar whose gradient the
 * backward returns. */
static double ce_objective(const ce_case *k, const double *z, const int64_t *t, bool logits,
                           const double *gl) {
    int64_t np = k->n * k->inner;
    if (k->red != CT_REDUCTION_NONE) return gl[0] * ref_ce(k, z, t, logits, NULL);
    double *loss = malloc(sizeof(double) * (size_t)np), s = 0;
    ref_ce(k, z, t, logits, loss);
    for (int64_t p = 0; p < np; p++) s += gl[p] * loss[p];
    free(loss);
    return s;
}

/* Central finite differences of the objective in float64. */
static void fd_grad(const ce_case *k, const double *z, const int64_t *t, bool logits,
                    const double *gl, double *grad) {
    int64_t nz = k->n * k->c * k->inner;
    double *zz = malloc(sizeof(double) * (size_t)nz);
    memcpy(zz, z, sizeof(double) * (size_t)nz);
    for (int64_t i = 0; i < nz; i++) {
        double h = 1e-5 * fmax(1.0, fabs(z[i]));
        zz[i] = z[i] + h;
        double a = ce_objective(k, zz, t, logits, gl);
        zz[i] = z[i] - h;
        double b = ce_objective(k, zz, t, logits, gl);
        zz[i] = z[i];
        grad[i] = (a - b) / (2 * h);
    }
    free(zz);
}

static void run_cls_case(const ce_case *k, ct_dtype dt, bool logits, bool nc) {
    /* shapes: [C], [N, C], or [N, C, a, b] with a * b = inner */
    int64_t shape[4], tshape[3];
    int nd, tnd;
    if (k->flat) {
        nd = 1, tnd = 0, shape[0] = k->c;
    } else if (k->inner == 1) {
        nd = 2, tnd = 1, shape[0] = tshape[0] = k->n, shape[1] = k->c;
    } else {
        nd = 4, tnd = 3;
        shape[0] = tshape[0] = k->n, shape[1] = k->c;
        shape[2] = tshape[1] = k->inner % 2 == 0 ? 2 : 1;
        shape[3] = tshape[2] = k->inner / shape[2];
    }
    int64_t np = k->n * k->inner, nz = np * k->c;
    double *zv;
    ct_tensor *z = rnd(nd, shape, dt, logits ? -4 : -6, logits ? 4 : -0.05, nc, &zv);
    int64_t *tv = malloc(sizeof(int64_t) * (size_t)np);
    for (int64_t p = 0; p < np; p++) {
        tv[p] = tu_randint(0, k->c);
        if (p % 3 == 1) tv[p] = k->ignore; /* ignored targets present */
    }
    if (k->ignore >= 0 && k->ignore < k->c && np > 0) tv[0] = (k->ignore + 1) % k->c;
    ct_tensor *t = i64_tensor(tv, tnd, tshape);
    ct_tensor *w = NULL;
    if (k->w) {
        w = tu_from_f64(k->w, 1, &k->c, dt);
        assert_non_null(w);
    }
    /* the reference sees the weights as the library stores them */
    double *wr = NULL;
    ce_case kk = *k;
    if (k->w) {
        wr = malloc(sizeof(double) * (size_t)k->c);
        for (int64_t q = 0; q < k->c; q++) wr[q] = tu_round(k->w[q], dt);
        kk.w = wr;
    }
    ct_tensor *loss = logits ? ct_cross_entropy(z, t, w, k->red, k->ignore, k->ls)
                             : ct_nll_loss(z, t, w, k->red, k->ignore);
    assert_non_null(loss);
    double *lr = malloc(sizeof(double) * (size_t)(np + 1));
    double red = ref_ce(&kk, zv, tv, logits, lr);
    if (k->red == CT_REDUCTION_NONE) {
        check_shape(loss, tnd, tshape);
        check(loss, lr, np, dt, 4);
    } else {
        assert_int_equal(ct_tensor_ndim(loss), 0);
        check(loss, &red, 1, dt, 4);
    }

    /* backward against finite differences */
    int64_t gn = k->red == CT_REDUCTION_NONE ? np : 1;
    double *glv;
    ct_tensor *gl = tu_rand(k->red == CT_REDUCTION_NONE ? tnd : 0, tshape, dt, 0.5, 2, &glv);
    ct_tensor *dz = logits ? ct_cross_entropy_backward(gl, z, t, w, k->red, k->ignore, k->ls)
                           : ct_nll_loss_backward(gl, z, t, w, k->red, k->ignore);
    assert_non_null(dz);
    check_shape(dz, nd, shape);
    double *ref = malloc(sizeof(double) * (size_t)nz);
    fd_grad(&kk, zv, tv, logits, glv, ref);
    double *got = tu_values(dz);
    double rtol = dt == CT_F64 ? 1e-6 : tu_rtol(dt) * 4;
    tu_assert_close(got, ref, nz, rtol, rtol * fmax(max_abs(ref, nz), 1e-3));
    (void)gn;
    free(got), free(ref), free(glv), free(lr), free(zv), free(tv), free(wr);
    ct_tensor_release(z), ct_tensor_release(t), ct_tensor_release(w), ct_tensor_release(loss);
    ct_tensor_release(gl), ct_tensor_release(dz);
}

static void test_cross_entropy(void **state) {
    (void)state;
    static const double w5[5] = {0.5, 2.0, 1.0, 0.25, 1.5};
    for (int it = 0; it < 48; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        ce_case k = {.n = tu_randint(1, 6), .c = 5, .inner = 1, .w = (it / 4) % 2 ? w5 : NULL,
                     .red = (it / 8) % 3, .ignore = (it / 24) % 2 ? -100 : 2,
                     .ls = it % 3 == 0 ? 0.0 : (it % 3 == 1 ? 0.2 : 1.0)};
        if (it % 5 == 1) k.inner = 6;  /* [N, C, 2, 3] */
        if (it % 7 == 3) k.n = 1, k.inner = 1, k.flat = true; /* [C] logits, 0-d target */
        run_cls_case(&k, dt, true, it % 2 == 1);
    }
}

static void test_nll_loss(void **state) {
    (void)state;
    static const double w4[4] = {1.5, 0.5, 1.0, 3.0};
    for (int it = 0; it < 24; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        ce_case k = {.n = tu_randint(1, 7), .c = 4, .inner = it % 3 == 2 ? 4 : 1,
                     .w = (it / 4) % 2 ? w4 : NULL, .red = (it / 8) % 3,
                     .ignore = it % 2 ? 1 : -100, .ls = 0};
        if (it % 5 == 4) k.n = 1, k.inner = 1, k.flat = true;
        run_cls_case(&k, dt, false, it % 3 == 0);
    }
}

/* Every target ignored: the mean divides 0 by 0, as PyTorch (NaN). */
/* f32 rows past NN_STREAM_BYTES (16 MiB) take the non-temporal stores: softmax,
 * log_softmax and the cross-entropy gradient, rows of 4100 so that most start
 * off a vector boundary. The gradient's reference is the closed form
 * g * ((1 - ls) w_t (p - [c == t]) + ls / C (sum(w) p - w_c)), in float64. */
static void test_softmax_xent_streaming(void **state) {
    (void)state;
    const int64_t R = 1024, C = 4100, n = R * C;
    int64_t shape[2] = {R, C};
    double *xv;
    ct_tensor *x = tu_rand(2, shape, CT_F32, -8, 8, &xv);
    double *p = malloc(sizeof(double) * (size_t)n), *lp = malloc(sizeof(double) * (size_t)n);
    ref_softmax(xv, R, C, 1, false, p);
    ref_softmax(xv, R, C, 1, true, lp);
    ct_tensor *y = ct_softmax(x, 1), *ly = ct_log_softmax(x, -1);
    check(y, p, n, CT_F32, 1);
    check(ly, lp, n, CT_F32, 1);

    int64_t *tv = malloc(sizeof(int64_t) * (size_t)R);
    for (int64_t r = 0; r < R; r++) tv[r] = r % 7 == 3 ? -100 : tu_randint(0, C);
    ct_tensor *t = i64_tensor(tv, 1, shape);
    double *wv;
    ct_tensor *w = tu_rand(1, shape + 1, CT_F32, 0.5, 2, &wv);
    double *ref = malloc(sizeof(double) * (size_t)n);
    for (int variant = 0; variant < 2; variant++) {
        bool weighted = variant == 1;
        double ls = weighted ? 0.1 : 0.0, sumw = 0, wsum = 0;
        for (int64_t c = 0; c < C; c++) sumw += weighted ? wv[c] : 1.0;
        for (int64_t r = 0; r < R; r++)
            if (tv[r] != -100) wsum += weighted ? wv[tv[r]] : 1.0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++) {
                double v = 0;
                if (tv[r] != -100) {
                    double wt = weighted ? wv[tv[r]] : 1.0, wc = weighted ? wv[c] : 1.0;
                    double pc = p[r * C + c];
                    v = ((1 - ls) * wt * (pc - (c == tv[r])) + ls / (double)C * (sumw * pc - wc)) /
                        wsum;
                }
                ref[r * C + c] = v;
            }
        ct_tensor *g = ct_tensor_scalar(1.0, CT_F32, CT_CPU);
        ct_tensor *dz = ct_cross_entropy_backward(g, x, t, weighted ? w : NULL,
                                                  CT_REDUCTION_MEAN, -100, ls);
        check(dz, ref, n, CT_F32, 4);
        ct_tensor_release(dz), ct_tensor_release(g);
    }
    free(xv), free(p), free(lp), free(tv), free(wv), free(ref);
    ct_tensor_release(x), ct_tensor_release(y), ct_tensor_release(ly), ct_tensor_release(t);
    ct_tensor_release(w);
}

static void test_cross_entropy_all_ignored(void **state) {
    (void)state;
    ct_tensor *z = tu_rand(2, (const int64_t[]){3, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *t = i64_tensor((const int64_t[]){-100, -100, -100}, 1, (const int64_t[]){3});
    ct_tensor *m = ct_cross_entropy(z, t, NULL, CT_REDUCTION_MEAN, -100, 0.1);
    ct_tensor *s = ct_cross_entropy(z, t, NULL, CT_REDUCTION_SUM, -100, 0.1);
    double mv, sv;
    assert_int_equal(ct_tensor_item(m, &mv), CT_OK);
    assert_int_equal(ct_tensor_item(s, &sv), CT_OK);
    assert_true(isnan(mv));
    assert_true(sv == 0.0);
    ct_tensor_release(z), ct_tensor_release(t), ct_tensor_release(m), ct_tensor_release(s);
}

/* CROSS_ENTROPY's second output, the row statistics that autograd's
 * backward reads: each counted position's log-sum-exp and the weight sum
 * last, against float64 loops, for f32 and f64 and [n, C, inner] logits. */
static void test_cross_entropy_row_statistics(void **state) {
    (void)state;
    static const int64_t shapes[][3] = {{5, 7, 1}, {3, 4, 6}, {1, 2000, 1}};
    for (int di = 0; di < 2; di++)
        for (int si = 0; si < 3; si++) {
            ct_dtype dt = di ? CT_F64 : CT_F32;
            int64_t n = shapes[si][0], c = shapes[si][1], inner = shapes[si][2], npos = n * inner;
            double *xv, *wv;
            ct_tensor *x = tu_rand(3, shapes[si], dt, -5, 5, &xv);
            ct_tensor *w = tu_rand(1, &c, dt, 0.25, 2, &wv);
            int64_t *tv = malloc(sizeof(int64_t) * (size_t)npos);
            for (int64_t p = 0; p < npos; p++) tv[p] = p % 3 == 1 ? -100 : tu_randint(0, c);
            ct_tensor *t = i64_tensor(tv, 2, (const int64_t[]){n, inner});
            int64_t ns = npos + 1;
            ct_tensor *loss = ct_tensor_empty(0, NULL, dt, CT_CPU);
            ct_tensor *st = ct_tensor_full(1, &ns, 12345.0, dt, CT_CPU); /* poisoned */
            cti_loss_params lp = {.n = n, .c = c, .inner = inner, .reduction = CT_REDUCTION_MEAN,
                                  .ignore_index = -100, .label_smoothing = 0.1};
            ct_call call;
            cti_call_init(&call, CT_OP_CROSS_ENTROPY);
            cti_call_params(&call, &lp);
            call.in[0] = x, call.in[1] = t, call.in[2] = w, call.nin = 3;
            call.out[0] = loss, call.out[1] = st, call.nout = 2;
            assert_int_equal(cti_dispatch(&call, CT_CPU, dt), CT_OK);
            double *sv = tu_values(st), wsum = 0;
            for (int64_t p = 0; p < npos; p++) {
                if (tv[p] == -100) continue;
                int64_t i = p / inner, j = p % inner;
                double m = -INFINITY, e = 0;
                for (int64_t k = 0; k < c; k++) m = fmax(m, xv[(i * c + k) * inner + j]);
                for (int64_t k = 0; k < c; k++) e += exp(xv[(i * c + k) * inner + j] - m);
                double lse = m + log(e);
                assert_true(fabs(sv[p] - lse) <= (di ? 1e-12 : 2e-6) * (1 + fabs(lse)));
                wsum += wv[tv[p]];
            }
            assert_true(fabs(sv[npos] - wsum) <= (di ? 1e-12 : 1e-6) * wsum);
            free(sv), free(xv), free(wv), free(tv);
            ct_tensor_release(x), ct_tensor_release(w), ct_tensor_release(t);
            ct_tensor_release(loss), ct_tensor_release(st);
        }
}

/* ---- mse ----------------------------------------------------------------------------------- */

/* Linear index into a tensor of shape s (nd dims) broadcast into bs (nb dims). */
static int64_t bcast_index(int64_t lin, int nb, const int64_t *bs, int nd, const int64_t *s) {
    int64_t idx = 0, mul = 1;
    for (int i = nb - 1; i >= 0; i--) {
        int64_t c = lin % bs[i];
        lin /= bs[i];
        int j = i - (nb - nd);
        if (j >= 0) {
            if (s[j] != 1) idx += c * mul;
            mul *= s[j];
        }
    }
    return idx;
}

/* log_softmax of rows whose max is far from 0 keeps float32's precision
 * near 0: (x - max) - log(sum), never x - (max + log(sum)), which rounds at
 * the max's magnitude. Short and long rows (the streamed path). */
static void test_log_softmax_large_max(void **state) {
    (void)state;
    static const int64_t lens[] = {4, 5000};
    for (int li = 0; li < 2; li++) {
        int64_t d = lens[li];
        double *v = malloc(sizeof(double) * (size_t)d), *ref = malloc(sizeof(double) * (size_t)d);
        for (int64_t k = 0; k < d; k++) v[k] = 990 + (double)(k % 13) * 0.75;
        v[0] = 1000;
        v[1] = 999.5;
        ct_tensor *x = tu_from_f64(v, 1, &d, CT_F32);
        double *xv = tu_values(x), m = -INFINITY, s = 0;
        for (int64_t k = 0; k < d; k++) m = fmax(m, xv[k]);
        for (int64_t k = 0; k < d; k++) s += exp(xv[k] - m);
        for (int64_t k = 0; k < d; k++) ref[k] = (xv[k] - m) - log(s);
        ct_tensor *y = ct_log_softmax(x, 0);
        assert_non_null(y);
        double *yv = tu_values(y);
        for (int64_t k = 0; k < d; k++) {
            if (fabs(yv[k] - ref[k]) > 4e-6 * fmax(1, fabs(ref[k])))
                fprintf(stderr, "d %lld: y[%lld] = %.9g, float64 %.9g\n", (long long)d, (long long)k, yv[k], ref[k]);
            assert_true(fabs(yv[k] - ref[k]) <= 4e-6 * fmax(1, fabs(ref[k])));
        }
        free(yv), free(xv), free(v), free(ref);
        ct_tensor_release(y);
        ct_tensor_release(x);
    }
}

static void test_mse_loss(void **state) {
    (void)state;
    for (int it = 0; it < 36; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        int red = (it / 4) % 3;
        bool nc = (it / 12) % 2, bc = it % 5 == 2;
        int nb = (int)tu_randint(1, 4);
        int64_t bs[3], as[3], ts[3];
        rand_shape(nb, 1, 6, bs);
        if (it == 7) bs[0] = 0;
        int na = nb, nt = nb;
        memcpy(as, bs, sizeof bs);
        memcpy(ts, bs, sizeof bs);
        if (bc) { /* input broadcasts along its last dim, target lacks the leading dim */
            if (bs[nb - 1] == 1) bs[nb - 1] = 3;
            memcpy(as, bs, sizeof bs);
            as[nb - 1] = 1;
            if (nb > 1) {
                nt = nb - 1;
                memcpy(ts, bs + 1, sizeof(int64_t) * (size_t)nt);
            } else {
                memcpy(ts, bs, sizeof bs);
            }
        }
        int64_t n = tu_numel(nb, bs);
        double *av, *tv;
        ct_tensor *a = rnd(na, as, dt, -2, 2, nc, &av);
        /* Every third case a target of another dtype: the loss is in the
         * promoted dtype, the input's gradient in the input's. */
        static const ct_dtype other[4] = {CT_F64, CT_F32, CT_F32, CT_I64};
        ct_dtype tdt = it % 3 == 1 ? other[it % 4] : dt;
        ct_dtype rdt = ct_promote_types(dt, tdt);
        ct_tensor *t = rnd(nt, ts, tdt, -2, 2, !nc, &tv);
        ct_tensor *loss = ct_mse_loss(a, t, red);
        assert_non_null(loss);
        assert_int_equal(ct_tensor_dtype(loss), rdt);
        double *lr = malloc(sizeof(double) * (size_t)(n + 1)), total = 0;
        for (int64_t i = 0; i < n; i++) {
            double d = av[bcast_index(i, nb, bs, na, as)] - tv[bcast_index(i, nb, bs, nt, ts)];
            lr[i] = d * d;
            total += d * d;
        }
        if (red == CT_REDUCTION_MEAN) total /= (double)n;
        if (red == CT_REDUCTION_NONE) {
            check_shape(loss, nb, bs);
            check(loss, lr, n, rdt, 1);
        } else if (n > 0) {
            check(loss, &total, 1, rdt, 4);
        }
        /* backward: d/da of sum gl * (a - t)^2 (over the broadcast), summed back to a's shape */
        double *glv;
        ct_tensor *gl = tu_rand(red == CT_REDUCTION_NONE ? nb : 0, bs, dt, -1, 1, &glv);
        ct_tensor *ga = ct_mse_loss_backward(gl, a, t, red);
        assert_non_null(ga);
        assert_int_equal(ct_tensor_dtype(ga), dt);
        check_shape(ga, na, as);
        int64_t nia = tu_numel(na, as);
        double *gr = calloc((size_t)(nia + 1), sizeof(double));
        for (int64_t i = 0; i < n; i++) {
            int64_t ia = bcast_index(i, nb, bs, na, as);
            double d = av[ia] - tv[bcast_index(i, nb, bs, nt, ts)];
            double g = red == CT_REDUCTION_NONE ? glv[i] : glv[0] / (red == CT_REDUCTION_MEAN ? (double)n : 1.0);
            gr[ia] += 2 * d * g;
        }
        check(ga, gr, nia, dt, 4);
        free(av), free(tv), free(lr), free(glv), free(gr);
        ct_tensor_release(a), ct_tensor_release(t), ct_tensor_release(loss);
        ct_tensor_release(gl), ct_tensor_release(ga);
    }
}

/* ---- embedding --------------------------------------------------------------------------- */

static void test_embedding(void **state) {
    (void)state;
    for (int it = 0; it < 16; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        ct_dtype it_dt = (it / 4) % 2 ? CT_I32 : CT_I64;
        bool nc = (it / 8) % 2;
        int64_t v = tu_randint(1, 9), d = tu_randint(1, 12);
        int ni = (int)tu_randint(0, 3);
        int64_t ishape[3];
        rand_shape(ni, 1, 6, ishape);
        int64_t n = tu_numel(ni, ishape);
        double *iv = malloc(sizeof(double) * (size_t)(n + 1));
        for (int64_t i = 0; i < n; i++) iv[i] = (double)tu_randint(0, v);
        if (n > 1) iv[n - 1] = iv[0]; /* a repeated index */
        ct_tensor *idx0 = tu_from_f64(iv, ni, ishape, it_dt);
        ct_tensor *idx = nc && ni > 0 ? tu_noncontig(idx0) : ct_tensor_retain(idx0);
        double *wv;
        ct_tensor *w = rnd(2, (const int64_t[]){v, d}, dt, -3, 3, nc, &wv);
        ct_tensor *e = ct_embedding(w, idx);
        assert_non_null(e);
        int64_t eshape[4];
        memcpy(eshape, ishape, sizeof(int64_t) * (size_t)ni);
        eshape[ni] = d;
        check_shape(e, ni + 1, eshape);
        double *er = malloc(sizeof(double) * (size_t)(n * d + 1));
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < d; j++) er[i * d + j] = wv[(int64_t)iv[i] * d + j];
        double *ev = tu_values(e);
        for (int64_t i = 0; i < n * d; i++) assert_true(ev[i] == er[i]);

        /* backward: scatter-add with repeats, padding row skipped */
        int64_t pad = it % 3 == 0 ? -1 : (int64_t)iv[0];
        if (n == 0) pad = -1;
        double *gv;
        ct_tensor *g = rnd(ni + 1, eshape, dt, -1, 1, nc, &gv);
        ct_tensor *gw = ct_embedding_backward(g, idx, v, pad);
        assert_non_null(gw);
        check_shape(gw, 2, (const int64_t[]){v, d});
        double *gr = calloc((size_t)(v * d + 1), sizeof(double));
        for (int64_t i = 0; i < n; i++) {
            int64_t r = (int64_t)iv[i];
            if (r == pad) continue;
            for (int64_t j = 0; j < d; j++) gr[r * d + j] += gv[i * d + j];
        }
        check(gw, gr, v * d, dt, 2);
        if (pad >= 0) {
            double *gwv = tu_values(gw);
            for (int64_t j = 0; j < d; j++) assert_true(gwv[pad * d + j] == 0.0);
            free(gwv);
        }
        free(iv), free(wv), free(er), free(ev), free(gv), free(gr);
        ct_tensor *ts[] = {idx0, idx, w, e, g, gw};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
    }
}

/* A gather copies bytes: integer weights work too. */
static void test_embedding_int_weight(void **state) {
    (void)state;
    int64_t wv[6] = {10, 11, 20, 21, 30, 31};
    ct_tensor *w = ct_tensor_from_data(wv, CT_I64, 2, (const int64_t[]){3, 2});
    ct_tensor *idx = i64_tensor((const int64_t[]){2, 0, 2}, 1, (const int64_t[]){3});
    ct_tensor *e = ct_embedding(w, idx);
    assert_non_null(e);
    double *ev = tu_values(e);
    double want[6] = {30, 31, 10, 11, 30, 31};
    tu_assert_close(ev, want, 6, 0, 0);
    free(ev);
    ct_tensor_release(w), ct_tensor_release(idx), ct_tensor_release(e);
}

/* ---- dropout ---------------------------------------------------------------------------- */

static bool kept(uint64_t seed, uint64_t draw, double p) {
    return (double)(ct_philox(seed, draw) >> 8) * 0x1p-24 >= p;
}

static void test_dropout_values(void **state) {
    (void)state;
    for (int it = 0; it < 8; it++) {
        ct_dtype dt = tu_float_dtypes[it % 4];
        bool nc = it >= 4;
        uint64_t seed = tu_next();
        ct_generator *gen = ct_generator_new(seed);
        if (it % 2) ct_generator_set_offset(gen, 5); /* a start inside a Philox block */
        uint64_t first = ct_generator_offset(gen);
        double p = tu_uniform(0.1, 0.9);
        int64_t shape[3] = {7, 5, 9};
        double *xv;
        ct_tensor *x = rnd(3, shape, dt, -2, 2, nc, &xv);
        ct_tensor *mask = NULL;
        ct_tensor *y = ct_dropout(x, p, true, gen, &mask);
        assert_non_null(y);
        assert_non_null(mask);
        assert_int_equal(ct_tensor_dtype(mask), CT_BOOL);
        check_shape(y, 3, shape);
        int64_t n = tu_numel(3, shape);
        double *yr = malloc(sizeof(double) * (size_t)n), *mr = malloc(sizeof(double) * (size_t)n);
        for (int64_t k = 0; k < n; k++) {
            bool keep = kept(seed, first + (uint64_t)k, p);
            mr[k] = keep;
            yr[k] = keep ? xv[k] / (1 - p) : 0.0;
        }
        check(y, yr, n, dt, 1);
        double *mv = tu_values(mask);
        tu_assert_close(mv, mr, n, 0, 0);
        assert_true(ct_generator_offset(gen) >= first + (uint64_t)n);

        double *gv;
        ct_tensor *g = rnd(3, shape, dt, -1, 1, !nc, &gv);
        ct_tensor *dx = ct_dropout_backward(g, mask, p);
        for (int64_t k = 0; k < n; k++) yr[k] = mr[k] ? gv[k] / (1 - p) : 0.0;
        check(dx, yr, n, dt, 1);
        free(xv), free(yr), free(mr), free(mv), free(gv);
        ct_tensor_release(x), ct_tensor_release(y), ct_tensor_release(mask);
        ct_tensor_release(g), ct_tensor_release(dx);
        ct_generator_free(gen);
    }
}

static void test_dropout_reproducible(void **state) {
    (void)state;
    int64_t n = 200000;
    double p = 0.3;
    ct_tensor *x = tu_rand(1, &n, CT_F32, 0.5, 1.5, NULL);
    ct_generator *gen = ct_generator_new(42);
    ct_tensor *m1, *m2, *m3, *m4;
    ct_tensor *y1 = ct_dropout(x, p, true, gen, &m1);
    ct_tensor *y4 = ct_dropout(x, p, true, gen, &m4); /* the stream moved on */
    ct_generator_set_seed(gen, 42);
    ct_tensor *y2 = ct_dropout(x, p, true, gen, &m2);
    ct_generator_set_seed(gen, 43);
    ct_tensor *y3 = ct_dropout(x, p, true, gen, &m3);
    double *a = tu_values(y1), *b = tu_values(y2), *c = tu_values(y3), *d = tu_values(y4);
    double *ma = tu_values(m1);
    int64_t same = 0, diff3 = 0, diff4 = 0, nkept = 0;
    for (int64_t i = 0; i < n; i++) {
        same += a[i] == b[i];
        diff3 += (a[i] == 0) != (c[i] == 0);
        diff4 += (a[i] == 0) != (d[i] == 0);
        nkept += ma[i] != 0;
        assert_true((ma[i] != 0) == (a[i] != 0));
    }
    assert_int_equal(same, n);
    assert_true(diff3 > n / 10);
    assert_true(diff4 > n / 10);
    double frac = (double)nkept / (double)n;
    assert_true(fabs(frac - (1 - p)) < 0.01);
    /* the kept elements are scaled so that the mean is kept */
    double sx = 0, sy = 0, *xv = tu_values(x);
    for (int64_t i = 0; i < n; i++) sx += xv[i], sy += a[i];
    assert_true(fabs(sy / sx - 1) < 0.02);
    free(a), free(b), free(c), free(d), free(ma), free(xv);
    ct_tensor *ts[] = {x, y1, y2, y3, y4, m1, m2, m3, m4};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
    ct_generator_free(gen);
}

static void test_dropout_special(void **state) {
    (void)state;
    int64_t shape[2] = {4, 6};
    ct_tensor *x = tu_rand(2, shape, CT_F32, -1, 1, NULL);
    ct_generator *gen = ct_generator_new(7);
    ct_tensor *mask = (ct_tensor *)&mask; /* must be overwritten with NULL */
    ct_tensor *y = ct_dropout(x, 0.5, false, gen, &mask);
    assert_true(ct_tensor_shares_storage(y, x));
    assert_ptr_equal(ct_tensor_data_ptr(y), ct_tensor_data_ptr(x));
    assert_null(mask);
    ct_tensor_release(y);
    mask = (ct_tensor *)&mask;
    uint64_t off = ct_generator_offset(gen);
    y = ct_dropout(x, 0.0, true, gen, &mask);
    assert_true(ct_tensor_shares_storage(y, x));
    assert_null(mask);
    assert_int_equal(ct_generator_offset(gen), off); /* no draws taken */
    ct_tensor *g = tu_rand(2, shape, CT_F32, -1, 1, NULL);
    ct_tensor *dg = ct_dropout_backward(g, NULL, 0.0); /* identity, as the forward */
    assert_true(ct_tensor_shares_storage(dg, g));
    ct_tensor_release(dg);
    ct_tensor_release(y);
    y = ct_dropout(x, 1.0, true, gen, &mask);
    double *yv = tu_values(y), *mv = tu_values(mask);
    for (int i = 0; i < 24; i++) assert_true(yv[i] == 0.0 && mv[i] == 0.0);
    dg = ct_dropout_backward(g, mask, 1.0);
    double *dv = tu_values(dg);
    for (int i = 0; i < 24; i++) assert_true(dv[i] == 0.0);
    /* the default generator is used for gen == NULL */
    ct_manual_seed(99);
    ct_tensor *m1, *m2;
    ct_tensor *y1 = ct_dropout(x, 0.5, true, NULL, &m1);
    ct_manual_seed(99);
    ct_tensor *y2 = ct_dropout(x, 0.5, true, NULL, &m2);
    double *a = tu_values(y1), *b = tu_values(y2);
    tu_assert_close(a, b, 24, 0, 0);
    free(yv), free(mv), free(dv), free(a), free(b);
    ct_tensor *ts[] = {x, y, mask, g, dg, y1, y2, m1, m2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
    ct_generator_free(gen);
}

/* ---- bad inputs ------------------------------------------------------------------------------ */

static void test_norm_errors(void **state) {
    (void)state;
    int64_t sh[2] = {3, 4};
    ct_tensor *x = tu_rand(2, sh, CT_F32, -1, 1, NULL);
    ct_tensor *xi = tu_rand(2, sh, CT_I64, -3, 3, NULL);
    ct_tensor *w = tu_rand(1, (const int64_t[]){4}, CT_F32, -1, 1, NULL);
    ct_tensor *w5 = tu_rand(1, (const int64_t[]){5}, CT_F32, -1, 1, NULL);
    ct_tensor *wd = tu_rand(1, (const int64_t[]){4}, CT_F64, -1, 1, NULL);
    ct_tensor *inv = (ct_tensor *)&inv;
    ct_tensor *keep = inv;
    tu_assert_null_error(ct_rms_norm(NULL, 1, (const int64_t[]){4}, NULL, 1e-5, NULL),
                         CT_ERR_INVALID_ARG, "ct_rms_norm", "NULL");
    tu_assert_null_error(ct_rms_norm(xi, 1, (const int64_t[]){4}, NULL, 1e-5, &inv), CT_ERR_DTYPE,
                         "ct_rms_norm", "floating", "int64");
    assert_ptr_equal(inv, keep); /* left unchanged on failure */
    tu_assert_null_error(ct_rms_norm(x, 1, (const int64_t[]){3}, NULL, 1e-5, NULL), CT_ERR_SHAPE,
                         "ct_rms_norm", "normalized_shape", "[3]", "[3, 4]");
    tu_assert_null_error(ct_rms_norm(x, 3, (const int64_t[]){1, 3, 4}, NULL, 1e-5, NULL),
                         CT_ERR_SHAPE, "normalized_shape");
    tu_assert_null_error(ct_rms_norm(x, 0, NULL, NULL, 1e-5, NULL), CT_ERR_INVALID_ARG,
                         "normalized_shape");
    tu_assert_null_error(ct_rms_norm(x, 1, (const int64_t[]){4}, w5, 1e-5, NULL), CT_ERR_SHAPE,
                         "weight", "[5]", "[4]");
    tu_assert_null_error(ct_rms_norm(x, 1, (const int64_t[]){4}, wd, 1e-5, NULL), CT_ERR_DTYPE,
                         "weight", "float64", "float32");
    tu_assert_null_error(ct_rms_norm(x, 1, (const int64_t[]){4}, w, -1.0, NULL), CT_ERR_INVALID_ARG,
                         "eps");
    tu_assert_null_error(ct_layer_norm(x, 1, (const int64_t[]){4}, w, w5, 1e-5, NULL, NULL),
                         CT_ERR_SHAPE, "ct_layer_norm", "bias");
    tu_assert_null_error(ct_layer_norm(x, 1, (const int64_t[]){2}, NULL, NULL, 1e-5, NULL, NULL),
                         CT_ERR_SHAPE, "ct_layer_norm", "normalized_shape");

    ct_tensor *rinv = NULL, *mean = NULL, *rstd = NULL;
    ct_tensor *y = ct_rms_norm(x, 1, (const int64_t[]){4}, w, 1e-5, &rinv);
    ct_tensor *ly = ct_layer_norm(x, 1, (const int64_t[]){4}, w, NULL, 1e-5, &mean, &rstd);
    ct_tensor *g_bad = tu_rand(2, (const int64_t[]){3, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *g64 = tu_rand(2, sh, CT_F64, -1, 1, NULL);
    ct_tensor *inv64 = tu_rand(1, (const int64_t[]){3}, CT_F64, 0, 1, NULL);
    ct_tensor *inv2 = tu_rand(1, (const int64_t[]){2}, CT_F32, 0, 1, NULL);
    ct_tensor *dx = (ct_tensor *)&dx, *dxk = dx;
    tu_assert_error(ct_rms_norm_backward(g_bad, x, w, rinv, &dx, NULL), CT_ERR_SHAPE,
                    "ct_rms_norm_backward", "grad_y", "[3, 5]");
    assert_ptr_equal(dx, dxk);
    tu_assert_error(ct_rms_norm_backward(g64, x, w, rinv, &dx, NULL), CT_ERR_DTYPE, "grad_y");
    tu_assert_error(ct_rms_norm_backward(x, x, w, inv64, &dx, NULL), CT_ERR_DTYPE, "inv_rms",
                    "float64", "float32");
    tu_assert_error(ct_rms_norm_backward(x, x, w, inv2, &dx, NULL), CT_ERR_SHAPE, "inv_rms");
    tu_assert_error(ct_rms_norm_backward(x, x, w, NULL, &dx, NULL), CT_ERR_INVALID_ARG, "NULL");
    /* Nothing asked for: no dx, and no weight gradient (no weight, or no dweight). */
    ct_tensor *dw = (ct_tensor *)&dw, *dwk = dw;
    tu_assert_error(ct_rms_norm_backward(x, x, w, rinv, NULL, NULL), CT_ERR_INVALID_ARG,
                    "ct_rms_norm_backward", "nothing to compute", "dx is NULL");
    tu_assert_error(ct_rms_norm_backward(x, x, NULL, rinv, NULL, &dw), CT_ERR_INVALID_ARG,
                    "ct_rms_norm_backward", "nothing to compute");
    assert_ptr_equal(dw, dwk);
    tu_assert_error(ct_layer_norm_backward(x, x, w, mean, rstd, NULL, NULL, NULL),
                    CT_ERR_INVALID_ARG, "ct_layer_norm_backward", "nothing to compute");
    tu_assert_error(ct_layer_norm_backward(x, x, NULL, mean, rstd, NULL, &dw, NULL),
                    CT_ERR_INVALID_ARG, "ct_layer_norm_backward", "nothing to compute");
    assert_ptr_equal(dw, dwk);
    /* Without a weight, a dweight slot comes back NULL rather than untouched. */
    assert_int_equal(ct_rms_norm_backward(x, x, NULL, rinv, &dx, &dw), CT_OK);
    assert_null(dw);
    ct_tensor_release(dx);
    dx = dxk;
    dw = dwk;
    tu_assert_error(ct_layer_norm_backward(x, x, w5, mean, rstd, &dx, NULL, NULL), CT_ERR_SHAPE,
                    "ct_layer_norm_backward", "weight");
    tu_assert_error(ct_layer_norm_backward(x, x, w, mean, inv2, &dx, NULL, NULL), CT_ERR_SHAPE,
                    "rstd");
    ct_tensor *ts[] = {x, xi, w, w5, wd, rinv, mean, rstd, y, ly, g_bad, g64, inv64, inv2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

static void test_softmax_errors(void **state) {
    (void)state;
    ct_tensor *x = tu_rand(2, (const int64_t[]){3, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *xi = tu_rand(2, (const int64_t[]){3, 4}, CT_I32, -3, 3, NULL);
    ct_tensor *g = tu_rand(2, (const int64_t[]){4, 3}, CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_softmax(x, 2), CT_ERR_INDEX, "ct_softmax", "dim 2");
    tu_assert_null_error(ct_log_softmax(x, -3), CT_ERR_INDEX, "ct_log_softmax", "dim -3");
    tu_assert_null_error(ct_softmax(xi, 0), CT_ERR_DTYPE, "ct_softmax", "int32");
    tu_assert_null_error(ct_softmax(NULL, 0), CT_ERR_INVALID_ARG, "ct_softmax");
    tu_assert_null_error(ct_softmax_backward(g, x, 1), CT_ERR_SHAPE, "ct_softmax_backward",
                         "grad_y", "[4, 3]", "[3, 4]");
    tu_assert_null_error(ct_log_softmax_backward(x, x, 5), CT_ERR_INDEX, "dim 5");
    ct_tensor_release(x), ct_tensor_release(xi), ct_tensor_release(g);
}

static void test_loss_errors(void **state) {
    (void)state;
    ct_tensor *z = tu_rand(2, (const int64_t[]){3, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *t = i64_tensor((const int64_t[]){0, 4, 2}, 1, (const int64_t[]){3});
    ct_tensor *tbad = i64_tensor((const int64_t[]){0, 5, 2}, 1, (const int64_t[]){3});
    ct_tensor *tneg = i64_tensor((const int64_t[]){0, -3, 2}, 1, (const int64_t[]){3});
    ct_tensor *tf = tu_rand(1, (const int64_t[]){3}, CT_F32, 0, 4, NULL);
    ct_tensor *t4 = i64_tensor((const int64_t[]){0, 1, 2, 3}, 1, (const int64_t[]){4});
    ct_tensor *w4 = tu_rand(1, (const int64_t[]){4}, CT_F32, 0, 1, NULL);
    ct_tensor *w5d = tu_rand(1, (const int64_t[]){5}, CT_F64, 0, 1, NULL);
    ct_tensor *s0 = ct_tensor_scalar(1.0, CT_F32, CT_CPU);
    ct_tensor *g3 = tu_rand(1, (const int64_t[]){3}, CT_F32, 0, 1, NULL);
    tu_assert_null_error(ct_cross_entropy(z, tf, NULL, CT_REDUCTION_MEAN, -100, 0),
                         CT_ERR_DTYPE, "ct_cross_entropy", "expected int64 class indices, got float32");
    tu_assert_null_error(ct_cross_entropy(z, tbad, NULL, CT_REDUCTION_MEAN, -100, 0),
                         CT_ERR_INDEX, "ct_cross_entropy", "target 5", "5 classes");
    tu_assert_null_error(ct_cross_entropy(z, tneg, NULL, CT_REDUCTION_NONE, -100, 0),
                         CT_ERR_INDEX, "target -3", "5 classes");
    /* the out-of-range target is fine once it is the ignore_index */
    ct_tensor *ok = ct_cross_entropy(z, tneg, NULL, CT_REDUCTION_SUM, -3, 0);
    assert_non_null(ok);
    ct_tensor_release(ok);
    tu_assert_null_error(ct_cross_entropy(z, t4, NULL, CT_REDUCTION_MEAN, -100, 0), CT_ERR_SHAPE,
                         "target", "[4]", "[3]");
    tu_assert_null_error(ct_cross_entropy(z, t, w4, CT_REDUCTION_MEAN, -100, 0), CT_ERR_SHAPE,
                         "weight", "5 classes");
    tu_assert_null_error(ct_cross_entropy(z, t, w5d, CT_REDUCTION_MEAN, -100, 0), CT_ERR_DTYPE,
                         "weight", "float64");
    tu_assert_null_error(ct_cross_entropy(z, t, NULL, CT_REDUCTION_MEAN, -100, 1.5),
                         CT_ERR_INVALID_ARG, "label_smoothing", "1.5");
    tu_assert_null_error(ct_cross_entropy(z, t, NULL, CT_REDUCTION_MEAN, -100, -0.1),
                         CT_ERR_INVALID_ARG, "label_smoothing");
    tu_assert_null_error(ct_cross_entropy(z, t, NULL, (ct_reduction)7, -100, 0),
                         CT_ERR_INVALID_ARG, "reduction");
    tu_assert_null_error(ct_cross_entropy(s0, t, NULL, CT_REDUCTION_MEAN, -100, 0), CT_ERR_SHAPE,
                         "class dim");
    tu_assert_null_error(ct_cross_entropy(z, NULL, NULL, CT_REDUCTION_MEAN, -100, 0),
                         CT_ERR_INVALID_ARG, "ct_cross_entropy");
    tu_assert_null_error(ct_cross_entropy_backward(g3, z, t, NULL, CT_REDUCTION_MEAN, -100, 0),
                         CT_ERR_SHAPE, "ct_cross_entropy_backward", "grad_loss", "[3]", "[]");
    tu_assert_null_error(ct_cross_entropy_backward(s0, z, t, NULL, CT_REDUCTION_NONE, -100, 0),
                         CT_ERR_SHAPE, "grad_loss");
    tu_assert_null_error(ct_cross_entropy_backward(s0, z, tbad, NULL, CT_REDUCTION_SUM, -100, 0),
                         CT_ERR_INDEX, "target 5");
    tu_assert_null_error(ct_nll_loss(z, tbad, NULL, CT_REDUCTION_MEAN, -100), CT_ERR_INDEX,
                         "ct_nll_loss", "target 5", "5 classes");
    tu_assert_null_error(ct_nll_loss(z, tf, NULL, CT_REDUCTION_MEAN, -100), CT_ERR_DTYPE,
                         "ct_nll_loss", "int64");
    tu_assert_null_error(ct_nll_loss_backward(s0, z, tbad, NULL, CT_REDUCTION_MEAN, -100),
                         CT_ERR_INDEX, "ct_nll_loss_backward", "target 5");

    ct_tensor *a = tu_rand(2, (const int64_t[]){3, 4}, CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(2, (const int64_t[]){3, 5}, CT_F32, -1, 1, NULL);
    ct_tensor *bd = tu_rand(2, (const int64_t[]){3, 4}, CT_F64, -1, 1, NULL);
    ct_tensor *ai = tu_rand(2, (const int64_t[]){3, 4}, CT_I64, -1, 1, NULL);
    tu_assert_null_error(ct_mse_loss(a, b, CT_REDUCTION_MEAN), CT_ERR_SHAPE, "ct_mse_loss");
    tu_assert_null_error(ct_mse_loss(ai, ai, CT_REDUCTION_MEAN), CT_ERR_DTYPE, "floating");
    tu_assert_null_error(ct_mse_loss(a, a, (ct_reduction)-1), CT_ERR_INVALID_ARG, "reduction");
    tu_assert_null_error(ct_mse_loss_backward(g3, a, a, CT_REDUCTION_NONE), CT_ERR_SHAPE,
                         "ct_mse_loss_backward", "grad_loss");
    ct_tensor *ts[] = {z, t, tbad, tneg, tf, t4, w4, w5d, s0, g3, a, b, bd, ai};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

static void test_embedding_dropout_errors(void **state) {
    (void)state;
    ct_tensor *w = tu_rand(2, (const int64_t[]){10, 3}, CT_F32, -1, 1, NULL);
    ct_tensor *w1 = tu_rand(1, (const int64_t[]){10}, CT_F32, -1, 1, NULL);
    ct_tensor *idx = i64_tensor((const int64_t[]){1, 10, 2}, 1, (const int64_t[]){3});
    ct_tensor *neg = i64_tensor((const int64_t[]){1, -1}, 1, (const int64_t[]){2});
    ct_tensor *good = i64_tensor((const int64_t[]){1, 9, 2}, 1, (const int64_t[]){3});
    ct_tensor *fidx = tu_rand(1, (const int64_t[]){3}, CT_F32, 0, 3, NULL);
    ct_tensor *g = tu_rand(2, (const int64_t[]){3, 3}, CT_F32, -1, 1, NULL);
    ct_tensor *gbad = tu_rand(2, (const int64_t[]){4, 3}, CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_embedding(w, idx), CT_ERR_INDEX, "ct_embedding", "index 10",
                         "10 embeddings");
    tu_assert_null_error(ct_embedding(w, neg), CT_ERR_INDEX, "index -1");
    tu_assert_null_error(ct_embedding(w, fidx), CT_ERR_DTYPE, "ct_embedding", "float32");
    tu_assert_null_error(ct_embedding(w1, good), CT_ERR_SHAPE, "ct_embedding", "2-d");
    tu_assert_null_error(ct_embedding(NULL, good), CT_ERR_INVALID_ARG, "ct_embedding");
    tu_assert_null_error(ct_embedding_backward(g, good, 10, 10), CT_ERR_INVALID_ARG,
                         "ct_embedding_backward", "padding_idx 10");
    tu_assert_null_error(ct_embedding_backward(g, good, 10, -2), CT_ERR_INVALID_ARG, "padding_idx");
    tu_assert_null_error(ct_embedding_backward(g, good, -1, -1), CT_ERR_INVALID_ARG, "num_weights");
    tu_assert_null_error(ct_embedding_backward(g, good, 5, -1), CT_ERR_INDEX, "index 9",
                         "5 embeddings");
    tu_assert_null_error(ct_embedding_backward(gbad, good, 10, -1), CT_ERR_SHAPE, "grad_out",
                         "[4, 3]");

    ct_tensor *xi = tu_rand(1, (const int64_t[]){3}, CT_I64, 0, 3, NULL);
    ct_tensor *m = NULL, *mk = (ct_tensor *)&m;
    m = mk;
    tu_assert_null_error(ct_dropout(g, 1.5, true, NULL, &m), CT_ERR_INVALID_ARG, "ct_dropout",
                         "1.5");
    assert_ptr_equal(m, mk);
    tu_assert_null_error(ct_dropout(g, -0.25, true, NULL, NULL), CT_ERR_INVALID_ARG, "p");
    tu_assert_null_error(ct_dropout(g, NAN, false, NULL, NULL), CT_ERR_INVALID_ARG, "p");
    tu_assert_null_error(ct_dropout(xi, 0.5, true, NULL, NULL), CT_ERR_DTYPE, "ct_dropout", "int64");
    tu_assert_null_error(ct_dropout_backward(g, g, 0.5), CT_ERR_DTYPE, "ct_dropout_backward", "bool");
    ct_tensor *mb = ct_tensor_zeros(2, (const int64_t[]){4, 3}, CT_BOOL, CT_CPU);
    tu_assert_null_error(ct_dropout_backward(g, mb, 0.5), CT_ERR_SHAPE, "mask");
    tu_assert_null_error(ct_dropout_backward(g, NULL, 2.0), CT_ERR_INVALID_ARG, "p");
    ct_tensor *ts[] = {w, w1, idx, neg, good, fidx, g, gbad, xi, mb};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

/* No handle or storage outlives the calls above, including failed ones. */
static void test_no_leaks(void **state) {
    (void)state;
    cti_alloc_stats before = cti_get_alloc_stats();
    ct_tensor *x = tu_rand(2, (const int64_t[]){4, 6}, CT_F32, -1, 1, NULL);
    ct_tensor *inv, *y = ct_rms_norm(x, 1, (const int64_t[]){6}, NULL, 1e-5, &inv);
    ct_tensor *t = i64_tensor((const int64_t[]){0, 7, 1, 2}, 1, (const int64_t[]){4});
    assert_null(ct_cross_entropy(x, t, NULL, CT_REDUCTION_MEAN, -100, 0));
    ct_tensor *nc = tu_noncontig(x);
    assert_null(ct_cross_entropy(nc, t, NULL, CT_REDUCTION_MEAN, -100, 0));
    ct_tensor_release(nc), ct_tensor_release(x), ct_tensor_release(y), ct_tensor_release(inv);
    ct_tensor_release(t);
    cti_alloc_stats after = cti_get_alloc_stats();
    assert_int_equal(after.live_tensors, before.live_tensors);
    assert_int_equal(after.live_storages, before.live_storages);
}

/* NaN and infinite logits: the fast exp's exponent arithmetic once
 * overflowed (undefined behaviour the sanitizer build stops on). A NaN or
 * +inf in a row makes the row NaN, as exp(inf - inf) is; -inf is a zero
 * probability. */
static void test_softmax_nonfinite(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    const float v[9] = {1, NAN, 2, 1, INFINITY, 2, -INFINITY, 0, 1};
    ct_tensor *x = ct_tensor_from_data(v, CT_F32, CT_SHAPE(3, 3));
    const int64_t tg[3] = {0, 2, 0};
    ct_tensor *t = ct_tensor_from_data(tg, CT_I64, CT_SHAPE(3));
    float sm[9], ls[9], ce[3];
    assert_int_equal(ct_tensor_copy_to_host(ct_softmax(x, 1), sm, sizeof sm), CT_OK);
    assert_int_equal(ct_tensor_copy_to_host(ct_log_softmax(x, 1), ls, sizeof ls), CT_OK);
    assert_int_equal(ct_tensor_copy_to_host(ct_cross_entropy(x, t, NULL, CT_REDUCTION_NONE,
                                                             -100, 0.0),
                                            ce, sizeof ce),
                     CT_OK);
    for (int k = 0; k < 6; k++) assert_true(isnan(sm[k]) && isnan(ls[k]));
    double z = exp(0.0) + exp(1.0); /* the last row without its -inf */
    assert_true(sm[6] == 0.0f && isinf(ls[6]) && ls[6] < 0);
    assert_true(fabs(sm[7] - 1 / z) < 1e-6 && fabs(sm[8] - exp(1.0) / z) < 1e-6);
    assert_true(fabs(ls[8] - (1 - log(z))) < 1e-6);
    assert_true(isnan(ce[0]) && isnan(ce[1]) && isinf(ce[2]) && ce[2] > 0);
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rms_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rms_norm_large_deterministic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rms_norm_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_xent_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layer_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_stability, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nll_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_all_ignored, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_row_statistics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mse_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_log_softmax_large_max, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_int_weight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_reproducible, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_special, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loss_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_dropout_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_nonfinite, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_leaks, setup, teardown),
    };
    return tu_run_tests(tests);
}
