/* The optimizers' mixed-precision and capturable machinery on the CPU:
 *  - step counts in memory with the learning rate in a control tensor (the
 *    form a GPU optimizer uses, torch's capturable=True) against counts on
 *    the host, bit for bit, with a learning rate that changes every step;
 *  - found_inf: a non-zero one leaves parameters, states and counts as they
 *    were, bit for bit (front end and kernel);
 *  - float32 master weights of bfloat16/float16 parameters against a
 *    float64 AdamW/SGD on the masters, the model copy the master rounded;
 *  - the new list fields' bad inputs, and clipping of non-finite gradients. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "ops/optim_impl.h"
#include "test_fixture.h"

/* ---- helpers -------------------------------------------------------------------------------- */

/* t's bytes in row-major order (caller frees). */
static unsigned char *bytes_of(const ct_tensor *t, size_t *nb) {
    *nb = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    unsigned char *b = malloc(*nb ? *nb : 1);
    assert_int_equal(ct_tensor_copy_to_host(t, b, *nb), CT_OK);
    return b;
}

static void assert_same_bytes(const ct_tensor *a, const ct_tensor *b) {
    size_t na, nb;
    unsigned char *x = bytes_of(a, &na), *y = bytes_of(b, &nb);
    assert_int_equal(na, nb);
    assert_int_equal(memcmp(x, y, na), 0);
    free(x);
    free(y);
}

static double item(const ct_tensor *t) {
    double v;
    assert_int_equal(ct_tensor_item(t, &v), CT_OK);
    return v;
}

static unsigned version_of(const ct_tensor *t) { return atomic_load(&t->storage->version); }

/* A control tensor [lr, 0]. */
static ct_tensor *make_ctl(double lr) {
    double v[2] = {lr, 0};
    return ct_tensor_from_data(v, CT_F64, CT_SHAPE(2));
}

static void set_lr(ct_tensor *ctl, double lr) { ((double *)ct_tensor_data_ptr(ctl))[0] = lr; }

/* ---- counts in memory against counts on the host --------------------------------------------- */

#define NL 4 /* parameters per list: [7, 9], [200, 200] (split over threads), [0, 3], [5] */
static const int64_t nl_shape[NL][2] = {{7, 9}, {200, 200}, {0, 3}, {5, 1}};
static const int nl_ndim[NL] = {2, 2, 2, 1};

typedef struct mlist {
    ct_tensor *p[NL], *g[NL], *s[2][NL], *step_t[NL], *ctl[NL];
    int64_t step[NL];
    bool updated[NL];
} mlist;

/* Two identical lists a and b of dtype dt (SGD buffers NaN: a first step
 * must not read them). */
static void mlists_init(mlist *a, mlist *b, ct_dtype dt, bool adamw, ct_tensor *ctl) {
    memset(a, 0, sizeof *a);
    memset(b, 0, sizeof *b);
    for (int k = 0; k < NL; k++) {
        a->p[k] = tu_rand(nl_ndim[k], nl_shape[k], dt, -1, 1, NULL);
        b->p[k] = ct_clone(a->p[k]);
        for (int s = 0; s < 2; s++) {
            a->s[s][k] = adamw ? tu_rand(nl_ndim[k], nl_shape[k], dt, s ? 0 : -0.5, 0.5, NULL)
                               : ct_tensor_full(nl_ndim[k], nl_shape[k], NAN, dt, CT_CPU);
            b->s[s][k] = ct_clone(a->s[s][k]);
        }
        b->step_t[k] = ct_tensor_scalar(0, CT_F64, CT_CPU);
        b->ctl[k] = ctl;
    }
}

static void mlist_free(mlist *l) {
    for (int k = 0; k < NL; k++) {
        ct_tensor *all[] = {l->p[k], l->g[k], l->s[0][k], l->s[1][k], l->step_t[k]};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    }
}

static cti_optim_list list_of(mlist *l, bool mem, int nstate) {
    return (cti_optim_list){.n = NL,
                            .param = l->p,
                            .grad = l->g,
                            .state = {nstate > 0 ? l->s[0] : NULL, nstate > 1 ? l->s[1] : NULL},
                            .step = mem ? NULL : l->step,
                            .updated = l->updated,
                            .step_t = mem ? l->step_t : NULL,
                            .ctl = mem ? l->ctl : NULL};
}

