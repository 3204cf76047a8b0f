/* In-place ops on tensors with history (PyTorch's rebase): every in-place
 * op's gradients against its out-of-place form, in float64, for the
 * destination's history and an operand that requires grad; chains of
 * in-place ops under gradcheck; the node that replaces the destination's
 * grad_fn; a plain destination joining the graph; dtype kept; a tensor
 * saved for backward written (the version check refuses the backward).
 * Writes through views (PyTorch's CopySlices), against gradients written
 * by hand in double: narrow, select of a transpose, a view of a view, a
 * binary op whose operand requires grad, the base written while a view of
 * it lives (the view's history rebuilt), ct_copy_ into the rows of a plain
 * buffer, ct_fill_/ct_zero_/ct_copy_ on views and on tensors with history,
 * float64, float32 and bfloat16; the refusals PyTorch makes (a leaf or a
 * view of one, a view made in no-grad mode, split/chunk/unbind pieces, an
 * expanded view); no reference cycle; and gradcheck over writes through
 * views. */
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
    tu_assert_error(ct_fill_(a, 1), CT_ERR_AUTOGRAD, "ct_fill_",
                    "a leaf Variable that requires grad");
    /* a tensor an op saved for backward (exp saves its result) is written:
     * allowed, and the saved-tensor version check refuses the backward */
    ct_tensor *x = ct_mul_scalar(a, 2.0);
    ct_tensor *e = ct_exp(x);
    ct_tensor *y = ct_sum(e, CT_NONE, false);
    assert_int_equal(ct_mul_scalar_(e, 2), CT_OK);
    ct_tensor *one = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, one, false), CT_ERR_AUTOGRAD, "ct_backward", "ExpBackward",
                    "modified by an in-place operation");
    /* and so does a write in no-grad mode, through a view made in grad mode */
    ct_tensor *e2 = ct_exp(x), *y2 = ct_sum(e2, CT_NONE, false);
    ct_tensor *v = ct_narrow(e2, 1, 0, 2);
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_mul_scalar_(v, 2), CT_OK);
    ct_no_grad_end(prev);
    tu_assert_error(ct_backward(y2, one, false), CT_ERR_AUTOGRAD, "ct_backward", "ExpBackward",
                    "modified by an in-place operation");
    /* a bad operand changes nothing, history included */
    ct_tensor *z = ct_mul_scalar(a, 3.0);
    int64_t sh2[1] = {4};
    ct_tensor *bad = ct_tensor_ones(1, sh2, CT_F64, CT_CPU);
    tu_assert_error(ct_add_(z, bad), CT_ERR_SHAPE, "ct_add_");
    assert_string_equal(ct_grad_fn_name(z), "MulBackward");
    release_all(12, (ct_tensor *[]){a, b, x, e, y, one, e2, y2, v, z, bad, NULL});
}

/* ---- writes through views (CopySlices) -------------------------------------------------- */

static double tol(ct_dtype dt) { return dt == CT_F64 ? 1e-13 : dt == CT_F32 ? 1e-5 : 2e-2; }

/* Asserts t's gradient against ref (n values). */
static void check_grad(ct_tensor *t, const double *ref, int64_t n, double rtol) {
    ct_tensor *g = ct_grad(t);
    assert_non_null(g);
    assert_int_equal(ct_tensor_dtype(g), ct_tensor_dtype(t));
    check_values(g, ref, n, rtol, rtol);
}

/* y = x * x, v = narrow(y, 1, 2, 3), v *= 3; loss = sum(y * w) + sum(v * u):
 * dx = 2 x m (w + u in the region), m 3 in the region and 1 elsewhere. */
