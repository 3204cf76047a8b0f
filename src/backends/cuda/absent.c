/* The CUDA API of a build without the CUDA backend: no devices, and every
 * call that needs one says why it fails. The build compiles this file in
 * place of the backend, which is then absent from the backend list. */
#include "core/tensor_impl.h"
#include "tensor/cuda.h"

static ct_status no_cuda(const char *op) {
    return cti_error(CT_ERR_DEVICE, "%s: cten was built without the CUDA backend", op);
}

bool ct_cuda_available(void) { return false; }

int ct_cuda_device_count(void) { return 0; }

ct_status ct_cuda_get_device_properties(int device, ct_cuda_device_props *props) {
    return no_cuda("ct_cuda_get_device_properties");
}

ct_status ct_cuda_synchronize(int device) { return no_cuda("ct_cuda_synchronize"); }

void *ct_cuda_stream(int device) {
    (void)device;
    no_cuda("ct_cuda_stream");
    return NULL;
}

ct_status ct_cuda_memory_stats(int device, ct_cuda_memstats *stats) {
    return no_cuda("ct_cuda_memory_stats");
}

ct_status ct_cuda_reset_peak_memory_stats(int device) {
    return no_cuda("ct_cuda_reset_peak_memory_stats");
}

ct_status ct_cuda_empty_cache(int device) { return no_cuda("ct_cuda_empty_cache"); }
