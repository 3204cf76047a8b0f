/* ct_scaled_dot_product_attention on the CPU against float64 reference
 * loops written here (naive softmax attention over explicit masks, PyTorch
 * 2.5's semantics incl. its safe softmax), forward and backward (through
 * autograd), on fresh random inputs:
 *   every floating dtype; 4-d and 3-d inputs; odd T and S, T != S, T = 1,
 *   head dims that are not powers of two (24, 80) and Dv != D; grouped-query
 *   attention (Hq / Hkv = 1, 2, 4); q, k, v contiguous or transposed from
 *   [B, T, H, D], or split from one fused [B, T, (Hq + 2 Hkv) D] projection
 *   (their gradients then one buffer); no mask, bool and additive masks, full or broadcasting
 *   ([T, S], [B, 1, T, S], [1, Hq, 1, S]), with fully masked rows (output
 *   0, gradients 0); causal with T != S; dropout against the mask the
 *   reference regenerates from the shared Philox rule; explicit scales.
 * Also float64 gradient checks of q, k and v (the mask gets no gradient:
 * one that requires grad is refused), outputs poisoned with NaN, the public
 * backward, and every bad input with its message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "autograd_util.h"
#include "test_util.h"

#include "test_fixture.h"

#define OPN "ct_scaled_dot_product_attention"

/* Frees CPU blocks of about `bytes` filled with NaN, so that an output the
 * allocator hands out next from them starts as NaN. */
static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = ct_tensor_empty(1, &n, CT_F32, CT_CPU);
    assert_non_null(t);
    assert_int_equal(ct_fill_(t, NAN), CT_OK);
    ct_tensor_release(t);
}

enum { MASK_NONE, MASK_BOOL, MASK_ADD };
enum { FORM_FULL, FORM_TS, FORM_B1TS, FORM_1H1S, FORM_COUNT };

typedef struct acase {
    ct_dtype dt;
    int nd; /* 4, or 3 (B = 1) */
    int64_t B, Hq, Hkv, T, S, D, Dv;
    bool transposed; /* q, k, v are [B, T, H, D] leaves transposed to [B, H, T, D] */
    bool strided;    /* q, k, v and the mask strided in every dim (tu_noncontig) */
    bool packed;     /* q, k, v split from one [B, T, (Hq + 2 Hkv) D] leaf, as a fused
                      * projection gives them (4-d, S == T, Dv == D) */
    int mask_kind, mask_form;
    bool masked_row; /* force query row 0 to have every key masked */
    bool causal;
    double dropout_p;
    double scale; /* 0: default */
} acase;

/* ---- the float64 reference -------------------------------------------------------------- */
typedef struct ref {
    double *q, *k, *v, *g;    /* logical [B, H, T, D] order */
    double *mask;             /* the mask's own values, shape mshape */
    int mnd;
    int64_t mshape[4];
    uint64_t seed, offset;    /* dropout's draws */
    double *out, *dq, *dk, *dv;
    /* Sums of squares of the rounding noise dq and dk carry per unit
     * roundoff (see reference), same layout as dq and dk. */
    double *nq, *nk;
} ref;

/* The mask's value at (b, h, i, j), broadcast right-aligned. */
static double mask_at(const acase *c, const ref *r, int64_t b, int64_t h, int64_t i, int64_t j) {
    int64_t idx4[4] = {b, h, i, j};
    int64_t off = 0;
    for (int d = 0; d < r->mnd; d++) {
        int64_t sz = r->mshape[d], x = idx4[4 - r->mnd + d];
        off = off * sz + (sz == 1 ? 0 : x);
    }
    (void)c;
    return r->mask[off];
}

static double keep_factor(const acase *c, const ref *r, int64_t b, int64_t h, int64_t i,
                          int64_t j) {
    if (c->dropout_p <= 0) return 1;
    uint64_t draw = r->offset + (uint64_t)(((b * c->Hq + h) * c->T + i) * c->S + j);
    double u = (double)(ct_philox(r->seed, draw) >> 8) * 0x1p-24;
    return u >= c->dropout_p ? 1.0 / (1.0 - c->dropout_p) : 0.0;
}

static double eff_scale(const acase *c) {
    return c->scale != 0 ? c->scale : 1.0 / sqrt((double)c->D);
}