static void test_narrow_mul(void **state) {
    (void)state;
    tu_seed();
    const ct_dtype dts[] = {CT_F64, CT_F32, CT_BF16};
    int64_t sh[2] = {4, 6}, vsh[2] = {4, 3};
    for (int di = 0; di < 3; di++) {
        ct_dtype dt = dts[di];
        ct_scope *s = ct_scope_begin();
        double *xv, *wv, *uv;
        ct_tensor *x = tu_rand(2, sh, dt, -2, 2, &xv);
        ct_tensor *w = tu_rand(2, sh, dt, -1, 1, &wv), *u = tu_rand(2, vsh, dt, -1, 1, &uv);
        ct_requires_grad_(x, true);
        ct_tensor *y = ct_mul(x, x);
        ct_tensor *v = ct_narrow(y, 1, 2, 3);
        assert_string_equal(ct_grad_fn_name(v), "NarrowBackward");
        assert_int_equal(ct_mul_scalar_(v, 3), CT_OK);
        assert_string_equal(ct_grad_fn_name(y), "CopySlices");
        assert_string_equal(ct_grad_fn_name(v), "AsStridedBackward");
        double ref[24], yref[24];
        for (int i = 0; i < 24; i++) {
            int c = i % 6;
            bool in = c >= 2 && c < 5;
            double m = in ? 3 : 1;
            double sq = dt == CT_F64 ? xv[i] * xv[i] : tu_round(xv[i] * xv[i], dt);
            yref[i] = sq * m;
            ref[i] = 2 * xv[i] * m * (wv[i] + (in ? uv[(i / 6) * 3 + c - 2] : 0));
        }
        check_values(y, yref, 24, tol(dt), tol(dt));
        ct_tensor *l = ct_add(ct_sum(ct_mul(y, w), CT_NONE, false),
                              ct_sum(ct_mul(v, u), CT_NONE, false));
        backward_ones(l);
        check_grad(x, ref, 24, dt == CT_BF16 ? 4e-2 : tol(dt));
        free(xv), free(wv), free(uv);
        ct_scope_end(s);
    }
}

/* A column of y, reached as select(transpose(y)) (strided), gets b added;
 * the transpose made before the write is read after it (its history is
 * rebuilt from y's): loss = sum(y * w) + sum(t * u). */
static void test_select_transpose_add(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {3, 4}, ush[2] = {4, 3}, bsh[1] = {3};
    for (int di = 0; di < 2; di++) {
        ct_dtype dt = di ? CT_F32 : CT_F64;
        ct_scope *s = ct_scope_begin();
        double *xv, *wv, *uv, *bv;
        ct_tensor *x = tu_rand(2, sh, dt, -2, 2, &xv), *b = tu_rand(1, bsh, dt, -1, 1, &bv);
        ct_tensor *w = tu_rand(2, sh, dt, -1, 1, &wv), *u = tu_rand(2, ush, dt, -1, 1, &uv);
        ct_requires_grad_(x, true);
        ct_requires_grad_(b, true);
        ct_tensor *y = ct_mul(x, x);
        ct_tensor *t = ct_transpose(y, 0, 1);
        ct_tensor *col = ct_select(t, 0, 1);
        assert_false(ct_tensor_is_contiguous(col));
        assert_int_equal(ct_add_(col, b), CT_OK);
        assert_string_equal(ct_grad_fn_name(t), "AsStridedBackward");
        double yref[12], dx[12], db[3];
        for (int i = 0; i < 3; i++) {
            db[i] = wv[i * 4 + 1] + uv[1 * 3 + i];
            for (int j = 0; j < 4; j++) {
                int k = i * 4 + j;
                yref[k] = xv[k] * xv[k] + (j == 1 ? bv[i] : 0);
                dx[k] = 2 * xv[k] * (wv[k] + uv[j * 3 + i]);
            }
        }
        check_values(y, yref, 12, tol(dt), tol(dt));
        ct_tensor *l = ct_add(ct_sum(ct_mul(y, w), CT_NONE, false),
                              ct_sum(ct_mul(t, u), CT_NONE, false));
        backward_ones(l);
        check_grad(x, dx, 12, tol(dt));
        check_grad(b, db, 3, tol(dt));
        free(xv), free(wv), free(uv), free(bv);
        ct_scope_end(s);
    }
}

