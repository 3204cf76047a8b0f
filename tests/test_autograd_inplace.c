/* In-place ops on tensors with history (PyTorch's rebase): every in-place
 * op's gradients against its out-of-place form, in float64, for the
 * destination's history and an operand that requires grad; chains of
 * in-place ops under gradcheck; the node that replaces the destination's
 * grad_fn; a plain destination joining the graph; dtype kept; and the
 * refusals: a leaf that requires grad (PyTorch's message), memory another
 * tensor shares (a view, its base, a tensor saved for backward), and the
 * saved-tensor version check of a write made in no-grad mode. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "autograd_util.h"
#include "test_fixture.h"

typedef struct ip_case {
    const char *name, *node;
    ct_status (*inplace)(ct_tensor *a, ct_tensor *b);
    ct_tensor *(*outplace)(ct_tensor *a, ct_tensor *b);
    bool binary;
    double lo, hi; /* the destination's range before the op */
} ip_case;

static unsigned version_of(const ct_tensor *t) { return atomic_load(&t->storage->version); }

static ct_status ip_add(ct_tensor *a, ct_tensor *b) { return ct_add_(a, b); }
static ct_status ip_add_alpha(ct_tensor *a, ct_tensor *b) { return ct_add_alpha_(a, b, 0.5); }
static ct_status ip_sub(ct_tensor *a, ct_tensor *b) { return ct_sub_(a, b); }
static ct_status ip_mul(ct_tensor *a, ct_tensor *b) { return ct_mul_(a, b); }
static ct_status ip_div(ct_tensor *a, ct_tensor *b) { return ct_div_(a, b); }
static ct_status ip_pow(ct_tensor *a, ct_tensor *b) { return ct_pow_(a, b); }
static ct_status ip_adds(ct_tensor *a, ct_tensor *b) { (void)b; return ct_add_scalar_(a, 1.5); }
static ct_status ip_subs(ct_tensor *a, ct_tensor *b) { (void)b; return ct_sub_scalar_(a, 1.5); }
static ct_status ip_muls(ct_tensor *a, ct_tensor *b) { (void)b; return ct_mul_scalar_(a, -1.5); }
static ct_status ip_divs(ct_tensor *a, ct_tensor *b) { (void)b; return ct_div_scalar_(a, 1.5); }
static ct_status ip_clamp(ct_tensor *a, ct_tensor *b) { (void)b; return ct_clamp_(a, 0.8, 1.9); }
static ct_status ip_neg(ct_tensor *a, ct_tensor *b) { (void)b; return ct_neg_(a); }
static ct_status ip_exp(ct_tensor *a, ct_tensor *b) { (void)b; return ct_exp_(a); }
static ct_status ip_sqrt(ct_tensor *a, ct_tensor *b) { (void)b; return ct_sqrt_(a); }
static ct_status ip_relu(ct_tensor *a, ct_tensor *b) { (void)b; return ct_relu_(a); }

static ct_tensor *op_add(ct_tensor *a, ct_tensor *b) { return ct_add(a, b); }
static ct_tensor *op_add_alpha(ct_tensor *a, ct_tensor *b) { return ct_add_alpha(a, b, 0.5); }
static ct_tensor *op_sub(ct_tensor *a, ct_tensor *b) { return ct_sub(a, b); }
static ct_tensor *op_mul(ct_tensor *a, ct_tensor *b) { return ct_mul(a, b); }
static ct_tensor *op_div(ct_tensor *a, ct_tensor *b) { return ct_div(a, b); }
static ct_tensor *op_pow(ct_tensor *a, ct_tensor *b) { return ct_pow(a, b); }
static ct_tensor *op_adds(ct_tensor *a, ct_tensor *b) { (void)b; return ct_add_scalar(a, 1.5); }
static ct_tensor *op_subs(ct_tensor *a, ct_tensor *b) { (void)b; return ct_sub_scalar(a, 1.5); }
static ct_tensor *op_muls(ct_tensor *a, ct_tensor *b) { (void)b; return ct_mul_scalar(a, -1.5); }
static ct_tensor *op_divs(ct_tensor *a, ct_tensor *b) { (void)b; return ct_div_scalar(a, 1.5); }
static ct_tensor *op_clamp(ct_tensor *a, ct_tensor *b) { (void)b; return ct_clamp(a, 0.8, 1.9); }
static ct_tensor *op_neg(ct_tensor *a, ct_tensor *b) { (void)b; return ct_neg(a); }
static ct_tensor *op_exp(ct_tensor *a, ct_tensor *b) { (void)b; return ct_exp(a); }
static ct_tensor *op_sqrt(ct_tensor *a, ct_tensor *b) { (void)b; return ct_sqrt(a); }
static ct_tensor *op_relu(ct_tensor *a, ct_tensor *b) { (void)b; return ct_relu(a); }

