/* Faults the kernels find in their inputs (see cuda_impl.h): one record per
 * device, allocated on first use and kept for the life of the process. */
#include <pthread.h>
#include <stdlib.h>

#include "cuda_impl.h"

typedef struct {
    cti_cuda_fault *record;
    volatile unsigned int *host_flag; /* the host's address of the mapped word */
    volatile unsigned int *dev_flag;  /* the device's address of it */
} fault_state;

static fault_state faults[CTI_CUDA_MAX_DEVICES];
static pthread_mutex_t fault_lock = PTHREAD_MUTEX_INITIALIZER;

static ct_status create(const char *op, int device, fault_state *f) {
    void *host = NULL, *dev_flag = NULL, *rec = NULL;
    cudaError_t e = cudaHostAlloc(&host, sizeof(unsigned int), cudaHostAllocMapped);
    if (e == cudaSuccess) e = cudaHostGetDevicePointer(&dev_flag, host, 0);
    if (e == cudaSuccess) e = cudaMalloc(&rec, sizeof(cti_cuda_fault));
    if (e == cudaSuccess) e = cudaMemset(rec, 0, sizeof(cti_cuda_fault));
    if (e != cudaSuccess) {
        ct_status s = cti_cuda_fail(op, device, "allocating the fault record", e);
        if (rec) cudaFree(rec);
        if (host) cudaFreeHost(host);
        return s;
    }
    *(volatile unsigned int *)host = 0;
    f->host_flag = host;
    f->dev_flag = dev_flag;
    f->record = rec;
    return CT_OK;
}

/* The records go back at exit, so a leak check of the process sees none. */
static void free_faults(void) {
    pthread_mutex_lock(&fault_lock);
    for (int d = 0; d < CTI_CUDA_MAX_DEVICES; d++) {
        fault_state *f = &faults[d];
        if (!f->record) continue;
        cudaFree(f->record);
        cudaFreeHost((void *)f->host_flag);
        f->record = NULL;
        f->host_flag = f->dev_flag = NULL;
    }
    cudaGetLastError();
    pthread_mutex_unlock(&fault_lock);
}

static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static void register_exit(void) { atexit(free_faults); }

ct_status cti_cuda_fault_slot_get(const char *op, int device, cti_cuda_fault_slot *slot) {
    if ((unsigned)device >= CTI_CUDA_MAX_DEVICES)
        return cti_error(CT_ERR_DEVICE, "%s: invalid CUDA device index %d", op, device);
    fault_state *f = &faults[device];
    ct_status s = CT_OK;
    pthread_once(&exit_once, register_exit);
    pthread_mutex_lock(&fault_lock);
    if (!f->record) s = create(op, device, f);
    slot->record = f->record;
    slot->flag = f->dev_flag;
    pthread_mutex_unlock(&fault_lock);
    return s;
}

ct_status cti_cuda_take_fault(const char *waiter, int device) {
    if ((unsigned)device >= CTI_CUDA_MAX_DEVICES) return CT_OK;
    fault_state *f = &faults[device];
    /* The common case costs one read of host memory: no record, or no fault. */
    volatile unsigned int *flag = f->host_flag;
    if (!flag || *flag == 0) return CT_OK;
    pthread_mutex_lock(&fault_lock);
    cti_cuda_fault r = {0}, zero = {0};
    cudaError_t e = cudaMemcpy(&r, f->record, sizeof r, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaMemcpy(f->record, &zero, sizeof zero, cudaMemcpyHostToDevice);
    *flag = 0;
    pthread_mutex_unlock(&fault_lock);
    if (e != cudaSuccess) return cti_cuda_fail(waiter, device, "reading the fault record", e);
    if (!r.claimed) return CT_OK;
    char label[48];
    const char *op = cti_cuda_op_label((ct_op)r.op, label, sizeof label);
    if (r.op == CT_OP_MULTINOMIAL || r.op == CT_OP_TOPK_BACKWARD)
        return cti_cuda_seq_fault(&r, op, waiter, device);
    if (r.op == CT_OP_EMBEDDING || r.op == CT_OP_EMBEDDING_BACKWARD)
        return cti_error(CT_ERR_INDEX,
                         "%s: index %lld is out of range for %lld embeddings (expected 0..%lld); "
                         "found at position %lld by the kernel on cuda:%d in a CUDA graph replay "
                         "and reported by %s, the first wait for the device after it; the rows "
                         "of %s for bad indices are not written",
                         op, r.value, r.limit, r.limit - 1, r.position, device, waiter, op);
    return cti_error(CT_ERR_INDEX,
                     "%s: target %lld is out of bounds for %lld classes (expected 0..%lld or "
                     "ignore_index %lld); found at position %lld by the kernel on cuda:%d and "
                     "reported by %s, the first wait for the device after it; the results of %s "
                     "are NaN where the target was bad",
                     op, r.value, r.limit, r.limit - 1, r.ignore, r.position, device, waiter, op);
}
