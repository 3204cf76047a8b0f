/* Collectives and data-parallel training across processes (tensor/dist.h),
 * run under mpirun with several ranks (tests/mpirun.sh; meson runs it with
 * 2). Every rank runs every test in the same order.
 *
 * Each rank's inputs are drawn from a seed all ranks share (rank 0's,
 * broadcast) and the rank number, so every rank can draw every other rank's
 * inputs too and check a collective's result against sums it forms itself
 * in float64. The training tests compare with the same computation done in
 * one process: the gradients of every rank's batch averaged, the
 * parameters after steps on the concatenated batch.
 *
 *     test_dist              the tests
 *     test_dist early_exit   rank 1 leaves the group without joining an all-reduce; rank 0
 *                            must fail with a message within the timeout (CT_DIST_TIMEOUT) */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "test_fixture.h"

static int rank, world;
static uint64_t shared_seed;

/* ---- inputs any rank can draw for any rank ---------------------------------------- */
typedef struct rng {
    uint64_t s;
} rng;

static rng rng_for(uint64_t salt, int r) {
    rng g = {shared_seed ^ (salt * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(r + 1) << 48)};
    if (!g.s) g.s = 1;
    return g;
}

static uint64_t rng_next(rng *g) {
    g->s ^= g->s >> 12;
    g->s ^= g->s << 25;
    g->s ^= g->s >> 27;
    return g->s * 2685821657736338717ull;
}

static double rng_uniform(rng *g, double lo, double hi) {
    return lo + (hi - lo) * ((double)(rng_next(g) >> 11) * (1.0 / 9007199254740992.0));
}

/* Values of dtype (rounded to it) for rank r: integers in [-50, 50), bools,
 * floats in [-2, 2). */
static double *vals_for(uint64_t salt, int r, int64_t n, ct_dtype dt) {
    rng g = rng_for(salt, r);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) {
        if (dt == CT_BOOL) v[i] = (double)(rng_next(&g) >> 63);
        else if (!ct_dtype_is_floating(dt)) v[i] = (double)((int64_t)(rng_next(&g) % 100) - 50);
        else v[i] = tu_round(rng_uniform(&g, -2, 2), dt);
    }
    return v;
}

/* A shape every rank draws alike: 1 to 3 dims of 1 to 7. */
static int shape_for(uint64_t salt, int64_t *shape) {
    rng g = rng_for(salt, -1);
    int nd = 1 + (int)(rng_next(&g) % 3);
    for (int d = 0; d < nd; d++) shape[d] = 1 + (int64_t)(rng_next(&g) % 7);
    return nd;
}

static ct_tensor *checked(ct_tensor *t) {
    if (!t) fprintf(stderr, "rank %d: unexpected failure: %s\n", rank, ct_last_error());
    assert_non_null(t);
    return t;
}

static void ok(ct_status s) {
    if (s != CT_OK) fprintf(stderr, "rank %d: unexpected failure: %s\n", rank, ct_last_error());
    assert_int_equal(s, CT_OK);
}

static void poison(ct_tensor *t) {
    ok(ct_fill_(t, ct_dtype_is_floating(ct_tensor_dtype(t)) ? NAN : 77));
}

static double tol(ct_dtype dt) { return ct_dtype_is_floating(dt) ? tu_rtol(dt) : 0; }

/* ---- collectives ---------------------------------------------------------------------- */
static double reduce_ref(double acc, double v, ct_dist_op op, ct_dtype dt, bool first) {
    if (first) return v;
    if (op == CT_DIST_MAX || (dt == CT_BOOL && op == CT_DIST_SUM)) return acc > v ? acc : v;
    return acc + v;
}

/* The reduction of every rank's values, as the dtype holds it. */
static double *reduced(uint64_t salt, int64_t n, ct_dtype dt, ct_dist_op op) {
    double *ref = calloc((size_t)(n ? n : 1), sizeof *ref);
    for (int r = 0; r < world; r++) {
        double *v = vals_for(salt, r, n, dt);
        for (int64_t i = 0; i < n; i++) ref[i] = reduce_ref(ref[i], v[i], op, dt, r == 0);
        free(v);
    }
    for (int64_t i = 0; i < n; i++) {
        if (op == CT_DIST_AVG) ref[i] /= world;
        ref[i] = tu_round(ref[i], dt);
    }
    return ref;
}

