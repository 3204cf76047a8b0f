/* Autograd of the neural-network ops: gradchecks of rms_norm and layer_norm
 * (with and without the affine parameters, several normalized shapes,
 * non-contiguous and empty inputs), softmax/log_softmax over every dim, the
 * classification losses with every reduction, ignore_index, label smoothing,
 * class weights and [N,C,d...] inputs, mse with broadcasting, embedding with
 * repeated indices, dropout under a fixed generator, and composed models;
 * plus explicit gradients against naive references, which inputs get a
 * gradient, reduced-precision gradients, the saved tensors' version checks,
 * failures that leave no graph, and memory. */
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

/* t made non-contiguous (same values) when nc, then marked requires_grad = rg. */
static ct_tensor *finish(ct_tensor *t, shp s, bool nc, bool rg) {
    assert_non_null(t);
    if (nc) {
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        t = v;
        assert_non_null(t);
        if (s.nd > 0 && tu_numel(s.nd, s.s) > 1) assert_false(ct_tensor_is_contiguous(t));
    }
    if (rg) assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

/* A random float64 tensor in [lo, hi), requiring grad when rg. */
static ct_tensor *rand64(shp s, double lo, double hi, bool nc, bool rg) {
    return finish(tu_rand(s.nd, s.s, CT_F64, lo, hi, NULL), s, nc, rg);
}

static ct_tensor *leaf(shp s, double lo, double hi, bool nc) { return rand64(s, lo, hi, nc, true); }

/* An integer tensor of dtype holding vals. */
static ct_tensor *ints(const int64_t *vals, shp s, ct_dtype dt) {
    int64_t n = tu_numel(s.nd, s.s);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)vals[i];
    ct_tensor *t = tu_from_f64(v, s.nd, s.s, dt);
    free(v);
    assert_non_null(t);
    return t;
}

static const char *red_name(ct_reduction r) {
    return r == CT_REDUCTION_NONE ? "none" : r == CT_REDUCTION_MEAN ? "mean" : "sum";
}

static const ct_reduction reductions[] = {CT_REDUCTION_NONE, CT_REDUCTION_MEAN,
                                          CT_REDUCTION_SUM};

/* ---- normalization --------------------------------------------------------------------- */

typedef struct nctx {
    bool layer;     /* layer_norm, else rms_norm */
    int nnorm;
    int64_t ns[4];
    int iw, ib;     /* index of weight / bias among the inputs, -1 for none */
    bool stats;     /* ask for the saved statistics too */
} nctx;

static ct_tensor *gc_norm(ct_tensor *const *in, void *v) {
    const nctx *c = v;
    ct_tensor *w = c->iw >= 0 ? in[c->iw] : NULL, *b = c->ib >= 0 ? in[c->ib] : NULL;
    ct_tensor *s1 = NULL, *s2 = NULL, *y;
    if (c->layer)
        y = ct_layer_norm(in[0], c->nnorm, c->ns, w, b, 1e-5, c->stats ? &s1 : NULL,
                          c->stats ? &s2 : NULL);
    else y = ct_rms_norm(in[0], c->nnorm, c->ns, w, 1e-5, c->stats ? &s1 : NULL);
    if (c->stats) {
        assert_non_null(s1);
        assert_false(ct_requires_grad(s1)); /* statistics carry no history */
        if (c->layer) assert_non_null(s2);
    }
    ct_tensor_release(s1);
    ct_tensor_release(s2);
    return y;
}

typedef struct norm_case {
    shp x;
    int nnorm;
} norm_case;

static const norm_case norm_cases[] = {
    {SHP(4, 6), 1},       {SHP(2, 3, 4), 1},   {SHP(2, 3, 4), 2}, {SHP(2, 3, 4), 3},
    {SHP(5), 1},          {SHP(2, 1, 3, 5), 2}, {SHP(3, 1), 1},   {SHP(0, 4), 1},
};
#define NNORM (int)(sizeof norm_cases / sizeof norm_cases[0])

/* Every case with every combination of affine parameters (each constant or
 * requiring grad), contiguous or not, x requiring grad or constant. */
static void gradcheck_norms(bool layer) {
    char what[200];
    for (int k = 0; k < NNORM; k++) {
        const norm_case *nc0 = &norm_cases[k];
        shp xs = nc0->x, ps = {nc0->nnorm, {0}};
        for (int d = 0; d < nc0->nnorm; d++) ps.s[d] = xs.s[xs.nd - nc0->nnorm + d];
        int nparam = layer ? 2 : 1;
        /* affine: bit 0 weight present, bit 1 bias present; grads: bit 0 x, bit 1 params */
        for (int affine = 0; affine < (1 << nparam); affine++)
            for (int nc = 0; nc < 2; nc++)
                for (int grads = 1; grads < 4; grads++) {
                    if (!(grads & 1) && affine == 0) continue; /* nothing requires grad */
                    nctx c = {layer, nc0->nnorm, {0}, -1, -1, (k + nc) % 2 == 0};
                    memcpy(c.ns, ps.s, sizeof c.ns);
                    ct_tensor *in[3];
                    int n = 0;
                    in[n++] = rand64(xs, -2, 2, nc, grads & 1);
                    if (affine & 1) {
                        c.iw = n;
                        in[n++] = rand64(ps, 0.5, 1.5, nc, grads & 2);
                    }
                    if (affine & 2) {
                        c.ib = n;
                        in[n++] = rand64(ps, -1, 1, nc, grads & 2);
                    }
                    snprintf(what, sizeof what, "%s case %d affine %d nc %d grads %d",
                             layer ? "layer_norm" : "rms_norm", k, affine, nc, grads);
                    gradcheck_ok(what, gc_norm, &c, n, in);
                    release_all(n, in);
                }
    }
}

static void test_rms_norm_gradcheck(void **state) {
    (void)state;
    gradcheck_norms(false);
}

static void test_layer_norm_gradcheck(void **state) {
    (void)state;
    gradcheck_norms(true);
}

/* x used as its own weight (and, for layer_norm, w as both weight and bias):
 * the gradients of both uses reach the one leaf. */
static ct_tensor *gc_rms_self(ct_tensor *const *in, void *v) {
    (void)v;
    int64_t ns[1] = {ct_tensor_shape(in[0])[0]};
    return ct_rms_norm(in[0], 1, ns, in[0], 1e-5, NULL);
}

