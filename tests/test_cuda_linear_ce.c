/* ct_linear_cross_entropy on CUDA against the CPU backend: the loss and the
 * gradients of x, weight and bias (through autograd, and the explicit
 * backward for reduction none) in every floating dtype, for every reduction,
 * ignore_index, label smoothing, bias or not, rows from 1 to 5003 classes
 * (each block size of the row kernel), chunks forced small and automatic,
 * non-contiguous x and weight; the row kernel on its own (loss and in-place
 * gradient); a target out of range (a recorded fault that the next wait
 * returns with the message); inputs on mixed devices; and the extra device
 * memory, which must stay below the [N, V] logits. Skips without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cuda_test_util.h"
#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

#include "dispatch/dispatch_impl.h"

/* Private test hook (src/ops/linear_ce.c): chunks of rows rows, 0 for automatic. */
void cti_linear_ce_set_chunk_rows(int64_t rows);

static int ngpu;

static ct_tensor *gpu(ct_tensor *t) { return checked(ct_to_device(t, CT_CUDA(0))); }

/* Fills freed device blocks of about bytes with NaN, so the outputs and the
 * workspace the caching allocator hands out next start as NaN. */
static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ok(ct_fill_(t, NAN));
    ct_tensor_release(t);
}

/* GPU against CPU: |g - c| <= rtol |c| + atol max(max|c|, 0.05). The CPU and
 * the GPU round the logits of a half the same way but sum in other orders. */
static void close_to(const char *what, ct_tensor *got, ct_tensor *ref, double rtol, double atol) {
    assert_non_null(got);
    assert_non_null(ref);
    assert_int_equal(ct_tensor_numel(got), ct_tensor_numel(ref));
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(ref));
    assert_int_equal(ct_tensor_ndim(got), ct_tensor_ndim(ref));
    assert_int_equal(ct_tensor_device(got).type, CT_DEVICE_CUDA);
    int64_t n = ct_tensor_numel(ref);
    double *g = tu_values(got), *c = tu_values(ref), mx = 0.05;
    for (int64_t i = 0; i < n; i++)
        if (isfinite(c[i])) mx = fmax(mx, fabs(c[i]));
    for (int64_t i = 0; i < n; i++) {
        bool okv = isnan(c[i]) ? isnan(g[i]) : fabs(g[i] - c[i]) <= rtol * fabs(c[i]) + atol * mx;
        if (!okv) {
            fprintf(stderr, "%s: element %lld of %lld: GPU %.17g, CPU %.17g\n", what, (long long)i,
                    (long long)n, g[i], c[i]);
            fail();
        }
    }
    free(g);
    free(c);
}

static void tol_of(ct_dtype dt, double *rtol, double *atol) {
    switch (dt) {
    case CT_F64: *rtol = 1e-10, *atol = 1e-12; break;
    case CT_F32: *rtol = 1e-4, *atol = 2e-5; break;
    case CT_F16: *rtol = 1e-2, *atol = 1e-2; break;
    default: *rtol = 4e-2, *atol = 4e-2; break;
    }
}

typedef struct pcase {
    int64_t n, d, v, chunk;
    bool bias, noncontig;
    ct_reduction red;
    int64_t ignore;
    double ls;
} pcase;

/* A leaf on dev with t's values (non-contiguous when nc). */
static ct_tensor *leaf_on(ct_tensor *t, ct_device dev, bool nc) {
    ct_tensor *m = checked(ct_to_device(t, dev));
    ct_tensor *l = nc ? tu_noncontig(m) : ct_clone(m);
    ct_tensor_release(m);
    checked(l);
    ok(ct_requires_grad_(l, true));
    return l;
}

