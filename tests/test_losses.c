/* The losses of src/ops/losses.c against float64 references written here
 * (PyTorch's formulas, element by element), in every floating dtype, on
 * fresh random inputs, contiguous and as non-contiguous views, with the
 * broadcasting each allows, every reduction; float64 gradient checks; the
 * pinned edges (BCE's -100 clamp, extreme logits, zero targets of kl_div,
 * zero vectors); and the refusals with their messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "autograd_util.h"
#include "test_fixture.h"

#define N_ 5
#define C_ 7

static double tol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-11;
    case CT_F32: return 2e-5;
    case CT_F16: return 1e-2;
    default: return 6e-2;
    }
}

/* ---- float64 references --------------------------------------------------------------------- */
static double r_log100(double v) { return fmax(log(v), -100.0); }
static double r_softplus_neg(double x) { return log1p(exp(-fabs(x))) + fmax(-x, 0.0); }

static double ref_bce(const double *v, double p) {
    (void)p;
    return -v[2] * (v[1] * r_log100(v[0]) + (1 - v[1]) * r_log100(1 - v[0]));
}
static double ref_bce_logits(const double *v, double p) {
    (void)p;
    double lw = 1 + (v[3] - 1) * v[1];
    return v[2] * ((1 - v[1]) * v[0] + lw * r_softplus_neg(v[0]));
}
static double ref_l1(const double *v, double p) {
    (void)p;
    return fabs(v[0] - v[1]);
}
static double ref_smooth_l1(const double *v, double beta) {
    double z = fabs(v[0] - v[1]);
    return z < beta ? 0.5 * z * z / beta : z - 0.5 * beta;
}
static double ref_huber(const double *v, double delta) {
    double z = fabs(v[0] - v[1]);
    return z < delta ? 0.5 * z * z : delta * (z - 0.5 * delta);
}
static double ref_kl(const double *v, double log_target) {
    if (log_target != 0) return exp(v[1]) * (v[1] - v[0]);
    return (v[1] == 0 ? 0 : v[1] * log(v[1])) - v[1] * v[0];
}
static double ref_margin(const double *v, double margin) {
    return fmax(0.0, -v[2] * (v[0] - v[1]) + margin);
}

/* ---- the calls -------------------------------------------------------------------------------- */
static ct_tensor *c_bce(ct_tensor *const *in, double p, ct_reduction r) {
    (void)p;
    return ct_binary_cross_entropy(in[0], in[1], in[2], r);
}
static ct_tensor *c_bce_logits(ct_tensor *const *in, double p, ct_reduction r) {
    (void)p;
    return ct_binary_cross_entropy_with_logits(in[0], in[1], in[2], in[3], r);
}
static ct_tensor *c_l1(ct_tensor *const *in, double p, ct_reduction r) {
    (void)p;
    return ct_l1_loss(in[0], in[1], r);
}
static ct_tensor *c_smooth_l1(ct_tensor *const *in, double p, ct_reduction r) {
    return ct_smooth_l1_loss(in[0], in[1], r, p);
}
static ct_tensor *c_huber(ct_tensor *const *in, double p, ct_reduction r) {
    return ct_huber_loss(in[0], in[1], r, p);
}
static ct_tensor *c_kl(ct_tensor *const *in, double p, ct_reduction r) {
    return ct_kl_div(in[0], in[1], r, p != 0);
}
static ct_tensor *c_margin(ct_tensor *const *in, double p, ct_reduction r) {
    return ct_margin_ranking_loss(in[0], in[1], in[2], p, r);
}

/* A pointwise loss: nin inputs of shape [N_, C_] each, or [C_] where
 * last[k] (broadcast over the rows), or absent (value 1 in the reference)
 * where absent[k]; values in [lo, hi]; gradcheck over the diff[k] ones. */
typedef struct pw_case {
    const char *name;
    int nin;
    double lo[4], hi[4];
    bool last[4], absent[4], diff[4];
    double p;
    ct_tensor *(*call)(ct_tensor *const *in, double p, ct_reduction r);
    double (*ref)(const double *v, double p);
} pw_case;

