/* Activation checkpointing (ct_activation_checkpoint): the gradients of a checkpointed
 * MLP block against the same block run plainly and against float64 formulas
 * written out, in each floating dtype, on non-contiguous inputs; what the
 * forward keeps alive; several inputs (one without grad, one unused),
 * nesting, an autocast region, retain_graph, grad mode off; the errors. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

/* ---- the block: y = gelu(x w1^T + b1) w2^T ------------------------------------------------ */
typedef struct block {
    ct_tensor *w1, *b1, *w2;
    int calls; /* how often the function ran */
    bool nested; /* the inner gelu-linear in a checkpoint of its own */
    bool fail_second; /* fails when run again */
    bool other_shape; /* gives another shape when run again */
} block;

static ct_tensor *second_half(void *ctx, int n, ct_tensor *const *in) {
    block *b = ctx;
    (void)n;
    return ct_linear(ct_gelu(in[0], CT_GELU_TANH), b->w2, NULL);
}

static ct_tensor *block_fn(void *ctx, int n, ct_tensor *const *in) {
    block *b = ctx;
    (void)n;
    b->calls++;
    if (b->fail_second && b->calls == 2) /* vectors of 2 and 3: ct_matmul refuses them */
        return ct_matmul(ct_tensor_zeros(CT_SHAPE(2), CT_F32, CT_CPU),
                         ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CPU));
    ct_tensor *h = ct_linear(in[0], b->w1, b->b1);
    if (!h) return NULL;
    if (b->other_shape && b->calls == 2) h = ct_narrow(h, 0, 0, 1);
    if (b->nested) return ct_activation_checkpoint(second_half, b, 1, &h);
    return second_half(b, 1, &h);
}

static ct_tensor *leaf_rand(int nd, const int64_t *shape, ct_dtype dt, bool nc) {
    ct_tensor *t0 = tu_rand(nd, shape, dt, -1, 1, NULL);
    ct_tensor *t = nc ? tu_noncontig(t0) : ct_tensor_retain(t0);
    ct_tensor_release(t0);
    assert_int_equal(ct_requires_grad_(t, true), CT_OK);
    return t;
}

static void zero_grads(ct_tensor *x, block *b) {
    ct_zero_grad(x);
    ct_zero_grad(b->w1);
    ct_zero_grad(b->b1);
    ct_zero_grad(b->w2);
}

/* The four gradients as doubles, after a backward of y with g. */
static void grads_of(ct_tensor *x, const block *b, double **out) {
    ct_tensor *ts[4] = {x, b->w1, b->b1, b->w2};
    for (int i = 0; i < 4; i++) out[i] = tu_values(ct_grad(ts[i]));
}

static const ct_dtype float_dts[3] = {CT_F32, CT_F64, CT_BF16};

/* Checkpointed, nested or not, against plain: the same gradients bit for
 * bit (the same kernels on the same values), the function run twice. */
static void test_same_gradients(void **state) {
    (void)state;
    for (int di = 0; di < 3; di++)
        for (int variant = 0; variant < 3; variant++) {
            ct_dtype dt = float_dts[di];
            bool nc = variant == 1;
            int64_t rows = tu_randint(1, 9), d = tu_randint(1, 7), h = tu_randint(1, 8),
                    o = tu_randint(1, 5);
            ct_tensor *x = leaf_rand(CT_SHAPE(rows, d), dt, nc);
            block b = {.w1 = leaf_rand(CT_SHAPE(h, d), dt, false),
                       .b1 = leaf_rand(CT_SHAPE(h), dt, false),
                       .w2 = leaf_rand(CT_SHAPE(o, h), dt, nc),
                       .nested = variant == 2};
            ct_tensor *g = tu_rand(CT_SHAPE(rows, o), dt, -1, 1, NULL);
            double *want[4], *got[4];
            ct_scope *sc = ct_scope_begin();
            ct_tensor *y0 = block_fn(&b, 1, &x);
            assert_int_equal(ct_backward(y0, g, false), CT_OK);
            grads_of(x, &b, want);
            zero_grads(x, &b);
            b.calls = 0;
            ct_tensor *y1 = ct_activation_checkpoint(block_fn, &b, 1, &x);
            assert_non_null(y1);
            assert_string_equal(ct_grad_fn_name(y1), "CheckpointBackward");
            assert_int_equal(b.calls, 1);
            assert_int_equal(ct_backward(y1, g, false), CT_OK);
            assert_int_equal(b.calls, 2);
            grads_of(x, &b, got);
            ct_scope_end(sc);
            static const char *const names[4] = {"dx", "dw1", "db1", "dw2"};
            const int64_t ns[4] = {rows * d, h * d, h, o * h};
            for (int i = 0; i < 4; i++) {
                for (int64_t k = 0; k < ns[i]; k++)
                    if (memcmp(&got[i][k], &want[i][k], sizeof(double))) {
                        fprintf(stderr, "%s %s variant %d: element %lld: %.17g, plain %.17g\n",
                                names[i], ct_dtype_name(dt), variant, (long long)k, got[i][k],
                                want[i][k]);
                        fail();
                    }
                free(got[i]);
                free(want[i]);
            }
            ct_tensor *ts[5] = {x, b.w1, b.b1, b.w2, g};
            release_all(5, ts);
        }
}

