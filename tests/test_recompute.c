/* Recomputation of pointwise results in the backward (ct_set_recompute_enabled):
 * the gradients are bit for bit those without it, for every op it covers, in
 * each floating dtype, on non-contiguous inputs; the result's storage is
 * freed once the caller releases it; chains, a result saved twice by one
 * node, retain_graph, the in-place rules and the ops it leaves alone; the
 * setting is per thread. */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "autograd_util.h"

#include "test_fixture.h"

/* ---- the producers: h = f(x), x of shape [rows, 2 cols] (swiglu: its halves) ------------- */
typedef enum prod {
    P_GELU,
    P_GELU_TANH,
    P_SILU,
    P_ELU,
    P_SIN,
    P_LOG,
    P_SOFTPLUS,
    P_LEAKY_RELU,
    P_SWIGLU,
    P_COUNT
} prod;

static const char *const prod_names[P_COUNT] = {
    "gelu", "gelu tanh", "silu", "elu", "sin", "log", "softplus", "leaky_relu", "swiglu"};

static ct_tensor *produce(prod p, ct_tensor *x) {
    switch (p) {
    case P_GELU: return ct_gelu(x, CT_GELU_NONE);
    case P_GELU_TANH: return ct_gelu(x, CT_GELU_TANH);
    case P_SILU: return ct_silu(x);
    case P_ELU: return ct_elu(x, 0.7);
    case P_SIN: return ct_sin(x);
    case P_LOG: return ct_log(x);
    case P_SOFTPLUS: return ct_softplus(x, 2.0, 1.5);
    case P_LEAKY_RELU: return ct_leaky_relu(x, 0.05);
    case P_SWIGLU: {
        ct_tensor *gu[2] = {NULL, NULL};
        int n = 0;
        assert_int_equal(ct_chunk(x, 2, -1, 2, gu, &n), CT_OK);
        ct_tensor *h = ct_swiglu(gu[0], gu[1]);
        ct_tensor_release(gu[0]);
        ct_tensor_release(gu[1]);
        return h;
    }
    default: return NULL;
    }
}

/* What one run leaves: the leaves' gradients as doubles, and how many
 * storages and CPU bytes were alive after the forward, the caller's handle
 * to h released. */
typedef struct run_out {
    double *gx, *gw;
    int64_t nx, nw;
    cti_alloc_stats after_forward;
} run_out;

static void run_free(run_out *r) {
    free(r->gx);
    free(r->gw);
}

/* loss = sum(g * (f(x) @ w)) with recomputation on or off; x and w are
 * leaves (fresh gradients), g is fixed. */
static run_out run_once(prod p, bool recompute, ct_tensor *x, ct_tensor *w, ct_tensor *g) {
    bool prev = ct_set_recompute_enabled(recompute);
    ct_zero_grad(x);
    ct_zero_grad(w);
    ct_tensor *h = produce(p, x);
    assert_non_null(h);
    ct_tensor *y = ct_matmul(h, w);
    assert_non_null(y);
    ct_tensor_release(h);
    run_out r = {.after_forward = cti_get_alloc_stats()};
    ct_set_recompute_enabled(prev);
    assert_int_equal(ct_backward(y, g, false), CT_OK);
    ct_tensor_release(y);
    r.gx = tu_values(ct_grad(x));
    r.gw = tu_values(ct_grad(w));
    r.nx = ct_tensor_numel(x);
    r.nw = ct_tensor_numel(w);
    return r;
}

static void expect_same_bits(const char *what, const double *a, const double *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        if (!memcmp(&a[i], &b[i], sizeof a[i])) continue;
        fprintf(stderr, "%s: element %lld: %.17g with recomputation, %.17g without\n", what,
                (long long)i, a[i], b[i]);
        fail();
    }
}

static const ct_dtype float_dts[3] = {CT_F32, CT_F64, CT_BF16};

/* Every producer, dtype and layout: the same gradients, and h's storage
 * (rows x cols elements) gone after the forward. */
