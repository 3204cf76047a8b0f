/* Scaled dot-product attention on the GPU, the shape of a GPT-2-small layer
 * at batch 16: q, k, v [16, 12, 1024, 64], causal, no dropout.
 *   - forward: ct_scaled_dot_product_attention (no grad), timed with CUDA
 *     events around one call; median ms and TFLOP/s (4 T S D flops a
 *     (b, h), halved for causal);
 *   - forward + backward through autograd: q, k, v require grad,
 *     ct_backward with a given grad;
 * in bfloat16 through the default dispatch (cuDNN's fused attention where it
 * takes the call) and through the flash kernels of attention.cu
 * (CT_CUDA_SDPA_CUDNN=0), and in float32 (flash kernels only), each once
 * with the trace on (one forward + backward, routine names on stderr) so the
 * log says which kernels ran.
 * bench/torch_cuda_attention.py prints the same cases for PyTorch's SDPA
 * backends. Skips (exit 0, a line saying why) without a GPU. */
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_attention"
#include "cuda_bench.h"

#define B 16
#define H 12
#define T 1024
#define D 64
#define REPS 25
#define WARMUP 3

static cudaStream_t stream;
static cudaEvent_t ev_start, ev_stop;

enum { K_FWD, K_FWD_BWD };

typedef struct bench_in {
    ct_tensor *q, *k, *v, *g;
    ct_tensor *qa, *ka, *va; /* leaves that require grad */
} bench_in;

static int run_once(const bench_in *in, int kind) {
    if (kind == K_FWD) {
        ct_tensor *y = ct_scaled_dot_product_attention(in->q, in->k, in->v, NULL, 0.0, true, 0.0,
                                                       NULL);
        if (!y) return die("forward", ct_last_error());
        ct_tensor_release(y);
        return 0;
    }
    ct_zero_grad(in->qa);
    ct_zero_grad(in->ka);
    ct_zero_grad(in->va);
    ct_tensor *y =
        ct_scaled_dot_product_attention(in->qa, in->ka, in->va, NULL, 0.0, true, 0.0, NULL);
    if (!y) return die("forward (autograd)", ct_last_error());
    if (ct_backward(y, in->g, false) != CT_OK) return die("ct_backward", ct_last_error());
    ct_tensor_release(y);
    return 0;
}

/* Median milliseconds of one run of each of the nk kinds, timed in
 * alternation. */
static int time_kinds(const bench_in *in, int nk, const int *kinds, double *ms) {
    double t[2][REPS];
    for (int r = -WARMUP; r < REPS; r++)
        for (int k = 0; k < nk; k++) {
            CUDA_OK(cudaEventRecord(ev_start, stream));
            if (run_once(in, kinds[k])) return 1;
            CUDA_OK(cudaEventRecord(ev_stop, stream));
            CUDA_OK(cudaEventSynchronize(ev_stop));
            float f = 0;
            CUDA_OK(cudaEventElapsedTime(&f, ev_start, ev_stop));
            if (r >= 0) t[k][r] = f;
        }
    for (int k = 0; k < nk; k++) ms[k] = median(t[k], REPS);
    return 0;
}

static ct_tensor *leaf(ct_tensor *t) {
    ct_tensor *l = ct_detach(t);
    if (l && ct_requires_grad_(l, true) != CT_OK) {
        ct_tensor_release(l);
        return NULL;
    }
    return l;
}

/* path: "cudnn" (the default dispatch) or "flash" (CT_CUDA_SDPA_CUDNN=0). */
static int bench_one(ct_dtype dt, const char *path) {
    if (strcmp(path, "flash") == 0) setenv("CT_CUDA_SDPA_CUDNN", "0", 1);
    else unsetenv("CT_CUDA_SDPA_CUDNN");
    bench_in in = {0};
    in.q = ct_tensor_randn(NULL, CT_SHAPE(B, H, T, D), dt, CT_CUDA(0));
    in.k = ct_tensor_randn(NULL, CT_SHAPE(B, H, T, D), dt, CT_CUDA(0));
    in.v = ct_tensor_randn(NULL, CT_SHAPE(B, H, T, D), dt, CT_CUDA(0));
    in.g = ct_tensor_randn(NULL, CT_SHAPE(B, H, T, D), dt, CT_CUDA(0));
    if (!in.q || !in.k || !in.v || !in.g) return die("allocating the inputs", ct_last_error());
    in.qa = leaf(in.q);
    in.ka = leaf(in.k);
    in.va = leaf(in.v);
    if (!in.qa || !in.ka || !in.va) return die("leaves", ct_last_error());

    /* one traced forward + backward: the routine names go to stderr */
    ct_set_trace(true);
    int bad = run_once(&in, K_FWD_BWD);
    ct_set_trace(false);
    if (bad) return 1;

    int kinds[2] = {K_FWD, K_FWD_BWD};
    double ms[2];
    if (time_kinds(&in, 2, kinds, ms)) return 1;
    double flops = 4.0 * B * H * (double)T * T * D / 2; /* causal: half the scores */
    const char *dn = ct_dtype_name(dt);
    printf("sdpa causal %-8s %-6s forward             %8.3f ms %7.1f TFLOP/s\n", dn, path,
           ms[0], flops / (ms[0] * 1e-3) / 1e12);
    printf("sdpa causal %-8s %-6s fwd+bwd (autograd)  %8.3f ms %7.1f TFLOP/s\n", dn, path,
           ms[1], 3.5 * flops / (ms[1] * 1e-3) / 1e12);

    ct_tensor *all[] = {in.q, in.k, in.v, in.g, in.qa, in.ka, in.va};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) ct_tensor_release(all[i]);
    return 0;
}

int main(void) {
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_attention: skipped, no usable GPU\n");
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return die("properties", ct_last_error());
    printf("bench_cuda_attention on %s (%d SMs): q, k, v [%d, %d, %d, %d], causal, median of %d "
           "after %d warm-up\n",
           p.name, p.multiprocessors, B, H, T, D, REPS, WARMUP);
    if (cti_cuda_begin("bench_cuda_attention", 0, &stream) != CT_OK)
        return die("stream", ct_last_error());
    CUDA_OK(cudaEventCreate(&ev_start));
    CUDA_OK(cudaEventCreate(&ev_stop));
    if (bench_one(CT_BF16, "cudnn") || bench_one(CT_BF16, "flash") || bench_one(CT_F32, "flash"))
        return 1;
    unsetenv("CT_CUDA_SDPA_CUDNN");
    printf("\ntargets (bfloat16, H200): forward <= 0.087 ms (PyTorch's cuDNN backend), "
           "fwd+bwd <= 0.424 ms; fwd+bwd flops counted as 3.5x the forward's\n");
    cudaEventDestroy(ev_start);
    cudaEventDestroy(ev_stop);
    return 0;
}
