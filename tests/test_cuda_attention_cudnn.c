/* The CUDA attention's two f16/bf16 paths on the shapes cuDNN's fused flash
 * attention takes (T and S multiples of 64 and 128, D a multiple of 8):
 * forward and autograd backward against float64 references computed here
 * from the same rounded inputs, once through cuDNN (the default) and once
 * through the flash kernels (CT_CUDA_SDPA_CUDNN=0) on tensor cores and on
 * the scalar tiles (CT_CUDA_SDPA_MMA=0), causal and not, with a
 * non-contiguous (transposed-heads) q, and the flash kernels on odd shapes
 * too; and, from the trace's routine names,
 * that the default path is cuDNN's there and the flash kernels' where cuDNN
 * does not apply (an odd T). Output memory is poisoned with NaN before each
 * op writes it. Skips without a GPU. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "cuda_test_util.h"
#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

#include "dispatch/dispatch_impl.h"

static int ngpu;

#define NEED_GPU()             \
    do {                       \
        if (ngpu == 0) skip(); \
    } while (0)

static ct_tensor *gpu(ct_tensor *t) { return checked(ct_to_device(t, CT_CUDA(0))); }

static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ok(ct_fill_(t, NAN));
    ct_tensor_release(t);
}

typedef struct shape {
    int64_t B, H, T, S, D;
} shape;

/* float64 attention of row-major q [B,H,T,D], k, v [B,H,S,D] and its
 * gradients for grad_out g: out, dq, dk, dv (any may be NULL). */
static void reference(const shape *s, bool causal, double scale, const double *q, const double *k,
                      const double *v, const double *g, double *out, double *dq, double *dk,
                      double *dv) {
    const int64_t T = s->T, S = s->S, D = s->D;
    double *p = malloc((size_t)S * sizeof(double)), *dp = malloc((size_t)S * sizeof(double));
    int64_t nq = s->B * s->H * T * D, nk = s->B * s->H * S * D;
    if (dq) memset(dq, 0, (size_t)nq * sizeof(double));
    if (dk) memset(dk, 0, (size_t)nk * sizeof(double));
    if (dv) memset(dv, 0, (size_t)nk * sizeof(double));
    for (int64_t bh = 0; bh < s->B * s->H; bh++) {
        const double *Q = q + bh * T * D, *K = k + bh * S * D, *V = v + bh * S * D;
        for (int64_t i = 0; i < T; i++) {
            double mx = -INFINITY;
            for (int64_t j = 0; j < S; j++) {
                double a = 0;
                for (int64_t d = 0; d < D; d++) a += Q[i * D + d] * K[j * D + d];
                p[j] = causal && j > i ? -INFINITY : a * scale;
                if (p[j] > mx) mx = p[j];
            }
            double sum = 0;
            for (int64_t j = 0; j < S; j++) sum += p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx);
            for (int64_t j = 0; j < S; j++) p[j] /= sum;
            if (out)
                for (int64_t d = 0; d < D; d++) {
                    double a = 0;
                    for (int64_t j = 0; j < S; j++) a += p[j] * V[j * D + d];
                    out[(bh * T + i) * D + d] = a;
                }
            if (!g) continue;
            const double *G = g + (bh * T + i) * D;
            double delta = 0;
            for (int64_t j = 0; j < S; j++) {
                double a = 0;
                for (int64_t d = 0; d < D; d++) a += G[d] * V[j * D + d];
                dp[j] = a;
                delta += p[j] * a;
            }
            for (int64_t j = 0; j < S; j++) {
                double ds = p[j] * (dp[j] - delta) * scale;
                for (int64_t d = 0; d < D; d++) {
                    if (dq) dq[(bh * T + i) * D + d] += ds * K[j * D + d];
                    if (dk) dk[(bh * S + j) * D + d] += ds * Q[i * D + d];
                    if (dv) dv[(bh * S + j) * D + d] += p[j] * G[d];
                }
            }
        }
    }
    free(p);
    free(dp);
}

/* |got - ref| <= tol * max|ref| everywhere: both paths round P (cuDNN: and
 * dS) to the io dtype before a matmul, so errors scale with the largest
 * value rather than each element. */
static void expect_near(ct_tensor *got, const double *ref, int64_t n, double tol) {
    assert_non_null(got);
    assert_int_equal(ct_tensor_numel(got), n);
    double *v = tu_values(got), big = 0;
    for (int64_t i = 0; i < n; i++) big = fmax(big, fabs(ref[i]));
    tu_assert_close(v, ref, n, 0, tol * big + 1e-6);
    free(v);
}

/* Runs fn with the trace on and stderr captured; whether the captured text
 * contains both words. */
