/* Autograd of the copying front ends: cat, stack, reshape, clone, contiguous,
 * to_dtype. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "core/tensor_impl.h"
#include "test_util.h"

#include "test_fixture.h"

static ct_tensor *leaf(int ndim, const int64_t *shape) {
    ct_tensor *t = tu_rand(ndim, shape, CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

typedef struct join_ctx {
    int n, dim;
    bool stack;
} join_ctx;

/* The join, then a non-linear op so each input's gradient differs per element. */
static ct_tensor *join_fn(ct_tensor *const *in, void *vctx) {
    join_ctx *c = vctx;
    ct_tensor *j = c->stack ? ct_stack(c->n, in, c->dim) : ct_cat(c->n, in, c->dim);
    ct_tensor *y = ct_mul(j, j);
    ct_tensor_release(j);
    return y;
}

static void test_cat_grad(void **state) {
    (void)state;
    /* Three inputs, the middle one without grad, joined on a middle dim. */
    ct_tensor *in[3] = {leaf(CT_SHAPE(2, 3, 4)), tu_rand(CT_SHAPE(2, 1, 4), CT_F64, -1, 1, NULL),
                        leaf(CT_SHAPE(2, 2, 4))};
    join_ctx c = {3, 1, false};
    assert_int_equal(ct_gradcheck(join_fn, &c, 3, in, 1e-6, 1e-6, 1e-5), CT_OK);
    assert_null(ct_grad(in[1]));
    ct_tensor *y = join_fn(in, &c);
    assert_string_equal(ct_grad_fn_name(y), "MulBackward");
    ct_tensor_release(y);
    /* Negative dim, and a non-contiguous input. */
    ct_tensor *nc = tu_noncontig(in[0]);
    assert_int_equal(ct_requires_grad_(nc, true), CT_OK);
    ct_tensor *in2[2] = {nc, in[2]};
    join_ctx c2 = {2, -2, false};
    assert_int_equal(ct_gradcheck(join_fn, &c2, 2, in2, 1e-6, 1e-6, 1e-5), CT_OK);
    ct_tensor_release(nc);
    for (int i = 0; i < 3; i++) ct_tensor_release(in[i]);
}

static void test_cat_many_and_skipped(void **state) {
    (void)state;
    /* More inputs than a graph node holds: joined in groups. */
    ct_tensor *in[9];
    for (int i = 0; i < 9; i++) in[i] = leaf(CT_SHAPE(i % 3 + 1, 2));
    join_ctx c = {9, 0, false};
    assert_int_equal(ct_gradcheck(join_fn, &c, 9, in, 1e-6, 1e-6, 1e-5), CT_OK);
    for (int i = 0; i < 9; i++) ct_tensor_release(in[i]);
    /* A 1-d empty tensor is left out of cat, as in PyTorch, and gets no gradient. */
    ct_tensor *e = ct_tensor_zeros(CT_SHAPE(0), CT_F64, CT_CPU);
    assert_int_equal(ct_requires_grad_(e, true), CT_OK);
    ct_tensor *in2[3] = {leaf(CT_SHAPE(2, 3)), e, leaf(CT_SHAPE(1, 3))};
    join_ctx c2 = {3, 0, false};
    assert_int_equal(ct_gradcheck(join_fn, &c2, 3, in2, 1e-6, 1e-6, 1e-5), CT_OK);
    for (int i = 0; i < 3; i++) ct_tensor_release(in2[i]);
}

static void test_stack_grad(void **state) {
    (void)state;
    for (int n = 2; n <= 8; n += 6) {
        ct_tensor *in[8];
        for (int i = 0; i < n; i++) in[i] = leaf(CT_SHAPE(3, 2));
        for (int dim = -3; dim <= 2; dim += 2) {
            join_ctx c = {n, dim, true};
            assert_int_equal(ct_gradcheck(join_fn, &c, n, in, 1e-6, 1e-6, 1e-5), CT_OK);
        }
        for (int i = 0; i < n; i++) ct_tensor_release(in[i]);
    }
}

static void test_cat_grad_values(void **state) {
    (void)state;
    /* d(sum(cat(a, b) * w))/da is the slice of w that a filled. */
    double *av, *bv, *wv;
    ct_tensor *a = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, &av);
    ct_tensor *b = tu_rand(CT_SHAPE(2, 2), CT_F32, -1, 1, &bv);
    ct_tensor *w = tu_rand(CT_SHAPE(2, 5), CT_F32, -1, 1, &wv);
    ct_requires_grad_(a, true);
    ct_requires_grad_(b, true);
    ct_scope *s = ct_scope_begin();
    ct_tensor *loss = ct_sum(ct_mul(ct_cat(2, (ct_tensor *const[]){a, b}, 1), w), CT_NONE, false);
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    ct_scope_end(s);
    assert_int_equal(ct_tensor_dtype(ct_grad(a)), CT_F32);
    double *ga = tu_values(ct_grad(a)), *gb = tu_values(ct_grad(b));
    for (int r = 0; r < 2; r++) {
        for (int k = 0; k < 3; k++) assert_true(ga[r * 3 + k] == wv[r * 5 + k]);
        for (int k = 0; k < 2; k++) assert_true(gb[r * 2 + k] == wv[r * 5 + 3 + k]);
    }
    free(ga);
    free(gb);
    free(av);
    free(bv);
    free(wv);
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(w);
}

