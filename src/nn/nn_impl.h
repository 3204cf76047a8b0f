/* Private: the parameter list's layout, shared by the layers, the
 * optimizers and gradient clipping. */
#ifndef CTEN_NN_IMPL_H
#define CTEN_NN_IMPL_H

#include "core/hashmap.h"
#include "core/tensor_impl.h"
#include "tensor/autograd.h"
#include "tensor/nn.h"
#include "tensor/ops.h"

struct ct_params {
    int64_t n, cap;
    char **names;       /* owned copies */
    ct_tensor **tensors; /* retained handles */
    /* name -> index and tensor -> index, so that adding and finding stay
     * constant time in lists of a checkpoint's size */
    cti_hmap by_name, by_tensor;
};

/* Removes the last entry (the undo of a ct_params_add), dropping its
 * reference. */
void cti_params_pop(ct_params *p);

/* ct_optim_step with op naming errors and an optional found_inf (0-d
 * float32; NULL: none) that skips the update where it is not zero: read on
 * the host for a CPU tensor, by the kernels for a device one (the
 * parameters must then be on its device). */
ct_status cti_optim_step_with(const char *op, ct_optimizer *opt, ct_tensor *found_inf);
/* The optimizer's parameter count and parameter k (borrowed). */
int64_t cti_optim_count(const ct_optimizer *opt);
ct_tensor *cti_optim_param(const ct_optimizer *opt, int64_t k);

#endif