static void reference(const acase *c, ref *r) {
    int64_t B = c->B, Hq = c->Hq, T = c->T, S = c->S, D = c->D, Dv = c->Dv;
    int64_t G = Hq / c->Hkv;
    double sc = eff_scale(c);
    r->out = calloc((size_t)(B * Hq * T * Dv), sizeof(double));
    r->dq = calloc((size_t)(B * Hq * T * D), sizeof(double));
    r->dk = calloc((size_t)(B * c->Hkv * S * D) + 1, sizeof(double));
    r->dv = calloc((size_t)(B * c->Hkv * S * Dv) + 1, sizeof(double));
    r->nq = calloc((size_t)(B * Hq * T * D) + 1, sizeof(double));
    r->nk = calloc((size_t)(B * c->Hkv * S * D) + 1, sizeof(double));
    double *s = malloc(sizeof(double) * (size_t)(S + 1)), *p = malloc(sizeof(double) * (size_t)(S + 1));
    double *z = malloc(sizeof(double) * (size_t)(S + 1)), *dp = malloc(sizeof(double) * (size_t)(S + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t hk = h / G;
            for (int64_t i = 0; i < T; i++) {
                const double *qi = r->q + ((b * Hq + h) * T + i) * D;
                double mx = -INFINITY;
                for (int64_t j = 0; j < S; j++) {
                    const double *kj = r->k + ((b * c->Hkv + hk) * S + j) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kj[d];
                    s[j] = dot * sc;
                    if (c->causal && j > i) s[j] = -INFINITY;
                    if (c->mask_kind == MASK_BOOL && mask_at(c, r, b, h, i, j) == 0) s[j] = -INFINITY;
                    if (c->mask_kind == MASK_ADD) s[j] += mask_at(c, r, b, h, i, j);
                    if (s[j] > mx) mx = s[j];
                    z[j] = keep_factor(c, r, b, h, i, j);
                }
                if (mx == -INFINITY) continue; /* safe softmax: zeros everywhere */
                double sum = 0;
                for (int64_t j = 0; j < S; j++) sum += (p[j] = exp(s[j] - mx));
                for (int64_t j = 0; j < S; j++) p[j] /= sum;
                double *oi = r->out + ((b * Hq + h) * T + i) * Dv;
                const double *gi = r->g + ((b * Hq + h) * T + i) * Dv;
                double di = 0;
                for (int64_t j = 0; j < S; j++) {
                    const double *vj = r->v + ((b * c->Hkv + hk) * S + j) * Dv;
                    double *dvj = r->dv + ((b * c->Hkv + hk) * S + j) * Dv;
                    double gv = 0;
                    for (int64_t d = 0; d < Dv; d++) {
                        oi[d] += p[j] * z[j] * vj[d];
                        dvj[d] += p[j] * z[j] * gi[d];
                        gv += gi[d] * vj[d];
                    }
                    dp[j] = gv * z[j];
                    di += p[j] * dp[j];
                }
                /* The kernel's D_i = rowsum(dO_i * O_i) reads O as it stored
                 * it, rounded to the dtype: an error of about u |dO_i O_i|
                 * (u the unit roundoff), while dP - D_i cancels to nothing
                 * where one key takes the whole row. Each dS_ij carries p_ij
                 * times that error, summed into dq over the keys and into dk
                 * over the group's rows like a random walk. */
                double dn = 0;
                for (int64_t d = 0; d < Dv; d++) dn += gi[d] * oi[d] * gi[d] * oi[d];
                dn = sqrt(dn);
                double *dqi = r->dq + ((b * Hq + h) * T + i) * D;
                double *nqi = r->nq + ((b * Hq + h) * T + i) * D;
                for (int64_t j = 0; j < S; j++) {
                    double ds = p[j] * (dp[j] - di) * sc, a = p[j] * dn * sc;
                    const double *kj = r->k + ((b * c->Hkv + hk) * S + j) * D;
                    double *dkj = r->dk + ((b * c->Hkv + hk) * S + j) * D;
                    double *nkj = r->nk + ((b * c->Hkv + hk) * S + j) * D;
                    for (int64_t d = 0; d < D; d++) {
                        dqi[d] += ds * kj[d];
                        dkj[d] += ds * qi[d];
                        nqi[d] += a * kj[d] * a * kj[d];
                        nkj[d] += a * qi[d] * a * qi[d];
                    }
                }
            }
        }
    free(s);
    free(p);
    free(z);
    free(dp);
}

static void ref_free(ref *r) {
    free(r->q);
    free(r->k);
    free(r->v);
    free(r->g);
    free(r->mask);
    free(r->out);
    free(r->dq);
    free(r->dk);
    free(r->dv);
    free(r->nq);
    free(r->nk);
}

/* ---- building the inputs ----------------------------------------------------------------- */
/* A leaf holding logical [B, H, L, E] values vals, and the [B, H, L, E] (or
 * [H, L, E]) tensor the op gets: the leaf itself, or the transpose of a
 * [B, L, H, E] leaf. */
static ct_tensor *make_input(const acase *c, const double *vals, int64_t H, int64_t L,
                             int64_t E, ct_tensor **leaf, bool grad) {
    int64_t B = c->B;
    ct_tensor *lf, *x;
    if (!c->transposed) {
        int64_t s4[4] = {B, H, L, E};
        lf = tu_from_f64(vals, c->nd, s4 + 4 - c->nd, c->dt);
        assert_non_null(lf);
        if (c->strided) {
            ct_tensor *nc = tu_noncontig(lf);
            ct_tensor_release(lf);
            lf = nc;
            assert_non_null(lf);
        }
        if (grad) assert_int_equal(ct_requires_grad_(lf, true), CT_OK);
        x = ct_tensor_retain(lf);
    } else {
        double *t = malloc(sizeof(double) * (size_t)(B * H * L * E + 1));
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t l = 0; l < L; l++)
                    for (int64_t e = 0; e < E; e++)
                        t[((b * L + l) * H + h) * E + e] = vals[((b * H + h) * L + l) * E + e];
        int64_t s4[4] = {B, L, H, E};
        lf = tu_from_f64(t, c->nd, s4 + 4 - c->nd, c->dt);
        free(t);
        assert_non_null(lf);
        if (grad) assert_int_equal(ct_requires_grad_(lf, true), CT_OK);
        x = c->nd == 4 ? ct_transpose(lf, 1, 2) : ct_transpose(lf, 0, 1);
        assert_non_null(x);
    }
    *leaf = lf;
    return x;
}

/* q, k and v as the pieces of one [B, T, (Hq + 2 Hkv) D] leaf (returned in
 * *leaf), each viewed as [B, T, H, D] and transposed to [B, H, T, D]. */
