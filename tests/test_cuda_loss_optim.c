/* The new losses and optimizers on a GPU against the CPU:
 *  - every loss of src/ops/losses.c, every floating dtype, its value and
 *    its gradients (backward on the device against backward on the CPU);
 *  - Adam (amsgrad), RMSprop (momentum, centered), Adagrad (lr_decay,
 *    initial accumulator) with weight decay: several steps with a learning
 *    rate changed between them (the rate and counts on the device), in
 *    float32, float64 and bfloat16 with float32 master weights; the states
 *    and counts alike;
 *  - in-place ops on tensors with history (the rebase) on the device.
 * Skipped without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "cuda_module.h"
#include "cuda_test_util.h"
#include "test_fixture.h"

#define DEV CT_CUDA(0)

static void assert_close_t(const ct_tensor *got, const ct_tensor *ref, double rtol, double atol) {
    assert_int_equal(ct_tensor_numel(got), ct_tensor_numel(ref));
    double *g = tu_values(got), *r = tu_values(ref);
    tu_assert_close(g, r, ct_tensor_numel(ref), rtol, atol);
    free(g);
    free(r);
}

/* t's twin on the GPU: a leaf of its own (the copy is detached from t, so
 * gradients of the two stay on their own devices). */
static ct_tensor *on_dev(ct_tensor *t) {
    if (!t) return NULL;
    ct_tensor *c = checked(ct_detach(t));
    ct_tensor *d = checked(ct_to_device(c, DEV));
    ct_tensor_release(c);
    if (ct_requires_grad(t)) ok(ct_requires_grad_(d, true));
    return d;
}

/* ---- losses ------------------------------------------------------------------------------- */
typedef ct_tensor *(*loss_fn)(ct_tensor *const *in, ct_reduction r);

static ct_tensor *f_bce(ct_tensor *const *in, ct_reduction r) {
    return ct_binary_cross_entropy(in[0], in[1], in[2], r);
}
static ct_tensor *f_bcel(ct_tensor *const *in, ct_reduction r) {
    return ct_binary_cross_entropy_with_logits(in[0], in[1], in[2], in[3], r);
}
static ct_tensor *f_l1(ct_tensor *const *in, ct_reduction r) {
    return ct_l1_loss(in[0], in[1], r);
}
static ct_tensor *f_sl1(ct_tensor *const *in, ct_reduction r) {
    return ct_smooth_l1_loss(in[0], in[1], r, 0.7);
}
static ct_tensor *f_huber(ct_tensor *const *in, ct_reduction r) {
    return ct_huber_loss(in[0], in[1], r, 1.3);
}
static ct_tensor *f_kl(ct_tensor *const *in, ct_reduction r) {
    return ct_kl_div(in[0], in[1], r == CT_REDUCTION_MEAN ? CT_REDUCTION_BATCHMEAN : r, false);
}
static ct_tensor *f_kl_log(ct_tensor *const *in, ct_reduction r) {
    return ct_kl_div(in[0], in[1], r, true);
}
static ct_tensor *f_margin(ct_tensor *const *in, ct_reduction r) {
    return ct_margin_ranking_loss(in[0], in[1], in[2], 0.2, r);
}
static ct_tensor *f_cos(ct_tensor *const *in, ct_reduction r) {
    (void)r;
    return ct_cosine_similarity(in[0], in[1], 1, 1e-8);
}
static ct_tensor *f_cel(ct_tensor *const *in, ct_reduction r) {
    return ct_cosine_embedding_loss(in[0], in[1], in[2], 0.1, r);
}
static ct_tensor *f_ce(ct_tensor *const *in, ct_reduction r) {
    return ct_cross_entropy(in[0], in[1], in[2], r, -100, 0.1);
}

typedef struct lcase {
    const char *name;
    loss_fn fn;
    int nin;
    double lo[4], hi[4];
    bool row[4], grad[4], sign[4]; /* [C] inputs; which require grad; +-1 values */
} lcase;

static const lcase lcases[] = {
    {"bce", f_bce, 3, {0.05, 0, 0.5}, {0.95, 1, 2}, {0, 0, 1}, {1, 1, 0}, {0}},
    {"bce_with_logits", f_bcel, 4, {-5, 0, 0.5, 0.5}, {5, 1, 2, 3}, {0, 0, 0, 1}, {1, 1, 1, 1},
     {0}},
    {"l1", f_l1, 2, {-2, -2}, {2, 2}, {0, 1}, {1, 1}, {0}},
    {"smooth_l1", f_sl1, 2, {-2, -2}, {2, 2}, {0}, {1, 1}, {0}},
    {"huber", f_huber, 2, {-3, -3}, {3, 3}, {0}, {1, 1}, {0}},
    {"kl_div", f_kl, 2, {-3, 0.01}, {0, 1}, {0}, {1, 1}, {0}},
    {"kl_div log_target", f_kl_log, 2, {-3, -3}, {0, 0}, {0}, {1, 1}, {0}},
    {"margin_ranking", f_margin, 3, {-2, -2, -1}, {2, 2, 1}, {0, 0, 1}, {1, 1, 0}, {0, 0, 1}},
    {"cosine_similarity", f_cos, 2, {-1, -1}, {1, 1}, {0, 1}, {1, 1}, {0}},
    {"cosine_embedding", f_cel, 3, {-1, -1, 0}, {1, 1, 0}, {0}, {1, 1, 0}, {0, 0, 1}},
    {"cross_entropy prob", f_ce, 3, {-3, 0, 0.5}, {3, 1, 2}, {0, 0, 1}, {1, 1, 0}, {0}},
};

