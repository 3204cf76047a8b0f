/* CUDA graphs (ct_cuda_graph_*, src/backends/cuda/graph.c; the rules are
 * docs/CUDA_GRAPHS.md): work captured once and replayed gives the bits the
 * same calls give eagerly on the same inputs (elementwise ops and matmul,
 * an MLP training step with autograd and SGD, random ops whose draws a
 * replay renews), new data copied into static inputs changes what a replay
 * computes, the private pool keeps the graph's blocks from everyone else
 * and returns them on free, and every call that cannot be captured is
 * refused with its status and message, after which the library runs ops
 * and captures again. The program is skipped without a usable GPU.
 *
 * Each capture follows one eager run of the same calls (the warmup the
 * rules ask for), whose temporaries are released first, so the allocator's
 * cache holds most blocks the capture asks for; what it lacks comes from
 * cudaMalloc during the capture. A test that fails with a capture open
 * leaves it to the teardown to end, so the next tests start clean. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>

#include "test_util.h"

#include "cuda_module.h"
#include "cuda_test_util.h"
#include "test_fixture.h"

#define DEV CT_CUDA(0)

/* src/backends/cuda/stream.c, looked up in the module. */
static int64_t (*cti_cuda_host_waits)(void);

/* CT_CUDA_NO_CACHE=1 (compute-sanitizer's runs) turns the caching
 * allocator off; a capture then allocates every block anew. */
static bool allocator_caches(void) {
    const char *e = getenv("CT_CUDA_NO_CACHE");
    return !(e && *e && strcmp(e, "0") != 0);
}

/* The graph of the last begin_capture, until graph_free: the teardown
 * frees it (ending its capture) when a failed test left it. */
static ct_cuda_graph *open_graph;

static ct_cuda_graph *begin_capture(void) {
    ct_cuda_graph *g = ct_cuda_graph_capture_begin(0);
    if (!g) fprintf(stderr, "unexpected failure: %s\n", ct_last_error());
    assert_non_null(g);
    open_graph = g;
    return g;
}

static void graph_free(ct_cuda_graph *g) {
    if (g == open_graph) open_graph = NULL;
    ct_cuda_graph_free(g);
}

static int teardown_graph(void **state) {
    if (open_graph) {
        ct_cuda_graph_free(open_graph);
        open_graph = NULL;
    }
    return teardown(state);
}

/* A GPU tensor of fresh uniform values; *vals (if not NULL) gets them. */
static ct_tensor *gpu_rand(int ndim, const int64_t *shape, double lo, double hi, double **vals) {
    ct_tensor *c = checked(tu_rand(ndim, shape, CT_F32, lo, hi, vals));
    ct_tensor *g = checked(ct_to_device(c, DEV));
    ct_tensor_release(c);
    return g;
}

/* Gives the static input t fresh values (returned, caller frees). */
static double *refill(ct_tensor *t, double lo, double hi) {
    double *v;
    ct_tensor *c = checked(tu_rand(ct_tensor_ndim(t), ct_tensor_shape(t), ct_tensor_dtype(t), lo,
                                   hi, &v));
    ok(ct_copy_(t, c));
    ct_tensor_release(c);
    return v;
}

/* t's bytes on the host (caller frees). */
static unsigned char *bytes_of(const ct_tensor *t, size_t *n) {
    *n = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    unsigned char *b = malloc(*n ? *n : 1);
    ok(ct_tensor_copy_to_host(t, b, *n ? *n : 1));
    return b;
}

static void assert_same_bits(const ct_tensor *a, const ct_tensor *b, const char *what) {
    assert_int_equal(ct_tensor_dtype(a), ct_tensor_dtype(b));
    assert_int_equal(ct_tensor_numel(a), ct_tensor_numel(b));
    size_t na, nb;
    unsigned char *x = bytes_of(a, &na), *y = bytes_of(b, &nb);
    size_t es = ct_dtype_size(ct_tensor_dtype(a));
    for (size_t i = 0; i < na; i += es)
        if (memcmp(x + i, y + i, es)) {
            fprintf(stderr, "%s: element %zu differs between the replay and the eager run\n",
                    what, i / es);
            break;
        }
    assert_memory_equal(x, y, na);
    free(x);
    free(y);
}

