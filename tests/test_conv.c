/* conv2d and 2-d pooling, forward and backward, against float64 loops written
 * here from the definitions (PyTorch's semantics). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "test_util.h"
#include "test_fixture.h"

/* ---- helpers --------------------------------------------------------------------------- */

/* |got - ref| <= rtol * mag + atol + 1e-12 * (1 + mag), where mag bounds the rounding
 * scale of each element (the sum of |terms| that formed it). */
static void check_close(const double *got, const double *ref, const double *mag, int64_t n,
                        double rtol, double atol, const char *what) {
    for (int64_t i = 0; i < n; i++) {
        double tol = rtol * mag[i] + atol + 1e-12 * (1 + mag[i]);
        if (!(fabs(got[i] - ref[i]) <= tol)) {
            fprintf(stderr, "%s: element %lld: got %.10g, expected %.10g (tol %.3g)\n", what,
                    (long long)i, got[i], ref[i], tol);
            fail();
        }
    }
}

/* Relative tolerance against the magnitude bound, per dtype: the half types
 * round their result once; f32 accumulates in f32. */
static double mag_rtol(ct_dtype dt) {
    switch (dt) {
    case CT_F64: return 1e-12;
    case CT_F32: return 2e-5;
    case CT_F16: return 1.5e-3;
    default: return 8e-3;
    }
}

static void assert_shape(const ct_tensor *t, int ndim, const int64_t *shape) {
    assert_non_null(t);
    assert_int_equal(ct_tensor_ndim(t), ndim);
    for (int d = 0; d < ndim; d++) assert_int_equal(ct_tensor_shape(t)[d], shape[d]);
}

static ct_tensor *must(ct_tensor *t) {
    if (!t) fprintf(stderr, "unexpected error: %s\n", ct_last_error());
    assert_non_null(t);
    return t;
}

/* Replaces *t by a non-contiguous copy of itself. */
static void make_noncontig(ct_tensor **t) {
    ct_tensor *v = tu_noncontig(*t);
    if (ct_tensor_numel(v) > 1) assert_false(ct_tensor_is_contiguous(v));
    ct_tensor_release(*t);
    *t = v;
}

/* ---- convolution reference ---------------------------------------------------------------- */

typedef struct conv_cfg {
    int64_t N, Cg, Cog, G, H, W, kh, kw, s[2], p[2], d[2];
    bool bias, three_d, noncontig;
    /* derived */
    int64_t C, Co, OH, OW;
} conv_cfg;

static int64_t conv_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
    return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

static void conv_derive(conv_cfg *c) {
    c->C = c->Cg * c->G;
    c->Co = c->Cog * c->G;
    c->OH = conv_out(c->H, c->kh, c->s[0], c->p[0], c->d[0]);
    c->OW = conv_out(c->W, c->kw, c->s[1], c->p[1], c->d[1]);
}

#define X_AT(n, c, h, w) (((n) * k->C + (c)) * k->H + (h)) * k->W + (w)
#define W_AT(o, c, i, j) (((o) * k->Cg + (c)) * k->kh + (i)) * k->kw + (j)
#define Y_AT(n, o, h, w) (((n) * k->Co + (o)) * k->OH + (h)) * k->OW + (w)

/* Visits every (output, input, weight) triple of the convolution. */
typedef void (*conv_visit)(void *ctx, int64_t yi, int64_t xi, int64_t wi);
static void conv_each(const conv_cfg *k, conv_visit f, void *ctx) {
    for (int64_t n = 0; n < k->N; n++)
        for (int64_t o = 0; o < k->Co; o++) {
            int64_t g = o / k->Cog;
            for (int64_t oh = 0; oh < k->OH; oh++)
                for (int64_t ow = 0; ow < k->OW; ow++)
                    for (int64_t c = 0; c < k->Cg; c++)
                        for (int64_t i = 0; i < k->kh; i++)
                            for (int64_t j = 0; j < k->kw; j++) {
                                int64_t ih = oh * k->s[0] - k->p[0] + i * k->d[0];
                                int64_t iw = ow * k->s[1] - k->p[1] + j * k->d[1];
                                if (ih < 0 || ih >= k->H || iw < 0 || iw >= k->W) continue;
                                f(ctx, Y_AT(n, o, oh, ow), X_AT(n, g * k->Cg + c, ih, iw),
                                  W_AT(o, c, i, j));
                            }
        }
}

typedef struct acc_ctx {
    const double *a, *b; /* the two factors' arrays */
    double *out, *mag;
    int which; /* 0: y += x*w, 1: dx += dy*w, 2: dw += dy*x */
} acc_ctx;

static void acc_visit(void *vctx, int64_t yi, int64_t xi, int64_t wi) {
    acc_ctx *c = vctx;
    double t;
    int64_t oi;
    switch (c->which) {
    case 0: t = c->a[xi] * c->b[wi]; oi = yi; break;
    case 1: t = c->a[yi] * c->b[wi]; oi = xi; break;
    default: t = c->a[yi] * c->b[xi]; oi = wi; break;
    }
    c->out[oi] += t;
    c->mag[oi] += fabs(t);
}

static void conv_ref(const conv_cfg *k, int which, const double *a, const double *b,
                     double *out, double *mag, int64_t n) {
    memset(out, 0, (size_t)n * sizeof(double));
    memset(mag, 0, (size_t)n * sizeof(double));
    acc_ctx c = {a, b, out, mag, which};
    conv_each(k, acc_visit, &c);
}

static void check_tensor(const ct_tensor *t, const double *ref, const double *mag,
                         ct_dtype dt, const char *what) {
    double *got = tu_values(t);
    /* float16 results below 2^-14 are subnormal, spaced 2^-24 apart */
    double atol = dt == CT_F16 ? 6e-8 : 0;
    check_close(got, ref, mag, ct_tensor_numel(t), mag_rtol(dt), atol, what);
    free(got);
}

