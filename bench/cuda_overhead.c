/* The CUDA path's fixed cost and its memory ceiling:
 *   - ct_add on two 1-element float32 tensors on the GPU, result allocated
 *     from the caching allocator and released: median ns per op over
 *     batches, each batch ending with ct_cuda_synchronize (the GPU's time
 *     is included once the launch queue is full);
 *   - device-to-device copy bandwidth of 256M float32 (1 GiB) through
 *     cudaMemcpy, the ceiling every memory-bound kernel is measured against,
 *     next to ct_copy_ (same dtype) and a float32 -> bfloat16 conversion
 *     through the library.
 * Skips (exit 0, a line saying why) without a GPU or without a CUDA add
 * kernel. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_overhead"
#include "cuda_bench.h"

#define BATCHES 7
#define CALLS 100000
#define REPS 10

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_cuda_overhead: %s: %s\n", what, ct_last_error());
    return 1;
}

/* Median GB/s of cudaMemcpy device to device over nbytes (read + written). */
static int memcpy_ceiling(size_t nbytes, double *gbs) {
    void *a = NULL, *b = NULL;
    cudaEvent_t t0, t1;
    if (cudaMalloc(&a, nbytes) != cudaSuccess || cudaMalloc(&b, nbytes) != cudaSuccess) {
        fprintf(stderr, "bench_cuda_overhead: cudaMalloc of 2 x %zu bytes failed\n", nbytes);
        cudaFree(a);
        return 1;
    }
    cudaEventCreate(&t0);
    cudaEventCreate(&t1);
    cudaMemset(a, 1, nbytes);
    cudaMemcpy(b, a, nbytes, cudaMemcpyDeviceToDevice); /* warm up */
    double rate[REPS];
    for (int r = 0; r < REPS; r++) {
        float ms = 0;
        cudaEventRecord(t0, 0);
        cudaMemcpy(b, a, nbytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(t1, 0);
        cudaEventSynchronize(t1);
        cudaEventElapsedTime(&ms, t0, t1);
        rate[r] = 2.0 * (double)nbytes / (ms * 1e-3) / 1e9;
    }
    *gbs = median(rate, REPS);
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    return cudaGetLastError() == cudaSuccess ? 0 : 1;
}

/* Median GB/s of ct_copy_(dst, src) (bytes read + written). */
static int api_copy(ct_tensor *dst, ct_tensor *src, double *gbs) {
    double bytes = (double)ct_tensor_numel(dst) *
                   (double)(ct_dtype_size(ct_tensor_dtype(dst)) + ct_dtype_size(ct_tensor_dtype(src)));
    if (ct_copy_(dst, src) != CT_OK || ct_cuda_synchronize(0) != CT_OK) return fail("ct_copy_");
    double rate[REPS];
    for (int r = 0; r < REPS; r++) {
        double t = now_s();
        if (ct_copy_(dst, src) != CT_OK || ct_cuda_synchronize(0) != CT_OK) return fail("ct_copy_");
        rate[r] = bytes / (now_s() - t) / 1e9;
    }
    *gbs = median(rate, REPS);
    return 0;
}

static int bandwidth(void) {
    const int64_t n = (int64_t)1 << 28;
    double ceiling, same, conv;
    if (memcpy_ceiling((size_t)n * 4, &ceiling)) return 1;
    printf("cudaMemcpy D2D, 256M float32 (1 GiB): %.0f GB/s (read + write, median of %d)\n",
           ceiling, REPS);
    ct_tensor *a = ct_tensor_ones(1, &n, CT_F32, CT_CUDA(0));
    ct_tensor *b = ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0));
    ct_tensor *h = ct_tensor_empty(1, &n, CT_BF16, CT_CUDA(0));
    if (!a || !b || !h) return fail("allocating 256M-element tensors");
    if (api_copy(b, a, &same) || api_copy(h, a, &conv)) return 1;
    printf("ct_copy_ float32 -> float32, 256M: %.0f GB/s (%.1f%% of cudaMemcpy)\n", same,
           100 * same / ceiling);
    printf("ct_copy_ float32 -> bfloat16, 256M: %.0f GB/s (%.1f%% of cudaMemcpy)\n", conv,
           100 * conv / ceiling);
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(h);
    ct_cuda_empty_cache(0);
    return 0;
}

