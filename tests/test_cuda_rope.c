/* The CUDA rope and swiglu kernels, forward and backward, against the CPU
 * backend's (which tests/test_rope.c checks against float64 references) on
 * the same inputs: every floating dtype, both pair layouts, tables broadcast
 * as [T, 1, D/2] and [T, D/2], head dims whose halves do and do not fill
 * 16-byte vectors, x transposed (strided leading dims, vector path) and
 * sliced off alignment (element path), non-contiguous tables, many rows,
 * swiglu lengths with partial vectors and misaligned inputs, swiglu on rows
 * read in place (chunk halves, narrow views off the vector grid), each backward
 * output alone, ct_rope_tables on the device, autograd on the GPU against the
 * CPU, and the messages for inputs on mixed devices. Output memory is
 * poisoned with NaN before each op writes it. Skips without a GPU. */
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

static int ngpu;

#define NEED_GPU()             \
    do {                       \
        if (ngpu == 0) skip(); \
    } while (0)

static ct_tensor *gpu(ct_tensor *t) { return checked(ct_to_device(t, CT_CUDA(0))); }

/* Fills freed device blocks of about `bytes` with NaN, so an output the
 * caching allocator hands out next from them starts as NaN. */
static void poison(int64_t bytes) {
    int64_t n = bytes / 4 + 1;
    ct_tensor *t = checked(ct_tensor_empty(1, &n, CT_F32, CT_CUDA(0)));
    ok(ct_fill_(t, NAN));
    ct_tensor_release(t);
}

/* GPU against CPU: both compute f16/bf16/f32 in f32 and round once, so they
 * differ by the last bit of f32 math (exp, fused multiply-adds) and, rarely,
 * by one rounding of the 16-bit result. */
static double tol_of(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-12;
    case CT_F32: return 2e-6;
    default: return tu_rtol(dt);
    }
}

static void expect_close(ct_tensor *got, ct_tensor *ref, double scale) {
    assert_non_null(got);
    assert_non_null(ref);
    assert_int_equal(ct_tensor_device(got).type, CT_DEVICE_CUDA);
    assert_int_equal(ct_tensor_dtype(got), ct_tensor_dtype(ref));
    assert_int_equal(ct_tensor_ndim(got), ct_tensor_ndim(ref));
    for (int i = 0; i < ct_tensor_ndim(ref); i++)
        assert_int_equal(ct_tensor_shape(got)[i], ct_tensor_shape(ref)[i]);
    int64_t n = ct_tensor_numel(ref);
    double *g = tu_values(got), *r = tu_values(ref);
    double t = scale * tol_of(ct_tensor_dtype(ref));
    tu_assert_close(g, r, n, t, t);
    free(g);
    free(r);
}

static void expect_same(ct_tensor *got, ct_tensor *ref) { expect_close(got, ref, 1); }

/* cos and sin of random angles, rounded to dt, of shape ts (CPU). */
static void rand_tables(int tnd, const int64_t *ts, ct_dtype dt, ct_tensor **c, ct_tensor **s) {
    int64_t n = tu_numel(tnd, ts);
    double *cv = malloc(sizeof(double) * (size_t)(n ? n : 1));
    double *sv = malloc(sizeof(double) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        double a = tu_uniform(-4, 4);
        cv[i] = cos(a);
        sv[i] = sin(a);
    }
    *c = checked(tu_from_f64(cv, tnd, ts, dt));
    *s = checked(tu_from_f64(sv, tnd, ts, dt));
    free(cv);
    free(sv);
}

/* x (in the current scope, as the result) in one of four layouts: x itself; a
 * transposed [B, H, T, D] tensor seen as [B, T, H, D]; a slice [..., 1:D+1]
 * of rows of D + 2 (last dim contiguous, every row off the 16-byte grid); x's
 * values at stride 2 everywhere (a contiguous copy). */
