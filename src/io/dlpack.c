/* DLPack: cten tensors handed to other libraries and theirs taken in, the
 * memory shared both ways.
 *
 * An export is one malloc'd record holding the DLManagedTensor, the shape
 * and strides it points at, and a reference on the tensor's storage, which
 * the deleter drops. An import is a tensor on an external storage
 * (cti_tensor_from_external) whose release callback calls the producer's
 * deleter, so cten's reference counting decides when the producer gets its
 * memory back, whichever handle or view goes last. */
#include <stdlib.h>

#include <dlpack/dlpack.h>

#include "io_impl.h"
#include "tensor/cuda.h"
#include "tensor/dispatch.h"
#include "tensor/dlpack.h"

/* dtype codes by number: the older headers lack kDLBool. */
enum { DL_CODE_BOOL = 6 };

typedef struct export_rec {
    cti_storage *storage; /* a reference of the export's own */
    ct_dtype dtype;       /* what cten exported: bool may travel as uint8 */
    int64_t shape[CT_MAX_DIMS];
    int64_t strides[CT_MAX_DIMS];
    union {
        DLManagedTensor legacy;
#ifdef CTI_HAVE_DLPACK_VERSIONED
        struct DLManagedTensorVersioned versioned;
#endif
    } m;
} export_rec;

/* ---- dtypes and devices -------------------------------------------------------------------- */

static DLDataType dl_dtype(ct_dtype dt) {
    DLDataType d = {.code = kDLFloat, .bits = (uint8_t)(8 * ct_dtype_size(dt)), .lanes = 1};
    switch (dt) {
    case CT_BOOL:
#ifdef CTI_HAVE_DLPACK_BOOL
        d.code = DL_CODE_BOOL;
#else
        d.code = kDLUInt; /* as PyTorch did before DLPack had a bool */
#endif
        break;
    case CT_I32:
    case CT_I64: d.code = kDLInt; break;
    case CT_BF16: d.code = kDLBfloat; break;
    default: break;
    }
    return d;
}

/* The cten dtype of d, or CT_NUM_DTYPES. */
static ct_dtype ct_dtype_of(DLDataType d) {
    if (d.lanes != 1) return CT_NUM_DTYPES;
    switch (d.code) {
    case DL_CODE_BOOL: return d.bits == 8 ? CT_BOOL : CT_NUM_DTYPES;
    case kDLInt: return d.bits == 32 ? CT_I32 : d.bits == 64 ? CT_I64 : CT_NUM_DTYPES;
    case kDLBfloat: return d.bits == 16 ? CT_BF16 : CT_NUM_DTYPES;
    case kDLFloat:
        return d.bits == 16 ? CT_F16 : d.bits == 32 ? CT_F32 : d.bits == 64 ? CT_F64
                                                                            : CT_NUM_DTYPES;
    default: return CT_NUM_DTYPES;
    }
}

static const char *dl_code_name(uint8_t code) {
    static const char *const names[] = {"int", "uint", "float", "opaque handle",
                                        "bfloat", "complex", "bool"};
    return code < sizeof names / sizeof names[0] ? names[code] : "float8/other";
}

static const char *dl_device_name(int type) {
    static const char *const names[] = {
        "?", "kDLCPU", "kDLCUDA", "kDLCUDAHost", "kDLOpenCL", "?", "?", "kDLVulkan", "kDLMetal",
        "kDLVPI", "kDLROCM", "kDLROCMHost", "kDLExtDev", "kDLCUDAManaged", "kDLOneAPI",
        "kDLWebGPU", "kDLHexagon", "kDLMAIA"};
    return type >= 0 && type < (int)(sizeof names / sizeof names[0]) ? names[type] : "unknown";
}

/* ---- export ------------------------------------------------------------------------------- */

static void fill_dltensor(DLTensor *d, export_rec *r, const ct_tensor *t) {
    for (int i = 0; i < t->ndim; i++) {
        r->shape[i] = t->shape[i];
        r->strides[i] = t->stride[i];
    }
    d->data = cti_data(t);
    d->device.device_type = t->storage->device.type == CT_DEVICE_CUDA ? kDLCUDA : kDLCPU;
    d->device.device_id = t->storage->device.type == CT_DEVICE_CUDA ? t->storage->device.index : 0;
    d->ndim = t->ndim;
    d->dtype = dl_dtype(t->dtype);
    d->shape = r->shape;
    d->strides = r->strides;
    d->byte_offset = 0;
}

