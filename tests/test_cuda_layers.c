/* The layer and linear-algebra ops on the GPU against the CPU on the same
 * inputs, in every floating dtype: values, and gradients through autograd
 * (dot, outer, einsum, baddbmm, batch/group/instance norm with their
 * running statistics, conv1d, conv_transpose2d, 1-d pooling, adaptive
 * pooling); integer matmul refused on the GPU with PyTorch's reason. The
 * program is skipped without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cuda_module.h"
#include "cuda_test_util.h"
#include "test_util.h"

#include "core/tensor_impl.h"

#define P(...) ((const int64_t[]){__VA_ARGS__})

static int ngpu;

static int setup(void **state) {
    (void)state;
    ct_clear_error();
    ct_set_grad_enabled(true);
    ct_set_allow_tf32(false);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    if (ngpu > 0 && ct_cuda_synchronize(0) != CT_OK) {
        fprintf(stderr, "device error: %s\n", ct_last_error());
        return -1;
    }
    return 0;
}

static double rtol_of(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-10;
    case CT_F32: return 1e-4;
    case CT_F16: return 1e-2;
    default: return 4e-2;
    }
}

/* got against ref: |g - r| <= rtol * (|r| + max|ref|). */
static void close_to(ct_tensor *got, ct_tensor *ref, double rtol, const char *what) {
    assert_non_null(got);
    assert_non_null(ref);
    assert_int_equal(ct_tensor_numel(got), ct_tensor_numel(ref));
    assert_int_equal(ct_tensor_ndim(got), ct_tensor_ndim(ref));
    int64_t n = ct_tensor_numel(ref);
    double *g = tu_values(got), *r = tu_values(ref), scale = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(r[i]) > scale) scale = fabs(r[i]);
    for (int64_t i = 0; i < n; i++) {
        bool ok = isnan(r[i]) ? isnan(g[i]) : fabs(g[i] - r[i]) <= rtol * (fabs(r[i]) + scale);
        if (ok) continue;
        fprintf(stderr, "%s: element %lld of %lld: GPU %.17g, CPU %.17g\n", what, (long long)i,
                (long long)n, g[i], r[i]);
        free(g);
        free(r);
        fail();
    }
    free(g);
    free(r);
}

/* A case: n inputs of the given shapes (NULL shape: the input is absent),
 * the op on them, and which inputs take gradients. */
typedef ct_tensor *(*op_fn)(ct_tensor *const *in, void *ctx);
typedef struct pcase {
    const char *name;
    int n;
    int nd[5];
    int64_t shape[5][5];
    bool grad[5];
    double lo[5], hi[5];
    op_fn fn;
    void *ctx;
} pcase;

/* Runs c on the CPU and the GPU in dtype dt: values, then the gradients of
 * sum(y * r) for a random r. */
static void run_case(const pcase *c, ct_dtype dt) {
    ct_tensor *cpu[5] = {0}, *gpu[5] = {0};
    for (int i = 0; i < c->n; i++) {
        if (c->nd[i] < 0) continue;
        double lo = c->lo[i] != c->hi[i] ? c->lo[i] : -1, hi = c->lo[i] != c->hi[i] ? c->hi[i] : 1;
        cpu[i] = checked(tu_rand(c->nd[i], c->shape[i], dt, lo, hi, NULL));
        gpu[i] = checked(ct_to_device(cpu[i], CT_CUDA(0)));
        if (c->grad[i]) {
            ok(ct_requires_grad_(cpu[i], true));
            ok(ct_requires_grad_(gpu[i], true));
        }
    }
    char what[128];
    snprintf(what, sizeof what, "%s %s", c->name, ct_dtype_name(dt));
    ct_tensor *yc = c->fn(cpu, c->ctx);
    if (!yc) fprintf(stderr, "%s CPU: %s\n", what, ct_last_error());
    ct_tensor *yg = c->fn(gpu, c->ctx);
    if (!yg) fprintf(stderr, "%s GPU: %s\n", what, ct_last_error());
    close_to(yg, yc, rtol_of(dt), what);
    bool any = false;
    for (int i = 0; i < c->n; i++) any |= c->grad[i];
    if (any) {
        ct_tensor *r = checked(tu_rand(ct_tensor_ndim(yc), ct_tensor_shape(yc), dt, -1, 1, NULL));
        ct_tensor *rg = checked(ct_to_device(r, CT_CUDA(0)));
        ok(ct_backward(yc, r, false));
        ok(ct_backward(yg, rg, false));
        for (int i = 0; i < c->n; i++) {
            if (!c->grad[i]) continue;
            char gw[160];
            snprintf(gw, sizeof gw, "%s: gradient of input %d", what, i);
            close_to(ct_grad(gpu[i]), ct_grad(cpu[i]), rtol_of(dt) * 2, gw);
        }
        ct_tensor_release(r);
        ct_tensor_release(rg);
    }
    ct_tensor_release(yc);
    ct_tensor_release(yg);
    for (int i = 0; i < c->n; i++) {
        ct_tensor_release(cpu[i]);
        ct_tensor_release(gpu[i]);
    }
}

