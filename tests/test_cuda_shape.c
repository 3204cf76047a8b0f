/* The indexing and shape ops on CUDA tensors beyond the parity table
 * (parity_shape.inc): the composite ops (index_add, index_put, take,
 * masked_select, tile, unbind, diagonal, diag, one_hot) against the CPU in
 * every dtype they take; large contiguous copies (flip, roll, repeat, pad)
 * against the CPU bit for bit; out-of-range indices refused on the GPU with
 * the CPU's message, the device usable after; gradients on the GPU against
 * the CPU's; mixed devices refused. Skips without a GPU. */
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

/* got (on the GPU) holds ref's shape and dtype, and its values within rtol. */
static void check_close(ct_tensor *got, ct_tensor *ref, double rtol) {
    assert_non_null(got);
    assert_non_null(ref);
    assert_int_equal(ct_tensor_device(got).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(ref));
    int nd = ct_tensor_ndim(ref);
    assert_int_equal(ct_tensor_ndim(got), nd);
    for (int d = 0; d < nd; d++) assert_int_equal(ct_tensor_shape(got)[d], ct_tensor_shape(ref)[d]);
    int64_t n = ct_tensor_numel(ref);
    double *r = tu_values(ref), *g = tu_values(got);
    tu_assert_close(g, r, n, rtol, rtol);
    free(r);
    free(g);
}

static ct_tensor *ints(const int64_t *vals, int nd, const int64_t *shape) {
    int64_t n = tu_numel(nd, shape);
    double *v = malloc((size_t)(n > 0 ? n : 1) * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (double)vals[i];
    ct_tensor *t = tu_from_f64(v, nd, shape, CT_I64);
    free(v);
    return chk(t);
}

static ct_tensor *rnd(int nd, const int64_t *s, ct_dtype dt) {
    bool f = ct_dtype_is_floating(dt);
    return chk(tu_rand(nd, s, dt, f ? -4 : -20, f ? 4 : 20, NULL));
}

static ct_tensor *on_gpu(ct_tensor *t, bool nc) {
    ct_tensor *g = gpu(t);
    return nc ? chk(tu_noncontig(g)) : g;
}

/* ---- the composite ops ------------------------------------------------------------------ */

static void test_composites(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t t = 0; t < sizeof tu_all_dtypes / sizeof tu_all_dtypes[0]; t++)
        for (int nc = 0; nc < 2; nc++) {
            ct_dtype dt = tu_all_dtypes[t];
            ct_scope *sc = ct_scope_begin();
            ct_tensor *x = rnd(CT_SHAPE(6, 7, 5), dt), *gx = on_gpu(x, nc);
            double rtol = tu_rtol(dt);
            if (dt != CT_BOOL) {
                int64_t iv[9] = {0, 5, 5, 1, 6, 0, 2, 2, 5}, nine = 9;
                ct_tensor *idx = ints(iv, 1, &nine), *src = rnd(CT_SHAPE(6, 9, 5), dt);
                check_close(chk(ct_index_add(gx, 1, gpu(idx), on_gpu(src, nc), 2)),
                            chk(ct_index_add(x, 1, idx, src, 2)), 0);
            }
            int64_t av[2] = {-1, 3}, bv[3] = {0, 6, -2}, two[2] = {2, 1}, three = 3;
            ct_tensor *a = ints(av, 2, two), *b = ints(bv, 1, &three);
            ct_tensor *vals = rnd(CT_SHAPE(3, 5), dt);
            ct_tensor *ic[2] = {a, b}, *ig[2] = {gpu(a), gpu(b)};
            for (int acc = 0; acc < 2; acc++) {
                if (acc && dt == CT_BOOL) continue;
                check_close(chk(ct_index_put(gx, 2, ig, gpu(vals), acc)),
                            chk(ct_index_put(x, 2, ic, vals, acc)), acc ? rtol : 0);
            }
            /* PyTorch's x[:, b] = v and x[mask] = v, a slice and a bool mask */
            ct_tensor *mk = chk(tu_rand(CT_SHAPE(6, 7), CT_BOOL, 0, 1, NULL));
            ct_tensor *sc_[2] = {NULL, b}, *sg[2] = {NULL, gpu(b)}, *mc[1] = {mk},
                      *mg[1] = {on_gpu(mk, nc)};
            ct_tensor *v35 = rnd(CT_SHAPE(3, 5), dt), *v5 = rnd(CT_SHAPE(5), dt);
            for (int acc = 0; acc < 2; acc++) {
                if (acc && dt == CT_BOOL) continue;
                check_close(chk(ct_index_put(gx, 2, sg, gpu(v35), acc)),
                            chk(ct_index_put(x, 2, sc_, v35, acc)), acc ? rtol : 0);
                check_close(chk(ct_index_put(gx, 1, mg, gpu(v5), acc)),
                            chk(ct_index_put(x, 1, mc, v5, acc)), acc ? rtol : 0);
            }
            ct_tensor *ti = chk(tu_rand(CT_SHAPE(4, 9), CT_I64, -210, 210, NULL));
            check_close(chk(ct_take(gx, on_gpu(ti, nc))), chk(ct_take(x, ti)), 0);
            ct_tensor *m = chk(tu_rand(CT_SHAPE(7, 1), CT_BOOL, 0, 1, NULL));
            check_close(chk(ct_masked_select(gx, on_gpu(m, nc))), chk(ct_masked_select(x, m)), 0);
            int64_t reps[2] = {2, 3};
            check_close(chk(ct_tile(gx, 2, reps)), chk(ct_tile(x, 2, reps)), 0);
            check_close(chk(ct_diagonal(gx, -2, 2, 0)), chk(ct_diagonal(x, -2, 2, 0)), 0);
            ct_tensor *pc[7], *pg[7];
            int n = 0;
            assert_int_equal(ct_unbind(x, 1, 7, pc, &n), CT_OK);
            assert_int_equal(ct_unbind(gx, 1, 7, pg, &n), CT_OK);
            for (int k = 0; k < n; k++) check_close(pg[k], pc[k], 0);
            ct_tensor *v = rnd(CT_SHAPE(5), dt), *gv = gpu(v);
            for (int64_t off = -2; off <= 2; off += 2) {
                ct_tensor *D = chk(ct_diag(gv, off));
                check_close(D, chk(ct_diag(v, off)), 0);
                check_close(chk(ct_diag(D, off)), v, 0);
            }
            ct_scope_end(sc);
        }
    ct_scope *sc = ct_scope_begin();
    ct_tensor *c = chk(tu_rand(CT_SHAPE(3, 4), CT_I64, 0, 6, NULL));
    check_close(chk(ct_one_hot(gpu(c), -1)), chk(ct_one_hot(c, -1)), 0);
    check_close(chk(ct_one_hot(gpu(c), 9)), chk(ct_one_hot(c, 9)), 0);
    ct_scope_end(sc);
}