static double ltol(ct_dtype dt) {
    return dt == CT_F64 ? 1e-12 : dt == CT_F32 ? 1e-5 : dt == CT_F16 ? 1e-2 : 6e-2;
}

static void test_losses_parity(void **state) {
    (void)state;
    enum { N = 6, C = 9 };
    for (size_t li = 0; li < sizeof lcases / sizeof lcases[0]; li++) {
        const lcase *c = &lcases[li];
        for (size_t di = 0; di < 4; di++) {
            ct_dtype dt = tu_float_dtypes[di];
            for (int r = 0; r < 2; r++) {
                ct_reduction red = r ? CT_REDUCTION_MEAN : CT_REDUCTION_NONE;
                ct_tensor *hc[4] = {NULL}, *hd[4] = {NULL};
                for (int k = 0; k < c->nin; k++) {
                    int64_t full[2] = {N, C}, row[1] = {C}, col[1] = {N};
                    bool cel_t = c->fn == f_cel && k == 2;
                    if (c->sign[k]) { /* +-1 targets */
                        double v[N * C];
                        int64_t n = cel_t ? N : c->row[k] ? C : N * C;
                        for (int64_t i = 0; i < n; i++) v[i] = tu_next() & 1 ? 1 : -1;
                        hc[k] = tu_from_f64(v, cel_t || c->row[k] ? 1 : 2,
                                            cel_t ? col : c->row[k] ? row : full, dt);
                    } else {
                        hc[k] = c->row[k] ? tu_rand(1, row, dt, c->lo[k], c->hi[k], NULL)
                                          : tu_rand(2, full, dt, c->lo[k], c->hi[k], NULL);
                    }
                    if (c->grad[k]) ok(ct_requires_grad_(hc[k], true));
                    hd[k] = on_dev(hc[k]);
                }
                ct_tensor *lc = checked(c->fn(hc, red)), *ld = checked(c->fn(hd, red));
                assert_true(ct_device_eq(ct_tensor_device(ld), DEV));
                double mag = dt == CT_F64 || dt == CT_F32 ? 1 : 5;
                assert_close_t(ld, lc, ltol(dt), ltol(dt) * mag);
                ct_tensor *gc = ct_tensor_ones_like(lc), *gd = ct_tensor_ones_like(ld);
                ok(ct_backward(lc, gc, false));
                ok(ct_backward(ld, gd, false));
                for (int k = 0; k < c->nin; k++)
                    if (c->grad[k]) assert_close_t(ct_grad(hd[k]), ct_grad(hc[k]), ltol(dt),
                                                   ltol(dt) * mag);
                for (int k = 0; k < c->nin; k++) {
                    ct_tensor_release(hc[k]);
                    ct_tensor_release(hd[k]);
                }
                ct_tensor_release(lc), ct_tensor_release(ld);
                ct_tensor_release(gc), ct_tensor_release(gd);
            }
        }
    }
}

/* ---- optimizers -------------------------------------------------------------------------- */
typedef struct ocfg {
    int kind; /* 0 Adam, 1 RMSprop, 2 Adagrad */
    double a, b, c, d;
    bool flag;
} ocfg;

static const ocfg ocfgs[] = {
    {0, 0.9, 0.99, 1e-6, 0.05, false}, {0, 0.8, 0.95, 1e-6, 0.1, true},
    {1, 0.9, 1e-6, 0.01, 0.0, false},  {1, 0.95, 1e-6, 0.02, 0.6, true},
    {2, 0.1, 0.02, 0.3, 1e-8, false},
};

static ct_optimizer *omake(const ocfg *c, ct_params *p) {
    ct_optimizer *o;
    switch (c->kind) {
    case 0: o = ct_optim_adam_new(p, 0.02, c->a, c->b, c->c, c->d, c->flag); break;
    case 1: o = ct_optim_rmsprop_new(p, 0.01, c->a, c->b, c->c, c->d, c->flag); break;
    default: o = ct_optim_adagrad_new(p, 0.05, c->a, c->b, c->c, c->d); break;
    }
    if (!o) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(o);
    return o;
}

#define NP 3
static const int64_t oshape[NP][2] = {{64, 300}, {300, 1}, {0, 5}};

