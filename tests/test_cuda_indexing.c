/* The indexing ops on CUDA tensors against the CPU: gather, scatter_add,
 * index_select, masked_fill, repeat_interleave, split and chunk in every
 * dtype, on random shapes with odd and size-1 dims, contiguous and
 * non-contiguous (transposed, strided) inputs, into output memory poisoned
 * with NaN; results must equal the CPU's bit for bit (copies, and sums in
 * the same order). Out-of-range indices (positive, negative, int32, through
 * strides, several in one call) fail with the CPU's message and leave the
 * device usable; gradients on the GPU match the CPU's; mixed devices and
 * empty inputs. Skips without a GPU. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cuda_test_util.h"
#include "test_util.h"
#include "cuda_module.h"

#include "test_fixture.h"

static int ngpu;

#define NEED_GPU()             \
    do {                       \
        if (ngpu == 0) skip(); \
    } while (0)

static ct_tensor *chk(ct_tensor *t) { return checked(t); }
static ct_tensor *gpu(ct_tensor *t) { return checked(ct_to_device(t, CT_CUDA(0))); }

/* Fills freed device blocks of about `bytes` with NaN bits, so an output
 * the caching allocator hands out next from them starts poisoned. */
static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ok(ct_fill_(t, NAN));
    ct_tensor_release(t);
}

/* got (on the GPU) holds exactly ref's values, shape and dtype. */
static void check_identical(ct_tensor *got, ct_tensor *ref) {
    assert_non_null(got);
    assert_non_null(ref);
    assert_int_equal(ct_tensor_device(got).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(ref));
    int nd = ct_tensor_ndim(ref);
    assert_int_equal(ct_tensor_ndim(got), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(got)[d], ct_tensor_shape(ref)[d]);
    int64_t n = ct_tensor_numel(ref);
    double *r = tu_values(ref), *g = tu_values(got);
    tu_assert_close(g, r, n, 0, 0);
    free(r);
    free(g);
}

static void check_close(ct_tensor *got, ct_tensor *ref, double rtol) {
    assert_non_null(got);
    assert_non_null(ref);
    int64_t n = ct_tensor_numel(ref);
    assert_int_equal(ct_tensor_numel(got), n);
    double *r = tu_values(ref), *g = tu_values(got);
    tu_assert_close(g, r, n, rtol, rtol);
    free(r);
    free(g);
}

static void rand_shape(int nd, int64_t hi, int64_t *s) {
    for (int k = 0; k < nd; k++) s[k] = tu_next() % 4 == 0 ? 1 : tu_randint(1, hi + 1);
}

static ct_tensor *ints(const int64_t *vals, int nd, const int64_t *shape, ct_dtype dt) {
    int64_t n = tu_numel(nd, shape);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)vals[i];
    ct_tensor *t = tu_from_f64(v, nd, shape, dt);
    free(v);
    return chk(t);
}

static ct_tensor *rnd(int nd, const int64_t *s, ct_dtype dt) {
    bool f = ct_dtype_is_floating(dt);
    return chk(tu_rand(nd, s, dt, f ? -4 : -20, f ? 4 : 20, NULL));
}

/* The GPU copy of t, non-contiguous when nc. */
static ct_tensor *on_gpu(ct_tensor *t, bool nc) {
    ct_tensor *g = gpu(t);
    return nc ? chk(tu_noncontig(g)) : g;
}

/* ---- parity, every op and dtype ---------------------------------------------------------- */

