/* Autocast on CUDA tensors: the same policy table as on the CPU (tests/test_autocast.c checks
 * it there against float64), here every row of it and a few ops outside it run inside a CUDA
 * region (bfloat16 and float16) on float32, bfloat16 and mixed inputs, contiguous and not, and
 * give the dtype the CPU gives inside a CPU region of the same dtype, on the GPU, with the
 * CPU's values; a CUDA region leaves CPU tensors alone and a CPU region CUDA ones; a model
 * trained one step in a CUDA region (linear -> relu -> linear -> cross_entropy) gets the
 * CPU's gradients, float32 for float32 leaves; the weight casts are made once per region on
 * the GPU too; recomputing an MLP block's activation changes no bit of its gradients; the
 * fused optimizers write the lasting casts, bit for bit fresh casts. Skips without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "autograd_util.h"
#include "cuda_test_util.h"
#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

/* Private test hooks (src/ops/autocast.c): casts made and cache hits on this thread; casts
 * taken from lasting copies. */
void cti_autocast_counts(int64_t *casts, int64_t *hits);
int64_t cti_autocast_kept_count(void);

static ct_tensor *gpu(ct_tensor *t) { return checked(ct_to_device(t, CT_CUDA(0))); }

static ct_tensor *i64_on(int n, const int64_t *vals, ct_device dev) {
    ct_tensor *t = checked(ct_tensor_from_data(vals, CT_I64, 1, (int64_t[]){n}));
    ct_tensor *r = checked(ct_to_device(t, dev));
    ct_tensor_release(t);
    return r;
}

/* ---- the ops ------------------------------------------------------------------------------- */

#define MAXIN 4

typedef ct_tensor *(*op_fn)(ct_tensor *const *t, ct_device dev);

static ct_tensor *f_matmul(ct_tensor *const *t, ct_device d) { (void)d; return ct_matmul(t[0], t[1]); }
static ct_tensor *f_mm(ct_tensor *const *t, ct_device d) { (void)d; return ct_mm(t[0], t[1]); }
static ct_tensor *f_bmm(ct_tensor *const *t, ct_device d) { (void)d; return ct_bmm(t[0], t[1]); }
static ct_tensor *f_addmm(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_addmm(t[0], t[1], t[2], 0.5, 2.0);
}
static ct_tensor *f_linear(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_linear(t[0], t[1], t[2]);
}
static ct_tensor *f_conv2d(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_conv2d(t[0], t[1], t[2], NULL, (int64_t[]){1, 1}, NULL, 1);
}
static ct_tensor *f_sdpa(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_scaled_dot_product_attention(t[0], t[1], t[2], t[3], 0.0, false, 0.0, NULL);
}
static ct_tensor *f_sdpa_causal(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_scaled_dot_product_attention(t[0], t[1], t[2], NULL, 0.0, true, 0.0, NULL);
}
static ct_tensor *f_lce(ct_tensor *const *t, ct_device d) {
    ct_tensor *tg = i64_on(6, (int64_t[]){1, 0, 4, 2, 3, 1}, d);
    ct_tensor *r = ct_linear_cross_entropy(t[0], t[1], t[2], tg, -100, 0.1, CT_REDUCTION_MEAN);
    ct_tensor_release(tg);
    return r;
}
static ct_tensor *f_exp(ct_tensor *const *t, ct_device d) { (void)d; return ct_exp(t[0]); }
static ct_tensor *f_log(ct_tensor *const *t, ct_device d) { (void)d; return ct_log(t[0]); }
static ct_tensor *f_rsqrt(ct_tensor *const *t, ct_device d) { (void)d; return ct_rsqrt(t[0]); }
static ct_tensor *f_reciprocal(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_reciprocal(t[0]);
}
static ct_tensor *f_pow(ct_tensor *const *t, ct_device d) { (void)d; return ct_pow(t[0], t[1]); }
static ct_tensor *f_pow_scalar(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_pow_scalar(t[0], 2.5);
}
static ct_tensor *f_softplus(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_softplus(t[0], 1.0, 20.0);
}
static ct_tensor *f_layer_norm(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_layer_norm(t[0], CT_LIST(8), t[1], t[2], 1e-5, NULL, NULL);
}
static ct_tensor *f_softmax(ct_tensor *const *t, ct_device d) { (void)d; return ct_softmax(t[0], -1); }
static ct_tensor *f_log_softmax(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_log_softmax(t[0], 1);
}
static ct_tensor *f_cross_entropy(ct_tensor *const *t, ct_device d) {
    ct_tensor *tg = i64_on(4, (int64_t[]){1, 0, 4, 2}, d);
    ct_tensor *r = ct_cross_entropy(t[0], tg, t[1], CT_REDUCTION_MEAN, -100, 0.0);
    ct_tensor_release(tg);
    return r;
}
static ct_tensor *f_nll_loss(ct_tensor *const *t, ct_device d) {
    ct_tensor *tg = i64_on(4, (int64_t[]){3, 0, 4, 2}, d);
    ct_tensor *r = ct_nll_loss(t[0], tg, NULL, CT_REDUCTION_SUM, -100);
    ct_tensor_release(tg);
    return r;
}
static ct_tensor *f_mse_loss(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_mse_loss(t[0], t[1], CT_REDUCTION_NONE);
}
static ct_tensor *f_sum(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_sum(t[0], CT_DIMS(1), false);
}
static ct_tensor *f_prod(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_prod(t[0], CT_DIMS(-1), true);
}
static ct_tensor *f_cumsum(ct_tensor *const *t, ct_device d) { (void)d; return ct_cumsum(t[0], 0); }
static ct_tensor *f_norm(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_norm(t[0], 2.0, CT_NONE, false);
}
static ct_tensor *f_scatter_add(ct_tensor *const *t, ct_device d) {
    int64_t iv[6] = {0, 3, 1, 2, 2, 0};
    ct_tensor *ic = checked(ct_tensor_from_data(iv, CT_I64, 2, (int64_t[]){3, 2}));
    ct_tensor *ix = checked(ct_to_device(ic, d));
    ct_tensor *r = ct_scatter_add(t[0], 1, ix, t[1]);
    ct_tensor_release(ix);
    ct_tensor_release(ic);
    return r;
}
static ct_tensor *f_rms_norm(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_rms_norm(t[0], CT_LIST(8), t[1], 1e-6, NULL);
}
static ct_tensor *f_rope(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_rope(t[0], t[1], t[2], CT_ROPE_HALF);
}
static ct_tensor *f_add(ct_tensor *const *t, ct_device d) { (void)d; return ct_add(t[0], t[1]); }
static ct_tensor *f_gelu(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_gelu(t[0], CT_GELU_TANH);
}
static ct_tensor *f_mean(ct_tensor *const *t, ct_device d) {
    (void)d;
    return ct_mean(t[0], CT_DIMS(0), false);
}

