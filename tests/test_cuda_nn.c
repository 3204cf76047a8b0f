/* The CUDA kernels of the neural-network ops against float64 references
 * computed here and against the CPU: softmax and log_softmax over every dim
 * (short, long and strided rows, -inf/NaN rows) and their backward, the
 * classification losses with every reduction, ignore_index, label smoothing,
 * class weights and [N, C, d...] inputs, mse, embedding (every dtype, int32
 * and int64 indices) and its deterministic backward, dropout's masks (equal
 * to the CPU's for the same generator state); gradients through autograd on
 * the GPU against the CPU; bad inputs (mixed devices, out-of-range indices
 * and targets) and empty ones. The program is skipped without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

static int ngpu;

#define NEED_GPU()                  \
    do {                            \
        if (ngpu == 0) skip();      \
    } while (0)

/* ---- helpers ------------------------------------------------------------------------------- */
static ct_tensor *chk(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

static ct_tensor *gpu(ct_tensor *t) {
    ct_tensor *g = chk(ct_to_device(t, CT_CUDA(0)));
    assert_int_equal(ct_tensor_device(g).type, CT_DEVICE_CUDA);
    return g;
}

/* A GPU copy of t, non-contiguous when nc. */
static ct_tensor *gpu_nc(ct_tensor *t, bool nc) {
    ct_tensor *g = gpu(t);
    if (!nc) return g;
    g = chk(tu_noncontig(g));
    if (ct_tensor_numel(g) > 1) assert_false(ct_tensor_is_contiguous(g));
    return g;
}

static void assert_shape(const ct_tensor *t, int nd, const int64_t *shape) {
    assert_int_equal(ct_tensor_ndim(t), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(t)[d], shape[d]);
}

/* got (on the GPU) against float64 values; atol relative to the largest |ref|. */
static void check_ref(ct_tensor *got, const double *ref, int64_t n, double rtol, double arel) {
    assert_int_equal(ct_tensor_device(got).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_numel(got), n);
    double mx = 0;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(ref[i]) && fabs(ref[i]) > mx) mx = fabs(ref[i]);
    double *g = tu_values(got);
    tu_assert_close(g, ref, n, rtol, arel * mx + 1e-300);
    free(g);
}

/* Two tensors with the same shape and close values (NaN where the other has NaN). */
static void check_same(ct_tensor *got, ct_tensor *want, double rtol, double atol) {
    assert_non_null(got);
    assert_non_null(want);
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(want));
    assert_shape(got, ct_tensor_ndim(want), ct_tensor_shape(want));
    int64_t n = ct_tensor_numel(want);
    double *g = tu_values(got), *w = tu_values(want);
    tu_assert_close(g, w, n, rtol, atol);
    free(g);
    free(w);
}

/* Same bits (via the values as doubles, NaN == NaN). */
static void check_identical(ct_tensor *got, ct_tensor *want) { check_same(got, want, 0, 0); }

/* A CPU int64 (or int32) tensor holding vals. */
static ct_tensor *ints(const int64_t *vals, int nd, const int64_t *shape, ct_dtype dt) {
    int64_t n = tu_numel(nd, shape);
    double *v = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) v[i] = (double)vals[i];
    ct_tensor *t = chk(tu_from_f64(v, nd, shape, dt));
    free(v);
    return t;
}

static double rtol_for(ct_dtype dt) { return 2 * tu_rtol(dt); }

/* ---- softmax --------------------------------------------------------------------------------- */
typedef struct smg {
    int nd;
    int64_t s[4];
    int dim;
    bool nc;
} smg;

/* Rows of one warp (d <= 1024), rows held in one block's registers (1500:
 * one element a chunk; 4096 and 8200: 16-byte chunks, 8200 past what float64
 * holds so it takes the two-pass kernel there; 20000: two-pass for float32,
 * registers for the 2-byte types), and softmax over inner dims. */
static const smg sm_geoms[] = {
    {2, {4, 37}, 1, false},   {2, {64, 1024}, -1, false}, {2, {3, 1500}, 1, false},
    {3, {5, 6, 7}, 1, true},  {3, {5, 6, 7}, 0, false},   {3, {5, 6, 7}, 2, true},
    {2, {2, 1025}, 0, false}, {4, {2, 3, 33, 4}, 2, false}, {1, {9}, 0, false},
    {2, {5, 4096}, -1, false}, {2, {3, 8200}, 1, true},   {2, {2, 20000}, 1, false},
};

static void split(const smg *g, int64_t *outer, int64_t *d, int64_t *inner) {
    int dim = g->dim < 0 ? g->dim + g->nd : g->dim;
    *outer = tu_numel(dim, g->s);
    *d = g->s[dim];
    *inner = tu_numel(g->nd - dim - 1, g->s + dim + 1);
}

static void softmax_ref(const double *x, double *y, int64_t outer, int64_t d, int64_t inner,
                        bool lg) {
    for (int64_t o = 0; o < outer; o++)
        for (int64_t j = 0; j < inner; j++) {
            const double *xr = x + o * d * inner + j;
            double *yr = y + o * d * inner + j;
            double m = -INFINITY, s = 0;
            for (int64_t k = 0; k < d; k++) m = fmax(m, xr[k * inner]);
            for (int64_t k = 0; k < d; k++) s += exp(xr[k * inner] - m);
            for (int64_t k = 0; k < d; k++)
                yr[k * inner] = lg ? xr[k * inner] - m - log(s) : exp(xr[k * inner] - m) / s;
        }
}

static void test_softmax_reference(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < 4; di++)
        for (size_t gi = 0; gi < sizeof sm_geoms / sizeof sm_geoms[0]; gi++) {
            ct_dtype dt = tu_float_dtypes[di];
            const smg *g = &sm_geoms[gi];
            ct_scope *sc = ct_scope_begin();
            double *xv;
            ct_tensor *x = chk(tu_rand(g->nd, g->s, dt, -8, 8, &xv));
            ct_tensor *gx = gpu_nc(x, g->nc);
            int64_t outer, d, inner, n = tu_numel(g->nd, g->s);
            split(g, &outer, &d, &inner);
            double *ref = malloc(sizeof(double) * (size_t)n);
            for (int lg = 0; lg < 2; lg++) {
                ct_tensor *y = chk(lg ? ct_log_softmax(gx, g->dim) : ct_softmax(gx, g->dim));
                assert_shape(y, g->nd, g->s);
                assert_int_equal(ct_tensor_dtype(y), dt);
                softmax_ref(xv, ref, outer, d, inner, lg);
                /* absolute slack: log_softmax's (x - m) - log(s) cancels terms of the
                 * inputs' size; probabilities round to float16 subnormals */
                check_ref(y, ref, n, rtol_for(dt), tu_rtol(dt));
                check_same(y, chk(lg ? ct_log_softmax(x, g->dim) : ct_softmax(x, g->dim)),
                           rtol_for(dt), lg ? 16 * tu_rtol(dt) : 1e-2 * tu_rtol(dt));
            }
            free(ref);
            free(xv);
            ct_scope_end(sc);
        }
}

