/* Threads: several threads train their own small models at once, each with
 * its own parameters, optimizer, generator, scopes, grad mode and error
 * state, all reading one shared input tensor, with the CPU thread pool and
 * OpenBLAS underneath; every thread's losses and final parameters must equal,
 * bit for bit, what the same work gives when run alone on one thread.
 *
 * Built normally it checks the results; built with -Db_sanitize=thread
 * (.ci/run does) ThreadSanitizer checks that nothing in the library races
 * while it runs. CT_STRESS_STEPS and CT_STRESS_WORKERS in the environment
 * make the run longer or wider. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "tensor/tensor.h"

#include "test_fixture.h"

enum {
    MAX_WORKERS = 16,
    MAX_STEPS = 64,
    ROWS = 192,     /* rows of the shared input */
    BATCH = 64,     /* rows a step takes */
    D_IN = 128,
    HIDDEN = 1024,  /* BATCH * HIDDEN elements: elementwise ops go parallel */
    CLASSES = 10,
    IMG_BATCH = 16,
    IMG_C = 3,
    IMG_HW = 16,
    CONV_C = 16,    /* IMG_BATCH * CONV_C * 16 * 16 elements: parallel too */
};

/* Read by every thread at once, written by none. */
typedef struct shared_input {
    ct_tensor *x;   /* [ROWS, D_IN] f32 */
    ct_tensor *y;   /* [ROWS] int64 classes */
    ct_tensor *img; /* [ROWS, IMG_C, IMG_HW, IMG_HW] f32 */
} shared_input;

typedef struct worker {
    int id, steps;
    const shared_input *in;
    double losses[MAX_STEPS];
    float *params; /* every parameter's final values, in list order */
    int64_t nparams;
    char failure[512]; /* the first check that failed, "" when none */
} worker;

/* Worker threads may not call cmocka's assertions (they jump to the main
 * thread's test), so a worker records its first failure and stops. */
#define CHECK(w, cond, ...)                                                                    \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            int n_ = snprintf((w)->failure, sizeof (w)->failure, "worker %d, %s:%d: ",         \
                              (w)->id, __FILE__, __LINE__);                                    \
            snprintf((w)->failure + n_, sizeof (w)->failure - (size_t)n_, __VA_ARGS__);        \
            goto out;                                                                          \
        }                                                                                      \
    } while (0)

static int env_int(const char *name, int def, int max) {
    const char *e = getenv(name);
    int v = e && *e ? atoi(e) : def;
    return v < 1 ? def : v > max ? max : v;
}

/* One worker's training run: an MLP on rows of x and a small CNN on images,
 * their losses summed, SGD with momentum on even workers and AdamW on odd
 * ones. Everything it creates is its own; x, y and img are only read. */
