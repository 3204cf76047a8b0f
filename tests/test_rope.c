/* Rotary position embedding (ct_rope, ct_rope_backward, ct_rope_tables) and
 * SwiGLU (ct_swiglu, ct_swiglu_backward) on the CPU against float64
 * reference loops written here, on fresh random inputs: every floating
 * dtype, both pair layouts, tables broadcast as [T, 1, D/2] against
 * [B, T, H, D] and as [T, D/2] against [B, H, T, D], random sizes with odd
 * and size-1 dims, transposed and strided (non-contiguous) inputs and tables,
 * empty tensors, outputs poisoned with NaN before each op; swiglu on rows
 * read in place (the halves of ct_chunk(h, 2, -1), narrow views at odd
 * offsets, odd column counts; the trace shows no copy) and on leading dims
 * that do not fold (copied); float64 gradient checks, chunk -> swiglu
 * through autograd, autograd (the tables get no gradient), and the message
 * of every bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <unistd.h>

#include "autograd_util.h"
#include "test_fixture.h"
#include "test_util.h"

/* Fills a freed block of the size of a result with NaN first, so an output
 * the allocator hands back from it and the kernel leaves unwritten fails. */
static void poison_output(int nd, const int64_t *shape, ct_dtype dt) {
    ct_tensor *t = ct_tensor_full(nd, shape, NAN, dt, CT_CPU);
    assert_non_null(t);
    ct_tensor_release(t);
}

/* Tolerances against float64 math on the same rounded inputs: f16/bf16/f32
 * compute in f32 and round the result once; the atol covers cancellation in
 * a cos - b sin for values of order 1. */
static double rtol_of(ct_dtype dt) { return tu_rtol(dt); }
static double atol_of(ct_dtype dt) { return dt == CT_F64 ? 1e-12 : dt == CT_F32 ? 4e-6 : 2 * tu_rtol(dt); }

static void expect(ct_tensor *got, const double *ref, int nd, const int64_t *shape, ct_dtype dt) {
    check_shape(got, nd, shape);
    assert_int_equal(ct_tensor_dtype(got), dt);
    assert_true(ct_tensor_is_contiguous(got));
    check_values(got, ref, tu_numel(nd, shape), rtol_of(dt), atol_of(dt));
}

/* expect without the layout: the gradients of chunk halves are halves too. */
static void expect_vals(ct_tensor *got, const double *ref, int nd, const int64_t *shape,
                        ct_dtype dt) {
    check_shape(got, nd, shape);
    assert_int_equal(ct_tensor_dtype(got), dt);
    check_values(got, ref, tu_numel(nd, shape), rtol_of(dt), atol_of(dt));
}

/* Whether dg and du are the two halves of one contiguous [..., 2 cols]
 * tensor (what ct_swiglu_backward gives for chunk halves). */
static bool halves_of_one(const ct_tensor *dg, const ct_tensor *du) {
    int nd = ct_tensor_ndim(dg);
    const int64_t *s = ct_tensor_shape(dg), *st = ct_tensor_strides(dg);
    if (!ct_tensor_shares_storage(dg, du) ||
        ct_tensor_offset(du) != ct_tensor_offset(dg) + s[nd - 1])
        return false;
    int64_t want = 1;
    for (int k = nd - 1; k >= 0; k--) {
        if (s[k] > 1 && st[k] != want) return false;
        if (ct_tensor_strides(du)[k] != st[k]) return false;
        want *= k == nd - 1 ? 2 * s[k] : s[k];
    }
    return true;
}

/* ---- the float64 rope reference ------------------------------------------------------- */

/* y = rope(x) with sign +1, its backward with -1. x row-major of shape xs
 * (nd dims, last d); c and s row-major of shape ts (tnd dims, last d/2),
 * broadcast against x's leading dims. */
static void ref_rope(const double *x, int nd, const int64_t *xs, const double *c, const double *s,
                     int tnd, const int64_t *ts, int layout, double sign, double *y) {
    int64_t d = xs[nd - 1], h = d / 2, rows = tu_numel(nd - 1, xs);
    for (int64_t r = 0; r < rows; r++) {
        /* the table row: r's index in x's leading dims, right-aligned on the table's */
        int64_t q = r, trow = 0, tmul = 1;
        for (int i = nd - 2; i >= 0; i--) {
            int64_t ii = q % xs[i];
            q /= xs[i];
            int ti = i - (nd - tnd);
            if (ti >= 0) {
                trow += (ts[ti] == 1 ? 0 : ii) * tmul;
                tmul *= ts[ti];
            }
        }
        const double *xr = x + r * d, *cr = c + trow * h, *sr = s + trow * h;
        double *yr = y + r * d;
        for (int64_t k = 0; k < h; k++) {
            int64_t ia = layout == CT_ROPE_HALF ? k : 2 * k, ib = layout == CT_ROPE_HALF ? k + h : 2 * k + 1;
            double a = xr[ia], b = xr[ib], ck = cr[k], sk = sign * sr[k];
            yr[ia] = a * ck - b * sk;
            yr[ib] = b * ck + a * sk;
        }
    }
}

/* cos and sin of random angles, rounded to dt, as tensors of shape ts and as values. */
static void rand_tables(int tnd, const int64_t *ts, ct_dtype dt, ct_tensor **c, ct_tensor **s,
                        double **cv, double **sv) {
    int64_t n = tu_numel(tnd, ts);
    *cv = malloc(sizeof(double) * (size_t)(n ? n : 1));
    *sv = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        double a = tu_uniform(-4, 4);
        (*cv)[i] = tu_round(cos(a), dt);
        (*sv)[i] = tu_round(sin(a), dt);
    }
    *c = tu_from_f64(*cv, tnd, ts, dt);
    *s = tu_from_f64(*sv, tnd, ts, dt);
    assert_non_null(*c);
    assert_non_null(*s);
}

/* One rope geometry: x's shape and the tables' shape. */
typedef struct rope_geo {
    int nd, tnd;
    int64_t xs[4], ts[4];
    bool bthd; /* x [B, T, H, D]: can also come as a transposed [B, H, T, D] */
} rope_geo;

static int64_t rand_d(void) {
    static const int64_t ds[] = {2, 4, 6, 8, 10, 16, 18, 34, 64};
    return ds[tu_randint(0, sizeof ds / sizeof ds[0])];
}

