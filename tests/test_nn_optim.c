/* Layers, parameter lists, optimizers, schedules and gradient clipping:
 * initial distributions, SGD/AdamW updates against float64 loops of
 * PyTorch's formulas (through the optimizers and the fused update ops they
 * run on), optimizer state, bad arguments, and end-to-end
 * training of a small MLP (accuracy and constant memory over many steps). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"

#include "ops/optim_impl.h"
#include "test_fixture.h"

/* ---- fixtures: every test must leave no tensor or storage alive ----------------------------- */

/* ---- helpers -------------------------------------------------------------------------------- */

static ct_generator *fresh_gen(void) {
    ct_generator *g = ct_generator_new(tu_next());
    assert_non_null(g);
    return g;
}

static double mean_of(const double *v, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += v[i];
    return s / (double)n;
}

static double var_of(const double *v, int64_t n) {
    double m = mean_of(v, n), s = 0;
    for (int64_t i = 0; i < n; i++) s += (v[i] - m) * (v[i] - m);
    return s / (double)n;
}

static void assert_shape(const ct_tensor *t, int nd, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_ndim(t), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(t)[d], shape[d]);
}

static void assert_param(const ct_tensor *t, ct_dtype dt) {
    assert_non_null(t);
    assert_true(ct_requires_grad(t));
    assert_true(ct_is_leaf(t));
    assert_null(ct_grad(t));
    assert_int_equal(ct_tensor_dtype(t), dt);
}

/* Checks a U(-b, b) sample: inside the bounds, reaching near both ends
 * (within reach * b), mean 0 and variance b^2/3 within six standard errors. */
static void assert_uniform_(const ct_tensor *t, double b, double reach) {
    int64_t n = ct_tensor_numel(t);
    double *v = tu_values(t);
    double lo = INFINITY, hi = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        lo = fmin(lo, v[i]);
        hi = fmax(hi, v[i]);
        assert_true(fabs(v[i]) <= b * (1 + 1e-6));
    }
    if (n >= 1000) {
        assert_true(hi > reach * b && lo < -reach * b);
        double se_mean = b / sqrt(3.0) / sqrt((double)n);
        double se_var = sqrt(4.0 / 45.0) * b * b / sqrt((double)n);
        assert_true(fabs(mean_of(v, n)) < 6 * se_mean);
        assert_true(fabs(var_of(v, n) - b * b / 3) < 6 * se_var);
    }
    free(v);
}

static void assert_uniform(const ct_tensor *t, double b) { assert_uniform_(t, b, 0.99); }

static void assert_all_equal(const ct_tensor *t, double value) {
    int64_t n = ct_tensor_numel(t);
    double *v = tu_values(t);
    for (int64_t i = 0; i < n; i++) assert_true(v[i] == value);
    free(v);
}

static void assert_tensor_close(const ct_tensor *got, const ct_tensor *ref, double rtol,
                                double atol) {
    assert_non_null(got);
    assert_non_null(ref);
    assert_int_equal(ct_tensor_numel(got), ct_tensor_numel(ref));
    double *g = tu_values(got), *r = tu_values(ref);
    tu_assert_close(g, r, ct_tensor_numel(ref), rtol, atol);
    free(g);
    free(r);
}

/* ---- parameter lists ------------------------------------------------------------------------ */

static void test_params_list(void **state) {
    (void)state;
    ct_params *p = ct_params_new();
    assert_non_null(p);
    assert_int_equal(ct_params_count(p), 0);
    ct_tensor *a = tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, NULL);
    ct_tensor *b = tu_rand(CT_SHAPE(4), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_params_add(p, "a", a), CT_OK);
    assert_int_equal(ct_params_add(p, "layer.b", b), CT_OK);
    /* The list holds its own references. */
    ct_tensor_release(a);
    ct_tensor_release(b);
    assert_int_equal(ct_params_count(p), 2);
    const char *name = NULL;
    ct_tensor *t = ct_params_get(p, 1, &name);
    assert_string_equal(name, "layer.b");
    assert_shape(t, CT_SHAPE(4));
    t = ct_params_get(p, 0, NULL);
    assert_shape(t, CT_SHAPE(2, 3));
    assert_ptr_equal(ct_params_find(p, "a"), t);
    assert_ptr_equal(ct_params_find(p, "layer.b"), ct_params_get(p, 1, NULL));

    tu_assert_error(ct_params_add(p, "a", ct_params_get(p, 1, NULL)), CT_ERR_INVALID_ARG,
                    "ct_params_add", "'a'", "already");
    tu_assert_error(ct_params_add(p, "c", t), CT_ERR_INVALID_ARG, "ct_params_add", "'a'",
                    "'c'", "already");
    tu_assert_error(ct_params_add(p, "", t), CT_ERR_INVALID_ARG, "ct_params_add", "name");
    tu_assert_error(ct_params_add(p, NULL, t), CT_ERR_INVALID_ARG, "ct_params_add", "name");
    tu_assert_error(ct_params_add(p, "d", NULL), CT_ERR_INVALID_ARG, "ct_params_add", "'d'",
                    "NULL");
    tu_assert_error(ct_params_add(NULL, "d", t), CT_ERR_INVALID_ARG, "ct_params_add", "NULL");
    assert_int_equal(ct_params_count(p), 2);
    tu_assert_null_error(ct_params_get(p, 2, NULL), CT_ERR_INDEX, "ct_params_get", "2");
    tu_assert_null_error(ct_params_get(p, -1, NULL), CT_ERR_INDEX, "ct_params_get", "-1");
    tu_assert_null_error(ct_params_get(NULL, 0, NULL), CT_ERR_INVALID_ARG, "ct_params_get");
    tu_assert_null_error(ct_params_find(p, "zz"), CT_ERR_INDEX, "ct_params_find", "'zz'");
    tu_assert_null_error(ct_params_find(p, NULL), CT_ERR_INVALID_ARG, "ct_params_find");
    assert_int_equal(ct_params_count(NULL), 0);

    /* Many entries: the list grows. */
    ct_params *q = ct_params_new();
    for (int i = 0; i < 40; i++) {
        char nm[16];
        snprintf(nm, sizeof nm, "p%d", i);
        ct_tensor *x = ct_tensor_scalar(i, CT_F32, CT_CPU);
        assert_int_equal(ct_params_add(q, nm, x), CT_OK);
        ct_tensor_release(x);
    }
    assert_int_equal(ct_params_count(q), 40);
    double v;
    assert_int_equal(ct_tensor_item(ct_params_find(q, "p37"), &v), CT_OK);
    assert_true(v == 37);
    ct_params_free(q);
    ct_params_free(p);
    ct_params_free(NULL);
}

/* ---- layers --------------------------------------------------------------------------------- */

static void test_linear_init_and_forward(void **state) {
    (void)state;
    ct_generator *g = fresh_gen();
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        int64_t in = 100 + (int64_t)tu_randint(0, 50), out = 256;
        ct_nn_linear *m = ct_nn_linear_new(in, out, true, dt, CT_CPU, g);
        assert_non_null(m);
        assert_int_equal(m->in_features, in);
        assert_int_equal(m->out_features, out);
        assert_shape(m->weight, CT_SHAPE(out, in));
        assert_shape(m->bias, CT_SHAPE(out));
        assert_param(m->weight, dt);
        assert_param(m->bias, dt);
        double b = 1.0 / sqrt((double)in);
        /* Reduced precision rounds values near the bound by half an ulp, and
         * its generator draws 8 (bf16) or 11 (f16) random bits. */
        double slack = dt == CT_BF16 ? 1.004 : dt == CT_F16 ? 1.0005 : 1.0;
        double reach = dt == CT_BF16 ? 0.98 : 0.99;
        assert_uniform_(m->weight, b * slack, reach);
        assert_uniform_(m->bias, b * slack, reach);
        ct_nn_linear_free(m);
    }

    /* Forward: x @ W^T + b, computed here in float64, with leading batch dims. */
    ct_nn_linear *m = ct_nn_linear_new(5, 3, true, CT_F64, CT_CPU, g);
    double *xv;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 4, 5), CT_F64, -2, 2, &xv);
    ct_tensor *y = ct_nn_linear_forward(m, x);
    assert_shape(y, CT_SHAPE(2, 4, 3));
    double *w = tu_values(m->weight), *bias = tu_values(m->bias), ref[24];
    for (int r = 0; r < 8; r++)
        for (int o = 0; o < 3; o++) {
            double s = bias[o];
            for (int k = 0; k < 5; k++) s += xv[r * 5 + k] * w[o * 5 + k];
            ref[r * 3 + o] = s;
        }
    double *yv = tu_values(y);
    tu_assert_close(yv, ref, 24, 1e-12, 1e-12);
    free(yv);
    free(w);
    free(bias);
    free(xv);
    ct_tensor_release(y);
    ct_tensor_release(x);
    ct_nn_linear_free(m);

    /* No bias. */
    m = ct_nn_linear_new(3, 2, false, CT_F32, CT_CPU, g);
    assert_non_null(m);
    assert_null(m->bias);
    ct_params *p = ct_params_new();
    assert_int_equal(ct_nn_linear_params(m, "head", p), CT_OK);
    assert_int_equal(ct_params_count(p), 1);
    assert_ptr_equal(ct_params_find(p, "head.weight"), m->weight);
    ct_params_free(p);
    ct_nn_linear_free(m);
    ct_nn_linear_free(NULL);
    ct_generator_free(g);
}

static void test_init_reproducible(void **state) {
    (void)state;
    uint64_t seed = tu_next();
    ct_generator *g1 = ct_generator_new(seed), *g2 = ct_generator_new(seed);
    ct_nn_linear *a = ct_nn_linear_new(7, 9, true, CT_F32, CT_CPU, g1);
    ct_nn_linear *b = ct_nn_linear_new(7, 9, true, CT_F32, CT_CPU, g2);
    assert_tensor_close(a->weight, b->weight, 0, 0);
    assert_tensor_close(a->bias, b->bias, 0, 0);
    /* The next layer draws further along the stream: different values. */
    ct_nn_linear *c = ct_nn_linear_new(7, 9, true, CT_F32, CT_CPU, g1);
    double *va = tu_values(a->weight), *vc = tu_values(c->weight);
    int same = 0;
    for (int i = 0; i < 63; i++) same += va[i] == vc[i];
    assert_true(same < 5);
    free(va);
    free(vc);
    ct_nn_linear_free(a);
    ct_nn_linear_free(b);
    ct_nn_linear_free(c);
    ct_generator_free(g1);
    ct_generator_free(g2);
}