/* Rows with -inf, huge values, an all -inf row and a NaN: the GPU gives the
 * CPU's results (NaN where the CPU has NaN) on every path. */
static void test_softmax_special_values(void **state) {
    (void)state;
    NEED_GPU();
    static const int64_t lens[] = {40, 2000, 3001}; /* a warp, 16-byte and 1-element chunks */
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        int64_t d = lens[li], shape[2] = {4, d};
        ct_scope *sc = ct_scope_begin();
        double *v = malloc(sizeof(double) * (size_t)(4 * d));
        for (int64_t k = 0; k < 4 * d; k++) v[k] = tu_uniform(-3, 3);
        v[0] = -INFINITY;
        v[3] = 1000;
        v[4] = 999.5;
        for (int64_t k = 0; k < d; k++) v[d + k] = -INFINITY;
        v[2 * d + 5] = NAN;
        v[3 * d + d - 1] = -INFINITY;
        ct_tensor *x = chk(tu_from_f64(v, 2, shape, CT_F32)), *gx = gpu(x);
        for (int lg = 0; lg < 2; lg++)
            for (int dim = 0; dim < 2; dim++) {
                ct_tensor *want = chk(lg ? ct_log_softmax(x, dim) : ct_softmax(x, dim));
                ct_tensor *got = chk(lg ? ct_log_softmax(gx, dim) : ct_softmax(gx, dim));
                check_same(got, want, 1e-5, 1e-6);
            }
        /* the stable row: softmax of (1000, 999.5) dominates and is finite */
        double *y = tu_values(chk(ct_softmax(gx, 1)));
        assert_true(isfinite(y[3]) && y[3] > 0.5);
        assert_true(isnan(y[d])); /* all -inf */
        assert_true(isnan(y[2 * d])); /* NaN row */
        free(y);
        free(v);
        ct_scope_end(sc);
    }
}

/* The backward ops on arbitrary y: softmax dx = y * (g - sum(g*y)),
 * log_softmax dx = g - exp(y) * sum(g). */
static void test_softmax_backward_reference(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < 4; di++)
        for (size_t gi = 0; gi < sizeof sm_geoms / sizeof sm_geoms[0]; gi++) {
            ct_dtype dt = tu_float_dtypes[di];
            const smg *g = &sm_geoms[gi];
            int64_t outer, d, inner, n = tu_numel(g->nd, g->s);
            split(g, &outer, &d, &inner);
            for (int lg = 0; lg < 2; lg++) {
                ct_scope *sc = ct_scope_begin();
                double *gv, *yv;
                ct_tensor *gr = chk(tu_rand(g->nd, g->s, dt, -2, 2, &gv));
                ct_tensor *y = chk(tu_rand(g->nd, g->s, dt, lg ? -5 : 0, lg ? 0 : 1, &yv));
                ct_tensor *dx = chk(lg ? ct_log_softmax_backward(gpu_nc(gr, g->nc), gpu(y), g->dim)
                                       : ct_softmax_backward(gpu(gr), gpu_nc(y, g->nc), g->dim));
                double *ref = malloc(sizeof(double) * (size_t)n);
                for (int64_t o = 0; o < outer; o++)
                    for (int64_t j = 0; j < inner; j++) {
                        int64_t b = o * d * inner + j;
                        double s = 0;
                        for (int64_t k = 0; k < d; k++)
                            s += lg ? gv[b + k * inner] : gv[b + k * inner] * yv[b + k * inner];
                        for (int64_t k = 0; k < d; k++) {
                            int64_t e = b + k * inner;
                            ref[e] = lg ? gv[e] - exp(yv[e]) * s : yv[e] * (gv[e] - s);
                        }
                    }
                check_ref(dx, ref, n, rtol_for(dt), 2 * tu_rtol(dt));
                ct_tensor *want = chk(lg ? ct_log_softmax_backward(gr, y, g->dim)
                                         : ct_softmax_backward(gr, y, g->dim));
                check_same(dx, want, rtol_for(dt), 1e-3);
                free(ref);
                free(gv);
                free(yv);
                ct_scope_end(sc);
            }
        }
}

/* ---- classification losses ------------------------------------------------------------------------ */
typedef struct clsg {
    int nd;
    int64_t s[4];
    bool nc;
} clsg;

/* Three sets, a test each per dtype (under racecheck one dtype's whole set
 * ran past two minutes in one process).
 * [64, 10] (one launch), [4, 5, 3, 2] non-contiguous, [300, 2000] (split), [7] (0-d target),
 * [20000, 3] (the backward's weight sum runs apart). */
static const clsg cls_small[] = {
    {2, {64, 10}, false}, {4, {4, 5, 3, 2}, true}, {2, {300, 2000}, false},
    {1, {7}, false},      {2, {20000, 3}, false},
};
/* long rows (the register kernels: 16-byte chunks, 1 to 8 a thread; 2001
 * is no multiple of a chunk and 9000 float64 does not fit, so both take
 * the warp-per-row kernels) */
static const clsg cls_long[] = {{2, {40, 9000}, false}, {2, {50, 2001}, true}, {2, {17, 4096}, true}};
/* more rows than the forward's grid: each block loops over rows */
static const clsg cls_many[] = {{2, {1500, 1104}, false}};
#define CLS_SET(a) a, sizeof a / sizeof a[0]

typedef struct clsopt {
    bool weighted;
    int64_t ignore;
    double ls;
} clsopt;

static const clsopt cls_opts[] = {{false, -100, 0}, {true, 0, 0}, {false, 0, 0.2}, {true, -100, 0.1}};

/* Per-position losses and counted weights of cross-entropy (nll: of
 * log-probabilities) in float64; the CPU's formulas. */
