/* Adam, RMSprop and Adagrad against float64 transcriptions of torch.optim's
 * single-tensor updates written here, over several steps with fresh
 * gradients and a learning rate changed midway, in float64, float32 and
 * float16/bfloat16 with float32 master weights; every option (amsgrad,
 * weight decay, momentum, centered, lr_decay, initial accumulator), a
 * parameter without a gradient skipped, per-parameter weight decay; the
 * state names and a restore into a fresh optimizer continuing alike; SGD's
 * nesterov and dampening against the same kind of reference; the refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <cmocka.h>

#include "test_util.h"

#include "test_fixture.h"

enum { ADAM, RMSPROP, ADAGRAD, SGD };

/* One configuration: the optimizer and its hyperparameters. */
typedef struct cfg {
    int kind;
    double lr, b1, b2, eps, wd, momentum, extra; /* extra: lr_decay | dampening */
    double init;                                 /* Adagrad's initial accumulator */
    bool flag;                                   /* amsgrad | centered | nesterov */
} cfg;

static const cfg cfgs[] = {
    {ADAM, 1e-2, 0.9, 0.999, 1e-8, 0, 0, 0, 0, false},
    {ADAM, 3e-2, 0.8, 0.95, 1e-6, 0.1, 0, 0, 0, true},
    {RMSPROP, 1e-2, 0.99, 0, 1e-8, 0, 0, 0, 0, false},
    {RMSPROP, 5e-3, 0.9, 0, 1e-6, 0.05, 0.7, 0, 0, true},
    {RMSPROP, 5e-3, 0.95, 0, 1e-7, 0, 0.5, 0, 0, false},
    {RMSPROP, 5e-3, 0.95, 0, 1e-7, 0.01, 0, 0, 0, true},
    {ADAGRAD, 1e-1, 0, 0, 1e-10, 0, 0, 0, 0, false},
    {ADAGRAD, 5e-2, 0, 0, 1e-6, 0.02, 0, 0.3, 0.1, false},
    {SGD, 5e-2, 0, 0, 0, 0.01, 0.9, 0, 0, true},
    {SGD, 5e-2, 0, 0, 0, 0, 0.8, 0.25, 0, false},
};
#define NCFG (sizeof cfgs / sizeof cfgs[0])

static ct_optimizer *make(const cfg *c, const ct_params *p) {
    switch (c->kind) {
    case ADAM: return ct_optim_adam_new(p, c->lr, c->b1, c->b2, c->eps, c->wd, c->flag);
    case RMSPROP:
        return ct_optim_rmsprop_new(p, c->lr, c->b1, c->eps, c->wd, c->momentum, c->flag);
    case ADAGRAD: return ct_optim_adagrad_new(p, c->lr, c->extra, c->wd, c->init, c->eps);
    default: return ct_optim_sgd_new(p, c->lr, c->momentum, c->extra, c->wd, c->flag);
    }
}

/* The float64 reference state of one parameter of n elements. */
typedef struct ref {
    int64_t n, step;
    double *p, *s[3];
} ref;

static void ref_init(ref *r, const double *p, int64_t n, const cfg *c) {
    r->n = n;
    r->step = 0;
    r->p = malloc((size_t)n * sizeof *r->p);
    memcpy(r->p, p, (size_t)n * sizeof *r->p);
    for (int b = 0; b < 3; b++) {
        r->s[b] = calloc((size_t)n, sizeof *r->s[b]);
        if (c->kind == ADAGRAD && b == 0)
            for (int64_t i = 0; i < n; i++) r->s[b][i] = c->init;
    }
}

static void ref_free(ref *r) {
    free(r->p);
    for (int b = 0; b < 3; b++) free(r->s[b]);
}

