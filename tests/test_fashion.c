/* Training on Fashion-MNIST end to end: the data set files as the IDX reader
 * sees them, short CPU training runs of the examples' MLP and CNN on a
 * subset that must beat 70% test accuracy, and a checkpoint/resume round
 * trip (parameters, optimizer state, data loader state) that continues
 * exactly as an uninterrupted run. The data tests skip when the dataset
 * files are absent (CT_FASHION_DATA names another directory). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/tensor_impl.h"
#include "test_util.h"

#include "test_fixture.h"

#define MEAN 0.2860
#define STD 0.3530

static const char *data_dir(void) {
    const char *d = getenv("CT_FASHION_DATA");
    return d && *d ? d : "/usr/share/datasets/fashion-mnist";
}

static void file_path(char *buf, size_t n, const char *split, const char *what) {
    snprintf(buf, n, "%s/%s-%s-ubyte.gz", data_dir(), split, what);
}

static bool have_data(void) {
    static const char *splits[] = {"train", "t10k"}, *whats[] = {"images-idx3", "labels-idx1"};
    for (int s = 0; s < 2; s++) {
        for (int w = 0; w < 2; w++) {
            char p[4096];
            file_path(p, sizeof p, splits[s], whats[w]);
            if (access(p, R_OK) != 0) return false;
        }
    }
    return true;
}

/* The first limit samples of a split, as the examples prepare them: images
 * [N, 1, 28, 28] float32, (x / 255 - mean) / std; labels [N] int64. */
static void load_split(const char *split, int64_t limit, ct_tensor **x, ct_tensor **y) {
    char ip[4096], lp[4096];
    file_path(ip, sizeof ip, split, "images-idx3");
    file_path(lp, sizeof lp, split, "labels-idx1");
    ct_scope *s = ct_scope_begin();
    ct_tensor *img = ct_idx_load(ip, CT_F32), *lab = ct_idx_load(lp, CT_I64);
    if (!img || !lab) fail_msg("loading %s: %s", split, ct_last_error());
    int64_t n = ct_tensor_size(img, 0);
    if (limit > 0 && limit < n) n = limit;
    img = ct_narrow(img, 0, 0, n);
    lab = ct_contiguous(ct_narrow(lab, 0, 0, n));
    img = ct_div_scalar(ct_sub_scalar(ct_div_scalar(img, 255.0), MEAN), STD);
    img = ct_reshape(img, CT_SHAPE(n, 1, 28, 28));
    assert_non_null(img);
    assert_non_null(lab);
    *x = ct_keep(img);
    *y = ct_keep(lab);
    ct_scope_end(s);
}

/* ---- the data set -------------------------------------------------------------------------- */

/* Sizes, the first labels, ten balanced classes, and the pixel statistics
 * behind the normalisation constants every example uses. */
