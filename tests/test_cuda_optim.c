/* The optimizers and the gradient scaler on a GPU, against the CPU:
 *  - capturable state: a GPU parameter's step count lives on its device and
 *    the kernel advances it; with a learning rate changed every step the
 *    updates follow the CPU optimizer (host counts), and no step or
 *    ct_optim_set_lr waits for the device; the memory form and the host form
 *    of the op give the same bits on the device;
 *  - a step recorded in a CUDA graph (stream capture through the runtime)
 *    and replayed with new gradients and learning rates equals eager steps
 *    bit for bit, the counts advancing once per replay; a scaled step
 *    (unscale, update, skip on inf) likewise;
 *  - the scaler: a planted inf skips the step bit for bit (parameters,
 *    moments, counts) and halves the scale without a host wait; unscale,
 *    clip (no wait), step follow the CPU; the device of its inputs checked;
 *  - float32 master weights of bfloat16 parameters against the CPU's;
 *  - more parameters than one launch takes, a zero-size one among them.
 * Skipped without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "test_util.h"

#include "cuda_module.h"
#include "ops/optim_impl.h"
#include "test_fixture.h"

#define DEV CT_CUDA(0)

/* Looked up in the module and the runtime it links. */
static int64_t (*host_waits)(void);
static cudaError_t (*begin_capture)(cudaStream_t, enum cudaStreamCaptureMode);
static cudaError_t (*end_capture)(cudaStream_t, cudaGraph_t *);
static cudaError_t (*instantiate)(cudaGraphExec_t *, cudaGraph_t, unsigned long long);
static cudaError_t (*graph_launch)(cudaGraphExec_t, cudaStream_t);
static cudaError_t (*exec_destroy)(cudaGraphExec_t);
static cudaError_t (*graph_destroy)(cudaGraph_t);

static void ok(ct_status s) {
    if (s != CT_OK) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_int_equal(s, CT_OK);
}