/* float64 against the formulas: with a = x w1^T + b1, s = gelu_tanh(a),
 * dw2 = g^T s, ds = g w2, da = ds gelu'(a), dx = da w1, dw1 = da^T x,
 * db1 = sum over rows of da. */
static double gelu_tanh_grad(double a) {
    const double k = sqrt(2 / M_PI), c = 0.044715;
    double u = k * (a + c * a * a * a), t = tanh(u);
    return 0.5 * (1 + t) + 0.5 * a * (1 - t * t) * k * (1 + 3 * c * a * a);
}

static double gelu_tanh(double a) {
    const double k = sqrt(2 / M_PI), c = 0.044715;
    return 0.5 * a * (1 + tanh(k * (a + c * a * a * a)));
}

static void test_reference(void **state) {
    (void)state;
    int64_t rows = tu_randint(1, 6), d = tu_randint(1, 5), h = tu_randint(1, 6),
            o = tu_randint(1, 4);
    double *xv, *w1v, *b1v, *w2v, *gv;
    ct_tensor *x = tu_rand(CT_SHAPE(rows, d), CT_F64, -1, 1, &xv);
    block b = {.w1 = tu_rand(CT_SHAPE(h, d), CT_F64, -1, 1, &w1v),
               .b1 = tu_rand(CT_SHAPE(h), CT_F64, -1, 1, &b1v),
               .w2 = tu_rand(CT_SHAPE(o, h), CT_F64, -1, 1, &w2v)};
    ct_tensor *g = tu_rand(CT_SHAPE(rows, o), CT_F64, -1, 1, &gv);
    ct_tensor *ts[5] = {x, b.w1, b.b1, b.w2, g};
    for (int i = 0; i < 4; i++) assert_int_equal(ct_requires_grad_(ts[i], true), CT_OK);
    ct_tensor *y = ct_activation_checkpoint(block_fn, &b, 1, &x);
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    double *dx = calloc((size_t)(rows * d), sizeof *dx), *dw1 = calloc((size_t)(h * d), 8);
    double *db1 = calloc((size_t)h, 8), *dw2 = calloc((size_t)(o * h), 8);
    double *yv = calloc((size_t)(rows * o), 8);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < h; j++) {
            double a = b1v[j], ds = 0;
            for (int64_t i = 0; i < d; i++) a += xv[r * d + i] * w1v[j * d + i];
            for (int64_t k = 0; k < o; k++) {
                ds += gv[r * o + k] * w2v[k * h + j];
                dw2[k * h + j] += gv[r * o + k] * gelu_tanh(a);
                yv[r * o + k] += gelu_tanh(a) * w2v[k * h + j];
            }
            double da = ds * gelu_tanh_grad(a);
            db1[j] += da;
            for (int64_t i = 0; i < d; i++) {
                dx[r * d + i] += da * w1v[j * d + i];
                dw1[j * d + i] += da * xv[r * d + i];
            }
        }
    check_values(y, yv, rows * o, 1e-13, 1e-14);
    check_values(ct_grad(x), dx, rows * d, 1e-12, 1e-13);
    check_values(ct_grad(b.w1), dw1, h * d, 1e-12, 1e-13);
    check_values(ct_grad(b.b1), db1, h, 1e-12, 1e-13);
    check_values(ct_grad(b.w2), dw2, o * h, 1e-12, 1e-13);
    double *fr[10] = {dx, dw1, db1, dw2, yv, xv, w1v, b1v, w2v, gv};
    for (int i = 0; i < 10; i++) free(fr[i]);
    release_all(5, ts);
    ct_tensor_release(y);
}

/* What the forward leaves alive: plainly, the block's activations (the
 * linear's result, gelu's); checkpointed, none of them. */