static void parity_round(ct_dtype dt, int nd, bool nc) {
    int64_t xs[4], is[4], ss[4];
    rand_shape(nd, 7, xs);
    int dim = (int)tu_randint(0, nd);
    for (int k = 0; k < nd; k++) {
        is[k] = k == dim ? tu_randint(0, 12) : tu_randint(1, xs[k] + 1);
        ss[k] = is[k] + tu_randint(0, 2);
    }
    ct_tensor *x = rnd(nd, xs, dt), *gx = on_gpu(x, nc);
    ct_tensor *idx = chk(tu_rand(nd, is, CT_I64, 0, (double)xs[dim], NULL)), *gidx = on_gpu(idx, nc);
    ct_tensor *src = rnd(nd, ss, dt), *gsrc = on_gpu(src, nc);
    int64_t xbytes = tu_numel(nd, xs) * 8 * 4 + 64;

    poison(xbytes);
    check_identical(chk(ct_gather(gx, dim, gidx)), chk(ct_gather(x, dim, idx)));
    poison(xbytes);
    check_identical(chk(ct_scatter_add(gx, dim - nd, gidx, gsrc)),
                    chk(ct_scatter_add(x, dim, idx, src)));

    int64_t m = tu_randint(0, 14);
    for (int i32 = 0; i32 < 2; i32++) {
        ct_tensor *sel = chk(tu_rand(1, &m, i32 ? CT_I32 : CT_I64, 0, (double)xs[dim], NULL));
        poison(xbytes);
        check_identical(chk(ct_index_select(gx, dim, on_gpu(sel, nc))),
                        chk(ct_index_select(x, dim, sel)));
    }

    ct_tensor *mask = chk(tu_rand(1, &xs[nd - 1], CT_BOOL, 0, 1, NULL));
    double value = ct_dtype_is_floating(dt) ? -INFINITY : 3;
    poison(xbytes);
    check_identical(chk(ct_masked_fill(gx, on_gpu(mask, nc), value)),
                    chk(ct_masked_fill(x, mask, value)));

    int64_t r = tu_randint(0, 4);
    poison(xbytes * 4);
    check_identical(chk(ct_repeat_interleave(gx, r, dim)), chk(ct_repeat_interleave(x, r, dim)));

    ct_tensor *gp[16], *cp[16];
    int gn = 0, cn = 0;
    int64_t chunks = tu_randint(1, 6);
    ok(ct_chunk(gx, chunks, dim, 16, gp, &gn));
    ok(ct_chunk(x, chunks, dim, 16, cp, &cn));
    assert_int_equal(gn, cn);
    for (int k = 0; k < gn; k++) check_identical(gp[k], cp[k]);
}

static void test_parity(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nd = 1; nd <= 4; nd++)
            for (int nc = 0; nc < 2; nc++) {
                ct_scope *sc = ct_scope_begin();
                parity_round(tu_all_dtypes[t], nd, nc);
                ct_scope_end(sc);
            }
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
}

/* Sizes past one block and one grid: gather of 300 x 2049, scatter_add with
 * lines of 3000 positions onto 5 rows (long ordered sums in f16/bf16), the
 * grouped-query repeat [2, 4, 128, 64] -> [2, 8, 128, 64], and an index
 * expanded with stride 0. */
static void test_large(void **state) {
    (void)state;
    NEED_GPU();
    static const ct_dtype dts[] = {CT_F32, CT_F16, CT_BF16, CT_F64, CT_I64};
    for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
        ct_scope *sc = ct_scope_begin();
        ct_dtype dt = dts[t];
        ct_tensor *x = rnd(CT_SHAPE(300, 517), dt);
        ct_tensor *idx = chk(tu_rand(CT_SHAPE(300, 2049), CT_I64, 0, 517, NULL));
        poison(300 * 2049 * 8);
        check_identical(chk(ct_gather(gpu(x), 1, gpu(idx))), chk(ct_gather(x, 1, idx)));

        ct_tensor *y = rnd(CT_SHAPE(5, 700), dt), *src = rnd(CT_SHAPE(3000, 700), dt);
        ct_tensor *si = chk(tu_rand(CT_SHAPE(3000, 700), CT_I64, 0, 5, NULL));
        check_identical(chk(ct_scatter_add(gpu(y), 0, gpu(si), gpu(src))),
                        chk(ct_scatter_add(y, 0, si, src)));

        ct_tensor *kv = rnd(CT_SHAPE(2, 4, 128, 64), dt);
        poison(2 * 8 * 128 * 64 * 8);
        check_identical(chk(ct_repeat_interleave(gpu(kv), 2, 1)),
                        chk(ct_repeat_interleave(kv, 2, 1)));

        ct_tensor *col = chk(tu_rand(CT_SHAPE(300, 1), CT_I64, 0, 517, NULL));
        ct_tensor *ex = chk(ct_expand(col, CT_SHAPE(300, 40)));
        ct_tensor *gex = chk(ct_expand(gpu(col), CT_SHAPE(300, 40)));
        check_identical(chk(ct_gather(gpu(x), 1, gex)), chk(ct_gather(x, 1, ex)));
        ct_scope_end(sc);
    }
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
}

/* ---- bad indices ------------------------------------------------------------------------- */

/* An index out of range fails the GPU call with the CPU's message, naming
 * the first bad index in row-major order, also through a non-contiguous
 * index and with int32 indices; a good call afterwards works. */