static const pw_case cases[] = {
    {"bce", 3, {0.02, 0, 0.5}, {0.98, 1, 2}, {0, 0, 1}, {0}, {1, 1, 1}, 0, c_bce, ref_bce},
    {"bce no weight", 3, {0.02, 0, 0}, {0.98, 1, 0}, {0}, {0, 0, 1}, {1, 1}, 0, c_bce, ref_bce},
    {"bce_with_logits", 4, {-6, 0, 0.5, 0.3}, {6, 1, 2, 3}, {0, 0, 0, 1}, {0}, {1, 1, 1, 1}, 0,
     c_bce_logits, ref_bce_logits},
    {"bce_with_logits plain", 4, {-12, 0, 0, 0}, {12, 1, 0, 0}, {0}, {0, 0, 1, 1}, {1, 1}, 0,
     c_bce_logits, ref_bce_logits},
    {"l1", 2, {-3, -3}, {3, 3}, {0}, {0}, {1, 1}, 0, c_l1, ref_l1},
    {"l1 broadcast", 2, {-3, -3}, {3, 3}, {0, 1}, {0}, {1, 1}, 0, c_l1, ref_l1},
    {"smooth_l1", 2, {-3, -3}, {3, 3}, {0}, {0}, {1, 1}, 1.0, c_smooth_l1, ref_smooth_l1},
    {"smooth_l1 beta 0.5", 2, {-2, -2}, {2, 2}, {0, 1}, {0}, {1, 1}, 0.5, c_smooth_l1,
     ref_smooth_l1},
    {"smooth_l1 beta 0", 2, {-2, -2}, {2, 2}, {0}, {0}, {1, 1}, 0.0, c_smooth_l1, ref_l1},
    {"huber", 2, {-3, -3}, {3, 3}, {0}, {0}, {1, 1}, 1.0, c_huber, ref_huber},
    {"huber delta 2.5", 2, {-4, -4}, {4, 4}, {0, 1}, {0}, {1, 1}, 2.5, c_huber, ref_huber},
    {"kl_div", 2, {-4, 0.01}, {0, 1}, {0}, {0}, {1, 1}, 0, c_kl, ref_kl},
    {"kl_div log_target", 2, {-4, -4}, {0, 0}, {0, 1}, {0}, {1, 1}, 1, c_kl, ref_kl},
    {"margin_ranking", 3, {-2, -2, -1}, {2, 2, 1}, {0}, {0}, {1, 1, 1}, 0.3, c_margin,
     ref_margin},
    {"margin_ranking broadcast", 3, {-2, -2, -1}, {2, 2, 1}, {0, 1, 1}, {0}, {1, 1, 1}, 0,
     c_margin, ref_margin},
};
#define NCASES (sizeof cases / sizeof cases[0])

static ct_tensor *make_input(const pw_case *c, int k, ct_dtype dt) {
    if (c->absent[k]) return NULL;
    int64_t full[2] = {N_, C_}, row[1] = {C_};
    return c->last[k] ? tu_rand(1, row, dt, c->lo[k], c->hi[k], NULL)
                      : tu_rand(2, full, dt, c->lo[k], c->hi[k], NULL);
}

/* The reference's pointwise values of case c over in (N_ * C_ of them). */
static void pointwise_ref(const pw_case *c, ct_tensor *const *in, double *out) {
    double *vals[4] = {NULL};
    for (int k = 0; k < c->nin; k++) vals[k] = in[k] ? tu_values(in[k]) : NULL;
    for (int64_t i = 0; i < N_ * C_; i++) {
        double v[4];
        for (int k = 0; k < c->nin; k++)
            v[k] = !vals[k] ? 1.0 : c->last[k] ? vals[k][i % C_] : vals[k][i];
        out[i] = c->ref(v, c->p);
    }
    for (int k = 0; k < c->nin; k++) free(vals[k]);
}

