/* cten: CUDA devices, their memory and the settings of the CUDA backend.
 *
 * Every function exists in every build. The CUDA backend is a module the
 * library loads when the machine can run it (cten-info says whether it did
 * and why not). Without it, or with it but no usable GPU, the device count
 * is 0, ct_cuda_available() is false and the calls that need a device fail
 * with CT_ERR_DEVICE and a message saying why. Tensors live on a device
 * through ct_device values (CT_CUDA(i)); see core.h for moving them
 * (ct_to_device). */
#ifndef CTEN_CUDA_H
#define CTEN_CUDA_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* True when the CUDA module loaded and at least one device can be used. */
bool ct_cuda_available(void);
/* Number of CUDA devices usable now (0 without the module or a driver). */
int ct_cuda_device_count(void);

/* What a device is. Versions are the libraries the process runs with,
 * encoded as the libraries do: driver and runtime 1000*major + 10*minor
 * (13000 is 13.0), cuBLAS and cuDNN 10000*major + 100*minor + patch. */
typedef struct ct_cuda_device_props {
    char name[256];
    int major, minor;              /* compute capability */
    int multiprocessors;
    int max_threads_per_multiprocessor;
    int warp_size;
    int clock_khz;                 /* peak SM clock */
    int memory_clock_khz;          /* peak memory clock */
    int memory_bus_width;          /* bits */
    size_t total_memory;           /* bytes of device memory */
    size_t l2_cache_bytes;
    size_t shared_memory_per_block_optin;
    size_t shared_memory_per_multiprocessor;
    int pci_domain, pci_bus, pci_device;
    bool ecc_enabled;
    int driver_version;
    int runtime_version;
    int cublas_version;
    int cudnn_version;
} ct_cuda_device_props;

/* Fills *props for device index; CT_ERR_DEVICE for an index out of range. */
ct_status ct_cuda_get_device_properties(int device, ct_cuda_device_props *props);

/* Waits until all work queued on device is done. An error raised by
 * earlier asynchronous work is reported here, naming the op last launched on
 * the device. */
ct_status ct_cuda_synchronize(int device);

/* The stream cten queues device's work on (a cudaStream_t), created on first
 * use; NULL (error set) for a device not present. A program mixing its own
 * CUDA work or CUDA events with cten's orders them on this stream, as it
 * would with torch.cuda.current_stream(). */
void *ct_cuda_stream(int device);

/* The caching allocator's counters for one device. Device memory freed by
 * tensors is kept for reuse ("cached") instead of being returned with
 * cudaFree; reserved = allocated + cached. Sizes are the rounded block sizes
 * the allocator hands out. */
typedef struct ct_cuda_memstats {
    uint64_t allocated;       /* bytes in blocks held by live tensors */
    uint64_t reserved;        /* bytes obtained by cudaMalloc and not yet freed */
    uint64_t peak_allocated;  /* highest allocated since start or the last reset */
    uint64_t peak_reserved;
    uint64_t num_allocs;      /* blocks handed out (cache hits included) */
    uint64_t num_mallocs;     /* cudaMalloc calls */
    uint64_t num_frees;       /* cudaFree calls */
    uint64_t num_retries;     /* failed cudaMallocs retried after emptying the cache */
    uint64_t num_ooms;        /* requests that failed after the retry */
} ct_cuda_memstats;

ct_status ct_cuda_memory_stats(int device, ct_cuda_memstats *stats);
/* Sets the peaks to the current values. */
ct_status ct_cuda_reset_peak_memory_stats(int device);
/* Returns every cached, unused block of device to the driver (waiting for
 * queued work first). device -1 empties every device's cache. */
ct_status ct_cuda_empty_cache(int device);

/* Whether float32 matrix products may use TF32 tensor cores (10-bit
 * mantissa inputs, float32 accumulation). Off by default, as in PyTorch.
 * Process-wide; read by the CUDA matmul kernels at each call. */
void ct_set_allow_tf32(bool allow);
bool ct_allow_tf32(void);

#ifdef __cplusplus
}
#endif
#endif