static ct_tensor *x_layout(ct_tensor *x, int how) {
    int nd = ct_tensor_ndim(x);
    const int64_t *sh = ct_tensor_shape(x);
    ct_tensor *r = NULL;
    if (how == 1 && nd == 4) {
        ct_tensor *t = checked(ct_transpose(x, 1, 2));
        ct_tensor *tc = checked(ct_contiguous(t));
        r = checked(ct_transpose(tc, 1, 2));
        ct_tensor_release(t);
        ct_tensor_release(tc);
    } else if (how == 2) {
        int64_t big[CT_MAX_DIMS];
        memcpy(big, sh, sizeof(int64_t) * (size_t)nd);
        big[nd - 1] += 2;
        ct_tensor *b = checked(ct_tensor_zeros(nd, big, ct_tensor_dtype(x), ct_tensor_device(x)));
        r = checked(ct_narrow(b, nd - 1, 1, sh[nd - 1]));
        ok(ct_copy_(r, x));
        ct_tensor_release(b);
    } else if (how == 3) {
        r = checked(tu_noncontig(x));
    } else {
        r = x;
    }
    return r;
}

typedef struct geo {
    int nd, tnd;
    int64_t xs[4], ts[4];
} geo;

static geo rand_geo(int style, int64_t D) {
    int64_t B = tu_randint(1, 4), T = tu_randint(1, 20), H = tu_randint(1, 6);
    switch (style) {
    case 0: return (geo){4, 3, {B, T, H, D}, {T, 1, D / 2}};
    case 1: return (geo){4, 2, {B, H, T, D}, {T, D / 2}};
    case 2: return (geo){2, 2, {T * H, D}, {T * H, D / 2}};
    default: return (geo){1, 1, {D}, {D / 2}};
    }
}

/* tdt: the tables' dtype, x's or float32 beside a 16-bit x. */
static void rope_case(ct_dtype dt, ct_dtype tdt, const geo *g, int layout, int how,
                      bool nc_tables) {
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = checked(tu_rand(g->nd, g->xs, dt, -2, 2, NULL));
    ct_tensor *gr = checked(tu_rand(g->nd, g->xs, dt, -1, 1, NULL));
    ct_tensor *c, *s;
    rand_tables(g->tnd, g->ts, tdt, &c, &s);
    if (nc_tables) {
        c = checked(tu_noncontig(c));
        s = checked(tu_noncontig(s));
    }
    ct_tensor *xg = x_layout(gpu(x), how), *grg = x_layout(gpu(gr), how);
    ct_tensor *cg = gpu(c), *sg = gpu(s);
    if (nc_tables) {
        cg = checked(tu_noncontig(cg));
        sg = checked(tu_noncontig(sg));
    }
    int64_t bytes = ct_tensor_numel(x) * (int64_t)ct_dtype_size(dt);
    ct_rope_layout L = (ct_rope_layout)layout;
    poison(bytes);
    ct_tensor *y = checked(ct_rope(xg, cg, sg, L));
    expect_same(y, checked(ct_rope(x, c, s, L)));
    poison(bytes);
    ct_tensor *dx = checked(ct_rope_backward(grg, cg, sg, L));
    expect_same(dx, checked(ct_rope_backward(gr, c, s, L)));
    ct_scope_end(sc);
}

static const int64_t head_dims[] = {2, 6, 8, 16, 18, 32, 34, 64, 128};
#define NHEAD (sizeof head_dims / sizeof head_dims[0])

static void test_rope(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t t = 0; t < 4; t++)
        for (int layout = 0; layout < 2; layout++)
            for (int style = 0; style < 4; style++)
                for (int how = 0; how < 4; how++)
                    for (size_t k = 0; k < NHEAD; k += 1 + (size_t)tu_randint(0, 2)) {
                        geo g = rand_geo(style, head_dims[k]);
                        rope_case(tu_float_dtypes[t], tu_float_dtypes[t], &g, layout, how,
                                  how == 3);
                    }
}

/* Many rows: grid-stride loops over more units than one wave of blocks. */
static void test_rope_large(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t t = 0; t < 4; t++)
        for (int layout = 0; layout < 2; layout++) {
            geo g = {4, 3, {2, 300, 12, 64}, {300, 1, 32}};
            rope_case(tu_float_dtypes[t], tu_float_dtypes[t], &g, layout, 0, false);
            geo h = {4, 2, {3, 7, 129, 128}, {129, 64}};
            rope_case(tu_float_dtypes[t], tu_float_dtypes[t], &h, layout, 1, false);
        }
}