/* ---- large copies ------------------------------------------------------------------------ */

/* Rows of 2051 elements take the element-wise kernel; rows of 2048 (and the
 * pads to 2056) the row kernel's vector paths: aligned runs, runs one
 * element off (pad by 1, roll by 3: two loads shifted), reversed runs (flip,
 * and the reflected edge of a reflect pad), in every element size. */
static void test_large_copies(void **state) {
    (void)state;
    NEED_GPU();
    ct_dtype dts[4] = {CT_F32, CT_BF16, CT_BOOL, CT_F64};
    int64_t widths[2] = {2051, 2048};
    for (int w = 0; w < 2; w++)
        for (int t = 0; t < 4; t++) {
            ct_scope *sc = ct_scope_begin();
            const int64_t cols = widths[w];
            ct_tensor *x = rnd(CT_SHAPE(1024, cols), dts[t]), *gx = gpu(x);
            int64_t d1 = 1, d0 = 0, s[2] = {1000, -77}, s3[2] = {3, 5}, dims[2] = {1, 0};
            int64_t pad[4] = {3, 5, 1, 2}, pad1[4] = {1, 7, 0, 1}, refl[2] = {4, 4};
            int64_t reps[2] = {2, 1}, bytes = 1024 * cols * (int64_t)ct_dtype_size(dts[t]);
            poison(bytes);
            check_close(chk(ct_flip(gx, 1, &d1)), chk(ct_flip(x, 1, &d1)), 0);
            poison(bytes);
            check_close(chk(ct_flip(gx, 1, &d0)), chk(ct_flip(x, 1, &d0)), 0);
            poison(bytes);
            check_close(chk(ct_roll(gx, 2, s, 2, dims)), chk(ct_roll(x, 2, s, 2, dims)), 0);
            poison(bytes);
            check_close(chk(ct_roll(gx, 2, s3, 2, dims)), chk(ct_roll(x, 2, s3, 2, dims)), 0);
            poison(2 * bytes);
            check_close(chk(ct_repeat(gx, 2, reps)), chk(ct_repeat(x, 2, reps)), 0);
            poison(bytes + 8 * cols * 8);
            check_close(chk(ct_pad(gx, 4, pad, CT_PAD_CONSTANT, 0)),
                        chk(ct_pad(x, 4, pad, CT_PAD_CONSTANT, 0)), 0);
            poison(bytes + 8 * cols * 8);
            check_close(chk(ct_pad(gx, 4, pad1, CT_PAD_CONSTANT, 0)),
                        chk(ct_pad(x, 4, pad1, CT_PAD_CONSTANT, 0)), 0);
            if (dts[t] != CT_BOOL) {
                poison(bytes + 8 * cols * 8);
                check_close(chk(ct_pad(gx, 2, refl, CT_PAD_REFLECT, 0)),
                            chk(ct_pad(x, 2, refl, CT_PAD_REFLECT, 0)), 0);
            }
            ct_scope_end(sc);
        }
}