typedef struct op_case {
    const char *name;
    op_fn fn;
    int nin;
    shp shape[MAXIN];
    double lo, hi;
} op_case;

static const op_case cases[] = {
    {"matmul", f_matmul, 2, {SHP(3, 4, 5), SHP(5, 6)}, -1, 1},
    {"mm", f_mm, 2, {SHP(64, 40), SHP(40, 24)}, -1, 1},
    {"bmm", f_bmm, 2, {SHP(2, 3, 4), SHP(2, 4, 5)}, -1, 1},
    {"addmm", f_addmm, 3, {SHP(3), SHP(2, 4), SHP(4, 3)}, -1, 1},
    {"linear", f_linear, 3, {SHP(2, 3, 16), SHP(8, 16), SHP(8)}, -1, 1},
    {"conv2d", f_conv2d, 3, {SHP(2, 4, 8, 8), SHP(8, 4, 3, 3), SHP(8)}, -1, 1},
    {"sdpa", f_sdpa, 4, {SHP(1, 2, 4, 8), SHP(1, 2, 6, 8), SHP(1, 2, 6, 8), SHP(4, 6)}, -1, 1},
    /* the shapes cuDNN's fused attention takes */
    {"sdpa causal", f_sdpa_causal, 3, {SHP(1, 2, 64, 64), SHP(1, 2, 64, 64), SHP(1, 2, 64, 64)},
     -1, 1},
    {"linear_cross_entropy", f_lce, 3, {SHP(6, 4), SHP(5, 4), SHP(5)}, -1, 1},
    {"exp", f_exp, 1, {SHP(3, 4)}, -2, 2},
    {"log", f_log, 1, {SHP(3, 4)}, 0.1, 3},
    {"rsqrt", f_rsqrt, 1, {SHP(3, 4)}, 0.1, 3},
    {"reciprocal", f_reciprocal, 1, {SHP(3, 4)}, 0.5, 3},
    {"pow", f_pow, 2, {SHP(3, 4), SHP(4)}, 0.5, 2},
    {"pow_scalar", f_pow_scalar, 1, {SHP(3, 4)}, 0.5, 2},
    {"softplus", f_softplus, 1, {SHP(3, 4)}, -3, 3},
    {"layer_norm", f_layer_norm, 3, {SHP(2, 3, 8), SHP(8), SHP(8)}, -2, 2},
    {"softmax", f_softmax, 1, {SHP(3, 7)}, -3, 3},
    {"log_softmax", f_log_softmax, 1, {SHP(2, 5, 3)}, -3, 3},
    {"cross_entropy", f_cross_entropy, 2, {SHP(4, 5), SHP(5)}, 0.2, 2},
    {"nll_loss", f_nll_loss, 1, {SHP(4, 5)}, -3, 0},
    {"mse_loss", f_mse_loss, 2, {SHP(3, 4), SHP(3, 4)}, -2, 2},
    {"sum", f_sum, 1, {SHP(3, 9)}, -1, 1},
    {"prod", f_prod, 1, {SHP(2, 5)}, 0.5, 1.5},
    {"cumsum", f_cumsum, 1, {SHP(6, 3)}, -1, 1},
    {"norm", f_norm, 1, {SHP(4, 5)}, -1, 1},
    {"scatter_add", f_scatter_add, 2, {SHP(3, 4), SHP(3, 2)}, -1, 1},
    {"rms_norm", f_rms_norm, 2, {SHP(2, 3, 8), SHP(8)}, -2, 2},
    {"rope", f_rope, 3, {SHP(2, 4, 8), SHP(4, 4), SHP(4, 4)}, -1, 1},
    {"add", f_add, 2, {SHP(3, 4), SHP(4)}, -2, 2},
    {"gelu", f_gelu, 1, {SHP(3, 4)}, -2, 2},
    {"mean", f_mean, 1, {SHP(5, 3)}, -2, 2},
};