/* float32 tables beside a float16/bfloat16 x: the GPU rounds each entry to x's dtype as
 * it reads it, as the CPU does (test_rope.c holds the CPU to the cast tables bit for bit);
 * the vector path reads two vectors of each table a unit and names itself. */
static void test_rope_f32_tables(void **state) {
    (void)state;
    NEED_GPU();
    const ct_dtype halves[] = {CT_F16, CT_BF16};
    for (size_t t = 0; t < 2; t++)
        for (int layout = 0; layout < 2; layout++) {
            for (int style = 0; style < 4; style++)
                for (int how = 0; how < 4; how++)
                    for (size_t k = 0; k < NHEAD; k += 1 + (size_t)tu_randint(0, 2)) {
                        geo g = rand_geo(style, head_dims[k]);
                        rope_case(halves[t], CT_F32, &g, layout, how, how == 3);
                    }
            geo big = {4, 3, {2, 300, 12, 64}, {300, 1, 32}};
            rope_case(halves[t], CT_F32, &big, layout, 0, false);
            ct_scope *sc = ct_scope_begin();
            ct_tensor *x = gpu(tu_rand(CT_SHAPE(2, 5, 3, 64), halves[t], -2, 2, NULL));
            ct_tensor *c, *s;
            rand_tables(3, (const int64_t[]){5, 1, 32}, CT_F32, &c, &s);
            ct_tensor *cg = gpu(c), *sg = gpu(s);
            tu_trace tr = tu_trace_begin();
            ct_tensor *y = ct_rope(x, cg, sg, (ct_rope_layout)layout);
            char *log = tu_trace_end(&tr);
            assert_non_null(y);
            assert_int_equal(ct_tensor_dtype(y), halves[t]);
            assert_int_equal(tu_trace_lines(log, layout ? "cten_rope_interleaved_vec16_f32_tables"
                                                        : "cten_rope_half_vec16_f32_tables",
                                            NULL),
                             1);
            free(log);
            /* the same bits as the GPU's own rope on tables cast to x's dtype */
            ct_tensor *ch = checked(ct_to_dtype(cg, halves[t]));
            ct_tensor *sh = checked(ct_to_dtype(sg, halves[t]));
            ct_tensor *yh = checked(ct_rope(x, ch, sh, (ct_rope_layout)layout));
            tu_assert_same_bits("rope, float32 tables", y, yh);
            ct_scope_end(sc);
        }
}

static void test_rope_tables_gpu(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t t = 0; t < 4; t++) {
        ct_scope *sc = ct_scope_begin();
        ct_tensor *c = NULL, *s = NULL, *cc = NULL, *scpu = NULL;
        ok(ct_rope_tables(37, 24, 10000, tu_float_dtypes[t], CT_CUDA(0), &c, &s));
        ok(ct_rope_tables(37, 24, 10000, tu_float_dtypes[t], CT_CPU, &cc, &scpu));
        double *a = tu_values(c), *b = tu_values(cc);
        assert_memory_equal(a, b, sizeof(double) * 37 * 12); /* the same conversion */
        free(a);
        free(b);
        expect_same(s, scpu);
        ct_scope_end(sc);
    }
}

/* ---- swiglu -------------------------------------------------------------------------------- */