static ct_status run_op(bool adamw, const cti_optim_list *l, double lr) {
    cti_adamw_hparams ah = {lr, 0.8, 0.95, 1e-6, 0.05};
    cti_sgd_hparams sh = {lr, 0.9, 0.1, 0.01, false};
    bool prev = ct_no_grad_begin();
    ct_status st = adamw ? cti_adamw_step("test", l, &ah) : cti_sgd_step("test", l, &sh);
    ct_no_grad_end(prev);
    return st;
}

/* Five steps with a new learning rate each (the host form's in the
 * hyperparameters, the memory form's in the control tensor), parameter 0
 * without a gradient on step 2: parameters and states equal bit for bit,
 * the counts in memory equal the host's (the zero-size parameter's
 * included), every count tensor's version bumped once per update. */
static void run_capturable(ct_dtype dt, bool adamw) {
    mlist a, b;
    ct_tensor *ctl = make_ctl(0);
    mlists_init(&a, &b, dt, adamw, ctl);
    int nstate = adamw ? 2 : 1;
    for (int step = 1; step <= 5; step++) {
        double lr = 0.01 * step * (step % 2 ? 1 : 0.5);
        for (int k = 0; k < NL; k++) {
            ct_tensor_release(a.g[k]);
            ct_tensor_release(b.g[k]);
            a.g[k] = b.g[k] = NULL;
            if (k == 0 && step == 2) continue;
            a.g[k] = tu_rand(nl_ndim[k], nl_shape[k], dt, -1, 1, NULL);
            b.g[k] = ct_clone(a.g[k]);
            a.step[k]++;
        }
        unsigned ver[NL];
        for (int k = 0; k < NL; k++) ver[k] = version_of(b.step_t[k]);
        cti_optim_list la = list_of(&a, false, nstate), lb = list_of(&b, true, nstate);
        set_lr(ctl, lr);
        assert_int_equal(run_op(adamw, &la, lr), CT_OK);
        /* The hyperparameters' lr is not the one the memory form uses. */
        assert_int_equal(run_op(adamw, &lb, 1e3), CT_OK);
        for (int k = 0; k < NL; k++) {
            assert_true(a.updated[k] == (a.g[k] != NULL));
            assert_true(b.updated[k] == (b.g[k] != NULL));
            assert_same_bytes(a.p[k], b.p[k]);
            for (int s = 0; s < nstate; s++) assert_same_bytes(a.s[s][k], b.s[s][k]);
            assert_true(item(b.step_t[k]) == (double)a.step[k]);
            assert_int_equal(version_of(b.step_t[k]), ver[k] + (b.g[k] ? 1 : 0));
        }
        const double *cv = ct_tensor_data_ptr(ctl); /* [0] read, [1] untouched */
        assert_true(cv[0] == lr && cv[1] == 0);
    }
    /* A reference run with the counts the memory form started from would
     * differ: the counts were read (step 1 of SGD copies the gradient). */
    mlist_free(&a);
    mlist_free(&b);
    ct_tensor_release(ctl);
}

static void test_counts_in_memory(void **state) {
    (void)state;
    for (size_t di = 0; di < 4; di++) {
        run_capturable(tu_float_dtypes[di], true);
        run_capturable(tu_float_dtypes[di], false);
    }
}

/* The counts in memory are what the update reads: a count of 9 gives
 * AdamW's bias corrections of step 10, as a host count of 10 does. */
static void test_counts_read(void **state) {
    (void)state;
    mlist a, b;
    ct_tensor *ctl = make_ctl(0.02);
    mlists_init(&a, &b, CT_F32, true, ctl);
    for (int k = 0; k < NL; k++) {
        a.g[k] = tu_rand(nl_ndim[k], nl_shape[k], CT_F32, -1, 1, NULL);
        b.g[k] = ct_clone(a.g[k]);
        a.step[k] = 10;
        assert_int_equal(ct_fill_(b.step_t[k], 9), CT_OK);
    }
    cti_optim_list la = list_of(&a, false, 2), lb = list_of(&b, true, 2);
    assert_int_equal(run_op(true, &la, 0.02), CT_OK);
    assert_int_equal(run_op(true, &lb, 0.02), CT_OK);
    for (int k = 0; k < NL; k++) {
        assert_same_bytes(a.p[k], b.p[k]);
        assert_true(item(b.step_t[k]) == 10);
    }
    mlist_free(&a);
    mlist_free(&b);
    ct_tensor_release(ctl);
}