/* torch.optim's _single_tensor_* updates, in float64. */
static void ref_step(ref *r, const double *grad, const cfg *c, double lr) {
    double t = (double)++r->step;
    for (int64_t i = 0; i < r->n; i++) {
        double g = grad[i], *p = &r->p[i];
        double *s0 = &r->s[0][i], *s1 = &r->s[1][i], *s2 = &r->s[2][i];
        if (c->wd != 0) g += c->wd * *p;
        switch (c->kind) {
        case ADAM: {
            *s0 += (g - *s0) * (1 - c->b1); /* exp_avg.lerp_(grad, 1 - beta1) */
            *s1 = *s1 * c->b2 + (1 - c->b2) * g * g;
            double bc1 = 1 - pow(c->b1, t), bc2 = 1 - pow(c->b2, t), v = *s1;
            if (c->flag) v = *s2 = fmax(*s2, *s1);
            *p -= lr / bc1 * *s0 / (sqrt(v) / sqrt(bc2) + c->eps);
            break;
        }
        case RMSPROP: {
            *s0 = *s0 * c->b1 + (1 - c->b1) * g * g;
            double avg;
            if (c->flag) {
                *s2 += (g - *s2) * (1 - c->b1);
                avg = sqrt(*s0 - *s2 * *s2) + c->eps;
            } else {
                avg = sqrt(*s0) + c->eps;
            }
            if (c->momentum > 0) {
                *s1 = *s1 * c->momentum + g / avg;
                *p -= lr * *s1;
            } else {
                *p -= lr * g / avg;
            }
            break;
        }
        case ADAGRAD: {
            double clr = lr / (1 + (t - 1) * c->extra);
            *s0 += g * g;
            *p -= clr * g / (sqrt(*s0) + c->eps);
            break;
        }
        default: {
            if (c->momentum != 0) {
                *s0 = t == 1 ? g : c->momentum * *s0 + (1 - c->extra) * g;
                g = c->flag ? g + c->momentum * *s0 : *s0;
            }
            *p -= lr * g;
        }
        }
    }
}

#define NP 3
static const int64_t pshape[NP][2] = {{7, 9}, {13, 1}, {0, 3}};

static double ptol(ct_dtype dt) { return dt == CT_F64 ? 1e-12 : dt == CT_F32 ? 2e-5 : 1e-2; }

/* Runs configuration c on parameters of dtype dt (masters for the halves)
 * for nsteps steps against the reference; the second parameter gets no
 * gradient at step 2; the rate changes after step 3. */
static void run_cfg(const cfg *c, ct_dtype dt, bool masters) {
    ct_params *pl = ct_params_new();
    ct_tensor *p[NP];
    ref r[NP];
    for (int k = 0; k < NP; k++) {
        double *v;
        p[k] = tu_rand(2, pshape[k], dt, -1, 1, &v);
        assert_int_equal(ct_requires_grad_(p[k], true), CT_OK);
        char nm[8];
        snprintf(nm, sizeof nm, "p%d", k);
        assert_int_equal(ct_params_add(pl, nm, p[k]), CT_OK);
        ref_init(&r[k], v, ct_tensor_numel(p[k]), c);
        free(v);
    }
    ct_optimizer *o = make(c, pl);
    if (!o) fprintf(stderr, "%s\n", ct_last_error());
    assert_non_null(o);
    if (masters) assert_int_equal(ct_optim_set_master_weights(o, true), CT_OK);
    double lr = c->lr;
    for (int step = 0; step < 6; step++) {
        if (step == 3) {
            lr *= 0.5;
            assert_int_equal(ct_optim_set_lr(o, lr), CT_OK);
        }
        for (int k = 0; k < NP; k++) {
            if (k == 1 && step == 2) {
                ct_zero_grad(p[k]);
                continue;
            }
            double *gv;
            ct_tensor *g = tu_rand(2, pshape[k], dt, -1, 1, &gv);
            /* the kernels read the gradient in the parameter's dtype */
            assert_int_equal(ct_set_grad(p[k], g), CT_OK);
            ref_step(&r[k], gv, c, lr);
            free(gv);
            ct_tensor_release(g);
        }
        assert_int_equal(ct_optim_step(o), CT_OK);
    }
    for (int k = 0; k < NP; k++) {
        double *got = tu_values(p[k]);
        double *want = malloc((size_t)(r[k].n ? r[k].n : 1) * sizeof *want);
        for (int64_t i = 0; i < r[k].n; i++) want[i] = tu_round(r[k].p[i], dt);
        tu_assert_close(got, want, r[k].n, ptol(dt), ptol(dt));
        free(got);
        free(want);
        ref_free(&r[k]);
    }
    ct_optim_free(o);
    ct_params_free(pl);
    for (int k = 0; k < NP; k++) ct_tensor_release(p[k]);
}