static bool same_bits(const ct_tensor *a, const ct_tensor *b) {
    size_t na, nb;
    unsigned char *x = bytes_of(a, &na), *y = bytes_of(b, &nb);
    bool same = na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

/* ---- the library after a refusal ---------------------------------------------------------- */

static ct_tensor *double_plus_one(ct_tensor *a) {
    return ct_add_scalar(ct_mul_scalar(a, 2.0), 1.0);
}

/* Runs ops, reads a result, and captures and replays again. */
static void assert_usable(void) {
    double *va;
    ct_tensor *a = gpu_rand(CT_SHAPE(300), -1, 1, &va);
    ct_scope *s = ct_scope_begin();
    ct_tensor *e = checked(double_plus_one(a));
    double v = 0;
    ok(ct_tensor_item(ct_select(e, 0, 7), &v));
    assert_true(v == (double)(2.0f * (float)va[7] + 1.0f));
    ct_scope_end(s);
    ct_cuda_graph *g = begin_capture();
    s = ct_scope_begin();
    ct_tensor *out = ct_keep(checked(double_plus_one(a)));
    ct_scope_end(s);
    ok(ct_cuda_graph_capture_end(g));
    ok(ct_fill_(out, NAN));
    ok(ct_cuda_graph_replay(g));
    double *vo = tu_values(out);
    for (int i = 0; i < 300; i++) assert_true(vo[i] == (double)(2.0f * (float)va[i] + 1.0f));
    free(vo);
    free(va);
    graph_free(g);
    ct_tensor_release(out);
    ct_tensor_release(a);
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
}

/* ---- elementwise ops and a matrix product --------------------------------------------------- */

#define N_ 64
#define K_ 96
#define M_ 48

/* 0.5 relu(a b + bias) - tanh(a b), [N, M]. */
static ct_tensor *ops_chain(ct_tensor *a, ct_tensor *b, ct_tensor *bias) {
    ct_tensor *m = ct_matmul(a, b);
    return ct_sub(ct_mul_scalar(ct_relu(ct_add(m, bias)), 0.5), ct_tanh(m));
}

static void test_ops_replay(void **state) {
    (void)state;
    ct_tensor *a = gpu_rand(CT_SHAPE(N_, K_), -1, 1, NULL);
    ct_tensor *b = gpu_rand(CT_SHAPE(K_, M_), -1, 1, NULL);
    ct_tensor *bias = gpu_rand(CT_SHAPE(M_), -1, 1, NULL);
    ct_scope *s = ct_scope_begin();
    checked(ops_chain(a, b, bias)); /* warmup */
    ct_scope_end(s);

    ct_cuda_graph *g = begin_capture();
    s = ct_scope_begin();
    ct_tensor *out = ct_keep(checked(ops_chain(a, b, bias)));
    ct_scope_end(s); /* the temporaries go back to the graph's pool */
    ok(ct_cuda_graph_capture_end(g));

    for (int r = 0; r < 4; r++) {
        double *va = refill(a, -1, 1), *vb = refill(b, -1, 1), *vbias = refill(bias, -1, 1);
        ok(ct_fill_(out, NAN)); /* poisoned: the replay must write every element */
        int64_t w0 = cti_cuda_host_waits();
        ok(ct_cuda_graph_replay(g));
        assert_int_equal(cti_cuda_host_waits(), w0); /* a replay queues, never waits */
        s = ct_scope_begin();
        assert_same_bits(out, checked(ops_chain(a, b, bias)), "ops");
        ct_scope_end(s);
        double *vo = tu_values(out);
        for (int i = 0; i < N_; i++)
            for (int j = 0; j < M_; j++) {
                double m = 0;
                for (int k = 0; k < K_; k++) m += va[i * K_ + k] * vb[k * M_ + j];
                double ref = 0.5 * fmax(m + vbias[j], 0.0) - tanh(m);
                if (!(fabs(vo[i * M_ + j] - ref) <= 1e-4 + 1e-4 * fabs(ref)))
                    fprintf(stderr, "ops[%d,%d]: replay %.9g, float64 %.9g\n", i, j,
                            vo[i * M_ + j], ref);
                assert_true(fabs(vo[i * M_ + j] - ref) <= 1e-4 + 1e-4 * fabs(ref));
            }
        free(vo);
        free(va);
        free(vb);
        free(vbias);
    }
    graph_free(g);
    ct_tensor_release(out);
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(bias);
}

/* ---- a training step ------------------------------------------------------------------------- */

#define BATCH 64
#define STEPS 5

typedef struct net {
    bool cnn;
    ct_nn_linear *fc1, *fc2;
    ct_nn_conv2d *conv;
    ct_params *params;
    ct_optimizer *opt;
} net;

/* MLP 784-128-10, or conv 1->8 3x3 pad 1, relu, max-pool 2, linear
 * 1568->10; SGD with momentum and weight decay. Nets made from generators
 * of one seed are equal. */
static void net_init(net *m, bool cnn, uint64_t seed) {
    memset(m, 0, sizeof *m);
    ct_generator *gen = ct_generator_new(seed);
    assert_non_null(gen);
    m->cnn = cnn;
    m->params = ct_params_new();
    assert_non_null(m->params);
    if (cnn) {
        const int64_t k3[2] = {3, 3}, pad1[2] = {1, 1};
        m->conv = ct_nn_conv2d_new(1, 8, k3, NULL, pad1, NULL, 1, true, CT_F32, DEV, gen);
        m->fc2 = ct_nn_linear_new(8 * 14 * 14, 10, true, CT_F32, DEV, gen);
        assert_non_null(m->conv);
        assert_non_null(m->fc2);
        ok(ct_nn_conv2d_params(m->conv, "conv", m->params));
        ok(ct_nn_linear_params(m->fc2, "fc", m->params));
    } else {
        m->fc1 = ct_nn_linear_new(28 * 28, 128, true, CT_F32, DEV, gen);
        m->fc2 = ct_nn_linear_new(128, 10, true, CT_F32, DEV, gen);
        assert_non_null(m->fc1);
        assert_non_null(m->fc2);
        ok(ct_nn_linear_params(m->fc1, "fc1", m->params));
        ok(ct_nn_linear_params(m->fc2, "fc2", m->params));
    }
    m->opt = ct_optim_sgd_new(m->params, 0.05, 0.9, 0, 1e-4, false);
    assert_non_null(m->opt);
    ct_generator_free(gen);
}

static void net_free(net *m) {
    ct_optim_free(m->opt);
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
    ct_nn_conv2d_free(m->conv);
    ct_params_free(m->params);
}

static ct_tensor *net_forward(net *m, ct_tensor *x) {
    if (!m->cnn) return ct_nn_linear_forward(m->fc2, ct_relu(ct_nn_linear_forward(m->fc1, x)));
    const int64_t k2[2] = {2, 2};
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    return ct_nn_linear_forward(m->fc2, ct_flatten(x, 1, -1));
}

/* zero_grad, loss = cross_entropy(net(x), y), backward, step; the loss (in
 * the open scope). The zero_grad inside the step lets backward make new
 * gradients, in the graph's pool when captured. */
static ct_tensor *train_step(net *m, ct_tensor *x, ct_tensor *y) {
    ct_optim_zero_grad(m->opt);
    ct_tensor *loss = ct_cross_entropy(net_forward(m, x), y, NULL, CT_REDUCTION_MEAN, -100, 0.0);
    if (!loss || ct_backward(loss, NULL, false) != CT_OK || ct_optim_step(m->opt) != CT_OK)
        return NULL;
    return loss;
}

static void step_case(bool cnn) {
    uint64_t seed = tu_next();
    net eager, graphed;
    net_init(&eager, cnn, seed);
    net_init(&graphed, cnn, seed);
    ct_tensor *x[STEPS], *y[STEPS];
    for (int s = 0; s < STEPS; s++) {
        x[s] = cnn ? gpu_rand(CT_SHAPE(BATCH, 1, 28, 28), -2, 2, NULL)
                   : gpu_rand(CT_SHAPE(BATCH, 28 * 28), -2, 2, NULL);
        ct_tensor *yc = checked(tu_rand(CT_SHAPE(BATCH), CT_I64, 0, 10, NULL));
        y[s] = checked(ct_to_device(yc, DEV));
        ct_tensor_release(yc);
    }
    /* Step 0 eagerly on both: the warmup. */
    ct_tensor *loss_eager[STEPS] = {NULL};
    for (int s = 0; s < STEPS; s++) {
        ct_scope *sc = ct_scope_begin();
        loss_eager[s] = ct_keep(checked(train_step(&eager, x[s], y[s])));
        ct_scope_end(sc);
    }
    ct_scope *sc = ct_scope_begin();
    checked(train_step(&graphed, x[0], y[0]));
    ct_scope_end(sc);

    /* Static inputs, allocated before the capture. */
    ct_tensor *sx = checked(ct_tensor_zeros_like(x[0])), *sy = checked(ct_tensor_zeros_like(y[0]));
    ct_cuda_graph *g = begin_capture();
    sc = ct_scope_begin();
    ct_tensor *loss = ct_keep(checked(train_step(&graphed, sx, sy)));
    ct_scope_end(sc);
    ok(ct_cuda_graph_capture_end(g));

    for (int s = 1; s < STEPS; s++) {
        ok(ct_copy_(sx, x[s]));
        ok(ct_copy_(sy, y[s]));
        sc = ct_scope_begin();
        ok(ct_fill_(ct_detach(loss), NAN)); /* poisoned: the replay writes it */
        ct_scope_end(sc);
        int64_t w0 = cti_cuda_host_waits();
        ok(ct_cuda_graph_replay(g));
        assert_int_equal(cti_cuda_host_waits(), w0);
        double le = 0, lg = 0;
        ok(ct_tensor_item(loss_eager[s], &le));
        ok(ct_tensor_item(loss, &lg));
        if (cnn) {
            /* cuDNN's weight gradient may add with atomics: float32 rounding. */
            if (!(fabs(lg - le) <= 1e-5 * fmax(1.0, fabs(le))))
                fprintf(stderr, "cnn step %d: loss replay %.9g, eager %.9g\n", s, lg, le);
            assert_true(fabs(lg - le) <= 1e-5 * fmax(1.0, fabs(le)));
        } else {
            assert_same_bits(loss, loss_eager[s], "mlp loss");
        }
    }
    for (int64_t k = 0; k < ct_params_count(eager.params); k++) {
        const char *name;
        ct_tensor *pe = ct_params_get(eager.params, k, &name);
        ct_tensor *pg = ct_params_get(graphed.params, k, NULL);
        if (!cnn) {
            assert_same_bits(pg, pe, name);
            continue;
        }
        double *ve = tu_values(pe), *vg = tu_values(pg);
        tu_assert_close(vg, ve, ct_tensor_numel(pe), 1e-4, 1e-6);
        free(ve);
        free(vg);
    }
    graph_free(g);
    ct_tensor_release(loss);
    ct_tensor_release(sx);
    ct_tensor_release(sy);
    for (int s = 0; s < STEPS; s++) {
        ct_tensor_release(x[s]);
        ct_tensor_release(y[s]);
        ct_tensor_release(loss_eager[s]);
    }
    net_free(&eager);
    net_free(&graphed);
}

static void test_mlp_step_bit_for_bit(void **state) {
    (void)state;
    step_case(false);
}

static void test_cnn_step(void **state) {
    (void)state;
    step_case(true);
}

/* ---- random ops ------------------------------------------------------------------------------ */

enum { R_DROPOUT, R_RANDN, R_MULTINOMIAL, R_SDPA, R_DQ, R_DK, R_DV, R_N };

typedef struct rand_inputs {
    ct_tensor *x, *probs, *q, *k, *v; /* q, k, v require grad */
} rand_inputs;

/* Dropout and multinomial from g1, randn and the attention's dropout from
 * g2, and the attention's backward (which draws the forward's mask again):
 * out[R_N], kept out of the open scope. */
static void random_ops(rand_inputs *in, ct_generator *g1, ct_generator *g2, ct_tensor **out) {
    out[R_DROPOUT] = ct_keep(checked(ct_dropout(in->x, 0.4, true, g1, NULL)));
    out[R_RANDN] = ct_keep(checked(ct_tensor_randn(g2, CT_SHAPE(1001), CT_F32, DEV)));
    out[R_MULTINOMIAL] = ct_keep(checked(ct_multinomial(in->probs, 16, true, g1)));
    ct_zero_grad(in->q);
    ct_zero_grad(in->k);
    ct_zero_grad(in->v);
    out[R_SDPA] = ct_keep(
        checked(ct_scaled_dot_product_attention(in->q, in->k, in->v, NULL, 0.25, false, 0, g2)));
    ok(ct_backward(checked(ct_sum(out[R_SDPA], CT_NONE, false)), NULL, false));
    out[R_DQ] = ct_grad(in->q);
    out[R_DK] = ct_grad(in->k);
    out[R_DV] = ct_grad(in->v);
}

/* Inputs from src (attention) and probs (multinomial), the same for every
 * call with the same two. */
static void rand_inputs_make(rand_inputs *in, ct_tensor *src, ct_tensor *probs) {
    in->x = checked(ct_tensor_ones(CT_SHAPE(4099), CT_F32, DEV));
    in->probs = checked(ct_clone(probs));
    in->q = checked(ct_clone(src));
    in->k = checked(ct_mul_scalar(src, 0.5));
    in->v = checked(ct_neg(src));
    ok(ct_requires_grad_(in->q, true));
    ok(ct_requires_grad_(in->k, true));
    ok(ct_requires_grad_(in->v, true));
}

static void rand_inputs_free(rand_inputs *in) {
    ct_tensor_release(in->x);
    ct_tensor_release(in->probs);
    ct_tensor_release(in->q);
    ct_tensor_release(in->k);
    ct_tensor_release(in->v);
}

/* Each replay draws what the next eager call would: the same bits as an
 * eager run from the same generator states, and new numbers every time. */
static void test_random_ops_renew_draws(void **state) {
    (void)state;
    uint64_t s1 = tu_next(), s2 = tu_next();
    ct_generator *g1 = ct_generator_new(s1), *g2 = ct_generator_new(s2);
    ct_generator *h1 = ct_generator_new(s1), *h2 = ct_generator_new(s2);
    ct_tensor *src = gpu_rand(CT_SHAPE(1, 2, 8, 16), -1, 1, NULL);
    ct_tensor *probs = gpu_rand(CT_SHAPE(6, 10), 0.1, 1, NULL);
    rand_inputs gin, ein;
    rand_inputs_make(&gin, src, probs);
    rand_inputs_make(&ein, src, probs);
    ct_tensor_release(src);
    ct_tensor_release(probs);
    ct_tensor *out[R_N], *ref[R_N], *prev[R_N] = {NULL};
    ct_scope *sc = ct_scope_begin();
    random_ops(&gin, g1, g2, out); /* warmup */
    ct_scope_end(sc);
    for (int i = 0; i < R_SDPA + 1; i++) ct_tensor_release(out[i]);

    uint64_t o1 = ct_generator_offset(g1), o2 = ct_generator_offset(g2);
    ct_cuda_graph *g = begin_capture();
    sc = ct_scope_begin();
    random_ops(&gin, g1, g2, out);
    ct_scope_end(sc);
    ok(ct_cuda_graph_capture_end(g));
    /* The eager run starts where the capture did; so do the replays. */
    ct_generator_set_offset(g1, o1);
    ct_generator_set_offset(g2, o2);
    ct_generator_set_offset(h1, o1);
    ct_generator_set_offset(h2, o2);
    for (int r = 0; r < 3; r++) {
        ok(ct_cuda_graph_replay(g));
        sc = ct_scope_begin();
        random_ops(&ein, h1, h2, ref);
        static const char *const names[R_N] = {"dropout", "randn", "multinomial", "sdpa",
                                               "sdpa dq", "sdpa dk", "sdpa dv"};
        for (int i = 0; i < R_N; i++) assert_same_bits(out[i], ref[i], names[i]);
        /* new numbers at every replay */
        if (r > 0) {
            assert_false(same_bits(out[R_DROPOUT], prev[R_DROPOUT]));
            assert_false(same_bits(out[R_RANDN], prev[R_RANDN]));
            assert_false(same_bits(out[R_SDPA], prev[R_SDPA]));
        }
        for (int i = 0; i < R_SDPA + 1; i++) {
            ct_tensor_release(prev[i]);
            prev[i] = ct_keep(checked(ct_clone(out[i]))); /* past this scope's end */
            ct_tensor_release(ref[i]);
        }
        ct_scope_end(sc);
    }
    assert_int_equal(ct_generator_offset(g1), ct_generator_offset(h1));
    assert_int_equal(ct_generator_offset(g2), ct_generator_offset(h2));
    graph_free(g);
    for (int i = 0; i < R_SDPA + 1; i++) {
        ct_tensor_release(out[i]);
        ct_tensor_release(prev[i]);
    }
    rand_inputs_free(&gin);
    rand_inputs_free(&ein);
    ct_generator_free(g1);
    ct_generator_free(g2);
    ct_generator_free(h1);
    ct_generator_free(h2);
}

/* Reseeding inside the capture cannot be replayed: capture_end says so. */
static void test_reseed_during_capture(void **state) {
    (void)state;
    ct_generator *gen = ct_generator_new(tu_next());
    ct_tensor *x = checked(ct_tensor_ones(CT_SHAPE(512), CT_F32, DEV));
    ct_scope *sc = ct_scope_begin();
    checked(ct_dropout(x, 0.5, true, gen, NULL));
    checked(ct_dropout(x, 0.5, true, gen, NULL));
    ct_scope_end(sc);
    ct_cuda_graph *g = begin_capture();
    sc = ct_scope_begin();
    checked(ct_dropout(x, 0.5, true, gen, NULL));
    ct_generator_set_seed(gen, 5);
    checked(ct_dropout(x, 0.5, true, gen, NULL));
    ct_scope_end(sc);
    tu_assert_error(ct_cuda_graph_capture_end(g), CT_ERR_CAPTURE, "ct_cuda_graph_capture_end",
                    "the capture on cuda:0 failed", "reseeded", "before capturing");
    graph_free(g);
    ct_tensor_release(x);
    ct_generator_free(gen);
    assert_usable();
}

/* ---- refusals -------------------------------------------------------------------------------- */

/* The capture of g failed with the refusal's words; the graph can only be
 * freed, and the library goes on. */
static void assert_capture_failed(ct_cuda_graph *g, const char *word1, const char *word2) {
    tu_assert_error(ct_cuda_graph_capture_end(g), CT_ERR_CAPTURE, "ct_cuda_graph_capture_end",
                    "the capture on cuda:0 failed", word1, word2);
    tu_assert_error(ct_cuda_graph_replay(g), CT_ERR_CAPTURE, "ct_cuda_graph_replay",
                    "capture failed", "can only be freed", word1);
    tu_assert_error(ct_cuda_graph_capture_end(g), CT_ERR_CAPTURE, "not being captured",
                    "ended already and failed");
    graph_free(g);
    assert_usable();
}

static void test_refused_host_syncs(void **state) {
    (void)state;
    ct_tensor *one = checked(ct_tensor_full(CT_SHAPE(1), 3.0, CT_F32, DEV));
    ct_tensor *w = gpu_rand(CT_SHAPE(10, 4), -1, 1, NULL);
    ct_tensor *idx = checked(ct_tensor_zeros(CT_SHAPE(5), CT_I64, DEV));
    ct_tensor *gidx = checked(ct_tensor_zeros(CT_SHAPE(10, 2), CT_I64, DEV));
    ct_scope *sc = ct_scope_begin();
    checked(ct_gather(w, 1, gidx)); /* warmup */
    ct_scope_end(sc);
    double v = 0;
    float buf[1];

    ct_cuda_graph *g = begin_capture();
    tu_assert_error(ct_tensor_item(one, &v), CT_ERR_CAPTURE, "ct_copy_",
                    "a copy between the host and cuda:0 cannot be captured");
    assert_capture_failed(g, "ct_copy_", "a copy between the host");

    g = begin_capture();
    tu_assert_error(ct_tensor_copy_to_host(one, buf, sizeof buf), CT_ERR_CAPTURE, "ct_copy_",
                    "cannot be captured");
    assert_capture_failed(g, "ct_copy_", "static input");

    g = begin_capture();
    tu_assert_error(ct_cuda_synchronize(0), CT_ERR_CAPTURE, "ct_cuda_synchronize",
                    "waits for the device, which cannot be captured", "replay");
    assert_capture_failed(g, "ct_cuda_synchronize", "waits for the device");

    /* The index check of gather reads a flag back: a host sync. */
    g = begin_capture();
    sc = ct_scope_begin();
    tu_assert_null_error(ct_gather(w, 1, gidx), CT_ERR_CAPTURE, "ct_gather",
                         "checks its indices on the host", "cannot be captured");
    ct_scope_end(sc);
    assert_capture_failed(g, "ct_gather", "checks its indices");

    ct_tensor_release(one);
    ct_tensor_release(w);
    ct_tensor_release(idx);
    ct_tensor_release(gidx);
}

/* Embedding and its backward are captured with their index check on the
 * device: a replay with a bad index in the static input reports it at the
 * first wait after it, and a later replay with good indices is clean. */
static void test_embedding_replay_checks_indices(void **state) {
    (void)state;
    double *wv, *gv;
    ct_tensor *w = gpu_rand(CT_SHAPE(10, 4), -1, 1, &wv);
    ct_tensor *go = gpu_rand(CT_SHAPE(5, 4), -1, 1, &gv);
    int64_t good[5] = {0, 9, 3, 3, 1}, other[5] = {2, 2, 8, 0, 7}, bad[5] = {1, 2, 10, 4, -1};
    ct_tensor *idx = checked(ct_tensor_from_data_on(good, CT_I64, CT_SHAPE(5), DEV));
    ct_scope *sc = ct_scope_begin();
    checked(ct_embedding(w, idx)); /* warmup */
    checked(ct_embedding_backward(go, idx, 10, -1));
    ct_scope_end(sc);

    ct_cuda_graph *g = begin_capture();
    sc = ct_scope_begin();
    ct_tensor *out = ct_keep(checked(ct_embedding(w, idx)));
    ct_tensor *dw = ct_keep(checked(ct_embedding_backward(go, idx, 10, -1)));
    ct_scope_end(sc);
    ok(ct_cuda_graph_capture_end(g));

    ct_tensor *src = checked(ct_tensor_from_data(other, CT_I64, CT_SHAPE(5)));
    ok(ct_copy_(idx, src));
    ct_tensor_release(src);
    ok(ct_cuda_graph_replay(g));
    float o[20], d[40];
    ok(ct_tensor_copy_to_host(out, o, sizeof o));
    ok(ct_tensor_copy_to_host(dw, d, sizeof d));
    for (int i = 0; i < 5; i++)
        for (int k = 0; k < 4; k++) assert_true(o[i * 4 + k] == (float)wv[other[i] * 4 + k]);
    for (int r = 0; r < 10; r++)
        for (int k = 0; k < 4; k++) {
            double want = 0;
            for (int i = 0; i < 5; i++)
                if (other[i] == r) want += (float)gv[i * 4 + k];
            assert_true(fabs(d[r * 4 + k] - want) <= 1e-6);
        }

    src = checked(ct_tensor_from_data(bad, CT_I64, CT_SHAPE(5)));
    ok(ct_copy_(idx, src));
    ct_tensor_release(src);
    ok(ct_cuda_graph_replay(g));
    tu_assert_error(ct_cuda_synchronize(0), CT_ERR_INDEX, "ct_embedding", "index 10 is out of range",
                    "for 10 embeddings (expected 0..9)", "position 2", "CUDA graph replay",
                    "ct_cuda_synchronize");
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);

    src = checked(ct_tensor_from_data(good, CT_I64, CT_SHAPE(5)));
    ok(ct_copy_(idx, src));
    ct_tensor_release(src);
    ok(ct_cuda_graph_replay(g));
    ok(ct_cuda_synchronize(0));
    graph_free(g);
    ct_tensor_release(out);
    ct_tensor_release(dw);
    ct_tensor_release(w);
    ct_tensor_release(go);
    ct_tensor_release(idx);
    free(wv);
    free(gv);
}

