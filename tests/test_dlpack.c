/* DLPack on the CPU: exports of every dtype and layout (views with offsets
 * and strides, 0-d, empty) describe cten's memory exactly and keep it alive
 * until their deleter runs; imports from a producer written here (byte
 * offsets, strides or none, 0-d, empty, CUDA host memory) share its memory,
 * and its deleter is called exactly once, when the last cten handle, view
 * or scope lets go, never on failure; a table of bad imports gives each
 * status and message and leaves the producer's struct untouched; cten's
 * own exports come back with their dtype (bool included); the versioned
 * struct where the DLPack header has it. Zero copy is checked by writing
 * through one side and reading through the other. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <dlpack/dlpack.h>

#include "test_util.h"

#include "test_fixture.h"

/* ---- a producer: a malloc'd buffer and a counting deleter ------------------------------ */

static int deleted;

typedef struct producer {
    DLManagedTensor m;
    int64_t shape[CT_MAX_DIMS], strides[CT_MAX_DIMS];
    void *buf;
} producer;

static void producer_delete(DLManagedTensor *self) {
    producer *p = self->manager_ctx;
    deleted++;
    free(p->buf);
    free(p);
}

/* A producer of ndim dims holding nbytes of buffer (poisoned with 0x7f),
 * data at its start, byte_offset 0, row-major (strides NULL). */
static producer *produce(int ndim, const int64_t *shape, DLDataType dt, size_t nbytes) {
    producer *p = calloc(1, sizeof *p);
    p->buf = malloc(nbytes ? nbytes : 1);
    memset(p->buf, 0x7f, nbytes);
    for (int d = 0; d < ndim; d++) p->shape[d] = shape[d];
    p->m.dl_tensor = (DLTensor){.data = p->buf, .device = {kDLCPU, 0}, .ndim = ndim,
                                .dtype = dt, .shape = p->shape, .strides = NULL};
    p->m.manager_ctx = p;
    p->m.deleter = producer_delete;
    return p;
}

static const DLDataType DL_F32 = {kDLFloat, 32, 1}, DL_F64 = {kDLFloat, 64, 1},
                        DL_I64 = {kDLInt, 64, 1};

static size_t dt_size(ct_dtype dt) { return ct_dtype_size(dt); }

/* The element at index idx of a DLTensor, as a double. */
static double dl_get(const DLTensor *d, ct_dtype dt, const int64_t *idx) {
    int64_t off = 0, stride = 1;
    for (int k = d->ndim - 1; k >= 0; k--) {
        off += idx[k] * (d->strides ? d->strides[k] : stride);
        stride *= d->shape[k];
    }
    double v;
    tu_unpack((const char *)d->data + d->byte_offset + off * (int64_t)dt_size(dt), 1, dt, &v);
    return v;
}

static void dl_set(DLTensor *d, ct_dtype dt, const int64_t *idx, double v) {
    int64_t off = 0, stride = 1;
    for (int k = d->ndim - 1; k >= 0; k--) {
        off += idx[k] * (d->strides ? d->strides[k] : stride);
        stride *= d->shape[k];
    }
    tu_pack(&v, 1, dt, (char *)d->data + d->byte_offset + off * (int64_t)dt_size(dt));
}

/* Row-major index number i of shape. */
static void unravel(int64_t i, int nd, const int64_t *shape, int64_t *idx) {
    for (int k = nd - 1; k >= 0; k--) {
        idx[k] = i % shape[k];
        i /= shape[k];
    }
}

/* Asserts that d and t hold the same elements, read through each side. */
static void expect_same_elements(const DLTensor *d, ct_tensor *t) {
    ct_dtype dt = ct_tensor_dtype(t);
    int64_t n = ct_tensor_numel(t);
    double *tv = tu_values(t);
    for (int64_t i = 0; i < n; i++) {
        int64_t idx[CT_MAX_DIMS];
        unravel(i, d->ndim, d->shape, idx);
        double v = dl_get(d, dt, idx);
        if (!(v == tv[i] || (isnan(v) && isnan(tv[i])))) {
            fprintf(stderr, "element %lld: DLPack %g, cten %g\n", (long long)i, v, tv[i]);
            fail();
        }
    }
    free(tv);
}

