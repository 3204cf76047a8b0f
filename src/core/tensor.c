/* Tensor handles and storages: allocation, reference counts, properties.
 *
 * A new tensor is one block [storage | handle | data] when its data is small,
 * so creating and dropping a small result costs one malloc and one free; the
 * embedded handle keeps a reference on its storage, and the block is freed
 * when the storage's last reference goes. */
#include <pthread.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tensor_impl.h"

#define CTI_INLINE_MAX 1024 /* bytes of data kept in the storage's block */
#define CTI_ALIGN 64        /* alignment of separately allocated data */

/* Allocation statistics. Each thread counts into its own block without
 * locked instructions (a result's creation and release are on the hot path
 * of every op); a reader sums the blocks. A thread's block stays in the list
 * after it exits: its counts still describe tensors it made. */
typedef struct stats_block {
    atomic_llong tensors, storages, bytes;
    struct stats_block *next;
} stats_block;

static stats_block *all_blocks;
static pthread_mutex_t blocks_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local stats_block *my_block;
static stats_block fallback_block; /* used if a thread's block cannot be allocated */

static stats_block *stats(void) {
    if (my_block) return my_block;
    stats_block *b = calloc(1, sizeof *b);
    pthread_mutex_lock(&blocks_lock);
    if (!b) {
        b = &fallback_block;
    } else {
        b->next = all_blocks;
        all_blocks = b;
    }
    pthread_mutex_unlock(&blocks_lock);
    my_block = b;
    return b;
}

/* Only the owning thread writes its counters (the fallback block is shared,
 * a rare case where a lost update is acceptable). */
static inline void bump(atomic_llong *c, long long d) {
    atomic_store_explicit(c, atomic_load_explicit(c, memory_order_relaxed) + d,
                          memory_order_relaxed);
}

cti_alloc_stats cti_get_alloc_stats(void) {
    cti_alloc_stats s = {0, 0, 0};
    pthread_mutex_lock(&blocks_lock);
    for (stats_block *b = all_blocks; b; b = b->next) {
        s.live_tensors += atomic_load(&b->tensors);
        s.live_storages += atomic_load(&b->storages);
        s.live_bytes += atomic_load(&b->bytes);
    }
    s.live_tensors += atomic_load(&fallback_block.tensors);
    s.live_storages += atomic_load(&fallback_block.storages);
    s.live_bytes += atomic_load(&fallback_block.bytes);
    pthread_mutex_unlock(&blocks_lock);
    return s;
}

/* ---- allocators ----------------------------------------------------------------
 * CPU blocks from 64 KiB on are kept in a cache when freed and handed out
 * again for the same rounded size. glibc returns such blocks to the kernel
 * (mmap'd chunks at once, the heap's top when it trims), so every new result
 * would otherwise pay page faults on first touch: with transparent huge pages
 * that is 2 MiB zeroed per fault, measured as 40% of a small CNN's training
 * step here, several times the work of the memory-bound ops themselves.
 * Blocks from 2 MiB on are rounded to huge-page multiples and advised to use
 * them; smaller ones to 64 KiB multiples. The cache holds at most
 * CT_CPU_CACHE_MB (default 512) megabytes; ct_cpu_empty_cache frees it. */
#define CTI_BIG (64u << 10)        /* blocks from this size on are cached */
#define CTI_SMALL_ROUND (64u << 10)
#define CTI_BIG_ROUND (2u << 20)   /* from this size on, huge-page multiples */
#define CTI_CACHE_BUCKETS 64

typedef struct cached_block {
    void *ptr;
    size_t size;
    uint64_t seq; /* when it was cached: the oldest goes first when the cache is full */
    struct cached_block *next;
} cached_block;

static pthread_mutex_t cache_lock = PTHREAD_MUTEX_INITIALIZER;
static cached_block *cache_heads[CTI_CACHE_BUCKETS]; /* hashed by size */
static size_t cache_bytes;
static uint64_t cache_seq;
static size_t cache_limit = (size_t)-1; /* read from the environment on first use */

static size_t cache_cap(void) {
    if (cache_limit == (size_t)-1) {
        const char *e = getenv("CT_CPU_CACHE_MB");
        long mb = e && *e ? strtol(e, NULL, 10) : 512;
        cache_limit = mb > 0 ? (size_t)mb << 20 : 0;
    }
    return cache_limit;
}

static size_t big_size(size_t nbytes) {
    size_t r = nbytes >= CTI_BIG_ROUND ? CTI_BIG_ROUND : CTI_SMALL_ROUND;
    return (nbytes + r - 1) / r * r;
}

