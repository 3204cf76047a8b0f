/* Autocast (ct_autocast_begin / ct_autocast_end, the table in src/ops/autocast.h).
 *
 * Table-driven: every op of the policy table, and ops outside it, run inside a CPU region
 * (bfloat16 and float16) on float32, bfloat16, float16, float64 and mixed inputs, contiguous
 * and not: the result has the dtype the policy gives, and its values are those of the same op
 * in float64 on the inputs rounded to the dtype the policy computes in (the ops' own values
 * are checked against float64 loops in their test files; here the dtype an op runs in is
 * what is under test); an op outside the table gives bit for bit what it gives outside a
 * region. Then a small model (linear -> relu -> linear -> cross_entropy) whose loss and
 * gradients are checked against a float64 reference written here, from bfloat16-rounded
 * casts; nesting and restoring; thread-locality; the cast cache (one cast per weight per
 * region, released at the outermost end, remade after an in-place write or when grad mode
 * needs a recorded cast, safe with scopes); backward inside a region; and bad inputs. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "autograd_util.h"
#include "test_util.h"

#include "test_fixture.h"

/* Private test hooks (src/ops/autocast.c): casts made and cache hits on this thread; casts
 * taken from lasting copies. */
void cti_autocast_counts(int64_t *casts, int64_t *hits);
int64_t cti_autocast_kept_count(void);
/* src/autograd/graph.c: a leaf's lasting cast (borrowed), NULL when it has none. */
ct_tensor *cti_ag_amp_copy(const ct_tensor *t, unsigned *src_version, unsigned *copy_version);

static void ok(ct_status s) {
    if (s != CT_OK) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_int_equal(s, CT_OK);
}