static void test_same_gradients_less_memory(void **state) {
    (void)state;
    for (int p = 0; p < P_COUNT; p++)
        for (int di = 0; di < 3; di++)
            for (int nc = 0; nc < 2; nc++) {
                ct_dtype dt = float_dts[di];
                int64_t rows = tu_randint(1, 9), cols = tu_randint(1, 7), outs = tu_randint(1, 5);
                int64_t xin = p == P_SWIGLU ? 2 * cols : cols;
                double lo = p == P_LOG ? 0.1 : -3;
                ct_tensor *x0 = tu_rand(CT_SHAPE(rows, xin), dt, lo, 3, NULL);
                ct_tensor *x = nc ? tu_noncontig(x0) : ct_tensor_retain(x0);
                ct_tensor *w = tu_rand(CT_SHAPE(cols, outs), dt, -1, 1, NULL);
                ct_tensor *g = tu_rand(CT_SHAPE(rows, outs), dt, -1, 1, NULL);
                assert_int_equal(ct_requires_grad_(x, true), CT_OK);
                assert_int_equal(ct_requires_grad_(w, true), CT_OK);
                run_out off = run_once((prod)p, false, x, w, g);
                run_out on = run_once((prod)p, true, x, w, g);
                char what[96];
                snprintf(what, sizeof what, "%s %s %s: dx", prod_names[p], ct_dtype_name(dt),
                         nc ? "strided" : "contiguous");
                expect_same_bits(what, on.gx, off.gx, on.nx);
                what[strlen(what) - 1] = 'w';
                expect_same_bits(what, on.gw, off.gw, on.nw);
                /* h is the only storage the forward no longer holds */
                assert_int_equal(on.after_forward.live_storages,
                                 off.after_forward.live_storages - 1);
                assert_int_equal(on.after_forward.live_bytes,
                                 off.after_forward.live_bytes -
                                     rows * cols * (int64_t)ct_dtype_size(dt));
                run_free(&off);
                run_free(&on);
                ct_tensor *ts[4] = {x0, x, w, g};
                release_all(4, ts);
            }
}

/* The float64 gradients against the formulas written out, for silu:
 * dw = silu(x)^T g, dx = (g w^T) silu'(x), silu'(x) = s (1 + x (1 - s)). */
static void test_silu_reference(void **state) {
    (void)state;
    int64_t rows = tu_randint(1, 7), cols = tu_randint(1, 6), outs = tu_randint(1, 5);
    double *xv, *wv, *gv;
    ct_tensor *x = tu_rand(CT_SHAPE(rows, cols), CT_F64, -4, 4, &xv);
    ct_tensor *w = tu_rand(CT_SHAPE(cols, outs), CT_F64, -1, 1, &wv);
    ct_tensor *g = tu_rand(CT_SHAPE(rows, outs), CT_F64, -1, 1, &gv);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    run_out on = run_once(P_SILU, true, x, w, g);
    double *dx = calloc((size_t)(rows * cols), sizeof *dx);
    double *dw = calloc((size_t)(cols * outs), sizeof *dw);
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) {
            double xi = xv[i * cols + j], s = 1 / (1 + exp(-xi)), gwt = 0;
            for (int64_t o = 0; o < outs; o++) {
                gwt += gv[i * outs + o] * wv[j * outs + o];
                dw[j * outs + o] += xi * s * gv[i * outs + o];
            }
            dx[i * cols + j] = gwt * s * (1 + xi * (1 - s));
        }
    for (int64_t k = 0; k < rows * cols; k++)
        assert_true(fabs(on.gx[k] - dx[k]) <= 1e-13 * (1 + fabs(dx[k])));
    for (int64_t k = 0; k < cols * outs; k++)
        assert_true(fabs(on.gw[k] - dw[k]) <= 1e-13 * (1 + fabs(dw[k])));
    run_free(&on);
    free(dx);
    free(dw);
    free(xv);
    free(wv);
    free(gv);
    ct_tensor *ts[3] = {x, w, g};
    release_all(3, ts);
}

/* silu(gelu(x)) * w: silu leaves gelu's result to recomputation, the
 * product leaves silu's; both storages go, the gradients do not change. */