static unsigned char *bytes_of(const ct_tensor *t, size_t *nb) {
    *nb = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    unsigned char *b = malloc(*nb ? *nb : 1);
    ok(ct_tensor_copy_to_host(t, b, *nb));
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

static void assert_close(const ct_tensor *got, const ct_tensor *ref, double rtol, double atol) {
    assert_int_equal(ct_tensor_numel(got), ct_tensor_numel(ref));
    double *g = tu_values(got), *r = tu_values(ref);
    tu_assert_close(g, r, ct_tensor_numel(ref), rtol, atol);
    free(g);
    free(r);
}

static double item(const ct_tensor *t) {
    double v;
    ok(ct_tensor_item(t, &v));
    return v;
}

#define NP 4
static const int64_t shapes[NP][2] = {{64, 300}, {300, 1}, {0, 5}, {1000, 77}};
static const int ndims[NP] = {2, 1, 2, 2};

/* NP leaves of dtype dt on the CPU (*cpu) and the same values on the GPU
 * (returned). */
static ct_params *twin_leaves(ct_dtype dt, ct_params **cpu) {
    ct_params *g = ct_params_new();
    *cpu = ct_params_new();
    for (int k = 0; k < NP; k++) {
        char nm[8];
        snprintf(nm, sizeof nm, "p%d", k);
        ct_tensor *c = tu_rand(ndims[k], shapes[k], dt, -1, 1, NULL);
        ct_tensor *d = ct_to_device(c, DEV);
        ok(ct_requires_grad_(c, true));
        ok(ct_requires_grad_(d, true));
        ok(ct_params_add(*cpu, nm, c));
        ok(ct_params_add(g, nm, d));
        ct_tensor_release(c);
        ct_tensor_release(d);
    }
    return g;
}

/* Fresh gradients times scale on both (parameter skip gets none). */
static void twin_grads(ct_params *g, ct_params *c, double scale, int skip) {
    for (int k = 0; k < NP; k++) {
        ct_tensor *tc = ct_params_get(c, k, NULL), *tg = ct_params_get(g, k, NULL);
        if (k == skip) {
            ct_zero_grad(tc);
            ct_zero_grad(tg);
            continue;
        }
        ct_tensor *v = tu_rand(ndims[k], shapes[k], ct_tensor_dtype(tc), -1, 1, NULL);
        ct_tensor *vs = ct_mul_scalar(v, scale), *vg = ct_to_device(vs, DEV);
        ok(ct_set_grad(tc, vs));
        ok(ct_set_grad(tg, vg));
        ct_tensor_release(v);
        ct_tensor_release(vs);
        ct_tensor_release(vg);
    }
}

static ct_optimizer *make_opt(ct_params *p, bool adamw) {
    ct_optimizer *o = adamw ? ct_optim_adamw_new(p, 0.01, 0.9, 0.99, 1e-6, 0.05)
                            : ct_optim_sgd_new(p, 0.05, 0.9, 0.1, 0.01, false);
    if (!o) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(o);
    return o;
}

static void assert_states_close(ct_optimizer *og, ct_optimizer *oc, double rtol, double atol) {
    assert_int_equal(ct_optim_state_count(og), ct_optim_state_count(oc));
    for (int64_t s = 0; s < ct_optim_state_count(og); s++) {
        const char *name;
        ct_tensor *t = ct_optim_state_get(og, s, &name);
        assert_true(ct_device_eq(ct_tensor_device(t), DEV));
        if (strstr(name, ".step")) assert_true(item(t) == item(ct_optim_state_get(oc, s, NULL)));
        else assert_close(t, ct_optim_state_get(oc, s, NULL), rtol, atol);
    }
}

/* ---- capturable state ---------------------------------------------------------------------------
 */

static void test_counts_on_device(void **state) {
    (void)state;
    for (int adamw = 0; adamw < 2; adamw++) {
        ct_params *pc;
        ct_params *pg = twin_leaves(CT_F32, &pc);
        ct_optimizer *oc = make_opt(pc, adamw), *og = make_opt(pg, adamw);
        for (int step = 0; step < 5; step++) {
            double lr = 0.01 * (1 + step % 3);
            twin_grads(pg, pc, 1, step == 2 ? 0 : -1);
            ok(ct_optim_set_lr(oc, lr));
            int64_t w0 = host_waits();
            ok(ct_optim_set_lr(og, lr));
            ok(ct_optim_step(og));
            assert_int_equal(host_waits(), w0);
            ok(ct_optim_step(oc));
        }
        for (int k = 0; k < NP; k++)
            assert_close(ct_params_get(pg, k, NULL), ct_params_get(pc, k, NULL), 1e-5, 1e-6);
        assert_states_close(og, oc, 1e-5, 1e-6);
        assert_true(item(ct_optim_state_get(og, 0, NULL)) == 4); /* parameter 0 skipped once */
        ct_optim_free(oc);
        ct_optim_free(og);
        ct_params_free(pc);
        ct_params_free(pg);
    }
}

/* The op on the device: host counts and counts in memory give the same
 * bits (both compute the scalars in the kernel from the count). */
static void test_forms_agree(void **state) {
    (void)state;
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        ct_scope *sc = ct_scope_begin();
        enum { N = 5 };
        ct_tensor *p[2][N], *g[N], *m[2][N], *v[2][N], *cnt[N], *ctl[N];
        int64_t steps[N];
        double cv[2] = {0.03, 0};
        ct_tensor *c = ct_tensor_from_data_on(cv, CT_F64, CT_SHAPE(2), DEV);
        for (int k = 0; k < N; k++) {
            int64_t n = 1 + 3001 * k;
            ct_tensor *x = ct_to_device(tu_rand(CT_SHAPE(n), dt, -1, 1, NULL), DEV);
            p[0][k] = x;
            p[1][k] = ct_clone(x);
            g[k] = ct_to_device(tu_rand(CT_SHAPE(n), dt, -1, 1, NULL), DEV);
            m[0][k] = ct_to_device(tu_rand(CT_SHAPE(n), dt, -1, 1, NULL), DEV);
            v[0][k] = ct_to_device(tu_rand(CT_SHAPE(n), dt, 0, 1, NULL), DEV);
            m[1][k] = ct_clone(m[0][k]);
            v[1][k] = ct_clone(v[0][k]);
            steps[k] = 1 + 7 * k;
            cnt[k] = ct_tensor_scalar((double)(7 * k), CT_F64, DEV);
            ctl[k] = c;
        }
        cti_optim_list host = {.n = N, .param = p[0], .grad = g, .state = {m[0], v[0]},
                               .step = steps};
        cti_optim_list mem = {.n = N, .param = p[1], .grad = g, .state = {m[1], v[1]},
                              .step_t = cnt, .ctl = ctl};
        cti_adamw_hparams h = {0.03, 0.9, 0.999, 1e-8, 0.01};
        bool prev = ct_no_grad_begin();
        ok(cti_adamw_step("t", &host, &h));
        h.lr = 5; /* not the one the memory form reads */
        ok(cti_adamw_step("t", &mem, &h));
        ct_no_grad_end(prev);
        for (int k = 0; k < N; k++) {
            assert_same_bytes(p[0][k], p[1][k]);
            assert_same_bytes(m[0][k], m[1][k]);
            assert_same_bytes(v[0][k], v[1][k]);
            assert_true(item(cnt[k]) == (double)steps[k]);
        }
        ct_scope_end(sc);
    }
}

