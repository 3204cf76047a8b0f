/* CT_OP_RMS_NORM, CT_OP_LAYER_NORM and their backward ops for CUDA tensors:
 * the CPU kernels' call records (src/backends/cpu/norm.c; cti_norm_params
 * rows, d, eps, every tensor contiguous as the front ends hand them over)
 * into launches of norm.cu.
 *   rms_norm:            in x, weight|NULL;                 out y, inv_rms
 *   rms_norm_backward:   in grad_y, x, weight|NULL, inv_rms; out dx|NULL, dweight|NULL
 *   layer_norm:          in x, weight|NULL, bias|NULL;      out y, mean, rstd
 *   layer_norm_backward: in grad_y, x, weight|NULL, mean, rstd;
 *                        out dx|NULL, dweight|NULL, dbias|NULL
 * The backward's weight and bias grads go through a scratch buffer of
 * per-block partial sums, taken from the caching allocator and released as
 * soon as the kernels are queued (reuse is ordered after them on the stream). */
#include <string.h>

#include "ops_impl.h"

static const void *opt_data(const ct_tensor *t) { return t ? cti_data(t) : NULL; }

static void *opt_out(const ct_call *c, int k) {
    return k < c->nout && c->out[k] ? cti_data(c->out[k]) : NULL;
}

static ct_status launch(ct_call *c, cti_cuda_norm *a, bool bwd) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    const ct_tensor *x = c->in[bwd ? 1 : 0];
    int dev = x->storage->device.index;
    a->dt = x->dtype;
    a->rows = p->rows;
    a->d = p->d;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    int sm = cti_cuda_sm_count(dev);
    ct_tensor *work = NULL;
    if (bwd) {
        size_t wb = cti_cuda_norm_work(a, sm);
        if (wb > 0) {
            int64_t n = (int64_t)wb;
            work = cti_tensor_new(op, 1, &n, CT_BOOL, CT_CUDA(dev));
            if (!work) return ct_last_status();
            a->work = cti_data(work);
        }
    }
    cudaError_t e = bwd ? cti_cuda_norm_backward(a, sm, stream, &c->routine)
                        : cti_cuda_norm_forward(a, sm, stream, &c->routine);
    ct_status st;
    if (e != cudaSuccess) st = cti_cuda_fail(op, dev, "a normalization kernel launch", e);
    else st = cti_cuda_launched(op, dev, ct_op_name(c->op));
    ct_tensor_release(work);
    return st;
}

static ct_status k_rms_norm(ct_call *c) {
    cti_cuda_norm a;
    memset(&a, 0, sizeof a);
    a.layer = false;
    a.eps = CTI_PARAMS(c, cti_norm_params)->eps;
    a.x = cti_data(c->in[0]);
    a.w = opt_data(c->in[1]);
    a.y = cti_data(c->out[0]);
    a.rstd_out = opt_out(c, 1);
    return launch(c, &a, false);
}

static ct_status k_rms_norm_backward(ct_call *c) {
    cti_cuda_norm a;
    memset(&a, 0, sizeof a);
    a.layer = false;
    a.g = cti_data(c->in[0]);
    a.x = cti_data(c->in[1]);
    a.w = opt_data(c->in[2]);
    a.rstd = cti_data(c->in[3]);
    a.y = opt_out(c, 0);
    a.dw = a.w ? opt_out(c, 1) : NULL;
    return launch(c, &a, true);
}

static ct_status k_layer_norm(ct_call *c) {
    cti_cuda_norm a;
    memset(&a, 0, sizeof a);
    a.layer = true;
    a.eps = CTI_PARAMS(c, cti_norm_params)->eps;
    a.x = cti_data(c->in[0]);
    a.w = opt_data(c->in[1]);
    a.b = opt_data(c->in[2]);
    a.y = cti_data(c->out[0]);
    a.mean_out = opt_out(c, 1);
    a.rstd_out = opt_out(c, 2);
    return launch(c, &a, false);
}

static ct_status k_layer_norm_backward(ct_call *c) {
    cti_cuda_norm a;
    memset(&a, 0, sizeof a);
    a.layer = true;
    a.g = cti_data(c->in[0]);
    a.x = cti_data(c->in[1]);
    a.w = opt_data(c->in[2]);
    a.mean = cti_data(c->in[3]);
    a.rstd = cti_data(c->in[4]);
    a.y = opt_out(c, 0);
    a.dw = a.w ? opt_out(c, 1) : NULL;
    a.db = opt_out(c, 2);
    return launch(c, &a, true);
}

void cti_cuda_register_norm(void) {
    static const ct_dtype dts[] = {CT_F16, CT_BF16, CT_F32, CT_F64};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        ct_dtype dt = dts[k];
        cti_register_kernel(CT_OP_RMS_NORM, CT_DEVICE_CUDA, dt, k_rms_norm, "cuda_rms_norm");
        cti_register_kernel(CT_OP_RMS_NORM_BACKWARD, CT_DEVICE_CUDA, dt, k_rms_norm_backward,
                            "cuda_rms_norm_backward");
        cti_register_kernel(CT_OP_LAYER_NORM, CT_DEVICE_CUDA, dt, k_layer_norm, "cuda_layer_norm");
        cti_register_kernel(CT_OP_LAYER_NORM_BACKWARD, CT_DEVICE_CUDA, dt, k_layer_norm_backward,
                            "cuda_layer_norm_backward");
    }
}