static void test_refused_cpu_tensors(void **state) {
    (void)state;
    ct_tensor *c = checked(tu_rand(CT_SHAPE(8), CT_F32, -1, 1, NULL));
    ct_tensor *d = gpu_rand(CT_SHAPE(8), -1, 1, NULL);
    ct_scope *sc = ct_scope_begin();
    checked(ct_add(d, d));
    ct_scope_end(sc);

    /* A CPU kernel would run once, now. */
    ct_cuda_graph *g = begin_capture();
    sc = ct_scope_begin();
    tu_assert_null_error(ct_add(c, c), CT_ERR_CAPTURE, "ct_add: [8] float32 cpu:",
                         "this thread captures a CUDA graph on cuda:0", "never at replay");
    ct_scope_end(sc);
    assert_capture_failed(g, "ct_add: [8] float32 cpu:", "never at replay");

    /* So would a CPU random fill, drawing once. */
    g = begin_capture();
    sc = ct_scope_begin();
    tu_assert_null_error(ct_tensor_randn(NULL, CT_SHAPE(5), CT_F32, CT_CPU), CT_ERR_CAPTURE,
                         "[5] float32 cpu:", "this thread captures a CUDA graph on cuda:0");
    ct_scope_end(sc);
    assert_capture_failed(g, "[5] float32 cpu:", "never at replay");

    /* New inputs are copied before the replay, not inside the graph. */
    g = begin_capture();
    tu_assert_error(ct_copy_(d, c), CT_ERR_CAPTURE, "ct_copy_",
                    "a copy between the host and cuda:0 cannot be captured", "static input");
    sc = ct_scope_begin();
    tu_assert_null_error(ct_to_device(c, DEV), CT_ERR_CAPTURE, "a copy between the host");
    ct_scope_end(sc);
    assert_capture_failed(g, "ct_copy_", "a copy between the host");

    ct_tensor_release(c);
    ct_tensor_release(d);
}

