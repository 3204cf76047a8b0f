/* The caching allocator for device memory, in the spirit of PyTorch's.
 *
 * cudaMalloc and cudaFree cost tens of microseconds and cudaFree waits for
 * the whole device, so storage freed by a tensor is kept in a per-device
 * pool and handed to the next request of its size class instead. Requests up
 * to 1 MiB are rounded to one of four classes per power of two (at most 25%
 * slack) and reuse a block of exactly that class; larger ones are rounded to
 * 2 MiB and take the smallest cached block that is at most 1/8 larger. All
 * ops of a device run in order on its one stream, so a block freed by one op
 * and reused by the next is never touched by both at once.
 *
 * A cudaMalloc that fails returns the device's cache to the driver and is
 * tried once more; a second failure is reported by the caller as
 * CT_ERR_OOM. CT_CUDA_NO_CACHE=1 in the environment frees every block at
 * once (for compute-sanitizer, which cannot see misuse inside cached
 * blocks).
 *
 * CUDA graphs (graph.c) get private pools, as PyTorch's do. While a thread
 * captures a graph on a device, its requests there are served from the
 * graph's pool: first the pool's own unused blocks (freed earlier in the
 * same capture: the graph replays in capture order, so the reuse is ordered
 * as it was recorded), then the device's cache, whose block then belongs to
 * the pool, then a new block from cudaMalloc with the thread's capture mode
 * relaxed for that call, as PyTorch's allocator makes new segments for a
 * graph's pool (cudaMalloc is not recorded and does not wait for the
 * device; the thread-local mode would otherwise count it as unsafe and
 * invalidate the capture). A step run once eagerly before its capture
 * leaves the cache holding most of what it needs, so few such calls
 * happen. A pool's blocks go back to the pool when freed, during the
 * capture or after it, and are handed to nobody else, so the addresses the
 * graph recorded stay its own at every replay; when the graph is freed they
 * return to the cache. With CT_CUDA_NO_CACHE a capture takes a new exact
 * allocation for every request and frees made during a capture wait for its
 * end (cudaFree would wait for the device). */
#include <pthread.h>
#include <stdlib.h>

#include "cuda_impl.h"

#define MIN_BLOCK 512u
#define SMALL_MAX ((size_t)1 << 20)
#define LARGE_ROUND ((size_t)2 << 20)
#define NCLASSES 45 /* 512, then 4 per power of two up to 1 MiB */

typedef struct block {
    void *ptr;
    size_t size;
    struct block *next;  /* in a free list or a hash chain */
    cti_cuda_pool *pool; /* the graph's pool it belongs to; NULL: the device's */
} block;

/* Unused blocks: by size class up to SMALL_MAX, else one list by size. */
typedef struct free_lists {
    block *small[NCLASSES];
    block *large; /* sorted by size, smallest first */
} free_lists;

struct cti_cuda_pool {
    int dev;
    free_lists free;
    size_t cached; /* bytes in free */
};

typedef struct dev_pool {
    pthread_mutex_t lock;
    free_lists free;
    block **table; /* live blocks by address */
    size_t table_cap, live;
    ct_cuda_memstats st;
    cti_cuda_pool *capture;  /* the pool that serves capture_thread's requests */
    pthread_t capture_thread;
} dev_pool;

static dev_pool pools[CTI_CUDA_MAX_DEVICES];
static pthread_once_t pools_once = PTHREAD_ONCE_INIT;
static bool no_cache;

static void init_pools(void) {
    for (int i = 0; i < CTI_CUDA_MAX_DEVICES; i++) pthread_mutex_init(&pools[i].lock, NULL);
    const char *e = getenv("CT_CUDA_NO_CACHE");
    no_cache = e && *e && strcmp(e, "0") != 0;
}

/* ---- size classes -------------------------------------------------------------------- */

static int class_of(size_t n, size_t *size) {
    if (n <= MIN_BLOCK) {
        *size = MIN_BLOCK;
        return 0;
    }
    int k = 63 - __builtin_clzll((unsigned long long)(n - 1)); /* 2^k < n <= 2^(k+1) */
    size_t m = (n + ((size_t)1 << (k - 2)) - 1) >> (k - 2);     /* 5..8 quarters */
    *size = m << (k - 2);
    return 1 + (k - 9) * 4 + (int)(m - 5);
}

static size_t round_size(size_t n, int *cls) {
    size_t size;
    if (n <= SMALL_MAX) {
        *cls = class_of(n, &size);
        return size;
    }
    *cls = -1;
    return (n + LARGE_ROUND - 1) / LARGE_ROUND * LARGE_ROUND;
}

