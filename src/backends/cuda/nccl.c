/* NCCL for the dist layer's collectives on CUDA tensors (tensor/dist.h),
 * reached through the module's API table (cuda_api.h: cti_nccl_api), so
 * libcten.so never links libnccl.
 *
 * A communicator is nonblocking (ncclConfig_t.blocking = 0): creating it
 * and every call are polled against a deadline instead of blocking inside
 * NCCL. Collectives queue on cten's stream of the communicator's device,
 * ordered with the ops around them, and return at once; each is followed by
 * an event. A watchdog thread per communicator polls those events and
 * ncclCommGetAsyncError: when one is not complete by its deadline (a peer
 * died, exited or never called the collective) or NCCL reports an error, it
 * aborts the communicator (ncclCommAbort makes the waiting kernels return,
 * so nothing waiting for the stream hangs) and keeps the message, which
 * every later call of the group returns. */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_api.h"
#include "cuda_impl.h"
#include "tensor/dist.h"

#define RING 256          /* pending collectives watched one by one */
#define WATCH_PERIOD_MS 20

typedef struct pending {
    cudaEvent_t done;
    double deadline;
    const char *op;
} pending;

typedef struct comm {
    ncclComm_t nc;
    int device, rank, world;
    pthread_mutex_t lock; /* the ring, the flags, and calls into nc */
    pthread_cond_t wake;
    pthread_t watchdog;
    bool watching, stop;
    pending ring[RING];
    int head, count;
    bool failed; /* nc was aborted; msg says why */
    ct_status status;
    char msg[1024];
} comm;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static ct_status nccl_fail(const char *op, const char *call, ncclResult_t r, ncclComm_t nc,
                           int device) {
    const char *last = nc ? ncclGetLastError(nc) : NULL;
    return cti_error(CT_ERR_RUNTIME, "%s: %s failed on cuda:%d: %s%s%s", op, call, device,
                     ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
}

static ncclDataType_t nccl_type(ct_dtype dt) {
    switch (dt) {
    case CT_BOOL: return ncclUint8;
    case CT_I32: return ncclInt32;
    case CT_I64: return ncclInt64;
    case CT_F16: return ncclFloat16;
    case CT_BF16: return ncclBfloat16;
    case CT_F32: return ncclFloat32;
    default: return ncclFloat64;
    }
}

/* A bool sum is a logical or: the largest byte. */
static ncclRedOp_t nccl_op(ct_dtype dt, int op) {
    if (op == CT_DIST_AVG) return ncclAvg;
    if (op == CT_DIST_MAX || dt == CT_BOOL) return ncclMax;
    return ncclSum;
}

/* Polls a nonblocking communicator until its last call is done, the
 * deadline passes (ncclInProgress returned) or it reports an error. */
static ncclResult_t settle(ncclComm_t nc, ncclResult_t r, double deadline) {
    while (r == ncclInProgress) {
        if (now_s() > deadline) return ncclInProgress;
        struct timespec t = {0, 100000};
        nanosleep(&t, NULL);
        if (ncclCommGetAsyncError(nc, &r) != ncclSuccess) return ncclSystemError;
    }
    return r;
}

/* Marks c failed with the error just set and aborts it. Holds c->lock. */
static void fail_locked(comm *c) {
    if (c->failed) return;
    c->failed = true;
    c->status = ct_last_status();
    snprintf(c->msg, sizeof c->msg, "%s", ct_last_error());
    ncclCommAbort(c->nc);
}

static void pop_locked(comm *c) {
    cudaEventDestroy(c->ring[c->head].done);
    c->head = (c->head + 1) % RING;
    c->count--;
}

/* One look at c: completed collectives leave the ring; an overdue one or an
 * asynchronous error fails c. Holds c->lock. */
static void watch_locked(comm *c) {
    while (c->count && !c->failed) {
        pending *p = &c->ring[c->head];
        cudaError_t e = cudaEventQuery(p->done);
        if (e == cudaSuccess) {
            pop_locked(c);
            continue;
        }
        if (e != cudaErrorNotReady) {
            cti_cuda_fail(p->op, c->device, "cudaEventQuery", e);
            fail_locked(c);
        } else if (now_s() > p->deadline) {
            cti_error(CT_ERR_RUNTIME,
                      "%s: rank %d of %d: the NCCL collective did not complete within its "
                      "timeout on cuda:%d: a peer failed, exited or did not call it (the "
                      "communicator was aborted)",
                      p->op, c->rank, c->world, c->device);
            fail_locked(c);
        }
        break;
    }
    if (c->failed) return;
    ncclResult_t r = ncclSuccess;
    if (ncclCommGetAsyncError(c->nc, &r) == ncclSuccess && r != ncclSuccess &&
        r != ncclInProgress) {
        nccl_fail(c->count ? c->ring[c->head].op : "ct_dist", "NCCL (asynchronous error)", r,
                  c->nc, c->device);
        fail_locked(c);
    }
}

static void *watchdog(void *arg) {
    comm *c = arg;
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->lock);
    while (!c->stop) {
        if (c->count) watch_locked(c);
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += WATCH_PERIOD_MS * 1000000L;
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->wake, &c->lock, &t);
    }
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

