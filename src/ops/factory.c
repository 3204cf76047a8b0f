/* Front ends that create tensors, copy and convert them, and join them.
 *
 * Device handling lives here once: new tensors get their storage from the
 * device's allocator (through cti_tensor_new), and every transfer is a COPY
 * dispatched on the device of the non-CPU side, so a backend that registers
 * COPY for its device type (host<->device and device<->device) makes every
 * function below work on it unchanged. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "ops_impl.h"

/* ---- helpers ------------------------------------------------------------------------ */

static const char *dev_s(ct_device d, char *buf, size_t n) { return ct_device_str(d, buf, n); }

/* Fails unless device names a device of a built backend that exists; CPU
 * devices are normalized to index 0. */
static ct_status check_device(const char *op, ct_device *device) {
    char d[32];
    /* A device's allocator is registered at init: a program whose first call
     * puts a tensor on a GPU must find it there. */
    cti_init();
    if ((unsigned)device->type >= CT_NUM_DEVICE_TYPES)
        return cti_error(CT_ERR_DEVICE, "%s: invalid device type %d", op, (int)device->type);
    if (device->type == CT_DEVICE_CPU) {
        *device = CT_CPU;
        return CT_OK;
    }
    if (!ct_backend_available(device->type))
        return cti_error(CT_ERR_DEVICE, "%s: device %s is not available (%s)", op,
                         dev_s(*device, d, sizeof d), cti_backend_missing(device->type));
    int count = ct_device_count(device->type);
    if (device->index < 0 || device->index >= count)
        return cti_error(CT_ERR_DEVICE, "%s: device %s is not available (%d %s present)", op,
                         dev_s(*device, d, sizeof d), count,
                         count == 1 ? "device of its type" : "devices of its type");
    return CT_OK;
}

static ct_device dev_of(const ct_tensor *t) { return t->storage->device; }

static bool is_cpu(const ct_tensor *t) { return t->storage->device.type == CT_DEVICE_CPU; }

/* A new tensor after the device check (shape, dtype, overflow and memory are
 * checked by cti_tensor_new). */
static ct_tensor *new_tensor(const char *op, int ndim, const int64_t *shape, ct_dtype dtype,
                             ct_device device) {
    /* A device's allocator is registered at init; a program may create its
     * first tensor on a GPU before any op has run. */
    cti_init();
    if (check_device(op, &device) != CT_OK) return NULL;
    return cti_tensor_new(op, ndim, shape, dtype, device);
}

/* A second handle on t with the same geometry. Used where PyTorch returns
 * "self": a fresh handle belongs to the caller's scope like any other result,
 * where a bumped reference count on t would outlive the scope. */
static ct_tensor *alias(ct_tensor *t) {
    return cti_tensor_view(t, t->ndim, t->shape, t->stride, t->offset);
}

/* Two elements of t share memory (a stride-0 dim of size > 1): writing into
 * it would race and lose values. */
static bool has_internal_overlap(const ct_tensor *t) {
    for (int i = 0; i < t->ndim; i++)
        if (t->stride[i] == 0 && t->shape[i] > 1) return true;
    return false;
}

static ct_status check_writable(const char *op, const ct_tensor *t) {
    if (has_internal_overlap(t))
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: destination %s (strides %s) has elements sharing one memory "
                         "location (an expanded view); clone it first",
                         op, cti_desc(t), cti_shape_s(t->ndim, t->stride));
    return CT_OK;
}

/* Byte range [lo, hi) t's elements span in its storage; false when empty. */
static bool byte_range(const ct_tensor *t, int64_t *lo, int64_t *hi) {
    /* The zero first: an empty tensor's strides may be saturated, and the
     * spans of the dims before its zero would overflow. */
    if (cti_numel(t->ndim, t->shape) == 0) return false;
    int64_t first = t->offset, last = t->offset;
    for (int i = 0; i < t->ndim; i++) {
        int64_t span = (t->shape[i] - 1) * t->stride[i];
        if (span < 0) first += span;
        else last += span;
    }
    int64_t es = (int64_t)ct_dtype_size(t->dtype);
    *lo = first * es;
    *hi = (last + 1) * es;
    return true;
}

static bool same_geometry(const ct_tensor *a, const ct_tensor *b) {
    if (a->ndim != b->ndim || a->offset != b->offset || a->dtype != b->dtype) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->stride[i] != b->stride[i]))
            return false;
    return true;
}

/* dst <- src (src broadcast to dst, converted to dst's dtype), no checks.
 * Dispatched on the non-CPU side's device so one backend kernel owns each
 * transfer direction. */
static ct_status dispatch_copy(ct_tensor *dst, const ct_tensor *src) {
    ct_call c;
    cti_call_init(&c, CT_OP_COPY);
    c.in[0] = (ct_tensor *)src;
    c.nin = 1;
    c.out[0] = dst;
    c.nout = 1;
    ct_device dev = is_cpu(dst) ? dev_of(src) : dev_of(dst);
    return cti_run(&c, dev, dst->dtype);
}

static ct_status dispatch_fill(ct_tensor *dst, double value) {
    ct_call c;
    cti_call_init(&c, CT_OP_FILL);
    c.out[0] = dst;
    c.nout = 1;
    cti_fill_params p = {.value = value};
    cti_call_params(&c, &p);
    return cti_run(&c, dev_of(dst), dst->dtype);
}

/* A CPU tensor handle over caller memory, living on the stack for the length
 * of one dispatch: lets a kernel read from or write into a user buffer with
 * no staging copy. Never retained, scoped or released. */
