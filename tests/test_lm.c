/* The language-model example's pieces (examples/llm/model.c, data.c): the
 * byte tokenizer's text loading (files, the fortunes directory's layout),
 * the fixed train/validation split, the random windows and their batches,
 * the model's configuration checks, parameter names and shapes, output
 * shapes, causality and gradients. The training loop itself is checked by
 * lm_resume (a resumed run continues exactly) and lm_twin (PyTorch's
 * losses). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test_util.h"

#include "data.h"
#include "model.h"
#include "test_fixture.h"

/* ---- text and windows ------------------------------------------------------------------------- */

static lm_text pattern_text(int64_t n) {
    lm_text t = {malloc((size_t)n), n};
    assert_non_null(t.tokens);
    for (int64_t i = 0; i < n; i++) t.tokens[i] = (uint8_t)((i * 7 + i / 256) % 256);
    return t;
}

static void test_split(void **state) {
    (void)state;
    lm_text t = pattern_text(1000), train, val;
    char why[256];
    assert_true(lm_split(&t, 0.1, 16, &train, &val, why, sizeof why));
    /* the last tenth, the same every time, no copy */
    assert_int_equal(train.n, 900);
    assert_int_equal(val.n, 100);
    assert_ptr_equal(train.tokens, t.tokens);
    assert_ptr_equal(val.tokens, t.tokens + 900);
    /* each part needs a window of context + 1 tokens */
    assert_false(lm_split(&t, 0.1, 100, &train, &val, why, sizeof why));
    assert_non_null(strstr(why, "needs a window of 101"));
    assert_false(lm_split(&t, 0.0, 4, &train, &val, why, sizeof why));
    assert_false(lm_split(&t, 1.0, 4, &train, &val, why, sizeof why));
    lm_text_free(&t);
}

static void test_windows(void **state) {
    (void)state;
    enum { B = 64, T = 10 };
    lm_text t = pattern_text(500);
    uint64_t seed = tu_next();
    ct_generator *g1 = ct_generator_new(seed), *g2 = ct_generator_new(seed);
    int64_t s1[B], s2[B];
    lm_draw_starts(&t, T, B, g1, s1);
    /* one 32-bit draw per window, in range, every start reachable from the seed alone */
    assert_int_equal(ct_generator_offset(g1), B);
    lm_draw_starts(&t, T, B, g2, s2);
    assert_memory_equal(s1, s2, sizeof s1);
    bool differ = false;
    for (int b = 0; b < B; b++) {
        assert_true(s1[b] >= 0 && s1[b] <= t.n - T - 1);
        differ |= s1[b] != s1[0];
    }
    assert_true(differ);
    /* the next batch continues the stream: restoring the offset repeats it */
    uint64_t off = ct_generator_offset(g1);
    lm_draw_starts(&t, T, B, g1, s1);
    ct_generator_set_offset(g2, off);
    lm_draw_starts(&t, T, B, g2, s2);
    assert_memory_equal(s1, s2, sizeof s1);

    ct_tensor *x, *y;
    assert_true(lm_batch_at(&t, s1, B, T, CT_CPU, &x, &y));
    assert_int_equal(ct_tensor_dtype(x), CT_I64);
    assert_int_equal(ct_tensor_size(x, 0), B);
    assert_int_equal(ct_tensor_size(x, 1), T);
    const int64_t *xv = ct_tensor_data_ptr(x), *yv = ct_tensor_data_ptr(y);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) {
            assert_int_equal(xv[b * T + i], t.tokens[s1[b] + i]);
            assert_int_equal(yv[b * T + i], t.tokens[s1[b] + i + 1]); /* the next token */
        }
    ct_tensor_release(x);
    ct_tensor_release(y);
    ct_generator_free(g1);
    ct_generator_free(g2);
    lm_text_free(&t);
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The fortunes package's layout: text files, their .dat and .u8 index
 * files, and subdirectories; the text comes back in name order. */
static void test_load_dir(void **state) {
    (void)state;
    char dir[] = "/tmp/cten_test_lm_XXXXXX", sub[600], why[1024];
    assert_non_null(mkdtemp(dir));
    write_file(dir, "zippy", "Z\n%\n");
    write_file(dir, "art", "A\n%\n");
    write_file(dir, "art.dat", "index");
    write_file(dir, "art.u8", "utf8 index");
    snprintf(sub, sizeof sub, "%s/off", dir);
    assert_int_equal(mkdir(sub, 0700), 0);
    write_file(sub, "rude", "R\n");
    lm_text t;
    assert_true(lm_text_load(dir, &t, why, sizeof why));
    assert_int_equal(t.n, 8);
    assert_memory_equal(t.tokens, "A\n%\nZ\n%\n", 8);
    lm_text_free(&t);
    char file[600];
    snprintf(file, sizeof file, "%s/zippy", dir);
    assert_true(lm_text_load(file, &t, why, sizeof why));
    assert_int_equal(t.n, 4);
    lm_text_free(&t);
    snprintf(file, sizeof file, "%s/missing", dir);
    assert_false(lm_text_load(file, &t, why, sizeof why));
    assert_non_null(strstr(why, file));
    assert_null(t.tokens);
    /* clean up */
    const char *names[] = {"zippy", "art", "art.dat", "art.u8", "off/rude"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        snprintf(file, sizeof file, "%s/%s", dir, names[i]);
        unlink(file);
    }
    rmdir(sub);
    write_file(dir, "only.dat", "x");
    assert_false(lm_text_load(dir, &t, why, sizeof why));
    assert_non_null(strstr(why, "no text files"));
    snprintf(file, sizeof file, "%s/only.dat", dir);
    unlink(file);
    rmdir(dir);
}