static void test_bad_indices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = rnd(CT_SHAPE(4, 6), CT_F32), *gx = gpu(x);
    static const int64_t cases[][8] = {
        {0, 1, 2, 6, 1, 9, 0, 0},    /* 6 first, then 9 */
        {5, 5, -1, 0, 7, 1, 2, 3},   /* -1 first */
        {0, 1, 2, 3, 4, 5, 0, 100},  /* the last one */
    };
    char msg[512];
    for (int k = 0; k < 3; k++)
        for (int nc = 0; nc < 2; nc++) {
            int64_t s[2] = {2, 4};
            /* the index's transpose as [4, 2] keeps its row-major order
             * only when contiguous; either way the CPU's message is the
             * reference */
            ct_tensor *idx = ints(cases[k], 2, s, CT_I64);
            ct_tensor *gidx = gpu(idx);
            if (nc) {
                idx = chk(ct_transpose(idx, 0, 1));
                gidx = chk(ct_transpose(gidx, 0, 1));
            }
            ct_tensor *src = rnd(2, ct_tensor_shape(idx), CT_F32);
            assert_null(ct_gather(x, 1, idx));
            snprintf(msg, sizeof msg, "%s", ct_last_error());
            tu_assert_null_error(ct_gather(gx, 1, gidx), CT_ERR_INDEX, "ct_gather: index",
                                 "out of range for dim 1 of size 6", "expected 0..5");
            assert_string_equal(ct_last_error(), msg);

            assert_null(ct_scatter_add(x, 1, idx, src));
            snprintf(msg, sizeof msg, "%s", ct_last_error());
            tu_assert_null_error(ct_scatter_add(gx, 1, gidx, gpu(src)), CT_ERR_INDEX,
                                 "ct_scatter_add: index", "dim 1 of size 6");
            assert_string_equal(ct_last_error(), msg);

            for (int i32 = 0; i32 < 2; i32++) {
                int64_t eight = 8;
                ct_tensor *sel = ints(cases[k], 1, &eight, i32 ? CT_I32 : CT_I64);
                assert_null(ct_index_select(x, 1, sel));
                snprintf(msg, sizeof msg, "%s", ct_last_error());
                tu_assert_null_error(ct_index_select(gx, 1, on_gpu(sel, nc)), CT_ERR_INDEX,
                                     "ct_index_select: index", "dim 1 of size 6");
                assert_string_equal(ct_last_error(), msg);
            }
        }
    /* gather along an empty dim: no index is valid */
    ct_tensor *e = gpu(chk(ct_tensor_zeros(CT_SHAPE(3, 0), CT_F32, CT_CPU)));
    int64_t zero = 0, s1[2] = {1, 1};
    tu_assert_null_error(ct_gather(e, 1, gpu(ints(&zero, 2, s1, CT_I64))), CT_ERR_INDEX,
                         "ct_gather: index 0", "size 0");
    /* the device still works */
    int64_t good[8] = {0, 5, 1, 4, 2, 3, 5, 5}, s[2] = {2, 4};
    ct_tensor *gi = ints(good, 2, s, CT_I64);
    check_identical(chk(ct_gather(gx, 1, gpu(gi))), chk(ct_gather(x, 1, gi)));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

/* ---- autograd ------------------------------------------------------------------------------ */

typedef ct_tensor *(*op_fn)(ct_tensor *x, ct_tensor *a, ct_tensor *b);

static ct_tensor *f_gather(ct_tensor *x, ct_tensor *i, ct_tensor *s) {
    (void)s;
    return ct_gather(x, 1, i);
}
static ct_tensor *f_isel(ct_tensor *x, ct_tensor *i, ct_tensor *s) {
    (void)s;
    ct_tensor *i1 = ct_select(i, 0, 0);
    return i1 ? ct_index_select(x, 1, i1) : NULL;
}
static ct_tensor *f_masked(ct_tensor *x, ct_tensor *i, ct_tensor *s) {
    (void)s;
    ct_tensor *m = ct_gt_scalar(i, 2);
    ct_tensor *b = m ? ct_gather(x, 1, i) : NULL; /* same shape as m */
    return b ? ct_masked_fill(b, m, 0.5) : NULL;
}
static ct_tensor *f_repeat(ct_tensor *x, ct_tensor *i, ct_tensor *s) {
    (void)i, (void)s;
    return ct_repeat_interleave(x, 3, 0);
}
static ct_tensor *f_scatter_x(ct_tensor *x, ct_tensor *i, ct_tensor *s) {
    return ct_scatter_add(x, 1, i, s);
}