static void cls_ref(bool nll, const double *x, const int64_t *t, const double *w, int64_t n,
                    int64_t c, int64_t inner, int64_t ignore, double ls, double *loss,
                    double *wt) {
    for (int64_t p = 0; p < n * inner; p++) {
        int64_t nn = p / inner, j = p % inner;
        const double *z = x + nn * c * inner + j;
        loss[p] = wt[p] = 0;
        if (t[p] == ignore) continue;
        double wtp = w ? w[t[p]] : 1;
        wt[p] = wtp;
        if (nll) {
            loss[p] = -wtp * z[t[p] * inner];
            continue;
        }
        double m = -INFINITY, s = 0;
        for (int64_t k = 0; k < c; k++) m = fmax(m, z[k * inner]);
        for (int64_t k = 0; k < c; k++) s += exp(z[k * inner] - m);
        double lse = m + log(s), sm = 0;
        for (int64_t k = 0; k < c; k++) sm += (w ? w[k] : 1) * (lse - z[k * inner]);
        loss[p] = (1 - ls) * wtp * (lse - z[t[p] * inner]) + ls / (double)c * sm;
    }
}

/* The gradient of the loss for per-position scales gp. */
static void cls_grad_ref(bool nll, const double *x, const int64_t *t, const double *w, int64_t n,
                         int64_t c, int64_t inner, int64_t ignore, double ls, const double *gp,
                         double *dx) {
    double sumw = 0;
    for (int64_t k = 0; k < c; k++) sumw += w ? w[k] : 1;
    for (int64_t p = 0; p < n * inner; p++) {
        int64_t nn = p / inner, j = p % inner;
        const double *z = x + nn * c * inner + j;
        double *d = dx + nn * c * inner + j;
        for (int64_t k = 0; k < c; k++) d[k * inner] = 0;
        if (t[p] == ignore) continue;
        double wtp = w ? w[t[p]] : 1;
        if (nll) {
            d[t[p] * inner] = -wtp * gp[p];
            continue;
        }
        double m = -INFINITY, s = 0;
        for (int64_t k = 0; k < c; k++) m = fmax(m, z[k * inner]);
        for (int64_t k = 0; k < c; k++) s += exp(z[k * inner] - m);
        double lse = m + log(s);
        for (int64_t k = 0; k < c; k++) {
            double pr = exp(z[k * inner] - lse);
            d[k * inner] = gp[p] * ((1 - ls) * wtp * (pr - (k == t[p])) +
                                    ls / (double)c * (sumw * pr - (w ? w[k] : 1)));
        }
    }
}

/* Each of the geometries, every option and reduction. */
static void run_cls_reference(bool nll, ct_dtype dt, const clsg *geoms, size_t count) {
    for (size_t gi = 0; gi < count; gi++) {
        const clsg *g = &geoms[gi];
        ct_scope *sc = ct_scope_begin();
        int64_t c = g->nd == 1 ? g->s[0] : g->s[1], n = g->nd == 1 ? 1 : g->s[0];
        int64_t inner = g->nd > 2 ? tu_numel(g->nd - 2, g->s + 2) : 1, npos = n * inner;
        int64_t tsh[4];
        int tnd = 0;
        if (g->nd > 1) {
            tsh[tnd++] = g->s[0];
            for (int d = 2; d < g->nd; d++) tsh[tnd++] = g->s[d];
        }
        double *xv, *wv, *gv;
        ct_tensor *x = chk(tu_rand(g->nd, g->s, dt, nll ? -6 : -4, nll ? 0 : 4, &xv));
        ct_tensor *w = chk(tu_rand(1, &c, dt, 0.25, 2, &wv));
        ct_tensor *gl = chk(tu_rand(tnd, tsh, dt, -1, 1, &gv));
        int64_t *tv = malloc(sizeof(int64_t) * (size_t)npos);
        for (int64_t p = 0; p < npos; p++) tv[p] = tu_next() % 4 == 0 ? 0 : tu_randint(0, c);
        ct_tensor *t = ints(tv, tnd, tsh, CT_I64);
        ct_tensor *gx = gpu_nc(x, g->nc), *gt = gpu_nc(t, g->nc), *gw = gpu(w), *ggl = gpu(gl);
        ct_tensor *g0 = chk(ct_tensor_scalar(0.75, dt, CT_CUDA(0)));
        size_t nx = (size_t)(npos * c);
        double *loss = malloc(sizeof(double) * (size_t)npos), *wt = malloc(sizeof(double) * (size_t)npos);
        double *gp = malloc(sizeof(double) * (size_t)npos), *dx = malloc(sizeof(double) * nx);
        double rt = rtol_for(dt);
        for (size_t oi = 0; oi < sizeof cls_opts / sizeof cls_opts[0]; oi++) {
            const clsopt *o = &cls_opts[oi];
            double ls = nll ? 0 : o->ls;
            const double *w64 = o->weighted ? wv : NULL;
            ct_tensor *wt_t = o->weighted ? gw : NULL;
            cls_ref(nll, xv, tv, w64, n, c, inner, o->ignore, ls, loss, wt);
            double lsum = 0, wsum = 0;
            for (int64_t p = 0; p < npos; p++) lsum += loss[p], wsum += wt[p];
            for (int red = 0; red < 3; red++) {
                ct_tensor *y = chk(nll ? ct_nll_loss(gx, gt, wt_t, (ct_reduction)red, o->ignore)
                                       : ct_cross_entropy(gx, gt, wt_t, (ct_reduction)red,
                                                          o->ignore, ls));
                double r = red == CT_REDUCTION_MEAN ? lsum / wsum : lsum;
                if (red == CT_REDUCTION_NONE) {
                    assert_shape(y, tnd, tsh);
                    check_ref(y, loss, npos, rt, rt);
                } else {
                    assert_int_equal(ct_tensor_ndim(y), 0);
                    /* a float16 sum past 65504 is inf on both devices */
                    if (dt != CT_F16 || fabs(r) < 6e4) check_ref(y, &r, 1, rt, rt);
                }
                for (int64_t p = 0; p < npos; p++)
                    gp[p] = red == CT_REDUCTION_NONE ? gv[p]
                            : red == CT_REDUCTION_SUM ? 0.75 : 0.75 / wsum;
                ct_tensor *gg = red == CT_REDUCTION_NONE ? ggl : g0;
                ct_tensor *d = chk(nll ? ct_nll_loss_backward(gg, gx, gt, wt_t, (ct_reduction)red, o->ignore)
                                       : ct_cross_entropy_backward(gg, gx, gt, wt_t, (ct_reduction)red,
                                                                   o->ignore, ls));
                assert_shape(d, g->nd, g->s);
                cls_grad_ref(nll, xv, tv, w64, n, c, inner, o->ignore, ls, gp, dx);
                check_ref(d, dx, (int64_t)nx, rt, rt);
                if (!nll) {
                    /* through autograd: the backward reads the forward's row
                     * statistics (the saved-statistics kernel where inner is 1) */
                    ct_tensor *lx = chk(ct_detach(gx));
                    assert_int_equal(ct_requires_grad_(lx, true), CT_OK);
                    ct_tensor *ly = chk(ct_cross_entropy(lx, gt, wt_t, (ct_reduction)red,
                                                         o->ignore, ls));
                    assert_int_equal(ct_backward(ly, gg, false), CT_OK);
                    check_ref(chk(ct_grad(lx)), dx, (int64_t)nx, rt, rt);
                }
            }
        }
        free(loss), free(wt), free(gp), free(dx), free(tv), free(xv), free(wv), free(gv);
        ct_scope_end(sc);
    }
}

