#include "cuda_impl.h"

void cti_cuda_register_pool(void) {}
