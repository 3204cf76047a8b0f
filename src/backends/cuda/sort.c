/* sort, cumprod and nonzero for CUDA tensors, with the CPU kernels' call
 * records (src/backends/cpu/sort.c; the contract is schema.h's). Inputs
 * arrive contiguous; the work is queued without waiting (nonzero's front end
 * has already read the count it needs). */
#include <limits.h>

#include "ops_impl.h"
#include "sort_impl.h"

static ct_status k_sort(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    ct_tensor *out = c->out[0];
    if (cti_numel(out->ndim, out->shape) == 0) return CT_OK;
    cti_cuda_sort a = {
        .op = (int)c->op,
        .dt = c->in[0]->dtype,
        .x = cti_data(c->in[0]),
        .count = c->op == CT_OP_NONZERO ? (const int64_t *)cti_data(c->in[1]) : NULL,
        .out = cti_data(out),
        .out2 = c->nout > 1 && c->out[1] ? cti_data(c->out[1]) : NULL,
        .numel = cti_numel(c->in[0]->ndim, c->in[0]->shape),
    };
    if (c->op == CT_OP_CUMPROD) a.q = *CTI_PARAMS(c, cti_seq_params);
    else a.p = *CTI_PARAMS(c, cti_sort_params);
    if (c->op == CT_OP_SORT && a.p.n > INT_MAX)
        return cti_error(CT_ERR_INVALID_ARG, "%s: rows of %lld elements exceed the CUDA kernel's %d",
                         op, (long long)a.p.n, INT_MAX);
    if (c->op == CT_OP_NONZERO && a.p.ndim == 0) return CT_OK;
    int dev = out->storage->device.index;
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    a.sms = cti_cuda_sm_count(dev);
    ct_tensor *work = NULL;
    size_t wb = cti_cuda_sort_work(&a);
    if (wb > 0) {
        int64_t sz = (int64_t)wb;
        if (!(work = cti_tensor_new(op, 1, &sz, CT_BOOL, CT_CUDA(dev)))) return ct_last_status();
        a.work = cti_data(work);
    }
    cudaError_t e = cti_cuda_sort_launch(&a, st, &c->routine);
    ct_tensor_release(work); /* the caching allocator orders its reuse on the stream */
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a kernel launch", e);
    return cti_cuda_launched(op, dev, ct_op_name(c->op));
}

void cti_cuda_register_sort(void) {
    for (int d = 0; d < CT_NUM_DTYPES; d++) {
        ct_dtype dt = (ct_dtype)d;
        cti_register_kernel(CT_OP_SORT, CT_DEVICE_CUDA, dt, k_sort, "cuda_sort");
        cti_register_kernel(CT_OP_CUMPROD, CT_DEVICE_CUDA, dt, k_sort, "cuda_cumprod");
        cti_register_kernel(CT_OP_NONZERO, CT_DEVICE_CUDA, dt, k_sort, "cuda_nonzero");
    }
}