/* More parameters than one launch takes (CTI_CUDA_OPTIM_MAX 48), one of
 * them zero-size: every count advances, the values follow the CPU. */
static void test_many_parameters(void **state) {
    (void)state;
    enum { N = 100 };
    ct_params *pc = ct_params_new(), *pg = ct_params_new();
    for (int k = 0; k < N; k++) {
        char nm[8];
        snprintf(nm, sizeof nm, "p%d", k);
        ct_tensor *c = tu_rand(CT_SHAPE(k == 50 ? 0 : 3 + k), CT_F32, -1, 1, NULL);
        ct_tensor *d = ct_to_device(c, DEV);
        ok(ct_requires_grad_(c, true));
        ok(ct_requires_grad_(d, true));
        ok(ct_params_add(pc, nm, c));
        ok(ct_params_add(pg, nm, d));
        ct_tensor_release(c);
        ct_tensor_release(d);
    }
    ct_optimizer *oc = make_opt(pc, true), *og = make_opt(pg, true);
    for (int step = 0; step < 3; step++) {
        for (int k = 0; k < N; k++) {
            ct_tensor *tc = ct_params_get(pc, k, NULL);
            ct_tensor *gc = tu_rand(1, ct_tensor_shape(tc), CT_F32, -1, 1, NULL);
            ct_tensor *gg = ct_to_device(gc, DEV);
            ok(ct_set_grad(tc, gc));
            ok(ct_set_grad(ct_params_get(pg, k, NULL), gg));
            ct_tensor_release(gc);
            ct_tensor_release(gg);
        }
        ok(ct_optim_step(og));
        ok(ct_optim_step(oc));
    }
    assert_states_close(og, oc, 1e-5, 1e-6);
    for (int k = 0; k < N; k++) assert_true(item(ct_optim_state_get(og, 3 * k, NULL)) == 3);
    ct_optim_free(oc);
    ct_optim_free(og);
    ct_params_free(pc);
    ct_params_free(pg);
}

/* ---- CUDA graphs --------------------------------------------------------------------------- */

typedef struct graph {
    cudaGraph_t g;
    cudaGraphExec_t exec;
} graph;

static cudaStream_t stream(void) { return (cudaStream_t)ct_cuda_stream(0); }

static void capture_begin(void) {
    ok(ct_cuda_synchronize(0));
    assert_int_equal(begin_capture(stream(), cudaStreamCaptureModeRelaxed), cudaSuccess);
}

static graph capture_end(void) {
    graph gr;
    assert_int_equal(end_capture(stream(), &gr.g), cudaSuccess);
    assert_int_equal(instantiate(&gr.exec, gr.g, 0), cudaSuccess);
    return gr;
}

static void replay(graph *gr) { assert_int_equal(graph_launch(gr->exec, stream()), cudaSuccess); }

static void graph_free(graph *gr) {
    exec_destroy(gr->exec);
    graph_destroy(gr->g);
}

/* Copies fresh values (times scale) into the GPU parameters' gradients in
 * place (a graph reads them at fixed addresses), and the same into the twin
 * list's gradients. */
static void refill_grads(ct_params *pg, ct_params *twin, double scale) {
    for (int k = 0; k < NP; k++) {
        ct_tensor *t = ct_params_get(pg, k, NULL);
        ct_tensor *v = tu_rand(ndims[k], shapes[k], CT_F32, -1, 1, NULL);
        ct_tensor *vs = ct_mul_scalar(v, scale);
        ok(ct_copy_(ct_grad(t), vs));
        ok(ct_copy_(ct_grad(ct_params_get(twin, k, NULL)), vs));
        ct_tensor_release(v);
        ct_tensor_release(vs);
    }
}