static void test_memory(void **state) {
    (void)state;
    ct_tensor *x = leaf_rand(CT_SHAPE(16, 8), CT_F32, false);
    block b = {.w1 = leaf_rand(CT_SHAPE(32, 8), CT_F32, false),
               .b1 = leaf_rand(CT_SHAPE(32), CT_F32, false),
               .w2 = leaf_rand(CT_SHAPE(4, 32), CT_F32, false)};
    cti_alloc_stats s0 = cti_get_alloc_stats();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *y0 = block_fn(&b, 1, &x);
    ct_keep(y0);
    ct_scope_end(sc);
    cti_alloc_stats plain = cti_get_alloc_stats();
    ct_tensor *y1 = ct_activation_checkpoint(block_fn, &b, 1, &x);
    cti_alloc_stats ckpt = cti_get_alloc_stats();
    /* plainly: y, and [16, 32] twice (the pre-activation and gelu's output) */
    assert_int_equal(plain.live_bytes - s0.live_bytes, (16 * 4 + 2 * 16 * 32) * 4);
    /* checkpointed: y alone */
    assert_int_equal(ckpt.live_bytes - plain.live_bytes, 16 * 4 * 4);
    ct_tensor *ts[6] = {y0, y1, x, b.w1, b.b1, b.w2};
    release_all(6, ts);
}

/* Three inputs: x (grad), a mask without grad, u (grad, unused): x gets
 * its gradient, u none, the mask is passed again as it was. */
static ct_tensor *masked_fn(void *ctx, int n, ct_tensor *const *in) {
    (void)ctx;
    assert_int_equal(n, 3);
    return ct_mul(ct_sin(in[0]), in[1]);
}

