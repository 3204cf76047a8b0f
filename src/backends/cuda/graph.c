/* CUDA graphs: ct_cuda_graph_capture_begin/end, ct_cuda_graph_replay and
 * ct_cuda_graph_free (tensor/cuda.h; the rules for users are in
 * docs/CUDA_GRAPHS.md).
 *
 * A capture records what the capturing thread queues on its device's one
 * stream (stream.c) with cudaStreamBeginCapture, and capture_end turns it
 * into an executable graph that a replay launches with one call. The mode
 * is cudaStreamCaptureModeThreadLocal: a call CUDA deems unsafe during a
 * capture (cudaMalloc, a synchronizing call) made on the capturing thread
 * invalidates the capture, so one cten does not know of (the user's own
 * CUDA calls, a library's) is still caught and reported by capture_end
 * rather than recorded wrong; other threads are not affected, so a data
 * loader or work on another GPU goes on (Global mode would fail their
 * cudaMalloc and cudaHostAlloc, and invalidate the capture with them).
 * Work from other threads on the captured device is refused by cten itself
 * (below), since on the shared stream it would land in the graph.
 *
 * cten refuses, with a message naming the call, everything that cannot be
 * replayed, before CUDA sees it:
 *  - on the capturing thread, a call on the host or another device (the
 *    dispatcher's capture guard) and work queued on another device;
 *  - a wait for the device (cti_cuda_sync, ct_cuda_synchronize, the kernels
 *    that read a result back to check it);
 *  - first uses that allocate or time on the device: creating the cuBLAS or
 *    cuDNN handle, a cuDNN algorithm search or attention plan;
 *  - on other threads, work queued on the captured device or a wait for it.
 * A refusal on the capturing thread fails the capture: the calls after it
 * are still recorded (not run), and capture_end discards the graph and
 * returns the first refusal's message; the library is then as before.
 *
 * Memory: each graph has a private pool in the caching allocator (alloc.c)
 * that serves the capturing thread's requests; its blocks stay the graph's
 * until the graph is freed, so the addresses the kernels recorded are valid
 * at every replay.
 *
 * Random kernels take their Philox key and first draw as arguments; a
 * replay of recorded arguments would repeat the same numbers. As PyTorch
 * does, the capture notes which generator each draw came from (an observer
 * on ct_generator_reserve, core/rng.c) and passes those kernels a pointer to
 * a per-graph device array holding each generator's (seed, first draw) and
 * the draw's offset within the graph; every replay reserves the graph's
 * whole range from each generator, as the eager step would, and writes its
 * seed and first draw there before the launch. */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda_impl.h"

enum { CAPTURING, READY, FAILED };

/* Generators one capture may draw from. */
#define MAX_GENS 16

/* A generator the capture drew from: the range of draws it reserved. */
typedef struct gen_use {
    ct_generator *gen;
    uint64_t seed, base, end;
} gen_use;

/* One reservation, as a random kernel's front end passes it (seed, first). */
typedef struct draw {
    uint64_t seed, first;
    int gen;
} draw;

struct ct_cuda_graph {
    int device, state;
    cudaStream_t stream;
    cudaGraphExec_t exec;
    cti_cuda_pool *pool;
    cti_capture_guard guard;
    ct_status failure; /* the first refusal during the capture */
    char message[1024];
    ct_tensor *philox; /* int64 [2 * MAX_GENS] on the device: per generator (seed, first) */
    int ngens;
    gen_use gens[MAX_GENS];
    draw *draws;
    size_t ndraws, cap;
};

/* The graph each device is being captured into, and how many captures are
 * under way: while none is, every check below is one load. */
static _Atomic(ct_cuda_graph *) capturing[CTI_CUDA_MAX_DEVICES];
static atomic_int captures;
static pthread_mutex_t claim_lock = PTHREAD_MUTEX_INITIALIZER;
/* The graph this thread captures. */
static _Thread_local ct_cuda_graph *mine;

static bool any_capture(void) { return atomic_load_explicit(&captures, memory_order_acquire) != 0; }

/* Records the error just set as g's failure when it is the first; returns
 * its status. */
static ct_status fail(ct_cuda_graph *g, ct_status st) {
    if (g && g->state == CAPTURING && g->failure == CT_OK) {
        g->failure = st;
        snprintf(g->message, sizeof g->message, "%s", ct_last_error());
    }
    return st;
}

void cti_cuda_capture_failed(ct_status st, const char *message) {
    ct_cuda_graph *g = mine;
    if (!g || g->state != CAPTURING || g->failure != CT_OK) return;
    g->failure = st;
    snprintf(g->message, sizeof g->message, "%s", message);
}