static void run_worker(worker *w) {
    const int64_t k3[2] = {3, 3}, pad1[2] = {1, 1}, k2[2] = {2, 2};
    ct_generator *gen = ct_generator_new(100 + (uint64_t)w->id);
    ct_nn_linear *fc1 = ct_nn_linear_new(D_IN, HIDDEN, true, CT_F32, CT_CPU, gen);
    ct_nn_layer_norm *norm = ct_nn_layer_norm_new(1, (const int64_t[]){HIDDEN}, 1e-5, true,
                                                  true, CT_F32, CT_CPU);
    ct_nn_linear *fc2 = ct_nn_linear_new(HIDDEN, CLASSES, true, CT_F32, CT_CPU, gen);
    ct_nn_conv2d *conv = ct_nn_conv2d_new(IMG_C, CONV_C, k3, NULL, pad1, NULL, 1, true, CT_F32,
                                          CT_CPU, gen);
    ct_nn_linear *fc3 = ct_nn_linear_new(CONV_C * (IMG_HW / 2) * (IMG_HW / 2), CLASSES, true,
                                         CT_F32, CT_CPU, gen);
    ct_params *params = ct_params_new();
    ct_optimizer *opt = NULL;
    ct_scope *scope = NULL;
    FILE *devnull = NULL;
    CHECK(w, gen && fc1 && norm && fc2 && conv && fc3 && params, "setup: %s", ct_last_error());
    CHECK(w, ct_nn_linear_params(fc1, "fc1", params) == CT_OK &&
                 ct_nn_layer_norm_params(norm, "norm", params) == CT_OK &&
                 ct_nn_linear_params(fc2, "fc2", params) == CT_OK &&
                 ct_nn_conv2d_params(conv, "conv", params) == CT_OK &&
                 ct_nn_linear_params(fc3, "fc3", params) == CT_OK,
          "params: %s", ct_last_error());
    opt = w->id % 2 ? ct_optim_adamw_new(params, 1e-3, 0.9, 0.999, 1e-8, 1e-2)
                    : ct_optim_sgd_new(params, 0.05, 0.9, 0.0, 1e-4, false);
    CHECK(w, opt, "optimizer: %s", ct_last_error());

    for (int s = 0; s < w->steps; s++) {
        scope = ct_scope_begin();
        CHECK(w, scope, "scope: %s", ct_last_error());
        int64_t start = ((int64_t)(s + w->id) * 32) % (ROWS - BATCH + 1);
        ct_tensor *xb = ct_narrow(w->in->x, 0, start, BATCH);
        ct_tensor *yb = ct_narrow(w->in->y, 0, start, BATCH);
        ct_tensor *ib = ct_narrow(w->in->img, 0, start, IMG_BATCH);
        ct_tensor *yi = ct_narrow(w->in->y, 0, start, IMG_BATCH);

        ct_tensor *h = ct_relu(ct_nn_layer_norm_forward(norm, ct_nn_linear_forward(fc1, xb)));
        h = ct_dropout(h, 0.1, true, gen, NULL);
        ct_tensor *l1 = ct_cross_entropy(ct_nn_linear_forward(fc2, h), yb, NULL,
                                         CT_REDUCTION_MEAN, -100, 0.0);
        ct_tensor *c = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(conv, ib)), k2, NULL, NULL,
                                     NULL, false, NULL);
        ct_tensor *l2 = ct_cross_entropy(ct_nn_linear_forward(fc3, ct_flatten(c, 1, -1)), yi,
                                         NULL, CT_REDUCTION_MEAN, -100, 0.1);
        ct_tensor *loss = ct_add(l1, ct_mul_scalar(l2, 0.5));
        CHECK(w, loss, "step %d forward: %s", s, ct_last_error());
        CHECK(w, ct_grad_fn_name(loss) != NULL, "step %d: grad mode leaked from another thread",
              s);
        ct_optim_zero_grad(opt);
        CHECK(w, ct_backward(loss, NULL, false) == CT_OK, "step %d backward: %s", s,
              ct_last_error());
        CHECK(w, ct_optim_step(opt) == CT_OK, "step %d optimizer: %s", s, ct_last_error());
        CHECK(w, ct_tensor_item(loss, &w->losses[s]) == CT_OK, "step %d item: %s", s,
              ct_last_error());

        /* The error channel is this thread's: a failure here is reported
         * with this worker's shapes, whatever the others are doing. */
        ct_clear_error();
        ct_tensor *bad = ct_matmul(ct_tensor_ones(CT_SHAPE(w->id + 1, 3), CT_F32, CT_CPU),
                                   ct_tensor_ones(CT_SHAPE(5, 2), CT_F32, CT_CPU));
        char want[64];
        snprintf(want, sizeof want, "[%d, 3] and [5, 2]", w->id + 1);
        CHECK(w, !bad && ct_last_status() == CT_ERR_SHAPE && strstr(ct_last_error(), want),
              "step %d: expected this thread's error naming %s, got %s \"%s\"", s, want,
              ct_status_name(ct_last_status()), ct_last_error());
        ct_clear_error();

        /* Grad mode is this thread's: odd workers evaluate without it while
         * even ones record. */
        if (w->id % 2) {
            bool prev = ct_no_grad_begin();
            ct_tensor *e = ct_nn_linear_forward(fc2, h);
            ct_no_grad_end(prev);
            CHECK(w, e && ct_grad_fn_name(e) == NULL, "step %d: no-grad result has history", s);
        }

        /* The default generator, shared by all: concurrent draws reserve
         * disjoint ranges, so the values vary between runs but stay U[0,1). */
        ct_tensor *u = ct_tensor_rand(NULL, CT_SHAPE(4096), CT_F32, CT_CPU);
        ct_tensor *umax = ct_max(u), *umin = ct_min(u);
        double hi = 2, lo = -1;
        CHECK(w, umax && umin && ct_tensor_item(umax, &hi) == CT_OK &&
                     ct_tensor_item(umin, &lo) == CT_OK && lo >= 0 && hi < 1,
              "step %d: default generator draws [%g, %g]", s, lo, hi);

        /* References on a shared tensor from several threads. */
        ct_tensor *again = ct_tensor_retain(w->in->x);
        ct_tensor_release(again);
        ct_scope_end(scope);
        scope = NULL;
    }

    /* The profile table is shared; printing it from several threads while
     * others still record must be safe. */
    devnull = fopen("/dev/null", "w");
    if (devnull) ct_profile_print(devnull);

    w->nparams = 0;
    for (int64_t k = 0; k < ct_params_count(params); k++)
        w->nparams += ct_tensor_numel(ct_params_get(params, k, NULL));
    w->params = malloc((size_t)w->nparams * sizeof(float));
    CHECK(w, w->params, "out of memory");
    for (int64_t k = 0, at = 0; k < ct_params_count(params); k++) {
        ct_tensor *p = ct_params_get(params, k, NULL);
        int64_t n = ct_tensor_numel(p);
        CHECK(w, ct_tensor_copy_to_host(p, w->params + at, (size_t)n * sizeof(float)) == CT_OK,
              "copy: %s", ct_last_error());
        at += n;
    }