/* ---- bad indices -------------------------------------------------------------------------- */

/* fn fails on the CPU and the GPU with the same message. */
#define SAME_ERROR(cpu_call, gpu_call, status, word)                   \
    do {                                                               \
        char msg_[512];                                                \
        assert_null(cpu_call);                                         \
        snprintf(msg_, sizeof msg_, "%s", ct_last_error());            \
        tu_assert_null_error(gpu_call, status, word);                  \
        assert_string_equal(ct_last_error(), msg_);                    \
    } while (0)

static void test_bad_indices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = rnd(CT_SHAPE(4, 6), CT_F32), *gx = gpu(x);
    int64_t bad[8] = {0, 1, 2, 9, 4, -1, 0, 100}, s[2] = {2, 4};
    for (int nc = 0; nc < 2; nc++) {
        ct_tensor *idx = ints(bad, 2, s), *gidx = gpu(idx);
        if (nc) {
            idx = chk(ct_transpose(idx, 0, 1));
            gidx = chk(ct_transpose(gidx, 0, 1));
        }
        ct_tensor *src = rnd(2, ct_tensor_shape(idx), CT_F32), *gsrc = gpu(src);
        SAME_ERROR(ct_scatter(x, 1, idx, src), ct_scatter(gx, 1, gidx, gsrc), CT_ERR_INDEX,
                   "ct_scatter: index");
        SAME_ERROR(ct_scatter_value(x, 1, idx, 2), ct_scatter_value(gx, 1, gidx, 2), CT_ERR_INDEX,
                   "ct_scatter");
        for (int self = 0; self < 2; self++)
            SAME_ERROR(ct_scatter_reduce(x, 1, idx, src, "amax", self),
                       ct_scatter_reduce(gx, 1, gidx, gsrc, "amax", self), CT_ERR_INDEX,
                       "ct_scatter_reduce: index");
        SAME_ERROR(ct_take(x, idx), ct_take(gx, gidx), CT_ERR_INDEX, "ct_take: index 100");
        SAME_ERROR(ct_one_hot(idx, 10), ct_one_hot(gidx, 10), CT_ERR_INDEX, "ct_one_hot");
    }
    int64_t eight = 8;
    ct_tensor *i1 = ints(bad, 1, &eight), *src8 = rnd(CT_SHAPE(4, 8), CT_F32);
    SAME_ERROR(ct_index_add(x, 1, i1, src8, 1), ct_index_add(gx, 1, gpu(i1), gpu(src8), 1),
               CT_ERR_INDEX, "ct_index_add: index 9");
    ct_tensor *ind[1] = {i1}, *gind[1] = {gpu(i1)};
    ct_tensor *v = rnd(CT_SHAPE(8, 6), CT_F32);
    SAME_ERROR(ct_index_put(x, 1, ind, v, true), ct_index_put(gx, 1, gind, gpu(v), true),
               CT_ERR_INDEX, "ct_index_put: index 9");
    /* the device still works */
    int64_t good[8] = {0, 5, 1, 4, 2, 3, 5, 5};
    ct_tensor *gi = ints(good, 2, s), *src = rnd(CT_SHAPE(2, 4), CT_F32);
    check_close(chk(ct_scatter(gx, 1, gpu(gi), gpu(src))), chk(ct_scatter(x, 1, gi, src)), 0);
    assert_int_equal(ct_cuda_synchronize(0), CT_OK);
    ct_scope_end(sc);
}

