/* Private: the tensor and storage objects and the helpers every layer uses.
 * Internal functions carry the cti_ prefix. The shared library exports them
 * in a private version node (src/cten.map) for its backend modules and the
 * tests only: they are not API and change without notice. */
#ifndef CTEN_TENSOR_IMPL_H
#define CTEN_TENSOR_IMPL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>

#include "tensor/core.h"
#include "tensor/types.h"

/* How a device type allocates and frees storage bytes. The CPU's lives in
 * core; other backends register theirs at init. */
typedef struct cti_allocator {
    /* Returns NULL on failure, setting no error (the caller does). */
    void *(*alloc)(size_t nbytes, int device_index);
    void (*free)(void *ptr, size_t nbytes, int device_index);
} cti_allocator;

void cti_register_allocator(ct_device_type type, const cti_allocator *a);

typedef struct cti_storage {
    atomic_int refcount;
    ct_device device;
    void *data;
    size_t nbytes;
    /* Bumped by every in-place write; autograd compares it with the value it
     * saved to catch tensors modified before backward. */
    atomic_uint version;
    /* data lives in the same block as this struct (small CPU tensors). */
    bool inline_data;
    /* Memory cten did not allocate (a DLPack producer's): when the last
     * reference goes, release(release_ctx) is called instead of the device
     * allocator's free. NULL for cten's own storage. */
    void (*release)(void *ctx);
    void *release_ctx;
} cti_storage;

struct ct_autograd_meta; /* defined by the autograd layer */

struct ct_tensor {
    atomic_int refcount;
    int ndim;
    ct_dtype dtype;
    /* A scalar operand promoted like a Python number (tensor-scalar ops). */
    bool wrapped_number;
    /* Made by a view op in no-grad mode (or a view of such a view): autograd
     * does not know its base, so it refuses to record an in-place update of
     * it (as PyTorch refuses one on a view created in no_grad mode). */
    bool nograd_view;
    cti_storage *storage;
    int64_t offset; /* elements */
    int64_t shape[CT_MAX_DIMS];
    int64_t stride[CT_MAX_DIMS]; /* elements */
    /* The scope owning this handle's creation reference, and its slot there.
     * Written only by the thread whose scope it is; atomic because another
     * thread's ct_tensor_release reads it to learn that it is not the owner. */
    _Atomic(struct ct_scope *) scope;
    int64_t scope_slot;
    struct ct_autograd_meta *autograd;
};

