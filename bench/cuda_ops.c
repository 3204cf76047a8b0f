/* The CUDA backend's two heavy paths against the hardware's own ceilings,
 * in one run:
 *   - matmul 8192 x 8192 in float32, TF32 (ct_set_allow_tf32) and bfloat16:
 *     ct_matmul against cublasGemmEx called directly on the same stream with
 *     the same workspace size, alternating, each timed with CUDA events;
 *     median TFLOP/s and the ratio;
 *   - elementwise add of two 256M-element float32 tensors (ct_add, result
 *     from the caching allocator) against a device-to-device cudaMemcpy of
 *     one such tensor: GB/s moved (add: two reads and a write; copy: a read
 *     and a write) and the add's share of the copy bandwidth.
 * Prints a summary table. Skips (exit 0, a line saying why) without a GPU. */
#include <cublas_v2.h>
#include <stdio.h>
#include <stdlib.h>

#include "backends/cuda/cuda_impl.h"
#include "tensor/tensor.h"

#define BENCH_NAME "bench_cuda_ops"
#include "cuda_bench.h"

#define N_MM 8192
#define N_EW ((int64_t)256 << 20)
#define REPS_MM 15
#define REPS_EW 15
#define WORKSPACE ((size_t)32 << 20)

#define BLAS_OK(call)                                                  \
    do {                                                               \
        cublasStatus_t s_ = (call);                                    \
        if (s_ != CUBLAS_STATUS_SUCCESS) return die(#call, cublasGetStatusString(s_)); \
    } while (0)

typedef struct mm_result {
    const char *name;
    double lib_tflops, direct_tflops;
} mm_result;

/* One matmul configuration: dt, and TF32 for float32 when tf32. */
static int bench_matmul(timer *t, cublasHandle_t h, void *ws, ct_dtype dt, bool tf32,
                        mm_result *res) {
    const int64_t n = N_MM;
    ct_set_allow_tf32(tf32);
    ct_tensor *a = ct_tensor_randn(NULL, CT_SHAPE(n, n), dt, CT_CUDA(0));
    ct_tensor *b = ct_tensor_randn(NULL, CT_SHAPE(n, n), dt, CT_CUDA(0));
    ct_tensor *c = ct_tensor_empty(CT_SHAPE(n, n), dt, CT_CUDA(0));
    if (!a || !b || !c) return die("allocating the matrices", ct_last_error());
    cudaDataType_t ty = dt == CT_BF16 ? CUDA_R_16BF : CUDA_R_32F;
    cublasComputeType_t ct = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    float one = 1, zero = 0;
    double lib[REPS_MM], direct[REPS_MM];
    for (int r = -2; r < REPS_MM; r++) { /* two warm-up rounds */
        double ms;
        CUDA_OK(cudaEventRecord(t->start, t->stream));
        ct_tensor *p = ct_matmul(a, b);
        if (!p) return die("ct_matmul", ct_last_error());
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        ct_tensor_release(p);
        if (r >= 0) lib[r] = ms;

        /* C^T = B^T A^T: row-major operands as cuBLAS's column-major ones. */
        BLAS_OK(cublasSetWorkspace(h, ws, WORKSPACE));
        CUDA_OK(cudaEventRecord(t->start, t->stream));
        BLAS_OK(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one,
                             ct_tensor_data_ptr(b), ty, (int)n, ct_tensor_data_ptr(a), ty, (int)n,
                             &zero, ct_tensor_data_ptr(c), ty, (int)n, ct, CUBLAS_GEMM_DEFAULT));
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        if (r >= 0) direct[r] = ms;
    }
    double flop = 2.0 * (double)n * (double)n * (double)n;
    res->lib_tflops = flop / (median(lib, REPS_MM) * 1e-3) / 1e12;
    res->direct_tflops = flop / (median(direct, REPS_MM) * 1e-3) / 1e12;
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(c);
    ct_set_allow_tf32(false);
    return 0;
}