static cached_block **bucket(size_t size) {
    return &cache_heads[(size / CTI_SMALL_ROUND) % CTI_CACHE_BUCKETS];
}

static void *cpu_alloc(size_t nbytes, int index) {
    (void)index;
    void *p = NULL;
    if (nbytes >= CTI_BIG) {
        size_t size = big_size(nbytes);
        pthread_mutex_lock(&cache_lock);
        for (cached_block **b = bucket(size); *b; b = &(*b)->next) {
            if ((*b)->size != size) continue;
            cached_block *hit = *b;
            *b = hit->next;
            cache_bytes -= size;
            p = hit->ptr;
            free(hit);
            break;
        }
        pthread_mutex_unlock(&cache_lock);
        if (p) return p;
        size_t align = size >= CTI_BIG_ROUND ? CTI_BIG_ROUND : 4096;
        if (posix_memalign(&p, align, size) != 0) {
            ct_cpu_empty_cache(); /* retry once with the cache returned to the system */
            if (posix_memalign(&p, align, size) != 0) return NULL;
        }
#ifdef MADV_HUGEPAGE
        if (size >= CTI_BIG_ROUND) madvise(p, size, MADV_HUGEPAGE);
#endif
        return p;
    }
    size_t n = (nbytes + CTI_ALIGN - 1) / CTI_ALIGN * CTI_ALIGN;
    if (posix_memalign(&p, CTI_ALIGN, n ? n : CTI_ALIGN) != 0) return NULL;
    return p;
}

/* Returns a list of blocks to the system. */
static void free_blocks(cached_block *b) {
    while (b) {
        cached_block *next = b->next;
        free(b->ptr);
        free(b);
        b = next;
    }
}

/* Unlinks the least recently cached block; NULL when the cache is empty.
 * Called with cache_lock held. */
static cached_block *take_oldest(void) {
    cached_block **oldest = NULL;
    for (int i = 0; i < CTI_CACHE_BUCKETS; i++)
        for (cached_block **b = &cache_heads[i]; *b; b = &(*b)->next)
            if (!oldest || (*b)->seq < (*oldest)->seq) oldest = b;
    if (!oldest) return NULL;
    cached_block *o = *oldest;
    *oldest = o->next;
    cache_bytes -= o->size;
    return o;
}

/* A block that does not fit evicts the least recently cached ones, so a
 * program whose shapes change keeps caching its current sizes instead of
 * holding on to sizes it no longer uses. */
static void cpu_free(void *p, size_t nbytes, int index) {
    (void)index;
    cached_block *evicted = NULL;
    if (nbytes >= CTI_BIG) {
        size_t size = big_size(nbytes);
        cached_block *b = malloc(sizeof *b);
        pthread_mutex_lock(&cache_lock);
        size_t cap = cache_cap();
        if (b && size <= cap) {
            while (cache_bytes + size > cap) {
                cached_block *o = take_oldest();
                o->next = evicted;
                evicted = o;
            }
            b->ptr = p;
            b->size = size;
            b->seq = ++cache_seq;
            b->next = *bucket(size);
            *bucket(size) = b;
            cache_bytes += size;
            p = NULL;
            b = NULL;
        }
        pthread_mutex_unlock(&cache_lock);
        free(b);
    }
    free(p);
    free_blocks(evicted);
}

void ct_cpu_empty_cache(void) {
    cached_block *lists[CTI_CACHE_BUCKETS];
    pthread_mutex_lock(&cache_lock);
    memcpy(lists, cache_heads, sizeof lists);
    memset(cache_heads, 0, sizeof cache_heads);
    cache_bytes = 0;
    pthread_mutex_unlock(&cache_lock);
    for (int i = 0; i < CTI_CACHE_BUCKETS; i++) free_blocks(lists[i]);
}

size_t ct_cpu_cached_bytes(void) {
    pthread_mutex_lock(&cache_lock);
    size_t n = cache_bytes;
    pthread_mutex_unlock(&cache_lock);
    return n;
}

static const cti_allocator cpu_allocator = {cpu_alloc, cpu_free};
static const cti_allocator *allocators[CT_NUM_DEVICE_TYPES] = {&cpu_allocator};

void cti_register_allocator(ct_device_type type, const cti_allocator *a) {
    if ((unsigned)type < CT_NUM_DEVICE_TYPES && type != CT_DEVICE_CPU) allocators[type] = a;
}

/* A block holding a storage and, when embed is set, the first handle and
 * inline data after it. */
typedef struct block {
    cti_storage storage;
    struct ct_tensor handle;
} block;

#define CTI_BLOCK_DATA_OFFSET ((sizeof(block) + 63) / 64 * 64)