/* ---- gradients ---------------------------------------------------------------------------- */

typedef ct_tensor *(*op_fn)(ct_tensor *x, ct_tensor *aux);

static ct_tensor *f_sred(ct_tensor *x, ct_tensor *i) {
    ct_tensor *src = ct_mul_scalar(x, 0.5);
    ct_tensor *r = ct_scatter_reduce(x, 1, i, src, "amax", false);
    ct_tensor_release(src);
    return r;
}
static ct_tensor *f_mean(ct_tensor *x, ct_tensor *i) {
    return ct_scatter_reduce(x, 1, i, x, "mean", true);
}
static ct_tensor *f_pad_reflect(ct_tensor *x, ct_tensor *i) {
    (void)i;
    return ct_pad(x, 4, (int64_t[]){2, 3, 1, 2}, CT_PAD_REFLECT, 0);
}
static ct_tensor *f_pad_circ(ct_tensor *x, ct_tensor *i) {
    (void)i;
    return ct_pad(x, 4, (int64_t[]){4, 1, 2, 3}, CT_PAD_CIRCULAR, 0);
}
static ct_tensor *f_pad_const(ct_tensor *x, ct_tensor *i) {
    (void)i;
    return ct_pad(x, 4, (int64_t[]){-1, 3, 2, 0}, CT_PAD_CONSTANT, 2);
}
static ct_tensor *f_repeat(ct_tensor *x, ct_tensor *i) {
    (void)i;
    return ct_repeat(x, 5, (int64_t[]){2, 1, 3, 1, 2});
}
static ct_tensor *f_flip_roll(ct_tensor *x, ct_tensor *i) {
    (void)i;
    ct_tensor *f = ct_flip(x, 2, (int64_t[]){0, 3});
    ct_tensor *r = ct_roll(f, 2, (int64_t[]){3, -1}, 2, (int64_t[]){1, 2});
    ct_tensor_release(f);
    return r;
}
static ct_tensor *f_interp(ct_tensor *x, ct_tensor *i) {
    (void)i;
    return ct_interpolate(x, (int64_t[]){11, 3}, NULL, CT_INTERP_BILINEAR, false);
}
static ct_tensor *f_nearest(ct_tensor *x, ct_tensor *i) {
    (void)i;
    return ct_interpolate(x, NULL, (double[]){2.5, 1.5}, CT_INTERP_NEAREST, false);
}
static ct_tensor *f_linear1d(ct_tensor *x, ct_tensor *i) {
    (void)i;
    ct_tensor *v = ct_reshape(x, 3, (int64_t[]){2, 3, 35});
    ct_tensor *r = ct_interpolate(v, (int64_t[]){50}, NULL, CT_INTERP_LINEAR, false);
    ct_tensor_release(v);
    return r;
}
static ct_tensor *f_trilinear(ct_tensor *x, ct_tensor *i) {
    (void)i;
    ct_tensor *v = ct_reshape(x, 5, (int64_t[]){2, 1, 3, 5, 7});
    ct_tensor *r = ct_interpolate(v, (int64_t[]){4, 9, 5}, NULL, CT_INTERP_TRILINEAR, true);
    ct_tensor_release(v);
    return r;
}
static ct_tensor *f_unfold(ct_tensor *x, ct_tensor *i) {
    (void)i;
    return ct_unfold(x, (int64_t[]){2, 3}, (int64_t[]){1, 1}, (int64_t[]){1, 1}, (int64_t[]){1, 2});
}

