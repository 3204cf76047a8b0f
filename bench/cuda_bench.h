/* What the single-purpose GPU benches (bench/cuda_*.c) share: the median of
 * the repeats, an error exit naming the bench, and the time between two CUDA
 * events. Each bench defines BENCH_NAME before including it; the header
 * keeps every bench one source file. */
#ifndef CTEN_BENCH_CUDA_BENCH_H
#define CTEN_BENCH_CUDA_BENCH_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef BENCH_NAME
#error "define BENCH_NAME before including cuda_bench.h"
#endif

static inline int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts v and returns its median (the upper one for even n). */
static inline double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof v[0], cmp_double);
    return v[n / 2];
}

/* Prints "BENCH_NAME: what: why" and returns the bench's failure status. */
static inline int die(const char *what, const char *why) {
    fprintf(stderr, BENCH_NAME ": %s: %s\n", what, why);
    return 1;
}

#define CUDA_OK(call)                                                      \
    do {                                                                   \
        cudaError_t e_ = (call);                                           \
        if (e_ != cudaSuccess) return die(#call, cudaGetErrorString(e_)); \
    } while (0)

typedef struct timer {
    cudaStream_t stream;
    cudaEvent_t start, stop;
} timer;

/* Milliseconds between the two events after waiting for the second. */
static inline int elapsed(timer *t, double *ms) {
    float f = 0;
    CUDA_OK(cudaEventSynchronize(t->stop));
    CUDA_OK(cudaEventElapsedTime(&f, t->start, t->stop));
    *ms = f;
    return 0;
}

#endif
