/* Private: the CUDA backend's share of the public API (tensor/cuda.h).
 *
 * libcten.so answers every ct_cuda_* call (api.c) whether or not the CUDA
 * module loaded: when it did, it forwards to this table, which the module
 * hands over as its backend's api field; when it did not, the call fails
 * with the reason the module did not load. Nothing here names a CUDA type,
 * so the library's side compiles without the CUDA headers. */
#ifndef CTEN_CUDA_API_H
#define CTEN_CUDA_API_H

#include "tensor/cuda.h"

/* One collective over contiguous device buffers (tensor/dist.h's calls, as
 * the dist layer hands them to NCCL). count is in elements: the whole
 * buffer for all-reduce and broadcast, what each rank sends for all-gather
 * (recv holds world * count), what each rank receives for reduce-scatter
 * (send holds world * count). op is a ct_dist_op; name (a static string)
 * is the public call messages name. */
typedef enum cti_coll_kind {
    CTI_COLL_ALL_REDUCE,
    CTI_COLL_BROADCAST,
    CTI_COLL_ALL_GATHER,
    CTI_COLL_REDUCE_SCATTER,
} cti_coll_kind;

typedef struct cti_coll {
    cti_coll_kind kind;
    int op, root;
    const void *send;
    void *recv;
    size_t count;
    ct_dtype dtype;
    const char *name;
} cti_coll;

#define CTI_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

/* NCCL inside the module (nccl.c): a communicator per process group, its
 * collectives queued on cten's stream of its device, a watchdog thread that
 * aborts it when queued work outlives the timeout or NCCL reports an
 * asynchronous error. Each call's errors name op. */
typedef struct cti_nccl_api {
    /* ncclGetUniqueId into id[CTI_NCCL_ID_BYTES]. */
    ct_status (*unique_id)(const char *op, unsigned char *id);
    /* A communicator of rank among world on device, from rank 0's id;
     * waits at most timeout_s for the others. */
    ct_status (*comm_new)(const char *op, const unsigned char *id, int world, int rank,
                          int device, double timeout_s, void **comm);
    /* Queues c on the device's stream; the watchdog gives it timeout_s. */
    ct_status (*run)(void *comm, const cti_coll *c, double timeout_s);
    /* The first error the watchdog recorded (the communicator is then
     * aborted), else CT_OK. */
    ct_status (*check)(void *comm, const char *op);
    /* Waits, at most timeout_s, for the work queued on the device so far. */
    ct_status (*wait)(void *comm, const char *op, double timeout_s);
    /* Stops the watchdog and destroys (or, after a failure, aborts) comm. */
    void (*comm_free)(void *comm);
} cti_nccl_api;

typedef struct cti_cuda_api {
    int (*device_count)(void);
    ct_status (*get_device_properties)(int device, ct_cuda_device_props *props);
    ct_status (*synchronize)(int device);
    void *(*stream)(int device);
    ct_status (*memory_stats)(int device, ct_cuda_memstats *stats);
    ct_status (*reset_peak_memory_stats)(int device);
    ct_status (*empty_cache)(int device);
    ct_cuda_graph *(*graph_capture_begin)(int device);
    ct_status (*graph_capture_end)(ct_cuda_graph *graph);
    ct_status (*graph_replay)(ct_cuda_graph *graph);
    void (*graph_free)(ct_cuda_graph *graph);
    /* NULL when the module was built without NCCL. */
    const cti_nccl_api *nccl;
} cti_cuda_api;

/* The loaded module's NCCL table (api.c, in the library), or NULL with an
 * error naming op: the module did not load, or was built without NCCL. */
const cti_nccl_api *cti_cuda_nccl_api(const char *op);

#endif