static void make_packed(const acase *c, const ref *r, ct_tensor **leaf, ct_tensor *qkv[3]) {
    int64_t B = c->B, T = c->T, D = c->D, H[3] = {c->Hq, c->Hkv, c->Hkv};
    int64_t W = (H[0] + 2 * H[1]) * D;
    const double *src[3] = {r->q, r->k, r->v};
    double *t = malloc(sizeof(double) * (size_t)(B * T * W + 1));
    for (int p = 0, col = 0; p < 3; col += (int)(H[p] * D), p++)
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H[p]; h++)
                for (int64_t i = 0; i < T; i++)
                    for (int64_t e = 0; e < D; e++)
                        t[(b * T + i) * W + col + h * D + e] = src[p][((b * H[p] + h) * T + i) * D + e];
    int64_t s3[3] = {B, T, W};
    ct_tensor *lf = tu_from_f64(t, 3, s3, c->dt);
    free(t);
    assert_non_null(lf);
    assert_int_equal(ct_requires_grad_(lf, true), CT_OK);
    ct_tensor *part[3] = {NULL, NULL, NULL};
    const int64_t sizes[3] = {H[0] * D, H[1] * D, H[2] * D};
    assert_int_equal(ct_split_with_sizes(lf, 3, sizes, 2, part), CT_OK);
    for (int p = 0; p < 3; p++) {
        ct_tensor *x = ct_view(part[p], 4, (const int64_t[]){B, T, H[p], D});
        assert_non_null(x);
        qkv[p] = ct_transpose(x, 1, 2);
        assert_non_null(qkv[p]);
        ct_tensor_release(x);
        ct_tensor_release(part[p]);
    }
    *leaf = lf;
}

/* The gradient of the packed leaf, split back into logical [B, H, T, D]
 * orders of q, k and v. */
static void packed_grads(const acase *c, ct_tensor *leaf, double *out[3]) {
    ct_tensor *g = ct_grad(leaf);
    assert_non_null(g);
    assert_int_equal(ct_tensor_dtype(g), c->dt);
    double *vals = tu_values(g);
    int64_t B = c->B, T = c->T, D = c->D, H[3] = {c->Hq, c->Hkv, c->Hkv};
    int64_t W = (H[0] + 2 * H[1]) * D;
    for (int p = 0, col = 0; p < 3; col += (int)(H[p] * D), p++) {
        out[p] = malloc(sizeof(double) * (size_t)(B * H[p] * T * D + 1));
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < H[p]; h++)
                for (int64_t i = 0; i < T; i++)
                    for (int64_t e = 0; e < D; e++)
                        out[p][((b * H[p] + h) * T + i) * D + e] = vals[(b * T + i) * W + col + h * D + e];
    }
    free(vals);
}

/* The gradient of a leaf made by make_input, in logical [B, H, L, E] order. */
static double *leaf_grad(const acase *c, ct_tensor *leaf) {
    ct_tensor *g = ct_grad(leaf);
    assert_non_null(g);
    assert_int_equal(ct_tensor_dtype(g), c->dt);
    ct_tensor *v = c->transposed ? (c->nd == 4 ? ct_transpose(g, 1, 2) : ct_transpose(g, 0, 1))
                                 : ct_tensor_retain(g);
    ct_tensor *cc = ct_contiguous(v);
    double *vals = tu_values(cc);
    ct_tensor_release(cc);
    ct_tensor_release(v);
    return vals;
}

static void mask_shape(const acase *c, int *nd, int64_t s[4]) {
    switch (c->mask_form) {
    case FORM_TS: *nd = 2, s[0] = c->T, s[1] = c->S; break;
    case FORM_B1TS: *nd = 4, s[0] = c->B, s[1] = 1, s[2] = c->T, s[3] = c->S; break;
    case FORM_1H1S: *nd = 4, s[0] = 1, s[1] = c->Hq, s[2] = 1, s[3] = c->S; break;
    default: *nd = 4, s[0] = c->B, s[1] = c->Hq, s[2] = c->T, s[3] = c->S; break;
    }
    if (c->nd == 3 && *nd == 4) { /* drop the batch dim (B = 1) */
        *nd = 3;
        for (int d = 0; d < 3; d++) s[d] = s[d + 1];
    }
}

static ct_tensor *make_mask(const acase *c, ref *r) {
    r->mask = NULL;
    r->mnd = 0;
    if (c->mask_kind == MASK_NONE) return NULL;
    mask_shape(c, &r->mnd, r->mshape);
    int64_t n = tu_numel(r->mnd, r->mshape);
    r->mask = malloc(sizeof(double) * (size_t)(n + 1));
    for (int64_t e = 0; e < n; e++) {
        if (c->mask_kind == MASK_BOOL) r->mask[e] = tu_uniform(0, 1) < 0.8;
        else r->mask[e] = tu_uniform(0, 1) < 0.15 ? -INFINITY : tu_round(tu_uniform(-2, 2), c->dt);
    }
    if (c->masked_row) { /* the first row of the mask's last two dims, for every leading index */
        int64_t S = r->mshape[r->mnd - 1], rows = n / S, tsz = r->mnd >= 2 ? r->mshape[r->mnd - 2] : 1;
        for (int64_t rr = 0; rr < rows; rr += tsz)
            for (int64_t j = 0; j < S; j++)
                r->mask[rr * S + j] = c->mask_kind == MASK_BOOL ? 0 : -INFINITY;
    }
    ct_tensor *m = tu_from_f64(r->mask, r->mnd, r->mshape,
                               c->mask_kind == MASK_BOOL ? CT_BOOL : c->dt);
    assert_non_null(m);
    if (c->strided) {
        ct_tensor *nc = tu_noncontig(m);
        ct_tensor_release(m);
        m = nc;
    }
    return m;
}

static double out_tol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-11;
    case CT_F32: return 2e-5;
    case CT_F16: return 4e-3;
    default: return 3e-2;
    }
}

static const char *dname(ct_dtype dt) { return ct_dtype_name(dt); }

static void describe(const acase *c, char *buf, size_t n) {
    snprintf(buf, n,
             "%s %dd B%lld Hq%lld Hkv%lld T%lld S%lld D%lld Dv%lld%s%s%s mask %d form %d%s%s p %g "
             "scale %g",
             dname(c->dt), c->nd, (long long)c->B, (long long)c->Hq, (long long)c->Hkv,
             (long long)c->T, (long long)c->S, (long long)c->D, (long long)c->Dv,
             c->transposed ? " transposed" : "", c->strided ? " strided" : "",
             c->packed ? " packed" : "", c->mask_kind, c->mask_form,
             c->masked_row ? " masked-row" : "", c->causal ? " causal" : "", c->dropout_p,
             c->scale);
}

