/* CUDA events and directly called anchors for cten-bench (see bench_gpu.h). */
#include "bench_gpu.h"

#include <stdio.h>
#include <stdlib.h>

#ifdef CTEN_HAVE_CUDA
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

/* The library's cuBLAS workspace size, so both sides run the same algorithms. */
#define WORKSPACE_BYTES ((size_t)32 << 20)

struct bg_gpu {
    int device;
    cudaStream_t stream;
    cudaEvent_t start, stop;
    cublasHandle_t blas;
    void *workspace;
    char err[512];
};

static int cuda_fail(bg_gpu *g, const char *call, cudaError_t e) {
    snprintf(g->err, sizeof g->err, "%s failed on cuda:%d: %s", call, g->device,
             cudaGetErrorString(e));
    return 1;
}

static int blas_fail(bg_gpu *g, const char *call, cublasStatus_t s) {
    snprintf(g->err, sizeof g->err, "%s failed on cuda:%d: %s", call, g->device,
             cublasGetStatusString(s));
    return 1;
}

/* Makes the device current on this thread: events, cuBLAS and the copies
 * must be issued there. */
static int enter(bg_gpu *g) {
    cudaError_t e = cudaSetDevice(g->device);
    return e == cudaSuccess ? 0 : cuda_fail(g, "cudaSetDevice", e);
}

bg_gpu *bg_open(int device, char *err, size_t n) {
    bg_gpu *g = calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, n, "out of memory");
        return NULL;
    }
    g->device = device;
    cudaError_t e;
    cublasStatus_t s;
    /* events and anchors go on the stream the library queues its work on */
    g->stream = (cudaStream_t)ct_cuda_stream(device);
    if (!g->stream) {
        snprintf(err, n, "%s", ct_last_error());
        free(g);
        return NULL;
    }
    int fail = 0;
    if ((e = cudaEventCreate(&g->start)) != cudaSuccess)
        fail = cuda_fail(g, "cudaEventCreate", e);
    else if ((e = cudaEventCreate(&g->stop)) != cudaSuccess)
        fail = cuda_fail(g, "cudaEventCreate", e);
    else if ((s = cublasCreate(&g->blas)) != CUBLAS_STATUS_SUCCESS)
        fail = blas_fail(g, "cublasCreate", s);
    else if ((s = cublasSetStream(g->blas, g->stream)) != CUBLAS_STATUS_SUCCESS)
        fail = blas_fail(g, "cublasSetStream", s);
    else if ((e = cudaMalloc(&g->workspace, WORKSPACE_BYTES)) != cudaSuccess)
        fail = cuda_fail(g, "cudaMalloc (cuBLAS workspace)", e);
    else if ((s = cublasSetWorkspace(g->blas, g->workspace, WORKSPACE_BYTES)) !=
             CUBLAS_STATUS_SUCCESS)
        fail = blas_fail(g, "cublasSetWorkspace", s);
    if (fail) {
        snprintf(err, n, "%s", g->err);
        bg_close(g);
        return NULL;
    }
    return g;
}

void bg_close(bg_gpu *g) {
    if (!g) return;
    cudaSetDevice(g->device);
    if (g->stream) cudaStreamSynchronize(g->stream);
    if (g->blas) cublasDestroy(g->blas);
    if (g->workspace) cudaFree(g->workspace);
    if (g->start) cudaEventDestroy(g->start);
    if (g->stop) cudaEventDestroy(g->stop);
    free(g);
}

const char *bg_error(const bg_gpu *g) { return g ? g->err : "no GPU"; }

int bg_timer_start(bg_gpu *g) {
    if (enter(g)) return 1;
    cudaError_t e = cudaEventRecord(g->start, g->stream);
    return e == cudaSuccess ? 0 : cuda_fail(g, "cudaEventRecord", e);
}