typedef struct host_wrap {
    struct ct_tensor t;
    cti_storage s;
} host_wrap;

static ct_tensor *wrap_host(host_wrap *w, void *data, size_t nbytes, ct_dtype dtype, int ndim,
                            const int64_t *shape) {
    memset(w, 0, sizeof *w);
    atomic_init(&w->s.refcount, 1);
    atomic_init(&w->s.version, 0);
    w->s.device = CT_CPU;
    w->s.data = data;
    w->s.nbytes = nbytes;
    atomic_init(&w->t.refcount, 1);
    w->t.ndim = ndim;
    w->t.dtype = dtype;
    w->t.storage = &w->s;
    w->t.offset = 0;
    if (ndim > 0) memcpy(w->t.shape, shape, (size_t)ndim * sizeof(int64_t));
    cti_contiguous_strides(ndim, shape, w->t.stride);
    atomic_init(&w->t.scope, NULL);
    w->t.scope_slot = -1;
    w->t.autograd = NULL;
    return &w->t;
}

/* Whether value converts to dtype without overflow (PyTorch refuses
 * torch.full(..., 1e10, dtype=int32) the same way). Infinities and NaN are
 * fine for floating dtypes; bool takes anything (v != 0). */
static ct_status check_value_fits(const char *op, double v, ct_dtype dt) {
    bool ok = true;
    switch (dt) {
    case CT_I32: ok = v == v && v > -2147483649.0 && v < 2147483648.0; break;
    case CT_I64: ok = v == v && v >= -9223372036854775808.0 && v < 9223372036854775808.0; break;
    case CT_F32: ok = !isfinite(v) || fabs(v) <= FLT_MAX || isfinite((float)v); break;
    case CT_F16: ok = !isfinite(v) || isfinite(ct_f16_to_f32(ct_f32_to_f16((float)v))); break;
    case CT_BF16: ok = !isfinite(v) || isfinite(ct_bf16_to_f32(ct_f32_to_bf16((float)v))); break;
    default: break;
    }
    if (!ok)
        return cti_error(CT_ERR_INVALID_ARG, "%s: value %g cannot be converted to %s without overflow",
                         op, v, ct_dtype_name(dt));
    return CT_OK;
}

static ct_tensor *fail_release(ct_tensor *t) {
    ct_tensor_release(t);
    return NULL;
}

/* Records out = f(t) for autograd when t requires grad, where f keeps the
 * values (reshape, copy, dtype or device change): the backward reshapes the
 * gradient to t's shape and the engine casts it to t's dtype. Integer
 * results carry no gradient. Releases out on failure. */
static ct_tensor *record_same_values(ct_tensor *t, ct_tensor *out, const char *name) {
    if (!out || !ct_dtype_is_floating(out->dtype)) return out;
    if (cti_ag_needed(1, &t)) {
        cti_ag_rec r = {.name = name, .backward = cti_bw_view, .nin = 1, .in = {t}, .nout = 1,
                        .out = {out}};
        if (cti_ag_record(&r) != CT_OK) return fail_release(out);
    }
    /* A result over t's storage (an alias, a reshape that is a view) is a
     * view of t for in-place writes, as PyTorch's is. */
    return out->storage == t->storage ? cti_ag_view_link(t, out) : out;
}

/* ---- creation --------------------------------------------------------------------------- */

ct_tensor *ct_tensor_from_data_on(const void *data, ct_dtype dtype, int ndim,
                                  const int64_t *shape, ct_device device) {
    static const char op[] = "ct_tensor_from_data_on";
    ct_tensor *t = new_tensor(op, ndim, shape, dtype, device);
    if (!t) return NULL;
    size_t nbytes = (size_t)cti_numel(ndim, shape) * ct_dtype_size(dtype);
    if (nbytes == 0) return t;
    if (!data) {
        ct_tensor_release(t);
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: data is NULL for %s %s", op,
                              cti_shape_s(ndim, shape), ct_dtype_name(dtype));
    }
    if (is_cpu(t)) {
        memcpy(cti_data(t), data, nbytes);
        return t;
    }
    host_wrap w;
    ct_tensor *src = wrap_host(&w, (void *)data, nbytes, dtype, ndim, shape);
    if (dispatch_copy(t, src) != CT_OK) return fail_release(t);
    return t;
}

ct_tensor *ct_tensor_from_data(const void *data, ct_dtype dtype, int ndim, const int64_t *shape) {
    static const char op[] = "ct_tensor_from_data";
    ct_tensor *t = cti_tensor_new(op, ndim, shape, dtype, CT_CPU);
    if (!t) return NULL;
    size_t nbytes = (size_t)cti_numel(ndim, shape) * ct_dtype_size(dtype);
    if (nbytes == 0) return t;
    if (!data) {
        ct_tensor_release(t);
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: data is NULL for %s %s", op,
                              cti_shape_s(ndim, shape), ct_dtype_name(dtype));
    }
    memcpy(cti_data(t), data, nbytes);
    return t;
}

ct_tensor *ct_tensor_empty(int ndim, const int64_t *shape, ct_dtype dtype, ct_device device) {
    return new_tensor("ct_tensor_empty", ndim, shape, dtype, device);
}

static ct_tensor *full_impl(const char *op, int ndim, const int64_t *shape, double value,
                            ct_dtype dtype, ct_device device) {
    if ((unsigned)dtype < CT_NUM_DTYPES && check_value_fits(op, value, dtype) != CT_OK)
        return NULL;
    ct_tensor *t = new_tensor(op, ndim, shape, dtype, device);
    if (!t) return NULL;
    if (dispatch_fill(t, value) != CT_OK) return fail_release(t);
    return t;
}