/* |got - want| within tol + tol |want|, plus 4 u sqrt(noise) where noise (or
 * NULL) holds an element's sum of squared rounding terms. */
static void check_close_n(const char *what, const acase *c, const double *got, const double *want,
                          const double *noise, int64_t n, double tol) {
    double u = tu_unit_roundoff(c->dt);
    for (int64_t e = 0; e < n; e++) {
        double g = got[e], w = want[e], extra = noise ? 4 * u * sqrt(noise[e]) : 0;
        if (!(fabs(g - w) <= tol + tol * fabs(w) + extra)) {
            char d[256];
            describe(c, d, sizeof d);
            fprintf(stderr, "%s [%s]: element %lld got %.10g expected %.10g\n", what, d,
                    (long long)e, g, w);
            fail();
        }
    }
}

static void check_close(const char *what, const acase *c, const double *got, const double *want,
                        int64_t n, double tol) {
    check_close_n(what, c, got, want, NULL, n, tol);
}

/* Runs case c forward and backward and compares with the reference. */
static void run_case(const acase *c) {
    ref r = {0};
    int64_t B = c->B, Hq = c->Hq, Hkv = c->Hkv, T = c->T, S = c->S, D = c->D, Dv = c->Dv;
    r.q = tu_rand_vals(B * Hq * T * D, c->dt, -1, 1);
    r.k = tu_rand_vals(B * Hkv * S * D, c->dt, -1, 1);
    r.v = tu_rand_vals(B * Hkv * S * Dv, c->dt, -1, 1);
    r.g = tu_rand_vals(B * Hq * T * Dv, c->dt, -1, 1);
    ct_tensor *lq = NULL, *lk = NULL, *lv = NULL, *q, *k, *v;
    if (c->packed) {
        ct_tensor *qkv[3];
        make_packed(c, &r, &lq, qkv);
        q = qkv[0], k = qkv[1], v = qkv[2];
    } else {
        q = make_input(c, r.q, Hq, T, D, &lq, true);
        k = make_input(c, r.k, Hkv, S, D, &lk, true);
        v = make_input(c, r.v, Hkv, S, Dv, &lv, true);
    }
    ct_tensor *m = make_mask(c, &r);
    ct_generator *gen = ct_generator_new(tu_next());
    assert_non_null(gen);
    ct_generator_set_offset(gen, (uint64_t)tu_randint(0, 1000));
    r.seed = ct_generator_seed(gen);
    r.offset = ct_generator_offset(gen); /* where the op's reservation starts */
    reference(c, &r);

    poison(B * Hq * T * Dv * 8);
    ct_tensor *out = ct_scaled_dot_product_attention(q, k, v, m, c->dropout_p, c->causal,
                                                     c->scale, gen);
    if (!out) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(out);
    int64_t os[4] = {B, Hq, T, Dv};
    check_shape(out, c->nd, os + 4 - c->nd);
    assert_int_equal(ct_tensor_dtype(out), c->dt);
    double *got = tu_values(out);
    double tol = out_tol(c->dt) * (c->dropout_p > 0 ? 1.0 / (1.0 - c->dropout_p) : 1.0);
    check_close("out", c, got, r.out, B * Hq * T * Dv, tol);
    free(got);

    int64_t gs[4] = {B, Hq, T, Dv};
    ct_tensor *g = tu_from_f64(r.g, c->nd, gs + 4 - c->nd, c->dt);
    poison(B * Hq * T * D * 8);
    ct_status st = ct_backward(out, g, false);
    if (st != CT_OK) fprintf(stderr, "backward: %s\n", ct_last_error());
    assert_int_equal(st, CT_OK);
    /* gradients sum over up to S (dq) or G T (dk, dv) terms of size ~1 */
    double gt = tol * (c->dt == CT_F64 ? 10 : 4);
    double *gq, *gk, *gv;
    if (c->packed) {
        double *pg[3];
        packed_grads(c, lq, pg);
        gq = pg[0], gk = pg[1], gv = pg[2];
    } else {
        gq = leaf_grad(c, lq), gk = leaf_grad(c, lk), gv = leaf_grad(c, lv);
    }
    check_close_n("dq", c, gq, r.dq, r.nq, B * Hq * T * D, gt);
    check_close_n("dk", c, gk, r.dk, r.nk, B * Hkv * S * D, gt);
    check_close("dv", c, gv, r.dv, B * Hkv * S * Dv, gt);
    free(gq);
    free(gk);
    free(gv);
    ct_tensor *rel[] = {g, out, q, k, v, lq, lk, lv, m};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) ct_tensor_release(rel[i]);
    ct_generator_free(gen);
    ref_free(&r);
}

static int64_t pick(const int64_t *xs, int n) { return xs[tu_randint(0, n)]; }