static ct_tensor *f_dot(ct_tensor *const *in, void *ctx) { (void)ctx; return ct_dot(in[0], in[1]); }
static ct_tensor *f_outer(ct_tensor *const *in, void *ctx) { (void)ctx; return ct_outer(in[0], in[1]); }
static ct_tensor *f_einsum(ct_tensor *const *in, void *ctx) {
    const char *eq = ctx;
    int n = 1;
    for (const char *s = eq; *s && *s != '-'; s++) n += *s == ',';
    return ct_einsum(eq, n, in);
}
static ct_tensor *f_baddbmm(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_baddbmm(in[0], in[1], in[2], 0.5, -1.5);
}
/* batch norm in training, its running statistics compared after */
static ct_tensor *f_bn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_batch_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
}
static ct_tensor *f_bn_eval(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_batch_norm(in[0], in[3], in[4], in[1], in[2], false, 0.1, 1e-5);
}
static ct_tensor *f_gn(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_group_norm(in[0], 2, in[1], in[2], 1e-5);
}
static ct_tensor *f_in(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_instance_norm(in[0], NULL, NULL, in[1], in[2], true, 0.1, 1e-5);
}
static ct_tensor *f_conv1d(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_conv1d(in[0], in[1], in[2], 2, 1, 2, 2);
}
static ct_tensor *f_convt(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_conv_transpose2d(in[0], in[1], in[2], P(2, 3), P(1, 0), P(1, 2), 2, P(1, 2));
}
static ct_tensor *f_maxpool1d(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_max_pool1d(in[0], 3, 2, 1, 2, true, NULL);
}
static ct_tensor *f_avgpool1d(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_avg_pool1d(in[0], 4, 3, 2, true, false);
}
static ct_tensor *f_amax(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_adaptive_max_pool2d(in[0], 3, 5, NULL);
}
static ct_tensor *f_aavg(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_adaptive_avg_pool2d(in[0], 4, 3);
}

static const pcase cases[] = {
    {"dot", 2, {1, 1}, {{37}, {37}}, {true, true}, {0}, {0}, f_dot, NULL},
    {"outer", 2, {1, 1}, {{5}, {7}}, {true, true}, {0}, {0}, f_outer, NULL},
    {"einsum bmm", 2, {3, 3}, {{2, 3, 4}, {2, 4, 5}}, {true, true}, {0}, {0}, f_einsum,
     "bij,bjk->bik"},
    {"einsum diag", 2, {3, 2}, {{3, 3, 4}, {4, 2}}, {true, true}, {0}, {0}, f_einsum,
     "iij,jk->ik"},
    {"einsum ellipsis", 2, {4, 3}, {{2, 3, 4, 5}, {3, 5, 2}}, {true, true}, {0}, {0}, f_einsum,
     "...ij,...jk->...ik"},
    {"einsum three", 3, {3, 3, 3}, {{2, 3, 4}, {2, 4, 3}, {2, 3, 2}}, {true, true, true}, {0},
     {0}, f_einsum, "ijk,ikl,ilm->jm"},
    {"baddbmm", 3, {2, 3, 3}, {{1, 5}, {3, 4, 6}, {3, 6, 5}}, {true, true, true}, {0}, {0},
     f_baddbmm, NULL},
    {"batch_norm", 3, {4, 1, 1}, {{4, 3, 5, 6}, {3}, {3}}, {true, true, true}, {-2, 0.5, -1},
     {3, 2, 1}, f_bn, NULL},
    {"batch_norm eval", 5, {3, 1, 1, 1, 1}, {{4, 3, 7}, {3}, {3}, {3}, {3}},
     {true, true, true, false, false}, {-2, 0.5, -1, -1, 0.5}, {3, 2, 1, 1, 2}, f_bn_eval, NULL},
    {"group_norm", 3, {4, 1, 1}, {{3, 4, 5, 3}, {4}, {4}}, {true, true, true}, {-2, 0.5, -1},
     {3, 2, 1}, f_gn, NULL},
    {"instance_norm", 3, {4, 1, 1}, {{3, 4, 5, 3}, {4}, {4}}, {true, true, true}, {-2, 0.5, -1},
     {3, 2, 1}, f_in, NULL},
    {"conv1d", 3, {3, 3, 1}, {{2, 4, 17}, {6, 2, 3}, {6}}, {true, true, true}, {0}, {0},
     f_conv1d, NULL},
    {"conv_transpose2d", 3, {4, 4, 1}, {{2, 4, 5, 6}, {4, 3, 3, 2}, {6}}, {true, true, true},
     {0}, {0}, f_convt, NULL},
    {"max_pool1d", 1, {3}, {{2, 3, 19}}, {true}, {0}, {0}, f_maxpool1d, NULL},
    {"avg_pool1d", 1, {3}, {{2, 3, 19}}, {true}, {0}, {0}, f_avgpool1d, NULL},
    {"adaptive_max_pool2d", 1, {4}, {{2, 3, 7, 11}}, {true}, {0}, {0}, f_amax, NULL},
    {"adaptive_avg_pool2d", 1, {4}, {{2, 3, 7, 5}}, {true}, {0}, {0}, f_aavg, NULL},
};