int bg_timer_stop(bg_gpu *g, double *seconds) {
    if (enter(g)) return 1;
    cudaError_t e = cudaEventRecord(g->stop, g->stream);
    if (e != cudaSuccess) return cuda_fail(g, "cudaEventRecord", e);
    if ((e = cudaEventSynchronize(g->stop)) != cudaSuccess)
        return cuda_fail(g, "cudaEventSynchronize", e);
    float ms = 0;
    if ((e = cudaEventElapsedTime(&ms, g->start, g->stop)) != cudaSuccess)
        return cuda_fail(g, "cudaEventElapsedTime", e);
    *seconds = (double)ms * 1e-3;
    return 0;
}

int bg_sync(bg_gpu *g) {
    if (enter(g)) return 1;
    cudaError_t e = cudaStreamSynchronize(g->stream);
    return e == cudaSuccess ? 0 : cuda_fail(g, "cudaStreamSynchronize", e);
}

int bg_gemm(bg_gpu *g, ct_dtype dt, bool tf32, int64_t M, int64_t N, int64_t K, const void *A,
            const void *B, void *C) {
    if (M > 0x7fffffff || N > 0x7fffffff || K > 0x7fffffff) {
        snprintf(g->err, sizeof g->err, "cublasGemmEx: %lld x %lld x %lld exceeds int",
                 (long long)M, (long long)N, (long long)K);
        return 1;
    }
    cudaDataType_t ty = dt == CT_BF16 ? CUDA_R_16BF : dt == CT_F16 ? CUDA_R_16F : CUDA_R_32F;
    cublasComputeType_t comp =
        dt == CT_F32 && tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    const float one = 1.0f, zero = 0.0f;
    if (enter(g)) return 1;
    /* Row-major C = A B is column-major C^T = B^T A^T: swap the operands. */
    cublasStatus_t s =
        cublasGemmEx(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, (int)N, (int)M, (int)K, &one, B, ty, (int)N,
                     A, ty, (int)K, &zero, C, ty, (int)N, comp, CUBLAS_GEMM_DEFAULT);
    return s == CUBLAS_STATUS_SUCCESS ? 0 : blas_fail(g, "cublasGemmEx", s);
}

int bg_memcpy(bg_gpu *g, void *dst, const void *src, size_t bytes) {
    if (enter(g)) return 1;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g->stream);
    return e == cudaSuccess ? 0 : cuda_fail(g, "cudaMemcpyAsync", e);
}

int bg_memset(bg_gpu *g, void *dst, size_t bytes) {
    if (enter(g)) return 1;
    cudaError_t e = cudaMemsetAsync(dst, 0, bytes, g->stream);
    return e == cudaSuccess ? 0 : cuda_fail(g, "cudaMemsetAsync", e);
}

#else /* no CUDA backend in this build */

struct bg_gpu {
    int unused;
};

bg_gpu *bg_open(int device, char *err, size_t n) {
    snprintf(err, n, "cten-bench was built without the CUDA backend (device %d)", device);
    return NULL;
}
void bg_close(bg_gpu *g) { (void)g; }
const char *bg_error(const bg_gpu *g) {
    (void)g;
    return "built without the CUDA backend";
}
int bg_timer_start(bg_gpu *g) {
    (void)g;
    return 1;
}
int bg_timer_stop(bg_gpu *g, double *seconds) {
    (void)g;
    *seconds = 0;
    return 1;
}
int bg_sync(bg_gpu *g) {
    (void)g;
    return 1;
}
int bg_gemm(bg_gpu *g, ct_dtype dt, bool tf32, int64_t M, int64_t N, int64_t K, const void *A,
            const void *B, void *C) {
    (void)g, (void)dt, (void)tf32, (void)M, (void)N, (void)K, (void)A, (void)B, (void)C;
    return 1;
}
int bg_memcpy(bg_gpu *g, void *dst, const void *src, size_t bytes) {
    (void)g, (void)dst, (void)src, (void)bytes;
    return 1;
}
int bg_memset(bg_gpu *g, void *dst, size_t bytes) {
    (void)g, (void)dst, (void)bytes;
    return 1;
}

#endif
