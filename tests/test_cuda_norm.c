/* The CUDA RMSNorm and LayerNorm kernels, forward and backward, against
 * float64 references computed here on the host from the same (rounded)
 * inputs, and against the CPU backend: every floating dtype, rows of
 * D = 1 ... 40000 elements (the register kernels with and without 16-byte
 * vectors, and the loop kernels for rows past 8192 elements), many rows,
 * weight/bias present or not, non-contiguous and misaligned inputs, several
 * normalized dims, empty inputs, autograd on the GPU against the CPU,
 * determinism of the weight gradients, and the messages for inputs on mixed
 * devices. Output memory is poisoned with NaN before each op writes it.
 * Skips without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cuda_test_util.h"
#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

#include "dispatch/dispatch_impl.h"

static int ngpu;

#define NEED_GPU()             \
    do {                       \
        if (ngpu == 0) skip(); \
    } while (0)

static ct_tensor *gpu(ct_tensor *t) { return checked(ct_to_device(t, CT_CUDA(0))); }

/* Fills freed device blocks of about `bytes` with NaN, so an output the
 * caching allocator hands out next from them starts as NaN. */
static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ok(ct_fill_(t, NAN));
    ct_tensor_release(t);
}

static ct_dtype stat_dt(ct_dtype dt) { return dt == CT_F64 ? CT_F64 : CT_F32; }

/* Tolerances against float64 math on the same inputs: f32/f16/bf16 compute
 * in float32 and round the result once. */
static double rtol_of(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-12;
    case CT_F32: return 1e-5;
    case CT_F16: return 2e-3;
    default: return 1.6e-2;
    }
}

static void expect(ct_tensor *got, const double *ref, int64_t n, double rtol, double atol) {
    assert_non_null(got);
    assert_int_equal(ct_tensor_numel(got), n);
    double *g = tu_values(got);
    tu_assert_close(g, ref, n, rtol, atol);
    free(g);
}

static void expect_same(ct_tensor *got, ct_tensor *ref, double rtol, double atol) {
    assert_non_null(got);
    assert_non_null(ref);
    int64_t n = ct_tensor_numel(ref);
    assert_int_equal(ct_tensor_numel(got), n);
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(ref));
    double *r = tu_values(ref);
    expect(got, r, n, rtol, atol);
    free(r);
}

/* Row by row, with a tolerance per row: layer_norm's f32 results carry the
 * rounding of the row's mean times rstd (and rstd^2 for dx), large for rows of
 * a few nearly equal values. */
static void expect_rows(ct_tensor *got, const double *ref, int64_t R, int64_t D, double rtol,
                        const double *row_atol) {
    assert_non_null(got);
    assert_int_equal(ct_tensor_numel(got), R * D);
    double *g = tu_values(got);
    for (int64_t r = 0; r < R; r++) tu_assert_close(g + r * D, ref + r * D, D, rtol, row_atol[r]);
    free(g);
}

static void expect_rows_same(ct_tensor *got, ct_tensor *ref, int64_t R, int64_t D, double rtol,
                             const double *row_atol) {
    assert_non_null(ref);
    double *r = tu_values(ref);
    expect_rows(got, r, R, D, rtol, row_atol);
    free(r);
}

/* The per-row tolerances of layer_norm's y (order 1) and dx (order 2) from
 * the row's mean and rstd. */
static double *ln_row_atol(const double *mean, const double *rstd, int64_t R, double rt, int order) {
    double *a = malloc(sizeof(double) * (size_t)(R > 0 ? R : 1));
    for (int64_t r = 0; r < R; r++) {
        double c = 1 + fabs(mean[r]);
        a[r] = 4 * rt * (order == 1 ? 1 + rstd[r] * c : 1 + rstd[r] + rstd[r] * rstd[r] * c);
    }
    return a;
}

/* ---- float64 references (row-major [R, D]) --------------------------------------------------- */
static void ref_rms(const double *x, const double *w, int64_t R, int64_t D, double eps,
                    double *y, double *inv) {
    for (int64_t r = 0; r < R; r++) {
        const double *xr = x + r * D;
        double ss = 0;
        for (int64_t j = 0; j < D; j++) ss += xr[j] * xr[j];
        double v = 1 / sqrt(ss / (double)D + eps);
        inv[r] = v;
        for (int64_t j = 0; j < D; j++) y[r * D + j] = xr[j] * v * (w ? w[j] : 1);
    }
}