static void all_reduce_case(uint64_t salt, ct_dtype dt, ct_dist_op op, bool noncontig) {
    int64_t shape[CT_MAX_DIMS];
    int nd = shape_for(salt, shape);
    int64_t n = tu_numel(nd, shape);
    double *v = vals_for(salt, rank, n, dt);
    ct_tensor *t = checked(tu_from_f64(v, nd, shape, dt));
    ct_tensor *x = noncontig ? checked(tu_noncontig(t)) : ct_tensor_retain(t);
    ok(ct_dist_all_reduce(x, op));
    double *got = tu_values(x), *ref = reduced(salt, n, dt, op);
    tu_assert_close(got, ref, n, tol(dt), 0);
    free(got);
    free(ref);
    free(v);
    ct_tensor_release(x);
    ct_tensor_release(t);
}

static void test_all_reduce(void **state) {
    uint64_t salt = 1;
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof *tu_all_dtypes; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        ct_dist_op ops[] = {CT_DIST_SUM, CT_DIST_MAX, CT_DIST_AVG};
        for (int o = 0; o < 3; o++) {
            if (ops[o] == CT_DIST_AVG && !ct_dtype_is_floating(dt)) continue;
            all_reduce_case(salt++, dt, ops[o], false);
            all_reduce_case(salt++, dt, ops[o], true);
        }
    }
}

static void test_broadcast(void **state) {
    uint64_t salt = 100;
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof *tu_all_dtypes; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        for (int nc = 0; nc < 2; nc++, salt++) {
            int64_t shape[CT_MAX_DIMS];
            int nd = shape_for(salt, shape);
            int64_t n = tu_numel(nd, shape);
            int root = world - 1;
            double *v = vals_for(salt, rank, n, dt), *ref = vals_for(salt, root, n, dt);
            ct_tensor *t = checked(tu_from_f64(v, nd, shape, dt));
            ct_tensor *x = nc ? checked(tu_noncontig(t)) : ct_tensor_retain(t);
            ok(ct_dist_broadcast(x, root));
            double *got = tu_values(x);
            tu_assert_close(got, ref, n, 0, 0);
            free(got);
            free(ref);
            free(v);
            ct_tensor_release(x);
            ct_tensor_release(t);
        }
    }
}

static void test_all_gather(void **state) {
    uint64_t salt = 200;
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof *tu_all_dtypes; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        for (int variant = 0; variant < 3; variant++, salt++) {
            /* variant 0: contiguous, 1: non-contiguous in and out, 2: a 0-d in */
            int64_t shape[CT_MAX_DIMS], oshape[CT_MAX_DIMS];
            int nd = variant == 2 ? 0 : shape_for(salt, shape);
            int64_t n = tu_numel(nd, shape);
            int ond = nd ? nd : 1;
            if (nd) memcpy(oshape, shape, sizeof oshape);
            else oshape[0] = 1;
            oshape[0] *= world;
            double *v = vals_for(salt, rank, n, dt);
            ct_tensor *t = checked(tu_from_f64(v, nd, shape, dt));
            ct_tensor *o = checked(ct_tensor_empty(ond, oshape, dt, CT_CPU));
            ct_tensor *in = variant == 1 ? checked(tu_noncontig(t)) : ct_tensor_retain(t);
            ct_tensor *out = variant == 1 ? checked(tu_noncontig(o)) : ct_tensor_retain(o);
            poison(out);
            ok(ct_dist_all_gather(out, in));
            double *got = tu_values(out);
            for (int r = 0; r < world; r++) {
                double *ref = vals_for(salt, r, n, dt);
                tu_assert_close(got + r * n, ref, n, 0, 0);
                free(ref);
            }
            free(got);
            free(v);
            ct_tensor_release(in);
            ct_tensor_release(out);
            ct_tensor_release(t);
            ct_tensor_release(o);
        }
    }
}