static const ip_case cases[] = {
    {"ct_add_", "AddBackward", ip_add, op_add, true, -1, 1},
    {"ct_add_alpha_", "AddBackward", ip_add_alpha, op_add_alpha, true, -1, 1},
    {"ct_sub_", "SubBackward", ip_sub, op_sub, true, -1, 1},
    {"ct_mul_", "MulBackward", ip_mul, op_mul, true, -1, 1},
    {"ct_div_", "DivBackward", ip_div, op_div, true, -1, 1},
    {"ct_pow_", "PowBackward", ip_pow, op_pow, true, 0.5, 1.5},
    {"ct_add_scalar_", "AddBackward", ip_adds, op_adds, false, -1, 1},
    {"ct_sub_scalar_", "SubBackward", ip_subs, op_subs, false, -1, 1},
    {"ct_mul_scalar_", "MulBackward", ip_muls, op_muls, false, -1, 1},
    {"ct_div_scalar_", "DivBackward", ip_divs, op_divs, false, -1, 1},
    {"ct_clamp_", "ClampBackward", ip_clamp, op_clamp, false, 0.5, 2.2},
    {"ct_neg_", "NegBackward", ip_neg, op_neg, false, -1, 1},
    {"ct_exp_", "ExpBackward", ip_exp, op_exp, false, -1, 1},
    {"ct_sqrt_", "SqrtBackward", ip_sqrt, op_sqrt, false, 0.5, 1.5},
    {"ct_relu_", "ReluBackward", ip_relu, op_relu, false, -1, 1},
};
#define NCASES (sizeof cases / sizeof cases[0])

/* y = sum((x0 + s) * w) with x0 = a * 0.5 (a's values in [2 lo, 2 hi]
 * give x0 in the case's range), then op on x (in place or not), then
 * sum(x * w): the graph after the op reads x through a second op. */
static ct_tensor *forward(const ip_case *c, ct_tensor *a, ct_tensor *b, ct_tensor *w,
                          bool in_place) {
    ct_tensor *x = ct_mul_scalar(a, 0.5);
    assert_non_null(x);
    if (in_place) {
        ct_status st = c->inplace(x, b);
        if (st != CT_OK) fprintf(stderr, "%s: %s\n", c->name, ct_last_error());
        assert_int_equal(st, CT_OK);
    } else {
        ct_tensor *y = c->outplace(x, b);
        ct_tensor_release(x);
        x = y;
    }
    ct_tensor *l = ct_sum(ct_mul(x, w), CT_NONE, false);
    ct_tensor_release(x);
    return l;
}

