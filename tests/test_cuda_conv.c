/* The CUDA convolution (cuDNN) and pooling kernels beyond the parity suite:
 * gradients through autograd on the GPU against the CPU's on the same
 * inputs, the algorithm cache (a repeated shape does not search again), the
 * TF32 switch reaching cuDNN's math mode, strided views reaching cuDNN
 * without a copy, bad inputs, and the workspace going back to the caching
 * allocator. The program is skipped without a usable GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cuda_module.h"
#include "cuda_test_util.h"
#include "test_util.h"

#include "core/tensor_impl.h"

/* src/backends/cuda/conv.c, looked up in the module: algorithm searches run
 * so far, and the size below which the direct kernels run (-1 reads it). */
static uint64_t (*cti_cuda_conv_search_count)(void);
static int64_t (*cti_cuda_conv_direct_limit)(int64_t macs);

/* The tests run on cuDNN unless they pick the direct kernels themselves:
 * setup sets the direct limit to 0, teardown puts the default back. */
static int64_t default_direct_limit;
#define CUDNN_ONLY 0
#define DIRECT_ALWAYS INT64_MAX
static const int64_t both_paths[2] = {CUDNN_ONLY, DIRECT_ALWAYS};
static const char *path_name(int64_t limit) { return limit == CUDNN_ONLY ? "cuDNN" : "direct"; }

static int ngpu;

/* A parameter array in place: P(1, 2) for stride[2], P(2, 3, 4, 4) for a shape[4]. */
#define P(...) ((const int64_t[]){__VA_ARGS__})

#define NEED_GPU()             \
    do {                       \
        if (ngpu == 0) skip(); \
    } while (0)

/* ---- fixtures: no tensor alive and no device memory in use after a test ---------------------- */

static cti_alloc_stats start_stats;
static uint64_t start_gpu_allocated;

static uint64_t gpu_allocated(void) {
    ct_cuda_memstats m;
    return ngpu > 0 && ct_cuda_memory_stats(0, &m) == CT_OK ? m.allocated : 0;
}

static int setup(void **state) {
    (void)state;
    ct_clear_error();
    ct_set_grad_enabled(true);
    ct_set_allow_tf32(false);
    cti_cuda_conv_direct_limit(CUDNN_ONLY);
    start_stats = cti_get_alloc_stats();
    start_gpu_allocated = gpu_allocated();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ct_set_allow_tf32(false);
    cti_cuda_conv_direct_limit(default_direct_limit);
    if (ngpu > 0 && ct_cuda_synchronize(0) != CT_OK) {
        fprintf(stderr, "device error: %s\n", ct_last_error());
        return -1;
    }
    cti_alloc_stats s = cti_get_alloc_stats();
    uint64_t g = gpu_allocated();
    if (s.live_tensors != start_stats.live_tensors ||
        s.live_storages != start_stats.live_storages || g != start_gpu_allocated) {
        fprintf(stderr,
                "leak: tensors %lld -> %lld, storages %lld -> %lld, device bytes %llu -> %llu\n",
                (long long)start_stats.live_tensors, (long long)s.live_tensors,
                (long long)start_stats.live_storages, (long long)s.live_storages,
                (unsigned long long)start_gpu_allocated, (unsigned long long)g);
        return -1;
    }
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------------ */

static ct_tensor *to_gpu(ct_tensor *t) { return checked(ct_to_device(t, CT_CUDA(0))); }

/* A leaf on dev with t's values that requires grad (t itself never does). */
static ct_tensor *leaf(ct_tensor *t, ct_device dev) {
    ct_tensor *l = checked(dev.type == CT_DEVICE_CPU ? ct_detach(t) : ct_to_device(t, dev));
    ok(ct_requires_grad_(l, true));
    return l;
}

/* got (any device) against ref elementwise: |g - r| <= rtol * (|r| + max|ref|). */
static void assert_tensor_close(ct_tensor *got, ct_tensor *ref, double rtol, const char *what) {
    assert_int_equal(ct_tensor_numel(got), ct_tensor_numel(ref));
    int64_t n = ct_tensor_numel(ref);
    double *g = tu_values(got), *r = tu_values(ref), scale = 0;
    for (int64_t i = 0; i < n; i++)
        if (fabs(r[i]) > scale) scale = fabs(r[i]);
    for (int64_t i = 0; i < n; i++) {
        if (fabs(g[i] - r[i]) <= rtol * (fabs(r[i]) + scale)) continue;
        fprintf(stderr, "%s: element %lld of %lld: GPU %.17g, CPU %.17g (rtol %g, scale %g)\n",
                what, (long long)i, (long long)n, g[i], r[i], rtol, scale);
        free(g);
        free(r);
        fail();
    }
    free(g);
    free(r);
}

static double grad_rtol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-10;
    case CT_F32: return 1e-5;
    case CT_F16: return 1e-2;
    default: return 3e-2;
    }
}