/* ---- the table of live blocks --------------------------------------------------------- */

static size_t slot(const void *p, size_t cap) {
    return (size_t)(((uintptr_t)p >> 9) * 0x9E3779B97F4A7C15ull >> 20) & (cap - 1);
}

static void table_grow(dev_pool *d) {
    size_t cap = d->table_cap ? d->table_cap * 2 : 256;
    block **t = calloc(cap, sizeof *t);
    if (!t) return; /* keep the old table: longer chains, still correct */
    for (size_t i = 0; i < d->table_cap; i++) {
        block *b = d->table[i];
        while (b) {
            block *next = b->next;
            size_t s = slot(b->ptr, cap);
            b->next = t[s];
            t[s] = b;
            b = next;
        }
    }
    free(d->table);
    d->table = t;
    d->table_cap = cap;
}

static bool table_insert(dev_pool *d, block *b) {
    if (d->live * 2 >= d->table_cap) table_grow(d);
    if (!d->table) return false;
    size_t s = slot(b->ptr, d->table_cap);
    b->next = d->table[s];
    d->table[s] = b;
    d->live++;
    return true;
}

static block *table_remove(dev_pool *d, const void *p) {
    if (!d->table) return NULL;
    for (block **b = &d->table[slot(p, d->table_cap)]; *b; b = &(*b)->next) {
        if ((*b)->ptr != p) continue;
        block *hit = *b;
        *b = hit->next;
        d->live--;
        return hit;
    }
    return NULL;
}

/* ---- cached blocks ---------------------------------------------------------------------- */

static block *take_cached(free_lists *d, size_t size, int cls) {
    if (cls >= 0) {
        block *b = d->small[cls];
        if (b) d->small[cls] = b->next;
        return b;
    }
    for (block **b = &d->large; *b; b = &(*b)->next) {
        if ((*b)->size < size) continue;
        if ((*b)->size - size > size / 8) return NULL; /* the rest are larger still */
        block *hit = *b;
        *b = hit->next;
        return hit;
    }
    return NULL;
}

static void put_cached(free_lists *d, block *b) {
    int cls;
    round_size(b->size, &cls);
    if (cls >= 0) {
        b->next = d->small[cls];
        d->small[cls] = b;
        return;
    }
    block **at = &d->large;
    while (*at && (*at)->size < b->size) at = &(*at)->next;
    b->next = *at;
    *at = b;
}

static void release_block(dev_pool *d, block *b) {
    cudaFree(b->ptr);
    cudaGetLastError(); /* at exit the runtime may already be gone: nothing to do */
    d->st.reserved -= b->size;
    d->st.num_frees++;
    free(b);
}

/* Takes every block out of f, calling fn on each. */
static void drain(free_lists *f, dev_pool *d, void (*fn)(dev_pool *, block *)) {
    for (int c = 0; c < NCLASSES; c++) {
        while (f->small[c]) {
            block *b = f->small[c];
            f->small[c] = b->next;
            fn(d, b);
        }
    }
    while (f->large) {
        block *b = f->large;
        f->large = b->next;
        fn(d, b);
    }
}

/* Returns every cached block of d to the driver; the device must be
 * current and not being captured. Waits first: queued kernels may still use
 * a block freed on the host side. */
static void release_cache(dev_pool *d) {
    cudaDeviceSynchronize();
    cudaGetLastError();
    drain(&d->free, d, release_block);
}

/* ---- the allocator ------------------------------------------------------------------------- */

static void *device_malloc(dev_pool *d, size_t size) {
    void *p = NULL;
    d->st.num_mallocs++;
    cudaError_t e = cudaMalloc(&p, size);
    /* Emptying the cache waits for the device, which a capture forbids. */
    if (e == cudaErrorMemoryAllocation && !d->capture) {
        cudaGetLastError();
        d->st.num_retries++;
        release_cache(d);
        d->st.num_mallocs++;
        e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        d->st.num_ooms++;
        return NULL;
    }
    d->st.reserved += size;
    if (d->st.reserved > d->st.peak_reserved) d->st.peak_reserved = d->st.reserved;
    return p;
}

/* Makes dev current for the calls below; returns the device to restore. */
static int enter_device(int dev) {
    int cur = -1;
    if (cudaGetDevice(&cur) != cudaSuccess) cur = -1;
    if (cur != dev) cudaSetDevice(dev);
    cudaGetLastError();
    return cur;
}