/* A record holding a reference on t's storage, after t's device work is
 * done; NULL with an error naming op. */
static export_rec *export_begin(const char *op, ct_tensor *t) {
    if (!t) return cti_error_null(CT_ERR_INVALID_ARG, "%s: tensor is NULL", op);
    if (t->storage->device.type == CT_DEVICE_CUDA &&
        ct_cuda_synchronize(t->storage->device.index) != CT_OK)
        return cti_error_null(ct_last_status(), "%s: waiting for %s: %s", op, cti_desc(t),
                              ct_last_error());
    export_rec *r = calloc(1, sizeof *r);
    if (!r) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    r->storage = t->storage;
    r->dtype = t->dtype;
    cti_storage_retain(t->storage);
    return r;
}

static void export_free(export_rec *r) {
    cti_storage_release(r->storage);
    free(r);
}

static void legacy_deleter(DLManagedTensor *self) {
    if (self) export_free(self->manager_ctx);
}

DLManagedTensor *ct_to_dlpack(ct_tensor *t) {
    export_rec *r = export_begin("ct_to_dlpack", t);
    if (!r) return NULL;
    fill_dltensor(&r->m.legacy.dl_tensor, r, t);
    r->m.legacy.manager_ctx = r;
    r->m.legacy.deleter = legacy_deleter;
    return &r->m.legacy;
}

/* ---- import -------------------------------------------------------------------------------- */

/* What the storage's release calls: the producer's deleter, after cten's
 * work on the memory is done. */
typedef struct import_rec {
    void *managed;
    void (*deleter)(void *managed);
    ct_device device;
} import_rec;

static void import_release(void *ctx) {
    import_rec *r = ctx;
    /* The producer may reuse the memory at once; a failed wait leaves
     * nothing better to do than to hand it back anyway. */
    if (r->device.type == CT_DEVICE_CUDA) ct_cuda_synchronize(r->device.index);
    if (r->deleter) r->deleter(r->managed);
    free(r);
}

static ct_status check_device(const char *op, DLDevice dev, ct_device *out) {
    switch ((int)dev.device_type) {
    case kDLCPU:
    case kDLCUDAHost: *out = CT_CPU; return CT_OK;
    case kDLCUDA: {
        int n = ct_device_count(CT_DEVICE_CUDA);
        if (dev.device_id < 0 || dev.device_id >= n)
            return cti_error(CT_ERR_DEVICE,
                             "%s: the tensor is on CUDA device %d but cten has %d CUDA "
                             "device%s (cten-info says why)",
                             op, dev.device_id, n, n == 1 ? "" : "s");
        *out = CT_CUDA(dev.device_id);
        return CT_OK;
    }
    default:
        return cti_error(CT_ERR_DEVICE,
                         "%s: device type %d (%s) is not one cten can use (expected kDLCPU, "
                         "kDLCUDAHost or kDLCUDA)",
                         op, (int)dev.device_type, dl_device_name((int)dev.device_type));
    }
}

/* Strides (dl's or row-major ones) into out: sizes 0 and 1 make any stride
 * harmless, so only a negative stride of a longer dim is refused. *nbytes
 * receives the bytes from the first element to the end of the furthest. */