/* The trace of what fn runs (caller frees). */
static char *traced(void (*fn)(void *), void *ctx) {
    tu_trace t = tu_trace_begin();
    fn(ctx);
    return tu_trace_end(&t);
}

/* The kernel= field of the trace's first line for op (static buffer). */
static const char *kernel_of(const char *trace, const char *op) {
    static char out[256];
    out[0] = 0;
    for (const char *l = trace; *l;) {
        const char *e = strchr(l, '\n');
        size_t len = e ? (size_t)(e - l) : strlen(l);
        char line[1024];
        snprintf(line, sizeof line, "%.*s", (int)(len < sizeof line ? len : sizeof line - 1), l);
        char name[64];
        if (sscanf(line, "[cten] %63s", name) == 1 && strcmp(name, op) == 0) {
            const char *k = strstr(line, "kernel=");
            if (k) {
                snprintf(out, sizeof out, "%s", k + 7);
                char *us = strstr(out, " us");
                /* drop the time: the last space-separated number before " us" */
                if (us) {
                    *us = 0;
                    char *sp = strrchr(out, ' ');
                    if (sp) *sp = 0;
                }
            }
            return out;
        }
        l += len + (e ? 1 : 0);
    }
    return out;
}

/* ---- gradients against the CPU ---------------------------------------------------------------- */

typedef struct conv_setup {
    int64_t x[4], w[4], s[2], p[2], d[2], g;
} conv_setup;

static const conv_setup conv_setups[] = {
    {{2, 4, 10, 9}, {6, 4, 3, 3}, {1, 1}, {1, 1}, {1, 1}, 1},
    {{3, 6, 13, 11}, {4, 3, 3, 2}, {2, 1}, {1, 0}, {1, 2}, 2},
    {{2, 8, 9, 9}, {8, 1, 5, 5}, {1, 2}, {2, 2}, {1, 1}, 8},
};

/* loss = sum(conv2d(x, w, b) * R) on dev; returns the gradients of x, w, b. */
static void conv_grads(const conv_setup *c, ct_tensor *x, ct_tensor *w, ct_tensor *b,
                       ct_tensor *R, ct_device dev, ct_tensor **gx, ct_tensor **gw,
                       ct_tensor **gb) {
    ct_tensor *lx = leaf(x, dev), *lw = leaf(w, dev), *lb = leaf(b, dev);
    ct_tensor *r = checked(ct_to_device(R, dev));
    ct_tensor *y = checked(ct_conv2d(lx, lw, lb, c->s, c->p, c->d, c->g));
    ct_tensor *loss = checked(ct_sum(checked(ct_mul(y, r)), CT_NONE, false));
    ok(ct_backward(loss, NULL, false));
    *gx = checked(ct_to_device(ct_grad(lx), CT_CPU));
    *gw = checked(ct_to_device(ct_grad(lw), CT_CPU));
    *gb = checked(ct_to_device(ct_grad(lb), CT_CPU));
    /* every handle here belongs to the caller's scope */
}