typedef enum conv_kind { K_RESHAPE, K_FLATTEN, K_CLONE, K_CONTIGUOUS, K_TO_F32 } conv_kind;

static ct_tensor *conv_fn(ct_tensor *const *in, void *vctx) {
    conv_kind k = *(conv_kind *)vctx;
    ct_tensor *t = NULL;
    switch (k) {
    case K_RESHAPE: t = ct_reshape(in[0], CT_SHAPE(3, -1)); break;
    case K_FLATTEN: t = ct_flatten(in[0], 0, -1); break;
    case K_CLONE: t = ct_clone(in[0]); break;
    case K_CONTIGUOUS: t = ct_contiguous(in[0]); break;
    case K_TO_F32: {
        ct_tensor *f = ct_to_dtype(in[0], CT_F32);
        t = ct_to_dtype(f, CT_F64);
        ct_tensor_release(f);
        break;
    }
    }
    ct_tensor *y = ct_mul(t, t);
    ct_tensor_release(t);
    return y;
}

static void test_copies_grad(void **state) {
    (void)state;
    ct_tensor *x = leaf(CT_SHAPE(2, 3, 2));
    ct_tensor *nc = tu_noncontig(x); /* reshape and contiguous must copy here */
    ct_requires_grad_(nc, true);
    for (conv_kind k = K_RESHAPE; k <= K_TO_F32; k++) {
        ct_tensor *in[1] = {k % 2 ? x : nc};
        /* A round trip through float32 rounds the perturbation away unless the
         * step is large; central differences of a square are exact anyway. */
        double eps = k == K_TO_F32 ? 1e-2 : 1e-6, tol = k == K_TO_F32 ? 1e-4 : 1e-5;
        ct_status st = ct_gradcheck(conv_fn, &k, 1, in, eps, tol, tol);
        if (st) fprintf(stderr, "kind %d: %s\n", (int)k, ct_last_error());
        assert_int_equal(st, CT_OK);
    }
    ct_tensor_release(nc);
    ct_tensor_release(x);
}

/* A backward op reached by backward is an error naming it, not a silent zero. */
static void test_no_double_backward(void **state) {
    (void)state;
    ct_tensor *x = leaf(CT_SHAPE(3, 4));
    ct_scope *s = ct_scope_begin();
    ct_tensor *y = ct_softmax(x, 1);
    ct_tensor *g = ct_mul(x, x); /* a gradient that itself has history */
    ct_tensor *gx = ct_softmax_backward(g, y, 1);
    assert_non_null(gx);
    assert_true(ct_requires_grad(gx));
    assert_string_equal(ct_grad_fn_name(gx), "softmax_backward");
    ct_status st = ct_backward(ct_sum(gx, CT_NONE, false), NULL, false);
    tu_assert_error(st, CT_ERR_AUTOGRAD, "ct_softmax_backward", "no backward formula");
    /* Without history on the inputs nothing is recorded. */
    ct_tensor *plain = ct_softmax_backward(ct_detach(g), ct_detach(y), 1);
    assert_false(ct_requires_grad(plain));
    ct_scope_end(s);
    ct_tensor_release(x);
}

static ct_tensor *returns_null(ct_tensor *const *in, void *ctx) {
    (void)in;
    (void)ctx;
    return NULL;
}

/* Misuse of ct_backward and ct_gradcheck is refused by name, never
 * converted or answered from a stale status. */
static void test_backward_gradcheck_misuse(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *w = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    ct_tensor *y = ct_mul(w, w);
    ct_tensor *gi = ct_tensor_ones(CT_SHAPE(4), CT_I64, CT_CPU);
    ct_tensor *gb = ct_tensor_ones(CT_SHAPE(4), CT_BOOL, CT_CPU);
    tu_assert_error(ct_backward(y, gi, true), CT_ERR_DTYPE, "ct_backward", "floating", "int64");
    tu_assert_error(ct_backward(y, gb, true), CT_ERR_DTYPE, "ct_backward", "floating", "bool");
    assert_null(ct_grad(w));
    ct_tensor *x = ct_tensor_ones(CT_SHAPE(2), CT_F64, CT_CPU);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    /* A stale error from an earlier call must not pass for fn's. */
    tu_assert_null_error(ct_matmul(NULL, NULL), CT_ERR_INVALID_ARG, "ct_matmul");
    tu_assert_error(ct_gradcheck(returns_null, NULL, 1, &x, 1e-6, 1e-5, 1e-3),
                    CT_ERR_INVALID_ARG, "ct_gradcheck", "fn returned NULL");
    tu_assert_error(ct_gradcheck(NULL, NULL, 1, &x, 1e-6, 1e-5, 1e-3), CT_ERR_INVALID_ARG,
                    "ct_gradcheck", "fn is NULL");
    tu_assert_error(ct_gradcheck(returns_null, NULL, -1, &x, 1e-6, 1e-5, 1e-3),
                    CT_ERR_INVALID_ARG, "ct_gradcheck", "n must be >= 0", "-1");
    tu_assert_error(ct_gradcheck(returns_null, NULL, 2, NULL, 1e-6, 1e-5, 1e-3),
                    CT_ERR_INVALID_ARG, "ct_gradcheck", "inputs is NULL");
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cat_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cat_many_and_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stack_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cat_grad_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copies_grad, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_double_backward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backward_gradcheck_misuse, setup, teardown),
    };
    return tu_run_tests(tests);
}
