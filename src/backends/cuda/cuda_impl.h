/* Private to the CUDA backend.
 *
 * The first part is shared by the backend's C files and its .cu files. nvcc
 * compiles .cu files as C++, where the tensor object's header (C11 atomics)
 * cannot be included, so kernels never see a ct_tensor: the C side turns
 * tensors into the plain geometry below (cti_cuda_iter) and calls the .cu
 * launchers with device addresses. The second part (C only) is what the
 * backend's C files share: devices, streams, errors, the allocator. */
#ifndef CTEN_CUDA_IMPL_H
#define CTEN_CUDA_IMPL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "tensor/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CTI_CUDA_MAX_DEVICES 64
#define CTI_CUDA_MAX_OPERANDS 6

/* Elementwise geometry over nops operands: operand 0 is the output and sets
 * the iteration shape, the others are broadcast to it (stride 0). Dims are
 * stored innermost first, size-1 dims dropped and mergeable dims merged, so
 * contiguous operands give ndim == 1. Strides are in elements. When
 * use32 is set, numel fits in 31 bits and magic[]/shift[] let kernels divide
 * a linear index by shape[d] with a multiply (Granlund-Montgomery). */
typedef struct cti_cuda_iter {
    int ndim, nops;
    bool use32;
    int64_t numel;
    int64_t shape[CT_MAX_DIMS];
    int64_t stride[CTI_CUDA_MAX_OPERANDS][CT_MAX_DIMS];
    uint32_t magic[CT_MAX_DIMS];
    uint32_t shift[CT_MAX_DIMS];
} cti_cuda_iter;

/* ---- faults found by kernels (fault.c) ------------------------------------------------
 * Some bad input can only be seen on the device: a class target of a loss
 * outside [0, C). Checking it before launch would make the host wait for
 * every loss, so the kernel records the first one here (in device memory,
 * claimed with atomicCAS) and raises *flag, a word of host-mapped memory,
 * and leaves that output NaN (never reading outside its inputs). Every wait
 * for the device (cti_cuda_sync: copies to the host, ct_tensor_item;
 * ct_cuda_synchronize) then returns the first record as the op's error. */
typedef struct cti_cuda_fault {
    unsigned int claimed; /* 0 until the first fault */
    int op;               /* ct_op of the kernel that found it */
    long long value, limit, ignore, position;
} cti_cuda_fault;

typedef struct cti_cuda_fault_slot {
    cti_cuda_fault *record;      /* device memory */
    volatile unsigned int *flag; /* host-mapped memory, as a device address */
} cti_cuda_fault_slot;

/* ---- launchers (copy.cu). They queue work on stream and return the launch
 * status; they never wait. ---------------------------------------------------- */
/* dst[i] = convert(src[i]) for n contiguous elements (dst_dt != src_dt). */
cudaError_t cti_cuda_convert_contiguous(void *dst, ct_dtype dst_dt, const void *src,
                                        ct_dtype src_dt, int64_t n, int sm_count,
                                        cudaStream_t stream);
/* Strided copy with conversion: operand 0 of it is dst, operand 1 src
 * (same dtype moves the bits, as the CPU backend does). */
cudaError_t cti_cuda_copy_strided(void *dst, ct_dtype dst_dt, const void *src, ct_dtype src_dt,
                                  const cti_cuda_iter *it, int sm_count, cudaStream_t stream);
/* Strided move of elsize-byte units (1, 2, 4, 8 or 16) as it describes them. */
cudaError_t cti_cuda_move_strided(void *dst, const void *src, int elsize, const cti_cuda_iter *it,
                                  int sm_count, cudaStream_t stream);
/* Writes the elsize-byte pattern value to every element of operand 0 of it
 * (contiguous runs use 16-byte stores). */