static void test_conv_gradients(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 8; k++) {
        ct_dtype dt = tu_float_dtypes[k % 4];
        cti_cuda_conv_direct_limit(both_paths[k / 4]);
        for (size_t i = 0; i < sizeof conv_setups / sizeof conv_setups[0]; i++) {
            const conv_setup *c = &conv_setups[i];
            ct_scope *sc = ct_scope_begin();
            int64_t oh = (c->x[2] + 2 * c->p[0] - c->d[0] * (c->w[2] - 1) - 1) / c->s[0] + 1;
            int64_t ow = (c->x[3] + 2 * c->p[1] - c->d[1] * (c->w[3] - 1) - 1) / c->s[1] + 1;
            ct_tensor *x = tu_rand(4, c->x, dt, -1, 1, NULL);
            ct_tensor *w = tu_rand(4, c->w, dt, -1, 1, NULL);
            ct_tensor *b = tu_rand(1, c->w, dt, -1, 1, NULL);
            ct_tensor *R = tu_rand(CT_SHAPE(c->x[0], c->w[0], oh, ow), dt, -1, 1, NULL);
            ct_tensor *cg[3], *gg[3];
            conv_grads(c, x, w, b, R, CT_CPU, &cg[0], &cg[1], &cg[2]);
            conv_grads(c, x, w, b, R, CT_CUDA(0), &gg[0], &gg[1], &gg[2]);
            char what[96];
            static const char *const names[3] = {"grad x", "grad w", "grad bias"};
            for (int j = 0; j < 3; j++) {
                snprintf(what, sizeof what, "conv setup %zu %s %s (%s)", i, ct_dtype_name(dt),
                         names[j], path_name(both_paths[k / 4]));
                assert_tensor_close(gg[j], cg[j], grad_rtol(dt), what);
            }
            ct_scope_end(sc);
        }
    }
}

/* max, average (ceil_mode, count_include_pad off) and adaptive pooling of the
 * same input, weighted and summed; returns the gradient of x. */
static ct_tensor *pool_grad(ct_tensor *x, ct_tensor *const *R, ct_device dev) {
    ct_tensor *lx = leaf(x, dev);
    ct_tensor *r0 = checked(ct_to_device(R[0], dev)), *r1 = checked(ct_to_device(R[1], dev));
    ct_tensor *r2 = checked(ct_to_device(R[2], dev));
    ct_tensor *p0 = checked(ct_max_pool2d(lx, P(3, 3), P(1, 2), P(1, 1),
                                          P(1, 1), false, NULL));
    ct_tensor *p1 = checked(ct_avg_pool2d(lx, P(3, 2), P(2, 2), P(1, 1), true,
                                          false));
    ct_tensor *p2 = checked(ct_adaptive_avg_pool2d(lx, 4, 3));
    ct_tensor *l0 = checked(ct_sum(checked(ct_mul(p0, r0)), CT_NONE, false));
    ct_tensor *l1 = checked(ct_sum(checked(ct_mul(p1, r1)), CT_NONE, false));
    ct_tensor *l2 = checked(ct_sum(checked(ct_mul(p2, r2)), CT_NONE, false));
    ct_tensor *loss = checked(ct_add(checked(ct_add(l0, l1)), l2));
    ok(ct_backward(loss, NULL, false));
    return checked(ct_to_device(ct_grad(lx), CT_CPU));
}

static void test_pool_gradients(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < 4; k++) {
        ct_dtype dt = tu_float_dtypes[k];
        ct_scope *sc = ct_scope_begin();
        ct_tensor *x = tu_rand(CT_SHAPE(2, 3, 11, 10), dt, -2, 2, NULL);
        /* output sizes: max 11x5, avg (ceil) 6x6, adaptive 4x3 */
        ct_tensor *R[3] = {tu_rand(CT_SHAPE(2, 3, 11, 5), dt, -1, 1, NULL),
                           tu_rand(CT_SHAPE(2, 3, 6, 6), dt, -1, 1, NULL),
                           tu_rand(CT_SHAPE(2, 3, 4, 3), dt, -1, 1, NULL)};
        ct_tensor *cpu = pool_grad(x, R, CT_CPU), *gpu = pool_grad(x, R, CT_CUDA(0));
        char what[64];
        snprintf(what, sizeof what, "pooling grad x %s", ct_dtype_name(dt));
        assert_tensor_close(gpu, cpu, grad_rtol(dt), what);
        ct_scope_end(sc);
    }
}