ct_tensor *ct_tensor_zeros(int ndim, const int64_t *shape, ct_dtype dtype, ct_device device) {
    return full_impl("ct_tensor_zeros", ndim, shape, 0.0, dtype, device);
}

ct_tensor *ct_tensor_ones(int ndim, const int64_t *shape, ct_dtype dtype, ct_device device) {
    return full_impl("ct_tensor_ones", ndim, shape, 1.0, dtype, device);
}

ct_tensor *ct_tensor_full(int ndim, const int64_t *shape, double value, ct_dtype dtype,
                          ct_device device) {
    return full_impl("ct_tensor_full", ndim, shape, value, dtype, device);
}

ct_tensor *ct_tensor_scalar(double value, ct_dtype dtype, ct_device device) {
    return full_impl("ct_tensor_scalar", 0, NULL, value, dtype, device);
}

#define LIKE_CHECK(op, t)                                                                  \
    do {                                                                                   \
        if (!(t)) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);    \
    } while (0)

ct_tensor *ct_tensor_empty_like(const ct_tensor *t) {
    LIKE_CHECK("ct_tensor_empty_like", t);
    return new_tensor("ct_tensor_empty_like", t->ndim, t->shape, t->dtype, dev_of(t));
}

ct_tensor *ct_tensor_zeros_like(const ct_tensor *t) {
    LIKE_CHECK("ct_tensor_zeros_like", t);
    return full_impl("ct_tensor_zeros_like", t->ndim, t->shape, 0.0, t->dtype, dev_of(t));
}

ct_tensor *ct_tensor_ones_like(const ct_tensor *t) {
    LIKE_CHECK("ct_tensor_ones_like", t);
    return full_impl("ct_tensor_ones_like", t->ndim, t->shape, 1.0, t->dtype, dev_of(t));
}

ct_tensor *ct_tensor_full_like(const ct_tensor *t, double value) {
    LIKE_CHECK("ct_tensor_full_like", t);
    return full_impl("ct_tensor_full_like", t->ndim, t->shape, value, t->dtype, dev_of(t));
}

/* Integer dtypes take start/end/step truncated, as PyTorch converts the
 * scalars to the dtype before computing values (the length still comes from
 * the values as given). */
static double as_dtype_scalar(double v, ct_dtype dt) {
    return ct_dtype_is_floating(dt) ? v : trunc(v);
}

static ct_status dispatch_range(ct_tensor *t, double start, double step, bool linspace,
                                double end, int64_t steps) {
    ct_call c;
    cti_call_init(&c, CT_OP_ARANGE);
    c.out[0] = t;
    c.nout = 1;
    cti_range_params p = {
        .start = start, .step = step, .end = end, .steps = steps, .linspace = linspace};
    cti_call_params(&c, &p);
    return cti_run(&c, dev_of(t), t->dtype);
}

ct_tensor *ct_tensor_arange(double start, double end, double step, ct_dtype dtype,
                            ct_device device) {
    static const char op[] = "ct_tensor_arange";
    if (!isfinite(start) || !isfinite(end) || !isfinite(step))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: start, end and step must be finite, got %g, %g, %g", op, start,
                              end, step);
    if (step == 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: step must be nonzero", op);
    if ((end > start && step < 0) || (end < start && step > 0))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: upper bound %g and lower bound %g inconsistent with step sign "
                              "(step %g)",
                              op, end, start, step);
    double len = ceil((end - start) / step);
    if (!(len < 9.2e18))
        return cti_error_null(CT_ERR_OVERFLOW, "%s: %g elements from %g to %g by %g overflow", op,
                              len, start, end, step);
    int64_t n = (int64_t)len;
    ct_tensor *t = new_tensor(op, 1, &n, dtype, device);
    if (!t) return NULL;
    if (n > 0 && dispatch_range(t, as_dtype_scalar(start, dtype), as_dtype_scalar(step, dtype),
                                false, 0, 0) != CT_OK)
        return fail_release(t);
    return t;
}

ct_tensor *ct_tensor_linspace(double start, double end, int64_t steps, ct_dtype dtype,
                              ct_device device) {
    static const char op[] = "ct_tensor_linspace";
    if (steps < 0)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: number of steps must be non-negative, got %lld",
                              op, (long long)steps);
    ct_tensor *t = new_tensor(op, 1, &steps, dtype, device);
    if (!t || steps == 0) return t;
    start = as_dtype_scalar(start, dtype);
    end = as_dtype_scalar(end, dtype);
    ct_status s = steps == 1 ? dispatch_fill(t, start)
                             : dispatch_range(t, start, (end - start) / (double)(steps - 1), true,
                                              end, steps);
    if (s != CT_OK) return fail_release(t);
    return t;
}

ct_tensor *ct_tensor_eye(int64_t n, int64_t m, ct_dtype dtype, ct_device device) {
    static const char op[] = "ct_tensor_eye";
    if (n < 0) return cti_error_null(CT_ERR_INVALID_ARG, "%s: n must be >= 0, got %lld", op, (long long)n);
    if (m < 0) m = n;
    int64_t shape[2] = {n, m};
    ct_tensor *t = full_impl(op, 2, shape, 0.0, dtype, device);
    if (!t || n == 0 || m == 0) return t;
    /* The diagonal is a strided view: one step down and one right at once. */
    int64_t len = n < m ? n : m, stride = m + 1;
    ct_tensor *diag = cti_tensor_view(t, 1, &len, &stride, 0);
    if (!diag) return fail_release(t);
    ct_status s = dispatch_fill(diag, 1.0);
    ct_tensor_release(diag);
    if (s != CT_OK) return fail_release(t);
    return t;
}