static rope_geo rand_geo(int style) {
    rope_geo g = {0};
    int64_t B = tu_randint(1, 4), T = tu_randint(1, 8), H = tu_randint(1, 5), D = rand_d();
    switch (style) {
    case 0: /* x [B, T, H, D], tables [T, 1, D/2] */
        g = (rope_geo){4, 3, {B, T, H, D}, {T, 1, D / 2}, true};
        break;
    case 1: /* x [B, H, T, D], tables [T, D/2] */
        g = (rope_geo){4, 2, {B, H, T, D}, {T, D / 2}, false};
        break;
    case 2: /* x [N, D], tables [N, D/2] */
        g = (rope_geo){2, 2, {T * H, D}, {T * H, D / 2}, false};
        break;
    default: /* x [D], tables [D/2] */
        g = (rope_geo){1, 1, {D}, {D / 2}, false};
        break;
    }
    return g;
}

/* x with values v (row-major over g.xs) in one of three layouts: contiguous;
 * a transposed view of a [B, H, T, D] tensor (last dim contiguous, the others
 * not), or x's values at stride 2 in every dim (a contiguous copy path). */
static ct_tensor *x_in_layout(const double *v, const rope_geo *g, ct_dtype dt, int how) {
    ct_tensor *x = tu_from_f64(v, g->nd, g->xs, dt);
    assert_non_null(x);
    if (how == 1 && g->bthd) {
        ct_tensor *t = ct_transpose(x, 1, 2); /* [B, H, T, D] view */
        ct_tensor *tc = ct_contiguous(t);
        ct_tensor *back = ct_transpose(tc, 1, 2);
        ct_tensor_release(t);
        ct_tensor_release(tc);
        ct_tensor_release(x);
        if (g->xs[1] > 1 && g->xs[2] > 1) assert_false(ct_tensor_is_contiguous(back));
        return back;
    }
    if (how == 2) {
        ct_tensor *nc = tu_noncontig(x);
        ct_tensor_release(x);
        return nc;
    }
    return x;
}

/* x's gradient through a recorded ct_rope by tables c, s and by ch, sh: bit for bit equal. */
static void expect_same_grad(ct_tensor *x, ct_tensor *c, ct_tensor *s, ct_tensor *ch,
                             ct_tensor *sh, ct_rope_layout L) {
    ct_tensor *xl = ct_contiguous(x), *xh = ct_contiguous(x);
    assert_int_equal(ct_requires_grad_(xl, true), CT_OK);
    assert_int_equal(ct_requires_grad_(xh, true), CT_OK);
    ct_tensor *go = tu_rand(ct_tensor_ndim(x), ct_tensor_shape(x), ct_tensor_dtype(x), -1, 1, NULL);
    ct_tensor *yl = ct_rope(xl, c, s, L), *yh = ct_rope(xh, ch, sh, L);
    assert_int_equal(ct_backward(yl, go, false), CT_OK);
    assert_int_equal(ct_backward(yh, go, false), CT_OK);
    tu_assert_same_bits("rope's gradient, float32 tables", ct_grad(xl), ct_grad(xh));
    ct_tensor *all[] = {xl, xh, go, yl, yh};
    release_all(5, all);
}

/* tdt: the tables' dtype, dt or float32 beside a 16-bit x. With float32 tables the result
 * (and x's gradient through autograd) is also bit for bit that of the tables cast to x's
 * dtype, and the float64 reference rotates by the rounded tables. */
static void rope_case(ct_dtype dt, ct_dtype tdt, int style, int layout, int how, bool nc_tables,
                      bool bwd) {
    rope_geo g = rand_geo(style);
    int64_t n = tu_numel(g.nd, g.xs), tn = tu_numel(g.tnd, g.ts);
    double *xv = tu_rand_vals(n, dt, -2, 2), *cv, *sv;
    ct_tensor *c, *s, *ch = NULL, *sh = NULL;
    rand_tables(g.tnd, g.ts, tdt, &c, &s, &cv, &sv);
    if (tdt != dt) {
        ch = ct_to_dtype(c, dt);
        sh = ct_to_dtype(s, dt);
        for (int64_t i = 0; i < tn; i++) {
            cv[i] = tu_round(cv[i], dt);
            sv[i] = tu_round(sv[i], dt);
        }
    }
    if (nc_tables) {
        ct_tensor *c2 = tu_noncontig(c), *s2 = tu_noncontig(s);
        ct_tensor_release(c);
        ct_tensor_release(s);
        c = c2;
        s = s2;
    }
    ct_tensor *x = x_in_layout(xv, &g, dt, how);
    double *ref = malloc(sizeof(double) * (size_t)n);
    ref_rope(xv, g.nd, g.xs, cv, sv, g.tnd, g.ts, layout, bwd ? -1 : 1, ref);
    for (int64_t i = 0; i < n; i++) ref[i] = tu_round(ref[i], dt);
    ct_rope_layout L = (ct_rope_layout)layout;
    poison_output(g.nd, g.xs, dt);
    ct_tensor *y = bwd ? ct_rope_backward(x, c, s, L) : ct_rope(x, c, s, L);
    if (!y)
        fprintf(stderr, "rope %s, tables %s: %s\n", ct_dtype_name(dt), ct_dtype_name(tdt),
                ct_last_error());
    expect(y, ref, g.nd, g.xs, dt);
    if (tdt != dt) {
        ct_tensor *yh = bwd ? ct_rope_backward(x, ch, sh, L) : ct_rope(x, ch, sh, L);
        tu_assert_same_bits("rope, float32 tables", y, yh);
        ct_tensor_release(yh);
        expect_same_grad(x, c, s, ch, sh, L);
    }
    ct_tensor *all[] = {x, c, s, y, ch, sh};
    release_all(6, all);
    free(xv);
    free(cv);
    free(sv);
    free(ref);
}

static void test_rope_forward(void **state) {
    (void)state;
    for (size_t t = 0; t < 4; t++)
        for (int style = 0; style < 4; style++)
            for (int layout = 0; layout < 2; layout++)
                for (int how = 0; how < 3; how++)
                    for (int rep = 0; rep < 2; rep++)
                        rope_case(tu_float_dtypes[t], tu_float_dtypes[t], style, layout, how,
                                  rep == 1, false);
}

static void test_rope_backward(void **state) {
    (void)state;
    for (size_t t = 0; t < 4; t++)
        for (int style = 0; style < 4; style++)
            for (int layout = 0; layout < 2; layout++)
                for (int how = 0; how < 3; how++)
                    rope_case(tu_float_dtypes[t], tu_float_dtypes[t], style, layout, how,
                              how == 2, true);
}

static void test_rope_f32_tables(void **state) {
    (void)state;
    const ct_dtype halves[] = {CT_F16, CT_BF16};
    for (size_t t = 0; t < 2; t++)
        for (int style = 0; style < 4; style++)
            for (int layout = 0; layout < 2; layout++)
                for (int how = 0; how < 3; how++)
                    for (int bwd = 0; bwd < 2; bwd++)
                        rope_case(halves[t], CT_F32, style, layout, how, (how + bwd) % 2 == 1,
                                  bwd == 1);
}