static void ref_ln(const double *x, const double *w, const double *b, int64_t R, int64_t D,
                   double eps, double *y, double *mean, double *rstd) {
    for (int64_t r = 0; r < R; r++) {
        const double *xr = x + r * D;
        double s = 0, q = 0;
        for (int64_t j = 0; j < D; j++) s += xr[j];
        double m = s / (double)D;
        for (int64_t j = 0; j < D; j++) q += (xr[j] - m) * (xr[j] - m);
        double rs = 1 / sqrt(q / (double)D + eps);
        mean[r] = m;
        rstd[r] = rs;
        for (int64_t j = 0; j < D; j++)
            y[r * D + j] = (xr[j] - m) * rs * (w ? w[j] : 1) + (b ? b[j] : 0);
    }
}

/* dx = inv * g * w - x * inv^3 * mean(g * w * x); dw = sum over rows of g * x * inv. */
static void ref_rms_bwd(const double *g, const double *x, const double *w, const double *inv,
                        int64_t R, int64_t D, double *dx, double *dw) {
    for (int64_t j = 0; j < D; j++) dw[j] = 0;
    for (int64_t r = 0; r < R; r++) {
        double dot = 0, v = inv[r];
        for (int64_t j = 0; j < D; j++) dot += g[r * D + j] * (w ? w[j] : 1) * x[r * D + j];
        for (int64_t j = 0; j < D; j++) {
            dx[r * D + j] = v * g[r * D + j] * (w ? w[j] : 1) - x[r * D + j] * v * v * v * dot / (double)D;
            dw[j] += g[r * D + j] * x[r * D + j] * v;
        }
    }
}

/* xh = (x - mean) * rstd, gw = g * w: dx = rstd * (gw - mean(gw) - xh * mean(gw * xh));
 * dw = sum g * xh; db = sum g. */
static void ref_ln_bwd(const double *g, const double *x, const double *w, const double *mean,
                       const double *rstd, int64_t R, int64_t D, double *dx, double *dw,
                       double *db) {
    for (int64_t j = 0; j < D; j++) dw[j] = db[j] = 0;
    for (int64_t r = 0; r < R; r++) {
        double sg = 0, sgx = 0, m = mean[r], rs = rstd[r];
        for (int64_t j = 0; j < D; j++) {
            double gw = g[r * D + j] * (w ? w[j] : 1), xh = (x[r * D + j] - m) * rs;
            sg += gw;
            sgx += gw * xh;
        }
        for (int64_t j = 0; j < D; j++) {
            double gw = g[r * D + j] * (w ? w[j] : 1), xh = (x[r * D + j] - m) * rs;
            dx[r * D + j] = rs * (gw - sg / (double)D - xh * sgx / (double)D);
            dw[j] += g[r * D + j] * xh;
            db[j] += g[r * D + j];
        }
    }
}

/* ---- shapes ------------------------------------------------------------------------------------- */
typedef struct nshape {
    int64_t rows, d;
} nshape;

/* D = 1, 7, 33 (scalar loads, several rows a warp or block), 1024 and 8192
 * (16-byte vectors in every dtype), 4099 (odd: scalar, one block a row),
 * 8195 and 40000 (the loop kernels, scalar and vector), 70000 rows of 3
 * (grid-stride loops and many partial sums). 64, 512, 1024, 4096 and 8192
 * fill their 16-byte chunks exactly (the forward's fwd_full); 1 row of 64
 * and 5 rows of 512 leave rows of the last block empty. */
static const nshape shapes[] = {{1000, 1}, {257, 7},   {300, 33}, {64, 1024}, {20, 4099},
                                {9, 8192}, {3, 8195},  {5, 40000}, {70000, 3}, {1, 64},
                                {5, 512},  {37, 4096}};
#define NSHAPES (sizeof shapes / sizeof shapes[0])

/* Fresh [rows, d] values in [lo, hi) rounded to dt, as a CPU tensor and doubles. */
static ct_tensor *rand2(nshape s, ct_dtype dt, double lo, double hi, double **v) {
    return checked(tu_rand(2, (int64_t[]){s.rows, s.d}, dt, lo, hi, v));
}
static ct_tensor *rand1(int64_t d, ct_dtype dt, double lo, double hi, double **v) {
    return checked(tu_rand(1, &d, dt, lo, hi, v));
}

/* A tolerance for sums over `rows` terms of magnitude about one. */
static double sum_atol(ct_dtype dt, int64_t rows) {
    return rtol_of(dt) * 4 * sqrt((double)(rows > 0 ? rows : 1));
}