/* ---- random numbers ------------------------------------------------------------------------
 * The kernels' draw layout (documented in the CPU backend's copy.c) uses D
 * draws per element: 1 for f32/f16/bf16, 2 for f64, 2 for randint; normal
 * takes draws for whole pairs of elements. The front end reserves exactly
 * that many draws so consecutive calls never reuse one. */

static int draws_per_element(ct_op kind, ct_dtype dt) {
    if (kind == CT_OP_RANDINT) return 2;
    return dt == CT_F64 ? 2 : 1;
}

/* Fills the contiguous tensor t. a, b: low/high or mean/std. */
static ct_status dispatch_random(ct_tensor *t, ct_op kind, ct_generator *gen, double a, double b,
                                 int64_t ilow, int64_t ihigh) {
    int64_t n = cti_numel(t->ndim, t->shape);
    if (n == 0) return CT_OK;
    uint64_t elems = kind == CT_OP_RAND_NORMAL ? (uint64_t)(n + 1) / 2 * 2 : (uint64_t)n;
    if (!gen) gen = ct_generator_default();
    ct_call c;
    cti_call_init(&c, kind);
    c.out[0] = t;
    c.nout = 1;
    cti_random_params p = {
        .a = a,
        .b = b,
        .low = ilow,
        .high = ihigh,
        .seed = ct_generator_seed(gen),
        .offset = ct_generator_reserve(gen, elems * (uint64_t)draws_per_element(kind, t->dtype)),
    };
    cti_call_params(&c, &p);
    return cti_run(&c, dev_of(t), t->dtype);
}

/* Fills any tensor t: contiguous ones directly, others through a contiguous
 * temporary, so element k in row-major order gets the same value either way. */
static ct_status random_into(ct_tensor *t, ct_op kind, ct_generator *gen, double a, double b) {
    if (cti_is_contiguous(t)) return dispatch_random(t, kind, gen, a, b, 0, 0);
    ct_tensor *tmp = cti_tensor_new(kind == CT_OP_RAND_NORMAL ? "ct_normal_" : "ct_uniform_",
                                    t->ndim, t->shape, t->dtype, dev_of(t));
    if (!tmp) return ct_last_status();
    ct_status s = dispatch_random(tmp, kind, gen, a, b, 0, 0);
    if (s == CT_OK) s = dispatch_copy(t, tmp);
    ct_tensor_release(tmp);
    return s;
}

static ct_status check_random_floating(const char *op, ct_dtype dtype) {
    if ((unsigned)dtype < CT_NUM_DTYPES && !ct_dtype_is_floating(dtype))
        return cti_error(CT_ERR_DTYPE, "%s: expected a floating dtype, got %s", op,
                         ct_dtype_name(dtype));
    return CT_OK;
}

ct_tensor *ct_tensor_rand(ct_generator *gen, int ndim, const int64_t *shape, ct_dtype dtype,
                          ct_device device) {
    static const char op[] = "ct_tensor_rand";
    if (check_random_floating(op, dtype) != CT_OK) return NULL;
    ct_tensor *t = new_tensor(op, ndim, shape, dtype, device);
    if (!t) return NULL;
    if (dispatch_random(t, CT_OP_RAND_UNIFORM, gen, 0.0, 1.0, 0, 0) != CT_OK) return fail_release(t);
    return t;
}

ct_tensor *ct_tensor_randn(ct_generator *gen, int ndim, const int64_t *shape, ct_dtype dtype,
                           ct_device device) {
    static const char op[] = "ct_tensor_randn";
    if (check_random_floating(op, dtype) != CT_OK) return NULL;
    ct_tensor *t = new_tensor(op, ndim, shape, dtype, device);
    if (!t) return NULL;
    if (dispatch_random(t, CT_OP_RAND_NORMAL, gen, 0.0, 1.0, 0, 0) != CT_OK) return fail_release(t);
    return t;
}

/* The integers every value in [low, high) must be exact in dtype. */
static bool randint_fits(ct_dtype dt, int64_t low, int64_t high) {
    int64_t lo, hi; /* allowed low and high (high exclusive) */
    switch (dt) {
    case CT_BOOL: lo = 0, hi = 2; break;
    case CT_I32: lo = INT32_MIN, hi = (int64_t)INT32_MAX + 1; break;
    case CT_I64: return true;
    case CT_F16: lo = -(1 << 11), hi = 1 << 11; break;
    case CT_BF16: lo = -(1 << 8), hi = 1 << 8; break;
    case CT_F32: lo = -(1 << 24), hi = 1 << 24; break;
    default: lo = -(INT64_C(1) << 53), hi = INT64_C(1) << 53; break;
    }
    return low >= lo && high <= hi;
}

ct_tensor *ct_tensor_randint(ct_generator *gen, int64_t low, int64_t high, int ndim,
                             const int64_t *shape, ct_dtype dtype, ct_device device) {
    static const char op[] = "ct_tensor_randint";
    if (low >= high)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: expected low < high, got low=%lld high=%lld",
                              op, (long long)low, (long long)high);
    if ((unsigned)dtype < CT_NUM_DTYPES && !randint_fits(dtype, low, high))
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: range [%lld, %lld) does not fit in %s (values must be exact)", op,
                              (long long)low, (long long)high, ct_dtype_name(dtype));
    ct_tensor *t = new_tensor(op, ndim, shape, dtype, device);
    if (!t) return NULL;
    if (dispatch_random(t, CT_OP_RANDINT, gen, 0, 0, low, high) != CT_OK) return fail_release(t);
    return t;
}

