/* tril/triu, cumsum, topk, topk_backward and multinomial for CUDA tensors,
 * with the CPU kernels' call records (src/backends/cpu/seqops.c; the
 * contract is schema.h's). Inputs arrive contiguous. The work is queued
 * without waiting: a bad weight of multinomial or a bad index of
 * topk_backward is recorded by the kernel and fails the next wait for the
 * device (cuda_impl.h, "faults") with the message cti_cuda_seq_fault words. */
#include <limits.h>
#include <string.h>

#include "ops_impl.h"
#include "seqops_impl.h"

static int dev_of(const ct_tensor *t) { return t->storage->device.index; }

static ct_status k_seq(ct_call *c) {
    const cti_seq_params *p = CTI_PARAMS(c, cti_seq_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *out = c->out[0];
    if (cti_numel(out->ndim, out->shape) == 0) return CT_OK;
    if (c->op == CT_OP_TOPK && p->n > INT_MAX)
        return cti_error(CT_ERR_INVALID_ARG, "%s: rows of %lld elements exceed the CUDA kernel's %d",
                         op, (long long)p->n, INT_MAX);
    cti_cuda_seq a = {
        .op = (int)c->op,
        .dt = c->in[0]->dtype,
        .x = cti_data(c->in[0]),
        .index = c->op == CT_OP_TOPK_BACKWARD ? (const int64_t *)cti_data(c->in[1]) : NULL,
        .out = cti_data(out),
        .out2 = c->nout > 1 && c->out[1] ? cti_data(c->out[1]) : NULL,
        .p = *p,
    };
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    if ((c->op == CT_OP_MULTINOMIAL || c->op == CT_OP_TOPK_BACKWARD) &&
        cti_cuda_fault_slot_get(op, dev, &a.fault) != CT_OK)
        return ct_last_status();
    if (c->op == CT_OP_MULTINOMIAL) cti_cuda_philox(dev, p->seed, &a.p.offset, &a.philox);
    a.sms = cti_cuda_sm_count(dev);
    ct_tensor *work = NULL;
    size_t wb = cti_cuda_seq_work(&a);
    if (wb > 0) {
        int64_t sz = (int64_t)wb;
        if (!(work = cti_tensor_new(op, 1, &sz, CT_BOOL, CT_CUDA(dev)))) return ct_last_status();
        a.work = cti_data(work);
    }
    cudaError_t e = cti_cuda_seq_launch(&a, st, &c->routine);
    ct_tensor_release(work); /* the caching allocator orders its reuse on the stream */
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a kernel launch", e);
    return cti_cuda_launched(op, dev, ct_op_name(c->op));
}

ct_status cti_cuda_seq_fault(const cti_cuda_fault *r, const char *op, const char *waiter,
                             int device) {
    char where[160];
    snprintf(where, sizeof where,
             "; found by the kernel on cuda:%d and reported by %s, the first wait for the device "
             "after it",
             device, waiter);
    switch ((int)r->value) {
    case CTI_SEQ_BAD_WEIGHT: {
        double w;
        long long bits = r->limit;
        memcpy(&w, &bits, sizeof w);
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: probabilities must be finite and non-negative, got %g at row %lld, "
                         "element %lld%s",
                         op, w, r->position, r->ignore, where);
    }
    case CTI_SEQ_ZERO_ROW:
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: row %lld of the probabilities sums to 0 (expected a positive sum)%s",
                         op, r->position, where);
    case CTI_SEQ_FEW_NONZERO:
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: cannot draw %lld samples without replacement from row %lld, which "
                         "has %lld non-zero probabilities%s",
                         op, r->ignore, r->position, r->limit, where);
    default:
        return cti_error(CT_ERR_INDEX, "%s: index %lld is out of range for dim %lld of size %lld%s",
                         op, r->ignore, r->position, r->limit, where);
    }
}

void cti_cuda_register_seqops(void) {
    for (int d = 0; d < CT_NUM_DTYPES; d++) {
        ct_dtype dt = (ct_dtype)d;
        cti_register_kernel(CT_OP_TRIL, CT_DEVICE_CUDA, dt, k_seq, "cuda_tril");
        cti_register_kernel(CT_OP_TRIU, CT_DEVICE_CUDA, dt, k_seq, "cuda_triu");
        cti_register_kernel(CT_OP_CUMSUM, CT_DEVICE_CUDA, dt, k_seq, "cuda_cumsum");
        if (dt != CT_BOOL) cti_register_kernel(CT_OP_TOPK, CT_DEVICE_CUDA, dt, k_seq, "cuda_topk");
        if (ct_dtype_is_floating(dt)) {
            cti_register_kernel(CT_OP_TOPK_BACKWARD, CT_DEVICE_CUDA, dt, k_seq,
                                "cuda_topk_backward");
            cti_register_kernel(CT_OP_MULTINOMIAL, CT_DEVICE_CUDA, dt, k_seq, "cuda_multinomial");
        }
    }
}
