/* The CUDA backend's foundation: devices and properties, transfers between
 * host and device in every dtype and layout, conversion and fill on the
 * device against the CPU backend, strided copies in wide units, linear's
 * bias through cuBLASLt's epilogue, the caching allocator (reuse,
 * statistics, out-of-memory, empty cache) and the device checks of the
 * front ends.
 *
 * The program runs only where the CUDA module loaded and a device is
 * usable, and is skipped otherwise; test_module.c checks the messages a
 * build with CUDA gives on a machine without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <cuda_runtime_api.h>

#include "cuda_module.h"
#include "cuda_test_util.h"
#include "test_util.h"

#include "core/tensor_impl.h"

static int ngpu;

#define NEED_GPU()                 \
    do {                           \
        if (ngpu == 0) skip();     \
    } while (0)

/* ---- fixtures: every test leaves no tensor alive and no device memory in use ------------- */

static cti_alloc_stats start_stats;
static uint64_t start_gpu_allocated;

static uint64_t gpu_allocated(void) {
    ct_cuda_memstats m;
    return ngpu > 0 && ct_cuda_memory_stats(0, &m) == CT_OK ? m.allocated : 0;
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

/* ---- helpers ---------------------------------------------------------------------------------- */

static ct_tensor *to_gpu(ct_tensor *t, int dev) {
    ct_tensor *g = checked(ct_to_device(t, CT_CUDA(dev)));
    assert_int_equal(ct_tensor_device(g).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_device(g).index, dev);
    return g;
}

static ct_tensor *to_cpu(ct_tensor *t) {
    ct_tensor *c = checked(ct_to_device(t, CT_CPU));
    assert_int_equal(ct_tensor_device(c).type, CT_DEVICE_CPU);
    return c;
}

/* t's elements in row-major order, as bytes (caller frees). */
static unsigned char *bytes_of(const ct_tensor *t, size_t *n) {
    *n = (size_t)ct_tensor_numel(t) * ct_dtype_size(ct_tensor_dtype(t));
    unsigned char *b = malloc(*n ? *n : 1);
    ok(ct_tensor_copy_to_host(t, b, *n));
    return b;
}

/* Same shape, dtype and bits. */
static void assert_identical(const ct_tensor *got, const ct_tensor *want) {
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(want));
    assert_int_equal(ct_tensor_ndim(got), ct_tensor_ndim(want));
    for (int d = 0; d < ct_tensor_ndim(got); d++)
        assert_int_equal(ct_tensor_shape(got)[d], ct_tensor_shape(want)[d]);
    size_t ng, nw;
    unsigned char *g = bytes_of(got, &ng), *w = bytes_of(want, &nw);
    assert_int_equal(ng, nw);
    size_t es = ct_dtype_size(ct_tensor_dtype(got));
    for (size_t i = 0; i < ng; i++) {
        if (g[i] == w[i]) continue;
        double vg, vw;
        tu_unpack(g + i / es * es, 1, ct_tensor_dtype(got), &vg);
        tu_unpack(w + i / es * es, 1, ct_tensor_dtype(got), &vw);
        fprintf(stderr, "%s element %zu differs: got %.17g, want %.17g\n",
                ct_dtype_name(ct_tensor_dtype(got)), i / es, vg, vw);
        fail();
    }
    free(g);
    free(w);
}

/* Values that stress conversions: NaN, infinities, signed zero, halfway
 * cases, f16 and f32 overflow and subnormals, integer limits. */
static const double specials[] = {
    NAN, -NAN, INFINITY, -INFINITY, 0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 2.4999, 65504.0, 65520.0,
    70000.0, 1e-8, 6e-8, -3e-5, 3e38, 1e39, 1e10, -1e10, 2147483647.0, 2147483648.0,
    -2147483649.0, 9.3e18, -9.3e18, 4294967297.0, 123456789.0, 16777217.0, 1.00048828125};

/* n elements of dtype: the specials (floating) or integer limits first,
 * then random values over a wide range. Caller frees. */
static void *conversion_source(ct_dtype dt, int64_t n) {
    void *buf = malloc((size_t)n * 8);
    int nspec = (int)(sizeof specials / sizeof specials[0]);
    for (int64_t i = 0; i < n; i++) {
        double v = i < nspec ? specials[i]
                   : (i & 3) == 0 ? tu_uniform(-3e9, 3e9)
                                  : tu_uniform(-300, 300);
        uint64_t r = tu_next();
        switch (dt) {
        case CT_BOOL: ((uint8_t *)buf)[i] = (uint8_t)(r & 1); break;
        case CT_I32:
            ((int32_t *)buf)[i] = i == 0 ? INT32_MIN : i == 1 ? INT32_MAX
                                  : (i & 1)  ? (int32_t)(uint32_t)r
                                             : (int32_t)(r % 601) - 300;
            break;
        case CT_I64:
            ((int64_t *)buf)[i] = i == 0 ? INT64_MIN : i == 1 ? INT64_MAX
                                  : i == 2 ? ((int64_t)1 << 53) + 1
                                  : (i & 1) ? (int64_t)r
                                            : (int64_t)(r % 601) - 300;
            break;
        case CT_F16: ((uint16_t *)buf)[i] = ct_f32_to_f16((float)v); break;
        case CT_BF16: ((uint16_t *)buf)[i] = ct_f32_to_bf16((float)v); break;
        case CT_F32: ((float *)buf)[i] = (float)v; break;
        default: ((double *)buf)[i] = v; break;
        }
    }
    return buf;
}

