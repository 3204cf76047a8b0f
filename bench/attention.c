/* Scaled dot-product attention on the CPU: ct_scaled_dot_product_attention
 * forward, and forward + backward (through autograd, gradients of q, k and
 * v), of float32 q, k, v [B, H, T, D] uniform in [-1, 1). Prints the median
 * time of each over reps timed calls after warm-up calls, as one line
 *   cten fwd_ms <median> fwdbwd_ms <median>
 * which bench/torch_attention.py reads when it alternates this program with
 * its PyTorch twin (the math path of PyTorch 1.13, which has no fused op).
 *
 * usage: bench_attention [B H T D causal reps warmup]   (default 4 8 512 64 1 10 3) */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "tensor/tensor.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int fail(const char *what) {
    fprintf(stderr, "bench_attention: %s: %s\n", what, ct_last_error());
    return 1;
}

/* One call; with bwd, its backward from a gradient of ones too. */
static int step(ct_tensor *q, ct_tensor *k, ct_tensor *v, ct_tensor *g, bool causal, bool bwd) {
    ct_tensor *o = ct_scaled_dot_product_attention(q, k, v, NULL, 0, causal, 0, NULL);
    if (!o) return fail("forward");
    if (bwd) {
        if (ct_backward(o, g, false) != CT_OK) return fail("backward");
        ct_zero_grad(q);
        ct_zero_grad(k);
        ct_zero_grad(v);
    }
    ct_tensor_release(o);
    return 0;
}

int main(int argc, char **argv) {
    int64_t B = argc > 1 ? atoll(argv[1]) : 4, H = argc > 2 ? atoll(argv[2]) : 8;
    int64_t T = argc > 3 ? atoll(argv[3]) : 512, D = argc > 4 ? atoll(argv[4]) : 64;
    bool causal = argc > 5 ? atoi(argv[5]) != 0 : true;
    int reps = argc > 6 ? atoi(argv[6]) : 10, warm = argc > 7 ? atoi(argv[7]) : 3;
    if (B < 1 || H < 1 || T < 1 || D < 1 || reps < 1 || warm < 0) {
        fprintf(stderr, "usage: bench_attention [B H T D causal reps warmup]\n");
        return 2;
    }
    int64_t s[4] = {B, H, T, D};
    ct_generator *gen = ct_generator_new(1);
    ct_tensor *q = ct_tensor_rand(gen, 4, s, CT_F32, CT_CPU);
    ct_tensor *k = ct_tensor_rand(gen, 4, s, CT_F32, CT_CPU);
    ct_tensor *v = ct_tensor_rand(gen, 4, s, CT_F32, CT_CPU);
    ct_tensor *g = ct_tensor_ones(4, s, CT_F32, CT_CPU);
    if (!q || !k || !v || !g) return fail("inputs");
    ct_tensor *in[3] = {q, k, v};
    for (int i = 0; i < 3; i++) {
        /* uniform in [-1, 1), as the twin's */
        if (ct_uniform_(in[i], -1, 1, gen) != CT_OK) return fail("uniform");
        if (ct_requires_grad_(in[i], true) != CT_OK) return fail("requires_grad");
    }
    double *tf = malloc(sizeof(double) * (size_t)reps), *tb = malloc(sizeof(double) * (size_t)reps);
    for (int i = 0; i < warm; i++)
        if (step(q, k, v, g, causal, false) || step(q, k, v, g, causal, true)) return 1;
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        if (step(q, k, v, g, causal, false)) return 1;
        double t1 = now_s();
        if (step(q, k, v, g, causal, true)) return 1;
        double t2 = now_s();
        tf[i] = (t1 - t0) * 1e3;
        tb[i] = (t2 - t1) * 1e3;
    }
    printf("cten fwd_ms %.4f fwdbwd_ms %.4f\n", median(tf, reps), median(tb, reps));
    free(tf);
    free(tb);
    ct_tensor *rel[] = {q, k, v, g};
    for (int i = 0; i < 4; i++) ct_tensor_release(rel[i]);
    ct_generator_free(gen);
    return 0;
}
