/* DLPack on the GPU: exports of CUDA tensors (every dtype, views with
 * offsets and strides) describe the device memory exactly and keep it
 * allocated until their deleter runs; imports of device memory a producer
 * allocated with cudaMalloc share it (written through the CUDA runtime,
 * read through cten, and the other way round) and call its deleter exactly
 * once; a device index cten does not have is refused. The test calls the
 * CUDA runtime the module links (looked up, so the program links no CUDA
 * library). Skips without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>
#include <dlpack/dlpack.h>

#include "cuda_module.h"
#include "cuda_test_util.h"
#include "test_util.h"

#include "core/tensor_impl.h"

static int ngpu;
static cudaError_t (*cuda_malloc)(void **, size_t);
static cudaError_t (*cuda_free)(void *);
static cudaError_t (*cuda_memcpy)(void *, const void *, size_t, enum cudaMemcpyKind);
static cudaError_t (*cuda_device_synchronize)(void);

/* ---- fixtures: every test leaves no tensor alive and no device memory in use ------------- */

static cti_alloc_stats start_stats;
static uint64_t start_gpu_allocated;

static uint64_t gpu_allocated(void) {
    ct_cuda_memstats m;
    return ct_cuda_memory_stats(0, &m) == CT_OK ? m.allocated : 0;
}

static int setup(void **state) {
    (void)state;
    ct_clear_error();
    start_stats = cti_get_alloc_stats();
    start_gpu_allocated = gpu_allocated();
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cti_alloc_stats s = cti_get_alloc_stats();
    uint64_t g = gpu_allocated();
    if (s.live_tensors != start_stats.live_tensors || s.live_storages != start_stats.live_storages ||
        g != start_gpu_allocated) {
        fprintf(stderr, "leak: tensors %lld -> %lld, storages %lld -> %lld, device bytes %llu -> %llu\n",
                (long long)start_stats.live_tensors, (long long)s.live_tensors,
                (long long)start_stats.live_storages, (long long)s.live_storages,
                (unsigned long long)start_gpu_allocated, (unsigned long long)g);
        return -1;
    }
    return 0;
}

/* ---- element access through the CUDA runtime -------------------------------------------- */

static int64_t dl_offset(const DLTensor *d, int64_t i) {
    int64_t off = 0;
    for (int k = d->ndim - 1; k >= 0; k--) {
        off += (i % d->shape[k]) * d->strides[k];
        i /= d->shape[k];
    }
    return off;
}

/* Row-major element i of d, read from the device, as a double. */
static double dev_get(const DLTensor *d, ct_dtype dt, int64_t i) {
    unsigned char b[8];
    size_t es = ct_dtype_size(dt);
    const char *p = (const char *)d->data + d->byte_offset + dl_offset(d, i) * (int64_t)es;
    assert_int_equal(cuda_memcpy(b, p, es, cudaMemcpyDeviceToHost), cudaSuccess);
    double v;
    tu_unpack(b, 1, dt, &v);
    return v;
}

static void dev_set(const DLTensor *d, ct_dtype dt, int64_t i, double v) {
    unsigned char b[8];
    size_t es = ct_dtype_size(dt);
    tu_pack(&v, 1, dt, b);
    char *p = (char *)d->data + d->byte_offset + dl_offset(d, i) * (int64_t)es;
    assert_int_equal(cuda_memcpy(p, b, es, cudaMemcpyHostToDevice), cudaSuccess);
    /* cudaMemcpy from pageable memory returns once the bytes are staged; the
     * DMA may still be under way when cten's stream (which does not wait for
     * the legacy stream) reads them back. */
    assert_int_equal(cuda_device_synchronize(), cudaSuccess);
}

/* Same elements through both sides, then a write each way. */
static void expect_shared(const DLTensor *d, ct_tensor *t) {
    ct_dtype dt = ct_tensor_dtype(t);
    int64_t n = ct_tensor_numel(t);
    double *tv = tu_values(t);
    for (int64_t i = 0; i < n; i++) assert_true(dev_get(d, dt, i) == tv[i]);
    free(tv);
    if (n == 0) return;
    int64_t i = tu_randint(0, n);
    double v = dt == CT_BOOL ? 1 - dev_get(d, dt, i) : tu_round(tu_uniform(-9, 9), dt);
    dev_set(d, dt, i, v);
    tv = tu_values(t);
    assert_true(tv[i] == v);
    free(tv);
    ok(ct_fill_(t, 1));
    ok(ct_cuda_synchronize(0));
    assert_true(dev_get(d, dt, n - 1) == 1);
}

/* ---- export -------------------------------------------------------------------------------- */