static void test_reduce_scatter(void **state) {
    uint64_t salt = 300;
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof *tu_all_dtypes; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        ct_dist_op ops[] = {CT_DIST_SUM, CT_DIST_MAX, CT_DIST_AVG};
        for (int o = 0; o < 3; o++) {
            if (ops[o] == CT_DIST_AVG && !ct_dtype_is_floating(dt)) continue;
            for (int nc = 0; nc < 2; nc++, salt++) {
                int64_t shape[CT_MAX_DIMS], ishape[CT_MAX_DIMS];
                int nd = shape_for(salt, shape);
                memcpy(ishape, shape, sizeof ishape);
                ishape[0] *= world;
                int64_t n = tu_numel(nd, shape);
                double *v = vals_for(salt, rank, n * world, dt);
                ct_tensor *t = checked(tu_from_f64(v, nd, ishape, dt));
                ct_tensor *o2 = checked(ct_tensor_empty(nd, shape, dt, CT_CPU));
                ct_tensor *in = nc ? checked(tu_noncontig(t)) : ct_tensor_retain(t);
                ct_tensor *out = nc ? checked(tu_noncontig(o2)) : ct_tensor_retain(o2);
                poison(out);
                ok(ct_dist_reduce_scatter(out, in, ops[o]));
                double *got = tu_values(out), *all = reduced(salt, n * world, dt, ops[o]);
                tu_assert_close(got, all + rank * n, n, tol(dt), 0);
                free(got);
                free(all);
                free(v);
                ct_tensor_release(in);
                ct_tensor_release(out);
                ct_tensor_release(t);
                ct_tensor_release(o2);
            }
        }
    }
}

static void test_bad_arguments(void **state) {
    int64_t s2[] = {2, 3}, s3[] = {3, 3};
    ct_tensor *i = checked(ct_tensor_zeros(2, s2, CT_I32, CT_CPU));
    ct_tensor *f = checked(ct_tensor_zeros(2, s2, CT_F32, CT_CPU));
    ct_tensor *bad = checked(ct_tensor_zeros(2, s3, CT_F32, CT_CPU));
    tu_assert_error(ct_dist_all_reduce(i, CT_DIST_AVG), CT_ERR_DTYPE, "ct_dist_all_reduce",
                    "CT_DIST_AVG needs a floating dtype", "int32");
    tu_assert_error(ct_dist_all_reduce(NULL, CT_DIST_SUM), CT_ERR_INVALID_ARG,
                    "ct_dist_all_reduce: tensor is NULL");
    tu_assert_error(ct_dist_all_reduce(f, (ct_dist_op)9), CT_ERR_INVALID_ARG, "reduction 9");
    tu_assert_error(ct_dist_broadcast(f, world), CT_ERR_INVALID_ARG, "ct_dist_broadcast",
                    "is not a rank");
    tu_assert_error(ct_dist_all_gather(bad, f), CT_ERR_SHAPE, "ct_dist_all_gather",
                    "dim 0 times the world size");
    tu_assert_error(ct_dist_all_gather(f, i), CT_ERR_DTYPE, "one dtype");
    tu_assert_error(ct_dist_reduce_scatter(bad, f, CT_DIST_SUM), CT_ERR_SHAPE,
                    "ct_dist_reduce_scatter");
    ok(ct_requires_grad_(f, true));
    tu_assert_error(ct_dist_all_reduce(f, CT_DIST_SUM), CT_ERR_AUTOGRAD, "ct_dist_all_reduce",
                    "in-place");
    tu_assert_error(ct_dist_init(NULL), CT_ERR_INVALID_ARG, "ct_dist_init",
                    "a process group exists");
    ct_tensor_release(i);
    ct_tensor_release(f);
    ct_tensor_release(bad);
}

static void test_barrier(void **state) {
    ok(ct_dist_barrier());
    ok(ct_dist_barrier());
}

/* ---- data-parallel training ---------------------------------------------------------------- */
/* A small model with parameters that get no gradient: y = relu(x W1^T + b1)
 * W2^T + b2; "unused" never takes part; "half" only on rank 0's pass. */
typedef struct net {
    ct_tensor *w1, *b1, *w2, *b2, *unused, *half;
    ct_params *params;
} net;

#define IN 5
#define HID 7
#define OUT 3

static ct_tensor *param(uint64_t salt, int nd, const int64_t *shape) {
    int64_t n = tu_numel(nd, shape);
    double *v = vals_for(salt, 0, n, CT_F32);
    ct_tensor *t = checked(tu_from_f64(v, nd, shape, CT_F32));
    free(v);
    ok(ct_requires_grad_(t, true));
    return t;
}

/* The same initial values on every rank when same, else each rank's own
 * (which ct_ddp_new must replace with rank 0's). */