static void run_conv(conv_cfg k, ct_dtype dt) {
    conv_derive(&k);
    if (k.three_d) k.N = 1;
    int64_t xs4[4] = {k.N, k.C, k.H, k.W}, ws[4] = {k.Co, k.Cg, k.kh, k.kw};
    int64_t ys4[4] = {k.N, k.Co, k.OH, k.OW};
    int nd = k.three_d ? 3 : 4;
    const int64_t *xs = k.three_d ? xs4 + 1 : xs4, *ys = k.three_d ? ys4 + 1 : ys4;
    double *xv, *wv, *bv = NULL, *dyv;
    ct_tensor *x = tu_rand(nd, xs, dt, -1, 1, &xv);
    ct_tensor *w = tu_rand(4, ws, dt, -1, 1, &wv);
    ct_tensor *b = k.bias ? tu_rand(1, &k.Co, dt, -1, 1, &bv) : NULL;
    ct_tensor *dy = tu_rand(nd, ys, dt, -1, 1, &dyv);
    if (k.noncontig) {
        make_noncontig(&x);
        make_noncontig(&w);
        make_noncontig(&dy);
        if (b && k.Co > 1) make_noncontig(&b);
    }
    int64_t nx = tu_numel(4, xs4), nw = tu_numel(4, ws), ny = tu_numel(4, ys4);
    int64_t nmax = nx > nw ? nx : nw;
    nmax = nmax > ny ? nmax : ny;
    double *ref = malloc((size_t)nmax * sizeof(double)), *mag = malloc((size_t)nmax * sizeof(double));

    ct_tensor *y = must(ct_conv2d(x, w, b, k.s, k.p, k.d, k.G));
    assert_shape(y, nd, ys);
    assert_int_equal(ct_tensor_dtype(y), dt);
    conv_ref(&k, 0, xv, wv, ref, mag, ny);
    if (bv)
        for (int64_t i = 0; i < ny; i++) {
            double v = bv[(i / (k.OH * k.OW)) % k.Co];
            ref[i] += v;
            mag[i] += fabs(v);
        }
    check_tensor(y, ref, mag, dt, "conv2d");

    ct_tensor *dx = must(ct_conv2d_backward_input(dy, w, xs4, k.s, k.p, k.d, k.G));
    assert_shape(dx, nd, xs);
    conv_ref(&k, 1, dyv, wv, ref, mag, nx);
    check_tensor(dx, ref, mag, dt, "conv2d_backward_input");

    ct_tensor *dw = must(ct_conv2d_backward_weight(dy, x, ws, k.s, k.p, k.d, k.G));
    assert_shape(dw, 4, ws);
    conv_ref(&k, 2, dyv, xv, ref, mag, nw);
    check_tensor(dw, ref, mag, dt, "conv2d_backward_weight");

    ct_tensor *db = must(ct_conv2d_backward_bias(dy));
    assert_shape(db, 1, &k.Co);
    for (int64_t o = 0; o < k.Co; o++) {
        ref[o] = mag[o] = 0;
        for (int64_t n = 0; n < k.N; n++)
            for (int64_t p = 0; p < k.OH * k.OW; p++) {
                double v = dyv[(n * k.Co + o) * k.OH * k.OW + p];
                ref[o] += v;
                mag[o] += fabs(v);
            }
    }
    check_tensor(db, ref, mag, dt, "conv2d_backward_bias");

    ct_tensor *ts[] = {x, w, b, dy, y, dx, dw, db};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
    free(xv);
    free(wv);
    free(bv);
    free(dyv);
    free(ref);
    free(mag);
}

static conv_cfg random_conv(void) {
    conv_cfg k;
    memset(&k, 0, sizeof k);
    int64_t kind = tu_randint(0, 4);
    k.G = kind == 0 ? 1 : tu_randint(1, 4);
    k.Cg = kind == 3 ? 1 : tu_randint(1, 5); /* kind 3: depthwise */
    k.Cog = kind == 3 ? tu_randint(1, 3) : tu_randint(1, 5);
    k.N = tu_randint(1, 6);
    k.kh = tu_randint(1, 5);
    k.kw = tu_randint(1, 5);
    for (int a = 0; a < 2; a++) {
        k.s[a] = tu_randint(1, 4);
        k.p[a] = tu_randint(0, 3);
        k.d[a] = tu_randint(1, 3);
    }
    int64_t eh = k.d[0] * (k.kh - 1) + 1 - 2 * k.p[0], ew = k.d[1] * (k.kw - 1) + 1 - 2 * k.p[1];
    k.H = (eh > 1 ? eh : 1) + tu_randint(0, 9);
    k.W = (ew > 1 ? ew : 1) + tu_randint(0, 9);
    k.bias = tu_randint(0, 2);
    k.three_d = tu_randint(0, 5) == 0;
    k.noncontig = tu_randint(0, 3) == 0;
    return k;
}

/* Each case in every float dtype. */
static void run_cases(const conv_cfg *cases, size_t n) {
    for (size_t i = 0; i < n; i++)
        for (size_t d = 0; d < 4; d++) run_conv(cases[i], tu_float_dtypes[d]);
}

static void test_conv_random(void **state) {
    (void)state;
    for (int it = 0; it < 40; it++) {
        conv_cfg k = random_conv();
        for (size_t d = 0; d < 4; d++) run_conv(k, tu_float_dtypes[d]);
    }
}

/* Shapes that take each tiling path of the kernel: several row tiles of one
 * large image, batches of small images per GEMM, and 1x1 convolutions that
 * skip im2col. */