static void test_export(void **state) {
    (void)state;
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        ct_tensor *c = tu_rand(CT_SHAPE(4, 6, 5), dt, -20, 20, NULL);
        ct_tensor *g = checked(ct_to_device(c, CT_CUDA(0)));
        ct_tensor *views[] = {ct_tensor_retain(g), checked(ct_transpose(g, 0, 2)),
                              checked(ct_narrow(g, 1, 2, 3)), checked(ct_slice(g, 2, 1, 5, 3)),
                              checked(ct_tensor_scalar(1, dt, CT_CUDA(0)))};
        for (size_t v = 0; v < sizeof views / sizeof views[0]; v++) {
            DLManagedTensor *m = ct_to_dlpack(views[v]);
            assert_non_null(m);
            DLTensor *d = &m->dl_tensor;
            assert_int_equal(d->device.device_type, kDLCUDA);
            assert_int_equal(d->device.device_id, 0);
            assert_ptr_equal(d->data, ct_tensor_data_ptr(views[v]));
            assert_int_equal(d->byte_offset, 0);
            for (int i = 0; i < d->ndim; i++)
                assert_int_equal(d->strides[i], ct_tensor_strides(views[v])[i]);
            expect_shared(d, views[v]);
            /* With every handle gone, the device memory stays the consumer's. */
            uint64_t held = gpu_allocated();
            ct_tensor_release(views[v]);
            if (v == sizeof views / sizeof views[0] - 1) assert_int_equal(gpu_allocated(), held);
            (void)dev_get(d, dt, 0);
            m->deleter(m);
        }
        ct_tensor_release(g);
        ct_tensor_release(c);
    }
}

/* ---- import -------------------------------------------------------------------------------- */

static int deleted;

typedef struct producer {
    DLManagedTensor m;
    int64_t shape[2], strides[2];
} producer;

static void producer_delete(DLManagedTensor *self) {
    deleted++;
    assert_int_equal(cuda_free(self->dl_tensor.data), cudaSuccess);
    free(self->manager_ctx);
}

static void test_import(void **state) {
    (void)state;
    deleted = 0;
    /* [3, 4] float32 every other column of a [3, 8] buffer, one float in. */
    float host[24];
    for (int i = 0; i < 24; i++) host[i] = (float)i;
    void *buf;
    assert_int_equal(cuda_malloc(&buf, sizeof host), cudaSuccess);
    assert_int_equal(cuda_memcpy(buf, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    producer *p = calloc(1, sizeof *p);
    p->shape[0] = 3;
    p->shape[1] = 4;
    p->strides[0] = 8;
    p->strides[1] = 2;
    p->m.dl_tensor = (DLTensor){.data = buf, .device = {kDLCUDA, 0}, .ndim = 2,
                                .dtype = {kDLFloat, 32, 1}, .shape = p->shape,
                                .strides = p->strides, .byte_offset = 4};
    p->m.manager_ctx = p;
    p->m.deleter = producer_delete;
    ct_tensor *t = checked(ct_from_dlpack(&p->m));
    assert_int_equal(ct_tensor_device(t).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_device(t).index, 0);
    double *v = tu_values(t);
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 4; c++) assert_true(v[4 * r + c] == 8 * r + 2 * c + 1);
    free(v);
    expect_shared(&p->m.dl_tensor, t);
    /* An op on it, and a view that outlives the handle. */
    ct_tensor *sum = checked(ct_sum(t, CT_NONE, false));
    double s;
    ok(ct_tensor_item(sum, &s));
    assert_true(s == 12);
    ct_tensor *row = checked(ct_select(t, 0, 1));
    ct_tensor_release(t);
    assert_int_equal(deleted, 0);
    ct_tensor_release(row);
    assert_int_equal(deleted, 1);
    ct_tensor_release(sum);
}

static void test_import_errors(void **state) {
    (void)state;
    deleted = 0;
    int64_t shape[1] = {4};
    DLManagedTensor m = {.dl_tensor = {.data = (void *)(uintptr_t)256, .device = {kDLCUDA, ngpu},
                                       .ndim = 1, .dtype = {kDLFloat, 32, 1}, .shape = shape}};
    tu_assert_null_error(ct_from_dlpack(&m), CT_ERR_DEVICE, "ct_from_dlpack",
                         "the tensor is on CUDA device");
    m.dl_tensor.device = (DLDevice){kDLROCM, 0};
    tu_assert_null_error(ct_from_dlpack(&m), CT_ERR_DEVICE, "kDLROCM");
    assert_int_equal(deleted, 0);
}

/* cten's own CUDA exports come back as they left. */
static void test_roundtrip(void **state) {
    (void)state;
    ct_tensor *c = tu_rand(CT_SHAPE(5, 3), CT_BOOL, 0, 2, NULL);
    ct_tensor *g = checked(ct_to_device(c, CT_CUDA(0)));
    ct_tensor *u = checked(ct_from_dlpack(ct_to_dlpack(g)));
    assert_int_equal(ct_tensor_dtype(u), CT_BOOL);
    assert_int_equal(ct_tensor_device(u).type, CT_DEVICE_CUDA);
    assert_ptr_equal(ct_tensor_data_ptr(u), ct_tensor_data_ptr(g));
    double *a = tu_values(u), *b = tu_values(c);
    tu_assert_close(a, b, 15, 0, 0);
    free(a);
    free(b);
    ct_tensor_release(g);
    ct_tensor_release(u);
    ct_tensor_release(c);
}

int main(void) {
    tu_seed();
    cti_init();
    ngpu = tu_cuda_devices_or_skip("cuda_dlpack");
    cuda_malloc = tu_cuda_symbol("cudaMalloc");
    cuda_free = tu_cuda_symbol("cudaFree");
    cuda_memcpy = tu_cuda_symbol("cudaMemcpy");
    cuda_device_synchronize = tu_cuda_symbol("cudaDeviceSynchronize");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_export), T(test_import), T(test_import_errors), T(test_roundtrip),
    };
#undef T
    return tu_run_tests(tests);
}
