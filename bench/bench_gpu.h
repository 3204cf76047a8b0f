/* The GPU side of cten-bench: CUDA-event timing on the stream the library
 * queues its work on, and the anchors called directly (cublasGemmEx,
 * cudaMemcpyAsync device to device, cudaMemsetAsync). In a build without
 * the CUDA backend every function fails and bg_open returns NULL. */
#ifndef CTEN_BENCH_GPU_H
#define CTEN_BENCH_GPU_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tensor/tensor.h"

typedef struct bg_gpu bg_gpu;

/* Events, a cuBLAS handle and its workspace for device; NULL with the reason
 * in err on failure. */
bg_gpu *bg_open(int device, char *err, size_t n);
void bg_close(bg_gpu *g);
/* The last failure's message. */
const char *bg_error(const bg_gpu *g);

/* Brackets work queued on the library's stream with two events; stop waits
 * for the second and gives the seconds between them. Return 0 on success. */
int bg_timer_start(bg_gpu *g);
int bg_timer_stop(bg_gpu *g, double *seconds);
/* Waits for everything queued on the library's stream. */
int bg_sync(bg_gpu *g);

/* Row-major C[M,N] = A[M,K] B[K,N] with cublasGemmEx on the library's
 * stream: dt CT_F32 (TF32 tensor cores when tf32), CT_BF16 or CT_F16, f32
 * accumulation. Device pointers. */
int bg_gemm(bg_gpu *g, ct_dtype dt, bool tf32, int64_t M, int64_t N, int64_t K, const void *A,
            const void *B, void *C);
/* cudaMemcpyAsync device to device / cudaMemsetAsync on the library's stream. */
int bg_memcpy(bg_gpu *g, void *dst, const void *src, size_t bytes);
int bg_memset(bg_gpu *g, void *dst, size_t bytes);

#endif