static void test_dataset_files(void **state) {
    (void)state;
    if (!have_data()) skip();
    char p[4096];
    static const int64_t train_first[10] = {9, 0, 0, 3, 0, 2, 7, 2, 5, 5};
    static const int64_t test_first[10] = {9, 2, 1, 1, 6, 1, 4, 6, 5, 7};
    static const char *splits[2] = {"train", "t10k"};
    const int64_t sizes[2] = {60000, 10000};
    const int64_t *firsts[2] = {train_first, test_first};
    for (int s = 0; s < 2; s++) {
        ct_scope *sc = ct_scope_begin();
        file_path(p, sizeof p, splits[s], "labels-idx1");
        ct_tensor *y = ct_idx_load(p, CT_I64);
        assert_non_null(y);
        assert_int_equal(ct_tensor_ndim(y), 1);
        assert_int_equal(ct_tensor_size(y, 0), sizes[s]);
        int64_t first[10];
        assert_int_equal(ct_tensor_copy_to_host(ct_narrow(y, 0, 0, 10), first, sizeof first),
                         CT_OK);
        for (int i = 0; i < 10; i++) assert_int_equal(first[i], firsts[s][i]);
        for (int c = 0; c < 10; c++) {
            double count = 0;
            assert_int_equal(ct_tensor_item(ct_sum(ct_eq_scalar(y, c), CT_NONE, false), &count),
                             CT_OK);
            assert_int_equal((int64_t)count, sizes[s] / 10);
        }
        file_path(p, sizeof p, splits[s], "images-idx3");
        ct_tensor *x = ct_idx_load(p, CT_F32);
        assert_non_null(x);
        assert_int_equal(ct_tensor_ndim(x), 3);
        assert_int_equal(ct_tensor_size(x, 0), sizes[s]);
        assert_int_equal(ct_tensor_size(x, 1), 28);
        assert_int_equal(ct_tensor_size(x, 2), 28);
        if (s == 0) {
            double mean = -1, std = -1, lo = -1, hi = -1;
            ct_tensor *scaled = ct_to_dtype(ct_div_scalar(x, 255.0), CT_F64);
            assert_int_equal(ct_tensor_item(ct_mean(scaled, CT_NONE, false), &mean), CT_OK);
            assert_int_equal(ct_tensor_item(ct_std(scaled, CT_NONE, 0.0, false), &std), CT_OK);
            assert_int_equal(ct_tensor_item(ct_min(x), &lo), CT_OK);
            assert_int_equal(ct_tensor_item(ct_max(x), &hi), CT_OK);
            assert_true(fabs(mean - MEAN) < 5e-4);
            assert_true(fabs(std - STD) < 5e-4);
            assert_true(lo == 0.0 && hi == 255.0);
        }
        ct_scope_end(sc);
    }
}

/* ---- the examples' models ---------------------------------------------------------------------- */

typedef struct model {
    bool conv;
    ct_nn_conv2d *conv1, *conv2;
    ct_nn_linear *fc1, *fc2;
    ct_params *params;
} model;

/* MLP 784-256-10 or CNN conv(1->16)-relu-pool-conv(16->32)-relu-pool-linear(1568->10). */
static void model_init(model *m, bool conv, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->conv = conv;
    m->params = ct_params_new();
    ct_generator *gen = ct_generator_new(seed);
    assert_non_null(m->params);
    assert_non_null(gen);
    if (conv) {
        const int64_t k3[2] = {3, 3}, pad1[2] = {1, 1};
        m->conv1 = ct_nn_conv2d_new(1, 16, k3, NULL, pad1, NULL, 1, true, CT_F32, CT_CPU, gen);
        m->conv2 = ct_nn_conv2d_new(16, 32, k3, NULL, pad1, NULL, 1, true, CT_F32, CT_CPU, gen);
        m->fc1 = ct_nn_linear_new(32 * 7 * 7, 10, true, CT_F32, CT_CPU, gen);
        assert_non_null(m->conv1);
        assert_non_null(m->conv2);
        assert_non_null(m->fc1);
        assert_int_equal(ct_nn_conv2d_params(m->conv1, "conv1", m->params), CT_OK);
        assert_int_equal(ct_nn_conv2d_params(m->conv2, "conv2", m->params), CT_OK);
        assert_int_equal(ct_nn_linear_params(m->fc1, "fc", m->params), CT_OK);
    } else {
        m->fc1 = ct_nn_linear_new(28 * 28, 256, true, CT_F32, CT_CPU, gen);
        m->fc2 = ct_nn_linear_new(256, 10, true, CT_F32, CT_CPU, gen);
        assert_non_null(m->fc1);
        assert_non_null(m->fc2);
        assert_int_equal(ct_nn_linear_params(m->fc1, "fc1", m->params), CT_OK);
        assert_int_equal(ct_nn_linear_params(m->fc2, "fc2", m->params), CT_OK);
    }
    ct_generator_free(gen);
}

static ct_tensor *model_forward(model *m, ct_tensor *x) {
    if (!m->conv)
        return ct_nn_linear_forward(
            m->fc2, ct_relu(ct_nn_linear_forward(m->fc1, ct_flatten(x, 1, -1))));
    const int64_t k2[2] = {2, 2};
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv1, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    x = ct_max_pool2d(ct_relu(ct_nn_conv2d_forward(m->conv2, x)), k2, NULL, NULL, NULL, false,
                      NULL);
    return ct_nn_linear_forward(m->fc1, ct_flatten(x, 1, -1));
}