ct_status ct_uniform_(ct_tensor *t, double low, double high, ct_generator *gen) {
    static const char op[] = "ct_uniform_";
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (check_random_floating(op, t->dtype) != CT_OK || check_writable(op, t) != CT_OK ||
        cti_ag_check_inplace(op, t) != CT_OK)
        return ct_last_status();
    if (!isfinite(low) || !isfinite(high) || !isfinite(high - low))
        return cti_error(CT_ERR_INVALID_ARG, "%s: low %g and high %g must be finite (and so their difference)",
                         op, low, high);
    if (low > high)
        return cti_error(CT_ERR_INVALID_ARG, "%s: expected low <= high, got low=%g > high=%g", op,
                         low, high);
    ct_status s = random_into(t, CT_OP_RAND_UNIFORM, gen, low, high);
    if (s == CT_OK) cti_bump_version(t);
    return s;
}

ct_status ct_normal_(ct_tensor *t, double mean, double std, ct_generator *gen) {
    static const char op[] = "ct_normal_";
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (check_random_floating(op, t->dtype) != CT_OK || check_writable(op, t) != CT_OK ||
        cti_ag_check_inplace(op, t) != CT_OK)
        return ct_last_status();
    if (!(std >= 0) || !isfinite(std) || !isfinite(mean))
        return cti_error(CT_ERR_INVALID_ARG, "%s: expected std >= 0 and finite mean/std, got mean=%g std=%g",
                         op, mean, std);
    ct_status s = random_into(t, CT_OP_RAND_NORMAL, gen, mean, std);
    if (s == CT_OK) cti_bump_version(t);
    return s;
}

/* ---- copies and conversion ----------------------------------------------------------------- */

ct_status ct_tensor_copy_to_host(const ct_tensor *t, void *buf, size_t nbytes) {
    static const char op[] = "ct_tensor_copy_to_host";
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    size_t need = (size_t)cti_numel(t->ndim, t->shape) * ct_dtype_size(t->dtype);
    if (need == 0) return CT_OK;
    if (!buf) return cti_error(CT_ERR_INVALID_ARG, "%s: buffer is NULL for %s", op, cti_desc(t));
    if (nbytes < need)
        return cti_error(CT_ERR_INVALID_ARG,
                         "%s: buffer of %zu bytes is too small for %s (%zu bytes needed)", op,
                         nbytes, cti_desc(t), need);
    if (is_cpu(t) && cti_is_contiguous(t)) {
        memcpy(buf, cti_data(t), need);
        return CT_OK;
    }
    host_wrap w;
    ct_tensor *dst = wrap_host(&w, buf, need, t->dtype, t->ndim, t->shape);
    return dispatch_copy(dst, t);
}

ct_status ct_tensor_item(const ct_tensor *t, double *out) {
    static const char op[] = "ct_tensor_item";
    if (!t) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (!out) return cti_error(CT_ERR_INVALID_ARG, "%s: out is NULL", op);
    int64_t n = cti_numel(t->ndim, t->shape);
    if (n != 1)
        return cti_error(CT_ERR_SHAPE, "%s: expected a tensor with one element, got %s (%lld elements)",
                         op, cti_desc(t), (long long)n);
    union {
        uint8_t b;
        int32_t i32;
        int64_t i64;
        uint16_t h;
        float f;
        double d;
    } v;
    ct_status s = ct_tensor_copy_to_host(t, &v, sizeof v);
    if (s != CT_OK) return s;
    switch (t->dtype) {
    case CT_BOOL: *out = v.b != 0; break;
    case CT_I32: *out = v.i32; break;
    case CT_I64: *out = (double)v.i64; break;
    case CT_F16: *out = ct_f16_to_f32(v.h); break;
    case CT_BF16: *out = ct_bf16_to_f32(v.h); break;
    case CT_F32: *out = v.f; break;
    default: *out = v.d; break;
    }
    return CT_OK;
}

/* Whether src's shape broadcasts to dst's (src may have fewer dims and
 * size-1 dims; dst's shape never changes). */
static ct_status check_broadcast_to(const char *op, const ct_tensor *src, const ct_tensor *dst) {
    bool ok = src->ndim <= dst->ndim;
    int bad = 0;
    for (int i = 1; ok && i <= src->ndim; i++) {
        int64_t s = src->shape[src->ndim - i], d = dst->shape[dst->ndim - i];
        if (s != d && s != 1) {
            ok = false;
            bad = -i;
        }
    }
    if (ok) return CT_OK;
    if (bad)
        return cti_error(CT_ERR_SHAPE,
                         "%s: src %s cannot be broadcast to dst shape %s (dim %d: %lld vs %lld)",
                         op, cti_desc(src), cti_shape_s(dst->ndim, dst->shape), bad,
                         (long long)src->shape[src->ndim + bad],
                         (long long)dst->shape[dst->ndim + bad]);
    return cti_error(CT_ERR_SHAPE, "%s: src %s cannot be broadcast to dst shape %s (more dims)", op,
                     cti_desc(src), cti_shape_s(dst->ndim, dst->shape));
}

/* Whether overwriting dst (from src, NULL for a constant) is recorded in
 * grad mode (cti_ag_inplace_mode): 1 yes, 0 no, -1 refused. */
static int overwrite_mode(const char *op, ct_tensor *dst, const ct_tensor *src) {
    /* Integer sources carry no gradient; a floating one may. */
    ct_tensor *other = src && ct_dtype_is_floating(src->dtype) ? (ct_tensor *)src : NULL;
    return cti_ag_inplace_mode(op, dst, other);
}