/* A test per dtype: a process each under compute-sanitizer (CT_TEST_SHARD). */
static void test_cross_entropy_reference(void **state) {
    NEED_GPU();
    run_cls_reference(false, tu_dtype_of(state), CLS_SET(cls_small));
}

static void test_cross_entropy_reference_long_rows(void **state) {
    NEED_GPU();
    run_cls_reference(false, tu_dtype_of(state), CLS_SET(cls_long));
}

static void test_cross_entropy_reference_many_rows(void **state) {
    NEED_GPU();
    run_cls_reference(false, tu_dtype_of(state), CLS_SET(cls_many));
}

static void test_nll_loss_reference(void **state) {
    NEED_GPU();
    run_cls_reference(true, tu_dtype_of(state), CLS_SET(cls_small));
    run_cls_reference(true, tu_dtype_of(state), CLS_SET(cls_long));
    run_cls_reference(true, tu_dtype_of(state), CLS_SET(cls_many));
}

/* Repeated calls give the same bits (no atomics in any fold), and a small
 * batch matches the CPU. */
static void test_cross_entropy_deterministic(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    int64_t c = 1000;
    ct_tensor *x = chk(tu_rand(CT_SHAPE(4096, 1000), CT_F32, -5, 5, NULL));
    ct_tensor *t = chk(tu_rand(CT_SHAPE(4096), CT_I64, 0, c, NULL));
    ct_tensor *w = chk(tu_rand(1, &c, CT_F32, 0.5, 1.5, NULL));
    ct_tensor *gx = gpu(x), *gt = gpu(t), *gw = gpu(w);
    ct_tensor *a = chk(ct_cross_entropy(gx, gt, gw, CT_REDUCTION_MEAN, -100, 0.1));
    ct_tensor *b = chk(ct_cross_entropy(gx, gt, gw, CT_REDUCTION_MEAN, -100, 0.1));
    check_identical(a, b);
    check_same(a, chk(ct_cross_entropy(x, t, w, CT_REDUCTION_MEAN, -100, 0.1)), 1e-5, 0);
    ct_tensor *g1 = chk(ct_tensor_scalar(1, CT_F32, CT_CUDA(0)));
    ct_tensor *d1 = chk(ct_cross_entropy_backward(g1, gx, gt, gw, CT_REDUCTION_MEAN, -100, 0.1));
    ct_tensor *d2 = chk(ct_cross_entropy_backward(g1, gx, gt, gw, CT_REDUCTION_MEAN, -100, 0.1));
    check_identical(d1, d2);
    /* Long rows past the size at which the mean's weight sum has a pass of
     * its own: the register kernels with that pass, against the CPU. */
    c = 1100;
    x = chk(tu_rand(CT_SHAPE(9000, 1100), CT_F32, -5, 5, NULL));
    t = chk(tu_rand(CT_SHAPE(9000), CT_I64, 0, c, NULL));
    w = chk(tu_rand(1, &c, CT_F32, 0.5, 1.5, NULL));
    gx = gpu(x), gt = gpu(t), gw = gpu(w);
    for (int k = 0; k < 2; k++) {
        ct_tensor *wk = k ? gw : NULL, *wc = k ? w : NULL;
        a = chk(ct_cross_entropy(gx, gt, wk, CT_REDUCTION_MEAN, 3, 0.05 * k));
        check_identical(a, chk(ct_cross_entropy(gx, gt, wk, CT_REDUCTION_MEAN, 3, 0.05 * k)));
        check_same(a, chk(ct_cross_entropy(x, t, wc, CT_REDUCTION_MEAN, 3, 0.05 * k)), 1e-5, 0);
        d1 = chk(ct_cross_entropy_backward(g1, gx, gt, wk, CT_REDUCTION_MEAN, 3, 0.05 * k));
        check_identical(d1, chk(ct_cross_entropy_backward(g1, gx, gt, wk, CT_REDUCTION_MEAN, 3, 0.05 * k)));
        ct_tensor *c1 = chk(ct_tensor_scalar(1, CT_F32, CT_CPU));
        check_same(d1, chk(ct_cross_entropy_backward(c1, x, t, wc, CT_REDUCTION_MEAN, 3, 0.05 * k)),
                   1e-4, 1e-9);
    }
    ct_scope_end(sc);
}

/* A target outside [0, C) (and not ignore_index) is found by the kernel and
 * returned as the op's error by the next wait for the device (here
 * ct_cuda_synchronize; a copy to the host waits too); the record is then
 * cleared. The bad position's loss and gradient row, and any mean or sum
 * over them, are NaN; other positions are unaffected; nothing is read
 * outside the inputs (compute-sanitizer runs this test). */
static void expect_fault(const char *op, const char *target) {
    ct_status s = ct_cuda_synchronize(0);
    if (s != CT_ERR_INDEX) fprintf(stderr, "%s: got status %d: %s\n", op, (int)s, ct_last_error());
    assert_int_equal(s, CT_ERR_INDEX);
    const char *m = ct_last_error();
    if (!strstr(m, op) || !strstr(m, target) || !strstr(m, "out of bounds for 5 classes"))
        fprintf(stderr, "message: %s\n", m);
    assert_non_null(strstr(m, op));
    assert_non_null(strstr(m, target));
    assert_non_null(strstr(m, "out of bounds for 5 classes"));
    assert_non_null(strstr(m, "ct_cuda_synchronize"));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
}