static ct_tensor *checked(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

static ct_tensor *i64_tensor(int n, const int64_t *vals) {
    return checked(ct_tensor_from_data(vals, CT_I64, 1, (int64_t[]){n}));
}

/* ---- the ops, as the table runs them ------------------------------------------------------ */

#define MAXIN 5

typedef ct_tensor *(*op_fn)(ct_tensor *const *t);

static ct_tensor *f_matmul(ct_tensor *const *t) { return ct_matmul(t[0], t[1]); }
static ct_tensor *f_mm(ct_tensor *const *t) { return ct_mm(t[0], t[1]); }
static ct_tensor *f_bmm(ct_tensor *const *t) { return ct_bmm(t[0], t[1]); }
static ct_tensor *f_addmm(ct_tensor *const *t) { return ct_addmm(t[0], t[1], t[2], 0.5, 2.0); }
static ct_tensor *f_linear(ct_tensor *const *t) { return ct_linear(t[0], t[1], t[2]); }
static ct_tensor *f_conv2d(ct_tensor *const *t) {
    return ct_conv2d(t[0], t[1], t[2], NULL, (int64_t[]){1, 1}, NULL, 1);
}
static ct_tensor *f_sdpa(ct_tensor *const *t) {
    return ct_scaled_dot_product_attention(t[0], t[1], t[2], t[3], 0.0, false, 0.0, NULL);
}
static ct_tensor *f_lce(ct_tensor *const *t) {
    ct_tensor *tg = i64_tensor(6, (int64_t[]){1, 0, 4, 2, 3, 1});
    ct_tensor *r = ct_linear_cross_entropy(t[0], t[1], t[2], tg, -100, 0.1, CT_REDUCTION_MEAN);
    ct_tensor_release(tg);
    return r;
}
static ct_tensor *f_mlp_gelu(ct_tensor *const *t) {
    return ct_mlp_gelu(t[0], t[1], t[2], t[3], t[4], CT_GELU_TANH);
}
static ct_tensor *f_exp(ct_tensor *const *t) { return ct_exp(t[0]); }
static ct_tensor *f_log(ct_tensor *const *t) { return ct_log(t[0]); }
static ct_tensor *f_rsqrt(ct_tensor *const *t) { return ct_rsqrt(t[0]); }
static ct_tensor *f_reciprocal(ct_tensor *const *t) { return ct_reciprocal(t[0]); }
static ct_tensor *f_pow(ct_tensor *const *t) { return ct_pow(t[0], t[1]); }
static ct_tensor *f_pow_scalar(ct_tensor *const *t) { return ct_pow_scalar(t[0], 2.5); }
static ct_tensor *f_softplus(ct_tensor *const *t) { return ct_softplus(t[0], 1.0, 20.0); }
static ct_tensor *f_layer_norm(ct_tensor *const *t) {
    return ct_layer_norm(t[0], CT_LIST(8), t[1], t[2], 1e-5, NULL, NULL);
}
static ct_tensor *f_softmax(ct_tensor *const *t) { return ct_softmax(t[0], -1); }
static ct_tensor *f_log_softmax(ct_tensor *const *t) { return ct_log_softmax(t[0], 1); }
static ct_tensor *f_cross_entropy(ct_tensor *const *t) {
    ct_tensor *tg = i64_tensor(4, (int64_t[]){1, 0, 4, 2});
    ct_tensor *r = ct_cross_entropy(t[0], tg, t[1], CT_REDUCTION_MEAN, -100, 0.0);
    ct_tensor_release(tg);
    return r;
}
static ct_tensor *f_nll_loss(ct_tensor *const *t) {
    ct_tensor *tg = i64_tensor(4, (int64_t[]){3, 0, 4, 2});
    ct_tensor *r = ct_nll_loss(t[0], tg, NULL, CT_REDUCTION_SUM, -100);
    ct_tensor_release(tg);
    return r;
}
static ct_tensor *f_mse_loss(ct_tensor *const *t) {
    return ct_mse_loss(t[0], t[1], CT_REDUCTION_NONE);
}
static ct_tensor *f_sum(ct_tensor *const *t) { return ct_sum(t[0], CT_DIMS(1), false); }
static ct_tensor *f_sum_all(ct_tensor *const *t) { return ct_sum(t[0], CT_NONE, false); }
static ct_tensor *f_prod(ct_tensor *const *t) { return ct_prod(t[0], CT_DIMS(-1), true); }
static ct_tensor *f_cumsum(ct_tensor *const *t) { return ct_cumsum(t[0], 0); }
static ct_tensor *f_norm(ct_tensor *const *t) { return ct_norm(t[0], 2.0, CT_NONE, false); }
static ct_tensor *f_scatter_add(ct_tensor *const *t) {
    int64_t iv[6] = {0, 3, 1, 2, 2, 0};
    ct_tensor *ix = checked(ct_tensor_from_data(iv, CT_I64, 2, (int64_t[]){3, 2}));
    ct_tensor *r = ct_scatter_add(t[0], 1, ix, t[1]);
    ct_tensor_release(ix);
    return r;
}
static ct_tensor *f_rms_norm(ct_tensor *const *t) {
    return ct_rms_norm(t[0], CT_LIST(8), t[1], 1e-6, NULL);
}
static ct_tensor *f_rope(ct_tensor *const *t) { return ct_rope(t[0], t[1], t[2], CT_ROPE_HALF); }
/* outside the table */
static ct_tensor *f_add(ct_tensor *const *t) { return ct_add(t[0], t[1]); }
static ct_tensor *f_mul(ct_tensor *const *t) { return ct_mul(t[0], t[1]); }
static ct_tensor *f_relu(ct_tensor *const *t) { return ct_relu(t[0]); }
static ct_tensor *f_gelu(ct_tensor *const *t) { return ct_gelu(t[0], CT_GELU_TANH); }
static ct_tensor *f_sqrt(ct_tensor *const *t) { return ct_sqrt(t[0]); }
static ct_tensor *f_tanh(ct_tensor *const *t) { return ct_tanh(t[0]); }
static ct_tensor *f_mean(ct_tensor *const *t) { return ct_mean(t[0], CT_DIMS(0), false); }
static ct_tensor *f_var(ct_tensor *const *t) { return ct_var(t[0], CT_NONE, 1.0, false); }
static ct_tensor *f_cat(ct_tensor *const *t) { return ct_cat(2, t, 0); }
static ct_tensor *f_swiglu(ct_tensor *const *t) { return ct_swiglu(t[0], t[1]); }
static ct_tensor *f_where(ct_tensor *const *t) {
    ct_tensor *c = ct_gt_scalar(t[0], 0.0);
    ct_tensor *r = c ? ct_where(c, t[0], t[1]) : NULL;
    ct_tensor_release(c);
    return r;
}
static ct_tensor *f_exp_inplace(ct_tensor *const *t) {
    ct_tensor *c = ct_clone(t[0]);
    if (c && ct_exp_(c) != CT_OK) {
        ct_tensor_release(c);
        return NULL;
    }
    return c;
}
static ct_tensor *f_softmax_backward(ct_tensor *const *t) {
    return ct_softmax_backward(t[0], t[1], -1);
}
/* sums its gradient over the dims where input broadcast: with ct_sum, held off */
static ct_tensor *f_mse_loss_backward(ct_tensor *const *t) {
    return ct_mse_loss_backward(t[0], t[1], t[2], CT_REDUCTION_NONE);
}

/* ---- the table ----------------------------------------------------------------------------- */

typedef enum rule {
    LOWER,   /* runs in the region's dtype */
    LOWER_F32_LOSS, /* runs in the region's dtype, returns float32 (linear_cross_entropy) */
    FP32,    /* runs in float32 */
    PROMOTE, /* runs in the widest of the region's and the inputs' dtypes */
    FIRST,   /* runs in the first input's dtype */
    SAME,    /* outside the table: as outside a region, bit for bit */
} rule;

typedef struct op_case {
    const char *name;
    op_fn fn;
    rule rule;
    int nin;
    shp shape[MAXIN];
    double lo, hi;
} op_case;

static const op_case cases[] = {
    {"matmul", f_matmul, LOWER, 2, {SHP(3, 4, 5), SHP(5, 6)}, -1, 1},
    {"mm", f_mm, LOWER, 2, {SHP(4, 5), SHP(5, 3)}, -1, 1},
    {"bmm", f_bmm, LOWER, 2, {SHP(2, 3, 4), SHP(2, 4, 5)}, -1, 1},
    {"addmm", f_addmm, LOWER, 3, {SHP(3), SHP(2, 4), SHP(4, 3)}, -1, 1},
    {"linear", f_linear, LOWER, 3, {SHP(2, 3, 4), SHP(5, 4), SHP(5)}, -1, 1},
    {"conv2d", f_conv2d, LOWER, 3, {SHP(1, 2, 5, 5), SHP(3, 2, 3, 3), SHP(3)}, -1, 1},
    {"sdpa", f_sdpa, LOWER, 4, {SHP(1, 2, 4, 8), SHP(1, 2, 6, 8), SHP(1, 2, 6, 8), SHP(4, 6)},
     -1, 1},
    {"linear_cross_entropy", f_lce, LOWER_F32_LOSS, 3, {SHP(6, 4), SHP(5, 4), SHP(5)}, -1, 1},
    {"mlp_gelu", f_mlp_gelu, LOWER, 5, {SHP(2, 3, 4), SHP(6, 4), SHP(6), SHP(5, 6), SHP(5)}, -1,
     1},
    {"exp", f_exp, FP32, 1, {SHP(3, 4)}, -2, 2},
    {"log", f_log, FP32, 1, {SHP(3, 4)}, 0.1, 3},
    {"rsqrt", f_rsqrt, FP32, 1, {SHP(3, 4)}, 0.1, 3},
    {"reciprocal", f_reciprocal, FP32, 1, {SHP(3, 4)}, 0.5, 3},
    {"pow", f_pow, FP32, 2, {SHP(3, 4), SHP(4)}, 0.5, 2},
    {"pow_scalar", f_pow_scalar, FP32, 1, {SHP(3, 4)}, 0.5, 2},
    {"softplus", f_softplus, FP32, 1, {SHP(3, 4)}, -3, 3},
    {"layer_norm", f_layer_norm, FP32, 3, {SHP(2, 3, 8), SHP(8), SHP(8)}, -2, 2},
    {"softmax", f_softmax, FP32, 1, {SHP(3, 7)}, -3, 3},
    {"log_softmax", f_log_softmax, FP32, 1, {SHP(2, 5, 3)}, -3, 3},
    {"cross_entropy", f_cross_entropy, FP32, 2, {SHP(4, 5), SHP(5)}, 0.2, 2},
    {"nll_loss", f_nll_loss, FP32, 1, {SHP(4, 5)}, -3, 0},
    {"mse_loss", f_mse_loss, FP32, 2, {SHP(3, 4), SHP(3, 4)}, -2, 2},
    {"sum", f_sum, FP32, 1, {SHP(3, 9)}, -1, 1},
    {"sum_all", f_sum_all, FP32, 1, {SHP(3, 9)}, -1, 1},
    {"prod", f_prod, FP32, 1, {SHP(2, 5)}, 0.5, 1.5},
    {"cumsum", f_cumsum, FP32, 1, {SHP(6, 3)}, -1, 1},
    {"norm", f_norm, FP32, 1, {SHP(4, 5)}, -1, 1},
    {"scatter_add", f_scatter_add, PROMOTE, 2, {SHP(3, 4), SHP(3, 2)}, -1, 1},
    {"rms_norm", f_rms_norm, FIRST, 2, {SHP(2, 3, 8), SHP(8)}, -2, 2},
    {"rope", f_rope, FIRST, 3, {SHP(2, 4, 8), SHP(4, 4), SHP(4, 4)}, -1, 1},
    {"add", f_add, SAME, 2, {SHP(3, 4), SHP(4)}, -2, 2},
    {"mul", f_mul, SAME, 2, {SHP(3, 4), SHP(3, 4)}, -2, 2},
    {"relu", f_relu, SAME, 1, {SHP(3, 4)}, -2, 2},
    {"gelu", f_gelu, SAME, 1, {SHP(3, 4)}, -2, 2},
    {"sqrt", f_sqrt, SAME, 1, {SHP(3, 4)}, 0.1, 2},
    {"tanh", f_tanh, SAME, 1, {SHP(3, 4)}, -2, 2},
    {"mean", f_mean, SAME, 1, {SHP(5, 3)}, -2, 2},
    {"var", f_var, SAME, 1, {SHP(5, 3)}, -2, 2},
    {"cat", f_cat, SAME, 2, {SHP(2, 3), SHP(4, 3)}, -2, 2},
    {"swiglu", f_swiglu, SAME, 2, {SHP(3, 4), SHP(3, 4)}, -2, 2},
    {"where", f_where, SAME, 2, {SHP(3, 4), SHP(3, 4)}, -2, 2},
    {"exp_ (in place)", f_exp_inplace, SAME, 1, {SHP(3, 4)}, -2, 2},
    {"softmax_backward", f_softmax_backward, SAME, 2, {SHP(3, 4), SHP(3, 4)}, 0, 1},
    {"mse_loss_backward", f_mse_loss_backward, SAME, 3, {SHP(3, 4), SHP(4), SHP(3, 4)}, -1, 1},
};

/* The input dtypes each case runs with: all one dtype, or the first bfloat16 and the rest
 * float32 (a bfloat16 activation meeting float32 weights). */
typedef struct config {
    const char *name;
    ct_dtype first, rest;
} config;

static const config configs[] = {
    {"f32", CT_F32, CT_F32},   {"bf16", CT_BF16, CT_BF16}, {"f16", CT_F16, CT_F16},
    {"f64", CT_F64, CT_F64},   {"bf16+f32", CT_BF16, CT_F32},
};

static bool eligible(ct_dtype dt) { return dt == CT_F32 || dt == CT_F16 || dt == CT_BF16; }

/* The dtype a case computes in (its inputs are cast to) under region dtype r. */
static ct_dtype compute_dtype(const op_case *k, ct_dtype r, const ct_dtype *dts) {
    switch (k->rule) {
    case LOWER:
    case LOWER_F32_LOSS: return r;
    case FP32: return CT_F32;
    case PROMOTE: {
        ct_dtype to = r;
        for (int i = 0; i < k->nin; i++) to = ct_promote_types(to, dts[i]);
        return to;
    }
    case FIRST: return dts[0];
    case SAME: break;
    }
    return CT_NUM_DTYPES;
}

/* The result's dtype. */
static ct_dtype result_dtype(const op_case *k, ct_dtype compute) {
    return k->rule == LOWER_F32_LOSS ? CT_F32 : compute;
}

static double tol_of(ct_dtype dt) { return dt == CT_F32 ? 1e-4 : tu_rtol(dt); }

/* |got - ref| <= rtol (|ref| + max |ref|) + atol elementwise. */
static void expect_near(const char *what, ct_tensor *got, ct_tensor *ref, double tol,
                        double atol) {
    int64_t n = ct_tensor_numel(ref);
    assert_int_equal(ct_tensor_numel(got), n);
    double *g = tu_values(got), *r = tu_values(ref), mx = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(r[i]));
    for (int64_t i = 0; i < n; i++) {
        if (fabs(g[i] - r[i]) <= tol * (fabs(r[i]) + mx) + atol) continue;
        fprintf(stderr, "%s: element %lld: got %.9g, expected %.9g (rtol %g, atol %g)\n", what,
                (long long)i, g[i], r[i], tol, atol);
        fail();
    }
    free(g);
    free(r);
}

static void expect_close(const char *what, ct_tensor *got, ct_tensor *ref, double tol) {
    expect_near(what, got, ref, tol, 0);
}

static void expect_close_abs(const char *what, ct_tensor *got, ct_tensor *ref, double atol) {
    expect_near(what, got, ref, 0, atol);
}

/* Bit for bit, same dtype and shape; ref NULL: got must fail too. */
static void expect_identical(const char *what, ct_tensor *got, ct_tensor *ref) {
    if (!ref) {
        if (got) fprintf(stderr, "%s: succeeded in a region, fails outside\n", what);
        assert_null(got);
        return;
    }
    if (!got) fprintf(stderr, "%s: fails in a region: %s\n", what, ct_last_error());
    tu_assert_same_bits(what, got, ref);
}