cudaError_t cti_cuda_fill(void *dst, int elsize, const void *value, const cti_cuda_iter *it,
                          int sm_count, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#ifndef __cplusplus
#include "../../dispatch/dispatch_impl.h"
#include "tensor/cuda.h"

/* ---- devices (device.c) -------------------------------------------------------------- */
/* Devices usable now; the driver is queried once, on first use. 0 when no
 * driver or device is present. */
int cti_cuda_device_count(void);
/* Why the count is 0 ("" when devices exist). Static string. */
const char *cti_cuda_unavailable_reason(void);
/* CT_OK for a present device index, else CT_ERR_DEVICE naming op. */
ct_status cti_cuda_check_device(const char *op, int index);
int cti_cuda_sm_count(int device);

/* ---- streams and errors (stream.c) ------------------------------------------------------
 * Each device has one stream all ops queue on, so ops are asynchronous and
 * ordered. A kernel file brackets a launch with cti_cuda_begin and
 * cti_cuda_launched; errors raised later by that work surface at the next
 * synchronizing call, whose message names the op last launched there. */
/* Makes device current on this thread and gives its stream. */
ct_status cti_cuda_begin(const char *op, int device, cudaStream_t *stream);
/* Records op_name (a static string, e.g. ct_op_name's) as the device's last
 * launched work, after turning a launch error (cudaGetLastError) into a
 * status naming op. */
ct_status cti_cuda_launched(const char *op, int device, const char *op_name);
/* Waits for the device's stream; an error names op and the last launched op. */
ct_status cti_cuda_sync(const char *op, int device);
/* A status and message for e, returned by call (a CUDA function name) inside
 * op on device. Errors left by earlier asynchronous work name the last
 * launched op. Clears the runtime's last error. */
ct_status cti_cuda_fail(const char *op, int device, const char *call, cudaError_t e);
/* The device's fault slot (allocated on first use), or CT_ERR_OOM/RUNTIME
 * naming op. */
ct_status cti_cuda_fault_slot_get(const char *op, int device, cti_cuda_fault_slot *slot);
/* After a completed wait on device: the first fault a kernel recorded, as
 * an error naming the op that launched it (the record is cleared), or CT_OK.
 * waiter names the call that waited. */
ct_status cti_cuda_take_fault(const char *waiter, int device);
/* How many times the host waited for device work (cti_cuda_sync and
 * ct_cuda_synchronize), all devices, since start. */
int64_t cti_cuda_host_waits(void);
/* The op last launched on device ("none" before any). */
const char *cti_cuda_last_op(int device);
/* The op label messages start with: "ct_copy_", "ct_add", ... */
const char *cti_cuda_op_label(ct_op op, char *buf, size_t n);

/* ---- allocator (alloc.c) ------------------------------------------------------------------- */
void cti_cuda_register_allocator(void);
/* A CUDA graph's private pool of device blocks (the allocator's comment
 * says how it serves a capture). */
typedef struct cti_cuda_pool cti_cuda_pool;
/* An empty pool for a graph on dev; NULL when out of host memory. */
cti_cuda_pool *cti_cuda_pool_new(int dev);
/* on: this thread's requests on the pool's device come from the pool (and
 * the cache) until called with off, which follows cudaStreamEndCapture. */
void cti_cuda_pool_capture(cti_cuda_pool *p, bool on);
/* Returns p's unused blocks to the device's cache, hands the blocks
 * tensors still hold to the cache for when they are freed, and frees p.
 * NULL is a no-op. */
void cti_cuda_pool_release(cti_cuda_pool *p);

/* ---- CUDA graph captures (graph.c) ----------------------------------------------------------
 * The checks the rest of the backend makes so that what cannot be replayed
 * is refused (CT_ERR_CAPTURE, a message naming op) instead of recorded.
 * Each costs one atomic load while no capture is under way. A refusal on
 * the capturing thread also fails its capture. */
/* Before queuing work on device: refused on a thread that captures another
 * device, and on any other thread while device is captured. */
ct_status cti_cuda_capture_check_launch(const char *op, int device);
/* Before the host waits for device (what: "waits for the device", ...):
 * refused on a capturing thread, and on others while device is captured. */
ct_status cti_cuda_capture_check_wait(const char *op, int device, const char *what);
/* Whether this thread is capturing device. */
bool cti_cuda_capturing(int device);
/* Refuses, on a thread capturing device, a first use that would allocate
 * or time on the device (what: "creating the cuBLAS handle"); fails the
 * capture. */
ct_status cti_cuda_capture_refuse(const char *op, int device, const char *what);
/* Fails this thread's capture, if any, with message (alloc.c's refusals). */
void cti_cuda_capture_failed(ct_status st, const char *message);
/* For a random kernel about to be queued on device with the draws
 * (seed, *offset) its front end reserved: outside a capture *state is
 * NULL and nothing changes; in one, when the draws were reserved during
 * it, *state points at the graph's device pair (seed, first draw) for their
 * generator, which every replay renews, and *offset becomes the draws'
 * offset from that first draw. The kernel then uses seed = state[0] and
 * first = state[1] + offset. */
void cti_cuda_philox(int device, uint64_t seed, uint64_t *offset, const uint64_t **state);

/* ---- the public API's implementations (device.c, stream.c, alloc.c, graph.c) ----------------
 * libcten.so's ct_cuda_* functions forward to these through the backend's
 * api table (cuda_api.h, register.c); each behaves as tensor/cuda.h says
 * of the function it implements, and its messages name that function. */
ct_status cti_cuda_get_device_properties(int device, ct_cuda_device_props *props);
ct_status cti_cuda_synchronize(int device);
void *cti_cuda_stream(int device);
ct_status cti_cuda_memory_stats(int device, ct_cuda_memstats *stats);
ct_status cti_cuda_reset_peak_memory_stats(int device);
ct_status cti_cuda_empty_cache(int device);
ct_cuda_graph *cti_cuda_graph_capture_begin(int device);
ct_status cti_cuda_graph_capture_end(ct_cuda_graph *graph);
ct_status cti_cuda_graph_replay(ct_cuda_graph *graph);
void cti_cuda_graph_free(ct_cuda_graph *graph);

/* ---- NCCL (nccl.c, built where NCCL is found): the table the dist layer
 * calls (cuda_api.h), the api table's nccl field. */
#ifdef CTI_HAVE_NCCL
struct cti_nccl_api;
extern const struct cti_nccl_api cti_cuda_nccl;
#endif

/* ---- elementwise geometry (iter.c) -------------------------------------------------------- */
/* Fills it for ops[0..nops) (ops[0] the output; the others must broadcast
 * to its shape, as the front ends check). */
void cti_cuda_iter_init(cti_cuda_iter *it, int nops, ct_tensor *const *ops);
/* For a same-dtype copy (operand 0 at p0, operand 1 at p1, es-byte
 * elements): rewrites it to count the widest unit the layout allows and
 * returns that unit's size in bytes (es when none is wider). */
int cti_cuda_iter_widen(cti_cuda_iter *it, int es, const void *p0, const void *p1);

/* ---- kernels, one registration function per kernel file ------------------------------------ */
void cti_cuda_register_copy(void); /* copy (host<->device, device<->device), fill */
void cti_cuda_register_elementwise(void); /* unary, binary, comparisons, where, clamp */
void cti_cuda_register_reduce(void);      /* sum, mean, prod, var, norm, max/min, arg* */
void cti_cuda_register_random(void);      /* arange, uniform, normal, randint */
void cti_cuda_register_blas(void);        /* mm, bmm, addmm through cuBLAS */
void cti_cuda_register_conv(void);        /* conv2d and its backward ops through cuDNN */
void cti_cuda_register_pool(void);        /* max/avg/adaptive pooling and backward */
void cti_cuda_register_norm(void);        /* rms_norm, layer_norm and backward */
void cti_cuda_register_nn(void);          /* softmax, losses, embedding, dropout */
void cti_cuda_register_optim(void);       /* fused optimizer updates */
void cti_cuda_register_rope(void);        /* rope, swiglu and their backward ops */
void cti_cuda_register_seqops(void);      /* tril, triu, cumsum, topk, multinomial */
/* The error of a fault that seqops' kernels recorded (r->op MULTINOMIAL or
 * TOPK_BACKWARD), for cti_cuda_take_fault; op is r->op's label. */
ct_status cti_cuda_seq_fault(const cti_cuda_fault *r, const char *op, const char *waiter,
                             int device);
void cti_cuda_register_linear_ce(void);   /* cross_entropy_fused (ct_linear_cross_entropy) */
void cti_cuda_register_attention(void);   /* scaled dot-product attention and backward */
void cti_cuda_register_indexing(void);    /* gather, index_select, scatter_add */
void cti_cuda_register_sort(void);        /* sort, cumprod, nonzero */
/* Waits for the work queued on st, then fails (CT_ERR_INDEX, the CPU
 * kernels' message naming op, dim and size) when *bad, a device word a
 * kernel set with atomicMin, holds a row-major position of idx (int64 or
 * int32) rather than all ones. */
ct_status cti_cuda_index_check_bad(const char *op, int dev, cudaStream_t st,
                                   const unsigned long long *bad, const ct_tensor *idx, int dim,
                                   int64_t size);
void cti_cuda_register_shape(void);       /* scatter(_reduce), flip/roll/repeat/pad, interpolate, fold */
void cti_cuda_register_batch_norm(void);  /* batch_norm and its backward (layers) */

#endif /* !__cplusplus */
#endif
