/* The CPU backend's entry point: fills the CPU column of the kernel table. */
#include "cpu_impl.h"

void cti_cpu_register(void) {
    cti_blas_init();
    cti_cpu_register_copy();
    cti_cpu_register_elementwise();
    cti_cpu_register_reduce();
    cti_cpu_register_linalg();
    cti_cpu_register_conv();
    cti_cpu_register_nn();
    cti_cpu_register_optim();
}