static bool trace_says(void (*fn)(void *), void *arg, const char *word, const char *word2) {
    fflush(stderr);
    int saved = dup(2);
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    assert_true(saved >= 0);
    dup2(fileno(tmp), 2);
    ct_set_trace(true);
    fn(arg);
    ct_set_trace(false);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    long n = ftell(tmp);
    char *buf = calloc((size_t)(n > 0 ? n : 0) + 1, 1);
    rewind(tmp);
    size_t got = fread(buf, 1, (size_t)(n > 0 ? n : 0), tmp);
    buf[got] = 0;
    fclose(tmp);
    bool found = strstr(buf, word) != NULL && strstr(buf, word2) != NULL;
    if (!found) fprintf(stderr, "trace (looking for %s and %s):\n%s", word, word2, buf);
    free(buf);
    return found;
}

typedef struct fb_case {
    const shape *s;
    ct_dtype dt;
    bool causal, transposed_q;
    double *q, *k, *v, *g; /* the rounded inputs */
    ct_tensor *out, *dq, *dk, *dv;
} fb_case;

/* Forward and autograd backward on the GPU; fills c->out, dq, dk, dv. */
static void run_case(void *arg) {
    fb_case *c = arg;
    const shape *s = c->s;
    int64_t qs[4] = {s->B, s->H, s->T, s->D}, ks[4] = {s->B, s->H, s->S, s->D};
    ct_tensor *hq = checked(tu_from_f64(c->q, 4, qs, c->dt));
    ct_tensor *hk = checked(tu_from_f64(c->k, 4, ks, c->dt));
    ct_tensor *hv = checked(tu_from_f64(c->v, 4, ks, c->dt));
    ct_tensor *hg = checked(tu_from_f64(c->g, 4, qs, c->dt));
    ct_tensor *q = gpu(hq), *k = gpu(hk), *v = gpu(hv), *g = gpu(hg);
    if (c->transposed_q) {
        /* the same values with heads and rows swapped in memory: [B, T, H, D] storage */
        int64_t perm[4] = {0, 2, 1, 3};
        ct_tensor *t = checked(ct_permute(q, 4, perm));
        ct_tensor *tc = checked(ct_contiguous(t));
        ct_tensor *back = checked(ct_permute(tc, 4, perm));
        ct_tensor_release(t);
        ct_tensor_release(tc);
        ct_tensor_release(q);
        q = back;
    }
    ok(ct_requires_grad_(q, true));
    ok(ct_requires_grad_(k, true));
    ok(ct_requires_grad_(v, true));
    poison(s->B * s->H * s->T * s->D * 2);
    ct_tensor *y =
        checked(ct_scaled_dot_product_attention(q, k, v, NULL, 0.0, c->causal, 0.0, NULL));
    poison(s->B * s->H * s->S * s->D * 2);
    ok(ct_backward(y, g, false));
    c->out = checked(ct_detach(y));
    c->dq = ct_tensor_retain(checked(ct_grad(q)));
    c->dk = ct_tensor_retain(checked(ct_grad(k)));
    c->dv = ct_tensor_retain(checked(ct_grad(v)));
    ct_tensor *all[] = {hq, hk, hv, hg, q, k, v, g, y};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
}

static void release_case(fb_case *c) {
    ct_tensor *all[] = {c->out, c->dq, c->dk, c->dv};
    for (size_t i = 0; i < 4; i++) ct_tensor_release(all[i]);
    c->out = c->dq = c->dk = c->dv = NULL;
}

/* Which path a case forces: cuDNN (the default where it applies), the
 * flash kernels on tensor cores, or their scalar versions. */
enum { P_CUDNN, P_MMA, P_SCALAR };

static void check_shape(const shape *s, ct_dtype dt, bool causal, bool transposed_q, int path) {
    int64_t nq = s->B * s->H * s->T * s->D, nk = s->B * s->H * s->S * s->D;
    fb_case c = {.s = s, .dt = dt, .causal = causal, .transposed_q = transposed_q};
    c.q = tu_rand_vals(nq, dt, -1, 1);
    c.k = tu_rand_vals(nk, dt, -1, 1);
    c.v = tu_rand_vals(nk, dt, -1, 1);
    c.g = tu_rand_vals(nq, dt, -1, 1);
    double *out = malloc((size_t)nq * 8), *dq = malloc((size_t)nq * 8);
    double *dk = malloc((size_t)nk * 8), *dv = malloc((size_t)nk * 8);
    /* q in [-4, 4): sharper rows than near-uniform attention (default scale) */
    for (int64_t i = 0; i < nq; i++) c.q[i] = tu_round(c.q[i] * 4, dt);
    reference(s, causal, 1 / sqrt((double)s->D), c.q, c.k, c.v, c.g, out, dq, dk, dv);

    setenv("CT_CUDA_SDPA_CUDNN", path == P_CUDNN ? "1" : "0", 1);
    setenv("CT_CUDA_SDPA_MMA", path == P_SCALAR ? "0" : "1", 1);
    bool traced = path == P_CUDNN ? trace_says(run_case, &c, "cudnn_sdpa (", "cudnn_sdpa_backward")
                  : path == P_MMA ? trace_says(run_case, &c, "flash_fwd_mma", "flash_bwd_mma")
                                  : trace_says(run_case, &c, "flash_fwd_tile32", "flash_bwd_delta");
    unsetenv("CT_CUDA_SDPA_CUDNN");
    unsetenv("CT_CUDA_SDPA_MMA");
    double tol = dt == CT_BF16 ? 2.5e-2 : 4e-3;
    expect_near(c.out, out, nq, tol);
    expect_near(c.dq, dq, nq, 2 * tol);
    expect_near(c.dk, dk, nk, 2 * tol);
    expect_near(c.dv, dv, nk, 2 * tol);
    release_case(&c);
    free(c.q);
    free(c.k);
    free(c.v);
    free(c.g);
    free(out);
    free(dq);
    free(dk);
    free(dv);
    if (!traced)
        fail_msg("the %s path did not run for B %lld H %lld T %lld S %lld D %lld %s%s",
                 path == P_CUDNN ? "cuDNN" : path == P_MMA ? "tensor-core flash" : "scalar flash",
                 (long long)s->B, (long long)s->H,
                 (long long)s->T, (long long)s->S, (long long)s->D, ct_dtype_name(dt),
                 causal ? " causal" : "");
}