static void test_cross_entropy_bad_target_fails_next_wait(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = gpu(chk(tu_rand(CT_SHAPE(4, 5), CT_F32, -2, 2, NULL)));
    int64_t tv[4] = {1, 7, 0, -3}, ts[1] = {4};
    ct_tensor *t = gpu(ints(tv, 1, ts, CT_I64));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_tensor *l = chk(ct_cross_entropy(x, t, NULL, CT_REDUCTION_NONE, -100, 0));
    expect_fault("cross_entropy", "target ");
    double *v = tu_values(l);
    assert_true(isfinite(v[0]) && isnan(v[1]) && isfinite(v[2]) && isnan(v[3]));
    free(v);
    /* A copy to the host is a wait: it returns the fault instead of the values. */
    l = chk(ct_cross_entropy(x, t, NULL, CT_REDUCTION_MEAN, -100, 0));
    double item = 0;
    assert_int_equal(ct_tensor_item(l, &item), CT_ERR_INDEX);
    assert_non_null(strstr(ct_last_error(), "cross_entropy"));
    assert_int_equal(ct_tensor_item(l, &item), CT_OK);
    assert_true(isnan(item));
    chk(ct_nll_loss(x, t, NULL, CT_REDUCTION_SUM, -100));
    expect_fault("nll_loss", "target ");
    ct_tensor *g = gpu(chk(tu_rand(CT_SHAPE(4), CT_F32, 0.5, 1, NULL)));
    ct_tensor *d = chk(ct_cross_entropy_backward(g, x, t, NULL, CT_REDUCTION_NONE, -100, 0));
    expect_fault("cross_entropy_backward", "target ");
    double *dv = tu_values(d);
    for (int k = 0; k < 5; k++) {
        assert_true(isfinite(dv[k]) && isnan(dv[5 + k]));
        assert_true(isfinite(dv[10 + k]) && isnan(dv[15 + k]));
    }
    free(dv);
    chk(ct_nll_loss_backward(g, x, t, NULL, CT_REDUCTION_NONE, -100));
    expect_fault("nll_loss_backward", "target ");
    /* Exactly C, and -100 when another ignore_index is set. */
    int64_t edge[2][4] = {{0, 5, 1, 2}, {0, 1, -100, 2}};
    for (int k = 0; k < 2; k++) {
        ct_tensor *te = gpu(ints(edge[k], 1, ts, CT_I64));
        chk(ct_cross_entropy(x, te, NULL, CT_REDUCTION_MEAN, k == 1 ? 3 : -100, 0.1));
        expect_fault("cross_entropy", k == 0 ? "target 5 " : "target -100 ");
    }
    /* Good targets after a fault: no error left behind. */
    int64_t good[4] = {0, 4, -100, 2};
    l = chk(ct_cross_entropy(x, gpu(ints(good, 1, ts, CT_I64)), NULL, CT_REDUCTION_MEAN, -100, 0));
    assert_int_equal(ct_tensor_item(l, &item), CT_OK);
    assert_true(isfinite(item));
    ct_scope_end(sc);
}

/* With the profile's device waits (CT_PROFILE=sync) a fault is the faulting
 * op's own error: its wait is the first after the kernel. */
static void test_profile_sync_reports_fault_at_op(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = gpu(chk(tu_rand(CT_SHAPE(4, 5), CT_F32, -2, 2, NULL)));
    int64_t tv[4] = {1, 7, 0, 2}, ts[1] = {4};
    ct_tensor *t = gpu(ints(tv, 1, ts, CT_I64));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_profile_reset();
    ct_set_profile(true);
    ct_set_profile_sync(true);
    assert_true(ct_profile_sync_enabled());
    ct_tensor *l = ct_cross_entropy(x, t, NULL, CT_REDUCTION_NONE, -100, 0);
    ct_status s = ct_last_status();
    ct_set_profile_sync(false);
    ct_set_profile(false);
    ct_profile_reset();
    assert_null(l);
    assert_int_equal(s, CT_ERR_INDEX);
    assert_non_null(strstr(ct_last_error(), "target 7 is out of bounds for 5 classes"));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

/* ---- mse --------------------------------------------------------------------------------------------- */
static void test_mse_reference(void **state) {
    (void)state;
    NEED_GPU();
    static const int64_t sizes[] = {1, 1000, 100003};
    for (size_t di = 0; di < 4; di++)
        for (size_t si = 0; si < 3; si++) {
            ct_dtype dt = tu_float_dtypes[di];
            int64_t n = sizes[si];
            ct_scope *sc = ct_scope_begin();
            double *av, *bv, *gv;
            ct_tensor *a = chk(tu_rand(1, &n, dt, -2, 2, &av)), *b = chk(tu_rand(1, &n, dt, -2, 2, &bv));
            ct_tensor *g = chk(tu_rand(1, &n, dt, -1, 1, &gv));
            ct_tensor *ga = gpu(a), *gb = gpu_nc(b, si == 1), *gg = gpu(g);
            ct_tensor *g0 = chk(ct_tensor_scalar(-1.5, dt, CT_CUDA(0)));
            double *sq = malloc(sizeof(double) * (size_t)n), *dr = malloc(sizeof(double) * (size_t)n);
            double s = 0;
            for (int64_t i = 0; i < n; i++) s += (sq[i] = (av[i] - bv[i]) * (av[i] - bv[i]));
            double rt = rtol_for(dt);
            for (int red = 0; red < 3; red++) {
                ct_tensor *y = chk(ct_mse_loss(ga, gb, (ct_reduction)red));
                double r = red == CT_REDUCTION_MEAN ? s / (double)n : s;
                if (red == CT_REDUCTION_NONE) check_ref(y, sq, n, rt, rt);
                else if (dt != CT_F16 || r < 60000) check_ref(y, &r, 1, rt, 0);
                for (int64_t i = 0; i < n; i++)
                    dr[i] = 2 * (av[i] - bv[i]) *
                            (red == CT_REDUCTION_NONE ? gv[i] : red == CT_REDUCTION_SUM ? -1.5 : -1.5 / (double)n);
                ct_tensor *d = chk(ct_mse_loss_backward(red == CT_REDUCTION_NONE ? gg : g0, ga, gb,
                                                        (ct_reduction)red));
                check_ref(d, dr, n, rt, rt);
            }
            free(sq), free(dr), free(av), free(bv), free(gv);
            ct_scope_end(sc);
        }
}

/* ---- embedding ------------------------------------------------------------------------------------ */
static void test_embedding_reference(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t di = 0; di < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; di++)
        for (int i32 = 0; i32 < 2; i32++) {
            ct_dtype dt = tu_all_dtypes[di];
            ct_scope *sc = ct_scope_begin();
            double *wv;
            ct_tensor *w = chk(tu_rand(CT_SHAPE(50, 33), dt, -100, 100, &wv));
            int64_t iv[42];
            for (int k = 0; k < 42; k++) iv[k] = tu_randint(0, 50);
            iv[3] = 49;
            iv[4] = 0;
            ct_tensor *idx = ints(iv, 2, (const int64_t[]){6, 7}, i32 ? CT_I32 : CT_I64);
            ct_tensor *y = chk(ct_embedding(gpu_nc(w, i32), gpu_nc(idx, !i32)));
            assert_shape(y, 3, (const int64_t[]){6, 7, 33});
            assert_int_equal(ct_tensor_dtype(y), dt);
            double *ref = malloc(sizeof(double) * 42 * 33);
            for (int k = 0; k < 42; k++)
                for (int j = 0; j < 33; j++) ref[k * 33 + j] = wv[iv[k] * 33 + j];
            check_ref(y, ref, 42 * 33, 0, 0);
            free(ref);
            free(wv);
            ct_scope_end(sc);
        }
}