/* A random case of dtype dt. */
static acase random_case(ct_dtype dt) {
    static const int64_t ratios[] = {1, 2, 4}, dims[] = {1, 3, 8, 16, 24, 33, 64, 80};
    static const int64_t lens[] = {1, 2, 5, 7, 16, 31, 64, 65, 100, 129, 200};
    acase c = {.dt = dt};
    c.nd = tu_randint(0, 4) == 0 ? 3 : 4;
    c.B = c.nd == 3 ? 1 : tu_randint(1, 3);
    c.Hkv = tu_randint(1, 3);
    c.Hq = c.Hkv * pick(ratios, 3);
    c.T = pick(lens, 11);
    c.S = tu_randint(0, 3) == 0 ? c.T : pick(lens, 11);
    c.D = pick(dims, 8);
    c.Dv = tu_randint(0, 2) ? c.D : pick(dims, 8);
    c.transposed = tu_randint(0, 2);
    c.strided = !c.transposed && tu_randint(0, 4) == 0;
    if (c.nd == 4 && !c.transposed && !c.strided && tu_randint(0, 3) == 0) {
        c.packed = true;
        c.S = c.T;
        c.Dv = c.D;
    }
    int kind = (int)tu_randint(0, 4); /* none, bool, additive, causal */
    c.mask_kind = kind < 3 ? kind : MASK_NONE;
    c.causal = kind == 3;
    c.mask_form = (int)tu_randint(0, FORM_COUNT);
    c.masked_row = c.mask_kind != MASK_NONE && tu_randint(0, 2);
    c.dropout_p = tu_randint(0, 3) == 0 ? 0.3 : 0;
    c.scale = tu_randint(0, 3) == 0 ? tu_uniform(0.05, 0.5) : 0;
    return c;
}

static void test_random_cases(void **state) {
    (void)state;
    for (int rep = 0; rep < 30; rep++)
        for (size_t d = 0; d < 4; d++) {
            acase c = random_case(tu_float_dtypes[d]);
            run_case(&c);
        }
}

/* The shapes the task names, each once in every dtype. */
static void test_named_cases(void **state) {
    (void)state;
    const acase base = {.nd = 4, .B = 2, .Hq = 4, .Hkv = 2, .T = 37, .S = 53, .D = 24, .Dv = 24};
    acase cs[24];
    int n = 0;
    cs[n++] = base;                                                   /* GQA 2, T != S */
    cs[n] = base, cs[n].T = 1, n++;                                   /* one query */
    cs[n] = base, cs[n].D = 80, cs[n].Dv = 20, cs[n].Hkv = 1, n++;    /* GQA 4, Dv != D */
    cs[n] = base, cs[n].transposed = true, cs[n].causal = true, n++;  /* causal, T < S */
    cs[n] = base, cs[n].T = 70, cs[n].S = 29, cs[n].causal = true, n++; /* causal, T > S */
    cs[n] = base, cs[n].mask_kind = MASK_BOOL, cs[n].mask_form = FORM_TS, cs[n].masked_row = true, n++;
    cs[n] = base, cs[n].mask_kind = MASK_ADD, cs[n].mask_form = FORM_B1TS, cs[n].masked_row = true, n++;
    cs[n] = base, cs[n].mask_kind = MASK_ADD, cs[n].mask_form = FORM_1H1S, n++;
    cs[n] = base, cs[n].mask_kind = MASK_BOOL, cs[n].mask_form = FORM_FULL, cs[n].transposed = true, n++;
    cs[n] = base, cs[n].dropout_p = 0.4, n++;
    cs[n] = base, cs[n].dropout_p = 0.2, cs[n].causal = true, cs[n].Hkv = 1, n++;
    cs[n] = base, cs[n].nd = 3, cs[n].B = 1, cs[n].mask_kind = MASK_BOOL, cs[n].masked_row = true, n++;
    cs[n] = base, cs[n].scale = 0.7, cs[n].T = 130, cs[n].S = 257, n++; /* several tiles */
    cs[n] = base, cs[n].T = 200, cs[n].S = 200, cs[n].causal = true, cs[n].dropout_p = 0.1, n++;
    cs[n] = base, cs[n].strided = true, cs[n].mask_kind = MASK_ADD, cs[n].masked_row = true, n++;
    cs[n] = base, cs[n].strided = true, cs[n].Hkv = 4, cs[n].mask_kind = MASK_BOOL, n++;
    cs[n] = base, cs[n].S = 0, n++;                       /* no keys: every row masked */
    cs[n] = base, cs[n].T = 0, cs[n].causal = true, n++;  /* no queries */
    cs[n] = base, cs[n].B = 1, cs[n].Hkv = 1, cs[n].Hq = 1, cs[n].T = 130, n++; /* one (b, kv head) */
    cs[n] = base, cs[n].packed = true, cs[n].S = 37, cs[n].causal = true, n++; /* fused qkv, GQA 2 */
    cs[n] = base, cs[n].packed = true, cs[n].S = 37, cs[n].Hkv = 4, cs[n].D = cs[n].Dv = 80, n++;
    for (size_t d = 0; d < 4; d++)
        for (int i = 0; i < n; i++) {
            cs[i].dt = tu_float_dtypes[d];
            run_case(&cs[i]);
        }
}

/* A row with every key masked: exactly 0 out and 0 gradients, even with
 * scores that would overflow. */
static void test_fully_masked(void **state) {
    (void)state;
    double qv[12], kv[16], vv[16], mv[12];
    for (int i = 0; i < 12; i++) qv[i] = 50.0 * (i + 1);
    for (int i = 0; i < 16; i++) kv[i] = vv[i] = 1.0 + i;
    for (int i = 0; i < 12; i++) mv[i] = i < 4 ? 0 : 1; /* row 0 fully masked */
    int64_t ks[4] = {1, 1, 4, 4}, qs[4] = {1, 1, 3, 4};
    ct_tensor *q = leaf_of(qv, 4, qs, CT_F32), *k = leaf_of(kv, 4, ks, CT_F32),
              *v = leaf_of(vv, 4, ks, CT_F32);
    int64_t ms[2] = {3, 4};
    ct_tensor *m = tu_from_f64(mv, 2, ms, CT_BOOL);
    ct_tensor *o = ct_scaled_dot_product_attention(q, k, v, m, 0, false, 0, NULL);
    assert_non_null(o);
    double *ov = tu_values(o);
    for (int d = 0; d < 4; d++) assert_true(ov[d] == 0.0);
    for (int e = 4; e < 12; e++) assert_true(isfinite(ov[e]));
    free(ov);
    backward_ones(o);
    double *gq = tu_values(ct_grad(q));
    for (int d = 0; d < 4; d++) assert_true(gq[d] == 0.0);
    free(gq);
    ct_tensor *rel[] = {o, q, k, v, m};
    release_all(5, rel);
}

