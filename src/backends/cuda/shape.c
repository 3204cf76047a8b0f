/* The indexing and shape ops for CUDA tensors (schema.h's contracts, the
 * CPU kernels' call records in src/backends/cpu/shape.c): turns a call into
 * shape.cu's launch record and queues it. The scatter kernels record the
 * first bad index on the device; the call then waits for them and fails with
 * the CPU's message (cti_cuda_index_check_bad, as gather's), so an index out
 * of range is refused on the GPU as on the CPU. */
#include "ops_impl.h"
#include "shape_impl.h"

static int dev_of(const ct_tensor *t) { return t->storage->device.index; }

/* ---- scatter ------------------------------------------------------------------------- */

/* in x, index, src; out out (holding x). */
static ct_status k_scatter(ct_call *c) {
    const cti_scatter_params *p = CTI_PARAMS(c, cti_scatter_params);
    const char *op = p->from_reduce ? "ct_scatter_reduce" : "ct_scatter";
    const ct_tensor *idx = c->in[1], *src = c->in[2], *out = c->out[0];
    int64_t n = cti_numel(idx->ndim, idx->shape), len = idx->shape[p->dim];
    if (n == 0) return CT_OK;
    int dev = dev_of(out);
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
        cti_cuda_scatter a;
        memset(&a, 0, sizeof a);
        a.dt = (int)out->dtype;
        a.nd = idx->ndim;
        a.dim = p->dim;
        a.reduce = p->reduce;
        a.size = p->size;
        a.len = len;
        a.odim = out->stride[p->dim];
        a.idim = idx->stride[p->dim];
        a.sdim = src->stride[p->dim];
        int64_t cs[CT_MAX_DIMS];
        cti_contiguous_strides(idx->ndim, idx->shape, cs);
        a.cdim = cs[p->dim];
        for (int k = 0; k < idx->ndim; k++) {
            bool d = k == p->dim;
            a.shape[k] = d ? 1 : idx->shape[k];
            a.os[k] = d ? 0 : out->stride[k];
            a.is[k] = d ? 0 : idx->stride[k];
            a.ss[k] = d ? 0 : src->stride[k];
            a.cs[k] = d ? 0 : cs[k];
        }
        a.idx = cti_data(idx);
        a.src = cti_data(src);
        a.out = cti_data(out);
        a.bad = bad;
        e = cti_cuda_scatter_lines(&a, n / len, cti_cuda_sm_count(dev), st, &c->routine);
        s = e != cudaSuccess ? cti_cuda_fail(op, dev, "a kernel launch", e)
                             : cti_cuda_launched(op, dev, ct_op_name(c->op));
        if (s == CT_OK) s = cti_cuda_index_check_bad(op, dev, st, bad, idx, p->dim, p->size);
    }
    ct_tensor_release(flag);
    return s;
}

/* ---- flip, roll, repeat, pad ------------------------------------------------------------ */

/* in x; out out (contiguous, x's ndim >= 1). */
static ct_status k_remap(ct_call *c) {
    const cti_remap_params *p = CTI_PARAMS(c, cti_remap_params);
    const ct_tensor *x = c->in[0], *out = c->out[0];
    const char *op = ct_op_name(c->op);
    cti_cuda_remap a;
    memset(&a, 0, sizeof a);
    a.es = (int)ct_dtype_size(out->dtype);
    a.nd = out->ndim;
    a.numel = cti_numel(out->ndim, out->shape);
    if (a.numel == 0) return CT_OK;
    for (int k = 0; k < out->ndim; k++) {
        a.oshape[k] = out->shape[k];
        a.xshape[k] = x->shape[k];
        a.xstride[k] = x->stride[k];
        a.lo[k] = p->lo[k];
        a.mode[k] = p->mode[k];
    }
    /* the fill value's bits, as the CPU kernel converts it */
    double v = p->value;
    switch (out->dtype) {
    case CT_BOOL: a.fill = v != 0; break;
    case CT_I32: a.fill = (uint32_t)(int32_t)v; break;
    case CT_I64: a.fill = (unsigned long long)(int64_t)v; break;
    case CT_F16: a.fill = ct_f32_to_f16((float)v); break;
    case CT_BF16: a.fill = cti_f32_to_bf16((float)v); break;
    case CT_F32: {
        float f = (float)v;
        uint32_t u;
        memcpy(&u, &f, 4);
        a.fill = u;
        break;
    }
    default: memcpy(&a.fill, &v, 8); break;
    }
    a.x = cti_data(x);
    a.out = cti_data(out);
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    cudaError_t e = cti_cuda_remap_copy(&a, cti_cuda_sm_count(dev), st, &c->routine);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a kernel launch", e);
    return cti_cuda_launched(op, dev, op);
}

