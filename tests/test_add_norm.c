/* The residual add fused with a norm (ct_add_rms_norm, ct_add_layer_norm)
 * against float64 references written here, on fresh random inputs: the sum
 * x + residual must be x + residual correctly rounded to the promoted dtype S,
 * y the norm of that stored sum rounded once to out_dtype, and the gradients
 * the analytic ones (x and residual both get grad_sum plus the norm's input
 * gradient, each in its own dtype; weight and bias theirs in S). Every S
 * dtype, mixed input dtypes, every out_dtype, an autocast region,
 * non-contiguous views, optional affine parameters, two normalized dims,
 * zero rows and rows of one element; losses that read y, the sum or both;
 * outputs written into poisoned memory; bad inputs with their status and
 * message, leaving *sum as it was.
 *
 * Tolerances are bounds, not fudge factors: a result rounded to dtype t may
 * be off by u(t) = 2^-p of itself, and what the kernel computes in its
 * accumulation dtype (float32, float64 for a float64 sum) by a multiple of
 * that unit roundoff times the magnitudes of the terms it adds, the multiple
 * growing with the length of the sums (sum_depth). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

#define P(...) ((const int64_t[]){__VA_ARGS__})

enum { USE_Y = 1, USE_SUM = 2 }; /* the outputs a case's loss reads */
enum { FROZEN_X = 1, FROZEN_R = 2, FROZEN_WB = 4 }; /* inputs that are no leaves requiring grad */

typedef struct an_case {
    bool layer;                /* add_layer_norm, else add_rms_norm */
    ct_dtype xdt, rdt;         /* x's and residual's dtypes */
    ct_dtype odt;              /* out_dtype; CT_NUM_DTYPES: the sum's */
    int nd, nnorm;
    int64_t shape[4];
    bool nc;                   /* x and residual as transposed views */
    bool has_w, has_b;         /* has_b: layer norm only */
    bool autocast;             /* called inside ct_autocast_begin(CT_CPU, CT_BF16) */
    bool no_sum;               /* sum argument NULL */
    int uses;                  /* USE_Y | USE_SUM; 0: forward only, no leaves */
    int frozen;                /* FROZEN_*: left out of the leaves when uses != 0 */
    double eps;
} an_case;

/* ---- helpers ------------------------------------------------------------------------------ */

/* Half the spacing of dt's subnormals (float64: the spacing, its half being no
 * double): what a rounding below the normal range may lose in absolute terms
 * (float16's starts at 6.1e-5, where normalized outputs of tiny elements fall). */
static double underflow_floor(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 0x1p-1074;
    case CT_F32: return 0x1p-150;
    case CT_F16: return 0x1p-25;
    case CT_BF16: return 0x1p-134;
    default: return 0;
    }
}

static bool is_half(ct_dtype dt) { return dt == CT_F16 || dt == CT_BF16; }

/* The dtype the kernels accumulate in for a sum of dtype s. */
static ct_dtype acc_dtype(ct_dtype s) { return s == CT_F64 ? CT_F64 : CT_F32; }

/* A multiple of the unit roundoff that bounds the error of a sum of n terms
 * relative to the sum of their magnitudes. A serial sum's worst case is n - 1,
 * which rounding errors of random signs do not approach (they grow as
 * sqrt(n)); the kernels' sums over 64 lanes folded pairwise stay within
 * n/64 + 6. Both are below this for every n. */
static double sum_depth(int64_t n) { return 8.0 + (double)n / 16.0; }

/* S: the promoted dtype of x and residual as PyTorch's promotion gives it (two
 * different 16-bit dtypes meet in float32), float32 at least in an autocast
 * region. Written out here rather than asked of the library. */
static ct_dtype sum_dtype_of(ct_dtype a, ct_dtype b, bool autocast) {
    ct_dtype s;
    if (a == CT_F64 || b == CT_F64) s = CT_F64;
    else if (a == CT_F32 || b == CT_F32 || a != b) s = CT_F32;
    else s = a;
    return autocast && is_half(s) ? CT_F32 : s;
}

/* Fills and frees a block of a result's size and dtype with NaN, so that an
 * output the allocator hands back from it and the kernel leaves unwritten
 * fails the comparison. */
static void poison(int nd, const int64_t *shape, ct_dtype dt) {
    if (tu_numel(nd, shape) == 0) return;
    ct_tensor *t = ct_tensor_full(nd, shape, NAN, dt, CT_CPU);
    assert_non_null(t);
    ct_tensor_release(t);
}

/* A random tensor of dt in [lo, hi) (*vals its values, row-major), a
 * transposed view of a larger storage when nc, a leaf requiring grad when rg. */