/* ---- found_inf --------------------------------------------------------------------------------
 */

/* A non-zero found_inf: nothing written, nothing counted, no version bump;
 * zero: the update as without one. */
static void test_found_inf_skips(void **state) {
    (void)state;
    for (int adamw = 0; adamw < 2; adamw++) {
        mlist a, b;
        ct_tensor *ctl = make_ctl(0.05);
        mlists_init(&a, &b, CT_BF16, adamw, ctl);
        int nstate = adamw ? 2 : 1;
        for (int k = 0; k < NL; k++) {
            a.g[k] = tu_rand(nl_ndim[k], nl_shape[k], CT_BF16, -1, 1, NULL);
            b.g[k] = ct_clone(a.g[k]);
            a.step[k] = 1;
        }
        ct_tensor *found = ct_tensor_scalar(1, CT_F32, CT_CPU);
        for (int mem = 0; mem < 2; mem++) {
            mlist *l = mem ? &b : &a;
            ct_tensor *before[NL][3];
            unsigned ver[NL];
            for (int k = 0; k < NL; k++) {
                before[k][0] = ct_clone(l->p[k]);
                for (int s = 0; s < nstate; s++) before[k][1 + s] = ct_clone(l->s[s][k]);
                ver[k] = version_of(l->p[k]);
            }
            cti_optim_list li = list_of(l, mem, nstate);
            li.found_inf = found;
            assert_int_equal(run_op(adamw, &li, 0.05), CT_OK);
            for (int k = 0; k < NL; k++) {
                assert_false(l->updated[k]);
                assert_same_bytes(l->p[k], before[k][0]);
                for (int s = 0; s < nstate; s++) assert_same_bytes(l->s[s][k], before[k][1 + s]);
                assert_int_equal(version_of(l->p[k]), ver[k]);
                if (mem) assert_true(item(l->step_t[k]) == 0);
                for (int s = 0; s < 1 + nstate; s++) ct_tensor_release(before[k][s]);
            }
        }
        /* found_inf 0: the update runs. */
        assert_int_equal(ct_fill_(found, 0), CT_OK);
        cti_optim_list la = list_of(&a, false, nstate), lb = list_of(&b, true, nstate);
        la.found_inf = lb.found_inf = found;
        assert_int_equal(run_op(adamw, &la, 0.05), CT_OK);
        assert_int_equal(run_op(adamw, &lb, 0.05), CT_OK);
        for (int k = 0; k < NL; k++) {
            assert_true(a.updated[k]);
            assert_same_bytes(a.p[k], b.p[k]);
            assert_true(item(b.step_t[k]) == 1);
        }
        ct_tensor_release(found);
        mlist_free(&a);
        mlist_free(&b);
        ct_tensor_release(ctl);
    }
}

/* The kernel honours found_inf itself (the contract), dispatched directly. */
static void test_found_inf_kernel(void **state) {
    (void)state;
    ct_tensor *p = tu_rand(CT_SHAPE(40), CT_F32, -1, 1, NULL), *g = ct_tensor_ones_like(p);
    ct_tensor *m = ct_tensor_zeros_like(p), *v = ct_tensor_zeros_like(p);
    ct_tensor *cnt = ct_tensor_scalar(3, CT_F64, CT_CPU), *ctl = make_ctl(0.1);
    ct_tensor *found = ct_tensor_scalar(INFINITY, CT_F32, CT_CPU), *p0 = ct_clone(p);
    ct_tensor *ps[1] = {p}, *gs[1] = {g}, *ms[1] = {m}, *vs[1] = {v}, *cs[1] = {cnt},
              *ctls[1] = {ctl};
    cti_optim_params prm = {.list = {.n = 1, .param = ps, .grad = gs, .state = {ms, vs},
                                     .step_t = cs, .ctl = ctls, .found_inf = found},
                            .adamw = {0.1, 0.9, 0.999, 1e-8, 0}};
    ct_call c;
    cti_call_init(&c, CT_OP_ADAMW_STEP);
    c.in[c.nin++] = p;
    c.in[c.nin++] = g;
    cti_call_params(&c, &prm);
    ct_scope *sc = ct_scope_begin();
    assert_int_equal(cti_dispatch(&c, CT_CPU, CT_F32), CT_OK);
    assert_same_bytes(p, p0);
    assert_true(item(cnt) == 3);
    assert_true(item(ct_sum(ct_abs(m), CT_NONE, false)) == 0);
    assert_true(item(ct_sum(v, CT_NONE, false)) == 0);
    ct_fill_(found, 0);
    assert_int_equal(cti_dispatch(&c, CT_CPU, CT_F32), CT_OK);
    assert_true(item(cnt) == 4);
    assert_true(item(ct_sum(ct_abs(m), CT_NONE, false)) != 0);
    ct_scope_end(sc);
    ct_tensor *all[] = {p, g, m, v, cnt, ctl, found, p0};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
}