/* Many rows of a wide head through the pool's threads, so tasks start at
 * rows inside the leading dims (where x and table offsets must be found from
 * the row index). */
static void test_rope_large(void **state) {
    (void)state;
    int threads = ct_get_num_threads();
    assert_int_equal(ct_set_num_threads(3), CT_OK);
    for (int layout = 0; layout < 2; layout++)
        for (size_t t = 0; t < 4; t++) {
            ct_dtype dt = tu_float_dtypes[t];
            int64_t xs[4] = {3, 37, 5, 128}, ts[3] = {37, 1, 64};
            int64_t n = tu_numel(4, xs);
            double *xv = tu_rand_vals(n, dt, -3, 3), *cv, *sv;
            ct_tensor *c, *s;
            rand_tables(3, ts, dt, &c, &s, &cv, &sv);
            ct_tensor *x = tu_from_f64(xv, 4, xs, dt);
            double *ref = malloc(sizeof(double) * (size_t)n);
            ref_rope(xv, 4, xs, cv, sv, 3, ts, layout, 1, ref);
            for (int64_t i = 0; i < n; i++) ref[i] = tu_round(ref[i], dt);
            poison_output(4, xs, dt);
            ct_tensor *y = ct_rope(x, c, s, (ct_rope_layout)layout);
            expect(y, ref, 4, xs, dt);
            ct_tensor *all[] = {x, c, s, y};
            release_all(4, all);
            free(xv);
            free(cv);
            free(sv);
            free(ref);
        }
    assert_int_equal(ct_set_num_threads(threads), CT_OK);
}

/* The backward undoes the forward: rope_backward(rope(x)) == x (f64), and
 * rotating by the tables of ct_rope_tables keeps each pair's length. */
static void test_rope_round_trip(void **state) {
    (void)state;
    int64_t xs[4] = {2, 9, 3, 12};
    ct_tensor *c = NULL, *s = NULL;
    assert_int_equal(ct_rope_tables(9, 12, 10000, CT_F64, CT_CPU, &c, &s), CT_OK);
    ct_tensor *c3 = ct_reshape(c, 3, (int64_t[]){9, 1, 6}), *s3 = ct_reshape(s, 3, (int64_t[]){9, 1, 6});
    for (int layout = 0; layout < 2; layout++) {
        double *xv;
        ct_tensor *x = tu_rand(4, xs, CT_F64, -2, 2, &xv);
        ct_tensor *y = ct_rope(x, c3, s3, (ct_rope_layout)layout);
        ct_tensor *z = ct_rope_backward(y, c3, s3, (ct_rope_layout)layout);
        check_values(z, xv, tu_numel(4, xs), 1e-14, 1e-14);
        double *yv = tu_values(y);
        for (int64_t r = 0; r < tu_numel(3, xs); r++)
            for (int64_t k = 0; k < 6; k++) {
                int64_t ia = layout ? 2 * k : k, ib = layout ? 2 * k + 1 : k + 6;
                double l0 = hypot(xv[r * 12 + ia], xv[r * 12 + ib]);
                double l1 = hypot(yv[r * 12 + ia], yv[r * 12 + ib]);
                assert_true(fabs(l0 - l1) <= 1e-14 * (1 + l0));
            }
        free(yv);
        free(xv);
        ct_tensor *all[] = {x, y, z};
        release_all(3, all);
    }
    ct_tensor *all[] = {c, s, c3, s3};
    release_all(4, all);
}

static void test_rope_tables(void **state) {
    (void)state;
    static const double bases[] = {10000, 500000, 2.5};
    for (size_t t = 0; t < 4; t++)
        for (int b = 0; b < 3; b++) {
            ct_dtype dt = tu_float_dtypes[t];
            int64_t T = tu_randint(1, 40), D = 2 * tu_randint(1, 40);
            ct_tensor *c = NULL, *s = NULL;
            assert_int_equal(ct_rope_tables(T, D, bases[b], dt, CT_CPU, &c, &s), CT_OK);
            int64_t shape[2] = {T, D / 2};
            double *rc = malloc(sizeof(double) * (size_t)(T * D / 2));
            double *rs = malloc(sizeof(double) * (size_t)(T * D / 2));
            for (int64_t i = 0; i < T; i++)
                for (int64_t k = 0; k < D / 2; k++) {
                    double a = (double)i * pow(bases[b], -(double)(2 * k) / (double)D);
                    rc[i * (D / 2) + k] = tu_round(cos(a), dt);
                    rs[i * (D / 2) + k] = tu_round(sin(a), dt);
                }
            check_shape(c, 2, shape);
            check_shape(s, 2, shape);
            assert_int_equal(ct_tensor_dtype(c), dt);
            assert_int_equal(ct_tensor_dtype(s), dt);
            /* computed in f64 and rounded once to the dtype */
            check_values(c, rc, T * D / 2, 0, 0);
            check_values(s, rs, T * D / 2, 0, 0);
            free(rc);
            free(rs);
            ct_tensor_release(c);
            ct_tensor_release(s);
        }
    /* no positions: empty tables */
    ct_tensor *c = NULL, *s = NULL;
    assert_int_equal(ct_rope_tables(0, 8, 10000, CT_F32, CT_CPU, &c, &s), CT_OK);
    check_shape(c, 2, (int64_t[]){0, 4});
    check_shape(s, 2, (int64_t[]){0, 4});
    ct_tensor_release(c);
    ct_tensor_release(s);
}

static void test_rope_empty(void **state) {
    (void)state;
    for (int layout = 0; layout < 2; layout++) {
        int64_t xs[4] = {0, 3, 2, 8}, ts[3] = {3, 1, 4};
        ct_tensor *x = ct_tensor_zeros(4, xs, CT_F32, CT_CPU);
        ct_tensor *c = ct_tensor_ones(3, ts, CT_F32, CT_CPU), *s = ct_tensor_ones(3, ts, CT_F32, CT_CPU);
        ct_tensor *y = ct_rope(x, c, s, (ct_rope_layout)layout);
        check_shape(y, 4, xs);
        ct_tensor *z = ct_rope_backward(y, c, s, (ct_rope_layout)layout);
        check_shape(z, 4, xs);
        ct_tensor *all[] = {x, c, s, y, z};
        release_all(5, all);
    }
}

/* ---- rope: gradients ------------------------------------------------------------------ */

