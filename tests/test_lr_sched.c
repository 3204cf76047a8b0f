/* LinearLR, OneCycleLR (rate and momentum) and ReduceLROnPlateau against
 * float64 transcriptions of torch.optim.lr_scheduler's code written here
 * (the phase loop of OneCycleLR, the counters of ReduceLROnPlateau), on
 * drawn settings, and their refusals; a momentum set between steps reaching
 * Adam's and SGD's updates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

#include "test_util.h"

#include "test_fixture.h"

/* torch's LinearLR recurrence (its chainable form), stepped step times. */
static double ref_linear(double base, double sf, double ef, int64_t total, int64_t step) {
    double lr = base * sf;
    for (int64_t e = 1; e <= step; e++) {
        if (e > total) break;
        lr *= 1.0 + (ef - sf) / (total * sf + (e - 1) * (ef - sf));
    }
    return lr;
}

static void test_linear(void **state) {
    (void)state;
    tu_seed();
    for (int rep = 0; rep < 20; rep++) {
        double base = tu_uniform(1e-4, 1), sf = tu_uniform(0.05, 1), ef = tu_uniform(0, 1);
        int64_t total = tu_randint(1, 30);
        for (int64_t s = 0; s < total + 5; s++) {
            double got = ct_lr_linear(base, sf, ef, total, s);
            double ref = ref_linear(base, sf, ef, total, s);
            assert_true(fabs(got - ref) <= 1e-12 * base);
        }
    }
    /* torch's defaults: 1/3 .. 1 over 5 iterations */
    assert_true(fabs(ct_lr_linear(0.3, 1.0 / 3, 1.0, 5, 0) - 0.1) < 1e-15);
    assert_true(fabs(ct_lr_linear(0.3, 1.0 / 3, 1.0, 5, 5) - 0.3) < 1e-15);
    assert_true(isnan(ct_lr_linear(0.1, 0, 1, 5, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_linear", "start_factor");
    assert_true(isnan(ct_lr_linear(0.1, 0.5, 1.5, 5, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_linear", "end_factor");
    assert_true(isnan(ct_lr_linear(0.1, 0.5, 1, 0, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_linear", "total_iters 0");
    assert_true(isnan(ct_lr_linear(0.1, 0.5, 1, 3, -1)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_linear", "step -1");
}

/* torch's OneCycleLR phases, transcribed: a to b, then b to c (three phases: a to b, b to
 * a, a to c); the rate's get_lr with (initial, max_lr, min_lr), its momentum with (max, base,
 * max). */
static double ref_cycle(double a, double b, double c, int64_t total, double pct, bool cosine,
                        bool three, int64_t step) {
    double ends[3], st[3], en[3];
    int n;
    if (three) {
        n = 3;
        ends[0] = pct * total - 1, st[0] = a, en[0] = b;
        ends[1] = 2 * pct * total - 2, st[1] = b, en[1] = a;
        ends[2] = total - 1, st[2] = a, en[2] = c;
    } else {
        n = 2;
        ends[0] = pct * total - 1, st[0] = a, en[0] = b;
        ends[1] = total - 1, st[1] = b, en[1] = c;
    }
    double start = 0;
    for (int i = 0; i < n; i++) {
        if (step <= ends[i] || i == n - 1) {
            double p = (step - start) / (ends[i] - start);
            if (cosine) return en[i] + (st[i] - en[i]) / 2.0 * (cos(M_PI * p) + 1);
            return (en[i] - st[i]) * p + st[i];
        }
        start = ends[i];
    }
    return NAN;
}

static double ref_one_cycle(double max_lr, int64_t total, double pct, bool cosine, double div,
                            double fdiv, bool three, int64_t step) {
    double init = max_lr / div;
    return ref_cycle(init, max_lr, init / fdiv, total, pct, cosine, three, step);
}

static void test_one_cycle(void **state) {
    (void)state;
    tu_seed();
    for (int rep = 0; rep < 40; rep++) {
        double max_lr = tu_uniform(1e-3, 1), pct = tu_uniform(0.1, 0.45);
        double div = tu_uniform(2, 50), fdiv = tu_uniform(10, 1e4);
        int64_t total = tu_randint(20, 200);
        bool cosine = rep % 2, three = (rep / 2) % 2;
        for (int64_t s = 0; s <= total; s++) {
            double got = ct_lr_one_cycle(max_lr, total, pct, cosine, div, fdiv, three, s);
            double ref = ref_one_cycle(max_lr, total, pct, cosine, div, fdiv, three, s);
            assert_true(fabs(got - ref) <= 1e-12 * max_lr);
        }
    }
    /* The ends of the default cycle: max_lr / 25 at 0, max_lr at the peak,
     * max_lr / 25 / 1e4 at total_steps - 1. */
    assert_true(fabs(ct_lr_one_cycle(1, 100, 0.3, true, 25, 1e4, false, 0) - 0.04) < 1e-15);
    assert_true(fabs(ct_lr_one_cycle(1, 100, 0.3, true, 25, 1e4, false, 29) - 1) < 1e-15);
    assert_true(fabs(ct_lr_one_cycle(1, 100, 0.3, true, 25, 1e4, false, 99) - 4e-6) < 1e-18);
    assert_true(isnan(ct_lr_one_cycle(1, 100, 0.3, true, 25, 1e4, false, 101)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_one_cycle", "step 101");
    assert_true(isnan(ct_lr_one_cycle(1, 0, 0.3, true, 25, 1e4, false, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_one_cycle", "total_steps 0");
    assert_true(isnan(ct_lr_one_cycle(1, 100, 1.5, true, 25, 1e4, false, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_one_cycle", "pct_start");
    assert_true(isnan(ct_lr_one_cycle(1, 100, 0.3, true, 0, 1e4, false, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_one_cycle", "div_factor");
    /* pct_start * total_steps = 1: the first phase has no length. */
    assert_true(isnan(ct_lr_one_cycle(1, 10, 0.1, true, 25, 1e4, false, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_one_cycle", "phase 0");
}

static void test_one_cycle_momentum(void **state) {
    (void)state;
    tu_seed();
    for (int rep = 0; rep < 40; rep++) {
        double base = tu_uniform(0.5, 0.9), mx = tu_uniform(0.9, 0.99), pct = tu_uniform(0.1, 0.45);
        int64_t total = tu_randint(20, 200);
        bool cosine = rep % 2, three = (rep / 2) % 2;
        for (int64_t s = 0; s <= total; s++) {
            double got = ct_momentum_one_cycle(base, mx, total, pct, cosine, three, s);
            double ref = ref_cycle(mx, base, mx, total, pct, cosine, three, s);
            assert_true(fabs(got - ref) <= 1e-14);
        }
    }
    /* torch's defaults: 0.95 at the start and the end, 0.85 at the rate's peak */
    assert_true(fabs(ct_momentum_one_cycle(0.85, 0.95, 100, 0.3, true, false, 0) - 0.95) < 1e-15);
    assert_true(fabs(ct_momentum_one_cycle(0.85, 0.95, 100, 0.3, true, false, 29) - 0.85) < 1e-15);
    assert_true(fabs(ct_momentum_one_cycle(0.85, 0.95, 100, 0.3, true, false, 99) - 0.95) < 1e-15);
    assert_true(isnan(ct_momentum_one_cycle(0.85, 0.95, 100, 0.3, true, false, 101)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_momentum_one_cycle", "step 101");
    assert_true(isnan(ct_momentum_one_cycle(NAN, 0.95, 100, 0.3, true, false, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_momentum_one_cycle",
                    "base_momentum");
    assert_true(isnan(ct_momentum_one_cycle(0.85, 0.95, 10, 0.1, true, false, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_momentum_one_cycle", "phase 0");
}

/* A parameter of 3 float64 elements with a fixed gradient, and opt made over it. */
typedef struct one_param {
    ct_params *pl;
    ct_tensor *w;
} one_param;

static one_param make_param(const double *w0) {
    one_param o;
    o.w = tu_from_f64(w0, 1, (const int64_t[]){3}, CT_F64);
    assert_non_null(o.w);
    assert_int_equal(ct_requires_grad_(o.w, true), CT_OK);
    o.pl = ct_params_new();
    assert_int_equal(ct_params_add(o.pl, "w", o.w), CT_OK);
    return o;
}

static void set_grad(ct_tensor *w, const double *g) {
    ct_tensor *t = tu_from_f64(g, 1, (const int64_t[]){3}, CT_F64);
    assert_non_null(t);
    assert_int_equal(ct_set_grad(w, t), CT_OK);
    ct_tensor_release(t);
}

/* A momentum changed between steps reaches the update: Adam's beta1 (its bias
 * correction with the current beta1, as torch computes it) and SGD's momentum,
 * against float64 transcriptions of torch's updates. */
static void test_set_momentum_steps(void **state) {
    (void)state;
    tu_seed();
    double w0[3], g[3][3], betas[3] = {0.9, 0.6, 0.75};
    for (int i = 0; i < 3; i++) {
        w0[i] = tu_uniform(-1, 1);
        for (int t = 0; t < 3; t++) g[t][i] = tu_uniform(-1, 1);
    }
    /* Adam */
    one_param a = make_param(w0);
    ct_optimizer *o = ct_optim_adam_new(a.pl, 0.01, 0.9, 0.999, 1e-8, 0, false);
    assert_non_null(o);
    double w[3], m[3] = {0}, v[3] = {0};
    memcpy(w, w0, sizeof w);
    for (int t = 0; t < 3; t++) {
        assert_int_equal(ct_optim_set_momentum(o, betas[t]), CT_OK);
        assert_true(ct_optim_get_momentum(o) == betas[t]);
        set_grad(a.w, g[t]);
        assert_int_equal(ct_optim_step(o), CT_OK);
        double b1 = betas[t], bc1 = 1 - pow(b1, t + 1), bc2 = 1 - pow(0.999, t + 1);
        for (int i = 0; i < 3; i++) {
            m[i] = b1 * m[i] + (1 - b1) * g[t][i];
            v[i] = 0.999 * v[i] + 0.001 * g[t][i] * g[t][i];
            w[i] -= 0.01 / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + 1e-8);
        }
    }
    double *got = tu_values(a.w);
    for (int i = 0; i < 3; i++) assert_true(fabs(got[i] - w[i]) <= 1e-12);
    free(got);
    ct_optim_free(o);
    ct_params_free(a.pl);
    ct_tensor_release(a.w);
    /* SGD with momentum */
    one_param s = make_param(w0);
    o = ct_optim_sgd_new(s.pl, 0.1, 0.5, 0, 0, false);
    assert_non_null(o);
    double buf[3] = {0};
    memcpy(w, w0, sizeof w);
    for (int t = 0; t < 3; t++) {
        assert_int_equal(ct_optim_set_momentum(o, betas[t]), CT_OK);
        set_grad(s.w, g[t]);
        assert_int_equal(ct_optim_step(o), CT_OK);
        for (int i = 0; i < 3; i++) {
            buf[i] = t == 0 ? g[t][i] : betas[t] * buf[i] + g[t][i];
            w[i] -= 0.1 * buf[i];
        }
    }
    got = tu_values(s.w);
    for (int i = 0; i < 3; i++) assert_true(fabs(got[i] - w[i]) <= 1e-12);
    free(got);
    ct_optim_free(o);
    ct_params_free(s.pl);
    ct_tensor_release(s.w);
}

static void test_set_momentum_errors(void **state) {
    (void)state;
    double w0[3] = {1, 2, 3};
    one_param a = make_param(w0);
    ct_optimizer *sgd0 = ct_optim_sgd_new(a.pl, 0.1, 0, 0, 0, false);
    ct_optimizer *sgd = ct_optim_sgd_new(a.pl, 0.1, 0.9, 0, 0, true);
    ct_optimizer *adamw = ct_optim_adamw_new(a.pl, 0.1, 0.9, 0.999, 1e-8, 0);
    ct_optimizer *ada = ct_optim_adagrad_new(a.pl, 0.1, 0, 0, 0, 1e-10);
    assert_non_null(sgd0);
    assert_non_null(sgd);
    assert_non_null(adamw);
    assert_non_null(ada);
    tu_assert_error(ct_optim_set_momentum(sgd0, 0.9), CT_ERR_INVALID_ARG,
                    "ct_optim_set_momentum", "momentum 0");
    tu_assert_error(ct_optim_set_momentum(sgd, 0), CT_ERR_INVALID_ARG, "ct_optim_set_momentum",
                    "expected > 0");
    tu_assert_error(ct_optim_set_momentum(sgd, NAN), CT_ERR_INVALID_ARG,
                    "ct_optim_set_momentum", "expected > 0");
    assert_true(ct_optim_get_momentum(sgd) == 0.9); /* unchanged */
    tu_assert_error(ct_optim_set_momentum(adamw, 1.0), CT_ERR_INVALID_ARG,
                    "ct_optim_set_momentum", "beta1");
    assert_true(ct_optim_get_momentum(adamw) == 0.9);
    tu_assert_error(ct_optim_set_momentum(ada, 0.9), CT_ERR_INVALID_ARG, "ct_optim_set_momentum",
                    "Adagrad");
    assert_true(isnan(ct_optim_get_momentum(ada)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_optim_get_momentum", "Adagrad");
    tu_assert_error(ct_optim_set_momentum(NULL, 0.9), CT_ERR_INVALID_ARG,
                    "ct_optim_set_momentum", "NULL");
    assert_true(isnan(ct_optim_get_momentum(NULL)));
    ct_optim_free(sgd0);
    ct_optim_free(sgd);
    ct_optim_free(adamw);
    ct_optim_free(ada);
    ct_params_free(a.pl);
    ct_tensor_release(a.w);
}

/* torch's ReduceLROnPlateau, transcribed. */
typedef struct ref_plateau {
    bool mode_max, abs_;
    double factor, threshold, min_lr, eps, best, lr;
    int64_t patience, cooldown, bad, cd;
} ref_plateau;

static void ref_step(ref_plateau *r, double m) {
    bool better;
    if (!r->mode_max)
        better = r->abs_ ? m < r->best - r->threshold : m < r->best * (1 - r->threshold);
    else
        better = r->abs_ ? m > r->best + r->threshold : m > r->best * (r->threshold + 1);
    if (better) {
        r->best = m;
        r->bad = 0;
    } else {
        r->bad++;
    }
    if (r->cd > 0) {
        r->cd--;
        r->bad = 0;
    }
    if (r->bad > r->patience) {
        double nl = fmax(r->lr * r->factor, r->min_lr);
        if (r->lr - nl > r->eps) r->lr = nl;
        r->cd = r->cooldown;
        r->bad = 0;
    }
}

static ct_optimizer *one_param_sgd(ct_params **pl, ct_tensor **w, double lr) {
    *w = ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CPU);
    assert_int_equal(ct_requires_grad_(*w, true), CT_OK);
    *pl = ct_params_new();
    assert_int_equal(ct_params_add(*pl, "w", *w), CT_OK);
    ct_optimizer *o = ct_optim_sgd_new(*pl, lr, 0, 0, 0, false);
    assert_non_null(o);
    return o;
}

static void test_plateau(void **state) {
    (void)state;
    tu_seed();
    for (int rep = 0; rep < 16; rep++) {
        ct_params *pl;
        ct_tensor *w;
        ct_optimizer *o = one_param_sgd(&pl, &w, 0.5);
        ref_plateau r = {.mode_max = rep % 2,
                         .abs_ = (rep / 2) % 2,
                         .factor = tu_uniform(0.1, 0.9),
                         .threshold = tu_uniform(0, 0.05),
                         .min_lr = rep % 3 == 0 ? 0.01 : 0,
                         .eps = 1e-8,
                         .lr = 0.5,
                         .patience = tu_randint(0, 4),
                         .cooldown = tu_randint(0, 3)};
        r.best = r.mode_max ? -INFINITY : INFINITY;
        ct_lr_plateau *s = ct_lr_plateau_new(o, r.mode_max, r.factor, r.patience, r.threshold,
                                             r.abs_, r.cooldown, r.min_lr, r.eps);
        assert_non_null(s);
        int changes = 0;
        /* A noisy metric that improves, then stalls: the rate must fall. */
        for (int e = 0; e < 60; e++) {
            double m = (e < 15 ? 10 - 0.5 * e : 3) + tu_uniform(-0.2, 0.2);
            if (r.mode_max) m = 20 - m; /* positive, rising, then flat */
            double before = r.lr;
            ref_step(&r, m);
            changes += r.lr != before;
            assert_int_equal(ct_lr_plateau_step(s, m), CT_OK);
            assert_true(ct_optim_get_lr(o) == r.lr);
            ct_lr_plateau_state st;
            assert_int_equal(ct_lr_plateau_get_state(s, &st), CT_OK);
            assert_true(st.best == r.best && st.num_bad_epochs == r.bad &&
                        st.cooldown_counter == r.cd && st.last_epoch == e + 1);
        }
        assert_true(changes > 0);
        /* A restored state continues as the original. */
        ct_lr_plateau_state st;
        assert_int_equal(ct_lr_plateau_get_state(s, &st), CT_OK);
        ct_lr_plateau *s2 = ct_lr_plateau_new(o, r.mode_max, r.factor, r.patience, r.threshold,
                                              r.abs_, r.cooldown, r.min_lr, r.eps);
        assert_int_equal(ct_lr_plateau_set_state(s2, &st), CT_OK);
        for (int e = 0; e < 5; e++) {
            ref_step(&r, r.best);
            assert_int_equal(ct_lr_plateau_step(s2, r.best), CT_OK);
            assert_true(ct_optim_get_lr(o) == r.lr);
        }
        ct_lr_plateau_free(s2);
        ct_lr_plateau_free(s);
        ct_optim_free(o);
        ct_params_free(pl);
        ct_tensor_release(w);
    }
}

static void test_plateau_errors(void **state) {
    (void)state;
    ct_params *pl;
    ct_tensor *w;
    ct_optimizer *o = one_param_sgd(&pl, &w, 0.1);
    tu_assert_null_error(ct_lr_plateau_new(NULL, false, 0.1, 10, 1e-4, false, 0, 0, 1e-8),
                         CT_ERR_INVALID_ARG, "ct_lr_plateau_new", "optimizer is NULL");
    tu_assert_null_error(ct_lr_plateau_new(o, false, 1.0, 10, 1e-4, false, 0, 0, 1e-8),
                         CT_ERR_INVALID_ARG, "ct_lr_plateau_new", "factor");
    tu_assert_null_error(ct_lr_plateau_new(o, false, 0.1, -1, 1e-4, false, 0, 0, 1e-8),
                         CT_ERR_INVALID_ARG, "ct_lr_plateau_new", "patience");
    tu_assert_null_error(ct_lr_plateau_new(o, false, 0.1, 1, -1e-4, false, 0, 0, 1e-8),
                         CT_ERR_INVALID_ARG, "ct_lr_plateau_new", "threshold");
    ct_lr_plateau *s = ct_lr_plateau_new(o, false, 0.1, 0, 1e-4, false, 0, 0, 1e-8);
    assert_non_null(s);
    ct_lr_plateau_state bad = {1.0, -1, 0, 0};
    tu_assert_error(ct_lr_plateau_set_state(s, &bad), CT_ERR_INVALID_ARG,
                    "ct_lr_plateau_set_state", "num_bad_epochs -1");
    tu_assert_error(ct_lr_plateau_step(NULL, 1), CT_ERR_INVALID_ARG, "ct_lr_plateau_step");
    /* NaN is never better: with patience 0 one NaN lowers the rate. */
    assert_int_equal(ct_lr_plateau_step(s, NAN), CT_OK);
    assert_true(fabs(ct_optim_get_lr(o) - 0.01) < 1e-15);
    ct_lr_plateau_free(s);
    ct_optim_free(o);
    ct_params_free(pl);
    ct_tensor_release(w);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_linear, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_cycle_momentum, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_momentum_steps, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_momentum_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plateau, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plateau_errors, setup, teardown),
    };
    return tu_run_tests(tests);
}
