/* The public CUDA API (tensor/cuda.h) as libcten.so answers it. The CUDA
 * backend is a module the library loads at init when it can run
 * (src/dispatch/modules.c); these functions forward to the module's table
 * (cuda_api.h) when it loaded and otherwise fail with the reason it did
 * not: built without it, no module file, no driver, a missing CUDA library.
 * The build compiles this file into the library in every configuration. */
#include "cuda_api.h"
#include "dispatch/dispatch_impl.h"

static const cti_cuda_api *loaded(void) {
    const cti_backend *b = cti_backend_of(CT_DEVICE_CUDA);
    return b ? (const cti_cuda_api *)b->api : NULL;
}

static ct_status absent(const char *op) {
    return cti_error(CT_ERR_DEVICE, "%s: the CUDA backend is not loaded: %s", op,
                     cti_backend_missing(CT_DEVICE_CUDA));
}

bool ct_cuda_available(void) { return ct_cuda_device_count() > 0; }

int ct_cuda_device_count(void) {
    const cti_cuda_api *a = loaded();
    return a ? a->device_count() : 0;
}

ct_status ct_cuda_get_device_properties(int device, ct_cuda_device_props *props) {
    const cti_cuda_api *a = loaded();
    return a ? a->get_device_properties(device, props) : absent("ct_cuda_get_device_properties");
}

ct_status ct_cuda_synchronize(int device) {
    const cti_cuda_api *a = loaded();
    return a ? a->synchronize(device) : absent("ct_cuda_synchronize");
}

void *ct_cuda_stream(int device) {
    const cti_cuda_api *a = loaded();
    if (a) return a->stream(device);
    absent("ct_cuda_stream");
    return NULL;
}

ct_status ct_cuda_memory_stats(int device, ct_cuda_memstats *stats) {
    const cti_cuda_api *a = loaded();
    return a ? a->memory_stats(device, stats) : absent("ct_cuda_memory_stats");
}

ct_status ct_cuda_reset_peak_memory_stats(int device) {
    const cti_cuda_api *a = loaded();
    return a ? a->reset_peak_memory_stats(device) : absent("ct_cuda_reset_peak_memory_stats");
}

ct_status ct_cuda_empty_cache(int device) {
    const cti_cuda_api *a = loaded();
    return a ? a->empty_cache(device) : absent("ct_cuda_empty_cache");
}

ct_cuda_graph *ct_cuda_graph_capture_begin(int device) {
    const cti_cuda_api *a = loaded();
    if (a) return a->graph_capture_begin(device);
    absent("ct_cuda_graph_capture_begin");
    return NULL;
}

ct_status ct_cuda_graph_capture_end(ct_cuda_graph *graph) {
    const cti_cuda_api *a = loaded();
    return a ? a->graph_capture_end(graph) : absent("ct_cuda_graph_capture_end");
}

ct_status ct_cuda_graph_replay(ct_cuda_graph *graph) {
    const cti_cuda_api *a = loaded();
    return a ? a->graph_replay(graph) : absent("ct_cuda_graph_replay");
}

/* Without the module no graph can exist: only NULL reaches here then. */
void ct_cuda_graph_free(ct_cuda_graph *graph) {
    const cti_cuda_api *a = loaded();
    if (a && graph) a->graph_free(graph);
}

const cti_nccl_api *cti_cuda_nccl_api(const char *op) {
    const cti_cuda_api *a = loaded();
    if (!a) {
        absent(op);
        return NULL;
    }
    if (!a->nccl)
        cti_error(CT_ERR_UNSUPPORTED,
                  "%s: the CUDA module was built without NCCL (nccl.h and libnccl were not found, "
                  "or -Ddist=disabled)",
                  op);
    return a->nccl;
}