typedef struct rope_gc {
    ct_tensor *c, *s;
    int layout;
    bool transposed; /* x comes as [B, H, T, D] and is turned as [B, T, H, D] */
} rope_gc;

static ct_tensor *gc_rope(ct_tensor *const *in, void *ctx) {
    rope_gc *g = ctx;
    if (!g->transposed) return ct_rope(in[0], g->c, g->s, (ct_rope_layout)g->layout);
    ct_tensor *t = ct_transpose(in[0], 1, 2);
    ct_tensor *y = ct_rope(t, g->c, g->s, (ct_rope_layout)g->layout);
    ct_tensor_release(t);
    return y;
}

static void test_rope_gradcheck(void **state) {
    (void)state;
    for (int layout = 0; layout < 2; layout++)
        for (int style = 0; style < 3; style++) {
            rope_geo g = rand_geo(style);
            double *cv, *sv;
            rope_gc ctx = {.layout = layout};
            rand_tables(g.tnd, g.ts, CT_F64, &ctx.c, &ctx.s, &cv, &sv);
            /* the tables require grad too: they are no input of the node */
            assert_int_equal(ct_requires_grad_(ctx.c, true), CT_OK);
            int64_t xs[4];
            memcpy(xs, g.xs, sizeof xs);
            ctx.transposed = g.bthd && layout == 1;
            if (ctx.transposed) { /* the leaf is [B, H, T, D] */
                xs[1] = g.xs[2];
                xs[2] = g.xs[1];
            }
            double *xv = tu_rand_vals(tu_numel(g.nd, xs), CT_F64, -2, 2);
            ct_tensor *x = leaf_of(xv, g.nd, xs, CT_F64);
            gradcheck_ok("rope", gc_rope, &ctx, 1, &x);
            ct_tensor *all[] = {x, ctx.c, ctx.s};
            release_all(3, all);
            free(xv);
            free(cv);
            free(sv);
        }
}

/* Autograd in f32: x's gradient is ct_rope_backward's, cos and sin (which
 * require grad here) get none. */
static void test_rope_autograd(void **state) {
    (void)state;
    for (int layout = 0; layout < 2; layout++) {
        rope_geo g = rand_geo(0);
        int64_t n = tu_numel(g.nd, g.xs);
        double *cv, *sv, *gv, *xv = tu_rand_vals(n, CT_F32, -2, 2);
        ct_tensor *c, *s;
        rand_tables(g.tnd, g.ts, CT_F32, &c, &s, &cv, &sv);
        assert_int_equal(ct_requires_grad_(c, true), CT_OK);
        assert_int_equal(ct_requires_grad_(s, true), CT_OK);
        ct_tensor *x = leaf_of(xv, g.nd, g.xs, CT_F32);
        ct_tensor *go = tu_rand(g.nd, g.xs, CT_F32, -1, 1, &gv);
        ct_tensor *y = ct_rope(x, c, s, (ct_rope_layout)layout);
        assert_non_null(y);
        assert_int_equal(ct_backward(y, go, false), CT_OK);
        double *ref = malloc(sizeof(double) * (size_t)n);
        ref_rope(gv, g.nd, g.xs, cv, sv, g.tnd, g.ts, layout, -1, ref);
        ct_tensor *gx = ct_grad(x);
        check_values(gx, ref, n, 1e-5, 4e-6);
        assert_null(ct_grad(c));
        assert_null(ct_grad(s));
        ct_tensor *all[] = {x, c, s, go, y}; /* the gradients are borrowed */
        release_all(5, all);
        free(xv);
        free(cv);
        free(sv);
        free(gv);
        free(ref);
    }
}

/* ---- swiglu ----------------------------------------------------------------------------- */

static double sig(double x) { return 1 / (1 + exp(-x)); }

static void rand_shape(int *nd, int64_t *shape) {
    *nd = (int)tu_randint(1, 4);
    for (int i = 0; i < *nd; i++) shape[i] = tu_randint(1, 12);
    if (tu_randint(0, 4) == 0) shape[*nd - 1] = tu_randint(300, 1400); /* past the f32 blocks */
}

static ct_tensor *maybe_nc(ct_tensor *t, bool nc) {
    if (!nc) return t;
    ct_tensor *v = tu_noncontig(t);
    ct_tensor_release(t);
    return v;
}

/* float64 references, rounded to dt: y = silu(g) u and the gradients of g
 * and u for grad_out o (new arrays; the caller frees them). */
static void swiglu_refs(const double *gv, const double *uv, const double *ov, int64_t n,
                        ct_dtype dt, double **ry, double **rg, double **ru) {
    *ry = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    *rg = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    *ru = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    assert_true(*ry && *rg && *ru);
    for (int64_t i = 0; i < n; i++) {
        double s = sig(gv[i]);
        (*ry)[i] = tu_round(gv[i] * s * uv[i], dt);
        (*rg)[i] = tu_round(ov[i] * uv[i] * s * (1 + gv[i] * (1 - s)), dt);
        (*ru)[i] = tu_round(ov[i] * gv[i] * s, dt);
    }
}

static void swiglu_case(ct_dtype dt, bool nc) {
    int nd;
    int64_t shape[4];
    rand_shape(&nd, shape);
    int64_t n = tu_numel(nd, shape);
    double *gv, *uv, *ov;
    ct_tensor *g = maybe_nc(tu_rand(nd, shape, dt, -8, 8, &gv), nc);
    ct_tensor *u = maybe_nc(tu_rand(nd, shape, dt, -3, 3, &uv), nc);
    ct_tensor *go = maybe_nc(tu_rand(nd, shape, dt, -2, 2, &ov), nc);
    double *ry, *rg, *ru;
    swiglu_refs(gv, uv, ov, n, dt, &ry, &rg, &ru);
    poison_output(nd, shape, dt);
    ct_tensor *y = ct_swiglu(g, u);
    if (!y) fprintf(stderr, "swiglu: %s\n", ct_last_error());
    expect(y, ry, nd, shape, dt);
    /* both gradients, then each alone */
    for (int want = 3; want >= 1; want--) {
        ct_tensor *dg = NULL, *du = NULL;
        poison_output(nd, shape, dt);
        poison_output(nd, shape, dt);
        assert_int_equal(ct_swiglu_backward(go, g, u, want & 1 ? &dg : NULL, want & 2 ? &du : NULL),
                         CT_OK);
        if (want & 1) expect(dg, rg, nd, shape, dt);
        if (want & 2) expect(du, ru, nd, shape, dt);
        ct_tensor_release(dg);
        ct_tensor_release(du);
    }
    ct_tensor *all[] = {g, u, go, y};
    release_all(4, all);
    free(gv);
    free(uv);
    free(ov);
    free(ry);
    free(rg);
    free(ru);
}