static void test_conv2d_layer(void **state) {
    (void)state;
    ct_generator *g = fresh_gen();
    int64_t k[2] = {3, 5}, st[2] = {2, 1}, pad[2] = {1, 2}, dil[2] = {1, 2};
    ct_nn_conv2d *m = ct_nn_conv2d_new(8, 64, k, st, pad, dil, 2, true, CT_F32, CT_CPU, g);
    assert_non_null(m);
    assert_shape(m->weight, CT_SHAPE(64, 4, 3, 5));
    assert_shape(m->bias, CT_SHAPE(64));
    assert_param(m->weight, CT_F32);
    assert_param(m->bias, CT_F32);
    assert_int_equal(m->groups, 2);
    assert_int_equal(m->stride[0], 2);
    assert_int_equal(m->padding[1], 2);
    assert_int_equal(m->dilation[1], 2);
    double b = 1.0 / sqrt(4.0 * 3 * 5); /* fan_in = in/groups * kh * kw */
    assert_uniform(m->weight, b);
    assert_uniform(m->bias, b);

    ct_tensor *x = tu_rand(CT_SHAPE(2, 8, 9, 11), CT_F32, -1, 1, NULL);
    ct_tensor *y = ct_nn_conv2d_forward(m, x);
    ct_tensor *ref = ct_conv2d(x, m->weight, m->bias, st, pad, dil, 2);
    assert_shape(y, 4, ct_tensor_shape(ref));
    assert_tensor_close(y, ref, 0, 0);
    ct_tensor_release(y);
    ct_tensor_release(ref);
    ct_tensor_release(x);

    ct_params *p = ct_params_new();
    assert_int_equal(ct_nn_conv2d_params(m, "features.0", p), CT_OK);
    assert_int_equal(ct_params_count(p), 2);
    const char *name;
    assert_ptr_equal(ct_params_get(p, 0, &name), m->weight);
    assert_string_equal(name, "features.0.weight");
    assert_ptr_equal(ct_params_get(p, 1, &name), m->bias);
    assert_string_equal(name, "features.0.bias");
    ct_nn_conv2d_free(m);
    /* The list keeps the parameters alive after the layer is gone. */
    assert_shape(ct_params_find(p, "features.0.weight"), CT_SHAPE(64, 4, 3, 5));
    ct_params_free(p);

    /* Defaults: stride 1, padding 0, dilation 1; no bias. */
    m = ct_nn_conv2d_new(3, 4, (int64_t[]){2, 2}, NULL, NULL, NULL, 1, false, CT_F64, CT_CPU, g);
    assert_non_null(m);
    assert_null(m->bias);
    assert_true(m->stride[0] == 1 && m->stride[1] == 1 && m->padding[0] == 0 &&
                m->dilation[1] == 1);
    assert_uniform(m->weight, 1.0 / sqrt(12.0));
    x = tu_rand(CT_SHAPE(1, 3, 5, 5), CT_F64, -1, 1, NULL);
    y = ct_nn_conv2d_forward(m, x);
    assert_shape(y, CT_SHAPE(1, 4, 4, 4));
    ct_tensor_release(y);
    ct_tensor_release(x);
    ct_nn_conv2d_free(m);
    ct_generator_free(g);
}

static void test_embedding_layer(void **state) {
    (void)state;
    ct_generator *g = fresh_gen();
    ct_nn_embedding *m = ct_nn_embedding_new(200, 64, CT_F32, CT_CPU, g);
    assert_non_null(m);
    assert_shape(m->weight, CT_SHAPE(200, 64));
    assert_param(m->weight, CT_F32);
    double *w = tu_values(m->weight);
    int64_t n = 200 * 64;
    assert_true(fabs(mean_of(w, n)) < 6.0 / sqrt((double)n));
    assert_true(fabs(var_of(w, n) - 1.0) < 6.0 * sqrt(2.0 / (double)n));
    double mx = 0;
    for (int64_t i = 0; i < n; i++) mx = fmax(mx, fabs(w[i]));
    assert_true(mx > 2.5 && mx < 7); /* normal tails, not a bounded law */

    int64_t idx[6] = {3, 199, 0, 3, 42, 7};
    ct_tensor *ix = ct_tensor_from_data(idx, CT_I64, CT_SHAPE(2, 3));
    ct_tensor *y = ct_nn_embedding_forward(m, ix);
    assert_shape(y, CT_SHAPE(2, 3, 64));
    double *yv = tu_values(y);
    for (int r = 0; r < 6; r++) tu_assert_close(yv + r * 64, w + idx[r] * 64, 64, 0, 0);
    free(yv);
    free(w);
    ct_tensor_release(y);
    ct_tensor_release(ix);

    ct_params *p = ct_params_new();
    assert_int_equal(ct_nn_embedding_params(m, NULL, p), CT_OK);
    assert_ptr_equal(ct_params_find(p, "weight"), m->weight);
    assert_int_equal(ct_params_count(p), 1);
    ct_params_free(p);
    ct_nn_embedding_free(m);
    ct_generator_free(g);
}

static void test_norm_layers(void **state) {
    (void)state;
    int64_t ns[2] = {3, 4};
    ct_nn_rms_norm *r = ct_nn_rms_norm_new(2, ns, 1e-6, true, CT_F64, CT_CPU);
    assert_non_null(r);
    assert_shape(r->weight, CT_SHAPE(3, 4));
    assert_param(r->weight, CT_F64);
    assert_all_equal(r->weight, 1.0);
    ct_nn_layer_norm *l = ct_nn_layer_norm_new(1, ns + 1, 1e-5, true, true, CT_F32, CT_CPU);
    assert_non_null(l);
    assert_shape(l->weight, CT_SHAPE(4));
    assert_shape(l->bias, CT_SHAPE(4));
    assert_param(l->weight, CT_F32);
    assert_param(l->bias, CT_F32);
    assert_all_equal(l->weight, 1.0);
    assert_all_equal(l->bias, 0.0);

    /* Forward against float64 loops of the definitions. */
    double *xv;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3, 4), CT_F64, -2, 2, &xv);
    ct_tensor *y = ct_nn_rms_norm_forward(r, x);
    assert_shape(y, CT_SHAPE(2, 3, 4));
    double ref[24];
    for (int b = 0; b < 2; b++) {
        double ss = 0;
        for (int i = 0; i < 12; i++) ss += xv[b * 12 + i] * xv[b * 12 + i];
        double inv = 1.0 / sqrt(ss / 12 + 1e-6);
        for (int i = 0; i < 12; i++) ref[b * 12 + i] = xv[b * 12 + i] * inv;
    }
    double *yv = tu_values(y);
    tu_assert_close(yv, ref, 24, 1e-12, 1e-12);
    free(yv);
    ct_tensor_release(y);
    ct_tensor *x32 = ct_to_dtype(x, CT_F32);
    y = ct_nn_layer_norm_forward(l, x32);
    for (int row = 0; row < 6; row++) {
        double m = 0, v = 0;
        for (int i = 0; i < 4; i++) m += xv[row * 4 + i] / 4;
        for (int i = 0; i < 4; i++) v += (xv[row * 4 + i] - m) * (xv[row * 4 + i] - m) / 4;
        for (int i = 0; i < 4; i++) ref[row * 4 + i] = (xv[row * 4 + i] - m) / sqrt(v + 1e-5);
    }
    yv = tu_values(y);
    tu_assert_close(yv, ref, 24, 1e-4, 1e-5);
    free(yv);
    free(xv);
    ct_tensor_release(y);
    ct_tensor_release(x32);
    ct_tensor_release(x);

    ct_params *p = ct_params_new();
    assert_int_equal(ct_nn_rms_norm_params(r, "norm1", p), CT_OK);
    assert_int_equal(ct_nn_layer_norm_params(l, "ln", p), CT_OK);
    assert_int_equal(ct_params_count(p), 3);
    const char *name;
    ct_params_get(p, 0, &name);
    assert_string_equal(name, "norm1.weight");
    ct_params_get(p, 2, &name);
    assert_string_equal(name, "ln.bias");
    /* Adding the same layer again fails and leaves the list as it was. */
    tu_assert_error(ct_nn_layer_norm_params(l, "ln", p), CT_ERR_INVALID_ARG, "ln.weight",
                    "already");
    assert_int_equal(ct_params_count(p), 3);
    ct_params_free(p);
    ct_nn_rms_norm_free(r);
    ct_nn_layer_norm_free(l);

    /* Without affine parameters; layer norm with weight only. */
    r = ct_nn_rms_norm_new(1, ns, 1e-6, false, CT_F32, CT_CPU);
    assert_non_null(r);
    assert_null(r->weight);
    l = ct_nn_layer_norm_new(1, ns, 1e-5, true, false, CT_BF16, CT_CPU);
    assert_non_null(l);
    assert_param(l->weight, CT_BF16);
    assert_null(l->bias);
    p = ct_params_new();
    assert_int_equal(ct_nn_rms_norm_params(r, "r", p), CT_OK);
    assert_int_equal(ct_nn_layer_norm_params(l, "l", p), CT_OK);
    assert_int_equal(ct_params_count(p), 1);
    ct_params_free(p);
    ct_nn_rms_norm_free(r);
    ct_nn_layer_norm_free(l);
}

