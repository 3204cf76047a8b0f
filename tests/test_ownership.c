/* Ownership of handles: scopes, retains, releases, ct_keep, and the
 * references the library itself holds (graph edges, parameter lists,
 * optimizers, data loaders, the autocast cast cache), in every combination. A double release shows up
 * as a live-tensor count below the start (and under ASan as a
 * use-after-free); a reference nobody releases, as a count above it. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "tensor/tensor.h"

#include "test_fixture.h"

/* w = [1, 2, 3, 4] (f32), or after one SGD step with lr 0.5 on
 * loss = sum(w * w): w - 0.5 * 2w = 0. */
static void assert_w(ct_tensor *w, bool stepped) {
    assert_non_null(w);
    double *got = tu_values(w);
    for (int i = 0; i < 4; i++) assert_true(got[i] == (stepped ? 0.0 : i + 1.0));
    free(got);
}

enum {
    USE_GRAPH = 1 << 0,   /* w is a leaf of a graph that outlives the scope's other tensors */
    USE_BACKWARD = 1 << 1, /* backward ran (graph freed, w.grad set) */
    USE_PARAMS = 1 << 2,  /* a parameter list holds w */
    USE_OPTIM = 1 << 3,   /* an optimizer over that list holds w, and steps */
    USE_LOADER = 1 << 4,  /* a data loader holds w */
    RELEASE_EARLY = 1 << 5, /* the creator releases w inside the scope */
    KEEP = 1 << 6,        /* ct_keep(w) inside the scope */
    NESTED = 1 << 7,      /* w is made in an inner scope */
    USE_AUTOCAST = 1 << 8, /* an autocast region, open past the scopes, caches w's cast */
    NUM_CASES = 1 << 9,
};

typedef struct {
    ct_params *params;
    ct_optimizer *opt;
    ct_dataloader *loader;
    ct_tensor *loss; /* kept out of the scope when the graph must outlive it */
    int retains;
    bool caller_owns; /* ct_keep handed w to the caller */
} holders;

/* Builds every holder the case asks for on w, inside the innermost scope. */
static void take_holders(ct_tensor *w, int c, holders *h) {
    if (c & USE_GRAPH) {
        assert_int_equal(ct_requires_grad_(w, true), CT_OK);
        h->loss = ct_keep(ct_sum(ct_mul(w, w), CT_NONE, false));
        if (c & NESTED) h->loss = ct_keep(h->loss);
        assert_non_null(h->loss);
        if (c & USE_BACKWARD) assert_int_equal(ct_backward(h->loss, NULL, false), CT_OK);
    }
    for (int r = 0; r < h->retains; r++) assert_ptr_equal(ct_tensor_retain(w), w);
    if (c & USE_AUTOCAST) {
        /* a float32 leaf that requires grad: its bfloat16 cast goes to the cache */
        assert_int_equal(ct_requires_grad_(w, true), CT_OK);
        ct_tensor *d = ct_matmul(w, w);
        assert_non_null(d);
        assert_int_equal(ct_tensor_dtype(d), CT_BF16);
        ct_tensor_release(d);
    }
    if (c & (USE_PARAMS | USE_OPTIM)) {
        assert_non_null(h->params = ct_params_new());
        assert_int_equal(ct_params_add(h->params, "w", w), CT_OK);
    }
    if (c & USE_OPTIM) {
        assert_non_null(h->opt = ct_optim_sgd_new(h->params, 0.5, 0, 0, 0, false));
        if ((c & USE_BACKWARD) && (c & USE_GRAPH))
            assert_int_equal(ct_optim_step(h->opt), CT_OK);
    }
    if (c & USE_LOADER) assert_non_null(h->loader = ct_dataloader_new(w, NULL, 4, false, false, 1));
}

static bool stepped(int c) {
    return (c & USE_OPTIM) && (c & USE_GRAPH) && (c & USE_BACKWARD);
}

/* Reads w through every holder still holding it, then lets each go. */
static void check_and_drop(ct_tensor *w, int c, holders *h) {
    if (h->retains || h->caller_owns) assert_w(w, stepped(c));
    if (h->params) assert_w(ct_params_find(h->params, "w"), stepped(c));
    if (h->loader) {
        ct_tensor *x = NULL;
        assert_true(ct_dataloader_next(h->loader, &x, NULL));
        assert_w(x, stepped(c));
        ct_tensor_release(x);
    }
    if (h->loss && !(c & USE_BACKWARD)) {
        /* The graph alone keeps w alive: backward reaches it. */
        assert_int_equal(ct_backward(h->loss, NULL, false), CT_OK);
        double *g = tu_values(ct_grad(w));
        for (int i = 0; i < 4; i++) assert_true(g[i] == (stepped(c) ? 0.0 : 2.0 * (i + 1)));
        free(g);
    }
    ct_optim_free(h->opt);
    ct_params_free(h->params);
    ct_dataloader_free(h->loader);
    ct_tensor_release(h->loss);
    for (int r = 0; r < h->retains; r++) ct_tensor_release(w);
    if (h->caller_owns) ct_tensor_release(w);
    /* the region's end drops the cache's references, the last ones when no holder is left */
    if (c & USE_AUTOCAST) assert_int_equal(ct_autocast_end(), CT_OK);
}