/* Writes through d, reads through t, then the other way round. */
static void expect_shared(DLTensor *d, ct_tensor *t) {
    ct_dtype dt = ct_tensor_dtype(t);
    int64_t n = ct_tensor_numel(t);
    if (n == 0) return;
    int64_t idx[CT_MAX_DIMS], i = tu_randint(0, n);
    unravel(i, d->ndim, d->shape, idx);
    double v = dt == CT_BOOL ? 1 - dl_get(d, dt, idx) : tu_round(tu_uniform(-9, 9), dt);
    dl_set(d, dt, idx, v);
    double *tv = tu_values(t);
    assert_true(tv[i] == v);
    free(tv);
    for (int k = 0; k < d->ndim; k++)
        if (d->shape[k] > 1 && ct_tensor_strides(t)[k] == 0) return; /* cten refuses writes */
    assert_int_equal(ct_fill_(t, 1), CT_OK);
    unravel(n - 1, d->ndim, d->shape, idx);
    assert_true(dl_get(d, dt, idx) == 1);
}

/* ---- export -------------------------------------------------------------------------------- */

static void expect_dtype(DLDataType d, ct_dtype dt) {
    assert_int_equal(d.lanes, 1);
    assert_int_equal(d.bits, 8 * ct_dtype_size(dt));
    switch (dt) {
    case CT_BOOL:
#ifdef CTI_HAVE_DLPACK_BOOL
        assert_int_equal(d.code, kDLBool);
#else
        assert_int_equal(d.code, kDLUInt);
#endif
        break;
    case CT_I32:
    case CT_I64: assert_int_equal(d.code, kDLInt); break;
    case CT_BF16: assert_int_equal(d.code, kDLBfloat); break;
    default: assert_int_equal(d.code, kDLFloat); break;
    }
}

/* Exports of t: fields, shared memory, and the storage alive until the
 * deleter, even with every cten handle released. */
static void check_export(ct_tensor *t) {
    cti_alloc_stats before = cti_get_alloc_stats();
    int64_t numel = ct_tensor_numel(t);
    size_t es = ct_dtype_size(ct_tensor_dtype(t));
    DLManagedTensor *m = ct_to_dlpack(t);
    assert_non_null(m);
    DLTensor *d = &m->dl_tensor;
    assert_int_equal(d->device.device_type, kDLCPU);
    assert_int_equal(d->ndim, ct_tensor_ndim(t));
    for (int k = 0; k < d->ndim; k++) {
        assert_int_equal(d->shape[k], ct_tensor_shape(t)[k]);
        assert_int_equal(d->strides[k], ct_tensor_strides(t)[k]);
    }
    assert_ptr_equal(d->data, ct_tensor_data_ptr(t));
    assert_int_equal(d->byte_offset, 0);
    expect_dtype(d->dtype, ct_tensor_dtype(t));
    expect_same_elements(d, t);
    expect_shared(d, t);
    ct_tensor *keep = ct_tensor_retain(t);
    ct_tensor_release(t);
    ct_tensor_release(keep);
    /* Every handle gone, the storage stays for the consumer (ASan would
     * report the write below otherwise). */
    assert_int_equal(cti_get_alloc_stats().live_storages, before.live_storages);
    if (numel > 0) memset(d->data, 0, es);
    m->deleter(m);
}

static void test_export(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        ct_tensor *base = tu_rand(CT_SHAPE(4, 6, 5), dt, -20, 20, NULL);
        ct_tensor *row = ct_select(base, 0, 1), *col = ct_narrow(row, 0, 2, 1);
        ct_tensor *views[] = {
            ct_tensor_retain(base),
            ct_transpose(base, 0, 2),                       /* strides (1, 5, 30) */
            ct_narrow(base, 1, 2, 3),                       /* an offset */
            ct_slice(base, 2, 1, 5, 3),                     /* step 3 */
            ct_select(base, 0, 3),                          /* an offset, 2-d */
            ct_expand(col, CT_SHAPE(3, 5)),                 /* stride 0 */
            ct_tensor_scalar(1, dt, CT_CPU),                /* 0-d */
            ct_tensor_zeros(CT_SHAPE(3, 0, 2), dt, CT_CPU), /* empty */
            ct_tensor_zeros(CT_SHAPE(0), dt, CT_CPU),
        };
        ct_tensor_release(col);
        ct_tensor_release(row);
        for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) check_export(views[v]);
        ct_tensor_release(base);
    }
}