/* ---- forward --------------------------------------------------------------------------------------- */
static void check_rms_forward(nshape s, ct_dtype dt, bool with_w) {
    ct_scope *sc = ct_scope_begin();
    const double eps = 1e-5;
    double *xv, *wv = NULL;
    ct_tensor *x = rand2(s, dt, -2, 2, &xv);
    ct_tensor *w = with_w ? rand1(s.d, dt, 0.5, 1.5, &wv) : NULL;
    int64_t n = s.rows * s.d;
    double *y = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double *inv = malloc(sizeof(double) * (size_t)(s.rows > 0 ? s.rows : 1));
    ref_rms(xv, wv, s.rows, s.d, eps, y, inv);
    ct_tensor *gx = gpu(x), *gw = w ? gpu(w) : NULL;
    poison(n * (int64_t)ct_dtype_size(dt));
    poison(s.rows * (int64_t)ct_dtype_size(stat_dt(dt)));
    ct_tensor *ginv = NULL;
    ct_tensor *gy = checked(ct_rms_norm(gx, 1, &s.d, gw, eps, &ginv));
    assert_int_equal(ct_tensor_device(gy).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_dtype(gy), dt);
    assert_int_equal(ct_tensor_dtype(ginv), stat_dt(dt));
    expect(gy, y, n, rtol_of(dt), rtol_of(dt));
    expect(ginv, inv, s.rows, dt == CT_F64 ? 1e-12 : 1e-5, 0);
    ct_tensor_release(ginv);
    free(xv);
    free(wv);
    free(y);
    free(inv);
    ct_scope_end(sc);
}

static void test_rms_norm_forward(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < NSHAPES; i++) {
            check_rms_forward(shapes[i], tu_float_dtypes[k], true);
            check_rms_forward(shapes[i], tu_float_dtypes[k], false);
        }
}

static void check_ln_forward(nshape s, ct_dtype dt, bool with_w, bool with_b) {
    ct_scope *sc = ct_scope_begin();
    const double eps = 1e-5;
    double *xv, *wv = NULL, *bv = NULL;
    /* An offset mean, so the mean matters. */
    ct_tensor *x = rand2(s, dt, -1, 3, &xv);
    ct_tensor *w = with_w ? rand1(s.d, dt, 0.5, 1.5, &wv) : NULL;
    ct_tensor *b = with_b ? rand1(s.d, dt, -1, 1, &bv) : NULL;
    int64_t n = s.rows * s.d;
    double *y = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double *m = malloc(sizeof(double) * (size_t)(s.rows > 0 ? s.rows : 1));
    double *r = malloc(sizeof(double) * (size_t)(s.rows > 0 ? s.rows : 1));
    ref_ln(xv, wv, bv, s.rows, s.d, eps, y, m, r);
    ct_tensor *gx = gpu(x), *gw = w ? gpu(w) : NULL, *gb = b ? gpu(b) : NULL;
    poison(n * (int64_t)ct_dtype_size(dt));
    poison(s.rows * (int64_t)ct_dtype_size(stat_dt(dt)));
    ct_tensor *gm = NULL, *gr = NULL;
    ct_tensor *gy = checked(ct_layer_norm(gx, 1, &s.d, gw, gb, eps, &gm, &gr));
    assert_int_equal(ct_tensor_dtype(gy), dt);
    assert_int_equal(ct_tensor_dtype(gm), stat_dt(dt));
    double st = dt == CT_F64 ? 1e-12 : 1e-5;
    double *ya = ln_row_atol(m, r, s.rows, rtol_of(dt), 1);
    expect_rows(gy, y, s.rows, s.d, rtol_of(dt), ya);
    free(ya);
    expect(gm, m, s.rows, st, st);
    expect(gr, r, s.rows, st, 0);
    ct_tensor_release(gm);
    ct_tensor_release(gr);
    free(xv);
    free(wv);
    free(bv);
    free(y);
    free(m);
    free(r);
    ct_scope_end(sc);
}

static void test_layer_norm_forward(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < NSHAPES; i++) {
            check_ln_forward(shapes[i], tu_float_dtypes[k], true, true);
            check_ln_forward(shapes[i], tu_float_dtypes[k], i % 2 == 0, i % 2 == 1);
            if (i < 4) check_ln_forward(shapes[i], tu_float_dtypes[k], false, false);
        }
}