/* A block the cache does not hold comes from cudaMalloc during the
 * capture and is the graph's; one the device cannot hold fails the capture
 * with the size, and the library goes on. */
static void test_allocation_during_capture(void **state) {
    (void)state;
    ok(ct_cuda_empty_cache(0));
    const int64_t n = (64 << 20) / 4 + 1000;
    ct_tensor *a = checked(ct_tensor_ones(CT_SHAPE(n), CT_F32, DEV));
    ct_cuda_memstats m0, m1;
    ct_cuda_graph *g = begin_capture();
    ok(ct_cuda_memory_stats(0, &m0));
    ct_scope *sc = ct_scope_begin();
    ct_tensor *out = ct_keep(checked(ct_mul_scalar(a, 3.0))); /* not in the emptied cache */
    ct_scope_end(sc);
    ok(ct_cuda_graph_capture_end(g));
    ok(ct_cuda_memory_stats(0, &m1));
    assert_true(m1.num_mallocs > m0.num_mallocs);
    assert_true(m1.reserved >= m0.reserved + (uint64_t)n * 4);
    ok(ct_fill_(out, NAN));
    ok(ct_cuda_graph_replay(g));
    double v = 0;
    sc = ct_scope_begin();
    ok(ct_tensor_item(ct_select(out, 0, n - 1), &v));
    ct_scope_end(sc);
    assert_true(v == 3.0);
    graph_free(g);
    ct_tensor_release(out);
    ct_tensor_release(a);

    /* More than any device holds: 2^50 bytes. */
    g = begin_capture();
    sc = ct_scope_begin();
    tu_assert_null_error(ct_tensor_empty(CT_SHAPE(INT64_C(1) << 48), CT_F32, DEV), CT_ERR_OOM,
                         "ct_tensor_empty", "out of memory");
    ct_scope_end(sc);
    assert_capture_failed(g, "out of memory allocating 1125899906842624 bytes on cuda:0",
                          "during a CUDA graph capture");
}