/* ---- import -------------------------------------------------------------------------------- */

static void test_import_counted(void **state) {
    (void)state;
    deleted = 0;
    /* [3, 4] float32 row-major, then views, released in every order. */
    for (int order = 0; order < 3; order++) {
        producer *p = produce(CT_SHAPE(3, 4), DL_F32, 48);
        for (int i = 0; i < 12; i++) ((float *)p->buf)[i] = (float)i;
        ct_tensor *t = ct_from_dlpack(&p->m);
        assert_non_null(t);
        assert_int_equal(ct_tensor_dtype(t), CT_F32);
        assert_ptr_equal(ct_tensor_data_ptr(t), p->buf);
        expect_same_elements(&p->m.dl_tensor, t);
        expect_shared(&p->m.dl_tensor, t);
        ct_tensor *tt = ct_transpose(t, 0, 1);
        ct_tensor *r = ct_tensor_retain(t);
        ct_tensor *first = order == 0 ? t : order == 1 ? tt : r;
        ct_tensor *second = order == 0 ? tt : order == 1 ? r : t;
        ct_tensor *third = order == 0 ? r : order == 1 ? t : tt;
        ct_tensor_release(first);
        ct_tensor_release(second);
        assert_int_equal(deleted, order);
        ct_tensor_release(third);
        assert_int_equal(deleted, order + 1);
    }
    /* A scope releases it, once, with the results of ops on it. */
    deleted = 0;
    producer *p = produce(CT_SHAPE(5), DL_F64, 40);
    ct_scope *s = ct_scope_begin();
    ct_tensor *t = ct_from_dlpack(&p->m);
    assert_non_null(t);
    ct_tensor *sum = ct_add(t, t);
    assert_non_null(sum);
    ct_tensor_release(t); /* the scope's reference: the scope forgets it */
    assert_int_equal(deleted, 1);
    ct_scope_end(s);
    assert_int_equal(deleted, 1);
    p = produce(CT_SHAPE(5), DL_F64, 40);
    s = ct_scope_begin();
    t = ct_from_dlpack(&p->m);
    ct_tensor *v = ct_narrow(t, 0, 1, 2);
    assert_non_null(v);
    assert_int_equal(deleted, 1);
    ct_scope_end(s);
    assert_int_equal(deleted, 2);
    /* A producer without a deleter. */
    double local[2] = {1, 2};
    DLManagedTensor bare = {.dl_tensor = {.data = local, .device = {kDLCPU, 0}, .ndim = 1,
                                          .dtype = DL_F64, .shape = (int64_t[]){2}}};
    t = ct_from_dlpack(&bare);
    assert_non_null(t);
    assert_int_equal(ct_fill_(t, 4), CT_OK);
    assert_true(local[0] == 4 && local[1] == 4);
    ct_tensor_release(t);
}

