/* Private to the CUDA backend: the launch record of CROSS_ENTROPY_FUSED
 * (linear_ce.c fills it, linear_ce.cu launches it). Nothing here names a
 * ct_tensor, so nvcc can read it. */
#ifndef CTEN_CUDA_LINEAR_CE_IMPL_H
#define CTEN_CUDA_LINEAR_CE_IMPL_H

#include "ops_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cti_lce_rows {
    ct_dtype dt;           /* the logits' dtype; loss is f32 (f64 for f64) */
    void *logits;          /* [rows, c], overwritten with the gradient when grad */
    const int64_t *target; /* [rows] */
    const void *rscale;    /* [rows] of dt, or NULL */
    void *loss;            /* [rows] */
    int64_t rows, c, ignore;
    double ls, scale;
    int grad;
    int op;                    /* ct_op, for the fault record */
    cti_cuda_fault_slot fault; /* where a bad target is recorded */
} cti_lce_rows;

cudaError_t cti_lce_rows_launch(const cti_lce_rows *r, cudaStream_t st, const char **routine);

#ifdef __cplusplus
}
#endif
#endif