/* ---- the table's functions ------------------------------------------------------------ */
static ct_status unique_id(const char *op, unsigned char *id) {
    _Static_assert(sizeof(ncclUniqueId) == CTI_NCCL_ID_BYTES, "NCCL's id size");
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return nccl_fail(op, "ncclGetUniqueId", r, NULL, -1);
    memcpy(id, &u, sizeof u);
    return CT_OK;
}

static ct_status comm_new(const char *op, const unsigned char *id, int world, int rank,
                          int device, double timeout_s, void **out) {
    *out = NULL;
    ct_status st = cti_cuda_check_device(op, device);
    if (st != CT_OK) return st;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess) return cti_cuda_fail(op, device, "cudaSetDevice", e);
    comm *c = calloc(1, sizeof *c);
    if (!c) return cti_error(CT_ERR_OOM, "%s: out of memory", op);
    c->device = device;
    c->rank = rank;
    c->world = world;
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->nc, world, u, rank, &cfg);
    r = settle(c->nc, r, now_s() + timeout_s);
    if (r != ncclSuccess) {
        if (r == ncclInProgress)
            st = cti_error(CT_ERR_RUNTIME,
                           "%s: rank %d of %d: NCCL's communicator on cuda:%d was not made within "
                           "%g s (a peer did not join)",
                           op, rank, world, device, timeout_s);
        else st = nccl_fail(op, "ncclCommInitRankConfig", r, c->nc, device);
        if (c->nc) ncclCommAbort(c->nc);
        free(c);
        return st;
    }
    pthread_mutex_init(&c->lock, NULL);
    pthread_cond_init(&c->wake, NULL);
    if (pthread_create(&c->watchdog, NULL, watchdog, c) != 0) {
        ncclCommAbort(c->nc);
        pthread_mutex_destroy(&c->lock);
        pthread_cond_destroy(&c->wake);
        free(c);
        return cti_error(CT_ERR_RUNTIME, "%s: cannot start NCCL's watchdog thread", op);
    }
    c->watching = true;
    *out = c;
    return CT_OK;
}

static ncclResult_t enqueue(comm *c, const cti_coll *k, cudaStream_t s) {
    ncclDataType_t t = nccl_type(k->dtype);
    switch (k->kind) {
    case CTI_COLL_ALL_REDUCE:
        return ncclAllReduce(k->send, k->recv, k->count, t, nccl_op(k->dtype, k->op), c->nc, s);
    case CTI_COLL_BROADCAST: return ncclBroadcast(k->send, k->recv, k->count, t, k->root, c->nc, s);
    case CTI_COLL_ALL_GATHER: return ncclAllGather(k->send, k->recv, k->count, t, c->nc, s);
    case CTI_COLL_REDUCE_SCATTER:
        return ncclReduceScatter(k->send, k->recv, k->count, t, nccl_op(k->dtype, k->op), c->nc, s);
    }
    return ncclInvalidArgument;
}

static const char *call_name(cti_coll_kind kind) {
    switch (kind) {
    case CTI_COLL_ALL_REDUCE: return "ncclAllReduce";
    case CTI_COLL_BROADCAST: return "ncclBroadcast";
    case CTI_COLL_ALL_GATHER: return "ncclAllGather";
    default: return "ncclReduceScatter";
    }
}

static ct_status failed_status(comm *c, const char *op) {
    return cti_error(c->status ? c->status : CT_ERR_RUNTIME,
                     "%s: the NCCL communicator failed earlier: %s", op, c->msg);
}