static const shape cudnn_shapes[] = {
    {2, 3, 128, 128, 64},
    {1, 2, 64, 256, 32},
    {1, 1, 192, 128, 128},
};

static void test_cudnn_path(void **state) {
    (void)state;
    NEED_GPU();
    static const ct_dtype dts[] = {CT_BF16, CT_F16};
    for (size_t i = 0; i < sizeof cudnn_shapes / sizeof cudnn_shapes[0]; i++)
        for (int d = 0; d < 2; d++)
            for (int causal = 0; causal < 2; causal++)
                check_shape(&cudnn_shapes[i], dts[d], causal, i == 0, P_CUDNN);
}

static void test_flash_path_same_shapes(void **state) {
    (void)state;
    NEED_GPU();
    static const ct_dtype dts[] = {CT_BF16, CT_F16};
    for (size_t i = 0; i < sizeof cudnn_shapes / sizeof cudnn_shapes[0]; i++)
        for (int d = 0; d < 2; d++)
            for (int causal = 0; causal < 2; causal++)
                for (int path = P_MMA; path <= P_SCALAR; path++)
                    check_shape(&cudnn_shapes[i], dts[d], causal, i == 0, path);
}

/* The flash kernels on shapes cuDNN never takes: odd T and S, head dims
 * that are not multiples of 16 (the tensor-core kernels pad them) and above
 * 64 (their wide instances), one row, one key. */
static void test_flash_path_odd_shapes(void **state) {
    (void)state;
    NEED_GPU();
    static const shape odd[] = {
        {1, 2, 67, 45, 40}, {2, 1, 1, 1, 8}, {1, 3, 130, 7, 1}, {1, 1, 33, 100, 128},
        {1, 2, 70, 129, 72},
    };
    static const ct_dtype dts[] = {CT_BF16, CT_F16};
    for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++)
        for (int d = 0; d < 2; d++)
            for (int causal = 0; causal < 2; causal++)
                for (int path = P_MMA; path <= P_SCALAR; path++)
                    check_shape(&odd[i], dts[d], causal, i == 0, path);
}

/* Where cuDNN does not apply (T not a multiple of 64), the flash kernels
 * run even with cuDNN allowed. */
static void test_fallback(void **state) {
    (void)state;
    NEED_GPU();
    shape s = {1, 2, 67, 128, 64};
    int64_t nq = s.B * s.H * s.T * s.D, nk = s.B * s.H * s.S * s.D;
    fb_case c = {.s = &s, .dt = CT_BF16, .causal = true};
    c.q = tu_rand_vals(nq, CT_BF16, -1, 1);
    c.k = tu_rand_vals(nk, CT_BF16, -1, 1);
    c.v = tu_rand_vals(nk, CT_BF16, -1, 1);
    c.g = tu_rand_vals(nq, CT_BF16, -1, 1);
    double *out = malloc((size_t)nq * 8);
    reference(&s, true, 1 / sqrt((double)s.D), c.q, c.k, c.v, NULL, out, NULL, NULL, NULL);
    bool traced = trace_says(run_case, &c, "flash_fwd", "flash_bwd");
    expect_near(c.out, out, nq, 2.5e-2);
    release_case(&c);
    free(c.q);
    free(c.k);
    free(c.v);
    free(c.g);
    free(out);
    assert_true(traced);
}

int main(void) {
    tu_seed();
    cti_init();
    ngpu = tu_cuda_devices_or_skip("cuda_attention_cudnn");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_cudnn_path),
        T(test_flash_path_same_shapes),
        T(test_flash_path_odd_shapes),
        T(test_fallback),
    };
#undef T
    return tu_run_tests(tests);
}