static void test_updates(void **state) {
    (void)state;
    tu_seed();
    for (size_t ci = 0; ci < NCFG; ci++) {
        run_cfg(&cfgs[ci], CT_F64, false);
        run_cfg(&cfgs[ci], CT_F32, false);
        run_cfg(&cfgs[ci], CT_BF16, true);
        run_cfg(&cfgs[ci], CT_F16, true);
    }
}

/* Low-precision parameters without masters round their states every step:
 * the result follows the reference within the dtype's precision. */
static void test_half_states(void **state) {
    (void)state;
    tu_seed();
    for (size_t ci = 0; ci < NCFG; ci++) {
        cfg c = cfgs[ci];
        c.eps = fmax(c.eps, 1e-3); /* eps below float16's resolution of sqrt(v) */
        int64_t s[1] = {64};
        double *v, *gv;
        ct_tensor *p = tu_rand(1, s, CT_F16, -1, 1, &v);
        assert_int_equal(ct_requires_grad_(p, true), CT_OK);
        ct_params *pl = ct_params_new();
        assert_int_equal(ct_params_add(pl, "p", p), CT_OK);
        ct_optimizer *o = make(&c, pl);
        ref r;
        ref_init(&r, v, 64, &c);
        ct_tensor *g = tu_rand(1, s, CT_F16, 0.2, 1, &gv);
        assert_int_equal(ct_set_grad(p, g), CT_OK);
        ref_step(&r, gv, &c, c.lr);
        assert_int_equal(ct_optim_step(o), CT_OK);
        double *got = tu_values(p);
        tu_assert_close(got, r.p, 64, 2e-3, 2e-3);
        free(got), free(v), free(gv);
        ref_free(&r);
        ct_optim_free(o);
        ct_params_free(pl);
        ct_tensor_release(p);
        ct_tensor_release(g);
    }
}

/* The state's names and tensors; copying them into a fresh optimizer makes
 * it continue as the original. */