/* A view of a view (a strided slice, then rows of it) multiplied by c that
 * requires grad: the root base y is rebased, c's gradient flows. */
static void test_view_of_view_mul(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {4, 6}, csh[2] = {2, 3};
    ct_scope *s = ct_scope_begin();
    double *xv, *wv, *cv;
    ct_tensor *x = tu_rand(2, sh, CT_F64, -2, 2, &xv), *c = tu_rand(2, csh, CT_F64, -2, 2, &cv);
    ct_tensor *w = tu_rand(2, sh, CT_F64, -1, 1, &wv);
    ct_requires_grad_(x, true);
    ct_requires_grad_(c, true);
    ct_tensor *y = ct_mul(x, x);
    ct_tensor *v1 = ct_slice(y, 1, 0, 6, 2); /* [4, 3], columns 0, 2, 4 */
    ct_tensor *v2 = ct_narrow(v1, 0, 1, 2);  /* rows 1, 2 */
    assert_int_equal(ct_mul_(v2, c), CT_OK);
    assert_string_equal(ct_grad_fn_name(y), "CopySlices");
    ct_tensor *l = ct_sum(ct_mul(y, w), CT_NONE, false);
    backward_ones(l);
    double dx[24], dc[6];
    for (int i = 0; i < 24; i++) {
        int r = i / 6, col = i % 6;
        bool in = r >= 1 && r <= 2 && col % 2 == 0;
        double cc = in ? cv[(r - 1) * 3 + col / 2] : 1;
        dx[i] = 2 * xv[i] * cc * wv[i];
        if (in) dc[(r - 1) * 3 + col / 2] = xv[i] * xv[i] * wv[i];
    }
    check_grad(x, dx, 24, 1e-13);
    check_grad(c, dc, 6, 1e-13);
    free(xv), free(wv), free(cv);
    ct_scope_end(s);
}

/* The base itself written while a view of it lives: the view's history is
 * rebuilt from the base's new one when it is next read. */
static void test_base_written_view_read(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {3, 4}, ush[2] = {3, 2};
    ct_scope *s = ct_scope_begin();
    double *xv, *uv;
    ct_tensor *x = tu_rand(2, sh, CT_F64, -2, 2, &xv), *u = tu_rand(2, ush, CT_F64, -1, 1, &uv);
    ct_requires_grad_(x, true);
    ct_tensor *y = ct_mul(x, x);
    ct_tensor *v = ct_narrow(y, 1, 1, 2);
    assert_int_equal(ct_mul_scalar_(y, -2.5), CT_OK);
    assert_string_equal(ct_grad_fn_name(y), "MulBackward");
    assert_string_equal(ct_grad_fn_name(v), "AsStridedBackward");
    ct_tensor *l = ct_sum(ct_mul(v, u), CT_NONE, false);
    backward_ones(l);
    double dx[12];
    for (int i = 0; i < 12; i++) {
        int col = i % 4;
        dx[i] = col >= 1 && col <= 2 ? 2 * xv[i] * -2.5 * uv[(i / 4) * 2 + col - 1] : 0;
    }
    check_grad(x, dx, 12, 1e-13);
    free(xv), free(uv);
    ct_scope_end(s);
}

/* The C training-loop pattern: rows of a plain buffer filled with ct_copy_
 * from tensors with history (dtype cast and broadcast included), then a
 * loss on the buffer. A row view made before the copies requires grad
 * after them. */