static void test_parity(void **state) {
    (void)state;
    if (ngpu == 0) skip();
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (int k = 0; k < 4; k++) run_case(&cases[c], tu_float_dtypes[k]);
}

/* The running statistics move alike on both devices. */
static void test_running_stats(void **state) {
    (void)state;
    if (ngpu == 0) skip();
    for (int k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k], sdt = dt == CT_F64 ? CT_F64 : CT_F32;
        ct_tensor *x = checked(tu_rand(4, P(3, 4, 5, 5), dt, -2, 3, NULL));
        ct_tensor *xg = checked(ct_to_device(x, CT_CUDA(0)));
        for (int which = 0; which < 2; which++) {
            ct_tensor *rm = checked(tu_rand(1, P(4), sdt, -1, 1, NULL));
            ct_tensor *rv = checked(tu_rand(1, P(4), sdt, 0.5, 2, NULL));
            ct_tensor *rmg = checked(ct_to_device(rm, CT_CUDA(0)));
            ct_tensor *rvg = checked(ct_to_device(rv, CT_CUDA(0)));
            ct_tensor *y = which ? ct_instance_norm(x, rm, rv, NULL, NULL, true, 0.3, 1e-5)
                                 : ct_batch_norm(x, rm, rv, NULL, NULL, true, 0.3, 1e-5);
            ct_tensor *yg = which ? ct_instance_norm(xg, rmg, rvg, NULL, NULL, true, 0.3, 1e-5)
                                  : ct_batch_norm(xg, rmg, rvg, NULL, NULL, true, 0.3, 1e-5);
            close_to(yg, y, rtol_of(dt), which ? "instance_norm" : "batch_norm");
            close_to(rmg, rm, 1e-5, "running_mean");
            close_to(rvg, rv, 1e-5, "running_var");
            ct_tensor *ts[6] = {rm, rv, rmg, rvg, y, yg};
            for (int i = 0; i < 6; i++) ct_tensor_release(ts[i]);
        }
        ct_tensor_release(x);
        ct_tensor_release(xg);
    }
}

static void test_integer_matmul_refused(void **state) {
    (void)state;
    if (ngpu == 0) skip();
    ct_tensor *a = checked(ct_tensor_zeros(2, P(2, 3), CT_I32, CT_CUDA(0)));
    ct_tensor *b = checked(ct_tensor_zeros(2, P(3, 2), CT_I32, CT_CUDA(0)));
    tu_assert_null_error(ct_matmul(a, b), CT_ERR_DTYPE, "ct_matmul", "CPU only", "cuda:0",
                         "not implemented for 'Int'");
    tu_assert_null_error(ct_mm(a, b), CT_ERR_DTYPE, "ct_mm", "CPU only");
    ct_tensor *v = checked(ct_tensor_zeros(1, P(3), CT_I64, CT_CUDA(0)));
    tu_assert_null_error(ct_dot(v, v), CT_ERR_DTYPE, "ct_dot", "'Long'");
    ct_tensor *ops[2] = {a, b};
    tu_assert_null_error(ct_einsum("ij,jk->ik", 2, ops), CT_ERR_DTYPE, "ct_einsum", "CPU only");
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(v);
}

/* A module pointer mixed with a CPU tensor is refused, naming the op. */
static void test_mixed_devices(void **state) {
    (void)state;
    if (ngpu == 0) skip();
    ct_tensor *x = checked(ct_tensor_zeros(4, P(1, 2, 3, 3), CT_F32, CT_CUDA(0)));
    ct_tensor *w = checked(ct_tensor_zeros(4, P(2, 2, 3, 3), CT_F32, CT_CPU));
    tu_assert_null_error(ct_conv_transpose2d(x, w, NULL, NULL, NULL, NULL, 1, NULL),
                         CT_ERR_DEVICE, "ct_conv_transpose2d");
    ct_tensor *wc = checked(ct_tensor_ones(1, P(2), CT_F32, CT_CPU));
    tu_assert_null_error(ct_batch_norm(x, NULL, NULL, wc, NULL, true, 0.1, 1e-5), CT_ERR_DEVICE,
                         "ct_batch_norm", "weight");
    ct_tensor_release(x);
    ct_tensor_release(w);
    ct_tensor_release(wc);
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda layers");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_parity),
        T(test_running_stats),
        T(test_integer_matmul_refused),
        T(test_mixed_devices),
    };
#undef T
    return tu_run_tests(tests);
}