/* ---- settings ----------------------------------------------------------------------------------- */

static void test_tf32_switch(void **state) {
    (void)state;
    assert_false(ct_allow_tf32());
    ct_set_allow_tf32(true);
    assert_true(ct_allow_tf32());
    ct_set_allow_tf32(false);
    assert_false(ct_allow_tf32());
}

/* The limit of the direct convolution kernels: 2^26 multiply-adds by
 * default; setting returns the previous value, a negative value only reads;
 * the CUDA module reads the same setting (its test name for it). */
static void test_conv_direct_limit(void **state) {
    (void)state;
    int64_t (*module_limit)(int64_t) = tu_cuda_symbol("cti_cuda_conv_direct_limit");
    assert_non_null(module_limit);
    assert_int_equal(ct_cuda_conv_direct_limit(-1), (int64_t)1 << 26);
    assert_int_equal(ct_cuda_conv_direct_limit(0), (int64_t)1 << 26);
    assert_int_equal(ct_cuda_conv_direct_limit(-5), 0);
    assert_int_equal(module_limit(-1), 0);
    assert_int_equal(module_limit(12345), 0);
    assert_int_equal(ct_cuda_conv_direct_limit((int64_t)1 << 26), 12345);
    assert_int_equal(module_limit(-1), (int64_t)1 << 26);
}

/* ---- devices ----------------------------------------------------------------------------------- */

static void test_properties(void **state) {
    (void)state;
    NEED_GPU();
    assert_true(ct_cuda_available());
    assert_int_equal(ct_cuda_device_count(), ngpu);
    for (int i = 0; i < ngpu; i++) {
        ct_cuda_device_props p;
        ok(ct_cuda_get_device_properties(i, &p));
        assert_true(strlen(p.name) > 0);
        assert_true(p.major >= 1);
        assert_true(p.multiprocessors > 0);
        assert_true(p.total_memory > ((size_t)1 << 28));
        assert_true(p.l2_cache_bytes > 0);
        assert_int_equal(p.warp_size, 32);
        assert_true(p.runtime_version >= 12000);
        assert_true(p.driver_version >= p.runtime_version);
        assert_true(p.cublas_version >= 10000);
        assert_true(p.cudnn_version >= 10000);
    }
    ct_cuda_device_props p;
    tu_assert_error(ct_cuda_get_device_properties(ngpu, &p), CT_ERR_DEVICE, "cuda:", "present");
    tu_assert_error(ct_cuda_get_device_properties(-1, &p), CT_ERR_DEVICE, "cuda:-1");
    tu_assert_error(ct_cuda_get_device_properties(0, NULL), CT_ERR_INVALID_ARG, "NULL");
    /* The stack description names every GPU. */
    FILE *f = tmpfile();
    assert_non_null(f);
    ct_print_info(f);
    rewind(f);
    char text[8192];
    size_t n = fread(text, 1, sizeof text - 1, f);
    text[n] = 0;
    fclose(f);
    ok(ct_cuda_get_device_properties(0, &p));
    assert_non_null(strstr(text, "cuda:0"));
    assert_non_null(strstr(text, p.name));
    assert_non_null(strstr(text, "cuDNN"));
}

/* A GPU tensor prints as its CPU copy does, with its device. */
static void test_print_gpu(void **state) {
    (void)state;
    NEED_GPU();
    double v[6] = {0.5, -1, 2.25, 3, 1e3, -7};
    ct_tensor *c = ct_tensor_from_data(v, CT_F64, CT_SHAPE(2, 3));
    ct_tensor *g = ct_to_device(c, CT_CUDA(0));
    assert_non_null(g);
    char a[512], b[512];
    assert_true(ct_tensor_str(c, a, sizeof a) > 0);
    assert_true(ct_tensor_str(g, b, sizeof b) > 0);
    char *da = strstr(a, "device=cpu)"), *db = strstr(b, "device=cuda:0)");
    assert_non_null(da);
    assert_non_null(db);
    assert_int_equal(da - a, db - b);
    assert_memory_equal(a, b, (size_t)(da - a));
    ct_tensor_release(g);
    ct_tensor_release(c);
}

static void test_invalid_index(void **state) {
    (void)state;
    NEED_GPU();
    char want[32];
    snprintf(want, sizeof want, "cuda:%d", ngpu);
    tu_assert_null_error(ct_tensor_zeros(CT_SHAPE(3), CT_F32, CT_CUDA(ngpu)), CT_ERR_DEVICE,
                         "ct_tensor_zeros", want, "not available");
    ct_tensor *c = checked(tu_rand(CT_SHAPE(3), CT_F32, -1, 1, NULL));
    tu_assert_null_error(ct_to_device(c, CT_CUDA(7 < ngpu ? 64 : 7)), CT_ERR_DEVICE,
                         "ct_to_device", "not available");
    tu_assert_null_error(ct_to_device(c, CT_CUDA(-1)), CT_ERR_DEVICE, "cuda:-1");
    tu_assert_error(ct_cuda_synchronize(ngpu), CT_ERR_DEVICE, "ct_cuda_synchronize", want);
    tu_assert_error(ct_cuda_empty_cache(ngpu), CT_ERR_DEVICE, "ct_cuda_empty_cache", want);
    tu_assert_null_error(ct_cuda_stream(ngpu), CT_ERR_DEVICE, "ct_cuda_stream", want);
    tu_assert_null_error(ct_cuda_stream(-1), CT_ERR_DEVICE, "ct_cuda_stream");
    ct_tensor_release(c);
}