/* A failure found outside any call that could report it (a reservation
 * of random draws): kept for capture_end, the thread's error untouched. */
static void note(ct_cuda_graph *g, ct_status st, const char *fmt, ...) {
    if (g->failure != CT_OK) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->message, sizeof g->message, fmt, ap);
    va_end(ap);
    g->failure = st;
}

static void guard_refused(void *ctx, ct_status st, const char *message) {
    (void)ctx;
    cti_cuda_capture_failed(st, message);
}

bool cti_cuda_capturing(int device) {
    return any_capture() && mine && mine->device == device;
}

ct_status cti_cuda_capture_check_launch(const char *op, int device) {
    if (!any_capture()) return CT_OK;
    ct_cuda_graph *g = mine;
    if (g && g->device == device) return CT_OK;
    if (g)
        return fail(g, cti_error(CT_ERR_CAPTURE,
                                 "%s: work on cuda:%d while this thread captures a CUDA graph on "
                                 "cuda:%d would run once, now, and never at replay; keep the "
                                 "captured work on cuda:%d",
                                 op, device, g->device, g->device));
    if ((unsigned)device < CTI_CUDA_MAX_DEVICES &&
        atomic_load_explicit(&capturing[device], memory_order_acquire))
        return cti_error(CT_ERR_CAPTURE,
                         "%s: cuda:%d is being captured into a CUDA graph by another thread; "
                         "work queued on it now would be recorded into that graph (queue it "
                         "after ct_cuda_graph_capture_end)",
                         op, device);
    return CT_OK;
}

ct_status cti_cuda_capture_check_wait(const char *op, int device, const char *what) {
    if (!any_capture()) return CT_OK;
    ct_cuda_graph *g = mine;
    if (g)
        return fail(g, cti_error(CT_ERR_CAPTURE,
                                 "%s: %s, which cannot be captured: this thread captures a CUDA "
                                 "graph on cuda:%d, and nothing it records runs before a replay; "
                                 "read results after ct_cuda_graph_replay",
                                 op, what, g->device));
    if ((unsigned)device < CTI_CUDA_MAX_DEVICES &&
        atomic_load_explicit(&capturing[device], memory_order_acquire))
        return cti_error(CT_ERR_CAPTURE,
                         "%s: %s on cuda:%d, which another thread is capturing into a CUDA "
                         "graph; wait after ct_cuda_graph_capture_end",
                         op, what, device);
    return CT_OK;
}

ct_status cti_cuda_capture_refuse(const char *op, int device, const char *what) {
    return fail(mine, cti_error(CT_ERR_CAPTURE,
                                "%s: %s on cuda:%d cannot be captured in a CUDA graph; run the "
                                "step once eagerly before capturing it, so that this is done "
                                "already",
                                op, what, device));
}

/* ---- random numbers ------------------------------------------------------------------------ */

static int gen_index(ct_cuda_graph *g, ct_generator *gen) {
    for (int k = 0; k < g->ngens; k++)
        if (g->gens[k].gen == gen) return k;
    return -1;
}

/* The observer of this thread's reservations during the capture. */
static void on_reserve(void *ctx, ct_generator *gen, uint64_t seed, uint64_t first, uint64_t n) {
    ct_cuda_graph *g = ctx;
    if (g->failure != CT_OK) return;
    int k = gen_index(g, gen);
    if (k < 0) {
        if (g->ngens == MAX_GENS) {
            note(g, CT_ERR_CAPTURE,
                 "a random op drew from more than %d generators; a CUDA graph takes at most %d",
                 MAX_GENS, MAX_GENS);
            return;
        }
        k = g->ngens++;
        g->gens[k] = (gen_use){gen, seed, first, first};
    }
    gen_use *u = &g->gens[k];
    if (seed != u->seed || first < u->end) {
        note(g, CT_ERR_CAPTURE,
             "a generator was reseeded or its offset set back during the capture, which a "
             "replay cannot repeat; set generators before capturing");
        return;
    }
    u->end = first + n;
    if (g->ndraws == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        draw *d = realloc(g->draws, cap * sizeof *d);
        if (!d) {
            note(g, CT_ERR_OOM, "out of memory recording a random op");
            return;
        }
        g->draws = d;
        g->cap = cap;
    }
    g->draws[g->ndraws++] = (draw){seed, first, k};
}

