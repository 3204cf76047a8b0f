/* What the library knows about itself and the machine. */
#include <stdio.h>

#include "backends/cpu/cpu_impl.h"
#include "dispatch_impl.h"

const char *ct_blas_info(void) {
    cti_init();
    return cti_cpu_blas_info();
}

bool ct_backend_available(ct_device_type device) { return device == CT_DEVICE_CPU; }

int ct_device_count(ct_device_type device) { return device == CT_DEVICE_CPU ? 1 : 0; }

void ct_print_info(void *file) {
    FILE *f = file ? (FILE *)file : stdout;
    cti_init();
    int kernels[CT_NUM_DEVICE_TYPES] = {0};
    for (int op = 0; op < CT_NUM_OPS; op++)
        for (int d = 0; d < CT_NUM_DEVICE_TYPES; d++)
            for (int t = 0; t < CT_NUM_DTYPES; t++)
                kernels[d] += ct_supports((ct_op)op, (ct_device_type)d, (ct_dtype)t);
    fprintf(f, "cten %s\n", CT_VERSION_STRING);
    fprintf(f, "  dispatcher: %d ops, %d CPU kernels, %d CUDA kernels\n", (int)CT_NUM_OPS,
            kernels[CT_DEVICE_CPU], kernels[CT_DEVICE_CUDA]);
    fprintf(f, "  cpu: %d threads (ct_set_num_threads / CT_NUM_THREADS)\n", ct_get_num_threads());
    fprintf(f, "    BLAS: %s\n", cti_cpu_blas_info());
    fprintf(f, "  cuda: %s\n", ct_backend_available(CT_DEVICE_CUDA)
                                   ? "compiled in"
                                   : "not compiled in (built without the CUDA backend)");
}