static void net_init(net *m, bool same) {
    uint64_t base = same ? 1000 : 1000 + 100 * (uint64_t)rank;
    m->w1 = param(base + 1, 2, (int64_t[]){HID, IN});
    m->b1 = param(base + 2, 1, (int64_t[]){HID});
    m->w2 = param(base + 3, 2, (int64_t[]){OUT, HID});
    m->b2 = param(base + 4, 1, (int64_t[]){OUT});
    m->unused = param(base + 5, 1, (int64_t[]){4});
    m->half = param(base + 6, 1, (int64_t[]){OUT});
    m->params = ct_params_new();
    ok(ct_params_add(m->params, "w1", m->w1));
    ok(ct_params_add(m->params, "b1", m->b1));
    ok(ct_params_add(m->params, "unused", m->unused));
    ok(ct_params_add(m->params, "w2", m->w2));
    ok(ct_params_add(m->params, "b2", m->b2));
    ok(ct_params_add(m->params, "half", m->half));
}

static void net_free(net *m) {
    ct_tensor *ts[] = {m->w1, m->b1, m->w2, m->b2, m->unused, m->half};
    for (int k = 0; k < 6; k++) ct_tensor_release(ts[k]);
    ct_params_free(m->params);
}

/* The loss of rank r's batch `salt`: mean squared output (+ half's terms on rank 0). */
static ct_tensor *net_loss(net *m, uint64_t salt, int r) {
    int64_t xs[] = {4, IN};
    double *xv = vals_for(salt, r, 4 * IN, CT_F32);
    ct_tensor *x = checked(tu_from_f64(xv, 2, xs, CT_F32));
    free(xv);
    ct_tensor *h = ct_relu(ct_add(ct_matmul(x, ct_t(m->w1)), m->b1));
    ct_tensor *y = ct_add(ct_matmul(h, ct_t(m->w2)), m->b2);
    if (r == 0) y = ct_mul(y, m->half);
    return checked(ct_mean(ct_mul(y, y), 0, NULL, false));
}

/* Each parameter's gradient summed over every rank's batches, divided by
 * the world size: what DDP must leave in every rank's .grad. Computed by
 * running each rank's pass here. With only >= 0, that rank's own sums
 * alone (what a pass that communicates nothing leaves). */
static double **reference_grads_of(net *m, const uint64_t *salts, int nsalts, int only) {
    double **ref = calloc(6, sizeof *ref);
    ct_tensor *ts[] = {m->w1, m->b1, m->unused, m->w2, m->b2, m->half};
    for (int k = 0; k < 6; k++) ref[k] = calloc((size_t)ct_tensor_numel(ts[k]), sizeof **ref);
    for (int r = 0; r < world; r++) {
        if (only >= 0 && r != only) continue;
        for (int k = 0; k < 6; k++) ct_zero_grad(ts[k]);
        for (int s = 0; s < nsalts; s++) {
            ct_scope *sc = ct_scope_begin();
            ok(ct_backward(net_loss(m, salts[s], r), NULL, false));
            ct_scope_end(sc);
        }
        for (int k = 0; k < 6; k++) {
            if (!ct_grad(ts[k])) continue;
            double *g = tu_values(ct_grad(ts[k]));
            for (int64_t i = 0; i < ct_tensor_numel(ts[k]); i++)
                ref[k][i] += only >= 0 ? g[i] : g[i] / world;
            free(g);
        }
    }
    for (int k = 0; k < 6; k++) ct_zero_grad(ts[k]);
    return ref;
}

static double **reference_grads(net *m, const uint64_t *salts, int nsalts) {
    return reference_grads_of(m, salts, nsalts, -1);
}

static void free_ref(double **ref) {
    for (int k = 0; k < 6; k++) free(ref[k]);
    free(ref);
}

static void check_grads(net *m, double **ref, bool unused_none) {
    ct_tensor *ts[] = {m->w1, m->b1, m->unused, m->w2, m->b2, m->half};
    for (int k = 0; k < 6; k++) {
        ct_tensor *g = ct_grad(ts[k]);
        if (k == 2 && unused_none) {
            assert_null(g);
            continue;
        }
        assert_non_null(g);
        double *got = tu_values(g);
        tu_assert_close(got, ref[k], ct_tensor_numel(ts[k]), 1e-5, 1e-6);
        free(got);
    }
}

static void test_ddp_broadcasts_rank0(void **state) {
    net m, ref;
    net_init(&m, false);
    net_init(&ref, true); /* rank 0's values, drawn here */
    ct_ddp *d = ct_ddp_new(m.params, NULL);
    assert_non_null(d);
    for (int64_t k = 0; k < ct_params_count(m.params); k++) {
        double *a = tu_values(ct_params_get(m.params, k, NULL));
        double *b = tu_values(ct_params_get(ref.params, k, NULL));
        tu_assert_close(a, b, ct_tensor_numel(ct_params_get(m.params, k, NULL)), 0, 0);
        free(a);
        free(b);
    }
    ct_ddp_free(d);
    net_free(&m);
    net_free(&ref);
}

