/* Private: the fused optimizer updates (CT_OP_SGD_STEP, CT_OP_ADAMW_STEP)
 * and the loss-scaling ops of a gradient scaler (CT_OP_AMP_UNSCALE,
 * CT_OP_AMP_UPDATE_SCALE), shared by their front ends (src/ops/optim.c,
 * src/ops/loss_scale.c) and the optimizers and scaler (src/nn/); the
 * kernels' contract is with their parameters in src/dispatch/schema.h.
 *
 * One call updates a list of parameters in place, each with its gradient and
 * its state tensors, in no-grad mode, with the formulas of include/tensor/nn.h:
 * one kernel per list on each backend instead of several elementwise ops per
 * parameter. Float32, float64, float16 and bfloat16 parameters; float16 and
 * bfloat16 compute in float32 and round the parameter and the states (which
 * have the parameter's dtype) once per update, or keep float32 master
 * weights and states and round only the parameter. */
#ifndef CTEN_OPTIM_IMPL_H
#define CTEN_OPTIM_IMPL_H

#include "ops_impl.h"

/* Front ends. Parameters whose gradient is NULL are skipped (their states
 * untouched). The list may mix devices and dtypes: it is split into one
 * dispatch per (device, dtype, masters or not, weight decay). Every tensor
 * is checked before any is written: parameters floating, gradients of the
 * parameter's shape, dtype and device, states likewise (float32 with
 * masters), masters float32 of the shape of a float16/bfloat16 parameter,
 * counts in memory 0-d float64 with a float64 [2] control tensor per
 * device, no parameter or state an expanded view or on the memory of
 * another, no grad mode in effect for tensors that require grad (as
 * in-place ops), per-entry weight decays (when given) finite and >= 0. A
 * found_inf on the CPU is read here (not zero: nothing is dispatched,
 * *updated all false); one on a device goes to the kernels, and then every
 * live entry must be on that device with its count in memory. Each written
 * tensor's version counter is bumped once per dispatch. A failure names op
 * ("ct_optim_step", ...) and the parameter's index. */
ct_status cti_sgd_step(const char *op, const cti_optim_list *l, const cti_sgd_hparams *h);
ct_status cti_adamw_step(const char *op, const cti_optim_list *l, const cti_adamw_hparams *h);
ct_status cti_adam_step(const char *op, const cti_optim_list *l, const cti_adam_hparams *h);
ct_status cti_rmsprop_step(const char *op, const cti_optim_list *l,
                           const cti_rmsprop_hparams *h);
ct_status cti_adagrad_step(const char *op, const cti_optim_list *l,
                           const cti_adagrad_hparams *h);

/* The scaler's non-finite check and unscale (CT_OP_AMP_UNSCALE) over the n
 * gradients grad[k] (NULL entries skipped), one dispatch per device: every
 * gradient must be on found_inf's device, found_inf and scale 0-d float32
 * there. Non-contiguous gradients go through contiguous copies written
 * back. Version counters of the gradients and found_inf are bumped. */
ct_status cti_amp_unscale(const char *op, int64_t n, ct_tensor *const *grad,
                          ct_tensor *found_inf, ct_tensor *scale);
/* The scale's update (CT_OP_AMP_UPDATE_SCALE) on scale (0-d float32),
 * growth_tracker (0-d int32) and found_inf (0-d float32), all on one
 * device; growth_factor > 1 is not checked here (the scaler does). */
ct_status cti_amp_update_scale(const char *op, ct_tensor *scale, ct_tensor *growth_tracker,
                               ct_tensor *found_inf, const cti_amp_update_params *p);

#endif
