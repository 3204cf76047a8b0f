/* cten: the tensor object, creation, views, copies, scopes and generators.
 *
 * Ownership: every function returning ct_tensor * returns a new handle the
 * caller owns (release it with ct_tensor_release, or let the innermost open
 * scope release it), or NULL on error with the message in ct_last_error().
 * Arguments are borrowed, never consumed, and left unchanged on failure. */
#ifndef CTEN_CORE_H
#define CTEN_CORE_H

#include "types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct ct_tensor ct_tensor;
typedef struct ct_generator ct_generator;
typedef struct ct_scope ct_scope;

/* CT_LIST(2, 3, 4) expands to "3, (const int64_t[]){2, 3, 4}": a count and
 * an array, the form every shape/dims argument takes. */
#define CT_LIST(...)                                                        \
    (int)(sizeof((const int64_t[]){__VA_ARGS__}) / sizeof(int64_t)),       \
        ((const int64_t[]){__VA_ARGS__})
#define CT_SHAPE(...) CT_LIST(__VA_ARGS__)
#define CT_DIMS(...) CT_LIST(__VA_ARGS__)
/* The empty list: a 0-d shape, or "all dims" for reductions. */
#define CT_NONE 0, NULL

/* ---- text ----------------------------------------------------------------
 * A tensor as PyTorch's repr writes it, e.g.
 *   tensor([[ 0.1000, -2.0000],
 *           [ 3.5000,  4.0000]], shape=[2, 2], dtype=float32, device=cpu)
 * every element in one format (4 decimals; "3." when all are integers;
 * scientific when magnitudes span more than 1000 or leave [1e-4, 1e8)), the
 * middle of each dim longer than 6 elided with "..." when the tensor has more
 * than 1000 elements, and requires_grad or grad_fn last. A GPU tensor is
 * copied to the host first (a wait for the device). */
/* Writes the text into buf (at most n bytes, always NUL-terminated when n > 0;
 * buf may be NULL with n 0) and returns its full length, as snprintf does, or
 * -1 on error. */
int64_t ct_tensor_str(const ct_tensor *t, char *buf, size_t n);
/* Writes the text and a newline to stdout. */
ct_status ct_print(const ct_tensor *t);
/* The same to file (a FILE *; NULL means stdout). */
ct_status ct_fprint(const ct_tensor *t, void *file);

/* ---- reference counting ------------------------------------------------ */
/* Adds a reference of the caller's, to be released by the caller; returns t.
 * Inside a scope too: the scope releases only the reference it was given. */
ct_tensor *ct_tensor_retain(ct_tensor *t);
/* Drops a reference (NULL is a no-op). On a handle that a scope open on this
 * thread owns, it is the scope's reference that goes: the scope forgets the
 * handle, whatever else still holds it (a graph, a parameter list, an
 * optimizer, a retain). So a scoped handle takes as many releases as it has
 * references, never more: one for the scope's, whether the scope or the
 * caller gives it, and one per retain. References the library takes (graph
 * edges, ct_params_add, optimizers, data loaders) are its own and never
 * count against the caller's. A release on another thread drops one of that
 * thread's references: hand a scoped handle to another thread with a retain
 * or with ct_keep out of every scope. */
void ct_tensor_release(ct_tensor *t);

/* ---- properties ----------------------------------------------------------- */
int ct_tensor_ndim(const ct_tensor *t);
/* Borrowed pointer to ndim sizes, valid while t lives. */
const int64_t *ct_tensor_shape(const ct_tensor *t);
/* Borrowed pointer to ndim strides, in elements. */
const int64_t *ct_tensor_strides(const ct_tensor *t);
/* Size of dim (negative counts from the end); -1 with an error if out of range. */
int64_t ct_tensor_size(const ct_tensor *t, int dim);
int64_t ct_tensor_numel(const ct_tensor *t);
int64_t ct_tensor_offset(const ct_tensor *t); /* storage offset, elements */
ct_dtype ct_tensor_dtype(const ct_tensor *t);
ct_device ct_tensor_device(const ct_tensor *t);
bool ct_tensor_is_contiguous(const ct_tensor *t);
/* True when a and b view the same storage. */
bool ct_tensor_shares_storage(const ct_tensor *a, const ct_tensor *b);
/* Address of element [0,...,0] (storage data + offset). Borrowed; for
 * device tensors a device address. */
void *ct_tensor_data_ptr(const ct_tensor *t);
/* "[2, 3]" into buf; returns buf. */
char *ct_shape_str(int ndim, const int64_t *shape, char *buf, size_t n);

/* ---- creation --------------------------------------------------------------- */
/* Copies numel(shape) elements of dtype from host memory into a new CPU tensor. */
ct_tensor *ct_tensor_from_data(const void *data, ct_dtype dtype, int ndim,
                               const int64_t *shape);
/* Copies data into a new tensor on device. */
ct_tensor *ct_tensor_from_data_on(const void *data, ct_dtype dtype, int ndim,
                                  const int64_t *shape, ct_device device);
