/* Private to the CUDA backend: the launch record of tril/triu, cumsum, topk,
 * topk_backward and multinomial, which seqops.c fills from a ct_call and
 * seqops.cu launches from. The contract of each op is schema.h's
 * ("tril, cumsum, topk, multinomial"). Nothing here names a ct_tensor, so
 * nvcc reads it. */
#ifndef CTEN_CUDA_SEQOPS_IMPL_H
#define CTEN_CUDA_SEQOPS_IMPL_H

#include "../../dispatch/schema.h"
#include "cuda_impl.h"
#include "tensor/dispatch.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What a kernel found wrong (cti_cuda_fault.value; seqops.c words it):
 *   BAD_WEIGHT: limit the weight's f64 bits, ignore its element, position its row
 *   ZERO_ROW:   position the row
 *   FEW_NONZERO: limit the row's non-zero weights, ignore num_samples, position the row
 *   BAD_INDEX:  limit the size of dim, ignore the index, position the dim */
enum { CTI_SEQ_BAD_WEIGHT = 1, CTI_SEQ_ZERO_ROW = 2, CTI_SEQ_FEW_NONZERO = 3, CTI_SEQ_BAD_INDEX = 4 };

typedef struct cti_cuda_seq {
    int op;       /* ct_op */
    ct_dtype dt;  /* the dispatch dtype (x's; topk_backward: grad's) */
    const void *x;
    const int64_t *index; /* topk_backward's indices */
    void *out, *out2;     /* topk: values, indices */
    cti_seq_params p;
    const uint64_t *philox; /* multinomial: NULL, or the draws' state in a CUDA graph
                               (ops_impl.h, "random fills") */
    void *work; /* cti_cuda_seq_work bytes of device scratch */
    cti_cuda_fault_slot fault;
    int sms;
} cti_cuda_seq;

/* Scratch bytes the launch needs (topk's sort of long selections). */
size_t cti_cuda_seq_work(const cti_cuda_seq *a);
/* Queues the op; *routine receives the variant (static string). */
cudaError_t cti_cuda_seq_launch(const cti_cuda_seq *a, cudaStream_t stream, const char **routine);

#ifdef __cplusplus
}
#endif
#endif