static void ddp_grads_case(bool find_unused, double bucket_mb) {
    net m;
    net_init(&m, true);
    ct_ddp_options o = {.bucket_mb = bucket_mb, .find_unused_parameters = find_unused};
    ct_ddp *d = ct_ddp_new(m.params, &o);
    assert_non_null(d);
    uint64_t salt = 2000;
    double **ref = reference_grads(&m, &salt, 1);
    for (int pass = 0; pass < 2; pass++) { /* the second reuses the buckets */
        for (int64_t k = 0; k < ct_params_count(m.params); k++)
            ct_zero_grad(ct_params_get(m.params, k, NULL));
        ct_scope *sc = ct_scope_begin();
        ok(ct_ddp_backward(d, net_loss(&m, salt, rank), NULL));
        ct_scope_end(sc);
        check_grads(&m, ref, find_unused);
    }
    /* Tiny buckets: one parameter each, in reverse order of the list. The
     * bucket of "unused" (index 3 of 6, reversed) can only start after the
     * pass; on rank 1 so can "half"'s (bucket 0), which then holds back
     * every bucket after it, since buckets start in order. */
    if (bucket_mb > 0) {
        assert_int_equal(ct_ddp_num_buckets(d), 6);
        for (int64_t k = 0; k < 6; k++) assert_int_equal(ct_ddp_bucket_params(d, k), 1);
        assert_int_equal(ct_ddp_bucket_numel(d, 3), 4);
        assert_int_equal(ct_ddp_bucket_early_starts(d, 3), 0);
        if (rank == 0) {
            assert_int_equal(ct_ddp_bucket_early_starts(d, 0), 2);
            assert_int_equal(ct_ddp_bucket_early_starts(d, 2), 2);
        } else {
            assert_int_equal(ct_ddp_bucket_early_starts(d, 0), 0);
        }
    } else {
        assert_int_equal(ct_ddp_num_buckets(d), 1);
        assert_int_equal(ct_ddp_bucket_params(d, 0), 6);
    }
    assert_int_equal(ct_ddp_bucket_params(d, 99), -1);
    free_ref(ref);
    ct_ddp_free(d);
    net_free(&m);
}

static void test_ddp_unused_as_zeros(void **state) { ddp_grads_case(false, 1e-6); }
static void test_ddp_unused_none(void **state) { ddp_grads_case(true, 1e-6); }
static void test_ddp_one_bucket(void **state) { ddp_grads_case(false, 0); }

static void test_ddp_no_sync(void **state) {
    net m;
    net_init(&m, true);
    ct_ddp *d = ct_ddp_new(m.params, &(ct_ddp_options){.bucket_mb = 1e-5});
    assert_non_null(d);
    uint64_t salts[] = {3000, 3001, 3002};
    double **ref = reference_grads(&m, salts, 3);
    double **local = reference_grads_of(&m, salts, 2, rank);
    assert_true(ct_ddp_set_sync(d, false));
    for (int s = 0; s < 2; s++) {
        ct_scope *sc = ct_scope_begin();
        ok(ct_ddp_backward(d, net_loss(&m, salts[s], rank), NULL));
        ct_scope_end(sc);
    }
    /* Nothing was reduced yet: each rank holds its own sums ("unused" none,
     * "half" only on rank 0). */
    ct_tensor *ts[] = {m.w1, m.b1, m.unused, m.w2, m.b2, m.half};
    for (int k = 0; k < 6; k++) {
        ct_tensor *g = ct_grad(ts[k]);
        if (k == 2 || (k == 5 && rank != 0)) {
            assert_null(g);
            continue;
        }
        assert_non_null(g);
        double *got = tu_values(g);
        tu_assert_close(got, local[k], ct_tensor_numel(ts[k]), 1e-5, 1e-6);
        free(got);
    }
    free_ref(local);
    assert_false(ct_ddp_set_sync(d, true));
    ct_scope *sc = ct_scope_begin();
    ok(ct_ddp_backward(d, net_loss(&m, salts[2], rank), NULL));
    ct_scope_end(sc);
    check_grads(&m, ref, false);
    free_ref(ref);
    ct_ddp_free(d);
    net_free(&m);
}