static void test_copy_into_slices(void **state) {
    (void)state;
    tu_seed();
    enum { N = 5, M = 4 };
    int64_t sh[2] = {N + 2, M}, row[1] = {M}, one[1] = {1};
    ct_scope *s = ct_scope_begin();
    double *wv, *av[N], *bv, *cv;
    ct_tensor *out = ct_tensor_zeros(2, sh, CT_F64, CT_CPU);
    ct_tensor *w = tu_rand(2, sh, CT_F64, -1, 1, &wv);
    ct_tensor *first = ct_select(out, 0, 0);
    assert_false(ct_requires_grad(first));
    ct_tensor *a[N];
    for (int i = 0; i < N; i++) {
        a[i] = tu_rand(1, row, CT_F64, -2, 2, &av[i]);
        ct_requires_grad_(a[i], true);
        ct_tensor *src = ct_mul_scalar(ct_mul(a[i], a[i]), i + 1);
        ct_tensor *dst = ct_select(out, 0, i);
        assert_int_equal(ct_copy_(dst, src), CT_OK);
    }
    /* a float32 row (cast up) and a [1] value broadcast along the last row */
    ct_tensor *b = tu_rand(1, row, CT_F32, -2, 2, &bv), *c = tu_rand(1, one, CT_F64, -2, 2, &cv);
    ct_requires_grad_(b, true);
    ct_requires_grad_(c, true);
    assert_int_equal(ct_copy_(ct_narrow(ct_select(out, 0, N), 0, 0, M), b), CT_OK);
    assert_int_equal(ct_copy_(ct_select(out, 0, N + 1), c), CT_OK);
    assert_true(ct_requires_grad(out) && !ct_is_leaf(out));
    assert_string_equal(ct_grad_fn_name(out), "CopySlices");
    assert_true(ct_requires_grad(first));
    ct_tensor *l = ct_sum(ct_mul(out, w), CT_NONE, false);
    backward_ones(l);
    for (int i = 0; i < N; i++) {
        double ref[M];
        for (int j = 0; j < M; j++) ref[j] = 2 * (i + 1) * av[i][j] * wv[i * M + j];
        check_grad(a[i], ref, M, 1e-13);
        free(av[i]);
    }
    double db[M], dc = 0;
    for (int j = 0; j < M; j++) {
        db[j] = wv[N * M + j];
        dc += wv[(N + 1) * M + j];
    }
    check_grad(b, db, M, 1e-6);
    check_grad(c, &dc, 1, 1e-13);
    free(wv), free(bv), free(cv);
    ct_scope_end(s);
}

/* ct_fill_ / ct_zero_ through a view (zero gradient in the region) and on a
 * tensor with history (its old history gets zeros); ct_copy_ onto a tensor
 * with history (old history zeros, the source the gradient, summed over its
 * broadcast dim and cast back). */