/* ---- errors: set the thread's last error, return the status (or NULL) ---- */
ct_status cti_error(ct_status s, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void *cti_error_null(ct_status s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Re-reports the last error (an inner call's) as "prefix: message", with
 * its status, or fallback when none is set; returns the status. */
ct_status cti_error_wrap(ct_status fallback, const char *prefix);
/* Called with every error set on any thread (the trace uses it to show
 * argument-check failures); NULL for none. Set by the dispatcher at init. */
typedef void (*cti_error_hook_fn)(ct_status s, const char *msg);
void cti_set_error_hook(cti_error_hook_fn fn);
/* Formats t for messages: "[2, 3] float32 cpu" ("NULL" for NULL). Returns a
 * pointer into a small thread-local ring of buffers (8 live at a time). */
const char *cti_desc(const ct_tensor *t);
/* Shape only: "[2, 3]", same ring. */
const char *cti_shape_s(int ndim, const int64_t *shape);

/* ---- bfloat16 in loops ----------------------------------------------------------
 * ct_bf16_to_f32 / ct_f32_to_bf16 themselves (round to nearest
 * even, NaN kept quiet), inline and branch-free so that conversion loops
 * vectorize instead of calling into the library per element. Every CPU
 * kernel's bf16 loop uses these. */
static inline float cti_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline uint16_t cti_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    uint32_t quiet = (x >> 16) | 0x0040u;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

/* ---- float16 in loops ------------------------------------------------------------
 * ct_f32_to_f16 / ct_f16_to_f32 themselves (round to nearest even, NaN made
 * quiet with its sign kept), inline so that conversion loops vectorize. They
 * follow the branch-light scheme of Maratyszcza's FP16 library: the float
 * addition does the rounding, so they assume the default floating-point
 * environment (no flush-to-zero), as the library's other kernels do. */
static inline float cti_f16_to_f32(uint16_t h) {
    const uint32_t w = (uint32_t)h << 16;
    const uint32_t sign = w & 0x80000000u;
    const uint32_t two_w = w + w;
    const uint32_t exp_offset = 0xE0u << 23;
    const float exp_scale = 0x1.0p-112f;
    uint32_t u = (two_w >> 4) + exp_offset;
    float normalized, denormalized;
    memcpy(&normalized, &u, sizeof u);
    normalized *= exp_scale;
    u = (two_w >> 17) | (126u << 23);
    memcpy(&denormalized, &u, sizeof u);
    denormalized -= 0.5f;
    uint32_t nb, db;
    memcpy(&nb, &normalized, sizeof nb);
    memcpy(&db, &denormalized, sizeof db);
    const uint32_t r = sign | (two_w < (1u << 27) ? db : nb);
    float f;
    memcpy(&f, &r, sizeof f);
    return f;
}

static inline uint16_t cti_f32_to_f16(float f) {
    const float scale_to_inf = 0x1.0p+112f;
    const float scale_to_zero = 0x1.0p-110f;
    float base = (__builtin_fabsf(f) * scale_to_inf) * scale_to_zero;
    uint32_t w;
    memcpy(&w, &f, sizeof w);
    const uint32_t shl1_w = w + w;
    const uint32_t sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xFF000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    const uint32_t bias_bits = (bias >> 1) + 0x07800000u;
    float bias_f;
    memcpy(&bias_f, &bias_bits, sizeof bias_f);
    base = bias_f + base;
    uint32_t bits;
    memcpy(&bits, &base, sizeof bits);
    const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
    const uint32_t mantissa_bits = bits & 0x00000FFFu;
    const uint32_t nonsign = exp_bits + mantissa_bits;
    return (uint16_t)((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

/* ---- element access --------------------------------------------------------- */
static inline char *cti_data(const ct_tensor *t) {
    return (char *)t->storage->data + t->offset * (int64_t)ct_dtype_size(t->dtype);
}
int64_t cti_numel(int ndim, const int64_t *shape);
bool cti_is_contiguous(const ct_tensor *t);
/* Wraps a dim into [0, ndim); sets an error naming op and returns -1 if out of range. */
int cti_wrap_dim(const char *op, int dim, int ndim);
/* numel * elsize with overflow check; false (error set, naming op) on overflow
 * or a negative size. */
bool cti_checked_nbytes(const char *op, int ndim, const int64_t *shape, ct_dtype dt,
                        size_t *nbytes);
void cti_contiguous_strides(int ndim, const int64_t *shape, int64_t *stride);

/* ---- tensors ------------------------------------------------------------------- */
/* A new contiguous tensor with uninitialized data, registered in the current
 * scope. Errors (bad shape, overflow, OOM) name op. */
ct_tensor *cti_tensor_new(const char *op, int ndim, const int64_t *shape, ct_dtype dtype,
                          ct_device device);
/* A new handle on base's storage with the given geometry (no checks),
 * registered in the current scope. */
ct_tensor *cti_tensor_view(const ct_tensor *base, int ndim, const int64_t *shape,
                           const int64_t *stride, int64_t offset);
/* A new handle with the given geometry (no checks) on a new storage over
 * nbytes of external memory at data on device, registered in the current
 * scope. The storage calls release(ctx) exactly once, instead of freeing
 * data, when its last reference goes; on failure (NULL, error naming op)
 * release is not called and data stays the caller's. Core never reaches
 * a backend here: what release does on a device (wait for its streams, hand
 * the memory back to its producer) is the caller's. */
ct_tensor *cti_tensor_from_external(const char *op, void *data, size_t nbytes, ct_device device,
                                    void (*release)(void *ctx), void *ctx, int ndim,
                                    const int64_t *shape, const int64_t *stride, ct_dtype dtype);
/* References on a storage itself, for holders that are not tensor handles
 * (a DLPack export keeps its storage alive this way). */
void cti_storage_retain(cti_storage *s);
void cti_storage_release(cti_storage *s);
/* Marks t's storage as written in place. */
static inline void cti_bump_version(ct_tensor *t) {
    atomic_fetch_add_explicit(&t->storage->version, 1, memory_order_relaxed);
}

/* Resolves one -1 in shape and returns a view of t with it, or NULL. When
 * t's strides cannot express the shape, *viewable is false and no error is
 * set (ct_reshape copies then); other failures set an error naming op. */
ct_tensor *cti_try_view(const char *op, ct_tensor *t, int ndim, const int64_t *shape,
                        bool *viewable);

/* ---- views without autograd (the public ct_ versions in src/ops/views.c
 * record history on top of these) ---------------------------------------------- */
ct_tensor *cti_view(ct_tensor *t, int ndim, const int64_t *shape);
ct_tensor *cti_transpose(ct_tensor *t, int dim0, int dim1);
ct_tensor *cti_t(ct_tensor *t);
ct_tensor *cti_permute(ct_tensor *t, int ndim, const int64_t *dims);
ct_tensor *cti_squeeze(ct_tensor *t);
ct_tensor *cti_squeeze_dim(ct_tensor *t, int dim);
ct_tensor *cti_unsqueeze(ct_tensor *t, int dim);
ct_tensor *cti_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
ct_tensor *cti_narrow(ct_tensor *t, int dim, int64_t start, int64_t length);
ct_tensor *cti_diagonal(ct_tensor *t, int64_t offset, int dim1, int dim2);
ct_tensor *cti_select(ct_tensor *t, int dim, int64_t index);
ct_tensor *cti_expand(ct_tensor *t, int ndim, const int64_t *shape);
ct_tensor *cti_expand_as(ct_tensor *t, const ct_tensor *other);

/* ---- shapes and types ---------------------------------------------------------- */
/* Broadcasts two shapes (NumPy rules). Error naming op on mismatch. */
ct_status cti_broadcast_shapes(const char *op, int na, const int64_t *sa, int nb,
                               const int64_t *sb, int *nout, int64_t *out);
/* PyTorch's result_type over n operands (wrapped_number and 0-d rules). */
ct_dtype cti_result_type(int n, ct_tensor *const *ts);
/* Whether a value of dtype from may be written into dtype to by an in-place op
 * (PyTorch's canCast: no float into integer, no integer into bool). */
bool cti_can_cast(ct_dtype from, ct_dtype to);
/* Computes strides for viewing t as shape without a copy (torch's
 * computeStride); false when impossible. */
bool cti_view_strides(const ct_tensor *t, int ndim, const int64_t *shape, int64_t *stride);

/* ---- scopes ---------------------------------------------------------------------- */
/* Registers a freshly created handle with the thread's innermost scope. */
void cti_scope_adopt(ct_tensor *t);
/* Removes t from its scope without releasing it. */
void cti_scope_forget(ct_tensor *t);
/* Whether t's creation reference belongs to a scope open on this thread. */
bool cti_scope_owned_here(const ct_tensor *t);

/* References the library holds on a caller's handle (graph edges, parameter
 * lists, optimizers, data loaders) are taken and dropped with these, never
 * with ct_tensor_retain/ct_tensor_release: a public release of a scope-owned
 * handle stands for the release of the scope's reference, which the library's
 * own references must not consume. */
static inline ct_tensor *cti_ref(ct_tensor *t) {
    if (t) atomic_fetch_add_explicit(&t->refcount, 1, memory_order_relaxed);
    return t;
}
void cti_unref(ct_tensor *t);
/* Installed by the autograd layer (core may not call it directly) before it
 * attaches its first record to a handle: frees that record on release.
 * Setting it again with the same function is harmless; any thread may. */
typedef void (*cti_autograd_free_fn)(ct_tensor *t);
void cti_set_autograd_free_hook(cti_autograd_free_fn fn);

/* ---- random numbers ------------------------------------------------------------- */
struct ct_generator {
    uint64_t seed;
    uint64_t offset;
};
/* Fills out[0..3] with the Philox-4x32-10 block for counter block_index. */
void cti_philox_block(uint64_t seed, uint64_t block_index, uint32_t out[4]);
/* Called by ct_generator_reserve, on the thread that reserves, with the
 * generator (never NULL: the default one resolved), its seed and the
 * reserved range [first, first + n) (n rounded as the reservation was).
 * The CUDA graph capture listens on its thread to find, for each random
 * kernel it records, the generator whose draws a replay must renew. */
typedef void (*cti_rng_observer)(void *ctx, ct_generator *g, uint64_t seed, uint64_t first,
                                 uint64_t n);
/* Sets this thread's observer (fn NULL removes it); one per thread. */
void cti_rng_observe(cti_rng_observer fn, void *ctx);

/* ---- allocation statistics (CPU storage), read by tests ---------------------------- */
typedef struct cti_alloc_stats {
    int64_t live_tensors;  /* handles alive */
    int64_t live_storages; /* storages alive */
    int64_t live_bytes;    /* CPU storage bytes alive */
} cti_alloc_stats;
cti_alloc_stats cti_get_alloc_stats(void);

#endif
