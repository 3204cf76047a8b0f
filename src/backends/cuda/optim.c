/* CT_OP_SGD_STEP and CT_OP_ADAMW_STEP for CUDA tensors: the list of the
 * call's cti_optim_params (src/dispatch/schema.h: contiguous tensors of one
 * dtype on one device) in launches of optim.cu over up to CTI_CUDA_OPTIM_MAX
 * parameters each, so a model's step is usually one kernel. The per-parameter scalars are
 * computed here, on the host, from the step counts the optimizer keeps
 * there: nothing is read back from the device. */
#include "ops_impl.h"

static ct_status flush(const char *op, ct_call *c, int dev, cti_cuda_optim *o,
                       cudaStream_t stream) {
    if (o->n == 0) return CT_OK;
    cudaError_t e = cti_cuda_optim_step(o, cti_cuda_sm_count(dev), stream, &c->routine);
    o->n = 0;
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "an optimizer kernel launch", e);
    return cti_cuda_launched(op, dev, ct_op_name(c->op));
}

static void hparams(cti_cuda_optim *o, const cti_optim_params *p) {
    if (o->adamw) {
        const cti_adamw_hparams *h = &p->adamw;
        o->lr = h->lr;
        o->weight_decay = h->weight_decay;
        o->beta1 = h->beta1;
        o->beta2 = h->beta2;
        o->eps = h->eps;
    } else {
        const cti_sgd_hparams *h = &p->sgd;
        o->lr = h->lr;
        o->weight_decay = h->weight_decay;
        o->momentum = h->momentum;
        o->dampening = h->dampening;
        o->nesterov = h->nesterov;
    }
}

static ct_status k_optim(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    const cti_optim_params *prm = CTI_PARAMS(c, cti_optim_params);
    const cti_optim_list *l = &prm->list;
    int dev = l->param[0]->storage->device.index;
    bool adamw = c->op == CT_OP_ADAMW_STEP;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();

    cti_cuda_optim o;
    memset(&o, 0, sizeof o);
    o.adamw = adamw;
    o.dt = l->param[0]->dtype;
    hparams(&o, prm);
    bool has_momentum = !adamw && prm->sgd.momentum != 0;
    ct_status st = CT_OK;
    for (int64_t k = 0; k < l->n && st == CT_OK; k++) {
        ct_tensor *p = l->param[k];
        int64_t n = cti_numel(p->ndim, p->shape);
        if (n == 0) continue;
        int j = o.n++;
        o.p[j] = cti_data(p);
        o.g[j] = cti_data(l->grad[k]);
        o.s0[j] = adamw || has_momentum ? cti_data(l->state[0][k]) : NULL;
        o.s1[j] = adamw ? cti_data(l->state[1][k]) : NULL;
        o.numel[j] = n;
        if (adamw) {
            double step_size;
            const cti_adamw_hparams *h = &prm->adamw;
            cti_adamw_scalars(h->lr, h->beta1, h->beta2, l->step[k], &step_size, &o.a1[j]);
            o.a0[j] = -step_size;
        } else {
            o.a0[j] = l->step[k] == 1 ? 1 : 0;
        }
        if (o.n == CTI_CUDA_OPTIM_MAX) st = flush(op, c, dev, &o, stream);
    }
    if (st == CT_OK) st = flush(op, c, dev, &o, stream);
    return st;
}

void cti_cuda_register_optim(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        if (!cti_cuda_optim_supported(dts[k])) continue;
        cti_register_kernel(CT_OP_SGD_STEP, CT_DEVICE_CUDA, dts[k], k_optim,
                            "cten_sgd_step_multi_tensor");
        cti_register_kernel(CT_OP_ADAMW_STEP, CT_DEVICE_CUDA, dts[k], k_optim,
                            "cten_adamw_step_multi_tensor");
    }
}