/* The public stream is the one ops queue on: an event recorded on it after
 * an op completes only once the op's result is there. */
static void test_public_stream(void **state) {
    (void)state;
    NEED_GPU();
    void *s = ct_cuda_stream(0);
    assert_non_null(s);
    assert_ptr_equal(s, ct_cuda_stream(0));
    ct_tensor *x = checked(ct_tensor_full(CT_SHAPE(1 << 20), 2.0, CT_F32, CT_CUDA(0)));
    ct_tensor *y = checked(ct_mul(x, x));
    cudaError_t (*stream_synchronize)(cudaStream_t) = tu_cuda_symbol("cudaStreamSynchronize");
    assert_int_equal(stream_synchronize((cudaStream_t)s), cudaSuccess);
    double v;
    ct_tensor *last = checked(ct_select(y, 0, (1 << 20) - 1));
    assert_int_equal(ct_tensor_item(last, &v), CT_OK);
    assert_true(v == 4.0);
    ct_tensor_release(last);
    ct_tensor_release(y);
    ct_tensor_release(x);
}

static void test_mixed_devices(void **state) {
    (void)state;
    NEED_GPU();
    ct_tensor *a = checked(tu_rand(CT_SHAPE(2, 3), CT_F32, -1, 1, NULL));
    ct_tensor *g = to_gpu(a, 0);
    tu_assert_null_error(ct_add(a, g), CT_ERR_DEVICE, "ct_add", "cpu", "cuda:0");
    tu_assert_null_error(ct_add(g, a), CT_ERR_DEVICE, "ct_add", "cuda:0", "cpu");
    ct_tensor *b = checked(tu_rand(CT_SHAPE(3, 2), CT_F32, -1, 1, NULL));
    tu_assert_null_error(ct_matmul(g, b), CT_ERR_DEVICE, "ct_matmul", "cuda:0", "cpu");
    ct_tensor_release(b);
    ct_tensor_release(g);
    ct_tensor_release(a);
}

/* An op without a CUDA kernel says so by name; one with a kernel matches the CPU. */
static void test_add_kernel_or_message(void **state) {
    (void)state;
    NEED_GPU();
    double *va, *vb;
    ct_tensor *a = checked(tu_rand(CT_SHAPE(5, 7), CT_F32, -2, 2, &va));
    ct_tensor *b = checked(tu_rand(CT_SHAPE(7), CT_F32, -2, 2, &vb));
    ct_tensor *ga = to_gpu(a, 0), *gb = to_gpu(b, 0);
    ct_tensor *r = ct_add(ga, gb);
    if (!ct_supports(CT_OP_ADD, CT_DEVICE_CUDA, CT_F32)) {
        tu_assert_null_error(r, CT_ERR_UNSUPPORTED, "add", "cuda:0", "float32");
    } else {
        checked(r);
        double *got = tu_values(r), ref[35];
        for (int i = 0; i < 35; i++) ref[i] = (double)((float)va[i] + (float)vb[i % 7]);
        tu_assert_close(got, ref, 35, 0, 0);
        free(got);
        ct_tensor_release(r);
    }
    free(va);
    free(vb);
    ct_tensor_release(ga);
    ct_tensor_release(gb);
    ct_tensor_release(a);
    ct_tensor_release(b);
}

/* ---- transfers ----------------------------------------------------------------------------------- */

/* Host -> device -> host is the identity, bit for bit, in every dtype and
 * size: empty, scalar, small, and large enough for the staged path (several
 * 4 MiB chunks and a partial one). */
static void test_roundtrip_every_dtype(void **state) {
    (void)state;
    NEED_GPU();
    const int64_t sizes[] = {0, 1, 7, 4099, (1 << 20) + 3, (3 << 20) + 17};
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
            void *src = conversion_source(dt, sizes[s] > 0 ? sizes[s] : 1);
            ct_tensor *c = checked(ct_tensor_from_data(src, dt, 1, &sizes[s]));
            ct_tensor *g = to_gpu(c, 0), *back = to_cpu(g);
            assert_identical(back, c);
            /* from_data_on and copy_to_host take the direct routes. */
            ct_tensor *g2 = checked(ct_tensor_from_data_on(src, dt, 1, &sizes[s], CT_CUDA(0)));
            size_t n;
            unsigned char *host = bytes_of(g2, &n);
            if (n) assert_memory_equal(host, src, n);
            free(host);
            free(src);
            ct_tensor_release(g2);
            ct_tensor_release(back);
            ct_tensor_release(g);
            ct_tensor_release(c);
        }
        /* A 0-d tensor. */
        ct_tensor *s0 = checked(ct_tensor_scalar(3.0, dt, CT_CPU));
        ct_tensor *g0 = to_gpu(s0, 0), *b0 = to_cpu(g0);
        assert_int_equal(ct_tensor_ndim(g0), 0);
        assert_identical(b0, s0);
        double v;
        ok(ct_tensor_item(g0, &v));
        assert_true(v == (dt == CT_BOOL ? 1.0 : 3.0));
        ct_tensor_release(b0);
        ct_tensor_release(g0);
        ct_tensor_release(s0);
    }
}