ct_status ct_copy_(ct_tensor *dst, const ct_tensor *src) {
    static const char op[] = "ct_copy_";
    ct_tensor *args[2] = {dst, (ct_tensor *)src};
    if (cti_check_not_null(op, 2, args) != CT_OK) return ct_last_status();
    if (check_broadcast_to(op, src, dst) != CT_OK || check_writable(op, dst) != CT_OK)
        return ct_last_status();
    int mode = overwrite_mode(op, dst, src);
    if (mode < 0) return ct_last_status();
    ct_status s = CT_OK;
    int64_t dlo, dhi, slo, shi;
    if (dst->storage == src->storage && byte_range(dst, &dlo, &dhi) &&
        byte_range(src, &slo, &shi) && dlo < shi && slo < dhi) {
        if (!same_geometry(dst, src)) { /* (else copying onto itself: nothing to write) */
            /* Overlapping views: read everything before writing anything. */
            ct_tensor *tmp = cti_tensor_new(op, src->ndim, src->shape, src->dtype, dev_of(src));
            if (!tmp) return ct_last_status();
            s = dispatch_copy(tmp, src);
            if (s == CT_OK) s = dispatch_copy(dst, tmp);
            ct_tensor_release(tmp);
            if (s == CT_OK) cti_bump_version(dst);
        }
    } else {
        s = dispatch_copy(dst, src);
        if (s == CT_OK) cti_bump_version(dst);
    }
    if (s == CT_OK && mode > 0)
        s = cti_ag_record_overwrite("CopyBackwards", dst, (ct_tensor *)src);
    return s;
}

ct_status ct_fill_(ct_tensor *dst, double value) {
    static const char op[] = "ct_fill_";
    if (!dst) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (check_writable(op, dst) != CT_OK || check_value_fits(op, value, dst->dtype) != CT_OK)
        return ct_last_status();
    int mode = overwrite_mode(op, dst, NULL);
    if (mode < 0) return ct_last_status();
    ct_status s = dispatch_fill(dst, value);
    if (s == CT_OK) cti_bump_version(dst);
    if (s == CT_OK && mode > 0) s = cti_ag_record_overwrite("FillBackward", dst, NULL);
    return s;
}

ct_status ct_zero_(ct_tensor *dst) {
    static const char op[] = "ct_zero_";
    if (!dst) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (check_writable(op, dst) != CT_OK) return ct_last_status();
    int mode = overwrite_mode(op, dst, NULL);
    if (mode < 0) return ct_last_status();
    ct_status s = dispatch_fill(dst, 0.0);
    if (s == CT_OK) cti_bump_version(dst);
    if (s == CT_OK && mode > 0) s = cti_ag_record_overwrite("ZeroBackward", dst, NULL);
    return s;
}

/* A new contiguous tensor on device holding t's values as dtype. */
static ct_tensor *converted(const char *op, const ct_tensor *t, ct_dtype dtype, ct_device device) {
    ct_tensor *r = cti_tensor_new(op, t->ndim, t->shape, dtype, device);
    if (!r) return NULL;
    if (dispatch_copy(r, t) != CT_OK) return fail_release(r);
    return r;
}

ct_tensor *ct_to_dtype(ct_tensor *t, ct_dtype dtype) {
    static const char op[] = "ct_to_dtype";
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if ((unsigned)dtype >= CT_NUM_DTYPES)
        return cti_error_null(CT_ERR_DTYPE, "%s: invalid dtype %d", op, (int)dtype);
    ct_tensor *r = dtype == t->dtype ? alias(t) : converted(op, t, dtype, dev_of(t));
    return record_same_values(t, r, dtype == t->dtype ? "AliasBackward" : "ToCopyBackward");
}

ct_tensor *cti_cast_from_copy(ct_tensor *src, const ct_tensor *copy) {
    ct_tensor *r = cti_tensor_view(copy, copy->ndim, copy->shape, copy->stride, copy->offset);
    return record_same_values(src, r, "ToCopyBackward");
}

ct_tensor *ct_to_device(ct_tensor *t, ct_device device) {
    static const char op[] = "ct_to_device";
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (check_device(op, &device) != CT_OK) return NULL;
    bool same = ct_device_eq(device, dev_of(t));
    ct_tensor *r = same ? alias(t) : converted(op, t, t->dtype, device);
    return record_same_values(t, r, same ? "AliasBackward" : "ToCopyBackward");
}

ct_tensor *ct_clone(ct_tensor *t) {
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "ct_clone: tensor is NULL");
    return record_same_values(t, converted("ct_clone", t, t->dtype, dev_of(t)), "CloneBackward");
}

ct_tensor *ct_contiguous(ct_tensor *t) {
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "ct_contiguous: tensor is NULL");
    if (cti_is_contiguous(t)) return record_same_values(t, alias(t), "AliasBackward");
    return record_same_values(t, converted("ct_contiguous", t, t->dtype, dev_of(t)),
                              "CloneBackward");
}

/* ---- reshaping and joining --------------------------------------------------------------- */

ct_tensor *ct_reshape(ct_tensor *t, int ndim, const int64_t *shape) {
    static const char op[] = "ct_reshape";
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    bool viewable;
    ct_tensor *v = cti_try_view(op, t, ndim, shape, &viewable);
    if (!v && viewable) return NULL; /* a shape error, already reported */
    if (!v) {
        ct_tensor *c = converted(op, t, t->dtype, dev_of(t));
        if (!c) return NULL;
        v = cti_try_view(op, c, ndim, shape, &viewable);
        ct_tensor_release(c); /* the view keeps the storage */
    }
    return record_same_values(t, v, "ReshapeBackward");
}