static void run_case(const op_case *k, ct_dtype region, const config *cf, bool noncontig) {
    char what[160];
    snprintf(what, sizeof what, "%s, region %s, inputs %s%s", k->name, ct_dtype_name(region),
             cf->name, noncontig ? ", non-contiguous" : "");
    ct_tensor *in[MAXIN] = {0}, *ref_in[MAXIN] = {0};
    double *vals[MAXIN] = {0};
    ct_dtype dts[MAXIN];
    bool any = false;
    for (int i = 0; i < k->nin; i++) {
        dts[i] = i == 0 ? cf->first : cf->rest;
        any |= eligible(dts[i]);
        ct_tensor *t = tu_rand(k->shape[i].nd, k->shape[i].s, dts[i], k->lo, k->hi, &vals[i]);
        in[i] = noncontig ? tu_noncontig(t) : ct_tensor_retain(t);
        ct_tensor_release(t);
    }
    ok(ct_autocast_begin(CT_CPU, region));
    ct_tensor *got = k->fn(in);
    ct_status st = ct_last_status();
    ok(ct_autocast_end());
    if (k->rule == SAME || !any) {
        /* outside the table, or nothing eligible: as outside a region */
        ct_clear_error();
        ct_tensor *ref = k->fn(in);
        expect_identical(what, got, ref);
        ct_tensor_release(ref);
    } else {
        if (!got) fprintf(stderr, "%s: %s (%s)\n", what, ct_last_error(), ct_status_name(st));
        assert_non_null(got);
        ct_dtype cd = compute_dtype(k, region, dts), rd = result_dtype(k, cd);
        if (ct_tensor_dtype(got) != rd)
            fprintf(stderr, "%s: result %s, expected %s\n", what,
                    ct_dtype_name(ct_tensor_dtype(got)), ct_dtype_name(rd));
        assert_int_equal(ct_tensor_dtype(got), rd);
        /* the reference: the op in float64 on the inputs rounded to the compute dtype */
        for (int i = 0; i < k->nin; i++) {
            int64_t n = tu_numel(k->shape[i].nd, k->shape[i].s);
            for (int64_t j = 0; j < n; j++) vals[i][j] = tu_round(vals[i][j], cd);
            ref_in[i] = tu_from_f64(vals[i], k->shape[i].nd, k->shape[i].s, CT_F64);
        }
        ct_tensor *ref = checked(k->fn(ref_in));
        double tol = fmax(tol_of(cd), tol_of(rd));
        expect_close(what, got, ref, tol);
        ct_tensor_release(ref);
    }
    ct_tensor_release(got);
    for (int i = 0; i < k->nin; i++) {
        ct_tensor_release(in[i]);
        ct_tensor_release(ref_in[i]);
        free(vals[i]);
    }
}

static void test_op_table(void **state) {
    (void)state;
    const ct_dtype regions[] = {CT_BF16, CT_F16};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t r = 0; r < 2; r++)
            for (size_t f = 0; f < sizeof configs / sizeof configs[0]; f++)
                for (int nc = 0; nc < 2; nc++) run_case(&cases[c], regions[r], &configs[f], nc);
}

/* Integer inputs are never cast: sum, cumsum and matmul (a CPU integer product) of int64
 * stay int64. */
static void test_integers_not_cast(void **state) {
    (void)state;
    ct_tensor *x = checked(ct_tensor_arange(0, 12, 1, CT_I64, CT_CPU));
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *s = checked(ct_sum(x, CT_NONE, false));
    ct_tensor *c = checked(ct_cumsum(x, 0));
    ct_tensor *m = checked(ct_matmul(x, x));
    ok(ct_autocast_end());
    assert_int_equal(ct_tensor_dtype(s), CT_I64);
    assert_int_equal(ct_tensor_dtype(c), CT_I64);
    double v;
    ok(ct_tensor_item(s, &v));
    assert_true(v == 66);
    assert_int_equal(ct_tensor_dtype(m), CT_I64);
    ok(ct_tensor_item(m, &v));
    assert_true(v == 506); /* sum of k^2, k < 12 */
    ct_tensor_release(m);
    ct_tensor_release(s);
    ct_tensor_release(c);
    ct_tensor_release(x);
}

/* A region for one device type leaves the others' tensors alone. */
static void test_other_device_type(void **state) {
    (void)state;
    ct_tensor *a = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
    ok(ct_autocast_begin(CT_CUDA(0), CT_BF16));
    assert_true(ct_autocast_enabled(CT_CUDA(0)));
    assert_false(ct_autocast_enabled(CT_CPU));
    ct_tensor *at = checked(ct_t(a));
    ct_tensor *m = checked(ct_mm(a, at));
    ct_tensor *e = checked(ct_exp(a));
    ok(ct_autocast_end());
    assert_int_equal(ct_tensor_dtype(m), CT_F32);
    assert_int_equal(ct_tensor_dtype(e), CT_F32);
    ct_tensor_release(at);
    ct_tensor_release(m);
    ct_tensor_release(e);
    ct_tensor_release(a);
}

/* ---- a small model: linear -> relu -> linear -> cross_entropy --------------------------- */

enum { N = 8, D = 6, H = 10, C = 4 };

static double bf(double v) { return tu_round(v, CT_BF16); }

typedef struct mlp_ref {
    double loss, dw1[H * D], db1[H], dw2[C * H], db2[C];
} mlp_ref;

/* The float64 reference of what autocast computes: every linear on bfloat16 casts of its
 * inputs, its output rounded to bfloat16; the loss in float64 on those logits; the
 * gradients in float64 through the same rounded values, the gradients of the bfloat16
 * logits and activations rounded to bfloat16 as they are (their sums over the rows
 * cancel, so an unrounded reference would be off by more than the sums' rounding). */
static void mlp_reference(const double *x, const double *w1, const double *b1, const double *w2,
                          const double *b2, const int64_t *t, mlp_ref *r) {
    double h[N * H], a[N * H], z[N * C], dz[N * C], da[N * H];
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            double s = bf(b1[j]);
            for (int k = 0; k < D; k++) s += bf(x[n * D + k]) * bf(w1[j * D + k]);
            h[n * H + j] = bf(s);
            a[n * H + j] = h[n * H + j] > 0 ? h[n * H + j] : 0;
        }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            double s = bf(b2[c]);
            for (int j = 0; j < H; j++) s += a[n * H + j] * bf(w2[c * H + j]);
            z[n * C + c] = bf(s);
        }
    r->loss = 0;
    for (int n = 0; n < N; n++) {
        double m = -INFINITY, se = 0;
        for (int c = 0; c < C; c++) m = fmax(m, z[n * C + c]);
        for (int c = 0; c < C; c++) se += exp(z[n * C + c] - m);
        double lse = m + log(se);
        r->loss += (lse - z[n * C + t[n]]) / N;
        for (int c = 0; c < C; c++)
            dz[n * C + c] = bf((exp(z[n * C + c] - lse) - (c == t[n])) / N);
    }
    memset(r->dw2, 0, sizeof r->dw2);
    memset(r->db2, 0, sizeof r->db2);
    memset(r->dw1, 0, sizeof r->dw1);
    memset(r->db1, 0, sizeof r->db1);
    memset(da, 0, sizeof da);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            r->db2[c] += dz[n * C + c];
            for (int j = 0; j < H; j++) {
                r->dw2[c * H + j] += dz[n * C + c] * a[n * H + j];
                da[n * H + j] += dz[n * C + c] * bf(w2[c * H + j]);
            }
        }
    for (int n = 0; n < N; n++)
        for (int j = 0; j < H; j++) {
            double dh = h[n * H + j] > 0 ? bf(da[n * H + j]) : 0;
            r->db1[j] += dh;
            for (int k = 0; k < D; k++) r->dw1[j * D + k] += dh * bf(x[n * D + k]);
        }
}

typedef struct mlp {
    double *x, *w1, *b1, *w2, *b2;
    int64_t t[N];
    ct_tensor *tx, *tw1, *tb1, *tw2, *tb2, *tt;
} mlp;

/* Parameters: float32 leaves, except b2, a bfloat16 leaf (its gradient stays bfloat16). */
static void mlp_make(mlp *m) {
    m->tx = tu_rand(CT_SHAPE(N, D), CT_F32, -1, 1, &m->x);
    m->tw1 = tu_rand(CT_SHAPE(H, D), CT_F32, -0.6, 0.6, &m->w1);
    m->tb1 = tu_rand(CT_SHAPE(H), CT_F32, -0.3, 0.3, &m->b1);
    m->tw2 = tu_rand(CT_SHAPE(C, H), CT_F32, -0.6, 0.6, &m->w2);
    m->tb2 = tu_rand(CT_SHAPE(C), CT_BF16, -0.3, 0.3, &m->b2);
    for (int n = 0; n < N; n++) m->t[n] = tu_randint(0, C);
    m->tt = i64_tensor(N, m->t);
    ct_tensor *leaves[4] = {m->tw1, m->tb1, m->tw2, m->tb2};
    for (int i = 0; i < 4; i++) ok(ct_requires_grad_(leaves[i], true));
}

static void mlp_free(mlp *m) {
    ct_tensor *ts[6] = {m->tx, m->tw1, m->tb1, m->tw2, m->tb2, m->tt};
    release_all(6, ts);
    free(m->x);
    free(m->w1);
    free(m->b1);
    free(m->w2);
    free(m->b2);
}

/* The forward in a bfloat16 region, checking each result's dtype. */
static ct_tensor *mlp_loss(mlp *m) {
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *h = checked(ct_linear(m->tx, m->tw1, m->tb1));
    assert_int_equal(ct_tensor_dtype(h), CT_BF16);
    ct_tensor *a = checked(ct_relu(h));
    assert_int_equal(ct_tensor_dtype(a), CT_BF16);
    ct_tensor *z = checked(ct_linear(a, m->tw2, m->tb2));
    assert_int_equal(ct_tensor_dtype(z), CT_BF16);
    ct_tensor *loss = checked(ct_cross_entropy(z, m->tt, NULL, CT_REDUCTION_MEAN, -100, 0.0));
    assert_int_equal(ct_tensor_dtype(loss), CT_F32);
    ok(ct_autocast_end());
    ct_tensor_release(h);
    ct_tensor_release(a);
    ct_tensor_release(z);
    return loss;
}

