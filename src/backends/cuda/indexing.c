/* gather / index_select and scatter_add for CUDA tensors, with the CPU
 * kernels' call records (src/backends/cpu/indexing.c; cti_index_params of
 * schema.h). The C side turns a call into indexing.cu's launch record (the
 * tensors' shapes and strides: nothing is copied to make it contiguous),
 * queues the kernel, then reads back its record of the first bad index
 * before returning, as embedding does, so an index out of range fails the
 * call with the CPU's message instead of a later wait for the device. */
#include <limits.h>

#include "ops_impl.h"

static int dev_of(const ct_tensor *t) { return t->storage->device.index; }

static const char *op_label(ct_op op) {
    return op == CT_OP_GATHER ? "ct_gather"
           : op == CT_OP_INDEX_SELECT ? "ct_index_select"
                                      : "ct_scatter_add";
}

/* The launch record of call c: index's geometry, the indexed tensor t's and
 * src's strides (src may be NULL). */
static void fill(cti_cuda_index *a, const ct_call *c, const ct_tensor *t, const ct_tensor *src,
                 unsigned long long *bad) {
    const cti_index_params *p = CTI_PARAMS(c, cti_index_params);
    const ct_tensor *idx = c->in[1];
    memset(a, 0, sizeof *a);
    a->dt = (int)t->dtype;
    a->idx_i32 = idx->dtype == CT_I32;
    a->nd = idx->ndim;
    a->dim = p->dim;
    a->size = p->size;
    a->tdim = t->stride[p->dim];
    a->len = idx->shape[p->dim];
    cti_contiguous_strides(idx->ndim, idx->shape, a->cs);
    for (int k = 0; k < idx->ndim; k++) {
        a->shape[k] = idx->shape[k];
        a->ts[k] = k == p->dim ? 0 : t->stride[k];
        a->is[k] = idx->stride[k];
        a->ss[k] = src ? src->stride[k] : 0;
    }
    a->x = cti_data(c->in[0]);
    a->idx = cti_data(idx);
    a->src = src ? cti_data(src) : NULL;
    a->out = cti_data(c->out[0]);
    a->bad = bad;
}

/* Waits for the queued work, then turns a recorded bad position into the
 * CPU kernel's error (shape.c's scatter kernels use it too). */
ct_status cti_cuda_index_check_bad(const char *op, int dev, cudaStream_t st,
                           const unsigned long long *bad, const ct_tensor *idx, int dim,
                           int64_t size) {
    unsigned long long pos = 0;
    if (cti_cuda_capture_check_wait(op, dev, "checks its indices on the host after the kernel (a "
                                             "host sync)") != CT_OK)
        return ct_last_status();
    cudaError_t e = cudaMemcpyAsync(&pos, bad, sizeof pos, cudaMemcpyDeviceToHost, st);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
    if (cti_cuda_sync(op, dev) != CT_OK) return ct_last_status();
    if (pos == ULLONG_MAX) return CT_OK;
    /* the element at row-major position pos, through index's strides */
    int64_t off = 0, rest = (int64_t)pos;
    for (int k = idx->ndim - 1; k >= 0; k--) {
        off += rest % idx->shape[k] * idx->stride[k];
        rest /= idx->shape[k];
    }
    size_t es = ct_dtype_size(idx->dtype);
    int64_t v64 = 0;
    int32_t v32 = 0;
    void *dst = idx->dtype == CT_I32 ? (void *)&v32 : (void *)&v64;
    e = cudaMemcpyAsync(dst, cti_data(idx) + off * (int64_t)es, es, cudaMemcpyDeviceToHost, st);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemcpyAsync", e);
    if (cti_cuda_sync(op, dev) != CT_OK) return ct_last_status();
    int64_t v = idx->dtype == CT_I32 ? v32 : v64;
    if (size > 0)
        return cti_error(CT_ERR_INDEX,
                         "%s: index %lld is out of range for dim %d of size %lld (expected 0..%lld)",
                         op, (long long)v, dim, (long long)size, (long long)(size - 1));
    return cti_error(CT_ERR_INDEX,
                     "%s: index %lld is out of range for dim %d of size 0 (no index is valid)", op,
                     (long long)v, dim);
}

/* Queues the kernel for n threads with a fresh bad-index record, then checks it. */
static ct_status launch(ct_call *c, const ct_tensor *t, const ct_tensor *src, int64_t n,
                        bool scatter) {
    const char *op = op_label(c->op);
    const cti_index_params *p = CTI_PARAMS(c, cti_index_params);
    int dev = dev_of(c->out[0]);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    int64_t one = (int64_t)sizeof(unsigned long long);
    ct_tensor *flag = cti_tensor_new(op, 1, &one, CT_BOOL, CT_CUDA(dev));
    if (!flag) return ct_last_status();
    unsigned long long *bad = (unsigned long long *)cti_data(flag);
    ct_status s;
    cudaError_t e = cudaMemsetAsync(bad, 0xFF, sizeof *bad, st);
    if (e != cudaSuccess) {
        s = cti_cuda_fail(op, dev, "cudaMemsetAsync", e);
    } else {
        cti_cuda_index a;
        fill(&a, c, t, src, bad);
        if (scatter) a.shape[p->dim] = 1; /* one thread per line along dim */
        int sms = cti_cuda_sm_count(dev);
        e = scatter ? cti_cuda_scatter_add(&a, n, sms, st, &c->routine)
                    : cti_cuda_gather(&a, n, sms, st, &c->routine);
        s = e != cudaSuccess ? cti_cuda_fail(op, dev, "a kernel launch", e)
                             : cti_cuda_launched(op, dev, ct_op_name(c->op));
        if (s == CT_OK) s = cti_cuda_index_check_bad(op, dev, st, bad, c->in[1], p->dim, p->size);
    }
    ct_tensor_release(flag);
    return s;
}

/* in x, index; out out (index's shape, contiguous). */
static ct_status k_gather(ct_call *c) {
    int64_t n = cti_numel(c->in[1]->ndim, c->in[1]->shape);
    if (n == 0) return CT_OK;
    return launch(c, c->in[0], NULL, n, false);
}

/* in x, index, src; out out (x's shape, contiguous, holding x already). */
static ct_status k_scatter_add(ct_call *c) {
    const cti_index_params *p = CTI_PARAMS(c, cti_index_params);
    const ct_tensor *idx = c->in[1];
    int64_t len = idx->shape[p->dim];
    if (len == 0 || cti_numel(idx->ndim, idx->shape) == 0) return CT_OK;
    return launch(c, c->out[0], c->in[2], cti_numel(idx->ndim, idx->shape) / len, true);
}

void cti_cuda_register_indexing(void) {
    for (int dt = 0; dt < CT_NUM_DTYPES; dt++) {
        cti_register_kernel(CT_OP_GATHER, CT_DEVICE_CUDA, (ct_dtype)dt, k_gather, "cuda_gather");
        cti_register_kernel(CT_OP_INDEX_SELECT, CT_DEVICE_CUDA, (ct_dtype)dt, k_gather,
                            "cuda_index_select");
        cti_register_kernel(CT_OP_SCATTER_ADD, CT_DEVICE_CUDA, (ct_dtype)dt, k_scatter_add,
                            "cuda_scatter_add");
    }
}