/* ---- gradcheck ----------------------------------------------------------------------------- */
typedef struct gc_ctx {
    ct_tensor *mask;
    bool causal;
    double p, scale;
    uint64_t seed;
} gc_ctx;

static ct_tensor *gc_sdpa(ct_tensor *const *in, void *pv) {
    gc_ctx *g = pv;
    /* a fresh generator per call: every evaluation drops the same elements */
    ct_generator *gen = ct_generator_new(g->seed);
    ct_tensor *o = ct_scaled_dot_product_attention(in[0], in[1], in[2], g->mask, g->p, g->causal,
                                                   g->scale, gen);
    ct_generator_free(gen);
    return o;
}

static void test_gradcheck(void **state) {
    (void)state;
    for (int rep = 0; rep < 8; rep++) {
        int64_t B = tu_randint(1, 3), Hkv = tu_randint(1, 3), Hq = Hkv * (rep % 3 == 0 ? 2 : 1);
        int64_t T = tu_randint(1, 6), S = tu_randint(1, 7), D = tu_randint(1, 5),
                Dv = tu_randint(1, 5);
        int64_t qs[4] = {B, Hq, T, D}, ks[4] = {B, Hkv, S, D}, vs[4] = {B, Hkv, S, Dv};
        double *qv = tu_rand_vals(B * Hq * T * D, CT_F64, -1, 1);
        double *kv = tu_rand_vals(B * Hkv * S * D, CT_F64, -1, 1);
        double *vv = tu_rand_vals(B * Hkv * S * Dv, CT_F64, -1, 1);
        ct_tensor *in[3] = {leaf_of(qv, 4, qs, CT_F64), leaf_of(kv, 4, ks, CT_F64),
                            leaf_of(vv, 4, vs, CT_F64)};
        gc_ctx g = {.seed = tu_next(), .scale = rep % 2 ? 0.6 : 0};
        int kind = rep % 4;
        if (kind == 1) g.causal = true;
        if (kind == 2) {
            int64_t ms[2] = {T, S};
            double *mv = tu_rand_vals(T * S, CT_F64, -1, 1);
            for (int64_t j = 0; j < S; j++) mv[j] = -INFINITY; /* row 0 fully masked */
            g.mask = tu_from_f64(mv, 2, ms, CT_F64);
            free(mv);
        }
        if (kind == 3) {
            int64_t ms[4] = {B, 1, T, S};
            double *mv = tu_rand_vals(B * T * S, CT_BOOL, 0, 2);
            g.mask = tu_from_f64(mv, 4, ms, CT_BOOL);
            free(mv);
            g.p = 0.3;
        }
        char what[96];
        snprintf(what, sizeof what, "sdpa gradcheck rep %d kind %d", rep, kind);
        gradcheck_ok(what, gc_sdpa, &g, 3, in);
        release_all(3, in);
        ct_tensor_release(g.mask);
        free(qv);
        free(kv);
        free(vv);
    }
}

/* ---- dropout ----------------------------------------------------------------------------- */
/* The default generator is used without one, and each call takes a fresh
 * range of draws: two calls differ, and a generator reset repeats. */
static void test_dropout_generator(void **state) {
    (void)state;
    int64_t s[4] = {1, 2, 9, 8};
    ct_tensor *q = tu_rand(4, s, CT_F32, -1, 1, NULL), *k = tu_rand(4, s, CT_F32, -1, 1, NULL),
              *v = tu_rand(4, s, CT_F32, -1, 1, NULL);
    ct_generator *g = ct_generator_new(7);
    ct_tensor *a = ct_scaled_dot_product_attention(q, k, v, NULL, 0.5, false, 0, g);
    ct_tensor *b = ct_scaled_dot_product_attention(q, k, v, NULL, 0.5, false, 0, g);
    ct_generator_set_offset(g, 0);
    ct_tensor *a2 = ct_scaled_dot_product_attention(q, k, v, NULL, 0.5, false, 0, g);
    uint64_t before = ct_generator_offset(ct_generator_default());
    ct_tensor *d = ct_scaled_dot_product_attention(q, k, v, NULL, 0.5, false, 0, NULL);
    assert_true(ct_generator_offset(ct_generator_default()) >= before + 2 * 9 * 8);
    /* dropout_p 0 draws nothing */
    before = ct_generator_offset(g);
    ct_tensor *e = ct_scaled_dot_product_attention(q, k, v, NULL, 0, false, 0, g);
    assert_int_equal(ct_generator_offset(g), before);
    double *av = tu_values(a), *bv = tu_values(b), *a2v = tu_values(a2);
    int differ = 0;
    for (int i = 0; i < 2 * 9 * 8; i++) {
        differ += av[i] != bv[i];
        assert_true(av[i] == a2v[i]);
    }
    assert_true(differ > 0);
    free(av);
    free(bv);
    free(a2v);
    ct_tensor *rel[] = {q, k, v, a, b, a2, d, e};
    release_all(8, rel);
    ct_generator_free(g);
}