static void expect_grad(const char *what, ct_tensor *leaf, ct_dtype dt, const double *ref) {
    ct_tensor *g = ct_grad(leaf);
    if (!g) fprintf(stderr, "%s: no gradient\n", what);
    assert_non_null(g);
    assert_int_equal(ct_tensor_dtype(g), dt);
    ct_tensor *r = tu_from_f64(ref, ct_tensor_ndim(leaf), ct_tensor_shape(leaf), CT_F64);
    expect_close(what, g, r, 2e-2);
    ct_tensor_release(r);
}

static void test_mlp_backward(void **state) {
    (void)state;
    mlp m;
    mlp_make(&m);
    mlp_ref r;
    mlp_reference(m.x, m.w1, m.b1, m.w2, m.b2, m.t, &r);
    ct_tensor *loss = mlp_loss(&m);
    double lv;
    ok(ct_tensor_item(loss, &lv));
    if (!(fabs(lv - r.loss) <= 1e-3 * fabs(r.loss)))
        fprintf(stderr, "loss %.9g, expected %.9g\n", lv, r.loss);
    assert_true(fabs(lv - r.loss) <= 1e-3 * fabs(r.loss));
    ok(ct_backward(loss, NULL, false));
    expect_grad("dw1", m.tw1, CT_F32, r.dw1);
    expect_grad("db1", m.tb1, CT_F32, r.db1);
    expect_grad("dw2", m.tw2, CT_F32, r.dw2);
    expect_grad("db2", m.tb2, CT_BF16, r.db2);
    ct_tensor_release(loss);
    mlp_free(&m);
}

/* ct_backward inside a region gives what it gives outside, bit for bit (the gradients run
 * in their forwards' dtypes either way), and leaves the region as it was. */
static void test_backward_inside_region(void **state) {
    (void)state;
    mlp m;
    mlp_make(&m);
    ct_tensor *leaves[4] = {m.tw1, m.tb1, m.tw2, m.tb2}, *outside[4];
    ct_tensor *loss = mlp_loss(&m);
    ok(ct_backward(loss, NULL, false));
    ct_tensor_release(loss);
    for (int i = 0; i < 4; i++) {
        outside[i] = ct_tensor_retain(ct_grad(leaves[i]));
        ct_zero_grad(leaves[i]);
    }
    loss = mlp_loss(&m);
    ok(ct_autocast_begin(CT_CPU, CT_F16));
    ok(ct_backward(loss, NULL, false));
    assert_true(ct_autocast_enabled(CT_CPU));
    assert_int_equal(ct_autocast_dtype(CT_CPU), CT_F16);
    ok(ct_autocast_end());
    assert_false(ct_autocast_enabled(CT_CPU));
    for (int i = 0; i < 4; i++) {
        expect_identical("gradient", ct_grad(leaves[i]), outside[i]);
        ct_tensor_release(outside[i]);
    }
    ct_tensor_release(loss);
    mlp_free(&m);
}

/* linear_cross_entropy in a region against linear + cross_entropy in the same region: a
 * float32 loss, gradients in the leaves' dtype, for the eager (mean) and the recomputing
 * (none) backward. */
static void test_linear_cross_entropy(void **state) {
    (void)state;
    const ct_reduction reds[2] = {CT_REDUCTION_MEAN, CT_REDUCTION_NONE};
    for (int ri = 0; ri < 2; ri++) {
        ct_tensor *x = tu_rand(CT_SHAPE(7, 5), CT_F32, -1, 1, NULL);
        ct_tensor *w = tu_rand(CT_SHAPE(6, 5), CT_F32, -1, 1, NULL);
        ct_tensor *b = tu_rand(CT_SHAPE(6), CT_F32, -1, 1, NULL);
        ct_tensor *t = i64_tensor(7, (int64_t[]){0, 5, 2, 3, 1, 4, 2});
        ok(ct_requires_grad_(w, true));
        ok(ct_requires_grad_(b, true));
        ct_tensor *g[2][2];
        ct_tensor *losses[2];
        for (int fused = 0; fused < 2; fused++) {
            ok(ct_autocast_begin(CT_CPU, CT_BF16));
            ct_tensor *z = fused ? NULL : checked(ct_linear(x, w, b));
            ct_tensor *l = checked(fused ? ct_linear_cross_entropy(x, w, b, t, -100, 0.0, reds[ri])
                                         : ct_cross_entropy(z, t, NULL, reds[ri], -100, 0.0));
            ok(ct_autocast_end());
            assert_int_equal(ct_tensor_dtype(l), CT_F32);
            ct_tensor *ones = checked(ct_tensor_ones_like(l));
            ok(ct_backward(l, ones, false));
            g[fused][0] = ct_tensor_retain(ct_grad(w));
            g[fused][1] = ct_tensor_retain(ct_grad(b));
            assert_int_equal(ct_tensor_dtype(g[fused][0]), CT_F32);
            assert_int_equal(ct_tensor_dtype(g[fused][1]), CT_F32);
            ct_zero_grad(w);
            ct_zero_grad(b);
            losses[fused] = l;
            ct_tensor_release(ones);
            ct_tensor_release(z);
        }
        expect_close("loss", losses[1], losses[0], 1e-3);
        /* The two paths round the logits' gradient to bfloat16 at different points: each of
         * the 7 rows' terms (|p - onehot| <= 1, times |x| <= 1) may differ by a bfloat16 ulp,
         * and the sums cancel, so the bound is absolute: 7 rows x 2^-8. */
        const double atol = 7.0 / 256;
        expect_close_abs("dweight", g[1][0], g[0][0], atol);
        expect_close_abs("dbias", g[1][1], g[0][1], atol);
        for (int f = 0; f < 2; f++) {
            ct_tensor_release(losses[f]);
            ct_tensor_release(g[f][0]);
            ct_tensor_release(g[f][1]);
        }
        ct_tensor *ts[4] = {x, w, b, t};
        release_all(4, ts);
    }
}

/* ---- nesting, threads ---------------------------------------------------------------------- */

static void expect_mm_dtype(ct_tensor *a, ct_dtype want) {
    ct_tensor *r = checked(ct_mm(a, a));
    assert_int_equal(ct_tensor_dtype(r), want);
    ct_tensor_release(r);
}

static void test_nesting(void **state) {
    (void)state;
    ct_tensor *a = tu_rand(CT_SHAPE(4, 4), CT_F32, -1, 1, NULL);
    assert_false(ct_autocast_enabled(CT_CPU));
    assert_int_equal(ct_autocast_dtype(CT_CPU), CT_BF16);
    assert_int_equal(ct_autocast_dtype(CT_CUDA(0)), CT_F16);
    expect_mm_dtype(a, CT_F32);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    expect_mm_dtype(a, CT_BF16);
    ok(ct_autocast_begin(CT_CPU, CT_F16));
    assert_int_equal(ct_autocast_dtype(CT_CPU), CT_F16);
    expect_mm_dtype(a, CT_F16);
    ok(ct_autocast_begin_disabled(CT_CPU));
    assert_false(ct_autocast_enabled(CT_CPU));
    assert_int_equal(ct_autocast_dtype(CT_CPU), CT_F16);
    expect_mm_dtype(a, CT_F32);
    ok(ct_autocast_begin(CT_CUDA(0), CT_BF16)); /* another type: the CPU's stays off */
    expect_mm_dtype(a, CT_F32);
    ok(ct_autocast_end());
    assert_false(ct_autocast_enabled(CT_CUDA(0)));
    ok(ct_autocast_end());
    assert_true(ct_autocast_enabled(CT_CPU));
    expect_mm_dtype(a, CT_F16);
    ok(ct_autocast_end());
    expect_mm_dtype(a, CT_BF16);
    assert_int_equal(ct_autocast_dtype(CT_CPU), CT_BF16);
    ok(ct_autocast_end());
    assert_false(ct_autocast_enabled(CT_CPU));
    expect_mm_dtype(a, CT_F32);
    ct_tensor_release(a);
}

typedef struct thread_arg {
    ct_tensor *a;
    bool enabled_seen;
    ct_dtype dtype_seen, own_dtype;
} thread_arg;

static void *other_thread(void *p) {
    thread_arg *t = p;
    t->enabled_seen = ct_autocast_enabled(CT_CPU);
    ct_tensor *r = ct_mm(t->a, t->a);
    t->dtype_seen = r ? ct_tensor_dtype(r) : CT_NUM_DTYPES;
    ct_tensor_release(r);
    /* a region of its own, left open while the first thread checks its own */
    if (ct_autocast_begin(CT_CPU, CT_F16) == CT_OK) {
        r = ct_mm(t->a, t->a);
        t->own_dtype = r ? ct_tensor_dtype(r) : CT_NUM_DTYPES;
        ct_tensor_release(r);
        ct_autocast_end();
    }
    return NULL;
}

static void test_thread_local(void **state) {
    (void)state;
    ct_tensor *a = tu_rand(CT_SHAPE(4, 4), CT_F32, -1, 1, NULL);
    ok(ct_requires_grad_(a, true)); /* a leaf the main thread's cache holds */
    thread_arg t = {.a = a};
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    expect_mm_dtype(a, CT_BF16);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread, &t), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_false(t.enabled_seen);
    assert_int_equal(t.dtype_seen, CT_F32);
    assert_int_equal(t.own_dtype, CT_F16);
    expect_mm_dtype(a, CT_BF16); /* the other thread's region did not reach here */
    ok(ct_autocast_end());
    ct_tensor_release(a);
}

