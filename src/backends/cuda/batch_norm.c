/* CT_OP_BATCH_NORM and CT_OP_BATCH_NORM_BACKWARD for CUDA tensors: the
 * CPU kernels' call records (src/backends/cpu/batch_norm.c;
 * cti_batch_norm_params, every tensor contiguous as the front end hands it
 * over) into launches of batch_norm.cu.
 *   batch_norm:          in x, weight|NULL, bias|NULL, mean|NULL, var|NULL;
 *                        out y, and with training mean, var
 *   batch_norm_backward: in grad_y, x, weight|NULL, mean, var;
 *                        out dx|NULL, dweight|NULL, dbias|NULL */
#include <string.h>

#include "batch_norm_impl.h"

static const void *opt(const ct_tensor *t) { return t ? cti_data(t) : NULL; }

static void *opt_out(const ct_call *c, int k) {
    return k < c->nout && c->out[k] ? cti_data(c->out[k]) : NULL;
}

static ct_status launch(ct_call *c, cti_cuda_bn *a, bool bwd) {
    const cti_batch_norm_params *p = CTI_PARAMS(c, cti_batch_norm_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    const ct_tensor *x = c->in[bwd ? 1 : 0];
    int dev = x->storage->device.index;
    for (int k = 0; k < c->nin; k++) {
        const ct_tensor *t = c->in[k];
        if (t && (t->storage->device.type != CT_DEVICE_CUDA || t->storage->device.index != dev))
            return cti_error(CT_ERR_DEVICE, "%s: operand %s is not on cuda:%d", op, cti_desc(t),
                             dev);
    }
    if (p->C > 0x7fffffff)
        return cti_error(CT_ERR_OVERFLOW, "%s: %lld channels exceed a grid of 2^31 - 1 blocks",
                         op, (long long)p->C);
    a->dt = x->dtype;
    a->N = p->N;
    a->C = p->C;
    a->S = p->S;
    a->eps = p->eps;
    a->training = p->training;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    if (p->N * p->S == 0 || p->C == 0) {
        /* nothing to normalize: the weight and bias gradients are sums of nothing */
        c->routine = "none (empty)";
        size_t bytes = (size_t)p->C * ct_dtype_size(x->dtype);
        cudaError_t z = cudaSuccess;
        if (bwd && a->dw && bytes) z = cudaMemsetAsync(a->dw, 0, bytes, stream);
        if (bwd && a->db && bytes && z == cudaSuccess) z = cudaMemsetAsync(a->db, 0, bytes, stream);
        if (z != cudaSuccess) return cti_cuda_fail(op, dev, "cudaMemsetAsync", z);
        return cti_cuda_launched(op, dev, ct_op_name(c->op));
    }
    cudaError_t e = bwd ? cti_cuda_batch_norm_backward(a, stream, &c->routine)
                        : cti_cuda_batch_norm_forward(a, stream, &c->routine);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "a batch norm kernel launch", e);
    return cti_cuda_launched(op, dev, ct_op_name(c->op));
}

static ct_status k_batch_norm(ct_call *c) {
    cti_cuda_bn a;
    memset(&a, 0, sizeof a);
    a.x = cti_data(c->in[0]);
    a.w = opt(c->in[1]);
    a.b = opt(c->in[2]);
    a.mean_in = opt(c->in[3]);
    a.var_in = opt(c->in[4]);
    a.y = cti_data(c->out[0]);
    a.mean_out = opt_out(c, 1);
    a.var_out = opt_out(c, 2);
    return launch(c, &a, false);
}

static ct_status k_batch_norm_backward(ct_call *c) {
    cti_cuda_bn a;
    memset(&a, 0, sizeof a);
    a.dy = cti_data(c->in[0]);
    a.x = cti_data(c->in[1]);
    a.w = opt(c->in[2]);
    a.mean_in = cti_data(c->in[3]);
    a.var_in = cti_data(c->in[4]);
    a.dx = opt_out(c, 0);
    a.dw = opt_out(c, 1);
    a.db = opt_out(c, 2);
    return launch(c, &a, true);
}

void cti_cuda_register_batch_norm(void) {
    static const ct_dtype dts[] = {CT_F16, CT_BF16, CT_F32, CT_F64};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        cti_register_kernel(CT_OP_BATCH_NORM, CT_DEVICE_CUDA, dts[k], k_batch_norm,
                            "cuda_batch_norm");
        cti_register_kernel(CT_OP_BATCH_NORM_BACKWARD, CT_DEVICE_CUDA, dts[k],
                            k_batch_norm_backward, "cuda_batch_norm_backward");
    }
}