static void check_reductions(const pw_case *c, ct_tensor *const *in, const double *pw,
                             ct_dtype dt) {
    static const ct_reduction rs[] = {CT_REDUCTION_NONE, CT_REDUCTION_MEAN, CT_REDUCTION_SUM};
    /* A loss that cancels terms of the inputs' size ((1 - t) x against
     * softplus(-x)) loses their rounding, not its own. */
    double mag = 1;
    for (int k = 0; k < c->nin; k++) mag = fmax(mag, fmax(fabs(c->lo[k]), fabs(c->hi[k])));
    double atol = tol(dt) * mag, sum = 0;
    for (int i = 0; i < N_ * C_; i++) sum += pw[i];
    for (int r = 0; r < 3; r++) {
        ct_tensor *out = c->call(in, c->p, rs[r]);
        if (!out) fprintf(stderr, "%s: %s\n", c->name, ct_last_error());
        assert_non_null(out);
        assert_int_equal(ct_tensor_dtype(out), dt);
        double *got = tu_values(out);
        if (rs[r] == CT_REDUCTION_NONE) {
            int64_t shape[2] = {N_, C_};
            check_shape(out, 2, shape);
            tu_assert_close(got, pw, N_ * C_, tol(dt), atol);
        } else {
            assert_int_equal(ct_tensor_ndim(out), 0);
            double ref = rs[r] == CT_REDUCTION_MEAN ? sum / (N_ * C_) : sum;
            double scale = rs[r] == CT_REDUCTION_SUM ? N_ * C_ : 1;
            tu_assert_close(got, &ref, 1, tol(dt), atol * scale);
        }
        free(got);
        ct_tensor_release(out);
    }
}

static void test_pointwise_values(void **state) {
    (void)state;
    tu_seed();
    for (size_t ci = 0; ci < NCASES; ci++) {
        const pw_case *c = &cases[ci];
        for (size_t di = 0; di < 4; di++) {
            ct_dtype dt = tu_float_dtypes[di];
            for (int view = 0; view < 2; view++) {
                ct_tensor *in[4] = {NULL};
                for (int k = 0; k < c->nin; k++) {
                    in[k] = make_input(c, k, dt);
                    if (view && in[k]) { /* every input a non-contiguous view */
                        ct_tensor *v = tu_noncontig(in[k]);
                        ct_tensor_release(in[k]);
                        in[k] = v;
                    }
                }
                double pw[N_ * C_];
                pointwise_ref(c, in, pw);
                check_reductions(c, in, pw, dt);
                release_all(c->nin, in);
            }
        }
    }
}

typedef struct gc_ctx {
    const pw_case *c;
    ct_reduction r;
} gc_ctx;

static ct_tensor *gc_fn(ct_tensor *const *in, void *ctx) {
    const gc_ctx *g = ctx;
    ct_tensor *all[4] = {NULL};
    for (int k = 0; k < g->c->nin && !g->c->absent[k]; k++) all[k] = in[k];
    return g->c->call(all, g->c->p, g->r);
}

static void test_pointwise_gradcheck(void **state) {
    (void)state;
    tu_seed();
    for (size_t ci = 0; ci < NCASES; ci++) {
        const pw_case *c = &cases[ci];
        ct_tensor *in[4] = {NULL};
        for (int k = 0; k < c->nin; k++) {
            in[k] = make_input(c, k, CT_F64);
            if (in[k] && c->diff[k]) assert_int_equal(ct_requires_grad_(in[k], true), CT_OK);
        }
        int present = 0; /* absent inputs come last */
        while (present < c->nin && in[present]) present++;
        for (int r = 0; r < 2; r++) {
            gc_ctx g = {c, r == 0 ? CT_REDUCTION_NONE : CT_REDUCTION_MEAN};
            gradcheck_ok(c->name, gc_fn, &g, present, in);
        }
        release_all(c->nin, in);
    }
}