static void test_swiglu(void **state) {
    (void)state;
    for (size_t t = 0; t < 4; t++)
        for (int rep = 0; rep < 6; rep++) swiglu_case(tu_float_dtypes[t], rep % 2 == 1);
}

static void test_swiglu_empty(void **state) {
    (void)state;
    int64_t shape[2] = {3, 0};
    ct_tensor *g = ct_tensor_zeros(2, shape, CT_BF16, CT_CPU), *u = ct_tensor_zeros(2, shape, CT_BF16, CT_CPU);
    ct_tensor *y = ct_swiglu(g, u);
    check_shape(y, 2, shape);
    ct_tensor *dg = NULL, *du = NULL;
    assert_int_equal(ct_swiglu_backward(y, g, u, &dg, &du), CT_OK);
    check_shape(dg, 2, shape);
    check_shape(du, 2, shape);
    ct_tensor *all[] = {g, u, y, dg, du};
    release_all(5, all);
}

static ct_tensor *gc_swiglu(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    return ct_swiglu(in[0], in[1]);
}

static void test_swiglu_gradcheck(void **state) {
    (void)state;
    for (int rep = 0; rep < 3; rep++) {
        int64_t shape[3] = {tu_randint(1, 4), tu_randint(1, 5), tu_randint(1, 7)};
        double *gv = tu_rand_vals(tu_numel(3, shape), CT_F64, -5, 5);
        double *uv = tu_rand_vals(tu_numel(3, shape), CT_F64, -2, 2);
        ct_tensor *in[2] = {leaf_of(gv, 3, shape, CT_F64), leaf_of(uv, 3, shape, CT_F64)};
        if (rep == 2) assert_int_equal(ct_requires_grad_(in[1], false), CT_OK);
        gradcheck_ok("swiglu", gc_swiglu, NULL, 2, in);
        release_all(2, in);
        free(gv);
        free(uv);
    }
}

/* Autograd: only the inputs that require grad get one, equal to the fused backward's. */
static void test_swiglu_autograd(void **state) {
    (void)state;
    for (int which = 0; which < 3; which++) { /* both, gate only, up only */
        int64_t shape[2] = {5, 33};
        double *gv = tu_rand_vals(165, CT_F32, -6, 6), *uv = tu_rand_vals(165, CT_F32, -2, 2), *ov;
        ct_tensor *g = leaf_of(gv, 2, shape, CT_F32), *u = leaf_of(uv, 2, shape, CT_F32);
        if (which == 1) assert_int_equal(ct_requires_grad_(u, false), CT_OK);
        if (which == 2) assert_int_equal(ct_requires_grad_(g, false), CT_OK);
        ct_tensor *go = tu_rand(2, shape, CT_F32, -1, 1, &ov);
        ct_tensor *y = ct_swiglu(g, u);
        assert_int_equal(ct_backward(y, go, false), CT_OK);
        double rg[165], ru[165];
        for (int i = 0; i < 165; i++) {
            double s = sig(gv[i]);
            rg[i] = ov[i] * uv[i] * s * (1 + gv[i] * (1 - s));
            ru[i] = ov[i] * gv[i] * s;
        }
        ct_tensor *dg = ct_grad(g), *du = ct_grad(u);
        if (which != 2) check_values(dg, rg, 165, 1e-5, 1e-6);
        else assert_null(dg);
        if (which != 1) check_values(du, ru, 165, 1e-5, 1e-6);
        else assert_null(du);
        ct_tensor *all[] = {g, u, go, y}; /* the gradients are borrowed */
        release_all(4, all);
        free(gv);
        free(uv);
        free(ov);
    }
}

/* ---- swiglu on rows read in place: chunk halves, narrow views ------------------------- */

/* Lines of the trace of op name (its lines start "[cten] name "). */
static int traced_ops(const char *trace, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "[cten] %s ", name);
    int n = 0;
    for (const char *l = trace; (l = strstr(l, key)); l++) n++;
    return n;
}

/* Runs ct_swiglu and ct_swiglu_backward (both gradients) under the trace;
 * returns how many copy ops ran, the outputs in *y, *dg, *du. */
static int traced_copies(ct_tensor *go, ct_tensor *g, ct_tensor *u, ct_tensor **y,
                         ct_tensor **dg, ct_tensor **du) {
    tu_trace tr = tu_trace_begin();
    *y = ct_swiglu(g, u);
    ct_status st = ct_swiglu_backward(go, g, u, dg, du);
    char *trace = tu_trace_end(&tr);
    assert_non_null(*y);
    assert_int_equal(st, CT_OK);
    int copies = traced_ops(trace, "copy");
    free(trace);
    return copies;
}

/* Values of t, a [rows, cols] view at column off of a row-major [rows, width]
 * block bv (caller frees). */
static double *strip_vals(const double *bv, int64_t rows, int64_t cols, int64_t width,
                          int64_t off) {
    double *v = malloc(sizeof(double) * (size_t)(rows * cols > 0 ? rows * cols : 1));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < cols; j++) v[r * cols + j] = bv[r * width + off + j];
    return v;
}

/* A fresh random [lead..., width] tensor narrowed to columns [off, off +
 * shape[nd - 1]), with the view's values in *vals. */
static ct_tensor *rand_strip(int nd, const int64_t *shape, int64_t width, int64_t off,
                             ct_dtype dt, double lo, double hi, double **vals) {
    int64_t bs[4];
    memcpy(bs, shape, sizeof(int64_t) * (size_t)nd);
    bs[nd - 1] = width;
    double *bv;
    ct_tensor *b = tu_rand(nd, bs, dt, lo, hi, &bv);
    ct_tensor *v = ct_narrow(b, nd - 1, off, shape[nd - 1]);
    assert_non_null(v);
    ct_tensor_release(b);
    *vals = strip_vals(bv, tu_numel(nd - 1, shape), shape[nd - 1], width, off);
    free(bv);
    return v;
}

/* Column counts: 1, odd ones (no row start but the first is 16-byte
 * aligned), whole vectors of every dtype, and rows past the f32 blocks. */
static int64_t rows_cols(int rep) {
    static const int64_t cs[] = {1, 3, 7, 8, 16, 33, 301};
    return rep < 7 ? cs[rep] : tu_randint(520, 1400);
}

/* how 0: gate and up the halves of ct_chunk(h, 2, -1), grad_out contiguous;
 * 1: grad_out a chunk half too; 2: each operand a narrow view at an odd
 * column of its own wider tensor; 3: chunk halves of a tensor whose leading
 * dims are transposed (they do not fold into rows: copied first). */