static int bench_add(timer *t, double *add_gbs, double *copy_gbs) {
    ct_tensor *a = ct_tensor_rand(NULL, CT_SHAPE(N_EW), CT_F32, CT_CUDA(0));
    ct_tensor *b = ct_tensor_rand(NULL, CT_SHAPE(N_EW), CT_F32, CT_CUDA(0));
    ct_tensor *c = ct_tensor_empty(CT_SHAPE(N_EW), CT_F32, CT_CUDA(0));
    if (!a || !b || !c) return die("allocating 3 x 1 GiB", ct_last_error());
    size_t bytes = (size_t)N_EW * sizeof(float);
    double add[REPS_EW], copy[REPS_EW];
    for (int r = -2; r < REPS_EW; r++) {
        double ms;
        CUDA_OK(cudaEventRecord(t->start, t->stream));
        ct_tensor *s = ct_add(a, b);
        if (!s) return die("ct_add", ct_last_error());
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        ct_tensor_release(s);
        if (r >= 0) add[r] = ms;

        CUDA_OK(cudaEventRecord(t->start, t->stream));
        CUDA_OK(cudaMemcpyAsync(ct_tensor_data_ptr(c), ct_tensor_data_ptr(a), bytes,
                                cudaMemcpyDeviceToDevice, t->stream));
        CUDA_OK(cudaEventRecord(t->stop, t->stream));
        if (elapsed(t, &ms)) return 1;
        if (r >= 0) copy[r] = ms;
    }
    *add_gbs = 3.0 * (double)bytes / (median(add, REPS_EW) * 1e-3) / 1e9;
    *copy_gbs = 2.0 * (double)bytes / (median(copy, REPS_EW) * 1e-3) / 1e9;
    ct_tensor_release(a);
    ct_tensor_release(b);
    ct_tensor_release(c);
    return 0;
}

int main(void) {
    if (ct_device_count(CT_DEVICE_CUDA) == 0) {
        printf("bench_cuda_ops: skipped, no usable GPU\n");
        return 0;
    }
    ct_cuda_device_props p;
    if (ct_cuda_get_device_properties(0, &p) != CT_OK) return die("properties", ct_last_error());
    printf("bench_cuda_ops on %s (%d SMs)\n", p.name, p.multiprocessors);

    /* Events and the direct cuBLAS calls go on the stream the library uses. */
    timer t;
    if (cti_cuda_begin("bench_cuda_ops", 0, &t.stream) != CT_OK)
        return die("stream", ct_last_error());
    CUDA_OK(cudaEventCreate(&t.start));
    CUDA_OK(cudaEventCreate(&t.stop));
    cublasHandle_t h;
    BLAS_OK(cublasCreate(&h));
    BLAS_OK(cublasSetStream(h, t.stream));
    void *ws = NULL;
    CUDA_OK(cudaMalloc(&ws, WORKSPACE));

    mm_result mm[3] = {{"float32", 0, 0}, {"tf32", 0, 0}, {"bfloat16", 0, 0}};
    if (bench_matmul(&t, h, ws, CT_F32, false, &mm[0]) ||
        bench_matmul(&t, h, ws, CT_F32, true, &mm[1]) ||
        bench_matmul(&t, h, ws, CT_BF16, false, &mm[2]))
        return 1;
    double add_gbs = 0, copy_gbs = 0;
    if (bench_add(&t, &add_gbs, &copy_gbs)) return 1;

    printf("\n%-34s %14s %14s %8s\n", "benchmark", "cten", "reference", "ratio");
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "matmul %d^2 %s (TFLOP/s)", N_MM, mm[i].name);
        printf("%-34s %14.1f %14.1f %7.3fx\n", name, mm[i].lib_tflops, mm[i].direct_tflops,
               mm[i].lib_tflops / mm[i].direct_tflops);
    }
    printf("%-34s %14.1f %14.1f %7.1f%%\n", "add 256M f32 vs D2D copy (GB/s)", add_gbs, copy_gbs,
           100.0 * add_gbs / copy_gbs);
    printf("\nreference: cublasGemmEx called directly; cudaMemcpy device to device\n");

    cudaFree(ws);
    cublasDestroy(h);
    cudaEventDestroy(t.start);
    cudaEventDestroy(t.stop);
    return 0;
}