/* Sums in index order, as the CPU: f32/f64 results are the CPU's bits, and
 * repeat from run to run; also a padding row and long runs of one index. */
static void test_embedding_backward_reference(void **state) {
    (void)state;
    NEED_GPU();
    static const int64_t geo[][3] = {{42, 50, 33}, {20000, 30, 64}, {5000, 3000, 5}, {0, 7, 4}};
    for (size_t di = 0; di < 4; di++)
        for (size_t gi = 0; gi < 4; gi++) {
            ct_dtype dt = tu_float_dtypes[di];
            int64_t n = geo[gi][0], v = geo[gi][1], d = geo[gi][2], pad = gi == 0 ? 3 : -1;
            ct_scope *sc = ct_scope_begin();
            double *gv;
            int64_t gs[2] = {n, d};
            ct_tensor *g = chk(tu_rand(2, gs, dt, -1, 1, &gv));
            int64_t *iv = malloc(sizeof(int64_t) * (size_t)(n > 0 ? n : 1));
            for (int64_t k = 0; k < n; k++) iv[k] = tu_next() % 3 == 0 ? 2 : tu_randint(0, v);
            ct_tensor *idx = ints(iv, 1, &n, gi == 2 ? CT_I32 : CT_I64);
            ct_tensor *gg = gpu_nc(g, gi == 0), *gidx = gpu(idx);
            ct_tensor *dw = chk(ct_embedding_backward(gg, gidx, v, pad));
            assert_shape(dw, 2, (const int64_t[]){v, d});
            double *ref = calloc((size_t)(v * d > 0 ? v * d : 1), sizeof(double));
            for (int64_t k = 0; k < n; k++)
                if (iv[k] != pad)
                    for (int64_t j = 0; j < d; j++) ref[iv[k] * d + j] += gv[k * d + j];
            check_ref(dw, ref, v * d, rtol_for(dt), 4 * tu_rtol(dt));
            ct_tensor *want = chk(ct_embedding_backward(g, idx, v, pad));
            if (dt == CT_F32 || dt == CT_F64) check_identical(dw, want);
            else check_same(dw, want, rtol_for(dt), 0);
            check_identical(chk(ct_embedding_backward(gg, gidx, v, pad)), dw);
            free(ref), free(iv), free(gv);
            ct_scope_end(sc);
        }
}

/* ---- dropout ---------------------------------------------------------------------------------------- */
/* The same generator state draws the same mask on both devices; kept
 * elements are scaled by 1/(1-p). */
static void test_dropout_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
    static const double ps[] = {0.1, 0.5, 0.9, 1.0};
    for (size_t di = 0; di < 4; di++)
        for (size_t pi = 0; pi < 4; pi++) {
            ct_dtype dt = tu_float_dtypes[di];
            double p = ps[pi];
            ct_scope *sc = ct_scope_begin();
            double *xv;
            ct_tensor *x = chk(tu_rand(CT_SHAPE(33, 65), dt, -3, 3, &xv));
            ct_generator *g1 = ct_generator_new(1234 + pi), *g2 = ct_generator_new(1234 + pi);
            ct_generator_set_offset(g1, pi);
            ct_generator_set_offset(g2, pi);
            ct_tensor *m1 = NULL, *m2 = NULL;
            ct_tensor *y = chk(ct_dropout(gpu_nc(x, pi == 1), p, true, g1, &m1));
            ct_tensor *yc = chk(ct_dropout(x, p, true, g2, &m2));
            assert_non_null(m1);
            assert_int_equal(ct_tensor_dtype(m1), CT_BOOL);
            check_identical(m1, m2);
            check_identical(y, yc);
            assert_int_equal(ct_generator_offset(g1), ct_generator_offset(g2));
            double *mv = tu_values(m1), *ref = malloc(sizeof(double) * 33 * 65);
            int64_t kept = 0;
            for (int64_t k = 0; k < 33 * 65; k++) {
                ref[k] = mv[k] != 0 ? xv[k] / (1 - p) : 0;
                kept += mv[k] != 0;
            }
            if (p == 1) assert_int_equal(kept, 0);
            else assert_true(kept > 0 && kept < 33 * 65);
            check_ref(y, ref, 33 * 65, rtol_for(dt), 0);
            /* the backward applies the same mask */
            ct_tensor *gr = chk(tu_rand(CT_SHAPE(33, 65), dt, -1, 1, NULL));
            check_identical(chk(ct_dropout_backward(gpu(gr), m1, p)), chk(ct_dropout_backward(gr, m2, p)));
            /* eval mode and p = 0: the identity */
            check_identical(chk(ct_dropout(gpu(x), p, false, g1, NULL)), x);
            free(mv), free(ref), free(xv);
            ct_generator_free(g1);
            ct_generator_free(g2);
            ct_scope_end(sc);
        }
}

/* ---- autograd on the GPU against the CPU -------------------------------------------------------------- */
typedef ct_tensor *(*model_fn)(ct_tensor *const *in, ct_device dev);

static ct_tensor *proj(ct_tensor *y, ct_device dev) {
    /* a fixed projection, so every output element gets its own weight */
    int64_t n = ct_tensor_numel(y);
    double *r = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) r[i] = sin(0.37 * (double)i + 0.1);
    ct_tensor *rt = chk(tu_from_f64(r, ct_tensor_ndim(y), ct_tensor_shape(y), ct_tensor_dtype(y)));
    free(r);
    ct_tensor *rd = chk(ct_to_device(rt, dev));
    return chk(ct_sum(chk(ct_mul(y, rd)), CT_NONE, false));
}