/* ---- the cast cache ------------------------------------------------------------------------ */

/* Backward from sum(y). */
static void backward_sum(ct_tensor *y) {
    ct_tensor *s = checked(ct_sum(y, CT_NONE, false));
    ok(ct_backward(s, NULL, false));
    ct_tensor_release(s);
}

static int64_t casts_since(int64_t *c0, int64_t *h0, int64_t *hits) {
    int64_t c, h;
    cti_autocast_counts(&c, &h);
    int64_t dc = c - *c0;
    *hits = h - *h0;
    *c0 = c;
    *h0 = h;
    return dc;
}

static int64_t live_tensors(void) { return cti_get_alloc_stats().live_tensors; }

static void test_cache(void **state) {
    (void)state;
    ct_autocast_set_lasting_casts(false); /* the region cache alone, as PyTorch's */
    ct_tensor *x = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(5, 4), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(5), CT_F32, -1, 1, NULL);
    ok(ct_requires_grad_(w, true));
    ok(ct_requires_grad_(b, true));
    int64_t c0, h0, hits;
    cti_autocast_counts(&c0, &h0);

    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *y1 = checked(ct_linear(x, w, b));
    assert_int_equal(casts_since(&c0, &h0, &hits), 3); /* x for this call; w, b cached */
    assert_int_equal(hits, 0);
    ct_tensor *y2 = checked(ct_linear(x, w, b));
    assert_int_equal(casts_since(&c0, &h0, &hits), 1); /* only x again */
    assert_int_equal(hits, 2);
    /* a nested region of another dtype has casts of its own; the outer ones stay */
    ok(ct_autocast_begin(CT_CPU, CT_F16));
    ct_tensor *y3 = checked(ct_linear(x, w, b));
    assert_int_equal(casts_since(&c0, &h0, &hits), 3);
    ok(ct_autocast_end());
    ct_tensor *y4 = checked(ct_linear(x, w, b));
    assert_int_equal(casts_since(&c0, &h0, &hits), 1);
    assert_int_equal(hits, 2);
    backward_sum(y4);
    assert_int_equal(ct_tensor_dtype(ct_grad(w)), CT_F32);
    casts_since(&c0, &h0, &hits); /* the sum's cast of y4 to float32 */
    ct_tensor *ys[4] = {y1, y2, y3, y4};
    release_all(4, ys);
    /* the outermost end releases the four cached casts (w, b in bfloat16 and float16) */
    int64_t before = live_tensors();
    ok(ct_autocast_end());
    assert_int_equal(live_tensors(), before - 4);

    /* a new region casts again */
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *y5 = checked(ct_linear(x, w, b));
    assert_int_equal(casts_since(&c0, &h0, &hits), 3);
    ct_tensor_release(y5);
    ok(ct_autocast_end());
    ct_zero_grad(w);
    ct_tensor *ts[3] = {x, w, b};
    release_all(3, ts);
}

/* A weight written in place is cast again; a cast made in no-grad mode is not reused when
 * grad mode needs the recorded one; tensors that are not leaves requiring grad are never
 * cached. */
static void test_cache_invalidation(void **state) {
    (void)state;
    ct_autocast_set_lasting_casts(false); /* the region cache alone, as PyTorch's */
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(4, 3), CT_F32, -1, 1, NULL);
    ok(ct_requires_grad_(w, true));
    int64_t c0, h0, hits;
    cti_autocast_counts(&c0, &h0);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));

    bool prev = ct_no_grad_begin();
    ct_tensor *y1 = checked(ct_linear(x, w, NULL));
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    ok(ct_mul_scalar_(w, 2.0)); /* as an optimizer step would */
    ct_tensor *y2 = checked(ct_linear(x, w, NULL));
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    assert_int_equal(hits, 0);
    ct_tensor *twice = checked(ct_mul_scalar(y1, 2.0));
    expect_close("after the in-place write", y2, twice, 1e-2);
    ct_no_grad_end(prev);

    /* the cast above has no edge to w: grad mode makes a recorded one */
    ct_tensor *y3 = checked(ct_linear(x, w, NULL));
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    assert_int_equal(hits, 0);
    assert_true(ct_requires_grad(y3));
    ct_tensor *y4 = checked(ct_linear(x, w, NULL)); /* and that one serves again */
    assert_int_equal(casts_since(&c0, &h0, &hits), 1);
    assert_int_equal(hits, 1);
    backward_sum(y4);
    assert_non_null(ct_grad(w));
    casts_since(&c0, &h0, &hits);

    /* a view of w is no leaf: cast every time */
    ct_tensor *wt = checked(ct_t(w));
    ct_tensor *y5 = checked(ct_mm(x, wt));
    ct_tensor *y6 = checked(ct_mm(x, wt));
    assert_int_equal(casts_since(&c0, &h0, &hits), 4);
    assert_int_equal(hits, 0);
    ok(ct_autocast_end());
    ct_zero_grad(w);
    ct_tensor *ts[10] = {x, w, y1, y2, twice, y3, y4, wt, y5, y6};
    release_all(10, ts);
}

/* Scopes and the cache: casts made inside a scope outlive it (the cache holds them), a
 * weight released during the region lives until the region ends, and nothing leaks (the
 * fixture counts; ASan checks the frees). */
static void test_cache_scopes(void **state) {
    (void)state;
    ct_autocast_set_lasting_casts(false); /* the region cache alone, as PyTorch's */
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(4, 3), CT_F32, -1, 1, NULL);
    ok(ct_requires_grad_(w, true));
    int64_t c0, h0, hits;
    cti_autocast_counts(&c0, &h0);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    int64_t live = live_tensors();
    ct_scope *s1 = ct_scope_begin();
    ct_tensor *y1 = checked(ct_linear(x, w, NULL));
    ct_tensor *ref = ct_keep(checked(ct_to_dtype(checked(ct_detach(y1)), CT_F32)));
    ct_scope_end(s1);
    assert_int_equal(live_tensors(), live + 2); /* ref, and w's cast the scope did not take */
    ct_scope *s2 = ct_scope_begin();
    ct_tensor *y2 = checked(ct_linear(x, w, NULL));
    assert_int_equal(casts_since(&c0, &h0, &hits), 3);
    assert_int_equal(hits, 1);
    expect_identical("second use", checked(ct_to_dtype(y2, CT_F32)), ref);
    backward_sum(y2);
    ct_scope_end(s2);
    assert_non_null(ct_grad(w));
    ct_zero_grad(w);
    ct_tensor_release(w); /* the caller is done with w; the cache still holds it */
    ct_scope *s3 = ct_scope_begin();
    ok(ct_autocast_end()); /* inside a scope: the cached casts go, the scope's tensors stay */
    ct_scope_end(s3);
    ct_tensor_release(ref);
    ct_tensor_release(x);
}

/* ---- lasting casts -------------------------------------------------------------------------- */

/* Casts taken from lasting copies since *k0 (advanced). */
static int64_t kept_since(int64_t *k0) {
    int64_t k = cti_autocast_kept_count(), d = k - *k0;
    *k0 = k;
    return d;
}

/* One training step of linear(x, w, b) -> relu -> sum in a bfloat16 region, its output
 * (float32 copy, the caller's) in *y. */
static void lasting_step(ct_optimizer *opt, ct_tensor *x, ct_tensor *w, ct_tensor *b,
                         ct_tensor **y) {
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *h = checked(ct_linear(x, w, b));
    ct_tensor *r = checked(ct_relu(h));
    ok(ct_autocast_end());
    *y = checked(ct_to_dtype(r, CT_F32));
    ct_optim_zero_grad(opt);
    backward_sum(r);
    ok(ct_optim_step(opt));
    ct_tensor_release(r);
    ct_tensor_release(h);
}

/* Training with lasting casts gives bit for bit what casting afresh in every region gives
 * (outputs, gradients, parameters, for every optimizer), and after the first step the
 * weights' casts come from the copies the optimizer writes. */
static void test_lasting_casts_training(void **state) {
    (void)state;
    for (int alg = 0; alg < N_OPTIM_ALGS; alg++) {
        double *xv, *wv, *bv;
        ct_tensor *x = tu_rand(CT_SHAPE(6, 5), CT_F32, -1, 1, &xv);
        ct_tensor *w[2], *b[2];
        ct_params *ps[2];
        ct_optimizer *opt[2];
        ct_tensor *w0 = tu_rand(CT_SHAPE(7, 5), CT_F32, -1, 1, &wv);
        ct_tensor *b0 = tu_rand(CT_SHAPE(7), CT_F32, -1, 1, &bv);
        for (int k = 0; k < 2; k++) {
            w[k] = checked(ct_clone(w0));
            b[k] = checked(ct_clone(b0));
            ok(ct_requires_grad_(w[k], true));
            ok(ct_requires_grad_(b[k], true));
            ps[k] = ct_params_new();
            ok(ct_params_add(ps[k], "w", w[k]));
            ok(ct_params_add(ps[k], "b", b[k]));
            opt[k] = optimizer_of(alg, ps[k]);
            assert_non_null(opt[k]);
        }
        int64_t k0 = cti_autocast_kept_count(), c0, h0, hits;
        cti_autocast_counts(&c0, &h0);
        for (int step = 0; step < 4; step++) {
            ct_tensor *y[2];
            ct_autocast_set_lasting_casts(true);
            lasting_step(opt[0], x, w[0], b[0], &y[0]);
            /* the first step casts x, w and b; the later ones x alone, w and b kept */
            assert_int_equal(kept_since(&k0), step == 0 ? 0 : 2);
            assert_int_equal(casts_since(&c0, &h0, &hits), step == 0 ? 3 : 1);
            ct_autocast_set_lasting_casts(false);
            lasting_step(opt[1], x, w[1], b[1], &y[1]);
            assert_int_equal(kept_since(&k0), 0);
            assert_int_equal(casts_since(&c0, &h0, &hits), 3);
            expect_identical("output", y[0], y[1]);
            expect_identical("weight gradient", ct_grad(w[0]), ct_grad(w[1]));
            expect_identical("bias gradient", ct_grad(b[0]), ct_grad(b[1]));
            expect_identical("weight", w[0], w[1]);
            expect_identical("bias", b[0], b[1]);
            release_all(2, y);
        }
        ct_autocast_set_lasting_casts(true);
        for (int k = 0; k < 2; k++) {
            ct_optim_free(opt[k]);
            ct_params_free(ps[k]);
            ct_tensor_release(w[k]);
            ct_tensor_release(b[k]);
        }
        ct_tensor *ts[3] = {x, w0, b0};
        release_all(3, ts);
        free(xv);
        free(wv);
        free(bv);
    }
}