/* Graph calls out of order. */
static void test_misuse(void **state) {
    (void)state;
    ct_tensor *a = gpu_rand(CT_SHAPE(300), -1, 1, NULL);
    ct_scope *sc = ct_scope_begin();
    checked(double_plus_one(a));
    ct_scope_end(sc);

    ct_cuda_graph *g = begin_capture();
    /* These refusals leave the capture under way intact. */
    tu_assert_null_error(ct_cuda_graph_capture_begin(0), CT_ERR_CAPTURE,
                         "ct_cuda_graph_capture_begin", "this thread is capturing a CUDA graph "
                         "on cuda:0 already");
    tu_assert_error(ct_cuda_graph_replay(g), CT_ERR_CAPTURE, "ct_cuda_graph_replay",
                    "still being captured", "ct_cuda_graph_capture_end first");
    sc = ct_scope_begin();
    ct_tensor *out = ct_keep(checked(double_plus_one(a)));
    ct_scope_end(sc);
    ok(ct_cuda_graph_capture_end(g));
    tu_assert_error(ct_cuda_graph_capture_end(g), CT_ERR_CAPTURE, "ct_cuda_graph_capture_end",
                    "not being captured", "ended already)");
    tu_assert_error(ct_cuda_graph_capture_end(NULL), CT_ERR_INVALID_ARG,
                    "ct_cuda_graph_capture_end", "graph is NULL");
    tu_assert_error(ct_cuda_graph_replay(NULL), CT_ERR_INVALID_ARG, "ct_cuda_graph_replay",
                    "graph is NULL");
    ok(ct_fill_(out, NAN));
    ok(ct_cuda_graph_replay(g));
    ok(ct_cuda_graph_replay(g)); /* twice in a row: the same result */
    sc = ct_scope_begin();
    assert_same_bits(out, checked(double_plus_one(a)), "replayed twice");
    ct_scope_end(sc);
    graph_free(g);
    graph_free(NULL);
    ct_tensor_release(out);

    /* Freed while capturing: the capture ends, nothing is left behind. */
    g = begin_capture();
    sc = ct_scope_begin();
    checked(double_plus_one(a));
    ct_scope_end(sc);
    graph_free(g);
    assert_usable();

    char dev[64];
    snprintf(dev, sizeof dev, "cuda:%d", ct_cuda_device_count());
    tu_assert_null_error(ct_cuda_graph_capture_begin(ct_cuda_device_count()), CT_ERR_DEVICE,
                         "ct_cuda_graph_capture_begin", dev, "not available");
    tu_assert_null_error(ct_cuda_graph_capture_begin(-1), CT_ERR_DEVICE,
                         "ct_cuda_graph_capture_begin", "cuda:-1");
    ct_tensor_release(a);
}