static void test_import_geometry(void **state) {
    (void)state;
    deleted = 0;
    /* A byte offset and strides in elements: [2, 3] every other column of
     * a [2, 8] int64 buffer, from element 1. */
    producer *p = produce(CT_SHAPE(2, 3), DL_I64, 16 * 8);
    for (int i = 0; i < 16; i++) ((int64_t *)p->buf)[i] = i;
    p->m.dl_tensor.byte_offset = 8;
    p->strides[0] = 8;
    p->strides[1] = 2;
    p->m.dl_tensor.strides = p->strides;
    ct_tensor *t = ct_from_dlpack(&p->m);
    assert_non_null(t);
    assert_false(ct_tensor_is_contiguous(t));
    assert_int_equal(ct_tensor_strides(t)[0], 8);
    assert_int_equal(ct_tensor_strides(t)[1], 2);
    double *v = tu_values(t);
    static const double want[6] = {1, 3, 5, 9, 11, 13};
    tu_assert_close(v, want, 6, 0, 0);
    free(v);
    expect_shared(&p->m.dl_tensor, t);
    assert_true(((int64_t *)p->buf)[0] == 0 && ((int64_t *)p->buf)[2] == 2); /* untouched */
    ct_tensor_release(t);
    assert_int_equal(deleted, 1);

    /* 0-d (shape may be NULL), size-1 dims with any stride, empty without data. */
    p = produce(0, NULL, DL_F64, 8);
    p->m.dl_tensor.shape = NULL;
    ((double *)p->buf)[0] = 2.5;
    t = ct_from_dlpack(&p->m);
    assert_non_null(t);
    assert_int_equal(ct_tensor_ndim(t), 0);
    double x;
    assert_int_equal(ct_tensor_item(t, &x), CT_OK);
    assert_true(x == 2.5);
    ct_tensor_release(t);
    p = produce(CT_SHAPE(1, 3, 1), DL_F32, 12);
    int64_t odd[3] = {-7, 1, 12345};
    p->m.dl_tensor.strides = odd;
    t = ct_from_dlpack(&p->m);
    assert_non_null(t);
    assert_int_equal(ct_fill_(t, 3), CT_OK);
    for (int i = 0; i < 3; i++) assert_true(((float *)p->buf)[i] == 3);
    ct_tensor_release(t);
    p = produce(CT_SHAPE(4, 0), DL_F32, 0);
    free(p->buf);
    p->buf = NULL;
    p->m.dl_tensor.data = NULL;
    int64_t wild[2] = {-1, INT64_MAX};
    p->m.dl_tensor.strides = wild;
    p->m.dl_tensor.byte_offset = UINT64_MAX; /* addresses nothing either */
    t = ct_from_dlpack(&p->m);
    assert_non_null(t);
    assert_int_equal(ct_tensor_numel(t), 0);
    ct_tensor *sum = ct_sum(t, CT_NONE, false);
    assert_int_equal(ct_tensor_item(sum, &x), CT_OK);
    assert_true(x == 0);
    ct_tensor_release(sum);
    ct_tensor_release(t);
    /* CUDA host (pinned) memory is host memory. */
    p = produce(CT_SHAPE(2), DL_F64, 16);
    p->m.dl_tensor.device = (DLDevice){kDLCUDAHost, 0};
    t = ct_from_dlpack(&p->m);
    assert_non_null(t);
    assert_int_equal(ct_tensor_device(t).type, CT_DEVICE_CPU);
    ct_tensor_release(t);
    assert_int_equal(deleted, 5);
}

typedef struct bad_import {
    void (*change)(producer *p);
    ct_status status;
    const char *words[3];
} bad_import;

static void ndim_9(producer *p) { p->m.dl_tensor.ndim = 9; }
static void ndim_neg(producer *p) { p->m.dl_tensor.ndim = -1; }
static void shape_null(producer *p) { p->m.dl_tensor.shape = NULL; }
static void size_neg(producer *p) { p->shape[1] = -2; }
static void lanes_4(producer *p) { p->m.dl_tensor.dtype.lanes = 4; }
static void uint8(producer *p) { p->m.dl_tensor.dtype = (DLDataType){kDLUInt, 8, 1}; }
static void float8(producer *p) { p->m.dl_tensor.dtype = (DLDataType){kDLFloat, 8, 1}; }
static void complex64(producer *p) { p->m.dl_tensor.dtype = (DLDataType){kDLComplex, 64, 1}; }
static void opencl(producer *p) { p->m.dl_tensor.device = (DLDevice){kDLOpenCL, 0}; }
static void cuda_missing(producer *p) { p->m.dl_tensor.device = (DLDevice){kDLCUDA, 7}; }
static void stride_neg(producer *p) {
    p->strides[0] = -3;
    p->strides[1] = 1;
    p->m.dl_tensor.strides = p->strides;
}
static void misaligned(producer *p) { p->m.dl_tensor.byte_offset = 2; }
static void data_null(producer *p) { p->m.dl_tensor.data = NULL; }
static void stride_overflow(producer *p) {
    p->strides[0] = INT64_MAX / 2;
    p->strides[1] = 1;
    p->m.dl_tensor.strides = p->strides;
}
static void offset_overflow(producer *p) { p->m.dl_tensor.byte_offset = UINT64_MAX - 4; }