/* A kept cast serves only while it holds the leaf's values: a write of the leaf outside the
 * optimizer, a region of the other dtype and switching lasting casts off each make a fresh
 * cast; off, the kept cast is dropped when autocast meets its leaf, and the leaf's release
 * frees it (the fixture counts). */
static void test_lasting_casts_invalidation(void **state) {
    (void)state;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(4, 3), CT_F32, -1, 1, NULL);
    ok(ct_requires_grad_(w, true));
    int64_t k0 = cti_autocast_kept_count(), c0, h0, hits;
    cti_autocast_counts(&c0, &h0);
    ct_tensor *y[6];
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    y[0] = checked(ct_linear(x, w, NULL));
    ok(ct_autocast_end());
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    /* a new region takes the kept cast */
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    y[1] = checked(ct_linear(x, w, NULL));
    ok(ct_autocast_end());
    assert_int_equal(casts_since(&c0, &h0, &hits), 1);
    assert_int_equal(kept_since(&k0), 1);
    expect_identical("kept cast", y[1], y[0]);
    /* w written in place: cast afresh, from the new values */
    bool prev = ct_no_grad_begin();
    ok(ct_mul_scalar_(w, -2.0));
    ct_no_grad_end(prev);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    y[2] = checked(ct_linear(x, w, NULL));
    ok(ct_autocast_end());
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    assert_int_equal(kept_since(&k0), 0);
    ct_tensor *twice = checked(ct_mul_scalar(y[0], -2.0));
    expect_identical("after the write", y[2], twice);
    /* a float16 region: a cast of its own */
    ok(ct_autocast_begin(CT_CPU, CT_F16));
    y[3] = checked(ct_linear(x, w, NULL));
    ok(ct_autocast_end());
    assert_int_equal(ct_tensor_dtype(y[3]), CT_F16);
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    assert_int_equal(kept_since(&k0), 0);
    /* off: no kept cast is used, and w's goes when autocast meets w */
    ct_autocast_set_lasting_casts(false);
    assert_false(ct_autocast_lasting_casts());
    unsigned sv, cv;
    assert_non_null(cti_ag_amp_copy(w, &sv, &cv));
    ok(ct_autocast_begin(CT_CPU, CT_F16));
    y[4] = checked(ct_linear(x, w, NULL));
    ok(ct_autocast_end());
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    assert_int_equal(kept_since(&k0), 0);
    assert_null(cti_ag_amp_copy(w, &sv, &cv));
    ct_autocast_set_lasting_casts(true);
    assert_true(ct_autocast_lasting_casts());
    ok(ct_autocast_begin(CT_CPU, CT_F16));
    y[5] = checked(ct_linear(x, w, NULL));
    ok(ct_autocast_end());
    assert_int_equal(casts_since(&c0, &h0, &hits), 2);
    expect_identical("cast again", y[5], y[4]);
    release_all(6, y);
    ct_tensor *ts[3] = {x, w, twice};
    release_all(3, ts);
}

/* The ops an op of the table runs inside it run on what they are given: the fused
 * linear + cross-entropy sums its bfloat16 logits' gradient for the bias with ct_sum, an
 * fp32 op of the table, and that sum casts nothing. */
static void test_inner_ops_not_cast(void **state) {
    (void)state;
    ct_autocast_set_lasting_casts(false); /* the region cache alone, as PyTorch's */
    ct_tensor *x = tu_rand(CT_SHAPE(6, 4), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(5, 4), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(5), CT_F32, -1, 1, NULL);
    ct_tensor *t = i64_tensor(6, (int64_t[]){1, 0, 4, 2, 3, 1});
    ok(ct_requires_grad_(w, true));
    ok(ct_requires_grad_(b, true));
    int64_t c0, h0, hits;
    cti_autocast_counts(&c0, &h0);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *l = checked(ct_linear_cross_entropy(x, w, b, t, -100, 0.0, CT_REDUCTION_MEAN));
    assert_int_equal(casts_since(&c0, &h0, &hits), 3); /* x, w and b, nothing inside */
    ok(ct_autocast_end());
    ct_tensor *ts[5] = {x, w, b, t, l};
    release_all(5, ts);
}

/* An op that fails inside a region fails as outside, and the region works afterwards. */
static void test_failure_inside_region(void **state) {
    (void)state;
    ct_tensor *a = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *r = ct_mm(a, a);
    tu_assert_null_error(r, CT_ERR_SHAPE, "ct_mm", "[3, 4]", "do not align");
    r = ct_mm(a, NULL);
    tu_assert_null_error(r, CT_ERR_INVALID_ARG, "ct_mm", "NULL");
    ct_tensor *at = checked(ct_t(a));
    ct_tensor *m = checked(ct_mm(a, at));
    assert_int_equal(ct_tensor_dtype(m), CT_BF16);
    ct_tensor *s = checked(ct_softmax(at, 0));
    assert_int_equal(ct_tensor_dtype(s), CT_F32);
    ok(ct_autocast_end());
    ct_tensor_release(m);
    ct_tensor_release(s);
    ct_tensor_release(at);
    ct_tensor_release(a);
}

/* ---- bad input --------------------------------------------------------------------------- */

static void test_bad_input(void **state) {
    (void)state;
    tu_assert_error(ct_autocast_end(), CT_ERR_INVALID_ARG, "ct_autocast_end",
                    "no autocast region is open");
    tu_assert_error(ct_autocast_begin(CT_CPU, CT_F32), CT_ERR_DTYPE, "ct_autocast_begin",
                    "float32", "cpu", "expected float16 or bfloat16");
    tu_assert_error(ct_autocast_begin(CT_CUDA(0), CT_F64), CT_ERR_DTYPE, "float64", "cuda");
    tu_assert_error(ct_autocast_begin(CT_CPU, CT_I64), CT_ERR_DTYPE, "int64");
    tu_assert_error(ct_autocast_begin(CT_CPU, (ct_dtype)42), CT_ERR_DTYPE, "invalid");
    ct_device bad = {(ct_device_type)7, 0};
    tu_assert_error(ct_autocast_begin(bad, CT_BF16), CT_ERR_DEVICE, "ct_autocast_begin",
                    "unknown device type 7");
    tu_assert_error(ct_autocast_begin_disabled(bad), CT_ERR_DEVICE,
                    "ct_autocast_begin_disabled", "unknown device type 7");
    assert_int_equal(ct_autocast_dtype(bad), CT_NUM_DTYPES);
    tu_assert_error(ct_last_status(), CT_ERR_DEVICE, "ct_autocast_dtype");
    assert_false(ct_autocast_enabled(bad));
    /* the failures opened nothing */
    assert_false(ct_autocast_enabled(CT_CPU));
    assert_false(ct_autocast_enabled(CT_CUDA(0)));
    tu_assert_error(ct_autocast_end(), CT_ERR_INVALID_ARG, "ct_autocast_end");
    /* one end per begin: the second is refused */
    ok(ct_autocast_begin_disabled(CT_CPU));
    ok(ct_autocast_end());
    tu_assert_error(ct_autocast_end(), CT_ERR_INVALID_ARG, "ct_autocast_end");
}

/* A test that failed inside a region leaves it open: close it, so that the next test starts
 * outside any region, then count leaks as every test does. */
static int close_regions(void **state) {
    while (ct_autocast_end() == CT_OK) continue;
    ct_clear_error();
    ct_autocast_set_lasting_casts(true);
    return teardown(state);
}

/* ---- widened weight gradients ------------------------------------------------------------ */

enum { WB = 3, WT = 37, WI = 19, WO = 13, WR = WB * WT };

/* The float64 gradients of linear(x, w, b) for the output gradient g ([WR, WO], bfloat16
 * values) over the rows of xb ([WR, WI], x rounded to bfloat16), and per element the sum of
 * the terms' magnitudes. */
typedef struct wide_ref {
    double dw[WO * WI], db[WO], mw[WO * WI], mb[WO];
} wide_ref;

