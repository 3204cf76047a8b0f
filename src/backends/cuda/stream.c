/* One stream per device, and the CUDA errors turned into cten's.
 *
 * Every op queues its work on its device's stream and returns without
 * waiting, so a fault inside a kernel (an illegal address, say) is only seen
 * by a later call that waits: a copy to the host, ct_cuda_synchronize, or any
 * runtime call, since such faults stick to the context. To point at the
 * culprit, each launch records its op's name per device and those messages
 * name it. */
#include <pthread.h>
#include <stdio.h>

#include "cuda_impl.h"

static _Atomic(cudaStream_t) streams[CTI_CUDA_MAX_DEVICES];
static _Atomic(const char *) last_op[CTI_CUDA_MAX_DEVICES];
static pthread_mutex_t create_lock = PTHREAD_MUTEX_INITIALIZER;
/* Host waits for device work (cti_cuda_sync, ct_cuda_synchronize), so tests
 * can check that a path never waits. */
static atomic_llong host_waits;

int64_t cti_cuda_host_waits(void) { return atomic_load_explicit(&host_waits, memory_order_relaxed); }

/* Errors that poison the context: always the result of earlier kernels. */
static bool sticky(cudaError_t e) {
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorAssert:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorHardwareStackError:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
        return true;
    default:
        return false;
    }
}

const char *cti_cuda_last_op(int device) {
    if ((unsigned)device >= CTI_CUDA_MAX_DEVICES) return "none";
    const char *s = atomic_load_explicit(&last_op[device], memory_order_relaxed);
    return s ? s : "none";
}

const char *cti_cuda_op_label(ct_op op, char *buf, size_t n) {
    if (op == CT_OP_COPY) return "ct_copy_";
    if (op == CT_OP_FILL) return "ct_fill_";
    snprintf(buf, n, "ct_%s", ct_op_name(op));
    return buf;
}

static ct_status fail(const char *op, int device, const char *call, cudaError_t e, bool async) {
    cudaGetLastError();
    ct_status s = e == cudaErrorMemoryAllocation ? CT_ERR_OOM : CT_ERR_RUNTIME;
    if (async)
        return cti_error(s,
                         "%s: CUDA error on cuda:%d raised by earlier asynchronous work (last op "
                         "launched there: %s), reported by %s: %s (%s)",
                         op, device, cti_cuda_last_op(device), call, cudaGetErrorString(e),
                         cudaGetErrorName(e));
    return cti_error(s, "%s: %s failed on cuda:%d: %s (%s)", op, call, device,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

ct_status cti_cuda_fail(const char *op, int device, const char *call, cudaError_t e) {
    return fail(op, device, call, e, sticky(e));
}

static ct_status make_stream(const char *op, int device, cudaStream_t *out) {
    pthread_mutex_lock(&create_lock);
    cudaStream_t s = atomic_load(&streams[device]);
    cudaError_t e = cudaSuccess;
    /* Non-blocking: no implicit ordering with the legacy default stream that
     * other libraries in the process may use. */
    if (!s) e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e == cudaSuccess) atomic_store_explicit(&streams[device], s, memory_order_release);
    pthread_mutex_unlock(&create_lock);
    if (e != cudaSuccess) return cti_cuda_fail(op, device, "cudaStreamCreateWithFlags", e);
    *out = s;
    return CT_OK;
}

/* cti_cuda_begin without the capture check (ct_cuda_stream only hands the
 * stream out). */
static ct_status begin(const char *op, int device, cudaStream_t *stream) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess || cur != device) {
        cudaError_t e = cudaSetDevice(device);
        if (e != cudaSuccess) return cti_cuda_fail(op, device, "cudaSetDevice", e);
    }
    cudaStream_t s = atomic_load_explicit(&streams[device], memory_order_acquire);
    if (!s) return make_stream(op, device, stream);
    *stream = s;
    return CT_OK;
}

ct_status cti_cuda_begin(const char *op, int device, cudaStream_t *stream) {
    if ((unsigned)device >= CTI_CUDA_MAX_DEVICES)
        return cti_error(CT_ERR_DEVICE, "%s: invalid CUDA device index %d", op, device);
    if (cti_cuda_capture_check_launch(op, device) != CT_OK) return ct_last_status();
    return begin(op, device, stream);
}

ct_status cti_cuda_launched(const char *op, int device, const char *op_name) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return cti_cuda_fail(op, device, "a kernel launch", e);
    atomic_store_explicit(&last_op[device], op_name, memory_order_relaxed);
    return CT_OK;
}

ct_status cti_cuda_sync(const char *op, int device) {
    if (cti_cuda_capture_check_wait(op, device, "waits for the device (a host sync)") != CT_OK)
        return ct_last_status();
    cudaStream_t s = atomic_load_explicit(&streams[device], memory_order_acquire);
    if (!s) return CT_OK; /* nothing was ever queued */
    atomic_fetch_add_explicit(&host_waits, 1, memory_order_relaxed);
    cudaError_t e = cudaStreamSynchronize(s);
    if (e != cudaSuccess) return fail(op, device, "cudaStreamSynchronize", e, true);
    return cti_cuda_take_fault(op, device);
}

void *cti_cuda_stream(int device) {
    static const char op[] = "ct_cuda_stream";
    if (cti_cuda_check_device(op, device) != CT_OK) return NULL;
    cudaStream_t s = NULL;
    if (begin(op, device, &s) != CT_OK) return NULL;
    return (void *)s;
}

ct_status cti_cuda_synchronize(int device) {
    static const char op[] = "ct_cuda_synchronize";
    if (cti_cuda_check_device(op, device) != CT_OK ||
        cti_cuda_capture_check_wait(op, device, "waits for the device") != CT_OK)
        return ct_last_status();
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cti_cuda_fail(op, device, "cudaSetDevice", e);
    atomic_fetch_add_explicit(&host_waits, 1, memory_order_relaxed);
    e = cudaDeviceSynchronize();
    if (e != cudaSuccess) return fail(op, device, "cudaDeviceSynchronize", e, true);
    return cti_cuda_take_fault(op, device);
}