static ct_status check_geometry(const char *op, const DLTensor *dl, ct_dtype dt, int64_t *out,
                                size_t *nbytes) {
    int64_t numel = 1;
    for (int i = 0; i < dl->ndim; i++) {
        if (dl->shape[i] < 0)
            return cti_error(CT_ERR_SHAPE, "%s: size %lld of dim %d is negative", op,
                             (long long)dl->shape[i], i);
        if (__builtin_mul_overflow(numel, dl->shape[i], &numel))
            return cti_error(CT_ERR_OVERFLOW, "%s: shape %s overflows", op,
                             cti_shape_s(dl->ndim, dl->shape));
    }
    cti_contiguous_strides(dl->ndim, dl->shape, out);
    if (numel == 0) { /* addresses nothing: row-major strides, whatever dl says */
        *nbytes = 0;
        return CT_OK;
    }
    int64_t last = 0; /* element offset of the furthest element */
    for (int i = 0; i < dl->ndim && dl->strides; i++) {
        int64_t s = dl->strides[i];
        if (dl->shape[i] <= 1) continue;
        if (s < 0)
            return cti_error(CT_ERR_INVALID_ARG,
                             "%s: stride %lld of dim %d is negative (a reversed view); cten "
                             "expects strides >= 0: make it contiguous first",
                             op, (long long)s, i);
        out[i] = s;
    }
    size_t es = ct_dtype_size(dt);
    for (int i = 0; i < dl->ndim; i++) {
        int64_t span;
        if (__builtin_mul_overflow(dl->shape[i] - 1, out[i], &span) ||
            __builtin_add_overflow(last, span, &last))
            return cti_error(CT_ERR_OVERFLOW, "%s: shape %s with strides %s overflows", op,
                             cti_shape_s(dl->ndim, dl->shape), cti_shape_s(dl->ndim, out));
    }
    if ((uint64_t)last >= SIZE_MAX / es)
        return cti_error(CT_ERR_OVERFLOW, "%s: shape %s with strides %s overflows", op,
                         cti_shape_s(dl->ndim, dl->shape), cti_shape_s(dl->ndim, out));
    *nbytes = ((size_t)last + 1) * es;
    return CT_OK;
}

/* A tensor over dl's memory whose storage gives managed to deleter when it
 * goes; nothing is taken over on failure. own_dtype is the dtype of one of
 * cten's own exports (CT_NUM_DTYPES otherwise). */
static ct_tensor *wrap(const char *op, const DLTensor *dl, void *managed,
                       void (*deleter)(void *), ct_dtype own_dtype) {
    if (dl->ndim < 0 || dl->ndim > CT_MAX_DIMS)
        return cti_error_null(CT_ERR_SHAPE, "%s: %d dims; cten tensors have 0 to %d", op,
                              dl->ndim, CT_MAX_DIMS);
    if (dl->ndim > 0 && !dl->shape)
        return cti_error_null(CT_ERR_INVALID_ARG, "%s: shape is NULL for %d dims", op, dl->ndim);
    ct_dtype dt = own_dtype != CT_NUM_DTYPES ? own_dtype : ct_dtype_of(dl->dtype);
    if (dt == CT_NUM_DTYPES)
        return cti_error_null(CT_ERR_DTYPE,
                              "%s: dtype %s%u (code %u, %u bits, %u lanes) is not a cten dtype "
                              "(expected bool, int32, int64, float16, bfloat16, float32, "
                              "float64, one lane)",
                              op, dl_code_name(dl->dtype.code), dl->dtype.bits, dl->dtype.code,
                              dl->dtype.bits, dl->dtype.lanes);
    ct_device dev;
    if (check_device(op, dl->device, &dev)) return NULL;
    int64_t strides[CT_MAX_DIMS];
    size_t nbytes = 0;
    if (check_geometry(op, dl, dt, strides, &nbytes)) return NULL;
    char *data = dl->data;
    size_t es = ct_dtype_size(dt);
    if (nbytes > 0) {
        if (!data) return cti_error_null(CT_ERR_INVALID_ARG, "%s: data is NULL", op);
        if ((uintptr_t)data > UINTPTR_MAX - nbytes ||
            dl->byte_offset > UINTPTR_MAX - nbytes - (uintptr_t)data)
            return cti_error_null(CT_ERR_OVERFLOW, "%s: byte_offset %llu overflows the address",
                                  op, (unsigned long long)dl->byte_offset);
        data += dl->byte_offset;
        if ((uintptr_t)data % es)
            return cti_error_null(CT_ERR_INVALID_ARG,
                                  "%s: data + byte_offset (%p) is not aligned to the %zu-byte "
                                  "elements of %s",
                                  op, (void *)data, es, ct_dtype_name(dt));
    } else {
        /* Addresses nothing (byte_offset need not even fit): a pointer of
         * cten's own, as no arithmetic on the producer's NULL is defined. */
        static _Alignas(16) char nothing[16];
        data = nothing;
    }
    import_rec *r = malloc(sizeof *r);
    if (!r) return cti_error_null(CT_ERR_OOM, "%s: out of memory", op);
    *r = (import_rec){managed, deleter, dev};
    ct_tensor *t = cti_tensor_from_external(op, data, nbytes, dev, import_release, r, dl->ndim,
                                            dl->shape, strides, dt);
    if (!t) free(r);
    return t;
}