static void storage_release(cti_storage *s) {
    if (atomic_fetch_sub_explicit(&s->refcount, 1, memory_order_acq_rel) != 1) return;
    stats_block *st = stats();
    if (s->device.type == CT_DEVICE_CPU) bump(&st->bytes, -(long long)s->nbytes);
    if (s->release)
        s->release(s->release_ctx);
    else if (!s->inline_data && s->data)
        allocators[s->device.type]->free(s->data, s->nbytes, s->device.index);
    bump(&st->storages, -1);
    free(s); /* the block starts with the storage */
}

void cti_storage_retain(cti_storage *s) {
    atomic_fetch_add_explicit(&s->refcount, 1, memory_order_relaxed);
}

void cti_storage_release(cti_storage *s) { storage_release(s); }

static void init_geometry(ct_tensor *t, int ndim, const int64_t *shape, ct_dtype dtype) {
    atomic_init(&t->refcount, 1);
    t->ndim = ndim;
    t->dtype = dtype;
    t->wrapped_number = false;
    t->nograd_view = false;
    t->offset = 0;
    if (ndim > 0) memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
    cti_contiguous_strides(ndim, shape, t->stride);
    atomic_init(&t->scope, NULL);
    t->scope_slot = -1;
    t->autograd = NULL;
}

ct_tensor *cti_tensor_new(const char *op, int ndim, const int64_t *shape, ct_dtype dtype,
                          ct_device device) {
    size_t nbytes;
    if (!cti_checked_nbytes(op, ndim, shape, dtype, &nbytes)) return NULL;
    if ((unsigned)device.type >= CT_NUM_DEVICE_TYPES || !allocators[device.type]) {
        char d[32];
        return cti_error_null(CT_ERR_DEVICE, "%s: device %s is not available", op,
                              ct_device_str(device, d, sizeof d));
    }
    bool inl = device.type == CT_DEVICE_CPU && nbytes <= CTI_INLINE_MAX;
    block *b = malloc(CTI_BLOCK_DATA_OFFSET + (inl ? nbytes : 0));
    if (!b) return cti_error_null(CT_ERR_OOM, "%s: out of memory allocating a tensor", op);
    cti_storage *s = &b->storage;
    if (inl) {
        s->data = (char *)b + CTI_BLOCK_DATA_OFFSET;
    } else {
        s->data = allocators[device.type]->alloc(nbytes, device.index);
        if (!s->data) {
            free(b);
            char d[32];
            return cti_error_null(CT_ERR_OOM, "%s: out of memory allocating %zu bytes for %s %s on %s",
                                  op, nbytes, cti_shape_s(ndim, shape), ct_dtype_name(dtype),
                                  ct_device_str(device, d, sizeof d));
        }
    }
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->device = device;
    s->nbytes = nbytes;
    s->inline_data = inl;
    s->release = NULL;
    s->release_ctx = NULL;
    ct_tensor *t = &b->handle;
    init_geometry(t, ndim, shape, dtype);
    t->storage = s;
    stats_block *st = stats();
    bump(&st->storages, 1);
    bump(&st->tensors, 1);
    if (device.type == CT_DEVICE_CPU) bump(&st->bytes, (long long)nbytes);
    cti_scope_adopt(t);
    return t;
}

ct_tensor *cti_tensor_from_external(const char *op, void *data, size_t nbytes, ct_device device,
                                    void (*release)(void *ctx), void *ctx, int ndim,
                                    const int64_t *shape, const int64_t *stride, ct_dtype dtype) {
    if ((unsigned)device.type >= CT_NUM_DEVICE_TYPES) {
        char d[32];
        return cti_error_null(CT_ERR_DEVICE, "%s: device %s is not available", op,
                              ct_device_str(device, d, sizeof d));
    }
    /* The storage and its first handle in one block, as cti_tensor_new
     * makes them, without inline data. */
    block *b = malloc(sizeof *b);
    if (!b) return cti_error_null(CT_ERR_OOM, "%s: out of memory allocating a tensor", op);
    cti_storage *s = &b->storage;
    atomic_init(&s->refcount, 1);
    atomic_init(&s->version, 0);
    s->device = device;
    s->data = data;
    s->nbytes = nbytes;
    s->inline_data = false;
    s->release = release;
    s->release_ctx = ctx;
    ct_tensor *t = &b->handle;
    init_geometry(t, ndim, shape, dtype);
    if (ndim > 0) memcpy(t->stride, stride, (size_t)ndim * sizeof(int64_t));
    t->storage = s;
    stats_block *st = stats();
    bump(&st->storages, 1);
    bump(&st->tensors, 1);
    if (device.type == CT_DEVICE_CPU) bump(&st->bytes, (long long)nbytes);
    cti_scope_adopt(t);
    return t;
}