static void test_gradients_match_out_of_place(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {3, 5}, row[1] = {5};
    for (size_t ci = 0; ci < NCASES; ci++) {
        const ip_case *c = &cases[ci];
        ct_scope *s = ct_scope_begin();
        ct_tensor *a[2], *b[2];
        ct_tensor *a0 = tu_rand(2, sh, CT_F64, 2 * c->lo, 2 * c->hi, NULL);
        ct_tensor *b0 = tu_rand(1, row, CT_F64, 0.5, 1.5, NULL);
        ct_tensor *w = tu_rand(2, sh, CT_F64, -1, 1, NULL);
        double lv[2];
        for (int k = 0; k < 2; k++) {
            a[k] = ct_clone(a0), b[k] = ct_clone(b0);
            ct_requires_grad_(a[k], true);
            ct_requires_grad_(b[k], c->binary);
            ct_tensor *l = forward(c, a[k], b[k], w, k == 0);
            assert_int_equal(ct_tensor_item(l, &lv[k]), CT_OK);
            backward_ones(l);
        }
        assert_true(fabs(lv[0] - lv[1]) <= 1e-13 * fabs(lv[1]));
        double *g0 = tu_values(ct_grad(a[0])), *g1 = tu_values(ct_grad(a[1]));
        tu_assert_close(g0, g1, 15, 1e-13, 1e-13);
        free(g0), free(g1);
        if (c->binary) {
            g0 = tu_values(ct_grad(b[0])), g1 = tu_values(ct_grad(b[1]));
            tu_assert_close(g0, g1, 5, 1e-13, 1e-13);
            free(g0), free(g1);
        }
        ct_scope_end(s);
    }
}

/* The node replacing x's grad_fn is the op's, and its input is x's old history. */
static void test_rebase_node(void **state) {
    (void)state;
    int64_t sh[1] = {4};
    for (size_t ci = 0; ci < NCASES; ci++) {
        const ip_case *c = &cases[ci];
        ct_scope *s = ct_scope_begin();
        ct_tensor *a = tu_rand(1, sh, CT_F64, 2 * c->lo, 2 * c->hi, NULL);
        ct_tensor *b = tu_rand(1, sh, CT_F64, 0.5, 1.5, NULL);
        ct_requires_grad_(a, true);
        ct_tensor *x = ct_mul_scalar(a, 0.5);
        assert_string_equal(ct_grad_fn_name(x), "MulBackward");
        assert_int_equal(c->inplace(x, b), CT_OK);
        assert_string_equal(ct_grad_fn_name(x), c->node);
        assert_false(ct_is_leaf(x));
        ct_scope_end(s);
    }
}

/* A chain of in-place ops, differentiated by gradcheck. */
static ct_tensor *chain(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    ct_tensor *x = ct_mul_scalar(in[0], 0.5);
    if (!x || ct_add_(x, in[1]) || ct_mul_(x, in[1]) || ct_add_scalar_(x, 2.0) || ct_sqrt_(x) ||
        ct_div_(x, in[1]) || ct_exp_(x) || ct_clamp_(x, -INFINITY, 50.0) || ct_neg_(x)) {
        fprintf(stderr, "chain: %s\n", ct_last_error());
        ct_tensor_release(x);
        return NULL;
    }
    return x;
}

static void test_chain_gradcheck(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {2, 3}, row[1] = {3};
    ct_tensor *a = tu_rand(2, sh, CT_F64, 0, 1, NULL), *b = tu_rand(1, row, CT_F64, 0.5, 1, NULL);
    ct_requires_grad_(a, true);
    ct_requires_grad_(b, true);
    gradcheck_ok("in-place chain", chain, NULL, 2, (ct_tensor *[]){a, b});
    /* against the closed form: x = -exp(sqrt((a/2 + b) b + 2) / b) */
    ct_tensor *y = chain((ct_tensor *[]){a, b}, NULL);
    double *av = tu_values(a), *bv = tu_values(b), *yv = tu_values(y), ref[6];
    for (int i = 0; i < 6; i++) {
        double bb = bv[i % 3];
        ref[i] = -exp(sqrt((av[i] * 0.5 + bb) * bb + 2) / bb);
    }
    tu_assert_close(yv, ref, 6, 1e-14, 0);
    free(av), free(bv), free(yv);
    release_all(3, (ct_tensor *[]){a, b, y});
}

/* A plain destination updated from an operand that requires grad joins the
 * graph; its dtype stays, the gradient returns in the operand's. */
