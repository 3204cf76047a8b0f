/* Private to the CUDA backend: the launch record of scaled dot-product
 * attention, shared by attention.c (which fills it from a ct_call) and
 * attention.cu (which launches from it). Like ops_impl.h, nothing here names
 * a ct_tensor, so nvcc can read it. The math and the tensors' roles are
 * schema.h's (cti_attention_params). */
#ifndef CTEN_CUDA_ATTENTION_IMPL_H
#define CTEN_CUDA_ATTENTION_IMPL_H

#include "ops_impl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The largest head dim (D and Dv) the kernels take. */
#define CTI_CUDA_ATTN_MAX_HEAD 128

/* Pointers are device addresses of the tensors' first elements; strides are
 * in elements, outermost first ([B, H, rows, cols]; lse: [B, H, rows]). A
 * NULL pointer is an operand the call does not have (mask, the backward's
 * inputs in the forward, ...). */
typedef struct cti_cuda_attn {
    ct_dtype dt;
    bool tensor_cores; /* f16/bf16: the mma.sync kernels (else the scalar ones) */
    cti_attention_params p;
    const uint64_t *philox;       /* dropout: NULL, or the draws' state in a CUDA graph
                                     (ops_impl.h, "random fills") */
    const void *q, *k, *v, *mask; /* mask: uint8 for CTI_ATTN_MASK_BOOL, else dt */
    const void *go, *o, *lse;     /* backward: grad_out, out, lse */
    void *out, *lse_out;          /* forward */
    void *dq, *dk, *dv;           /* backward */
    void *delta;                  /* backward: cti_cuda_attn_work bytes */
    int64_t sq[4], sk[4], sv[4], smask[4], sgo[4], so[4], slse[3];
    int64_t sout[4], slse_out[3], sdq[4], sdk[4], sdv[4];
} cti_cuda_attn;

/* Scratch bytes the backward needs (the per-row Delta = rowsum(dO * O)). */
size_t cti_cuda_attn_work(const cti_cuda_attn *a);
/* Queue the forward / backward on stream; *routine receives the kernels
 * launched (a static string). They never wait. The caller has checked the
 * head dims (<= CTI_CUDA_ATTN_MAX_HEAD) and that the block counts fit. */
cudaError_t cti_cuda_attn_forward(const cti_cuda_attn *a, cudaStream_t stream,
                                  const char **routine);
cudaError_t cti_cuda_attn_backward(const cti_cuda_attn *a, cudaStream_t stream,
                                   const char **routine);

#ifdef __cplusplus
}
#endif
#endif