static void test_chain(void **state) {
    (void)state;
    for (int di = 0; di < 3; di++) {
        ct_dtype dt = float_dts[di];
        int64_t n = tu_randint(1, 40);
        ct_tensor *x = tu_rand(CT_SHAPE(n), dt, -3, 3, NULL);
        ct_tensor *w = tu_rand(CT_SHAPE(n), dt, -1, 1, NULL);
        assert_int_equal(ct_requires_grad_(x, true), CT_OK);
        assert_int_equal(ct_requires_grad_(w, true), CT_OK);
        double *grads[2][2];
        int64_t storages[2];
        for (int on = 0; on < 2; on++) {
            bool prev = ct_set_recompute_enabled(on);
            ct_zero_grad(x);
            ct_zero_grad(w);
            ct_tensor *h1 = ct_gelu(x, CT_GELU_TANH);
            ct_tensor *h2 = ct_silu(h1);
            ct_tensor *y = ct_mul(h2, w);
            ct_tensor_release(h1);
            ct_tensor_release(h2);
            storages[on] = cti_get_alloc_stats().live_storages;
            ct_set_recompute_enabled(prev);
            backward_ones(y);
            ct_tensor_release(y);
            grads[on][0] = tu_values(ct_grad(x));
            grads[on][1] = tu_values(ct_grad(w));
        }
        assert_int_equal(storages[1], storages[0] - 2);
        expect_same_bits("chain dx", grads[1][0], grads[0][0], n);
        expect_same_bits("chain dw", grads[1][1], grads[0][1], n);
        for (int k = 0; k < 4; k++) free(grads[k / 2][k % 2]);
        ct_tensor_release(x);
        ct_tensor_release(w);
    }
}

/* h * h: the node's two slots share one recomputation; the gradient is
 * 2 h gelu'(x) either way. */
static void test_saved_twice(void **state) {
    (void)state;
    int64_t n = tu_randint(1, 30);
    ct_tensor *x = tu_rand(CT_SHAPE(n), CT_F32, -3, 3, NULL);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    double *gx[2];
    for (int on = 0; on < 2; on++) {
        bool prev = ct_set_recompute_enabled(on);
        ct_zero_grad(x);
        ct_tensor *h = ct_gelu(x, CT_GELU_NONE);
        ct_tensor *y = ct_mul(h, h);
        ct_tensor_release(h);
        ct_set_recompute_enabled(prev);
        backward_ones(y);
        ct_tensor_release(y);
        gx[on] = tu_values(ct_grad(x));
    }
    expect_same_bits("h * h", gx[1], gx[0], n);
    free(gx[0]);
    free(gx[1]);
    ct_tensor_release(x);
}

/* retain_graph keeps the recomputed result for the next backward, which
 * accumulates; without it, a third backward is refused. */
