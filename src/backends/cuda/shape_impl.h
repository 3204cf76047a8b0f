/* Private to the CUDA backend: the launch records of the indexing and shape
 * kernels (shape.cu), which the C side (shape.c) fills from a ct_call. As
 * ops_impl.h, nothing here names a ct_tensor, so nvcc can read it. */
#ifndef CTEN_CUDA_SHAPE_IMPL_H
#define CTEN_CUDA_SHAPE_IMPL_H

#include "../../dispatch/schema.h"
#include "cuda_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* SCATTER / SCATTER_REDUCE: one thread per line of index along dim (shape:
 * index's with 1 at dim; lines of them). Strides in elements: os out's (0
 * at dim; odim at dim), is index's, ss src's, cs the row-major strides of
 * index's shape (for *bad). */
typedef struct cti_cuda_scatter {
    int dt, nd, dim, reduce;
    int64_t size, len, odim, idim, sdim, cdim;
    int64_t shape[CT_MAX_DIMS], os[CT_MAX_DIMS], is[CT_MAX_DIMS], ss[CT_MAX_DIMS],
        cs[CT_MAX_DIMS];
    const void *idx, *src;
    void *out;
    unsigned long long *bad;
} cti_cuda_scatter;

/* FLIP / ROLL / REPEAT / PAD: out (contiguous, oshape) from x (xshape,
 * xstride) per dim's mode and lo (schema.h's cti_remap_params); es the
 * element size, fill the fill value's bits. */
typedef struct cti_cuda_remap {
    int es, nd;
    int64_t numel;
    int64_t oshape[CT_MAX_DIMS], xshape[CT_MAX_DIMS], xstride[CT_MAX_DIMS], lo[CT_MAX_DIMS];
    int mode[CT_MAX_DIMS];
    unsigned long long fill;
    const void *x;
    void *out;
} cti_cuda_remap;

/* INTERPOLATE (+ backward), UNFOLD, FOLD: contiguous tensors of dtype dt.
 * The interpolate backward accumulates with atomics into acc (float32 for
 * float16/bfloat16, else out itself), zeroed by the C side. */
typedef struct cti_cuda_resample {
    int dt;
    cti_interp_params ip;
    cti_fold_params fp;
    const void *in;
    void *out;
    void *acc;
} cti_cuda_resample;

cudaError_t cti_cuda_scatter_lines(const cti_cuda_scatter *a, int64_t lines, int sm_count,
                                   cudaStream_t st, const char **routine);
cudaError_t cti_cuda_remap_copy(const cti_cuda_remap *a, int sm_count, cudaStream_t st,
                                const char **routine);
/* which: 0 interpolate, 1 its backward (into acc), 2 unfold, 3 fold; n output elements
 * (the backward: grad_out's). */
cudaError_t cti_cuda_resample_run(const cti_cuda_resample *a, int which, int64_t n, int sm_count,
                                  cudaStream_t st, const char **routine);

#ifdef __cplusplus
}
#endif
#endif