/* What another thread gets while this one captures cuda:0. */
typedef struct other_thread {
    ct_cuda_graph *g;
    ct_tensor *a;
    ct_status add, item, sync, begin, empty, end, free_st;
    char add_msg[512], sync_msg[512], begin_msg[512], empty_msg[512], end_msg[512],
        free_msg[512];
} other_thread;

static void *other_thread_run(void *arg) {
    other_thread *o = arg;
    ct_clear_error();
    ct_tensor *b = ct_add(o->a, o->a);
    o->add = b ? CT_OK : ct_last_status();
    snprintf(o->add_msg, sizeof o->add_msg, "%s", ct_last_error());
    ct_tensor_release(b);
    double v;
    ct_tensor *one = ct_select(o->a, 0, 0);
    o->item = one ? ct_tensor_item(one, &v) : ct_last_status();
    ct_tensor_release(one);
    o->sync = ct_cuda_synchronize(0);
    snprintf(o->sync_msg, sizeof o->sync_msg, "%s", ct_last_error());
    ct_cuda_graph *g2 = ct_cuda_graph_capture_begin(0);
    o->begin = g2 ? CT_OK : ct_last_status();
    snprintf(o->begin_msg, sizeof o->begin_msg, "%s", ct_last_error());
    ct_cuda_graph_free(g2);
    o->empty = ct_cuda_empty_cache(0);
    snprintf(o->empty_msg, sizeof o->empty_msg, "%s", ct_last_error());
    o->end = ct_cuda_graph_capture_end(o->g);
    snprintf(o->end_msg, sizeof o->end_msg, "%s", ct_last_error());
    ct_clear_error();
    ct_cuda_graph_free(o->g); /* not its capture: left as it is */
    o->free_st = ct_last_status();
    snprintf(o->free_msg, sizeof o->free_msg, "%s", ct_last_error());
    return NULL;
}