static void swiglu_rows_case(ct_dtype dt, int64_t cols, int how) {
    int nd = (int)tu_randint(2, 4);
    int64_t shape[4];
    for (int i = 0; i < nd - 1; i++) shape[i] = tu_randint(1, 6);
    shape[nd - 1] = cols;
    int64_t rows = tu_numel(nd - 1, shape), n = rows * cols;
    double *gv, *uv, *ov;
    ct_tensor *g, *u, *go, *h = NULL;
    bool strided = false; /* the inputs have no row form: copies expected */
    if (how == 2) {
        g = rand_strip(nd, shape, cols + 3, 1, dt, -8, 8, &gv);
        u = rand_strip(nd, shape, 2 * cols + 5, cols + 2, dt, -3, 3, &uv);
        go = rand_strip(nd, shape, cols + 1, 1, dt, -2, 2, &ov);
    } else {
        int64_t hs[4];
        memcpy(hs, shape, sizeof hs);
        hs[nd - 1] = 2 * cols;
        double *hv;
        h = tu_rand(nd, hs, dt, -8, 8, &hv);
        if (how == 3) { /* the same values, leading dims 0 and 1 held transposed */
            int64_t ts[4];
            memcpy(ts, hs, sizeof ts);
            ts[0] = hs[1];
            ts[1] = hs[0];
            ct_tensor *tv = ct_transpose(h, 0, 1);
            ct_tensor *t = ct_contiguous(tv);
            ct_tensor *back = ct_transpose(t, 0, 1);
            assert_non_null(back);
            ct_tensor *tmp[] = {tv, t, h};
            release_all(3, tmp);
            h = back;
            /* 2-d: the last dim gets stride hs[0], unless the halves are one column */
            strided = hs[0] > 1 && hs[1] > 1 && !(nd == 2 && cols == 1);
        }
        ct_tensor *pc[2];
        int np = 0;
        assert_int_equal(ct_chunk(h, 2, -1, 2, pc, &np), CT_OK);
        assert_int_equal(np, 2);
        g = pc[0];
        u = pc[1];
        gv = strip_vals(hv, rows, cols, 2 * cols, 0);
        uv = strip_vals(hv, rows, cols, 2 * cols, cols);
        free(hv);
        if (how == 1) go = rand_strip(nd, shape, 2 * cols, cols, dt, -2, 2, &ov);
        else go = tu_rand(nd, shape, dt, -2, 2, &ov);
    }
    double *ry, *rg, *ru;
    swiglu_refs(gv, uv, ov, n, dt, &ry, &rg, &ru);
    for (int k = 0; k < 3; k++) poison_output(nd, shape, dt);
    ct_tensor *y, *dg = NULL, *du = NULL;
    int copies = traced_copies(go, g, u, &y, &dg, &du);
    /* the count is seen to work where copies must happen */
    if (strided ? copies == 0 : copies != 0) {
        fprintf(stderr, "swiglu rows (how %d, cols %lld): %d copies, expected %s\n", how,
                (long long)cols, copies, strided ? "some" : "none");
        fail();
    }
    expect(y, ry, nd, shape, dt);
    /* gate and up chunk halves: dgate and dup fill one buffer of h's shape */
    if (how <= 1) assert_true(halves_of_one(dg, du));
    else if (!halves_of_one(dg, du))
        assert_true(ct_tensor_is_contiguous(dg) && ct_tensor_is_contiguous(du));
    expect_vals(dg, rg, nd, shape, dt);
    expect_vals(du, ru, nd, shape, dt);
    ct_tensor_release(dg);
    ct_tensor_release(du);
    /* each gradient alone */
    for (int want = 2; want >= 1; want--) {
        dg = du = NULL;
        poison_output(nd, shape, dt);
        assert_int_equal(ct_swiglu_backward(go, g, u, want & 1 ? &dg : NULL, want & 2 ? &du : NULL),
                         CT_OK);
        if (want & 1) expect(dg, rg, nd, shape, dt);
        else expect(du, ru, nd, shape, dt);
        ct_tensor_release(dg);
        ct_tensor_release(du);
    }
    ct_tensor *all[] = {g, u, go, y, h};
    release_all(h ? 5 : 4, all);
    free(gv);
    free(uv);
    free(ov);
    free(ry);
    free(rg);
    free(ru);
}

static void test_swiglu_rows(void **state) {
    (void)state;
    for (size_t t = 0; t < 4; t++)
        for (int rep = 0; rep < 8; rep++)
            for (int how = 0; how < 4; how++)
                swiglu_rows_case(tu_float_dtypes[t], rows_cols(rep), how);
}

/* h -> chunk(h, 2, -1) -> swiglu: h's gradient through the chunk views. */
static ct_tensor *gc_chunk_swiglu(ct_tensor *const *in, void *ctx) {
    (void)ctx;
    ct_tensor *pc[2];
    int np = 0;
    if (ct_chunk(in[0], 2, -1, 2, pc, &np) != CT_OK) return NULL;
    ct_tensor *y = ct_swiglu(pc[0], pc[1]);
    ct_tensor_release(pc[0]);
    ct_tensor_release(pc[1]);
    return y;
}

/* narrow views at odd offsets of one tensor, overlapping: both gradients add up in it. */
static ct_tensor *gc_narrow_swiglu(ct_tensor *const *in, void *ctx) {
    int64_t cols = *(const int64_t *)ctx;
    ct_tensor *g = ct_narrow(in[0], -1, 1, cols), *u = ct_narrow(in[0], -1, 2, cols);
    ct_tensor *y = g && u ? ct_swiglu(g, u) : NULL;
    ct_tensor_release(g);
    ct_tensor_release(u);
    return y;
}

static void test_swiglu_chunk_gradcheck(void **state) {
    (void)state;
    for (int rep = 0; rep < 4; rep++) {
        int64_t cols = rep == 0 ? 1 : tu_randint(2, 9);
        int64_t shape[3] = {tu_randint(1, 4), tu_randint(1, 4), 2 * cols};
        double *hv = tu_rand_vals(tu_numel(3, shape), CT_F64, -4, 4);
        ct_tensor *in[1] = {leaf_of(hv, 3, shape, CT_F64)};
        gradcheck_ok("chunk -> swiglu", gc_chunk_swiglu, NULL, 1, in);
        if (cols >= 2) gradcheck_ok("narrow -> swiglu", gc_narrow_swiglu, &cols, 1, in);
        release_all(1, in);
        free(hv);
    }
}

/* The float32 gradient of h through chunk -> swiglu, against the reference:
 * dgate in h's first half of each row, dup in its second, written there by
 * swiglu_backward: the backward runs that op alone (no zero fill, copy, cat
 * or sum). */
