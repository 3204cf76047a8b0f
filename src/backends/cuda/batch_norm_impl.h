/* Private to the CUDA backend: the launch record of BATCH_NORM and
 * BATCH_NORM_BACKWARD (batch_norm.c fills it, batch_norm.cu launches it).
 * Nothing here names a ct_tensor, so nvcc can read it. */
#ifndef CTEN_CUDA_BATCH_NORM_IMPL_H
#define CTEN_CUDA_BATCH_NORM_IMPL_H

#include "ops_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* x, y, dy, dx: contiguous [N, C, S] of dt; w, b, dw, db: [C] of dt or NULL;
 * mean, var: [C] of f32 (f64 for f64), read (backward, eval forward) or
 * written (training forward). */
typedef struct cti_cuda_bn {
    ct_dtype dt;
    int64_t N, C, S;
    double eps;
    int training;
    const void *x, *w, *b, *dy;
    const void *mean_in, *var_in;
    void *y, *mean_out, *var_out; /* forward */
    void *dx, *dw, *db;           /* backward; each may be NULL */
} cti_cuda_bn;

cudaError_t cti_cuda_batch_norm_forward(const cti_cuda_bn *a, cudaStream_t st,
                                        const char **routine);
cudaError_t cti_cuda_batch_norm_backward(const cti_cuda_bn *a, cudaStream_t st,
                                         const char **routine);

#ifdef __cplusplus
}
#endif
#endif