static ct_tensor *gc_ln_shared(ct_tensor *const *in, void *v) {
    (void)v;
    int64_t ns[1] = {ct_tensor_shape(in[1])[0]};
    return ct_layer_norm(in[0], 1, ns, in[1], in[1], 1e-5, NULL, NULL);
}

static void test_norm_same_tensor_twice(void **state) {
    (void)state;
    shp s = SHP(6);
    ct_tensor *x = leaf(s, 0.5, 2, false);
    gradcheck_ok("rms_norm(x, weight = x)", gc_rms_self, NULL, 1, &x);
    ct_tensor_release(x);
    ct_tensor *in[2] = {leaf((shp)SHP(3, 4), -2, 2, true), leaf((shp)SHP(4), -1, 1, false)};
    gradcheck_ok("layer_norm(x, w, w)", gc_ln_shared, NULL, 2, in);
    release_all(2, in);
}

/* rms_norm's gradient against a naive reference:
 * dx = r w g - x r^3 mean(w g x), dw = sum_rows(g x r). */
static void test_rms_norm_reference(void **state) {
    (void)state;
    const int64_t R = 3, D = 5;
    double *xv, *wv, *gv;
    ct_tensor *x = tu_rand(2, (int64_t[]){R, D}, CT_F64, -2, 2, &xv);
    ct_tensor *w = tu_rand(1, (int64_t[]){D}, CT_F64, 0.5, 1.5, &wv);
    ct_tensor *g = tu_rand(2, (int64_t[]){R, D}, CT_F64, -1, 1, &gv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    const double eps = 1e-6;
    ct_tensor *y = ct_rms_norm(x, 1, (int64_t[]){D}, w, eps, NULL);
    assert_non_null(y);
    assert_string_equal(ct_grad_fn_name(y), "RmsNormBackward");
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    double dx[15], dw[5] = {0};
    for (int64_t r = 0; r < R; r++) {
        double ms = 0, dot = 0;
        for (int64_t j = 0; j < D; j++) ms += xv[r * D + j] * xv[r * D + j];
        double inv = 1 / sqrt(ms / (double)D + eps);
        for (int64_t j = 0; j < D; j++) dot += wv[j] * gv[r * D + j] * xv[r * D + j];
        for (int64_t j = 0; j < D; j++) {
            dx[r * D + j] = inv * wv[j] * gv[r * D + j] -
                            xv[r * D + j] * inv * inv * inv * dot / (double)D;
            dw[j] += gv[r * D + j] * xv[r * D + j] * inv;
        }
    }
    check_values(ct_grad(x), dx, R * D, 1e-10, 1e-12);
    check_values(ct_grad(w), dw, D, 1e-10, 1e-12);
    free(xv);
    free(wv);
    free(gv);
    ct_tensor *all[4] = {x, w, g, y};
    release_all(4, all);
}

/* The statistics the caller asked for carry no history, are what the
 * forward computed, and the graph does not depend on the caller keeping them. */
static void test_norm_stats(void **state) {
    (void)state;
    const int64_t R = 4, D = 3;
    double *xv;
    ct_tensor *x = tu_rand(2, (int64_t[]){R, D}, CT_F64, -2, 2, &xv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *inv = NULL, *mean = NULL, *rstd = NULL;
    ct_tensor *y1 = ct_rms_norm(x, 1, (int64_t[]){D}, NULL, 1e-5, &inv);
    ct_tensor *y2 = ct_layer_norm(x, 1, (int64_t[]){D}, NULL, NULL, 1e-5, &mean, &rstd);
    assert_non_null(y1);
    assert_non_null(y2);
    assert_string_equal(ct_grad_fn_name(y2), "LayerNormBackward");
    double ri[4], rm[4], rr[4];
    for (int64_t r = 0; r < R; r++) {
        double s = 0, s2 = 0, v = 0;
        for (int64_t j = 0; j < D; j++) {
            s += xv[r * D + j];
            s2 += xv[r * D + j] * xv[r * D + j];
        }
        rm[r] = s / (double)D;
        for (int64_t j = 0; j < D; j++) v += (xv[r * D + j] - rm[r]) * (xv[r * D + j] - rm[r]);
        rr[r] = 1 / sqrt(v / (double)D + 1e-5);
        ri[r] = 1 / sqrt(s2 / (double)D + 1e-5);
    }
    check_values(inv, ri, R, 1e-12, 0);
    check_values(mean, rm, R, 1e-12, 1e-14);
    check_values(rstd, rr, R, 1e-12, 0);
    assert_false(ct_requires_grad(inv));
    assert_false(ct_requires_grad(mean));
    assert_false(ct_requires_grad(rstd));
    ct_tensor_release(inv);
    ct_tensor_release(mean);
    ct_tensor_release(rstd);
    ct_tensor *s = ct_add(y1, y2);
    ct_tensor *l = ct_sum(s, 0, NULL, false);
    assert_int_equal(ct_backward(l, NULL, false), CT_OK);
    assert_non_null(ct_grad(x));
    free(xv);
    ct_tensor *all[5] = {x, y1, y2, s, l};
    release_all(5, all);
}

/* ---- softmax ------------------------------------------------------------------------------ */

typedef struct sctx {
    bool lg;
    int dim;
} sctx;

static ct_tensor *gc_softmax(ct_tensor *const *in, void *v) {
    const sctx *c = v;
    return c->lg ? ct_log_softmax(in[0], c->dim) : ct_softmax(in[0], c->dim);
}

static void test_softmax_gradcheck(void **state) {
    (void)state;
    char what[160];
    struct {
        shp s;
        int dims[6];
        int nd;
    } cases[] = {
        {SHP(3, 4, 5), {0, 1, 2, -1, -2, -3}, 6},
        {SHP(7), {0, -1}, 2},
        {SHP0, {0, -1}, 2},
        {SHP(2, 1, 3), {1, 2}, 2},
        {SHP(2, 0, 3), {1, 2}, 2},
    };
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++)
        for (int j = 0; j < cases[k].nd; j++)
            for (int lg = 0; lg < 2; lg++)
                for (int nc = 0; nc < 2; nc++) {
                    sctx c = {lg, cases[k].dims[j]};
                    ct_tensor *x = leaf(cases[k].s, -3, 3, nc);
                    snprintf(what, sizeof what, "%s case %d dim %d nc %d",
                             lg ? "log_softmax" : "softmax", k, c.dim, nc);
                    gradcheck_ok(what, gc_softmax, &c, 1, &x);
                    ct_tensor_release(x);
                }
}

/* softmax's gradient against y * (g - sum(g * y)) per row, and log_softmax's
 * against g - softmax * sum(g). */
static void test_softmax_reference(void **state) {
    (void)state;
    const int64_t R = 3, D = 4;
    double *xv, *gv;
    ct_tensor *x = tu_rand(2, (int64_t[]){R, D}, CT_F64, -3, 3, &xv);
    ct_tensor *g = tu_rand(2, (int64_t[]){R, D}, CT_F64, -1, 1, &gv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    double sm[12], ref_s[12], ref_l[12];
    for (int64_t r = 0; r < R; r++) {
        double mx = -INFINITY, z = 0, gy = 0, gs = 0;
        for (int64_t j = 0; j < D; j++) mx = fmax(mx, xv[r * D + j]);
        for (int64_t j = 0; j < D; j++) z += exp(xv[r * D + j] - mx);
        for (int64_t j = 0; j < D; j++) {
            sm[r * D + j] = exp(xv[r * D + j] - mx) / z;
            gy += gv[r * D + j] * sm[r * D + j];
            gs += gv[r * D + j];
        }
        for (int64_t j = 0; j < D; j++) {
            ref_s[r * D + j] = sm[r * D + j] * (gv[r * D + j] - gy);
            ref_l[r * D + j] = gv[r * D + j] - sm[r * D + j] * gs;
        }
    }
    ct_tensor *y = ct_softmax(x, -1);
    assert_string_equal(ct_grad_fn_name(y), "SoftmaxBackward");
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    check_values(ct_grad(x), ref_s, R * D, 1e-10, 1e-13);
    ct_zero_grad(x);
    ct_tensor *ly = ct_log_softmax(x, 1);
    assert_string_equal(ct_grad_fn_name(ly), "LogSoftmaxBackward");
    assert_int_equal(ct_backward(ly, g, false), CT_OK);
    check_values(ct_grad(x), ref_l, R * D, 1e-10, 1e-13);
    free(xv);
    free(gv);
    ct_tensor *all[4] = {x, g, y, ly};
    release_all(4, all);
}

/* ---- classification losses ----------------------------------------------------------------- */

typedef struct cctx {
    bool nll;
    ct_reduction red;
    int64_t ignore;
    double ls;
    bool has_w;
} cctx;

/* in: input, target, weight (used when has_w). */
static ct_tensor *gc_cls(ct_tensor *const *in, void *v) {
    const cctx *c = v;
    ct_tensor *w = c->has_w ? in[2] : NULL;
    if (c->nll) return ct_nll_loss(in[0], in[1], w, c->red, c->ignore);
    return ct_cross_entropy(in[0], in[1], w, c->red, c->ignore, c->ls);
}

typedef struct cls_case {
    shp in;
    shp target;
} cls_case;

static const cls_case cls_cases[] = {
    {SHP(5), SHP0},
    {SHP(4, 5), SHP(4)},
    {SHP(3, 4, 2), SHP(3, 2)},
    {SHP(2, 3, 2, 2), SHP(2, 2, 2)},
    {SHP(1, 1), SHP(1)},
};

/* Random class indices in [0, C), a few replaced by ignore (never the first,
 * so a mean has something to average). */
static ct_tensor *rand_target(shp s, int64_t C, int64_t ignore, bool with_ignore) {
    int64_t n = tu_numel(s.nd, s.s), v[16];
    assert_true(n <= 16);
    for (int64_t i = 0; i < n; i++) {
        v[i] = tu_randint(0, C);
        if (with_ignore && i > 0 && tu_randint(0, 3) == 0) v[i] = ignore;
    }
    /* The ignore index as a class: make sure it occurs and is not the first. */
    if (with_ignore && n > 1) v[n - 1] = ignore;
    if (with_ignore && ignore >= 0 && ignore < C && v[0] == ignore) v[0] = (ignore + 1) % C;
    return ints(v, s, CT_I64);
}

static void gradcheck_cls(bool nll) {
    char what[200];
    const double smoothing[] = {0.0, 0.25};
    for (int k = 0; k < (int)(sizeof cls_cases / sizeof cls_cases[0]); k++) {
        const cls_case *cc = &cls_cases[k];
        int64_t C = cc->in.nd == 1 ? cc->in.s[0] : cc->in.s[1];
        for (int r = 0; r < 3; r++)
            for (int ig = 0; ig < 3; ig++)      /* no ignored targets, -100, a class */
                for (int ls = 0; ls < (nll ? 1 : 2); ls++)
                    for (int hw = 0; hw < 2; hw++)
                        for (int nc = 0; nc < 2; nc++) {
                            if (C == 1 && ig == 2) continue; /* the only class ignored */
                            int64_t ignore = ig == 2 ? C / 2 : -100;
                            cctx c = {nll, reductions[r], ignore, smoothing[ls], hw};
                            ct_tensor *in[3];
                            in[0] = leaf(cc->in, -3, 3, nc);
                            in[1] = rand_target(cc->target, C, ignore, ig > 0);
                            in[2] = rand64((shp)SHP(C), 0.3, 2, false, false);
                            snprintf(what, sizeof what,
                                     "%s case %d reduction %s ignore %d ls %g weight %d nc %d",
                                     nll ? "nll_loss" : "cross_entropy", k, red_name(c.red), ig,
                                     c.ls, hw, nc);
                            gradcheck_ok(what, gc_cls, &c, 3, in);
                            release_all(3, in);
                        }
    }
}

static void test_cross_entropy_gradcheck(void **state) {
    (void)state;
    gradcheck_cls(false);
}

static void test_nll_loss_gradcheck(void **state) {
    (void)state;
    gradcheck_cls(true);
}

/* Empty batch with sum and none reductions: a zero gradient of the right shape. */
static void test_cls_empty_batch(void **state) {
    (void)state;
    for (int nll = 0; nll < 2; nll++)
        for (int r = 0; r < 3; r += 2) {
            cctx c = {nll, reductions[r], -100, 0.0, false};
            ct_tensor *in[3] = {leaf((shp)SHP(0, 4), -1, 1, false), ints(NULL, (shp)SHP(0), CT_I64),
                                rand64((shp)SHP(4), 0.5, 1, false, false)};
            gradcheck_ok("empty batch", gc_cls, &c, 3, in);
            release_all(3, in);
        }
}

/* cross_entropy's gradient against a naive reference, weighted mean with
 * label smoothing and an ignored target: for a kept row i with target t,
 * d/dz_ic = ((1-ls) w_t (p_c - [c=t]) + ls/C (p_c sum_k w_k - w_c)) / sum_i w_t. */
static void test_cross_entropy_reference(void **state) {
    (void)state;
    const int64_t N = 4, C = 3;
    const double ls = 0.2;
    double *zv, *wv;
    ct_tensor *z = tu_rand(2, (int64_t[]){N, C}, CT_F64, -2, 2, &zv);
    ct_tensor *w = tu_rand(1, (int64_t[]){C}, CT_F64, 0.5, 2, &wv);
    int64_t tv[4] = {2, 0, -100, 1};
    ct_tensor *t = ints(tv, (shp)SHP(4), CT_I64);
    assert_int_equal(ct_requires_grad_(z, true), CT_OK);
    ct_tensor *l = ct_cross_entropy(z, t, w, CT_REDUCTION_MEAN, -100, ls);
    assert_non_null(l);
    assert_string_equal(ct_grad_fn_name(l), "CrossEntropyBackward");
    assert_int_equal(ct_backward(l, NULL, false), CT_OK);
    /* PyTorch: loss_i = (1-ls) w_t (-log p_t) + ls/C sum_c w_c (-log p_c);
     * mean divides by sum_i w_{t_i} over non-ignored i. */
    double ref[12] = {0}, wsum = 0;
    for (int64_t i = 0; i < N; i++)
        if (tv[i] != -100) wsum += wv[tv[i]];
    for (int64_t i = 0; i < N; i++) {
        if (tv[i] == -100) continue;
        double mx = -INFINITY, zs = 0, p[3], sw = 0;
        for (int64_t c = 0; c < C; c++) mx = fmax(mx, zv[i * C + c]);
        for (int64_t c = 0; c < C; c++) zs += exp(zv[i * C + c] - mx);
        for (int64_t c = 0; c < C; c++) {
            p[c] = exp(zv[i * C + c] - mx) / zs;
            sw += wv[c];
        }
        for (int64_t c = 0; c < C; c++) {
            double gt = (1 - ls) * wv[tv[i]] * (p[c] - (c == tv[i]));
            double gs = ls / (double)C * (sw * p[c] - wv[c]);
            ref[i * C + c] = (gt + gs) / wsum;
        }
    }
    check_values(ct_grad(z), ref, N * C, 1e-10, 1e-13);
    free(zv);
    free(wv);
    ct_tensor *all[4] = {z, w, t, l};
    release_all(4, all);
}

/* Neither the class indices nor the class weights get a gradient. */
static void test_cls_no_grad_to_weight(void **state) {
    (void)state;
    ct_tensor *z = rand64((shp)SHP(3, 4), -1, 1, false, false);
    ct_tensor *w = leaf((shp)SHP(4), 0.5, 1.5, false);
    int64_t tv[3] = {0, 3, 1};
    ct_tensor *t = ints(tv, (shp)SHP(3), CT_I64);
    /* Only the weight requires grad: nothing is recorded. */
    ct_tensor *l = ct_cross_entropy(z, t, w, CT_REDUCTION_MEAN, -100, 0.0);
    ct_tensor *l2 = ct_nll_loss(z, t, w, CT_REDUCTION_SUM, -100);
    assert_non_null(l);
    assert_non_null(l2);
    assert_false(ct_requires_grad(l));
    assert_false(ct_requires_grad(l2));
    assert_null(ct_grad_fn_name(l));
    tu_assert_error(ct_backward(l, NULL, false), CT_ERR_AUTOGRAD, "does not require grad");
    ct_tensor_release(l);
    ct_tensor_release(l2);
    /* Both logits and weight require grad: only the logits get one. */
    assert_int_equal(ct_requires_grad_(z, true), CT_OK);
    l = ct_nll_loss(z, t, w, CT_REDUCTION_MEAN, -100);
    assert_string_equal(ct_grad_fn_name(l), "NllLossBackward");
    assert_int_equal(ct_backward(l, NULL, false), CT_OK);
    assert_non_null(ct_grad(z));
    assert_null(ct_grad(w));
    ct_tensor *all[4] = {z, w, t, l};
    release_all(4, all);
}

/* ---- mse ------------------------------------------------------------------------------------ */

static ct_tensor *gc_mse(ct_tensor *const *in, void *v) {
    return ct_mse_loss(in[0], in[1], *(const ct_reduction *)v);
}

static void test_mse_gradcheck(void **state) {
    (void)state;
    char what[160];
    struct {
        shp a, b;
    } cases[] = {
        {SHP(3, 4), SHP(3, 4)}, {SHP(3, 1, 4), SHP(2, 4)}, {SHP(4), SHP(2, 3, 4)},
        {SHP0, SHP(3)},         {SHP(2, 3), SHP0},          {SHP(2, 1), SHP(1, 3)},
        {SHP(0, 3), SHP(3)},
    };
    for (int k = 0; k < (int)(sizeof cases / sizeof cases[0]); k++)
        for (int r = 0; r < 3; r++)
            for (int grads = 1; grads < 4; grads++)
                for (int nc = 0; nc < 2; nc++) {
                    ct_reduction red = reductions[r];
                    if (red == CT_REDUCTION_MEAN && k == 6) continue; /* mean of nothing */
                    ct_tensor *in[2] = {rand64(cases[k].a, -2, 2, nc, grads & 1),
                                        rand64(cases[k].b, -2, 2, nc, grads & 2)};
                    snprintf(what, sizeof what, "mse case %d reduction %s grads %d nc %d", k,
                             red_name(red), grads, nc);
                    gradcheck_ok(what, gc_mse, &red, 2, in);
                    release_all(2, in);
                }
}

/* The target's gradient is the input's negated; with x as both, both uses
 * reach x and cancel. */
static void test_mse_target_grad(void **state) {
    (void)state;
    double *av, *bv;
    ct_tensor *a = tu_rand(2, (int64_t[]){2, 3}, CT_F64, -2, 2, &av);
    ct_tensor *b = tu_rand(2, (int64_t[]){2, 3}, CT_F64, -2, 2, &bv);
    assert_int_equal(ct_requires_grad_(a, true), CT_OK);
    assert_int_equal(ct_requires_grad_(b, true), CT_OK);
    ct_tensor *l = ct_mse_loss(a, b, CT_REDUCTION_MEAN);
    assert_string_equal(ct_grad_fn_name(l), "MseLossBackward");
    assert_int_equal(ct_backward(l, NULL, false), CT_OK);
    double ga[6], gb[6];
    for (int i = 0; i < 6; i++) {
        ga[i] = 2 * (av[i] - bv[i]) / 6;
        gb[i] = -ga[i];
    }
    check_values(ct_grad(a), ga, 6, 1e-12, 1e-15);
    check_values(ct_grad(b), gb, 6, 1e-12, 1e-15);
    ct_tensor *l2 = ct_mse_loss(a, a, CT_REDUCTION_SUM);
    ct_zero_grad(a);
    assert_int_equal(ct_backward(l2, NULL, false), CT_OK);
    assert_non_null(ct_grad(a));
    double zeros[6] = {0};
    check_values(ct_grad(a), zeros, 6, 0, 0);
    free(av);
    free(bv);
    ct_tensor *all[4] = {a, b, l, l2};
    release_all(4, all);
}

/* ---- embedding ---------------------------------------------------------------------------- */

static ct_tensor *gc_embedding(ct_tensor *const *in, void *v) {
    (void)v;
    return ct_embedding(in[0], in[1]);
}

static void test_embedding_gradcheck(void **state) {
    (void)state;
    char what[160];
    /* Indices drawn from fewer rows than the table has: repeats, and rows
     * nobody looks up (their gradient is zero). */
    const shp ishapes[] = {SHP(2, 5), SHP(7), SHP0, SHP(2, 1, 3), SHP(0)};
    for (int k = 0; k < (int)(sizeof ishapes / sizeof ishapes[0]); k++)
        for (int dt = 0; dt < 2; dt++)
            for (int nc = 0; nc < 2; nc++) {
                shp is = ishapes[k];
                int64_t n = tu_numel(is.nd, is.s), v[16];
                for (int64_t i = 0; i < n; i++) v[i] = tu_randint(0, 4);
                if (n > 2) v[n - 1] = v[0]; /* at least one repeat */
                ct_tensor *idx = ints(v, is, dt ? CT_I32 : CT_I64);
                if (nc) {
                    ct_tensor *t = tu_noncontig(idx);
                    ct_tensor_release(idx);
                    idx = t;
                }
                ct_tensor *in[2] = {leaf((shp)SHP(6, 3), -1, 1, nc), idx};
                snprintf(what, sizeof what, "embedding indices case %d %s nc %d", k,
                         dt ? "int32" : "int64", nc);
                gradcheck_ok(what, gc_embedding, NULL, 2, in);
                release_all(2, in);
            }
}

/* Every lookup adds its gradient row into the table's row: with ones, each
 * row's gradient is the number of times it was looked up. */
static void test_embedding_counts(void **state) {
    (void)state;
    const int64_t V = 5, D = 2;
    int64_t v[6] = {1, 3, 1, 1, 0, 3};
    ct_tensor *w = leaf((shp)SHP(5, 2), -1, 1, false);
    ct_tensor *idx = ints(v, (shp)SHP(2, 3), CT_I64);
    ct_tensor *y = ct_embedding(w, idx);
    assert_string_equal(ct_grad_fn_name(y), "EmbeddingBackward");
    assert_false(ct_requires_grad(idx));
    backward_ones(y);
    double ref[10] = {0};
    for (int i = 0; i < 6; i++)
        for (int64_t d = 0; d < D; d++) ref[v[i] * D + d] += 1;
    check_values(ct_grad(w), ref, V * D, 0, 0);
    ct_tensor *all[3] = {w, idx, y};
    release_all(3, all);
}

/* ---- dropout ----------------------------------------------------------------------------- */

typedef struct dctx {
    double p;
    bool train;
    bool want_mask;
    ct_generator *gen;
    uint64_t seed;
} dctx;

/* Seeds the generator on every call so each evaluation draws the same mask. */
static ct_tensor *gc_dropout(ct_tensor *const *in, void *v) {
    const dctx *c = v;
    ct_generator_set_seed(c->gen, c->seed);
    ct_tensor *m = NULL;
    ct_tensor *y = ct_dropout(in[0], c->p, c->train, c->gen, c->want_mask ? &m : NULL);
    ct_tensor_release(m);
    return y;
}

static void test_dropout_gradcheck(void **state) {
    (void)state;
    char what[160];
    ct_generator *gen = ct_generator_new(1);
    assert_non_null(gen);
    const double ps[] = {0.0, 0.2, 0.5, 1.0};
    const shp shapes[] = {SHP(4, 5), SHP(3, 2, 2), SHP0};
    for (int k = 0; k < 3; k++)
        for (int pi = 0; pi < 4; pi++)
            for (int train = 0; train < 2; train++)
                for (int wm = 0; wm < 2; wm++)
                    for (int nc = 0; nc < 2; nc++) {
                        dctx c = {ps[pi], train, wm, gen, tu_next()};
                        ct_tensor *x = leaf(shapes[k], -2, 2, nc);
                        snprintf(what, sizeof what, "dropout shape %d p %g train %d mask %d nc %d",
                                 k, c.p, train, wm, nc);
                        gradcheck_ok(what, gc_dropout, &c, 1, &x);
                        ct_tensor_release(x);
                    }
    ct_generator_free(gen);
}

/* The gradient is mask / (1 - p), with the mask drawn internally when the
 * caller asks for none; the same seed gives the caller the same mask. */
static void test_dropout_mask(void **state) {
    (void)state;
    const double p = 0.4;
    const int64_t n = 200;
    ct_generator *gen = ct_generator_new(77);
    ct_tensor *x = leaf((shp)SHP(10, 20), -1, 1, false);
    ct_tensor *y = ct_dropout(x, p, true, gen, NULL);
    assert_non_null(y);
    assert_string_equal(ct_grad_fn_name(y), "DropoutBackward");
    backward_ones(y);
    ct_generator_set_seed(gen, 77);
    ct_tensor *m = NULL;
    bool prev = ct_no_grad_begin();
    ct_tensor *y2 = ct_dropout(x, p, true, gen, &m);
    ct_no_grad_end(prev);
    assert_non_null(m);
    assert_false(ct_requires_grad(y2));
    double *mv = tu_values(m), ref[200];
    int kept = 0;
    for (int64_t i = 0; i < n; i++) {
        ref[i] = mv[i] ? 1 / (1 - p) : 0;
        kept += mv[i] != 0;
    }
    assert_true(kept > 0 && kept < n);
    check_values(ct_grad(x), ref, n, 1e-15, 0);
    free(mv);
    ct_tensor *all[4] = {x, y, y2, m};
    release_all(4, all);
    ct_generator_free(gen);
}

/* ---- composed models ---------------------------------------------------------------------- */

typedef struct mctx {
    ct_tensor *idx, *target;
    ct_generator *gen;
    ct_tensor *class_w; /* constant class weights of the cross-entropy */
} mctx;

/* embedding -> rms_norm -> softmax -> nll_loss (mean). in: table, rms weight. */
static ct_tensor *gc_model1(ct_tensor *const *in, void *v) {
    const mctx *c = v;
    int64_t D = ct_tensor_shape(in[0])[1];
    ct_tensor *e = ct_embedding(in[0], c->idx);
    ct_tensor *h = ct_rms_norm(e, 1, &D, in[1], 1e-6, NULL);
    ct_tensor *p = ct_softmax(h, 1);
    ct_tensor *l = ct_nll_loss(p, c->target, NULL, CT_REDUCTION_MEAN, -100);
    ct_tensor_release(e);
    ct_tensor_release(h);
    ct_tensor_release(p);
    return l;
}

/* embedding -> layer_norm -> dropout -> log_softmax -> cross_entropy with
 * class weights (sum) + mse against the bias. in: table, ln weight, ln bias. */
static ct_tensor *gc_model2(ct_tensor *const *in, void *v) {
    const mctx *c = v;
    int64_t D = ct_tensor_shape(in[0])[1];
    ct_generator_set_seed(c->gen, 5);
    ct_tensor *e = ct_embedding(in[0], c->idx);
    ct_tensor *h = ct_layer_norm(e, 1, &D, in[1], in[2], 1e-5, NULL, NULL);
    ct_tensor *d = ct_dropout(h, 0.25, true, c->gen, NULL);
    ct_tensor *lp = ct_log_softmax(d, -1);
    ct_tensor *l1 = ct_cross_entropy(lp, c->target, c->class_w, CT_REDUCTION_SUM, 1, 0.1);
    ct_tensor *l2 = ct_mse_loss(d, in[2], CT_REDUCTION_MEAN);
    ct_tensor *l = ct_add(l1, l2);
    ct_tensor *tmp[6] = {e, h, d, lp, l1, l2};
    release_all(6, tmp);
    return l;
}

static void test_composed_models(void **state) {
    (void)state;
    const int64_t V = 7, D = 5, N = 6;
    int64_t iv[6], tv[6];
    for (int i = 0; i < N; i++) {
        iv[i] = tu_randint(0, V);
        tv[i] = tu_randint(0, D);
    }
    iv[N - 1] = iv[0];
    mctx c = {ints(iv, (shp)SHP(6), CT_I64), ints(tv, (shp)SHP(6), CT_I64), ct_generator_new(3),
              rand64((shp)SHP(5), 0.5, 2, false, false)};
    ct_tensor *in[3] = {leaf((shp)SHP(7, 5), -2, 2, false), leaf((shp)SHP(5), 0.5, 1.5, false),
                        leaf((shp)SHP(5), -0.5, 0.5, false)};
    gradcheck_ok("embedding -> rms_norm -> softmax -> nll", gc_model1, &c, 2, in);
    gradcheck_ok("embedding -> layer_norm -> dropout -> log_softmax -> cross_entropy + mse",
                 gc_model2, &c, 3, in);
    release_all(3, in);
    ct_tensor_release(c.idx);
    ct_tensor_release(c.target);
    ct_tensor_release(c.class_w);
    ct_generator_free(c.gen);
}

/* ---- engine interplay ---------------------------------------------------------------------- */

/* Two backward calls accumulate into .grad. */
static void test_accumulate(void **state) {
    (void)state;
    double *xv;
    ct_tensor *x = tu_rand(2, (int64_t[]){2, 3}, CT_F64, -1, 1, &xv);
    ct_tensor *t = rand64((shp)SHP(2, 3), -1, 1, false, false);
    double *tv = tu_values(t);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    for (int k = 0; k < 2; k++) {
        ct_tensor *l = ct_mse_loss(x, t, CT_REDUCTION_SUM);
        assert_int_equal(ct_backward(l, NULL, false), CT_OK);
        ct_tensor_release(l);
    }
    double ref[6];
    for (int i = 0; i < 6; i++) ref[i] = 4 * (xv[i] - tv[i]);
    check_values(ct_grad(x), ref, 6, 1e-12, 1e-15);
    free(xv);
    free(tv);
    ct_tensor_release(x);
    ct_tensor_release(t);
}

/* No recording in no-grad mode, nor when no input requires grad. */
static void test_no_grad_mode(void **state) {
    (void)state;
    ct_tensor *x = leaf((shp)SHP(3, 4), -1, 1, false);
    ct_tensor *c = rand64((shp)SHP(3, 4), -1, 1, false, false);
    int64_t tv[3] = {0, 1, 2};
    ct_tensor *t = ints(tv, (shp)SHP(3), CT_I64);
    ct_tensor *outs[16];
    int n = 0;
    bool prev = ct_no_grad_begin();
    outs[n++] = ct_rms_norm(x, 1, (int64_t[]){4}, NULL, 1e-5, NULL);
    outs[n++] = ct_layer_norm(x, 1, (int64_t[]){4}, NULL, NULL, 1e-5, NULL, NULL);
    outs[n++] = ct_softmax(x, 0);
    outs[n++] = ct_log_softmax(x, 1);
    outs[n++] = ct_cross_entropy(x, t, NULL, CT_REDUCTION_MEAN, -100, 0.0);
    outs[n++] = ct_nll_loss(x, t, NULL, CT_REDUCTION_MEAN, -100);
    outs[n++] = ct_mse_loss(x, c, CT_REDUCTION_MEAN);
    outs[n++] = ct_embedding(x, t);
    outs[n++] = ct_dropout(x, 0.5, true, NULL, NULL);
    outs[n++] = ct_dropout(x, 0.5, false, NULL, NULL);
    ct_no_grad_end(prev);
    outs[n++] = ct_softmax(c, 0);
    outs[n++] = ct_mse_loss(c, c, CT_REDUCTION_SUM);
    outs[n++] = ct_dropout(c, 0.5, true, NULL, NULL);
    for (int i = 0; i < n; i++) {
        assert_non_null(outs[i]);
        assert_false(ct_requires_grad(outs[i]));
        assert_null(ct_grad_fn_name(outs[i]));
    }
    release_all(n, outs);
    ct_tensor *all[3] = {x, c, t};
    release_all(3, all);
}

/* The identity dropout (eval mode, p = 0) still passes the gradient on. */
static void test_dropout_identity(void **state) {
    (void)state;
    ct_tensor *x = leaf((shp)SHP(2, 3), -1, 1, false);
    ct_tensor *m = x; /* must be set to NULL */
    ct_tensor *y = ct_dropout(x, 0.3, false, NULL, &m);
    assert_null(m);
    assert_string_equal(ct_grad_fn_name(y), "DropoutBackward");
    backward_ones(y);
    double ones[6] = {1, 1, 1, 1, 1, 1};
    check_values(ct_grad(x), ones, 6, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

/* float32/float16/bfloat16 leaves get gradients of their dtype, close to
 * the float64 ones. */
typedef ct_tensor *(*op1_fn)(ct_tensor *x, ct_tensor *aux);

static ct_tensor *op_rms(ct_tensor *x, ct_tensor *aux) {
    (void)aux;
    return ct_rms_norm(x, 1, (int64_t[]){8}, NULL, 1e-5, NULL);
}
static ct_tensor *op_ln(ct_tensor *x, ct_tensor *aux) {
    (void)aux;
    return ct_layer_norm(x, 2, (int64_t[]){4, 8}, NULL, NULL, 1e-5, NULL, NULL);
}
static ct_tensor *op_softmax(ct_tensor *x, ct_tensor *aux) {
    (void)aux;
    return ct_softmax(x, 1);
}
static ct_tensor *op_log_softmax(ct_tensor *x, ct_tensor *aux) {
    (void)aux;
    return ct_log_softmax(x, 2);
}
static ct_tensor *op_ce(ct_tensor *x, ct_tensor *aux) {
    return ct_cross_entropy(x, aux, NULL, CT_REDUCTION_MEAN, -100, 0.1);
}
static ct_tensor *op_nll(ct_tensor *x, ct_tensor *aux) {
    return ct_nll_loss(x, aux, NULL, CT_REDUCTION_SUM, -100);
}
static ct_tensor *op_mse(ct_tensor *x, ct_tensor *aux) {
    (void)aux;
    ct_tensor *z = ct_tensor_zeros(0, NULL, ct_tensor_dtype(x), ct_tensor_device(x));
    ct_tensor *l = ct_mse_loss(x, z, CT_REDUCTION_MEAN);
    ct_tensor_release(z);
    return l;
}
static ct_tensor *op_emb(ct_tensor *x, ct_tensor *aux) {
    ct_tensor *i = ct_view(aux, 1, (int64_t[]){-1});
    ct_tensor *x2 = ct_view(x, 2, (int64_t[]){8, 8});
    ct_tensor *y = ct_embedding(x2, i);
    ct_tensor_release(i);
    ct_tensor_release(x2);
    return y;
}
static ct_tensor *op_dropout(ct_tensor *x, ct_tensor *aux) {
    (void)aux;
    ct_generator *g = ct_generator_new(9);
    ct_tensor *y = ct_dropout(x, 0.5, true, g, NULL);
    ct_generator_free(g);
    return y;
}

static void test_reduced_precision(void **state) {
    (void)state;
    const op1_fn ops[] = {op_rms, op_ln, op_softmax, op_log_softmax, op_ce, op_nll, op_mse,
                          op_emb, op_dropout};
    const char *names[] = {"rms_norm", "layer_norm", "softmax", "log_softmax", "cross_entropy",
                           "nll_loss", "mse", "embedding", "dropout"};
    int64_t shape[3] = {2, 4, 8};
    double *xv = tu_rand_vals(64, CT_BF16, -2, 2); /* exact in every dtype */
    double *gv = tu_rand_vals(128, CT_BF16, -1, 1); /* the largest output: embedding's */
    int64_t tv[16];
    for (int i = 0; i < 16; i++) tv[i] = tu_randint(0, 4);
    ct_tensor *t = ints(tv, (shp)SHP(2, 8), CT_I64);
    for (int k = 0; k < (int)(sizeof ops / sizeof ops[0]); k++) {
        double *ref = NULL;
        for (int d = 0; d < 4; d++) {
            ct_dtype dt = d == 0 ? CT_F64 : tu_float_dtypes[d == 1 ? 0 : d];
            ct_tensor *x = tu_from_f64(xv, 3, shape, dt);
            assert_int_equal(ct_requires_grad_(x, true), CT_OK);
            ct_tensor *y = ops[k](x, t);
            if (!y) fprintf(stderr, "%s %s: %s\n", names[k], ct_dtype_name(dt), ct_last_error());
            assert_non_null(y);
            assert_int_equal(ct_tensor_dtype(y), dt);
            ct_tensor *g = tu_from_f64(gv, ct_tensor_ndim(y), ct_tensor_shape(y), dt);
            ct_status st = ct_backward(y, g, false);
            if (st != CT_OK)
                fprintf(stderr, "%s %s: %s\n", names[k], ct_dtype_name(dt), ct_last_error());
            assert_int_equal(st, CT_OK);
            ct_tensor *gx = ct_grad(x);
            assert_non_null(gx);
            assert_int_equal(ct_tensor_dtype(gx), dt);
            if (d == 0) {
                ref = tu_values(gx);
            } else {
                double *v = tu_values(gx), amax = 0;
                for (int i = 0; i < 64; i++) amax = fmax(amax, fabs(ref[i]));
                double tol = dt == CT_F32 ? 1e-5 : dt == CT_F16 ? 4e-3 : 3e-2;
                for (int i = 0; i < 64; i++)
                    if (fabs(v[i] - ref[i]) > tol * (amax + fabs(ref[i]))) {
                        fprintf(stderr, "%s %s element %d: %g vs %g\n", names[k],
                                ct_dtype_name(dt), i, v[i], ref[i]);
                        fail();
                    }
                free(v);
            }
            ct_tensor *all[3] = {x, y, g};
            release_all(3, all);
        }
        free(ref);
    }
    free(xv);
    free(gv);
    ct_tensor_release(t);
}

/* A saved tensor changed in place after the forward is caught at backward. */
static void test_saved_modified(void **state) {
    (void)state;
    ct_tensor *x = leaf((shp)SHP(3, 4), -1, 1, false);
    ct_tensor *m = NULL;
    ct_tensor *y = ct_dropout(x, 0.5, true, NULL, &m);
    assert_non_null(m);
    assert_false(ct_requires_grad(m));
    assert_int_equal(ct_fill_(m, 1), CT_OK);
    ct_tensor *g = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, g, false), CT_ERR_AUTOGRAD, "DropoutBackward",
                    "modified by an in-place");
    ct_tensor *s = ct_softmax(x, 1);
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(s, 2.0), CT_OK);
    ct_no_grad_end(prev);
    tu_assert_error(ct_backward(s, g, false), CT_ERR_AUTOGRAD, "SoftmaxBackward", "in-place");
    assert_null(ct_grad(x));
    /* The retained graph can be walked twice; a freed one cannot. */
    ct_tensor *r = ct_rms_norm(x, 1, (int64_t[]){4}, NULL, 1e-5, NULL);
    assert_int_equal(ct_backward(r, g, true), CT_OK);
    assert_int_equal(ct_backward(r, g, false), CT_OK);
    tu_assert_error(ct_backward(r, g, false), CT_ERR_AUTOGRAD, "second time");
    ct_tensor *all[6] = {x, m, y, g, s, r};
    release_all(6, all);
}

/* A failing op leaves no graph, no output and no leak, the leaf unchanged. */
static void test_bad_inputs(void **state) {
    (void)state;
    ct_tensor *x = leaf((shp)SHP(3, 4), -1, 1, false);
    ct_tensor *w = leaf((shp)SHP(5), -1, 1, false);
    ct_tensor *ft = rand64((shp)SHP(3), 0, 3, false, false);
    int64_t tv[3] = {0, 1, 2};
    ct_tensor *t = ints(tv, (shp)SHP(3), CT_I64);
    ct_tensor *t2 = ints(tv, (shp)SHP(2), CT_I64);
    ct_tensor *inv = (ct_tensor *)0x1, *mean = (ct_tensor *)0x1, *mask = (ct_tensor *)0x1;
    tu_assert_null_error(ct_rms_norm(x, 1, (int64_t[]){5}, NULL, 1e-5, &inv), CT_ERR_SHAPE,
                         "ct_rms_norm", "normalized_shape");
    assert_ptr_equal(inv, (ct_tensor *)0x1);
    tu_assert_null_error(ct_rms_norm(x, 1, (int64_t[]){4}, w, 1e-5, NULL), CT_ERR_SHAPE,
                         "ct_rms_norm", "weight");
    tu_assert_null_error(ct_layer_norm(x, 1, (int64_t[]){4}, NULL, w, 1e-5, &mean, NULL),
                         CT_ERR_SHAPE, "ct_layer_norm", "bias");
    assert_ptr_equal(mean, (ct_tensor *)0x1);
    tu_assert_null_error(ct_softmax(x, 2), CT_ERR_INDEX, "ct_softmax", "dim 2");
    tu_assert_null_error(ct_log_softmax(x, -3), CT_ERR_INDEX, "ct_log_softmax", "dim -3");
    tu_assert_null_error(ct_cross_entropy(x, ft, NULL, CT_REDUCTION_MEAN, -100, 0), CT_ERR_DTYPE,
                         "ct_cross_entropy", "int64");
    tu_assert_null_error(ct_cross_entropy(x, t, NULL, CT_REDUCTION_MEAN, -100, 1.5),
                         CT_ERR_INVALID_ARG, "label_smoothing");
    tu_assert_null_error(ct_nll_loss(x, t2, NULL, CT_REDUCTION_MEAN, -100), CT_ERR_SHAPE,
                         "ct_nll_loss", "target");
    tu_assert_null_error(ct_nll_loss(x, t, w, CT_REDUCTION_MEAN, -100), CT_ERR_SHAPE,
                         "ct_nll_loss", "weight");
    tu_assert_null_error(ct_mse_loss(x, w, CT_REDUCTION_MEAN), CT_ERR_SHAPE, "ct_mse_loss");
    tu_assert_null_error(ct_mse_loss(x, x, (ct_reduction)7), CT_ERR_INVALID_ARG, "reduction");
    tu_assert_null_error(ct_embedding(x, ft), CT_ERR_DTYPE, "ct_embedding", "indices");
    tu_assert_null_error(ct_embedding(w, t), CT_ERR_SHAPE, "ct_embedding", "2-d");
    tu_assert_null_error(ct_dropout(x, 1.5, true, NULL, &mask), CT_ERR_INVALID_ARG, "ct_dropout",
                         "p");
    assert_ptr_equal(mask, (ct_tensor *)0x1);
    assert_true(ct_is_leaf(x));
    assert_null(ct_grad(x));
    assert_null(ct_grad(w));
    ct_tensor *all[5] = {x, w, ft, t, t2};
    release_all(5, all);
}

/* Many steps of a small model: the graphs are freed each time. */
static void test_memory_loop(void **state) {
    (void)state;
    mctx c = {ints((int64_t[]){0, 2, 2, 1}, (shp)SHP(4), CT_I64),
              ints((int64_t[]){1, 0, 3, 3}, (shp)SHP(4), CT_I64), ct_generator_new(4),
              rand64((shp)SHP(4), 0.5, 2, false, false)};
    ct_tensor *in[3] = {leaf((shp)SHP(3, 4), -1, 1, false), leaf((shp)SHP(4), 0.5, 1.5, false),
                        leaf((shp)SHP(4), -0.5, 0.5, false)};
    cti_alloc_stats before = {0};
    for (int step = 0; step < 20; step++) {
        ct_tensor *l = gc_model2(in, &c);
        assert_non_null(l);
        assert_int_equal(ct_backward(l, NULL, false), CT_OK);
        ct_tensor_release(l);
        for (int k = 0; k < 3; k++) ct_zero_grad(in[k]);
        if (step == 1) before = cti_get_alloc_stats();
    }
    assert_true(same_stats(before, cti_get_alloc_stats()));
    release_all(3, in);
    ct_tensor_release(c.idx);
    ct_tensor_release(c.target);
    ct_tensor_release(c.class_w);
    ct_generator_free(c.gen);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rms_norm_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layer_norm_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_same_tensor_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rms_norm_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_stats, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_softmax_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nll_loss_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cls_empty_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cls_no_grad_to_weight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mse_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mse_target_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_counts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_mask, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_identity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_composed_models, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accumulate, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_grad_mode, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduced_precision, setup, teardown),
        cmocka_unit_test_setup_teardown(test_saved_modified, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory_loop, setup, teardown),
    };
    return tu_run_tests(tests);
}