static void test_conv_paths(void **state) {
    (void)state;
    conv_cfg cases[] = {
        /* N Cg Cog G  H   W kh kw  s       p       d     bias 3d nc */
        {2, 3, 5, 1, 45, 40, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {1, 2, 3, 2, 50, 33, 3, 2, {2, 1}, {1, 0}, {1, 2}, true, true, false, 0, 0, 0, 0},
        {2, 4, 3, 1, 36, 36, 1, 1, {1, 1}, {0, 0}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {3, 4, 3, 2, 34, 34, 1, 1, {1, 1}, {0, 0}, {1, 1}, false, false, true, 0, 0, 0, 0},
        {9, 3, 4, 1, 7, 6, 1, 1, {1, 1}, {0, 0}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {40, 2, 3, 2, 6, 5, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {37, 1, 4, 1, 7, 7, 5, 5, {1, 1}, {2, 2}, {1, 1}, false, false, true, 0, 0, 0, 0},
        {3, 1, 2, 8, 9, 9, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {2, 2, 2, 1, 5, 5, 5, 5, {1, 1}, {0, 0}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {2, 2, 2, 1, 1, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {2, 2, 3, 1, 9, 9, 2, 2, {4, 4}, {0, 0}, {1, 1}, false, false, false, 0, 0, 0, 0},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* 3x3, stride 1 convolutions with at least 4 channels per group (8 input
 * channels for the weight gradient) take the Winograd F(2x2, 3x3) path on
 * CPUs with AVX-512 (f32, f16, bf16; f64 keeps im2col): odd sizes, partial
 * 16-tile chunks, several chunks per tile row, padding 0..2 (also different
 * per axis), groups, N = 1, blocks spanning images, more blocks than
 * partial-sum slabs, channel counts that are not multiples of 16, and cases
 * on each side of the channel thresholds. */
static void test_conv_winograd(void **state) {
    (void)state;
    conv_cfg cases[] = {
        /* N Cg Cog G  H   W kh kw  s       p       d     bias 3d nc */
        {2, 17, 19, 1, 13, 11, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {1, 16, 16, 1, 9, 40, 3, 3, {1, 1}, {0, 0}, {1, 1}, false, false, false, 0, 0, 0, 0},
        {3, 20, 33, 1, 7, 35, 3, 3, {1, 1}, {2, 2}, {1, 1}, true, false, true, 0, 0, 0, 0},
        {2, 16, 17, 2, 10, 10, 3, 3, {1, 1}, {1, 2}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {1, 16, 18, 1, 5, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, true, false, 0, 0, 0, 0},
        {2, 16, 16, 1, 1, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}, false, false, false, 0, 0, 0, 0},
        {5, 16, 21, 1, 6, 6, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, true, 0, 0, 0, 0},
        {1, 18, 16, 1, 4, 3, 3, 3, {1, 1}, {2, 0}, {1, 1}, false, false, false, 0, 0, 0, 0},
        {2, 16, 16, 1, 70, 67, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {2, 4, 5, 1, 8, 9, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, true, 0, 0, 0, 0},
        {3, 9, 4, 3, 11, 7, 3, 3, {1, 1}, {0, 1}, {1, 1}, false, false, false, 0, 0, 0, 0},
        {2, 3, 16, 1, 8, 8, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {1, 16, 16, 1, 12, 12, 3, 3, {1, 1}, {3, 3}, {1, 1}, true, false, false, 0, 0, 0, 0},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

/* Stride-1 layers with 1 to 4 input channels per group take the direct
 * AVX-512 kernels for the forward and the weight gradient (f32, f16, bf16;
 * f64 and the input gradient keep im2col): output widths below, at and
 * above one 16-lane vector, output channels past one block of 16 and not a
 * multiple of it, single-pixel outputs, padding wider than the kernel,
 * kernels up to 7x7 (98 taps, 11 passes of the weight gradient), groups,
 * 3-d input, non-contiguous operands, and a 4-channel 3x3 layer whose
 * forward goes to Winograd while its weight gradient stays direct. */
static void test_conv_direct(void **state) {
    (void)state;
    conv_cfg cases[] = {
        /* N Cg Cog G  H   W kh kw  s       p       d     bias 3d nc */
        {3, 1, 16, 1, 28, 28, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {2, 1, 20, 1, 9, 17, 3, 3, {1, 1}, {0, 0}, {1, 1}, true, false, true, 0, 0, 0, 0},
        {1, 3, 33, 1, 13, 35, 5, 5, {1, 1}, {2, 2}, {1, 1}, false, false, false, 0, 0, 0, 0},
        {2, 2, 3, 3, 7, 16, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {2, 1, 1, 1, 1, 1, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {2, 1, 4, 1, 4, 5, 3, 3, {1, 1}, {3, 3}, {1, 1}, true, false, true, 0, 0, 0, 0},
        {5, 2, 7, 1, 6, 9, 7, 7, {1, 1}, {3, 3}, {1, 1}, true, false, false, 0, 0, 0, 0},
        {1, 3, 18, 1, 11, 33, 3, 2, {1, 1}, {1, 0}, {1, 1}, true, true, false, 0, 0, 0, 0},
        {2, 4, 17, 1, 10, 19, 3, 3, {1, 1}, {1, 1}, {1, 1}, true, false, true, 0, 0, 0, 0},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
}

static void test_conv_known_values(void **state) {
    (void)state;
    /* 1x1x3x3 input 1..9, 2x2 kernel of ones, padding 1, stride 2: the four
     * corners of the padded input sum to 1, 2+3, 4+7, 5+6+8+9. */
    double xv[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, wv[4] = {1, 1, 1, 1};
    ct_tensor *x = tu_from_f64(xv, CT_SHAPE(1, 1, 3, 3), CT_F32);
    ct_tensor *w = tu_from_f64(wv, CT_SHAPE(1, 1, 2, 2), CT_F32);
    int64_t s[2] = {2, 2}, p[2] = {1, 1};
    ct_tensor *y = must(ct_conv2d(x, w, NULL, s, p, NULL, 1));
    int64_t want_shape[4] = {1, 1, 2, 2};
    assert_shape(y, 4, want_shape);
    double *got = tu_values(y), want[4] = {1, 5, 11, 28};
    tu_assert_close(got, want, 4, 0, 0);
    free(got);
    ct_tensor *ts[] = {x, w, y};
    for (int i = 0; i < 3; i++) ct_tensor_release(ts[i]);
}

static void test_conv_empty_batch(void **state) {
    (void)state;
    ct_tensor *x = ct_tensor_zeros(CT_SHAPE(0, 3, 5, 5), CT_F32, CT_CPU);
    ct_tensor *w = tu_rand(CT_SHAPE(4, 3, 3, 3), CT_F32, -1, 1, NULL);
    ct_tensor *y = must(ct_conv2d(x, w, NULL, NULL, NULL, NULL, 1));
    int64_t want[4] = {0, 4, 3, 3};
    assert_shape(y, 4, want);
    int64_t ws[4] = {4, 3, 3, 3};
    ct_tensor *dw = must(ct_conv2d_backward_weight(y, x, ws, NULL, NULL, NULL, 1));
    double *v = tu_values(dw);
    for (int i = 0; i < 108; i++) assert_true(v[i] == 0);
    free(v);
    ct_tensor *ts[] = {x, w, y, dw};
    for (int i = 0; i < 4; i++) ct_tensor_release(ts[i]);
}

static void test_conv_errors(void **state) {
    (void)state;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3, 8, 8), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(4, 3, 3, 3), CT_F32, -1, 1, NULL);
    ct_tensor *w64 = tu_rand(CT_SHAPE(4, 3, 3, 3), CT_F64, -1, 1, NULL);
    ct_tensor *w4 = tu_rand(CT_SHAPE(4, 4, 3, 3), CT_F32, -1, 1, NULL);
    ct_tensor *w6 = tu_rand(CT_SHAPE(6, 1, 3, 3), CT_F32, -1, 1, NULL);
    ct_tensor *w9 = tu_rand(CT_SHAPE(4, 3, 9, 9), CT_F32, -1, 1, NULL);
    ct_tensor *wk = tu_rand(CT_SHAPE(4, 3, 3), CT_F32, -1, 1, NULL);
    ct_tensor *b3 = tu_rand(CT_SHAPE(3), CT_F32, -1, 1, NULL);
    ct_tensor *b64 = tu_rand(CT_SHAPE(4), CT_F64, -1, 1, NULL);
    ct_tensor *x2 = tu_rand(CT_SHAPE(3, 8), CT_F32, -1, 1, NULL);
    ct_tensor *xi = ct_tensor_zeros(CT_SHAPE(2, 3, 8, 8), CT_I64, CT_CPU);
    ct_tensor *x0 = ct_tensor_zeros(CT_SHAPE(2, 0, 8, 8), CT_F32, CT_CPU);
    int64_t one[2] = {1, 1}, zero[2] = {0, 0}, bad0[2] = {0, 1}, neg[2] = {-1, 0};

    tu_assert_null_error(ct_conv2d(NULL, w, NULL, NULL, NULL, NULL, 1), CT_ERR_INVALID_ARG,
                         "ct_conv2d", "NULL");
    tu_assert_null_error(ct_conv2d(x2, w, NULL, NULL, NULL, NULL, 1), CT_ERR_SHAPE, "ct_conv2d",
                         "3-d", "4-d", "[3, 8]");
    tu_assert_null_error(ct_conv2d(x, wk, NULL, NULL, NULL, NULL, 1), CT_ERR_SHAPE, "4-d weight",
                         "[4, 3, 3]");
    tu_assert_null_error(ct_conv2d(x, w4, NULL, NULL, NULL, NULL, 1), CT_ERR_SHAPE,
                         "ct_conv2d: expected input [2, 3, 8, 8] to have 4 channels "
                         "(weight [4, 4, 3, 3], groups 1), got 3");
    tu_assert_null_error(ct_conv2d(x, w6, NULL, NULL, NULL, NULL, 2), CT_ERR_SHAPE,
                         "input [2, 3, 8, 8] has 3 channels, not divisible by groups 2");
    tu_assert_null_error(ct_conv2d(x, w6, NULL, NULL, NULL, NULL, 4), CT_ERR_SHAPE,
                         "6 output channels, not divisible by groups 4");
    tu_assert_null_error(ct_conv2d(x, w9, NULL, NULL, NULL, NULL, 1), CT_ERR_SHAPE,
                         "kernel 9x9", "larger than the padded input 8x8");
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, NULL, (int64_t[]){4, 4}, 1), CT_ERR_SHAPE,
                         "dilated 9x9", "padded input 8x8");
    tu_assert_null_error(ct_conv2d(x, w, NULL, bad0, NULL, NULL, 1), CT_ERR_INVALID_ARG,
                         "stride must be positive", "[0, 1]");
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, NULL, zero, 1), CT_ERR_INVALID_ARG,
                         "dilation must be positive");
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, neg, NULL, 1), CT_ERR_INVALID_ARG,
                         "padding must be non-negative", "[-1, 0]");
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, NULL, NULL, 0), CT_ERR_INVALID_ARG,
                         "groups must be positive");
    tu_assert_null_error(ct_conv2d(x, w64, NULL, NULL, NULL, NULL, 1), CT_ERR_DTYPE, "float32",
                         "float64", "same dtype");
    tu_assert_null_error(ct_conv2d(x, w, b64, NULL, NULL, NULL, 1), CT_ERR_DTYPE, "bias",
                         "float64");
    tu_assert_null_error(ct_conv2d(xi, w, NULL, NULL, NULL, NULL, 1), CT_ERR_DTYPE, "int64");
    tu_assert_null_error(ct_conv2d(x, w, b3, NULL, NULL, NULL, 1), CT_ERR_SHAPE,
                         "expected bias of shape [4]", "[3]");
    tu_assert_null_error(ct_conv2d(x0, w, NULL, NULL, NULL, NULL, 1), CT_ERR_SHAPE,
                         "non-zero channels");

    /* backward: grad_out must be the forward's output shape */
    ct_tensor *dy = tu_rand(CT_SHAPE(2, 4, 7, 6), CT_F32, -1, 1, NULL);
    int64_t xs[4] = {2, 3, 8, 8}, ws[4] = {4, 3, 3, 3};
    tu_assert_null_error(ct_conv2d_backward_input(dy, w, xs, NULL, NULL, NULL, 1), CT_ERR_SHAPE,
                         "ct_conv2d_backward_input", "expected grad_out of shape [2, 4, 6, 6]",
                         "[2, 4, 7, 6]");
    tu_assert_null_error(ct_conv2d_backward_input(dy, w, NULL, NULL, NULL, NULL, 1),
                         CT_ERR_INVALID_ARG, "input_shape");
    tu_assert_null_error(ct_conv2d_backward_input(dy, w64, xs, NULL, NULL, NULL, 1),
                         CT_ERR_DTYPE, "same dtype");
    tu_assert_null_error(ct_conv2d_backward_weight(dy, x, ws, NULL, NULL, NULL, 1), CT_ERR_SHAPE,
                         "ct_conv2d_backward_weight", "expected grad_out of shape [2, 4, 6, 6]");
    tu_assert_null_error(ct_conv2d_backward_weight(dy, x, (int64_t[]){4, 2, 3, 3}, NULL, NULL,
                                                   NULL, 1),
                         CT_ERR_SHAPE, "to have 2 channels");
    tu_assert_null_error(ct_conv2d_backward_weight(dy, x, ws, one, NULL, NULL, -2),
                         CT_ERR_INVALID_ARG, "groups");
    tu_assert_null_error(ct_conv2d_backward_bias(x2), CT_ERR_SHAPE, "ct_conv2d_backward_bias",
                         "3-d");
    tu_assert_null_error(ct_conv2d_backward_bias(xi), CT_ERR_DTYPE, "int64");

    ct_tensor *ts[] = {x, w, w64, w4, w6, w9, wk, b3, b64, x2, xi, x0, dy};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

/* ---- pooling reference ------------------------------------------------------------------------ */

typedef struct pool_cfg {
    int64_t N, C, H, W, k[2], s[2], p[2], d[2];
    bool ceil_mode, count_include_pad, three_d, noncontig;
    int64_t OH, OW;
} pool_cfg;

/* PyTorch's pooling_output_shape. */
static int64_t pool_out(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
    double num = (double)(in + 2 * p - d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0));
    int64_t out = (int64_t)floor(num / (double)s) + 1;
    if (ceil_mode && (out - 1) * s >= in + p) out--;
    return out;
}

static void max_ref(const pool_cfg *k, const double *x, double *y, int64_t *idx) {
    for (int64_t pl = 0; pl < k->N * k->C; pl++)
        for (int64_t oh = 0; oh < k->OH; oh++)
            for (int64_t ow = 0; ow < k->OW; ow++) {
                double best = -INFINITY;
                int64_t bi = -1;
                for (int64_t i = 0; i < k->k[0]; i++)
                    for (int64_t j = 0; j < k->k[1]; j++) {
                        int64_t h = oh * k->s[0] - k->p[0] + i * k->d[0];
                        int64_t w = ow * k->s[1] - k->p[1] + j * k->d[1];
                        if (h < 0 || h >= k->H || w < 0 || w >= k->W) continue;
                        double v = x[pl * k->H * k->W + h * k->W + w];
                        if (v > best) {
                            best = v;
                            bi = h * k->W + w;
                        }
                    }
                int64_t o = (pl * k->OH + oh) * k->OW + ow;
                y[o] = best;
                idx[o] = bi;
            }
}

/* Average pooling window of (oh, ow) and its divisor, from PyTorch's rules. */
static double avg_window(const pool_cfg *k, int64_t oh, int64_t ow, int64_t *h0, int64_t *h1,
                         int64_t *w0, int64_t *w1) {
    int64_t hs = oh * k->s[0] - k->p[0], ws = ow * k->s[1] - k->p[1];
    int64_t he = hs + k->k[0] < k->H + k->p[0] ? hs + k->k[0] : k->H + k->p[0];
    int64_t we = ws + k->k[1] < k->W + k->p[1] ? ws + k->k[1] : k->W + k->p[1];
    double padded = (double)((he - hs) * (we - ws));
    *h0 = hs < 0 ? 0 : hs;
    *w0 = ws < 0 ? 0 : ws;
    *h1 = he < k->H ? he : k->H;
    *w1 = we < k->W ? we : k->W;
    return k->count_include_pad ? padded : (double)((*h1 - *h0) * (*w1 - *w0));
}

/* y = avg pool of x (adaptive when adaptive); with backward, scatters dy into dx. */
static void avg_ref(const pool_cfg *k, bool adaptive, bool backward, const double *in,
                    double *out, double *mag) {
    int64_t HW = k->H * k->W, OHW = k->OH * k->OW;
    if (backward) {
        memset(out, 0, (size_t)(k->N * k->C * HW) * sizeof(double));
        memset(mag, 0, (size_t)(k->N * k->C * HW) * sizeof(double));
    }
    for (int64_t pl = 0; pl < k->N * k->C; pl++)
        for (int64_t oh = 0; oh < k->OH; oh++)
            for (int64_t ow = 0; ow < k->OW; ow++) {
                int64_t h0, h1, w0, w1;
                double div;
                if (adaptive) {
                    h0 = (int64_t)floor((double)(oh * k->H) / (double)k->OH);
                    h1 = (int64_t)ceil((double)((oh + 1) * k->H) / (double)k->OH);
                    w0 = (int64_t)floor((double)(ow * k->W) / (double)k->OW);
                    w1 = (int64_t)ceil((double)((ow + 1) * k->W) / (double)k->OW);
                    div = (double)((h1 - h0) * (w1 - w0));
                } else {
                    div = avg_window(k, oh, ow, &h0, &h1, &w0, &w1);
                }
                int64_t o = pl * OHW + oh * k->OW + ow;
                if (!backward) {
                    out[o] = mag[o] = 0;
                }
                for (int64_t h = h0; h < h1; h++)
                    for (int64_t w = w0; w < w1; w++) {
                        int64_t i = pl * HW + h * k->W + w;
                        if (backward) {
                            out[i] += in[o] / div;
                            mag[i] += fabs(in[o] / div);
                        } else {
                            out[o] += in[i] / div;
                            mag[o] += fabs(in[i] / div);
                        }
                    }
            }
}

/* Random values, distinct within each plane (so max pooling has no ties) and
 * exact in every float dtype: a shuffle of -128..127 scaled by 1/16. */
static double *distinct_vals(int64_t planes, int64_t per) {
    double *v = malloc((size_t)(planes * per) * sizeof(double));
    assert_true(per <= 256);
    for (int64_t p = 0; p < planes; p++) {
        int perm[256];
        for (int i = 0; i < 256; i++) perm[i] = i;
        for (int i = 255; i > 0; i--) {
            int j = (int)tu_randint(0, i + 1), t = perm[i];
            perm[i] = perm[j];
            perm[j] = t;
        }
        for (int64_t i = 0; i < per; i++) v[p * per + i] = (perm[i] - 128) / 16.0;
    }
    return v;
}

static pool_cfg random_pool(bool with_dilation) {
    for (;;) {
        pool_cfg k;
        memset(&k, 0, sizeof k);
        k.N = tu_randint(1, 3);
        k.C = tu_randint(1, 4);
        k.H = tu_randint(1, 14);
        k.W = tu_randint(1, 14);
        for (int a = 0; a < 2; a++) {
            k.k[a] = tu_randint(1, 5);
            k.s[a] = tu_randint(1, 4);
            k.p[a] = tu_randint(0, k.k[a] / 2 + 1);
            k.d[a] = with_dilation ? tu_randint(1, 3) : 1;
        }
        k.ceil_mode = tu_randint(0, 2);
        k.count_include_pad = tu_randint(0, 2);
        k.three_d = tu_randint(0, 4) == 0;
        k.noncontig = tu_randint(0, 3) == 0;
        if (k.three_d) k.N = 1;
        k.OH = pool_out(k.H, k.k[0], k.s[0], k.p[0], k.d[0], k.ceil_mode);
        k.OW = pool_out(k.W, k.k[1], k.s[1], k.p[1], k.d[1], k.ceil_mode);
        if (k.OH >= 1 && k.OW >= 1) return k;
    }
}

/* Input/output shapes of a pooling config (3-d when three_d). */
static int pool_shapes(const pool_cfg *k, int64_t xs[4], int64_t ys[4]) {
    int64_t a[4] = {k->N, k->C, k->H, k->W}, b[4] = {k->N, k->C, k->OH, k->OW};
    int off = k->three_d ? 1 : 0;
    for (int d = 0; d < 4 - off; d++) {
        xs[d] = a[d + off];
        ys[d] = b[d + off];
    }
    return 4 - off;
}

static void run_max_pool(pool_cfg k, ct_dtype dt) {
    int64_t xs[4], ys[4];
    int nd = pool_shapes(&k, xs, ys);
    int64_t nx = k.N * k.C * k.H * k.W, ny = k.N * k.C * k.OH * k.OW;
    double *xv = distinct_vals(k.N * k.C, k.H * k.W);
    double *dyv = tu_rand_vals(ny, dt, -1, 1);
    ct_tensor *x = tu_from_f64(xv, nd, xs, dt), *dy = tu_from_f64(dyv, nd, ys, dt);
    if (k.noncontig) {
        make_noncontig(&x);
        make_noncontig(&dy);
    }
    double *ref = malloc((size_t)ny * sizeof(double));
    int64_t *ridx = malloc((size_t)ny * sizeof(int64_t));
    max_ref(&k, xv, ref, ridx);

    ct_tensor *idx = NULL;
    ct_tensor *y = must(ct_max_pool2d(x, k.k, k.s, k.p, k.d, k.ceil_mode, &idx));
    assert_shape(y, nd, ys);
    assert_shape(idx, nd, ys);
    assert_int_equal(ct_tensor_dtype(idx), CT_I64);
    double *got = tu_values(y), *gi = tu_values(idx);
    for (int64_t i = 0; i < ny; i++) {
        assert_true(got[i] == ref[i]);
        assert_int_equal((int64_t)gi[i], ridx[i]);
    }
    free(got);

    ct_tensor *idx_arg = k.noncontig ? tu_noncontig(idx) : ct_tensor_retain(idx);
    ct_tensor *dx = must(ct_max_pool2d_backward(dy, x, idx_arg));
    assert_shape(dx, nd, xs);
    double *rdx = calloc((size_t)nx, sizeof(double)), *mag = calloc((size_t)nx, sizeof(double));
    for (int64_t i = 0; i < ny; i++) {
        if (ridx[i] < 0) continue; /* a dilated window that holds no element */
        int64_t pl = i / (k.OH * k.OW);
        rdx[pl * k.H * k.W + ridx[i]] += dyv[i];
        mag[pl * k.H * k.W + ridx[i]] += fabs(dyv[i]);
    }
    check_tensor(dx, rdx, mag, dt, "max_pool2d_backward");

    /* without indices */
    ct_tensor *y2 = must(ct_max_pool2d(x, k.k, k.s, k.p, k.d, k.ceil_mode, NULL));
    got = tu_values(y2);
    tu_assert_close(got, ref, ny, 0, 0);
    free(got);

    ct_tensor *ts[] = {x, dy, y, idx, idx_arg, dx, y2};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
    free(xv);
    free(dyv);
    free(ref);
    free(ridx);
    free(gi);
    free(rdx);
    free(mag);
}

static void run_avg_pool(pool_cfg k, ct_dtype dt, bool adaptive) {
    int64_t xs[4], ys[4];
    int nd = pool_shapes(&k, xs, ys);
    int64_t nx = k.N * k.C * k.H * k.W, ny = k.N * k.C * k.OH * k.OW;
    double *xv, *dyv;
    ct_tensor *x = tu_rand(nd, xs, dt, -1, 1, &xv), *dy = tu_rand(nd, ys, dt, -1, 1, &dyv);
    if (k.noncontig) {
        make_noncontig(&x);
        make_noncontig(&dy);
    }
    int64_t nmax = nx > ny ? nx : ny;
    double *ref = malloc((size_t)nmax * sizeof(double)), *mag = malloc((size_t)nmax * sizeof(double));
    ct_tensor *y = adaptive ? ct_adaptive_avg_pool2d(x, k.OH, k.OW)
                            : ct_avg_pool2d(x, k.k, k.s, k.p, k.ceil_mode, k.count_include_pad);
    must(y);
    assert_shape(y, nd, ys);
    avg_ref(&k, adaptive, false, xv, ref, mag);
    check_tensor(y, ref, mag, dt, adaptive ? "adaptive_avg_pool2d" : "avg_pool2d");

    ct_tensor *dx = adaptive ? ct_adaptive_avg_pool2d_backward(dy, x)
                             : ct_avg_pool2d_backward(dy, x, k.k, k.s, k.p, k.ceil_mode,
                                                      k.count_include_pad);
    must(dx);
    assert_shape(dx, nd, xs);
    avg_ref(&k, adaptive, true, dyv, ref, mag);
    check_tensor(dx, ref, mag, dt, adaptive ? "adaptive_avg_pool2d_backward"
                                            : "avg_pool2d_backward");
    ct_tensor *ts[] = {x, dy, y, dx};
    for (size_t i = 0; i < 4; i++) ct_tensor_release(ts[i]);
    free(xv);
    free(dyv);
    free(ref);
    free(mag);
}

static void test_max_pool_random(void **state) {
    (void)state;
    for (int it = 0; it < 60; it++) {
        pool_cfg k = random_pool(true);
        for (size_t d = 0; d < 4; d++) run_max_pool(k, tu_float_dtypes[d]);
    }
}

static void test_avg_pool_random(void **state) {
    (void)state;
    for (int it = 0; it < 60; it++) {
        pool_cfg k = random_pool(false);
        for (size_t d = 0; d < 4; d++) run_avg_pool(k, tu_float_dtypes[d], false);
    }
}

static void test_adaptive_pool_random(void **state) {
    (void)state;
    for (int it = 0; it < 40; it++) {
        pool_cfg k = random_pool(false);
        k.OH = tu_randint(1, k.H + 4); /* smaller, equal and larger than the input */
        k.OW = tu_randint(1, k.W + 4);
        for (size_t d = 0; d < 4; d++) run_avg_pool(k, tu_float_dtypes[d], true);
    }
}

/* The float32 kernels for contiguous, undilated pooling against the general
 * path (taken by float64) on data full of ties (ReLU's zeros) and NaNs: the
 * first maximum in window order wins, a NaN wins over numbers, and a later
 * NaN wins over an earlier one, on both paths. */
static void test_max_pool_f32_path_ties_nan(void **state) {
    (void)state;
    static const int64_t cfg[][6] = {
        /* kernel, stride, padding (h = w) and H, W, ceil_mode */
        {2, 2, 0, 8, 10, 0}, {2, 2, 0, 14, 14, 0}, {2, 2, 0, 7, 9, 1}, {3, 2, 1, 9, 8, 0},
        {3, 1, 1, 5, 6, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        int64_t k[2] = {cfg[c][0], cfg[c][0]}, st[2] = {cfg[c][1], cfg[c][1]},
                pd[2] = {cfg[c][2], cfg[c][2]}, one[2] = {1, 1};
        int64_t n = 2 * 3 * cfg[c][3] * cfg[c][4];
        double *v = tu_rand_vals(n, CT_F64, -1, 1);
        for (int64_t i = 0; i < n; i++) {
            int64_t r = tu_randint(0, 10);
            if (r < 5) v[i] = 0;         /* ties */
            else if (r == 5) v[i] = NAN; /* NaNs, some windows with two */
            else v[i] = (float)v[i];     /* the same value in both dtypes */
        }
        ct_tensor *x32 = tu_from_f64(v, CT_SHAPE(2, 3, cfg[c][3], cfg[c][4]), CT_F32);
        ct_tensor *x64 = tu_from_f64(v, CT_SHAPE(2, 3, cfg[c][3], cfg[c][4]), CT_F64);
        ct_tensor *i32 = NULL, *i64 = NULL;
        ct_tensor *y32 = must(ct_max_pool2d(x32, k, st, pd, one, cfg[c][5], &i32));
        ct_tensor *y64 = must(ct_max_pool2d(x64, k, st, pd, one, cfg[c][5], &i64));
        int64_t ny = ct_tensor_numel(y32);
        double *a = tu_values(y32), *b = tu_values(y64), *ia = tu_values(i32), *ib = tu_values(i64);
        for (int64_t i = 0; i < ny; i++) {
            assert_true(a[i] == b[i] || (isnan(a[i]) && isnan(b[i])));
            assert_int_equal((int64_t)ia[i], (int64_t)ib[i]);
        }
        /* the backward through the same indices */
        ct_tensor *dy = tu_rand(4, ct_tensor_shape(y32), CT_F32, -1, 1, NULL);
        ct_tensor *dy64 = ct_to_dtype(dy, CT_F64);
        ct_tensor *d32 = must(ct_max_pool2d_backward(dy, x32, i32));
        ct_tensor *d64 = must(ct_max_pool2d_backward(dy64, x64, i64));
        double *ga = tu_values(d32), *gb = tu_values(d64);
        tu_assert_close(ga, gb, n, 1e-6, 1e-6);
        ct_tensor *ts[] = {x32, x64, i32, i64, y32, y64, dy, dy64, d32, d64};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
        free(v);
        free(a);
        free(b);
        free(ia);
        free(ib);
        free(ga);
        free(gb);
    }
}

static void test_pool_known_values(void **state) {
    (void)state;
    double v16[16], v9[9];
    for (int i = 0; i < 16; i++) v16[i] = i + 1;
    for (int i = 0; i < 9; i++) v9[i] = i + 1;
    ct_tensor *x = tu_from_f64(v16, CT_SHAPE(1, 1, 4, 4), CT_F32);
    int64_t k2[2] = {2, 2}, k3[2] = {3, 3}, one[2] = {1, 1}, s2[2] = {2, 2};
    ct_tensor *idx = NULL;
    ct_tensor *y = must(ct_max_pool2d(x, k2, NULL, NULL, NULL, false, &idx));
    double *g = tu_values(y), *gi = tu_values(idx);
    double want[4] = {6, 8, 14, 16}, want_i[4] = {5, 7, 13, 15};
    tu_assert_close(g, want, 4, 0, 0);
    tu_assert_close(gi, want_i, 4, 0, 0);
    free(g);
    free(gi);
    ct_tensor_release(y);
    ct_tensor_release(idx);

    /* torch.nn.functional.avg_pool2d(arange(1,10).view(1,1,3,3), 2, ceil_mode=True)
     * = [[3, 4.5], [7.5, 9]]: the clipped windows divide by their clipped size */
    ct_tensor *x9 = tu_from_f64(v9, CT_SHAPE(1, 1, 3, 3), CT_F64);
    y = must(ct_avg_pool2d(x9, k2, NULL, NULL, true, true));
    g = tu_values(y);
    double want_avg[4] = {3, 4.5, 7.5, 9};
    tu_assert_close(g, want_avg, 4, 1e-15, 0);
    free(g);
    ct_tensor_release(y);
    /* avg_pool2d(x, 3, stride 2, padding 1, count_include_pad=True): corners
     * divide by 9 including padding: (1+2+4+5)/9 = 12/9, ... */
    y = must(ct_avg_pool2d(x9, k3, s2, one, false, true));
    g = tu_values(y);
    double want_pad[4] = {12.0 / 9, 16.0 / 9, 24.0 / 9, 28.0 / 9};
    tu_assert_close(g, want_pad, 4, 1e-15, 0);
    free(g);
    ct_tensor_release(y);
    y = must(ct_avg_pool2d(x9, k3, s2, one, false, false));
    g = tu_values(y);
    double want_nopad[4] = {3, 4, 6, 7};
    tu_assert_close(g, want_nopad, 4, 1e-15, 0);
    free(g);
    ct_tensor_release(y);

    /* adaptive 5 -> 3: windows [0,2), [1,4), [3,5) */
    ct_tensor *x5 = tu_from_f64(v9, CT_SHAPE(1, 1, 5), CT_F64);
    y = must(ct_adaptive_avg_pool2d(x5, 1, 3));
    g = tu_values(y);
    double want_ad[3] = {1.5, 3, 4.5};
    tu_assert_close(g, want_ad, 3, 1e-15, 0);
    free(g);
    ct_tensor_release(y);

    /* ceil_mode drops a last window that would start in the right padding:
     * H = 5, kernel 2, stride 2, padding 1 gives 3 windows, not 4 */
    ct_tensor *x55 = tu_rand(CT_SHAPE(1, 5, 5), CT_F32, -1, 1, NULL);
    y = must(ct_max_pool2d(x55, k2, s2, one, NULL, true, NULL));
    int64_t want_shape[3] = {1, 3, 3};
    assert_shape(y, 3, want_shape);
    ct_tensor_release(y);
    ct_tensor *ts[] = {x, x9, x5, x55};
    for (int i = 0; i < 4; i++) ct_tensor_release(ts[i]);
}

/* Geometry from user integers near INT64_MAX is refused with a message
 * instead of overflowing into a wrong size; a huge kernel that fits is
 * computed exactly (every window covers the whole input). */
static void test_geometry_overflow(void **state) {
    (void)state;
    ct_scope *sc = ct_scope_begin();
    ct_tensor *x = tu_rand(CT_SHAPE(1, 1, 4, 4), CT_F32, -1, 1, NULL);
    ct_tensor *w = tu_rand(CT_SHAPE(1, 1, 3, 3), CT_F32, -1, 1, NULL);
    int64_t big = INT64_MAX / 2 + 1, huge[2] = {big, big}, one[2] = {1, 1};
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, huge, NULL, 1), CT_ERR_OVERFLOW,
                         "ct_conv2d", "padding", "overflow int64");
    tu_assert_null_error(ct_conv2d(x, w, NULL, NULL, NULL, huge, 1), CT_ERR_OVERFLOW,
                         "ct_conv2d", "dilation", "overflow int64");
    int64_t kmax[2] = {INT64_MAX, INT64_MAX}, pmax[2] = {INT64_MAX / 2, INT64_MAX / 2};
    tu_assert_null_error(ct_max_pool2d(x, kmax, one, pmax, NULL, false, NULL), CT_ERR_OVERFLOW,
                         "ct_max_pool2d", "kernel", "overflow int64");
    int64_t k3[2] = {3, 3};
    tu_assert_null_error(ct_max_pool2d(x, k3, one, NULL, kmax, false, NULL), CT_ERR_OVERFLOW,
                         "ct_max_pool2d", "dilation", "overflow int64");
    tu_assert_null_error(ct_avg_pool2d(x, kmax, one, pmax, true, true), CT_ERR_OVERFLOW,
                         "ct_avg_pool2d", "overflow int64");
    /* kernel 2^40 with padding 2^39: 5x5 windows, each covering the 4x4 input */
    int64_t k40[2] = {(int64_t)1 << 40, (int64_t)1 << 40}, p39[2] = {(int64_t)1 << 39,
                                                                    (int64_t)1 << 39};
    ct_tensor *y = ct_max_pool2d(x, k40, one, p39, NULL, false, NULL);
    assert_non_null(y);
    assert_int_equal(ct_tensor_shape(y)[2], 5);
    assert_int_equal(ct_tensor_shape(y)[3], 5);
    double mx;
    assert_int_equal(ct_tensor_item(ct_max(x), &mx), CT_OK);
    double first, last;
    assert_int_equal(ct_tensor_item(ct_select(ct_select(ct_select(ct_select(y, 0, 0), 0, 0), 0, 0), 0, 0), &first), CT_OK);
    assert_int_equal(ct_tensor_item(ct_select(ct_select(ct_select(ct_select(y, 0, 0), 0, 0), 0, 4), 0, 4), &last), CT_OK);
    assert_true(first == mx && last == mx);
    ct_scope_end(sc);
}

static void test_pool_errors(void **state) {
    (void)state;
    ct_tensor *x = tu_rand(CT_SHAPE(2, 3, 6, 6), CT_F32, -1, 1, NULL);
    ct_tensor *x2 = tu_rand(CT_SHAPE(6, 6), CT_F32, -1, 1, NULL);
    ct_tensor *xs = tu_rand(CT_SHAPE(1, 1, 2, 2), CT_F32, -1, 1, NULL);
    ct_tensor *xi = ct_tensor_zeros(CT_SHAPE(2, 3, 6, 6), CT_I32, CT_CPU);
    ct_tensor *x64 = tu_rand(CT_SHAPE(2, 3, 3, 3), CT_F64, -1, 1, NULL);
    int64_t k3[2] = {3, 3}, k0[2] = {0, 3}, p2[2] = {2, 0}, z[2] = {0, 0}, one[2] = {1, 1};

    tu_assert_null_error(ct_max_pool2d(NULL, k3, NULL, NULL, NULL, false, NULL),
                         CT_ERR_INVALID_ARG, "ct_max_pool2d");
    tu_assert_null_error(ct_max_pool2d(x, NULL, NULL, NULL, NULL, false, NULL),
                         CT_ERR_INVALID_ARG, "kernel");
    tu_assert_null_error(ct_max_pool2d(x, k0, NULL, NULL, NULL, false, NULL), CT_ERR_INVALID_ARG,
                         "kernel size must be positive", "[0, 3]");
    tu_assert_null_error(ct_max_pool2d(x, k3, z, NULL, NULL, false, NULL), CT_ERR_INVALID_ARG,
                         "stride must be positive");
    tu_assert_null_error(ct_max_pool2d(x, k3, NULL, NULL, z, false, NULL), CT_ERR_INVALID_ARG,
                         "dilation must be positive");
    tu_assert_null_error(ct_max_pool2d(x, k3, NULL, p2, NULL, false, NULL), CT_ERR_INVALID_ARG,
                         "padding [2, 0]", "at most half the kernel size [3, 3]");
    tu_assert_null_error(ct_avg_pool2d(x, k3, NULL, (int64_t[]){-1, 0}, false, true),
                         CT_ERR_INVALID_ARG, "ct_avg_pool2d", "non-negative");
    tu_assert_null_error(ct_max_pool2d(x2, k3, NULL, NULL, NULL, false, NULL), CT_ERR_SHAPE,
                         "3-d", "4-d", "[6, 6]");
    tu_assert_null_error(ct_max_pool2d(xs, k3, NULL, NULL, NULL, false, NULL), CT_ERR_SHAPE,
                         "output size 0x0 is too small", "[1, 1, 2, 2]");
    tu_assert_null_error(ct_avg_pool2d(xi, k3, NULL, NULL, false, true), CT_ERR_DTYPE, "int32");
    tu_assert_null_error(ct_adaptive_avg_pool2d(x, 0, 2), CT_ERR_INVALID_ARG,
                         "ct_adaptive_avg_pool2d", "0x2");
    tu_assert_null_error(ct_adaptive_avg_pool2d(x2, 2, 2), CT_ERR_SHAPE, "3-d");

    /* backward */
    ct_tensor *idx = NULL;
    ct_tensor *y = must(ct_max_pool2d(x, k3, NULL, NULL, NULL, false, &idx));
    ct_tensor *idx32 = ct_tensor_zeros(CT_SHAPE(2, 3, 2, 2), CT_I32, CT_CPU);
    ct_tensor *bad = ct_tensor_full(CT_SHAPE(2, 3, 2, 2), 36, CT_I64, CT_CPU);
    ct_tensor *dy3 = tu_rand(CT_SHAPE(2, 3, 3, 2), CT_F32, -1, 1, NULL);
    tu_assert_null_error(ct_max_pool2d_backward(y, x, idx32), CT_ERR_DTYPE, "int64", "int32");
    tu_assert_null_error(ct_max_pool2d_backward(dy3, x, idx), CT_ERR_SHAPE, "[2, 3, 3, 2]",
                         "[2, 3, 2, 2]");
    tu_assert_null_error(ct_max_pool2d_backward(y, x64, idx), CT_ERR_DTYPE, "same dtype");
    tu_assert_null_error(ct_max_pool2d_backward(y, x, bad), CT_ERR_INDEX, "outside [0, 36)");
    tu_assert_null_error(ct_max_pool2d_backward(y, x, NULL), CT_ERR_INVALID_ARG, "NULL");
    tu_assert_null_error(ct_avg_pool2d_backward(dy3, x, k3, NULL, NULL, false, true),
                         CT_ERR_SHAPE, "ct_avg_pool2d_backward",
                         "expected grad_out of shape [2, 3, 2, 2]");
    tu_assert_null_error(ct_avg_pool2d_backward(y, x, k3, one, NULL, false, true), CT_ERR_SHAPE,
                         "[2, 3, 4, 4]");
    tu_assert_null_error(ct_adaptive_avg_pool2d_backward(x2, x), CT_ERR_SHAPE,
                         "ct_adaptive_avg_pool2d_backward");
    tu_assert_null_error(ct_adaptive_avg_pool2d_backward(y, x64), CT_ERR_DTYPE, "same dtype");

    ct_tensor *ts[] = {x, x2, xs, xi, x64, idx, y, idx32, bad, dy3};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) ct_tensor_release(ts[i]);
}

int main(void) {
    tu_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_conv_random, setup, teardown),        cmocka_unit_test_setup_teardown(test_conv_paths, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv_winograd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv_direct, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv_known_values, setup, teardown),  cmocka_unit_test_setup_teardown(test_conv_empty_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_conv_errors, setup, teardown),        cmocka_unit_test_setup_teardown(test_max_pool_random, setup, teardown),
        cmocka_unit_test_setup_teardown(test_avg_pool_random, setup, teardown),    cmocka_unit_test_setup_teardown(test_adaptive_pool_random, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_known_values, setup, teardown),  cmocka_unit_test_setup_teardown(test_max_pool_f32_path_ties_nan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_geometry_overflow, setup, teardown),
    };
    return tu_run_tests(tests);
}