/* conv -> relu -> max pool -> conv -> adaptive pool in float64: every
 * gradient of the chain against the CPU's. */
static void chain_grads(ct_tensor *const *in, ct_device dev, ct_tensor **out) {
    ct_tensor *l[5];
    for (int i = 0; i < 5; i++) l[i] = leaf(in[i], dev);
    ct_tensor *r = checked(ct_to_device(in[5], dev));
    ct_tensor *h = checked(ct_conv2d(l[0], l[1], l[2], P(1, 1), P(1, 1), NULL, 1));
    h = checked(ct_relu(h));
    h = checked(ct_max_pool2d(h, P(2, 2), NULL, NULL, NULL, true, NULL));
    h = checked(ct_conv2d(h, l[3], l[4], P(2, 2), P(1, 1), NULL, 1));
    h = checked(ct_adaptive_avg_pool2d(h, 2, 2));
    ct_tensor *loss = checked(ct_sum(checked(ct_mul(h, r)), CT_NONE, false));
    ok(ct_backward(loss, NULL, false));
    for (int i = 0; i < 5; i++) out[i] = checked(ct_to_device(ct_grad(l[i]), CT_CPU));
}

static void test_chain_gradients_f64(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *in[6] = {
        tu_rand(CT_SHAPE(2, 3, 15, 14), CT_F64, -1, 1, NULL),
        tu_rand(CT_SHAPE(8, 3, 3, 3), CT_F64, -1, 1, NULL),
        tu_rand(CT_SHAPE(8), CT_F64, -1, 1, NULL),
        tu_rand(CT_SHAPE(5, 8, 3, 3), CT_F64, -1, 1, NULL),
        tu_rand(CT_SHAPE(5), CT_F64, -1, 1, NULL),
        tu_rand(CT_SHAPE(2, 5, 2, 2), CT_F64, -1, 1, NULL),
    };
    ct_tensor *cg[5], *gg[5];
    chain_grads(in, CT_CPU, cg);
    for (int p = 0; p < 2; p++) {
        cti_cuda_conv_direct_limit(both_paths[p]);
        chain_grads(in, CT_CUDA(0), gg);
        static const char *const names[5] = {"x", "w1", "b1", "w2", "b2"};
        char what[64];
        for (int i = 0; i < 5; i++) {
            snprintf(what, sizeof what, "%s (%s)", names[i], path_name(both_paths[p]));
            assert_tensor_close(gg[i], cg[i], 1e-10, what);
        }
    }
    ct_scope_end(sc);
}

/* ---- the algorithm cache ------------------------------------------------------------------------ */

