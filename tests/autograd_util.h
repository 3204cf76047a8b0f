/* What the autograd test programs share: shapes written inline, leaves,
 * gradcheck with the suite's tolerances, a backward with a ones gradient,
 * and value and shape checks. Included by tests/test_autograd_*.c after
 * test_util.h and cmocka.h. */
#ifndef CTEN_TESTS_AUTOGRAD_UTIL_H
#define CTEN_TESTS_AUTOGRAD_UTIL_H

#include "test_util.h"

typedef struct shp {
    int nd;
    int64_t s[4];
} shp;

#define SHP(...) {(int)(sizeof((int64_t[]){__VA_ARGS__}) / sizeof(int64_t)), {__VA_ARGS__}}
#define SHP0 {0, {0}}

/* A leaf of dtype from vals (row-major), requiring grad. */
static inline ct_tensor *leaf_of(const double *vals, int nd, const int64_t *shape, ct_dtype dt) {
    ct_tensor *t = tu_from_f64(vals, nd, shape, dt);
    assert_non_null(t);
    assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

/* ct_gradcheck with eps 1e-6, atol 1e-5, rtol 1e-4; what names the case
 * when it fails. */
static inline void gradcheck_ok(const char *what, ct_gradcheck_fn fn, void *ctx, int n,
                                ct_tensor *const *in) {
    ct_status st = ct_gradcheck(fn, ctx, n, in, 1e-6, 1e-5, 1e-4);
    if (st != CT_OK) {
        fprintf(stderr, "%s: %s\n", what, ct_last_error());
        fail();
    }
}

/* Backward of out with grad_out of ones, keeping the graph when retain. */
static inline void backward_ones_retain(ct_tensor *out, bool retain) {
    ct_tensor *g = ct_tensor_ones_like(out);
    assert_non_null(g);
    ct_status st = ct_backward(out, g, retain);
    if (st != CT_OK) fprintf(stderr, "backward: %s\n", ct_last_error());
    assert_int_equal(st, CT_OK);
    ct_tensor_release(g);
}

static inline void backward_ones(ct_tensor *out) { backward_ones_retain(out, false); }

/* Optimizer alg of the five (0 SGD with momentum and weight decay, 1 AdamW, 2 Adam with
 * amsgrad, 3 centered RMSprop with momentum, 4 Adagrad with lr decay) over ps, with the
 * options that take their kernels' other paths; NULL with the error when creation fails. */
#define N_OPTIM_ALGS 5
static inline ct_optimizer *optimizer_of(int alg, ct_params *ps) {
    switch (alg) {
    case 0: return ct_optim_sgd_new(ps, 0.1, 0.9, 0.0, 0.01, false);
    case 1: return ct_optim_adamw_new(ps, 0.05, 0.9, 0.99, 1e-8, 0.1);
    case 2: return ct_optim_adam_new(ps, 0.05, 0.9, 0.99, 1e-8, 0.01, true);
    case 3: return ct_optim_rmsprop_new(ps, 0.01, 0.99, 1e-8, 0.0, 0.9, true);
    default: return ct_optim_adagrad_new(ps, 0.1, 0.01, 0.0, 0.1, 1e-10);
    }
}

static inline void release_all(int n, ct_tensor **ts) {
    for (int i = 0; i < n; i++) ct_tensor_release(ts[i]);
}

static inline void check_shape(const ct_tensor *t, int nd, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_ndim(t), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(t)[d], shape[d]);
}

/* t's n values against ref within rtol/atol. */
static inline void check_values(const ct_tensor *t, const double *ref, int64_t n, double rtol,
                                double atol) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_numel(t), n);
    double *v = tu_values(t);
    tu_assert_close(v, ref, n, rtol, atol);
    free(v);
}

#endif
