/* Device discovery and properties. The driver is asked once, on the first
 * question about CUDA devices, so programs that only use the CPU never pay
 * for initializing CUDA. */
#include <cublasLt.h>
#include <cudnn.h>
#include <pthread.h>
#include <stdio.h>

#include "cuda_impl.h"

static pthread_once_t discover_once = PTHREAD_ONCE_INIT;
static int device_count;
static char unavailable[256];
static ct_cuda_device_props props[CTI_CUDA_MAX_DEVICES];

static int attribute(enum cudaDeviceAttr a, int dev) {
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return v;
}

static void library_versions(int *driver, int *runtime) {
    if (cudaDriverGetVersion(driver) != cudaSuccess) *driver = 0;
    if (cudaRuntimeGetVersion(runtime) != cudaSuccess) *runtime = 0;
    cudaGetLastError();
}

static bool query(int dev, ct_cuda_device_props *p, int driver, int runtime) {
    struct cudaDeviceProp d;
    if (cudaGetDeviceProperties(&d, dev) != cudaSuccess) {
        cudaGetLastError();
        return false;
    }
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", d.name);
    p->major = d.major;
    p->minor = d.minor;
    p->multiprocessors = d.multiProcessorCount;
    p->max_threads_per_multiprocessor = d.maxThreadsPerMultiProcessor;
    p->warp_size = d.warpSize;
    p->clock_khz = attribute(cudaDevAttrClockRate, dev);
    p->memory_clock_khz = attribute(cudaDevAttrMemoryClockRate, dev);
    p->memory_bus_width = d.memoryBusWidth;
    p->total_memory = d.totalGlobalMem;
    p->l2_cache_bytes = (size_t)d.l2CacheSize;
    p->shared_memory_per_block_optin = d.sharedMemPerBlockOptin;
    p->shared_memory_per_multiprocessor = d.sharedMemPerMultiprocessor;
    p->pci_domain = d.pciDomainID;
    p->pci_bus = d.pciBusID;
    p->pci_device = d.pciDeviceID;
    p->ecc_enabled = d.ECCEnabled != 0;
    p->driver_version = driver;
    p->runtime_version = runtime;
    p->cublas_version = (int)cublasLtGetVersion();
    p->cudnn_version = (int)cudnnGetVersion();
    return true;
}

static void discover(void) {
    int n = 0, driver = 0, runtime = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(unavailable, sizeof unavailable,
                 "no usable CUDA driver or device (cudaGetDeviceCount: %s, %s)",
                 cudaGetErrorString(e), cudaGetErrorName(e));
        cudaGetLastError();
        return;
    }
    if (n == 0) {
        snprintf(unavailable, sizeof unavailable, "the CUDA driver reports no device");
        return;
    }
    if (n > CTI_CUDA_MAX_DEVICES) n = CTI_CUDA_MAX_DEVICES;
    library_versions(&driver, &runtime);
    int ok = 0;
    for (int i = 0; i < n; i++) {
        if (!query(i, &props[i], driver, runtime)) break;
        ok++;
    }
    device_count = ok;
    if (ok == 0)
        snprintf(unavailable, sizeof unavailable,
                 "cudaGetDeviceProperties failed for every device");
}

int cti_cuda_device_count(void) {
    pthread_once(&discover_once, discover);
    return device_count;
}

const char *cti_cuda_unavailable_reason(void) {
    pthread_once(&discover_once, discover);
    return unavailable;
}

int cti_cuda_sm_count(int device) {
    if (device < 0 || device >= cti_cuda_device_count()) return 1;
    return props[device].multiprocessors > 0 ? props[device].multiprocessors : 1;
}

ct_status cti_cuda_check_device(const char *op, int index) {
    int n = cti_cuda_device_count();
    if (n == 0)
        return cti_error(CT_ERR_DEVICE, "%s: device cuda:%d is not available: %s", op, index,
                         unavailable);
    if (index < 0 || index >= n)
        return cti_error(CT_ERR_DEVICE,
                         "%s: device cuda:%d is not available (%d CUDA device%s present, "
                         "valid indices 0..%d)",
                         op, index, n, n == 1 ? "" : "s", n - 1);
    return CT_OK;
}

/* ---- public API (forwarded by the library, cuda_api.h) --------------------------------- */

ct_status cti_cuda_get_device_properties(int device, ct_cuda_device_props *out) {
    static const char op[] = "ct_cuda_get_device_properties";
    if (!out) return cti_error(CT_ERR_INVALID_ARG, "%s: props is NULL", op);
    if (cti_cuda_check_device(op, device) != CT_OK) return ct_last_status();
    *out = props[device];
    return CT_OK;
}