static void wide_reference(const double *g, const double *x, wide_ref *r) {
    memset(r, 0, sizeof *r);
    for (int n = 0; n < WR; n++)
        for (int o = 0; o < WO; o++) {
            r->db[o] += g[n * WO + o];
            r->mb[o] += fabs(g[n * WO + o]);
            for (int i = 0; i < WI; i++) {
                double t = g[n * WO + o] * bf(x[n * WI + i]);
                r->dw[o * WI + i] += t;
                r->mw[o * WI + i] += fabs(t);
            }
        }
}

/* got (float32, n values) within rtol of its terms' magnitudes from ref. */
static void expect_within(const char *what, ct_tensor *got, const double *ref, const double *mag,
                          int n, double rtol) {
    assert_non_null(got);
    assert_int_equal(ct_tensor_dtype(got), CT_F32);
    assert_int_equal(ct_tensor_numel(got), n);
    double *v = tu_values(got);
    for (int i = 0; i < n; i++) {
        if (fabs(v[i] - ref[i]) <= rtol * mag[i] + 1e-30) continue;
        fprintf(stderr, "%s: element %d: got %.9g, expected %.9g (rtol %g of %.9g)\n", what, i,
                v[i], ref[i], rtol, mag[i]);
        fail();
    }
    free(v);
}

/* Whether every value of t is a bfloat16 one. */
static bool all_bf16(ct_tensor *t) {
    double *v = tu_values(t);
    bool all = true;
    for (int64_t i = 0; i < ct_tensor_numel(t); i++) all = all && bf(v[i]) == v[i];
    free(v);
    return all;
}

/* A float32 weight's gradient through the region's cast of it leaves the GEMM in float32,
 * unrounded: ct_linear's weight and bias gradients (leading dims, with and without a bias)
 * are the float64 sums over the bfloat16 operands to float32 accuracy, where a rounding to
 * bfloat16 first would be off by up to 2^-9 of the value. The same linear on explicit
 * ct_to_dtype casts keeps PyTorch's rounding (every value a bfloat16 one), and a weight
 * cast once for two linears of a region gets both gradients, summed. */
static void test_widened_weight_grads(void **state) {
    (void)state;
    for (int with_bias = 0; with_bias < 2; with_bias++) {
        double *xv, *gv;
        ct_tensor *x = tu_rand(CT_SHAPE(WB, WT, WI), CT_F32, -1, 1, &xv);
        ct_tensor *g = tu_rand(CT_SHAPE(WB, WT, WO), CT_BF16, -1, 1, &gv);
        ct_tensor *w = tu_rand(CT_SHAPE(WO, WI), CT_F32, -1, 1, NULL);
        ct_tensor *b = with_bias ? tu_rand(CT_SHAPE(WO), CT_F32, -1, 1, NULL) : NULL;
        ok(ct_requires_grad_(w, true));
        if (b) ok(ct_requires_grad_(b, true));
        wide_ref *r = malloc(sizeof *r);
        wide_reference(gv, xv, r);

        ok(ct_autocast_begin(CT_CPU, CT_BF16));
        ct_tensor *y = checked(ct_linear(x, w, b));
        ok(ct_autocast_end());
        /* no conversion pass: the GEMM and the row sum write float32 */
        tu_trace t = tu_trace_begin();
        ok(ct_backward(y, g, false));
        char *log = tu_trace_end(&t);
        assert_null(strstr(log, "copy_to_float32"));
        free(log);
        ct_tensor_release(y);
        expect_within("dw in a region", ct_grad(w), r->dw, r->mw, WO * WI, 1e-6);
        if (b) expect_within("db in a region", ct_grad(b), r->db, r->mb, WO, 1e-6);

        /* explicit casts: the gradients rounded to bfloat16, then converted */
        ct_zero_grad(w);
        if (b) ct_zero_grad(b);
        ct_tensor *xc = checked(ct_to_dtype(x, CT_BF16)), *wc = checked(ct_to_dtype(w, CT_BF16));
        ct_tensor *bc = b ? checked(ct_to_dtype(b, CT_BF16)) : NULL;
        y = checked(ct_linear(xc, wc, bc));
        t = tu_trace_begin();
        ok(ct_backward(y, g, false));
        log = tu_trace_end(&t);
        assert_non_null(strstr(log, "copy_to_float32"));
        free(log);
        ct_tensor_release(y);
        assert_true(all_bf16(ct_grad(w)));
        expect_within("dw, explicit casts", ct_grad(w), r->dw, r->mw, WO * WI, 1.0 / 256);
        if (b) {
            assert_true(all_bf16(ct_grad(b)));
            expect_within("db, explicit casts", ct_grad(b), r->db, r->mb, WO, 1.0 / 256);
        }

        /* one cast, two linears: two gradients arrive at it, each in bfloat16 */
        ct_zero_grad(w);
        if (b) ct_zero_grad(b);
        ok(ct_autocast_begin(CT_CPU, CT_BF16));
        ct_tensor *y1 = checked(ct_linear(x, w, b)), *y2 = checked(ct_linear(x, w, NULL));
        ct_tensor *sum = checked(ct_add(y1, y2));
        ok(ct_autocast_end());
        ok(ct_backward(sum, g, false));
        for (int i = 0; i < WO * WI; i++) r->dw[i] *= 2, r->mw[i] *= 2;
        expect_within("dw, two linears", ct_grad(w), r->dw, r->mw, WO * WI, 1.0 / 256);
        if (b) expect_within("db, two linears", ct_grad(b), r->db, r->mb, WO, 1e-6);

        ct_tensor *ts[9] = {x, g, w, b, xc, wc, bc, y1, y2};
        release_all(9, ts);
        ct_tensor_release(sum);
        free(r);
        free(xv);
        free(gv);
    }
}

/* ct_mlp_gelu in a region widens as the unfused chain does: its weight and bias gradients
 * equal those of linear -> gelu -> linear in the same region to float32 accuracy (the same
 * bfloat16 operands, float32 results unrounded, b_in's the row sums of the same bfloat16
 * hidden gradient). */
static void test_widened_mlp_grads(void **state) {
    (void)state;
    enum { R = 29, I = 24, Hd = 40, O = 16 };
    ct_tensor *x = tu_rand(CT_SHAPE(R, I), CT_F32, -1, 1, NULL);
    ct_tensor *g = tu_rand(CT_SHAPE(R, O), CT_BF16, -1, 1, NULL);
    ct_tensor *p0[4] = {tu_rand(CT_SHAPE(Hd, I), CT_F32, -0.5, 0.5, NULL),
                        tu_rand(CT_SHAPE(Hd), CT_F32, -0.5, 0.5, NULL),
                        tu_rand(CT_SHAPE(O, Hd), CT_F32, -0.5, 0.5, NULL),
                        tu_rand(CT_SHAPE(O), CT_F32, -0.5, 0.5, NULL)};
    ct_tensor *p[2][4];
    for (int k = 0; k < 2; k++) {
        for (int i = 0; i < 4; i++) {
            p[k][i] = checked(ct_clone(p0[i]));
            ok(ct_requires_grad_(p[k][i], true));
        }
        ok(ct_autocast_begin(CT_CPU, CT_BF16));
        ct_tensor *h = NULL, *a = NULL, *y;
        if (k == 0) {
            y = checked(ct_mlp_gelu(x, p[k][0], p[k][1], p[k][2], p[k][3], CT_GELU_TANH));
        } else {
            h = checked(ct_linear(x, p[k][0], p[k][1]));
            a = checked(ct_gelu(h, CT_GELU_TANH));
            y = checked(ct_linear(a, p[k][2], p[k][3]));
        }
        ok(ct_autocast_end());
        ok(ct_backward(y, g, false));
        ct_tensor *ts[3] = {h, a, y};
        release_all(3, ts);
    }
    const char *names[4] = {"w_in", "b_in", "w_out", "b_out"};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ct_tensor_dtype(ct_grad(p[0][i])), CT_F32);
        expect_close(names[i], ct_grad(p[0][i]), ct_grad(p[1][i]), 1e-6);
    }
    for (int k = 0; k < 2; k++) release_all(4, p[k]);
    release_all(4, p0);
    ct_tensor *ts[2] = {x, g};
    release_all(2, ts);
}

/* cross_entropy on bfloat16/float16 logits in a region reads them as they are: no cast of the
 * logits and none of their gradient, and bit for bit what the cast path gives (the float32
 * loss of the logits cast to float32; their float32 gradient rounded once), for each
 * reduction, with label smoothing and an ignored target. Class weights take the cast. */
/* rope reads float32 tables beside a 16-bit x as they are (FIRST_READS_F32): no cast in
 * the region, and the result and x's gradient are those of tables cast by hand. Tables of
 * the other 16-bit dtype are still cast to x's. */