static void test_retain_graph(void **state) {
    (void)state;
    int64_t n = tu_randint(2, 20);
    double *xv;
    ct_tensor *x = tu_rand(CT_SHAPE(n), CT_F64, -2, 2, &xv);
    ct_tensor *w = tu_rand(CT_SHAPE(n), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    bool prev = ct_set_recompute_enabled(true);
    ct_tensor *h = ct_sin(x);
    ct_tensor *y = ct_mul(h, w);
    ct_tensor_release(h);
    ct_set_recompute_enabled(prev);
    backward_ones_retain(y, true);
    backward_ones_retain(y, false);
    double want[64];
    for (int64_t i = 0; i < n; i++) want[i] = 2 * sin(xv[i]);
    check_values(ct_grad(w), want, n, 1e-15, 0);
    ct_tensor *g = ct_tensor_ones_like(y);
    tu_assert_error(ct_backward(y, g, false), CT_ERR_AUTOGRAD, "ct_backward", "second time");
    free(xv);
    ct_tensor *ts[4] = {x, w, y, g};
    release_all(4, ts);
}

/* A result written in place before a consumer saves it is saved as it is
 * (its storage stays); one written in no-grad mode after the consumer saved
 * it: without recomputation the backward refuses, with it the gradient is
 * that of the values the consumer saw. */
static void test_written_in_place(void **state) {
    (void)state;
    int64_t n = tu_randint(1, 20);
    double *xv;
    ct_tensor *x = tu_rand(CT_SHAPE(n), CT_F64, -2, 2, &xv);
    ct_tensor *w = tu_rand(CT_SHAPE(n), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    assert_int_equal(ct_requires_grad_(x, true), CT_OK);
    double want[32];
    for (int64_t i = 0; i < n; i++) want[i] = sin(xv[i]) + 1;
    /* written before it is saved: saved as usual, so the storage stays */
    int64_t storages[2];
    for (int on = 0; on < 2; on++) {
        bool prev = ct_set_recompute_enabled(on);
        ct_zero_grad(w);
        ct_zero_grad(x);
        ct_tensor *h = ct_sin(x);
        bool g0 = ct_no_grad_begin();
        assert_int_equal(ct_add_scalar_(h, 1), CT_OK);
        ct_no_grad_end(g0);
        ct_tensor *y = ct_mul(h, w);
        ct_tensor_release(h);
        storages[on] = cti_get_alloc_stats().live_storages;
        ct_set_recompute_enabled(prev);
        backward_ones(y);
        ct_tensor_release(y);
        check_values(ct_grad(w), want, n, 1e-15, 0);
    }
    assert_int_equal(storages[1], storages[0]);
    /* written after it is saved */
    for (int on = 0; on < 2; on++) {
        bool prev = ct_set_recompute_enabled(on);
        ct_zero_grad(w);
        ct_tensor *h = ct_sin(x);
        ct_tensor *y = ct_mul(h, w);
        ct_set_recompute_enabled(prev);
        bool g0 = ct_no_grad_begin();
        assert_int_equal(ct_add_scalar_(h, 1), CT_OK);
        ct_no_grad_end(g0);
        ct_tensor *g = ct_tensor_ones_like(y);
        if (!on) {
            tu_assert_error(ct_backward(y, g, false), CT_ERR_AUTOGRAD, "MulBackward",
                            "modified by an in-place operation");
        } else {
            assert_int_equal(ct_backward(y, g, false), CT_OK);
            for (int64_t i = 0; i < n; i++) want[i] = sin(xv[i]);
            check_values(ct_grad(w), want, n, 1e-15, 0);
        }
        ct_tensor *ts[3] = {h, y, g};
        release_all(3, ts);
    }
    free(xv);
    ct_tensor_release(x);
    ct_tensor_release(w);
}

/* What is not left to recomputation: relu's result (its node keeps it for
 * its own formula), a view of a result, a result of an op that saves none
 * of its inputs (exp, whose formula reads its result). The same storages
 * stay with the setting on or off. */
static void test_left_alone(void **state) {
    (void)state;
    for (int k = 0; k < 3; k++) {
        int64_t storages[2];
        for (int on = 0; on < 2; on++) {
            ct_tensor *x = tu_rand(CT_SHAPE(3, 4), CT_F32, -2, 2, NULL);
            ct_tensor *w = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
            assert_int_equal(ct_requires_grad_(x, true), CT_OK);
            bool prev = ct_set_recompute_enabled(on);
            ct_tensor *h = k == 0 ? ct_relu(x) : k == 1 ? ct_gelu(x, CT_GELU_NONE) : ct_exp(x);
            ct_tensor *hv = k == 1 ? ct_view(h, CT_SHAPE(3, 4)) : ct_tensor_retain(h);
            ct_tensor *y = ct_mul(hv, w);
            ct_tensor_release(h);
            ct_tensor_release(hv);
            storages[on] = cti_get_alloc_stats().live_storages;
            ct_set_recompute_enabled(prev);
            backward_ones(y);
            ct_tensor *ts[3] = {x, w, y};
            release_all(3, ts);
        }
        assert_int_equal(storages[1], storages[0]);
    }
}

/* The setting: off by default, the previous one returned, per thread. */
static void *other_thread(void *arg) {
    *(bool *)arg = ct_is_recompute_enabled();
    return NULL;
}

static void test_setting(void **state) {
    (void)state;
    assert_false(ct_is_recompute_enabled());
    assert_false(ct_set_recompute_enabled(true));
    assert_true(ct_is_recompute_enabled());
    bool seen = true;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, other_thread, &seen), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_false(seen);
    assert_true(ct_set_recompute_enabled(false));
    assert_false(ct_is_recompute_enabled());
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_same_gradients_less_memory, setup, teardown),
        cmocka_unit_test_setup_teardown(test_silu_reference, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chain, setup, teardown),
        cmocka_unit_test_setup_teardown(test_saved_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retain_graph, setup, teardown),
        cmocka_unit_test_setup_teardown(test_written_in_place, setup, teardown),
        cmocka_unit_test_setup_teardown(test_left_alone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_setting, setup, teardown),
    };
    return tu_run_tests(tests);
}