ct_tensor *ct_flatten(ct_tensor *t, int start_dim, int end_dim) {
    static const char op[] = "ct_flatten";
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    int s = cti_wrap_dim(op, start_dim, t->ndim);
    if (s < 0) return NULL;
    int e = cti_wrap_dim(op, end_dim, t->ndim);
    if (e < 0) return NULL;
    if (s > e)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: start_dim %d must not come after end_dim %d (%s)",
                              op, start_dim, end_dim, cti_desc(t));
    if (t->ndim == 0) return ct_reshape(t, 1, (const int64_t[]){1});
    int64_t shape[CT_MAX_DIMS];
    int n = 0;
    for (int i = 0; i < s; i++) shape[n++] = t->shape[i];
    /* The merged size of an empty tensor may not fit int64 (a zero outside
     * the merged dims next to huge sizes inside them). */
    int64_t merged = cti_numel(e - s + 1, t->shape + s);
    if (merged == INT64_MAX) {
        int64_t exact = 1;
        for (int i = s; i <= e; i++)
            if (__builtin_mul_overflow(exact, t->shape[i], &exact))
                return cti_error_null(CT_ERR_OVERFLOW,
                                      "%s: merging dims %d..%d of %s gives more than INT64_MAX "
                                      "elements in one dim",
                                      op, s, e, cti_desc(t));
    }
    shape[n++] = merged;
    for (int i = e + 1; i < t->ndim; i++) shape[n++] = t->shape[i];
    return ct_reshape(t, n, shape);
}

/* Checks the list every joining op takes: non-empty, no NULL, one device. */
static ct_status check_tensor_list(const char *op, int n, ct_tensor *const *ts) {
    if (n <= 0 || !ts)
        return cti_error(CT_ERR_INVALID_ARG, "%s: expected a non-empty list of tensors, got %d", op,
                         ts ? n : 0);
    for (int i = 0; i < n; i++)
        if (!ts[i]) return cti_error(CT_ERR_INVALID_ARG, "%s: tensor %d is NULL", op, i);
    return cti_check_same_device(op, n, ts);
}

static ct_dtype promote_all(int n, ct_tensor *const *ts) {
    ct_dtype dt = ts[0]->dtype;
    for (int i = 1; i < n; i++) dt = ct_promote_types(dt, ts[i]->dtype);
    return dt;
}

/* PyTorch's legacy rule: 1-d tensors of size 0 are left out of cat. */
static bool cat_skipped(const ct_tensor *t) { return t->ndim == 1 && t->shape[0] == 0; }

static ct_tensor *cat_impl(int n, ct_tensor *const *tensors, int dim) {
    static const char op[] = "ct_cat";
    if (check_tensor_list(op, n, tensors) != CT_OK) return NULL;
    int ref = -1;
    for (int i = 0; i < n; i++) {
        if (tensors[i]->ndim == 0)
            return cti_error_null(CT_ERR_SHAPE, "%s: zero-dimensional tensor %d (%s) cannot be concatenated",
                                  op, i, cti_desc(tensors[i]));
        if (ref < 0 && !cat_skipped(tensors[i])) ref = i;
    }
    ct_dtype dtype = promote_all(n, tensors);
    ct_device device = dev_of(tensors[0]);
    if (ref < 0) return cti_tensor_new(op, 1, (const int64_t[]){0}, dtype, device);
    const ct_tensor *r = tensors[ref];
    int d = cti_wrap_dim(op, dim, r->ndim);
    if (d < 0) return NULL;
    int64_t shape[CT_MAX_DIMS];
    memcpy(shape, r->shape, sizeof shape);
    shape[d] = 0;
    for (int i = 0; i < n; i++) {
        const ct_tensor *t = tensors[i];
        if (cat_skipped(t)) continue;
        if (t->ndim != r->ndim)
            return cti_error_null(CT_ERR_SHAPE,
                                  "%s: tensors must have the same number of dims: tensor %d is %s "
                                  "but tensor %d is %s",
                                  op, i, cti_desc(t), ref, cti_desc(r));
        for (int k = 0; k < r->ndim; k++)
            if (k != d && t->shape[k] != r->shape[k])
                return cti_error_null(CT_ERR_SHAPE,
                                      "%s: sizes must match except in dim %d: tensor %d has size "
                                      "%lld in dim %d but tensor %d has %lld (%s vs %s)",
                                      op, d, i, (long long)t->shape[k], k, ref,
                                      (long long)r->shape[k], cti_shape_s(t->ndim, t->shape),
                                      cti_shape_s(r->ndim, r->shape));
        if (shape[d] > INT64_MAX - t->shape[d])
            return cti_error_null(CT_ERR_OVERFLOW, "%s: total size in dim %d overflows", op, d);
        shape[d] += t->shape[d];
    }
    ct_tensor *out = cti_tensor_new(op, r->ndim, shape, dtype, device);
    if (!out) return NULL;
    /* Nothing to copy into an empty result, whose strides may be saturated
     * (a zero in another dim next to huge sizes): no part's offset is formed. */
    if (cti_numel(out->ndim, out->shape) == 0) return out;
    int64_t pos = 0;
    for (int i = 0; i < n; i++) {
        const ct_tensor *t = tensors[i];
        if (cat_skipped(t)) continue;
        if (t->shape[d] > 0) {
            ct_tensor *part = cti_tensor_view(out, out->ndim, t->shape, out->stride,
                                              pos * out->stride[d]);
            if (!part) return fail_release(out);
            ct_status s = dispatch_copy(part, t);
            ct_tensor_release(part);
            if (s != CT_OK) return fail_release(out);
        }
        pos += t->shape[d];
    }
    return out;
}

