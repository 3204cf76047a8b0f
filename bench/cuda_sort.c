/* GPU sort and topk against PyTorch's (bench/torch_cuda_sort.py times the
 * same cases the same way): ct_sort (values and int64 indices), ct_argsort
 * and ct_topk on
 *   - many short rows: 4096 x 1024 f32, bf16 and int64, 16384 x 128 f32
 *     (the shared-memory block sort);
 *   - a few long rows: 1 x 16M f32 (the device-wide radix sort), 16 x 1M f32
 *     (the segmented one);
 *   - topk: 4096 x 1024 k 50, 64 x 50304 k 50 (sampling), 1 x 16M k 100.
 * Each case is timed with CUDA events around one call on the library's
 * stream: the median of REPS after WARMUP, in ms, and the elements sorted
 * (or scanned) per second. The target: within 1.5x of PyTorch's
 * time in the same run. Skips (exit 0, a line saying why) without a GPU. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_sort"
#include "cuda_bench.h"

#define REPS 20
#define WARMUP 3

static cudaStream_t stream;
static cudaEvent_t ev_start, ev_stop;

enum { K_SORT, K_ARGSORT, K_TOPK };

typedef struct scase {
    const char *what;
    int kind;
    ct_dtype dt;
    int64_t rows, cols, k;
} scase;

static ct_status run_once(const scase *c, ct_tensor *x) {
    ct_tensor *idx = NULL, *y = NULL;
    switch (c->kind) {
    case K_SORT: y = ct_sort(x, -1, false, false, &idx); break;
    case K_ARGSORT: y = ct_argsort(x, -1, false, false); break;
    default: y = ct_topk(x, c->k, -1, true, true, &idx); break;
    }
    ct_status st = y ? CT_OK : ct_last_status();
    ct_tensor_release(y);
    ct_tensor_release(idx);
    return st;
}

/* Random input of the case's dtype on the GPU (integers: uniform in a range
 * that leaves ties, as token ids would). */
static ct_tensor *input(const scase *c) {
    int64_t shape[2] = {c->rows, c->cols};
    ct_tensor *f = ct_tensor_randn(NULL, 2, shape, CT_F32, CT_CUDA(0));
    if (!f || c->dt == CT_F32) return f;
    ct_tensor *g = c->dt == CT_I64 ? ct_mul_scalar(f, 1e6) : ct_tensor_retain(f);
    ct_tensor *t = g ? ct_to_dtype(g, c->dt) : NULL;
    ct_tensor_release(g);
    ct_tensor_release(f);
    return t;
}

static int bench_case(const scase *c) {
    ct_tensor *x = input(c);
    if (!x) return die(c->what, ct_last_error());
    double t[REPS];
    for (int r = -WARMUP; r < REPS; r++) {
        CUDA_OK(cudaEventRecord(ev_start, stream));
        if (run_once(c, x) != CT_OK) return die(c->what, ct_last_error());
        CUDA_OK(cudaEventRecord(ev_stop, stream));
        CUDA_OK(cudaEventSynchronize(ev_stop));
        float f = 0;
        CUDA_OK(cudaEventElapsedTime(&f, ev_start, ev_stop));
        if (r >= 0) t[r] = f;
    }
    double ms = median(t, REPS), n = (double)c->rows * (double)c->cols;
    printf("%-36s %9.3f ms %8.2f Gelem/s\n", c->what, ms, n / (ms * 1e-3) / 1e9);
    ct_tensor_release(x);
    if (ct_cuda_empty_cache(0) != CT_OK) return die("empty_cache", ct_last_error());
    return 0;
}

int main(void) {
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_sort: skipped, no usable GPU\n");
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return die("properties", ct_last_error());
    printf("bench_cuda_sort on %s (%d SMs): median of %d after %d warm-up, one call per "
           "interval\n",
           p.name, p.multiprocessors, REPS, WARMUP);
    if (cti_cuda_begin(BENCH_NAME, 0, &stream) != CT_OK) return die("stream", ct_last_error());
    CUDA_OK(cudaEventCreate(&ev_start));
    CUDA_OK(cudaEventCreate(&ev_stop));
    static const scase cases[] = {
        {"sort 4096x1024 f32", K_SORT, CT_F32, 4096, 1024, 0},
        {"sort 4096x1024 bf16", K_SORT, CT_BF16, 4096, 1024, 0},
        {"sort 4096x1024 int64", K_SORT, CT_I64, 4096, 1024, 0},
        {"sort 16384x128 f32", K_SORT, CT_F32, 16384, 128, 0},
        {"argsort 4096x1024 f32", K_ARGSORT, CT_F32, 4096, 1024, 0},
        {"sort 1x16M f32", K_SORT, CT_F32, 1, 1 << 24, 0},
        {"sort 16x1M f32", K_SORT, CT_F32, 16, 1 << 20, 0},
        {"topk 4096x1024 k50 f32", K_TOPK, CT_F32, 4096, 1024, 50},
        {"topk 64x50304 k50 f32", K_TOPK, CT_F32, 64, 50304, 50},
        {"topk 1x16M k100 f32", K_TOPK, CT_F32, 1, 1 << 24, 100},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (bench_case(&cases[i])) return 1;
    printf("\nTarget: each case within 1.5x of PyTorch's time (bench/torch_cuda_sort.py) in the "
           "same run\n");
    cudaEventDestroy(ev_start);
    cudaEventDestroy(ev_stop);
    return 0;
}