/* The deleters as the release record calls them. */
static void call_legacy(void *m) {
    DLManagedTensor *mt = m;
    if (mt->deleter) mt->deleter(mt);
}

ct_tensor *ct_from_dlpack(DLManagedTensor *m) {
    static const char op[] = "ct_from_dlpack";
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "%s: managed tensor is NULL", op);
    ct_dtype own = m->deleter == legacy_deleter ? ((export_rec *)m->manager_ctx)->dtype
                                                : CT_NUM_DTYPES;
    return wrap(op, &m->dl_tensor, m, call_legacy, own);
}

/* ---- the versioned struct (DLPack >= 1.0) ----------------------------------------------- */

#ifdef CTI_HAVE_DLPACK_VERSIONED
bool ct_dlpack_has_versioned(void) { return true; }

static void versioned_deleter(struct DLManagedTensorVersioned *self) {
    if (self) export_free(self->manager_ctx);
}

struct DLManagedTensorVersioned *ct_to_dlpack_versioned(ct_tensor *t) {
    export_rec *r = export_begin("ct_to_dlpack_versioned", t);
    if (!r) return NULL;
    struct DLManagedTensorVersioned *m = &r->m.versioned;
    m->version.major = DLPACK_MAJOR_VERSION;
    m->version.minor = DLPACK_MINOR_VERSION;
    m->flags = 0;
    fill_dltensor(&m->dl_tensor, r, t);
    m->manager_ctx = r;
    m->deleter = versioned_deleter;
    return m;
}

static void call_versioned(void *m) {
    struct DLManagedTensorVersioned *mt = m;
    if (mt->deleter) mt->deleter(mt);
}

ct_tensor *ct_from_dlpack_versioned(struct DLManagedTensorVersioned *m) {
    static const char op[] = "ct_from_dlpack_versioned";
    if (!m) return cti_error_null(CT_ERR_INVALID_ARG, "%s: managed tensor is NULL", op);
    if (m->version.major != DLPACK_MAJOR_VERSION)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: DLPack version %u.%u; cten reads major version %d", op,
                              m->version.major, m->version.minor, DLPACK_MAJOR_VERSION);
    if (m->flags & DLPACK_FLAG_BITMASK_READ_ONLY)
        return cti_error_null(CT_ERR_INVALID_ARG,
                              "%s: the tensor is read-only (DLPACK_FLAG_BITMASK_READ_ONLY) and "
                              "cten tensors are writable: copy it on the producer's side first",
                              op);
    ct_dtype own = m->deleter == versioned_deleter ? ((export_rec *)m->manager_ctx)->dtype
                                                   : CT_NUM_DTYPES;
    return wrap(op, &m->dl_tensor, m, call_versioned, own);
}
#else
bool ct_dlpack_has_versioned(void) { return false; }

struct DLManagedTensorVersioned *ct_to_dlpack_versioned(ct_tensor *t) {
    (void)t;
    return cti_error_null(CT_ERR_UNSUPPORTED,
                          "ct_to_dlpack_versioned: this cten was built with DLPack %d.%d "
                          "headers, which lack DLManagedTensorVersioned (use ct_to_dlpack)",
                          DLPACK_VERSION / 100, DLPACK_VERSION / 10 % 10);
}

ct_tensor *ct_from_dlpack_versioned(struct DLManagedTensorVersioned *m) {
    (void)m;
    return cti_error_null(CT_ERR_UNSUPPORTED,
                          "ct_from_dlpack_versioned: this cten was built with DLPack %d.%d "
                          "headers, which lack DLManagedTensorVersioned (use ct_from_dlpack)",
                          DLPACK_VERSION / 100, DLPACK_VERSION / 10 % 10);
}
#endif