/* ---- bad input --------------------------------------------------------------------------- */
static void test_errors(void **state) {
    (void)state;
    int64_t s4[4] = {2, 4, 5, 8}, s3[3] = {4, 5, 8};
    ct_tensor *q = ct_tensor_zeros(4, s4, CT_F32, CT_CPU);
    ct_tensor *k = ct_tensor_zeros(4, s4, CT_F32, CT_CPU);
    ct_tensor *v = ct_tensor_zeros(4, s4, CT_F32, CT_CPU);
    ct_tensor *q3 = ct_tensor_zeros(3, s3, CT_F32, CT_CPU);
    ct_tensor *q64 = ct_tensor_zeros(4, s4, CT_F64, CT_CPU);
    ct_tensor *qi = ct_tensor_zeros(4, s4, CT_I64, CT_CPU);
    int64_t sd[4] = {2, 4, 5, 6}, sb[4] = {3, 4, 5, 8}, sh[4] = {2, 3, 5, 8}, ss[4] = {2, 4, 6, 8};
    ct_tensor *kd = ct_tensor_zeros(4, sd, CT_F32, CT_CPU);
    ct_tensor *kb = ct_tensor_zeros(4, sb, CT_F32, CT_CPU);
    ct_tensor *kh = ct_tensor_zeros(4, sh, CT_F32, CT_CPU);
    ct_tensor *vs = ct_tensor_zeros(4, ss, CT_F32, CT_CPU);
    int64_t m1[2] = {5, 5}, m2[2] = {3, 5}, m3[5] = {1, 2, 4, 5, 5};
    ct_tensor *mb = ct_tensor_zeros(2, m1, CT_BOOL, CT_CPU);
    ct_tensor *mi = ct_tensor_zeros(2, m1, CT_I32, CT_CPU);
    ct_tensor *m64 = ct_tensor_zeros(2, m1, CT_F64, CT_CPU);
    ct_tensor *mbad = ct_tensor_zeros(2, m2, CT_BOOL, CT_CPU);
    ct_tensor *m5 = ct_tensor_zeros(5, m3, CT_BOOL, CT_CPU);
    ct_tensor *mg = ct_tensor_zeros(2, m1, CT_F32, CT_CPU);
    assert_int_equal(ct_requires_grad_(mg, true), CT_OK);

    tu_assert_null_error(ct_scaled_dot_product_attention(NULL, k, v, NULL, 0, false, 0, NULL),
                         CT_ERR_INVALID_ARG, OPN, "argument 1 is NULL");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, NULL, NULL, 0, false, 0, NULL),
                         CT_ERR_INVALID_ARG, OPN, "argument 3 is NULL");
    tu_assert_null_error(ct_scaled_dot_product_attention(q3, k, v, NULL, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "must all be 4-d [B, H, T, D] or all 3-d", "q [4, 5, 8]");
    tu_assert_null_error(ct_scaled_dot_product_attention(qi, k, v, NULL, 0, false, 0, NULL),
                         CT_ERR_DTYPE, OPN, "floating", "int64");
    tu_assert_null_error(ct_scaled_dot_product_attention(q64, k, v, NULL, 0, false, 0, NULL),
                         CT_ERR_DTYPE, OPN, "k has dtype float32 but q has float64");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, kd, v, NULL, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "different head dims (8 != 6)");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, kb, v, NULL, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "one batch size");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, kh, kh, NULL, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "4 heads must be a multiple of k's and v's 3 heads");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, vs, NULL, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "different sequence lengths (5 != 6)");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, kh, NULL, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "different numbers of heads");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, mbad, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "attn_mask [3, 5] bool", "does not broadcast to [2, 4, 5, 5]");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, m5, 0, false, 0, NULL),
                         CT_ERR_SHAPE, OPN, "does not broadcast");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, mi, 0, false, 0, NULL),
                         CT_ERR_DTYPE, OPN, "attn_mask must be bool or of q's dtype float32, got int32");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, m64, 0, false, 0, NULL),
                         CT_ERR_DTYPE, OPN, "got float64");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, mb, 0, true, 0, NULL),
                         CT_ERR_INVALID_ARG, OPN, "attn_mask must be NULL when is_causal");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, NULL, 1.0, false, 0, NULL),
                         CT_ERR_INVALID_ARG, OPN, "dropout_p must be in [0, 1), got 1");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, NULL, -0.1, false, 0, NULL),
                         CT_ERR_INVALID_ARG, OPN, "got -0.1");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, NULL, NAN, false, 0, NULL),
                         CT_ERR_INVALID_ARG, OPN, "dropout_p");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, NULL, 0, false, INFINITY, NULL),
                         CT_ERR_INVALID_ARG, OPN, "scale must be finite");
    tu_assert_null_error(ct_scaled_dot_product_attention(q, k, v, mg, 0, false, 0, NULL),
                         CT_ERR_AUTOGRAD, OPN, "attn_mask [5, 5] float32 cpu requires grad");

    /* the backward's own checks */
    ct_tensor *dq = NULL;
    int64_t ls[3] = {2, 4, 5}, lbad[3] = {2, 4, 6};
    ct_tensor *lse = ct_tensor_zeros(3, ls, CT_F32, CT_CPU);
    ct_tensor *lse64 = ct_tensor_zeros(3, ls, CT_F64, CT_CPU);
    ct_tensor *lseb = ct_tensor_zeros(3, lbad, CT_F32, CT_CPU);
    tu_assert_error(ct_scaled_dot_product_attention_backward(q, q, k, v, q, lse, NULL, 0, false, 0,
                                                             0, 0, NULL, NULL, NULL),
                    CT_ERR_INVALID_ARG, OPN "_backward", "dq, dk and dv are all NULL");
    tu_assert_error(ct_scaled_dot_product_attention_backward(q, q, k, v, NULL, lse, NULL, 0, false,
                                                             0, 0, 0, &dq, NULL, NULL),
                    CT_ERR_INVALID_ARG, OPN "_backward", "argument 5 is NULL");
    tu_assert_error(ct_scaled_dot_product_attention_backward(q, q, k, v, q, lseb, NULL, 0, false,
                                                             0, 0, 0, &dq, NULL, NULL),
                    CT_ERR_SHAPE, OPN "_backward", "lse has shape [2, 4, 6] float32 cpu, expected [2, 4, 5]");
    tu_assert_error(ct_scaled_dot_product_attention_backward(q, q, k, v, q, lse64, NULL, 0, false,
                                                             0, 0, 0, &dq, NULL, NULL),
                    CT_ERR_DTYPE, OPN "_backward", "lse has dtype float64, expected float32");
    tu_assert_error(ct_scaled_dot_product_attention_backward(kd, q, k, v, q, lse, NULL, 0, false,
                                                             0, 0, 0, &dq, NULL, NULL),
                    CT_ERR_SHAPE, OPN "_backward", "grad_out has shape");
    assert_null(dq);
    ct_tensor *rel[] = {q, k, v, q3, q64, qi, kd, kb, kh, vs, mb, mi, m64, mbad, m5, mg, lse, lse64, lseb};
    release_all((int)(sizeof rel / sizeof rel[0]), rel);
}