out:
    if (devnull) fclose(devnull);
    ct_scope_end(scope);
    ct_optim_free(opt);
    ct_params_free(params);
    ct_nn_linear_free(fc1);
    ct_nn_layer_norm_free(norm);
    ct_nn_linear_free(fc2);
    ct_nn_conv2d_free(conv);
    ct_nn_linear_free(fc3);
    ct_generator_free(gen);
}

static void *worker_main(void *arg) {
    run_worker(arg);
    return NULL;
}

static shared_input make_input(void) {
    ct_generator *g = ct_generator_new(7);
    shared_input in = {
        ct_tensor_randn(g, CT_SHAPE(ROWS, D_IN), CT_F32, CT_CPU),
        ct_tensor_randint(g, 0, CLASSES, CT_SHAPE(ROWS), CT_I64, CT_CPU),
        ct_tensor_randn(g, CT_SHAPE(ROWS, IMG_C, IMG_HW, IMG_HW), CT_F32, CT_CPU),
    };
    ct_generator_free(g);
    assert_non_null(in.x);
    assert_non_null(in.y);
    assert_non_null(in.img);
    return in;
}

static void free_input(shared_input *in) {
    ct_tensor_release(in->x);
    ct_tensor_release(in->y);
    ct_tensor_release(in->img);
}

static void test_workers_match_one_thread(void **state) {
    (void)state;
    int nworkers = env_int("CT_STRESS_WORKERS", 4, MAX_WORKERS);
    int steps = env_int("CT_STRESS_STEPS", 3, MAX_STEPS);
    /* A pool of three even on a two-core machine, so jobs really split. */
    int prev_threads = ct_get_num_threads();
    assert_int_equal(ct_set_num_threads(3), CT_OK);
    bool prev_profile = ct_profile_enabled();
    ct_set_profile(true);
    shared_input in = make_input();

    worker alone[MAX_WORKERS], together[MAX_WORKERS];
    memset(alone, 0, sizeof alone);
    memset(together, 0, sizeof together);
    for (int k = 0; k < nworkers; k++) {
        alone[k] = (worker){.id = k, .steps = steps, .in = &in};
        run_worker(&alone[k]);
        if (alone[k].failure[0]) fail_msg("alone: %s", alone[k].failure);
    }

    pthread_t threads[MAX_WORKERS];
    for (int k = 0; k < nworkers; k++) {
        together[k] = (worker){.id = k, .steps = steps, .in = &in};
        assert_int_equal(pthread_create(&threads[k], NULL, worker_main, &together[k]), 0);
    }
    for (int k = 0; k < nworkers; k++) assert_int_equal(pthread_join(threads[k], NULL), 0);

    for (int k = 0; k < nworkers; k++) {
        worker *a = &alone[k], *t = &together[k];
        if (t->failure[0]) fail_msg("threads: %s", t->failure);
        for (int s = 0; s < steps; s++)
            if (memcmp(&a->losses[s], &t->losses[s], sizeof(double)) != 0)
                fail_msg("worker %d step %d: loss %.17g alone, %.17g among threads", k, s,
                         a->losses[s], t->losses[s]);
        assert_int_equal(a->nparams, t->nparams);
        for (int64_t i = 0; i < a->nparams; i++)
            if (memcmp(&a->params[i], &t->params[i], sizeof(float)) != 0)
                fail_msg("worker %d parameter element %lld: %.9g alone, %.9g among threads", k,
                         (long long)i, a->params[i], t->params[i]);
        free(a->params);
        free(t->params);
    }
    free_input(&in);
    ct_set_profile(prev_profile);
    ct_profile_reset();
    assert_int_equal(ct_set_num_threads(prev_threads), CT_OK);
}