static ct_tensor *stack_impl(int n, ct_tensor *const *tensors, int dim) {
    static const char op[] = "ct_stack";
    if (check_tensor_list(op, n, tensors) != CT_OK) return NULL;
    const ct_tensor *r = tensors[0];
    for (int i = 1; i < n; i++) {
        const ct_tensor *t = tensors[i];
        bool same = t->ndim == r->ndim;
        for (int k = 0; same && k < r->ndim; k++) same = t->shape[k] == r->shape[k];
        if (!same)
            return cti_error_null(CT_ERR_SHAPE,
                                  "%s: expected all tensors to have the same shape: tensor %d is "
                                  "%s but tensor 0 is %s",
                                  op, i, cti_desc(t), cti_desc(r));
    }
    if (r->ndim >= CT_MAX_DIMS)
        return cti_error_null(CT_ERR_SHAPE, "%s: stacking %s would exceed %d dims", op, cti_desc(r),
                              CT_MAX_DIMS);
    int d = cti_wrap_dim(op, dim, r->ndim + 1);
    if (d < 0) return NULL;
    int64_t shape[CT_MAX_DIMS];
    for (int k = 0, j = 0; k <= r->ndim; k++) shape[k] = k == d ? n : r->shape[j++];
    ct_tensor *out = cti_tensor_new(op, r->ndim + 1, shape, promote_all(n, tensors), dev_of(r));
    if (!out) return NULL;
    if (cti_numel(out->ndim, out->shape) == 0) return out;
    int64_t stride[CT_MAX_DIMS];
    for (int k = 0, j = 0; k <= r->ndim; k++)
        if (k != d) stride[j++] = out->stride[k];
    for (int i = 0; i < n; i++) {
        ct_tensor *part = cti_tensor_view(out, r->ndim, r->shape, stride, i * out->stride[d]);
        if (!part) return fail_release(out);
        ct_status s = dispatch_copy(part, tensors[i]);
        ct_tensor_release(part);
        if (s != CT_OK) return fail_release(out);
    }
    return out;
}

/* ---- cat and stack with history --------------------------------------------------
 * A graph node has at most CTI_AG_MAX_IN inputs, so a longer list that needs
 * gradients is joined in groups first (an extra copy only then). */
static ct_tensor *record_join(const char *name, cti_backward_fn bw, int n,
                              ct_tensor *const *tensors, int dim, ct_tensor *out) {
    if (!out || !ct_dtype_is_floating(out->dtype)) return out;
    cti_join_params p = {.dim = dim < 0 ? dim + out->ndim : dim};
    cti_ag_rec r = {.name = name, .backward = bw, .nin = n, .nout = 1, .out = {out},
                    CTI_AG_PARAMS(&p)};
    for (int k = 0; k < n; k++) r.in[k] = tensors[k];
    if (cti_ag_record(&r) != CT_OK) return fail_release(out);
    return out;
}

static ct_tensor *cat_grouped(int n, ct_tensor *const *tensors, int dim) {
    ct_tensor *groups[CTI_AG_MAX_IN];
    int ng = 0, per = (n + CTI_AG_MAX_IN - 1) / CTI_AG_MAX_IN;
    ct_tensor *out = NULL;
    for (int i = 0; i < n; i += per) {
        int m = n - i < per ? n - i : per;
        if (!(groups[ng] = ct_cat(m, tensors + i, dim))) goto done;
        ng++;
    }
    out = ct_cat(ng, groups, dim);
done:
    for (int g = 0; g < ng; g++) ct_tensor_release(groups[g]);
    return out;
}

ct_tensor *ct_cat(int n, ct_tensor *const *tensors, int dim) {
    if (check_tensor_list("ct_cat", n, tensors) != CT_OK) return NULL;
    if (!cti_ag_needed(n, tensors)) return cat_impl(n, tensors, dim);
    if (n > CTI_AG_MAX_IN) return cat_grouped(n, tensors, dim);
    ct_tensor *out = cat_impl(n, tensors, dim);
    /* cat_impl has validated dim against the first non-skipped input. */
    return record_join("CatBackward", cti_bw_cat, n, tensors, dim, out);
}

ct_tensor *ct_stack(int n, ct_tensor *const *tensors, int dim) {
    if (check_tensor_list("ct_stack", n, tensors) != CT_OK) return NULL;
    if (!cti_ag_needed(n, tensors)) return stack_impl(n, tensors, dim);
    if (n <= CTI_AG_MAX_IN)
        return record_join("StackBackward", cti_bw_stack, n, tensors, dim,
                           stack_impl(n, tensors, dim));
    /* stack(ts, d) == cat(unsqueeze(t, d) for t in ts, d), with views that record. */
    int d = cti_wrap_dim("ct_stack", dim, tensors[0]->ndim + 1);
    if (d < 0) return NULL;
    ct_tensor **u = calloc((size_t)n, sizeof *u);
    if (!u) return cti_error_null(CT_ERR_OOM, "ct_stack: out of memory");
    ct_tensor *out = NULL;
    int made = 0;
    while (made < n && (u[made] = ct_unsqueeze(tensors[made], d))) made++;
    if (made == n) out = ct_cat(n, u, d);
    for (int i = 0; i < made; i++) ct_tensor_release(u[i]);
    free(u);
    return out;
}
