/* Private: the parameter list's layout, shared by the layers, the
 * optimizers and gradient clipping. */
#ifndef CTEN_NN_IMPL_H
#define CTEN_NN_IMPL_H

#include "core/tensor_impl.h"
#include "tensor/autograd.h"
#include "tensor/nn.h"
#include "tensor/ops.h"

struct ct_params {
    int64_t n, cap;
    char **names;       /* owned copies */
    ct_tensor **tensors; /* retained handles */
};

#endif