static void test_fill_zero_copy_history(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {3, 4}, row[1] = {4};
    for (int di = 0; di < 2; di++) {
        ct_dtype dt = di ? CT_F32 : CT_F64;
        ct_scope *s = ct_scope_begin();
        double *xv, *wv, *bv;
        ct_tensor *x = tu_rand(2, sh, dt, -2, 2, &xv), *w = tu_rand(2, sh, dt, -1, 1, &wv);
        ct_requires_grad_(x, true);
        double dx[12], dxw[12], zero[12] = {0}, yref[12];
        /* fill_ through a non-contiguous view: column 2 */
        ct_tensor *y = ct_mul(x, x);
        assert_int_equal(ct_fill_(ct_select(y, 1, 2), 5.0), CT_OK);
        for (int i = 0; i < 12; i++) {
            bool in = i % 4 == 2;
            dx[i] = in ? 0 : 2 * xv[i] * wv[i];
            yref[i] = in ? 5.0 : xv[i] * xv[i];
        }
        check_values(y, yref, 12, tol(dt), tol(dt));
        backward_ones(ct_sum(ct_mul(y, w), CT_NONE, false));
        check_grad(x, dx, 12, tol(dt));
        /* zero_ through rows 1..2 */
        ct_zero_grad(x);
        y = ct_mul(x, x);
        assert_int_equal(ct_zero_(ct_narrow(y, 0, 1, 2)), CT_OK);
        for (int i = 0; i < 12; i++) dx[i] = i >= 4 ? 0 : 2 * xv[i] * wv[i];
        backward_ones(ct_sum(ct_mul(y, w), CT_NONE, false));
        check_grad(x, dx, 12, tol(dt));
        /* on the tensor with history itself: its old history gets zeros */
        for (int i = 0; i < 12; i++) dxw[i] = wv[i];
        for (int k = 0; k < 4; k++) {
            ct_zero_grad(x);
            ct_tensor *z = ct_mul(x, x);
            assert_int_equal(k % 2 ? ct_fill_(z, 2.0) : ct_zero_(z), CT_OK);
            assert_string_equal(ct_grad_fn_name(z), k % 2 ? "FillBackward" : "ZeroBackward");
            assert_true(ct_requires_grad(z));
            if (k < 2) {
                backward_ones(ct_sum(ct_mul(ct_add(z, x), w), CT_NONE, false));
                check_grad(x, dxw, 12, tol(dt));
            } else {
                backward_ones(ct_sum(ct_mul(z, w), CT_NONE, false));
                check_grad(x, zero, 12, 0); /* zeros, not nothing, as PyTorch */
            }
        }
        /* copy_ onto a tensor with history from a broadcast row of another dtype */
        ct_zero_grad(x);
        ct_tensor *b = tu_rand(1, row, di ? CT_F64 : CT_F32, -2, 2, &bv);
        ct_requires_grad_(b, true);
        ct_tensor *d = ct_mul(x, x);
        assert_int_equal(ct_copy_(d, b), CT_OK);
        assert_string_equal(ct_grad_fn_name(d), "CopyBackwards");
        assert_int_equal(ct_tensor_dtype(d), dt);
        backward_ones(ct_sum(ct_mul(d, w), CT_NONE, false));
        check_grad(x, zero, 12, 0);
        double db[4];
        for (int j = 0; j < 4; j++) db[j] = wv[j] + wv[4 + j] + wv[8 + j];
        check_grad(b, db, 4, 1e-6);
        /* from a plain source: the destination keeps requiring grad */
        ct_zero_grad(x);
        ct_tensor *d2 = ct_mul(x, x);
        assert_int_equal(ct_copy_(d2, w), CT_OK);
        assert_true(ct_requires_grad(d2));
        backward_ones(ct_sum(d2, CT_NONE, false));
        check_grad(x, zero, 12, 0);
        free(xv), free(wv), free(bv);
        ct_scope_end(s);
    }
}

/* What PyTorch refuses about views, and what it lets through plainly. */
static void test_view_refusals(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {4, 3}, row[1] = {3}, esh[2] = {4, 3};
    ct_scope *s = ct_scope_begin();
    ct_tensor *x = tu_rand(2, sh, CT_F64, -1, 1, NULL), *r = tu_rand(1, row, CT_F64, -1, 1, NULL);
    ct_requires_grad_(x, true);
    ct_requires_grad_(r, true);
    /* a view of a leaf that requires grad */
    ct_tensor *xv = ct_narrow(x, 0, 1, 2);
    tu_assert_error(ct_mul_scalar_(xv, 2), CT_ERR_AUTOGRAD, "ct_mul_scalar_",
                    "a view of a leaf Variable that requires grad is being used in an in-place "
                    "operation");
    tu_assert_error(ct_fill_(ct_select(ct_t(x), 0, 1), 0), CT_ERR_AUTOGRAD, "ct_fill_",
                    "a view of a leaf Variable");
    /* a view made in no-grad mode, of a tensor with history or of a plain one */
    ct_tensor *y = ct_mul(x, x), *plain = ct_tensor_zeros(2, sh, CT_F64, CT_CPU);
    bool prev = ct_no_grad_begin();
    ct_tensor *ny = ct_narrow(y, 0, 0, 2), *np = ct_select(plain, 0, 1);
    ct_no_grad_end(prev);
    unsigned vy = version_of(y);
    tu_assert_error(ct_add_(ny, r), CT_ERR_AUTOGRAD, "ct_add_", "created in no-grad mode",
                    "modified in place with grad mode enabled");
    tu_assert_error(ct_copy_(np, r), CT_ERR_AUTOGRAD, "ct_copy_", "created in no-grad mode");
    assert_int_equal(version_of(y), vy);
    /* ... which nothing stops when nothing requires grad */
    assert_int_equal(ct_fill_(np, 1.0), CT_OK);
    assert_false(ct_requires_grad(plain));
    /* views among several outputs */
    ct_tensor *pieces[4];
    int n;
    assert_int_equal(ct_chunk(y, 2, 0, 4, pieces, &n), CT_OK);
    tu_assert_error(ct_mul_scalar_(pieces[0], 2), CT_ERR_AUTOGRAD, "ct_mul_scalar_", "ct_chunk",
                    "several views");
    tu_assert_error(ct_copy_(ct_narrow(pieces[1], 0, 0, 1), r), CT_ERR_AUTOGRAD, "ct_chunk");
    assert_int_equal(ct_unbind(y, 1, 4, pieces, &n), CT_OK);
    tu_assert_error(ct_zero_(pieces[2]), CT_ERR_AUTOGRAD, "ct_zero_", "ct_unbind");
    assert_int_equal(ct_split(plain, 2, 0, 4, pieces, &n), CT_OK);
    assert_int_equal(ct_fill_(pieces[0], 3.0), CT_OK); /* plain: allowed */
    /* an expanded (stride-0) view */
    ct_tensor *yr = ct_select(y, 0, 0), *e = ct_expand(yr, 2, esh);
    tu_assert_error(ct_mul_scalar_(e, 2), CT_ERR_INVALID_ARG, "ct_mul_scalar_", "share memory");
    tu_assert_error(ct_copy_(e, x), CT_ERR_INVALID_ARG, "ct_copy_", "sharing one memory location");
    assert_int_equal(version_of(y), vy);
    assert_string_equal(ct_grad_fn_name(y), "MulBackward");
    ct_scope_end(s);
}