static ct_tensor *m_softmax(ct_tensor *const *in, ct_device dev) { return proj(chk(ct_softmax(in[0], 1)), dev); }
static ct_tensor *m_log_softmax(ct_tensor *const *in, ct_device dev) {
    return proj(chk(ct_log_softmax(in[0], 0)), dev);
}
static ct_tensor *m_cross_entropy(ct_tensor *const *in, ct_device dev) {
    (void)dev;
    return chk(ct_cross_entropy(in[0], in[1], in[2], CT_REDUCTION_MEAN, 0, 0.1));
}
static ct_tensor *m_nll(ct_tensor *const *in, ct_device dev) {
    (void)dev;
    return chk(ct_nll_loss(chk(ct_log_softmax(in[0], 1)), in[1], in[2], CT_REDUCTION_SUM, -100));
}
static ct_tensor *m_ce_none(ct_tensor *const *in, ct_device dev) {
    return proj(chk(ct_cross_entropy(in[0], in[1], NULL, CT_REDUCTION_NONE, 1, 0)), dev);
}
static ct_tensor *m_mse(ct_tensor *const *in, ct_device dev) {
    (void)dev;
    return chk(ct_mse_loss(in[0], in[3], CT_REDUCTION_MEAN));
}
static ct_tensor *m_embedding(ct_tensor *const *in, ct_device dev) {
    return proj(chk(ct_embedding(in[4], in[1])), dev);
}
static ct_tensor *m_dropout(ct_tensor *const *in, ct_device dev) {
    ct_generator *g = ct_generator_new(99);
    ct_tensor *y = chk(ct_dropout(in[0], 0.4, true, g, NULL));
    ct_generator_free(g);
    return proj(y, dev);
}

static void test_autograd_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
    static const model_fn models[] = {m_softmax, m_log_softmax, m_cross_entropy, m_nll,
                                      m_ce_none, m_mse, m_embedding, m_dropout};
    static const ct_dtype dts[] = {CT_F64, CT_F32};
    for (size_t di = 0; di < 2; di++)
        for (size_t mi = 0; mi < sizeof models / sizeof models[0]; mi++) {
            ct_dtype dt = dts[di];
            ct_scope *sc = ct_scope_begin();
            int64_t c = 6;
            /* x [8, 6, 3], target [8, 3], weight [6], mse target [6, 1] (broadcast), table [6, 5] */
            ct_tensor *cin[5], *gin[5];
            cin[0] = chk(tu_rand(CT_SHAPE(8, 6, 3), dt, -2, 2, NULL));
            cin[1] = chk(tu_rand(CT_SHAPE(8, 3), CT_I64, 0, c, NULL));
            cin[2] = chk(tu_rand(1, &c, dt, 0.5, 2, NULL));
            cin[3] = chk(tu_rand(CT_SHAPE(6, 1), dt, -1, 1, NULL));
            cin[4] = chk(tu_rand(CT_SHAPE(6, 5), dt, -1, 1, NULL));
            for (int k = 0; k < 5; k++) gin[k] = gpu(cin[k]);
            ct_tensor *grad_of[3] = {cin[0], cin[3], cin[4]}, *ggrad_of[3] = {gin[0], gin[3], gin[4]};
            for (int k = 0; k < 3; k++) {
                assert_int_equal(ct_requires_grad_(grad_of[k], true), CT_OK);
                assert_int_equal(ct_requires_grad_(ggrad_of[k], true), CT_OK);
            }
            ct_tensor *lc = models[mi](cin, CT_CPU), *lg = models[mi](gin, CT_CUDA(0));
            double tol = dt == CT_F64 ? 1e-10 : 1e-4;
            check_same(lg, lc, tol, tol);
            assert_int_equal(ct_backward(lc, NULL, false), CT_OK);
            assert_int_equal(ct_backward(lg, NULL, false), CT_OK);
            for (int k = 0; k < 3; k++) {
                ct_tensor *a = ct_grad(grad_of[k]), *b = ct_grad(ggrad_of[k]);
                assert_true((a == NULL) == (b == NULL));
                if (!a) continue;
                assert_int_equal(ct_tensor_device(b).type, CT_DEVICE_CUDA);
                check_same(b, a, tol, tol);
            }
            ct_scope_end(sc);
        }
}

/* ---- bad inputs ------------------------------------------------------------------------------------------ */
static void test_mixed_devices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    int64_t c = 5;
    ct_tensor *x = chk(tu_rand(CT_SHAPE(4, 5), CT_F32, -1, 1, NULL)), *gx = gpu(x);
    ct_tensor *t = chk(tu_rand(CT_SHAPE(4), CT_I64, 0, c, NULL)), *gt = gpu(t);
    ct_tensor *w = chk(tu_rand(1, &c, CT_F32, 0.5, 1, NULL));
    tu_assert_null_error(ct_cross_entropy(gx, t, NULL, CT_REDUCTION_MEAN, -100, 0), CT_ERR_DEVICE,
                         "ct_cross_entropy", "one device", "cuda:0", "cpu");
    tu_assert_null_error(ct_nll_loss(gx, gt, w, CT_REDUCTION_MEAN, -100), CT_ERR_DEVICE,
                         "ct_nll_loss", "one device", "cuda:0", "cpu");
    tu_assert_null_error(ct_cross_entropy_backward(chk(ct_tensor_scalar(1, CT_F32, CT_CPU)), gx, gt,
                                                   NULL, CT_REDUCTION_MEAN, -100, 0),
                         CT_ERR_DEVICE, "ct_cross_entropy_backward", "one device");
    tu_assert_null_error(ct_softmax_backward(gx, x, 1), CT_ERR_DEVICE, "ct_softmax_backward",
                         "one device");
    tu_assert_null_error(ct_mse_loss(gx, x, CT_REDUCTION_MEAN), CT_ERR_DEVICE, "ct_mse_loss",
                         "one device");
    tu_assert_null_error(ct_embedding(gx, t), CT_ERR_DEVICE, "ct_embedding", "one device");
    tu_assert_null_error(ct_embedding_backward(gx, t, 9, -1), CT_ERR_DEVICE,
                         "ct_embedding_backward", "one device");
    ct_tensor *mask = chk(tu_rand(CT_SHAPE(4, 5), CT_BOOL, 0, 2, NULL));
    tu_assert_null_error(ct_dropout_backward(gx, mask, 0.5), CT_ERR_DEVICE, "ct_dropout_backward",
                         "one device");
    /* nothing was queued wrongly: the device still works */
    check_same(chk(ct_softmax(gx, 1)), chk(ct_softmax(x, 1)), 1e-5, 1e-7);
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

