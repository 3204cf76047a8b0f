/* CT_OP_RMS_NORM, CT_OP_LAYER_NORM, the fused CT_OP_ADD_RMS_NORM and
 * CT_OP_ADD_LAYER_NORM (schema.h) and their backward ops for CUDA tensors:
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

/* ref: the tensor whose device runs the kernels and whose dtype is the
 * record's (x; the fused ops' sum). */
static ct_status launch(ct_call *c, cti_cuda_norm *a, bool bwd, const ct_tensor *ref) {
    const cti_norm_params *p = CTI_PARAMS(c, cti_norm_params);
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    int dev = ref->storage->device.index;
    a->dt = ref->dtype;
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
    return launch(c, &a, false, c->in[0]);
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
    return launch(c, &a, true, c->in[1]);
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
    return launch(c, &a, false, c->in[0]);
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
    return launch(c, &a, true, c->in[1]);
}

/* add_rms_norm / add_layer_norm: in x, residual, weight|NULL(, bias|NULL);
 * out y, sum, then inv_rms or mean and rstd. */
static ct_status k_add_norm(ct_call *c) {
    bool layer = c->op == CT_OP_ADD_LAYER_NORM;
    cti_cuda_norm a;
    memset(&a, 0, sizeof a);
    a.add = true;
    a.layer = layer;
    a.eps = CTI_PARAMS(c, cti_norm_params)->eps;
    a.x = cti_data(c->in[0]);
    a.xdt = c->in[0]->dtype;
    a.res = cti_data(c->in[1]);
    a.rdt = c->in[1]->dtype;
    a.w = opt_data(c->in[2]);
    a.b = layer ? opt_data(c->in[3]) : NULL;
    a.y = cti_data(c->out[0]);
    a.ydt = c->out[0]->dtype;
    a.sum = cti_data(c->out[1]);
    if (layer) {
        a.mean_out = opt_out(c, 2);
        a.rstd_out = opt_out(c, 3);
    } else {
        a.rstd_out = opt_out(c, 2);
    }
    return launch(c, &a, false, c->out[1]);
}

/* Their backward: in grad_y, grad_sum|NULL, sum, weight|NULL, then inv_rms or
 * mean and rstd; out dx|NULL, dresidual|NULL, dweight|NULL(, dbias|NULL). */
static ct_status k_add_norm_backward(ct_call *c) {
    bool layer = c->op == CT_OP_ADD_LAYER_NORM_BACKWARD;
    cti_cuda_norm a;
    memset(&a, 0, sizeof a);
    a.add = true;
    a.layer = layer;
    a.g = cti_data(c->in[0]);
    a.ydt = c->in[0]->dtype;
    a.gsum = opt_data(c->in[1]);
    a.x = cti_data(c->in[2]);
    a.w = opt_data(c->in[3]);
    if (layer) {
        a.mean = cti_data(c->in[4]);
        a.rstd = cti_data(c->in[5]);
    } else {
        a.rstd = cti_data(c->in[4]);
    }
    a.y = opt_out(c, 0);
    a.xdt = c->out[0] ? c->out[0]->dtype : c->in[2]->dtype;
    a.dres = opt_out(c, 1);
    a.rdt = c->out[1] ? c->out[1]->dtype : c->in[2]->dtype;
    a.dw = a.w ? opt_out(c, 2) : NULL;
    a.db = layer ? opt_out(c, 3) : NULL;
    return launch(c, &a, true, c->in[2]);
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
        cti_register_kernel(CT_OP_ADD_RMS_NORM, CT_DEVICE_CUDA, dt, k_add_norm, "cuda_add_rms_norm");
        cti_register_kernel(CT_OP_ADD_RMS_NORM_BACKWARD, CT_DEVICE_CUDA, dt, k_add_norm_backward,
                            "cuda_add_rms_norm_backward");
        cti_register_kernel(CT_OP_ADD_LAYER_NORM, CT_DEVICE_CUDA, dt, k_add_norm,
                            "cuda_add_layer_norm");
        cti_register_kernel(CT_OP_ADD_LAYER_NORM_BACKWARD, CT_DEVICE_CUDA, dt, k_add_norm_backward,
                            "cuda_add_layer_norm_backward");
    }
}