static void test_swiglu_chunk_autograd(void **state) {
    (void)state;
    enum { R = 6, C = 37 };
    int64_t hs[2] = {R, 2 * C}, ys[2] = {R, C};
    double *hv = tu_rand_vals(R * 2 * C, CT_F32, -6, 6), *ov;
    ct_tensor *h = leaf_of(hv, 2, hs, CT_F32);
    ct_tensor *go = tu_rand(2, ys, CT_F32, -1, 1, &ov);
    ct_tensor *y = gc_chunk_swiglu(&h, NULL);
    assert_non_null(y);
    tu_trace tr = tu_trace_begin();
    ct_status st = ct_backward(y, go, false);
    char *trace = tu_trace_end(&tr);
    assert_int_equal(st, CT_OK);
    int ops = 0;
    for (const char *l = trace; (l = strstr(l, "[cten] ")); l++) ops++;
    if (ops != 1 || traced_ops(trace, "swiglu_backward") != 1) {
        fprintf(stderr, "chunk -> swiglu backward: expected swiglu_backward alone:\n%s", trace);
        fail();
    }
    free(trace);
    double rh[R * 2 * C];
    for (int r = 0; r < R; r++)
        for (int j = 0; j < C; j++) {
            double g = hv[r * 2 * C + j], u = hv[r * 2 * C + C + j], o = ov[r * C + j], s = sig(g);
            rh[r * 2 * C + j] = o * u * s * (1 + g * (1 - s));
            rh[r * 2 * C + C + j] = o * g * s;
        }
    check_values(ct_grad(h), rh, R * 2 * C, 1e-5, 1e-6);
    ct_tensor *all[] = {h, go, y};
    release_all(3, all);
    free(hv);
    free(ov);
}

/* ---- bad input -------------------------------------------------------------------------- */

static void test_rope_bad_input(void **state) {
    (void)state;
    ct_tensor *x = ct_tensor_zeros(3, (int64_t[]){2, 3, 8}, CT_F32, CT_CPU);
    ct_tensor *x5 = ct_tensor_zeros(2, (int64_t[]){3, 5}, CT_F32, CT_CPU);
    ct_tensor *xi = ct_tensor_zeros(2, (int64_t[]){3, 8}, CT_I64, CT_CPU);
    ct_tensor *x0 = ct_tensor_zeros(0, NULL, CT_F32, CT_CPU);
    ct_tensor *c = ct_tensor_ones(2, (int64_t[]){3, 4}, CT_F32, CT_CPU);
    ct_tensor *s = ct_tensor_ones(2, (int64_t[]){3, 4}, CT_F32, CT_CPU);
    ct_tensor *cd = ct_tensor_ones(2, (int64_t[]){3, 4}, CT_F64, CT_CPU);
    ct_tensor *c1 = ct_tensor_ones(2, (int64_t[]){1, 4}, CT_F32, CT_CPU);
    ct_tensor *c5 = ct_tensor_ones(2, (int64_t[]){3, 5}, CT_F32, CT_CPU);
    ct_tensor *c2 = ct_tensor_ones(2, (int64_t[]){2, 4}, CT_F32, CT_CPU);
    ct_tensor *cbig = ct_tensor_ones(4, (int64_t[]){1, 2, 3, 4}, CT_F32, CT_CPU);
    const ct_rope_layout H = CT_ROPE_HALF;

    tu_assert_null_error(ct_rope(NULL, c, s, H), CT_ERR_INVALID_ARG, "ct_rope", "NULL");
    tu_assert_null_error(ct_rope(x, NULL, s, H), CT_ERR_INVALID_ARG, "ct_rope", "NULL");
    tu_assert_null_error(ct_rope(x, c, NULL, H), CT_ERR_INVALID_ARG, "ct_rope", "NULL");
    tu_assert_null_error(ct_rope(xi, c, s, H), CT_ERR_DTYPE, "ct_rope", "floating", "int64");
    tu_assert_null_error(ct_rope(x, c, s, (ct_rope_layout)2), CT_ERR_INVALID_ARG, "ct_rope",
                         "layout", "CT_ROPE_HALF", "got 2");
    tu_assert_null_error(ct_rope(x0, c, s, H), CT_ERR_SHAPE, "ct_rope", "at least one dim");
    tu_assert_null_error(ct_rope(x5, c5, c5, H), CT_ERR_SHAPE, "ct_rope", "must be even",
                         "got 5", "[3, 5]");
    tu_assert_null_error(ct_rope(x, cd, s, H), CT_ERR_DTYPE, "ct_rope", "cos", "float64",
                         "float32");
    tu_assert_null_error(ct_rope(x, c, cd, H), CT_ERR_DTYPE, "ct_rope", "sin", "float64");
    /* float32 tables go with a 16-bit x only; 16-bit or float64 tables with x's dtype only */
    ct_tensor *xb = ct_tensor_zeros(3, (int64_t[]){2, 3, 8}, CT_BF16, CT_CPU);
    ct_tensor *cb = ct_tensor_ones(2, (int64_t[]){3, 4}, CT_BF16, CT_CPU);
    ct_tensor *ch = ct_tensor_ones(2, (int64_t[]){3, 4}, CT_F16, CT_CPU);
    tu_assert_null_error(ct_rope(xb, cd, cd, H), CT_ERR_DTYPE, "ct_rope", "cos and sin",
                         "float64", "bfloat16", "float32 beside float16/bfloat16");
    tu_assert_null_error(ct_rope(xb, ch, ch, H), CT_ERR_DTYPE, "ct_rope", "float16", "bfloat16");
    tu_assert_null_error(ct_rope(x, cb, cb, H), CT_ERR_DTYPE, "ct_rope", "bfloat16", "float32");
    tu_assert_null_error(ct_rope(xb, c, cb, H), CT_ERR_DTYPE, "ct_rope", "sin", "bfloat16",
                         "cos", "float32");
    tu_assert_null_error(ct_rope_backward(xb, cd, cd, H), CT_ERR_DTYPE, "ct_rope_backward",
                         "grad_out", "float64");
    ct_tensor *yb = ct_rope(xb, c, s, H);
    assert_non_null(yb);
    assert_int_equal(ct_tensor_dtype(yb), CT_BF16);
    ct_tensor *more[] = {xb, cb, ch, yb};
    release_all(4, more);
    tu_assert_null_error(ct_rope(x, c, c1, H), CT_ERR_SHAPE, "ct_rope", "sin", "[1, 4]",
                         "shape of cos", "[3, 4]");
    tu_assert_null_error(ct_rope(x, c5, c5, H), CT_ERR_SHAPE, "ct_rope", "[3, 5]",
                         "[..., 4]", "broadcast", "[2, 3, 8]");
    tu_assert_null_error(ct_rope(x, c2, c2, H), CT_ERR_SHAPE, "ct_rope", "[2, 4]", "broadcast");
    tu_assert_null_error(ct_rope(x, cbig, cbig, H), CT_ERR_SHAPE, "ct_rope", "[1, 2, 3, 4]");
    tu_assert_null_error(ct_rope_backward(xi, c, s, H), CT_ERR_DTYPE, "ct_rope_backward",
                         "grad_out", "int64");
    tu_assert_null_error(ct_rope_backward(x, c5, c5, (ct_rope_layout)-1), CT_ERR_INVALID_ARG,
                         "ct_rope_backward", "layout", "got -1");
    tu_assert_null_error(ct_rope_backward(x5, c5, c5, H), CT_ERR_SHAPE, "ct_rope_backward",
                         "grad_out", "even");
    /* broadcasting size-1 table dims and fewer table dims are fine */
    ct_tensor *y = ct_rope(x, c1, c1, H);
    assert_non_null(y);
    ct_tensor_release(y);

    ct_tensor *tc = NULL, *ts = NULL;
    tu_assert_error(ct_rope_tables(4, 8, 10000, CT_F32, CT_CPU, NULL, &ts), CT_ERR_INVALID_ARG,
                    "ct_rope_tables", "cos", "NULL");
    tu_assert_error(ct_rope_tables(4, 8, 10000, CT_F32, CT_CPU, &tc, NULL), CT_ERR_INVALID_ARG,
                    "ct_rope_tables", "sin", "NULL");
    tu_assert_error(ct_rope_tables(-1, 8, 10000, CT_F32, CT_CPU, &tc, &ts), CT_ERR_INVALID_ARG,
                    "ct_rope_tables", "seq_len", "got -1");
    tu_assert_error(ct_rope_tables(4, 7, 10000, CT_F32, CT_CPU, &tc, &ts), CT_ERR_INVALID_ARG,
                    "ct_rope_tables", "dim", "even", "got 7");
    tu_assert_error(ct_rope_tables(4, 0, 10000, CT_F32, CT_CPU, &tc, &ts), CT_ERR_INVALID_ARG,
                    "ct_rope_tables", "dim", "got 0");
    tu_assert_error(ct_rope_tables(4, 8, 0, CT_F32, CT_CPU, &tc, &ts), CT_ERR_INVALID_ARG,
                    "ct_rope_tables", "base", "got 0");
    tu_assert_error(ct_rope_tables(4, 8, NAN, CT_F32, CT_CPU, &tc, &ts), CT_ERR_INVALID_ARG,
                    "ct_rope_tables", "base");
    tu_assert_error(ct_rope_tables(4, 8, 10000, CT_I32, CT_CPU, &tc, &ts), CT_ERR_DTYPE,
                    "ct_rope_tables", "floating", "int32");
    tu_assert_error(ct_rope_tables(INT64_MAX / 2, 8, 10000, CT_F32, CT_CPU, &tc, &ts),
                    CT_ERR_OVERFLOW, "ct_rope_tables", "overflows");
    assert_null(tc);
    assert_null(ts);
    ct_tensor *all[] = {x, x5, xi, x0, c, s, cd, c1, c5, c2, cbig};
    release_all(11, all);
}