/* ---- backward ----------------------------------------------------------------------------------------- */
/* Statistics as the forward would save them: rounded to the stat dtype. */
static ct_tensor *stat_tensor(double *v, int64_t rows, ct_dtype dt) {
    ct_dtype sd = stat_dt(dt);
    for (int64_t r = 0; r < rows; r++) v[r] = tu_round(v[r], sd);
    return checked(tu_from_f64(v, 1, &rows, sd));
}

static void check_rms_backward(nshape s, ct_dtype dt, bool with_w, bool want_dx) {
    ct_scope *sc = ct_scope_begin();
    double *xv, *gv, *wv = NULL;
    ct_tensor *x = rand2(s, dt, -2, 2, &xv);
    ct_tensor *g = rand2(s, dt, -1, 1, &gv);
    ct_tensor *w = with_w ? rand1(s.d, dt, 0.5, 1.5, &wv) : NULL;
    int64_t n = s.rows * s.d;
    double *y = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double *inv = malloc(sizeof(double) * (size_t)(s.rows > 0 ? s.rows : 1));
    ref_rms(xv, wv, s.rows, s.d, 1e-5, y, inv);
    ct_tensor *it = stat_tensor(inv, s.rows, dt);
    double *dx = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double *dw = malloc(sizeof(double) * (size_t)(s.d > 0 ? s.d : 1));
    ref_rms_bwd(gv, xv, wv, inv, s.rows, s.d, dx, dw);

    ct_tensor *gx = gpu(x), *gg = gpu(g), *gw = w ? gpu(w) : NULL, *gi = gpu(it);
    poison(n * (int64_t)ct_dtype_size(dt));
    poison(s.d * (int64_t)ct_dtype_size(dt));
    ct_tensor *gdx = NULL, *gdw = NULL;
    ok(ct_rms_norm_backward(gg, gx, gw, gi, want_dx ? &gdx : NULL, &gdw));
    ct_tensor *cdx = NULL, *cdw = NULL;
    ok(ct_rms_norm_backward(g, x, w, it, want_dx ? &cdx : NULL, &cdw));
    double rt = rtol_of(dt);
    if (want_dx) {
        expect(gdx, dx, n, rt, 2 * rt);
        expect_same(gdx, cdx, rt, 2 * rt);
    }
    if (with_w) {
        expect(gdw, dw, s.d, rt, sum_atol(dt, s.rows));
        expect_same(gdw, cdw, rt, sum_atol(dt, s.rows));
    } else {
        assert_null(gdw);
    }
    ct_tensor_release(gdx);
    ct_tensor_release(gdw);
    ct_tensor_release(cdx);
    ct_tensor_release(cdw);
    free(xv);
    free(gv);
    free(wv);
    free(y);
    free(inv);
    free(dx);
    free(dw);
    ct_scope_end(sc);
}

static void test_rms_norm_backward(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < NSHAPES; i++) {
            check_rms_backward(shapes[i], tu_float_dtypes[k], true, true);
            check_rms_backward(shapes[i], tu_float_dtypes[k], false, true);
            if (i % 3 == 0) check_rms_backward(shapes[i], tu_float_dtypes[k], true, false);
        }
}