/* ---- pinned points -------------------------------------------------------------------------- */
static void test_bce_edges(void **state) {
    (void)state;
    /* log(0) is clamped to -100: x = 0 with t = 1 costs 100, x = 1 with t = 0 too. */
    double xv[4] = {0, 1, 0, 1}, tv[4] = {1, 0, 0, 1};
    int64_t s4[1] = {4};
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        ct_tensor *x = tu_from_f64(xv, 1, s4, dt), *t = tu_from_f64(tv, 1, s4, dt);
        ct_tensor *l = ct_binary_cross_entropy(x, t, NULL, CT_REDUCTION_NONE);
        assert_non_null(l);
        double *g = tu_values(l), ref[4] = {100, 100, 0, 0};
        tu_assert_close(g, ref, 4, 0, 0);
        free(g);
        release_all(3, (ct_tensor *[]){x, t, l});
    }
    /* Extreme logits stay finite and exact: softplus(-x) for x = +-100, 1e4. */
    double lv[4] = {100, -100, 1e4, -1e4}, lt[4] = {1, 0, 0, 1};
    for (size_t di = 0; di < 2; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        ct_tensor *x = tu_from_f64(lv, 1, s4, dt), *t = tu_from_f64(lt, 1, s4, dt);
        ct_tensor *l = ct_binary_cross_entropy_with_logits(x, t, NULL, NULL, CT_REDUCTION_NONE);
        assert_non_null(l);
        double *g = tu_values(l), ref[4];
        for (int i = 0; i < 4; i++) {
            double v[4] = {tu_round(lv[i], dt), lt[i], 1, 1};
            ref[i] = ref_bce_logits(v, 0);
        }
        tu_assert_close(g, ref, 4, tol(dt), 1e-30);
        free(g);
        release_all(3, (ct_tensor *[]){x, t, l});
    }
}

static void test_kl_div_zero_and_batchmean(void **state) {
    (void)state;
    tu_seed();
    /* Targets of 0 count 0, and the gradient wrt target stays finite there:
     * t log t contributes 0 (its log is read at 1), leaving -x. */
    double xv[4] = {-1, -2, -0.5, -3}, tv[4] = {0, 0.5, 0, 0.25};
    int64_t s4[1] = {4};
    ct_tensor *x = leaf_of(xv, 1, s4, CT_F64), *t = leaf_of(tv, 1, s4, CT_F64);
    ct_tensor *l = ct_kl_div(x, t, CT_REDUCTION_SUM, false);
    assert_non_null(l);
    double got, ref = 0.5 * log(0.5) + 0.5 * 2 + 0.25 * log(0.25) + 0.25 * 3;
    assert_int_equal(ct_tensor_item(l, &got), CT_OK);
    assert_true(fabs(got - ref) < 1e-14);
    backward_ones(l);
    double *gt = tu_values(ct_grad(t)), *gx = tu_values(ct_grad(x));
    double rgt[4] = {1, log(0.5) + 1 + 2, 0.5, log(0.25) + 1 + 3};
    double rgx[4] = {0, -0.5, 0, -0.25};
    tu_assert_close(gt, rgt, 4, 1e-12, 1e-12);
    tu_assert_close(gx, rgx, 4, 1e-12, 1e-12);
    free(gt);
    free(gx);
    release_all(3, (ct_tensor *[]){x, t, l});
    /* batchmean divides the sum by the first dim's size. */
    int64_t sh[3] = {3, 4, 2};
    ct_tensor *a = tu_rand(3, sh, CT_F64, -3, 0, NULL), *b = tu_rand(3, sh, CT_F64, 0.01, 1, NULL);
    ct_tensor *s = ct_kl_div(a, b, CT_REDUCTION_SUM, false);
    ct_tensor *bm = ct_kl_div(a, b, CT_REDUCTION_BATCHMEAN, false);
    double vs, vb;
    assert_int_equal(ct_tensor_item(s, &vs), CT_OK);
    assert_int_equal(ct_tensor_item(bm, &vb), CT_OK);
    assert_true(fabs(vb - vs / 3) < 1e-13 * fabs(vs) + 1e-15);
    tu_assert_null_error(ct_l1_loss(a, b, CT_REDUCTION_BATCHMEAN), CT_ERR_INVALID_ARG,
                         "ct_l1_loss", "unknown reduction 3");
    release_all(4, (ct_tensor *[]){a, b, s, bm});
}