/* Non-contiguous sources and destinations on either side. */
static void test_noncontiguous_transfers(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        ct_scope *sc = ct_scope_begin();
        ct_tensor *c = checked(tu_rand(CT_SHAPE(3, 40, 33), dt, -100, 100, NULL));
        /* CPU strided source -> device. */
        ct_tensor *nc = checked(tu_noncontig(c));
        assert_false(ct_tensor_is_contiguous(nc));
        assert_identical(to_cpu(to_gpu(nc, 0)), c);
        /* Device strided source -> host: a permuted and a sliced view. */
        ct_tensor *g = to_gpu(c, 0);
        ct_tensor *gp = checked(ct_permute(g, CT_DIMS(2, 0, 1)));
        ct_tensor *cp = checked(ct_permute(c, CT_DIMS(2, 0, 1)));
        assert_identical(to_cpu(gp), cp);
        ct_tensor *gs = checked(ct_slice(g, 2, 1, 33, 3)), *cs = checked(ct_slice(c, 2, 1, 33, 3));
        assert_identical(to_cpu(gs), cs);
        /* Into strided destinations: a device view from the host, a host
         * view from the device. */
        ct_tensor *gz = checked(ct_tensor_zeros(CT_SHAPE(33, 3, 40), dt, CT_CUDA(0)));
        ct_tensor *gzv = checked(ct_permute(gz, CT_DIMS(1, 2, 0)));
        ok(ct_copy_(gzv, c));
        assert_identical(to_cpu(gzv), c);
        ct_tensor *hz = checked(ct_tensor_zeros(CT_SHAPE(33, 3, 40), dt, CT_CPU));
        ct_tensor *hzv = checked(ct_permute(hz, CT_DIMS(1, 2, 0)));
        ok(ct_copy_(hzv, g));
        assert_identical(hzv, c);
        /* Large permuted copy down (staged path through a host temporary). */
        ct_tensor *big = checked(tu_rand(CT_SHAPE(700, 1100), dt, -100, 100, NULL));
        ct_tensor *gbig = to_gpu(big, 0);
        ct_tensor *hb = checked(ct_tensor_empty(CT_SHAPE(1100, 700), dt, CT_CPU));
        ok(ct_copy_(checked(ct_t(hb)), gbig));
        assert_identical(hb, checked(ct_contiguous(checked(ct_t(big)))));
        ct_scope_end(sc);
    }
}

/* Broadcasting sources in every direction. */
static void test_broadcast_copies(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    double *v;
    ct_tensor *row = checked(tu_rand(CT_SHAPE(5), CT_F64, -3, 3, &v));
    ct_tensor *col = checked(tu_rand(CT_SHAPE(4, 1), CT_F32, -3, 3, NULL));
    ct_tensor *want_row = checked(ct_contiguous(checked(ct_expand(row, CT_SHAPE(4, 5)))));
    /* host row -> device [4, 5] float64 */
    ct_tensor *g = checked(ct_tensor_empty(CT_SHAPE(4, 5), CT_F64, CT_CUDA(0)));
    ok(ct_copy_(g, row));
    assert_identical(to_cpu(g), want_row);
    /* device column -> device [3, 4, 5] float16 (broadcast and convert) */
    ct_tensor *gcol = to_gpu(col, 0);
    ct_tensor *g3 = checked(ct_tensor_empty(CT_SHAPE(3, 4, 5), CT_F16, CT_CUDA(0)));
    ok(ct_copy_(g3, gcol));
    ct_tensor *h3 = checked(ct_tensor_empty(CT_SHAPE(3, 4, 5), CT_F16, CT_CPU));
    ok(ct_copy_(h3, col));
    assert_identical(to_cpu(g3), h3);
    /* device [1, 5] -> host [4, 5] int32 */
    ct_tensor *g15 = to_gpu(checked(ct_reshape(row, CT_SHAPE(1, 5))), 0);
    ct_tensor *hi = checked(ct_tensor_empty(CT_SHAPE(4, 5), CT_I32, CT_CPU));
    ok(ct_copy_(hi, g15));
    ct_tensor *want_i = checked(ct_to_dtype(want_row, CT_I32));
    assert_identical(hi, want_i);
    /* a device scalar to a large device tensor */
    ct_tensor *gs = checked(ct_tensor_scalar(-1.25, CT_F32, CT_CUDA(0)));
    ct_tensor *gl = checked(ct_tensor_empty(CT_SHAPE(1000, 999), CT_BF16, CT_CUDA(0)));
    ok(ct_copy_(gl, gs));
    assert_identical(to_cpu(gl), checked(ct_tensor_full(CT_SHAPE(1000, 999), -1.25, CT_BF16, CT_CPU)));
    /* shape errors come from the front end, before any device work */
    ct_tensor *bad = checked(ct_tensor_empty(CT_SHAPE(4, 6), CT_F64, CT_CUDA(0)));
    tu_assert_error(ct_copy_(bad, row), CT_ERR_SHAPE, "ct_copy_", "broadcast");
    free(v);
    ct_scope_end(sc);
}

/* Device-to-device: clone, contiguous, copy_ between views; across GPUs
 * when there are two. */