static void test_plain_destination_and_dtype(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {2, 3};
    double *bv;
    ct_tensor *q = ct_tensor_ones(2, sh, CT_F32, CT_CPU);
    ct_tensor *b = tu_rand(2, sh, CT_F64, -1, 1, &bv);
    ct_requires_grad_(b, true);
    assert_int_equal(ct_mul_scalar_(q, 3.0), CT_OK); /* nothing requires grad: plain */
    assert_true(ct_is_leaf(q) && !ct_requires_grad(q));
    assert_int_equal(ct_mul_(q, b), CT_OK);
    assert_int_equal(ct_tensor_dtype(q), CT_F32);
    assert_true(ct_requires_grad(q) && !ct_is_leaf(q));
    ct_tensor *sq = ct_square(q), *l = ct_sum(sq, CT_NONE, false);
    backward_ones(l);
    /* d/db sum((3 b)^2) = 18 b, through the float32 rounding of q */
    double ref[6];
    for (int i = 0; i < 6; i++) ref[i] = 18 * bv[i];
    double *g = tu_values(ct_grad(b));
    assert_int_equal(ct_tensor_dtype(ct_grad(b)), CT_F64);
    tu_assert_close(g, ref, 6, 1e-6, 1e-6);
    free(g), free(bv);
    release_all(4, (ct_tensor *[]){q, b, sq, l});
}

static void test_refusals(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {2, 3};
    ct_tensor *a = tu_rand(2, sh, CT_F64, 0.5, 1, NULL), *b = tu_rand(2, sh, CT_F64, 0.5, 1, NULL);
    ct_requires_grad_(a, true);
    /* a leaf that requires grad, as PyTorch says it */
    tu_assert_error(ct_add_(a, b), CT_ERR_AUTOGRAD, "ct_add_",
                    "a leaf Variable that requires grad", "in-place operation");
    /* a view of a tensor with history, and the tensor while its view lives */
    ct_tensor *x = ct_mul_scalar(a, 2.0);
    ct_tensor *v = ct_narrow(x, 1, 0, 2);
    unsigned vx = version_of(x);
    tu_assert_error(ct_add_scalar_(v, 1), CT_ERR_AUTOGRAD, "ct_add_scalar_",
                    "shares its memory", "NarrowBackward");
    tu_assert_error(ct_add_scalar_(x, 1), CT_ERR_AUTOGRAD, "ct_add_scalar_",
                    "shares its memory", "MulBackward");
    assert_int_equal(version_of(x), vx);
    /* once the view is gone the update is recorded */
    ct_tensor_release(v);
    assert_int_equal(ct_add_scalar_(x, 1), CT_OK);
    /* a tensor an op saved for backward (exp saves its result) */
    ct_tensor *e = ct_exp(x);
    tu_assert_error(ct_mul_scalar_(e, 2), CT_ERR_AUTOGRAD, "ct_mul_scalar_", "shares its memory",
                    "ExpBackward");
    /* the saved-tensor version check fires for a write in no-grad mode */
    ct_tensor *y = ct_sum(e, CT_NONE, false);
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(e, 2), CT_OK);
    ct_no_grad_end(prev);
    ct_tensor *one = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, one, false), CT_ERR_AUTOGRAD, "ct_backward", "ExpBackward",
                    "modified by an in-place operation");
    /* a bad operand changes nothing, history included */
    ct_tensor *z = ct_mul_scalar(a, 3.0);
    int64_t sh2[1] = {4};
    ct_tensor *bad = ct_tensor_ones(1, sh2, CT_F64, CT_CPU);
    tu_assert_error(ct_add_(z, bad), CT_ERR_SHAPE, "ct_add_");
    assert_string_equal(ct_grad_fn_name(z), "MulBackward");
    release_all(9, (ct_tensor *[]){a, b, x, e, y, one, z, bad, NULL});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gradients_match_out_of_place, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rebase_node, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chain_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_destination_and_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