static void check_ln_backward(nshape s, ct_dtype dt, bool with_w, bool want_dx, bool want_db) {
    ct_scope *sc = ct_scope_begin();
    double *xv, *gv, *wv = NULL;
    ct_tensor *x = rand2(s, dt, -1, 3, &xv);
    ct_tensor *g = rand2(s, dt, -1, 1, &gv);
    ct_tensor *w = with_w ? rand1(s.d, dt, 0.5, 1.5, &wv) : NULL;
    int64_t n = s.rows * s.d, R = s.rows > 0 ? s.rows : 1;
    double *y = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double *m = malloc(sizeof(double) * (size_t)R), *r = malloc(sizeof(double) * (size_t)R);
    ref_ln(xv, wv, NULL, s.rows, s.d, 1e-5, y, m, r);
    ct_tensor *mt = stat_tensor(m, s.rows, dt), *rt_ = stat_tensor(r, s.rows, dt);
    double *dx = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    double *dw = malloc(sizeof(double) * (size_t)(s.d > 0 ? s.d : 1));
    double *db = malloc(sizeof(double) * (size_t)(s.d > 0 ? s.d : 1));
    ref_ln_bwd(gv, xv, wv, m, r, s.rows, s.d, dx, dw, db);

    ct_tensor *gx = gpu(x), *gg = gpu(g), *gw = w ? gpu(w) : NULL, *gm = gpu(mt), *gr = gpu(rt_);
    poison(n * (int64_t)ct_dtype_size(dt));
    poison(s.d * (int64_t)ct_dtype_size(dt));
    ct_tensor *gdx = NULL, *gdw = NULL, *gdb = NULL;
    ok(ct_layer_norm_backward(gg, gx, gw, gm, gr, want_dx ? &gdx : NULL, &gdw,
                              want_db ? &gdb : NULL));
    ct_tensor *cdx = NULL, *cdw = NULL, *cdb = NULL;
    ok(ct_layer_norm_backward(g, x, w, mt, rt_, want_dx ? &cdx : NULL, &cdw, want_db ? &cdb : NULL));
    double rt = rtol_of(dt);
    if (want_dx) {
        double *da = ln_row_atol(m, r, s.rows, rt, 2);
        expect_rows(gdx, dx, s.rows, s.d, rt, da);
        expect_rows_same(gdx, cdx, s.rows, s.d, rt, da);
        free(da);
    }
    if (with_w) {
        expect(gdw, dw, s.d, rt, 2 * sum_atol(dt, s.rows));
        expect_same(gdw, cdw, rt, 2 * sum_atol(dt, s.rows));
    } else {
        assert_null(gdw);
    }
    if (want_db) {
        expect(gdb, db, s.d, rt, sum_atol(dt, s.rows));
        expect_same(gdb, cdb, rt, sum_atol(dt, s.rows));
    }
    ct_tensor_release(gdx);
    ct_tensor_release(gdw);
    ct_tensor_release(gdb);
    ct_tensor_release(cdx);
    ct_tensor_release(cdw);
    ct_tensor_release(cdb);
    free(xv);
    free(gv);
    free(wv);
    free(y);
    free(m);
    free(r);
    free(dx);
    free(dw);
    free(db);
    ct_scope_end(sc);
}

static void test_layer_norm_backward(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < NSHAPES; i++) {
            check_ln_backward(shapes[i], tu_float_dtypes[k], true, true, true);
            check_ln_backward(shapes[i], tu_float_dtypes[k], false, true, i % 2 == 0);
            if (i % 3 == 0) check_ln_backward(shapes[i], tu_float_dtypes[k], true, false, true);
            if (i % 3 == 1) check_ln_backward(shapes[i], tu_float_dtypes[k], true, false, false);
        }
}

/* ---- layouts -------------------------------------------------------------------------------------------- */
/* A contiguous GPU copy of t that starts one element into its storage, so
 * no row is 16-byte aligned. */
static ct_tensor *misaligned(ct_tensor *t) {
    int64_t n = ct_tensor_numel(t) + 1;
    ct_tensor *big = checked(ct_tensor_zeros(1, &n, ct_tensor_dtype(t), CT_CUDA(0)));
    ct_tensor *tail = checked(ct_slice(big, 0, 1, n, 1));
    ct_tensor *v = checked(ct_reshape(tail, ct_tensor_ndim(t), ct_tensor_shape(t)));
    ok(ct_copy_(v, t));
    assert_true(ct_tensor_is_contiguous(v));
    assert_true((uintptr_t)ct_tensor_data_ptr(v) % 16 != 0);
    return v;
}

