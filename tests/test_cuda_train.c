/* Training steps entirely on the GPU: an MLP (784-256-10) and a small CNN
 * (conv 1->16 3x3 pad 1, relu, max-pool 2, conv 16->32, relu, max-pool 2,
 * linear 1568->10) built from the library's layers, the same initial
 * weights on the CPU and the GPU, five SGD-momentum and five AdamW steps at
 * batch 64 on random inputs and targets. Losses and parameters follow the
 * CPU run within float32 tolerances (TF32 off), and a GPU step (forward,
 * cross-entropy, backward, optimizer step) makes the host wait for the
 * device only when the loss is read, and from the third step on never calls
 * cudaMalloc (unless CT_CUDA_NO_CACHE turns the caching allocator off).
 * The program is skipped without a usable GPU.
 *
 * A ReLU input within rounding of zero can take either side on the two
 * devices; in the MLP that moves a whole row of fc1's gradient by one
 * sample's share, far past float32 tolerances. Each MLP batch is therefore
 * drawn again until every hidden pre-activation the CPU model computes for
 * it is at least RELU_MARGIN from zero, well above the devices' rounding
 * differences (about 1e-6 for these sums). The CNN: see CNN_NORM_RTOL. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "cuda_module.h"
#include "test_fixture.h"

/* src/backends/cuda/stream.c, looked up in the module: how many times the
 * host has waited for a device. */
static int64_t (*cti_cuda_host_waits)(void);

#define BATCH 64
#define STEPS 5
#define RELU_MARGIN 1e-5
/* The CNN has 1.2M ReLU inputs and 300k pooling windows a batch, so some
 * always sit within rounding of a kink (a ReLU at 0, a near tie in a
 * window), and no redraw avoids them all. One such flip moves one output
 * channel's weight gradient by about one position's share, which after five
 * steps leaves that channel's weights about 1e-4 apart. The CNN's
 * parameters are therefore held to a looser elementwise bound and to a
 * whole-tensor one that a wrong gradient (even in a single channel) breaks
 * by orders of magnitude. */
#define CNN_RTOL 1e-2
#define CNN_ATOL 1e-3
#define CNN_NORM_RTOL 1e-3

typedef struct model {
    bool cnn;
    ct_nn_linear *fc1, *fc2; /* MLP: fc1, fc2; CNN: fc2 */
    ct_nn_conv2d *conv1, *conv2;
    ct_params *params;
} model;

static void model_free(model *m) {
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
    ct_nn_conv2d_free(m->conv1);
    ct_nn_conv2d_free(m->conv2);
    ct_params_free(m->params);
}

static void model_init(model *m, bool cnn, ct_device dev, ct_generator *gen) {
    memset(m, 0, sizeof *m);
    m->cnn = cnn;
    m->params = ct_params_new();
    assert_non_null(m->params);
    if (cnn) {
        const int64_t k3[2] = {3, 3}, pad1[2] = {1, 1};
        m->conv1 = ct_nn_conv2d_new(1, 16, k3, NULL, pad1, NULL, 1, true, CT_F32, dev, gen);
        m->conv2 = ct_nn_conv2d_new(16, 32, k3, NULL, pad1, NULL, 1, true, CT_F32, dev, gen);
        m->fc2 = ct_nn_linear_new(32 * 7 * 7, 10, true, CT_F32, dev, gen);
        assert_non_null(m->conv1);
        assert_non_null(m->conv2);
        assert_non_null(m->fc2);
        assert_int_equal(ct_nn_conv2d_params(m->conv1, "conv1", m->params), CT_OK);
        assert_int_equal(ct_nn_conv2d_params(m->conv2, "conv2", m->params), CT_OK);
        assert_int_equal(ct_nn_linear_params(m->fc2, "fc", m->params), CT_OK);
    } else {
        m->fc1 = ct_nn_linear_new(28 * 28, 256, true, CT_F32, dev, gen);
        m->fc2 = ct_nn_linear_new(256, 10, true, CT_F32, dev, gen);
        assert_non_null(m->fc1);
        assert_non_null(m->fc2);
        assert_int_equal(ct_nn_linear_params(m->fc1, "fc1", m->params), CT_OK);
        assert_int_equal(ct_nn_linear_params(m->fc2, "fc2", m->params), CT_OK);
    }
}

/* The GPU model: its own layers, then the CPU model's values moved over. */
static void model_copy_to(model *gpu, model *cpu, ct_device dev, ct_generator *gen) {
    model_init(gpu, cpu->cnn, dev, gen);
    assert_int_equal(ct_params_count(gpu->params), ct_params_count(cpu->params));
    bool prev = ct_no_grad_begin();
    for (int64_t k = 0; k < ct_params_count(cpu->params); k++) {
        ct_tensor *d = ct_to_device(ct_params_get(cpu->params, k, NULL), dev);
        assert_non_null(d);
        assert_int_equal(ct_copy_(ct_params_get(gpu->params, k, NULL), d), CT_OK);
        ct_tensor_release(d);
    }
    ct_no_grad_end(prev);
}