static void test_device_to_device(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        ct_tensor *c = checked(tu_rand(CT_SHAPE(37, 65), dt, -50, 50, NULL));
        ct_tensor *g = to_gpu(c, 0);
        ct_tensor *clone = checked(ct_clone(g));
        assert_false(ct_tensor_shares_storage(clone, g));
        assert_identical(to_cpu(clone), c);
        ct_tensor *gt = checked(ct_contiguous(checked(ct_t(g))));
        assert_true(ct_tensor_is_contiguous(gt));
        assert_identical(to_cpu(gt), checked(ct_contiguous(checked(ct_t(c)))));
        ct_tensor *dst = checked(ct_tensor_zeros(CT_SHAPE(65, 37), dt, CT_CUDA(0)));
        ok(ct_copy_(dst, checked(ct_t(g))));
        assert_identical(to_cpu(dst), gt);
        if (ngpu >= 2) {
            ct_tensor *g1 = to_gpu(g, 1);
            assert_identical(to_cpu(g1), c);
            ct_tensor *g1t = checked(ct_to_device(checked(ct_t(g)), CT_CUDA(1)));
            assert_identical(to_cpu(g1t), gt);
            ct_tensor *d1 = checked(ct_tensor_zeros(CT_SHAPE(65, 37), CT_F64, CT_CUDA(1)));
            ok(ct_copy_(checked(ct_t(d1)), g));
            assert_identical(to_cpu(d1), checked(ct_to_dtype(gt, CT_F64)));
        }
    }
    /* Overlapping views of one device storage: shift a row by one. */
    ct_tensor *c = checked(tu_rand(CT_SHAPE(10), CT_F32, -5, 5, NULL));
    ct_tensor *g = to_gpu(c, 0);
    ok(ct_copy_(checked(ct_narrow(g, 0, 1, 9)), checked(ct_narrow(g, 0, 0, 9))));
    ct_tensor *want = checked(ct_clone(c));
    ok(ct_copy_(checked(ct_narrow(want, 0, 1, 9)), checked(ct_narrow(c, 0, 0, 9))));
    assert_identical(to_cpu(g), want);
    ct_scope_end(sc);
}

/* Same-dtype strided copies whose rows are runs of whole 16-, 8- or 4-byte
 * units move in those units: column slices read and written, a broadcast
 * row, the pieces of a cat; and misaligned slices that cannot. Every result
 * equals the CPU's bit for bit. */
static void test_widened_moves(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_scope *sc = ct_scope_begin();
        ct_dtype dt = tu_all_dtypes[k];
        ct_tensor *c = checked(tu_rand(CT_SHAPE(24, 96), dt, -50, 50, NULL));
        ct_tensor *g = to_gpu(c, 0);
        const int64_t cuts[][2] = {{16, 32}, {8, 8}, {4, 2}, {1, 32}, {3, 5}, {0, 96}};
        for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
            int64_t at = cuts[i][0], len = cuts[i][1];
            /* a column slice read into a contiguous tensor */
            ct_tensor *got = checked(ct_contiguous(checked(ct_narrow(g, 1, at, len))));
            assert_identical(to_cpu(got), checked(ct_contiguous(checked(ct_narrow(c, 1, at, len)))));
            /* and written into the columns of a wider tensor */
            ct_tensor *dst = checked(ct_tensor_zeros(CT_SHAPE(24, 160), dt, CT_CUDA(0)));
            ct_tensor *hd = checked(ct_tensor_zeros(CT_SHAPE(24, 160), dt, CT_CPU));
            ok(ct_copy_(checked(ct_narrow(dst, 1, 40 + at, len)), checked(ct_narrow(g, 1, at, len))));
            ok(ct_copy_(checked(ct_narrow(hd, 1, 40 + at, len)), checked(ct_narrow(c, 1, at, len))));
            assert_identical(to_cpu(dst), hd);
        }
        /* a row broadcast down 24 rows */
        ct_tensor *row = checked(ct_select(g, 0, 5));
        ct_tensor *rows = checked(ct_contiguous(checked(ct_expand(row, CT_SHAPE(24, 96)))));
        assert_identical(to_cpu(rows),
                         checked(ct_contiguous(checked(ct_expand(checked(ct_select(c, 0, 5)),
                                                                 CT_SHAPE(24, 96))))));
        /* the pieces of a cat along the rows' dim */
        ct_tensor *gp[3] = {checked(ct_narrow(g, 1, 0, 32)), checked(ct_narrow(g, 1, 32, 16)),
                            checked(ct_narrow(g, 1, 48, 48))};
        ct_tensor *cp[3] = {checked(ct_narrow(c, 1, 0, 32)), checked(ct_narrow(c, 1, 32, 16)),
                            checked(ct_narrow(c, 1, 48, 48))};
        ct_tensor *gcat = checked(ct_cat(3, (ct_tensor *[]){gp[2], gp[0], gp[1]}, 1));
        assert_identical(to_cpu(gcat), checked(ct_cat(3, (ct_tensor *[]){cp[2], cp[0], cp[1]}, 1)));
        ct_scope_end(sc);
    }
}

/* A [n, k] @ [k, m] + bias product in float64, from the rounded inputs. */
static double *affine_ref(const double *x, const double *w, const double *b, int64_t n, int64_t k,
                          int64_t m) {
    double *y = malloc(sizeof(double) * (size_t)(n * m + 1));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double acc = b[j];
            for (int64_t e = 0; e < k; e++) acc += x[i * k + e] * w[j * k + e];
            y[i * m + j] = acc;
        }
    return y;
}