/* Non-contiguous and misaligned x, w and grad_y give the contiguous results. */
static void test_layouts(void **state) {
    (void)state;
    NEED_GPU();
    static const nshape ls[] = {{64, 1024}, {6, 8192}, {37, 33}};
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < 3; i++) {
            ct_scope *sc = ct_scope_begin();
            ct_dtype dt = tu_float_dtypes[k];
            nshape s = ls[i];
            ct_tensor *x = gpu(rand2(s, dt, -2, 2, NULL)), *g = gpu(rand2(s, dt, -1, 1, NULL));
            ct_tensor *w = gpu(rand1(s.d, dt, 0.5, 1.5, NULL)), *b = gpu(rand1(s.d, dt, -1, 1, NULL));
            ct_tensor *inv = NULL, *m = NULL, *r = NULL;
            ct_tensor *y = checked(ct_rms_norm(x, 1, &s.d, w, 1e-6, &inv));
            ct_tensor *yl = checked(ct_layer_norm(x, 1, &s.d, w, b, 1e-6, &m, &r));
            ct_tensor *dx = NULL, *dw = NULL, *ldx = NULL, *ldw = NULL, *ldb = NULL;
            ok(ct_rms_norm_backward(g, x, w, inv, &dx, &dw));
            ok(ct_layer_norm_backward(g, x, w, m, r, &ldx, &ldw, &ldb));
            for (int form = 0; form < 2; form++) {
                ct_tensor *x2 = form ? misaligned(x) : tu_noncontig(x);
                ct_tensor *g2 = form ? misaligned(g) : tu_noncontig(g);
                ct_tensor *w2 = form ? misaligned(w) : tu_noncontig(w);
                ct_tensor *inv2 = NULL, *m2 = NULL, *r2 = NULL;
                double rt = rtol_of(dt);
                expect_same(checked(ct_rms_norm(x2, 1, &s.d, w2, 1e-6, &inv2)), y, rt, rt);
                expect_same(checked(ct_layer_norm(x2, 1, &s.d, w2, b, 1e-6, &m2, &r2)), yl, rt, rt);
                expect_same(inv2, inv, 1e-5, 0);
                expect_same(r2, r, 1e-5, 0);
                ct_tensor *dx2 = NULL, *dw2 = NULL, *ldx2 = NULL, *ldw2 = NULL, *ldb2 = NULL;
                ok(ct_rms_norm_backward(g2, x2, w2, inv, &dx2, &dw2));
                ok(ct_layer_norm_backward(g2, x2, w2, m, r, &ldx2, &ldw2, &ldb2));
                expect_same(dx2, dx, rt, 2 * rt);
                expect_same(dw2, dw, rt, sum_atol(dt, s.rows));
                expect_same(ldx2, ldx, rt, 4 * rt);
                expect_same(ldw2, ldw, rt, sum_atol(dt, s.rows));
                expect_same(ldb2, ldb, rt, sum_atol(dt, s.rows));
                ct_tensor *all[] = {inv2, m2, r2, dx2, dw2, ldx2, ldw2, ldb2};
                for (size_t a = 0; a < sizeof all / sizeof all[0]; a++) ct_tensor_release(all[a]);
            }
            ct_tensor *all[] = {inv, m, r, dx, dw, ldx, ldw, ldb};
            for (size_t a = 0; a < sizeof all / sizeof all[0]; a++) ct_tensor_release(all[a]);
            ct_scope_end(sc);
        }
}

/* Normalizing over the last two dims of a 4-d x, against the CPU. */
static void test_multi_dim(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 4; k++) {
        ct_scope *sc = ct_scope_begin();
        ct_dtype dt = tu_float_dtypes[k];
        int64_t ns[2] = {5, 7};
        ct_tensor *x = checked(tu_rand(4, (int64_t[]){4, 6, 5, 7}, dt, -2, 2, NULL));
        ct_tensor *g = checked(tu_rand(4, (int64_t[]){4, 6, 5, 7}, dt, -1, 1, NULL));
        ct_tensor *w = checked(tu_rand(2, ns, dt, 0.5, 1.5, NULL));
        ct_tensor *b = checked(tu_rand(2, ns, dt, -1, 1, NULL));
        ct_tensor *gx = gpu(x), *gg = gpu(g), *gw = gpu(w), *gb = gpu(b);
        double rt = rtol_of(dt);
        ct_tensor *ci = NULL, *gi = NULL, *cm = NULL, *cr = NULL, *gm = NULL, *gr = NULL;
        expect_same(checked(ct_rms_norm(gx, 2, ns, gw, 1e-5, &gi)),
                    checked(ct_rms_norm(x, 2, ns, w, 1e-5, &ci)), rt, rt);
        expect_same(checked(ct_layer_norm(gx, 2, ns, gw, gb, 1e-5, &gm, &gr)),
                    checked(ct_layer_norm(x, 2, ns, w, b, 1e-5, &cm, &cr)), rt, rt);
        assert_int_equal(ct_tensor_ndim(gi), 2);
        ct_tensor *a[5] = {NULL}, *c[5] = {NULL};
        ok(ct_rms_norm_backward(gg, gx, gw, gi, &a[0], &a[1]));
        ok(ct_rms_norm_backward(g, x, w, ci, &c[0], &c[1]));
        ok(ct_layer_norm_backward(gg, gx, gw, gm, gr, &a[2], &a[3], &a[4]));
        ok(ct_layer_norm_backward(g, x, w, cm, cr, &c[2], &c[3], &c[4]));
        for (int i = 0; i < 5; i++) {
            assert_int_equal(ct_tensor_ndim(a[i]), ct_tensor_ndim(c[i]));
            expect_same(a[i], c[i], rt, 4 * rt);
            ct_tensor_release(a[i]);
            ct_tensor_release(c[i]);
        }
        ct_tensor *st[6] = {ci, gi, cm, cr, gm, gr};
        for (int i = 0; i < 6; i++) ct_tensor_release(st[i]);
        ct_scope_end(sc);
    }
}