static void leave_device(int prev, int dev) {
    if (prev >= 0 && prev != dev) cudaSetDevice(prev);
    cudaGetLastError();
}

/* An unused block back where it belongs (the caller holds d's lock): its
 * graph's pool, else the device's cache (with CT_CUDA_NO_CACHE the driver,
 * unless a capture is under way: cudaFree would wait for the device). */
static void give_back(dev_pool *d, block *b) {
    if (b->pool) {
        put_cached(&b->pool->free, b);
        b->pool->cached += b->size;
        d->st.graph_cached += b->size;
    } else if (no_cache && !d->capture) {
        int dev = (int)(d - pools);
        int prev = enter_device(dev);
        release_block(d, b);
        leave_device(prev, dev);
    } else {
        put_cached(&d->free, b);
    }
}

/* A new block of size bytes on dev (the caller holds d's lock), or NULL. */
static block *new_block(dev_pool *d, int dev, size_t size) {
    block *b = malloc(sizeof *b);
    int prev = enter_device(dev);
    void *p = b ? device_malloc(d, size) : NULL;
    leave_device(prev, dev);
    if (!p) {
        free(b);
        return NULL;
    }
    b->ptr = p;
    b->size = size;
    b->pool = NULL;
    return b;
}

/* A fresh block for a capture, cudaMalloc allowed for this one call (it is
 * not recorded into the graph either way). */
static block *capture_malloc(dev_pool *d, int dev, size_t size) {
    enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    block *b = new_block(d, dev, size);
    cudaThreadExchangeStreamCaptureMode(&mode);
    cudaGetLastError();
    return b;
}

/* A request of this thread while it captures a graph on dev (pool p): the
 * pool's unused blocks, the cache's, else a new one (all the pool's from
 * now on). NULL when the device is out of memory, which fails the capture
 * and is reported by the caller as out of memory. */
static block *capture_take(dev_pool *d, cti_cuda_pool *p, int dev, size_t nbytes, size_t size,
                           int cls) {
    block *b = NULL;
    if (!no_cache && (b = take_cached(&p->free, size, cls))) {
        p->cached -= b->size;
        d->st.graph_cached -= b->size;
        return b;
    }
    if (!no_cache) b = take_cached(&d->free, size, cls);
    if (!b) b = capture_malloc(d, dev, size);
    if (b) {
        b->pool = p;
        return b;
    }
    char msg[160];
    snprintf(msg, sizeof msg,
             "out of memory allocating %zu bytes on cuda:%d during a CUDA graph capture", nbytes,
             dev);
    cti_cuda_capture_failed(CT_ERR_OOM, msg);
    return NULL;
}

static void *cuda_alloc(size_t nbytes, int dev) {
    if (dev < 0 || dev >= cti_cuda_device_count()) return NULL;
    pthread_once(&pools_once, init_pools);
    dev_pool *d = &pools[dev];
    int cls;
    size_t size = round_size(nbytes, &cls);
    pthread_mutex_lock(&d->lock);
    block *b = NULL;
    if (d->capture && pthread_equal(d->capture_thread, pthread_self())) {
        b = capture_take(d, d->capture, dev, nbytes, size, cls);
        if (!b) {
            pthread_mutex_unlock(&d->lock);
            return NULL;
        }
    } else {
        b = no_cache ? NULL : take_cached(&d->free, size, cls);
        if (!b && !(b = new_block(d, dev, size))) {
            pthread_mutex_unlock(&d->lock);
            return NULL;
        }
    }
    if (!table_insert(d, b)) {
        give_back(d, b);
        pthread_mutex_unlock(&d->lock);
        return NULL;
    }
    d->st.num_allocs++;
    d->st.allocated += b->size;
    if (d->st.allocated > d->st.peak_allocated) d->st.peak_allocated = d->st.allocated;
    pthread_mutex_unlock(&d->lock);
    return b->ptr;
}

static void cuda_free(void *p, size_t nbytes, int dev) {
    (void)nbytes; /* the block's own size counts: it may be a larger cached one */
    if (!p || dev < 0 || dev >= CTI_CUDA_MAX_DEVICES) return;
    dev_pool *d = &pools[dev];
    pthread_mutex_lock(&d->lock);
    block *b = table_remove(d, p);
    if (b) {
        d->st.allocated -= b->size;
        give_back(d, b);
    }
    pthread_mutex_unlock(&d->lock);
}

