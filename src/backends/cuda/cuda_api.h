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
} cti_cuda_api;

#endif