/* Gradients on the device for both GPU lists: the same fresh values times
 * scale, in tensors of their own (the ones a graph reads afterwards). */
static void graph_grads(ct_params *pg, ct_params *pe, double scale) {
    for (int k = 0; k < NP; k++) {
        ct_tensor *v = tu_rand(ndims[k], shapes[k], CT_F32, -1, 1, NULL);
        ct_tensor *vs = ct_mul_scalar(v, scale);
        ct_tensor *vg = ct_to_device(vs, DEV), *ve = ct_clone(vg);
        ok(ct_set_grad(ct_params_get(pg, k, NULL), vg));
        ok(ct_set_grad(ct_params_get(pe, k, NULL), ve));
        ct_tensor *all[] = {v, vs, vg, ve};
        for (int i = 0; i < 4; i++) ct_tensor_release(all[i]);
    }
}

/* Two GPU lists with the same values: pg (replayed) and pe (eager). */
static void graph_twins(ct_params **pg, ct_params **pe) {
    ct_params *pc;
    *pg = twin_leaves(CT_F32, &pc);
    *pe = ct_params_new();
    for (int k = 0; k < NP; k++) {
        const char *nm;
        /* Detached first: the copy of a leaf that requires grad is
         * recorded, and an optimizer refuses a non-leaf. */
        ct_tensor *c = ct_detach(ct_params_get(pc, k, &nm));
        ct_tensor *t = ct_to_device(c, DEV);
        ct_tensor_release(c);
        ok(ct_requires_grad_(t, true));
        ok(ct_params_add(*pe, nm, t));
        ct_tensor_release(t);
    }
    ct_params_free(pc);
}

static void test_graph_step(void **state) {
    (void)state;
    for (int adamw = 0; adamw < 2; adamw++) {
        ct_params *pg, *pe;
        graph_twins(&pg, &pe);
        ct_optimizer *og = make_opt(pg, adamw), *oe = make_opt(pe, adamw);
        graph_grads(pg, pe, 1); /* the gradients' tensors the graph will read */
        ok(ct_optim_step(og)); /* warm-up, eager */
        ok(ct_optim_step(oe));
        capture_begin();
        ok(ct_optim_step(og));
        graph gr = capture_end();
        for (int r = 0; r < 4; r++) {
            double lr = 0.01 * (r + 2);
            refill_grads(pg, pe, 1);
            ok(ct_optim_set_lr(og, lr));
            ok(ct_optim_set_lr(oe, lr));
            replay(&gr);
            ok(ct_optim_step(oe));
        }
        ok(ct_cuda_synchronize(0));
        for (int k = 0; k < NP; k++)
            assert_same_bytes(ct_params_get(pg, k, NULL), ct_params_get(pe, k, NULL));
        for (int64_t s = 0; s < ct_optim_state_count(og); s++)
            assert_same_bytes(ct_optim_state_get(og, s, NULL), ct_optim_state_get(oe, s, NULL));
        assert_true(item(ct_optim_state_get(og, 0, NULL)) == 5); /* 1 eager + 4 replays */
        graph_free(&gr);
        ct_optim_free(og);
        ct_optim_free(oe);
        ct_params_free(pg);
        ct_params_free(pe);
    }
}

/* A scaled step (step = unscale + update skipping on inf, then the scale's
 * update) recorded once: replays with an inf planted in one of them skip
 * that one and back off the scale, as the eager scaler does. */