static void test_state_restore(void **state) {
    (void)state;
    tu_seed();
    static const char *const want[][4] = {
        {"step", "exp_avg", "exp_avg_sq", NULL},
        {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"},
        {"step", "square_avg", NULL, NULL},
        {"step", "square_avg", "momentum_buffer", "grad_avg"},
        {"step", "square_avg", "momentum_buffer", NULL},
        {"step", "square_avg", "grad_avg", NULL},
        {"step", "sum", NULL, NULL},
        {"step", "sum", NULL, NULL},
    };
    int64_t s[2] = {5, 4};
    for (size_t ci = 0; ci < 8; ci++) {
        const cfg *c = &cfgs[ci];
        ct_tensor *a = tu_rand(2, s, CT_F32, -1, 1, NULL), *b = ct_clone(a);
        ct_requires_grad_(a, true);
        ct_requires_grad_(b, true);
        ct_params *pa = ct_params_new(), *pb = ct_params_new();
        ct_params_add(pa, "w", a);
        ct_params_add(pb, "w", b);
        ct_optimizer *oa = make(c, pa), *ob = make(c, pb);
        int per = 0;
        while (per < 4 && want[ci][per]) per++;
        assert_int_equal(ct_optim_state_count(oa), per);
        for (int k = 0; k < per; k++) {
            const char *name;
            assert_non_null(ct_optim_state_get(oa, k, &name));
            char full[32];
            snprintf(full, sizeof full, "0.%s", want[ci][k]);
            assert_string_equal(name, full);
        }
        for (int step = 0; step < 3; step++) {
            ct_tensor *g = tu_rand(2, s, CT_F32, -1, 1, NULL);
            ct_set_grad(a, g);
            assert_int_equal(ct_optim_step(oa), CT_OK);
            ct_tensor_release(g);
        }
        /* restore: parameter values and every state tensor */
        bool prev = ct_no_grad_begin();
        assert_int_equal(ct_copy_(b, a), CT_OK);
        for (int k = 0; k < per; k++)
            assert_int_equal(
                ct_copy_(ct_optim_state_get(ob, k, NULL), ct_optim_state_get(oa, k, NULL)),
                CT_OK);
        ct_no_grad_end(prev);
        ct_tensor *g = tu_rand(2, s, CT_F32, -1, 1, NULL);
        ct_set_grad(a, g);
        ct_set_grad(b, g);
        assert_int_equal(ct_optim_step(oa), CT_OK);
        assert_int_equal(ct_optim_step(ob), CT_OK);
        double *va = tu_values(a), *vb = tu_values(b);
        assert_memory_equal(va, vb, 20 * sizeof(double));
        free(va), free(vb);
        ct_tensor_release(g);
        ct_optim_free(oa), ct_optim_free(ob);
        ct_params_free(pa), ct_params_free(pb);
        ct_tensor_release(a), ct_tensor_release(b);
    }
}

/* A checkpoint (ct_checkpoint_save / ct_checkpoint_load) of each new
 * optimizer restores it: the loaded one continues exactly as the original,
 * and another option set (a different state count) is refused. */
static void test_checkpoint_round_trip(void **state) {
    (void)state;
    tu_seed();
    char path[64];
    snprintf(path, sizeof path, "/tmp/cten_optx_%d.safetensors", (int)getpid());
    int64_t s[2] = {3, 4};
    for (size_t ci = 0; ci < 8; ci++) {
        const cfg *c = &cfgs[ci];
        ct_tensor *a = tu_rand(2, s, CT_F64, -1, 1, NULL), *b = ct_tensor_zeros(2, s, CT_F64, CT_CPU);
        ct_requires_grad_(a, true);
        ct_requires_grad_(b, true);
        ct_params *pa = ct_params_new(), *pb = ct_params_new();
        ct_params_add(pa, "w", a);
        ct_params_add(pb, "w", b);
        ct_optimizer *oa = make(c, pa), *ob = make(c, pb);
        for (int step = 0; step < 2; step++) {
            ct_tensor *g = tu_rand(2, s, CT_F64, -1, 1, NULL);
            ct_set_grad(a, g);
            assert_int_equal(ct_optim_step(oa), CT_OK);
            ct_tensor_release(g);
        }
        assert_int_equal(ct_checkpoint_save(path, pa, oa, NULL, NULL), CT_OK);
        assert_int_equal(ct_checkpoint_load(path, pb, ob, NULL, NULL), CT_OK);
        /* Adam with and without amsgrad keep different state counts */
        if (c->kind == ADAM) {
            cfg other = *c;
            other.flag = !c->flag;
            ct_optimizer *oc = make(&other, pb);
            tu_assert_error(ct_checkpoint_load(path, pb, oc, NULL, NULL), CT_ERR_FORMAT,
                            "ct_checkpoint_load", "state tensors");
            ct_optim_free(oc);
        }
        ct_tensor *g = tu_rand(2, s, CT_F64, -1, 1, NULL);
        ct_set_grad(a, g);
        ct_set_grad(b, g);
        assert_int_equal(ct_optim_step(oa), CT_OK);
        assert_int_equal(ct_optim_step(ob), CT_OK);
        double *va = tu_values(a), *vb = tu_values(b);
        assert_memory_equal(va, vb, 12 * sizeof(double));
        free(va), free(vb);
        ct_tensor_release(g);
        ct_optim_free(oa), ct_optim_free(ob);
        ct_params_free(pa), ct_params_free(pb);
        ct_tensor_release(a), ct_tensor_release(b);
    }
    remove(path);
}

/* Per-parameter weight decay replaces the constructor's for that one. */
static void test_weight_decay_per_param(void **state) {
    (void)state;
    tu_seed();
    int64_t s[1] = {16};
    for (int kind = 0; kind < 3; kind++) {
        cfg c = cfgs[kind == ADAM ? 0 : kind == RMSPROP ? 2 : 6];
        double *va, *vb, *gv;
        ct_tensor *a = tu_rand(1, s, CT_F64, -1, 1, &va), *b = tu_rand(1, s, CT_F64, -1, 1, &vb);
        ct_requires_grad_(a, true);
        ct_requires_grad_(b, true);
        ct_params *pl = ct_params_new();
        ct_params_add(pl, "a", a);
        ct_params_add(pl, "b", b);
        ct_optimizer *o = make(&c, pl);
        assert_int_equal(ct_optim_set_weight_decay(o, 1, 0.3), CT_OK);
        ref ra, rb;
        ref_init(&ra, va, 16, &c);
        ref_init(&rb, vb, 16, &c);
        cfg cb = c;
        cb.wd = 0.3;
        for (int step = 0; step < 3; step++) {
            ct_tensor *g = tu_rand(1, s, CT_F64, -1, 1, &gv);
            ct_set_grad(a, g);
            ct_set_grad(b, g);
            ref_step(&ra, gv, &c, c.lr);
            ref_step(&rb, gv, &cb, c.lr);
            assert_int_equal(ct_optim_step(o), CT_OK);
            free(gv);
            ct_tensor_release(g);
        }
        double *ga = tu_values(a), *gb = tu_values(b);
        tu_assert_close(ga, ra.p, 16, 1e-12, 1e-12);
        tu_assert_close(gb, rb.p, 16, 1e-12, 1e-12);
        free(ga), free(gb), free(va), free(vb);
        ref_free(&ra), ref_free(&rb);
        ct_optim_free(o);
        ct_params_free(pl);
        ct_tensor_release(a), ct_tensor_release(b);
    }
}

static void test_errors(void **state) {
    (void)state;
    int64_t s[1] = {4};
    ct_tensor *a = ct_tensor_zeros(1, s, CT_F32, CT_CPU);
    ct_requires_grad_(a, true);
    ct_params *pl = ct_params_new();
    ct_params_add(pl, "a", a);
    tu_assert_null_error(ct_optim_adam_new(pl, -1, 0.9, 0.999, 1e-8, 0, false),
                         CT_ERR_INVALID_ARG, "ct_optim_adam_new", "learning rate -1");
    tu_assert_null_error(ct_optim_adam_new(pl, 1e-3, 1.0, 0.999, 1e-8, 0, false),
                         CT_ERR_INVALID_ARG, "ct_optim_adam_new", "betas");
    tu_assert_null_error(ct_optim_adam_new(pl, 1e-3, 0.9, 0.999, -1, 0, false),
                         CT_ERR_INVALID_ARG, "ct_optim_adam_new", "epsilon");
    tu_assert_null_error(ct_optim_adam_new(NULL, 1e-3, 0.9, 0.999, 1e-8, 0, false),
                         CT_ERR_INVALID_ARG, "ct_optim_adam_new", "NULL");
    tu_assert_null_error(ct_optim_rmsprop_new(pl, 1e-2, -0.5, 1e-8, 0, 0, false),
                         CT_ERR_INVALID_ARG, "ct_optim_rmsprop_new", "alpha -0.5");
    tu_assert_null_error(ct_optim_rmsprop_new(pl, 1e-2, 0.99, 1e-8, 0, -1, false),
                         CT_ERR_INVALID_ARG, "ct_optim_rmsprop_new", "momentum -1");
    tu_assert_null_error(ct_optim_adagrad_new(pl, 1e-2, -1, 0, 0, 1e-10), CT_ERR_INVALID_ARG,
                         "ct_optim_adagrad_new", "lr_decay -1");
    tu_assert_null_error(ct_optim_adagrad_new(pl, 1e-2, 0, 0, -0.5, 1e-10), CT_ERR_INVALID_ARG,
                         "ct_optim_adagrad_new", "initial_accumulator_value -0.5");
    tu_assert_null_error(ct_optim_adagrad_new(pl, 1e-2, 0, NAN, 0, 1e-10), CT_ERR_INVALID_ARG,
                         "ct_optim_adagrad_new", "weight_decay");
    /* A restored count that is no count is refused, naming the parameter. */
    ct_optimizer *o = ct_optim_rmsprop_new(pl, 1e-2, 0.99, 1e-8, 0, 0.5, true);
    ct_tensor *ag = ct_tensor_ones(1, s, CT_F32, CT_CPU);
    assert_int_equal(ct_set_grad(a, ag), CT_OK);
    const char *name;
    ct_tensor *st = ct_optim_state_get(o, 0, &name);
    assert_string_equal(name, "0.step");
    assert_int_equal(ct_fill_(st, NAN), CT_OK);
    tu_assert_error(ct_optim_step(o), CT_ERR_INVALID_ARG, "ct_optim_step", "step count",
                    "parameter 0");
    ct_tensor_release(ag);
    ct_optim_free(o);
    ct_params_free(pl);
    ct_tensor_release(a);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_updates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_half_states, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_weight_decay_per_param, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
    };
    return tu_run_tests(tests);
}