/* ---- the model -------------------------------------------------------------------------------- */

static lm_config tiny(lm_family f) {
    lm_config c = lm_config_default(f);
    c.n_layer = 2;
    c.n_embd = 32;
    c.n_head = 4;
    c.n_kv_head = f == LM_GPT2 ? 4 : 2;
    c.ffn_hidden = 0;
    c.context = 16;
    char why[256];
    assert_true(lm_config_check(&c, why, sizeof why));
    return c;
}

static void test_config_check(void **state) {
    (void)state;
    char why[256];
    lm_config c = lm_config_default(LM_LLAMA);
    assert_true(lm_config_check(&c, why, sizeof why));
    assert_int_equal(c.ffn_hidden, 1024); /* 8/3 * 384 rounded up to 64 */
    c.n_embd = 768;
    c.ffn_hidden = 0;
    assert_true(lm_config_check(&c, why, sizeof why));
    assert_int_equal(c.ffn_hidden, 2048);
    c = lm_config_default(LM_GPT2);
    assert_true(lm_config_check(&c, why, sizeof why));
    assert_int_equal(c.ffn_hidden, 4 * 384);
    c.n_kv_head = 2;
    assert_false(lm_config_check(&c, why, sizeof why));
    assert_non_null(strstr(why, "gpt2"));
    c = lm_config_default(LM_LLAMA);
    c.n_kv_head = 4;
    assert_false(lm_config_check(&c, why, sizeof why));
    assert_non_null(strstr(why, "6 heads cannot share 4"));
    c = lm_config_default(LM_LLAMA);
    c.n_embd = 100;
    assert_false(lm_config_check(&c, why, sizeof why));
    assert_non_null(strstr(why, "width 100"));
    c = lm_config_default(LM_LLAMA);
    c.n_embd = 18;
    c.n_head = 6;
    c.n_kv_head = 6;
    assert_false(lm_config_check(&c, why, sizeof why));
    assert_non_null(strstr(why, "even head width"));
}

static void check_params(lm_family f) {
    lm_config c = tiny(f);
    ct_generator *g = ct_generator_new(tu_next());
    lm_model *m = lm_model_new(&c, CT_CPU, g);
    assert_non_null(m);
    bool gpt2 = f == LM_GPT2;
    int64_t per_block = gpt2 ? 12 : 6, qkv = (c.n_head + 2 * c.n_kv_head) * (c.n_embd / c.n_head);
    assert_int_equal(ct_params_count(m->params), 1 + gpt2 + 2 * per_block + 1 + gpt2);
    ct_tensor *w = ct_params_find(m->params, "h.1.attn.wqkv.weight");
    assert_non_null(w);
    assert_int_equal(ct_tensor_size(w, 0), qkv);
    assert_int_equal(ct_tensor_size(w, 1), c.n_embd);
    w = ct_params_find(m->params, "h.0.mlp.w_in.weight");
    assert_int_equal(ct_tensor_size(w, 0), gpt2 ? c.ffn_hidden : 2 * c.ffn_hidden);
    assert_int_equal(ct_tensor_size(ct_params_find(m->params, "h.0.mlp.w_out.weight"), 1),
                     c.ffn_hidden);
    assert_true((ct_params_find(m->params, "wpe.weight") != NULL) == gpt2);
    assert_true((ct_params_find(m->params, "normf.bias") != NULL) == gpt2);
    /* the initialisation: gains 1, residual projections with the smaller std */
    double *gain = tu_values(ct_params_find(m->params, "h.1.norm2.weight"));
    for (int i = 0; i < c.n_embd; i++) assert_true(gain[i] == 1.0);
    free(gain);
    ct_tensor *wo = ct_params_find(m->params, "h.0.attn.wo.weight");
    double *v = tu_values(wo), ss = 0;
    int64_t n = ct_tensor_numel(wo);
    for (int64_t i = 0; i < n; i++) ss += v[i] * v[i];
    free(v);
    double std = sqrt(ss / (double)n), want = 0.02 / sqrt(2.0 * (double)c.n_layer);
    assert_true(fabs(std - want) < 0.15 * want);
    lm_model_free(m);
    ct_generator_free(g);
}

static void test_params(void **state) {
    (void)state;
    check_params(LM_LLAMA);
    check_params(LM_GPT2);
}

/* Shapes, the initial loss (near log 256: the logits start small),
 * causality (a token changes no earlier position's hidden state) and a
 * gradient of every parameter's shape. */