static void test_ddp_errors(void **state) {
    net m;
    net_init(&m, true);
    tu_assert_null_error(ct_ddp_new(NULL, NULL), CT_ERR_INVALID_ARG, "ct_ddp_new: params is NULL");
    tu_assert_null_error(ct_ddp_new(m.params, &(ct_ddp_options){.bucket_mb = -1}),
                         CT_ERR_INVALID_ARG, "bucket_mb must be > 0");
    tu_assert_null_error(
        ct_ddp_new(m.params, &(ct_ddp_options){.zero1 = true, .find_unused_parameters = true}),
        CT_ERR_INVALID_ARG, "zero1", "find_unused_parameters");
    ct_ddp *d = ct_ddp_new(m.params, NULL);
    assert_non_null(d);
    /* A second wrapper would need a second hook on each parameter. */
    tu_assert_null_error(ct_ddp_new(m.params, NULL), CT_ERR_AUTOGRAD, "already has a hook");
    ct_ddp_free(d);
    /* The hooks went with the first wrapper. */
    d = ct_ddp_new(m.params, NULL);
    assert_non_null(d);
    ct_ddp_free(d);
    tu_assert_error(ct_ddp_backward(NULL, NULL, NULL), CT_ERR_INVALID_ARG, "ddp is NULL");
    net_free(&m);
}

/* ---- the Fashion-MNIST MLP: 2 ranks against one process ------------------------------------ */
#define BATCH 16
#define STEPS 4

typedef struct mlp {
    ct_nn_linear *fc1, *fc2;
    ct_params *params;
} mlp;

static void mlp_init(mlp *m) {
    ct_generator *gen = ct_generator_new(shared_seed);
    m->fc1 = ct_nn_linear_new(784, 256, true, CT_F32, CT_CPU, gen);
    m->fc2 = ct_nn_linear_new(256, 10, true, CT_F32, CT_CPU, gen);
    ct_generator_free(gen);
    assert_non_null(m->fc2);
    m->params = ct_params_new();
    ok(ct_nn_linear_params(m->fc1, "fc1", m->params));
    ok(ct_nn_linear_params(m->fc2, "fc2", m->params));
}

static void mlp_free(mlp *m) {
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
    ct_params_free(m->params);
}

static ct_tensor *mlp_loss(mlp *m, ct_tensor *x, ct_tensor *y) {
    ct_tensor *h = ct_relu(ct_nn_linear_forward(m->fc1, x));
    return ct_cross_entropy(ct_nn_linear_forward(m->fc2, h), y, NULL, CT_REDUCTION_MEAN, -100,
                            0.0);
}

/* Step s's batch of rank r (rows [r B, (r+1) B) of the step's 2B): images
 * and labels drawn from the shared seed, standing in for Fashion-MNIST
 * (the data set's values do not matter to the equivalence). */
static void batch(int step, int r, int nranks, ct_tensor **x, ct_tensor **y) {
    int64_t b = (int64_t)BATCH * nranks;
    int64_t xs[] = {b, 784}, ys[] = {b};
    double *xv = malloc((size_t)(b * 784) * sizeof *xv);
    double *yv = malloc((size_t)b * sizeof *yv);
    for (int k = 0; k < nranks; k++) {
        double *v = vals_for(5000 + (uint64_t)step, r + k, BATCH * 784, CT_F32);
        memcpy(xv + (size_t)k * BATCH * 784, v, (size_t)BATCH * 784 * sizeof *v);
        free(v);
        rng g = rng_for(6000 + (uint64_t)step, r + k);
        for (int i = 0; i < BATCH; i++) yv[k * BATCH + i] = (double)(rng_next(&g) % 10);
    }
    *x = checked(tu_from_f64(xv, 2, xs, CT_F32));
    *y = checked(tu_from_f64(yv, 1, ys, CT_I64));
    free(xv);
    free(yv);
}

/* Trains m for STEPS steps: DDP on this rank's batches, or one process on
 * every rank's batches concatenated. */