/* ---- cosine similarity and cosine embedding loss -------------------------------------------- */
static void ref_cos(const double *a, const double *b, int64_t n, int64_t d, int dim, double eps,
                    double *out) {
    /* a, b [n, d]; dim 1: n results over d; dim 0: d results over n */
    int64_t outer = dim == 1 ? n : d, inner = dim == 1 ? d : n;
    for (int64_t o = 0; o < outer; o++) {
        double na = 0, nb = 0, dot = 0;
        for (int64_t i = 0; i < inner; i++) {
            int64_t at = dim == 1 ? o * d + i : i * d + o;
            na += a[at] * a[at], nb += b[at] * b[at];
        }
        na = fmax(sqrt(na), eps), nb = fmax(sqrt(nb), eps);
        for (int64_t i = 0; i < inner; i++) {
            int64_t at = dim == 1 ? o * d + i : i * d + o;
            dot += a[at] / na * (b[at] / nb);
        }
        out[o] = dot;
    }
}

static ct_tensor *cos_fn(ct_tensor *const *in, void *ctx) {
    return ct_cosine_similarity(in[0], in[1], *(int *)ctx, 1e-8);
}

static void test_cosine_similarity(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {4, 6}, row[1] = {6};
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        for (int dim = 0; dim < 2; dim++)
            for (int bc = 0; bc < 2; bc++) {
                ct_tensor *a0 = tu_rand(2, sh, dt, -1, 1, NULL), *a = tu_noncontig(a0);
                ct_tensor_release(a0);
                ct_tensor *b = bc ? tu_rand(1, row, dt, -1, 1, NULL) : tu_rand(2, sh, dt, -1, 1, NULL);
                ct_tensor *be = bc ? ct_expand(b, 2, sh) : ct_tensor_retain(b);
                ct_tensor *r = ct_cosine_similarity(a, b, dim == 0 ? -2 : 1, 1e-8);
                assert_non_null(r);
                double *va = tu_values(a), *vb = tu_values(be), *g = tu_values(r), ref[6];
                ref_cos(va, vb, 4, 6, dim, 1e-8, ref);
                assert_int_equal(ct_tensor_numel(r), dim == 1 ? 4 : 6);
                tu_assert_close(g, ref, dim == 1 ? 4 : 6, tol(dt), tol(dt));
                free(va), free(vb), free(g);
                release_all(4, (ct_tensor *[]){a, b, be, r});
            }
    }
    /* A zero vector: its norm is clamped to eps, the similarity is 0. */
    double z[3] = {0, 0, 0}, o[3] = {1, 2, 3};
    int64_t s3[1] = {3};
    ct_tensor *a = tu_from_f64(z, 1, s3, CT_F32), *b = tu_from_f64(o, 1, s3, CT_F32);
    ct_tensor *r = ct_cosine_similarity(a, b, 0, 1e-8);
    double v;
    assert_int_equal(ct_tensor_item(r, &v), CT_OK);
    assert_true(v == 0);
    release_all(3, (ct_tensor *[]){a, b, r});
    /* gradcheck, both dims, with broadcasting */
    for (int dim = 0; dim < 2; dim++) {
        ct_tensor *ga = tu_rand(2, sh, CT_F64, -1, 1, NULL), *gb = tu_rand(1, row, CT_F64, -1, 1, NULL);
        ct_requires_grad_(ga, true);
        ct_requires_grad_(gb, true);
        gradcheck_ok("cosine_similarity", cos_fn, &dim, 2, (ct_tensor *[]){ga, gb});
        release_all(2, (ct_tensor *[]){ga, gb});
    }
    ct_tensor *s0 = ct_tensor_scalar(1, CT_F32, CT_CPU);
    tu_assert_null_error(ct_cosine_similarity(s0, s0, 0, 1e-8), CT_ERR_SHAPE,
                         "ct_cosine_similarity", "at least 1 dim");
    ct_tensor *m = tu_rand(2, sh, CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_cosine_similarity(m, m, 2, 1e-8), CT_ERR_INDEX, "ct_cosine_similarity");
    release_all(2, (ct_tensor *[]){s0, m});
}

static ct_tensor *cel_fn(ct_tensor *const *in, void *ctx) {
    return ct_cosine_embedding_loss(in[0], in[1], (ct_tensor *)ctx, 0.2, CT_REDUCTION_MEAN);
}