static void assert_msg(const char *msg, const char *w1, const char *w2) {
    if (!strstr(msg, w1) || !strstr(msg, w2)) fprintf(stderr, "message: %s\n", msg);
    assert_non_null(strstr(msg, w1));
    assert_non_null(strstr(msg, w2));
}

static void test_other_thread(void **state) {
    (void)state;
    ct_tensor *a = gpu_rand(CT_SHAPE(300), -1, 1, NULL);
    ct_scope *sc = ct_scope_begin();
    checked(double_plus_one(a));
    ct_scope_end(sc);
    other_thread o = {.a = a};
    o.g = begin_capture();
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, other_thread_run, &o), 0);
    pthread_join(th, NULL);
    assert_int_equal(o.add, CT_ERR_CAPTURE);
    assert_msg(o.add_msg, "ct_add: cuda:0 is being captured into a CUDA graph by another thread",
               "would be recorded into that graph");
    assert_int_equal(o.item, CT_ERR_CAPTURE);
    assert_int_equal(o.sync, CT_ERR_CAPTURE);
    assert_msg(o.sync_msg, "ct_cuda_synchronize", "another thread is capturing");
    assert_int_equal(o.begin, CT_ERR_CAPTURE);
    assert_msg(o.begin_msg, "ct_cuda_graph_capture_begin", "by another thread");
    assert_int_equal(o.empty, CT_ERR_CAPTURE);
    assert_msg(o.empty_msg, "ct_cuda_empty_cache", "being captured");
    assert_int_equal(o.end, CT_ERR_CAPTURE);
    assert_msg(o.end_msg, "ct_cuda_graph_capture_end", "begun by another thread");
    assert_int_equal(o.free_st, CT_ERR_CAPTURE);
    assert_msg(o.free_msg, "ct_cuda_graph_free", "left as it is");
    /* The capture is intact. */
    sc = ct_scope_begin();
    ct_tensor *out = ct_keep(checked(double_plus_one(a)));
    ct_scope_end(sc);
    ok(ct_cuda_graph_capture_end(o.g));
    ok(ct_fill_(out, NAN));
    ok(ct_cuda_graph_replay(o.g));
    sc = ct_scope_begin();
    assert_same_bits(out, checked(double_plus_one(a)), "other thread");
    ct_scope_end(sc);
    graph_free(o.g);
    ct_tensor_release(out);
    ct_tensor_release(a);
    assert_usable();
}