static void test_algorithm_cache(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    /* a geometry no other test uses */
    ct_tensor *x = tu_rand(CT_SHAPE(3, 5, 17, 19), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(7, 5, 3, 3), CT_F32, -1, 1, NULL);
    ct_tensor *gx = to_gpu(x), *gw = to_gpu(w);
    int64_t st[2] = {1, 2}, pd[2] = {2, 1};
    uint64_t n0 = cti_cuda_conv_search_count();
    ct_tensor *y1 = checked(ct_conv2d(gx, gw, NULL, st, pd, NULL, 1));
    assert_int_equal(cti_cuda_conv_search_count(), n0 + 1);
    /* same geometry, other buffers and values: the cached choice */
    ct_tensor *x2 = tu_rand(CT_SHAPE(3, 5, 17, 19), CT_F32, -1, 1, NULL);
    ct_tensor *gx2 = to_gpu(x2);
    ct_tensor *y2 = checked(ct_conv2d(gx2, gw, NULL, st, pd, NULL, 1));
    checked(ct_conv2d(gx, gw, NULL, st, pd, NULL, 1));
    assert_int_equal(cti_cuda_conv_search_count(), n0 + 1);
    assert_tensor_close(y1, checked(ct_conv2d(x, w, NULL, st, pd, NULL, 1)), 1e-5, "first");
    assert_tensor_close(y2, checked(ct_conv2d(x2, w, NULL, st, pd, NULL, 1)), 1e-5, "second");
    /* each backward direction searches once */
    const int64_t xs[4] = {3, 5, 17, 19}, ws[4] = {7, 5, 3, 3};
    for (int rep = 0; rep < 2; rep++) {
        checked(ct_conv2d_backward_input(y1, gw, xs, st, pd, NULL, 1));
        checked(ct_conv2d_backward_weight(y1, gx, ws, st, pd, NULL, 1));
        assert_int_equal(cti_cuda_conv_search_count(), n0 + 3);
    }
    /* another math mode is another key; switching back finds the first again */
    ct_set_allow_tf32(true);
    checked(ct_conv2d(gx, gw, NULL, st, pd, NULL, 1));
    assert_int_equal(cti_cuda_conv_search_count(), n0 + 4);
    ct_set_allow_tf32(false);
    checked(ct_conv2d(gx, gw, NULL, st, pd, NULL, 1));
    /* another geometry searches */
    checked(ct_conv2d(gx, gw, NULL, NULL, pd, NULL, 1));
    assert_int_equal(cti_cuda_conv_search_count(), n0 + 5);
    ct_scope_end(sc);
}

/* ---- TF32 and the routine in the trace ----------------------------------------------------------- */

typedef struct conv_io {
    ct_tensor *x, *w, *b, *y;
} conv_io;

static void run_conv(void *ctx) {
    conv_io *io = ctx;
    io->y = ct_conv2d(io->x, io->w, io->b, NULL, P(1, 1), NULL, 1);
}

static void test_tf32_math_mode(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    conv_io io = {to_gpu(tu_rand(CT_SHAPE(4, 16, 20, 20), CT_F32, -1, 1, NULL)),
                  to_gpu(tu_rand(CT_SHAPE(16, 16, 3, 3), CT_F32, -1, 1, NULL)), NULL, NULL};
    char *off = traced(run_conv, &io);
    checked(io.y);
    const char *k = kernel_of(off, "conv2d");
    fprintf(stderr, "[ routine  ] TF32 off: %s\n", k);
    assert_non_null(strstr(k, "cudnnConvolutionForward("));
    assert_non_null(strstr(k, "FMA_MATH"));
    free(off);
    ct_set_allow_tf32(true);
    char *on = traced(run_conv, &io);
    ct_set_allow_tf32(false);
    checked(io.y);
    k = kernel_of(on, "conv2d");
    fprintf(stderr, "[ routine  ] TF32 on:  %s\n", k);
    assert_non_null(strstr(k, "cudnnConvolutionForward("));
    assert_null(strstr(k, "FMA_MATH"));
    free(on);
    /* with a bias the routine says the bias is added */
    io.b = to_gpu(tu_rand(CT_SHAPE(16), CT_F32, -1, 1, NULL));
    char *bias = traced(run_conv, &io);
    checked(io.y);
    assert_non_null(strstr(kernel_of(bias, "conv2d"), "+ bias add"));
    free(bias);
    ct_scope_end(sc);
}