/* Results that share their input's storage (ct_reshape as a view,
 * ct_flatten, ct_contiguous and ct_to_dtype of what needs no copy) are views
 * of it: a write through them rewrites the input's history. */
static void test_alias_results_are_views(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {3, 4}, flat[1] = {12};
    for (int k = 0; k < 4; k++) {
        ct_scope *s = ct_scope_begin();
        double *xv, *wv;
        ct_tensor *x = tu_rand(2, sh, CT_F64, -2, 2, &xv), *w = tu_rand(2, sh, CT_F64, -1, 1, &wv);
        ct_requires_grad_(x, true);
        ct_tensor *y = ct_mul(x, x);
        ct_tensor *a = k == 0   ? ct_reshape(y, 1, flat)
                       : k == 1 ? ct_flatten(y, 0, -1)
                       : k == 2 ? ct_contiguous(y)
                                : ct_to_dtype(y, CT_F64);
        assert_true(ct_tensor_shares_storage(a, y));
        /* elements 2..5 in row-major order: the end of row 0, the start of row 1 */
        ct_tensor *part = k < 2 ? ct_narrow(a, 0, 2, 4) : ct_narrow(ct_flatten(a, 0, -1), 0, 2, 4);
        assert_int_equal(ct_mul_scalar_(part, -3), CT_OK);
        assert_string_equal(ct_grad_fn_name(y), "CopySlices");
        backward_ones(ct_sum(ct_mul(y, w), CT_NONE, false));
        double dx[12];
        for (int i = 0; i < 12; i++) dx[i] = 2 * xv[i] * wv[i] * (i >= 2 && i < 6 ? -3 : 1);
        check_grad(x, dx, 12, 1e-13);
        free(xv), free(wv);
        ct_scope_end(s);
    }
}

/* Ownership: a view holds its base, nothing holds a view back. A view of a
 * plain buffer made a leaf leaves its base, so a graph that reaches it from
 * the buffer's history makes no cycle (the fixture checks that everything
 * is freed); its gradient flows as in PyTorch. */