static void test_graph_scaled_step(void **state) {
    (void)state;
    ct_params *pg, *pe;
    graph_twins(&pg, &pe);
    ct_optimizer *og = make_opt(pg, true), *oe = make_opt(pe, true);
    ct_grad_scaler *sg = ct_grad_scaler_new(DEV, 1024, 2, 0.5, 3, true);
    ct_grad_scaler *se = ct_grad_scaler_new(DEV, 1024, 2, 0.5, 3, true);
    graph_grads(pg, pe, 1024);
    ok(ct_grad_scaler_step(sg, og)); /* warm-up: the scaler's per-optimizer state */
    ok(ct_grad_scaler_update(sg));
    ok(ct_grad_scaler_step(se, oe));
    ok(ct_grad_scaler_update(se));
    capture_begin();
    ok(ct_grad_scaler_step(sg, og));
    ok(ct_grad_scaler_update(sg));
    graph gr = capture_end();
    double scale = 1024;
    for (int r = 0; r < 6; r++) {
        refill_grads(pg, pe, scale);
        if (r == 2) {
            ct_tensor *e = ct_select(ct_grad(ct_params_get(pg, 3, NULL)), 0, 5);
            ok(ct_fill_(e, INFINITY));
            ct_tensor_release(e);
            e = ct_select(ct_grad(ct_params_get(pe, 3, NULL)), 0, 5);
            ok(ct_fill_(e, INFINITY));
            ct_tensor_release(e);
        }
        replay(&gr);
        ok(ct_grad_scaler_step(se, oe));
        ok(ct_grad_scaler_update(se));
        scale = ct_grad_scaler_get_scale(se);
        assert_true(ct_grad_scaler_get_scale(sg) == scale);
    }
    /* The warm-up and replays 0, 1 good: growth to 2048 (interval 3); the
     * inf: 1024; three good: 2048. */
    assert_true(scale == 2048);
    for (int k = 0; k < NP; k++)
        assert_same_bytes(ct_params_get(pg, k, NULL), ct_params_get(pe, k, NULL));
    for (int64_t s = 0; s < ct_optim_state_count(og); s++)
        assert_same_bytes(ct_optim_state_get(og, s, NULL), ct_optim_state_get(oe, s, NULL));
    assert_true(item(ct_optim_state_get(og, 0, NULL)) == 6); /* 7 steps, one skipped */
    graph_free(&gr);
    ct_grad_scaler_free(sg);
    ct_grad_scaler_free(se);
    ct_optim_free(og);
    ct_optim_free(oe);
    ct_params_free(pg);
    ct_params_free(pe);
}

/* ---- the scaler
 * ---------------------------------------------------------------------------------- */

static void test_scaler_skip(void **state) {
    (void)state;
    ct_params *pc;
    ct_params *pg = twin_leaves(CT_F32, &pc);
    ct_optimizer *og = make_opt(pg, true), *oc = make_opt(pc, true);
    ct_grad_scaler *sg = ct_grad_scaler_new(DEV, 4096, 2, 0.5, 100, true);
    ct_grad_scaler *scpu = ct_grad_scaler_new(CT_CPU, 4096, 2, 0.5, 100, true);
    for (int step = 0; step < 3; step++) {
        twin_grads(pg, pc, 4096, -1);
        int64_t w0 = host_waits();
        ok(ct_grad_scaler_unscale(sg, og));
        ok(ct_clip_grad_norm(pg, 5.0, NULL));
        ok(ct_grad_scaler_step(sg, og));
        ok(ct_grad_scaler_update(sg));
        assert_int_equal(host_waits(), w0);
        ok(ct_grad_scaler_unscale(scpu, oc));
        ok(ct_clip_grad_norm(pc, 5.0, NULL));
        ok(ct_grad_scaler_step(scpu, oc));
        ok(ct_grad_scaler_update(scpu));
    }
    for (int k = 0; k < NP; k++)
        assert_close(ct_params_get(pg, k, NULL), ct_params_get(pc, k, NULL), 1e-5, 1e-6);
    /* The inf: nothing moves, bit for bit, counts included; scale halves. */
    twin_grads(pg, pc, 4096, -1);
    ct_tensor *e = ct_select(ct_grad(ct_params_get(pg, 1, NULL)), 0, 17);
    ok(ct_fill_(e, NAN));
    ct_tensor_release(e);
    int64_t ns = ct_optim_state_count(og);
    ct_tensor **before = malloc((size_t)(ns + NP) * sizeof *before);
    for (int64_t s = 0; s < ns; s++) before[s] = ct_clone(ct_optim_state_get(og, s, NULL));
    bool prev = ct_no_grad_begin();
    for (int k = 0; k < NP; k++) before[ns + k] = ct_clone(ct_params_get(pg, k, NULL));
    ct_no_grad_end(prev);
    int64_t w0 = host_waits();
    ok(ct_grad_scaler_step(sg, og));
    ok(ct_grad_scaler_update(sg));
    assert_int_equal(host_waits(), w0);
    for (int64_t s = 0; s < ns; s++) assert_same_bytes(ct_optim_state_get(og, s, NULL), before[s]);
    for (int k = 0; k < NP; k++) assert_same_bytes(ct_params_get(pg, k, NULL), before[ns + k]);
    for (int64_t s = 0; s < ns + NP; s++) ct_tensor_release(before[s]);
    free(before);
    assert_true(ct_grad_scaler_get_scale(sg) == 2048);
    ct_grad_scaler_state st;
    ok(ct_grad_scaler_get_state(sg, &st));
    assert_int_equal(st.growth_tracker, 0);
    ct_grad_scaler_free(sg);
    ct_grad_scaler_free(scpu);
    ct_optim_free(og);
    ct_optim_free(oc);
    ct_params_free(pc);
    ct_params_free(pg);
}