ct_tensor *ct_tensor_empty(int ndim, const int64_t *shape, ct_dtype dtype, ct_device device);
ct_tensor *ct_tensor_zeros(int ndim, const int64_t *shape, ct_dtype dtype, ct_device device);
ct_tensor *ct_tensor_ones(int ndim, const int64_t *shape, ct_dtype dtype, ct_device device);
ct_tensor *ct_tensor_full(int ndim, const int64_t *shape, double value, ct_dtype dtype,
                          ct_device device);
/* A 0-d tensor holding value. */
ct_tensor *ct_tensor_scalar(double value, ct_dtype dtype, ct_device device);
/* Same shape/dtype/device as t. */
ct_tensor *ct_tensor_empty_like(const ct_tensor *t);
ct_tensor *ct_tensor_zeros_like(const ct_tensor *t);
ct_tensor *ct_tensor_ones_like(const ct_tensor *t);
ct_tensor *ct_tensor_full_like(const ct_tensor *t, double value);
/* [start, end) by step, as torch.arange: ceil((end-start)/step) elements. */
ct_tensor *ct_tensor_arange(double start, double end, double step, ct_dtype dtype,
                            ct_device device);
/* steps values from start to end inclusive, as torch.linspace. */
ct_tensor *ct_tensor_linspace(double start, double end, int64_t steps, ct_dtype dtype,
                              ct_device device);
/* n x m identity (m < 0 means m = n). */
ct_tensor *ct_tensor_eye(int64_t n, int64_t m, ct_dtype dtype, ct_device device);

/* ---- random numbers -----------------------------------------------------------
 * Generators are Philox-4x32-10 counter-based streams (Salmon et al., SC'11):
 * the key is the 64-bit seed, the counter advances by one per 4 draws of 32
 * bits. Uniform f32/f16/bf16 values take the top 24 bits of one draw, f64
 * values 53 bits of two; normals use Box-Muller on two uniforms. Same seed, same sequence, on every
 * run and machine. gen == NULL uses the process-wide default generator
 * (seeded 0 until ct_manual_seed). */
ct_generator *ct_generator_new(uint64_t seed);
void ct_generator_free(ct_generator *g);
void ct_generator_set_seed(ct_generator *g, uint64_t seed);
uint64_t ct_generator_seed(const ct_generator *g);
/* The state is (seed, offset): offset counts 32-bit draws taken so far. */
uint64_t ct_generator_offset(const ct_generator *g);
void ct_generator_set_offset(ct_generator *g, uint64_t offset);
ct_generator *ct_generator_default(void);
void ct_manual_seed(uint64_t seed);
/* Reserves n consecutive 32-bit draws and returns the offset of the first:
 * kernels compute draw k as ct_philox(seed, first + k). */
uint64_t ct_generator_reserve(ct_generator *g, uint64_t n);
/* Draw number index of the stream with key seed. */
uint32_t ct_philox(uint64_t seed, uint64_t index);

/* U[0,1). */
ct_tensor *ct_tensor_rand(ct_generator *gen, int ndim, const int64_t *shape, ct_dtype dtype,
                          ct_device device);
/* N(0,1). */
ct_tensor *ct_tensor_randn(ct_generator *gen, int ndim, const int64_t *shape, ct_dtype dtype,
                           ct_device device);
/* Integers uniform in [low, high). */
ct_tensor *ct_tensor_randint(ct_generator *gen, int64_t low, int64_t high, int ndim,
                             const int64_t *shape, ct_dtype dtype, ct_device device);
/* Fills t in place with U[low, high) / N(mean, std). */
ct_status ct_uniform_(ct_tensor *t, double low, double high, ct_generator *gen);
ct_status ct_normal_(ct_tensor *t, double mean, double std, ct_generator *gen);

/* ---- copies and conversion ---------------------------------------------------- */
/* Copies t's elements, in row-major order, into host buffer buf of nbytes
 * (must be at least numel * dtype size). Synchronizes with device work. */
ct_status ct_tensor_copy_to_host(const ct_tensor *t, void *buf, size_t nbytes);
/* Element [0...] of a one-element tensor, as a double. */
ct_status ct_tensor_item(const ct_tensor *t, double *out);
/* Copies src into dst (src broadcast to dst's shape, converted to dst's dtype).
 * In grad mode, when dst (or the base it views) has history or src requires
 * grad, the copy is recorded as PyTorch's copy_: src gets dst's gradient
 * (summed over the broadcast dims, in src's dtype and on its device), dst's
 * old values get zero; into a view, through its base (CopySlices; see the
 * in-place ops in ops.h), so rows of a plain buffer filled with ct_copy_
 * from tensors with history pass the buffer's gradient back to them.
 * Refused (CT_ERR_AUTOGRAD) on a leaf that requires grad, a view of one,
 * a view made in no-grad mode and a piece of ct_split/ct_chunk/ct_unbind
 * when recorded; a destination with elements sharing memory (an expanded
 * view) always. */