void cti_cuda_philox(int device, uint64_t seed, uint64_t *offset, const uint64_t **state) {
    *state = NULL;
    if (!cti_cuda_capturing(device)) return;
    ct_cuda_graph *g = mine;
    /* The latest match: a front end reserves right before its kernel runs. */
    for (size_t i = g->ndraws; i-- > 0;) {
        const draw *d = &g->draws[i];
        if (d->seed != seed || d->first != *offset) continue;
        *offset -= g->gens[d->gen].base;
        *state = (const uint64_t *)cti_data(g->philox) + 2 * d->gen;
        return;
    }
    /* Not reserved during this capture (an attention backward of a forward
     * run before it): fixed draws, the same at every replay, as eagerly. */
}

/* Before a launch: each generator's seed and a fresh range of the size the
 * capture drew, as the eager step would reserve it. */
static ct_status renew_draws(const char *op, ct_cuda_graph *g, cudaStream_t stream) {
    uint64_t v[2 * MAX_GENS];
    for (int k = 0; k < g->ngens; k++) {
        gen_use *u = &g->gens[k];
        v[2 * k] = ct_generator_seed(u->gen);
        v[2 * k + 1] = ct_generator_reserve(u->gen, u->end - u->base);
    }
    /* From pageable memory: the bytes are staged when the call returns. */
    cudaError_t e = cudaMemcpyAsync(cti_data(g->philox), v, sizeof(uint64_t) * 2 * (size_t)g->ngens,
                                    cudaMemcpyHostToDevice, stream);
    return e == cudaSuccess ? CT_OK : cti_cuda_fail(op, g->device, "cudaMemcpyAsync", e);
}

/* ---- capture --------------------------------------------------------------------------------- */

static void destroy(ct_cuda_graph *g) {
    if (g->exec) cudaGraphExecDestroy(g->exec);
    cudaGetLastError();
    cti_cuda_pool_release(g->pool);
    ct_tensor_release(g->philox);
    free(g->draws);
    free(g);
}

ct_cuda_graph *cti_cuda_graph_capture_begin(int device) {
    static const char op[] = "ct_cuda_graph_capture_begin";
    if (cti_cuda_check_device(op, device) != CT_OK) return NULL;
    if (mine)
        return cti_error_null(CT_ERR_CAPTURE,
                              "%s: this thread is capturing a CUDA graph on cuda:%d already; end "
                              "that capture with ct_cuda_graph_capture_end first",
                              op, mine->device);
    if (atomic_load(&capturing[device]))
        return cti_error_null(CT_ERR_CAPTURE,
                              "%s: cuda:%d is being captured into a CUDA graph by another "
                              "thread; one device takes one capture at a time",
                              op, device);
    cudaStream_t stream;
    cti_cuda_fault_slot slot;
    /* The fault record allocates on first use: now, not during the capture. */
    if (cti_cuda_begin(op, device, &stream) != CT_OK ||
        cti_cuda_fault_slot_get(op, device, &slot) != CT_OK)
        return NULL;
    ct_cuda_graph *g = calloc(1, sizeof *g);
    if (!g) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    g->device = device;
    g->stream = stream;
    g->state = CAPTURING;
    int64_t n = 2 * MAX_GENS;
    g->philox = cti_tensor_new(op, 1, &n, CT_I64, CT_CUDA(device));
    if (g->philox) cti_scope_forget(g->philox); /* the graph's own, whatever scope is open */
    g->pool = g->philox ? cti_cuda_pool_new(device) : NULL;
    if (!g->pool) {
        if (g->philox) cti_error(CT_ERR_OOM, "%s: out of memory", op);
        destroy(g);
        return NULL;
    }
    pthread_mutex_lock(&claim_lock);
    ct_cuda_graph *other = atomic_load(&capturing[device]);
    if (!other) {
        atomic_store(&capturing[device], g);
        atomic_fetch_add(&captures, 1);
    }
    pthread_mutex_unlock(&claim_lock);
    if (other) {
        destroy(g);
        return cti_error_null(CT_ERR_CAPTURE,
                              "%s: cuda:%d is being captured into a CUDA graph by another "
                              "thread; one device takes one capture at a time",
                              op, device);
    }
    cti_cuda_pool_capture(g->pool, true);
    cudaError_t e = cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cti_cuda_fail(op, device, "cudaStreamBeginCapture", e);
        cti_cuda_pool_capture(g->pool, false);
        atomic_store(&capturing[device], NULL);
        atomic_fetch_sub(&captures, 1);
        destroy(g);
        return NULL;
    }
    mine = g;
    g->guard = (cti_capture_guard){CT_CUDA(device), "captures a CUDA graph", guard_refused, g};
    cti_dispatch_guard(&g->guard);
    cti_rng_observe(on_reserve, g);
    return g;
}

/* Ends g's capture on this thread (its owner) and undoes the capture state;
 * *graph receives what CUDA recorded (NULL when it refused). */
