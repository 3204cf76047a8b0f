/* What the GPU test programs share about the CUDA module: they start only
 * where it loaded and a device is usable, and reach its internals (and the
 * CUDA runtime it links) by looking them up, so they link neither and build
 * and skip on any machine. */
#ifndef CTEN_TESTS_CUDA_MODULE_H
#define CTEN_TESTS_CUDA_MODULE_H

#include <stdio.h>
#include <stdlib.h>

#include "dispatch/dispatch_impl.h"
#include "tensor/tensor.h"

/* meson's exit status for a test that did not run: "Skipped" in its summary. */
#define TU_EXIT_SKIP 77

/* The number of usable CUDA devices; without one, says why on stderr and
 * exits with TU_EXIT_SKIP. */
static inline int tu_cuda_devices_or_skip(const char *prog) {
    int n = ct_device_count(CT_DEVICE_CUDA);
    if (n > 0) return n;
    const char *why = cti_backend_missing(CT_DEVICE_CUDA);
    ct_cuda_device_props p;
    if (!*why) why = ct_cuda_get_device_properties(0, &p) == CT_OK ? "" : ct_last_error();
    fprintf(stderr, "[ %s ] no usable GPU, skipped: %s\n", prog, why);
    exit(TU_EXIT_SKIP);
}

/* name in the loaded CUDA module or the libraries it links; exits with a
 * message when it is missing (the module and the test disagree). */
static inline void *tu_cuda_symbol(const char *name) {
    void *p = cti_module_symbol(CT_DEVICE_CUDA, name);
    if (!p) {
        fprintf(stderr, "the CUDA module has no %s\n", name);
        exit(EXIT_FAILURE);
    }
    return p;
}

#endif