static ct_tensor *input(int nd, const int64_t *shape, ct_dtype dt, double lo, double hi, bool nc,
                        bool rg, double **vals) {
    ct_tensor *t = tu_rand(nd, shape, dt, lo, hi, vals);
    assert_non_null(t);
    if (nc) {
        ct_tensor *v = tu_noncontig(t);
        ct_tensor_release(t);
        assert_non_null(v);
        if (tu_numel(nd, shape) > 1 && shape[nd - 1] > 1) assert_false(ct_tensor_is_contiguous(v));
        t = v;
    }
    if (rg) assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

static double *alloc_d(int64_t n) {
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    assert_non_null(p);
    return p;
}

/* t (dtype dt, shape nd/shape) against ref: each element within u(dt) of the
 * reference and dt's underflow floor (the final rounding), plus err[i], the
 * bound of what the kernel's arithmetic may add before it; a 16-bit result may
 * be rounded through float32 (as ct_to_dtype converts), one float32 rounding
 * more. */
static void check_result(const char *what, const ct_tensor *t, ct_dtype dt, int nd,
                         const int64_t *shape, const double *ref, const double *err) {
    if (!t) fail_msg("%s: no result (%s)", what, ct_last_error());
    if (ct_tensor_dtype(t) != dt)
        fail_msg("%s: dtype %s, expected %s", what, ct_dtype_name(ct_tensor_dtype(t)),
                 ct_dtype_name(dt));
    check_shape(t, nd, shape);
    int64_t n = tu_numel(nd, shape);
    double *got = tu_values(t);
    double u = tu_unit_roundoff(dt) + (is_half(dt) ? 0x1p-24 : 0.0);
    for (int64_t i = 0; i < n; i++) {
        double e = err ? err[i] : 0.0;
        double tol = u * (fabs(ref[i]) + e) + e + underflow_floor(dt);
        if (!(fabs(got[i] - ref[i]) <= tol)) {
            fprintf(stderr,
                    "%s: element %lld of %lld: got %.17g, expected %.17g (tolerance %.3g)\n", what,
                    (long long)i, (long long)n, got[i], ref[i], tol);
            free(got);
            fail();
        }
    }
    free(got);
}

/* A parameter gradient that a loss without y leaves out: absent or zeros. */
static void check_no_grad(const char *what, const ct_tensor *leaf) {
    ct_tensor *g = ct_grad(leaf);
    if (!g) return;
    int64_t n = ct_tensor_numel(g);
    double *v = tu_values(g);
    for (int64_t i = 0; i < n; i++)
        if (v[i] != 0.0)
            fail_msg("%s: element %lld is %g, expected no gradient", what, (long long)i, v[i]);
    free(v);
}

/* ---- float64 references --------------------------------------------------------------------
 * Rows of d elements of the stored sum s. Each fills its results and the
 * bounds of the kernel's error on them, in units of the accumulation
 * dtype's roundoff uc (multiplied in here). */

typedef struct fwd_ref {
    double *y, *yerr;
    double *inv, *mean, *rstd; /* per row (inv: rms; mean, rstd: layer) */
    double *kappa;             /* per row: how much of the sum's precision s - mean loses */
} fwd_ref;

static fwd_ref fwd_ref_new(int64_t rows, int64_t d) {
    fwd_ref f = {alloc_d(rows * d), alloc_d(rows * d), alloc_d(rows), alloc_d(rows),
                 alloc_d(rows), alloc_d(rows)};
    return f;
}

static void fwd_ref_free(fwd_ref *f) {
    free(f->y), free(f->yerr), free(f->inv), free(f->mean), free(f->rstd), free(f->kappa);
}

/* rms: inv = 1/sqrt(mean(s^2) + eps), y = s * inv * w; y's relative error is
 * that of the sum of squares and a few roundings. */
static void ref_rms_fwd(const double *s, const double *w, int64_t rows, int64_t d, double eps,
                        double uc, fwd_ref *f) {
    for (int64_t r = 0; r < rows; r++) {
        const double *sr = s + r * d;
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += sr[i] * sr[i];
        double inv = 1.0 / sqrt(ss / (double)d + eps);
        f->inv[r] = inv;
        f->kappa[r] = 1;
        for (int64_t i = 0; i < d; i++) {
            double y = sr[i] * inv * (w ? w[i] : 1.0);
            f->y[r * d + i] = y;
            f->yerr[r * d + i] = (sum_depth(d) + 8) * uc * fabs(y);
        }
    }
}

/* layer: mean, rstd = 1/sqrt(mean((s - mean)^2) + eps) (biased), xh = (s -
 * mean) * rstd, y = xh * w + b. s - mean keeps the absolute error of s and of
 * the mean, max|s| times the roundoff: relative to xh ~ 1 that is kappa =
 * max|s| * rstd, which a row of close values makes large. A row of one
 * element is exact: its mean is the element. */
static void ref_ln_fwd(const double *s, const double *w, const double *b, int64_t rows, int64_t d,
                       double eps, double uc, fwd_ref *f) {
    for (int64_t r = 0; r < rows; r++) {
        const double *sr = s + r * d;
        double m = 0, v = 0, mx = 0;
        for (int64_t i = 0; i < d; i++) m += sr[i];
        m /= (double)d;
        for (int64_t i = 0; i < d; i++) {
            v += (sr[i] - m) * (sr[i] - m);
            mx = fabs(sr[i]) > mx ? fabs(sr[i]) : mx;
        }
        double rs = 1.0 / sqrt(v / (double)d + eps);
        double kappa = d == 1 || mx * rs < 1 ? 1 : mx * rs;
        f->mean[r] = m;
        f->rstd[r] = rs;
        f->kappa[r] = kappa;
        for (int64_t i = 0; i < d; i++) {
            double xh = (sr[i] - m) * rs, wi = w ? w[i] : 1.0, bi = b ? b[i] : 0.0;
            f->y[r * d + i] = xh * wi + bi;
            f->yerr[r * d + i] =
                (sum_depth(d) + 8) * uc * (kappa * fabs(wi) * (1 + fabs(xh)) + fabs(bi));
        }
    }
}

typedef struct bwd_ref {
    double *dsum, *dsum_err; /* the gradient of x and of residual */
    double *dw, *dw_err, *db, *db_err;
} bwd_ref;

static bwd_ref bwd_ref_new(int64_t rows, int64_t d) {
    bwd_ref b = {alloc_d(rows * d), alloc_d(rows * d), alloc_d(d), alloc_d(d), alloc_d(d),
                 alloc_d(d)};
    return b;
}

static void bwd_ref_free(bwd_ref *b) {
    free(b->dsum), free(b->dsum_err), free(b->dw), free(b->dw_err), free(b->db), free(b->db_err);
}

/* rms: dx = inv*g*w - s*inv^3*mean(g*w*s), dw = sum_rows g*s*inv. The saved
 * inv carries the forward's relative error, tripled in inv^3. */
static void ref_rms_bwd(const double *g, const double *s, const double *w, const fwd_ref *f,
                        int64_t rows, int64_t d, double uc, bwd_ref *o) {
    double *dwabs = alloc_d(d);
    for (int64_t r = 0; r < rows; r++) {
        const double *sr = s + r * d, *gr = g + r * d;
        double inv = f->inv[r], c = 0, cabs = 0;
        for (int64_t i = 0; i < d; i++) {
            double t = gr[i] * (w ? w[i] : 1.0) * sr[i];
            c += t;
            cabs += fabs(t);
        }
        c /= (double)d;
        cabs /= (double)d;
        for (int64_t i = 0; i < d; i++) {
            double gw = gr[i] * (w ? w[i] : 1.0);
            o->dsum[r * d + i] = inv * gw - sr[i] * inv * inv * inv * c;
            double terms = inv * fabs(gw) + fabs(sr[i]) * inv * inv * inv * cabs;
            o->dsum_err[r * d + i] = (4 * sum_depth(d) + 24) * uc * terms;
            o->dw[i] += gr[i] * sr[i] * inv;
            dwabs[i] += fabs(gr[i] * sr[i] * inv);
        }
    }
    for (int64_t i = 0; i < d; i++)
        o->dw_err[i] = (sum_depth(rows) + sum_depth(d) + 10) * uc * dwabs[i];
    free(dwabs);
}

/* layer: gw = g*w, dx = rstd*(gw - mean(gw) - xh*mean(gw*xh)), dw = sum_rows
 * g*xh, db = sum_rows g. xh carries kappa times the roundoff (see
 * ref_ln_fwd), and mean(gw*xh) the same times mean|gw|. */
static void ref_ln_bwd(const double *g, const double *s, const double *w, const fwd_ref *f,
                       int64_t rows, int64_t d, double uc, bwd_ref *o) {
    double *dwabs = alloc_d(d), *dbabs = alloc_d(d);
    for (int64_t r = 0; r < rows; r++) {
        const double *sr = s + r * d, *gr = g + r * d;
        double m = f->mean[r], rs = f->rstd[r], kappa = f->kappa[r];
        double a = 0, bb = 0, a1 = 0, a2 = 0;
        for (int64_t i = 0; i < d; i++) {
            double gw = gr[i] * (w ? w[i] : 1.0), xh = (sr[i] - m) * rs;
            a += gw;
            bb += gw * xh;
            a1 += fabs(gw);
            a2 += fabs(gw) * (fabs(xh) + kappa);
        }
        a /= (double)d, bb /= (double)d, a1 /= (double)d, a2 /= (double)d;
        for (int64_t i = 0; i < d; i++) {
            double gw = gr[i] * (w ? w[i] : 1.0), xh = (sr[i] - m) * rs;
            o->dsum[r * d + i] = rs * (gw - a - xh * bb);
            double terms = rs * (fabs(gw) + a1 + (fabs(xh) + kappa) * a2);
            o->dsum_err[r * d + i] = (4 * sum_depth(d) + 24) * uc * terms;
            o->dw[i] += gr[i] * xh;
            dwabs[i] += fabs(gr[i]) * (fabs(xh) + kappa);
            o->db[i] += gr[i];
            dbabs[i] += fabs(gr[i]);
        }
    }
    for (int64_t i = 0; i < d; i++) {
        o->dw_err[i] = (sum_depth(rows) + sum_depth(d) + 10) * uc * dwabs[i];
        o->db_err[i] = sum_depth(rows) * uc * dbabs[i];
    }
    free(dwabs);
    free(dbabs);
}

/* ---- one case ------------------------------------------------------------------------------ */

static const char *case_name(const an_case *c, char *buf, size_t n) {
    snprintf(buf, n, "%s x %s + residual %s -> %s%s%s%s [%lld rows]",
             c->layer ? "add_layer_norm" : "add_rms_norm", ct_dtype_name(c->xdt),
             ct_dtype_name(c->rdt),
             c->odt == CT_NUM_DTYPES ? "(sum's)" : ct_dtype_name(c->odt), c->nc ? " nc" : "",
             c->autocast ? " autocast" : "", c->has_w ? "" : " no-weight",
             (long long)tu_numel(c->nd - c->nnorm, c->shape));
    return buf;
}

static ct_tensor *call_op(const an_case *c, ct_tensor *x, ct_tensor *r, ct_tensor *w,
                          ct_tensor *b, ct_tensor **sum) {
    const int64_t *ns = c->shape + (c->nd - c->nnorm);
    return c->layer ? ct_add_layer_norm(x, r, c->nnorm, ns, w, b, c->eps, c->odt, sum)
                    : ct_add_rms_norm(x, r, c->nnorm, ns, w, c->eps, c->odt, sum);
}

/* sum(a * g) as a new scalar; the intermediate released. */
static ct_tensor *dot_loss(ct_tensor *a, ct_tensor *g) {
    ct_tensor *p = ct_mul(a, g);
    assert_non_null(p);
    ct_tensor *l = ct_sum(p, CT_NONE, false);
    assert_non_null(l);
    ct_tensor_release(p);
    return l;
}

/* The weight's and the bias's gradients: none for inputs that are no leaves,
 * the reference's when the loss reads y, else none or zeros. */
static void check_params(const an_case *c, const char *name, ct_tensor *w, ct_tensor *b,
                         const bwd_ref *o) {
    ct_dtype sdt = sum_dtype_of(c->xdt, c->rdt, c->autocast);
    const int64_t *ns = c->shape + (c->nd - c->nnorm);
    char what[320];
    if (c->frozen & FROZEN_WB) {
        if (w) assert_null(ct_grad(w));
        if (b) assert_null(ct_grad(b));
        return;
    }
    if (w) {
        snprintf(what, sizeof what, "%s: grad weight", name);
        if (c->uses & USE_Y) check_result(what, ct_grad(w), sdt, c->nnorm, ns, o->dw, o->dw_err);
        else check_no_grad(what, w);
    }
    if (b) {
        snprintf(what, sizeof what, "%s: grad bias", name);
        if (c->uses & USE_Y) check_result(what, ct_grad(b), sdt, c->nnorm, ns, o->db, o->db_err);
        else check_no_grad(what, b);
    }
}

/* The loss the case reads (sum(y * gy) + sum(sum * gs), or one of the two),
 * its backward, and the gradients of every leaf against the reference. gy has
 * y's dtype and gs the sum's, so the gradients reaching the node are exactly
 * their values. */
static void check_backward(const an_case *c, const char *name, ct_tensor *x, ct_tensor *r,
                           ct_tensor *w, ct_tensor *b, ct_tensor *y, ct_tensor *s,
                           const double *sv, const double *wv, const fwd_ref *f) {
    ct_dtype sdt = sum_dtype_of(c->xdt, c->rdt, c->autocast);
    ct_dtype ydt = c->odt == CT_NUM_DTYPES ? sdt : c->odt;
    int lead = c->nd - c->nnorm;
    const int64_t *ns = c->shape + lead;
    int64_t rows = tu_numel(lead, c->shape), d = tu_numel(c->nnorm, ns), n = rows * d;
    double uc = tu_unit_roundoff(acc_dtype(sdt));
    char what[320];

    double *gyv = NULL, *gsv = NULL;
    ct_tensor *gy = tu_rand(c->nd, c->shape, ydt, -1, 1, &gyv);
    ct_tensor *gs = tu_rand(c->nd, c->shape, sdt, -1, 1, &gsv);
    ct_tensor *loss = NULL;
    if (c->uses & USE_Y) loss = dot_loss(y, gy);
    if (c->uses & USE_SUM) {
        ct_tensor *ls = dot_loss(s, gs);
        if (loss) {
            ct_tensor *t = ct_add(loss, ls);
            assert_non_null(t);
            ct_tensor_release(loss);
            ct_tensor_release(ls);
            loss = t;
        } else {
            loss = ls;
        }
    }
    poison(c->nd, c->shape, c->xdt);
    poison(c->nd, c->shape, c->rdt);
    poison(c->nnorm, ns, sdt);
    ct_status st = ct_backward(loss, NULL, false);
    if (st != CT_OK) fail_msg("%s: backward: %s", name, ct_last_error());

    bwd_ref o = bwd_ref_new(rows, d);
    if (c->uses & USE_Y) {
        if (c->layer) ref_ln_bwd(gyv, sv, wv, f, rows, d, uc, &o);
        else ref_rms_bwd(gyv, sv, wv, f, rows, d, uc, &o);
    }
    if (c->uses & USE_SUM)
        for (int64_t i = 0; i < n; i++) {
            o.dsum[i] += gsv[i];
            /* the add of grad_sum in the accumulation dtype, when there is one */
            if (c->uses & USE_Y) o.dsum_err[i] += 2 * uc * (fabs(o.dsum[i]) + fabs(gsv[i]));
        }
    snprintf(what, sizeof what, "%s: grad x", name);
    if (c->frozen & FROZEN_X) assert_null(ct_grad(x));
    else check_result(what, ct_grad(x), c->xdt, c->nd, c->shape, o.dsum, o.dsum_err);
    snprintf(what, sizeof what, "%s: grad residual", name);
    if (c->frozen & FROZEN_R) assert_null(ct_grad(r));
    else check_result(what, ct_grad(r), c->rdt, c->nd, c->shape, o.dsum, o.dsum_err);
    check_params(c, name, w, b, &o);
    bwd_ref_free(&o);
    free(gyv);
    free(gsv);
    ct_tensor_release(gy);
    ct_tensor_release(gs);
    ct_tensor_release(loss);
}

static void run_case(const an_case *c) {
    char name[256];
    case_name(c, name, sizeof name);
    ct_dtype sdt = sum_dtype_of(c->xdt, c->rdt, c->autocast);
    ct_dtype ydt = c->odt == CT_NUM_DTYPES ? sdt : c->odt;
    int lead = c->nd - c->nnorm;
    const int64_t *ns = c->shape + lead;
    int64_t rows = tu_numel(lead, c->shape), d = tu_numel(c->nnorm, ns), n = rows * d;
    bool rg = c->uses != 0;
    bool rgx = rg && !(c->frozen & FROZEN_X), rgr = rg && !(c->frozen & FROZEN_R);
    bool rgp = rg && !(c->frozen & FROZEN_WB);
    double uc = tu_unit_roundoff(acc_dtype(sdt));

    double *xv, *rv, *wv = NULL, *bv = NULL;
    ct_tensor *x = input(c->nd, c->shape, c->xdt, -2, 3, c->nc, rgx, &xv);
    ct_tensor *r = input(c->nd, c->shape, c->rdt, -1, 1, c->nc, rgr, &rv);
    ct_tensor *w = c->has_w ? input(c->nnorm, ns, sdt, 0.5, 1.5, false, rgp, &wv) : NULL;
    ct_tensor *b = c->layer && c->has_b ? input(c->nnorm, ns, sdt, -1, 1, false, rgp, &bv) : NULL;
    rg = rgx || rgr || (rgp && (w || b)); /* a node only where some input is a leaf */

    poison(c->nd, c->shape, ydt);
    poison(c->nd, c->shape, sdt);
    if (c->autocast) assert_int_equal(ct_autocast_begin(CT_CPU, CT_BF16), CT_OK);
    ct_tensor *s = NULL;
    ct_tensor *y = call_op(c, x, r, w, b, c->no_sum ? NULL : &s);
    if (c->autocast) assert_int_equal(ct_autocast_end(), CT_OK);
    if (!y) fail_msg("%s: %s", name, ct_last_error());

    /* the sum: x + residual correctly rounded to S. Their float64 sum is exact
     * for inputs of at most 24 significant bits in [-2, 3), and is the correctly
     * rounded one itself when S is float64. */
    double *sref = alloc_d(n), *serr = alloc_d(n);
    for (int64_t i = 0; i < n; i++) {
        sref[i] = xv[i] + rv[i];
        serr[i] = 0;
    }
    double *sv;
    char what[300];
    if (c->no_sum) {
        assert_null(s);
        sv = alloc_d(n);
        for (int64_t i = 0; i < n; i++) sv[i] = tu_round(sref[i], sdt);
    } else {
        snprintf(what, sizeof what, "%s: sum", name);
        check_result(what, s, sdt, c->nd, c->shape, sref, serr);
        sv = tu_values(s);
        assert_int_equal(ct_requires_grad(s), rg);
    }
    assert_int_equal(ct_requires_grad(y), rg);
    if (rg)
        assert_string_equal(ct_grad_fn_name(y),
                            c->layer ? "AddLayerNormBackward" : "AddRmsNormBackward");

    /* y: the norm of the sum as stored */
    fwd_ref f = fwd_ref_new(rows, d);
    if (c->layer) ref_ln_fwd(sv, wv, bv, rows, d, c->eps, uc, &f);
    else ref_rms_fwd(sv, wv, rows, d, c->eps, uc, &f);
    snprintf(what, sizeof what, "%s: y", name);
    check_result(what, y, ydt, c->nd, c->shape, f.y, f.yerr);

    if (rg) check_backward(c, name, x, r, w, b, y, s, sv, wv, &f);

    fwd_ref_free(&f);
    free(sref), free(serr), free(sv), free(xv), free(rv), free(wv), free(bv);
    ct_tensor *ts[] = {x, r, w, b, y, s};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

/* Both ops of a case. */
static void run_both(an_case c) {
    c.layer = false;
    run_case(&c);
    c.layer = true;
    run_case(&c);
}

/* A random [lead..., d] shape: nlead leading dims of 1..5, d in [dlo, dhi]. */
static void rand_rows(an_case *c, int nlead, int64_t dlo, int64_t dhi) {
    c->nd = nlead + 1;
    c->nnorm = 1;
    for (int i = 0; i < nlead; i++) c->shape[i] = tu_randint(1, 6);
    c->shape[nlead] = tu_randint(dlo, dhi + 1);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Every S dtype with x and residual of it: contiguous and transposed views,
 * with and without the affine parameters, rows of lengths that do and do not
 * fill the kernels' vectors, eps small and large. */
static void test_each_sum_dtype(void **state) {
    ct_dtype dt = tu_dtype_of(state);
    for (int it = 0; it < 8; it++) {
        an_case c = {.xdt = dt, .rdt = dt, .odt = CT_NUM_DTYPES, .nc = it & 1,
                     .has_w = (it & 2) == 0, .has_b = (it & 4) == 0, .uses = USE_Y | USE_SUM,
                     .eps = it & 4 ? 1e-2 : 1e-5};
        rand_rows(&c, 1 + it % 2, it < 4 ? 2 : 65, it < 4 ? 64 : 300);
        run_both(c);
    }
}

/* x and residual of different dtypes, and out_dtypes other than the sum's. */
static void test_mixed_dtypes(void **state) {
    (void)state;
    static const struct {
        ct_dtype x, r, out;
    } rows[] = {
        {CT_F32, CT_BF16, CT_BF16},        /* the pre-norm block under bf16 weights */
        {CT_F32, CT_BF16, CT_NUM_DTYPES},  /* S float32 */
        {CT_BF16, CT_F32, CT_F32},
        {CT_F16, CT_BF16, CT_NUM_DTYPES},  /* two 16-bit dtypes meet in float32 */
        {CT_F16, CT_BF16, CT_F16},
        {CT_F32, CT_F64, CT_F32},          /* S float64, a narrower y */
        {CT_BF16, CT_BF16, CT_F32},        /* y from the bf16 sum as stored, kept in float32 */
        {CT_F64, CT_F64, CT_BF16},
    };
    for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++)
        for (int nc = 0; nc < 2; nc++) {
            an_case c = {.xdt = rows[k].x, .rdt = rows[k].r, .odt = rows[k].out, .nc = nc,
                         .has_w = true, .has_b = true, .uses = USE_Y | USE_SUM, .eps = 1e-5};
            rand_rows(&c, 1, 3, 150);
            run_both(c);
        }
}

/* y in float64 from a narrower sum: its gradient reaches the node in float64. */
static void test_float64_out(void **state) {
    (void)state;
    static const ct_dtype sums[] = {CT_F32, CT_F16, CT_BF16};
    for (size_t k = 0; k < 3; k++)
        for (int uses = USE_Y; uses <= (USE_Y | USE_SUM); uses += USE_SUM) {
            an_case c = {.xdt = sums[k], .rdt = sums[k], .odt = CT_F64, .has_w = true,
                         .has_b = true, .uses = uses, .eps = 1e-5};
            rand_rows(&c, 1, 3, 150);
            run_both(c);
        }
}

/* bfloat16 x and residual inside a CPU bfloat16 autocast region: the sum is
 * float32 (norms run in float32 there), and so are weight and bias; y in
 * float32 or in the bfloat16 the next matmul reads. */
static void test_autocast(void **state) {
    (void)state;
    for (int k = 0; k < 4; k++) {
        an_case c = {.xdt = CT_BF16, .rdt = CT_BF16, .odt = k & 1 ? CT_BF16 : CT_NUM_DTYPES,
                     .nc = k >= 2, .has_w = true, .has_b = true, .autocast = true,
                     .uses = USE_Y | USE_SUM, .eps = 1e-5};
        rand_rows(&c, 2, 8, 96);
        run_both(c);
    }
    /* the sum's dtype itself, asked directly */
    ct_tensor *x = tu_rand(2, P(3, 8), CT_BF16, -1, 1, NULL);
    ct_tensor *r = tu_rand(2, P(3, 8), CT_BF16, -1, 1, NULL);
    ct_tensor *w = tu_rand(1, P(8), CT_F32, 0.5, 1.5, NULL);
    ct_tensor *s = NULL, *s2 = NULL;
    assert_int_equal(ct_autocast_begin(CT_CPU, CT_BF16), CT_OK);
    ct_tensor *y = ct_add_rms_norm(x, r, 1, P(8), w, 1e-5, CT_NUM_DTYPES, &s);
    ct_tensor *y2 = ct_add_layer_norm(x, r, 1, P(8), w, w, 1e-5, CT_BF16, &s2);
    assert_int_equal(ct_autocast_end(), CT_OK);
    assert_non_null(y);
    assert_non_null(y2);
    assert_int_equal(ct_tensor_dtype(s), CT_F32);
    assert_int_equal(ct_tensor_dtype(y), CT_F32);
    assert_int_equal(ct_tensor_dtype(s2), CT_F32);
    assert_int_equal(ct_tensor_dtype(y2), CT_BF16);
    ct_tensor *ts[] = {x, r, w, s, s2, y, y2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

/* Two normalized dims, rows of one element, no rows, more leading dims, the
 * affine parameters one at a time. */
static void test_shapes(void **state) {
    (void)state;
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        an_case c = {.xdt = dt, .rdt = dt, .odt = CT_NUM_DTYPES, .has_w = true, .has_b = true,
                     .uses = USE_Y | USE_SUM, .eps = 1e-5};
        /* normalized over [4, 5]; weight and bias of that shape */
        c.nd = 3, c.nnorm = 2;
        memcpy(c.shape, P(3, 4, 5), 3 * sizeof(int64_t));
        run_both(c);
        c.nc = true;
        run_both(c);
        c.nc = false;
        /* rows of one element; a larger eps keeps rms_norm's gradient, eps/(s^2+eps)
         * of its terms, above its rounding */
        c.nd = 2, c.nnorm = 1;
        memcpy(c.shape, P(7, 1), 2 * sizeof(int64_t));
        c.eps = 0.5;
        run_both(c);
        c.eps = 1e-5;
        run_both(c);
        /* no rows: empty results, zero weight and bias gradients */
        memcpy(c.shape, P(0, 6), 2 * sizeof(int64_t));
        run_both(c);
        c.nd = 3;
        memcpy(c.shape, P(2, 0, 6), 3 * sizeof(int64_t));
        run_both(c);
        /* four dims, normalized over the last */
        c.nd = 4;
        memcpy(c.shape, P(2, 3, 2, 9), 4 * sizeof(int64_t));
        c.nc = true;
        run_both(c);
        c.nc = false;
        /* weight without bias, bias without weight, neither */
        c.nd = 2;
        memcpy(c.shape, P(5, 24), 2 * sizeof(int64_t));
        c.has_b = false;
        run_both(c);
        c.has_w = false, c.has_b = true;
        run_both(c);
        c.has_b = false;
        run_both(c);
    }
}

/* Losses that read only y (with and without the sum asked for) or only the
 * sum, a forward without leaves (no history), and leaves among the inputs
 * one kind at a time. */
static void test_used_outputs(void **state) {
    (void)state;
    for (int k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        an_case c = {.xdt = dt, .rdt = k == 0 ? CT_BF16 : dt, .odt = CT_NUM_DTYPES,
                     .nc = k & 1, .has_w = true, .has_b = true, .eps = 1e-5};
        rand_rows(&c, 1, 5, 80);
        c.uses = USE_Y;
        run_both(c);
        c.no_sum = true;
        run_both(c);
        c.no_sum = false;
        c.uses = USE_SUM;
        run_both(c);
        c.uses = 0;
        run_both(c);
        c.no_sum = true;
        run_both(c);
        /* leaves among the inputs one kind at a time: the others get no gradient */
        c.no_sum = false;
        c.uses = USE_Y | USE_SUM;
        c.frozen = FROZEN_X | FROZEN_R;
        run_both(c);
        c.frozen = FROZEN_R | FROZEN_WB;
        run_both(c);
        c.frozen = FROZEN_X;
        c.uses = USE_Y;
        run_both(c);
    }
}

/* The gradients of both outputs against central differences (float64), and
 * x passed as its own residual (its gradient twice dsum). */
typedef struct gc_ctx {
    bool layer, self;
} gc_ctx;

static ct_tensor *gc_fn(ct_tensor *const *in, void *ctx) {
    const gc_ctx *g = ctx;
    ct_tensor *res = g->self ? in[0] : in[1], *s = NULL;
    ct_tensor *y = g->layer ? ct_add_layer_norm(in[0], res, 1, P(6), in[2], in[3], 1e-3,
                                                CT_NUM_DTYPES, &s)
                            : ct_add_rms_norm(in[0], res, 1, P(6), in[2], 1e-3, CT_NUM_DTYPES, &s);
    if (!y) return NULL;
    ct_tensor *s2 = ct_mul_scalar(s, 0.75);
    ct_tensor *out = ct_add(y, s2);
    ct_tensor_release(y);
    ct_tensor_release(s);
    ct_tensor_release(s2);
    return out;
}

static void test_gradcheck(void **state) {
    (void)state;
    for (int k = 0; k < 4; k++) {
        gc_ctx g = {.layer = k & 1, .self = k >= 2};
        ct_tensor *in[4];
        double *v;
        v = tu_rand_vals(24, CT_F64, -2, 3);
        in[0] = leaf_of(v, 2, P(4, 6), CT_F64);
        free(v);
        v = tu_rand_vals(24, CT_F64, -1, 1);
        in[1] = leaf_of(v, 2, P(4, 6), CT_F64);
        free(v);
        v = tu_rand_vals(6, CT_F64, 0.5, 1.5);
        in[2] = leaf_of(v, 1, P(6), CT_F64);
        free(v);
        v = tu_rand_vals(6, CT_F64, -1, 1);
        in[3] = leaf_of(v, 1, P(6), CT_F64);
        free(v);
        gradcheck_ok(g.layer ? "add_layer_norm" : "add_rms_norm", gc_fn, &g, g.layer ? 4 : 3, in);
        release_all(4, in);
    }
}

/* Each bad input: NULL, its status and a message naming the op and the
 * cause, and *sum left as it was. */
static void test_errors(void **state) {
    (void)state;
    ct_tensor *x = tu_rand(2, P(3, 4), CT_F32, -1, 1, NULL);
    ct_tensor *r = tu_rand(2, P(3, 4), CT_F32, -1, 1, NULL);
    ct_tensor *r5 = tu_rand(2, P(3, 5), CT_F32, -1, 1, NULL);
    ct_tensor *rt = tu_rand(2, P(4, 3), CT_F32, -1, 1, NULL);
    ct_tensor *xi = ct_tensor_zeros(2, P(3, 4), CT_I64, CT_CPU);
    ct_tensor *ri = ct_tensor_zeros(2, P(3, 4), CT_I32, CT_CPU);
    ct_tensor *xb = tu_rand(2, P(3, 4), CT_BF16, -1, 1, NULL);
    ct_tensor *rb = tu_rand(2, P(3, 4), CT_BF16, -1, 1, NULL);
    ct_tensor *w = tu_rand(1, P(4), CT_F32, 0.5, 1.5, NULL);
    ct_tensor *w64 = tu_rand(1, P(4), CT_F64, 0.5, 1.5, NULL);
    ct_tensor *wb = tu_rand(1, P(4), CT_BF16, 0.5, 1.5, NULL);
    ct_tensor *w5 = tu_rand(1, P(5), CT_F32, 0.5, 1.5, NULL);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    static int marker;
    ct_tensor *const sentinel = (ct_tensor *)(void *)&marker;
    for (int layer = 0; layer < 2; layer++) {
        const char *op = layer ? "ct_add_layer_norm" : "ct_add_rms_norm";
        ct_tensor *s = sentinel;
#define CALL(X, R, NN, NS, W, B, EPS, OUT)                                          \
    (layer ? ct_add_layer_norm(X, R, NN, NS, W, B, EPS, OUT, &s)                     \
           : ct_add_rms_norm(X, R, NN, NS, W, EPS, OUT, &s))
#define EXPECT(call, status, ...)                                                  \
    do {                                                                           \
        tu_assert_null_error(call, status, op, __VA_ARGS__);                       \
        assert_ptr_equal(s, sentinel);                                             \
    } while (0)
        EXPECT(CALL(NULL, r, 1, P(4), w, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_INVALID_ARG, "NULL");
        EXPECT(CALL(x, NULL, 1, P(4), w, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_INVALID_ARG, "NULL");
        EXPECT(CALL(x, r5, 1, P(4), w, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_SHAPE, "residual",
               "[3, 5]", "[3, 4]");
        /* the same number of elements is not the same shape: no broadcasting either */
        EXPECT(CALL(x, rt, 1, P(4), w, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_SHAPE, "residual");
        EXPECT(CALL(xi, r, 1, P(4), w, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_DTYPE, "floating",
               "int64");
        EXPECT(CALL(x, ri, 1, P(4), w, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_DTYPE, "floating",
               "residual", "int32");
        EXPECT(CALL(x, r, 1, P(4), w, NULL, 1e-5, CT_I64), CT_ERR_DTYPE, "out_dtype");
        EXPECT(CALL(x, r, 1, P(4), w, NULL, 1e-5, CT_BOOL), CT_ERR_DTYPE, "out_dtype");
        EXPECT(CALL(x, r, 1, P(4), w, NULL, 1e-5, (ct_dtype)(CT_NUM_DTYPES + 3)), CT_ERR_DTYPE,
               "out_dtype");
        EXPECT(CALL(x, r, 1, P(4), w64, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_DTYPE, "weight",
               "expected the sum's", "float32");
        /* bfloat16 inputs outside autocast: S is bfloat16, which a float32 weight is not */
        EXPECT(CALL(xb, rb, 1, P(4), w, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_DTYPE,
               "expected the sum's", "bfloat16");
        /* ... and inside, S is float32, which a bfloat16 weight is not */
        assert_int_equal(ct_autocast_begin(CT_CPU, CT_BF16), CT_OK);
        ct_tensor *y = CALL(xb, rb, 1, P(4), wb, NULL, 1e-5, CT_NUM_DTYPES);
        assert_int_equal(ct_autocast_end(), CT_OK);
        EXPECT(y, CT_ERR_DTYPE, "expected the sum's", "float32");
        if (layer)
            EXPECT(CALL(x, r, 1, P(4), w, w64, 1e-5, CT_NUM_DTYPES), CT_ERR_DTYPE, "bias",
                   "expected the sum's");
        EXPECT(CALL(x, r, 1, P(5), NULL, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_SHAPE,
               "normalized_shape", "[5]");
        EXPECT(CALL(x, r, 3, P(1, 3, 4), NULL, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_SHAPE,
               "normalized_shape");
        EXPECT(CALL(x, r, 1, P(4), w5, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_SHAPE, "weight", "[5]");
        if (layer)
            EXPECT(CALL(x, r, 1, P(4), NULL, w5, 1e-5, CT_NUM_DTYPES), CT_ERR_SHAPE, "bias");
        EXPECT(CALL(x, r, 0, P(4), NULL, NULL, 1e-5, CT_NUM_DTYPES), CT_ERR_INVALID_ARG,
               "normalized_shape");
        EXPECT(CALL(x, r, 1, P(4), w, NULL, -1e-5, CT_NUM_DTYPES), CT_ERR_INVALID_ARG, "eps");
        EXPECT(CALL(x, r, 1, P(4), w, NULL, NAN, CT_NUM_DTYPES), CT_ERR_INVALID_ARG, "eps");
        EXPECT(CALL(x, r, 1, P(4), w, NULL, INFINITY, CT_NUM_DTYPES), CT_ERR_INVALID_ARG, "eps");
#undef EXPECT
#undef CALL
    }
    ct_tensor *ts[] = {x, r, r5, rt, xi, ri, xb, rb, w, w64, wb, w5};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        TU_EACH_FLOAT_DTYPE(test_each_sum_dtype),
        T(test_mixed_dtypes),
        T(test_float64_out),
        T(test_autocast),
        T(test_shapes),
        T(test_used_outputs),
        T(test_gradcheck),
        T(test_errors),
    };
#undef T
    return tu_run_tests(tests);
}