static const cti_allocator cuda_allocator = {cuda_alloc, cuda_free};

void cti_cuda_register_allocator(void) {
    pthread_once(&pools_once, init_pools);
    cti_register_allocator(CT_DEVICE_CUDA, &cuda_allocator);
}

/* ---- public API (forwarded by the library, cuda_api.h) ------------------------------------- */

ct_status cti_cuda_memory_stats(int device, ct_cuda_memstats *out) {
    static const char op[] = "ct_cuda_memory_stats";
    if (!out) return cti_error(CT_ERR_INVALID_ARG, "%s: stats is NULL", op);
    if (cti_cuda_check_device(op, device) != CT_OK) return ct_last_status();
    pthread_once(&pools_once, init_pools);
    pthread_mutex_lock(&pools[device].lock);
    *out = pools[device].st;
    pthread_mutex_unlock(&pools[device].lock);
    return CT_OK;
}

ct_status cti_cuda_reset_peak_memory_stats(int device) {
    static const char op[] = "ct_cuda_reset_peak_memory_stats";
    if (cti_cuda_check_device(op, device) != CT_OK) return ct_last_status();
    pthread_once(&pools_once, init_pools);
    dev_pool *d = &pools[device];
    pthread_mutex_lock(&d->lock);
    d->st.peak_allocated = d->st.allocated;
    d->st.peak_reserved = d->st.reserved;
    pthread_mutex_unlock(&d->lock);
    return CT_OK;
}

/* Empties dev's cache; a device under capture is left as it is (emptying
 * waits for the device) and named in the error. */
static ct_status empty_one(const char *op, int dev) {
    dev_pool *d = &pools[dev];
    pthread_mutex_lock(&d->lock);
    bool capturing = d->capture != NULL;
    if (!capturing) {
        int prev = enter_device(dev);
        release_cache(d);
        leave_device(prev, dev);
    }
    pthread_mutex_unlock(&d->lock);
    if (capturing)
        return cti_error(CT_ERR_CAPTURE,
                         "%s: cuda:%d is being captured into a CUDA graph; emptying its cache "
                         "waits for the device, which a capture does not allow (call it after "
                         "ct_cuda_graph_capture_end)",
                         op, dev);
    return CT_OK;
}

ct_status cti_cuda_empty_cache(int device) {
    static const char op[] = "ct_cuda_empty_cache";
    if (device != -1 && cti_cuda_check_device(op, device) != CT_OK) return ct_last_status();
    pthread_once(&pools_once, init_pools);
    if (device >= 0) return empty_one(op, device);
    ct_status st = CT_OK;
    for (int i = 0; i < cti_cuda_device_count(); i++) {
        ct_status s = empty_one(op, i);
        if (st == CT_OK) st = s;
    }
    return st;
}

/* ---- graph pools (graph.c) ---------------------------------------------------------------- */

cti_cuda_pool *cti_cuda_pool_new(int dev) {
    pthread_once(&pools_once, init_pools);
    cti_cuda_pool *p = calloc(1, sizeof *p);
    if (p) p->dev = dev;
    return p;
}

void cti_cuda_pool_capture(cti_cuda_pool *p, bool on) {
    dev_pool *d = &pools[p->dev];
    pthread_mutex_lock(&d->lock);
    if (on) {
        d->capture = p;
        d->capture_thread = pthread_self();
    } else if (d->capture == p) {
        d->capture = NULL;
        /* the frees CT_CUDA_NO_CACHE deferred during the capture */
        if (no_cache) {
            int prev = enter_device(p->dev);
            release_cache(d);
            leave_device(prev, p->dev);
        }
    }
    pthread_mutex_unlock(&d->lock);
}

/* A pool block back to the device (the pool is going away). */
static void unpool(dev_pool *d, block *b) {
    b->pool = NULL;
    give_back(d, b);
}

void cti_cuda_pool_release(cti_cuda_pool *p) {
    if (!p) return;
    dev_pool *d = &pools[p->dev];
    pthread_mutex_lock(&d->lock);
    if (d->capture == p) d->capture = NULL;
    d->st.graph_cached -= p->cached;
    drain(&p->free, d, unpool);
    /* Blocks still held by tensors go to the device's cache when freed. */
    for (size_t i = 0; i < d->table_cap; i++)
        for (block *b = d->table[i]; b; b = b->next)
            if (b->pool == p) b->pool = NULL;
    pthread_mutex_unlock(&d->lock);
    free(p);
}