static void test_inputs(void **state) {
    (void)state;
    int64_t len = tu_randint(1, 20);
    double *xv, *mv;
    ct_tensor *x = tu_rand(CT_SHAPE(len), CT_F64, -2, 2, &xv);
    ct_tensor *m = tu_rand(CT_SHAPE(len), CT_F64, 0, 2, &mv);
    ct_tensor *u = tu_rand(CT_SHAPE(3), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    assert_int_equal(ct_requires_grad_(u, true), CT_OK);
    ct_tensor *in[3] = {x, m, u};
    ct_tensor *y = ct_activation_checkpoint(masked_fn, NULL, 3, in);
    backward_ones(y);
    double want[32];
    for (int64_t i = 0; i < len; i++) want[i] = cos(xv[i]) * mv[i];
    check_values(ct_grad(x), want, len, 1e-15, 0);
    assert_null(ct_grad(u));
    /* The input that did not require grad is passed as it was. */
    assert_false(ct_requires_grad(m));
    free(xv);
    free(mv);
    ct_tensor *ts[4] = {x, m, u, y};
    release_all(4, ts);
}

/* In a CPU bfloat16 region: the backward runs the function in the same
 * region, so the gradients are the plain run's. */
static void test_autocast(void **state) {
    (void)state;
    ct_tensor *x = leaf_rand(CT_SHAPE(5, 6), CT_F32, false);
    block b = {.w1 = leaf_rand(CT_SHAPE(7, 6), CT_F32, false),
               .b1 = leaf_rand(CT_SHAPE(7), CT_F32, false),
               .w2 = leaf_rand(CT_SHAPE(3, 7), CT_F32, false)};
    ct_tensor *g = tu_rand(CT_SHAPE(5, 3), CT_BF16, -1, 1, NULL);
    double *want[4], *got[4];
    for (int ck = 0; ck < 2; ck++) {
        zero_grads(x, &b);
        ct_scope *sc = ct_scope_begin();
        assert_int_equal(ct_autocast_begin(CT_CPU, CT_BF16), CT_OK);
        ct_tensor *y = ck ? ct_activation_checkpoint(block_fn, &b, 1, &x) : block_fn(&b, 1, &x);
        assert_int_equal(ct_autocast_end(), CT_OK);
        assert_int_equal(ct_tensor_dtype(y), CT_BF16);
        assert_int_equal(ct_backward(y, g, false), CT_OK);
        grads_of(x, &b, ck ? got : want);
        ct_scope_end(sc);
    }
    const int64_t ns[4] = {30, 42, 7, 21};
    for (int i = 0; i < 4; i++) {
        assert_memory_equal(got[i], want[i], (size_t)ns[i] * sizeof(double));
        free(got[i]);
        free(want[i]);
    }
    ct_tensor *ts[5] = {x, b.w1, b.b1, b.w2, g};
    release_all(5, ts);
}

/* retain_graph: the function runs again at each backward, the gradients
 * add up; grad mode off or no input requiring grad: it just runs (once),
 * and in the second case records as plain code, so the parameters still
 * get their gradients. */
static void test_retain_and_modes(void **state) {
    (void)state;
    ct_tensor *x = leaf_rand(CT_SHAPE(3, 4), CT_F64, false);
    block b = {.w1 = leaf_rand(CT_SHAPE(5, 4), CT_F64, false),
               .b1 = leaf_rand(CT_SHAPE(5), CT_F64, false),
               .w2 = leaf_rand(CT_SHAPE(2, 5), CT_F64, false)};
    ct_scope *sc = ct_scope_begin();
    ct_tensor *y = ct_activation_checkpoint(block_fn, &b, 1, &x);
    backward_ones_retain(y, true);
    double *once = tu_values(ct_grad(b.w1));
    backward_ones_retain(y, false);
    assert_int_equal(b.calls, 3);
    double *twice = tu_values(ct_grad(b.w1));
    for (int i = 0; i < 20; i++)
        assert_true(fabs(twice[i] - 2 * once[i]) <= 1e-14 * (1 + fabs(once[i])));
    free(once);
    free(twice);
    tu_assert_error(ct_backward(y, ct_tensor_ones_like(y), false), CT_ERR_AUTOGRAD,
                    "second time", "CheckpointBackward");
    /* grad mode off */
    b.calls = 0;
    bool prev = ct_no_grad_begin();
    ct_tensor *y2 = ct_activation_checkpoint(block_fn, &b, 1, &x);
    ct_no_grad_end(prev);
    assert_non_null(y2);
    assert_false(ct_requires_grad(y2));
    assert_int_equal(b.calls, 1);
    /* an input without grad: plain recording */
    ct_tensor *xd = ct_detach(x);
    ct_zero_grad(b.w1);
    ct_tensor *y3 = ct_activation_checkpoint(block_fn, &b, 1, &xd);
    assert_non_null(ct_grad_fn_name(y3));
    assert_string_not_equal(ct_grad_fn_name(y3), "CheckpointBackward");
    backward_ones(y3);
    assert_int_equal(b.calls, 2);
    assert_non_null(ct_grad(b.w1));
    ct_scope_end(sc);
    ct_tensor *ts[4] = {x, b.w1, b.b1, b.w2};
    release_all(4, ts);
}

static void test_errors(void **state) {
    (void)state;
    ct_tensor *x = leaf_rand(CT_SHAPE(3, 4), CT_F32, false);
    block b = {.w1 = leaf_rand(CT_SHAPE(5, 4), CT_F32, false),
               .b1 = leaf_rand(CT_SHAPE(5), CT_F32, false),
               .w2 = leaf_rand(CT_SHAPE(2, 5), CT_F32, false)};
    const char *op = "ct_activation_checkpoint";
    tu_assert_null_error(ct_activation_checkpoint(NULL, &b, 1, &x), CT_ERR_INVALID_ARG, op,
                         "fn is NULL");
    ct_tensor *seven[7] = {x, x, x, x, x, x, x};
    tu_assert_null_error(ct_activation_checkpoint(block_fn, &b, 7, seven), CT_ERR_INVALID_ARG, op,
                         "0 to 6 inputs, got 7");
    ct_tensor *none[1] = {NULL};
    tu_assert_null_error(ct_activation_checkpoint(block_fn, &b, 1, none), CT_ERR_INVALID_ARG, op,
                         "input 0 is NULL");
    tu_assert_null_error(ct_activation_checkpoint(block_fn, &b, 1, NULL), CT_ERR_INVALID_ARG, op,
                         "inputs is NULL");
    ct_scope *sc = ct_scope_begin();
    /* fn's own error on the first run, as it is */
    block wrong = b;
    wrong.w1 = b.w2;
    tu_assert_null_error(ct_activation_checkpoint(block_fn, &wrong, 1, &x), CT_ERR_SHAPE,
                         "ct_linear", "do not align");
    /* fails when run again */
    b.fail_second = true;
    ct_tensor *y = ct_activation_checkpoint(block_fn, &b, 1, &x);
    assert_non_null(y);
    tu_assert_error(ct_backward(y, ct_tensor_ones_like(y), false), CT_ERR_SHAPE,
                    "ct_backward: ct_activation_checkpoint's function failed when run again",
                    "ct_matmul");
    /* another shape when run again */
    b.fail_second = false;
    b.other_shape = true;
    b.calls = 0;
    y = ct_activation_checkpoint(block_fn, &b, 1, &x);
    tu_assert_error(ct_backward(y, ct_tensor_ones_like(y), false), CT_ERR_AUTOGRAD,
                    "ct_activation_checkpoint's function gave", "the first time",
                    "must compute the same each time");
    /* the input written in place after the call */
    b.other_shape = false;
    ct_tensor *h = ct_mul_scalar(x, 2);
    y = ct_activation_checkpoint(block_fn, &b, 1, &h);
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_add_scalar_(h, 1), CT_OK);
    ct_no_grad_end(prev);
    tu_assert_error(ct_backward(y, ct_tensor_ones_like(y), false), CT_ERR_AUTOGRAD,
                    "CheckpointBackward", "modified by an in-place operation");
    ct_scope_end(sc);
    ct_tensor *ts[4] = {x, b.w1, b.b1, b.w2};
    release_all(4, ts);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_gradients, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_inputs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_autocast, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retain_and_modes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
    };
    return tu_run_tests(tests);
}