static void model_free(model *m) {
    ct_nn_conv2d_free(m->conv1);
    ct_nn_conv2d_free(m->conv2);
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
    ct_params_free(m->params);
}

/* One optimizer step on (x, y) at the cosine schedule's step; returns the loss. */
static double train_step(model *m, ct_optimizer *opt, double base_lr, int64_t step,
                         int64_t total, ct_tensor *x, ct_tensor *y) {
    assert_int_equal(ct_optim_set_lr(opt, ct_lr_cosine_warmup(base_lr, 0, total, 0.0, step)),
                     CT_OK);
    ct_tensor *loss =
        ct_cross_entropy(model_forward(m, x), y, NULL, CT_REDUCTION_MEAN, -100, 0.0);
    if (!loss) fail_msg("forward: %s", ct_last_error());
    ct_optim_zero_grad(opt);
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    assert_int_equal(ct_optim_step(opt), CT_OK);
    double l = NAN;
    assert_int_equal(ct_tensor_item(loss, &l), CT_OK);
    return l;
}

/* Fraction of correct argmax predictions on (x, y), in no-grad mode. */
static double accuracy(model *m, ct_tensor *x, ct_tensor *y) {
    bool prev = ct_no_grad_begin();
    ct_scope *s = ct_scope_begin();
    double correct = -1;
    ct_tensor *pred = ct_argmax(model_forward(m, x), 1, false);
    assert_int_equal(ct_tensor_item(ct_sum(ct_eq(pred, y), CT_NONE, false), &correct), CT_OK);
    ct_scope_end(s);
    ct_no_grad_end(prev);
    return correct / (double)ct_tensor_size(y, 0);
}

/* One epoch over the first ntrain training images (batch 64, AdamW with a
 * cosine schedule, as the examples), then the accuracy on the first 1000
 * test images, which must beat 70% (chance is 10%). */
static void train_subset(bool conv, int64_t ntrain) {
    ct_tensor *tx, *ty, *vx, *vy;
    load_split("train", ntrain, &tx, &ty);
    load_split("t10k", 1000, &vx, &vy);
    model m;
    model_init(&m, conv, 1);
    double before = accuracy(&m, vx, vy);
    ct_optimizer *opt = ct_optim_adamw_new(m.params, 2e-3, 0.9, 0.999, 1e-8, 1e-2);
    ct_dataloader *dl = ct_dataloader_new(tx, ty, 64, true, false, 7);
    assert_non_null(opt);
    assert_non_null(dl);
    int64_t total = ct_dataloader_num_batches(dl), step = 0;
    double first = 0, last_sum = 0;
    ct_tensor *x, *y;
    for (ct_scope *s = ct_scope_begin(); ct_dataloader_next(dl, &x, &y);
         ct_scope_end(s), s = ct_scope_begin()) {
        double l = train_step(&m, opt, 2e-3, step, total, x, y);
        assert_true(isfinite(l));
        if (step == 0) first = l;
        if (step >= total - 10) last_sum += l;
        step++;
    }
    assert_int_equal(ct_dataloader_status(dl), CT_OK);
    assert_int_equal(step, (ntrain + 63) / 64);
    double acc = accuracy(&m, vx, vy);
    printf("# %s: %lld images, 1 epoch: loss %.3f -> %.3f, test accuracy %.1f%% (untrained "
           "%.1f%%)\n",
           conv ? "CNN" : "MLP", (long long)ntrain, first, last_sum / 10, 100 * acc,
           100 * before);
    assert_true(last_sum / 10 < 0.8 * first);
    assert_true(acc > 0.70);
    ct_dataloader_free(dl);
    ct_optim_free(opt);
    model_free(&m);
    ct_tensor_release(tx);
    ct_tensor_release(ty);
    ct_tensor_release(vx);
    ct_tensor_release(vy);
}

static void test_mlp_subset(void **state) {
    (void)state;
    if (!have_data()) skip();
    train_subset(false, 6000);
}

