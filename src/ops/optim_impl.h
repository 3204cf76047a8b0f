/* Private: the fused optimizer updates (CT_OP_SGD_STEP, CT_OP_ADAMW_STEP),
 * shared by their front end (src/ops/optim.c) and the optimizers
 * (src/nn/optim.c); the kernels' contract is with their parameters in
 * src/dispatch/schema.h.
 *
 * One call updates a list of parameters in place, each with its gradient and
 * its state tensors, in no-grad mode, with the formulas of include/tensor/nn.h:
 * one kernel per list on each backend instead of several elementwise ops per
 * parameter. Float32, float64, float16 and bfloat16 parameters; float16 and
 * bfloat16 compute in float32 and round the parameter and the states (which
 * have the parameter's dtype) once per update. */
#ifndef CTEN_OPTIM_IMPL_H
#define CTEN_OPTIM_IMPL_H

#include "ops_impl.h"

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

#endif