static void run_case(int c, int retains) {
    cti_alloc_stats before = cti_get_alloc_stats();
    holders h = {.retains = retains};
    if (c & USE_AUTOCAST) assert_int_equal(ct_autocast_begin(CT_CPU, CT_BF16), CT_OK);
    ct_scope *outer = ct_scope_begin(), *inner = NULL;
    assert_non_null(outer);
    if (c & NESTED) assert_non_null(inner = ct_scope_begin());
    ct_tensor *w = tu_from_f64((const double[]){1, 2, 3, 4}, CT_SHAPE(4), CT_F32);
    take_holders(w, c, &h);
    /* A released handle is no longer the scope's to keep. */
    if (c & RELEASE_EARLY) ct_tensor_release(w);
    else if (c & KEEP) {
        assert_ptr_equal(ct_keep(w), w);
        h.caller_owns = !(c & NESTED);
    }
    if (inner) {
        ct_scope_end(inner);
        /* Kept into the outer scope: still alive there. */
        if ((c & KEEP) && !(c & RELEASE_EARLY)) assert_w(w, stepped(c));
    }
    ct_scope_end(outer);
    check_and_drop(w, c, &h);
    cti_alloc_stats after = cti_get_alloc_stats();
    if (!same_stats(before, after))
        fail_msg("case %#x with %d retains: tensors %lld -> %lld", c, retains,
                 (long long)before.live_tensors, (long long)after.live_tensors);
}

static void test_every_combination(void **state) {
    (void)state;
    for (int retains = 0; retains <= 2; retains++)
        for (int c = 0; c < NUM_CASES; c++) {
            if ((c & USE_BACKWARD) && !(c & USE_GRAPH)) continue;
            if ((c & KEEP) && (c & RELEASE_EARLY)) continue;
            run_case(c, retains);
        }
}

/* The two programs that used to free w twice. */
static void test_release_inside_scope_with_graph(void **state) {
    (void)state;
    tu_scope s = tu_scope_begin();
    ct_tensor *w = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    ct_tensor *loss = ct_sum(ct_mul(w, w), CT_NONE, false);
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    ct_tensor_release(w);
    tu_scope_end_clean(s);
}

static void test_release_inside_scope_with_params(void **state) {
    (void)state;
    cti_alloc_stats before = cti_get_alloc_stats();
    ct_params *p = ct_params_new();
    ct_scope *s = ct_scope_begin();
    ct_tensor *w = tu_from_f64((const double[]){1, 2, 3, 4}, CT_SHAPE(4), CT_F32);
    assert_int_equal(ct_params_add(p, "w", w), CT_OK);
    ct_tensor_release(w);
    ct_scope_end(s);
    assert_w(ct_params_get(p, 0, NULL), false);
    double v = 0;
    ct_tensor *first = ct_select(ct_params_get(p, 0, NULL), 0, 0);
    assert_int_equal(ct_tensor_item(first, &v), CT_OK);
    assert_true(v == 1.0);
    ct_tensor_release(first);
    ct_params_free(p);
    assert_true(same_stats(before, cti_get_alloc_stats()));
}

/* A retain inside a scope is the caller's own reference: it needs a release
 * of its own, whether the creation reference went to the scope or to an
 * early release. */
static void test_retain_inside_scope(void **state) {
    (void)state;
    cti_alloc_stats before = cti_get_alloc_stats();
    ct_scope *s = ct_scope_begin();
    ct_tensor *w = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    ct_tensor_retain(w);
    ct_tensor_release(w); /* the scope's reference */
    ct_tensor_release(w); /* the retain */
    ct_tensor *v = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    ct_tensor_retain(v);
    ct_scope_end(s); /* releases the creation reference of v only */
    assert_int_equal(cti_get_alloc_stats().live_tensors, before.live_tensors + 1);
    ct_tensor_release(v);
    assert_true(same_stats(before, cti_get_alloc_stats()));
}

/* backward with a grad_out the caller's scope owns leaves that scope's
 * ownership alone. */
static void test_backward_grad_out_in_scope(void **state) {
    (void)state;
    cti_alloc_stats before = cti_get_alloc_stats();
    ct_tensor *w = tu_from_f64((const double[]){1, 2, 3, 4}, CT_SHAPE(4), CT_F32);
    assert_int_equal(ct_requires_grad_(w, true), CT_OK);
    ct_scope *s = ct_scope_begin();
    ct_tensor *y = ct_mul_scalar(w, 3.0);
    ct_tensor *go = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    assert_int_equal(ct_backward(y, go, false), CT_OK);
    ct_tensor *leaf_go = ct_tensor_ones(CT_SHAPE(4), CT_F32, CT_CPU);
    assert_int_equal(ct_backward(w, leaf_go, false), CT_OK);
    ct_scope_end(s);
    double *g = tu_values(ct_grad(w));
    for (int i = 0; i < 4; i++) assert_true(g[i] == 4.0);
    free(g);
    ct_tensor_release(w);
    assert_true(same_stats(before, cti_get_alloc_stats()));
}

/* Another thread's release drops a reference of its own, never the scope's
 * of the creating thread. */
static void *release_on_other_thread(void *arg) {
    ct_tensor_release(arg);
    return NULL;
}

static void test_release_on_another_thread(void **state) {
    (void)state;
    tu_scope s = tu_scope_begin();
    ct_tensor *w = tu_from_f64((const double[]){1, 2, 3, 4}, CT_SHAPE(4), CT_F32);
    ct_tensor_retain(w); /* handed to the other thread */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_on_other_thread, w), 0);
    assert_int_equal(pthread_join(th, NULL), 0);
    assert_w(w, false); /* the scope still holds it */
    tu_scope_end_clean(s);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
        T(test_every_combination),
        T(test_release_inside_scope_with_graph),
        T(test_release_inside_scope_with_params),
        T(test_retain_inside_scope),
        T(test_backward_grad_out_in_scope),
        T(test_release_on_another_thread),
#undef T
    };
    return tu_run_tests(tests);
}