/* Queues an event after the work on s, watched until deadline. Holds c->lock. */
static ct_status watch_event(comm *c, const char *op, cudaStream_t s, double deadline) {
    /* A full ring drops its oldest entry: the stream completes the work in
     * order, so the later entries still catch a stall, a little later. */
    if (c->count == RING) pop_locked(c);
    pending *p = &c->ring[(c->head + c->count) % RING];
    cudaError_t e = cudaEventCreateWithFlags(&p->done, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(p->done, s);
    if (e != cudaSuccess) return cti_cuda_fail(op, c->device, "cudaEventRecord", e);
    p->deadline = deadline;
    p->op = op;
    c->count++;
    return CT_OK;
}

static ct_status run(void *handle, const cti_coll *k, double timeout_s) {
    comm *c = handle;
    cudaStream_t s;
    ct_status st = cti_cuda_begin(k->name, c->device, &s);
    if (st != CT_OK) return st;
    pthread_mutex_lock(&c->lock);
    if (c->failed) {
        st = failed_status(c, k->name);
    } else {
        double deadline = now_s() + timeout_s;
        ncclResult_t r = settle(c->nc, enqueue(c, k, s), deadline);
        if (r != ncclSuccess) {
            if (r == ncclInProgress)
                cti_error(CT_ERR_RUNTIME, "%s: %s was not queued within %g s on cuda:%d", k->name,
                          call_name(k->kind), timeout_s, c->device);
            else nccl_fail(k->name, call_name(k->kind), r, c->nc, c->device);
            fail_locked(c);
            st = c->status;
        } else {
            st = watch_event(c, k->name, s, deadline);
        }
    }
    pthread_mutex_unlock(&c->lock);
    if (st == CT_OK) st = cti_cuda_launched(k->name, c->device, call_name(k->kind));
    return st;
}

static ct_status check(void *handle, const char *op) {
    comm *c = handle;
    pthread_mutex_lock(&c->lock);
    ct_status st = c->failed ? failed_status(c, op) : CT_OK;
    pthread_mutex_unlock(&c->lock);
    return st;
}

static ct_status wait_all(void *handle, const char *op, double timeout_s) {
    comm *c = handle;
    cudaStream_t s;
    ct_status st = cti_cuda_begin(op, c->device, &s);
    if (st != CT_OK) return st;
    double deadline = now_s() + timeout_s;
    cudaEvent_t ev;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(ev, s);
    if (e != cudaSuccess) return cti_cuda_fail(op, c->device, "cudaEventRecord", e);
    for (;;) {
        e = cudaEventQuery(ev);
        if (e != cudaErrorNotReady) break;
        pthread_mutex_lock(&c->lock);
        bool failed = c->failed;
        if (!failed && now_s() > deadline) {
            cti_error(CT_ERR_RUNTIME,
                      "%s: rank %d of %d: the work queued on cuda:%d did not complete within %g s "
                      "(the NCCL communicator was aborted)",
                      op, c->rank, c->world, c->device, timeout_s);
            fail_locked(c);
            failed = true;
        }
        pthread_mutex_unlock(&c->lock);
        if (failed) break;
        struct timespec t = {0, 200000};
        nanosleep(&t, NULL);
    }
    /* After a failure the event may never complete (the work before the
     * collectives may be what stalls); it is released when it does. */
    cudaEventDestroy(ev);
    if (e != cudaSuccess && e != cudaErrorNotReady)
        return cti_cuda_fail(op, c->device, "cudaEventQuery", e);
    return check(c, op);
}

static void comm_free(void *handle) {
    comm *c = handle;
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_signal(&c->wake);
    pthread_mutex_unlock(&c->lock);
    if (c->watching) pthread_join(c->watchdog, NULL);
    cudaSetDevice(c->device);
    if (!c->failed) {
        /* Finalize flushes queued work; an error here means a peer is gone,
         * and then abort is what frees the communicator. */
        ncclResult_t r = settle(c->nc, ncclCommFinalize(c->nc), now_s() + 30);
        if (r == ncclSuccess) ncclCommDestroy(c->nc);
        else ncclCommAbort(c->nc);
    }
    while (c->count) pop_locked(c);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->wake);
    free(c);
}

const cti_nccl_api cti_cuda_nccl = {
    .unique_id = unique_id,
    .comm_new = comm_new,
    .run = run,
    .check = check,
    .wait = wait_all,
    .comm_free = comm_free,
};