static void test_cnn_subset(void **state) {
    (void)state;
    if (!have_data()) skip();
    train_subset(true, 6000);
}

/* ---- checkpoint and resume ------------------------------------------------------------------ */

/* The model's parameters and the optimizer's state, as the examples'
 * checkpoints hold them. */
static ct_params *state_list(model *m, ct_optimizer *opt) {
    ct_params *list = ct_params_new();
    assert_non_null(list);
    for (int64_t i = 0; i < ct_params_count(m->params); i++) {
        const char *name;
        ct_tensor *t = ct_params_get(m->params, i, &name);
        assert_int_equal(ct_params_add(list, name, t), CT_OK);
    }
    for (int64_t k = 0; k < ct_optim_state_count(opt); k++) {
        const char *name;
        char full[128];
        ct_tensor *t = ct_optim_state_get(opt, k, &name);
        assert_non_null(t);
        snprintf(full, sizeof full, "optim.%s", name);
        assert_int_equal(ct_params_add(list, full, t), CT_OK);
    }
    return list;
}

/* Runs steps [from, to) of a 2-epoch schedule, recording the losses. */
static void run_steps(model *m, ct_optimizer *opt, ct_dataloader *dl, int64_t from, int64_t to,
                      int64_t total, double *losses) {
    for (int64_t step = from; step < to; step++) {
        ct_scope *s = ct_scope_begin();
        ct_tensor *x, *y;
        if (!ct_dataloader_next(dl, &x, &y)) {
            assert_int_equal(ct_dataloader_status(dl), CT_OK);
            assert_int_equal(ct_dataloader_reset(dl), CT_OK);
            assert_true(ct_dataloader_next(dl, &x, &y));
        }
        losses[step] = train_step(m, opt, 1e-2, step, total, x, y);
        ct_scope_end(s);
    }
}

static void assert_params_equal(model *a, model *b) {
    assert_int_equal(ct_params_count(a->params), ct_params_count(b->params));
    for (int64_t i = 0; i < ct_params_count(a->params); i++) {
        ct_tensor *ta = ct_params_get(a->params, i, NULL), *tb = ct_params_get(b->params, i, NULL);
        int64_t n = ct_tensor_numel(ta);
        assert_int_equal(n, ct_tensor_numel(tb));
        float *va = malloc((size_t)n * sizeof(float)), *vb = malloc((size_t)n * sizeof(float));
        assert_non_null(va);
        assert_non_null(vb);
        assert_int_equal(ct_tensor_copy_to_host(ta, va, (size_t)n * sizeof(float)), CT_OK);
        assert_int_equal(ct_tensor_copy_to_host(tb, vb, (size_t)n * sizeof(float)), CT_OK);
        assert_memory_equal(va, vb, (size_t)n * sizeof(float));
        free(va);
        free(vb);
    }
}

/* A run stopped in the middle of its second epoch, saved (parameters,
 * AdamW and SGD state, data loader state in the metadata), loaded into a
 * model built from another seed and continued gives bit for bit the losses
 * and parameters of the run that never stopped; the same seed gives the
 * same losses. Random data, so this runs without the dataset. */