static void test_layer_bad_args(void **state) {
    (void)state;
    ct_generator *g = fresh_gen();
    tu_assert_null_error(ct_nn_linear_new(0, 3, true, CT_F32, CT_CPU, g), CT_ERR_INVALID_ARG,
                         "ct_nn_linear_new", "in_features", "positive", "0");
    tu_assert_null_error(ct_nn_linear_new(3, -2, true, CT_F32, CT_CPU, g), CT_ERR_INVALID_ARG,
                         "ct_nn_linear_new", "out_features", "-2");
    tu_assert_null_error(ct_nn_linear_new(3, 2, true, CT_I64, CT_CPU, g), CT_ERR_DTYPE,
                         "ct_nn_linear_new", "floating", "int64");
    tu_assert_null_error(ct_nn_linear_forward(NULL, NULL), CT_ERR_INVALID_ARG,
                         "ct_nn_linear_forward", "NULL");
    tu_assert_error(ct_nn_linear_params(NULL, "x", NULL), CT_ERR_INVALID_ARG,
                    "ct_nn_linear_params", "NULL");

    int64_t k[2] = {3, 3};
    tu_assert_null_error(ct_nn_conv2d_new(6, 4, k, NULL, NULL, NULL, 4, true, CT_F32, CT_CPU, g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "groups", "4", "6");
    tu_assert_null_error(ct_nn_conv2d_new(6, 4, k, NULL, NULL, NULL, 0, true, CT_F32, CT_CPU, g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "groups");
    tu_assert_null_error(ct_nn_conv2d_new(6, 4, NULL, NULL, NULL, NULL, 1, true, CT_F32, CT_CPU,
                                          g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "kernel", "NULL");
    tu_assert_null_error(ct_nn_conv2d_new(6, 4, (int64_t[]){3, 0}, NULL, NULL, NULL, 1, true,
                                          CT_F32, CT_CPU, g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "kernel [3, 0]");
    tu_assert_null_error(ct_nn_conv2d_new(6, 4, k, (int64_t[]){1, 0}, NULL, NULL, 1, true,
                                          CT_F32, CT_CPU, g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "stride [1, 0]");
    tu_assert_null_error(ct_nn_conv2d_new(6, 4, k, NULL, (int64_t[]){-1, 0}, NULL, 1, true,
                                          CT_F32, CT_CPU, g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "padding [-1, 0]");
    tu_assert_null_error(ct_nn_conv2d_new(6, 4, k, NULL, NULL, (int64_t[]){0, 1}, 1, true,
                                          CT_F32, CT_CPU, g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "dilation [0, 1]");
    tu_assert_null_error(ct_nn_conv2d_new(0, 4, k, NULL, NULL, NULL, 1, true, CT_F32, CT_CPU, g),
                         CT_ERR_INVALID_ARG, "ct_nn_conv2d_new", "in_channels");
    tu_assert_null_error(ct_nn_conv2d_new(2, 4, k, NULL, NULL, NULL, 1, true, CT_BOOL, CT_CPU,
                                          g),
                         CT_ERR_DTYPE, "ct_nn_conv2d_new", "bool");

    tu_assert_null_error(ct_nn_embedding_new(0, 4, CT_F32, CT_CPU, g), CT_ERR_INVALID_ARG,
                         "ct_nn_embedding_new", "num_embeddings");
    tu_assert_null_error(ct_nn_embedding_new(4, 2, CT_I32, CT_CPU, g), CT_ERR_DTYPE,
                         "ct_nn_embedding_new", "int32");
    ct_nn_embedding *e = ct_nn_embedding_new(4, 2, CT_F32, CT_CPU, g);
    ct_tensor *bad = ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CPU);
    assert_null(ct_nn_embedding_forward(e, bad)); /* float indices: the op's error */
    assert_true(strstr(ct_last_error(), "ct_embedding") != NULL);
    ct_tensor_release(bad);
    ct_nn_embedding_free(e);

    int64_t ns[2] = {4, 0};
    tu_assert_null_error(ct_nn_rms_norm_new(0, ns, 1e-6, true, CT_F32, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_nn_rms_norm_new", "normalized_shape");
    tu_assert_null_error(ct_nn_rms_norm_new(2, ns, 1e-6, true, CT_F32, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_nn_rms_norm_new", "[4, 0]", "positive");
    tu_assert_null_error(ct_nn_rms_norm_new(1, NULL, 1e-6, true, CT_F32, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_nn_rms_norm_new", "NULL");
    tu_assert_null_error(ct_nn_layer_norm_new(1, ns, -1e-5, true, true, CT_F32, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_nn_layer_norm_new", "eps", "-1e-05");
    tu_assert_null_error(ct_nn_layer_norm_new(1, ns, NAN, true, true, CT_F32, CT_CPU),
                         CT_ERR_INVALID_ARG, "ct_nn_layer_norm_new", "eps");
    tu_assert_null_error(ct_nn_layer_norm_new(1, ns, 1e-5, true, true, CT_I64, CT_CPU),
                         CT_ERR_DTYPE, "ct_nn_layer_norm_new", "int64");

    /* A norm layer given a mismatched input reports the op's error. */
    ct_nn_layer_norm *l = ct_nn_layer_norm_new(1, ns, 1e-5, true, true, CT_F32, CT_CPU);
    ct_tensor *x = ct_tensor_zeros(CT_SHAPE(2, 5), CT_F32, CT_CPU);
    assert_null(ct_nn_layer_norm_forward(l, x));
    assert_true(strstr(ct_last_error(), "ct_layer_norm") != NULL);
    ct_tensor_release(x);
    ct_nn_layer_norm_free(l);
    ct_generator_free(g);
}

/* ---- optimizers against float64 loops of PyTorch's formulas --------------------------------- */

#define NP 2
static const int64_t opt_numel[NP] = {12, 5};

/* Two leaves requiring grad ([3,4] and [5]) with fresh values; their
 * values into ref[k] (caller frees). */
static ct_params *make_leaves(ct_dtype dt, double *ref[NP]) {
    ct_params *p = ct_params_new();
    ct_tensor *a = tu_rand(CT_SHAPE(3, 4), dt, -1, 1, &ref[0]);
    ct_tensor *b = tu_rand(CT_SHAPE(5), dt, -1, 1, &ref[1]);
    assert_int_equal(ct_requires_grad_(a, true), CT_OK);
    assert_int_equal(ct_requires_grad_(b, true), CT_OK);
    assert_int_equal(ct_params_add(p, "w", a), CT_OK);
    assert_int_equal(ct_params_add(p, "b", b), CT_OK);
    ct_tensor_release(a);
    ct_tensor_release(b);
    return p;
}

/* Gives parameter k a fresh random gradient, its values into g. */
static void set_fresh_grad(ct_params *p, int k, ct_dtype dt, double *g) {
    ct_tensor *t = ct_params_get(p, k, NULL);
    double *v;
    ct_tensor *gt = tu_rand(ct_tensor_ndim(t), ct_tensor_shape(t), dt, -1, 1, &v);
    assert_int_equal(ct_set_grad(t, gt), CT_OK);
    memcpy(g, v, (size_t)opt_numel[k] * sizeof *g);
    free(v);
    ct_tensor_release(gt);
}

static void assert_param_values(ct_params *p, double *ref[NP], double rtol, double atol) {
    for (int k = 0; k < NP; k++) {
        double *v = tu_values(ct_params_get(p, k, NULL));
        tu_assert_close(v, ref[k], opt_numel[k], rtol, atol);
        free(v);
    }
}

/* no_decay1: parameter 1 gets weight decay 0 (ct_optim_set_weight_decay),
 * parameter 0 keeps wd. */
typedef struct sgd_cfg {
    double lr, momentum, dampening, wd;
    bool nesterov, no_decay1;
} sgd_cfg;

/* The weight decay parameter k of a case's optimizer applies. */
static double case_wd(double wd, bool no_decay1, int k) { return no_decay1 && k == 1 ? 0 : wd; }

static void run_sgd_case(sgd_cfg c, ct_dtype dt, double rtol, double atol) {
    double *ref[NP], buf[NP][12], grad[NP][12];
    int steps_taken[NP] = {0, 0};
    ct_params *p = make_leaves(dt, ref);
    ct_optimizer *o = ct_optim_sgd_new(p, c.lr, c.momentum, c.dampening, c.wd, c.nesterov);
    assert_non_null(o);
    if (c.no_decay1) assert_int_equal(ct_optim_set_weight_decay(o, 1, 0.0), CT_OK);
    for (int step = 0; step < 6; step++) {
        for (int k = 0; k < NP; k++) {
            /* Parameter 1 gets no gradient on step 2: skipped, momentum
             * not advanced. */
            if (k == 1 && step == 2) {
                ct_zero_grad(ct_params_get(p, k, NULL));
                continue;
            }
            set_fresh_grad(p, k, dt, grad[k]);
            for (int64_t i = 0; i < opt_numel[k]; i++) {
                double d = grad[k][i] + case_wd(c.wd, c.no_decay1, k) * ref[k][i];
                if (c.momentum != 0) {
                    buf[k][i] = steps_taken[k] == 0
                                    ? d
                                    : c.momentum * buf[k][i] + (1 - c.dampening) * d;
                    d = c.nesterov ? d + c.momentum * buf[k][i] : buf[k][i];
                }
                ref[k][i] -= c.lr * d;
            }
            steps_taken[k]++;
        }
        assert_int_equal(ct_optim_step(o), CT_OK);
        assert_true(ct_is_grad_enabled()); /* restored after the no-grad update */
        assert_param_values(p, ref, rtol, atol);
    }
    /* State: step counts and momentum buffers. */
    int per = c.momentum != 0 ? 2 : 1;
    assert_int_equal(ct_optim_state_count(o), NP * per);
    for (int k = 0; k < NP; k++) {
        const char *name;
        char want[32];
        ct_tensor *st = ct_optim_state_get(o, k * per, &name);
        snprintf(want, sizeof want, "%d.step", k);
        assert_string_equal(name, want);
        double v;
        assert_int_equal(ct_tensor_item(st, &v), CT_OK);
        assert_true(v == steps_taken[k]);
        if (per == 2) {
            ct_tensor *mb = ct_optim_state_get(o, k * per + 1, &name);
            snprintf(want, sizeof want, "%d.momentum_buffer", k);
            assert_string_equal(name, want);
            assert_int_equal(ct_tensor_dtype(mb), dt);
            double *mv = tu_values(mb);
            tu_assert_close(mv, buf[k], opt_numel[k], rtol, atol);
            free(mv);
        }
    }
    ct_optim_free(o);
    ct_params_free(p);
    for (int k = 0; k < NP; k++) free(ref[k]);
}

static void test_sgd_updates(void **state) {
    (void)state;
    const sgd_cfg cases[] = {
        {0.1, 0, 0, 0, false, false},      {0.05, 0.9, 0, 0, false, false},
        {0.05, 0.9, 0.1, 0.01, false, false}, {0.02, 0.8, 0, 0.05, true, false},
        {0.1, 0.5, 0.5, 0, false, false},  {0.3, 0, 0, 0.2, false, false},
        {0.05, 0.9, 0, 0.2, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_sgd_case(cases[i], CT_F64, 1e-12, 1e-13);
    run_sgd_case(cases[3], CT_F32, 1e-5, 1e-6);
    run_sgd_case(cases[2], CT_F32, 1e-5, 1e-6);
    run_sgd_case(cases[6], CT_F32, 1e-5, 1e-6);
}

typedef struct adamw_cfg {
    double lr, beta1, beta2, eps, wd;
    bool no_decay1; /* as sgd_cfg's */
} adamw_cfg;

static void run_adamw_case(adamw_cfg c, ct_dtype dt, double rtol, double atol) {
    double *ref[NP], m[NP][12] = {{0}}, v[NP][12] = {{0}}, grad[NP][12];
    int t[NP] = {0, 0};
    ct_params *p = make_leaves(dt, ref);
    ct_optimizer *o = ct_optim_adamw_new(p, c.lr, c.beta1, c.beta2, c.eps, c.wd);
    assert_non_null(o);
    if (c.no_decay1) assert_int_equal(ct_optim_set_weight_decay(o, 1, 0.0), CT_OK);
    for (int k = 0; k < NP; k++)
        assert_true(ct_optim_get_weight_decay(o, k) == case_wd(c.wd, c.no_decay1, k));
    for (int step = 0; step < 7; step++) {
        for (int k = 0; k < NP; k++) {
            if (k == 0 && step == 3) {
                ct_zero_grad(ct_params_get(p, k, NULL));
                continue;
            }
            set_fresh_grad(p, k, dt, grad[k]);
            t[k]++;
            double bc1 = 1 - pow(c.beta1, t[k]), bc2 = 1 - pow(c.beta2, t[k]);
            for (int64_t i = 0; i < opt_numel[k]; i++) {
                double g = grad[k][i];
                ref[k][i] *= 1 - c.lr * case_wd(c.wd, c.no_decay1, k);
                m[k][i] = c.beta1 * m[k][i] + (1 - c.beta1) * g;
                v[k][i] = c.beta2 * v[k][i] + (1 - c.beta2) * g * g;
                double denom = sqrt(v[k][i]) / sqrt(bc2) + c.eps;
                ref[k][i] -= c.lr / bc1 * m[k][i] / denom;
            }
        }
        assert_int_equal(ct_optim_step(o), CT_OK);
        assert_param_values(p, ref, rtol, atol);
    }
    assert_int_equal(ct_optim_state_count(o), NP * 3);
    static const char *what[3] = {"step", "exp_avg", "exp_avg_sq"};
    for (int k = 0; k < NP; k++) {
        for (int j = 0; j < 3; j++) {
            const char *name;
            char want[32];
            ct_tensor *st = ct_optim_state_get(o, k * 3 + j, &name);
            snprintf(want, sizeof want, "%d.%s", k, what[j]);
            assert_string_equal(name, want);
            double *sv = tu_values(st);
            if (j == 0) {
                assert_int_equal(ct_tensor_ndim(st), 0);
                assert_int_equal(ct_tensor_dtype(st), CT_F64);
                assert_true(sv[0] == t[k]);
            } else {
                assert_int_equal(ct_tensor_dtype(st), dt);
                assert_int_equal(ct_tensor_numel(st), opt_numel[k]);
                tu_assert_close(sv, j == 1 ? m[k] : v[k], opt_numel[k], rtol, atol);
            }
            free(sv);
        }
    }
    ct_optim_free(o);
    ct_params_free(p);
    for (int k = 0; k < NP; k++) free(ref[k]);
}

static void test_adamw_updates(void **state) {
    (void)state;
    const adamw_cfg cases[] = {
        {1e-3, 0.9, 0.999, 1e-8, 1e-2, false},
        {0.01, 0.8, 0.99, 1e-6, 0, false},
        {0.05, 0.5, 0.9, 1e-3, 0.1, false},
        {0.1, 0, 0, 1e-8, 0.5, false},
        {0.05, 0.9, 0.99, 1e-8, 0.3, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_adamw_case(cases[i], CT_F64, 1e-11, 1e-13);
    run_adamw_case(cases[0], CT_F32, 1e-5, 1e-6);
    run_adamw_case(cases[2], CT_F32, 1e-5, 1e-6);
    run_adamw_case(cases[4], CT_F32, 1e-5, 1e-6);
}

/* ---- the fused update ops (CT_OP_SGD_STEP, CT_OP_ADAMW_STEP) against float64 loops -------- */

#define FL 6 /* parameters per list */

/* One list of FL parameters: [7, 9], [200, 200] (split over threads), [0, 3], a
 * non-contiguous [4, 5] with a non-contiguous first state, [6] with a
 * non-contiguous gradient, and [3] that never gets a gradient. dts[k] is
 * parameter k's dtype. */
typedef struct flist {
    ct_tensor *param[FL], *grad[FL], *state[2][FL];
    int64_t step[FL];
    bool updated[FL];
    int nstate;
} flist;

static const int64_t fl_shape[FL][2] = {{7, 9}, {200, 200}, {0, 3}, {4, 5}, {6, 1}, {3, 1}};
static const int fl_ndim[FL] = {2, 2, 2, 2, 1, 1};

static ct_tensor *fl_rand(int k, ct_dtype dt, double lo, double hi, bool noncontig) {
    ct_tensor *t = tu_rand(fl_ndim[k], fl_shape[k], dt, lo, hi, NULL);
    if (!noncontig) return t;
    ct_tensor *v = tu_noncontig(t);
    ct_tensor_release(t);
    assert_false(ct_tensor_is_contiguous(v));
    return v;
}

static void flist_init(flist *l, const ct_dtype *dts, int nstate, bool adamw) {
    memset(l, 0, sizeof *l);
    l->nstate = nstate;
    for (int k = 0; k < FL; k++) {
        l->param[k] = fl_rand(k, dts[k], -1, 1, k == 3);
        /* SGD's buffers are NaN: the first step must not read them. AdamW's
         * second moments must be >= 0. */
        for (int b = 0; b < nstate; b++)
            l->state[b][k] = adamw ? fl_rand(k, dts[k], b ? 0 : -0.5, 0.5, k == 3 && b == 0)
                                   : ct_tensor_full(fl_ndim[k], fl_shape[k], NAN, dts[k], CT_CPU);
    }
}

static void flist_free(flist *l) {
    for (int k = 0; k < FL; k++) {
        ct_tensor_release(l->param[k]);
        ct_tensor_release(l->grad[k]);
        for (int b = 0; b < 2; b++) ct_tensor_release(l->state[b][k]);
    }
}

static unsigned version_of(const ct_tensor *t) { return atomic_load(&t->storage->version); }

/* One update of parameter k in float64 from the values the tensors hold. */
static void ref_sgd(const cti_sgd_hparams *h, int64_t step, int64_t n, double *p,
                    const double *g, double *buf) {
    for (int64_t i = 0; i < n; i++) {
        double d = g[i] + h->weight_decay * p[i];
        if (h->momentum != 0) {
            buf[i] = step == 1 ? d : h->momentum * buf[i] + (1 - h->dampening) * d;
            d = h->nesterov ? d + h->momentum * buf[i] : buf[i];
        }
        p[i] -= h->lr * d;
    }
}

static void ref_adamw(const cti_adamw_hparams *h, int64_t step, int64_t n, double *p,
                      const double *g, double *m, double *v) {
    double bc1 = 1 - pow(h->beta1, (double)step), bc2 = 1 - pow(h->beta2, (double)step);
    for (int64_t i = 0; i < n; i++) {
        p[i] *= 1 - h->lr * h->weight_decay;
        m[i] = h->beta1 * m[i] + (1 - h->beta1) * g[i];
        v[i] = h->beta2 * v[i] + (1 - h->beta2) * g[i] * g[i];
        p[i] -= h->lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + h->eps);
    }
}

static double fl_atol(ct_dtype dt) {
    return dt == CT_F64 ? 1e-14 : dt == CT_F32 ? 1e-6 : 1e-5;
}

/* Three steps of the op over a list on the CPU: every parameter and state
 * against the float64 loops fed with the values the tensors held before the
 * step, the skipped parameter untouched, one version bump per write. */
static void run_fused(const ct_dtype *dts, const cti_sgd_hparams *sh,
                      const cti_adamw_hparams *ah) {
    bool adamw = ah != NULL;
    int nstate = adamw ? 2 : sh->momentum != 0 ? 1 : 0;
    flist l;
    flist_init(&l, dts, nstate, adamw);
    cti_optim_list list = {.n = FL, .param = l.param, .grad = l.grad,
                           .state = {l.state[0], l.state[1]}, .step = l.step,
                           .updated = l.updated};
    if (nstate < 2) list.state[1] = NULL;
    if (nstate < 1) list.state[0] = NULL;
    for (int step = 1; step <= 3; step++) {
        double *p[FL], *g[FL], *s[2][FL];
        unsigned ver[FL][3];
        for (int k = 0; k < FL; k++) {
            ct_tensor_release(l.grad[k]);
            l.grad[k] = k == FL - 1 ? NULL : fl_rand(k, dts[k], -1, 1, k == 4);
            /* Parameter 0 skips step 2: its count stays behind. */
            if (k == 0 && step == 2) {
                ct_tensor_release(l.grad[k]);
                l.grad[k] = NULL;
            }
            if (l.grad[k]) l.step[k]++;
            else if (l.step[k] == 0) l.step[k] = 1; /* a skipped entry's count is not read */
            p[k] = tu_values(l.param[k]);
            g[k] = l.grad[k] ? tu_values(l.grad[k]) : NULL;
            ver[k][0] = version_of(l.param[k]);
            for (int b = 0; b < nstate; b++) {
                s[b][k] = tu_values(l.state[b][k]);
                ver[k][1 + b] = version_of(l.state[b][k]);
            }
        }
        bool prev = ct_no_grad_begin();
        ct_status st = adamw ? cti_adamw_step("test", &list, ah) : cti_sgd_step("test", &list, sh);
        ct_no_grad_end(prev);
        assert_int_equal(st, CT_OK);
        for (int k = 0; k < FL; k++) {
            ct_dtype dt = dts[k];
            int64_t n = ct_tensor_numel(l.param[k]);
            bool live = l.grad[k] != NULL;
            assert_true(l.updated[k] == live);
            double *ref[3] = {p[k], s[0][k], s[1][k]};
            if (live && adamw) ref_adamw(ah, l.step[k], n, p[k], g[k], s[0][k], s[1][k]);
            else if (live) ref_sgd(sh, l.step[k], n, p[k], g[k], nstate ? s[0][k] : NULL);
            for (int j = 0; j <= nstate; j++) {
                ct_tensor *t = j == 0 ? l.param[k] : l.state[j - 1][k];
                double *got = tu_values(t);
                /* Untouched tensors keep their exact values (NaN included). */
                if (live) tu_assert_close(got, ref[j], n, tu_rtol(dt), fl_atol(dt));
                else
                    for (int64_t i = 0; i < n; i++)
                        assert_true(got[i] == ref[j][i] || (isnan(got[i]) && isnan(ref[j][i])));
                assert_int_equal(version_of(t), ver[k][j] + (live ? 1 : 0));
                free(got);
            }
            free(p[k]);
            free(g[k]);
            for (int b = 0; b < nstate; b++) free(s[b][k]);
        }
    }
    flist_free(&l);
}

static void test_fused_sgd_op(void **state) {
    (void)state;
    const cti_sgd_hparams hs[] = {
        {0.05, 0.9, 0.1, 0.01, false},
        {0.02, 0.8, 0, 0.05, true},
        {0.3, 0, 0, 0.2, false},
        {0.1, 0.5, 0.5, 0, false},
    };
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dts[FL];
        for (int k = 0; k < FL; k++) dts[k] = tu_float_dtypes[di];
        for (size_t h = 0; h < sizeof hs / sizeof hs[0]; h++) run_fused(dts, &hs[h], NULL);
    }
    /* One list of several dtypes: one dispatch per dtype. */
    const ct_dtype mixed[FL] = {CT_F32, CT_BF16, CT_F64, CT_F32, CT_F16, CT_F64};
    run_fused(mixed, &hs[0], NULL);
    run_fused(mixed, &hs[1], NULL);
}

static void test_fused_adamw_op(void **state) {
    (void)state;
    const cti_adamw_hparams hs[] = {
        {1e-3, 0.9, 0.999, 1e-8, 1e-2},
        {0.05, 0.5, 0.9, 1e-3, 0.1},
        {0.1, 0, 0, 1e-8, 0},
    };
    for (size_t di = 0; di < 4; di++) {
        ct_dtype dts[FL];
        for (int k = 0; k < FL; k++) dts[k] = tu_float_dtypes[di];
        for (size_t h = 0; h < sizeof hs / sizeof hs[0]; h++) run_fused(dts, NULL, &hs[h]);
    }
    const ct_dtype mixed[FL] = {CT_BF16, CT_F32, CT_F16, CT_F64, CT_F32, CT_F16};
    run_fused(mixed, NULL, &hs[0]);
}

/* Bad lists: a status and a message naming the parameter, nothing written. */
static void test_fused_op_bad_args(void **state) {
    (void)state;
    const cti_sgd_hparams sh = {0.1, 0.9, 0, 0, false};
    const cti_adamw_hparams ah = {1e-3, 0.9, 0.999, 1e-8, 0};
    ct_tensor *p[2], *g[2], *b[2], *v[2];
    int64_t steps[2] = {1, 1};
    for (int k = 0; k < 2; k++) {
        p[k] = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
        g[k] = tu_rand(CT_SHAPE(3, 4), CT_F32, -1, 1, NULL);
        b[k] = ct_tensor_zeros(CT_SHAPE(3, 4), CT_F32, CT_CPU);
        v[k] = ct_tensor_zeros(CT_SHAPE(3, 4), CT_F32, CT_CPU);
    }
    double *before = tu_values(p[0]);
    unsigned ver = version_of(p[0]);
    cti_optim_list l = {.n = 2, .param = p, .grad = g, .state = {b, NULL}, .step = steps};
    cti_optim_list la = {.n = 2, .param = p, .grad = g, .state = {b, v}, .step = steps};
    bool prev = ct_no_grad_begin();

    tu_assert_error(cti_sgd_step("op_x", NULL, &sh), CT_ERR_INVALID_ARG, "op_x", "NULL");
    tu_assert_error(cti_sgd_step("op_x", &l, NULL), CT_ERR_INVALID_ARG, "op_x", "NULL");
    cti_optim_list nostate = {.n = 2, .param = p, .grad = g, .step = steps};
    tu_assert_error(cti_sgd_step("op_x", &nostate, &sh), CT_ERR_INVALID_ARG, "op_x",
                    "malformed");
    /* A gradient of another shape, then another dtype. */
    ct_tensor *bad = tu_rand(CT_SHAPE(4, 3), CT_F32, -1, 1, NULL);
    ct_tensor *g1 = g[1], *v1 = v[1];
    g[1] = bad;
    tu_assert_error(cti_sgd_step("op_x", &l, &sh), CT_ERR_SHAPE, "op_x", "parameter 1",
                    "gradient", "[4, 3]", "[3, 4]");
    ct_tensor *bad64 = tu_rand(CT_SHAPE(3, 4), CT_F64, -1, 1, NULL);
    g[1] = bad64;
    tu_assert_error(cti_adamw_step("op_x", &la, &ah), CT_ERR_SHAPE, "op_x", "parameter 1",
                    "float64", "float32");
    g[1] = g1;
    /* A state of another shape, two states on one storage, an expanded
     * parameter. */
    v[1] = bad;
    tu_assert_error(cti_adamw_step("op_x", &la, &ah), CT_ERR_SHAPE, "op_x", "parameter 1",
                    "exp_avg_sq", "[4, 3]");
    v[1] = v[0];
    tu_assert_error(cti_adamw_step("op_x", &la, &ah), CT_ERR_INVALID_ARG, "op_x",
                    "share memory");
    v[1] = v1;
    ct_tensor *row = tu_rand(CT_SHAPE(1, 4), CT_F32, -1, 1, NULL);
    ct_tensor *ex = ct_expand(row, CT_SHAPE(3, 4));
    ct_tensor *p1 = p[1];
    p[1] = ex;
    tu_assert_error(cti_sgd_step("op_x", &l, &sh), CT_ERR_INVALID_ARG, "op_x", "parameter 1",
                    "expanded");
    /* Two parameters on one storage; an integer parameter; a step of 0. */
    p[1] = p[0];
    tu_assert_error(cti_sgd_step("op_x", &l, &sh), CT_ERR_INVALID_ARG, "op_x", "share memory");
    ct_tensor *ip = ct_tensor_zeros(CT_SHAPE(3, 4), CT_I64, CT_CPU);
    p[1] = ip;
    tu_assert_error(cti_sgd_step("op_x", &l, &sh), CT_ERR_DTYPE, "op_x", "parameter 1",
                    "int64", "floating");
    p[1] = p1;
    steps[1] = 0;
    tu_assert_error(cti_sgd_step("op_x", &l, &sh), CT_ERR_INVALID_ARG, "op_x", "parameter 1",
                    "step 0");
    steps[1] = 1;
    ct_no_grad_end(prev);
    /* In grad mode a parameter that requires grad is refused, as in-place ops. */
    assert_int_equal(ct_requires_grad_(p[1], true), CT_OK);
    tu_assert_error(cti_sgd_step("op_x", &l, &sh), CT_ERR_AUTOGRAD, "op_x", "leaf",
                    "no_grad");
    double *after = tu_values(p[0]);
    tu_assert_close(after, before, 12, 0, 0);
    assert_int_equal(version_of(p[0]), ver);
    /* In no-grad mode the same call runs. */
    prev = ct_no_grad_begin();
    assert_int_equal(cti_sgd_step("op_x", &l, &sh), CT_OK);
    ct_no_grad_end(prev);
    assert_int_equal(version_of(p[0]), ver + 1);
    free(before);
    free(after);
    ct_tensor_release(bad);
    ct_tensor_release(bad64);
    ct_tensor_release(row);
    ct_tensor_release(ex);
    ct_tensor_release(ip);
    for (int k = 0; k < 2; k++) {
        ct_tensor_release(p[k]);
        ct_tensor_release(g[k]);
        ct_tensor_release(b[k]);
        ct_tensor_release(v[k]);
    }
}

/* The optimizers in float16 and bfloat16: parameters and states keep the
 * dtype and follow float64 loops of the same updates within a few roundings. */
static void test_optim_low_precision(void **state) {
    (void)state;
    for (int di = 2; di < 4; di++) {
        ct_dtype dt = tu_float_dtypes[di];
        run_sgd_case((sgd_cfg){0.05, 0.9, 0.1, 0.01, false, false}, dt, 4 * tu_rtol(dt), 1e-2);
        run_adamw_case((adamw_cfg){0.01, 0.8, 0.99, 1e-6, 0.01, false}, dt, 4 * tu_rtol(dt), 2e-2);
    }
}

/* Copying one optimizer's state into a fresh one makes both continue
 * identically: what a checkpoint restore does. */
static void test_state_restore(void **state) {
    (void)state;
    for (int kind = 0; kind < 2; kind++) {
        double *ref[NP];
        ct_params *pa = make_leaves(CT_F32, ref);
        ct_params *pb = ct_params_new();
        for (int k = 0; k < NP; k++) {
            const char *name;
            bool prev = ct_no_grad_begin(); /* a fresh leaf, not a recorded clone */
            ct_tensor *c = ct_clone(ct_params_get(pa, k, &name));
            ct_no_grad_end(prev);
            assert_int_equal(ct_requires_grad_(c, true), CT_OK);
            assert_int_equal(ct_params_add(pb, name, c), CT_OK);
            ct_tensor_release(c);
            free(ref[k]);
        }
        ct_optimizer *a = kind ? ct_optim_adamw_new(pa, 0.01, 0.9, 0.99, 1e-8, 0.01)
                               : ct_optim_sgd_new(pa, 0.05, 0.9, 0.1, 0.01, false);
        ct_optimizer *b = kind ? ct_optim_adamw_new(pb, 0.01, 0.9, 0.99, 1e-8, 0.01)
                               : ct_optim_sgd_new(pb, 0.05, 0.9, 0.1, 0.01, false);
        assert_non_null(a);
        assert_non_null(b);
        double g[12];
        for (int step = 0; step < 3; step++) {
            for (int k = 0; k < NP; k++) set_fresh_grad(pa, k, CT_F32, g);
            assert_int_equal(ct_optim_step(a), CT_OK);
        }
        /* b's parameters and state become a's. */
        bool prev = ct_no_grad_begin();
        for (int k = 0; k < NP; k++)
            assert_int_equal(ct_copy_(ct_params_get(pb, k, NULL), ct_params_get(pa, k, NULL)),
                             CT_OK);
        ct_no_grad_end(prev);
        assert_int_equal(ct_optim_state_count(a), ct_optim_state_count(b));
        for (int64_t s = 0; s < ct_optim_state_count(a); s++) {
            const char *na, *nb;
            ct_tensor *sa = ct_optim_state_get(a, s, &na), *sb = ct_optim_state_get(b, s, &nb);
            assert_string_equal(na, nb);
            assert_int_equal(ct_copy_(sb, sa), CT_OK);
        }
        for (int step = 0; step < 2; step++) {
            for (int k = 0; k < NP; k++) {
                ct_tensor *ta = ct_params_get(pa, k, NULL), *tb = ct_params_get(pb, k, NULL);
                ct_tensor *gr = tu_rand(ct_tensor_ndim(ta), ct_tensor_shape(ta), CT_F32, -1, 1,
                                        NULL);
                assert_int_equal(ct_set_grad(ta, gr), CT_OK);
                assert_int_equal(ct_set_grad(tb, gr), CT_OK);
                ct_tensor_release(gr);
            }
            assert_int_equal(ct_optim_step(a), CT_OK);
            assert_int_equal(ct_optim_step(b), CT_OK);
        }
        for (int k = 0; k < NP; k++)
            assert_tensor_close(ct_params_get(pb, k, NULL), ct_params_get(pa, k, NULL), 0, 0);
        ct_optim_free(a);
        ct_optim_free(b);
        ct_params_free(pa);
        ct_params_free(pb);
    }
}

static void test_optim_misc(void **state) {
    (void)state;
    double *ref[NP], g[12];
    ct_params *p = make_leaves(CT_F64, ref);
    ct_optimizer *o = ct_optim_sgd_new(p, 0.1, 0, 0, 0, false);
    /* The optimizer holds its own references: the list may go. */
    ct_tensor *w = ct_tensor_retain(ct_params_get(p, 0, NULL));
    ct_params_free(p);
    assert_true(ct_optim_get_lr(o) == 0.1);
    assert_int_equal(ct_optim_set_lr(o, 0.25), CT_OK);
    assert_true(ct_optim_get_lr(o) == 0.25);
    tu_assert_error(ct_optim_set_lr(o, -1), CT_ERR_INVALID_ARG, "ct_optim_set_lr", "-1");
    tu_assert_error(ct_optim_set_lr(o, NAN), CT_ERR_INVALID_ARG, "ct_optim_set_lr");
    tu_assert_error(ct_optim_set_lr(NULL, 1), CT_ERR_INVALID_ARG, "ct_optim_set_lr", "NULL");
    assert_true(ct_optim_get_lr(o) == 0.25);
    assert_true(isnan(ct_optim_get_lr(NULL)));

    /* The new lr is used; zero_grad drops the gradients so the next step
     * leaves the parameter alone. */
    ct_tensor *gt = tu_rand(CT_SHAPE(3, 4), CT_F64, -1, 1, NULL);
    assert_int_equal(ct_set_grad(w, gt), CT_OK);
    double *gv = tu_values(gt);
    memcpy(g, gv, sizeof g);
    free(gv);
    ct_tensor_release(gt);
    assert_int_equal(ct_optim_step(o), CT_OK);
    for (int i = 0; i < 12; i++) ref[0][i] -= 0.25 * g[i];
    double *v = tu_values(w);
    tu_assert_close(v, ref[0], 12, 1e-15, 1e-15);
    free(v);
    ct_optim_zero_grad(o);
    assert_null(ct_grad(w));
    assert_int_equal(ct_optim_step(o), CT_OK);
    v = tu_values(w);
    tu_assert_close(v, ref[0], 12, 0, 0);
    free(v);

    /* The step runs in grad mode's absence and restores no-grad too. */
    bool prev = ct_no_grad_begin();
    assert_int_equal(ct_optim_step(o), CT_OK);
    assert_false(ct_is_grad_enabled());
    ct_no_grad_end(prev);

    tu_assert_null_error(ct_optim_state_get(o, 2, NULL), CT_ERR_INDEX, "ct_optim_state_get",
                         "2");
    /* Per-parameter weight decay: index and value checked, nothing changed
     * on failure. */
    assert_true(ct_optim_get_weight_decay(o, 0) == 0);
    tu_assert_error(ct_optim_set_weight_decay(o, 2, 0.1), CT_ERR_INDEX,
                    "ct_optim_set_weight_decay", "index 2", "2 parameters");
    tu_assert_error(ct_optim_set_weight_decay(o, -1, 0.1), CT_ERR_INDEX,
                    "ct_optim_set_weight_decay", "-1");
    tu_assert_error(ct_optim_set_weight_decay(o, 0, -0.5), CT_ERR_INVALID_ARG,
                    "ct_optim_set_weight_decay", "-0.5", "expected >= 0");
    tu_assert_error(ct_optim_set_weight_decay(o, 0, INFINITY), CT_ERR_INVALID_ARG,
                    "ct_optim_set_weight_decay");
    tu_assert_error(ct_optim_set_weight_decay(NULL, 0, 0.1), CT_ERR_INVALID_ARG,
                    "ct_optim_set_weight_decay", "NULL");
    assert_true(ct_optim_get_weight_decay(o, 0) == 0);
    assert_true(isnan(ct_optim_get_weight_decay(o, 2)));
    tu_assert_error(ct_last_status(), CT_ERR_INDEX, "ct_optim_get_weight_decay", "index 2");
    assert_true(isnan(ct_optim_get_weight_decay(NULL, 0)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_optim_get_weight_decay", "NULL");
    tu_assert_null_error(ct_optim_state_get(NULL, 0, NULL), CT_ERR_INVALID_ARG,
                         "ct_optim_state_get");
    tu_assert_error(ct_optim_step(NULL), CT_ERR_INVALID_ARG, "ct_optim_step", "NULL");
    assert_int_equal(ct_optim_state_count(NULL), 0);
    ct_optim_zero_grad(NULL);
    ct_optim_free(NULL);
    ct_optim_free(o);
    ct_tensor_release(w);
    for (int k = 0; k < NP; k++) free(ref[k]);
}

static void test_optim_bad_args(void **state) {
    (void)state;
    double *ref[NP];
    ct_params *p = make_leaves(CT_F32, ref);
    for (int k = 0; k < NP; k++) free(ref[k]);
    tu_assert_null_error(ct_optim_sgd_new(p, -0.1, 0, 0, 0, false), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "learning rate", "-0.1");
    tu_assert_null_error(ct_optim_sgd_new(p, NAN, 0, 0, 0, false), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "learning rate");
    tu_assert_null_error(ct_optim_sgd_new(p, 0.1, -0.5, 0, 0, false), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "momentum", "-0.5");
    tu_assert_null_error(ct_optim_sgd_new(p, 0.1, 0.9, 0, -1e-4, false), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "weight_decay", "-0.0001");
    tu_assert_null_error(ct_optim_sgd_new(p, 0.1, 0, 0, 0, true), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "nesterov", "momentum");
    tu_assert_null_error(ct_optim_sgd_new(p, 0.1, 0.9, 0.1, 0, true), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "nesterov", "dampening");
    tu_assert_null_error(ct_optim_sgd_new(p, 0.1, 0.9, INFINITY, 0, false), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "dampening");
    tu_assert_null_error(ct_optim_sgd_new(NULL, 0.1, 0, 0, 0, false), CT_ERR_INVALID_ARG,
                         "ct_optim_sgd_new", "NULL");
    tu_assert_null_error(ct_optim_adamw_new(p, -1, 0.9, 0.999, 1e-8, 0), CT_ERR_INVALID_ARG,
                         "ct_optim_adamw_new", "learning rate");
    tu_assert_null_error(ct_optim_adamw_new(p, 1e-3, 1.0, 0.999, 1e-8, 0), CT_ERR_INVALID_ARG,
                         "ct_optim_adamw_new", "betas", "(1, 0.999)");
    tu_assert_null_error(ct_optim_adamw_new(p, 1e-3, 0.9, -0.1, 1e-8, 0), CT_ERR_INVALID_ARG,
                         "ct_optim_adamw_new", "betas", "-0.1");
    tu_assert_null_error(ct_optim_adamw_new(p, 1e-3, 0.9, 0.999, -1e-8, 0), CT_ERR_INVALID_ARG,
                         "ct_optim_adamw_new", "epsilon");
    tu_assert_null_error(ct_optim_adamw_new(p, 1e-3, 0.9, 0.999, 1e-8, -0.01),
                         CT_ERR_INVALID_ARG, "ct_optim_adamw_new", "weight_decay");
    ct_params_free(p);

    p = ct_params_new();
    tu_assert_null_error(ct_optim_adamw_new(p, 1e-3, 0.9, 0.999, 1e-8, 0), CT_ERR_INVALID_ARG,
                         "ct_optim_adamw_new", "empty");
    /* An integer parameter, then a non-leaf. */
    ct_tensor *i = ct_tensor_zeros(CT_SHAPE(2), CT_I64, CT_CPU);
    assert_int_equal(ct_params_add(p, "idx", i), CT_OK);
    tu_assert_null_error(ct_optim_sgd_new(p, 0.1, 0, 0, 0, false), CT_ERR_DTYPE,
                         "ct_optim_sgd_new", "'idx'", "int64", "floating");
    ct_params_free(p);
    p = ct_params_new();
    ct_tensor *leaf = tu_rand(CT_SHAPE(2), CT_F32, -1, 1, NULL);
    ct_requires_grad_(leaf, true);
    ct_tensor *y = ct_mul_scalar(leaf, 2.0);
    assert_non_null(ct_grad_fn_name(y));
    assert_int_equal(ct_params_add(p, "y", y), CT_OK);
    tu_assert_null_error(ct_optim_adamw_new(p, 1e-3, 0.9, 0.999, 1e-8, 0), CT_ERR_AUTOGRAD,
                         "ct_optim_adamw_new", "non-leaf", "'y'");
    ct_params_free(p);
    ct_tensor_release(y);
    ct_tensor_release(leaf);
    ct_tensor_release(i);

    /* A restored step count that is no count: refused, nothing updated. */
    double g[12];
    p = make_leaves(CT_F32, ref);
    ct_optimizer *o = ct_optim_adamw_new(p, 1e-3, 0.9, 0.999, 1e-8, 0);
    for (int k = 0; k < NP; k++) set_fresh_grad(p, k, CT_F32, g);
    assert_int_equal(ct_fill_(ct_optim_state_get(o, 3, NULL), -2), CT_OK); /* "1.step" */
    tu_assert_error(ct_optim_step(o), CT_ERR_INVALID_ARG, "ct_optim_step", "parameter 1",
                    "-2");
    assert_int_equal(ct_fill_(ct_optim_state_get(o, 3, NULL), NAN), CT_OK);
    tu_assert_error(ct_optim_step(o), CT_ERR_INVALID_ARG, "ct_optim_step", "parameter 1",
                    "nan");
    assert_param_values(p, ref, 0, 0);
    double t;
    assert_int_equal(ct_tensor_item(ct_optim_state_get(o, 0, NULL), &t), CT_OK);
    assert_true(t == 0);
    ct_optim_free(o);
    ct_params_free(p);
    for (int k = 0; k < NP; k++) free(ref[k]);
}

/* On a GPU the same updates run through the device's kernels: parameters,
 * gradients and state (the step counts included) stay there and the values
 * follow the CPU run. Skipped without a usable CUDA device. */
static void test_optim_on_cuda(void **state) {
    (void)state;
    if (!ct_cuda_available()) skip();
    ct_device dev = CT_CUDA(0);
    ct_generator *g = fresh_gen();
    ct_nn_linear *l = ct_nn_linear_new(50, 40, true, CT_F32, dev, g);
    assert_non_null(l);
    assert_true(ct_device_eq(ct_tensor_device(l->weight), dev));
    assert_param(l->weight, CT_F32);
    assert_uniform(l->weight, 1.0 / sqrt(50.0));
    ct_nn_linear_free(l);
    ct_generator_free(g);

    for (int kind = 0; kind < 2; kind++) {
        double *ref[NP];
        ct_params *pc = make_leaves(CT_F32, ref), *pg = ct_params_new();
        for (int k = 0; k < NP; k++) {
            const char *name;
            bool prev = ct_no_grad_begin();
            ct_tensor *d = ct_to_device(ct_params_get(pc, k, &name), dev);
            ct_no_grad_end(prev);
            assert_non_null(d);
            assert_int_equal(ct_requires_grad_(d, true), CT_OK);
            assert_int_equal(ct_params_add(pg, name, d), CT_OK);
            ct_tensor_release(d);
            free(ref[k]);
        }
        ct_optimizer *oc = kind ? ct_optim_adamw_new(pc, 0.01, 0.9, 0.99, 1e-8, 0.05)
                                : ct_optim_sgd_new(pc, 0.05, 0.9, 0, 0.01, true);
        ct_optimizer *og = kind ? ct_optim_adamw_new(pg, 0.01, 0.9, 0.99, 1e-8, 0.05)
                                : ct_optim_sgd_new(pg, 0.05, 0.9, 0, 0.01, true);
        assert_non_null(oc);
        assert_non_null(og);
        for (int step = 0; step < 4; step++) {
            for (int k = 0; k < NP; k++) {
                ct_tensor *tc = ct_params_get(pc, k, NULL), *tg = ct_params_get(pg, k, NULL);
                ct_tensor *gc = tu_rand(ct_tensor_ndim(tc), ct_tensor_shape(tc), CT_F32, -1, 1,
                                        NULL);
                ct_tensor *gg = ct_to_device(gc, dev);
                assert_int_equal(ct_set_grad(tc, gc), CT_OK);
                assert_int_equal(ct_set_grad(tg, gg), CT_OK);
                ct_tensor_release(gc);
                ct_tensor_release(gg);
            }
            double nc, ng;
            assert_int_equal(ct_clip_grad_norm(pc, 1.5, &nc), CT_OK);
            assert_int_equal(ct_clip_grad_norm(pg, 1.5, &ng), CT_OK);
            assert_true(fabs(nc - ng) <= 1e-5 * nc);
            assert_int_equal(ct_optim_step(oc), CT_OK);
            assert_int_equal(ct_optim_step(og), CT_OK);
        }
        for (int k = 0; k < NP; k++)
            assert_tensor_close(ct_params_get(pg, k, NULL), ct_params_get(pc, k, NULL), 1e-5,
                                1e-6);
        for (int64_t s = 0; s < ct_optim_state_count(og); s++) {
            const char *name;
            ct_tensor *st = ct_optim_state_get(og, s, &name);
            /* The step counts too: on the device, read and advanced by the kernels. */
            (void)name;
            assert_true(ct_device_eq(ct_tensor_device(st), dev));
            assert_tensor_close(st, ct_optim_state_get(oc, s, NULL), 1e-5, 1e-6);
        }
        ct_optim_free(oc);
        ct_optim_free(og);
        ct_params_free(pc);
        ct_params_free(pg);
    }
}

/* ---- schedules ------------------------------------------------------------------------------ */

static void test_schedules(void **state) {
    (void)state;
    assert_true(fabs(ct_lr_step(0.1, 30, 0.1, 0) - 0.1) < 1e-15);
    assert_true(fabs(ct_lr_step(0.1, 30, 0.1, 29) - 0.1) < 1e-15);
    assert_true(fabs(ct_lr_step(0.1, 30, 0.1, 30) - 0.01) < 1e-15);
    assert_true(fabs(ct_lr_step(0.1, 30, 0.1, 95) - 1e-4) < 1e-15);
    assert_true(fabs(ct_lr_step(2.0, 1, 0.5, 3) - 0.25) < 1e-15);
    assert_true(isnan(ct_lr_step(0.1, 0, 0.1, 5)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_step", "step_size 0");
    assert_true(isnan(ct_lr_step(0.1, 3, 0.1, -1)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_step", "step -1");

    const double base = 1e-3, mn = 1e-5;
    assert_true(ct_lr_cosine_warmup(base, 100, 1000, mn, 0) == 0);
    assert_true(fabs(ct_lr_cosine_warmup(base, 100, 1000, mn, 1) - 1e-5) < 1e-18);
    assert_true(fabs(ct_lr_cosine_warmup(base, 100, 1000, mn, 50) - 5e-4) < 1e-18);
    assert_true(fabs(ct_lr_cosine_warmup(base, 100, 1000, mn, 100) - base) < 1e-18);
    /* Halfway through the decay: the mean of base and min. */
    assert_true(fabs(ct_lr_cosine_warmup(base, 100, 1000, mn, 550) - 5.05e-4) < 1e-15);
    /* A quarter through: min + (base - min) * (1 + cos(pi/4)) / 2. */
    assert_true(fabs(ct_lr_cosine_warmup(base, 100, 1000, mn, 325) -
                     (mn + (base - mn) * (1 + sqrt(0.5)) / 2)) < 1e-15);
    assert_true(ct_lr_cosine_warmup(base, 100, 1000, mn, 1000) == mn);
    assert_true(ct_lr_cosine_warmup(base, 100, 1000, mn, 5000) == mn);
    /* Monotone decay after the warmup. */
    double prev = INFINITY;
    for (int s = 100; s <= 1000; s += 7) {
        double lr = ct_lr_cosine_warmup(base, 100, 1000, mn, s);
        assert_true(lr <= prev && lr >= mn);
        prev = lr;
    }
    /* No warmup: full lr at step 0. */
    assert_true(ct_lr_cosine_warmup(0.5, 0, 10, 0, 0) == 0.5);
    assert_true(fabs(ct_lr_cosine_warmup(0.5, 0, 10, 0, 5) - 0.25) < 1e-15);
    assert_true(isnan(ct_lr_cosine_warmup(base, 200, 100, mn, 5)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_cosine_warmup",
                    "warmup_steps 200", "total_steps 100");
    assert_true(isnan(ct_lr_cosine_warmup(base, 0, 0, mn, 5)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_cosine_warmup",
                    "total_steps 0");
    assert_true(isnan(ct_lr_cosine_warmup(base, 1, 10, mn, -3)));
    tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "ct_lr_cosine_warmup", "step -3");
}

/* ---- gradient clipping ---------------------------------------------------------------------- */

static void test_clip_grad_norm(void **state) {
    (void)state;
    for (size_t di = 0; di < 2; di++) {
        ct_dtype dt = di ? CT_F32 : CT_F64;
        double rtol = di ? 1e-5 : 1e-12;
        ct_params *p = ct_params_new();
        const int64_t sizes[3] = {30, 7, 5};
        double *g[3];
        double sumsq = 0;
        for (int k = 0; k < 3; k++) {
            ct_tensor *t = tu_rand(CT_SHAPE(sizes[k]), dt, -1, 1, NULL);
            ct_requires_grad_(t, true);
            char nm[8];
            snprintf(nm, sizeof nm, "p%d", k);
            assert_int_equal(ct_params_add(p, nm, t), CT_OK);
            if (k != 1) { /* parameter 1 has no gradient */
                ct_tensor *gt = tu_rand(CT_SHAPE(sizes[k]), dt, -2, 2, &g[k]);
                assert_int_equal(ct_set_grad(t, gt), CT_OK);
                ct_tensor_release(gt);
                for (int64_t i = 0; i < sizes[k]; i++) sumsq += g[k][i] * g[k][i];
            }
            ct_tensor_release(t);
        }
        double total = sqrt(sumsq), got = -1;
        /* Below the threshold: untouched. */
        assert_int_equal(ct_clip_grad_norm(p, 2 * total, &got), CT_OK);
        assert_true(fabs(got - total) <= rtol * total);
        for (int k = 0; k < 3; k += 2) {
            double *v = tu_values(ct_grad(ct_params_get(p, k, NULL)));
            tu_assert_close(v, g[k], sizes[k], 0, 0);
            free(v);
        }
        assert_null(ct_grad(ct_params_get(p, 1, NULL)));
        /* Above: scaled by max_norm / (total + 1e-6). */
        double max_norm = total / 3;
        assert_int_equal(ct_clip_grad_norm(p, max_norm, &got), CT_OK);
        assert_true(fabs(got - total) <= rtol * total);
        double coef = max_norm / (total + 1e-6), after = 0;
        for (int k = 0; k < 3; k += 2) {
            double *v = tu_values(ct_grad(ct_params_get(p, k, NULL)));
            for (int64_t i = 0; i < sizes[k]; i++) {
                g[k][i] *= coef;
                after += v[i] * v[i];
            }
            tu_assert_close(v, g[k], sizes[k], rtol, 1e-7);
            free(v);
        }
        assert_true(fabs(sqrt(after) - max_norm) < 1e-5 * max_norm + 1e-6);
        /* total_norm may be NULL. */
        assert_int_equal(ct_clip_grad_norm(p, max_norm, NULL), CT_OK);
        tu_assert_error(ct_clip_grad_norm(p, 0, &got), CT_ERR_INVALID_ARG, "ct_clip_grad_norm",
                        "max_norm");
        tu_assert_error(ct_clip_grad_norm(p, -1, &got), CT_ERR_INVALID_ARG, "ct_clip_grad_norm",
                        "-1");
        tu_assert_error(ct_clip_grad_norm(p, NAN, &got), CT_ERR_INVALID_ARG,
                        "ct_clip_grad_norm");
        tu_assert_error(ct_clip_grad_norm(NULL, 1, &got), CT_ERR_INVALID_ARG,
                        "ct_clip_grad_norm", "NULL");
        free(g[0]);
        free(g[2]);
        ct_params_free(p);
    }
    /* No gradients at all: total 0. */
    ct_params *p = ct_params_new();
    ct_tensor *t = ct_tensor_ones(CT_SHAPE(3), CT_F32, CT_CPU);
    ct_params_add(p, "t", t);
    double got = -1;
    assert_int_equal(ct_clip_grad_norm(p, 1.0, &got), CT_OK);
    assert_true(got == 0);
    ct_params_free(p);
    ct_tensor_release(t);
}

/* ---- training an MLP end to end ------------------------------------------------------------- */

#define NCLS 3
#define NPER 100
#define NPTS (NCLS * NPER)
#define HIDDEN 64

typedef struct mlp {
    ct_nn_linear *fc1, *fc2;
    ct_params *params;
} mlp;

static void mlp_init(mlp *m, ct_generator *g) {
    m->fc1 = ct_nn_linear_new(2, HIDDEN, true, CT_F32, CT_CPU, g);
    m->fc2 = ct_nn_linear_new(HIDDEN, NCLS, true, CT_F32, CT_CPU, g);
    assert_non_null(m->fc1);
    assert_non_null(m->fc2);
    m->params = ct_params_new();
    assert_int_equal(ct_nn_linear_params(m->fc1, "fc1", m->params), CT_OK);
    assert_int_equal(ct_nn_linear_params(m->fc2, "fc2", m->params), CT_OK);
}

static void mlp_free(mlp *m) {
    ct_params_free(m->params);
    ct_nn_linear_free(m->fc1);
    ct_nn_linear_free(m->fc2);
}

static ct_tensor *mlp_forward(mlp *m, ct_tensor *x) {
    return ct_nn_linear_forward(m->fc2, ct_relu(ct_nn_linear_forward(m->fc1, x)));
}

/* The CS231n three-arm spiral: class c's points at radius r in [0, 1] and
 * angle 4c + 4r + 0.2 * noise; x [NPTS, 2] float32, y [NPTS] int64. Not
 * linearly separable: the hidden layer has to bend the boundaries. The three
 * points at r = 0 coincide, so 298/300 is the best accuracy possible. */
static void make_spiral(ct_generator *g, ct_tensor **x, ct_tensor **y) {
    ct_tensor *noise = ct_tensor_randn(g, CT_SHAPE(NPTS), CT_F64, CT_CPU);
    double *nv = tu_values(noise);
    float xv[NPTS * 2];
    int64_t yv[NPTS];
    for (int c = 0; c < NCLS; c++) {
        for (int i = 0; i < NPER; i++) {
            int k = c * NPER + i;
            double r = (double)i / (NPER - 1), t = 4.0 * c + 4.0 * r + 0.2 * nv[k];
            xv[2 * k] = (float)(r * sin(t));
            xv[2 * k + 1] = (float)(r * cos(t));
            yv[k] = c;
        }
    }
    free(nv);
    ct_tensor_release(noise);
    *x = ct_tensor_from_data(xv, CT_F32, CT_SHAPE(NPTS, 2));
    *y = ct_tensor_from_data(yv, CT_I64, CT_SHAPE(NPTS));
}

static double accuracy(ct_tensor *logits, ct_tensor *y) {
    ct_scope *s = ct_scope_begin();
    double hits = -1;
    ct_tensor *pred = ct_argmax(logits, 1, false);
    ct_tensor *n = ct_sum(ct_eq(pred, y), CT_NONE, false);
    assert_int_equal(ct_tensor_item(n, &hits), CT_OK);
    ct_scope_end(s);
    return hits / NPTS;
}

/* One step: forward, loss, zero_grad, backward, step (all temporaries in a
 * scope). Returns the loss and the accuracy of the logits before the step. */
static void train_step(mlp *m, ct_optimizer *o, ct_tensor *x, ct_tensor *y, double *loss,
                       double *acc) {
    ct_scope *s = ct_scope_begin();
    ct_tensor *logits = mlp_forward(m, x);
    ct_tensor *l = ct_cross_entropy(logits, y, NULL, CT_REDUCTION_MEAN, -100, 0.0);
    if (!l) fprintf(stderr, "forward: %s\n", ct_last_error());
    assert_non_null(l);
    ct_optim_zero_grad(o);
    ct_status st = ct_backward(l, NULL, false);
    if (st) fprintf(stderr, "backward: %s\n", ct_last_error());
    assert_int_equal(st, CT_OK);
    for (int64_t k = 0; k < ct_params_count(m->params); k++)
        assert_non_null(ct_grad(ct_params_get(m->params, k, NULL)));
    assert_int_equal(ct_optim_step(o), CT_OK);
    if (loss) assert_int_equal(ct_tensor_item(l, loss), CT_OK);
    if (acc) *acc = accuracy(logits, y);
    ct_scope_end(s);
}

/* Trains for steps steps and returns the first step after which the
 * training accuracy was at least 99%; the model must end within a point of it
 * (the noisy arms overlap near the centre, and as the loss keeps falling the
 * boundary can give up one of those points again: 296/300 at the end after
 * 297 on one sample), with the loss well below its start. */
static int train_to_99(bool adamw, int steps) {
    ct_generator *g = fresh_gen();
    mlp m;
    mlp_init(&m, g);
    ct_tensor *x, *y;
    make_spiral(g, &x, &y);
    ct_optimizer *o = adamw ? ct_optim_adamw_new(m.params, 0.01, 0.9, 0.999, 1e-8, 0.01)
                            : ct_optim_sgd_new(m.params, 0.2, 0.9, 0, 0, false);
    assert_non_null(o);
    double loss0 = 0, loss = 0, acc = 0;
    int first = -1;
    for (int step = 0; step < steps; step++) {
        /* acc is of the logits before this update: the model after step - 1. */
        train_step(&m, o, x, y, step == 0 ? &loss0 : &loss, &acc);
        if (first < 0 && acc >= 0.99) first = step - 1;
    }
    ct_scope *s = ct_scope_begin();
    double final_acc = accuracy(mlp_forward(&m, x), y);
    ct_scope_end(s);
    fprintf(stderr, "[ mlp      ] %s: loss %.4f -> %.4f over %d steps; 99%% accuracy first after "
            "%d steps; final accuracy %.4f\n",
            adamw ? "AdamW" : "SGD momentum", loss0, loss, steps, first, final_acc);
    assert_true(first >= 0);
    assert_true(final_acc >= 0.98);
    assert_true(loss < 0.2 * loss0);
    ct_optim_free(o);
    ct_tensor_release(x);
    ct_tensor_release(y);
    mlp_free(&m);
    ct_generator_free(g);
    return first;
}

static void test_train_mlp_sgd(void **state) {
    (void)state;
    train_to_99(false, 1500);
}

static void test_train_mlp_adamw(void **state) {
    (void)state;
    train_to_99(true, 1000);
}

/* 1000 steps leave the live tensor and storage counts where one step left
 * them: nothing accumulates across steps. */
static void test_train_memory(void **state) {
    (void)state;
    ct_generator *g = fresh_gen();
    mlp m;
    mlp_init(&m, g);
    ct_tensor *x, *y;
    make_spiral(g, &x, &y);
    ct_optimizer *o = ct_optim_adamw_new(m.params, 0.005, 0.9, 0.999, 1e-8, 0.01);
    double loss;
    train_step(&m, o, x, y, &loss, NULL);
    cti_alloc_stats after1 = cti_get_alloc_stats();
    for (int step = 1; step < 1000; step++) train_step(&m, o, x, y, &loss, NULL);
    cti_alloc_stats after = cti_get_alloc_stats();
    if (!same_stats(after, after1))
        fprintf(stderr, "growth: tensors %lld -> %lld, storages %lld -> %lld, bytes %lld -> %lld\n",
                (long long)after1.live_tensors, (long long)after.live_tensors,
                (long long)after1.live_storages, (long long)after.live_storages,
                (long long)after1.live_bytes, (long long)after.live_bytes);
    assert_true(same_stats(after, after1));
    assert_true(loss < 0.1);
    ct_optim_free(o);
    ct_tensor_release(x);
    ct_tensor_release(y);
    mlp_free(&m);
    ct_generator_free(g);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_params_list, setup, teardown),
        cmocka_unit_test_setup_teardown(test_linear_init_and_forward, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_reproducible, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv2d_layer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_embedding_layer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_norm_layers, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layer_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sgd_updates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_adamw_updates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fused_sgd_op, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fused_adamw_op, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fused_op_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optim_low_precision, setup, teardown),
        cmocka_unit_test_setup_teardown(test_state_restore, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optim_misc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optim_bad_args, setup, teardown),
        cmocka_unit_test_setup_teardown(test_optim_on_cuda, setup, teardown),
        cmocka_unit_test_setup_teardown(test_schedules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_clip_grad_norm, setup, teardown),
        cmocka_unit_test_setup_teardown(test_train_mlp_sgd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_train_mlp_adamw, setup, teardown),
        cmocka_unit_test_setup_teardown(test_train_memory, setup, teardown),
    };
    return tu_run_tests(tests);
}