/* The scaler's device against its inputs'. */
static void test_scaler_devices(void **state) {
    (void)state;
    ct_params *pc;
    ct_params *pg = twin_leaves(CT_F32, &pc);
    ct_optimizer *og = make_opt(pg, true), *oc = make_opt(pc, true);
    ct_grad_scaler *sg = ct_grad_scaler_new(DEV, 16, 2, 0.5, 10, true);
    ct_grad_scaler *scpu = ct_grad_scaler_new(CT_CPU, 16, 2, 0.5, 10, true);
    twin_grads(pg, pc, 1, -1);
    tu_assert_error(ct_grad_scaler_unscale(sg, oc), CT_ERR_DEVICE, "ct_grad_scaler_unscale",
                    "parameter 0", "cpu", "not on the scaler's device", "cuda:0");
    tu_assert_error(ct_grad_scaler_step(scpu, og), CT_ERR_DEVICE, "ct_grad_scaler_step",
                    "cuda:0", "not on the scaler's device", "cpu");
    ct_tensor *loss = ct_tensor_scalar(1, CT_F32, CT_CPU);
    tu_assert_null_error(ct_grad_scaler_scale(sg, loss), CT_ERR_DEVICE, "ct_grad_scaler_scale",
                         "not on the scaler's device", "cuda:0");
    ct_tensor_release(loss);
    /* Refused calls leave the scalers usable. */
    ok(ct_grad_scaler_step(sg, og));
    ok(ct_grad_scaler_update(sg));
    ok(ct_grad_scaler_step(scpu, oc));
    ok(ct_grad_scaler_update(scpu));
    ct_grad_scaler_free(sg);
    ct_grad_scaler_free(scpu);
    ct_optim_free(og);
    ct_optim_free(oc);
    ct_params_free(pc);
    ct_params_free(pg);
}

/* ---- master weights
 * ------------------------------------------------------------------------------- */

static void test_master_weights(void **state) {
    (void)state;
    for (int adamw = 0; adamw < 2; adamw++) {
        ct_params *pc;
        ct_params *pg = twin_leaves(CT_BF16, &pc);
        ct_optimizer *og = make_opt(pg, adamw), *oc = make_opt(pc, adamw);
        ok(ct_optim_set_master_weights(og, true));
        ok(ct_optim_set_master_weights(oc, true));
        for (int step = 0; step < 4; step++) {
            twin_grads(pg, pc, 1, step == 1 ? 3 : -1);
            ok(ct_optim_step(og));
            ok(ct_optim_step(oc));
        }
        assert_states_close(og, oc, 1e-5, 1e-6);
        int64_t per = adamw ? 4 : 3; /* step, buffers, master */
        for (int k = 0; k < NP; k++) {
            const char *name;
            ct_tensor *m = ct_optim_state_get(og, per * k + per - 1, &name);
            assert_non_null(strstr(name, "master_param"));
            double *mv = tu_values(m), *wv = tu_values(ct_params_get(pg, k, NULL));
            for (int64_t i = 0; i < ct_tensor_numel(m); i++)
                assert_true(wv[i] == tu_round(mv[i], CT_BF16));
            free(mv);
            free(wv);
        }
        ct_optim_free(og);
        ct_optim_free(oc);
        ct_params_free(pc);
        ct_params_free(pg);
    }
}

/* ---- checkpoints
 * ---------------------------------------------------------------------------------- */

/* A GPU optimizer's state (counts on the device, masters) through a
 * checkpoint into a fresh one: both go on bit for bit; the file loads into
 * a CPU optimizer too (the counts are plain float64 scalars). */