/* d(sum(op(x) * w))/dx and, for scatter_add, d/dsrc on the GPU against the CPU. */
static void test_autograd_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
    static const op_fn fns[] = {f_gather, f_isel, f_masked, f_repeat, f_scatter_x};
    static const ct_dtype dts[] = {CT_F32, CT_F64, CT_F16, CT_BF16};
    for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++)
        for (size_t t = 0; t < sizeof dts / sizeof dts[0]; t++) {
            ct_scope *sc = ct_scope_begin();
            ct_dtype dt = dts[t];
            ct_tensor *x = rnd(CT_SHAPE(5, 7), dt), *src = rnd(CT_SHAPE(5, 9), dt);
            ct_tensor *idx = chk(tu_rand(CT_SHAPE(5, 9), CT_I64, 0, 7, NULL));
            ct_tensor *gx = gpu(x), *gsrc = gpu(src), *gidx = gpu(idx);
            ct_tensor *leaves[4] = {x, src, gx, gsrc};
            for (int k = 0; k < 4; k++) ok(ct_requires_grad_(leaves[k], true));
            ct_tensor *y = chk(fns[f](x, idx, src)), *gy = chk(fns[f](gx, gidx, gsrc));
            ct_tensor *w = rnd(ct_tensor_ndim(y), ct_tensor_shape(y), dt);
            ok(ct_backward(chk(ct_sum(chk(ct_mul(y, w)), 0, NULL, false)), NULL, false));
            ok(ct_backward(chk(ct_sum(chk(ct_mul(gy, gpu(w))), 0, NULL, false)), NULL, false));
            check_identical(gy, y);
            /* gradients: sums of products, rounded alike (the reductions may
             * differ in order) */
            double rtol = tu_rtol(dt) * 4;
            check_close(ct_grad(gx), ct_grad(x), rtol);
            if (fns[f] == f_scatter_x) check_close(ct_grad(gsrc), ct_grad(src), rtol);
            ct_scope_end(sc);
        }
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
}

/* ---- argument checks ----------------------------------------------------------------------- */

static void test_mixed_devices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = rnd(CT_SHAPE(4, 5), CT_F32), *gx = gpu(x);
    ct_tensor *idx = chk(tu_rand(CT_SHAPE(4, 5), CT_I64, 0, 5, NULL)), *gidx = gpu(idx);
    ct_tensor *m = chk(tu_rand(CT_SHAPE(4, 5), CT_BOOL, 0, 1, NULL));
    int64_t three = 3;
    ct_tensor *sel = chk(tu_rand(1, &three, CT_I64, 0, 4, NULL));
    tu_assert_null_error(ct_gather(gx, 1, idx), CT_ERR_DEVICE, "ct_gather", "one device", "cuda:0",
                         "cpu");
    tu_assert_null_error(ct_scatter_add(gx, 1, gidx, x), CT_ERR_DEVICE, "ct_scatter_add",
                         "one device");
    tu_assert_null_error(ct_index_select(gx, 0, sel), CT_ERR_DEVICE, "ct_index_select",
                         "one device");
    tu_assert_null_error(ct_masked_fill(gx, m, 0), CT_ERR_DEVICE, "ct_masked_fill", "one device");
    check_identical(chk(ct_gather(gx, 1, gidx)), chk(ct_gather(x, 1, idx)));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

/* Empty indices and empty x: nothing launched, the CPU's shapes. */
static void test_empty_inputs(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = rnd(CT_SHAPE(4, 5), CT_F32), *gx = gpu(x);
    ct_tensor *i0 = chk(ct_tensor_zeros(CT_SHAPE(4, 0), CT_I64, CT_CPU));
    ct_tensor *s0 = chk(ct_tensor_zeros(CT_SHAPE(4, 0), CT_F32, CT_CPU));
    check_identical(chk(ct_gather(gx, 1, gpu(i0))), chk(ct_gather(x, 1, i0)));
    check_identical(chk(ct_scatter_add(gx, 1, gpu(i0), gpu(s0))), chk(ct_scatter_add(x, 1, i0, s0)));
    int64_t zero = 0;
    ct_tensor *e = chk(ct_tensor_zeros(1, &zero, CT_I32, CT_CPU));
    check_identical(chk(ct_index_select(gx, 0, gpu(e))), chk(ct_index_select(x, 0, e)));
    check_identical(chk(ct_repeat_interleave(gx, 0, 1)), chk(ct_repeat_interleave(x, 0, 1)));
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda_indexing");
    if (!ct_supports(CT_OP_GATHER, CT_DEVICE_CUDA, CT_F32))
        fprintf(stderr, "[ cuda_indexing ] no CUDA gather kernel registered\n");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_parity),
        T(test_large),
        T(test_bad_indices),
        T(test_autograd_matches_cpu),
        T(test_mixed_devices),
        T(test_empty_inputs),
    };
#undef T
    return tu_run_tests(tests);
}
