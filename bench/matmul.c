/* ct_matmul against cblas_sgemm called directly, in the same process, on
 * square f32 matrices.
 *
 * Both sides use the same OpenBLAS with the same kernels: cten's init (run
 * by the first ct_matmul, before any timing) already switched OpenBLAS to
 * the best kernels for this CPU, so the direct call is OpenBLAS at its best
 * and the ratio shows only what cten adds (checks, output allocation,
 * dispatch). Calls alternate between the two so that machine noise hits
 * both alike; each side reports the median of its repeats.
 *
 *   bench_matmul [repeat-scale]   (default 1; 2 doubles the repeats) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cblas.h>

#include "tensor/tensor.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Uniform values in [-1, 1) from a fixed-seed LCG, so runs are comparable. */
static void fill_random(float *x, size_t n, uint64_t *state) {
    for (size_t i = 0; i < n; i++) {
        *state = *state * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(*state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
    }
}

/* Times one size; returns 0 on success. */
static int bench_size(int64_t n, int reps) {
    size_t nn = (size_t)(n * n);
    float *ha = malloc(nn * sizeof *ha), *hb = malloc(nn * sizeof *hb);
    /* 64-byte aligned like cten's tensors, so neither side gains from alignment */
    float *hc = aligned_alloc(64, (nn * sizeof(float) + 63) / 64 * 64);
    double *t_ct = malloc((size_t)reps * sizeof *t_ct);
    double *t_blas = malloc((size_t)reps * sizeof *t_blas);
    if (!ha || !hb || !hc || !t_ct || !t_blas) {
        fprintf(stderr, "bench_matmul: out of memory\n");
        return 1;
    }
    uint64_t state = 0x5eed + (uint64_t)n;
    fill_random(ha, nn, &state);
    fill_random(hb, nn, &state);
    ct_tensor *a = ct_tensor_from_data(ha, CT_F32, CT_SHAPE(n, n));
    ct_tensor *b = ct_tensor_from_data(hb, CT_F32, CT_SHAPE(n, n));
    if (!a || !b) {
        fprintf(stderr, "bench_matmul: %s\n", ct_last_error());
        return 1;
    }
    const int in = (int)n;
    /* the direct call reads the very buffers ct_matmul reads */
    const float *pa = ct_tensor_data_ptr(a), *pb = ct_tensor_data_ptr(b);

    /* warm-up, and a check that both compute the same product */
    for (int w = 0; w < 2; w++) {
        ct_tensor *c = ct_matmul(a, b);
        if (!c) {
            fprintf(stderr, "bench_matmul: %s\n", ct_last_error());
            return 1;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, in, in, 1.0f, pa, in, pb, in,
                    0.0f, hc, in);
        const float *pc = ct_tensor_data_ptr(c);
        double maxdiff = 0;
        for (size_t i = 0; i < nn; i++) maxdiff = fmax(maxdiff, fabs((double)pc[i] - hc[i]));
        ct_tensor_release(c);
        if (maxdiff > 1e-3 * sqrt((double)n)) {
            fprintf(stderr, "bench_matmul: results differ by %g at n = %lld\n", maxdiff,
                    (long long)n);
            return 1;
        }
    }

    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        ct_tensor *c = ct_matmul(a, b);
        double t1 = now_s();
        ct_tensor_release(c);
        double t2 = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, in, in, in, 1.0f, pa, in, pb, in,
                    0.0f, hc, in);
        double t3 = now_s();
        t_ct[r] = t1 - t0;
        t_blas[r] = t3 - t2;
    }
    double flop = 2.0 * (double)n * (double)n * (double)n;
    double g_ct = flop / median(t_ct, reps) / 1e9, g_blas = flop / median(t_blas, reps) / 1e9;
    printf("%6lld %6d %12.1f %12.1f %8.3f\n", (long long)n, reps, g_ct, g_blas, g_ct / g_blas);

    ct_tensor_release(a);
    ct_tensor_release(b);
    free(ha);
    free(hb);
    free(hc);
    free(t_ct);
    free(t_blas);
    return 0;
}

int main(int argc, char **argv) {
    double scale = argc > 1 ? atof(argv[1]) : 1.0;
    if (!(scale > 0)) scale = 1.0;
    static const struct {
        int64_t n;
        int reps;
    } sizes[] = {{256, 401}, {1024, 41}, {2048, 15}};

    /* The first op initializes cten, which picks OpenBLAS's kernels. */
    ct_tensor *warm = ct_tensor_zeros(CT_SHAPE(2, 2), CT_F32, CT_CPU);
    ct_tensor *w2 = warm ? ct_matmul(warm, warm) : NULL;
    if (!w2) {
        fprintf(stderr, "bench_matmul: %s\n", ct_last_error());
        return 1;
    }
    ct_tensor_release(w2);
    ct_tensor_release(warm);

    printf("BLAS: %s\n", ct_blas_info());
    printf("threads: %d\n", ct_get_num_threads());
    printf("f32 square matmul, GFLOP/s (median), ct_matmul vs cblas_sgemm direct\n");
    printf("%6s %6s %12s %12s %8s\n", "n", "reps", "ct_matmul", "cblas_sgemm", "ratio");
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        int reps = (int)(sizes[i].reps * scale) | 1;
        if (bench_size(sizes[i].n, reps) != 0) return 1;
    }
    return 0;
}