/* ---- interpolate, unfold, fold -------------------------------------------------------------- */

static ct_status resample(ct_call *c, int which) {
    const char *op = ct_op_name(c->op);
    const ct_tensor *in = c->in[0], *out = c->out[0];
    cti_cuda_resample a;
    memset(&a, 0, sizeof a);
    a.dt = (int)out->dtype;
    if (which <= 1) a.ip = *CTI_PARAMS(c, cti_interp_params);
    else a.fp = *CTI_PARAMS(c, cti_fold_params);
    a.in = cti_data(in);
    a.out = cti_data(out);
    int64_t n = cti_numel(which == 1 ? in->ndim : out->ndim, which == 1 ? in->shape : out->shape);
    int64_t nout = cti_numel(out->ndim, out->shape);
    int dev = dev_of(out);
    cudaStream_t st;
    if (cti_cuda_begin(op, dev, &st) != CT_OK) return ct_last_status();
    ct_tensor *acc = NULL;
    cudaError_t e = cudaSuccess;
    if (which == 1) {
        /* atomics add into float32 for the halves (converted after), else into out */
        bool half = out->dtype == CT_F16 || out->dtype == CT_BF16;
        if (half && !(acc = cti_tensor_new(op, out->ndim, out->shape, CT_F32, out->storage->device)))
            return ct_last_status();
        a.acc = acc ? cti_data(acc) : a.out;
        size_t es = acc ? 4 : ct_dtype_size(out->dtype);
        if (nout > 0) e = cudaMemsetAsync(a.acc, 0, (size_t)nout * es, st);
        if (e != cudaSuccess) {
            if (acc) ct_tensor_release(acc);
            return cti_cuda_fail(op, dev, "cudaMemsetAsync", e);
        }
    }
    int sms = cti_cuda_sm_count(dev);
    if (n > 0) e = cti_cuda_resample_run(&a, which, n, sms, st, &c->routine);
    if (e == cudaSuccess && acc && nout > 0)
        e = cti_cuda_convert_contiguous(a.out, out->dtype, a.acc, CT_F32, nout, sms, st);
    if (acc) ct_tensor_release(acc);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a kernel launch", e);
    return cti_cuda_launched(op, dev, op);
}

static ct_status k_interp(ct_call *c) { return resample(c, 0); }
static ct_status k_interp_bw(ct_call *c) { return resample(c, 1); }
static ct_status k_unfold(ct_call *c) { return resample(c, 2); }
static ct_status k_fold(ct_call *c) { return resample(c, 3); }

void cti_cuda_register_shape(void) {
    for (int dt = 0; dt < CT_NUM_DTYPES; dt++) {
        ct_dtype d = (ct_dtype)dt;
        cti_register_kernel(CT_OP_SCATTER, CT_DEVICE_CUDA, d, k_scatter, "cuda_scatter");
        cti_register_kernel(CT_OP_SCATTER_REDUCE, CT_DEVICE_CUDA, d, k_scatter,
                            "cuda_scatter_reduce");
        cti_register_kernel(CT_OP_FLIP, CT_DEVICE_CUDA, d, k_remap, "cuda_remap");
        cti_register_kernel(CT_OP_ROLL, CT_DEVICE_CUDA, d, k_remap, "cuda_remap");
        cti_register_kernel(CT_OP_REPEAT, CT_DEVICE_CUDA, d, k_remap, "cuda_remap");
        cti_register_kernel(CT_OP_PAD, CT_DEVICE_CUDA, d, k_remap, "cuda_remap");
        if (!ct_dtype_is_floating(d)) continue;
        cti_register_kernel(CT_OP_INTERPOLATE, CT_DEVICE_CUDA, d, k_interp, "cuda_interpolate");
        cti_register_kernel(CT_OP_INTERPOLATE_BACKWARD, CT_DEVICE_CUDA, d, k_interp_bw,
                            "cuda_interpolate_backward");
        cti_register_kernel(CT_OP_UNFOLD, CT_DEVICE_CUDA, d, k_unfold, "cuda_im2col");
        cti_register_kernel(CT_OP_FOLD, CT_DEVICE_CUDA, d, k_fold, "cuda_col2im");
    }
}
