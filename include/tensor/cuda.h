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
    uint64_t graph_cached;    /* bytes in unused blocks kept for CUDA graphs (their private
                                 pools): part of reserved, handed to nobody else */
} ct_cuda_memstats;

ct_status ct_cuda_memory_stats(int device, ct_cuda_memstats *stats);
/* Sets the peaks to the current values. */
ct_status ct_cuda_reset_peak_memory_stats(int device);
/* Returns every cached, unused block of device to the driver (waiting for
 * queued work first). device -1 empties every device's cache. */
ct_status ct_cuda_empty_cache(int device);

/* ---- CUDA graphs -----------------------------------------------------------------
 * A CUDA graph records the device work of a sequence of cten calls once and
 * replays it with one launch, without the host's per-op cost: the way to
 * run a small training step at the speed of its kernels.
 * docs/CUDA_GRAPHS.md gives the rules and an example; in short:
 *   - run the step once eagerly first (warmup), so that the caching
 *     allocator holds the memory and cuBLAS/cuDNN have made their choices;
 *   - between capture_begin and capture_end, the calls this thread makes on
 *     the device are recorded, not run; calls that cannot be replayed are
 *     refused with CT_ERR_CAPTURE (a wait for the device: ct_tensor_item,
 *     copies to or from the host, ct_cuda_synchronize; any CPU tensor or
 *     other device; memory the cache does not already hold) and fail the
 *     capture, whose capture_end then returns that error; the library stays
 *     usable;
 *   - tensors allocated during the capture live in the graph's private
 *     memory pool, at the addresses every replay writes: keep the outputs
 *     you read (the loss) and read them after a replay; give new inputs to a
 *     replay by copying them (ct_copy_) into tensors allocated before the
 *     capture;
 *   - random ops draw fresh numbers at every replay, as the next eager call
 *     would (the graph reads its Philox offsets from device memory that each
 *     replay advances); the generators they use must outlive the graph.
 * A graph belongs to one device and one thread's capture; replays are
 * queued on the device's stream like any op (asynchronous). */
typedef struct ct_cuda_graph ct_cuda_graph;

/* Starts recording the work this thread queues on device into a new graph.
 * Returns the graph (the caller owns it: ct_cuda_graph_free), or NULL with
 * the error set: CT_ERR_DEVICE when device is not present (or the CUDA
 * backend is not loaded), CT_ERR_CAPTURE when this thread is capturing
 * already or another thread captures device. */
ct_cuda_graph *ct_cuda_graph_capture_begin(int device);
/* Stops recording and makes the graph ready to replay. Must be called on
 * the thread that began the capture. If a call was refused during the
 * capture (or CUDA invalidated it) the graph is discarded and CT_ERR_CAPTURE
 * returned, the first refusal's message after "the capture on cuda:N
 * failed: "; the graph can then only be freed. CT_ERR_CAPTURE also for a
 * graph not being captured (ended already) or a call on another thread. */
ct_status ct_cuda_graph_capture_end(ct_cuda_graph *graph);
/* Queues the recorded work on the graph's device (returns without waiting).
 * CT_ERR_CAPTURE for a graph whose capture did not end or failed, or while
 * any thread captures its device. */
ct_status ct_cuda_graph_replay(ct_cuda_graph *graph);
/* Frees the graph and returns its private pool's unused blocks to the
 * cache; tensors allocated during its capture stay valid. A graph still
 * being captured is ended and discarded (call this on the capturing thread;
 * on another one it is left as it is and CT_ERR_CAPTURE is set). NULL is
 * a no-op. */
void ct_cuda_graph_free(ct_cuda_graph *graph);

/* Whether float32 matrix products may use TF32 tensor cores (10-bit
 * mantissa inputs, float32 accumulation). Off by default, as in PyTorch.
 * Process-wide; read by the CUDA matmul kernels at each call. */
void ct_set_allow_tf32(bool allow);
bool ct_allow_tf32(void);

/* The largest convolution, in multiply-adds, whose forward and input
 * gradient run cten's direct CUDA kernels instead of cuDNN; returns the
 * previous limit (a negative macs only reads it). Default 2^26, every layer
 * of a small CNN at batch 64. Each cuDNN call costs 20-35 us of host time,
 * more than a small layer's kernel, so an eager training step of a small
 * CNN, bound by the host's queueing, is faster on the direct kernels; a step
 * replayed from a CUDA graph has no host time, and there cuDNN's faster
 * kernels win: set 0 before the eager warmup step that precedes the
 * capture (cuDNN times its algorithms on a convolution's first call, which
 * a capture cannot do). Process-wide, read at each convolution call. */
int64_t ct_cuda_conv_direct_limit(int64_t macs);

#ifdef __cplusplus
}
#endif
#endif