static int overhead(void) {
    if (!ct_supports(CT_OP_ADD, CT_DEVICE_CUDA, CT_F32)) {
        printf("ct_add 1-element overhead: skipped (no CUDA kernel for add float32 yet)\n");
        return 0;
    }
    float va = 1.5f, vb = 2.25f;
    ct_tensor *a = ct_tensor_from_data_on(&va, CT_F32, CT_SHAPE(1), CT_CUDA(0));
    ct_tensor *b = ct_tensor_from_data_on(&vb, CT_F32, CT_SHAPE(1), CT_CUDA(0));
    if (!a || !b) return fail("creating the operands");
    for (int i = 0; i < 1000; i++) ct_tensor_release(ct_add(a, b)); /* warm up, fill the cache */
    ct_cuda_memstats m0, m1;
    ct_cuda_memory_stats(0, &m0);
    double ns[BATCHES];
    for (int k = 0; k < BATCHES; k++) {
        double t0 = now_s();
        for (int i = 0; i < CALLS; i++) {
            ct_tensor *c = ct_add(a, b);
            if (!c) return fail("ct_add");
            ct_tensor_release(c);
        }
        if (ct_cuda_synchronize(0) != CT_OK) return fail("ct_cuda_synchronize");
        ns[k] = (now_s() - t0) * 1e9 / CALLS;
    }
    ct_cuda_memory_stats(0, &m1);
    double lo = ns[0], hi = ns[0];
    for (int k = 1; k < BATCHES; k++) {
        lo = ns[k] < lo ? ns[k] : lo;
        hi = ns[k] > hi ? ns[k] : hi;
    }
    printf("ct_add, two 1-element float32 CUDA tensors, result from the cache: %.1f ns/op "
           "(median of %d batches of %d calls; min %.1f, max %.1f; cudaMalloc calls during "
           "the run: %llu)\n",
           median(ns, BATCHES), BATCHES, CALLS, lo, hi,
           (unsigned long long)(m1.num_mallocs - m0.num_mallocs));
    ct_tensor_release(a);
    ct_tensor_release(b);
    return 0;
}

/* The floor under any op: the library's smallest kernel (a 1-element fill)
 * launched straight on the op stream, with no front end, allocation or
 * dispatch around it. */
static int launch_floor(void) {
    float v = 0.0f;
    ct_tensor *t = ct_tensor_zeros(CT_SHAPE(1), CT_F32, CT_CUDA(0));
    if (!t) return fail("creating the tensor");
    cti_cuda_iter it;
    cti_cuda_iter_init(&it, 1, &t);
    cudaStream_t stream;
    if (cti_cuda_begin("bench", 0, &stream) != CT_OK) return fail("cti_cuda_begin");
    int sm = cti_cuda_sm_count(0);
    void *p = ct_tensor_data_ptr(t);
    for (int i = 0; i < 1000; i++) cti_cuda_fill(p, 4, &v, &it, sm, stream);
    double ns[BATCHES];
    for (int k = 0; k < BATCHES; k++) {
        double t0 = now_s();
        for (int i = 0; i < CALLS; i++)
            if (cti_cuda_fill(p, 4, &v, &it, sm, stream) != cudaSuccess) return fail("launch");
        if (ct_cuda_synchronize(0) != CT_OK) return fail("ct_cuda_synchronize");
        ns[k] = (now_s() - t0) * 1e9 / CALLS;
    }
    printf("floor: one 1-element fill kernel launched directly: %.1f ns/launch (median of %d "
           "batches of %d)\n",
           median(ns, BATCHES), BATCHES, CALLS);
    for (int k = 0; k < BATCHES; k++) {
        double t0 = now_s();
        for (int i = 0; i < CALLS; i++) ct_tensor_release(ct_tensor_empty(CT_SHAPE(1), CT_F32, CT_CUDA(0)));
        ns[k] = (now_s() - t0) * 1e9 / CALLS;
    }
    printf("part: ct_tensor_empty + release of a 1-element CUDA tensor (cached): %.1f ns\n",
           median(ns, BATCHES));
    ct_tensor_release(t);
    return 0;
}

int main(void) {
    if (ct_cuda_device_count() == 0) {
        ct_cuda_device_props p;
        ct_cuda_get_device_properties(0, &p);
        printf("bench_cuda_overhead: skipped: %s\n", ct_last_error());
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return fail("device properties");
    printf("device: %s (%d SMs, %.0f GiB)\n", p.name, p.multiprocessors,
           (double)p.total_memory / (1 << 30));
    if (overhead() || launch_floor()) return 1;
    return bandwidth();
}