static const bad_import BAD_IMPORTS[] = {
    {ndim_9, CT_ERR_SHAPE, {"9 dims; cten tensors have 0 to 8"}},
    {ndim_neg, CT_ERR_SHAPE, {"-1 dims"}},
    {shape_null, CT_ERR_INVALID_ARG, {"shape is NULL for 2 dims"}},
    {size_neg, CT_ERR_SHAPE, {"size -2 of dim 1 is negative"}},
    {lanes_4, CT_ERR_DTYPE, {"float32 (code 2, 32 bits, 4 lanes) is not a cten dtype", "one lane"}},
    {uint8, CT_ERR_DTYPE, {"uint8 (code 1, 8 bits, 1 lanes)", "expected bool, int32"}},
    {float8, CT_ERR_DTYPE, {"float8 (code 2, 8 bits"}},
    {complex64, CT_ERR_DTYPE, {"complex64"}},
    {opencl, CT_ERR_DEVICE, {"device type 4 (kDLOpenCL) is not one cten can use",
                             "expected kDLCPU, kDLCUDAHost or kDLCUDA"}},
    {cuda_missing, CT_ERR_DEVICE, {"the tensor is on CUDA device 7 but cten has"}},
    {stride_neg, CT_ERR_INVALID_ARG, {"stride -3 of dim 0 is negative", "make it contiguous"}},
    {misaligned, CT_ERR_INVALID_ARG, {"is not aligned to the 4-byte elements of float32"}},
    {data_null, CT_ERR_INVALID_ARG, {"data is NULL"}},
    {stride_overflow, CT_ERR_OVERFLOW, {"shape [3, 4] with strides", "overflows"}},
    {offset_overflow, CT_ERR_OVERFLOW, {"byte_offset", "overflows the address"}},
};

static void test_import_errors(void **state) {
    (void)state;
    deleted = 0;
    for (size_t k = 0; k < sizeof BAD_IMPORTS / sizeof BAD_IMPORTS[0]; k++) {
        producer *p = produce(CT_SHAPE(3, 4), DL_F32, 48);
        BAD_IMPORTS[k].change(p);
        producer before = *p;
        ct_clear_error();
        ct_tensor *t = ct_from_dlpack(&p->m);
        if (t || ct_last_status() != BAD_IMPORTS[k].status)
            fprintf(stderr, "case %zu: %s\n", k, ct_last_error());
        tu_assert_null_error(t, BAD_IMPORTS[k].status, "ct_from_dlpack");
        for (int w = 0; w < 3 && BAD_IMPORTS[k].words[w]; w++) {
            if (!strstr(ct_last_error(), BAD_IMPORTS[k].words[w])) {
                fprintf(stderr, "case %zu: \"%s\" lacks \"%s\"\n", k, ct_last_error(),
                        BAD_IMPORTS[k].words[w]);
                fail();
            }
        }
        /* Still the caller's, as it was. */
        assert_int_equal(deleted, 0);
        assert_memory_equal(&before, p, sizeof before);
        p->m.deleter(&p->m);
        deleted = 0;
    }
    tu_assert_null_error(ct_from_dlpack(NULL), CT_ERR_INVALID_ARG,
                         "ct_from_dlpack: managed tensor is NULL");
    tu_assert_null_error(ct_to_dlpack(NULL), CT_ERR_INVALID_ARG, "ct_to_dlpack: tensor is NULL");
}

/* cten's own exports come back as they left, bool included. */
static void test_roundtrip(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        double *vals;
        ct_tensor *t = tu_rand(CT_SHAPE(3, 5), dt, -9, 9, &vals);
        ct_tensor *v = ct_transpose(t, 0, 1);
        cti_alloc_stats mid = cti_get_alloc_stats();
        ct_tensor *u = ct_from_dlpack(ct_to_dlpack(v));
        assert_non_null(u);
        assert_int_equal(ct_tensor_dtype(u), dt);
        assert_ptr_equal(ct_tensor_data_ptr(u), ct_tensor_data_ptr(v));
        double *a = tu_values(u), *b = tu_values(v);
        tu_assert_close(a, b, 15, 0, 0);
        free(a);
        free(b);
        assert_int_equal(ct_fill_(u, 1), CT_OK);
        double *c = tu_values(t);
        for (int i = 0; i < 15; i++) assert_true(c[i] == 1);
        free(c);
        ct_tensor_release(v);
        ct_tensor_release(t);
        /* u's storage holds the export, which holds t's storage. */
        ct_tensor_release(u);
        cti_alloc_stats end = cti_get_alloc_stats();
        assert_int_equal(end.live_storages, mid.live_storages - 1);
        free(vals);
    }
}