static cudaError_t stop(ct_cuda_graph *g, cudaGraph_t *graph) {
    *graph = NULL;
    cudaSetDevice(g->device);
    cudaError_t e = cudaStreamEndCapture(g->stream, graph);
    cudaGetLastError();
    cti_rng_observe(NULL, NULL);
    cti_dispatch_guard(NULL);
    mine = NULL;
    cti_cuda_pool_capture(g->pool, false);
    atomic_store(&capturing[g->device], NULL);
    atomic_fetch_sub(&captures, 1);
    return e;
}

ct_status cti_cuda_graph_capture_end(ct_cuda_graph *g) {
    static const char op[] = "ct_cuda_graph_capture_end";
    if (!g) return cti_error(CT_ERR_INVALID_ARG, "%s: graph is NULL", op);
    if (g->state != CAPTURING)
        return cti_error(CT_ERR_CAPTURE,
                         "%s: the graph is not being captured (its capture ended already%s)", op,
                         g->state == FAILED ? " and failed" : "");
    if (g != mine)
        return cti_error(CT_ERR_CAPTURE,
                         "%s: the capture on cuda:%d was begun by another thread; end it on "
                         "that thread",
                         op, g->device);
    cudaGraph_t graph = NULL;
    cudaError_t e = stop(g, &graph);
    if (g->failure == CT_OK && e != cudaSuccess) {
        g->failure = CT_ERR_CAPTURE;
        snprintf(g->message, sizeof g->message,
                 "cudaStreamEndCapture: %s (%s); a CUDA call that a capture does not allow "
                 "(cudaMalloc, a synchronizing call) was made on this thread",
                 cudaGetErrorString(e), cudaGetErrorName(e));
    }
    if (g->failure == CT_OK) {
        e = cudaGraphInstantiate(&g->exec, graph, 0);
        if (e != cudaSuccess) {
            g->exec = NULL;
            g->failure = CT_ERR_CAPTURE;
            snprintf(g->message, sizeof g->message, "cudaGraphInstantiate: %s (%s)",
                     cudaGetErrorString(e), cudaGetErrorName(e));
        }
    }
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
    if (g->failure != CT_OK) {
        g->state = FAILED;
        /* What the capture allocated is of no use now: the cache takes it. */
        cti_cuda_pool_release(g->pool);
        g->pool = NULL;
        return cti_error(CT_ERR_CAPTURE, "%s: the capture on cuda:%d failed: %s", op, g->device,
                         g->message);
    }
    /* Moves the graph to the device now rather than at the first replay. */
    cudaGraphUpload(g->exec, g->stream);
    cudaGetLastError();
    g->state = READY;
    return CT_OK;
}

ct_status cti_cuda_graph_replay(ct_cuda_graph *g) {
    static const char op[] = "ct_cuda_graph_replay";
    if (!g) return cti_error(CT_ERR_INVALID_ARG, "%s: graph is NULL", op);
    if (g->state == CAPTURING)
        return cti_error(CT_ERR_CAPTURE,
                         "%s: the graph is still being captured; end its capture with "
                         "ct_cuda_graph_capture_end first",
                         op);
    if (g->state == FAILED)
        return cti_error(CT_ERR_CAPTURE,
                         "%s: the graph's capture failed (%s); it can only be freed", op,
                         g->message);
    if (mine)
        return fail(mine, cti_error(CT_ERR_CAPTURE,
                                    "%s: this thread is capturing a CUDA graph on cuda:%d; a "
                                    "replay cannot be recorded into it",
                                    op, mine->device));
    cudaStream_t stream;
    if (cti_cuda_begin(op, g->device, &stream) != CT_OK) return ct_last_status();
    if (g->ngens > 0 && renew_draws(op, g, stream) != CT_OK) return ct_last_status();
    cudaError_t e = cudaGraphLaunch(g->exec, stream);
    if (e != cudaSuccess) return cti_cuda_fail(op, g->device, "cudaGraphLaunch", e);
    return cti_cuda_launched(op, g->device, "cuda_graph_replay");
}

void cti_cuda_graph_free(ct_cuda_graph *g) {
    if (!g) return;
    if (g->state == CAPTURING) {
        if (g != mine) {
            cti_error(CT_ERR_CAPTURE,
                      "ct_cuda_graph_free: the graph is being captured by another thread; free "
                      "it on that thread (it is left as it is)");
            return;
        }
        cudaGraph_t graph = NULL;
        stop(g, &graph);
        if (graph) cudaGraphDestroy(graph);
        cudaGetLastError();
    }
    destroy(g);
}