/* No rows: empty outputs and zero weight/bias grads. No columns: NaN
 * statistics, as on the CPU. */
static void test_empty(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 4; k++) {
        ct_scope *sc = ct_scope_begin();
        ct_dtype dt = tu_float_dtypes[k];
        int64_t d = 8;
        ct_tensor *x = checked(ct_tensor_zeros(2, (int64_t[]){0, d}, dt, CT_CUDA(0)));
        ct_tensor *w = gpu(rand1(d, dt, 0.5, 1.5, NULL));
        ct_tensor *inv = NULL, *m = NULL, *r = NULL;
        ct_tensor *y = checked(ct_rms_norm(x, 1, &d, w, 1e-5, &inv));
        assert_int_equal(ct_tensor_numel(y), 0);
        checked(ct_layer_norm(x, 1, &d, w, w, 1e-5, &m, &r));
        poison(d * (int64_t)ct_dtype_size(dt));
        ct_tensor *dx = NULL, *dw = NULL, *ldw = NULL, *ldb = NULL;
        ok(ct_rms_norm_backward(x, x, w, inv, &dx, &dw));
        ok(ct_layer_norm_backward(x, x, w, m, r, NULL, &ldw, &ldb));
        double zeros[8] = {0};
        expect(dw, zeros, d, 0, 0);
        expect(ldw, zeros, d, 0, 0);
        expect(ldb, zeros, d, 0, 0);
        ct_tensor *all[] = {inv, m, r, dx, dw, ldw, ldb};
        for (size_t a = 0; a < sizeof all / sizeof all[0]; a++) ct_tensor_release(all[a]);

        int64_t z = 0;
        ct_tensor *x0 = checked(ct_tensor_zeros(2, (int64_t[]){3, 0}, dt, CT_CUDA(0)));
        ct_tensor *i0 = NULL;
        checked(ct_rms_norm(x0, 1, &z, NULL, 1e-5, &i0));
        double nans[3] = {NAN, NAN, NAN};
        expect(i0, nans, 3, 0, 0);
        ct_tensor_release(i0);
        ct_scope_end(sc);
    }
}

/* ---- autograd ------------------------------------------------------------------------------------------- */
/* requires_grad x and weight (and bias): ct_backward with a given grad on the
 * GPU gives the CPU's gradients. */
static void test_autograd(void **state) {
    (void)state;
    NEED_GPU();
    static const nshape as[] = {{48, 4096}, {300, 33}};
    for (size_t k = 0; k < 4; k++)
        for (size_t i = 0; i < 2; i++)
            for (int layer = 0; layer < 2; layer++) {
                ct_scope *sc = ct_scope_begin();
                ct_dtype dt = tu_float_dtypes[k];
                nshape s = as[i];
                ct_tensor *cx = rand2(s, dt, -2, 2, NULL), *cg = rand2(s, dt, -1, 1, NULL);
                ct_tensor *cw = rand1(s.d, dt, 0.5, 1.5, NULL), *cb = rand1(s.d, dt, -1, 1, NULL);
                ct_tensor *gx = gpu(cx), *gg = gpu(cg), *gw = gpu(cw), *gb = gpu(cb);
                ct_tensor *leaves[2][3] = {{cx, cw, cb}, {gx, gw, gb}};
                ct_tensor *ys[2];
                for (int dv = 0; dv < 2; dv++) {
                    ct_tensor **l = leaves[dv];
                    for (int j = 0; j < 3; j++) ok(ct_requires_grad_(l[j], true));
                    ys[dv] = layer ? checked(ct_layer_norm(l[0], 1, &s.d, l[1], l[2], 1e-5, NULL, NULL))
                                   : checked(ct_rms_norm(l[0], 1, &s.d, l[1], 1e-5, NULL));
                    ok(ct_backward(ys[dv], dv ? gg : cg, false));
                }
                double rt = rtol_of(dt);
                expect_same(ys[1], ys[0], rt, rt);
                expect_same(ct_grad(gx), ct_grad(cx), rt, 4 * rt);
                expect_same(ct_grad(gw), ct_grad(cw), rt, 2 * sum_atol(dt, s.rows));
                assert_int_equal(ct_tensor_device(ct_grad(gw)).type, CT_DEVICE_CUDA);
                if (layer) expect_same(ct_grad(gb), ct_grad(cb), rt, sum_atol(dt, s.rows));
                else assert_null(ct_grad(gb));
                ct_scope_end(sc);
            }
}