static void swiglu_case(ct_dtype dt, int64_t n, int how) {
    ct_scope *sc = ct_scope_begin();
    int64_t shape[2] = {n > 3 ? 3 : 1, n > 3 ? n / 3 : n};
    ct_tensor *g = checked(tu_rand(2, shape, dt, -8, 8, NULL));
    ct_tensor *u = checked(tu_rand(2, shape, dt, -3, 3, NULL));
    ct_tensor *go = checked(tu_rand(2, shape, dt, -2, 2, NULL));
    ct_tensor *gg = gpu(g), *ug = gpu(u), *gog = gpu(go);
    if (how == 1) { /* off the 16-byte grid: a 1-element offset into a longer storage */
        int64_t m = ct_tensor_numel(g), m1 = m + 1;
        ct_tensor *ts[3] = {gg, ug, gog};
        for (int i = 0; i < 3; i++) {
            ct_tensor *b = checked(ct_tensor_zeros(1, &m1, dt, CT_CUDA(0)));
            ct_tensor *v = checked(ct_reshape(checked(ct_narrow(b, 0, 1, m)), 2, shape));
            ok(ct_copy_(v, ts[i]));
            ts[i] = v;
        }
        gg = ts[0], ug = ts[1], gog = ts[2];
    } else if (how == 2) {
        gg = checked(tu_noncontig(gg));
        ug = checked(tu_noncontig(ug));
        gog = checked(tu_noncontig(gog));
    }
    int64_t bytes = ct_tensor_numel(g) * (int64_t)ct_dtype_size(dt);
    poison(bytes);
    expect_same(checked(ct_swiglu(gg, ug)), checked(ct_swiglu(g, u)));
    for (int want = 3; want >= 1; want--) {
        ct_tensor *a[2] = {NULL, NULL}, *c[2] = {NULL, NULL};
        poison(bytes);
        poison(bytes);
        ok(ct_swiglu_backward(gog, gg, ug, want & 1 ? &a[0] : NULL, want & 2 ? &a[1] : NULL));
        ok(ct_swiglu_backward(go, g, u, want & 1 ? &c[0] : NULL, want & 2 ? &c[1] : NULL));
        for (int i = 0; i < 2; i++)
            if (want & (1 << i)) expect_same(a[i], c[i]);
            else assert_null(a[i]);
    }
    ct_scope_end(sc);
}

static void test_swiglu(void **state) {
    (void)state;
    NEED_GPU();
    static const int64_t ns[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 257, 1000, 4099, 100003};
    for (size_t t = 0; t < 4; t++)
        for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++)
            for (int how = 0; how < 3; how++) swiglu_case(tu_float_dtypes[t], ns[k], how);
}

/* gate and up read in place from one [rows, width] tensor h as rows of cols
 * at columns off and off + cols: off 0 and width 2 cols is ct_chunk(h, 2, -1)
 * (16-byte rows when cols fills vectors), off 1 and width 2 cols + 1 puts
 * every row start off the vector grid (element path). grad_out is the other
 * half of a chunk of its own tensor, or contiguous. The same views of the
 * same values on the CPU give the reference. With both gradients wanted of
 * chunk halves, the kernel writes them into the halves of one buffer. */
static void swiglu_rows_case(ct_dtype dt, int64_t rows, int64_t cols, int off, bool go_view) {
    ct_scope *sc = ct_scope_begin();
    int64_t width = 2 * cols + off, hs[2] = {rows, width}, ys[2] = {rows, cols};
    ct_tensor *h = checked(tu_rand(2, hs, dt, -8, 8, NULL)), *hg = gpu(h);
    ct_tensor *o = checked(tu_rand(2, go_view ? hs : ys, dt, -2, 2, NULL)), *og = gpu(o);
    ct_tensor *in[2][3]; /* [cpu, gpu][gate, up, grad_out] */
    for (int d = 0; d < 2; d++) {
        ct_tensor *src = d ? hg : h, *osrc = d ? og : o;
        if (off == 0) {
            ct_tensor *pc[2];
            int np = 0;
            ok(ct_chunk(src, 2, -1, 2, pc, &np));
            in[d][0] = checked(pc[0]);
            in[d][1] = checked(pc[1]);
        } else {
            in[d][0] = checked(ct_narrow(src, 1, off, cols));
            in[d][1] = checked(ct_narrow(src, 1, off + cols, cols));
        }
        in[d][2] = go_view ? checked(ct_narrow(osrc, 1, off + cols, cols)) : osrc;
    }
    int64_t bytes = rows * cols * (int64_t)ct_dtype_size(dt);
    poison(bytes);
    expect_same(checked(ct_swiglu(in[1][0], in[1][1])), checked(ct_swiglu(in[0][0], in[0][1])));
    for (int want = 3; want >= 1; want--) {
        ct_tensor *a[2] = {NULL, NULL}, *c[2] = {NULL, NULL};
        poison(bytes);
        poison(bytes);
        ok(ct_swiglu_backward(in[1][2], in[1][0], in[1][1], want & 1 ? &a[0] : NULL,
                              want & 2 ? &a[1] : NULL));
        ok(ct_swiglu_backward(in[0][2], in[0][0], in[0][1], want & 1 ? &c[0] : NULL,
                              want & 2 ? &c[1] : NULL));
        for (int i = 0; i < 2; i++)
            if (want & (1 << i)) expect_same(a[i], c[i]);
            else assert_null(a[i]);
        /* chunk halves: both gradients written into the halves of one buffer */
        if (off == 0 && want == 3) {
            assert_true(ct_tensor_shares_storage(a[0], a[1]));
            assert_int_equal(ct_tensor_offset(a[1]), ct_tensor_offset(a[0]) + cols);
        }
    }
    ct_scope_end(sc);
}