static void train(mlp *m, bool ddp, bool zero1, bool adamw) {
    ct_ddp *d = NULL;
    const ct_params *p = m->params;
    if (ddp) {
        d = ct_ddp_new(m->params, &(ct_ddp_options){.bucket_mb = 0.25, .zero1 = zero1});
        assert_non_null(d);
        p = ct_ddp_optim_params(d);
    }
    ct_optimizer *opt = adamw ? ct_optim_adamw_new(p, 1e-3, 0.9, 0.999, 1e-8, 1e-2)
                              : ct_optim_sgd_new(p, 0.1, 0.9, 0, 1e-4, false);
    assert_non_null(opt);
    for (int s = 0; s < STEPS; s++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *x, *y;
        batch(s, ddp ? rank : 0, ddp ? 1 : world, &x, &y);
        ct_optim_zero_grad(opt);
        ct_tensor *loss = checked(mlp_loss(m, x, y));
        if (ddp) {
            ok(ct_ddp_backward(d, loss, NULL));
            ok(ct_ddp_step(d, opt));
        } else {
            ok(ct_backward(loss, NULL, false));
            ok(ct_optim_step(opt));
        }
        ct_scope_end(sc);
    }
    if (zero1) {
        /* Each rank holds the state of about 1 / world of the parameters. */
        int64_t total = 0, state = 0;
        for (int64_t k = 0; k < ct_params_count(m->params); k++)
            total += ct_tensor_numel(ct_params_get(m->params, k, NULL));
        for (int64_t k = 0; k < ct_optim_state_count(opt); k++) {
            const char *name;
            ct_tensor *t = ct_optim_state_get(opt, k, &name);
            if (strstr(name, "exp_avg")) state += ct_tensor_numel(t);
        }
        assert_true(state <= 2 * (total / world + 2 * world));
        assert_true(state >= 2 * (total / world));
    }
    ct_optim_free(opt);
    ct_ddp_free(d);
}

static void assert_same_params(mlp *a, mlp *b, double rtol, double atol) {
    for (int64_t k = 0; k < ct_params_count(a->params); k++) {
        ct_tensor *pa = ct_params_get(a->params, k, NULL), *pb = ct_params_get(b->params, k, NULL);
        double *va = tu_values(pa), *vb = tu_values(pb);
        tu_assert_close(va, vb, ct_tensor_numel(pa), rtol, atol);
        free(va);
        free(vb);
    }
}

static void test_ddp_mlp_matches_one_process(void **state) {
    mlp d, one;
    mlp_init(&d);
    mlp_init(&one);
    train(&d, true, false, false);
    train(&one, false, false, false);
    /* SGD: the parameters move by lr times gradients that differ only in
     * float32 summation order. */
    assert_same_params(&d, &one, 1e-5, 1e-6);
    mlp_free(&d);
    mlp_free(&one);
}

static void test_zero1_matches_ddp(void **state) {
    mlp z, d, one;
    mlp_init(&z);
    mlp_init(&d);
    mlp_init(&one);
    train(&z, true, true, true);
    train(&d, true, false, true);
    train(&one, false, false, true);
    /* Same reductions of the same sums, the same elementwise AdamW. */
    assert_same_params(&z, &d, 1e-6, 1e-7);
    /* AdamW divides by sqrt(v): a gradient near zero whose float32 sum
     * differs in the last bits moves by up to lr, hence the looser bound. */
    assert_same_params(&z, &one, 1e-3, 1e-4);
    mlp_free(&z);
    mlp_free(&d);
    mlp_free(&one);
}

/* ---- the distributed sampler ----------------------------------------------------------------- */
static void test_sharded_loader(void **state) {
    enum { N = 11, B = 2, EPOCHS = 2 };
    int64_t shape[] = {N};
    double v[N];
    for (int i = 0; i < N; i++) v[i] = i;
    ct_tensor *data = checked(tu_from_f64(v, 1, shape, CT_I64));
    ct_dataloader *dl = ct_dataloader_new(data, NULL, B, true, false, shared_seed);
    assert_non_null(dl);
    ok(ct_dataloader_shard(dl, rank, world));
    int64_t per = (N + world - 1) / world;
    assert_int_equal(ct_dataloader_num_batches(dl), (per + B - 1) / B);
    int64_t prev_first = -1;
    bool changed = false;
    for (int e = 0; e < EPOCHS; e++) {
        int64_t mine[N + 8], n = 0;
        ct_tensor *x;
        while (ct_dataloader_next(dl, &x, NULL)) {
            double *xv = tu_values(x);
            for (int64_t i = 0; i < ct_tensor_numel(x); i++) mine[n++] = (int64_t)xv[i];
            free(xv);
            ct_tensor_release(x);
        }
        ok(ct_dataloader_status(dl));
        assert_int_equal(n, per);
        /* Every rank's shard, gathered: together every sample, the
         * padding repeating the epoch's first ones. */
        ct_tensor *t = checked(ct_tensor_from_data(mine, CT_I64, 1, &n));
        int64_t all_n = n * world;
        ct_tensor *all = checked(ct_tensor_empty(1, &all_n, CT_I64, CT_CPU));
        ok(ct_dist_all_gather(all, t));
        double *av = tu_values(all);
        int seen[N] = {0};
        for (int64_t i = 0; i < all_n; i++) seen[(int64_t)av[i]]++;
        for (int i = 0; i < N; i++) assert_true(seen[i] >= 1);
        if (prev_first >= 0 && prev_first != (int64_t)av[0]) changed = true;
        prev_first = (int64_t)av[0];
        free(av);
        ct_tensor_release(t);
        ct_tensor_release(all);
        ok(ct_dataloader_reset(dl));
    }
    (void)changed;
    tu_assert_error(ct_dataloader_shard(dl, world, world), CT_ERR_INVALID_ARG,
                    "ct_dataloader_shard", "0 <= rank < world");
    ct_tensor *x;
    assert_true(ct_dataloader_next(dl, &x, NULL));
    ct_tensor_release(x);
    tu_assert_error(ct_dataloader_shard(dl, 0, 1), CT_ERR_INVALID_ARG, "shard before its first");
    ct_dataloader_free(dl);
    ct_tensor_release(data);
}