static void test_cosine_embedding_loss(void **state) {
    (void)state;
    tu_seed();
    enum { n = 6, d = 5 };
    int64_t sh[2] = {n, d}, ts[1] = {n};
    double tv[n] = {1, -1, 1, -1, -1, 0};
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        ct_tensor *a = tu_rand(2, sh, dt, -1, 1, NULL), *b = tu_rand(2, sh, dt, -1, 1, NULL);
        ct_tensor *t = tu_from_f64(tv, 1, ts, CT_I64);
        double *va = tu_values(a), *vb = tu_values(b), ref[n], sum = 0;
        for (int i = 0; i < n; i++) {
            double p = 0, m1 = 1e-12, m2 = 1e-12;
            for (int j = 0; j < d; j++) {
                p += va[i * d + j] * vb[i * d + j];
                m1 += va[i * d + j] * va[i * d + j];
                m2 += vb[i * d + j] * vb[i * d + j];
            }
            double c = p / sqrt(m1 * m2);
            ref[i] = tv[i] == 1 ? 1 - c : tv[i] == -1 ? fmax(0, c - 0.2) : 0;
            sum += ref[i];
        }
        ct_tensor *l = ct_cosine_embedding_loss(a, b, t, 0.2, CT_REDUCTION_NONE);
        ct_tensor *lm = ct_cosine_embedding_loss(a, b, t, 0.2, CT_REDUCTION_MEAN);
        assert_non_null(l);
        assert_non_null(lm);
        double *g = tu_values(l), gm, mean = sum / n;
        assert_int_equal(ct_tensor_item(lm, &gm), CT_OK);
        tu_assert_close(g, ref, n, tol(dt), tol(dt));
        tu_assert_close(&gm, &mean, 1, tol(dt), tol(dt));
        free(va), free(vb), free(g);
        release_all(5, (ct_tensor *[]){a, b, t, l, lm});
    }
    ct_tensor *a = tu_rand(2, sh, CT_F64, -1, 1, NULL), *b = tu_rand(2, sh, CT_F64, -1, 1, NULL);
    ct_tensor *t = tu_from_f64(tv, 1, ts, CT_F64);
    ct_requires_grad_(a, true);
    ct_requires_grad_(b, true);
    gradcheck_ok("cosine_embedding_loss", cel_fn, t, 2, (ct_tensor *[]){a, b});
    int64_t bad[1] = {n - 1};
    ct_tensor *t2 = ct_tensor_zeros(1, bad, CT_F32, CT_CPU);
    tu_assert_null_error(ct_cosine_embedding_loss(a, b, t2, 0, CT_REDUCTION_MEAN), CT_ERR_SHAPE,
                         "ct_cosine_embedding_loss", "1-d target of 6 entries");
    release_all(4, (ct_tensor *[]){a, b, t, t2});
}

/* ---- cross-entropy with class probabilities ------------------------------------------------- */
/* logits and target [n, c, inner] row-major; weight [c] or NULL. */
static void ref_ce_prob(const double *x, const double *t, const double *w, int64_t n, int64_t c,
                        int64_t inner, double ls, double *out) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < inner; k++) {
            double mx = -INFINITY, s = 0, l = 0;
            for (int64_t j = 0; j < c; j++) mx = fmax(mx, x[(i * c + j) * inner + k]);
            for (int64_t j = 0; j < c; j++) s += exp(x[(i * c + j) * inner + k] - mx);
            for (int64_t j = 0; j < c; j++) {
                int64_t at = (i * c + j) * inner + k;
                double tt = t[at] * (1 - ls) + ls / c;
                l -= (w ? w[j] : 1) * (x[at] - mx - log(s)) * tt;
            }
            out[i * inner + k] = l;
        }
}

typedef struct ce_ctx {
    ct_tensor *w;
    double ls;
    ct_reduction r;
} ce_ctx;

static ct_tensor *ce_fn(ct_tensor *const *in, void *ctx) {
    const ce_ctx *c = ctx;
    return ct_cross_entropy(in[0], in[1], c->w, c->r, -100, c->ls);
}

