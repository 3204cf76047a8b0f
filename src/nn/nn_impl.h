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

#endif