/* Logits [B, 10]; temporaries go to the open scope. */
static ct_tensor *model_forward(model *m, ct_tensor *x) {
    if (!m->cnn) return ct_nn_linear_forward(m->fc2, ct_relu(ct_nn_linear_forward(m->fc1, x)));
    const int64_t k2[2] = {2, 2};
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv1, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv2, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    return ct_nn_linear_forward(m->fc2, ct_flatten(x, 1, -1));
}

/* loss = cross_entropy(model(x), y); zero_grad; backward; step. The loss
 * (in the open scope) into *loss. */
static void train_step(model *m, ct_optimizer *opt, ct_tensor *x, ct_tensor *y,
                       ct_tensor **loss) {
    *loss = ct_cross_entropy(model_forward(m, x), y, NULL, CT_REDUCTION_MEAN, -100, 0.0);
    if (!*loss) fprintf(stderr, "forward: %s\n", ct_last_error());
    assert_non_null(*loss);
    ct_optim_zero_grad(opt);
    assert_int_equal(ct_backward(*loss, NULL, false), CT_OK);
    assert_int_equal(ct_optim_step(opt), CT_OK);
}

static ct_optimizer *make_opt(model *m, bool adamw) {
    /* AdamW's update g / (|g| + eps) at the first steps turns a gradient
     * near zero into +-lr; eps 1e-5 keeps it a smooth function of the
     * gradient, so the devices' rounding differences stay small. */
    ct_optimizer *o = adamw ? ct_optim_adamw_new(m->params, 1e-3, 0.9, 0.999, 1e-5, 1e-2)
                            : ct_optim_sgd_new(m->params, 0.05, 0.9, 0, 1e-4, false);
    assert_non_null(o);
    return o;
}

/* The smallest |pre-activation| of the MLP's hidden layer for x. */
static double relu_margin(model *m, ct_tensor *x) {
    bool prev = ct_no_grad_begin();
    ct_tensor *h = ct_nn_linear_forward(m->fc1, x);
    ct_no_grad_end(prev);
    assert_non_null(h);
    double *v = tu_values(h), margin = INFINITY;
    for (int64_t i = 0; i < ct_tensor_numel(h); i++) margin = fmin(margin, fabs(v[i]));
    free(v);
    ct_tensor_release(h);
    return margin;
}

/* A batch for the CPU model's current weights (see RELU_MARGIN). */
static void draw_batch(model *m, ct_generator *gen, ct_tensor **x, ct_tensor **y) {
    for (int tries = 0;; tries++) {
        assert_true(tries < 100);
        *x = m->cnn ? ct_tensor_randn(gen, CT_SHAPE(BATCH, 1, 28, 28), CT_F32, CT_CPU)
                    : ct_tensor_randn(gen, CT_SHAPE(BATCH, 28 * 28), CT_F32, CT_CPU);
        assert_non_null(*x);
        if (m->cnn || relu_margin(m, *x) >= RELU_MARGIN) break;
        ct_tensor_release(*x);
    }
    *y = ct_tensor_randint(gen, 0, 10, CT_SHAPE(BATCH), CT_I64, CT_CPU);
    assert_non_null(*y);
}

/* CT_CUDA_NO_CACHE=1 (for compute-sanitizer) turns the caching allocator
 * off: every allocation is a cudaMalloc then. */
static bool allocator_caches(void) {
    const char *e = getenv("CT_CUDA_NO_CACHE");
    return !(e && *e && strcmp(e, "0") != 0);
}