static void run_linear_bias(ct_dtype dt, int64_t n, int64_t k, int64_t m, bool offset_bias) {
    ct_scope *sc = ct_scope_begin();
    double *x, *w, *b;
    ct_tensor *hx = checked(tu_rand(CT_SHAPE(n, k), dt, -1, 1, &x));
    ct_tensor *hw = checked(tu_rand(CT_SHAPE(m, k), dt, -1, 1, &w));
    ct_tensor *hb = checked(tu_rand(CT_SHAPE(m + 1), dt, -1, 1, &b));
    ct_tensor *gx = to_gpu(hx, 0), *gw = to_gpu(hw, 0);
    /* a bias one element into its storage is not 16-byte aligned */
    ct_tensor *gb = checked(ct_narrow(to_gpu(hb, 0), 0, offset_bias ? 1 : 0, m));
    double *want = affine_ref(x, w, b + (offset_bias ? 1 : 0), n, k, m);
    /* outputs land in blocks that held NaN */
    ct_tensor *nan = checked(ct_tensor_full(CT_SHAPE(n * m + 64), NAN, dt, CT_CUDA(0)));
    ct_tensor_release(nan);
    tu_trace tr = tu_trace_begin();
    ct_tensor *y = ct_linear(gx, gw, gb);
    char *trace = tu_trace_end(&tr);
    checked(y);
    ct_tensor *y2 = checked(ct_addmm(gb, gx, checked(ct_t(gw)), 1, 1));
    bool aligned = !offset_bias && (m * (int64_t)ct_dtype_size(dt)) % 16 == 0 &&
                   (k * (int64_t)ct_dtype_size(dt)) % 16 == 0;
    if (aligned != (strstr(trace, "bias epilogue") != NULL))
        fprintf(stderr, "%s %lldx%lldx%lld: trace %s\n", ct_dtype_name(dt), (long long)n,
                (long long)k, (long long)m, trace);
    assert_int_equal(aligned, strstr(trace, "bias epilogue") != NULL);
    free(trace);
    double tol = dt == CT_F32 ? (ct_allow_tf32() ? 2e-3 : 1e-5) : dt == CT_F16 ? 2e-3 : 1.6e-2;
    ct_tensor *ys[2] = {y, y2};
    for (int r = 0; r < 2; r++) {
        double *got = tu_values(ys[r]);
        for (int64_t i = 0; i < n * m; i++)
            if (!(fabs(got[i] - want[i]) <= tol * (2 + fabs(want[i])))) {
                fprintf(stderr, "%s %lldx%lldx%lld %s: element %lld got %.8g want %.8g\n",
                        ct_dtype_name(dt), (long long)n, (long long)k, (long long)m,
                        r ? "addmm" : "linear", (long long)i, got[i], want[i]);
                fail();
            }
        free(got);
    }
    free(x), free(w), free(b), free(want);
    ct_scope_end(sc);
}

/* ct_linear's bias added by cuBLASLt's epilogue where the layout allows,
 * by the GEMM's beta otherwise (a misaligned bias, rows of an odd byte
 * length), against float64; with TF32 on, too. */
static void test_linear_bias_epilogue(void **state) {
    (void)state;
    NEED_GPU();
    const ct_dtype dts[] = {CT_F32, CT_F16, CT_BF16};
    const int64_t shapes[][3] = {{64, 96, 128}, {3, 40, 24}, {1, 16, 8}, {130, 72, 200},
                                 {33, 47, 29}, {64, 8, 1}};
    for (size_t d = 0; d < 3; d++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            for (int off = 0; off < 2; off++)
                run_linear_bias(dts[d], shapes[i][0], shapes[i][1], shapes[i][2], off);
    ct_set_allow_tf32(true);
    run_linear_bias(CT_F32, 64, 96, 128, false);
    ct_set_allow_tf32(false);
}

/* Every (src, dst) dtype pair converted on the device equals the CPU's
 * conversion bit for bit: contiguous (vectorized), misaligned contiguous,
 * and strided sources. */
static void test_conversion_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
    const int64_t n = 40961;
    for (size_t s = 0; s < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; s++) {
        ct_dtype sd = tu_all_dtypes[s];
        void *buf = conversion_source(sd, n);
        ct_scope *sc = ct_scope_begin();
        ct_tensor *c = checked(ct_tensor_from_data(buf, sd, 1, &n));
        ct_tensor *g = to_gpu(c, 0);
        ct_tensor *c2 = checked(ct_reshape(checked(ct_narrow(c, 0, 0, 40960)), CT_SHAPE(160, 256)));
        ct_tensor *g2 = checked(ct_reshape(checked(ct_narrow(g, 0, 0, 40960)), CT_SHAPE(160, 256)));
        for (size_t d = 0; d < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; d++) {
            ct_dtype dd = tu_all_dtypes[d];
            assert_identical(to_cpu(checked(ct_to_dtype(g, dd))), checked(ct_to_dtype(c, dd)));
            ct_tensor *gm = checked(ct_narrow(g, 0, 1, n - 2)), *cm = checked(ct_narrow(c, 0, 1, n - 2));
            assert_identical(to_cpu(checked(ct_to_dtype(gm, dd))), checked(ct_to_dtype(cm, dd)));
            assert_identical(to_cpu(checked(ct_to_dtype(checked(ct_t(g2)), dd))),
                             checked(ct_to_dtype(checked(ct_t(c2)), dd)));
        }
        ct_scope_end(sc);
        free(buf);
    }
}

/* ---- fill ------------------------------------------------------------------------------------------ */

