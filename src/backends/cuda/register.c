/* The CUDA backend's entry point: registers its allocator and fills the CUDA
 * column of the kernel table. Nothing here talks to the driver, so a
 * process that never touches a GPU never initializes CUDA. */
#include "cuda_impl.h"

void cti_cuda_register(void) {
    cti_cuda_register_allocator();
    cti_cuda_register_copy();
    cti_cuda_register_elementwise();
    cti_cuda_register_reduce();
    cti_cuda_register_random();
    cti_cuda_register_blas();
    cti_cuda_register_conv();
    cti_cuda_register_pool();
    cti_cuda_register_norm();
    cti_cuda_register_nn();
    cti_cuda_register_optim();
}
