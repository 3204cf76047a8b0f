/* The CPU backend: its entry in the backend list, which fills the CPU
 * column of the kernel table. */
#include "cpu_impl.h"

static void cpu_register(void) {
    cti_blas_init();
    cti_cpu_register_copy();
    cti_cpu_register_elementwise();
    cti_cpu_register_reduce();
    cti_cpu_register_linalg();
    cti_cpu_register_conv();
    cti_cpu_register_norm();
    cti_cpu_register_softmax();
    cti_cpu_register_loss();
    cti_cpu_register_embedding();
    cti_cpu_register_dropout();
    cti_cpu_register_optim();
}

static int cpu_device_count(void) { return 1; }

static void cpu_print_info(FILE *f) {
    fprintf(f, "  cpu: %d threads (ct_set_num_threads / CT_NUM_THREADS)\n", cti_cpu_threads());
    fprintf(f, "    BLAS: %s\n", cti_cpu_blas_info());
}

static ct_status cpu_synchronize(int device) {
    (void)device;
    return CT_OK;
}

const cti_backend cti_backend_cpu = {
    .name = "cpu",
    .device = CT_DEVICE_CPU,
    .register_kernels = cpu_register,
    .device_count = cpu_device_count,
    .print_info = cpu_print_info,
    .synchronize = cpu_synchronize,
};

const char *ct_blas_info(void) {
    cti_init();
    return cti_cpu_blas_info();
}