static void test_checkpoint(void **state) {
    (void)state;
    ct_params *pc;
    ct_params *pa = twin_leaves(CT_BF16, &pc);
    ct_params *pb = ct_params_new();
    for (int k = 0; k < NP; k++) {
        const char *nm;
        /* Detached first: the copy of a leaf that requires grad is
         * recorded, and an optimizer refuses a non-leaf. */
        ct_tensor *c = ct_detach(ct_params_get(pc, k, &nm));
        ct_tensor *t = ct_to_device(c, DEV);
        ct_tensor_release(c);
        ok(ct_requires_grad_(t, true));
        ok(ct_params_add(pb, nm, t));
        ct_tensor_release(t);
    }
    ct_optimizer *oa = make_opt(pa, true), *ob = make_opt(pb, true), *oc = make_opt(pc, true);
    ok(ct_optim_set_master_weights(oa, true));
    ok(ct_optim_set_master_weights(ob, true));
    ok(ct_optim_set_master_weights(oc, true));
    for (int step = 0; step < 3; step++) {
        twin_grads(pa, pc, 1, step == 1 ? 1 : -1);
        ok(ct_optim_step(oa));
    }
    char path[256];
    snprintf(path, sizeof path, "%s/cten_cuda_optim_%d.safetensors",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid());
    ok(ct_checkpoint_save(path, pa, oa, NULL, NULL));
    ok(ct_checkpoint_load(path, pb, ob, NULL, NULL));
    ok(ct_checkpoint_load(path, pc, oc, NULL, NULL));
    remove(path);
    assert_true(item(ct_optim_state_get(ob, 4, NULL)) == 2); /* "1.step": one skip */
    for (int step = 0; step < 2; step++) {
        twin_grads(pa, pc, 1, -1);
        for (int k = 0; k < NP; k++)
            ok(ct_set_grad(ct_params_get(pb, k, NULL), ct_grad(ct_params_get(pa, k, NULL))));
        ok(ct_optim_step(oa));
        ok(ct_optim_step(ob));
        ok(ct_optim_step(oc));
    }
    for (int64_t s = 0; s < ct_optim_state_count(oa); s++)
        assert_same_bytes(ct_optim_state_get(oa, s, NULL), ct_optim_state_get(ob, s, NULL));
    assert_states_close(oa, oc, 1e-5, 1e-6);
    ct_optim_free(oa);
    ct_optim_free(ob);
    ct_optim_free(oc);
    ct_params_free(pa);
    ct_params_free(pb);
    ct_params_free(pc);
}

/* ---- clipping -----------------------------------------------------------------------------------
 */

/* On one GPU: no host wait unless the total is asked for (one), the
 * gradients follow the CPU's. */
static void test_clip_waits(void **state) {
    (void)state;
    ct_params *pc;
    ct_params *pg = twin_leaves(CT_F32, &pc);
    twin_grads(pg, pc, 1, 2);
    int64_t w0 = host_waits();
    ok(ct_clip_grad_norm(pg, 2.0, NULL));
    assert_int_equal(host_waits(), w0);
    double nc, ng;
    ok(ct_clip_grad_norm(pc, 2.0, &nc));
    for (int k = 0; k < NP; k++) {
        ct_tensor *gg = ct_grad(ct_params_get(pg, k, NULL)),
                  *gc = ct_grad(ct_params_get(pc, k, NULL));
        if (gc) assert_close(gg, gc, 1e-5, 1e-7);
    }
    w0 = host_waits();
    ok(ct_clip_grad_norm(pg, 100.0, &ng));
    assert_int_equal(host_waits(), w0 + 1);
    assert_true(fabs(ng - 2.0) < 1e-4);
    ct_params_free(pc);
    ct_params_free(pg);
}

int main(void) {
    tu_seed();
    tu_cuda_devices_or_skip("cuda_optim");
    host_waits = tu_cuda_symbol("cti_cuda_host_waits");
    begin_capture = tu_cuda_symbol("cudaStreamBeginCapture");
    end_capture = tu_cuda_symbol("cudaStreamEndCapture");
    instantiate = tu_cuda_symbol("cudaGraphInstantiateWithFlags");
    graph_launch = tu_cuda_symbol("cudaGraphLaunch");
    exec_destroy = tu_cuda_symbol("cudaGraphExecDestroy");
    graph_destroy = tu_cuda_symbol("cudaGraphDestroy");
    ct_set_allow_tf32(false);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_counts_on_device, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forms_agree, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_parameters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_graph_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_graph_scaled_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scaler_skip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scaler_devices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_master_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clip_waits, setup, teardown),
    };
    return tu_run_tests(tests);
}
