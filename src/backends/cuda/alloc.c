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
 * blocks). */
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
    struct block *next; /* in a free list or a hash chain */
} block;

typedef struct dev_pool {
    pthread_mutex_t lock;
    block *small[NCLASSES];
    block *large; /* sorted by size, smallest first */
    block **table; /* live blocks by address */
    size_t table_cap, live;
    ct_cuda_memstats st;
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

static block *take_cached(dev_pool *d, size_t size, int cls) {
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

static void put_cached(dev_pool *d, block *b) {
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

/* Returns every cached block of d to the driver; the device must be
 * current. Waits first: queued kernels may still use a block freed on the
 * host side. */
static void release_cache(dev_pool *d) {
    cudaDeviceSynchronize();
    cudaGetLastError();
    for (int c = 0; c < NCLASSES; c++) {
        while (d->small[c]) {
            block *b = d->small[c];
            d->small[c] = b->next;
            release_block(d, b);
        }
    }
    while (d->large) {
        block *b = d->large;
        d->large = b->next;
        release_block(d, b);
    }
}

/* ---- the allocator ------------------------------------------------------------------------- */

static void *device_malloc(dev_pool *d, size_t size) {
    void *p = NULL;
    d->st.num_mallocs++;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
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

static void *cuda_alloc(size_t nbytes, int dev) {
    if (dev < 0 || dev >= cti_cuda_device_count()) return NULL;
    pthread_once(&pools_once, init_pools);
    dev_pool *d = &pools[dev];
    int cls;
    size_t size = round_size(nbytes, &cls);
    pthread_mutex_lock(&d->lock);
    block *b = no_cache ? NULL : take_cached(d, size, cls);
    if (!b) {
        b = malloc(sizeof *b);
        int prev = enter_device(dev);
        void *p = b ? device_malloc(d, size) : NULL;
        leave_device(prev, dev);
        if (!p) {
            free(b);
            pthread_mutex_unlock(&d->lock);
            return NULL;
        }
        b->ptr = p;
        b->size = size;
    }
    if (!table_insert(d, b)) {
        put_cached(d, b);
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
        if (no_cache) {
            int prev = enter_device(dev);
            release_block(d, b);
            leave_device(prev, dev);
        } else {
            put_cached(d, b);
        }
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

static void empty_one(int dev) {
    dev_pool *d = &pools[dev];
    pthread_mutex_lock(&d->lock);
    int prev = enter_device(dev);
    release_cache(d);
    leave_device(prev, dev);
    pthread_mutex_unlock(&d->lock);
}

ct_status cti_cuda_empty_cache(int device) {
    static const char op[] = "ct_cuda_empty_cache";
    if (device != -1 && cti_cuda_check_device(op, device) != CT_OK) return ct_last_status();
    pthread_once(&pools_once, init_pools);
    if (device >= 0) {
        empty_one(device);
        return CT_OK;
    }
    for (int i = 0; i < cti_cuda_device_count(); i++) empty_one(i);
    return CT_OK;
}