static void run_parity(const pcase *k, ct_dtype dt) {
    ct_scope *sc = ct_scope_begin();
    double lo = ct_dtype_size(dt) == 2 ? -0.5 : -1.5;
    int64_t xs[2] = {k->n, k->d}, ws[2] = {k->v, k->d};
    ct_tensor *x = tu_rand(2, xs, dt, lo, -lo, NULL), *w = tu_rand(2, ws, dt, lo, -lo, NULL);
    ct_tensor *b = k->bias ? tu_rand(1, &k->v, dt, lo, -lo, NULL) : NULL;
    double *tv = malloc(sizeof(double) * (size_t)k->n);
    for (int64_t i = 0; i < k->n; i++)
        tv[i] = tu_uniform(0, 1) < 0.2 ? (double)k->ignore : (double)tu_randint(0, k->v);
    ct_tensor *t = tu_from_f64(tv, 1, &k->n, CT_I64), *gt = gpu(t);
    free(tv);
    ct_tensor *lx[2], *lw[2], *lb[2] = {NULL, NULL}, *loss[2];
    ct_device devs[2] = {CT_CPU, CT_CUDA(0)};
    int64_t nl = k->red == CT_REDUCTION_NONE ? k->n : 1;
    ct_tensor *go = tu_rand(k->red == CT_REDUCTION_NONE ? 1 : 0, &k->n, dt, -2, 2, NULL);
    ct_tensor *ggo = gpu(go);
    cti_linear_ce_set_chunk_rows(k->chunk);
    for (int i = 0; i < 2; i++) {
        lx[i] = leaf_on(x, devs[i], k->noncontig);
        lw[i] = leaf_on(w, devs[i], k->noncontig);
        if (b) lb[i] = leaf_on(b, devs[i], false);
        if (i == 1) poison(k->n * k->v * 8 + (1 << 20));
        loss[i] = checked(ct_linear_cross_entropy(lx[i], lw[i], lb[i], i ? gt : t, k->ignore,
                                                  k->ls, k->red));
        assert_int_equal(ct_tensor_numel(loss[i]), nl);
        ok(ct_backward(loss[i], i ? ggo : go, false));
    }
    double rtol, atol;
    tol_of(dt, &rtol, &atol);
    close_to("loss", loss[1], loss[0], rtol, atol);
    close_to("dx", ct_grad(lx[1]), ct_grad(lx[0]), rtol, atol);
    close_to("dweight", ct_grad(lw[1]), ct_grad(lw[0]), rtol, atol);
    if (b) close_to("dbias", ct_grad(lb[1]), ct_grad(lb[0]), rtol, atol);
    ok(ct_cuda_synchronize(0));
    cti_linear_ce_set_chunk_rows(0);
    ct_scope_end(sc);
}

static void test_parity(void **state) {
    (void)state;
    static const int64_t vs[] = {1, 3, 37, 200, 1500, 5003};
    static const int64_t chunks[] = {0, 1, 7};
    for (size_t di = 0; di < 4; di++)
        for (size_t vi = 0; vi < sizeof vs / sizeof vs[0]; vi++)
            for (int r = 0; r < 3; r++) {
                pcase k = {.n = tu_randint(1, 40), .d = tu_randint(1, 24), .v = vs[vi],
                           .chunk = chunks[tu_randint(0, 3)], .bias = tu_next() & 1,
                           .noncontig = tu_next() & 1, .red = (ct_reduction)r,
                           .ignore = tu_next() & 1 ? -100 : 0, .ls = r == 1 ? 0.1 : 0};
                run_parity(&k, tu_float_dtypes[di]);
            }
}

/* The row kernel alone: loss and in-place gradient, with a row scale, against the CPU's,
 * with 16-byte vectors when c is a multiple of a vector and element by element otherwise
 * (8191, 70001), from 1 class to 70001. */
static void test_row_kernel(void **state) {
    (void)state;
    static const int64_t cs[] = {1, 5, 130, 1100, 4500, 8191, 50304, 66000, 70001};
    for (size_t di = 0; di < 4; di++)
        for (size_t ci = 0; ci < sizeof cs / sizeof cs[0]; ci++) {
            ct_scope *sc = ct_scope_begin();
            ct_dtype dt = tu_float_dtypes[di];
            int64_t rows = 9, c = cs[ci], sh[2] = {rows, c};
            ct_tensor *z[2], *loss[2];
            z[0] = tu_rand(2, sh, dt, -8, 8, NULL);
            z[1] = gpu(z[0]);
            double tv[9];
            for (int i = 0; i < 9; i++) tv[i] = i == 4 ? 0 : (double)tu_randint(0, c);
            ct_tensor *t[2], *s[2];
            t[0] = tu_from_f64(tv, 1, &rows, CT_I64);
            t[1] = gpu(t[0]);
            s[0] = tu_rand(1, &rows, dt, -2, 2, NULL);
            s[1] = gpu(s[0]);
            ct_dtype ldt = dt == CT_F64 ? CT_F64 : CT_F32;
            for (int i = 0; i < 2; i++) {
                if (i) poison(rows * 8);
                loss[i] = checked(ct_tensor_empty(1, &rows, ldt, i ? CT_CUDA(0) : CT_CPU));
                cti_ce_fused_params p = {.rows = rows, .c = c, .ignore_index = 0,
                                         .label_smoothing = 0.2, .scale = 0.5, .grad = true};
                ct_call call;
                cti_call_init(&call, CT_OP_CROSS_ENTROPY_FUSED);
                cti_call_params(&call, &p);
                call.in[0] = z[i];
                call.in[1] = t[i];
                call.in[2] = s[i];
                call.nin = 3;
                call.out[0] = loss[i];
                call.nout = 1;
                ok(cti_dispatch(&call, i ? CT_CUDA(0) : CT_CPU, dt));
            }
            double rtol, atol;
            tol_of(dt, &rtol, &atol);
            close_to("row loss", loss[1], loss[0], rtol, atol);
            close_to("row gradient", z[1], z[0], rtol, atol);
            ct_scope_end(sc);
        }
}

