/* Training checkpoints: a run resumed from one continues exactly as the
 * uninterrupted run (parameters, AdamW state and the data order), a model
 * alone loads from a full checkpoint, every mismatch is refused with the
 * right status and nothing changed, and the typed metadata values round
 * trip and refuse malformed text. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <unistd.h>
#include <cmocka.h>

#include "test_util.h"

#include "test_fixture.h"

typedef struct run {
    ct_tensor *w1, *b1, *w2, *x, *y;
    ct_params *params;
    ct_optimizer *opt;
    ct_dataloader *dl;
} run;

/* A two-layer regression on 40 random samples, batches of 8, shuffled. */
static void run_new(run *r, uint64_t init_seed, bool sgd) {
    ct_generator *g = ct_generator_new(init_seed);
    r->w1 = ct_tensor_randn(g, CT_SHAPE(16, 5), CT_F32, CT_CPU);
    r->b1 = ct_tensor_zeros(CT_SHAPE(16), CT_F32, CT_CPU);
    r->w2 = ct_tensor_randn(g, CT_SHAPE(1, 16), CT_F32, CT_CPU);
    ct_generator *d = ct_generator_new(99);
    r->x = ct_tensor_randn(d, CT_SHAPE(40, 5), CT_F32, CT_CPU);
    r->y = ct_tensor_randn(d, CT_SHAPE(40, 1), CT_F32, CT_CPU);
    ct_generator_free(g);
    ct_generator_free(d);
    r->params = ct_params_new();
    assert_int_equal(ct_params_add(r->params, "fc1.weight", r->w1), CT_OK);
    assert_int_equal(ct_params_add(r->params, "fc1.bias", r->b1), CT_OK);
    assert_int_equal(ct_params_add(r->params, "fc2.weight", r->w2), CT_OK);
    for (int64_t i = 0; i < 3; i++) ct_requires_grad_(ct_params_get(r->params, i, NULL), true);
    r->opt = sgd ? ct_optim_sgd_new(r->params, 0.01, 0.9, 0, 0, false)
                 : ct_optim_adamw_new(r->params, 0.01, 0.9, 0.999, 1e-8, 0.01);
    assert_non_null(r->opt);
    r->dl = ct_dataloader_new(r->x, r->y, 8, true, false, 7);
    assert_non_null(r->dl);
}

static void run_free(run *r) {
    ct_dataloader_free(r->dl);
    ct_optim_free(r->opt);
    ct_params_free(r->params);
    ct_tensor_release(r->w1), ct_tensor_release(r->b1), ct_tensor_release(r->w2);
    ct_tensor_release(r->x), ct_tensor_release(r->y);
}

/* One step on the next batch (a new epoch when the last ended); its loss. */
static double step(run *r) {
    ct_scope *s = ct_scope_begin();
    ct_tensor *x, *y;
    if (!ct_dataloader_next(r->dl, &x, &y)) {
        assert_int_equal(ct_dataloader_status(r->dl), CT_OK);
        assert_int_equal(ct_dataloader_reset(r->dl), CT_OK);
        assert_true(ct_dataloader_next(r->dl, &x, &y));
    }
    ct_tensor *h = ct_relu(ct_linear(x, r->w1, r->b1));
    ct_tensor *loss = ct_mse_loss(ct_linear(h, r->w2, NULL), y, CT_REDUCTION_MEAN);
    assert_non_null(loss);
    double v;
    assert_int_equal(ct_tensor_item(loss, &v), CT_OK);
    ct_optim_zero_grad(r->opt);
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    assert_int_equal(ct_optim_step(r->opt), CT_OK);
    ct_scope_end(s);
    return v;
}

static char path[64];

static int setup_path(void **state) {
    snprintf(path, sizeof path, "/tmp/cten_ckpt_%d.safetensors", (int)getpid());
    return setup(state);
}

static int teardown_path(void **state) {
    unlink(path);
    return teardown(state);
}

