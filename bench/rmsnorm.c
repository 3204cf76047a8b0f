/* RMSNorm forward on the CPU against the memory bound: ct_rms_norm of an
 * R x D float32 tensor reads x once from memory and writes y once, as a memcpy
 * of the same bytes does. They are timed alternately in one run (so clock and
 * memory state drift hit all alike) and their medians compared; then the
 * forward + backward time.
 *
 * ct_rms_norm returns a new tensor; after the first call its output comes
 * from cten's cache of large CPU blocks, so it pays no first-touch page
 * faults. Two memcpy baselines (glibc's, one thread) bracket it: into a
 * buffer malloc'd for each copy (fresh pages) and into one reused,
 * already-faulted buffer (the pure memory bound).
 *
 * With "reuse" as 4th argument, glibc is told to serve large blocks from its
 * heap and keep freed memory (mallopt), so each ct_rms_norm output reuses
 * already-faulted pages: this isolates the kernel from the page faults.
 *
 * usage: bench_rmsnorm [rows [cols [reps [reuse]]]]   (default 4096 4096 21) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

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
    fprintf(stderr, "bench_rmsnorm: %s: %s\n", what, ct_last_error());
    return 1;
}

int main(int argc, char **argv) {
    int64_t rows = argc > 1 ? atoll(argv[1]) : 4096;
    int64_t cols = argc > 2 ? atoll(argv[2]) : 4096;
    int reps = argc > 3 ? atoi(argv[3]) : 21;
    if (rows < 1 || cols < 1 || reps < 1) {
        fprintf(stderr, "usage: bench_rmsnorm [rows [cols [reps]]]\n");
        return 2;
    }
    bool reuse = argc > 4 && strcmp(argv[4], "reuse") == 0;
#ifdef __GLIBC__
    if (reuse) {
        mallopt(M_MMAP_MAX, 0);
        mallopt(M_TRIM_THRESHOLD, 1 << 30);
    }
#else
    reuse = false;
#endif
    int64_t shape[2] = {rows, cols};
    ct_generator *gen = ct_generator_new(1);
    ct_tensor *x = ct_tensor_randn(gen, 2, shape, CT_F32, CT_CPU);
    ct_tensor *w = ct_tensor_randn(gen, 1, shape + 1, CT_F32, CT_CPU);
    ct_tensor *g = ct_tensor_randn(gen, 2, shape, CT_F32, CT_CPU);
    if (!x || !w || !g) return fail("inputs");
    size_t bytes = (size_t)(rows * cols) * sizeof(float);
    char *dst = malloc(bytes);
    if (!dst) return fail("memcpy buffer");
    memset(dst, 1, bytes); /* fault the pages in once, as a reused buffer would be */
    const void *src = ct_tensor_data_ptr(x);

    double *t_rms = malloc(sizeof(double) * (size_t)reps), *t_cpy = malloc(sizeof(double) * (size_t)reps);
    double *t_fb = malloc(sizeof(double) * (size_t)reps);
    double *t_fresh = malloc(sizeof(double) * (size_t)reps);
    if (!t_rms || !t_cpy || !t_fb || !t_fresh) return fail("timing buffers");
    volatile unsigned char sink = 0;
    for (int warm = 0; warm < 3; warm++) {
        ct_tensor *y = ct_rms_norm(x, 1, shape + 1, w, 1e-6, NULL);
        if (!y) return fail("ct_rms_norm");
        ct_tensor_release(y);
        memcpy(dst, src, bytes);
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        ct_tensor *y = ct_rms_norm(x, 1, shape + 1, w, 1e-6, NULL);
        double t1 = now_s();
        if (!y) return fail("ct_rms_norm");
        ct_tensor_release(y);
        double t2 = now_s();
        memcpy(dst, src, bytes);
        double t3 = now_s();
        char *fresh = malloc(bytes);
        if (!fresh) return fail("fresh buffer");
        memcpy(fresh, src, bytes);
        double t4 = now_s();
        sink ^= (unsigned char)(fresh[r] ^ dst[bytes - 1 - (size_t)r]);
        free(fresh);
        t_rms[r] = t1 - t0;
        t_cpy[r] = t3 - t2;
        t_fresh[r] = t4 - t3;
    }
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        ct_tensor *inv = NULL, *dx = NULL, *dw = NULL;
        ct_tensor *y = ct_rms_norm(x, 1, shape + 1, w, 1e-6, &inv);
        if (!y || ct_rms_norm_backward(g, x, w, inv, &dx, &dw) != CT_OK)
            return fail("forward + backward");
        double t1 = now_s();
        ct_tensor_release(y), ct_tensor_release(inv), ct_tensor_release(dx), ct_tensor_release(dw);
        t_fb[r] = t1 - t0;
    }
    double mr = median(t_rms, reps), mc = median(t_cpy, reps), mf = median(t_fb, reps);
    double mfr = median(t_fresh, reps);
    double gb = 2.0 * (double)bytes / 1e9; /* read + write */
    printf("rms_norm [%lld, %lld] float32, %d threads, %d reps (medians), %s\n", (long long)rows,
           (long long)cols, ct_get_num_threads(), reps,
           reuse ? "outputs reuse freed heap memory" : "outputs from cten's block cache");
    printf("  ct_rms_norm          %8.3f ms  %6.2f GB/s\n", mr * 1e3, gb / mr);
    printf("  memcpy, reused dst   %8.3f ms  %6.2f GB/s\n", mc * 1e3, gb / mc);
    printf("  malloc+memcpy fresh  %8.3f ms  %6.2f GB/s\n", mfr * 1e3, gb / mfr);
    printf("  ratio rms / memcpy reused dst  %6.3f\n", mr / mc);
    printf("  ratio rms / memcpy fresh dst   %6.3f\n", mr / mfr);
    printf("  forward + backward   %8.3f ms\n", mf * 1e3);
    free(t_rms), free(t_cpy), free(t_fb), free(t_fresh), free(dst);
    ct_tensor_release(x), ct_tensor_release(w), ct_tensor_release(g);
    ct_generator_free(gen);
    return sink == 0x5a ? 0 : 0; /* reads sink so that the copies are kept */
}