/* The weight grads come from per-block partial sums added in a fixed order:
 * two runs give the same bits. */
static void test_deterministic(void **state) {
    (void)state;
    NEED_GPU();
    nshape s = {70000, 64};
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = gpu(rand2(s, CT_F32, -2, 2, NULL)), *g = gpu(rand2(s, CT_F32, -1, 1, NULL));
    ct_tensor *w = gpu(rand1(s.d, CT_F32, 0.5, 1.5, NULL));
    ct_tensor *m = NULL, *r = NULL;
    checked(ct_layer_norm(x, 1, &s.d, w, NULL, 1e-5, &m, &r));
    ct_tensor *dw[2] = {NULL}, *db[2] = {NULL};
    for (int t = 0; t < 2; t++) ok(ct_layer_norm_backward(g, x, w, m, r, NULL, &dw[t], &db[t]));
    double *a = tu_values(dw[0]), *b = tu_values(dw[1]), *c = tu_values(db[0]), *d = tu_values(db[1]);
    assert_memory_equal(a, b, sizeof(double) * (size_t)s.d);
    assert_memory_equal(c, d, sizeof(double) * (size_t)s.d);
    free(a);
    free(b);
    free(c);
    free(d);
    ct_tensor *all[] = {m, r, dw[0], dw[1], db[0], db[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    ct_scope_end(sc);
}

/* ---- bad input ------------------------------------------------------------------------------------------ */
static void test_mixed_devices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    int64_t d = 16;
    ct_tensor *cx = rand2((nshape){4, 16}, CT_F32, -1, 1, NULL);
    ct_tensor *cw = rand1(d, CT_F32, 0.5, 1.5, NULL);
    ct_tensor *gx = gpu(cx), *gw = gpu(cw);
    tu_assert_null_error(ct_rms_norm(gx, 1, &d, cw, 1e-5, NULL), CT_ERR_DEVICE, "ct_rms_norm",
                         "cuda:0", "cpu", "one device");
    tu_assert_null_error(ct_layer_norm(gx, 1, &d, gw, cw, 1e-5, NULL, NULL), CT_ERR_DEVICE,
                         "ct_layer_norm", "cuda:0", "cpu");
    ct_tensor *inv = NULL, *m = NULL, *r = NULL;
    checked(ct_rms_norm(gx, 1, &d, gw, 1e-5, &inv));
    checked(ct_layer_norm(gx, 1, &d, gw, NULL, 1e-5, &m, &r));
    ct_tensor *dx = NULL, *dw = NULL, *db = NULL;
    tu_assert_error(ct_rms_norm_backward(cx, gx, gw, inv, &dx, &dw), CT_ERR_DEVICE,
                    "ct_rms_norm_backward", "cuda:0", "cpu");
    assert_null(dx);
    assert_null(dw);
    ok(ct_layer_norm_backward(gx, gx, gw, m, r, &dx, &dw, &db));
    ct_tensor_release(dx);
    ct_tensor_release(dw);
    ct_tensor_release(db);
    dx = dw = db = NULL;
    ct_tensor *cm = checked(ct_to_device(m, CT_CPU));
    tu_assert_error(ct_layer_norm_backward(gx, gx, gw, cm, r, &dx, &dw, &db), CT_ERR_DEVICE,
                    "ct_layer_norm_backward", "cuda:0", "cpu");
    assert_null(dx);
    ct_tensor *all[] = {inv, m, r};
    for (size_t i = 0; i < 3; i++) ct_tensor_release(all[i]);
    ct_scope_end(sc);
}

/* A build with the CUDA backend on a machine without a GPU says so. */
int main(void) {
    tu_seed();
    /* The first op in a process registers the backends; tests that start by
     * moving a tensor to the GPU need them registered before. */
    cti_init();
    ngpu = tu_cuda_devices_or_skip("cuda_norm");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_rms_norm_forward), T(test_layer_norm_forward), T(test_rms_norm_backward),
        T(test_layer_norm_backward), T(test_layouts), T(test_multi_dim), T(test_empty),
        T(test_autograd), T(test_deterministic), T(test_mixed_devices),
    };
#undef T
    return tu_run_tests(tests);
}