static void test_resume_is_exact(void **state) {
    (void)state;
    for (int sgd = 0; sgd < 2; sgd++) {
        run a;
        run_new(&a, 1, sgd);
        for (int i = 0; i < 7; i++) step(&a); /* into the second epoch */
        ct_metadata *m = ct_metadata_new();
        assert_int_equal(ct_metadata_set_int(m, "step", 7), CT_OK);
        assert_int_equal(ct_metadata_set(m, "model", "mlp"), CT_OK);
        assert_int_equal(ct_checkpoint_save(path, a.params, a.opt, a.dl, m), CT_OK);
        ct_metadata_free(m);
        double want[9];
        for (int i = 0; i < 9; i++) want[i] = step(&a);
        /* Another initialisation, resumed: the same losses, bit for bit. */
        run b;
        run_new(&b, 2, sgd);
        ct_metadata *got = NULL;
        assert_int_equal(ct_checkpoint_load(path, b.params, b.opt, b.dl, &got), CT_OK);
        int64_t st;
        assert_int_equal(ct_metadata_get_int(got, "step", &st), CT_OK);
        assert_int_equal(st, 7);
        assert_string_equal(ct_metadata_get(got, "model"), "mlp");
        assert_string_equal(ct_metadata_get(got, "cten.checkpoint"), "1");
        ct_metadata_free(got);
        for (int i = 0; i < 9; i++) assert_true(step(&b) == want[i]);
        run_free(&b);
        run_free(&a);
    }
}

static bool same_values(ct_tensor *a, ct_tensor *b) {
    double *x = tu_values(a), *y = tu_values(b);
    bool same = true;
    for (int64_t i = 0; i < ct_tensor_numel(a); i++) same = same && x[i] == y[i];
    free(x), free(y);
    return same;
}

static void test_model_only_and_mismatches(void **state) {
    (void)state;
    run a, b;
    run_new(&a, 1, false);
    step(&a);
    assert_int_equal(ct_checkpoint_save(path, a.params, a.opt, a.dl, NULL), CT_OK);
    /* The model alone: the optimizer state in the file is ignored. */
    run_new(&b, 2, false);
    assert_int_equal(ct_checkpoint_load(path, b.params, NULL, NULL, NULL), CT_OK);
    assert_true(same_values(a.w1, b.w1) && same_values(a.w2, b.w2));
    run_free(&b);
    /* SGD with momentum has 2 state tensors per parameter, AdamW 3. */
    run_new(&b, 2, true);
    ct_dataloader_state before = ct_dataloader_get_state(b.dl);
    tu_assert_error(ct_checkpoint_load(path, b.params, b.opt, b.dl, NULL), CT_ERR_FORMAT,
                    "ct_checkpoint_load", "holds 9 optimizer state tensors, the optimizer has 6");
    assert_false(same_values(a.w1, b.w1));
    run_free(&b);
    /* Another shape: refused after the loader was checked, which is undone. */
    run_new(&b, 2, false);
    ct_tensor *w = ct_tensor_zeros(CT_SHAPE(16, 6), CT_F32, CT_CPU);
    ct_params *p = ct_params_new();
    assert_int_equal(ct_params_add(p, "fc1.weight", w), CT_OK);
    before = ct_dataloader_get_state(b.dl);
    tu_assert_error(ct_checkpoint_load(path, p, NULL, b.dl, NULL), CT_ERR_SHAPE,
                    "ct_checkpoint_load", "fc1.weight");
    ct_dataloader_state after = ct_dataloader_get_state(b.dl);
    assert_true(after.epoch == before.epoch && after.position == before.position);
    double *wv = tu_values(w);
    for (int i = 0; i < 96; i++) assert_true(wv[i] == 0);
    free(wv);
    ct_params_free(p);
    ct_tensor_release(w);
    /* A safetensors file that is no checkpoint. */
    assert_int_equal(ct_save_safetensors(path, b.params, NULL), CT_OK);
    tu_assert_error(ct_checkpoint_load(path, a.params, NULL, NULL, NULL), CT_ERR_FORMAT,
                    "ct_checkpoint_load", "is not a cten checkpoint");
    /* Reserved names. */
    ct_metadata *m = ct_metadata_new();
    ct_metadata_set(m, "cten.mine", "1");
    tu_assert_error(ct_checkpoint_save(path, a.params, a.opt, NULL, m), CT_ERR_INVALID_ARG,
                    "ct_checkpoint_save", "cten.mine");
    ct_metadata_free(m);
    ct_params *q = ct_params_new();
    ct_params_add(q, "optim.0.step", a.w1);
    tu_assert_error(ct_checkpoint_save(path, q, a.opt, NULL, NULL), CT_ERR_INVALID_ARG,
                    "ct_checkpoint_save", "optim.0.step");
    ct_params_free(q);
    tu_assert_error(ct_checkpoint_save(NULL, a.params, NULL, NULL, NULL), CT_ERR_INVALID_ARG,
                    "ct_checkpoint_save", "path");
    tu_assert_error(ct_checkpoint_load(path, NULL, NULL, NULL, NULL), CT_ERR_INVALID_ARG,
                    "ct_checkpoint_load", "parameter list");
    tu_assert_error(ct_checkpoint_load("/nonexistent/x.safetensors", a.params, NULL, NULL, NULL),
                    CT_ERR_IO, "ct_checkpoint_load", "cannot open");
    run_free(&b);
    run_free(&a);
}