static void check_forward(lm_family f) {
    enum { B = 3, T = 12 };
    lm_config c = tiny(f);
    ct_generator *g = ct_generator_new(tu_next());
    lm_model *m = lm_model_new(&c, CT_CPU, g);
    ct_scope *s = ct_scope_begin();
    ct_tensor *x = ct_tensor_randint(g, 0, 256, CT_SHAPE(B, T), CT_I64, CT_CPU);
    ct_tensor *y = ct_tensor_randint(g, 0, 256, CT_SHAPE(B, T), CT_I64, CT_CPU);
    ct_tensor *h = lm_model_hidden(m, x);
    assert_non_null(h);
    assert_int_equal(ct_tensor_ndim(h), 3);
    assert_int_equal(ct_tensor_size(h, 2), c.n_embd);
    ct_tensor *logits = lm_model_last_logits(m, x);
    assert_int_equal(ct_tensor_size(logits, 0), B);
    assert_int_equal(ct_tensor_size(logits, 1), c.vocab);

    /* change the token at position 7: positions 0..6 keep their states */
    int64_t *xv = ct_tensor_data_ptr(x);
    double *before = tu_values(h);
    for (int b = 0; b < B; b++) xv[b * T + 7] = (xv[b * T + 7] + 1) % 256;
    double *after = tu_values(lm_model_hidden(m, x));
    bool later_changed = false;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int e = 0; e < c.n_embd; e++) {
                int64_t i = ((int64_t)b * T + t) * c.n_embd + e;
                if (t < 7) assert_true(before[i] == after[i]);
                else later_changed |= before[i] != after[i];
            }
    assert_true(later_changed);
    free(before);
    free(after);

    ct_tensor *loss = lm_model_loss(m, x, y);
    double l = 0;
    assert_int_equal(ct_tensor_ndim(loss), 0);
    assert_int_equal(ct_tensor_item(loss, &l), CT_OK);
    assert_true(fabs(l - log(256.0)) < 0.1);
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    for (int64_t k = 0; k < ct_params_count(m->params); k++) {
        const char *name;
        ct_tensor *p = ct_params_get(m->params, k, &name);
        ct_tensor *gr = ct_grad(p);
        if (!gr) fail_msg("no gradient for %s", name);
        assert_int_equal(ct_tensor_numel(gr), ct_tensor_numel(p));
    }
    ct_scope_end(s);
    lm_model_free(m);
    ct_generator_free(g);
}

static void test_forward(void **state) {
    (void)state;
    check_forward(LM_LLAMA);
    check_forward(LM_GPT2);
}

/* Under bfloat16 autocast on the CPU, llama's forward and backward run rope in bfloat16 on
 * the float32 tables as they are (no cast of a table: two per rope call before), and the
 * loss is the float32 loss within bfloat16's precision. */
static void test_autocast_tables(void **state) {
    (void)state;
    enum { B = 2, T = 12 };
    lm_config c = tiny(LM_LLAMA);
    ct_generator *g = ct_generator_new(tu_next());
    lm_model *m = lm_model_new(&c, CT_CPU, g);
    assert_non_null(m);
    ct_scope *s = ct_scope_begin();
    ct_tensor *x = ct_tensor_randint(g, 0, 256, CT_SHAPE(B, T), CT_I64, CT_CPU);
    ct_tensor *y = ct_tensor_randint(g, 0, 256, CT_SHAPE(B, T), CT_I64, CT_CPU);
    double l32 = 0, l16 = 0;
    assert_int_equal(ct_tensor_item(lm_model_loss(m, x, y), &l32), CT_OK);
    tu_trace t = tu_trace_begin();
    assert_int_equal(ct_autocast_begin(CT_CPU, CT_BF16), CT_OK);
    ct_tensor *loss = lm_model_loss(m, x, y);
    assert_int_equal(ct_autocast_end(), CT_OK);
    assert_non_null(loss);
    assert_int_equal(ct_backward(loss, NULL, false), CT_OK);
    char *log = tu_trace_end(&t);
    /* the tables' rows for T positions, [T, 1, head_dim / 2] */
    char table[32];
    snprintf(table, sizeof table, "[%d, 1, %d]", T, (int)(c.n_embd / c.n_head / 2));
    assert_int_equal(tu_trace_lines(log, "] copy ", table), 0);
    assert_int_equal(tu_trace_lines(log, "] rope ", "bfloat16"), 2 * (int)c.n_layer);
    assert_int_equal(tu_trace_lines(log, "] rope_backward ", "bfloat16"), 2 * (int)c.n_layer);
    free(log);
    assert_int_equal(ct_tensor_item(loss, &l16), CT_OK);
    assert_true(fabs(l16 - l32) < 0.05 * fabs(l32));
    ct_scope_end(s);
    lm_model_free(m);
    ct_generator_free(g);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_split, setup, teardown),
        cmocka_unit_test_setup_teardown(test_windows, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_check, setup, teardown),
        cmocka_unit_test_setup_teardown(test_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_autocast_tables, setup, teardown),
    };
    return tu_run_tests(tests);
}