static void test_fill(void **state) {
    (void)state;
    NEED_GPU();
    const double values[] = {0.0, 1.0, -3.75, 1e10, -1e10, NAN, 65504.0, 0.1, tu_uniform(-9, 9)};
    for (size_t k = 0; k < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; k++) {
        ct_dtype dt = tu_all_dtypes[k];
        for (size_t v = 0; v < sizeof values / sizeof values[0]; v++) {
            double x = values[v];
            ct_scope *sc = ct_scope_begin();
            ct_tensor *want = ct_tensor_full(CT_SHAPE(1000003), x, dt, CT_CPU);
            ct_tensor *got = ct_tensor_full(CT_SHAPE(1000003), x, dt, CT_CUDA(0));
            if (!want) { /* a value the dtype cannot hold: the same refusal on both */
                assert_null(got);
                tu_assert_error(ct_last_status(), CT_ERR_INVALID_ARG, "overflow");
                ct_scope_end(sc);
                continue;
            }
            assert_identical(to_cpu(checked(got)), want);
            /* Misaligned start (head elements before the 16-byte stores). */
            ct_tensor *gm = checked(ct_narrow(got, 0, 1, 1000001));
            ok(ct_fill_(gm, 1.0));
            ok(ct_fill_(checked(ct_narrow(want, 0, 1, 1000001)), 1.0));
            assert_identical(to_cpu(got), want);
            ct_scope_end(sc);
        }
    }
    /* A strided view: only its elements change. */
    ct_scope *sc = ct_scope_begin();
    ct_tensor *c = checked(tu_rand(CT_SHAPE(30, 41), CT_F32, -1, 1, NULL));
    ct_tensor *g = to_gpu(c, 0);
    ok(ct_fill_(checked(ct_slice(checked(ct_t(g)), 0, 2, 41, 5)), 7.5));
    ok(ct_fill_(checked(ct_slice(checked(ct_t(c)), 0, 2, 41, 5)), 7.5));
    assert_identical(to_cpu(g), c);
    ok(ct_zero_(g));
    assert_identical(to_cpu(g), checked(ct_tensor_zeros(CT_SHAPE(30, 41), CT_F32, CT_CPU)));
    /* ones, eye (a diagonal fill) */
    assert_identical(to_cpu(checked(ct_tensor_eye(37, 29, CT_BF16, CT_CUDA(0)))),
                     checked(ct_tensor_eye(37, 29, CT_BF16, CT_CPU)));
    assert_identical(to_cpu(checked(ct_tensor_ones(CT_SHAPE(3, 5), CT_I64, CT_CUDA(0)))),
                     checked(ct_tensor_ones(CT_SHAPE(3, 5), CT_I64, CT_CPU)));
    ct_scope_end(sc);
}

/* Work queued on the stream runs in order: a fill queued after a copy
 * does not leak into it, and a reused cached block is written only after
 * its previous reader ran. */
static void test_stream_order(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    const int64_t n = 1 << 22;
    ct_tensor *x = checked(ct_tensor_full(1, &n, 1.0, CT_F32, CT_CUDA(0)));
    ct_tensor *y = checked(ct_clone(x));
    ok(ct_fill_(x, 2.0));
    ct_tensor *z = checked(ct_clone(x));
    ct_tensor_release(x); /* its block goes back to the cache... */
    ct_tensor *w = checked(ct_tensor_full(1, &n, 3.0, CT_F32, CT_CUDA(0))); /* ...and is reused */
    assert_identical(to_cpu(y), checked(ct_tensor_full(1, &n, 1.0, CT_F32, CT_CPU)));
    assert_identical(to_cpu(z), checked(ct_tensor_full(1, &n, 2.0, CT_F32, CT_CPU)));
    assert_identical(to_cpu(w), checked(ct_tensor_full(1, &n, 3.0, CT_F32, CT_CPU)));
    ok(ct_cuda_synchronize(0));
    ct_scope_end(sc);
}

/* ---- the caching allocator ---------------------------------------------------------------------------- */

static ct_cuda_memstats stats(void) {
    ct_cuda_memstats m;
    ok(ct_cuda_memory_stats(0, &m));
    return m;
}

static bool caching_disabled(void) {
    const char *e = getenv("CT_CUDA_NO_CACHE");
    return e && *e && strcmp(e, "0") != 0;
}

static void test_allocator_reuse(void **state) {
    (void)state;
    NEED_GPU();
    if (caching_disabled()) skip();
    ok(ct_cuda_empty_cache(0));
    const int64_t sizes[] = {1, 1000, 300000, 5 << 20, 40 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ct_tensor *t = checked(ct_tensor_empty(1, &sizes[i], CT_F32, CT_CUDA(0)));
        ct_cuda_memstats a = stats();
        void *p = ct_tensor_data_ptr(t);
        ct_tensor_release(t);
        ct_tensor *u = checked(ct_tensor_empty(1, &sizes[i], CT_F32, CT_CUDA(0)));
        ct_cuda_memstats b = stats();
        assert_int_equal(b.num_mallocs, a.num_mallocs); /* served from the cache */
        assert_ptr_equal(ct_tensor_data_ptr(u), p);
        assert_int_equal(b.allocated, a.allocated);
        assert_int_equal(b.num_allocs, a.num_allocs + 1);
        ct_tensor_release(u);
    }
    /* A slightly smaller large request reuses a cached large block; a much
     * smaller one does not take it. */
    int64_t big = 64 << 20, near = 60 << 20, small = 8 << 20;
    ct_tensor *t = checked(ct_tensor_empty(1, &big, CT_BOOL, CT_CUDA(0)));
    ct_tensor_release(t);
    ct_cuda_memstats a = stats();
    t = checked(ct_tensor_empty(1, &near, CT_BOOL, CT_CUDA(0)));
    assert_int_equal(stats().num_mallocs, a.num_mallocs);
    ct_tensor_release(t);
    t = checked(ct_tensor_empty(1, &small, CT_BOOL, CT_CUDA(0)));
    assert_int_equal(stats().num_mallocs, a.num_mallocs + 1);
    ct_tensor_release(t);
    /* Empty tensors still get a valid (small) block. */
    int64_t zero = 0;
    t = checked(ct_tensor_empty(1, &zero, CT_F32, CT_CUDA(0)));
    assert_non_null(ct_tensor_data_ptr(t));
    ct_tensor_release(t);
}