static void test_other_device(void **state) {
    (void)state;
    if (ct_cuda_device_count() < 2) skip();
    ct_tensor *c = checked(tu_rand(CT_SHAPE(8), CT_F32, -1, 1, NULL));
    ct_tensor *d1 = checked(ct_to_device(c, CT_CUDA(1)));
    ct_cuda_graph *g = begin_capture();
    ct_scope *sc = ct_scope_begin();
    tu_assert_null_error(ct_add(d1, d1), CT_ERR_CAPTURE, "ct_add: [8] float32 cuda:1:",
                         "captures a CUDA graph on cuda:0");
    ct_scope_end(sc);
    assert_capture_failed(g, "ct_add: [8] float32 cuda:1:", "never at replay");
    ct_tensor_release(c);
    ct_tensor_release(d1);
}

/* ---- the private pool ----------------------------------------------------------------------- */

#define POOL_N (1 << 16)

static void test_private_pool(void **state) {
    (void)state;
    const bool caching = allocator_caches();
    const uint64_t block = POOL_N * 4; /* a size class of its own */
    ct_tensor *a = gpu_rand(CT_SHAPE(POOL_N), -1, 1, NULL);
    ct_tensor *b = gpu_rand(CT_SHAPE(POOL_N), -1, 1, NULL);
    ct_scope *sc = ct_scope_begin();
    checked(ct_mul(ct_add(a, b), ct_add(a, b)));
    ct_scope_end(sc);
    ct_cuda_memstats m0, m1, m2, m3, m4;
    ok(ct_cuda_memory_stats(0, &m0));
    assert_int_equal(m0.graph_cached, 0);

    ct_cuda_graph *g = begin_capture();
    ct_cuda_memstats mb;
    ok(ct_cuda_memory_stats(0, &mb));
    const uint64_t own = mb.allocated - m0.allocated; /* the graph's own state */
    sc = ct_scope_begin();
    ct_tensor *t = checked(ct_add(a, b));
    void *tp = ct_tensor_data_ptr(t);
    ct_tensor *u = ct_keep(checked(ct_mul(t, t)));
    void *up = ct_tensor_data_ptr(u);
    ct_scope_end(sc); /* t, freed during the capture, stays the graph's */
    ok(ct_cuda_graph_capture_end(g));
    ok(ct_cuda_memory_stats(0, &m1));
    assert_int_equal(m1.graph_cached, block);
    assert_int_equal(m1.allocated, mb.allocated + block);

    /* Eager work never gets the graph's blocks. */
    ct_tensor *v = checked(ct_add(a, b));
    assert_ptr_not_equal(ct_tensor_data_ptr(v), tp);
    assert_ptr_not_equal(ct_tensor_data_ptr(v), up);
    ok(ct_fill_(v, 7.0));
    double *va = refill(a, -1, 1), *vb = refill(b, -1, 1);
    ok(ct_cuda_graph_replay(g));
    double *vu = tu_values(u), *vv = tu_values(v);
    for (int i = 0; i < POOL_N; i++) {
        float s = (float)va[i] + (float)vb[i];
        assert_true(vu[i] == (double)(s * s));
        assert_true(vv[i] == 7.0); /* the replay wrote nothing of v's */
    }
    free(vu);
    free(vv);
    free(va);
    free(vb);

    /* An output released after the capture: its block stays the graph's. */
    ok(ct_cuda_memory_stats(0, &m2));
    ct_tensor_release(u);
    ok(ct_cuda_memory_stats(0, &m3));
    assert_int_equal(m3.graph_cached, m2.graph_cached + block);
    assert_int_equal(m3.allocated, m2.allocated - block);
    ct_tensor *w = checked(ct_mul(v, v));
    assert_ptr_not_equal(ct_tensor_data_ptr(w), tp);
    assert_ptr_not_equal(ct_tensor_data_ptr(w), up);
    ok(ct_cuda_graph_replay(g)); /* writes blocks nobody else holds */
    ok(ct_cuda_synchronize(0));

    /* Freeing the graph returns its blocks: to the cache, or to the driver
     * without one. */
    ok(ct_cuda_memory_stats(0, &m3));
    graph_free(g);
    ok(ct_cuda_memory_stats(0, &m4));
    assert_int_equal(m4.graph_cached, 0);
    assert_int_equal(m4.allocated, m3.allocated - own);
    if (caching) assert_int_equal(m4.reserved, m3.reserved);
    else assert_true(m4.reserved + 2 * block <= m3.reserved);
    ct_tensor_release(v);
    ct_tensor_release(w);

    /* A tensor from a capture outlives its graph; freed later, its block
     * goes back like any other. */
    sc = ct_scope_begin();
    checked(ct_add(a, b));
    ct_scope_end(sc);
    g = begin_capture();
    sc = ct_scope_begin();
    ct_tensor *kept = ct_keep(checked(ct_add(a, b)));
    ct_scope_end(sc);
    ok(ct_cuda_graph_capture_end(g));
    ok(ct_cuda_graph_replay(g));
    graph_free(g);
    sc = ct_scope_begin();
    assert_same_bits(kept, checked(ct_add(a, b)), "kept after free");
    ct_scope_end(sc);
    ok(ct_cuda_memory_stats(0, &m3));
    ct_tensor_release(kept);
    ok(ct_cuda_memory_stats(0, &m4));
    assert_int_equal(m4.graph_cached, 0);
    assert_int_equal(m4.allocated, m3.allocated - block);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

int main(void) {
    tu_seed();
    tu_cuda_devices_or_skip("cuda_graph");
    cti_cuda_host_waits = tu_cuda_symbol("cti_cuda_host_waits");
    ct_set_allow_tf32(false);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_ops_replay, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_mlp_step_bit_for_bit, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_cnn_step, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_random_ops_renew_draws, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_reseed_during_capture, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_refused_host_syncs, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_embedding_replay_checks_indices, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_refused_cpu_tensors, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_allocation_during_capture, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_misuse, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_other_thread, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_other_device, setup, teardown_graph),
        cmocka_unit_test_setup_teardown(test_private_pool, setup, teardown_graph),
    };
    return tu_run_tests(tests);
}