/* A handle made inside one thread's scope and retained for another: the other
 * thread's release drops its own reference while the scope ends, in either
 * order, and the tensor is freed exactly once. */
typedef struct handoff {
    ct_tensor *t;
    double sum;
    ct_status st;
} handoff;

static void *use_and_release(void *arg) {
    handoff *h = arg;
    ct_tensor *s = ct_sum(h->t, CT_NONE, false);
    h->st = s ? ct_tensor_item(s, &h->sum) : ct_last_status();
    ct_tensor_release(s);
    ct_tensor_release(h->t);
    return NULL;
}

static void test_handoff_between_threads(void **state) {
    (void)state;
    for (int round = 0; round < 8; round++) {
        ct_scope *scope = ct_scope_begin();
        assert_non_null(scope);
        handoff h = {.t = ct_tensor_retain(ct_tensor_ones(CT_SHAPE(70000), CT_F32, CT_CPU))};
        assert_non_null(h.t);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, use_and_release, &h), 0);
        if (round % 2) ct_scope_end(scope);
        assert_int_equal(pthread_join(th, NULL), 0);
        if (round % 2 == 0) ct_scope_end(scope);
        assert_int_equal(h.st, CT_OK);
        assert_true(h.sum == 70000.0);
    }
}

/* Threads that start using the library at the same moment all see it
 * initialized once, and each its own error state. */
static void *first_calls(void *arg) {
    int *ok = arg;
    ct_scope *s = ct_scope_begin();
    ct_tensor *a = ct_tensor_ones(CT_SHAPE(2, 2), CT_F32, CT_CPU);
    ct_tensor *r = ct_requires_grad_(a, true) == CT_OK ? ct_sum(ct_mul(a, a), CT_NONE, false)
                                                       : NULL;
    *ok = s && r && ct_backward(r, NULL, false) == CT_OK && ct_last_status() == CT_OK;
    ct_scope_end(s);
    return NULL;
}

static void test_concurrent_first_use(void **state) {
    (void)state;
    pthread_t th[8];
    int ok[8] = {0};
    for (int k = 0; k < 8; k++) assert_int_equal(pthread_create(&th[k], NULL, first_calls, &ok[k]), 0);
    for (int k = 0; k < 8; k++) assert_int_equal(pthread_join(th[k], NULL), 0);
    for (int k = 0; k < 8; k++) assert_true(ok[k]);
}

/* Library-wide switches and the profile table from several threads: ops
 * record into the table while others print it. */
static void *profile_and_print(void *arg) {
    int *ok = arg;
    FILE *devnull = fopen("/dev/null", "w");
    *ok = devnull != NULL;
    for (int i = 0; i < 50 && *ok; i++) {
        ct_tensor *t = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
        ct_tensor *u = ct_add(t, t);
        *ok = u != NULL;
        ct_tensor_release(u);
        ct_tensor_release(t);
        ct_profile_print(devnull);
        ct_set_allow_tf32(i % 2);
        (void)ct_trace_enabled();
        (void)ct_get_num_threads();
    }
    if (devnull) fclose(devnull);
    return NULL;
}

static void test_profile_from_threads(void **state) {
    (void)state;
    bool prev = ct_profile_enabled(), tf32 = ct_allow_tf32();
    ct_set_profile(true);
    pthread_t th[4];
    int ok[4] = {0};
    for (int k = 0; k < 4; k++)
        assert_int_equal(pthread_create(&th[k], NULL, profile_and_print, &ok[k]), 0);
    for (int k = 0; k < 4; k++) assert_int_equal(pthread_join(th[k], NULL), 0);
    for (int k = 0; k < 4; k++) assert_true(ok[k]);
    ct_set_profile(prev);
    ct_set_allow_tf32(tf32);
    ct_profile_reset();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        /* First, so that library init and the first autograd record happen
         * on several threads at once. */
        cmocka_unit_test_setup_teardown(test_concurrent_first_use, setup, teardown),
        cmocka_unit_test_setup_teardown(test_workers_match_one_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handoff_between_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_profile_from_threads, setup, teardown),
    };
    return tu_run_tests(tests);
}