static void test_cross_entropy_prob(void **state) {
    (void)state;
    tu_seed();
    enum { n = 3, c = 5, inner = 4 };
    int64_t s3[3] = {n, c, inner}, s2[2] = {n, c}, sw[1] = {c};
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        for (int variant = 0; variant < 4; variant++) {
            bool three = variant & 1, weighted = variant & 2;
            int nd = three ? 3 : 2;
            const int64_t *sh = three ? s3 : s2;
            int64_t in_ = three ? inner : 1, rows = n * in_;
            double ls = variant == 3 ? 0.15 : 0;
            ct_tensor *x = tu_rand(nd, sh, dt, -3, 3, NULL), *t = tu_rand(nd, sh, dt, 0, 1, NULL);
            ct_tensor *w = weighted ? tu_rand(1, sw, dt, 0.2, 2, NULL) : NULL;
            ct_tensor *xv = tu_noncontig(x);
            double *vx = tu_values(x), *vt = tu_values(t), *vw = w ? tu_values(w) : NULL;
            double ref[n * inner], sum = 0;
            ref_ce_prob(vx, vt, vw, n, c, in_, ls, ref);
            for (int64_t i = 0; i < rows; i++) sum += ref[i];
            ct_tensor *l = ct_cross_entropy(xv, t, w, CT_REDUCTION_NONE, -100, ls);
            ct_tensor *lm = ct_cross_entropy_prob(x, t, w, CT_REDUCTION_MEAN, ls);
            ct_tensor *lsum = ct_cross_entropy_prob(x, t, w, CT_REDUCTION_SUM, ls);
            assert_non_null(l);
            assert_non_null(lm);
            assert_non_null(lsum);
            assert_int_equal(ct_tensor_numel(l), rows);
            double *g = tu_values(l), gm, gs, mean = sum / (double)rows;
            assert_int_equal(ct_tensor_item(lm, &gm), CT_OK);
            assert_int_equal(ct_tensor_item(lsum, &gs), CT_OK);
            double tl = dt == CT_BF16 ? 0.15 : dt == CT_F16 ? 3e-2 : tol(dt);
            tu_assert_close(g, ref, rows, tl, tl);
            tu_assert_close(&gm, &mean, 1, tl, tl);
            tu_assert_close(&gs, &sum, 1, tl, tl * rows);
            free(vx), free(vt), free(vw), free(g);
            release_all(7, (ct_tensor *[]){x, t, w, xv, l, lm, lsum});
        }
    }
    /* gradcheck wrt logits and target, with weight and smoothing */
    ct_tensor *x = tu_rand(3, s3, CT_F64, -2, 2, NULL), *t = tu_rand(3, s3, CT_F64, 0, 1, NULL);
    ct_tensor *w = tu_rand(1, sw, CT_F64, 0.5, 2, NULL);
    ct_requires_grad_(x, true);
    ct_requires_grad_(t, true);
    ce_ctx cx = {w, 0.1, CT_REDUCTION_MEAN};
    gradcheck_ok("cross_entropy prob", ce_fn, &cx, 2, (ct_tensor *[]){x, t});
    cx = (ce_ctx){NULL, 0, CT_REDUCTION_NONE};
    gradcheck_ok("cross_entropy prob none", ce_fn, &cx, 2, (ct_tensor *[]){x, t});
    tu_assert_null_error(ct_cross_entropy(x, t, NULL, CT_REDUCTION_MEAN, 1, 0),
                         CT_ERR_INVALID_ARG, "ct_cross_entropy", "ignore_index");
    ct_tensor *t2 = tu_rand(2, s2, CT_F64, 0, 1, NULL);
    tu_assert_null_error(ct_cross_entropy(x, t2, NULL, CT_REDUCTION_MEAN, -100, 0), CT_ERR_DTYPE,
                         "ct_cross_entropy", "int64");
    tu_assert_null_error(ct_cross_entropy_prob(x, t2, NULL, CT_REDUCTION_MEAN, 0), CT_ERR_SHAPE,
                         "ct_cross_entropy_prob", "target size");
    tu_assert_null_error(ct_cross_entropy_prob(x, t, NULL, CT_REDUCTION_MEAN, 1.5),
                         CT_ERR_INVALID_ARG, "ct_cross_entropy_prob", "label_smoothing");
    ct_tensor *w2 = tu_rand(1, (int64_t[]){c + 1}, CT_F64, 0, 1, NULL);
    tu_assert_null_error(ct_cross_entropy_prob(x, t, w2, CT_REDUCTION_MEAN, 0), CT_ERR_SHAPE,
                         "ct_cross_entropy_prob", "weight");
    release_all(5, (ct_tensor *[]){x, t, w, t2, w2});
}