static void run_case(bool cnn, bool adamw) {
    const ct_device dev = CT_CUDA(0);
    const bool caching = allocator_caches();
    ct_generator *gen = ct_generator_new(tu_next());
    assert_non_null(gen);
    model mc, mg;
    model_init(&mc, cnn, CT_CPU, gen);
    model_copy_to(&mg, &mc, dev, gen);
    ct_optimizer *oc = make_opt(&mc, adamw), *og = make_opt(&mg, adamw);

    /* The CPU run first: each batch is drawn for the weights it meets. */
    ct_tensor *xc[STEPS], *yc[STEPS], *xg[STEPS], *yg[STEPS];
    double vc[STEPS];
    for (int s = 0; s < STEPS; s++) {
        draw_batch(&mc, gen, &xc[s], &yc[s]);
        ct_scope *sc = ct_scope_begin();
        ct_tensor *lc;
        train_step(&mc, oc, xc[s], yc[s], &lc);
        assert_int_equal(ct_tensor_item(lc, &vc[s]), CT_OK);
        ct_scope_end(sc);
    }

    /* Every batch on the device before the first step: the steps move nothing. */
    for (int s = 0; s < STEPS; s++) {
        xg[s] = ct_to_device(xc[s], dev);
        yg[s] = ct_to_device(yc[s], dev);
        assert_non_null(xg[s]);
        assert_non_null(yg[s]);
    }
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);

    for (int s = 0; s < STEPS; s++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *lg;
        double vg;
        ct_cuda_memstats m0, m1;
        assert_int_equal(ct_cuda_memory_stats(0, &m0), CT_OK);
        int64_t w0 = cti_cuda_host_waits();
        train_step(&mg, og, xg[s], yg[s], &lg);
        int64_t w1 = cti_cuda_host_waits();
        assert_int_equal(ct_cuda_memory_stats(0, &m1), CT_OK);
        assert_int_equal(ct_tensor_item(lg, &vg), CT_OK);
        int64_t w2 = cti_cuda_host_waits();
        bool steady = caching && s >= 2;
        if (w1 != w0 || (steady && m1.num_mallocs != m0.num_mallocs))
            fprintf(stderr, "%s %s step %d: %lld host waits, %llu cudaMalloc calls\n",
                    cnn ? "cnn" : "mlp", adamw ? "adamw" : "sgd", s, (long long)(w1 - w0),
                    (unsigned long long)(m1.num_mallocs - m0.num_mallocs));
        assert_int_equal(w1, w0);
        if (steady) assert_int_equal(m1.num_mallocs, m0.num_mallocs);
        assert_int_equal(w2, w1 + 1); /* the loss's read is the one wait */

        if (!(fabs(vg - vc[s]) <= 1e-4 * fmax(1.0, fabs(vc[s]))))
            fprintf(stderr, "%s %s step %d: loss GPU %.9g, CPU %.9g\n", cnn ? "cnn" : "mlp",
                    adamw ? "adamw" : "sgd", s, vg, vc[s]);
        assert_true(fabs(vg - vc[s]) <= 1e-4 * fmax(1.0, fabs(vc[s])));
        ct_scope_end(sc);
    }

    for (int64_t k = 0; k < ct_params_count(mc.params); k++) {
        const char *name;
        ct_tensor *pc = ct_params_get(mc.params, k, &name), *pg = ct_params_get(mg.params, k, NULL);
        assert_true(ct_device_eq(ct_tensor_device(pg), dev));
        double *c = tu_values(pc), *g = tu_values(pg);
        int64_t n = ct_tensor_numel(pc);
        const double rtol = cnn ? CNN_RTOL : 2e-4, atol = cnn ? CNN_ATOL : 5e-5;
        double d2 = 0, c2 = 0;
        for (int64_t i = 0; i < n; i++) {
            if (!(fabs(g[i] - c[i]) <= atol + rtol * fabs(c[i])))
                fprintf(stderr, "%s.%s[%lld]: GPU %.9g, CPU %.9g\n", cnn ? "cnn" : "mlp", name,
                        (long long)i, g[i], c[i]);
            d2 += (g[i] - c[i]) * (g[i] - c[i]);
            c2 += c[i] * c[i];
        }
        tu_assert_close(g, c, n, rtol, atol);
        if (cnn) {
            if (!(sqrt(d2) <= CNN_NORM_RTOL * sqrt(c2)))
                fprintf(stderr, "cnn.%s: |GPU - CPU| / |CPU| = %.3g\n", name, sqrt(d2 / c2));
            assert_true(sqrt(d2) <= CNN_NORM_RTOL * sqrt(c2));
        }
        free(c);
        free(g);
    }

    for (int s = 0; s < STEPS; s++) {
        ct_tensor_release(xc[s]);
        ct_tensor_release(yc[s]);
        ct_tensor_release(xg[s]);
        ct_tensor_release(yg[s]);
    }
    ct_optim_free(oc);
    ct_optim_free(og);
    model_free(&mc);
    model_free(&mg);
    ct_generator_free(gen);
}

static bool have_gpu(void) {
    if (ct_device_count(CT_DEVICE_CUDA) == 0) return false;
    ct_set_allow_tf32(false);
    return true;
}

static void test_mlp_sgd(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    run_case(false, false);
}

static void test_mlp_adamw(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    run_case(false, true);
}

static void test_cnn_sgd(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    run_case(true, false);
}

static void test_cnn_adamw(void **state) {
    (void)state;
    if (!have_gpu()) skip();
    run_case(true, true);
}

int main(void) {
    tu_seed();
    tu_cuda_devices_or_skip("cuda_train");
    cti_cuda_host_waits = tu_cuda_symbol("cti_cuda_host_waits");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_mlp_sgd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlp_adamw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cnn_sgd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cnn_adamw, setup, teardown),
    };
    return tu_run_tests(tests);
}