/* ---- the versioned struct ---------------------------------------------------------------- */

#ifdef CTI_HAVE_DLPACK_VERSIONED
typedef struct vproducer {
    struct DLManagedTensorVersioned m;
    int64_t shape[1];
    float buf[4];
} vproducer;

static void vdelete(struct DLManagedTensorVersioned *self) {
    deleted++;
    free(self->manager_ctx);
}

static vproducer *vproduce(void) {
    vproducer *p = calloc(1, sizeof *p);
    p->shape[0] = 4;
    p->m.version = (DLPackVersion){DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION};
    p->m.manager_ctx = p;
    p->m.deleter = vdelete;
    p->m.dl_tensor = (DLTensor){.data = p->buf, .device = {kDLCPU, 0}, .ndim = 1,
                                .dtype = DL_F32, .shape = p->shape};
    return p;
}
#endif

static void test_versioned(void **state) {
    (void)state;
    ct_tensor *t = ct_tensor_arange(0, 4, 1, CT_BOOL, CT_CPU);
#ifdef CTI_HAVE_DLPACK_VERSIONED
    assert_true(ct_dlpack_has_versioned());
    struct DLManagedTensorVersioned *m = ct_to_dlpack_versioned(t);
    assert_non_null(m);
    assert_int_equal(m->version.major, DLPACK_MAJOR_VERSION);
    assert_int_equal(m->flags, 0);
    expect_dtype(m->dl_tensor.dtype, CT_BOOL);
    assert_ptr_equal(m->dl_tensor.data, ct_tensor_data_ptr(t));
    ct_tensor *u = ct_from_dlpack_versioned(m);
    assert_non_null(u);
    assert_int_equal(ct_tensor_dtype(u), CT_BOOL);
    ct_tensor_release(u);

    deleted = 0;
    vproducer *p = vproduce();
    p->m.flags = DLPACK_FLAG_BITMASK_READ_ONLY;
    tu_assert_null_error(ct_from_dlpack_versioned(&p->m), CT_ERR_INVALID_ARG,
                         "ct_from_dlpack_versioned", "read-only");
    p->m.flags = DLPACK_FLAG_BITMASK_IS_COPIED;
    p->m.version.major = DLPACK_MAJOR_VERSION + 1;
    tu_assert_null_error(ct_from_dlpack_versioned(&p->m), CT_ERR_INVALID_ARG,
                         "ct_from_dlpack_versioned: DLPack version", "cten reads major version");
    assert_int_equal(deleted, 0);
    p->m.version.major = DLPACK_MAJOR_VERSION;
    u = ct_from_dlpack_versioned(&p->m);
    assert_non_null(u);
    assert_int_equal(ct_fill_(u, 2), CT_OK);
    assert_true(p->buf[3] == 2);
    ct_tensor_release(u);
    assert_int_equal(deleted, 1);
    tu_assert_null_error(ct_from_dlpack_versioned(NULL), CT_ERR_INVALID_ARG,
                         "managed tensor is NULL");
#else
    assert_false(ct_dlpack_has_versioned());
    tu_assert_null_error(ct_to_dlpack_versioned(t), CT_ERR_UNSUPPORTED, "ct_to_dlpack_versioned",
                         "lack DLManagedTensorVersioned");
    tu_assert_null_error(ct_from_dlpack_versioned(NULL), CT_ERR_UNSUPPORTED,
                         "ct_from_dlpack_versioned", "lack DLManagedTensorVersioned");
#endif
    ct_tensor_release(t);
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_export),        T(test_import_counted), T(test_import_geometry),
        T(test_import_errors), T(test_roundtrip),      T(test_versioned),
    };
#undef T
    return tu_run_tests(tests);
}
