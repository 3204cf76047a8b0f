/* What the library knows about its backends and the machine: the public
 * queries loop over the backends the build compiled in. */
#include <stdio.h>

#include "dispatch_impl.h"
#include "tensor/cuda.h"

bool ct_backend_available(ct_device_type device) {
    cti_init();
    return cti_backend_of(device) != NULL;
}

int ct_device_count(ct_device_type device) {
    cti_init();
    const cti_backend *b = cti_backend_of(device);
    return b ? b->device_count() : 0;
}

/* A setting, not a device property: it exists in every build so code that
 * sets it runs unchanged on machines without CUDA. */
static atomic_bool allow_tf32;

void ct_set_allow_tf32(bool allow) { atomic_store_explicit(&allow_tf32, allow, memory_order_relaxed); }

bool ct_allow_tf32(void) { return atomic_load_explicit(&allow_tf32, memory_order_relaxed); }

static _Atomic int64_t conv_direct_limit = (int64_t)1 << 26;

int64_t ct_cuda_conv_direct_limit(int64_t macs) {
    return macs < 0 ? atomic_load(&conv_direct_limit) : atomic_exchange(&conv_direct_limit, macs);
}

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
    const char *msg;
    if (cti_init_status(&msg) != CT_OK) fprintf(f, "  init FAILED: %s\n", msg);
    for (int d = 0; d < CT_NUM_DEVICE_TYPES; d++) {
        const cti_backend *b = cti_backend_of((ct_device_type)d);
        char name[16];
        ct_device_str((ct_device){(ct_device_type)d, 0}, name, sizeof name);
        name[strcspn(name, ":")] = '\0';
        const char *module = cti_module_path((ct_device_type)d);
        if (module) fprintf(f, "  %s: loaded from %s\n", name, module);
        if (b) b->print_info(f);
        else fprintf(f, "  %s: not loaded: %s\n", name, cti_backend_missing((ct_device_type)d));
    }
}