ct_status ct_copy_(ct_tensor *dst, const ct_tensor *src);
/* Fills dst with value; ct_zero_ with 0. Recorded like ct_copy_ when dst (or
 * its base) has history: the overwritten values get a zero gradient (the
 * view's region only, for a view). Refused as ct_copy_ is. */
ct_status ct_fill_(ct_tensor *dst, double value);
ct_status ct_zero_(ct_tensor *dst);
/* A new tensor of dtype (a new reference to t when t already has it). */
ct_tensor *ct_to_dtype(ct_tensor *t, ct_dtype dtype);
/* A new tensor on device (a new reference to t when already there). */
ct_tensor *ct_to_device(ct_tensor *t, ct_device device);
/* A contiguous copy that owns fresh storage. */
ct_tensor *ct_clone(ct_tensor *t);
/* t itself (new reference) when contiguous, else a contiguous copy. */
ct_tensor *ct_contiguous(ct_tensor *t);

/* ---- views (share storage with t; write through them reaches t) ----------------
 * A view made in grad mode knows the tensor it views (its base): an in-place
 * write through it, recorded, rewrites the base's history (see the in-place
 * ops in ops.h). So do the results of ct_reshape, ct_flatten, ct_contiguous,
 * ct_to_dtype and ct_to_device that share t's storage. */
/* shape may hold one -1, inferred. Fails when t's strides cannot express it. */
ct_tensor *ct_view(ct_tensor *t, int ndim, const int64_t *shape);
/* A view when possible, else a copy (as torch.reshape). */
ct_tensor *ct_reshape(ct_tensor *t, int ndim, const int64_t *shape);
ct_tensor *ct_transpose(ct_tensor *t, int dim0, int dim1);
/* t.T for <= 2-d tensors. */
ct_tensor *ct_t(ct_tensor *t);
ct_tensor *ct_permute(ct_tensor *t, int ndim, const int64_t *dims);
/* Drops all size-1 dims. */
ct_tensor *ct_squeeze(ct_tensor *t);
/* Drops dim if its size is 1, else returns a view equal to t. */
ct_tensor *ct_squeeze_dim(ct_tensor *t, int dim);
ct_tensor *ct_unsqueeze(ct_tensor *t, int dim);
/* length elements of dim from start. */
ct_tensor *ct_narrow(ct_tensor *t, int dim, int64_t start, int64_t length);
/* t[..., start:end:step, ...] on dim with Python's clamping of start/end
 * (negative counts from the end); step >= 1. */
ct_tensor *ct_slice(ct_tensor *t, int dim, int64_t start, int64_t end, int64_t step);
/* Removes dim, taking index (negative counts from the end). */
ct_tensor *ct_select(ct_tensor *t, int dim, int64_t index);
/* Broadcasts size-1 dims (stride 0); -1 keeps a size; new leading dims allowed. */
ct_tensor *ct_expand(ct_tensor *t, int ndim, const int64_t *shape);
ct_tensor *ct_expand_as(ct_tensor *t, const ct_tensor *other);
/* Merges dims start..end (inclusive, negatives allowed); a view when possible. */
ct_tensor *ct_flatten(ct_tensor *t, int start_dim, int end_dim);
/* Copies: joins tensors along dim (same shape elsewhere; dtypes promoted). */
ct_tensor *ct_cat(int n, ct_tensor *const *tensors, int dim);
/* Copies: stacks same-shaped tensors along a new dim. */
ct_tensor *ct_stack(int n, ct_tensor *const *tensors, int dim);

/* ---- CPU memory ---------------------------------------------------------------------
 * Freed CPU blocks of 64 KiB and more are kept (up to CT_CPU_CACHE_MB
 * megabytes, default 512; when full, the least recently cached blocks go
 * first) and reused for the next tensor of the same rounded size, sparing
 * the page faults of fresh memory. */
/* Returns every cached block to the system. */
void ct_cpu_empty_cache(void);
/* Bytes held in the cache now. */
size_t ct_cpu_cached_bytes(void);

/* ---- scopes ---------------------------------------------------------------------
 * Between ct_scope_begin and ct_scope_end, every tensor handle that the
 * library returns on this thread is owned by the innermost open scope;
 * ct_scope_end releases all of them except those passed to ct_keep, so a
 * loop body needs no release calls. Scopes nest; each thread has its own. */
ct_scope *ct_scope_begin(void);
/* Releases the scope's tensors. Scopes must end in reverse order of their
 * beginning; ending an outer scope ends the inner ones too. */
void ct_scope_end(ct_scope *s);
/* Takes t out of its scope: the enclosing scope owns it then, or the caller
 * when there is none. Returns t. A no-op for a handle no scope of this thread
 * owns (already kept out, released early, or another thread's). */
ct_tensor *ct_keep(ct_tensor *t);

#ifdef __cplusplus
}
#endif
#endif
