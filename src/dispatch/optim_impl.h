/* Private: the fused optimizer updates (CT_OP_SGD_STEP, CT_OP_ADAMW_STEP),
 * shared by their front end (src/dispatch/optim.c), the optimizers
 * (src/nn/optim.c) and the backends' kernels.
 *
 * One call updates a list of parameters in place, each with its gradient and
 * its state tensors, in no-grad mode, with the formulas of include/tensor/nn.h:
 * one kernel per list on each backend instead of several elementwise ops per
 * parameter. Float32, float64, float16 and bfloat16 parameters; float16 and
 * bfloat16 compute in float32 and round the parameter and the states (which
 * have the parameter's dtype) once per update. */
#ifndef CTEN_OPTIM_IMPL_H
#define CTEN_OPTIM_IMPL_H

#include <math.h>

#include "dispatch_impl.h"

/* n parameters with their gradients and states. state[0] holds SGD's
 * momentum buffers (the array is NULL without momentum) or AdamW's exp_avg,
 * state[1] AdamW's exp_avg_sq. step[k] is parameter k's step count
 * including this update (>= 1): SGD starts its momentum buffer at step 1,
 * AdamW's bias corrections use it. updated (NULL: not wanted) receives
 * which parameters the call updated: all on success, those of the
 * (device, dtype) groups done before a failure otherwise. */
typedef struct cti_optim_list {
    int64_t n;
    ct_tensor *const *param;
    ct_tensor *const *grad;
    ct_tensor *const *state[2];
    const int64_t *step;
    bool *updated;
} cti_optim_list;

typedef struct cti_sgd_hparams {
    double lr, momentum, dampening, weight_decay;
    bool nesterov;
} cti_sgd_hparams;

typedef struct cti_adamw_hparams {
    double lr, beta1, beta2, eps, weight_decay;
} cti_adamw_hparams;

/* Front ends. Parameters whose gradient is NULL are skipped (their states
 * untouched). The list may mix devices and dtypes: it is split into one
 * dispatch per (device, dtype). Every tensor is checked before any is
 * written: parameters floating, gradients and states of the parameter's
 * shape, dtype and device, no parameter or state an expanded view or on the
 * memory of another, no grad mode in effect for tensors that require grad
 * (as in-place ops). Each written tensor's version counter is bumped once.
 * A failure names op ("ct_optim_step", ...) and the parameter's index. */
ct_status cti_sgd_step(const char *op, const cti_optim_list *l, const cti_sgd_hparams *h);
ct_status cti_adamw_step(const char *op, const cti_optim_list *l, const cti_adamw_hparams *h);

/* ---- the kernels' contract ------------------------------------------------------
 * call->ptr is a cti_optim_list whose tensors all have the dispatch dtype,
 * live on the dispatch device and are contiguous; in[] holds the first
 * parameter's tensors for the trace only. Parameters:
 *   SGD:   f[0] lr, f[1] momentum, f[2] dampening, f[3] weight_decay,
 *          i[0] nesterov;
 *   AdamW: f[0] lr, f[1] beta1, f[2] beta2, f[3] eps, f[4] weight_decay.
 * Per element, in double for float64 and float otherwise:
 *   SGD:   d = g + wd * p; momentum != 0: buf = step == 1 ? d : momentum * buf +
 *          (1 - dampening) * d, d = nesterov ? d + momentum * buf : buf;
 *          p = p - lr * d.
 *   AdamW: p = p * (1 - lr * wd); m = beta1 * m + (1 - beta1) * g;
 *          v = beta2 * v + (1 - beta2) * g * g;
 *          p = p - step_size * m / (sqrt(v) / bc2_sqrt + eps)
 *          with cti_adamw_scalars' per-parameter step_size and bc2_sqrt. */
static inline void cti_adamw_scalars(double lr, double beta1, double beta2, int64_t step,
                                     double *step_size, double *bc2_sqrt) {
    double bc1 = 1 - pow(beta1, (double)step), bc2 = 1 - pow(beta2, (double)step);
    *step_size = lr / bc1;
    *bc2_sqrt = sqrt(bc2);
}

#endif
