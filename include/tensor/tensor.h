/* cten: a tensor library in C in the spirit of PyTorch's ATen. Include this. */
#ifndef CTEN_TENSOR_H
#define CTEN_TENSOR_H

#include "types.h"
#include "core.h"
#include "ops.h"
#include "dispatch.h"
#include "autograd.h"
#include "nn.h"
#include "io.h"
#include "cuda.h"

#endif