/* ---- refusals ----------------------------------------------------------------------------- */
static void test_errors(void **state) {
    (void)state;
    int64_t sh[2] = {3, 4}, sh2[2] = {3, 5};
    ct_tensor *x = tu_rand(2, sh, CT_F32, 0.1, 0.9, NULL), *y = tu_rand(2, sh2, CT_F32, 0, 1, NULL);
    ct_tensor *i = ct_tensor_zeros(2, sh, CT_I64, CT_CPU), *xd = tu_rand(2, sh, CT_F64, 0, 1, NULL);
    tu_assert_null_error(ct_binary_cross_entropy(NULL, x, NULL, CT_REDUCTION_MEAN),
                         CT_ERR_INVALID_ARG, "ct_binary_cross_entropy");
    tu_assert_null_error(ct_binary_cross_entropy(x, y, NULL, CT_REDUCTION_MEAN), CT_ERR_SHAPE,
                         "ct_binary_cross_entropy", "target size [3, 5]", "input size [3, 4]");
    tu_assert_null_error(ct_binary_cross_entropy_with_logits(x, y, NULL, NULL, CT_REDUCTION_SUM),
                         CT_ERR_SHAPE, "ct_binary_cross_entropy_with_logits", "target size");
    tu_assert_null_error(ct_binary_cross_entropy_with_logits(x, x, NULL, y, CT_REDUCTION_SUM),
                         CT_ERR_SHAPE, "ct_binary_cross_entropy_with_logits");
    tu_assert_null_error(ct_l1_loss(i, x, CT_REDUCTION_MEAN), CT_ERR_DTYPE, "ct_l1_loss",
                         "input");
    tu_assert_null_error(ct_l1_loss(x, y, CT_REDUCTION_MEAN), CT_ERR_SHAPE, "ct_l1_loss");
    tu_assert_null_error(ct_huber_loss(x, x, (ct_reduction)7, 1), CT_ERR_INVALID_ARG,
                         "ct_huber_loss", "unknown reduction 7");
    tu_assert_null_error(ct_huber_loss(x, x, CT_REDUCTION_MEAN, 0), CT_ERR_INVALID_ARG,
                         "ct_huber_loss", "delta");
    tu_assert_null_error(ct_smooth_l1_loss(x, x, CT_REDUCTION_MEAN, -1), CT_ERR_INVALID_ARG,
                         "ct_smooth_l1_loss", "beta");
    tu_assert_null_error(ct_smooth_l1_loss(x, y, CT_REDUCTION_MEAN, 0), CT_ERR_SHAPE,
                         "ct_smooth_l1_loss");
    tu_assert_null_error(ct_kl_div(x, i, CT_REDUCTION_MEAN, false), CT_ERR_DTYPE, "ct_kl_div",
                         "target");
    tu_assert_null_error(ct_margin_ranking_loss(x, x, NULL, 0, CT_REDUCTION_MEAN),
                         CT_ERR_INVALID_ARG, "ct_margin_ranking_loss");
    tu_assert_null_error(ct_cosine_embedding_loss(x, y, x, 0, CT_REDUCTION_MEAN), CT_ERR_SHAPE,
                         "ct_cosine_embedding_loss", "input2");
    /* Mixed float dtypes promote as the ops do (float64 here). */
    ct_tensor *l = ct_l1_loss(x, xd, CT_REDUCTION_MEAN);
    assert_non_null(l);
    assert_int_equal(ct_tensor_dtype(l), CT_F64);
    release_all(5, (ct_tensor *[]){x, y, i, xd, l});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pointwise_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pointwise_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bce_edges, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kl_div_zero_and_batchmean, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cosine_similarity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cosine_embedding_loss, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cross_entropy_prob, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
    };
    return tu_run_tests(tests);
}