static void resume_case(bool conv, bool adamw) {
    const int64_t n = conv ? 320 : 640, batch = 64;
    ct_generator *gen = ct_generator_new(tu_next());
    ct_tensor *x = ct_tensor_randn(gen, CT_SHAPE(n, 1, 28, 28), CT_F32, CT_CPU);
    ct_tensor *y = ct_tensor_randint(gen, 0, 10, CT_SHAPE(n), CT_I64, CT_CPU);
    ct_generator_free(gen);
    assert_non_null(x);
    assert_non_null(y);
    const int64_t per_epoch = n / batch, total = 2 * per_epoch, stop = per_epoch + 3;
    double straight[32], again[32], resumed[32];
    assert_true(total <= 32);
    model ref, m2;
    for (int pass = 0; pass < 2; pass++) { /* the uninterrupted run, twice */
        model_init(&ref, conv, 3);
        ct_optimizer *opt = adamw ? ct_optim_adamw_new(ref.params, 1e-2, 0.9, 0.999, 1e-8, 1e-2)
                                  : ct_optim_sgd_new(ref.params, 1e-2, 0.9, 0.0, 1e-4, false);
        ct_dataloader *dl = ct_dataloader_new(x, y, batch, true, false, 11);
        assert_non_null(opt);
        assert_non_null(dl);
        run_steps(&ref, opt, dl, 0, total, total, pass ? again : straight);
        ct_dataloader_free(dl);
        ct_optim_free(opt);
        if (pass == 0) model_free(&ref);
    }
    assert_memory_equal(straight, again, (size_t)total * sizeof(double));

    char path[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(path, sizeof path, "%s/cten_test_fashion_%ld.safetensors", tmp && *tmp ? tmp : "/tmp",
             (long)getpid());
    { /* the interrupted run */
        model m;
        model_init(&m, conv, 3);
        ct_optimizer *opt = adamw ? ct_optim_adamw_new(m.params, 1e-2, 0.9, 0.999, 1e-8, 1e-2)
                                  : ct_optim_sgd_new(m.params, 1e-2, 0.9, 0.0, 1e-4, false);
        ct_dataloader *dl = ct_dataloader_new(x, y, batch, true, false, 11);
        run_steps(&m, opt, dl, 0, stop, total, resumed);
        ct_dataloader_state ls = ct_dataloader_get_state(dl);
        assert_int_equal(ls.epoch, 1);
        assert_int_equal(ls.position, 3 * batch);
        ct_metadata *meta = ct_metadata_new();
        char buf[32];
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)ls.gen_offset);
        assert_int_equal(ct_metadata_set(meta, "loader_gen_offset", buf), CT_OK);
        snprintf(buf, sizeof buf, "%llu", (unsigned long long)ls.seed);
        assert_int_equal(ct_metadata_set(meta, "loader_seed", buf), CT_OK);
        ct_params *list = state_list(&m, opt);
        assert_int_equal(ct_save_safetensors(path, list, meta), CT_OK);
        ct_params_free(list);
        ct_metadata_free(meta);
        ct_dataloader_free(dl);
        ct_optim_free(opt);
        model_free(&m);
    }
    { /* resumed into a model from another seed */
        model_init(&m2, conv, 99);
        ct_optimizer *opt = adamw ? ct_optim_adamw_new(m2.params, 1e-2, 0.9, 0.999, 1e-8, 1e-2)
                                  : ct_optim_sgd_new(m2.params, 1e-2, 0.9, 0.0, 1e-4, false);
        ct_dataloader *dl = ct_dataloader_new(x, y, batch, true, false, 11);
        ct_params *list = state_list(&m2, opt);
        ct_metadata *meta = NULL;
        assert_int_equal(ct_load_safetensors_into(path, list, true, &meta), CT_OK);
        const char *off = ct_metadata_get(meta, "loader_gen_offset");
        const char *seed = ct_metadata_get(meta, "loader_seed");
        assert_non_null(off);
        assert_non_null(seed);
        ct_dataloader_state ls = {1, 3 * batch, strtoull(seed, NULL, 10),
                                  strtoull(off, NULL, 10)};
        assert_int_equal(ct_dataloader_set_state(dl, &ls), CT_OK);
        run_steps(&m2, opt, dl, stop, total, total, resumed);
        ct_metadata_free(meta);
        ct_params_free(list);
        ct_dataloader_free(dl);
        ct_optim_free(opt);
    }
    unlink(path);
    assert_memory_equal(straight, resumed, (size_t)total * sizeof(double));
    assert_params_equal(&ref, &m2);
    model_free(&ref);
    model_free(&m2);
    ct_tensor_release(x);
    ct_tensor_release(y);
}

static void test_resume_mlp_adamw(void **state) {
    (void)state;
    resume_case(false, true);
}

static void test_resume_cnn_sgd(void **state) {
    (void)state;
    resume_case(true, false);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dataset_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mlp_subset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cnn_subset, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_mlp_adamw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resume_cnn_sgd, setup, teardown),
    };
    return tu_run_tests(tests);
}