static void test_view_leaf_no_cycle(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {3, 4};
    double *bv, *wv;
    ct_tensor *buf = tu_rand(2, sh, CT_F64, -1, 1, &bv), *w = tu_rand(2, sh, CT_F64, -1, 1, &wv);
    ct_tensor *leafv = ct_select(buf, 0, 0);
    assert_int_equal(ct_requires_grad_(leafv, true), CT_OK);
    ct_tensor *twice = ct_mul_scalar(leafv, 2);
    ct_tensor *row = ct_select(buf, 0, 2);
    assert_int_equal(ct_copy_(row, twice), CT_OK);
    assert_string_equal(ct_grad_fn_name(buf), "CopySlices");
    tu_assert_error(ct_mul_scalar_(leafv, 2), CT_ERR_AUTOGRAD, "a leaf Variable that requires grad");
    ct_tensor *bw = ct_mul(buf, w), *l = ct_sum(bw, CT_NONE, false);
    backward_ones(l);
    double ref[4];
    for (int j = 0; j < 4; j++) ref[j] = 2 * wv[8 + j]; /* buf's own row 0 has no history */
    check_grad(leafv, ref, 4, 1e-13);
    free(bv), free(wv);
    release_all(7, (ct_tensor *[]){buf, w, leafv, twice, row, bw, l});
}

/* A view made while its leaf base required grad, the base then turned off
 * (ct_requires_grad_(base, false)): the view's history is dropped when next
 * read, as PyTorch's AccumulateGrad of such a leaf takes no gradient, so a
 * write through the view is a plain update and gives the base no node whose
 * graph would hold the base itself; writing into the base a tensor whose
 * graph holds the base as a leaf is refused for the same reason (the
 * fixture checks that all is freed). */
static void test_view_of_leaf_turned_off(void **state) {
    (void)state;
    ct_tensor *base = tu_rand(CT_SHAPE(2, 3), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(base, true), CT_OK);
    ct_tensor *v = ct_squeeze(base);
    ct_tensor *w = ct_mul_scalar(v, 2); /* before: recorded through the view */
    assert_non_null(ct_grad_fn_name(w));
    assert_int_equal(ct_requires_grad_(base, false), CT_OK);
    assert_int_equal(ct_clamp_(v, -0.5, 0.5), CT_OK);
    assert_null(ct_grad_fn_name(base));
    assert_null(ct_grad_fn_name(v));
    ct_tensor *u = ct_mul_scalar(v, 3); /* after: nothing to record */
    assert_false(ct_requires_grad(u));
    double *bv = tu_values(base);
    for (int i = 0; i < 6; i++) assert_true(bv[i] >= -0.5 && bv[i] <= 0.5);
    /* w's graph holds base as its leaf: writing w into base (or through a
     * view of it) would make base's new history reach base itself; refused,
     * base unchanged */
    tu_assert_error(ct_add_(base, w), CT_ERR_AUTOGRAD, "ct_add_", "the graph of the operand",
                    "cycle", "ct_detach the operand");
    tu_assert_error(ct_copy_(v, w), CT_ERR_AUTOGRAD, "ct_copy_", "the graph of the operand");
    double *again = tu_values(base);
    assert_memory_equal(again, bv, 6 * sizeof(double));
    free(bv);
    free(again);
    /* a detached operand is fine */
    ct_tensor *wd = ct_detach(w);
    assert_int_equal(ct_add_(base, wd), CT_OK);
    /* base given a history of its own by an operand that does not hold it:
     * still refused w afterwards */
    ct_tensor *z = tu_rand(CT_SHAPE(2, 3), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(z, true), CT_OK);
    assert_int_equal(ct_add_(base, z), CT_OK);
    assert_non_null(ct_grad_fn_name(base));
    tu_assert_error(ct_add_(base, w), CT_ERR_AUTOGRAD, "ct_add_", "the graph of the operand");
    release_all(6, (ct_tensor *[]){base, v, w, u, wd, z});
}

/* A leaf's gradient written in place with a function of the leaf (or the
 * leaf itself) would hold the leaf through its new history, as the leaf
 * holds its gradient: refused, the gradient unchanged (PyTorch warns of the
 * same cycle for create_graph). */