static void run_twins(const ocfg *c, ct_dtype dt, bool masters) {
    ct_params *pc = ct_params_new(), *pg = ct_params_new();
    ct_tensor *tc[NP], *tg[NP];
    for (int k = 0; k < NP; k++) {
        char nm[8];
        snprintf(nm, sizeof nm, "p%d", k);
        tc[k] = tu_rand(2, oshape[k], dt, -1, 1, NULL);
        ok(ct_requires_grad_(tc[k], true));
        tg[k] = on_dev(tc[k]);
        ok(ct_params_add(pc, nm, tc[k]));
        ok(ct_params_add(pg, nm, tg[k]));
    }
    ct_optimizer *oc = omake(c, pc), *og = omake(c, pg);
    if (masters) {
        ok(ct_optim_set_master_weights(oc, true));
        ok(ct_optim_set_master_weights(og, true));
    }
    for (int step = 0; step < 4; step++) {
        if (step == 2) {
            ok(ct_optim_set_lr(oc, 0.003));
            ok(ct_optim_set_lr(og, 0.003));
        }
        for (int k = 0; k < NP; k++) {
            ct_tensor *g = tu_rand(2, oshape[k], dt, -1, 1, NULL), *gd = on_dev(g);
            ok(ct_set_grad(tc[k], g));
            ok(ct_set_grad(tg[k], gd));
            ct_tensor_release(g), ct_tensor_release(gd);
        }
        ok(ct_optim_step(oc));
        ok(ct_optim_step(og));
    }
    double tl = dt == CT_F64 ? 1e-12 : dt == CT_F32 ? 1e-5 : 1e-2;
    for (int k = 0; k < NP; k++) assert_close_t(tg[k], tc[k], tl, tl);
    assert_int_equal(ct_optim_state_count(og), ct_optim_state_count(oc));
    for (int64_t s = 0; s < ct_optim_state_count(og); s++) {
        const char *nc, *ng;
        ct_tensor *sc = ct_optim_state_get(oc, s, &nc), *sg = ct_optim_state_get(og, s, &ng);
        assert_string_equal(nc, ng);
        assert_true(ct_device_eq(ct_tensor_device(sg), DEV));
        assert_close_t(sg, sc, tl, tl);
    }
    ct_optim_free(oc), ct_optim_free(og);
    ct_params_free(pc), ct_params_free(pg);
    for (int k = 0; k < NP; k++) ct_tensor_release(tc[k]), ct_tensor_release(tg[k]);
}

static void test_optim_parity(void **state) {
    (void)state;
    for (size_t ci = 0; ci < sizeof ocfgs / sizeof ocfgs[0]; ci++) {
        run_twins(&ocfgs[ci], CT_F32, false);
        run_twins(&ocfgs[ci], CT_F64, false);
        run_twins(&ocfgs[ci], CT_BF16, true);
    }
}

/* ---- in-place ops on tensors with history -------------------------------------------------- */
/* x = a * 2; x.add_(b); x.mul_(b); x.relu_(); y = (x * x).sum(): the
 * gradients of a and b on the device equal the CPU's. */
static void test_inplace_parity(void **state) {
    (void)state;
    int64_t s[2] = {5, 7};
    ct_tensor *ac = tu_rand(2, s, CT_F64, -1, 1, NULL), *bc = tu_rand(2, s, CT_F64, -1, 1, NULL);
    ok(ct_requires_grad_(ac, true));
    ok(ct_requires_grad_(bc, true));
    ct_tensor *ad = on_dev(ac), *bd = on_dev(bc);
    ct_tensor *ys[2];
    for (int dv = 0; dv < 2; dv++) {
        ct_tensor *a = dv ? ad : ac, *b = dv ? bd : bc;
        ct_tensor *x = checked(ct_mul_scalar(a, 2));
        ok(ct_add_(x, b));
        ok(ct_mul_(x, b));
        ok(ct_relu_(x));
        ct_tensor *xx = checked(ct_mul(x, x));
        ys[dv] = checked(ct_sum(xx, CT_NONE, false));
        ct_tensor_release(xx);
        ct_tensor *one = ct_tensor_ones_like(ys[dv]);
        ok(ct_backward(ys[dv], one, false));
        ct_tensor_release(one);
        ct_tensor_release(x);
    }
    assert_close_t(ys[1], ys[0], 1e-12, 1e-12);
    assert_close_t(ct_grad(ad), ct_grad(ac), 1e-12, 1e-12);
    assert_close_t(ct_grad(bd), ct_grad(bc), 1e-12, 1e-12);
    ct_tensor_release(ys[0]), ct_tensor_release(ys[1]);
    ct_tensor_release(ac), ct_tensor_release(bc), ct_tensor_release(ad), ct_tensor_release(bd);
}

int main(void) {
    tu_seed();
    tu_cuda_devices_or_skip("cuda_loss_optim");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_losses_parity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optim_parity, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inplace_parity, setup, teardown),
    };
    return tu_run_tests(tests);
}