/* A channel slice keeps NCHW with a packed last dim: cuDNN reads it in place. */
static void strided_view_without_copy(void) {
    ct_scope *sc = ct_scope_begin();
    ct_tensor *big = tu_rand(CT_SHAPE(2, 8, 12, 12), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(4, 3, 3, 3), CT_F32, -1, 1, NULL);
    conv_io io = {checked(ct_narrow(to_gpu(big), 1, 2, 3)), to_gpu(w), NULL, NULL};
    assert_false(cti_is_contiguous(io.x));
    char *trace = traced(run_conv, &io);
    checked(io.y);
    const char *k = kernel_of(trace, "conv2d");
    fprintf(stderr, "[ routine  ] channel slice: %s\n", k);
    assert_null(strstr(k, "copy"));
    assert_null(strstr(trace, "[cten] copy"));
    free(trace);
    ct_tensor *ref = checked(ct_conv2d(checked(ct_narrow(big, 1, 2, 3)), w, NULL, NULL,
                                       P(1, 1), NULL, 1));
    assert_tensor_close(io.y, ref, 1e-5, "channel slice");
    /* a transposed image (H and W swapped) may be read in place or packed;
     * either way the result is right */
    ct_tensor *sq = tu_rand(CT_SHAPE(2, 3, 10, 10), CT_F32, -1, 1, NULL);
    ct_tensor *t = checked(ct_transpose(to_gpu(sq), 2, 3));
    ref = checked(ct_conv2d(checked(ct_transpose(sq, 2, 3)), w, NULL, NULL, P(1, 1), NULL, 1));
    assert_tensor_close(checked(ct_conv2d(t, io.w, NULL, NULL, P(1, 1), NULL, 1)), ref,
                        1e-5, "transposed");
    ct_scope_end(sc);
}

static void test_strided_view_without_copy(void **state) {
    (void)state;
    NEED_GPU();
    for (int p = 0; p < 2; p++) {
        cti_cuda_conv_direct_limit(both_paths[p]);
        strided_view_without_copy();
    }
}

/* ---- the direct kernels ------------------------------------------------------------------------- */

typedef struct bias_io {
    ct_tensor *dy, *db;
} bias_io;

static void run_bias(void *ctx) {
    bias_io *io = ctx;
    io->db = ct_conv2d_backward_bias(io->dy);
}

/* With the default limit a small convolution runs the direct kernel with
 * the bias fused, a large one cuDNN; the bias gradient has its own kernel,
 * which also takes a strided grad_out (checked against float64 sums). */
static void test_direct_routing(void **state) {
    (void)state;
    NEED_GPU();
    cti_cuda_conv_direct_limit(default_direct_limit);
    ct_scope *sc = ct_scope_begin();
    conv_io io = {to_gpu(tu_rand(CT_SHAPE(2, 4, 10, 9), CT_F32, -1, 1, NULL)),
                  to_gpu(tu_rand(CT_SHAPE(6, 4, 3, 3), CT_F32, -1, 1, NULL)),
                  to_gpu(tu_rand(CT_SHAPE(6), CT_F32, -1, 1, NULL)), NULL};
    char *small = traced(run_conv, &io);
    checked(io.y);
    fprintf(stderr, "[ routine  ] small: %s\n", kernel_of(small, "conv2d"));
    assert_string_equal(kernel_of(small, "conv2d"), "cuda_conv2d_direct+bias");
    assert_null(strstr(small, "[cten] add"));
    free(small);
    /* 8 x 64 x 28 x 28 -> 64, 3 x 3: 231M multiply-adds, over the limit */
    conv_io big = {checked(ct_tensor_randn(NULL, CT_SHAPE(8, 64, 28, 28), CT_F32, CT_CUDA(0))),
                   checked(ct_tensor_randn(NULL, CT_SHAPE(64, 64, 3, 3), CT_F32, CT_CUDA(0))),
                   NULL, NULL};
    char *large = traced(run_conv, &big);
    checked(big.y);
    fprintf(stderr, "[ routine  ] large: %s\n", kernel_of(large, "conv2d"));
    assert_non_null(strstr(kernel_of(large, "conv2d"), "cudnnConvolutionForward("));
    free(large);

    /* the bias gradient of a channel-sliced (strided) grad_out */
    ct_tensor *dyc = tu_rand(CT_SHAPE(3, 7, 5, 6), CT_F32, -1, 1, NULL);
    bias_io b = {checked(ct_narrow(to_gpu(dyc), 1, 1, 5)), NULL};
    assert_false(cti_is_contiguous(b.dy));
    char *bt = traced(run_bias, &b);
    checked(b.db);
    assert_string_equal(kernel_of(bt, "conv2d_backward_bias"), "cuda_conv2d_backward_bias");
    free(bt);
    double *v = tu_values(dyc), *got = tu_values(checked(ct_to_device(b.db, CT_CPU)));
    for (int c = 0; c < 5; c++) {
        double ref = 0;
        for (int n = 0; n < 3; n++)
            for (int hw = 0; hw < 30; hw++) ref += v[(n * 7 + c + 1) * 30 + hw];
        assert_true(fabs(got[c] - ref) <= 1e-5 * (1 + fabs(ref)));
    }
    free(v);
    free(got);
    ct_scope_end(sc);
}