static void test_autograd_matches_cpu(void **state) {
    (void)state;
    NEED_GPU();
    op_fn fns[] = {f_sred, f_mean, f_pad_reflect, f_pad_circ, f_pad_const, f_repeat, f_flip_roll,
                   f_interp, f_nearest, f_linear1d, f_trilinear, f_unfold};
    const char *names[] = {"scatter_reduce amax", "scatter_reduce mean", "pad reflect",
                           "pad circular", "pad constant", "repeat", "flip roll",
                           "interpolate bilinear", "interpolate nearest", "interpolate linear",
                           "interpolate trilinear", "unfold"};
    ct_dtype dts[2] = {CT_F64, CT_F32};
    for (int t = 0; t < 2; t++)
        for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
            ct_scope *sc = ct_scope_begin();
            ct_tensor *x = rnd(CT_SHAPE(2, 3, 5, 7), dts[t]);
            ct_tensor *idx = chk(tu_rand(CT_SHAPE(2, 3, 5, 7), CT_I64, 0, 3, NULL));
            ct_tensor *gx = gpu(x), *gidx = gpu(idx);
            assert_int_equal(ct_requires_grad_(x, true), CT_OK);
            assert_int_equal(ct_requires_grad_(gx, true), CT_OK);
            ct_tensor *y = chk(fns[f](x, idx)), *gy = chk(fns[f](gx, gidx));
            ct_tensor *g = rnd(ct_tensor_ndim(y), ct_tensor_shape(y), dts[t]);
            assert_int_equal(ct_backward(y, g, false), CT_OK);
            assert_int_equal(ct_backward(gy, gpu(g), false), CT_OK);
            fprintf(stderr, "[ cuda_shape ] gradient of %s %s\n", names[f], ct_dtype_name(dts[t]));
            check_close(ct_grad(gx), ct_grad(x), dts[t] == CT_F64 ? 1e-12 : 1e-5);
            ct_scope_end(sc);
        }
}

/* Writes through views of tensors with history (CopySlices) and ct_copy_ into rows of a
 * plain buffer: their backwards are public ops, so the GPU's gradients are the CPU's. */
static void test_inplace_views_match_cpu(void **state) {
    (void)state;
    NEED_GPU();
    ct_dtype dts[2] = {CT_F64, CT_F32};
    for (int t = 0; t < 2; t++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *x = rnd(CT_SHAPE(4, 6), dts[t]), *gx = gpu(x);
        ct_tensor *s = rnd(CT_SHAPE(6), dts[t]), *gs = gpu(s);
        ct_tensor *w = rnd(CT_SHAPE(4, 6), dts[t]), *gw = gpu(w);
        ct_tensor *xs[2] = {x, gx}, *ss[2] = {s, gs}, *ws[2] = {w, gw};
        for (int d = 0; d < 2; d++) {
            assert_int_equal(ct_requires_grad_(xs[d], true), CT_OK);
            assert_int_equal(ct_requires_grad_(ss[d], true), CT_OK);
            ct_tensor *y = chk(ct_mul(xs[d], xs[d]));
            ct_tensor *v = chk(ct_narrow(y, 1, 1, 3));
            assert_int_equal(ct_mul_scalar_(v, 3), CT_OK);
            ct_tensor *buf = chk(ct_tensor_zeros(2, (int64_t[]){3, 6}, dts[t],
                                                 ct_tensor_device(xs[d])));
            for (int r = 0; r < 3; r++)
                assert_int_equal(ct_copy_(chk(ct_select(buf, 0, r)), ss[d]), CT_OK);
            ct_tensor *l1 = chk(ct_sum(chk(ct_mul(y, ws[d])), CT_NONE, false));
            ct_tensor *l2 = chk(ct_sum(chk(ct_mul(buf, chk(ct_narrow(ws[d], 0, 0, 3)))), CT_NONE, false));
            assert_int_equal(ct_backward(chk(ct_add(l1, l2)), NULL, false), CT_OK);
        }
        check_close(ct_grad(gx), ct_grad(x), dts[t] == CT_F64 ? 1e-12 : 1e-5);
        check_close(ct_grad(gs), ct_grad(s), dts[t] == CT_F64 ? 1e-12 : 1e-5);
        ct_scope_end(sc);
    }
}

static void test_mixed_devices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = rnd(CT_SHAPE(3, 4), CT_F32), *gx = gpu(x);
    ct_tensor *i = chk(tu_rand(CT_SHAPE(3, 4), CT_I64, 0, 3, NULL));
    tu_assert_null_error(ct_scatter(gx, 0, i, gx), CT_ERR_DEVICE, "ct_scatter");
    tu_assert_null_error(ct_take(gx, i), CT_ERR_DEVICE, "ct_take");
    tu_assert_null_error(ct_masked_select(gx, chk(ct_gt_scalar(x, 0))), CT_ERR_DEVICE,
                         "ct_masked_select");
    ct_tensor *ind[1] = {i};
    tu_assert_null_error(ct_index_put(gx, 1, ind, gx, false), CT_ERR_DEVICE, "ct_index_put");
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
    ngpu = tu_cuda_devices_or_skip("cuda_shape");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_composites),    T(test_large_copies), T(test_bad_indices),
        T(test_autograd_matches_cpu), T(test_inplace_views_match_cpu), T(test_mixed_devices),
    };
#undef T
    return tu_run_tests(tests);
}