/* A target out of range: the call queues, the next wait fails with the message. */
static void test_bad_target(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    int64_t xs[2] = {4, 3}, ws[2] = {5, 3}, n = 4, tv[4] = {0, 9, 1, 2};
    ct_tensor *x = checked(ct_tensor_ones(2, xs, CT_F32, CT_CUDA(0)));
    ct_tensor *w = checked(ct_tensor_ones(2, ws, CT_F32, CT_CUDA(0)));
    ct_tensor *t = gpu(ct_tensor_from_data(tv, CT_I64, 1, &n));
    ct_tensor *loss = ct_linear_cross_entropy(x, w, NULL, t, -100, 0, CT_REDUCTION_MEAN);
    ct_status st = loss ? ct_cuda_synchronize(0) : ct_last_status();
    tu_assert_error(st, CT_ERR_INDEX, "target 9 is out of bounds for 5 classes",
                    "ignore_index -100");
    ok(ct_cuda_synchronize(0)); /* reported once */
    ct_scope_end(sc);
}

static void test_mixed_devices(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    int64_t xs[2] = {4, 3}, ws[2] = {5, 3}, n = 4, v = 5;
    ct_tensor *x = checked(ct_tensor_ones(2, xs, CT_F32, CT_CUDA(0)));
    ct_tensor *w = checked(ct_tensor_ones(2, ws, CT_F32, CT_CPU));
    ct_tensor *gw = gpu(w);
    ct_tensor *b = checked(ct_tensor_ones(1, &v, CT_F32, CT_CPU));
    ct_tensor *t = checked(ct_tensor_zeros(1, &n, CT_I64, CT_CUDA(0)));
    ct_tensor *tc = checked(ct_tensor_zeros(1, &n, CT_I64, CT_CPU));
    tu_assert_null_error(ct_linear_cross_entropy(x, w, NULL, t, -100, 0, CT_REDUCTION_MEAN),
                         CT_ERR_DEVICE, "ct_linear_cross_entropy",
                         "expected all tensors on one device");
    tu_assert_null_error(ct_linear_cross_entropy(x, gw, b, t, -100, 0, CT_REDUCTION_MEAN),
                         CT_ERR_DEVICE, "ct_linear_cross_entropy", "one device");
    tu_assert_null_error(ct_linear_cross_entropy(x, gw, NULL, tc, -100, 0, CT_REDUCTION_SUM),
                         CT_ERR_DEVICE, "ct_linear_cross_entropy", "one device");
    ct_tensor *g = checked(ct_tensor_ones(0, NULL, CT_F32, CT_CPU)), *dx = NULL;
    tu_assert_error(ct_linear_cross_entropy_backward(g, x, gw, NULL, t, -100, 0,
                                                     CT_REDUCTION_SUM, &dx, NULL, NULL),
                    CT_ERR_DEVICE, "ct_linear_cross_entropy_backward", "one device");
    assert_null(dx);
    ct_scope_end(sc);
}

/* Forward + backward at N = 8192, V = 16384 (f32 logits: 512 MiB) must peak
 * well below the logits: the chunk workspace plus the gradients. */
static void test_memory_bound(void **state) {
    (void)state;
    /* What this measures is memory; its kernels are the other tests', at
     * sizes racecheck gets through (here it runs for hours). */
    if (tu_under_tool("racecheck")) skip();
    ct_scope *sc = ct_scope_begin();
    int64_t n = 8192, d = 128, v = 16384, xs[2] = {n, d}, ws[2] = {v, d};
    ct_tensor *x = checked(ct_tensor_randn(NULL, 2, xs, CT_F32, CT_CUDA(0)));
    ct_tensor *w = checked(ct_tensor_randn(NULL, 2, ws, CT_F32, CT_CUDA(0)));
    ct_tensor *t = checked(ct_tensor_randint(NULL, 0, v, 1, &n, CT_I64, CT_CUDA(0)));
    ok(ct_requires_grad_(x, true));
    ok(ct_requires_grad_(w, true));
    ok(ct_cuda_synchronize(0));
    ct_cuda_memstats m;
    ok(ct_cuda_memory_stats(0, &m));
    uint64_t base = m.allocated;
    ok(ct_cuda_reset_peak_memory_stats(0));
    ct_tensor *loss = checked(ct_linear_cross_entropy(x, w, NULL, t, -100, 0, CT_REDUCTION_MEAN));
    ok(ct_backward(loss, NULL, false));
    ok(ct_cuda_synchronize(0));
    ok(ct_cuda_memory_stats(0, &m));
    double extra = (double)(m.peak_allocated - base), logits = (double)(n * v * 4);
    fprintf(stderr, "[ memory   ] peak extra %.1f MiB, logits %.1f MiB\n", extra / (1 << 20),
            logits / (1 << 20));
    assert_true(extra < 0.5 * logits);
    double lv;
    ok(ct_tensor_item(loss, &lv));
    assert_true(isfinite(lv));
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
    cti_init();
    ngpu = tu_cuda_devices_or_skip("cuda_linear_ce");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_parity), T(test_row_kernel), T(test_bad_target), T(test_mixed_devices),
        T(test_memory_bound),
    };
#undef T
    return tu_run_tests(tests);
}