static void test_rope_reads_tables(void **state) {
    (void)state;
    static const ct_dtype dts[2] = {CT_BF16, CT_F16};
    for (int di = 0; di < 2; di++)
        for (int region = 0; region < 2; region++) {
            ct_dtype dt = dts[di];
            ct_tensor *x0 = tu_rand(CT_SHAPE(2, 6, 3, 8), dt, -2, 2, NULL);
            ct_tensor *cs = tu_rand(CT_SHAPE(6, 1, 4), CT_F32, -1, 1, NULL);
            ct_tensor *sn = tu_rand(CT_SHAPE(6, 1, 4), CT_F32, -1, 1, NULL);
            ct_tensor *go = tu_rand(CT_SHAPE(2, 6, 3, 8), dt, -1, 1, NULL);
            ct_tensor *x[2], *y[2];
            for (int k = 0; k < 2; k++) {
                x[k] = checked(ct_clone(x0));
                ok(ct_requires_grad_(x[k], true));
            }
            int64_t c0, h0, c1, h1;
            cti_autocast_counts(&c0, &h0);
            tu_trace t = tu_trace_begin();
            ok(ct_autocast_begin(CT_CPU, dts[region]));
            y[0] = checked(ct_rope(x[0], cs, sn, CT_ROPE_HALF));
            ok(ct_autocast_end());
            char *log = tu_trace_end(&t);
            cti_autocast_counts(&c1, &h1);
            assert_int_equal(c1 - c0, 0);
            assert_int_equal(tu_trace_lines(log, "] copy ", NULL), 0);
            free(log);
            ct_tensor *ch = checked(ct_to_dtype(cs, dt)), *sh = checked(ct_to_dtype(sn, dt));
            y[1] = checked(ct_rope(x[1], ch, sh, CT_ROPE_HALF));
            expect_identical("rope in a region, float32 tables", y[0], y[1]);
            for (int k = 0; k < 2; k++) ok(ct_backward(y[k], go, false));
            expect_identical("rope's gradient in a region", ct_grad(x[0]), ct_grad(x[1]));
            /* tables of the other 16-bit dtype: cast to x's, twice (cos and sin) */
            ct_dtype other = dt == CT_BF16 ? CT_F16 : CT_BF16;
            ct_tensor *co = checked(ct_to_dtype(cs, other)), *so = checked(ct_to_dtype(sn, other));
            cti_autocast_counts(&c0, &h0);
            ok(ct_autocast_begin(CT_CPU, dts[region]));
            ct_tensor *yo = checked(ct_rope(x0, co, so, CT_ROPE_HALF));
            ok(ct_autocast_end());
            cti_autocast_counts(&c1, &h1);
            assert_int_equal(c1 - c0, 2);
            assert_int_equal(ct_tensor_dtype(yo), dt);
            ct_tensor *all[] = {x0, cs, sn, go, x[0], x[1], y[0], y[1], ch, sh, co, so, yo};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
        }
}

static void test_cross_entropy_reads_logits(void **state) {
    (void)state;
    static const ct_dtype dts[2] = {CT_BF16, CT_F16};
    static const ct_reduction reds[3] = {CT_REDUCTION_MEAN, CT_REDUCTION_SUM, CT_REDUCTION_NONE};
    int64_t tv[7] = {1, 0, 4, 2, 3, 1, 2};
    ct_tensor *tg = i64_tensor(7, tv);
    /* [7, 5] rows, and [7, 5, 3]: classes strided by an inner dim */
    ct_tensor *tg3 = checked(ct_tensor_from_data((int64_t[]){1, 0, 4, 2, 3, 1, 2, 2, 0, 4, 4, 1,
                                                             3, 0, 2, 1, 2, 4, 0, 3, 3},
                                                 CT_I64, 2, (int64_t[]){7, 3}));
    for (int di = 0; di < 2; di++)
        for (int ri = 0; ri < 6; ri++)
            for (int ls = 0; ls < 2; ls++) {
                ct_tensor *z[2], *loss[2];
                int copies[2];
                bool inner = ri >= 3;
                ct_tensor *z0 = inner ? tu_rand(CT_SHAPE(7, 5, 3), dts[di], -3, 3, NULL)
                                      : tu_rand(CT_SHAPE(7, 5), dts[di], -3, 3, NULL);
                ct_tensor *tgt = inner ? tg3 : tg;
                for (int k = 0; k < 2; k++) {
                    z[k] = checked(ct_clone(z0));
                    ok(ct_requires_grad_(z[k], true));
                    tu_trace t = tu_trace_begin();
                    if (k == 0) {
                        ok(ct_autocast_begin(CT_CPU, dts[di]));
                        loss[k] = checked(ct_cross_entropy(z[k], tgt, NULL, reds[ri % 3], 2, 0.1 * ls));
                        ok(ct_autocast_end());
                    } else {
                        ct_tensor *zf = checked(ct_to_dtype(z[k], CT_F32));
                        loss[k] = checked(ct_cross_entropy(zf, tgt, NULL, reds[ri % 3], 2, 0.1 * ls));
                        ct_tensor_release(zf);
                    }
                    assert_int_equal(ct_tensor_dtype(loss[k]), CT_F32);
                    ct_tensor *sum = checked(ct_sum(loss[k], CT_NONE, false));
                    ok(ct_backward(sum, NULL, false));
                    ct_tensor_release(sum);
                    char *log = tu_trace_end(&t);
                    copies[k] = tu_trace_lines(log, "] copy ", NULL);
                    free(log);
                    assert_int_equal(ct_tensor_dtype(ct_grad(z[k])), dts[di]);
                }
                /* the cast path's two: the logits' cast and their gradient's */
                assert_int_equal(copies[1] - copies[0], 2);
                expect_identical("loss", loss[0], loss[1]);
                expect_identical("logits' gradient", ct_grad(z[0]), ct_grad(z[1]));
                ct_tensor *ts[5] = {z0, z[0], z[1], loss[0], loss[1]};
                release_all(5, ts);
            }
    /* class weights: cast with the logits to float32, as the policy says */
    ct_tensor *z = tu_rand(CT_SHAPE(7, 5), CT_BF16, -3, 3, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(5), CT_BF16, 0.5, 2, NULL);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    tu_trace t = tu_trace_begin();
    ct_tensor *l = checked(ct_cross_entropy(z, tg, w, CT_REDUCTION_MEAN, -100, 0.0));
    char *log = tu_trace_end(&t);
    ok(ct_autocast_end());
    assert_non_null(strstr(log, "] copy "));
    assert_int_equal(ct_tensor_dtype(l), CT_F32);
    free(log);
    ct_tensor *ts[5] = {z, w, l, tg, tg3};
    release_all(5, ts);
}

/* The ops one training step dispatches, from the trace: linear -> relu -> linear ->
 * cross_entropy, backward, an SGD step with momentum (bench_cuda_train's MLP, smaller), in a
 * region of amp or (CT_F32) none, after two steps (lasting casts made). */
static int step_ops(ct_dtype amp) {
    ct_params *ps = ct_params_new();
    ct_nn_linear *l1 = ct_nn_linear_new(48, 32, true, CT_F32, CT_CPU, NULL);
    ct_nn_linear *l2 = ct_nn_linear_new(32, 10, true, CT_F32, CT_CPU, NULL);
    assert_non_null(ps);
    assert_non_null(l1);
    assert_non_null(l2);
    ok(ct_nn_linear_params(l1, "fc1", ps));
    ok(ct_nn_linear_params(l2, "fc2", ps));
    ct_optimizer *opt = ct_optim_sgd_new(ps, 0.01, 0.9, 0, 0, false);
    assert_non_null(opt);
    ct_tensor *x = tu_rand(CT_SHAPE(8, 48), CT_F32, -1, 1, NULL);
    ct_tensor *y = i64_tensor(8, (int64_t[]){1, 0, 4, 2, 9, 3, 7, 2});
    int ops = 0;
    for (int s = 0; s < 3; s++) {
        tu_trace t = tu_trace_begin();
        ct_scope *sc = ct_scope_begin();
        if (amp != CT_F32) ok(ct_autocast_begin(CT_CPU, amp));
        ct_tensor *h = checked(ct_relu(checked(ct_nn_linear_forward(l1, x))));
        ct_tensor *l = checked(ct_cross_entropy(checked(ct_nn_linear_forward(l2, h)), y, NULL,
                                                CT_REDUCTION_MEAN, -100, 0.0));
        if (amp != CT_F32) ok(ct_autocast_end());
        ct_optim_zero_grad(opt);
        ok(ct_backward(l, NULL, false));
        ok(ct_optim_step(opt));
        ct_scope_end(sc);
        char *log = tu_trace_end(&t);
        ops = tu_trace_lines(log, "[cten] ", NULL);
        free(log);
    }
    ct_tensor *ts[2] = {x, y};
    release_all(2, ts);
    ct_optim_free(opt);
    ct_nn_linear_free(l1);
    ct_nn_linear_free(l2);
    ct_params_free(ps);
    return ops;
}

/* A bfloat16 or float16 training step dispatches one op more than the float32 one: the
 * input's cast. The weights' casts last from step to step, their gradients and the
 * logits' need none (issue 17's autocast overhead; on the GPU each op is a launch). */
static void test_step_ops(void **state) {
    (void)state;
    int f32 = step_ops(CT_F32);
    assert_true(f32 > 0);
    assert_int_equal(step_ops(CT_BF16), f32 + 1);
    assert_int_equal(step_ops(CT_F16), f32 + 1);
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, close_regions)
    const struct CMUnitTest tests[] = {
        T(test_op_table),         T(test_integers_not_cast),
        T(test_other_device_type), T(test_mlp_backward),
        T(test_backward_inside_region), T(test_linear_cross_entropy),
        T(test_nesting),          T(test_thread_local),
        T(test_cache),            T(test_cache_invalidation),
        T(test_cache_scopes),     T(test_inner_ops_not_cast),
        T(test_lasting_casts_training), T(test_lasting_casts_invalidation),
        T(test_failure_inside_region), T(test_widened_weight_grads),
        T(test_widened_mlp_grads),   T(test_cross_entropy_reads_logits),
        T(test_rope_reads_tables),
        T(test_step_ops),
        T(test_bad_input),
    };
#undef T
    return tu_run_tests(tests);
}