/* ---- bad inputs ------------------------------------------------------------------------------------ */

static void test_bad_inputs(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3, 8, 8), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(4, 3, 3, 3), CT_F32, -1, 1, NULL);
    ct_tensor *gx = to_gpu(x), *gw = to_gpu(w);
    tu_assert_null_error(ct_conv2d(gx, w, NULL, NULL, NULL, NULL, 1), CT_ERR_DEVICE, "ct_conv2d",
                         "cuda:0", "cpu");
    ct_tensor *b = tu_rand(CT_SHAPE(4), CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_conv2d(gx, gw, b, NULL, NULL, NULL, 1), CT_ERR_DEVICE, "ct_conv2d",
                         "cpu");
    ct_tensor *wh = to_gpu(tu_rand(CT_SHAPE(4, 3, 3, 3), CT_F16, -1, 1, NULL));
    tu_assert_null_error(ct_conv2d(gx, wh, NULL, NULL, NULL, NULL, 1), CT_ERR_DTYPE, "ct_conv2d",
                         "float32", "float16");
    tu_assert_null_error(ct_conv2d(gx, gw, NULL, NULL, NULL, NULL, 2), CT_ERR_SHAPE, "ct_conv2d",
                         "groups 2");
    ct_tensor *dy = to_gpu(tu_rand(CT_SHAPE(2, 4, 6, 6), CT_F32, -1, 1, NULL));
    const int64_t xs[4] = {2, 3, 8, 8};
    tu_assert_null_error(ct_conv2d_backward_input(dy, w, xs, NULL, NULL, NULL, 1), CT_ERR_DEVICE,
                         "ct_conv2d_backward_input", "cuda:0", "cpu");
    tu_assert_null_error(ct_conv2d_backward_weight(dy, x, P(4, 3, 3, 3), NULL, NULL, NULL, 1),
                         CT_ERR_DEVICE, "ct_conv2d_backward_weight", "cuda:0", "cpu");
    ct_tensor *idx = NULL;
    ct_tensor *p = checked(ct_max_pool2d(gx, P(2, 2), NULL, NULL, NULL, false, &idx));
    tu_assert_null_error(ct_max_pool2d_backward(p, x, idx), CT_ERR_DEVICE,
                         "ct_max_pool2d_backward", "cpu");
    tu_assert_null_error(ct_avg_pool2d_backward(p, x, P(2, 2), NULL, NULL, false, true),
                         CT_ERR_DEVICE, "ct_avg_pool2d_backward", "cpu");
    tu_assert_null_error(ct_adaptive_avg_pool2d_backward(p, x), CT_ERR_DEVICE,
                         "ct_adaptive_avg_pool2d_backward", "cpu");
    /* An image of more than 2^31 elements (a broadcast, so nothing is
     * allocated for it) exceeds cuDNN's int strides: refused by name. */
    ct_tensor *one = checked(ct_tensor_scalar(1, CT_F16, CT_CUDA(0)));
    ct_tensor *huge = checked(ct_expand(one, CT_SHAPE(1, 1024, 1500, 1500)));
    ct_tensor *w1 = checked(ct_tensor_zeros(CT_SHAPE(1, 1024, 1, 1), CT_F16, CT_CUDA(0)));
    tu_assert_null_error(ct_conv2d(huge, w1, NULL, NULL, NULL, NULL, 1), CT_ERR_OVERFLOW,
                         "ct_conv2d", "cuDNN", "32-bit");
    ok(ct_cuda_synchronize(0));
    ct_scope_end(sc);
}