static void test_swiglu_rows(void **state) {
    (void)state;
    NEED_GPU();
    static const int64_t cs[] = {1, 3, 7, 8, 16, 33, 64, 1000, 1024};
    for (size_t t = 0; t < 4; t++) {
        for (size_t k = 0; k < sizeof cs / sizeof cs[0]; k++)
            for (int off = 0; off < 2; off++) {
                swiglu_rows_case(tu_float_dtypes[t], 5, cs[k], off, k % 2 == 0);
                swiglu_rows_case(tu_float_dtypes[t], 1, cs[k], off, k % 2 == 1);
            }
        /* more units than one pass of the grid: threads step across rows */
        swiglu_rows_case(tu_float_dtypes[t], 4099, 1000, 1, t % 2 == 0);
        swiglu_rows_case(tu_float_dtypes[t], 9001, 1024, 0, t % 2 == 1);
    }
}

/* LLaMA's mlp through autograd on the GPU: h -> chunk -> swiglu, h's
 * gradient against the CPU's. */
static void test_chunk_swiglu_autograd(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t t = 0; t < 4; t++) {
        ct_scope *sc = ct_scope_begin();
        ct_dtype dt = tu_float_dtypes[t];
        int64_t hs[3] = {3, 17, 2 * 96}, ys[3] = {3, 17, 96};
        ct_tensor *h = checked(tu_rand(3, hs, dt, -6, 6, NULL));
        ct_tensor *go = checked(tu_rand(3, ys, dt, -1, 1, NULL));
        ct_tensor *hg = gpu(h), *gog = gpu(go);
        ok(ct_requires_grad_(h, true));
        ok(ct_requires_grad_(hg, true));
        ct_tensor *ls[2] = {h, hg}, *gs[2] = {go, gog};
        for (int d = 0; d < 2; d++) {
            ct_tensor *pc[2];
            int np = 0;
            ok(ct_chunk(ls[d], 2, -1, 2, pc, &np));
            ok(ct_backward(checked(ct_swiglu(pc[0], pc[1])), gs[d], false));
        }
        expect_same(ct_grad(hg), ct_grad(h));
        ct_scope_end(sc);
    }
}

static void test_empty(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    int64_t xs[4] = {2, 0, 3, 8}, ts[3] = {0, 1, 4};
    ct_tensor *x = checked(ct_tensor_zeros(4, xs, CT_BF16, CT_CUDA(0)));
    ct_tensor *c = checked(ct_tensor_zeros(3, ts, CT_BF16, CT_CUDA(0)));
    ct_tensor *y = checked(ct_rope(x, c, c, CT_ROPE_INTERLEAVED));
    assert_int_equal(ct_tensor_numel(y), 0);
    ct_tensor *z = checked(ct_swiglu(x, x));
    assert_int_equal(ct_tensor_numel(z), 0);
    ct_tensor *dg = NULL, *du = NULL;
    ok(ct_swiglu_backward(x, x, x, &dg, &du));
    assert_int_equal(ct_tensor_numel(dg), 0);
    ct_tensor_release(dg);
    ct_tensor_release(du);
    ok(ct_cuda_synchronize(0));
    ct_scope_end(sc);
}

/* ---- autograd on the GPU: rope -> swiglu, gradients against the CPU's --------------------- */
static ct_tensor *leaf(ct_tensor *t) {
    ct_tensor *l = checked(ct_detach(t));
    ok(ct_requires_grad_(l, true));
    return l;
}