/* ---- master weights -----------------------------------------------------------------------------
 */

/* Two leaves: a [6, 50] parameter of dtype dt and a float32 [7] one. */
static ct_params *mixed_params(ct_dtype dt) {
    ct_params *p = ct_params_new();
    ct_tensor *w = tu_rand(CT_SHAPE(6, 50), dt, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(7), CT_F32, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    assert_int_equal(ct_requires_grad_(b, true), CT_OK);
    assert_int_equal(ct_params_add(p, "w", w), CT_OK);
    assert_int_equal(ct_params_add(p, "b", b), CT_OK);
    ct_tensor_release(w);
    ct_tensor_release(b);
    return p;
}

/* Fresh gradients in the parameters' dtypes; their values into g[k]. */
static void fresh_grads(ct_params *p, double *g[2]) {
    for (int k = 0; k < 2; k++) {
        ct_tensor *t = ct_params_get(p, k, NULL);
        free(g[k]);
        ct_tensor *gt = tu_rand(ct_tensor_ndim(t), ct_tensor_shape(t), ct_tensor_dtype(t), -1, 1,
                                &g[k]);
        assert_int_equal(ct_set_grad(t, gt), CT_OK);
        ct_tensor_release(gt);
    }
}

typedef struct ref_state {
    double *p, *m, *v; /* master (or parameter), exp_avg or momentum buffer, exp_avg_sq */
    int64_t n;
    int t;
} ref_state;

static void ref_step(ref_state *r, const double *g, bool adamw, double lr) {
    const double b1 = 0.9, b2 = 0.99, eps = 1e-6, wd = 0.05, mom = 0.9, damp = 0.1;
    r->t++;
    double bc1 = 1 - pow(b1, r->t), bc2 = 1 - pow(b2, r->t);
    for (int64_t i = 0; i < r->n; i++) {
        if (adamw) {
            r->p[i] *= 1 - lr * wd;
            r->m[i] = b1 * r->m[i] + (1 - b1) * g[i];
            r->v[i] = b2 * r->v[i] + (1 - b2) * g[i] * g[i];
            r->p[i] -= lr / bc1 * r->m[i] / (sqrt(r->v[i]) / sqrt(bc2) + eps);
        } else {
            double d = g[i] + wd * r->p[i];
            r->m[i] = r->t == 1 ? d : mom * r->m[i] + (1 - damp) * d;
            r->p[i] -= lr * r->m[i];
        }
    }
}

static ct_optimizer *make_opt(ct_params *p, bool adamw) {
    ct_optimizer *o = adamw ? ct_optim_adamw_new(p, 0.01, 0.9, 0.99, 1e-6, 0.05)
                            : ct_optim_sgd_new(p, 0.01, 0.9, 0.1, 0.05, false);
    assert_non_null(o);
    return o;
}

/* Six steps of an optimizer with masters over a dt parameter and a float32
 * one: the state's names, dtypes and count; the master against float64
 * AdamW/SGD on it (within float32 roundings), the parameter exactly the
 * master rounded; the float32 parameter as without masters. */
static void run_masters(ct_dtype dt, bool adamw) {
    ct_params *p = mixed_params(dt);
    ct_optimizer *o = make_opt(p, adamw);
    int nbuf = adamw ? 2 : 1;
    assert_int_equal(ct_optim_state_count(o), 2 * (1 + nbuf));
    assert_int_equal(ct_optim_set_master_weights(o, true), CT_OK);
    assert_int_equal(ct_optim_set_master_weights(o, true), CT_OK); /* again: nothing to do */
    assert_int_equal(ct_optim_state_count(o), 2 * (1 + nbuf) + 1);
    ct_tensor *w = ct_params_get(p, 0, NULL);
    const char *name;
    ct_tensor *master = ct_optim_state_get(o, 1 + nbuf, &name);
    assert_string_equal(name, "0.master_param");
    assert_int_equal(ct_tensor_dtype(master), CT_F32);
    ct_tensor *buf0 = ct_optim_state_get(o, 1, &name);
    assert_string_equal(name, adamw ? "0.exp_avg" : "0.momentum_buffer");
    assert_int_equal(ct_tensor_dtype(buf0), CT_F32);
    ct_optim_state_get(o, 2 + nbuf, &name);
    assert_string_equal(name, "1.step");
    assert_int_equal(ct_tensor_dtype(ct_optim_state_get(o, 3 + nbuf, NULL)), CT_F32);
    tu_assert_null_error(ct_optim_state_get(o, 2 * (1 + nbuf) + 1, NULL), CT_ERR_INDEX,
                         "ct_optim_state_get", "out of range");

    ref_state r[2];
    for (int k = 0; k < 2; k++) {
        ct_tensor *t = ct_params_get(p, k, NULL);
        r[k] = (ref_state){tu_values(t), NULL, NULL, ct_tensor_numel(t), 0};
        r[k].m = calloc((size_t)r[k].n, sizeof(double));
        r[k].v = calloc((size_t)r[k].n, sizeof(double));
    }
    double *g[2] = {NULL, NULL};
    for (int step = 0; step < 6; step++) {
        double lr = 0.01 + 0.002 * step;
        assert_int_equal(ct_optim_set_lr(o, lr), CT_OK);
        fresh_grads(p, g);
        for (int k = 0; k < 2; k++) ref_step(&r[k], g[k], adamw, lr);
        assert_int_equal(ct_optim_step(o), CT_OK);
        double *mv = tu_values(master), *wv = tu_values(w),
               *bv = tu_values(ct_params_get(p, 1, NULL));
        tu_assert_close(mv, r[0].p, r[0].n, 2e-5, 2e-6);
        tu_assert_close(bv, r[1].p, r[1].n, 2e-5, 2e-6);
        for (int64_t i = 0; i < r[0].n; i++) assert_true(wv[i] == tu_round(mv[i], dt));
        double *m0 = tu_values(buf0);
        tu_assert_close(m0, r[0].m, r[0].n, 2e-5, 2e-6);
        free(m0);
        free(mv);
        free(wv);
        free(bv);
    }
    /* Off again: no master, states back in dt (rounded), the count restored. */
    assert_int_equal(ct_optim_set_master_weights(o, false), CT_OK);
    assert_int_equal(ct_optim_state_count(o), 2 * (1 + nbuf));
    ct_tensor *b0 = ct_optim_state_get(o, 1, NULL);
    assert_int_equal(ct_tensor_dtype(b0), dt);
    double *m0 = tu_values(b0);
    for (int64_t i = 0; i < r[0].n; i++) r[0].m[i] = tu_round(r[0].m[i], dt);
    tu_assert_close(m0, r[0].m, r[0].n, 2 * tu_rtol(dt), 1e-5);
    free(m0);
    for (int k = 0; k < 2; k++) {
        free(r[k].p);
        free(r[k].m);
        free(r[k].v);
        free(g[k]);
    }
    ct_optim_free(o);
    ct_params_free(p);
}

static void test_master_weights(void **state) {
    (void)state;
    run_masters(CT_BF16, true);
    run_masters(CT_BF16, false);
    run_masters(CT_F16, true);
    run_masters(CT_F16, false);
}

/* The state of an optimizer with masters copied into a fresh one with
 * masters (a checkpoint restore): both continue bit for bit. Without the
 * master copied the fresh one would start from the rounded parameter. */
static void test_master_state_restore(void **state) {
    (void)state;
    ct_params *pa = mixed_params(CT_BF16), *pb = ct_params_new();
    for (int k = 0; k < 2; k++) {
        const char *name;
        bool prev = ct_no_grad_begin();
        ct_tensor *c = ct_clone(ct_params_get(pa, k, &name));
        ct_no_grad_end(prev);
        assert_int_equal(ct_requires_grad_(c, true), CT_OK);
        assert_int_equal(ct_params_add(pb, name, c), CT_OK);
        ct_tensor_release(c);
    }
    ct_optimizer *a = make_opt(pa, true), *b = make_opt(pb, true);
    assert_int_equal(ct_optim_set_master_weights(a, true), CT_OK);
    assert_int_equal(ct_optim_set_master_weights(b, true), CT_OK);
    double *g[2] = {NULL, NULL};
    for (int step = 0; step < 3; step++) {
        fresh_grads(pa, g);
        assert_int_equal(ct_optim_step(a), CT_OK);
    }
    bool prev = ct_no_grad_begin();
    for (int k = 0; k < 2; k++)
        assert_int_equal(ct_copy_(ct_params_get(pb, k, NULL), ct_params_get(pa, k, NULL)), CT_OK);
    ct_no_grad_end(prev);
    for (int64_t s = 0; s < ct_optim_state_count(a); s++) {
        const char *na, *nb;
        ct_tensor *sa = ct_optim_state_get(a, s, &na), *sb = ct_optim_state_get(b, s, &nb);
        assert_string_equal(na, nb);
        assert_int_equal(ct_copy_(sb, sa), CT_OK);
    }
    for (int step = 0; step < 2; step++) {
        fresh_grads(pa, g);
        for (int k = 0; k < 2; k++)
            assert_int_equal(ct_set_grad(ct_params_get(pb, k, NULL),
                                         ct_grad(ct_params_get(pa, k, NULL))),
                             CT_OK);
        assert_int_equal(ct_optim_step(a), CT_OK);
        assert_int_equal(ct_optim_step(b), CT_OK);
    }
    for (int64_t s = 0; s < ct_optim_state_count(a); s++)
        assert_same_bytes(ct_optim_state_get(a, s, NULL), ct_optim_state_get(b, s, NULL));
    for (int k = 0; k < 2; k++) {
        assert_same_bytes(ct_params_get(pa, k, NULL), ct_params_get(pb, k, NULL));
        free(g[k]);
    }
    tu_assert_error(ct_optim_set_master_weights(NULL, true), CT_ERR_INVALID_ARG,
                    "ct_optim_set_master_weights", "NULL");
    ct_optim_free(a);
    ct_optim_free(b);
    ct_params_free(pa);
    ct_params_free(pb);
}

/* The op with masters on a list: non-contiguous master and state go through
 * copies written back; values as the optimizer's. */
static void test_master_op_noncontig(void **state) {
    (void)state;
    ct_tensor *p = tu_rand(CT_SHAPE(5, 6), CT_BF16, -1, 1, NULL);
    ct_tensor *g = tu_rand(CT_SHAPE(5, 6), CT_BF16, -1, 1, NULL);
    ct_tensor *m32 = ct_to_dtype(p, CT_F32);
    ct_tensor *master = tu_noncontig(m32), *mb = ct_tensor_zeros(CT_SHAPE(5, 6), CT_F32, CT_CPU);
    ct_tensor *zeros = ct_tensor_zeros(CT_SHAPE(5, 6), CT_F32, CT_CPU);
    ct_tensor *buf = tu_noncontig(zeros);
    ct_tensor *ps[1] = {p}, *gs[1] = {g}, *bs[1] = {buf}, *ms[1] = {master};
    int64_t step[1] = {1};
    cti_optim_list l = {.n = 1, .param = ps, .grad = gs, .state = {bs}, .step = step,
                        .master = ms};
    cti_sgd_hparams h = {0.1, 0.9, 0, 0.01, false};
    bool prev = ct_no_grad_begin();
    assert_int_equal(cti_sgd_step("test", &l, &h), CT_OK);
    ct_no_grad_end(prev);
    double *pv = tu_values(m32), *gv = tu_values(g), *mv = tu_values(master),
           *wv = tu_values(p), *bv = tu_values(buf);
    for (int i = 0; i < 30; i++) {
        double d = gv[i] + 0.01 * pv[i];
        assert_true(fabs(bv[i] - d) <= 1e-6 * fabs(d) + 1e-7);
        double want = pv[i] - 0.1 * d;
        assert_true(fabs(mv[i] - want) <= 1e-6 * fabs(want) + 1e-7);
        assert_true(wv[i] == tu_round(mv[i], CT_BF16));
    }
    free(pv), free(gv), free(mv), free(wv), free(bv);
    ct_tensor *all[] = {p, g, m32, master, mb, zeros, buf};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
}

/* ---- bad inputs ---------------------------------------------------------------------------------
 */

static void test_bad_lists(void **state) {
    (void)state;
    const cti_adamw_hparams ah = {1e-3, 0.9, 0.999, 1e-8, 0};
    ct_tensor *p[2], *g[2], *m[2], *v[2], *st[2], *ctl[2];
    ct_tensor *c0 = make_ctl(0.1), *c1 = make_ctl(0.1);
    for (int k = 0; k < 2; k++) {
        p[k] = tu_rand(CT_SHAPE(3, 4), CT_BF16, -1, 1, NULL);
        g[k] = tu_rand(CT_SHAPE(3, 4), CT_BF16, -1, 1, NULL);
        m[k] = ct_tensor_zeros(CT_SHAPE(3, 4), CT_BF16, CT_CPU);
        v[k] = ct_tensor_zeros(CT_SHAPE(3, 4), CT_BF16, CT_CPU);
        st[k] = ct_tensor_scalar(0, CT_F64, CT_CPU);
        ctl[k] = c0;
    }
    ct_tensor *p0 = ct_clone(p[0]);
    cti_optim_list l = {.n = 2, .param = p, .grad = g, .state = {m, v}, .step_t = st, .ctl = ctl};
    bool prev = ct_no_grad_begin();
    /* Counts in memory: a float32 count, a [1] count, no control tensor, a
     * control tensor of 3 elements, two control tensors in one dispatch. */
    ct_tensor *f32 = ct_tensor_scalar(0, CT_F32, CT_CPU),
              *one = ct_tensor_zeros(CT_SHAPE(1), CT_F64, CT_CPU);
    ct_tensor *c3 = ct_tensor_zeros(CT_SHAPE(3), CT_F64, CT_CPU);
    ct_tensor *st1 = st[1];
    st[1] = f32;
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x", "parameter 1",
                    "step count", "0-d float64");
    st[1] = one;
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x", "parameter 1",
                    "0-d float64");
    st[1] = NULL;
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x", "parameter 1",
                    "no step count");
    st[1] = st1;
    ctl[1] = NULL;
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x", "parameter 1",
                    "control tensor", "none");
    ctl[1] = c3;
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x", "parameter 1",
                    "control tensor", "[3]");
    ctl[1] = c1;
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x",
                    "parameters 0 and 1", "different control tensors");
    ctl[1] = c0;
    /* One count tensor for two parameters. */
    st[1] = st[0];
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x", "share memory");
    st[1] = st1;
    /* Neither form anywhere. */
    cti_optim_list none = {.n = 2, .param = p, .grad = g, .state = {m, v}};
    tu_assert_error(cti_adamw_step("op_x", &none, &ah), CT_ERR_INVALID_ARG, "op_x", "malformed");

    /* Masters: for a float32 parameter, of another shape or dtype, states
     * not float32. */
    ct_tensor *mw[2] = {ct_to_dtype(p[0], CT_F32), ct_to_dtype(p[1], CT_F32)};
    ct_tensor *m32[2] = {ct_to_dtype(m[0], CT_F32), ct_to_dtype(m[1], CT_F32)};
    ct_tensor *v32[2] = {ct_to_dtype(v[0], CT_F32), ct_to_dtype(v[1], CT_F32)};
    cti_optim_list lm = {.n = 2, .param = p, .grad = g, .state = {m32, v32}, .step_t = st,
                         .ctl = ctl, .master = mw};
    assert_int_equal(cti_adamw_step("op_x", &lm, &ah), CT_OK);
    ct_tensor_release(p0);
    p0 = ct_clone(p[0]); /* the refused calls below write nothing */
    lm.state[0] = m;
    tu_assert_error(cti_adamw_step("op_x", &lm, &ah), CT_ERR_SHAPE, "op_x", "parameter 0",
                    "exp_avg", "bfloat16", "expected float32");
    lm.state[0] = m32;
    ct_tensor *bad = ct_tensor_zeros(CT_SHAPE(4, 3), CT_F32, CT_CPU);
    ct_tensor *mw1 = mw[1];
    mw[1] = bad;
    tu_assert_error(cti_adamw_step("op_x", &lm, &ah), CT_ERR_SHAPE, "op_x", "parameter 1",
                    "master weights", "[4, 3]");
    mw[1] = m[1]; /* bfloat16 */
    tu_assert_error(cti_adamw_step("op_x", &lm, &ah), CT_ERR_SHAPE, "op_x", "parameter 1",
                    "master weights", "float32");
    mw[1] = mw1;
    ct_tensor *p32[2] = {ct_to_dtype(p[0], CT_F32), ct_to_dtype(p[1], CT_F32)};
    ct_tensor *g32[2] = {ct_to_dtype(g[0], CT_F32), ct_to_dtype(g[1], CT_F32)};
    cti_optim_list l32 = lm;
    l32.param = p32;
    l32.grad = g32;
    tu_assert_error(cti_adamw_step("op_x", &l32, &ah), CT_ERR_DTYPE, "op_x", "parameter 0",
                    "master weights", "float16 and bfloat16");
    /* found_inf: of another dtype or shape. */
    ct_tensor *fi = ct_tensor_zeros(CT_SHAPE(1), CT_F32, CT_CPU);
    l.found_inf = fi;
    tu_assert_error(cti_adamw_step("op_x", &l, &ah), CT_ERR_INVALID_ARG, "op_x", "found_inf",
                    "0-d float32");
    l.found_inf = NULL;
    ct_no_grad_end(prev);
    /* Nothing was written by a refused call. */
    assert_same_bytes(p[0], p0);
    ct_tensor *all[] = {p0, f32, one, c3, c0, c1, st1, bad, fi, mw[0], mw[1], m32[0], m32[1],
                        v32[0], v32[1], p32[0], p32[1], g32[0], g32[1]};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    for (int k = 0; k < 2; k++) {
        ct_tensor_release(p[k]);
        ct_tensor_release(g[k]);
        ct_tensor_release(m[k]);
        ct_tensor_release(v[k]);
    }
    ct_tensor_release(st[0]);
}