static bool is_embedded(const ct_tensor *t) {
    return (const char *)t == (const char *)t->storage + offsetof(block, handle);
}

ct_tensor *cti_tensor_view(const ct_tensor *base, int ndim, const int64_t *shape,
                           const int64_t *stride, int64_t offset) {
    ct_tensor *t = malloc(sizeof *t);
    if (!t) return cti_error_null(CT_ERR_OOM, "out of memory allocating a tensor view");
    atomic_init(&t->refcount, 1);
    t->ndim = ndim;
    t->dtype = base->dtype;
    t->wrapped_number = false;
    t->nograd_view = false;
    t->offset = offset;
    if (ndim > 0) {
        memcpy(t->shape, shape, (size_t)ndim * sizeof(int64_t));
        memcpy(t->stride, stride, (size_t)ndim * sizeof(int64_t));
    }
    atomic_init(&t->scope, NULL);
    t->scope_slot = -1;
    t->autograd = NULL;
    t->storage = base->storage;
    atomic_fetch_add_explicit(&t->storage->refcount, 1, memory_order_relaxed);
    bump(&stats()->tensors, 1);
    cti_scope_adopt(t);
    return t;
}

ct_tensor *ct_tensor_retain(ct_tensor *t) { return cti_ref(t); }

/* Atomic because threads attach their first autograd records concurrently;
 * a release that sees a record reads the hook with acquire, pairing with the
 * release store that came before the record was attached. */
static _Atomic(cti_autograd_free_fn) autograd_free_hook;

void cti_set_autograd_free_hook(cti_autograd_free_fn fn) {
    atomic_store_explicit(&autograd_free_hook, fn, memory_order_release);
}

void cti_unref(ct_tensor *t) {
    if (!t) return;
    if (atomic_fetch_sub_explicit(&t->refcount, 1, memory_order_acq_rel) != 1) return;
    if (atomic_load_explicit(&t->scope, memory_order_relaxed)) cti_scope_forget(t);
    if (t->autograd) {
        cti_autograd_free_fn hook = atomic_load_explicit(&autograd_free_hook, memory_order_acquire);
        if (hook) hook(t);
    }
    bump(&stats()->tensors, -1);
    cti_storage *s = t->storage;
    if (!is_embedded(t)) free(t);
    storage_release(s);
}

/* The scope's reference and the creator's are one: whichever is released
 * first releases it, so a release inside the scope leaves the scope nothing
 * to release, however many other references (graph edges, parameter lists,
 * retains) keep the tensor alive. Another thread's release is never the
 * owner's, and drops only a reference of its own. */
void ct_tensor_release(ct_tensor *t) {
    if (!t) return;
    if (cti_scope_owned_here(t)) cti_scope_forget(t);
    cti_unref(t);
}

/* ---- properties ---------------------------------------------------------------- */
int ct_tensor_ndim(const ct_tensor *t) { return t ? t->ndim : -1; }
const int64_t *ct_tensor_shape(const ct_tensor *t) { return t ? t->shape : NULL; }
const int64_t *ct_tensor_strides(const ct_tensor *t) { return t ? t->stride : NULL; }
int64_t ct_tensor_numel(const ct_tensor *t) { return t ? cti_numel(t->ndim, t->shape) : 0; }
int64_t ct_tensor_offset(const ct_tensor *t) { return t ? t->offset : 0; }
ct_dtype ct_tensor_dtype(const ct_tensor *t) { return t ? t->dtype : CT_NUM_DTYPES; }
ct_device ct_tensor_device(const ct_tensor *t) {
    return t ? t->storage->device : (ct_device){CT_DEVICE_CPU, -1};
}
bool ct_tensor_is_contiguous(const ct_tensor *t) { return t && cti_is_contiguous(t); }
bool ct_tensor_shares_storage(const ct_tensor *a, const ct_tensor *b) {
    return a && b && a->storage == b->storage;
}
void *ct_tensor_data_ptr(const ct_tensor *t) { return t ? cti_data(t) : NULL; }

int64_t ct_tensor_size(const ct_tensor *t, int dim) {
    if (!t) {
        cti_error(CT_ERR_INVALID_ARG, "ct_tensor_size: tensor is NULL");
        return -1;
    }
    int d = cti_wrap_dim("ct_tensor_size", dim, t->ndim);
    if (d < 0) return -1;
    return t->ndim == 0 ? 1 : t->shape[d];
}
