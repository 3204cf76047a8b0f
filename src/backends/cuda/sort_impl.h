/* Private to the CUDA backend: the launch record of sort, cumprod and
 * nonzero, which sort.c fills from a ct_call and sort.cu launches from. The
 * contract of each op is schema.h's ("sort, cumprod, nonzero"). Nothing here
 * names a ct_tensor, so nvcc reads it. */
#ifndef CTEN_CUDA_SORT_IMPL_H
#define CTEN_CUDA_SORT_IMPL_H

#include "../../dispatch/schema.h"
#include "cuda_impl.h"
#include "tensor/dispatch.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cti_cuda_sort {
    int op;      /* ct_op */
    ct_dtype dt; /* the dispatch dtype (x's) */
    const void *x;
    const int64_t *count; /* nonzero: the running count of non-zero elements */
    void *out, *out2;     /* sort: values, indices; the others: out */
    int64_t numel;        /* nonzero: x's elements */
    cti_sort_params p;    /* sort, nonzero */
    cti_seq_params q;     /* cumprod */
    void *work;           /* cti_cuda_sort_work bytes of device scratch */
    int sms;
} cti_cuda_sort;

/* Scratch bytes the launch needs (the device-wide sort of long rows). */
size_t cti_cuda_sort_work(const cti_cuda_sort *a);
/* Queues the op; *routine receives the variant (static string). */
cudaError_t cti_cuda_sort_launch(const cti_cuda_sort *a, cudaStream_t stream,
                                 const char **routine);

#ifdef __cplusplus
}
#endif
#endif