static void test_grad_written_with_its_leaf(void **state) {
    (void)state;
    ct_tensor *x = tu_rand(CT_SHAPE(4), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    ct_tensor *y = ct_mul_scalar(x, 3);
    backward_ones(y);
    ct_tensor *g = ct_grad(x);
    double *before = tu_values(g);
    tu_assert_error(ct_add_(g, y), CT_ERR_AUTOGRAD, "ct_add_", "the graph of the operand",
                    "a leaf's gradient");
    tu_assert_error(ct_mul_(g, x), CT_ERR_AUTOGRAD, "ct_mul_", "the graph of the operand");
    ct_tensor *sel = ct_select(g, 0, 1), *y2 = ct_select(y, 0, 2);
    tu_assert_error(ct_copy_(sel, y2), CT_ERR_AUTOGRAD, "ct_copy_");
    double *after = tu_values(ct_grad(x));
    assert_memory_equal(after, before, 4 * sizeof(double));
    assert_null(ct_grad_fn_name(ct_grad(x)));
    /* in no-grad mode, the usual manual update */
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_add_(g, y), CT_OK);
    ct_no_grad_end(prev);
    free(before);
    free(after);
    release_all(4, (ct_tensor *[]){x, y, sel, y2});
}

/* Writes through views of one graph, differentiated by gradcheck. */
static ct_tensor *through_views(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    ct_tensor *y = ct_mul(in[0], in[0]);
    ct_tensor *t = y ? ct_transpose(y, 0, 1) : NULL; /* [3, 4] */
    ct_tensor *v = t ? ct_narrow(t, 0, 1, 2) : NULL;  /* [2, 4], strided */
    ct_tensor *out = ct_tensor_zeros(2, (int64_t[]){2, 4}, CT_F64, CT_CPU);
    ct_tensor *row = out ? ct_select(out, 0, 1) : NULL;
    ct_status st = v && row ? ct_mul_(v, in[1]) : CT_ERR_INVALID_ARG;
    if (st == CT_OK) st = ct_add_scalar_(ct_select(t, 0, 0), 1.5);
    if (st == CT_OK) st = ct_copy_(row, ct_sum(ct_exp(v), 1, (int64_t[]){0}, false));
    ct_tensor *r = st == CT_OK ? ct_add(ct_sum(ct_mul(out, out), CT_NONE, true), y) : NULL;
    if (!r) fprintf(stderr, "through_views: %s\n", ct_last_error());
    release_all(5, (ct_tensor *[]){y, t, v, out, row});
    return r;
}

static void test_views_gradcheck(void **state) {
    (void)state;
    tu_seed();
    int64_t sh[2] = {4, 3}, csh[2] = {2, 4};
    ct_tensor *a = tu_rand(2, sh, CT_F64, -1, 1, NULL), *c = tu_rand(2, csh, CT_F64, 0.5, 1.5, NULL);
    ct_requires_grad_(a, true);
    ct_requires_grad_(c, true);
    ct_scope *s = ct_scope_begin();
    gradcheck_ok("writes through views", through_views, NULL, 2, (ct_tensor *[]){a, c});
    ct_scope_end(s);
    release_all(2, (ct_tensor *[]){a, c});
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_gradients_match_out_of_place, setup, teardown),
        cmocka_unit_test_setup_teardown(test_rebase_node, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chain_gradcheck, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plain_destination_and_dtype, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_narrow_mul, setup, teardown),
        cmocka_unit_test_setup_teardown(test_select_transpose_add, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_of_view_mul, setup, teardown),
        cmocka_unit_test_setup_teardown(test_base_written_view_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_copy_into_slices, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fill_zero_copy_history, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_alias_results_are_views, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_leaf_no_cycle, setup, teardown),
        cmocka_unit_test_setup_teardown(test_view_of_leaf_turned_off, setup, teardown),
        cmocka_unit_test_setup_teardown(test_grad_written_with_its_leaf, setup, teardown),
        cmocka_unit_test_setup_teardown(test_views_gradcheck, setup, teardown),
    };
    return tu_run_tests(tests);
}
