/* What the library knows about itself and the machine. */
#include <stdio.h>

#include "backends/cpu/cpu_impl.h"
#include "dispatch_impl.h"
#include "tensor/cuda.h"

#ifdef CTEN_HAVE_CUDA
const char *cti_cuda_unavailable_reason(void); /* src/backends/cuda/device.c */
#endif

const char *ct_blas_info(void) {
    cti_init();
    return cti_cpu_blas_info();
}

bool ct_backend_available(ct_device_type device) {
#ifdef CTEN_HAVE_CUDA
    if (device == CT_DEVICE_CUDA) return true;
#endif
    return device == CT_DEVICE_CPU;
}

int ct_device_count(ct_device_type device) {
    if (device == CT_DEVICE_CPU) return 1;
    return device == CT_DEVICE_CUDA ? ct_cuda_device_count() : 0;
}

/* A setting, not a device property: it exists in every build so code that
 * sets it runs unchanged on machines without CUDA. */
static atomic_bool allow_tf32;

void ct_set_allow_tf32(bool allow) { atomic_store_explicit(&allow_tf32, allow, memory_order_relaxed); }

bool ct_allow_tf32(void) { return atomic_load_explicit(&allow_tf32, memory_order_relaxed); }

#ifndef CTEN_HAVE_CUDA
/* The CUDA API of a build without the backend: no devices, and every call
 * that needs one says why it fails. */
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
#endif

#ifdef CTEN_HAVE_CUDA
/* "13.0" from 13000 (driver, runtime); "9.13.0" from 91300 (cuBLAS, cuDNN). */
static const char *version_s(int v, bool three, char *buf, size_t n) {
    if (three) snprintf(buf, n, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
    else snprintf(buf, n, "%d.%d", v / 1000, v % 1000 / 10);
    return buf;
}
#endif

static void print_cuda(FILE *f) {
#ifdef CTEN_HAVE_CUDA
    int n = ct_cuda_device_count();
    if (n == 0) {
        fprintf(f, "  cuda: compiled in, no device usable: %s\n", cti_cuda_unavailable_reason());
        return;
    }
    ct_cuda_device_props p;
    char v[4][16];
    ct_cuda_get_device_properties(0, &p);
    fprintf(f, "  cuda: driver %s, runtime %s, cuBLAS %s, cuDNN %s; TF32 matmul %s\n",
            version_s(p.driver_version, false, v[0], 16),
            version_s(p.runtime_version, false, v[1], 16),
            version_s(p.cublas_version, true, v[2], 16), version_s(p.cudnn_version, true, v[3], 16),
            ct_allow_tf32() ? "allowed" : "off (ct_set_allow_tf32)");
    for (int i = 0; i < n; i++) {
        if (ct_cuda_get_device_properties(i, &p) != CT_OK) continue;
        fprintf(f, "    cuda:%d %s, compute capability %d.%d, %d SMs at %.2f GHz\n", i, p.name,
                p.major, p.minor, p.multiprocessors, p.clock_khz / 1e6);
        fprintf(f,
                "      memory %.1f GiB (%d-bit bus at %.2f GHz%s), L2 %.0f MiB, shared memory "
                "%zu KiB/SM, %zu KiB/block; PCI %04x:%02x:%02x\n",
                (double)p.total_memory / (1 << 30), p.memory_bus_width, p.memory_clock_khz / 1e6,
                p.ecc_enabled ? ", ECC" : "", (double)p.l2_cache_bytes / (1 << 20),
                p.shared_memory_per_multiprocessor >> 10, p.shared_memory_per_block_optin >> 10,
                p.pci_domain, p.pci_bus, p.pci_device);
    }
#else
    fprintf(f, "  cuda: not compiled in (built without the CUDA backend)\n");
#endif
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
    fprintf(f, "  cpu: %d threads (ct_set_num_threads / CT_NUM_THREADS)\n", ct_get_num_threads());
    fprintf(f, "    BLAS: %s\n", cti_cpu_blas_info());
    print_cuda(f);
}