static void test_memory_stats(void **state) {
    (void)state;
    NEED_GPU();
    ct_cuda_memstats a = stats();
    assert_true(a.reserved >= a.allocated);
    ok(ct_cuda_reset_peak_memory_stats(0));
    assert_int_equal(stats().peak_allocated, a.allocated);
    const int64_t n = 3 << 20; /* 12 MiB of float32 */
    ct_tensor *t = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ct_tensor *u = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ct_cuda_memstats b = stats();
    assert_true(b.allocated >= a.allocated + 2 * (uint64_t)n * 4);
    assert_true(b.allocated <= a.allocated + 2 * ((uint64_t)n * 4 + (2 << 20)));
    assert_true(b.reserved >= b.allocated);
    assert_int_equal(b.peak_allocated, b.allocated);
    assert_true(b.peak_reserved >= b.reserved);
    ct_tensor_release(u);
    ct_tensor_release(t);
    ct_cuda_memstats c = stats();
    assert_int_equal(c.allocated, a.allocated);
    assert_int_equal(c.peak_allocated, b.allocated);
    if (!caching_disabled()) assert_int_equal(c.reserved, b.reserved); /* kept for reuse */
    tu_assert_error(ct_cuda_memory_stats(0, NULL), CT_ERR_INVALID_ARG, "NULL");
    tu_assert_error(ct_cuda_memory_stats(ngpu, &c), CT_ERR_DEVICE, "cuda:");
}

static void test_out_of_memory(void **state) {
    (void)state;
    NEED_GPU();
    ct_cuda_device_props p;
    ok(ct_cuda_get_device_properties(0, &p));
    /* Something cached first: the failed request must give it back. */
    const int64_t m = 16 << 20;
    ct_tensor_release(checked(ct_tensor_empty(1, &m, CT_F32, CT_CUDA(0))));
    ct_cuda_memstats a = stats();
    int64_t n = (int64_t)(p.total_memory / 4) * 2; /* twice the device, as float32 */
    char bytes[32];
    snprintf(bytes, sizeof bytes, "%lld bytes", (long long)n * 4);
    tu_assert_null_error(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)), CT_ERR_OOM,
                         "ct_tensor_empty", "out of memory", bytes, "cuda:0");
    ct_cuda_memstats b = stats();
    assert_int_equal(b.num_ooms, a.num_ooms + 1);
    assert_int_equal(b.num_retries, a.num_retries + 1);
    assert_int_equal(b.reserved, b.allocated); /* the cache went back to the driver */
    assert_int_equal(b.allocated, a.allocated);
    /* The library still works on the device. */
    double *v;
    ct_tensor *c = checked(tu_rand(CT_SHAPE(1000), CT_F32, -1, 1, &v));
    ct_tensor *g = to_gpu(c, 0);
    ct_tensor *back = to_cpu(g);
    assert_identical(back, c);
    ok(ct_cuda_synchronize(0));
    free(v);
    ct_tensor_release(back);
    ct_tensor_release(g);
    ct_tensor_release(c);
}

static void test_empty_cache(void **state) {
    (void)state;
    NEED_GPU();
    const int64_t n = 5 << 20;
    ct_tensor *keep = checked(ct_tensor_zeros(1, &n, CT_F32, CT_CUDA(0)));
    ct_tensor_release(checked(ct_tensor_empty(1, &n, CT_F64, CT_CUDA(0))));
    ct_cuda_memstats a = stats();
    if (!caching_disabled()) assert_true(a.reserved > a.allocated);
    ok(ct_cuda_empty_cache(0));
    ct_cuda_memstats b = stats();
    assert_int_equal(b.reserved, b.allocated);
    assert_int_equal(b.allocated, a.allocated);
    if (!caching_disabled()) assert_true(b.num_frees > a.num_frees);
    /* Live tensors are untouched. */
    ct_scope *sc = ct_scope_begin();
    assert_identical(to_cpu(keep), checked(ct_tensor_zeros(1, &n, CT_F32, CT_CPU)));
    ct_scope_end(sc);
    ok(ct_cuda_empty_cache(-1));
    ct_tensor_release(keep);
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda");
    ct_clear_error();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_tf32_switch),
        T(test_conv_direct_limit),
        T(test_properties),           T(test_invalid_index),
        T(test_public_stream),
        T(test_mixed_devices),        T(test_add_kernel_or_message),
        T(test_roundtrip_every_dtype), T(test_noncontiguous_transfers),
        T(test_broadcast_copies),     T(test_device_to_device),
        T(test_widened_moves),        T(test_linear_bias_epilogue),
        T(test_conversion_matches_cpu), T(test_fill),
        T(test_stream_order),         T(test_allocator_reuse),
        T(test_memory_stats),         T(test_out_of_memory),
        T(test_empty_cache),          T(test_print_gpu),
    };
#undef T
    return tu_run_tests(tests);
}
