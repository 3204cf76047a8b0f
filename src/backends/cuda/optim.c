/* CT_OP_SGD_STEP and CT_OP_ADAMW_STEP for CUDA tensors: the list of the
 * call's cti_optim_params (src/dispatch/schema.h: contiguous tensors of one
 * dtype on one device) in launches of optim.cu over up to CTI_CUDA_OPTIM_MAX
 * parameters each, so a model's step is usually a few kernels. Host counts
 * go into the launch as numbers, counts in memory and found_inf as
 * addresses the kernel reads: nothing is read back from the device, so the
 * launches record into a CUDA graph as they are.
 *
 * CT_OP_AMP_UNSCALE and CT_OP_AMP_UPDATE_SCALE (a gradient scaler's ops):
 * the gradients in launches over up to CTI_CUDA_AMP_MAX tensors of any
 * floating dtypes, and a one-thread kernel for the scale's update. */
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
    if (o->kind == CTI_CUDA_OPT_ADAM) {
        const cti_adam_hparams *h = &p->adam;
        o->lr = h->lr;
        o->weight_decay = h->weight_decay;
        o->beta1 = h->beta1;
        o->beta2 = h->beta2;
        o->eps = h->eps;
        o->amsgrad = h->amsgrad;
    } else if (o->kind == CTI_CUDA_OPT_RMSPROP) {
        const cti_rmsprop_hparams *h = &p->rmsprop;
        o->lr = h->lr;
        o->weight_decay = h->weight_decay;
        o->beta1 = h->alpha;
        o->eps = h->eps;
        o->momentum = h->momentum;
        o->centered = h->centered;
    } else if (o->kind == CTI_CUDA_OPT_ADAGRAD) {
        const cti_adagrad_hparams *h = &p->adagrad;
        o->lr = h->lr;
        o->weight_decay = h->weight_decay;
        o->lr_decay = h->lr_decay;
        o->eps = h->eps;
    } else if (o->adamw) {
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

static ct_tensor *entry(ct_tensor *const *a, int64_t k) { return a ? a[k] : NULL; }

static ct_status k_optim(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    const cti_optim_params *prm = CTI_PARAMS(c, cti_optim_params);
    const cti_optim_list *l = &prm->list;
    int dev = l->param[0]->storage->device.index;
    bool adamw = c->op == CT_OP_ADAMW_STEP;
    int kind = adamw                          ? CTI_CUDA_OPT_ADAMW
               : c->op == CT_OP_ADAM_STEP    ? CTI_CUDA_OPT_ADAM
               : c->op == CT_OP_RMSPROP_STEP ? CTI_CUDA_OPT_RMSPROP
               : c->op == CT_OP_ADAGRAD_STEP ? CTI_CUDA_OPT_ADAGRAD
                                             : CTI_CUDA_OPT_SGD;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();

    cti_cuda_optim o;
    memset(&o, 0, sizeof o);
    o.adamw = adamw;
    o.kind = kind;
    o.dt = l->param[0]->dtype;
    o.master = l->master != NULL;
    /* the front end groups entries by the dtype of their lasting autocast
     * cast, so one list has all or none, of one dtype */
    o.copy_dt = l->copy && l->copy[0] ? l->copy[0]->dtype : CT_NUM_DTYPES;
    o.found_inf = l->found_inf ? (const float *)cti_data(l->found_inf) : NULL;
    hparams(&o, prm);
    ct_tensor *const *st3[3] = {l->state[0], l->state[1], l->state[2]};
    ct_status st = CT_OK;
    for (int64_t k = 0; k < l->n && st == CT_OK; k++) {
        ct_tensor *p = l->param[k], *ms = entry(l->master, k), *cnt = entry(l->step_t, k);
        int64_t n = cti_numel(p->ndim, p->shape);
        /* A zero-size parameter needs the kernel only to advance its count. */
        if (n == 0 && !cnt) continue;
        int j = o.n++;
        o.p[j] = cti_data(ms ? ms : p);
        o.g[j] = cti_data(l->grad[k]);
        /* the states the op uses are present, the others NULL (schema.h) */
        o.s0[j] = st3[0] ? cti_data(st3[0][k]) : NULL;
        o.s1[j] = st3[1] ? cti_data(st3[1][k]) : NULL;
        o.s2[j] = st3[2] ? cti_data(st3[2][k]) : NULL;
        ct_tensor *cp = ms ? NULL : entry(l->copy, k);
        o.model[j] = ms ? cti_data(p) : cp ? cti_data(cp) : NULL;
        o.step[j] = cnt ? (double *)cti_data(cnt) : NULL;
        o.cnt[j] = cnt ? 0 : (double)l->step[k];
        if (cnt) o.ctl = (double *)cti_data(l->ctl[k]);
        o.numel[j] = n;
        if (o.n == CTI_CUDA_OPTIM_MAX) st = flush(op, c, dev, &o, stream);
    }
    if (st == CT_OK) st = flush(op, c, dev, &o, stream);
    return st;
}

static ct_status k_amp_unscale(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    const cti_amp_unscale_params *prm = CTI_PARAMS(c, cti_amp_unscale_params);
    int dev = prm->found_inf->storage->device.index;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    cti_cuda_unscale u;
    memset(&u, 0, sizeof u);
    u.found_inf = (float *)cti_data(prm->found_inf);
    u.scale = (const float *)cti_data(prm->scale);
    for (int64_t k = 0; k <= prm->n; k++) {
        if (u.n == CTI_CUDA_AMP_MAX || (k == prm->n && u.n > 0)) {
            cudaError_t e = cti_cuda_amp_unscale(&u, cti_cuda_sm_count(dev), stream, &c->routine);
            u.n = 0;
            if (e != cudaSuccess) return cti_cuda_fail(op, dev, "an unscale kernel launch", e);
            ct_status st = cti_cuda_launched(op, dev, ct_op_name(c->op));
            if (st != CT_OK) return st;
        }
        if (k == prm->n) break;
        ct_tensor *g = prm->grad[k];
        int64_t n = cti_numel(g->ndim, g->shape);
        if (n == 0) continue;
        u.x[u.n] = cti_data(g);
        u.numel[u.n] = n;
        u.dt[u.n++] = g->dtype;
    }
    return CT_OK;
}

static ct_status k_amp_update(ct_call *c) {
    char label[48];
    const char *op = cti_cuda_op_label(c->op, label, sizeof label);
    const cti_amp_update_params *p = CTI_PARAMS(c, cti_amp_update_params);
    int dev = c->in[0]->storage->device.index;
    cudaStream_t stream;
    if (cti_cuda_begin(op, dev, &stream) != CT_OK) return ct_last_status();
    cudaError_t e = cti_cuda_amp_update_scale(
        (float *)cti_data(c->in[0]), (int32_t *)cti_data(c->in[1]),
        (const float *)cti_data(c->in[2]), p->growth_factor, p->backoff_factor,
        p->growth_interval, stream);
    if (e != cudaSuccess) return cti_cuda_fail(op, dev, "the scale update's launch", e);
    c->routine = "cten_amp_update_scale";
    return cti_cuda_launched(op, dev, ct_op_name(c->op));
}

void cti_cuda_register_optim(void) {
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t k = 0; k < sizeof dts / sizeof dts[0]; k++) {
        if (!cti_cuda_optim_supported(dts[k])) continue;
        cti_register_kernel(CT_OP_SGD_STEP, CT_DEVICE_CUDA, dts[k], k_optim,
                            "cten_sgd_step_multi_tensor");
        cti_register_kernel(CT_OP_ADAMW_STEP, CT_DEVICE_CUDA, dts[k], k_optim,
                            "cten_adamw_step_multi_tensor");
        cti_register_kernel(CT_OP_ADAM_STEP, CT_DEVICE_CUDA, dts[k], k_optim,
                            "cten_adam_step_multi_tensor");
        cti_register_kernel(CT_OP_RMSPROP_STEP, CT_DEVICE_CUDA, dts[k], k_optim,
                            "cten_rmsprop_step_multi_tensor");
        cti_register_kernel(CT_OP_ADAGRAD_STEP, CT_DEVICE_CUDA, dts[k], k_optim,
                            "cten_adagrad_step_multi_tensor");
        cti_register_kernel(CT_OP_AMP_UNSCALE, CT_DEVICE_CUDA, dts[k], k_amp_unscale,
                            "cten_amp_non_finite_check_and_unscale_multi_tensor");
    }
    cti_register_kernel(CT_OP_AMP_UPDATE_SCALE, CT_DEVICE_CUDA, CT_F32, k_amp_update,
                        "cten_amp_update_scale");
}