static void test_typed_metadata(void **state) {
    (void)state;
    ct_metadata *m = ct_metadata_new();
    double dv[] = {0.1, -1e-300, 1.0 / 3, 6.02214076e23, INFINITY};
    for (int i = 0; i < 5; i++) {
        char key[8];
        snprintf(key, sizeof key, "d%d", i);
        assert_int_equal(ct_metadata_set_double(m, key, dv[i]), CT_OK);
        double back;
        assert_int_equal(ct_metadata_get_double(m, key, &back), CT_OK);
        assert_true(back == dv[i]);
    }
    int64_t i64;
    uint64_t u64;
    assert_int_equal(ct_metadata_set_int(m, "min", INT64_MIN), CT_OK);
    assert_int_equal(ct_metadata_get_int(m, "min", &i64), CT_OK);
    assert_true(i64 == INT64_MIN);
    assert_int_equal(ct_metadata_set_uint(m, "max", UINT64_MAX), CT_OK);
    assert_int_equal(ct_metadata_get_uint(m, "max", &u64), CT_OK);
    assert_true(u64 == UINT64_MAX);
    tu_assert_error(ct_metadata_get_int(m, "max", &i64), CT_ERR_FORMAT, "ct_metadata_get_int",
                    "'max'", "not an int64");
    ct_metadata_set(m, "bad", "12x");
    tu_assert_error(ct_metadata_get_int(m, "bad", &i64), CT_ERR_FORMAT, "\"12x\"");
    tu_assert_error(ct_metadata_get_double(m, "bad", NULL), CT_ERR_INVALID_ARG, "NULL");
    ct_metadata_set(m, "neg", "-3");
    tu_assert_error(ct_metadata_get_uint(m, "neg", &u64), CT_ERR_FORMAT, "not a uint64");
    tu_assert_error(ct_metadata_get_int(m, "absent", &i64), CT_ERR_FORMAT, "no metadata key 'absent'");
    tu_assert_error(ct_metadata_get_int(NULL, "x", &i64), CT_ERR_INVALID_ARG, "NULL");
    ct_metadata_free(m);
}

int main(void) {
#define T(f) cmocka_unit_test_setup_teardown(f, setup_path, teardown_path)
    const struct CMUnitTest tests[] = {
        T(test_resume_is_exact),
        T(test_model_only_and_mismatches),
        T(test_typed_metadata),
    };
#undef T
    return tu_run_tests(tests);
}