static void test_swiglu_bad_input(void **state) {
    (void)state;
    ct_tensor *g = ct_tensor_zeros(2, (int64_t[]){3, 4}, CT_F32, CT_CPU);
    ct_tensor *u = ct_tensor_zeros(2, (int64_t[]){3, 4}, CT_F32, CT_CPU);
    ct_tensor *u5 = ct_tensor_zeros(2, (int64_t[]){3, 5}, CT_F32, CT_CPU);
    ct_tensor *ud = ct_tensor_zeros(2, (int64_t[]){3, 4}, CT_F64, CT_CPU);
    ct_tensor *gi = ct_tensor_zeros(2, (int64_t[]){3, 4}, CT_I32, CT_CPU);
    tu_assert_null_error(ct_swiglu(NULL, u), CT_ERR_INVALID_ARG, "ct_swiglu", "NULL");
    tu_assert_null_error(ct_swiglu(g, NULL), CT_ERR_INVALID_ARG, "ct_swiglu", "NULL");
    tu_assert_null_error(ct_swiglu(gi, gi), CT_ERR_DTYPE, "ct_swiglu", "floating", "int32");
    tu_assert_null_error(ct_swiglu(g, ud), CT_ERR_DTYPE, "ct_swiglu", "up", "float64", "gate",
                         "float32");
    tu_assert_null_error(ct_swiglu(g, u5), CT_ERR_SHAPE, "ct_swiglu", "up", "[3, 5]", "gate",
                         "[3, 4]");
    ct_tensor *dg = NULL, *du = NULL;
    tu_assert_error(ct_swiglu_backward(g, g, u, NULL, NULL), CT_ERR_INVALID_ARG,
                    "ct_swiglu_backward", "nothing to compute");
    tu_assert_error(ct_swiglu_backward(NULL, g, u, &dg, &du), CT_ERR_INVALID_ARG,
                    "ct_swiglu_backward", "NULL");
    tu_assert_error(ct_swiglu_backward(u5, g, u, &dg, &du), CT_ERR_SHAPE, "ct_swiglu_backward",
                    "grad_out", "[3, 5]");
    tu_assert_error(ct_swiglu_backward(ud, g, u, &dg, &du), CT_ERR_DTYPE, "ct_swiglu_backward",
                    "grad_out", "float64");
    tu_assert_error(ct_swiglu_backward(g, g, u5, &dg, &du), CT_ERR_SHAPE, "ct_swiglu_backward",
                    "up");
    assert_null(dg);
    assert_null(du);
    ct_tensor *all[] = {g, u, u5, ud, gi};
    release_all(5, all);
}

int main(void) {
    tu_seed();
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_rope_forward),   T(test_rope_backward),    T(test_rope_large),
        T(test_rope_f32_tables),
        T(test_rope_round_trip), T(test_rope_tables),     T(test_rope_empty),
        T(test_rope_gradcheck), T(test_rope_autograd),    T(test_swiglu),
        T(test_swiglu_empty),   T(test_swiglu_gradcheck), T(test_swiglu_autograd),
        T(test_rope_bad_input), T(test_swiglu_bad_input), T(test_swiglu_rows),
        T(test_swiglu_chunk_gradcheck), T(test_swiglu_chunk_autograd),
    };
#undef T
    return tu_run_tests(tests);
}