/* The public backward against the reference directly, with its lse from a
 * forward run without autograd. */
static void test_public_backward(void **state) {
    (void)state;
    acase c = {.dt = CT_F64, .nd = 4, .B = 1, .Hq = 2, .Hkv = 1, .T = 9, .S = 11, .D = 5, .Dv = 3,
               .causal = true};
    ref r = {0};
    r.q = tu_rand_vals(2 * 9 * 5, CT_F64, -1, 1);
    r.k = tu_rand_vals(11 * 5, CT_F64, -1, 1);
    r.v = tu_rand_vals(11 * 3, CT_F64, -1, 1);
    r.g = tu_rand_vals(2 * 9 * 3, CT_F64, -1, 1);
    reference(&c, &r);
    int64_t qs[4] = {1, 2, 9, 5}, ks[4] = {1, 1, 11, 5}, vs[4] = {1, 1, 11, 3}, os[4] = {1, 2, 9, 3};
    ct_tensor *q = tu_from_f64(r.q, 4, qs, CT_F64), *k = tu_from_f64(r.k, 4, ks, CT_F64);
    ct_tensor *v = tu_from_f64(r.v, 4, vs, CT_F64), *g = tu_from_f64(r.g, 4, os, CT_F64);
    ct_tensor *out = tu_from_f64(r.out, 4, os, CT_F64);
    /* lse from the reference's definition */
    int64_t ls[3] = {1, 2, 9};
    double lv[18];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 9; i++) {
            double mx = -INFINITY, s[11];
            for (int j = 0; j < 11; j++) {
                double dot = 0;
                for (int d = 0; d < 5; d++) dot += r.q[(h * 9 + i) * 5 + d] * r.k[j * 5 + d];
                s[j] = j > i ? -INFINITY : dot / sqrt(5.0);
                if (s[j] > mx) mx = s[j];
            }
            double sum = 0;
            for (int j = 0; j < 11; j++) sum += exp(s[j] - mx);
            lv[h * 9 + i] = mx + log(sum);
        }
    ct_tensor *lse = tu_from_f64(lv, 3, ls, CT_F64);
    ct_tensor *dk = NULL, *dv = NULL;
    assert_int_equal(ct_scaled_dot_product_attention_backward(g, q, k, v, out, lse, NULL, 0, true,
                                                              0, 0, 0, NULL, &dk, &dv),
                     CT_OK);
    check_values(dk, r.dk, 11 * 5, 1e-10, 1e-10);
    check_values(dv, r.dv, 11 * 3, 1e-10, 1e-10);
    ct_tensor *rel[] = {q, k, v, g, out, lse, dk, dv};
    release_all(8, rel);
    ref_free(&r);
}

/* The backward op has no formula of its own: gradients it computes from
 * tensors that need grad refuse a second backward with a message. */
static void test_double_backward_refused(void **state) {
    (void)state;
    int64_t s[4] = {1, 2, 3, 4}, ls[3] = {1, 2, 3};
    double *x = tu_rand_vals(24, CT_F64, -1, 1);
    ct_tensor *q = leaf_of(x, 4, s, CT_F64);
    ct_tensor *o = ct_scaled_dot_product_attention(q, q, q, NULL, 0, false, 0, NULL);
    ct_tensor *lse = ct_tensor_zeros(3, ls, CT_F64, CT_CPU);
    ct_tensor *dq = NULL;
    assert_int_equal(ct_scaled_dot_product_attention_backward(q, q, q, q, o, lse, NULL, 0, false,
                                                              0, 0, 0, &dq, NULL, NULL),
                     CT_OK);
    assert_string_equal(ct_grad_fn_name(dq), "scaled_dot_product_attention_backward");
    ct_tensor *g = ct_tensor_ones_like(dq);
    tu_assert_error(ct_backward(dq, g, false), CT_ERR_AUTOGRAD,
                    "ct_scaled_dot_product_attention_backward has no backward formula");
    ct_tensor *rel[] = {q, o, lse, dq, g};
    release_all(5, rel);
    free(x);
}

/* Without grad mode (or inputs that need none) the op records nothing. */
static void test_no_grad(void **state) {
    (void)state;
    int64_t s[4] = {1, 1, 3, 4};
    double x[12] = {0};
    ct_tensor *q = leaf_of(x, 4, s, CT_F32);
    bool prev = ct_no_grad_begin();
    ct_tensor *o = ct_scaled_dot_product_attention(q, q, q, NULL, 0, false, 0, NULL);
    ct_no_grad_end(prev);
    assert_non_null(o);
    assert_null(ct_grad_fn_name(o));
    ct_tensor *o2 = ct_scaled_dot_product_attention(q, q, q, NULL, 0, false, 0, NULL);
    assert_string_equal(ct_grad_fn_name(o2), "ScaledDotProductAttentionBackward");
    ct_tensor *rel[] = {q, o, o2};
    release_all(3, rel);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_named_cases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_cases, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fully_masked, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dropout_generator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_public_backward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_double_backward_refused, setup, teardown),
    };
    return tu_run_tests(tests);
}