/* ---- clipping non-finite gradients -------------------------------------------------------------
 */

/* An inf or NaN gradient: no error, a non-finite total, the gradients made
 * non-finite where torch makes them so (inf * 0 and NaN spread). */
static void test_clip_non_finite(void **state) {
    (void)state;
    for (int nan = 0; nan < 2; nan++) {
        ct_params *p = ct_params_new();
        ct_tensor *a = tu_rand(CT_SHAPE(4), CT_F32, -1, 1, NULL),
                  *b = tu_rand(CT_SHAPE(3), CT_F32, -1, 1, NULL);
        ct_requires_grad_(a, true);
        ct_requires_grad_(b, true);
        ct_params_add(p, "a", a);
        ct_params_add(p, "b", b);
        double ga[4] = {1, nan ? NAN : INFINITY, 2, 3}, gb[3] = {0.5, 0.25, -1};
        ct_tensor *ta = tu_from_f64(ga, CT_SHAPE(4), CT_F32),
                  *tb = tu_from_f64(gb, CT_SHAPE(3), CT_F32);
        ct_set_grad(a, ta);
        ct_set_grad(b, tb);
        double total = 0;
        assert_int_equal(ct_clip_grad_norm(p, 1.0, &total), CT_OK);
        assert_true(nan ? isnan(total) : isinf(total));
        double *v = tu_values(ct_grad(b));
        for (int i = 0; i < 3; i++) assert_true(nan ? isnan(v[i]) : v[i] == 0);
        free(v);
        ct_tensor *all[] = {a, b, ta, tb};
        for (size_t i = 0; i < 4; i++) ct_tensor_release(all[i]);
        ct_params_free(p);
    }
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_counts_in_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_counts_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_found_inf_skips, setup, teardown),
        cmocka_unit_test_setup_teardown(test_found_inf_kernel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_state_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_op_noncontig, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_lists, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clip_non_finite, setup, teardown),
    };
    return tu_run_tests(tests);
}
