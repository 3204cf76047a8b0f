/* Private to the CUDA backend: the launch record of the RMSNorm and LayerNorm
 * kernels (norm.cu), filled by norm.c from a ct_call. Like ops_impl.h it
 * names no ct_tensor, so nvcc can read it. */
#ifndef CTEN_CUDA_NORM_IMPL_H
#define CTEN_CUDA_NORM_IMPL_H

#include "cuda_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of d contiguous elements of dtype dt. Statistics (inv_rms, mean,
 * rstd) are float for f16/bf16/f32 and double for f64, one per row. Every
 * pointer may be NULL where the op allows it (weight, bias, outputs the caller
 * did not ask for). */
typedef struct cti_cuda_norm {
    ct_dtype dt;
    bool layer;          /* layer_norm, else rms_norm */
    int64_t rows, d;
    double eps;          /* forward only */
    const void *x, *w;
    const void *b;       /* forward: the bias (layer_norm) */
    const void *g;       /* backward: grad_y */
    const void *mean;    /* backward: saved mean (layer_norm) */
    const void *rstd;    /* backward: saved inv_rms / rstd */
    void *y;             /* forward: y; backward: dx */
    void *mean_out;      /* forward: mean (layer_norm) */
    void *rstd_out;      /* forward: inv_rms / rstd */
    void *dw, *db;       /* backward: grads of weight and bias */
    void *work;          /* backward: cti_cuda_norm_work bytes when that is > 0 */
} cti_cuda_norm;

/* Scratch bytes the backward needs for the per-block partial sums of dw and
 * db (0: none); a pure function of the record's shapes, pointers and sm_count. */
size_t cti_cuda_norm_work(const cti_cuda_norm *a, int sm_count);
/* Queue the forward / backward on stream; *routine receives the kernel(s)
 * launched (a static string). They never wait. */
cudaError_t cti_cuda_norm_forward(const cti_cuda_norm *a, int sm_count, cudaStream_t stream,
                                  const char **routine);
cudaError_t cti_cuda_norm_backward(const cti_cuda_norm *a, int sm_count, cudaStream_t stream,
                                   const char **routine);

#ifdef __cplusplus
}
#endif
#endif