static void test_autograd(void **state) {
    (void)state;
    NEED_GPU();
    for (size_t t = 0; t < 4; t++)
        for (int layout = 0; layout < 2; layout++) {
            ct_dtype dt = tu_float_dtypes[t];
            ct_scope *sc = ct_scope_begin();
            int64_t xs[4] = {2, 5, 3, 16}, ts[3] = {5, 1, 8};
            ct_tensor *x = checked(tu_rand(4, xs, dt, -2, 2, NULL));
            ct_tensor *u = checked(tu_rand(4, xs, dt, -2, 2, NULL));
            ct_tensor *go = checked(tu_rand(4, xs, dt, -1, 1, NULL));
            ct_tensor *c, *s;
            rand_tables(3, ts, dt, &c, &s);
            ct_tensor *grads[2][2];
            for (int d = 0; d < 2; d++) {
                ct_tensor *xl = leaf(d ? gpu(x) : x), *ul = leaf(d ? gpu(u) : u);
                ct_tensor *cd = d ? gpu(c) : c, *sd = d ? gpu(s) : s;
                ct_tensor *r = checked(ct_rope(xl, cd, sd, (ct_rope_layout)layout));
                ct_tensor *y = checked(ct_swiglu(r, ul));
                ok(ct_backward(y, d ? gpu(go) : go, false));
                grads[d][0] = checked(ct_grad(xl));
                grads[d][1] = checked(ct_grad(ul));
            }
            /* rope's f16/bf16 result may round one ulp apart on the two devices
             * and swiglu's backward (derivative about 1) carries that on. */
            double scale = dt == CT_F16 || dt == CT_BF16 ? 4 : 1;
            expect_close(grads[1][0], grads[0][0], scale);
            expect_close(grads[1][1], grads[0][1], scale);
            ct_scope_end(sc);
        }
}

/* ---- bad input ----------------------------------------------------------------------------- */
static void test_mixed_devices(void **state) {
    (void)state;
    NEED_GPU();
    ct_scope *sc = ct_scope_begin();
    int64_t xs[2] = {4, 8}, ts[2] = {4, 4};
    ct_tensor *cx = checked(ct_tensor_zeros(2, xs, CT_F32, CT_CPU)), *gx = gpu(cx);
    ct_tensor *ct = checked(ct_tensor_ones(2, ts, CT_F32, CT_CPU)), *gt = gpu(ct);
    tu_assert_null_error(ct_rope(gx, ct, gt, CT_ROPE_HALF), CT_ERR_DEVICE, "ct_rope", "cuda:0",
                         "cpu");
    tu_assert_null_error(ct_rope(gx, gt, ct, CT_ROPE_HALF), CT_ERR_DEVICE, "ct_rope", "cuda:0",
                         "cpu");
    tu_assert_null_error(ct_rope_backward(cx, gt, gt, CT_ROPE_HALF), CT_ERR_DEVICE,
                         "ct_rope_backward", "cuda:0", "cpu");
    tu_assert_null_error(ct_swiglu(gx, cx), CT_ERR_DEVICE, "ct_swiglu", "cuda:0", "cpu");
    ct_tensor *dg = NULL, *du = NULL;
    tu_assert_error(ct_swiglu_backward(cx, gx, gx, &dg, &du), CT_ERR_DEVICE, "ct_swiglu_backward",
                    "cuda:0", "cpu");
    assert_null(dg);
    assert_null(du);
    ct_scope_end(sc);
}

int main(void) {
    tu_seed();
    /* The first op in a process registers the backends; tests that start by
     * moving a tensor to the GPU need them registered before. */
    cti_init();
    ngpu = tu_cuda_devices_or_skip("cuda_rope");
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_rope),     T(test_rope_large), T(test_rope_f32_tables), T(test_rope_tables_gpu),
        T(test_swiglu),
        T(test_swiglu_rows), T(test_chunk_swiglu_autograd),
        T(test_empty),    T(test_autograd),   T(test_mixed_devices),
    };
#undef T
    return tu_run_tests(tests);
}