/* Indices that ct_max_pool2d cannot produce never write outside the
 * gradient: the GPU kernel drops them (the CPU reports them). */
static void test_max_pool_backward_drops_bad_indices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = checked(ct_tensor_zeros(CT_SHAPE(2, 3, 4, 4), CT_F32, CT_CUDA(0)));
    ct_tensor *dy = checked(ct_tensor_full(CT_SHAPE(2, 3, 2, 2), 1.5, CT_F32, CT_CUDA(0)));
    ct_tensor *bad = checked(ct_tensor_full(CT_SHAPE(2, 3, 2, 2), 16, CT_I64, CT_CUDA(0)));
    ct_tensor *g = checked(ct_max_pool2d_backward(dy, x, bad));
    ok(ct_cuda_synchronize(0));
    double *v = tu_values(g);
    for (int i = 0; i < 96; i++) assert_true(v[i] == 0);
    free(v);
    ct_scope_end(sc);
}

/* ---- workspace ------------------------------------------------------------------------------------ */

/* The ResNet layer shape: algorithms with workspace are likely; every byte
 * of it is back with the allocator once the results are released. */
static void test_workspace_released(void **state) {
    (void)state;
    NEED_GPU();
    ok(ct_cuda_synchronize(0));
    ct_cuda_memstats before;
    ok(ct_cuda_memory_stats(0, &before));
    ok(ct_cuda_reset_peak_memory_stats(0));
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = checked(ct_tensor_randn(NULL, CT_SHAPE(8, 64, 28, 28), CT_F32, CT_CUDA(0)));
    ct_tensor *w = checked(ct_tensor_randn(NULL, CT_SHAPE(64, 64, 3, 3), CT_F32, CT_CUDA(0)));
    ct_tensor *b = checked(ct_tensor_randn(NULL, CT_SHAPE(64), CT_F32, CT_CUDA(0)));
    uint64_t inputs = gpu_allocated() - before.allocated;
    for (int rep = 0; rep < 2; rep++) {
        ct_tensor *y = checked(ct_conv2d(x, w, b, NULL, P(1, 1), NULL, 1));
        checked(ct_conv2d_backward_input(y, w, P(8, 64, 28, 28), NULL, P(1, 1), NULL, 1));
        checked(ct_conv2d_backward_weight(y, x, P(64, 64, 3, 3), NULL, P(1, 1), NULL, 1));
        checked(ct_conv2d_backward_bias(y));
    }
    ct_scope_end(sc);
    ok(ct_cuda_synchronize(0));
    ct_cuda_memstats after;
    ok(ct_cuda_memory_stats(0, &after));
    assert_int_equal(after.allocated, before.allocated);
    fprintf(stderr, "[ memory   ] peak %llu bytes above the start (inputs %llu)\n",
            (unsigned long long)(after.peak_allocated - before.allocated),
            (unsigned long long)inputs);
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda conv");
    cti_cuda_conv_search_count = tu_cuda_symbol("cti_cuda_conv_search_count");
    cti_cuda_conv_direct_limit = tu_cuda_symbol("cti_cuda_conv_direct_limit");
    default_direct_limit = cti_cuda_conv_direct_limit(-1);
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_conv_gradients),
        T(test_pool_gradients),
        T(test_chain_gradients_f64),
        T(test_algorithm_cache),
        T(test_tf32_math_mode),
        T(test_strided_view_without_copy),
        T(test_direct_routing),
        T(test_bad_inputs),
        T(test_max_pool_backward_drops_bad_indices),
        T(test_workspace_released),
    };
#undef T
    return tu_run_tests(tests);
}