typedef struct config {
    const char *name;
    ct_dtype first, rest;
} config;

static const config configs[] = {
    {"f32", CT_F32, CT_F32}, {"bf16", CT_BF16, CT_BF16}, {"bf16+f32", CT_BF16, CT_F32},
};

/* One rounding of the result's dtype apart, and the last bits of float32 math. */
static double tol_of(ct_dtype dt) { return dt == CT_F32 ? 1e-4 : tu_rtol(dt); }

static void expect_close_tol(const char *what, ct_tensor *got, ct_tensor *ref, double tol) {
    int64_t n = ct_tensor_numel(ref);
    double *g = tu_values(got), *r = tu_values(ref), mx = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(r[i]));
    for (int64_t i = 0; i < n; i++) {
        if (fabs(g[i] - r[i]) <= tol * (fabs(r[i]) + mx)) continue;
        fprintf(stderr, "%s: element %lld: got %.9g on the GPU, %.9g on the CPU (tol %g)\n",
                what, (long long)i, g[i], r[i], tol);
        fail();
    }
    free(g);
    free(r);
}

static void expect_close(const char *what, ct_tensor *got, ct_tensor *ref) {
    expect_close_tol(what, got, ref, tol_of(ct_tensor_dtype(ref)));
}

/* k in a region of dtype on the CPU and on the GPU: the same dtype, the same values. */
static void run_case(const op_case *k, ct_dtype region, const config *cf, bool noncontig) {
    char what[160];
    snprintf(what, sizeof what, "%s, region %s, inputs %s%s", k->name, ct_dtype_name(region),
             cf->name, noncontig ? ", non-contiguous" : "");
    ct_tensor *cin[MAXIN] = {0}, *gin[MAXIN] = {0};
    for (int i = 0; i < k->nin; i++) {
        ct_dtype dt = i == 0 ? cf->first : cf->rest;
        cin[i] = tu_rand(k->shape[i].nd, k->shape[i].s, dt, k->lo, k->hi, NULL);
        ct_tensor *g = gpu(cin[i]);
        gin[i] = noncontig ? checked(tu_noncontig(g)) : ct_tensor_retain(g);
        ct_tensor_release(g);
    }
    ok(ct_autocast_begin(CT_CPU, region));
    ct_tensor *ref = k->fn(cin, CT_CPU);
    ok(ct_autocast_end());
    if (!ref) fprintf(stderr, "%s on the CPU: %s\n", what, ct_last_error());
    assert_non_null(ref);
    ok(ct_autocast_begin(CT_CUDA(0), region));
    ct_tensor *got = k->fn(gin, CT_CUDA(0));
    ok(ct_autocast_end());
    if (!got) fprintf(stderr, "%s on the GPU: %s\n", what, ct_last_error());
    assert_non_null(got);
    assert_int_equal(ct_tensor_device(got).type, CT_DEVICE_CUDA);
    if (ct_tensor_dtype(got) != ct_tensor_dtype(ref))
        fprintf(stderr, "%s: %s on the GPU, %s on the CPU\n", what,
                ct_dtype_name(ct_tensor_dtype(got)), ct_dtype_name(ct_tensor_dtype(ref)));
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(ref));
    expect_close(what, got, ref);
    ct_tensor_release(got);
    ct_tensor_release(ref);
    for (int i = 0; i < k->nin; i++) {
        ct_tensor_release(cin[i]);
        ct_tensor_release(gin[i]);
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

/* A region of one device type leaves the other's tensors alone. */
static void test_device_types(void **state) {
    (void)state;
    ct_tensor *c = tu_rand(CT_SHAPE(8, 8), CT_F32, -1, 1, NULL);
    ct_tensor *g = gpu(c);
    ok(ct_autocast_begin(CT_CPU, CT_BF16));
    ct_tensor *rg = checked(ct_mm(g, g));
    ct_tensor *rc = checked(ct_mm(c, c));
    ok(ct_autocast_end());
    assert_int_equal(ct_tensor_dtype(rg), CT_F32);
    assert_int_equal(ct_tensor_dtype(rc), CT_BF16);
    ct_tensor_release(rg);
    ct_tensor_release(rc);
    ok(ct_autocast_begin(CT_CUDA(0), CT_F16));
    rg = checked(ct_mm(g, g));
    rc = checked(ct_mm(c, c));
    ok(ct_autocast_end());
    assert_int_equal(ct_tensor_dtype(rg), CT_F16);
    assert_int_equal(ct_tensor_dtype(rc), CT_F32);
    ct_tensor *ts[4] = {rg, rc, g, c};
    for (int i = 0; i < 4; i++) ct_tensor_release(ts[i]);
}

/* ---- one training step's gradients ------------------------------------------------------- */

enum { N = 32, D = 24, H = 40, C = 10 };

typedef struct model {
    ct_tensor *x, *w1, *b1, *w2, *b2, *t;
} model;

static void model_free(model *m) {
    ct_tensor *ts[6] = {m->x, m->w1, m->b1, m->w2, m->b2, m->t};
    for (int i = 0; i < 6; i++) ct_tensor_release(ts[i]);
}

static model model_on(const model *cpu, ct_device dev) {
    model m;
    ct_tensor *const src[6] = {cpu->x, cpu->w1, cpu->b1, cpu->w2, cpu->b2, cpu->t};
    ct_tensor **dst[6] = {&m.x, &m.w1, &m.b1, &m.w2, &m.b2, &m.t};
    for (int i = 0; i < 6; i++) {
        *dst[i] = checked(ct_to_device(src[i], dev));
        ct_tensor *d = checked(ct_detach(*dst[i])); /* a leaf of its own */
        ct_tensor_release(*dst[i]);
        *dst[i] = d;
        if (i >= 1 && i <= 4) ok(ct_requires_grad_(d, true));
    }
    return m;
}

/* Forward in a region of dtype on dev's type, backward outside it. */
static void step(model *m, ct_device dev, ct_dtype dtype) {
    ok(ct_autocast_begin(dev, dtype));
    /* tanh, not relu: a pre-activation near zero that the two devices round
     * to opposite signs would flip relu's mask and move a whole term of a
     * weight's gradient (a seed failed so in float16) */
    ct_tensor *h = checked(ct_tanh(checked(ct_linear(m->x, m->w1, m->b1))));
    ct_tensor *z = checked(ct_linear(h, m->w2, m->b2));
    assert_int_equal(ct_tensor_dtype(z), dtype);
    ct_tensor *loss = checked(ct_cross_entropy(z, m->t, NULL, CT_REDUCTION_MEAN, -100, 0.0));
    assert_int_equal(ct_tensor_dtype(loss), CT_F32);
    ok(ct_autocast_end());
    ok(ct_backward(loss, NULL, false));
}

static void test_training_step(void **state) {
    (void)state;
    const ct_dtype dts[2] = {CT_BF16, CT_F16};
    for (int di = 0; di < 2; di++) {
        model cpu = {
            .x = tu_rand(CT_SHAPE(N, D), CT_F32, -1, 1, NULL),
            .w1 = tu_rand(CT_SHAPE(H, D), CT_F32, -0.3, 0.3, NULL),
            .b1 = tu_rand(CT_SHAPE(H), CT_F32, -0.3, 0.3, NULL),
            .w2 = tu_rand(CT_SHAPE(C, H), CT_F32, -0.3, 0.3, NULL),
            .b2 = tu_rand(CT_SHAPE(C), CT_BF16, -0.3, 0.3, NULL),
            .t = tu_rand(CT_SHAPE(N), CT_I64, 0, C, NULL),
        };
        model mc = model_on(&cpu, CT_CPU), mg = model_on(&cpu, CT_CUDA(0));
        ct_scope *s = ct_scope_begin();
        step(&mc, CT_CPU, dts[di]);
        step(&mg, CT_CUDA(0), dts[di]);
        ct_scope_end(s);
        ct_tensor *lc[4] = {mc.w1, mc.b1, mc.w2, mc.b2}, *lg[4] = {mg.w1, mg.b1, mg.w2, mg.b2};
        for (int i = 0; i < 4; i++) {
            ct_tensor *gc = ct_grad(lc[i]), *gg = ct_grad(lg[i]);
            assert_non_null(gc);
            assert_non_null(gg);
            assert_int_equal(ct_tensor_dtype(gg), i == 3 ? CT_BF16 : CT_F32);
            assert_int_equal(ct_tensor_dtype(gg), ct_tensor_dtype(gc));
            /* float32 leaves, but every product on the way ran in the region's
             * dtype, with each device's own order of additions and roundings */
            expect_close_tol("gradient", gg, gc, 2 * tu_rtol(dts[di]));
        }
        model_free(&mc);
        model_free(&mg);
        model_free(&cpu);
    }
}

/* A weight used twice in a region is cast once on the GPU too. */
static void test_cache(void **state) {
    (void)state;
    ct_tensor *xc = tu_rand(CT_SHAPE(8, 16), CT_F32, -1, 1, NULL);
    ct_tensor *wc = tu_rand(CT_SHAPE(4, 16), CT_F32, -1, 1, NULL);
    ct_tensor *x = gpu(xc), *w = gpu(wc);
    ct_tensor *wl = checked(ct_detach(w));
    ok(ct_requires_grad_(wl, true));
    int64_t c0, h0, c1, h1;
    cti_autocast_counts(&c0, &h0);
    ok(ct_autocast_begin(CT_CUDA(0), CT_BF16));
    ct_tensor *y1 = checked(ct_linear(x, wl, NULL));
    ct_tensor *y2 = checked(ct_linear(x, wl, NULL));
    ok(ct_autocast_end());
    cti_autocast_counts(&c1, &h1);
    assert_int_equal(c1 - c0, 3); /* x twice, the weight once */
    assert_int_equal(h1 - h0, 1);
    ct_tensor *ts[7] = {y1, y2, wl, w, x, wc, xc};
    for (int i = 0; i < 7; i++) ct_tensor_release(ts[i]);
}

/* An MLP block in a bfloat16 region, its activation (GELU's or SwiGLU's output, which the
 * second linear saves) left to recomputation (ct_set_recompute_enabled) or not: the same
 * float32 weight gradients bit for bit, and the activation's device memory free once its
 * handle goes. */
typedef struct block_run {
    double *g1, *g2;
    uint64_t allocated; /* after the forward, the activation's handle released */
} block_run;

static block_run mlp_block(bool swiglu, bool recompute, ct_tensor *x, ct_tensor *w1,
                           ct_tensor *w2, ct_tensor *g) {
    ct_zero_grad(w1);
    ct_zero_grad(w2);
    bool prev = ct_set_recompute_enabled(recompute);
    ok(ct_autocast_begin(CT_CUDA(0), CT_BF16));
    ct_tensor *h = checked(ct_linear(x, w1, NULL)), *a;
    if (swiglu) {
        ct_tensor *gu[2] = {NULL, NULL};
        int n = 0;
        ok(ct_chunk(h, 2, -1, 2, gu, &n));
        a = checked(ct_swiglu(gu[0], gu[1]));
        ct_tensor_release(gu[0]);
        ct_tensor_release(gu[1]);
    } else {
        a = checked(ct_gelu(h, CT_GELU_TANH));
    }
    assert_int_equal(ct_tensor_dtype(a), CT_BF16);
    ct_tensor *z = checked(ct_linear(a, w2, NULL));
    ok(ct_autocast_end());
    ct_set_recompute_enabled(prev);
    ct_tensor_release(h);
    ct_tensor_release(a);
    ok(ct_cuda_synchronize(0));
    ct_cuda_memstats st;
    ok(ct_cuda_memory_stats(0, &st));
    ok(ct_backward(z, g, false));
    ct_tensor_release(z);
    block_run r = {tu_values(ct_grad(w1)), tu_values(ct_grad(w2)), st.allocated};
    return r;
}

static void test_recompute_block(void **state) {
    (void)state;
    for (int sw = 0; sw < 2; sw++) {
        int64_t hid = H, w1rows = sw ? 2 * H : H;
        ct_scope *s = ct_scope_begin();
        ct_tensor *x = gpu(tu_rand(CT_SHAPE(N, D), CT_F32, -1, 1, NULL));
        ct_tensor *w1 = gpu(tu_rand(CT_SHAPE(w1rows, D), CT_F32, -0.3, 0.3, NULL));
        ct_tensor *w2 = gpu(tu_rand(CT_SHAPE(C, hid), CT_F32, -0.3, 0.3, NULL));
        ct_tensor *g = gpu(tu_rand(CT_SHAPE(N, C), CT_BF16, -1, 1, NULL));
        ok(ct_requires_grad_(w1, true));
        ok(ct_requires_grad_(w2, true));
        block_run off = mlp_block(sw, false, x, w1, w2, g);
        block_run on = mlp_block(sw, true, x, w1, w2, g);
        for (int64_t i = 0; i < w1rows * D; i++)
            assert_memory_equal(&on.g1[i], &off.g1[i], sizeof(double));
        for (int64_t i = 0; i < C * hid; i++)
            assert_memory_equal(&on.g2[i], &off.g2[i], sizeof(double));
        assert_true((int64_t)off.allocated - (int64_t)on.allocated >= N * hid * 2);
        free(off.g1);
        free(off.g2);
        free(on.g1);
        free(on.g2);
        ct_scope_end(s);
    }
}

/* ---- lasting casts: the fused optimizers write them -------------------------------------- */

/* One step of linear(x, w, b) -> tanh -> sum in a region of dtype, its output (float32,
 * the caller's) in *y. */
static void lasting_step(ct_optimizer *opt, ct_tensor *x, ct_tensor *w, ct_tensor *b,
                         ct_dtype dtype, ct_tensor **y) {
    ok(ct_autocast_begin(CT_CUDA(0), dtype));
    ct_tensor *h = checked(ct_tanh(checked(ct_linear(x, w, b))));
    ok(ct_autocast_end());
    *y = checked(ct_to_dtype(h, CT_F32));
    ct_optim_zero_grad(opt);
    ct_tensor *l = checked(ct_sum(h, CT_NONE, false));
    ok(ct_backward(l, NULL, false));
    ok(ct_optim_step(opt));
    ct_tensor_release(l);
    ct_tensor_release(h);
}

/* Every fused optimizer, in bfloat16 and float16 regions, over a weight of several kernel
 * chunks with a ragged end: with lasting casts the optimizer writes the weights' casts in its
 * pass and the next regions take them without a kernel, and every output, gradient and
 * parameter is bit for bit that of casting afresh in every region. */
static void test_lasting_casts(void **state) {
    (void)state;
    static const ct_dtype dts[2] = {CT_BF16, CT_F16};
    for (int di = 0; di < 2; di++)
        for (int alg = 0; alg < N_OPTIM_ALGS; alg++) {
            ct_scope *s = ct_scope_begin();
            ct_tensor *x = gpu(tu_rand(CT_SHAPE(8, 257), CT_F32, -1, 1, NULL));
            ct_tensor *w0 = tu_rand(CT_SHAPE(300, 257), CT_F32, -0.2, 0.2, NULL);
            ct_tensor *b0 = tu_rand(CT_SHAPE(300), CT_F32, -0.2, 0.2, NULL);
            ct_tensor *w[2], *b[2];
            ct_params *ps[2];
            ct_optimizer *opt[2];
            for (int k = 0; k < 2; k++) {
                w[k] = gpu(w0);
                b[k] = gpu(b0);
                ok(ct_requires_grad_(w[k], true));
                ok(ct_requires_grad_(b[k], true));
                ps[k] = ct_params_new();
                ok(ct_params_add(ps[k], "w", w[k]));
                ok(ct_params_add(ps[k], "b", b[k]));
                opt[k] = optimizer_of(alg, ps[k]);
                assert_non_null(opt[k]);
            }
            int64_t k0 = cti_autocast_kept_count();
            for (int st = 0; st < 3; st++) {
                ct_tensor *y[2];
                ct_autocast_set_lasting_casts(true);
                lasting_step(opt[0], x, w[0], b[0], dts[di], &y[0]);
                int64_t k1 = cti_autocast_kept_count();
                assert_int_equal(k1 - k0, st == 0 ? 0 : 2);
                ct_autocast_set_lasting_casts(false);
                lasting_step(opt[1], x, w[1], b[1], dts[di], &y[1]);
                k0 = cti_autocast_kept_count();
                assert_int_equal(k0, k1);
                tu_assert_same_bits("output", y[0], y[1]);
                tu_assert_same_bits("weight gradient", ct_grad(w[0]), ct_grad(w[1]));
                tu_assert_same_bits("bias gradient", ct_grad(b[0]), ct_grad(b[1]));
                tu_assert_same_bits("weight", w[0], w[1]);
                tu_assert_same_bits("bias", b[0], b[1]);
                ct_tensor_release(y[0]);
                ct_tensor_release(y[1]);
            }
            ct_autocast_set_lasting_casts(true);
            for (int k = 0; k < 2; k++) {
                ct_optim_free(opt[k]);
                ct_params_free(ps[k]);
            }
            ct_scope_end(s);
        }
}

/* The trace has no conversion into float32 (a cast's line); else it is printed. */
static void expect_no_f32_conversion(const char *log) {
    int f32_copies = tu_trace_lines(log, "] copy ", " float32 ");
    if (f32_copies) fprintf(stderr, "a conversion to float32:\n%s", log);
    assert_int_equal(f32_copies, 0);
}

/* A float32 weight's and bias's gradients through a region's casts leave the GEMM in float32
 * (cti_ag_grad_dtype): on the GPU the bias-gradient epilogue writes both, no conversion pass
 * follows, and they match the CPU's (also unrounded) to float32 accuracy, for the
 * epilogue's operands and for odd widths (GEMM and column sum in float32). */
static void test_widened_weight_grads(void **state) {
    (void)state;
    static const ct_dtype dts[2] = {CT_BF16, CT_F16};
    static const int64_t dims[2][3] = {{64, 64, 24}, {37, 33, 17}}; /* rows, in, out */
    for (int di = 0; di < 2; di++)
        for (int s = 0; s < 2; s++) {
            ct_scope *sc = ct_scope_begin();
            const int64_t *d = dims[s];
            ct_tensor *x = tu_rand(CT_SHAPE(d[0], d[1]), CT_F32, -1, 1, NULL);
            ct_tensor *g = tu_rand(CT_SHAPE(d[0], d[2]), dts[di], -1, 1, NULL);
            ct_tensor *w0 = tu_rand(CT_SHAPE(d[2], d[1]), CT_F32, -1, 1, NULL);
            ct_tensor *b0 = tu_rand(CT_SHAPE(d[2]), CT_F32, -1, 1, NULL);
            ct_tensor *w[2], *b[2];
            for (int k = 0; k < 2; k++) {
                ct_device dev = k ? CT_CUDA(0) : CT_CPU;
                w[k] = checked(ct_to_device(w0, dev));
                b[k] = checked(ct_to_device(b0, dev));
                ok(ct_requires_grad_(w[k], true));
                ok(ct_requires_grad_(b[k], true));
                ok(ct_autocast_begin(dev, dts[di]));
                ct_tensor *y = checked(ct_linear(checked(ct_to_device(x, dev)), w[k], b[k]));
                ok(ct_autocast_end());
                tu_trace t = tu_trace_begin();
                ok(ct_backward(y, checked(ct_to_device(g, dev)), false));
                ok(ct_cuda_synchronize(0));
                char *log = tu_trace_end(&t);
                expect_no_f32_conversion(log);
                if (k == 1 && s == 0)
                    assert_non_null(strstr(log, "cublasLtMatmul, bias-gradient epilogue"));
                free(log);
                assert_int_equal(ct_tensor_dtype(ct_grad(w[k])), CT_F32);
                assert_int_equal(ct_tensor_dtype(ct_grad(b[k])), CT_F32);
            }
            expect_close_tol("weight gradient", ct_grad(w[1]), ct_grad(w[0]), 1e-5);
            expect_close_tol("bias gradient", ct_grad(b[1]), ct_grad(b[0]), 1e-5);
            ct_scope_end(sc);
        }
}

/* ct_mlp_gelu's four float32 parameters through a region's casts get float32 gradients on the
 * GPU with no conversion after: b_in's from the pass that folds gelu's backward into the row
 * sums (hidden width a multiple of 8) or the composite's row sum (33), storing its float32
 * accumulators; they match the CPU's within the rounding of the half hidden gradient. */
static void test_widened_mlp_grads(void **state) {
    (void)state;
    static const ct_dtype dts[2] = {CT_BF16, CT_F16};
    static const int64_t dims[2][4] = {{64, 32, 64, 24}, {37, 24, 33, 16}}; /* rows, in, hidden, out */
    for (int di = 0; di < 2; di++)
        for (int s = 0; s < 2; s++) {
            ct_scope *sc = ct_scope_begin();
            const int64_t *d = dims[s];
            ct_tensor *x = tu_rand(CT_SHAPE(d[0], d[1]), CT_F32, -1, 1, NULL);
            ct_tensor *g = tu_rand(CT_SHAPE(d[0], d[3]), dts[di], -1, 1, NULL);
            ct_tensor *p0[4] = {tu_rand(CT_SHAPE(d[2], d[1]), CT_F32, -0.5, 0.5, NULL),
                                tu_rand(CT_SHAPE(d[2]), CT_F32, -0.5, 0.5, NULL),
                                tu_rand(CT_SHAPE(d[3], d[2]), CT_F32, -0.5, 0.5, NULL),
                                tu_rand(CT_SHAPE(d[3]), CT_F32, -0.5, 0.5, NULL)};
            ct_tensor *p[2][4];
            for (int k = 0; k < 2; k++) {
                ct_device dev = k ? CT_CUDA(0) : CT_CPU;
                for (int i = 0; i < 4; i++) {
                    p[k][i] = checked(ct_to_device(p0[i], dev));
                    ok(ct_requires_grad_(p[k][i], true));
                }
                ok(ct_autocast_begin(dev, dts[di]));
                ct_tensor *y = checked(ct_mlp_gelu(checked(ct_to_device(x, dev)), p[k][0], p[k][1],
                                                   p[k][2], p[k][3], CT_GELU_TANH));
                ok(ct_autocast_end());
                tu_trace t = tu_trace_begin();
                ok(ct_backward(y, checked(ct_to_device(g, dev)), false));
                if (k) ok(ct_cuda_synchronize(0));
                char *log = tu_trace_end(&t);
                expect_no_f32_conversion(log);
                if (k && s == 0)
                    assert_int_equal(tu_trace_lines(log, "gelu_backward folded into the row sums",
                                                    NULL),
                                     1);
                free(log);
                for (int i = 0; i < 4; i++)
                    assert_int_equal(ct_tensor_dtype(ct_grad(p[k][i])), CT_F32);
            }
            const char *names[4] = {"w_in's gradient", "b_in's gradient", "w_out's gradient",
                                    "b_out's gradient"};
            for (int i = 0; i < 4; i++)
                expect_close_tol(names[i], ct_grad(p[1][i]), ct_grad(p[0][i]), tu_rtol(dts[di]));
            ct_scope_end(sc);
        }
}

/* cross_entropy in a region on float16/bfloat16 logits reads them as they are on the GPU too:
 * a float32 loss and the logits' gradient in their dtype, as the CPU gives them, with no copy
 * (cast) in the forward or the backward; every reduction, with label smoothing and an ignored
 * target, rows the row kernels take (5 classes, 1000) and a strided layout (inner dims). */
static void test_cross_entropy_reads_logits(void **state) {
    (void)state;
    static const ct_dtype dts[2] = {CT_BF16, CT_F16};
    static const ct_reduction reds[3] = {CT_REDUCTION_MEAN, CT_REDUCTION_SUM, CT_REDUCTION_NONE};
    static const int64_t shapes[3][3] = {{7, 5, 0}, {9, 1000, 0}, {4, 6, 3}};
    for (int di = 0; di < 2; di++)
        for (int si = 0; si < 3; si++)
            for (int ri = 0; ri < 3; ri++)
                for (int ls = 0; ls < 2; ls++) {
                    ct_scope *sc = ct_scope_begin();
                    const int64_t *sh = shapes[si];
                    int nd = sh[2] ? 3 : 2;
                    int64_t tshape[2] = {sh[0], sh[2]};
                    ct_tensor *z0 = tu_rand(nd, sh, dts[di], -3, 3, NULL);
                    ct_tensor *t0 = tu_rand(nd - 1, tshape, CT_I64, 0, (double)sh[1], NULL);
                    ct_tensor *z[2], *loss[2];
                    for (int k = 0; k < 2; k++) {
                        ct_device dev = k ? CT_CUDA(0) : CT_CPU;
                        z[k] = checked(ct_to_device(z0, dev));
                        ct_tensor *t = checked(ct_to_device(t0, dev));
                        ok(ct_requires_grad_(z[k], true));
                        tu_trace tr = tu_trace_begin();
                        ok(ct_autocast_begin(dev, dts[di]));
                        loss[k] = checked(ct_cross_entropy(z[k], t, NULL, reds[ri], 1, 0.1 * ls));
                        ok(ct_autocast_end());
                        ct_tensor *sum = checked(ct_sum(loss[k], CT_NONE, false));
                        ok(ct_backward(sum, NULL, false));
                        if (k) ok(ct_cuda_synchronize(0));
                        char *log = tu_trace_end(&tr);
                        /* a copy only to make the broadcast gradient of none contiguous */
                        const char *c = strstr(log, "] copy ");
                        if (c && reds[ri] != CT_REDUCTION_NONE) fprintf(stderr, "%s", log);
                        assert_true(!c || reds[ri] == CT_REDUCTION_NONE);
                        free(log);
                        assert_int_equal(ct_tensor_dtype(loss[k]), CT_F32);
                        assert_int_equal(ct_tensor_dtype(ct_grad(z[k])), dts[di]);
                    }
                    expect_close_tol("loss", loss[1], loss[0], 1e-5);
                    expect_close_tol("logits' gradient", ct_grad(z[1]), ct_grad(z[0]),
                                     tu_rtol(dts[di]));
                    ct_scope_end(sc);
                }
}

int main(void) {
    tu_seed();
    cti_init();
    (void)tu_cuda_devices_or_skip("cuda_autocast");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_op_table),
        T(test_device_types),
        T(test_training_step),
        T(test_cache),
        T(test_recompute_block),
        T(test_lasting_casts),
        T(test_widened_weight_grads),
        T(test_widened_mlp_grads),
        T(test_cross_entropy_reads_logits),
    };
#undef T
    return tu_run_tests(tests);
}