/* ---- a rank that leaves early ---------------------------------------------------------------- */
static int early_exit(void) {
    ct_tensor *t = ct_tensor_ones(1, (int64_t[]){3}, CT_F32, CT_CPU);
    if (rank != 0) {
        /* Leaves without joining: MPI_Finalize returns once rank 0 gets there. */
        ct_tensor_release(t);
        return ct_dist_finalize() == CT_OK ? 0 : 1;
    }
    ct_status st = ct_dist_all_reduce(t, CT_DIST_SUM);
    int rc = 0;
    if (st != CT_ERR_RUNTIME || !strstr(ct_last_error(), "did not complete within") ||
        !strstr(ct_last_error(), "ct_dist_all_reduce")) {
        fprintf(stderr, "rank 0: expected a timeout, got %s: %s\n", ct_status_name(st),
                ct_last_error());
        rc = 1;
    } else {
        fprintf(stderr, "rank 0 failed as expected: %s\n", ct_last_error());
    }
    /* The group is broken now: the next call says so at once. */
    st = ct_dist_barrier();
    if (st != CT_ERR_RUNTIME || !strstr(ct_last_error(), "failed earlier")) {
        fprintf(stderr, "rank 0: the broken group answered %s: %s\n", ct_status_name(st),
                ct_last_error());
        rc = 1;
    }
    ct_tensor_release(t);
    if (ct_dist_finalize() != CT_OK) rc = 1;
    return rc;
}

int main(int argc, char **argv) {
    if (ct_dist_init(NULL) != CT_OK) {
        fprintf(stderr, "ct_dist_init: %s\n", ct_last_error());
        return 1;
    }
    rank = ct_dist_rank();
    world = ct_dist_world_size();
    if (argc > 1 && !strcmp(argv[1], "early_exit")) return early_exit();
    /* One seed for every rank: rank 0's. */
    int64_t one = 1;
    tu_seed();
    int64_t s = (int64_t)(tu_next() >> 1);
    ct_tensor *st = ct_tensor_from_data(&s, CT_I64, 1, &one);
    if (!st || ct_dist_broadcast(st, 0) != CT_OK ||
        ct_tensor_copy_to_host(st, &s, sizeof s) != CT_OK) {
        fprintf(stderr, "sharing the seed: %s\n", ct_last_error());
        return 1;
    }
    ct_tensor_release(st);
    shared_seed = (uint64_t)s;
    if (rank == 0) fprintf(stderr, "[ shared   ] seed %llu over %d ranks\n",
                           (unsigned long long)shared_seed, world);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_all_reduce, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broadcast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_gather, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reduce_scatter, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_arguments, setup, teardown),
        cmocka_unit_test_setup_teardown(test_barrier, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_broadcasts_rank0, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_unused_as_zeros, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_unused_none, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_one_bucket, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_no_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ddp_mlp_matches_one_process, setup, teardown),
        cmocka_unit_test_setup_teardown(test_zero1_matches_ddp, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sharded_loader, setup, teardown),
    };
    int failed = tu_run_tests(tests);
    ct_status fst = ct_dist_finalize();
    if (fst != CT_OK) fprintf(stderr, "ct_dist_finalize: %s\n", ct_last_error());
    return failed || fst != CT_OK;
}