/* An index outside [0, V) fails the call with the CPU's message, naming the
 * first bad index in index order; the device stays usable. */
static void test_embedding_bad_index(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *w = chk(tu_rand(CT_SHAPE(50, 8), CT_F32, -1, 1, NULL)), *gw = gpu(w);
    static const int64_t cases[][6] = {{1, 2, 50, 3, 77, 4}, {0, -3, 1, 60, 2, 5}, {1, 1, 1, 1, 1, -1}};
    char cpu_msg[512];
    for (int k = 0; k < 3; k++)
        for (int i32 = 0; i32 < 2; i32++) {
            int64_t s[1] = {6};
            ct_tensor *idx = ints(cases[k], 1, s, i32 ? CT_I32 : CT_I64), *gidx = gpu(idx);
            assert_null(ct_embedding(w, idx));
            snprintf(cpu_msg, sizeof cpu_msg, "%s", ct_last_error());
            tu_assert_null_error(ct_embedding(gw, gidx), CT_ERR_INDEX, "ct_embedding: index",
                                 "out of range for 50 embeddings", "expected 0..49");
            assert_string_equal(ct_last_error(), cpu_msg);
            ct_tensor *g = chk(tu_rand(CT_SHAPE(6, 8), CT_F32, -1, 1, NULL));
            assert_null(ct_embedding_backward(g, idx, 50, -1));
            snprintf(cpu_msg, sizeof cpu_msg, "%s", ct_last_error());
            tu_assert_null_error(ct_embedding_backward(gpu(g), gidx, 50, -1), CT_ERR_INDEX,
                                 "ct_embedding_backward: index", "out of range for 50 embeddings");
            assert_string_equal(ct_last_error(), cpu_msg);
        }
    /* an embedding dim of 0 still checks the indices */
    ct_tensor *w0 = gpu(chk(ct_tensor_zeros(CT_SHAPE(5, 0), CT_F32, CT_CPU)));
    int64_t bad[2] = {1, 5}, s2[1] = {2};
    tu_assert_null_error(ct_embedding(w0, gpu(ints(bad, 1, s2, CT_I64))), CT_ERR_INDEX,
                         "index 5 is out of range for 5 embeddings");
    /* a good call afterwards works */
    int64_t good[3] = {0, 49, 7}, s3[1] = {3};
    check_identical(chk(ct_embedding(gw, gpu(ints(good, 1, s3, CT_I64)))),
                    chk(ct_embedding(w, ints(good, 1, s3, CT_I64))));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

/* Empty batches: a mean over nothing is NaN, a sum 0, as on the CPU. */
static void test_empty_inputs(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = chk(ct_tensor_zeros(CT_SHAPE(0, 5), CT_F32, CT_CPU)), *gx = gpu(x);
    ct_tensor *t = chk(ct_tensor_zeros(CT_SHAPE(0), CT_I64, CT_CPU)), *gt = gpu(t);
    for (int red = 0; red < 3; red++) {
        check_same(chk(ct_cross_entropy(gx, gt, NULL, (ct_reduction)red, -100, 0.1)),
                   chk(ct_cross_entropy(x, t, NULL, (ct_reduction)red, -100, 0.1)), 0, 0);
        check_same(chk(ct_nll_loss(gx, gt, NULL, (ct_reduction)red, -100)),
                   chk(ct_nll_loss(x, t, NULL, (ct_reduction)red, -100)), 0, 0);
        check_same(chk(ct_mse_loss(gx, gx, (ct_reduction)red)), chk(ct_mse_loss(x, x, (ct_reduction)red)), 0, 0);
    }
    double *m = tu_values(chk(ct_cross_entropy(gx, gt, NULL, CT_REDUCTION_MEAN, -100, 0)));
    assert_true(isnan(m[0]));
    free(m);
    /* every target ignored: mean NaN, gradient zeros */
    ct_tensor *x2 = gpu(chk(tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL)));
    int64_t tv[3] = {2, 2, 2}, ts[1] = {3};
    ct_tensor *t2 = gpu(ints(tv, 1, ts, CT_I64));
    m = tu_values(chk(ct_cross_entropy(x2, t2, NULL, CT_REDUCTION_MEAN, 2, 0)));
    assert_true(isnan(m[0]));
    free(m);
    double zeros[12] = {0};
    check_ref(chk(ct_cross_entropy_backward(chk(ct_tensor_scalar(1, CT_F32, CT_CUDA(0))), x2, t2,
                                            NULL, CT_REDUCTION_MEAN, 2, 0)),
              zeros, 12, 0, 0);
    assert_shape(chk(ct_softmax(gx, 0)), 2, (const int64_t[]){0, 5});
    assert_int_equal(ct_tensor_numel(chk(ct_embedding(gpu(chk(tu_rand(CT_SHAPE(4, 3), CT_F32, 0, 1, NULL))), gt))), 0);
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda_nn");
    /* Sets up the dispatch table and with it the CUDA allocator, which a
     * first ct_to_device does not do by itself. */
    if (!ct_supports(CT_OP_CROSS_ENTROPY, CT_DEVICE_CUDA, CT_F32))
        fprintf(stderr, "[ cuda_nn  ] no CUDA cross_entropy kernel registered\n");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_softmax_reference),
        T(test_softmax_special_values),
        T(test_softmax_backward_reference),
        TU_EACH_FLOAT_DTYPE(test_cross_entropy_reference),
        TU_EACH_FLOAT_DTYPE(test_cross_entropy_reference_long_rows),
        TU_EACH_FLOAT_DTYPE(test_cross_entropy_reference_many_rows),
        TU_EACH_FLOAT_DTYPE(test_nll_loss_reference),
        T(test_cross_entropy_deterministic),
        T(test_cross_entropy_bad_target_fails_next_wait),
        T(test_profile_sync_reports_fault_at_op),
        T(test_mse_reference),
        T(test_embedding_reference),
        T(test_embedding_backward_reference),
        T(test_dropout_matches_cpu),
        T(test_autograd_matches_cpu),
        T(test_mixed_devices),
        T(test_embedding_bad_index),
        T(test_empty_inputs),
    };
#undef T
    return tu_run_tests(tests);
}
